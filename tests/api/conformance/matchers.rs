//! Matchers of the OJS conformance format. `check(matcher, actual)` with `actual = None` when the
//! JSONPath did not resolve. Missing and `null` count as the same for `absent`, `$exists: false`,
//! a `null` literal and `$empty`; everything else needs a present value of the right type.
//!
//! String matchers: literal, `any`, `exists`, `absent`, `string:nonempty` / `string:non_empty`,
//! `string:uuid`, `string:uuidv7`, `string:datetime`, `string:contains:X`,
//! `string:pattern(REGEX)`, `number:positive`, `number:non_negative`, `number:range(a,b)`, `~N`,
//! `array:nonempty`, `array:empty`, `array:length:N` / `array:length(N)`,
//! `array:min_length:N` / `array:min:N`, `contains:X`, `not_contains:X`, `one_of:a,b`.
//! A JSON array is matched element-wise with exact length; a JSON object is either operators
//! (`$exists`, `$type`, `$match`, `$in`, `$or`, `$size`, `$empty`, `range`, and the internal
//! `$eq` used for resolved templates) or a literal object (same keys, values matched recursively).
//! Unknown `string:`/`number:`/`array:` matchers and unknown `$` operators are errors.

use super::jsonpath::values_equal;
use regex::Regex;
use serde_json::{Map, Value};

pub fn check(matcher: &Value, actual: Option<&Value>) -> Result<(), String> {
    match matcher {
        Value::String(s) => check_string(s, actual),
        Value::Array(items) => {
            let arr = actual
                .and_then(Value::as_array)
                .ok_or_else(|| mismatch(matcher, actual))?;
            if arr.len() != items.len() {
                return Err(format!(
                    "expected an array of length {}, got length {}: {}",
                    items.len(),
                    arr.len(),
                    show(actual)
                ));
            }
            for (i, (m, v)) in items.iter().zip(arr).enumerate() {
                check(m, Some(v)).map_err(|e| format!("[{i}]: {e}"))?;
            }
            Ok(())
        }
        Value::Object(ops) if is_operator_object(ops) => check_operators(ops, actual),
        Value::Object(fields) => {
            let obj = actual
                .and_then(Value::as_object)
                .ok_or_else(|| mismatch(matcher, actual))?;
            if obj.len() != fields.len() || !fields.keys().all(|k| obj.contains_key(k)) {
                return Err(mismatch(matcher, actual));
            }
            for (k, m) in fields {
                check(m, obj.get(k)).map_err(|e| format!(".{k}: {e}"))?;
            }
            Ok(())
        }
        Value::Null => match actual {
            None | Some(Value::Null) => Ok(()),
            _ => Err(mismatch(matcher, actual)),
        },
        literal => match actual {
            Some(v) if values_equal(literal, v) => Ok(()),
            _ => Err(mismatch(matcher, actual)),
        },
    }
}

fn is_operator_object(map: &Map<String, Value>) -> bool {
    map.keys().any(|k| k.starts_with('$'))
        || (map.len() == 1 && map.get("range").is_some_and(Value::is_object))
}

/// The plain string form of a value, as `contains:` / `one_of:` compare it.
pub fn plain(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Number(n) => match n.as_f64() {
            Some(f) if n.is_f64() && f.fract() == 0.0 && f.abs() < 1e15 => format!("{f:.0}"),
            _ => n.to_string(),
        },
        other => other.to_string(),
    }
}

pub fn show(actual: Option<&Value>) -> String {
    match actual {
        None => "<missing>".to_string(),
        Some(v) => {
            let text = v.to_string();
            if text.chars().count() > 300 {
                format!("{}...", text.chars().take(300).collect::<String>())
            } else {
                text
            }
        }
    }
}

fn mismatch(matcher: &Value, actual: Option<&Value>) -> String {
    format!("expected {matcher}, got {}", show(actual))
}

fn fail(what: &str, actual: Option<&Value>) -> Result<(), String> {
    Err(format!("expected {what}, got {}", show(actual)))
}

