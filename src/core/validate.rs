//! Validation and normalisation of client input: every rule about what a request may contain.

use chrono::{DateTime, Duration, Utc};
use serde_json::{Map, Value, json};
use uuid::Uuid;

use super::error::CoreError;
use super::job::{EnqueueJob, RetryPolicy};
use super::time::{parse_duration_ms, parse_time};

/// Longest job type.
pub const MAX_TYPE_LEN: usize = 255;
/// Longest queue name.
pub const MAX_QUEUE_LEN: usize = 128;
/// Priority range, inclusive.
pub const PRIORITY_RANGE: std::ops::RangeInclusive<i64> = -100..=100;

/// `^[a-z][a-z0-9_-]*(\.[a-z][a-z0-9_-]*)*$`, at most 255 characters.
pub fn check_job_type(job_type: &str) -> Result<(), CoreError> {
    let segments_ok = job_type.split('.').all(|segment| {
        let mut chars = segment.chars();
        matches!(chars.next(), Some('a'..='z'))
            && chars.all(|c| matches!(c, 'a'..='z' | '0'..='9' | '_' | '-'))
    });
    if job_type.is_empty() || job_type.len() > MAX_TYPE_LEN || !segments_ok {
        return Err(CoreError::invalid(format!(
            "type {job_type:?} is invalid: it must match ^[a-z][a-z0-9_-]*(\\.[a-z][a-z0-9_-]*)*$ and be at most {MAX_TYPE_LEN} characters"
        ))
        .with_detail("field", "type".into()));
    }
    Ok(())
}

/// `^[a-z0-9][a-z0-9.-]*$`, at most 128 characters.
pub fn check_queue_name(queue: &str) -> Result<(), CoreError> {
    let mut chars = queue.chars();
    let ok = matches!(chars.next(), Some('a'..='z' | '0'..='9'))
        && chars.all(|c| matches!(c, 'a'..='z' | '0'..='9' | '.' | '-'))
        && queue.len() <= MAX_QUEUE_LEN;
    if !ok {
        return Err(CoreError::invalid(format!(
            "queue {queue:?} is invalid: it must match ^[a-z0-9][a-z0-9.-]*$ and be at most {MAX_QUEUE_LEN} characters"
        ))
        .with_detail("field", "queue".into()));
    }
    Ok(())
}

/// A caller-supplied job id: a lowercase, hyphenated UUIDv7.
pub fn parse_new_job_id(id: &str) -> Result<Uuid, CoreError> {
    let parsed = Uuid::try_parse(id)
        .ok()
        .filter(|u| u.get_version_num() == 7 && u.hyphenated().to_string() == id && id.len() == 36);
    parsed.ok_or_else(|| {
        CoreError::invalid(format!("id {id:?} is not a lowercase UUIDv7"))
            .with_detail("field", "id".into())
    })
}

/// Refuses NUL characters anywhere in a value (PostgreSQL text and jsonb cannot store them).
pub fn check_no_nul(field: &str, value: &Value) -> Result<(), CoreError> {
    let found = match value {
        Value::String(s) => s.contains('\0'),
        Value::Array(items) => return items.iter().try_for_each(|v| check_no_nul(field, v)),
        Value::Object(map) => {
            for (k, v) in map {
                if k.contains('\0') {
                    return Err(nul_error(field));
                }
                check_no_nul(field, v)?;
            }
            false
        }
        _ => false,
    };
    if found { Err(nul_error(field)) } else { Ok(()) }
}

/// Refuses NUL characters in a text field.
pub fn check_text(field: &str, text: &str) -> Result<(), CoreError> {
    if text.contains('\0') {
        Err(nul_error(field))
    } else {
        Ok(())
    }
}

fn nul_error(field: &str) -> CoreError {
    CoreError::invalid(format!(
        "{field} contains a NUL character (\\u0000), which cannot be stored"
    ))
    .with_detail("field", field.into())
}

