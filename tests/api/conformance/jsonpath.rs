//! The JSONPath subset the conformance cases use:
//! `$`, dotted fields (`$.job.id`), bracketed names (`$['a-b']`), indexes (`[0]`, chainable:
//! `[6][1]`), wildcards (`[*]` or `.*`, results collected into one flat list, elements that do
//! not resolve are skipped), and the filter `[?(@.field=='value')]` (first matching element,
//! `==` only; the value may be quoted or a JSON literal such as `3` or `true`).

use serde_json::Value;

#[derive(Debug, Clone, PartialEq)]
pub enum Segment {
    Field(String),
    Index(usize),
    Wildcard,
    /// `[?(@.a.b == value)]`: the first array element whose `a.b` equals `value`.
    Filter {
        field: Vec<String>,
        value: Value,
    },
}

pub fn parse(path: &str) -> Result<Vec<Segment>, String> {
    let bad = |why: &str| format!("invalid JSONPath {path:?}: {why}");
    let rest = path
        .trim()
        .strip_prefix('$')
        .ok_or_else(|| bad("must start with '$'"))?;
    let chars: Vec<char> = rest.chars().collect();
    let mut segments = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        match chars[i] {
            '.' => {
                let start = i + 1;
                let mut end = start;
                while end < chars.len() && chars[end] != '.' && chars[end] != '[' {
                    end += 1;
                }
                let name: String = chars[start..end].iter().collect();
                if name.is_empty() {
                    return Err(bad("empty field name"));
                }
                segments.push(if name == "*" {
                    Segment::Wildcard
                } else {
                    Segment::Field(name)
                });
                i = end;
            }
            '[' => {
                let inner_start = i + 1;
                let (segment, next) = if chars[inner_start..].starts_with(&['?', '(']) {
                    parse_filter(&chars, inner_start + 2).map_err(|e| bad(&e))?
                } else if matches!(chars.get(inner_start), Some('\'' | '"')) {
                    let quote = chars[inner_start];
                    let close = find_from(&chars, inner_start + 1, quote)
                        .ok_or_else(|| bad("unterminated quoted name"))?;
                    if chars.get(close + 1) != Some(&']') {
                        return Err(bad("expected ']' after quoted name"));
                    }
                    let name: String = chars[inner_start + 1..close].iter().collect();
                    (Segment::Field(name), close + 2)
                } else {
                    let close =
                        find_from(&chars, inner_start, ']').ok_or_else(|| bad("missing ']'"))?;
                    let inner: String = chars[inner_start..close].iter().collect();
                    let inner = inner.trim();
                    let segment = if inner == "*" {
                        Segment::Wildcard
                    } else {
                        Segment::Index(
                            inner
                                .parse()
                                .map_err(|_| bad(&format!("unsupported index [{inner}]")))?,
                        )
                    };
                    (segment, close + 1)
                };
                segments.push(segment);
                i = next;
            }
            other => return Err(bad(&format!("unexpected {other:?}"))),
        }
    }
    Ok(segments)
}

fn find_from(chars: &[char], from: usize, wanted: char) -> Option<usize> {
    (from..chars.len()).find(|&j| chars[j] == wanted)
}

/// Parses `@.field == value)]` starting after `[?(`; returns the segment and the index after `]`.
fn parse_filter(chars: &[char], start: usize) -> Result<(Segment, usize), String> {
    // Find the closing ")]" outside quotes.
    let mut quote: Option<char> = None;
    let mut end = None;
    let mut j = start;
    while j < chars.len() {
        let c = chars[j];
        match quote {
            Some(q) if c == q => quote = None,
            Some(_) => {}
            None if c == '\'' || c == '"' => quote = Some(c),
            None if c == ')' && chars.get(j + 1) == Some(&']') => {
                end = Some(j);
                break;
            }
            None => {}
        }
        j += 1;
    }
    let end = end.ok_or("unterminated filter, expected ')]'")?;
    let expr: String = chars[start..end].iter().collect();
    let (lhs, rhs) = expr
        .split_once("==")
        .ok_or_else(|| format!("filter {expr:?}: only '==' is supported"))?;
    let field_path = lhs
        .trim()
        .strip_prefix("@.")
        .ok_or_else(|| format!("filter {expr:?}: left side must be @.field"))?;
    let field: Vec<String> = field_path.split('.').map(str::to_string).collect();
    if field.iter().any(String::is_empty) {
        return Err(format!("filter {expr:?}: empty field name"));
    }
    let rhs = rhs.trim();
    let value = if rhs.len() >= 2
        && ((rhs.starts_with('\'') && rhs.ends_with('\''))
            || (rhs.starts_with('"') && rhs.ends_with('"')))
    {
        Value::String(rhs[1..rhs.len() - 1].to_string())
    } else {
        serde_json::from_str(rhs).map_err(|_| format!("filter {expr:?}: bad value {rhs:?}"))?
    };
    Ok((Segment::Filter { field, value }, end + 2))
}

/// Resolves `path` against `root` (None = no body). `Ok(None)` means the path does not resolve.
pub fn resolve(path: &str, root: Option<&Value>) -> Result<Option<Value>, String> {
    let segments = parse(path)?;
    Ok(root.and_then(|root| apply(&segments, root)))
}