fn ensure(ok: bool, what: &str, actual: Option<&Value>) -> Result<(), String> {
    if ok { Ok(()) } else { fail(what, actual) }
}

fn parse_num(s: &str, matcher: &str) -> Result<f64, String> {
    s.trim()
        .parse::<f64>()
        .map_err(|_| format!("bad number {s:?} in matcher {matcher:?}"))
}

fn parse_len(s: &str, matcher: &str) -> Result<usize, String> {
    s.trim()
        .parse::<usize>()
        .map_err(|_| format!("bad length {s:?} in matcher {matcher:?}"))
}

/// `within max(50% of N, 100) of N`.
pub fn approx(expected: f64, actual: f64) -> bool {
    (actual - expected).abs() <= (expected.abs() * 0.5).max(100.0)
}

fn check_string(m: &str, actual: Option<&Value>) -> Result<(), String> {
    let quoted = format!("{m:?}");
    let as_str = actual.and_then(Value::as_str);
    let as_num = actual.and_then(Value::as_f64);
    let as_arr = actual.and_then(Value::as_array);
    match m {
        "any" => {
            return ensure(
                !matches!(actual, None | Some(Value::Null)),
                "any non-null value",
                actual,
            );
        }
        "exists" => return ensure(actual.is_some(), "a present value", actual),
        "absent" => return ensure(matches!(actual, None | Some(Value::Null)), "absent", actual),
        "string:nonempty" | "string:non_empty" => {
            return ensure(
                as_str.is_some_and(|s| !s.is_empty()),
                "a non-empty string",
                actual,
            );
        }
        "string:uuid" => return ensure(as_str.is_some_and(is_uuid), "a UUID string", actual),
        "string:uuidv7" => return ensure(as_str.is_some_and(is_uuidv7), "a UUIDv7 string", actual),
        "string:datetime" => {
            return ensure(
                as_str.is_some_and(is_rfc3339),
                "an RFC 3339 datetime",
                actual,
            );
        }
        "number:positive" => {
            return ensure(as_num.is_some_and(|n| n > 0.0), "a positive number", actual);
        }
        "number:non_negative" => {
            return ensure(
                as_num.is_some_and(|n| n >= 0.0),
                "a non-negative number",
                actual,
            );
        }
        "array:nonempty" => {
            return ensure(
                as_arr.is_some_and(|a| !a.is_empty()),
                "a non-empty array",
                actual,
            );
        }
        "array:empty" => {
            return ensure(as_arr.is_some_and(Vec::is_empty), "an empty array", actual);
        }
        _ => {}
    }
    if let Some(sub) = m.strip_prefix("string:contains:") {
        return ensure(
            as_str.is_some_and(|s| s.contains(sub)),
            &format!("a string containing {sub:?}"),
            actual,
        );
    }
    if let Some(pattern) = m
        .strip_prefix("string:pattern(")
        .and_then(|r| r.strip_suffix(')'))
    {
        let re = pattern_regex(pattern)?;
        return ensure(
            as_str.is_some_and(|s| re.is_match(s)),
            &format!("a string matching /{pattern}/"),
            actual,
        );
    }
    if let Some(args) = m
        .strip_prefix("number:range(")
        .and_then(|r| r.strip_suffix(')'))
    {
        let (lo, hi) = args
            .split_once(',')
            .ok_or_else(|| format!("bad matcher {quoted}"))?;
        let (lo, hi) = (parse_num(lo, m)?, parse_num(hi, m)?);
        return ensure(
            as_num.is_some_and(|n| lo <= n && n <= hi),
            &format!("a number in [{lo}, {hi}]"),
            actual,
        );
    }
    if let Some(n) = m.strip_prefix('~')
        && let Ok(n) = n.trim().parse::<f64>()
    {
        let tolerance = (n.abs() * 0.5).max(100.0);
        return ensure(
            as_num.is_some_and(|a| approx(n, a)),
            &format!("a number within {tolerance} of {n}"),
            actual,
        );
    }
    let length = m.strip_prefix("array:length:").or_else(|| {
        m.strip_prefix("array:length(")
            .and_then(|r| r.strip_suffix(')'))
    });
    if let Some(n) = length {
        let n = parse_len(n, m)?;
        return ensure(
            as_arr.is_some_and(|a| a.len() == n),
            &format!("an array of length {n}"),
            actual,
        );
    }
    let min_length = m
        .strip_prefix("array:min_length:")
        .or_else(|| m.strip_prefix("array:min:"));
    if let Some(n) = min_length {
        let n = parse_len(n, m)?;
        return ensure(
            as_arr.is_some_and(|a| a.len() >= n),
            &format!("an array of length >= {n}"),
            actual,
        );
    }
    if let Some(x) = m.strip_prefix("contains:") {
        return ensure(
            as_arr.is_some_and(|a| a.iter().any(|v| plain(v) == x)),
            &format!("an array containing {x:?}"),
            actual,
        );
    }
    if let Some(x) = m.strip_prefix("not_contains:") {
        return ensure(
            as_arr.is_some_and(|a| !a.iter().any(|v| plain(v) == x)),
            &format!("an array not containing {x:?}"),
            actual,
        );
    }
    if let Some(list) = m.strip_prefix("one_of:") {
        let options: Vec<&str> = list.split(',').map(str::trim).collect();
        return ensure(
            actual.is_some_and(|v| options.contains(&plain(v).as_str())),
            &format!("one of {options:?}"),
            actual,
        );
    }
    if ["string:", "number:", "array:"]
        .iter()
        .any(|p| m.starts_with(p))
    {
        return Err(format!("unknown matcher {quoted}"));
    }
    ensure(as_str == Some(m), &quoted, actual)
}