/// A page offset, bounded so it always fits the database's integer.
pub fn check_offset(offset: i64) -> Result<i64, CoreError> {
    if !(0..=1_000_000_000).contains(&offset) {
        return Err(CoreError::invalid(format!(
            "offset must be between 0 and 1000000000, not {offset}"
        ))
        .with_detail("field", "offset".into()));
    }
    Ok(offset)
}

/// A job id in a lookup: any UUID, so that an unknown id reads as not found rather than malformed.
pub fn parse_job_id(id: &str) -> Result<Uuid, CoreError> {
    Uuid::try_parse(id).map_err(|_| {
        CoreError::invalid(format!("job id {id:?} is not a UUID"))
            .with_detail("field", "job_id".into())
    })
}

/// A lease token as the worker sent it.
pub fn parse_lease_token(token: Option<&str>) -> Result<Option<Uuid>, CoreError> {
    match token {
        None | Some("") => Ok(None),
        Some(t) => Uuid::try_parse(t).map(Some).map_err(|_| {
            CoreError::invalid(format!("lease_token {t:?} is not a lease token"))
                .with_detail("field", "lease_token".into())
        }),
    }
}

/// An absolute time or a `+PT..` duration from `now`.
fn parse_instant(field: &str, text: &str, now: DateTime<Utc>) -> Result<DateTime<Utc>, CoreError> {
    if let Some(relative) = text.strip_prefix('+') {
        let ms = parse_duration_ms(relative).ok_or_else(|| {
            CoreError::invalid(format!("{field} {text:?} is not a +ISO-8601 duration"))
        })?;
        return Ok(now + Duration::milliseconds(ms));
    }
    parse_time(text).ok_or_else(|| {
        CoreError::invalid(format!(
            "{field} {text:?} is not an RFC 3339 time with a zone (or a +PT.. duration)"
        ))
        .with_detail("field", field.into())
    })
}

fn positive_ms(field: &str, value: Option<i64>) -> Result<Option<i64>, CoreError> {
    match value {
        Some(ms) if ms <= 0 => Err(CoreError::validation(
            field,
            format!("{field} must be a positive number of milliseconds, not {ms}"),
        )),
        other => Ok(other),
    }
}

/// A duration given as ISO-8601 text under `name` or as integer ms under `name_ms`.
fn policy_duration(policy: &Map<String, Value>, name: &str) -> Result<Option<i64>, CoreError> {
    let ms_name = format!("{name}_ms");
    if let Some(value) = policy.get(&ms_name).filter(|v| !v.is_null()) {
        return value.as_i64().map(Some).ok_or_else(|| {
            CoreError::validation(&ms_name, format!("retry.{ms_name} must be an integer"))
        });
    }
    match policy.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(text)) => parse_duration_ms(text).map(Some).ok_or_else(|| {
            CoreError::validation(
                name,
                format!("retry.{name} {text:?} is not an ISO-8601 duration"),
            )
        }),
        Some(Value::Number(n)) => n
            .as_i64()
            .map(Some)
            .ok_or_else(|| CoreError::validation(name, format!("retry.{name} must be a duration"))),
        Some(_) => Err(CoreError::validation(
            name,
            format!("retry.{name} must be an ISO-8601 duration string"),
        )),
    }
}

