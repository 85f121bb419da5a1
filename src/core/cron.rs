//! Cron expressions: validation of the classic five-field syntax and shorthands, with one clear
//! error per field, and next-run calculation by the `croner` crate in an IANA time zone's local
//! wall-clock time.
//!
//! Day semantics follow Vixie cron: when both day-of-month and day-of-week are restricted
//! (neither field is exactly `*`), a day matches if either matches; otherwise both must.
//! Local times skipped by a DST gap never run; ambiguous local times (DST overlap) run once,
//! at their earliest instant.

use chrono::offset::LocalResult;
use chrono::{DateTime, Datelike, Months, TimeZone, Utc};
use chrono_tz::Tz;
use croner::parser::{CronParser, Seconds, Year};
use croner::{Cron, YEAR_LOWER_LIMIT, YEAR_UPPER_LIMIT};

// The unit tests build instants with it through `use super::*`.
#[cfg(test)]
use chrono::Duration;

/// A parsed cron schedule: 5 fields (minute hour day-of-month month day-of-week) or a shorthand.
#[derive(Debug, Clone)]
pub struct Schedule {
    /// Croner's form of the expression, which finds the runs.
    cron: Cron,
    /// Minutes (0-59) that match, ascending.
    minutes: Vec<u16>,
    /// Hours (0-23) that match, ascending.
    hours: Vec<u16>,
    /// Days of month (1-31) that match, ascending.
    days_of_month: Vec<u16>,
    /// Months (1-12) that match, ascending.
    months: Vec<u16>,
    /// Weekdays (0 = Sunday … 6 = Saturday) that match, ascending.
    days_of_week: Vec<u16>,
}

/// Equal when they match the same times: croner's own `==` also compares how a field was
/// written (its step), which does not change the runs.
impl PartialEq for Schedule {
    fn eq(&self, other: &Self) -> bool {
        let (a, b) = (&self.cron.pattern, &other.cron.pattern);
        self.minutes == other.minutes
            && self.hours == other.hours
            && self.days_of_month == other.days_of_month
            && self.months == other.months
            && self.days_of_week == other.days_of_week
            && a.is_dom_wildcard() == b.is_dom_wildcard()
            && a.is_dow_wildcard() == b.is_dow_wildcard()
    }
}

impl Eq for Schedule {}

/// Why an expression or time zone was refused (Display = a clear one-line message naming the field).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CronError {
    /// The expression was empty or only whitespace.
    #[error("cron expression is empty")]
    Empty,
    /// The expression did not have exactly five fields.
    #[error(
        "cron expression must have exactly 5 fields (minute hour day-of-month month day-of-week), found {0}"
    )]
    FieldCount(usize),
    /// An `@` shorthand that is not one of the known ones.
    #[error(
        "unknown cron shorthand {0:?} (expected @yearly, @annually, @monthly, @weekly, @daily, @midnight or @hourly)"
    )]
    UnknownShorthand(String),
    /// One field could not be parsed; `field` names it, `reason` says why.
    #[error("invalid {field} field: {reason}")]
    InvalidField {
        /// The field's name, e.g. `"minute"` or `"day-of-week"`.
        field: &'static str,
        /// What was wrong with it.
        reason: String,
    },
    /// croner refused an expression our checks passed (not expected; an error, never a panic).
    #[error("invalid cron expression: {0}")]
    Rejected(String),
    /// The time zone name is not a known IANA zone.
    #[error(
        "unknown time zone {0:?} (expected an IANA name such as \"America/New_York\" or \"UTC\")"
    )]
    UnknownTimeZone(String),
}

/// Longest piece of user input echoed back in an error message.
const MAX_ECHO: usize = 40;

/// Shortens user input for an error message, on a character boundary.
fn echo(text: &str) -> String {
    match text.char_indices().nth(MAX_ECHO) {
        Some((cut, _)) => format!("{}…", &text[..cut]),
        None => text.to_owned(),
    }
}

/// How one of the five fields is checked.
struct FieldSpec {
    name: &'static str,
    min: u32,
    /// Largest value written explicitly (7 for day-of-week, an alias of Sunday).
    max: u32,
    /// Where `*` and `a/n` end (6 for day-of-week, so Sunday is not counted twice).
    open_max: u32,
    /// Three-letter names for `min`, `min + 1`, …; empty when the field has none.
    names: &'static [&'static str],
}