fn check_operators(ops: &Map<String, Value>, actual: Option<&Value>) -> Result<(), String> {
    for (op, arg) in ops {
        match op.as_str() {
            "$exists" => {
                let want = arg.as_bool().ok_or("$exists needs true or false")?;
                if want {
                    ensure(actual.is_some(), "a present value", actual)?;
                } else {
                    ensure(matches!(actual, None | Some(Value::Null)), "absent", actual)?;
                }
            }
            "$type" => {
                let want = arg.as_str().ok_or("$type needs a string")?;
                let got = match actual {
                    None | Some(Value::Null) => "null",
                    Some(Value::String(_)) => "string",
                    Some(Value::Number(_)) => "number",
                    Some(Value::Bool(_)) => "boolean",
                    Some(Value::Array(_)) => "array",
                    Some(Value::Object(_)) => "object",
                };
                if !["string", "number", "boolean", "null", "array", "object"].contains(&want) {
                    return Err(format!("unknown $type {want:?}"));
                }
                ensure(got == want, &format!("a value of type {want}"), actual)?;
            }
            "$match" => {
                let pattern = arg.as_str().ok_or("$match needs a string")?;
                let re = pattern_regex(pattern)?;
                ensure(
                    actual
                        .and_then(Value::as_str)
                        .is_some_and(|s| re.is_match(s)),
                    &format!("a string matching /{pattern}/"),
                    actual,
                )?;
            }
            "$in" | "$or" => {
                let alternatives = arg
                    .as_array()
                    .ok_or_else(|| format!("{op} needs an array"))?;
                if !alternatives.iter().any(|alt| check(alt, actual).is_ok()) {
                    return fail(&format!("{op} {arg}"), actual);
                }
            }
            "$size" => {
                let len = actual.and_then(Value::as_array).map(Vec::len);
                let Some(len) = len else {
                    return fail(&format!("an array with $size {arg}"), actual);
                };
                check_size(arg, len).map_err(|e| format!("{e}; got {}", show(actual)))?;
            }
            "$empty" => {
                let want = arg.as_bool().ok_or("$empty needs true or false")?;
                let empty = match actual {
                    None | Some(Value::Null) => true,
                    Some(Value::String(s)) => s.is_empty(),
                    Some(Value::Array(a)) => a.is_empty(),
                    Some(Value::Object(o)) => o.is_empty(),
                    Some(_) => false,
                };
                ensure(
                    empty == want,
                    if want {
                        "an empty body/value"
                    } else {
                        "a non-empty value"
                    },
                    actual,
                )?;
            }
            "$eq" => {
                ensure(
                    actual.is_some_and(|v| values_equal(arg, v)),
                    &arg.to_string(),
                    actual,
                )?;
            }
            "range" => {
                let bounds = arg
                    .as_object()
                    .ok_or("range needs {\"min\": .., \"max\": ..}")?;
                let min = bounds
                    .get("min")
                    .map(|v| v.as_f64().ok_or("range.min must be a number"))
                    .transpose()?;
                let max = bounds
                    .get("max")
                    .map(|v| v.as_f64().ok_or("range.max must be a number"))
                    .transpose()?;
                if let Some(k) = bounds.keys().find(|k| *k != "min" && *k != "max") {
                    return Err(format!("unknown range bound {k:?}"));
                }
                let ok = actual
                    .and_then(Value::as_f64)
                    .is_some_and(|n| min.is_none_or(|lo| n >= lo) && max.is_none_or(|hi| n <= hi));
                ensure(ok, &format!("a number in range {arg}"), actual)?;
            }
            other => return Err(format!("unknown matcher operator {other:?}")),
        }
    }
    Ok(())
}

