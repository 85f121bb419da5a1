//! Core types ↔ protobuf messages, and JSON ↔ `google.protobuf.Value`.

use chrono::{DateTime, Utc};
use prost_types::value::Kind;
use serde_json::{Map, Number, Value, json};

use super::proto::ojs::v1 as pb;
use crate::core::job::{Failure, JobOptions, JobTime, RetryPolicy};
use crate::core::workflow::{CronEntry, NewStep, NewWorkflow, StepState, Workflow};
use crate::core::{CoreError, EnqueueJob, Job, JobState, WorkerDirective};

/// The queues the call's token may see (every queue without a scoped token).
pub fn scope<T>(request: &tonic::Request<T>) -> crate::core::Scope {
    crate::middleware::QueueAdmission::of(request.extensions()).scope()
}

/// JSON → protobuf Value.
pub fn to_value(value: &Value) -> prost_types::Value {
    into_value(value.clone())
}

/// JSON → protobuf Value, moving strings and keys instead of copying them.
pub fn into_value(value: Value) -> prost_types::Value {
    let kind = match value {
        Value::Null => Kind::NullValue(0),
        Value::Bool(b) => Kind::BoolValue(b),
        Value::Number(n) => Kind::NumberValue(n.as_f64().unwrap_or(0.0)),
        Value::String(s) => Kind::StringValue(s),
        Value::Array(items) => Kind::ListValue(prost_types::ListValue {
            values: items.into_iter().map(into_value).collect(),
        }),
        Value::Object(map) => Kind::StructValue(prost_types::Struct {
            fields: map.into_iter().map(|(k, v)| (k, into_value(v))).collect(),
        }),
    };
    prost_types::Value { kind: Some(kind) }
}

/// JSON text → protobuf Value, built straight from the text (no `serde_json::Value` between);
/// `null` for text that is not JSON, which a `RawJson` never holds.
pub fn raw_into_value(raw: &crate::model::raw_json::RawJson) -> prost_types::Value {
    serde_json::from_str::<ProtoValue>(raw.get()).map_or(
        prost_types::Value {
            kind: Some(Kind::NullValue(0)),
        },
        |v| v.0,
    )
}

/// Protobuf Value → JSON text, written straight from the value (no `serde_json::Value` between),
/// with the numbers of [`from_value`].
pub fn value_into_raw(value: &prost_types::Value) -> crate::model::raw_json::RawJson {
    serde_json::value::to_raw_value(&ProtoJson(value))
        .map(Into::into)
        .unwrap_or_default()
}

/// A protobuf Value serialized as JSON.
struct ProtoJson<'a>(&'a prost_types::Value);

impl serde::Serialize for ProtoJson<'_> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match &self.0.kind {
            None | Some(Kind::NullValue(_)) => serializer.serialize_unit(),
            Some(Kind::BoolValue(b)) => serializer.serialize_bool(*b),
            Some(Kind::NumberValue(n)) => match json_number(*n) {
                Some(n) => n.serialize(serializer),
                None => serializer.serialize_unit(),
            },
            Some(Kind::StringValue(s)) => serializer.serialize_str(s),
            Some(Kind::ListValue(list)) => {
                serializer.collect_seq(list.values.iter().map(ProtoJson))
            }
            Some(Kind::StructValue(s)) => {
                serializer.collect_map(s.fields.iter().map(|(k, v)| (k, ProtoJson(v))))
            }
        }
    }
}

/// A protobuf number as JSON: integral ones within 9e15 as integers, NaN and infinities as none.
fn json_number(n: f64) -> Option<Number> {
    if n.fract() == 0.0 && n.abs() < 9.0e15 {
        Some(Number::from(n as i64))
    } else {
        Number::from_f64(n)
    }
}

/// A protobuf Value deserialized from JSON; numbers become doubles, as in [`into_value`].
struct ProtoValue(prost_types::Value);

impl<'de> serde::Deserialize<'de> for ProtoValue {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(ProtoValueVisitor)
    }
}

struct ProtoValueVisitor;