const MINUTE: FieldSpec = FieldSpec {
    name: "minute",
    min: 0,
    max: 59,
    open_max: 59,
    names: &[],
};
const HOUR: FieldSpec = FieldSpec {
    name: "hour",
    min: 0,
    max: 23,
    open_max: 23,
    names: &[],
};
const DAY_OF_MONTH: FieldSpec = FieldSpec {
    name: "day-of-month",
    min: 1,
    max: 31,
    open_max: 31,
    names: &[],
};
const MONTH: FieldSpec = FieldSpec {
    name: "month",
    min: 1,
    max: 12,
    open_max: 12,
    names: &[
        "JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC",
    ],
};
const DAY_OF_WEEK: FieldSpec = FieldSpec {
    name: "day-of-week",
    min: 0,
    max: 7,
    open_max: 6,
    names: &["SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT"],
};

impl FieldSpec {
    /// Checks a whole field (a comma list) and rewrites it in the plain numeric form croner
    /// is given.
    ///
    /// We check first because croner accepts more than standard cron (`L`, `W`, `#`, `?`,
    /// empty list items, names in any field) and its errors do not name the field.
    fn parse(&self, text: &str) -> Result<String, CronError> {
        // A lone `*` stays `*`: it decides the Vixie day rule.
        if text == "*" {
            return Ok(text.to_owned());
        }
        let items = text
            .split(',')
            .map(|item| self.parse_item(item))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|reason| CronError::InvalidField {
                field: self.name,
                reason,
            })?;
        Ok(items.join(","))
    }

    /// Checks one list item (`*`, `v`, `a-b`, optionally followed by `/step`) and rewrites it
    /// as `v`, `a-b` or `a-b/step`.
    fn parse_item(&self, item: &str) -> Result<String, String> {
        if item.is_empty() {
            return Err("empty list item".to_owned());
        }
        let (base, step) = match item.split_once('/') {
            Some((base, step)) => (base, Some(self.parse_step(step)?)),
            None => (item, None),
        };
        let (low, high) = if base == "*" {
            (self.min, self.open_max)
        } else if let Some((a, b)) = base.split_once('-') {
            let (low, high) = (self.parse_value(a)?, self.parse_value(b)?);
            if low > high {
                return Err(format!(
                    "range {} is reversed (start is after end)",
                    echo(base)
                ));
            }
            (low, high)
        } else {
            let value = self.parse_value(base)?;
            match step {
                // `v/n` runs from v to the field's end; croner's strict mode has no such form.
                Some(_) => (value, self.open_max.max(value)),
                None => (value, value),
            }
        };
        Ok(match step {
            Some(step) => format!("{low}-{high}/{step}"),
            None if low == high => low.to_string(),
            None => format!("{low}-{high}"),
        })
    }

    /// Parses the part after `/`: a positive number no larger than the field's span.
    fn parse_step(&self, text: &str) -> Result<u32, String> {
        let span = self.max - self.min + 1;
        let step =
            parse_number(text).ok_or_else(|| format!("step {:?} is not a number", echo(text)))?;
        if step == 0 {
            return Err("step must be at least 1, got 0".to_owned());
        }
        if step > span {
            return Err(format!("step {step} is larger than {span}"));
        }
        Ok(step)
    }

    /// Parses one value: a number in `min..=max` or, where the field has them, a name.
    fn parse_value(&self, text: &str) -> Result<u32, String> {
        if text.is_empty() {
            return Err("missing value".to_owned());
        }
        if let Some(value) = parse_number(text) {
            if value < self.min || value > self.max {
                return Err(format!(
                    "value {value} is out of range {}-{}",
                    self.min, self.max
                ));
            }
            return Ok(value);
        }
        if text.bytes().all(|b| b.is_ascii_digit()) {
            return Err(format!(
                "value {} is out of range {}-{}",
                echo(text),
                self.min,
                self.max
            ));
        }
        for (offset, name) in (0u32..).zip(self.names) {
            if text.eq_ignore_ascii_case(name) {
                return Ok(self.min + offset);
            }
        }
        if self.names.is_empty() {
            Err(format!("{:?} is not a number", echo(text)))
        } else {
            Err(format!(
                "{:?} is neither a number nor a name ({}-{})",
                echo(text),
                self.names.first().copied().unwrap_or_default(),
                self.names.last().copied().unwrap_or_default(),
            ))
        }
    }
}