fn check_size(arg: &Value, len: usize) -> Result<(), String> {
    let len_f = len as f64;
    if let Some(n) = arg.as_f64() {
        return if len_f == n {
            Ok(())
        } else {
            Err(format!("expected array size {n}, size is {len}"))
        };
    }
    let bounds = arg.as_object().ok_or("$size needs N or {\"$gte\": N}")?;
    for (op, n) in bounds {
        let n = n
            .as_f64()
            .ok_or_else(|| format!("$size {op} needs a number"))?;
        let ok = match op.as_str() {
            "$gte" => len_f >= n,
            "$gt" => len_f > n,
            "$lte" => len_f <= n,
            "$lt" => len_f < n,
            "$eq" => len_f == n,
            other => return Err(format!("unknown $size operator {other:?}")),
        };
        if !ok {
            return Err(format!("expected array size {op} {n}, size is {len}"));
        }
    }
    Ok(())
}

/// Compiles a case's pattern (Go RE2 syntax) with RE2's meaning of the Perl classes: in Go
/// `\d \w \s \b` are ASCII, in the regex crate Unicode (`\d` would accept "٣"). Each class
/// becomes its ASCII set; inside `[...]` that is a nested class, which the regex crate unions.
/// Matching is a search, like Go's `MatchString`.
fn pattern_regex(pattern: &str) -> Result<Regex, String> {
    let mut translated = String::with_capacity(pattern.len());
    let mut chars = pattern.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            translated.push(c);
            continue;
        }
        let Some(e) = chars.next() else {
            translated.push(c); // trailing backslash: let the regex crate reject it
            break;
        };
        match e {
            'd' => translated.push_str("[0-9]"),
            'D' => translated.push_str("[^0-9]"),
            'w' => translated.push_str("[0-9A-Za-z_]"),
            'W' => translated.push_str("[^0-9A-Za-z_]"),
            's' => translated.push_str("[\\t\\n\\f\\r ]"),
            'S' => translated.push_str("[^\\t\\n\\f\\r ]"),
            'b' => translated.push_str("(?-u:\\b)"),
            'B' => translated.push_str("(?-u:\\B)"),
            _ => {
                translated.push(c);
                translated.push(e);
            }
        }
    }
    Regex::new(&translated).map_err(|e| format!("invalid regex {pattern:?}: {e}"))
}

fn is_uuid(s: &str) -> bool {
    let b = s.as_bytes();
    b.len() == 36
        && b.iter().enumerate().all(|(i, &c)| match i {
            8 | 13 | 18 | 23 => c == b'-',
            _ => c.is_ascii_digit() || (b'a'..=b'f').contains(&c),
        })
}