impl ProtoValueVisitor {
    fn of(kind: Kind) -> ProtoValue {
        ProtoValue(prost_types::Value { kind: Some(kind) })
    }
}

impl<'de> serde::de::Visitor<'de> for ProtoValueVisitor {
    type Value = ProtoValue;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_unit<E>(self) -> Result<ProtoValue, E> {
        Ok(Self::of(Kind::NullValue(0)))
    }
    fn visit_bool<E>(self, b: bool) -> Result<ProtoValue, E> {
        Ok(Self::of(Kind::BoolValue(b)))
    }
    fn visit_i64<E>(self, n: i64) -> Result<ProtoValue, E> {
        Ok(Self::of(Kind::NumberValue(n as f64)))
    }
    fn visit_u64<E>(self, n: u64) -> Result<ProtoValue, E> {
        Ok(Self::of(Kind::NumberValue(n as f64)))
    }
    fn visit_f64<E>(self, n: f64) -> Result<ProtoValue, E> {
        Ok(Self::of(Kind::NumberValue(n)))
    }
    fn visit_str<E>(self, s: &str) -> Result<ProtoValue, E> {
        Ok(Self::of(Kind::StringValue(s.to_string())))
    }
    fn visit_string<E>(self, s: String) -> Result<ProtoValue, E> {
        Ok(Self::of(Kind::StringValue(s)))
    }
    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<ProtoValue, A::Error> {
        let mut values = Vec::with_capacity(seq.size_hint().unwrap_or(0));
        while let Some(ProtoValue(v)) = seq.next_element()? {
            values.push(v);
        }
        Ok(Self::of(Kind::ListValue(prost_types::ListValue { values })))
    }
    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<ProtoValue, A::Error> {
        let mut fields = std::collections::BTreeMap::new();
        while let Some((key, ProtoValue(v))) = map.next_entry::<String, ProtoValue>()? {
            fields.insert(key, v);
        }
        Ok(Self::of(Kind::StructValue(prost_types::Struct { fields })))
    }
}

/// JSON object → protobuf Struct.
pub fn to_struct(map: &Map<String, Value>) -> prost_types::Struct {
    prost_types::Struct {
        fields: map
            .iter()
            .map(|(k, v)| (k.clone(), into_value(v.clone())))
            .collect(),
    }
}

/// JSON object → protobuf Struct, moving its keys and values.
pub fn into_struct(map: Map<String, Value>) -> prost_types::Struct {
    prost_types::Struct {
        fields: map.into_iter().map(|(k, v)| (k, into_value(v))).collect(),
    }
}

/// Protobuf Value → JSON; integral numbers come back as integers.
pub fn from_value(value: prost_types::Value) -> Value {
    match value.kind {
        None | Some(Kind::NullValue(_)) => Value::Null,
        Some(Kind::BoolValue(b)) => Value::Bool(b),
        Some(Kind::NumberValue(n)) => json_number(n).map_or(Value::Null, Value::Number),
        Some(Kind::StringValue(s)) => Value::String(s),
        Some(Kind::ListValue(list)) => {
            Value::Array(list.values.into_iter().map(from_value).collect())
        }
        Some(Kind::StructValue(s)) => Value::Object(from_struct(s)),
    }
}

/// Protobuf Struct → JSON object.
pub fn from_struct(s: prost_types::Struct) -> Map<String, Value> {
    s.fields
        .into_iter()
        .map(|(k, v)| (k, from_value(v)))
        .collect()
}

fn timestamp(t: &DateTime<Utc>) -> prost_types::Timestamp {
    prost_types::Timestamp {
        seconds: t.timestamp(),
        nanos: t.timestamp_subsec_nanos() as i32,
    }
}

fn duration(ms: i64) -> prost_types::Duration {
    prost_types::Duration {
        seconds: ms / 1000,
        nanos: ((ms % 1000) * 1_000_000) as i32,
    }
}

/// Saturates instead of overflowing: the core refuses anything past its bounds.
/// A proto duration in milliseconds, saturating (bounds are the core's to refuse).
pub(super) fn duration_ms(d: &prost_types::Duration) -> i64 {
    d.seconds
        .saturating_mul(1000)
        .saturating_add(i64::from(d.nanos) / 1_000_000)
}