/// Parses a plain unsigned decimal (ASCII digits only, no sign); None if not one or too big.
fn parse_number(text: &str) -> Option<u32> {
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    text.parse().ok()
}

/// The five fields each shorthand stands for (croner has no `@midnight`, so we expand them).
fn expand_shorthand(expr: &str) -> Option<&'static str> {
    let lower = expr.to_ascii_lowercase();
    Some(match lower.as_str() {
        "@yearly" | "@annually" => "0 0 1 1 *",
        "@monthly" => "0 0 1 * *",
        "@weekly" => "0 0 * * 0",
        "@daily" | "@midnight" => "0 0 * * *",
        "@hourly" => "0 * * * *",
        _ => return None,
    })
}

impl Schedule {
    /// Parses `expr`: five space-separated fields, or @yearly @annually @monthly @weekly @daily @midnight @hourly.
    pub fn parse(expr: &str) -> Result<Schedule, CronError> {
        let trimmed = expr.trim();
        if trimmed.is_empty() {
            return Err(CronError::Empty);
        }
        let fields_text = if trimmed.starts_with('@') {
            expand_shorthand(trimmed).ok_or_else(|| CronError::UnknownShorthand(echo(trimmed)))?
        } else {
            trimmed
        };
        let fields: Vec<&str> = fields_text.split_whitespace().collect();
        let [minute, hour, dom, month, dow] = fields.as_slice() else {
            return Err(CronError::FieldCount(fields.len()));
        };
        let canonical = [
            MINUTE.parse(minute)?,
            HOUR.parse(hour)?,
            DAY_OF_MONTH.parse(dom)?,
            MONTH.parse(month)?,
            DAY_OF_WEEK.parse(dow)?,
        ]
        .join(" ");
        // Five fields only, no seconds or years; croner's defaults (Vixie OR day rule, 0 and
        // 7 both Sunday, no `0/10`-style sloppy ranges) are the semantics we want.
        let cron = CronParser::builder()
            .seconds(Seconds::Disallowed)
            .year(Year::Disallowed)
            .build()
            .parse(&canonical)
            .map_err(|e| CronError::Rejected(e.to_string()))?;
        let pattern = &cron.pattern;
        Ok(Schedule {
            minutes: pattern.minutes.values(),
            hours: pattern.hours.values(),
            days_of_month: pattern.days.values(),
            months: pattern.months.values(),
            days_of_week: pattern.days_of_week.values(),
            cron,
        })
    }

    /// The first run strictly after `after`, evaluated in time zone `tz`, as UTC; None if none within 5 years.
    pub fn next_after(&self, after: DateTime<Utc>, tz: Tz) -> Option<DateTime<Utc>> {
        let offset = tz.offset_from_utc_datetime(&after.naive_utc());
        let local = after
            .naive_utc()
            .checked_add_offset(chrono::Offset::fix(&offset))?;
        let limit = local.checked_add_months(Months::new(60))?;
        // croner searches only these years, and chrono's `naive_local` (croner calls it) panics
        // outside chrono's range.
        let searchable = YEAR_LOWER_LIMIT..=YEAR_UPPER_LIMIT;
        if !searchable.contains(&local.year()) || !searchable.contains(&limit.year()) {
            return None;
        }
        if !self.some_day_exists() {
            return None;
        }
        let mut from = after.with_timezone(&tz);
        loop {
            let run = self.cron.find_next_occurrence(&from, false).ok()?;
            if run.naive_local() > limit {
                return None;
            }
            if self.is_run(&run) && run > after {
                return Some(run.with_timezone(&Utc));
            }
            from = run;
        }
    }