/// Normalises a retry policy in any accepted spelling, filling defaults; 422 on out-of-range values.
pub fn retry_policy(input: Option<&Value>) -> Result<RetryPolicy, CoreError> {
    let mut policy = RetryPolicy::default();
    let Some(input) = input.filter(|v| !v.is_null()) else {
        return Ok(policy);
    };
    let map = input
        .as_object()
        .ok_or_else(|| CoreError::validation("retry", "retry must be an object"))?;
    if let Some(v) = map.get("max_attempts").filter(|v| !v.is_null()) {
        let n = v.as_i64().ok_or_else(|| {
            CoreError::validation("max_attempts", "retry.max_attempts must be an integer")
        })?;
        if !(0..=i64::from(i32::MAX)).contains(&n) {
            return Err(CoreError::validation(
                "max_attempts",
                format!("retry.max_attempts must be 0 or more, not {n}"),
            ));
        }
        // 0 and 1 both mean a single attempt.
        policy.max_attempts = (n as i32).max(1);
    }
    if let Some(ms) = policy_duration(map, "initial_interval")? {
        if ms <= 0 {
            return Err(CoreError::validation(
                "initial_interval",
                "retry.initial_interval must be positive",
            ));
        }
        policy.initial_interval_ms = ms;
    }
    if let Some(ms) = policy_duration(map, "max_interval")? {
        policy.max_interval_ms = ms;
    }
    if policy.max_interval_ms < policy.initial_interval_ms {
        return Err(CoreError::validation(
            "max_interval",
            "retry.max_interval must be at least retry.initial_interval",
        ));
    }
    if let Some(v) = map.get("backoff_coefficient").filter(|v| !v.is_null()) {
        let c = v.as_f64().ok_or_else(|| {
            CoreError::validation(
                "backoff_coefficient",
                "retry.backoff_coefficient must be a number",
            )
        })?;
        if c < 1.0 || !c.is_finite() {
            return Err(CoreError::validation(
                "backoff_coefficient",
                format!("retry.backoff_coefficient must be at least 1.0, not {c}"),
            ));
        }
        policy.backoff_coefficient = c;
    }
    if let Some(v) = map.get("jitter").filter(|v| !v.is_null()) {
        policy.jitter = v
            .as_bool()
            .ok_or_else(|| CoreError::validation("jitter", "retry.jitter must be a boolean"))?;
    }
    if let Some(v) = map.get("non_retryable_errors").filter(|v| !v.is_null()) {
        let list = v.as_array().ok_or_else(|| {
            CoreError::validation(
                "non_retryable_errors",
                "retry.non_retryable_errors must be an array of strings",
            )
        })?;
        policy.non_retryable_errors = list
            .iter()
            .map(|e| e.as_str().map(str::to_string))
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| {
                CoreError::validation(
                    "non_retryable_errors",
                    "retry.non_retryable_errors must be an array of strings",
                )
            })?;
    }
    if let Some(v) = map.get("on_exhaustion").filter(|v| !v.is_null()) {
        match v.as_str() {
            Some(s @ ("discard" | "dead_letter")) => policy.on_exhaustion = s.to_string(),
            _ => {
                return Err(CoreError::validation(
                    "on_exhaustion",
                    "retry.on_exhaustion must be \"discard\" or \"dead_letter\"",
                ));
            }
        }
    }
    let strategy = ["backoff_type", "backoff_strategy", "backoff"]
        .iter()
        .find_map(|k| map.get(*k).filter(|v| !v.is_null()));
    if let Some(v) = strategy {
        match v.as_str() {
            Some(s @ ("exponential" | "linear" | "constant")) => {
                policy.backoff_type = s.to_string()
            }
            _ => {
                return Err(CoreError::validation(
                    "backoff_type",
                    "retry.backoff_type must be exponential, linear or constant",
                ));
            }
        }
    }
    Ok(policy)
}

/// Field names the server manages; a caller cannot set them through unknown top-level fields.
const SYSTEM_FIELDS: &[&str] = &[
    "specversion",
    "id",
    "type",
    "queue",
    "args",
    "meta",
    "options",
    "state",
    "previous_state",
    "priority",
    "attempt",
    "max_attempts",
    "timeout_ms",
    "visibility_timeout_ms",
    "tags",
    "retry",
    "unique",
    "created_at",
    "enqueued_at",
    "scheduled_at",
    "expires_at",
    "started_at",
    "completed_at",
    "cancelled_at",
    "result",
    "error",
    "errors",
    "retry_delay_ms",
    "worker_id",
    "lease_token",
    "lease_expires_at",
];