fn state(state: JobState) -> pb::JobState {
    match state {
        JobState::Scheduled => pb::JobState::Scheduled,
        JobState::Available => pb::JobState::Available,
        JobState::Pending => pb::JobState::Pending,
        JobState::Active => pb::JobState::Active,
        JobState::Completed => pb::JobState::Completed,
        JobState::Retryable => pb::JobState::Retryable,
        JobState::Cancelled => pb::JobState::Cancelled,
        JobState::Discarded => pb::JobState::Discarded,
    }
}

fn retry_policy(policy: &RetryPolicy) -> pb::RetryPolicy {
    pb::RetryPolicy {
        max_attempts: policy.max_attempts,
        initial_interval: Some(duration(policy.initial_interval_ms)),
        backoff_coefficient: policy.backoff_coefficient,
        max_interval: Some(duration(policy.max_interval_ms)),
        jitter: policy.jitter,
        non_retryable_errors: policy.non_retryable_errors.clone(),
        on_exhaustion: policy.on_exhaustion.clone(),
    }
}

fn job_error(error: &Value) -> pb::JobError {
    let text = |key: &str| {
        error
            .get(key)
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string()
    };
    pb::JobError {
        code: text("code"),
        message: text("message"),
        retryable: error
            .get("retryable")
            .and_then(Value::as_bool)
            .unwrap_or(true),
        attempt: error.get("attempt").and_then(Value::as_i64).unwrap_or(0) as i32,
        occurred_at: error
            .get("occurred_at")
            .and_then(Value::as_str)
            .and_then(crate::model::time::parse_time)
            .map(|t| timestamp(&t)),
        backtrace: match error.get("backtrace") {
            Some(Value::String(s)) => s.clone(),
            Some(Value::Null) | None => String::new(),
            Some(other) => other.to_string(),
        },
        details: error
            .get("details")
            .and_then(Value::as_object)
            .map(to_struct),
        r#type: text("type"),
    }
}

/// A job as a protobuf message; the lease token only goes to the worker that claimed it.
pub fn job(job: Job, with_lease: bool) -> pb::Job {
    let ts = |t: Option<DateTime<Utc>>| t.as_ref().map(timestamp);
    let result = job
        .result
        .as_ref()
        .and_then(Value::as_object)
        .map(to_struct);
    pb::Job {
        id: job.id.to_string(),
        r#type: job.job_type,
        queue: job.queue,
        args: job.args.into_iter().map(into_value).collect(),
        meta: Some(into_struct(job.meta.unwrap_or_default())),
        state: state(job.state) as i32,
        priority: job.priority,
        attempt: job.attempt,
        max_attempts: job.max_attempts,
        retry_policy: Some(retry_policy(&job.retry)),
        unique_policy: None,
        result,
        errors: job.errors.iter().map(job_error).collect(),
        created_at: Some(timestamp(&job.created_at)),
        enqueued_at: ts(job.enqueued_at),
        scheduled_at: ts(job.scheduled_at),
        started_at: ts(job.started_at),
        completed_at: ts(job.completed_at),
        expires_at: ts(job.expires_at),
        timeout: job.timeout_ms.map(duration),
        visibility_timeout: job.visibility_timeout_ms.map(duration),
        tags: job.tags,
        trace_id: String::new(),
        workflow_id: job.workflow_id.map(|w| w.to_string()).unwrap_or_default(),
        specversion: "1.0".to_string(),
        lease_token: match (with_lease, job.lease_token) {
            (true, Some(t)) => t.to_string(),
            _ => String::new(),
        },
        unknown_fields_json: if job.extra.is_empty() {
            String::new()
        } else {
            Value::Object(job.extra).to_string()
        },
        cancelled_at: ts(job.cancelled_at),
        retry_delay_ms: job.retry_delay_ms.unwrap_or(0),
        timeout_ms: job.timeout_ms.unwrap_or(0),
        result_value: job.result.map(into_value),
        parent_results: match job.parent_results {
            Some(Value::Array(results)) => results.into_iter().map(into_value).collect(),
            _ => Vec::new(),
        },
    }
}

