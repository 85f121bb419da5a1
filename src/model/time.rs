//! Timestamps and durations as OJS writes them: RFC 3339 instants, ISO-8601 durations.

use chrono::{DateTime, SecondsFormat, Utc};

/// RFC 3339 UTC with milliseconds, or whole seconds when the fraction is zero.
pub fn format_time(t: &DateTime<Utc>) -> String {
    if t.timestamp_subsec_millis() == 0 {
        t.to_rfc3339_opts(SecondsFormat::Secs, true)
    } else {
        t.to_rfc3339_opts(SecondsFormat::Millis, true)
    }
}

/// `format_time` as a serde serializer, for the model's JSON forms.
pub fn serialize_time<S: serde::Serializer>(t: &DateTime<Utc>, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&format_time(t))
}

/// `format_time` of an optional time (null when absent) as a serde serializer.
pub fn serialize_opt_time<S: serde::Serializer>(
    t: &Option<DateTime<Utc>>,
    s: S,
) -> Result<S::Ok, S::Error> {
    match t {
        Some(t) => serialize_time(t, s),
        None => s.serialize_none(),
    }
}

/// Parses an RFC 3339 instant with an explicit zone; a time without a zone is rejected.
pub fn parse_time(text: &str) -> Option<DateTime<Utc>> {
    DateTime::parse_from_rfc3339(text)
        .ok()
        .map(|t| t.with_timezone(&Utc))
}

/// The instant as PostgreSQL stores it: whole microseconds (the rest dropped, as the bind does),
/// a leap second (`23:59:60`) folded into the second after it.
pub fn stored_instant(t: DateTime<Utc>) -> DateTime<Utc> {
    DateTime::from_timestamp_micros(t.timestamp_micros()).unwrap_or(t)
}

/// Parses an ISO-8601 duration (`PT1S`, `PT1.5S`, `P1DT2H`, `PT5M`) into milliseconds.
/// Years and months are refused: their length is not fixed.
pub fn parse_duration_ms(text: &str) -> Option<i64> {
    parse_duration_exact_ms(text).map(|total| total.round() as i64)
}

/// Whole seconds in ms: an ISO-8601 duration with no fraction of a second (none that rounding
/// to milliseconds would hide). `PT0.3M` is 18 s, though 0.3 × 60,000 is not exact in binary.
pub fn parse_whole_seconds_ms(text: &str) -> Option<i64> {
    let seconds = parse_duration_exact_ms(text)? / 1000.0;
    let whole = seconds.round();
    ((seconds - whole).abs() < 1e-9).then_some(whole as i64 * 1000)
}

/// An ISO-8601 duration in ms, unrounded. Its parts come in ISO order, each at most once
/// (`W`, `D`, then after `T`: `H`, `M`, `S`), and a `T` needs a part after it; only the last
/// part may have a fraction, written with `.` or `,`.
fn parse_duration_exact_ms(text: &str) -> Option<f64> {
    let rest = text.strip_prefix('P')?;
    if rest.is_empty() {
        return None;
    }
    let mut total = 0f64;
    let mut in_time = false;
    let mut number = String::new();
    let mut saw_unit = false;
    // The rank of the last part: each part must rank above the one before it.
    let mut last_rank = 0;
    let mut fraction_seen = false;
    for c in rest.chars() {
        match c {
            'T' if !in_time && number.is_empty() => in_time = true,
            '0'..='9' | '.' => number.push(c),
            ',' => number.push('.'),
            unit => {
                if fraction_seen {
                    return None;
                }
                fraction_seen = number.contains('.');
                let value: f64 = number.parse().ok()?;
                number.clear();
                let (rank, ms) = match (in_time, unit) {
                    (false, 'W') => (1, 7.0 * 86_400_000.0),
                    (false, 'D') => (2, 86_400_000.0),
                    (true, 'H') => (3, 3_600_000.0),
                    (true, 'M') => (4, 60_000.0),
                    (true, 'S') => (5, 1_000.0),
                    _ => return None,
                };
                if rank <= last_rank {
                    return None;
                }
                last_rank = rank;
                total += value * ms;
                saw_unit = true;
            }
        }
    }
    let time_part_missing = in_time && last_rank < 3;
    if !number.is_empty()
        || !saw_unit
        || time_part_missing
        || !total.is_finite()
        || total > i64::MAX as f64
    {
        return None;
    }
    Some(total)
}

