//! Validation and normalisation of client input: every rule about what a request may contain.

use chrono::{DateTime, Datelike as _, Duration, Utc};
use serde_json::{Map, Value, json};
use uuid::Uuid;

use super::error::CoreError;
use super::job::{EnqueueJob, JobTime, NewJob, RetryPolicy, mint_job_id};
use crate::model::time::{parse_duration_ms, stored_instant};

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

/// The refusal of a NUL character in `field`.
pub(super) fn nul_error(field: &str) -> CoreError {
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
        None => Ok(None),
        Some(t) => Uuid::try_parse(t).map(Some).map_err(|_| {
            CoreError::invalid(format!("lease_token {t:?} is not a lease token"))
                .with_detail("field", "lease_token".into())
        }),
    }
}

/// Largest retry backoff coefficient: beyond it the second retry already waits for any
/// `max_interval`; the delay itself saturates at `max_interval` in SQL (`s3p.retry_delay_ms`).
pub const MAX_BACKOFF_COEFFICIENT: f64 = 100.0;

/// Longest duration a client may send anywhere: delays, retention, takeover, retry intervals,
/// unique periods, stream retry_after and older_than. 10 years: beyond any schedule, and `now`
/// plus it fits every clock type on the way (chrono, PostgreSQL intervals and timestamps).
pub const MAX_DURATION_MS: i64 = 3650 * 86_400_000;

/// A duration a client sent, at most `MAX_DURATION_MS` (else 400 invalid_request naming the field).
pub fn bounded_duration(field: &str, ms: i64) -> Result<i64, CoreError> {
    if ms > MAX_DURATION_MS {
        return Err(CoreError::invalid(format!(
            "{field} must be at most {MAX_DURATION_MS} ms (10 years), not {ms}"
        ))
        .with_detail("field", field.into()));
    }
    Ok(ms)
}

/// A job option's time as a client writes it: RFC 3339 with a zone, or `+` and an ISO-8601
/// duration. The error names `field`.
pub fn job_time(field: &str, text: &str) -> Result<JobTime, CoreError> {
    JobTime::parse(text).ok_or_else(|| {
        let message = if text.starts_with('+') {
            format!("{field} {text:?} is not a +ISO-8601 duration")
        } else {
            format!("{field} {text:?} is not an RFC 3339 time with a zone (or a +PT.. duration)")
        };
        CoreError::invalid(message).with_detail("field", field.into())
    })
}

/// The instant a job option's time stands for; a span counts from `now`, at most 10 years.
fn instant(field: &str, when: JobTime, now: DateTime<Utc>) -> Result<DateTime<Utc>, CoreError> {
    let invalid = |why: &str| {
        CoreError::invalid(format!("{field} {:?} {why}", when.to_string()))
            .with_detail("field", field.into())
    };
    match when {
        // Normalised first, so the answer (built from it) says what GET will read back.
        JobTime::At(t) => {
            let t = stored_instant(t);
            // Years 1-9999 in UTC: PostgreSQL has no year 0 (an RFC 3339 text with an offset
            // can still land there), and text parses only to year 9999; a typed time (gRPC) too.
            if (1..=9999).contains(&t.year()) {
                Ok(t)
            } else {
                Err(invalid("is out of range (years 0001-9999 in UTC)"))
            }
        }
        // Only a typed span (gRPC) can be negative: no +ISO-8601 text says that.
        JobTime::After(ms) if ms < 0 => Err(invalid("is not a +ISO-8601 duration")),
        JobTime::After(ms) => now
            .checked_add_signed(Duration::milliseconds(bounded_duration(field, ms)?))
            .map(stored_instant)
            .ok_or_else(|| invalid("is out of range")),
    }
}

/// An error about a part of a request, so named (`job_template: ...`).
pub fn within(what: &str, mut error: CoreError) -> CoreError {
    error.message = format!("{what}: {}", error.message);
    error
}

/// An error of the `index`th job of a batch, so named.
pub fn batch_item_error(index: usize, mut error: CoreError) -> CoreError {
    error.message = format!("jobs[{index}]: {}", error.message);
    error.with_detail("index", index.into())
}

/// Longest lease a client may ask for (`visibility_timeout_ms`, `timeout_ms`): 7 days. Beyond
/// some such bound the lease's end no longer fits a timestamp and every claim of the queue fails.
pub const MAX_LEASE_MS: i64 = 7 * 24 * 3600 * 1000;