fn non_empty(s: String) -> Option<String> {
    (!s.is_empty()).then_some(s)
}

/// The retry policy in the JSON spelling the core validates; proto3 zero values mean "not set".
fn retry_json(policy: &pb::RetryPolicy, max_attempts: i32) -> Value {
    let mut map = Map::new();
    let attempts = if max_attempts > 0 {
        max_attempts
    } else {
        policy.max_attempts
    };
    if attempts != 0 {
        map.insert("max_attempts".into(), attempts.into());
    }
    if let Some(d) = &policy.initial_interval {
        map.insert("initial_interval_ms".into(), duration_ms(d).into());
    }
    if let Some(d) = &policy.max_interval {
        map.insert("max_interval_ms".into(), duration_ms(d).into());
    }
    if policy.backoff_coefficient != 0.0 {
        map.insert(
            "backoff_coefficient".into(),
            json!(policy.backoff_coefficient),
        );
    }
    map.insert("jitter".into(), policy.jitter.into());
    if !policy.non_retryable_errors.is_empty() {
        map.insert(
            "non_retryable_errors".into(),
            json!(policy.non_retryable_errors),
        );
    }
    if !policy.on_exhaustion.is_empty() {
        map.insert("on_exhaustion".into(), policy.on_exhaustion.clone().into());
    }
    Value::Object(map)
}

/// A unique policy in the JSON spelling the core validates.
fn unique_json(policy: &pb::UniquePolicy) -> Value {
    let mut map = Map::new();
    if !policy.key.is_empty() {
        map.insert("keys".into(), json!(policy.key));
    }
    if !policy.args_keys.is_empty() {
        map.insert("args_keys".into(), json!(policy.args_keys));
    }
    if !policy.meta_keys.is_empty() {
        map.insert("meta_keys".into(), json!(policy.meta_keys));
    }
    if let Some(period) = &policy.period {
        map.insert("period_ms".into(), duration_ms(period).into());
    }
    let action = match pb::UniqueConflictAction::try_from(policy.on_conflict) {
        Ok(pb::UniqueConflictAction::Ignore) => Some("ignore"),
        Ok(pb::UniqueConflictAction::Replace) => Some("replace"),
        Ok(pb::UniqueConflictAction::ReplaceExceptSchedule) => Some("replace_except_schedule"),
        Ok(pb::UniqueConflictAction::Reject) => Some("reject"),
        _ => None,
    };
    if let Some(action) = action {
        map.insert("on_conflict".into(), action.into());
    }
    let states: Vec<&str> = policy
        .states
        .iter()
        .filter_map(|s| pb::JobState::try_from(*s).ok())
        .filter(|s| *s != pb::JobState::Unspecified)
        .map(|s| match s {
            pb::JobState::Scheduled => "scheduled",
            pb::JobState::Available => "available",
            pb::JobState::Pending => "pending",
            pb::JobState::Active => "active",
            pb::JobState::Completed => "completed",
            pb::JobState::Retryable => "retryable",
            pb::JobState::Cancelled => "cancelled",
            _ => "discarded",
        })
        .collect();
    if !states.is_empty() {
        map.insert("states".into(), json!(states));
    }
    Value::Object(map)
}