/// Parses a duration written `500ms`, `2s`, `1h30m`, `720h`, `7d` or as ISO-8601 (`PT2S`) into ms.
pub fn parse_flexible_duration_ms(text: &str) -> Option<i64> {
    let text = text.trim();
    if text.starts_with('P') {
        return parse_duration_ms(text);
    }
    let mut total = 0f64;
    let mut rest = text;
    if rest.is_empty() {
        return None;
    }
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        if digits == 0 {
            return None;
        }
        let value: f64 = rest[..digits].parse().ok()?;
        rest = &rest[digits..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let factor = match &rest[..unit_len] {
            "ms" => 1.0,
            "s" => 1_000.0,
            "m" => 60_000.0,
            "h" => 3_600_000.0,
            "d" => 86_400_000.0,
            _ => return None,
        };
        rest = &rest[unit_len..];
        total += value * factor;
    }
    (total.is_finite() && total <= i64::MAX as f64).then_some(total.round() as i64)
}

/// Renders milliseconds as an ISO-8601 duration (`PT1S`, `PT0.5S`, `PT5M`).
pub fn format_duration_ms(ms: i64) -> String {
    if ms % 3_600_000 == 0 && ms != 0 {
        format!("PT{}H", ms / 3_600_000)
    } else if ms % 60_000 == 0 && ms != 0 {
        format!("PT{}M", ms / 60_000)
    } else if ms % 1000 == 0 {
        format!("PT{}S", ms / 1000)
    } else {
        format!("PT{}S", ms as f64 / 1000.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_keep_iso_order_and_need_a_part_after_t() {
        assert_eq!(parse_duration_ms("P1DT12H"), Some(129_600_000));
        assert_eq!(parse_duration_ms("P1WT1S"), Some(604_801_000));
        assert_eq!(parse_duration_ms("PT1H30M"), Some(5_400_000));
        assert_eq!(parse_duration_ms("PT1,5S"), Some(1_500));
        assert_eq!(parse_duration_ms("P1DT1.5H"), Some(91_800_000));
        for bad in [
            "P1DT",
            "PT",
            "PT1H1H",
            "PT1M1H",
            "P1D1W",
            "PT1S1M",
            "P1WT",
            "PT1.5H30M",
            "P1.5DT1H",
        ] {
            assert_eq!(parse_duration_ms(bad), None, "{bad}");
        }
    }

    #[test]
    fn whole_seconds_refuse_what_rounding_would_hide() {
        assert_eq!(parse_whole_seconds_ms("PT1M"), Some(60_000));
        assert_eq!(parse_whole_seconds_ms("P1D"), Some(86_400_000));
        assert_eq!(parse_whole_seconds_ms("PT0.3M"), Some(18_000));
        assert_eq!(parse_whole_seconds_ms("PT1.5M"), Some(90_000));
        for bad in [
            "PT0.5S",
            "PT1.0004S",
            "PT0.9996S",
            "P3650DT0.0004S",
            "PT0.001S",
        ] {
            assert_eq!(parse_whole_seconds_ms(bad), None, "{bad}");
        }
    }

    #[test]
    fn durations_parse_and_render() {
        assert_eq!(parse_duration_ms("PT1S"), Some(1000));
        assert_eq!(parse_duration_ms("PT1.5S"), Some(1500));
        assert_eq!(parse_duration_ms("PT5M"), Some(300_000));
        assert_eq!(parse_duration_ms("P1DT1H"), Some(90_000_000));
        assert_eq!(parse_duration_ms("P1M"), None);
        assert_eq!(parse_duration_ms("PT"), None);
        assert_eq!(parse_duration_ms("1S"), None);
        assert_eq!(parse_duration_ms("PT1"), None);
        assert_eq!(format_duration_ms(1000), "PT1S");
        assert_eq!(format_duration_ms(300_000), "PT5M");
        assert_eq!(format_duration_ms(500), "PT0.5S");
    }

    #[test]
    fn flexible_durations_take_both_spellings() {
        assert_eq!(parse_flexible_duration_ms("500ms"), Some(500));
        assert_eq!(parse_flexible_duration_ms("2s"), Some(2000));
        assert_eq!(parse_flexible_duration_ms("720h"), Some(2_592_000_000));
        assert_eq!(parse_flexible_duration_ms("1h30m"), Some(5_400_000));
        assert_eq!(parse_flexible_duration_ms("PT2S"), Some(2000));
        assert_eq!(parse_flexible_duration_ms("2"), None);
        assert_eq!(parse_flexible_duration_ms("2 weeks"), None);
        assert_eq!(parse_flexible_duration_ms(""), None);
    }

    #[test]
    fn times_need_a_zone_and_render_without_zero_fraction() {
        assert!(parse_time("2026-01-01T00:00:00").is_none());
        let t = parse_time("2099-12-31T23:59:59Z").expect("valid");
        assert_eq!(format_time(&t), "2099-12-31T23:59:59Z");
        let t = parse_time("2026-01-01T00:00:00.250+02:00").expect("valid");
        assert_eq!(format_time(&t), "2025-12-31T22:00:00.250Z");
    }
}
