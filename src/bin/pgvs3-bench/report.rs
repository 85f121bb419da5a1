//! Figures, their targets and floors, printed as one table and one JSON line per figure.

use serde_json::json;

/// What a figure is held against (issue 28's targets).
#[derive(Debug, Clone, Copy)]
pub enum Target {
    /// The value is at least this.
    AtLeast(f64),
    /// The value is at most this.
    AtMost(f64),
    /// The value divided by its floor is at least this.
    RatioAtLeast(f64),
    /// The value divided by its floor is at most this (costs: lower is better).
    RatioAtMost(f64),
}

/// One measured figure.
#[derive(Debug, Clone)]
pub struct Figure {
    /// Stable name, e.g. `grpc.jobs.work`.
    pub name: String,
    /// The measured value.
    pub value: f64,
    /// Its unit.
    pub unit: &'static str,
    /// The name of the floor figure it is compared with, if any.
    pub floor: Option<String>,
    /// The target, if the issue sets one.
    pub target: Option<Target>,
    /// How it was measured, in a few words.
    pub note: String,
}

/// Everything measured in this run.
#[derive(Debug, Default)]
pub struct Report {
    figures: Vec<Figure>,
}

impl Report {
    /// Adds a figure and echoes it to stderr as progress.
    pub fn add(&mut self, figure: Figure) {
        crate::progress(format_args!(
            "  {} = {} {} ({})",
            figure.name,
            format_value(figure.value),
            figure.unit,
            figure.note
        ));
        self.figures.push(figure);
    }

    fn value_of(&self, name: &str) -> Option<f64> {
        self.figures
            .iter()
            .find(|f| f.name == name)
            .map(|f| f.value)
    }

    /// The figure's value divided by its floor's, when both exist and the floor is not zero.
    fn ratio(&self, figure: &Figure) -> Option<f64> {
        let floor = self.value_of(figure.floor.as_deref()?)?;
        (floor != 0.0).then(|| figure.value / floor)
    }

    /// Whether the target is met (`None`: no target, or a ratio target without a floor).
    fn met(&self, figure: &Figure) -> Option<bool> {
        match figure.target? {
            Target::AtLeast(t) => Some(figure.value >= t),
            Target::AtMost(t) => Some(figure.value <= t),
            Target::RatioAtLeast(t) => self.ratio(figure).map(|r| r >= t),
            Target::RatioAtMost(t) => self.ratio(figure).map(|r| r <= t),
        }
    }

    /// The table, for humans.
    pub fn table(&self) -> String {
        let header = [
            "figure",
            "value",
            "unit",
            "× floor",
            "target",
            "result",
            "measured as",
        ];
        let mut rows: Vec<[String; 7]> = Vec::new();
        for f in &self.figures {
            let ratio = self
                .ratio(f)
                .map_or_else(|| "—".to_string(), |r| format!("{r:.2}×"));
            let target = f.target.map_or_else(
                || "—".to_string(),
                |t| match t {
                    Target::AtLeast(v) => format!("≥ {} {}", format_value(v), f.unit),
                    Target::AtMost(v) => format!("≤ {} {}", format_value(v), f.unit),
                    Target::RatioAtLeast(v) => format!("≥ {v}× {}", floor_name(f)),
                    Target::RatioAtMost(v) => format!("≤ {v}× {}", floor_name(f)),
                },
            );
            let result = match (f.target, self.met(f)) {
                (None, _) => "—".to_string(),
                (Some(_), None) => "n/a (no floor)".to_string(),
                (Some(_), Some(true)) => "PASS".to_string(),
                (Some(_), Some(false)) => "MISS".to_string(),
            };
            rows.push([
                f.name.clone(),
                format_value(f.value),
                f.unit.to_string(),
                ratio,
                target,
                result,
                f.note.clone(),
            ]);
        }
        let mut widths = header.map(|h| h.chars().count());
        for row in &rows {
            for (w, cell) in widths.iter_mut().zip(row) {
                *w = (*w).max(cell.chars().count());
            }
        }
        let line = |cells: &[String]| {
            let mut out = String::from("|");
            for (i, (cell, w)) in cells.iter().zip(widths).enumerate() {
                let pad = w - cell.chars().count();
                // Numbers right-aligned, text left-aligned.
                if i == 1 || i == 3 {
                    out.push_str(&format!(" {}{} |", " ".repeat(pad), cell));
                } else {
                    out.push_str(&format!(" {}{} |", cell, " ".repeat(pad)));
                }
            }
            out
        };
        let mut out = String::new();
        out.push_str(&line(&header.map(String::from)));
        out.push('\n');
        let rule: Vec<String> = widths.iter().map(|w| "-".repeat(*w)).collect();
        out.push_str(&format!("|-{}-|\n", rule.join("-|-")));
        for row in &rows {
            out.push_str(&line(row));
            out.push('\n');
        }
        out
    }

    /// One JSON line per figure.
    pub fn json_lines(&self) -> Vec<String> {
        self.figures
            .iter()
            .map(|f| {
                let target = f.target.map(|t| match t {
                    Target::AtLeast(v) => json!({"at_least": v}),
                    Target::AtMost(v) => json!({"at_most": v}),
                    Target::RatioAtLeast(v) => json!({"ratio_at_least": v}),
                    Target::RatioAtMost(v) => json!({"ratio_at_most": v}),
                });
                json!({
                    "figure": f.name,
                    "value": round4(f.value),
                    "unit": f.unit,
                    "floor": f.floor,
                    "ratio_to_floor": self.ratio(f).map(round4),
                    "target": target,
                    "met": self.met(f),
                })
                .to_string()
            })
            .collect()
    }
}

/// The floor a ratio target is against, as the table names it.
fn floor_name(f: &Figure) -> &str {
    f.floor.as_deref().unwrap_or("floor")
}

fn round4(v: f64) -> f64 {
    (v * 10_000.0).round() / 10_000.0
}

/// Integers above 100 without decimals, small values with a few.
pub fn format_value(v: f64) -> String {
    if v.abs() >= 100.0 {
        format!("{v:.0}")
    } else if v.abs() >= 10.0 {
        format!("{v:.1}")
    } else if v == 0.0 || v.abs() >= 0.01 {
        format!("{v:.2}")
    } else {
        // Per-event churn of a few rows per 1,000-event batch must not print as 0.00.
        format!("{v:.4}")
    }
}
