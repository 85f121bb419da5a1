//! Templates `{{steps.<step id>.response.body.<dotted.path>}}`, resolved against the context
//! document `{"steps": {"<id>": {"response": {"status", "headers", "body"}, ...}}}` built from the
//! steps run so far. The dotted path may use `[N]` indexes (`jobs[0].id`).
//!
//! In text (paths, headers, request body strings): strings are inserted as they are, whole numbers
//! without decimals, other numbers and booleans in their JSON form, objects and arrays as JSON
//! text; an unresolvable template (unknown step, missing or null value) stays as written.
//! In matchers, a string that is exactly one template becomes `{"$eq": <resolved value>}`, so the
//! value is compared as data (typed, never re-read as a matcher); other strings get text
//! substitution.

use super::jsonpath;
use super::matchers::plain;
use serde_json::{Map, Value, json};

/// Resolves the inside of one `{{...}}`; None if it does not resolve to a non-null value.
pub fn lookup(inner: &str, ctx: &Value) -> Option<Value> {
    let inner = inner.trim();
    if !inner.starts_with("steps.") {
        return None;
    }
    match jsonpath::resolve(&format!("$.{inner}"), Some(ctx)) {
        Ok(Some(Value::Null)) | Ok(None) | Err(_) => None,
        Ok(Some(v)) => Some(v),
    }
}

/// If `s` is exactly one template and it resolves, its value.
pub fn resolve_whole(s: &str, ctx: &Value) -> Option<Value> {
    let inner = s.strip_prefix("{{")?.strip_suffix("}}")?;
    if inner.contains("{{") || inner.contains("}}") {
        return None;
    }
    lookup(inner, ctx)
}

pub fn render_text(s: &str, ctx: &Value) -> String {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(open) = rest.find("{{") {
        let Some(close) = rest[open + 2..].find("}}") else {
            break;
        };
        let close = open + 2 + close;
        out.push_str(&rest[..open]);
        match lookup(&rest[open + 2..close], ctx) {
            Some(v) => out.push_str(&plain(&v)),
            None => out.push_str(&rest[open..close + 2]),
        }
        rest = &rest[close + 2..];
    }
    out.push_str(rest);
    out
}

/// Text substitution in every string (and object key) of a request body.
pub fn render_value(v: &Value, ctx: &Value) -> Value {
    match v {
        Value::String(s) => Value::String(render_text(s, ctx)),
        Value::Array(items) => Value::Array(items.iter().map(|x| render_value(x, ctx)).collect()),
        Value::Object(map) => Value::Object(
            map.iter()
                .map(|(k, x)| (render_text(k, ctx), render_value(x, ctx)))
                .collect::<Map<String, Value>>(),
        ),
        other => other.clone(),
    }
}

/// Template substitution in a matcher (keys are JSONPaths and get text substitution).
pub fn render_matcher(v: &Value, ctx: &Value) -> Value {
    match v {
        Value::String(s) => match resolve_whole(s, ctx) {
            Some(value) => json!({ "$eq": value }),
            None => Value::String(render_text(s, ctx)),
        },
        Value::Array(items) => Value::Array(items.iter().map(|x| render_matcher(x, ctx)).collect()),
        Value::Object(map) => Value::Object(
            map.iter()
                .map(|(k, x)| (render_text(k, ctx), render_matcher(x, ctx)))
                .collect::<Map<String, Value>>(),
        ),
        other => other.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::{render_matcher, render_text, render_value, resolve_whole};
    use serde_json::{Value, json};

    fn ctx() -> Value {
        json!({"steps": {
            "step-1": {"response": {"status": 201, "body": {
                "job": {"id": "0190-abc", "attempt": 2, "delay": 1.5, "ok": true, "result": null},
                "jobs": [{"id": "j0"}, {"id": "j1"}]
            }}}
        }})
    }

    #[test]
    fn template_text_substitution() {
        let c = ctx();
        assert_eq!(
            render_text("/ojs/v1/jobs/{{steps.step-1.response.body.job.id}}", &c),
            "/ojs/v1/jobs/0190-abc"
        );
        assert_eq!(
            render_text("n={{steps.step-1.response.body.job.attempt}}", &c),
            "n=2"
        );
        assert_eq!(
            render_text("{{steps.step-1.response.body.job.delay}}", &c),
            "1.5"
        );
        assert_eq!(
            render_text("{{steps.step-1.response.body.job.ok}}", &c),
            "true"
        );
        assert_eq!(
            render_text("{{steps.step-1.response.body.jobs[1].id}}", &c),
            "j1"
        );
        assert_eq!(
            render_text("{{steps.step-1.response.body.jobs}}", &c),
            r#"[{"id":"j0"},{"id":"j1"}]"#
        );
        assert_eq!(render_text("{{steps.step-1.response.status}}", &c), "201");
        // Unresolvable: unknown step, missing field, null value, unknown root.
        for t in [
            "{{steps.step-9.response.body.job.id}}",
            "{{steps.step-1.response.body.job.nope}}",
            "{{steps.step-1.response.body.job.result}}",
            "{{env.HOME}}",
            "{{unclosed",
        ] {
            assert_eq!(render_text(t, &c), t);
        }
    }

    #[test]
    fn template_values_and_matchers() {
        let c = ctx();
        let body = json!({"job_id": "{{steps.step-1.response.body.job.id}}", "n": 1, "list": ["{{steps.step-1.response.body.job.attempt}}"]});
        assert_eq!(
            render_value(&body, &c),
            json!({"job_id": "0190-abc", "n": 1, "list": ["2"]})
        );
        assert_eq!(
            resolve_whole("{{steps.step-1.response.body.job.attempt}}", &c),
            Some(json!(2))
        );
        assert_eq!(
            resolve_whole("x{{steps.step-1.response.body.job.attempt}}", &c),
            None
        );
        let m = json!({
            "$.jobs[?(@.id=='{{steps.step-1.response.body.job.id}}')]": "exists",
            "$.job.id": "{{steps.step-1.response.body.job.id}}",
            "$.job.attempt": "{{steps.step-1.response.body.job.attempt}}",
            "$.job.note": "id={{steps.step-1.response.body.job.id}}"
        });
        assert_eq!(
            render_matcher(&m, &c),
            json!({
                "$.jobs[?(@.id=='0190-abc')]": "exists",
                "$.job.id": {"$eq": "0190-abc"},
                "$.job.attempt": {"$eq": 2},
                "$.job.note": "id=0190-abc"
            })
        );
    }
}