/// Validates a job to enqueue and returns its stored form (s3p.job field names).
pub fn new_job_row(job: &EnqueueJob, now: DateTime<Utc>) -> Result<Value, CoreError> {
    check_job_type(&job.job_type)?;
    let id = match &job.id {
        Some(id) => parse_new_job_id(id)?,
        None => Uuid::now_v7(),
    };
    let options = &job.options;
    let queue = options
        .queue
        .clone()
        .unwrap_or_else(|| "default".to_string());
    check_queue_name(&queue)?;
    let priority = options.priority.unwrap_or(0);
    if !PRIORITY_RANGE.contains(&priority) {
        return Err(CoreError::invalid(format!(
            "priority {priority} is out of range: it must be between -100 and 100"
        ))
        .with_detail("field", "priority".into()));
    }
    let timeout_ms = positive_ms("timeout_ms", options.timeout_ms)?;
    let visibility_timeout_ms =
        positive_ms("visibility_timeout_ms", options.visibility_timeout_ms)?;
    let scheduled_at = options
        .scheduled_at
        .as_deref()
        .map(|t| parse_instant("scheduled_at", t, now))
        .transpose()?;
    let expires_at = options
        .expires_at
        .as_deref()
        .map(|t| parse_instant("expires_at", t, now))
        .transpose()?;
    let retry = retry_policy(options.retry.as_ref())?;
    if let Some(unique) = &options.unique
        && !unique.is_object()
        && !unique.is_null()
    {
        return Err(CoreError::invalid("options.unique must be an object"));
    }
    let mut meta = job.meta.clone();
    if let Some(metadata) = &options.metadata {
        let target = meta.get_or_insert_with(Map::new);
        for (k, v) in metadata {
            target.insert(k.clone(), v.clone());
        }
    }
    let row = json!({
        "id": id,
        "queue": queue,
        "type": job.job_type,
        "args": job.args,
        "meta": meta,
        "extra": job
            .extra
            .iter()
            .filter(|(k, _)| !SYSTEM_FIELDS.contains(&k.as_str()))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect::<Map<String, Value>>(),
        "state": if options.pending { "pending" } else { "available" },
        "priority": priority,
        "max_attempts": retry.max_attempts,
        "timeout_ms": timeout_ms,
        "visibility_timeout_ms": visibility_timeout_ms,
        "retry": retry,
        "uniq": options.unique,
        "tags": options.tags.clone().unwrap_or_default(),
        "scheduled_at": scheduled_at,
        "expires_at": expires_at,
        "errors": [],
    });
    check_no_nul("job", &row)?;
    Ok(row)
}

/// Changes to a queue's configuration; `None` leaves a setting, `Some(None)` clears a quota.
#[derive(Debug, Clone, Default)]
pub struct QueueConfigChanges {
    /// Nacks before a stream message is dead-lettered.
    pub max_retries: Option<i64>,
    /// Stream retention (duration text, at least 1s).
    pub retention: Option<String>,
    /// How long terminal jobs are kept (duration text).
    pub job_retention: Option<String>,
    /// Quota on non-terminal jobs.
    pub max_jobs: Option<Option<i64>>,
    /// Quota on retained stream events.
    pub max_stream_events: Option<Option<i64>>,
    /// Storage parameters of the jobs table (autovacuum_*, fillfactor).
    pub autovacuum: Option<Map<String, Value>>,
}

fn duration_field(field: &str, text: &str, min_ms: i64) -> Result<i64, CoreError> {
    let ms = super::time::parse_flexible_duration_ms(text).ok_or_else(|| {
        CoreError::invalid(format!(
            "{field} {text:?} is not a duration (500ms, 2s, 720h or PT2S)"
        ))
        .with_detail("field", field.into())
    })?;
    if ms < min_ms {
        return Err(
            CoreError::invalid(format!("{field} must be at least {min_ms}ms"))
                .with_detail("field", field.into()),
        );
    }
    Ok(ms)
}