fn apply(segments: &[Segment], root: &Value) -> Option<Value> {
    let mut nodes: Vec<&Value> = vec![root];
    let mut multi = false;
    for segment in segments {
        let mut next = Vec::new();
        for node in nodes {
            match segment {
                Segment::Field(name) => next.extend(node.get(name.as_str())),
                Segment::Index(index) => next.extend(node.as_array().and_then(|a| a.get(*index))),
                Segment::Wildcard => match node {
                    Value::Array(items) => next.extend(items.iter()),
                    Value::Object(map) => next.extend(map.values()),
                    _ => {}
                },
                Segment::Filter { field, value } => {
                    let found = node.as_array().and_then(|items| {
                        items.iter().find(|item| {
                            field
                                .iter()
                                .try_fold(*item, |v, name| v.get(name.as_str()))
                                .is_some_and(|v| values_equal(v, value))
                        })
                    });
                    next.extend(found);
                }
            }
        }
        if *segment == Segment::Wildcard {
            multi = true;
        }
        if next.is_empty() && !multi {
            return None;
        }
        nodes = next;
    }
    if multi {
        Some(Value::Array(nodes.into_iter().cloned().collect()))
    } else {
        nodes.first().map(|v| (*v).clone())
    }
}

/// Deep equality where numbers compare by value (`1 == 1.0`).
pub fn values_equal(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => {
            match (x.as_i64(), y.as_i64(), x.as_u64(), y.as_u64()) {
                (Some(x), Some(y), _, _) => x == y,
                (_, _, Some(x), Some(y)) => x == y,
                _ => x.as_f64() == y.as_f64(),
            }
        }
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(a, b)| values_equal(a, b))
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len()
                && x.iter()
                    .all(|(k, v)| y.get(k).is_some_and(|w| values_equal(v, w)))
        }
        _ => a == b,
    }
}

#[cfg(test)]
mod tests {
    use super::{Segment, parse, resolve, values_equal};
    use serde_json::{Value, json};

    fn doc() -> Value {
        json!({
            "job": {"id": "j1", "args": ["a", 42, [1, [2, 3]], {"nested": {"deeply": {"key": "v"}}}], "error": null},
            "jobs": [
                {"id": "a", "state": "active", "n": 1, "errors": [{"code": "x"}]},
                {"id": "b", "state": "discarded", "n": 2, "errors": [{"code": "y"}, {"code": "z"}]},
                {"id": "c", "state": "discarded", "n": 3}
            ],
            "crons": [{"name": "alpha"}, {"name": "beta"}, {"other": 1}],
            "empty": [],
            "step-2": {"x": 1}
        })
    }

    fn r(path: &str) -> Option<Value> {
        resolve(path, Some(&doc())).expect("valid test path")
    }

    #[test]
    fn jsonpath_root_fields_and_indexes() {
        assert_eq!(r("$"), Some(doc()));
        assert_eq!(r("$.job.id"), Some(json!("j1")));
        assert_eq!(r("$.job.args[1]"), Some(json!(42)));
        assert_eq!(r("$.job.args[2][1][0]"), Some(json!(2)));
        assert_eq!(r("$.job.args[3].nested.deeply.key"), Some(json!("v")));
        assert_eq!(r("$.step-2.x"), Some(json!(1)));
        assert_eq!(r("$['step-2'].x"), Some(json!(1)));
        assert_eq!(r("$.job.error"), Some(Value::Null));
        assert_eq!(r("$.job.missing"), None);
        assert_eq!(r("$.job.args[9]"), None);
        assert_eq!(r("$.job.id[0]"), None);
        assert_eq!(resolve("$.job", None).expect("valid"), None);
    }

    #[test]
    fn jsonpath_wildcard_flattens() {
        assert_eq!(r("$.crons[*].name"), Some(json!(["alpha", "beta"])));
        assert_eq!(r("$.jobs[*].errors[*].code"), Some(json!(["x", "y", "z"])));
        assert_eq!(r("$.jobs.*.id"), Some(json!(["a", "b", "c"])));
        assert_eq!(r("$.empty[*].name"), Some(json!([])));
    }

    #[test]
    fn jsonpath_filter_first_match() {
        assert_eq!(r("$.jobs[?(@.id=='b')].state"), Some(json!("discarded")));
        assert_eq!(r("$.jobs[?(@.state=='discarded')].id"), Some(json!("b")));
        assert_eq!(r("$.jobs[?(@.id == \"c\")].n"), Some(json!(3)));
        assert_eq!(r("$.jobs[?(@.n==2)].id"), Some(json!("b")));
        assert_eq!(r("$.jobs[?(@.errors==2)].id"), None);
        assert_eq!(r("$.jobs[?(@.id=='zzz')]"), None);
        assert_eq!(r("$.jobs[?(@.id=='a')].errors[0].code"), Some(json!("x")));
        assert_eq!(
            r("$.jobs[?(@.id=='b')]").and_then(|j| j.get("n").cloned()),
            Some(json!(2))
        );
    }

    #[test]
    fn jsonpath_parse_errors() {
        assert!(parse("job.id").is_err());
        assert!(parse("$.").is_err());
        assert!(parse("$.a[").is_err());
        assert!(parse("$.a[x]").is_err());
        assert!(parse("$.a[?(@.b>1)]").is_err());
        assert!(parse("$.a[?(@.b=='x']").is_err());
        assert_eq!(
            parse("$.a[?(@.b.c=='x)]')]").expect("quoted ')]' is part of the value"),
            vec![
                Segment::Field("a".into()),
                Segment::Filter {
                    field: vec!["b".into(), "c".into()],
                    value: json!("x)]")
                }
            ]
        );
    }

    #[test]
    fn jsonpath_values_equal_numbers() {
        assert!(values_equal(&json!(1), &json!(1.0)));
        assert!(values_equal(
            &json!({"a": [1, "x"]}),
            &json!({"a": [1.0, "x"]})
        ));
        assert!(!values_equal(&json!({"a": 1}), &json!({"a": 1, "b": 2})));
        assert!(!values_equal(&json!("1"), &json!(1)));
    }
}