/// An enqueue request in core terms.
pub fn enqueue(request: pb::EnqueueRequest) -> Result<EnqueueJob, CoreError> {
    let extra = match request.unknown_fields_json.as_str() {
        "" => Map::new(),
        text => match serde_json::from_str(text) {
            Ok(Value::Object(map)) => map,
            _ => {
                return Err(CoreError::invalid(
                    "unknown_fields_json must be a JSON object",
                ));
            }
        },
    };
    let o = request.options.unwrap_or_default();
    let retry = match (&o.retry, o.max_attempts) {
        (Some(policy), attempts) => Some(retry_json(policy, attempts)),
        (None, attempts) if attempts > 0 => Some(json!({ "max_attempts": attempts })),
        _ => None,
    };
    let meta = request.meta.or(o.meta).map(from_struct);
    Ok(EnqueueJob {
        id: non_empty(request.id),
        job_type: request.r#type,
        args: request.args.into_iter().map(from_value).collect(),
        meta,
        extra,
        options: JobOptions {
            queue: non_empty(o.queue),
            priority: Some(i64::from(o.priority)),
            timeout_ms: (o.timeout_ms > 0)
                .then_some(o.timeout_ms)
                .or(o.timeout.as_ref().map(duration_ms)),
            visibility_timeout_ms: (o.visibility_timeout_ms > 0)
                .then_some(o.visibility_timeout_ms)
                .or(o.visibility_timeout.as_ref().map(duration_ms)),
            scheduled_at: o
                .delay_until
                .map(|t| {
                    DateTime::<Utc>::from_timestamp(t.seconds, t.nanos.max(0) as u32)
                        .map(JobTime::At)
                        .ok_or_else(|| {
                            CoreError::invalid("delay_until is not a representable time")
                                .with_detail("field", "delay_until".into())
                        })
                })
                .transpose()?,
            expires_at: o.ttl.map(|d| JobTime::After(duration_ms(&d))),
            retry,
            unique: o.unique.as_ref().map(unique_json),
            tags: (!o.tags.is_empty()).then_some(o.tags),
            pending: o.pending,
            metadata: None,
            rate_limit: None,
        },
        trace_context: None,
    })
}