fn is_uuidv7(s: &str) -> bool {
    let b = s.as_bytes();
    is_uuid(s) && b[14] == b'7' && matches!(b[19], b'8' | b'9' | b'a' | b'b')
}

/// RFC 3339 date-time: `YYYY-MM-DDTHH:MM:SS[.frac](Z|+HH:MM|-HH:MM)` with valid field ranges.
pub fn is_rfc3339(s: &str) -> bool {
    let b = s.as_bytes();
    let num = |from: usize, len: usize| -> Option<u32> {
        let part = b.get(from..from + len)?;
        if part.iter().all(u8::is_ascii_digit) {
            std::str::from_utf8(part).ok()?.parse().ok()
        } else {
            None
        }
    };
    let at = |i: usize, c: u8| b.get(i) == Some(&c);
    let (Some(year), Some(month), Some(day), Some(hour), Some(minute), Some(second)) = (
        num(0, 4),
        num(5, 2),
        num(8, 2),
        num(11, 2),
        num(14, 2),
        num(17, 2),
    ) else {
        return false;
    };
    if !(at(4, b'-') && at(7, b'-') && at(10, b'T') && at(13, b':') && at(16, b':')) {
        return false;
    }
    let leap = year % 4 == 0 && (year % 100 != 0 || year % 400 == 0);
    let days_in_month = match month {
        1 | 3 | 5 | 7 | 8 | 10 | 12 => 31,
        4 | 6 | 9 | 11 => 30,
        2 if leap => 29,
        2 => 28,
        _ => return false,
    };
    if day == 0 || day > days_in_month || hour > 23 || minute > 59 || second > 60 {
        return false;
    }
    let mut i = 19;
    if at(i, b'.') {
        i += 1;
        let start = i;
        while b.get(i).is_some_and(u8::is_ascii_digit) {
            i += 1;
        }
        if i == start {
            return false;
        }
    }
    match b.get(i) {
        Some(b'Z') => i + 1 == b.len(),
        Some(b'+' | b'-') => {
            matches!((num(i + 1, 2), num(i + 4, 2)), (Some(h), Some(m)) if h <= 23 && m <= 59)
                && at(i + 3, b':')
                && i + 6 == b.len()
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::{check, is_rfc3339, pattern_regex};
    use serde_json::{Value, json};

    fn ok(m: Value, v: Value) {
        if let Err(e) = check(&m, Some(&v)) {
            panic!("matcher {m} should accept {v}: {e}");
        }
    }

    fn bad(m: Value, v: Value) {
        assert!(
            check(&m, Some(&v)).is_err(),
            "matcher {m} should reject {v}"
        );
    }

    fn ok_missing(m: Value) {
        if let Err(e) = check(&m, None) {
            panic!("matcher {m} should accept a missing value: {e}");
        }
    }

    fn bad_missing(m: Value) {
        assert!(
            check(&m, None).is_err(),
            "matcher {m} should reject a missing value"
        );
    }

    #[test]
    fn matchers_literals() {
        ok(json!("available"), json!("available"));
        bad(json!("available"), json!("active"));
        bad(json!("1"), json!(1));
        ok(json!(42), json!(42));
        ok(json!(2.5), json!(2.5));
        ok(json!(1), json!(1.0));
        bad(json!(42), json!(43));
        bad(json!(42), json!("42"));
        ok(json!(true), json!(true));
        bad(json!(true), json!(false));
        bad(json!(false), json!(null));
        ok(json!(null), json!(null));
        ok_missing(json!(null));
        bad(json!(null), json!(0));
        bad_missing(json!("x"));
        bad_missing(json!(0));
    }

    #[test]
    fn matchers_any_exists_absent() {
        ok(json!("any"), json!(0));
        bad(json!("any"), json!(null));
        bad_missing(json!("any"));
        ok(json!("exists"), json!(null));
        bad_missing(json!("exists"));
        ok_missing(json!("absent"));
        ok(json!("absent"), json!(null));
        bad(json!("absent"), json!(""));
    }

    #[test]
    fn matchers_strings() {
        ok(json!("string:nonempty"), json!("x"));
        bad(json!("string:nonempty"), json!(""));
        bad(json!("string:non_empty"), json!(1));
        ok(json!("string:non_empty"), json!("y"));
        ok(
            json!("string:uuid"),
            json!("0b6f2a1c-3d4e-4f50-8a61-72839405a6b7"),
        );
        bad(
            json!("string:uuid"),
            json!("0b6f2a1c3d4e4f508a6172839405a6b7"),
        );
        ok(
            json!("string:uuidv7"),
            json!("01890a5d-ac96-774b-bcce-b302099a8057"),
        );
        bad(
            json!("string:uuidv7"),
            json!("0b6f2a1c-3d4e-4f50-8a61-72839405a6b7"),
        );
        bad(
            json!("string:uuidv7"),
            json!("01890a5d-ac96-774b-7cce-b302099a8057"),
        );
        bad(
            json!("string:uuidv7"),
            json!("01890A5D-AC96-774B-BCCE-B302099A8057"),
        );
        ok(json!("string:datetime"), json!("2024-01-15T10:30:00Z"));
        ok(
            json!("string:datetime"),
            json!("2024-02-29T23:59:59.123456+05:30"),
        );
        bad(json!("string:datetime"), json!("2023-02-29T10:30:00Z"));
        bad(json!("string:datetime"), json!("2024-01-15 10:30:00Z"));
        bad(json!("string:datetime"), json!("2024-01-15T10:30:00"));
        bad(json!("string:datetime"), json!(1705314600));
        ok(
            json!("string:contains:max_attempts"),
            json!("bad max_attempts: 0"),
        );
        bad(
            json!("string:contains:max_attempts"),
            json!("bad coefficient"),
        );
        ok(json!("string:pattern(^test\\..*)"), json!("test.echo"));
        bad(json!("string:pattern(^test\\..*)"), json!("prod.echo"));
        assert!(check(&json!("string:bogus"), Some(&json!("x"))).is_err());
        assert!(is_rfc3339("2099-12-31T23:59:59Z"));
        assert!(!is_rfc3339("2099-12-31T24:00:00Z"));
        assert!(!is_rfc3339("2099-12-31T23:59:59.Z"));
        assert!(!is_rfc3339("2099-12-31T23:59:59+0100"));
    }

    #[test]
    fn matchers_numbers() {
        ok(json!("number:positive"), json!(1));
        bad(json!("number:positive"), json!(0));
        ok(json!("number:non_negative"), json!(0));
        bad(json!("number:non_negative"), json!(-1));
        bad(json!("number:non_negative"), json!("1"));
        ok(json!("number:range(400,422)"), json!(400));
        ok(json!("number:range(400,422)"), json!(422));
        bad(json!("number:range(400,422)"), json!(423));
        ok(json!("~1000"), json!(1400));
        ok(json!("~1000"), json!(500));
        bad(json!("~1000"), json!(1600));
        bad(json!("~1000"), json!(499));
        ok(json!("~100"), json!(150));
        ok(json!("~100"), json!(0));
        bad(json!("~100"), json!(201));
        bad(json!("~1000"), json!("1000"));
        bad_missing(json!("~1000"));
        ok(json!("~abc"), json!("~abc"));
        ok(json!({"range": {"min": 1000, "max": 3000}}), json!(3000));
        ok(json!({"range": {"min": 1000}}), json!(99999));
        bad(json!({"range": {"min": 1000, "max": 3000}}), json!(999));
        bad(json!({"range": {"max": 5}}), json!(6));
        ok(json!("one_of:400,422"), json!(422));
        bad(json!("one_of:400,422"), json!(404));
    }

    #[test]
    fn matchers_arrays() {
        ok(json!("array:nonempty"), json!([1]));
        bad(json!("array:nonempty"), json!([]));
        ok(json!("array:empty"), json!([]));
        bad(json!("array:empty"), json!({}));
        ok(json!("array:length:3"), json!([1, 2, 3]));
        bad(json!("array:length:3"), json!([1, 2]));
        ok(json!("array:length(0)"), json!([]));
        bad(json!("array:length(0)"), json!("x"));
        ok(json!("array:min_length:2"), json!([1, 2, 3]));
        bad(json!("array:min_length:2"), json!([1]));
        ok(json!("array:min:2"), json!([1, 2]));
        bad(json!("array:min:2"), json!([]));
        ok(json!("contains:beta"), json!(["alpha", "beta"]));
        bad(json!("contains:beta"), json!(["alpha"]));
        bad(json!("contains:beta"), json!("alphabeta"));
        ok(json!("contains:42"), json!([41, 42]));
        ok(json!("not_contains:gone"), json!(["alpha"]));
        ok(json!("not_contains:gone"), json!([]));
        bad(json!("not_contains:gone"), json!(["gone", "x"]));
        bad_missing(json!("not_contains:gone"));
        ok(
            json!(["arg1", 42, true, null, {"nested": "value"}]),
            json!(["arg1", 42, true, null, {"nested": "value"}]),
        );
        bad(json!(["arg1", 42]), json!(["arg1", 42, true]));
        bad(
            json!([{"nested": "value"}]),
            json!([{"nested": "value", "extra": 1}]),
        );
        ok(json!(["string:nonempty", "any"]), json!(["a", 1]));
        bad(json!(["string:nonempty", "any"]), json!(["", 1]));
        ok(json!([]), json!([]));
        bad(json!([]), json!([1]));
    }

    #[test]
    fn matchers_operators() {
        ok(json!({"$exists": true}), json!("x"));
        ok(json!({"$exists": true}), json!(null));
        bad_missing(json!({"$exists": true}));
        ok_missing(json!({"$exists": false}));
        ok(json!({"$exists": false}), json!(null));
        bad(json!({"$exists": false}), json!({"code": "x"}));
        ok(json!({"$exists": true, "$type": "string"}), json!("msg"));
        bad(json!({"$exists": true, "$type": "string"}), json!(5));
        ok(json!({"$type": "number"}), json!(5.5));
        ok(json!({"$type": "boolean"}), json!(false));
        ok(json!({"$type": "array"}), json!([]));
        ok(json!({"$type": "object"}), json!({}));
        ok(json!({"$type": "null"}), json!(null));
        bad(json!({"$type": "object"}), json!([]));
        assert!(check(&json!({"$type": "int"}), Some(&json!(1))).is_err());
        let v7 = "^[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$";
        ok(
            json!({"$match": v7}),
            json!("01890a5d-ac96-774b-bcce-b302099a8057"),
        );
        bad(
            json!({"$match": v7}),
            json!("0b6f2a1c-3d4e-4f50-8a61-72839405a6b7"),
        );
        ok(
            json!({"$match": "application/(openjobspec\\+)?json"}),
            json!("application/json"),
        );
        bad(
            json!({"$match": "application/(openjobspec\\+)?json"}),
            json!("text/html"),
        );
        bad(json!({"$match": "x"}), json!(["x"]));
        ok(json!({"$in": [200, 204]}), json!(204));
        bad(json!({"$in": [200, 204]}), json!(201));
        ok(
            json!({"$in": ["completed", "cancelled"]}),
            json!("cancelled"),
        );
        bad(json!({"$in": ["completed", "cancelled"]}), json!("active"));
        ok(
            json!({"$or": ["string:nonempty", {"$exists": false}]}),
            json!("x"),
        );
        ok_missing(json!({"$or": ["string:nonempty", {"$exists": false}]}));
        bad(
            json!({"$or": ["string:nonempty", {"$exists": false}]}),
            json!(""),
        );
        ok(json!({"$size": 0}), json!([]));
        bad(json!({"$size": 0}), json!([1]));
        bad_missing(json!({"$size": 0}));
        ok(json!({"$size": {"$gte": 1}}), json!([1, 2]));
        bad(json!({"$size": {"$gte": 1}}), json!([]));
        ok(json!({"$empty": true}), json!([]));
        ok_missing(json!({"$empty": true}));
        bad(json!({"$empty": true}), json!({"jobs": []}));
        ok(json!({"$empty": false}), json!({"jobs": []}));
        ok(json!({"$eq": {"a": [1, 2]}}), json!({"a": [1, 2]}));
        bad(json!({"$eq": {"a": [1, 2]}}), json!({"a": [1, 2], "b": 0}));
        bad(json!({"$eq": "absent"}), json!(null));
        assert!(check(&json!({"$regex": "x"}), Some(&json!("x"))).is_err());
    }

    fn m(p: &str, t: &str) -> bool {
        pattern_regex(p).expect("valid test pattern").is_match(t)
    }

    #[test]
    fn matchers_patterns_search() {
        assert!(m("json", "application/json"));
        assert!(m(
            "application/(openjobspec\\+)?json",
            "application/openjobspec+json"
        ));
        assert!(m(
            "application/(openjobspec\\+)?json",
            "application/json; charset=utf-8"
        ));
        assert!(!m("application/(openjobspec\\+)?json", "text/plain"));
    }

    #[test]
    fn matchers_patterns_anchors_classes_counts() {
        let v7 = "^[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$";
        assert!(m(v7, "01890a5d-ac96-774b-bcce-b302099a8057"));
        assert!(!m(v7, "01890a5d-ac96-474b-bcce-b302099a8057"));
        assert!(!m(v7, "x01890a5d-ac96-774b-bcce-b302099a8057"));
        assert!(m("^\\d{2,3}$", "123"));
        assert!(!m("^\\d{2,3}$", "1234"));
        assert!(m("^a|b$", "xxb"));
        assert!(m("^(ab)+c*$", "ababcc"));
        assert!(!m("^(ab)+$", "aba"));
        assert!(m("^[^x]*$", "abc"));
        assert!(!m("^[^x]*$", "axc"));
        assert!(m("^test\\..*", "test.echo"));
        assert!(m("^(a*)*$", "aaaa"));
        assert!(m("^\\w+\\s\\w+$", "hello world"));
    }

    #[test]
    fn matchers_patterns_perl_classes_are_ascii_as_in_re2() {
        assert!(!m("^\\d$", "\u{663}")); // ARABIC-INDIC DIGIT THREE
        assert!(m("^\\D$", "\u{663}"));
        assert!(!m("^\\w$", "é"));
        assert!(m("^\\W$", "é"));
        assert!(!m("^\\s$", "\u{a0}"));
        assert!(!m("^\\s$", "\u{b}")); // RE2's \s has no vertical tab
        assert!(m("^\\s$", "\u{c}"));
        assert!(m("^[\\d_]+$", "1_2"));
        assert!(!m("^[\\d_]+$", "1a"));
        assert!(m("^[^\\s]+$", "ab"));
        assert!(!m("^[^\\s]+$", "a b"));
        assert!(m("\\bx", "éx"));
        assert!(!m("\\Bx", "éx"));
        assert!(m("^a\\\\d$", "a\\d"));
        assert!(m("^.$", "é"));
    }

    #[test]
    fn matchers_patterns_reject_unsupported() {
        for p in ["(?=a)", "a)", "[a", "*a", "\\q", "a\\"] {
            assert!(pattern_regex(p).is_err(), "{p:?} should not compile");
        }
        assert!(check(&json!({"$match": "[a"}), Some(&json!("[a"))).is_err());
        assert!(check(&json!("string:pattern([a)"), Some(&json!("[a"))).is_err());
    }

    #[test]
    fn matchers_literal_objects() {
        ok(json!({"key": "value"}), json!({"key": "value"}));
        bad(json!({"key": "value"}), json!({"key": "other"}));
        bad(json!({"key": "value"}), json!({"key": "value", "more": 1}));
        bad(json!({"key": "value"}), json!("value"));
    }
}