/// A lease length a client sent: positive (else `negative`, the caller's error for it) and at most
/// `MAX_LEASE_MS` (else 400 invalid_request naming the field).
pub fn lease_ms(
    field: &str,
    value: Option<i64>,
    negative: impl FnOnce(i64) -> CoreError,
) -> Result<Option<i64>, CoreError> {
    match value {
        Some(ms) if ms <= 0 => Err(negative(ms)),
        Some(ms) if ms > MAX_LEASE_MS => Err(CoreError::invalid(format!(
            "{field} must be at most {MAX_LEASE_MS} ms (7 days), not {ms}"
        ))
        .with_detail("field", field.into())),
        other => Ok(other),
    }
}

/// The validation error of a job option that must be a positive number of milliseconds.
fn not_positive(field: &str, ms: i64) -> CoreError {
    CoreError::validation(
        field,
        format!("{field} must be a positive number of milliseconds, not {ms}"),
    )
}

/// A duration given as ISO-8601 text under `name` or as integer ms under `name_ms`.
fn policy_duration(policy: &Map<String, Value>, name: &str) -> Result<Option<i64>, CoreError> {
    let ms_name = format!("{name}_ms");
    let ms = if let Some(value) = policy.get(&ms_name).filter(|v| !v.is_null()) {
        value.as_i64().map(Some).ok_or_else(|| {
            CoreError::validation(&ms_name, format!("retry.{ms_name} must be an integer"))
        })?
    } else {
        policy_duration_text(policy, name)?
    };
    match ms {
        Some(ms) if ms > MAX_DURATION_MS => Err(CoreError::validation(
            name,
            format!("retry.{name} must be at most {MAX_DURATION_MS} ms (10 years), not {ms}"),
        )),
        other => Ok(other),
    }
}