/// A failure report in core terms. proto3 cannot tell an unset `retryable` from false, so false
/// counts as "not said"; `details.retryable: false` marks a failure non-retryable.
pub fn failure(error: pb::JobError) -> Failure {
    let details = error.details.map(from_struct);
    let retryable = details
        .as_ref()
        .and_then(|d| d.get("retryable"))
        .and_then(Value::as_bool)
        .or(error.retryable.then_some(true));
    Failure {
        code: non_empty(error.code),
        error_type: non_empty(error.r#type),
        message: error.message,
        retryable,
        details,
        backtrace: non_empty(error.backtrace).map(Value::String),
    }
}

/// The next attempt time of a retryable job.
pub fn next_attempt_at(job: &Job) -> Option<prost_types::Timestamp> {
    (job.state == JobState::Retryable)
        .then(|| job.run_at.as_ref().map(timestamp))
        .flatten()
}

/// A queue's creation time.
pub fn created_at(t: &DateTime<Utc>) -> prost_types::Timestamp {
    timestamp(t)
}

/// A worker directive as the proto enum.
pub fn directive(directive: WorkerDirective) -> pb::WorkerState {
    match directive {
        WorkerDirective::Running => pb::WorkerState::Running,
        WorkerDirective::Quiet => pb::WorkerState::Quiet,
        WorkerDirective::Terminate => pb::WorkerState::Terminate,
    }
}

/// A DAG workflow request in core terms (the proto's `depends_on` form).
pub fn new_workflow(request: pb::CreateWorkflowRequest) -> Result<NewWorkflow, CoreError> {
    let steps = request
        .steps
        .into_iter()
        .map(|step| {
            Ok(NewStep {
                key: (!step.id.is_empty()).then_some(step.id),
                depends_on: step.depends_on,
                job: enqueue(pb::EnqueueRequest {
                    r#type: step.r#type,
                    args: step.args,
                    options: step.options,
                    ..Default::default()
                })?,
            })
        })
        .collect::<Result<Vec<_>, CoreError>>()?;
    Ok(NewWorkflow {
        kind: Some("dag".to_string()),
        // proto3 cannot tell an empty name from none.
        name: (!request.name.is_empty()).then_some(request.name),
        steps,
        callbacks: Vec::new(),
    })
}

/// A workflow as a protobuf message.
pub fn workflow(w: &Workflow) -> pb::Workflow {
    let state = match w.state.as_str() {
        "running" => pb::WorkflowState::Running,
        "completed" => pb::WorkflowState::Completed,
        "failed" => pb::WorkflowState::Failed,
        "cancelled" => pb::WorkflowState::Cancelled,
        _ => pb::WorkflowState::Unspecified,
    };
    let step_state = |s: StepState| match s {
        StepState::Waiting => pb::WorkflowStepState::Waiting,
        StepState::Pending => pb::WorkflowStepState::Pending,
        StepState::Completed => pb::WorkflowStepState::Completed,
        StepState::Failed => pb::WorkflowStepState::Failed,
        StepState::Cancelled => pb::WorkflowStepState::Cancelled,
        StepState::Unspecified => pb::WorkflowStepState::Unspecified,
    };
    pb::Workflow {
        id: w.id.to_string(),
        name: w.name.clone(),
        state: state as i32,
        steps: w
            .steps
            .iter()
            .map(|s| pb::WorkflowStepStatus {
                id: s.id.clone(),
                r#type: s.job_type.clone(),
                state: step_state(s.step_state()) as i32,
                job_id: s.job_id.to_string(),
                depends_on: w.depends_on_ids(s),
            })
            .collect(),
        created_at: Some(timestamp(&w.created_at)),
        completed_at: w.completed_at.as_ref().map(timestamp),
    }
}

/// A cron registration as a protobuf message (type, args and queue of its template).
pub fn cron_entry(c: &CronEntry) -> pb::CronEntry {
    let template = &c.job_template;
    pb::CronEntry {
        name: c.name.clone(),
        cron: c.expression.clone(),
        timezone: c.timezone.clone(),
        r#type: template
            .get("type")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string(),
        args: template
            .get("args")
            .and_then(Value::as_array)
            .map(|a| a.iter().map(to_value).collect())
            .unwrap_or_default(),
        options: Some(pb::EnqueueOptions {
            queue: crate::model::job::queue_or_default(
                template.pointer("/options/queue").and_then(Value::as_str),
            )
            .to_string(),
            ..Default::default()
        }),
        next_run_at: c.next_run_at.as_ref().map(timestamp),
        last_run_at: c.last_run_at.as_ref().map(timestamp),
        status: c.status().to_string(),
    }
}

/// An ack in core terms: `result_value` (any JSON) wins over the `result` object; an empty lease
/// token means "not given".
pub fn ack_job(r: pb::AckRequest) -> crate::core::AckJob {
    let result = r
        .result_value
        .map(from_value)
        .or(r.result.map(|s| serde_json::Value::Object(from_struct(s))));
    crate::core::AckJob {
        job_id: r.job_id,
        lease_token: (!r.lease_token.is_empty()).then_some(r.lease_token),
        result,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A payload read as text converts to the protobuf value its parsed form converts to.
    #[test]
    fn raw_json_converts_like_its_parsed_value() {
        for text in [
            r#"{"n": 4000, "body": "bench payload"}"#,
            r#"[1, -2, 3.5, 1e300, 18446744073709551615, true, false, null, "é\u0001\"", {"a": []}]"#,
            r#""text""#,
            "null",
            "-0.0",
        ] {
            let raw = crate::model::raw_json::RawJson::from(
                serde_json::value::RawValue::from_string(text.to_string()).expect("JSON"),
            );
            let parsed: Value = serde_json::from_str(text).expect("JSON");
            assert_eq!(raw_into_value(&raw), into_value(parsed), "{text}");
        }
    }

    /// A protobuf payload written as text is the text of its converted JSON value.
    #[test]
    fn protobuf_value_writes_like_its_converted_json() {
        let number = |n: f64| prost_types::Value {
            kind: Some(Kind::NumberValue(n)),
        };
        let mut values: Vec<prost_types::Value> = [
            0.0,
            -0.0,
            1.5,
            -42.0,
            8.9e15,
            9.1e15,
            1e300,
            f64::NAN,
            f64::INFINITY,
        ]
        .into_iter()
        .map(number)
        .collect();
        values.push(into_value(json!({
            "n": 4000, "body": "bench \"payload\"\u{1}é", "list": [true, null, {"a": []}, "x"],
            "empty": {}
        })));
        values.push(prost_types::Value { kind: None });
        for value in values {
            let written = value_into_raw(&value);
            let converted = crate::model::raw_json::RawJson::from(&from_value(value.clone()));
            assert_eq!(written.get(), converted.get(), "{value:?}");
        }
    }
}