/// Validates configuration changes into the JSON `s3p.queue_config` takes.
pub fn queue_config_changes(c: &QueueConfigChanges) -> Result<Value, CoreError> {
    let mut out = Map::new();
    if let Some(n) = c.max_retries {
        if !(0..=1000).contains(&n) {
            return Err(CoreError::invalid(format!(
                "max_retries must be between 0 and 1000, not {n}"
            ))
            .with_detail("field", "max_retries".into()));
        }
        out.insert("max_retries".into(), n.into());
    }
    if let Some(text) = &c.retention {
        out.insert(
            "retention_ms".into(),
            duration_field("retention", text, 1000)?.into(),
        );
    }
    if let Some(text) = &c.job_retention {
        out.insert(
            "job_retention_ms".into(),
            duration_field("job_retention", text, 1)?.into(),
        );
    }
    for (name, quota) in [
        ("max_jobs", c.max_jobs),
        ("max_stream_events", c.max_stream_events),
    ] {
        match quota {
            None => {}
            Some(None) => {
                out.insert(name.into(), Value::Null);
            }
            Some(Some(n)) if n >= 0 => {
                out.insert(name.into(), n.into());
            }
            Some(Some(n)) => {
                return Err(
                    CoreError::invalid(format!("{name} must not be negative, not {n}"))
                        .with_detail("field", name.into()),
                );
            }
        }
    }
    if let Some(settings) = &c.autovacuum {
        out.insert("autovacuum".into(), Value::Object(settings.clone()));
    }
    Ok(Value::Object(out))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn job_types_follow_the_ojs_pattern() {
        for ok in ["email.send", "a", "dlq.test.list-first", "x_y.z9"] {
            assert!(check_job_type(ok).is_ok(), "{ok}");
        }
        for bad in [
            "",
            "Email.send",
            "1abc",
            "a..b",
            "a.",
            "a b",
            "a@b",
            &"a".repeat(256),
        ] {
            assert!(check_job_type(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn queue_names_follow_the_ojs_pattern() {
        for ok in ["default", "0", "a.b-c"] {
            assert!(check_queue_name(ok).is_ok(), "{ok}");
        }
        for bad in ["", "Default", "-a", ".a", "a_b", "a b", &"q".repeat(129)] {
            assert!(check_queue_name(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn caller_ids_must_be_lowercase_uuidv7() {
        assert!(parse_new_job_id("019539a4-aaaa-7000-8000-111111111111").is_ok());
        assert!(parse_new_job_id("019539A4-AAAA-7000-8000-111111111111").is_err());
        assert!(parse_new_job_id("6f1c2a34-5b6d-4e7f-8a9b-0c1d2e3f4a5b").is_err());
        assert!(parse_new_job_id("not-a-uuid").is_err());
        assert!(parse_new_job_id("019539a4aaaa70008000111111111111").is_err());
    }

    #[test]
    fn nul_characters_are_refused_anywhere() {
        assert!(check_no_nul("x", &json!({"a": ["ok", {"b": "fine"}]})).is_ok());
        assert!(check_no_nul("x", &json!(["a\u{0}b"])).is_err());
        assert!(check_no_nul("x", &json!({"k\u{0}": 1})).is_err());
        assert!(check_text("w", "w\u{0}").is_err());
        assert!(check_offset(-1).is_err() && check_offset(2_147_483_648).is_err());
    }

    #[test]
    fn retry_policies_normalise_and_reject_out_of_range() {
        let p = retry_policy(Some(
            &json!({"max_attempts": 5, "initial_interval": "PT2S", "max_interval_ms": 10000}),
        ))
        .expect("valid");
        assert_eq!(
            (p.max_attempts, p.initial_interval_ms, p.max_interval_ms),
            (5, 2000, 10000)
        );
        let e = retry_policy(Some(&json!({"max_attempts": -1}))).expect_err("negative");
        assert!(e.message.contains("max_attempts"));
        let e = retry_policy(Some(&json!({"backoff_coefficient": 0.5}))).expect_err("coefficient");
        assert!(e.message.contains("backoff_coefficient"));
        assert!(retry_policy(Some(&json!({"on_exhaustion": "explode"}))).is_err());
    }
}