/// A retry duration given as ISO-8601 text (or a bare number of ms) under `name`.
fn policy_duration_text(policy: &Map<String, Value>, name: &str) -> Result<Option<i64>, CoreError> {
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
        if !(1.0..=MAX_BACKOFF_COEFFICIENT).contains(&c) {
            return Err(CoreError::validation(
                "backoff_coefficient",
                format!(
                    "retry.backoff_coefficient must be 1.0 to {MAX_BACKOFF_COEFFICIENT}, not {c}"
                ),
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

/// Job states a unique policy may name.
const UNIQUE_STATES: &[&str] = &[
    "available",
    "active",
    "scheduled",
    "retryable",
    "pending",
    "completed",
    "cancelled",
    "discarded",
];

/// Normalises a unique policy and computes the job's unique key: SHA-256 (hex) of the canonical JSON
/// (sorted keys) of the chosen dimensions: type always, and queue / args / meta as `keys` says
/// (narrowed by `args_keys` / `meta_keys`). Returns (stored policy, key).
pub fn unique_policy(
    input: &Value,
    job_type: &str,
    queue: &str,
    args: &[Value],
    meta: Option<&Map<String, Value>>,
) -> Result<(Value, String), CoreError> {
    use sha2::{Digest, Sha256};
    let policy = input.as_object().ok_or_else(|| {
        CoreError::invalid("options.unique must be an object").with_detail("field", "unique".into())
    })?;
    let strings = |name: &str| -> Result<Option<Vec<String>>, CoreError> {
        match policy.get(name) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::Array(items)) => items
                .iter()
                .map(|i| i.as_str().map(str::to_string))
                .collect::<Option<Vec<_>>>()
                .map(Some)
                .ok_or_else(|| {
                    CoreError::invalid(format!("unique.{name} must be an array of strings"))
                }),
            Some(_) => Err(CoreError::invalid(format!(
                "unique.{name} must be an array of strings"
            ))),
        }
    };
    let keys = match strings("keys")? {
        Some(k) => k,
        None => {
            strings("key")?.unwrap_or_else(|| vec!["type".into(), "queue".into(), "args".into()])
        }
    };
    if let Some(bad) = keys
        .iter()
        .find(|k| !matches!(k.as_str(), "type" | "queue" | "args" | "meta"))
    {
        return Err(CoreError::invalid(format!(
            "unique.keys may only name type, queue, args and meta, not {bad:?}"
        )));
    }
    let args_keys = strings("args_keys")?;
    let meta_keys = strings("meta_keys")?;
    if keys.iter().any(|k| k == "meta") && meta_keys.is_none() {
        return Err(CoreError::invalid(
            "unique.meta_keys is required when unique.keys names meta",
        ));
    }
    let on_conflict = match policy.get("on_conflict").and_then(Value::as_str) {
        None => "reject",
        Some(c @ ("reject" | "ignore" | "replace" | "replace_except_schedule")) => c,
        Some(other) => {
            return Err(CoreError::invalid(format!(
                "unique.on_conflict {other:?} must be reject, ignore, replace or replace_except_schedule"
            )));
        }
    };
    let states = strings("states")?.unwrap_or_else(|| {
        ["available", "active", "scheduled", "retryable", "pending"]
            .iter()
            .map(|s| s.to_string())
            .collect()
    });
    if let Some(bad) = states.iter().find(|s| !UNIQUE_STATES.contains(&s.as_str())) {
        return Err(CoreError::invalid(format!(
            "unique.states names an unknown state {bad:?}"
        )));
    }
    let period_ms = match (policy.get("period_ms"), policy.get("period")) {
        (Some(Value::Number(n)), _) => n.as_i64(),
        (_, Some(Value::String(p))) => Some(parse_duration_ms(p).ok_or_else(|| {
            CoreError::invalid(format!("unique.period {p:?} is not an ISO-8601 duration"))
        })?),
        (None | Some(Value::Null), None | Some(Value::Null)) => None,
        _ => {
            return Err(CoreError::invalid(
                "unique.period must be an ISO-8601 duration",
            ));
        }
    };
    if period_ms.is_some_and(|p| p <= 0) {
        return Err(CoreError::invalid("unique.period must be positive"));
    }
    if let Some(ms) = period_ms {
        bounded_duration("unique.period", ms)?;
    }

    let mut canonical = Map::new();
    canonical.insert("type".into(), job_type.into());
    if keys.iter().any(|k| k == "queue") {
        canonical.insert("queue".into(), queue.into());
    }
    if keys.iter().any(|k| k == "args") {
        let selected: Vec<Value> = match &args_keys {
            None => args.to_vec(),
            Some(names) => args
                .iter()
                .map(|a| match a {
                    Value::Object(o) => Value::Object(
                        o.iter()
                            .filter(|(k, _)| names.contains(k))
                            .map(|(k, v)| (k.clone(), v.clone()))
                            .collect(),
                    ),
                    other => other.clone(),
                })
                .collect(),
        };
        canonical.insert("args".into(), Value::Array(selected));
    }
    if keys.iter().any(|k| k == "meta") {
        let names = meta_keys.clone().unwrap_or_default();
        let selected: Map<String, Value> = meta
            .map(|m| {
                m.iter()
                    .filter(|(k, _)| names.contains(k))
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect()
            })
            .unwrap_or_default();
        canonical.insert("meta".into(), Value::Object(selected));
    }
    // serde_json's Map keeps keys sorted, so this text is canonical for equal values.
    let digest = Sha256::digest(Value::Object(canonical).to_string().as_bytes());
    let key: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    let mut stored = policy.clone();
    stored.insert("keys".into(), json!(keys));
    stored.insert("states".into(), json!(states));
    stored.insert("on_conflict".into(), on_conflict.into());
    if let Some(p) = period_ms {
        stored.insert("period_ms".into(), p.into());
    }
    Ok((Value::Object(stored), key))
}

/// The claim rate from `options.rate_limit` (`{max_per_second}`), if any.
fn rate_limit(input: Option<&Value>) -> Result<Option<f64>, CoreError> {
    let Some(value) = input.filter(|v| !v.is_null()) else {
        return Ok(None);
    };
    let rate = value
        .get("max_per_second")
        .and_then(Value::as_f64)
        .ok_or_else(|| {
            CoreError::invalid("options.rate_limit must be {\"max_per_second\": number}")
        })?;
    check_claim_rate("options.rate_limit.max_per_second", rate).map(Some)
}

/// The claim rates a queue may have, per second, whichever API sets them: below one a day a
/// queue is frozen, not limited (pause it instead); above 1e9 nothing is limited, and the claim's
/// token count must stay a 32-bit integer.
pub(crate) fn check_claim_rate(field: &str, per_second: f64) -> Result<f64, CoreError> {
    if per_second.is_finite() && (1.0 / 86_400.0..=1e9).contains(&per_second) {
        return Ok(per_second);
    }
    Err(CoreError::invalid(format!(
        "{field}: {per_second} claims per second is out of range: between one a day and 1e9 a \
         second (to stop a queue, pause it)"
    ))
    .with_detail("field", field.into()))
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
pub fn new_job_row(job: &EnqueueJob, now: DateTime<Utc>) -> Result<NewJob, CoreError> {
    check_job_type(&job.job_type)?;
    let queue = job.queue().to_string();
    check_queue_name(&queue)?;
    let (id, minted) = match &job.id {
        Some(id) => (parse_new_job_id(id)?, false),
        None => (mint_job_id(&queue), true),
    };
    let options = &job.options;
    let priority = options.priority.unwrap_or(0);
    if !PRIORITY_RANGE.contains(&priority) {
        return Err(CoreError::invalid(format!(
            "priority {priority} is out of range: it must be between -100 and 100"
        ))
        .with_detail("field", "priority".into()));
    }
    let timeout_ms = lease_ms("timeout_ms", options.timeout_ms, |ms| {
        not_positive("timeout_ms", ms)
    })?;
    let visibility_timeout_ms = lease_ms(
        "visibility_timeout_ms",
        options.visibility_timeout_ms,
        |ms| not_positive("visibility_timeout_ms", ms),
    )?;
    let scheduled_at = options
        .scheduled_at
        .map(|t| instant("scheduled_at", t, now))
        .transpose()?;
    let expires_at = options
        .expires_at
        .map(|t| instant("expires_at", t, now))
        .transpose()?;
    let retry = retry_policy(options.retry.as_ref())?;
    let mut meta = job.meta.clone();
    if let Some(metadata) = &options.metadata {
        let target = meta.get_or_insert_with(Map::new);
        for (k, v) in metadata {
            target.insert(k.clone(), v.clone());
        }
    }
    // The producer's trace context rides in meta (OJS: traceparent/tracestate), unless the
    // caller already put its own there.
    if let Some(trace) = &job.trace_context {
        let target = meta.get_or_insert_with(Map::new);
        target
            .entry("traceparent")
            .or_insert_with(|| trace.parent.clone().into());
        if let Some(state) = &trace.state {
            target
                .entry("tracestate")
                .or_insert_with(|| state.clone().into());
        }
    }
    let (unique, unique_key) = match options.unique.as_ref().filter(|u| !u.is_null()) {
        Some(u) => {
            let (policy, key) = unique_policy(u, &job.job_type, &queue, &job.args, meta.as_ref())?;
            (Some(policy), Some(key))
        }
        None => (None, None),
    };
    let rate = rate_limit(options.rate_limit.as_ref())?;
    let row = NewJob {
        id,
        // Minted ids carry their queue and need no s3p.job_index row (s3p.given_job_ids).
        id_minted: minted,
        queue,
        job_type: job.job_type.clone(),
        args: job.args.clone(),
        meta,
        extra: job
            .extra
            .iter()
            .filter(|(k, _)| !SYSTEM_FIELDS.contains(&k.as_str()))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
        state: if options.pending {
            "pending"
        } else {
            "available"
        },
        priority,
        max_attempts: retry.max_attempts,
        timeout_ms,
        visibility_timeout_ms,
        retry: retry.stored(),
        uniq: unique,
        unique_key,
        tags: options.tags.clone().unwrap_or_default(),
        scheduled_at,
        expires_at,
        errors: Vec::new(),
        rate_limit_per_second: rate,
    };
    check_new_job_text(&row)?;
    Ok(row)
}

/// Refuses NUL characters anywhere in a new job's text (PostgreSQL stores none).
fn check_new_job_text(row: &NewJob) -> Result<(), CoreError> {
    for text in [
        Some(&row.job_type),
        Some(&row.queue),
        row.unique_key.as_ref(),
    ]
    .into_iter()
    .flatten()
    .chain(&row.tags)
    {
        check_text("job", text)?;
    }
    for value in row.args.iter().chain([&row.retry]).chain(&row.uniq) {
        check_no_nul("job", value)?;
    }
    for map in [Some(&row.extra), row.meta.as_ref()].into_iter().flatten() {
        for (key, value) in map {
            check_text("job", key)?;
            check_no_nul("job", value)?;
        }
    }
    Ok(())
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
    /// Whether job lifecycle events are also appended to the queue's stream.
    pub mirror_job_events: Option<bool>,
    /// How long a cooperative member's unacked batch is its own (duration text, at least 1ms).
    pub takeover: Option<String>,
    /// Most events one stream tick adds.
    pub tick_max_events: Option<i64>,
    /// Most bytes one stream tick adds.
    pub tick_max_bytes: Option<i64>,
}

fn duration_field(field: &str, text: &str, min_ms: i64) -> Result<i64, CoreError> {
    let ms = crate::model::time::parse_flexible_duration_ms(text).ok_or_else(|| {
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
    bounded_duration(field, ms)
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
    super::stream::check_tick_bounds(c.tick_max_events, c.tick_max_bytes)?;
    for (name, value) in [
        ("tick_max_events", c.tick_max_events),
        ("tick_max_bytes", c.tick_max_bytes),
    ] {
        if let Some(n) = value {
            out.insert(name.into(), n.into());
        }
    }
    if let Some(text) = &c.takeover {
        out.insert(
            "takeover_ms".into(),
            duration_field("takeover", text, 1)?.into(),
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
    if let Some(mirror) = c.mirror_job_events {
        out.insert("mirror_job_events".into(), mirror.into());
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
    fn unique_keys_depend_only_on_the_chosen_dimensions() {
        let policy = json!({"keys": ["type", "args"]});
        let (_, a) =
            unique_policy(&policy, "t", "q1", &[json!({"x": 1, "y": 2})], None).expect("valid");
        let (_, b) =
            unique_policy(&policy, "t", "q2", &[json!({"y": 2, "x": 1})], None).expect("valid");
        let (_, c) = unique_policy(&policy, "t", "q1", &[json!({"x": 2})], None).expect("valid");
        assert_eq!(
            a, b,
            "queue is not a dimension and key order does not matter"
        );
        assert_ne!(a, c);
        let narrowed = json!({"keys": ["type", "args"], "args_keys": ["x"]});
        let (_, d) =
            unique_policy(&narrowed, "t", "q", &[json!({"x": 1, "y": 2})], None).expect("valid");
        let (_, e) =
            unique_policy(&narrowed, "t", "q", &[json!({"x": 1, "y": 3})], None).expect("valid");
        assert_eq!(d, e);
        assert!(unique_policy(&json!({"keys": ["meta"]}), "t", "q", &[], None).is_err());
        assert!(unique_policy(&json!({"on_conflict": "explode"}), "t", "q", &[], None).is_err());
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

    #[test]
    fn job_times_read_their_text_and_count_spans_from_now() {
        let now = parse_time_or_panic("2026-01-01T00:00:00Z");
        let after = job_time("expires_at", "+PT1H").expect("a span");
        assert_eq!(after, JobTime::After(3_600_000));
        assert_eq!(
            instant("expires_at", after, now).ok(),
            Some(now + Duration::hours(1))
        );
        let at = job_time("scheduled_at", "2026-01-01T02:00:00.250+02:00").expect("a time");
        assert_eq!(at.to_string(), "2026-01-01T00:00:00.250Z");
        // Cron templates keep the text; it reads back as the same time.
        let stored = serde_json::to_value(at).expect("text");
        assert_eq!(serde_json::from_value::<JobTime>(stored).ok(), Some(at));
        let e = job_time("expires_at", "+1h").expect_err("not ISO-8601");
        assert_eq!(e.message, "expires_at \"+1h\" is not a +ISO-8601 duration");
        assert!(job_time("scheduled_at", "2026-01-01T00:00:00").is_err());
        let e = instant("expires_at", JobTime::After(-5000), now).expect_err("negative");
        assert_eq!(
            e.message,
            "expires_at \"+PT-5S\" is not a +ISO-8601 duration"
        );
        assert!(instant("expires_at", JobTime::After(MAX_DURATION_MS + 1), now).is_err());
    }

    fn parse_time_or_panic(text: &str) -> DateTime<Utc> {
        crate::model::time::parse_time(text).expect("a valid time")
    }
}