    /// Whether any month has a matching day; croner would search to year 5000 to find none.
    fn some_day_exists(&self) -> bool {
        // Longest each month gets (February in leap years).
        const DAYS: [u16; 12] = [31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31];
        let pattern = &self.cron.pattern;
        // Any weekday comes round, so only day-of-month ANDed with `*` can never match.
        if pattern.is_dom_wildcard() || !pattern.is_dow_wildcard() {
            return true;
        }
        let Some(&first_day) = self.days_of_month.first() else {
            return false;
        };
        self.months.iter().any(|&month| {
            DAYS.get(usize::from(month).wrapping_sub(1))
                .is_some_and(|&longest| first_day <= longest)
        })
    }

    /// Whether an instant croner found is a run for us: croner moves a time a DST gap skips
    /// to the gap's end, and runs `*`/step patterns on both passes of a DST overlap.
    fn is_run(&self, run: &DateTime<Tz>) -> bool {
        if !self.cron.is_time_matching(run).unwrap_or(false) {
            return false;
        }
        match run.timezone().from_local_datetime(&run.naive_local()) {
            LocalResult::Ambiguous(a, b) => *run == a.min(b),
            LocalResult::Single(_) | LocalResult::None => true,
        }
    }
}

/// Parses an IANA time zone name (e.g. "America/New_York", "UTC").
pub fn parse_time_zone(name: &str) -> Result<Tz, CronError> {
    name.trim()
        .parse::<Tz>()
        .map_err(|_| CronError::UnknownTimeZone(echo(name)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn utc(y: i32, mo: u32, d: u32, h: u32, mi: u32) -> DateTime<Utc> {
        Utc.with_ymd_and_hms(y, mo, d, h, mi, 0)
            .single()
            .expect("valid test time")
    }

    fn next(expr: &str, after: DateTime<Utc>) -> Option<DateTime<Utc>> {
        Schedule::parse(expr)
            .expect("valid test expression")
            .next_after(after, Tz::UTC)
    }

    #[test]
    fn shorthands() {
        // 2024-05-15 is a Wednesday.
        let after = utc(2024, 5, 15, 10, 30);
        assert_eq!(next("@yearly", after), Some(utc(2025, 1, 1, 0, 0)));
        assert_eq!(next("@annually", after), Some(utc(2025, 1, 1, 0, 0)));
        assert_eq!(next("@monthly", after), Some(utc(2024, 6, 1, 0, 0)));
        assert_eq!(next("@weekly", after), Some(utc(2024, 5, 19, 0, 0)));
        assert_eq!(next("@daily", after), Some(utc(2024, 5, 16, 0, 0)));
        assert_eq!(next("@midnight", after), Some(utc(2024, 5, 16, 0, 0)));
        assert_eq!(next("@hourly", after), Some(utc(2024, 5, 15, 11, 0)));
        assert_eq!(Schedule::parse("@DAILY"), Schedule::parse("0 0 * * *"));
        assert_eq!(Schedule::parse("@yearly"), Schedule::parse("0 0 1 1 *"));
        assert!(matches!(
            Schedule::parse("@often"),
            Err(CronError::UnknownShorthand(_))
        ));
        assert!(Schedule::parse("@daily *").is_err());
    }

    #[test]
    fn every_five_minutes() {
        assert_eq!(
            next("*/5 * * * *", utc(2024, 5, 15, 10, 2)),
            Some(utc(2024, 5, 15, 10, 5))
        );
        // Strictly after: an exact match moves on to the next one.
        assert_eq!(
            next("*/5 * * * *", utc(2024, 5, 15, 10, 5)),
            Some(utc(2024, 5, 15, 10, 10))
        );
        // Seconds are ignored in the input and zeroed in the output.
        let almost = utc(2024, 5, 15, 10, 4) + Duration::seconds(59);
        assert_eq!(next("*/5 * * * *", almost), Some(utc(2024, 5, 15, 10, 5)));
        // Rolls over the hour, the day, the year.
        assert_eq!(
            next("*/5 * * * *", utc(2024, 12, 31, 23, 56)),
            Some(utc(2025, 1, 1, 0, 0))
        );
    }

    #[test]
    fn weekdays_skip_weekend() {
        // 2024-05-17 is a Friday.
        let s = "0 9 * * 1-5";
        assert_eq!(
            next(s, utc(2024, 5, 17, 8, 0)),
            Some(utc(2024, 5, 17, 9, 0))
        );
        assert_eq!(
            next(s, utc(2024, 5, 17, 9, 0)),
            Some(utc(2024, 5, 20, 9, 0))
        );
        assert_eq!(
            next(s, utc(2024, 5, 18, 12, 0)),
            Some(utc(2024, 5, 20, 9, 0))
        );
    }

    #[test]
    fn dom_dow_or_rule() {
        // 13th of the month OR any Friday. 2024-09-01 is a Sunday; Fridays: 6, 13, 20, 27.
        let s = "0 0 13 * 5";
        assert_eq!(next(s, utc(2024, 9, 1, 0, 0)), Some(utc(2024, 9, 6, 0, 0)));
        assert_eq!(next(s, utc(2024, 9, 6, 0, 0)), Some(utc(2024, 9, 13, 0, 0)));
        // 2024-10-13 is a Sunday and still matches by day of month.
        assert_eq!(
            next(s, utc(2024, 10, 12, 0, 0)),
            Some(utc(2024, 10, 13, 0, 0))
        );
        // Only one restricted: both must match (AND with `*`).
        assert_eq!(
            next("0 0 13 * *", utc(2024, 9, 1, 0, 0)),
            Some(utc(2024, 9, 13, 0, 0))
        );
        assert_eq!(
            next("0 0 * * 5", utc(2024, 9, 1, 0, 0)),
            Some(utc(2024, 9, 6, 0, 0))
        );
    }

    #[test]
    fn month_and_day_names() {
        assert_eq!(
            Schedule::parse("0 0 1 jan-Mar *"),
            Schedule::parse("0 0 1 1-3 *")
        );
        assert_eq!(
            Schedule::parse("0 0 * * MON-FRI"),
            Schedule::parse("0 0 * * 1-5")
        );
        assert_eq!(Schedule::parse("0 0 * * sun"), Schedule::parse("0 0 * * 7"));
        assert_eq!(Schedule::parse("0 0 * * 0"), Schedule::parse("0 0 * * 7"));
        assert_eq!(
            Schedule::parse("0 0 * * SAT,SUN"),
            Schedule::parse("0 0 * * 6,0")
        );
        assert_eq!(
            next("0 12 * DEC *", utc(2024, 5, 15, 0, 0)),
            Some(utc(2024, 12, 1, 12, 0))
        );
        assert_eq!(
            next("0 12 * * WED", utc(2024, 5, 16, 0, 0)),
            Some(utc(2024, 5, 22, 12, 0))
        );
        assert!(Schedule::parse("0 0 * FOO *").is_err());
        assert!(Schedule::parse("0 0 * * MONDAY").is_err());
        assert!(Schedule::parse("0 0 JAN * *").is_err());
    }

    #[test]
    fn steps_ranges_and_lists() {
        let a = Schedule::parse("1-10/3,20 */6 1/10 * *").expect("parses");
        let b = Schedule::parse("1,4,7,10,20 0,6,12,18 1,11,21,31 * *").expect("parses");
        assert_eq!(a.minutes, b.minutes);
        assert_eq!(a.hours, b.hours);
        assert_eq!(a.days_of_month, b.days_of_month);
        // `a/n` on day-of-week ends at Saturday, so Sunday is not added via 7.
        assert_eq!(
            Schedule::parse("0 0 * * 1/2"),
            Schedule::parse("0 0 * * 1,3,5")
        );
        assert_eq!(
            Schedule::parse("0 0 * * 5-7"),
            Schedule::parse("0 0 * * 0,5,6")
        );
    }

    #[test]
    fn leap_day() {
        assert_eq!(
            next("0 0 29 2 *", utc(2025, 3, 1, 0, 0)),
            Some(utc(2028, 2, 29, 0, 0))
        );
        // Never: nothing within five years, and the search ends.
        assert_eq!(next("0 0 30 2 *", utc(2025, 3, 1, 0, 0)), None);
        assert_eq!(next("0 0 31 4,6,9,11 *", utc(2025, 3, 1, 0, 0)), None);
    }

    #[test]
    fn time_zone_offsets() {
        let ny = parse_time_zone("America/New_York").expect("known zone");
        let s = Schedule::parse("0 9 * * *").expect("parses");
        assert_eq!(
            s.next_after(utc(2024, 1, 15, 0, 0), ny),
            Some(utc(2024, 1, 15, 14, 0))
        );
        assert_eq!(
            s.next_after(utc(2024, 7, 15, 0, 0), ny),
            Some(utc(2024, 7, 15, 13, 0))
        );
        // After 9:00 local (13:30 UTC in summer) the next run is the next day.
        assert_eq!(
            s.next_after(utc(2024, 7, 15, 13, 30), ny),
            Some(utc(2024, 7, 16, 13, 0))
        );
    }

    #[test]
    fn dst_gap_is_skipped() {
        // 2024-03-10: New York clocks jump from 02:00 EST to 03:00 EDT.
        let ny = parse_time_zone("America/New_York").expect("known zone");
        let s = Schedule::parse("30 2 * * *").expect("parses");
        assert_eq!(
            s.next_after(utc(2024, 3, 9, 12, 0), ny),
            Some(utc(2024, 3, 11, 6, 30))
        );
    }

    #[test]
    fn dst_overlap_runs_once_at_earliest() {
        // 2024-11-03: New York clocks fall back from 02:00 EDT to 01:00 EST.
        let ny = parse_time_zone("America/New_York").expect("known zone");
        let s = Schedule::parse("30 1 * * *").expect("parses");
        assert_eq!(
            s.next_after(utc(2024, 11, 3, 0, 0), ny),
            Some(utc(2024, 11, 3, 5, 30))
        );
        // The second 01:30 (06:30 UTC) does not run again.
        assert_eq!(
            s.next_after(utc(2024, 11, 3, 5, 30), ny),
            Some(utc(2024, 11, 4, 6, 30))
        );
        // Starting inside the repeated hour, the next run is after it.
        let every = Schedule::parse("*/15 * * * *").expect("parses");
        assert_eq!(
            every.next_after(utc(2024, 11, 3, 6, 20), ny),
            Some(utc(2024, 11, 3, 7, 0))
        );
    }

    #[test]
    fn dst_overlap_interval_runs_first_pass_only() {
        let ny = parse_time_zone("America/New_York").expect("known zone");
        let every = Schedule::parse("*/15 * * * *").expect("parses");
        // 05:20 UTC is 01:20 EDT, the first pass of the repeated hour.
        assert_eq!(
            every.next_after(utc(2024, 11, 3, 5, 20), ny),
            Some(utc(2024, 11, 3, 5, 30))
        );
        // After 01:45 EDT comes 02:00 EST, not the second 01:00.
        assert_eq!(
            every.next_after(utc(2024, 11, 3, 5, 45), ny),
            Some(utc(2024, 11, 3, 7, 0))
        );
    }

    #[test]
    fn half_hour_dst_gap_is_skipped() {
        // 2024-10-06: Lord Howe clocks jump from 02:00 (+10:30) to 02:30 (+11).
        let lord_howe = parse_time_zone("Australia/Lord_Howe").expect("known zone");
        let s = Schedule::parse("15 2 * * *").expect("parses");
        assert_eq!(
            s.next_after(utc(2024, 10, 5, 12, 0), lord_howe),
            Some(utc(2024, 10, 6, 15, 15))
        );
    }

    #[test]
    fn impossible_days_skip_the_search() {
        for expr in ["0 0 30 2 *", "0 0 31 4,6,9,11 *", "* * 30,31 2 *"] {
            let s = Schedule::parse(expr).expect("parses");
            assert!(!s.some_day_exists(), "{expr}");
        }
        for expr in ["0 0 29 2 *", "0 0 30 2 5", "0 0 * 2 *", "0 0 31 2,3 *"] {
            let s = Schedule::parse(expr).expect("parses");
            assert!(s.some_day_exists(), "{expr}");
        }
        // Both day fields restricted: any Friday in February (2026-02-06) runs.
        assert_eq!(
            next("0 0 30 2 5", utc(2025, 3, 1, 0, 0)),
            Some(utc(2026, 2, 6, 0, 0))
        );
    }

    #[test]
    fn rejections() {
        let bad = [
            "",
            "   ",
            "* * * * * *",
            "0 0 * * * * 2024",
            "* * * *",
            "99 25 32 13 8",
            "60 * * * *",
            "* 24 * * *",
            "* * 0 * *",
            "* * * 0 *",
            "* * * * 8",
            "*/0 * * * *",
            "5-1 * * * *",
            "a b c d e",
            "1,,2 * * * *",
            "1, * * * *",
            ",1 * * * *",
            "*/ * * * *",
            "/5 * * * *",
            "-5 * * * *",
            "1- * * * *",
            "1-2-3 * * * *",
            "1/2/3 * * * *",
            "*/61 * * * *",
            "+5 * * * *",
            "99999999999999999999 * * * *",
            "*/99999999999999999999 * * * *",
            "** * * * *",
            "? * * * *",
            "L * * * *",
            "0 0 1 JANUARY *",
            "0 0 * * 1#2",
            "é * * * *",
            "@",
        ];
        for expr in bad {
            assert!(
                Schedule::parse(expr).is_err(),
                "{expr:?} should be rejected"
            );
        }
        assert_eq!(Schedule::parse(""), Err(CronError::Empty));
        assert_eq!(
            Schedule::parse("* * * * * *"),
            Err(CronError::FieldCount(6))
        );
        assert_eq!(
            Schedule::parse("0 0 * * * * 2024"),
            Err(CronError::FieldCount(7))
        );
        let msg = Schedule::parse("99 25 32 13 8")
            .expect_err("out of range")
            .to_string();
        assert_eq!(msg, "invalid minute field: value 99 is out of range 0-59");
        for (expr, field) in [
            ("0 25 * * *", "hour"),
            ("0 0 32 * *", "day-of-month"),
            ("0 0 * 13 *", "month"),
            ("0 0 * * 8", "day-of-week"),
        ] {
            match Schedule::parse(expr) {
                Err(CronError::InvalidField { field: f, .. }) => assert_eq!(f, field, "{expr}"),
                other => panic!("{expr:?}: unexpected {other:?}"),
            }
        }
        assert!(
            Schedule::parse("*/0 * * * *")
                .expect_err("step 0")
                .to_string()
                .contains("step")
        );
        assert!(
            Schedule::parse("5-1 * * * *")
                .expect_err("reversed")
                .to_string()
                .contains("reversed")
        );
    }

    #[test]
    fn accepts_edges_and_whitespace() {
        for expr in [
            "0-59 0-23 1-31 1-12 0-7",
            "  */60\t*/24 */31 */12 */8  ",
            "00 09 * * *",
        ] {
            assert!(Schedule::parse(expr).is_ok(), "{expr:?} should parse");
        }
    }

    #[test]
    fn time_zones() {
        assert_eq!(parse_time_zone("UTC"), Ok(Tz::UTC));
        assert_eq!(
            parse_time_zone("America/New_York"),
            Ok(chrono_tz::America::New_York)
        );
        assert!(matches!(
            parse_time_zone("Mars/Olympus"),
            Err(CronError::UnknownTimeZone(_))
        ));
        assert!(parse_time_zone("").is_err());
    }

    #[test]
    fn extreme_instants_do_not_panic() {
        let s = Schedule::parse("* * * * *").expect("parses");
        let tokyo = parse_time_zone("Asia/Tokyo").expect("known zone");
        let la = parse_time_zone("America/Los_Angeles").expect("known zone");
        for tz in [Tz::UTC, tokyo, la] {
            assert_eq!(s.next_after(DateTime::<Utc>::MAX_UTC, tz), None);
            let _ = s.next_after(DateTime::<Utc>::MIN_UTC, tz);
        }
    }

    #[test]
    fn long_garbage_does_not_panic() {
        let long = "9".repeat(10_000);
        let err = Schedule::parse(&format!("{long} * * * *")).expect_err("too big");
        assert!(err.to_string().len() < 200);
        let _ = Schedule::parse(&"*,".repeat(10_000));
        let _ = parse_time_zone(&"é".repeat(1000));
    }
}
