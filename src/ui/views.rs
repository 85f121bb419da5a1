//! What the templates show, converted from the core's types: times as RFC 3339 UTC text, JSON
//! documents pretty-printed, workflow steps with their dependencies by step id.

use chrono::{DateTime, Utc};
use serde_json::{Value, json};

use crate::core::events::Event;
use crate::core::stream::{ConsumerInfo, StreamDeadLetter, StreamInfo};
use crate::core::workflow::{CronEntry, Workflow};
use crate::core::{Job, QueueStats};
use crate::model::json_object;

/// A time as the API writes it.
pub fn time(t: &DateTime<Utc>) -> String {
    crate::model::time::format_time(t)
}

fn opt_time(t: &Option<DateTime<Utc>>) -> Value {
    t.as_ref().map_or(Value::Null, |t| Value::String(time(t)))
}

/// A JSON document as indented text.
pub fn pretty(value: &Value) -> String {
    serde_json::to_string_pretty(value).unwrap_or_default()
}

/// A job in a listing.
pub fn job_row(job: &Job) -> Value {
    json!({
        "id": job.id.to_string(),
        "type": job.job_type,
        "state": job.state.as_str(),
        "attempt": job.attempt,
        "max_attempts": job.max_attempts,
        "priority": job.priority,
        "created_at": time(&job.created_at),
        "queue": job.queue,
    })
}

/// A job with everything the detail page shows: its timeline, documents and errors.
pub fn job_detail(job: &Job, events: &[Event]) -> Value {
    let timeline: Vec<Value> = [
        ("created", Some(job.created_at)),
        ("scheduled for", job.scheduled_at),
        ("enqueued", job.enqueued_at),
        ("started", job.started_at),
        ("lease expires", job.lease_expires_at),
        (
            "due again",
            job.run_at.filter(|_| job.state.as_str() == "retryable"),
        ),
        ("completed", job.completed_at),
        ("cancelled", job.cancelled_at),
        ("expires", job.expires_at),
    ]
    .into_iter()
    .filter_map(|(what, at)| at.map(|at| json!({ "what": what, "at": time(&at) })))
    .collect();
    let mut view = job_row(job);
    if let Value::Object(fields) = &mut view {
        fields.extend([
            ("timeline".into(), Value::Array(timeline)),
            (
                "args".into(),
                pretty(&Value::Array(job.args.clone())).into(),
            ),
            (
                "meta".into(),
                job.meta
                    .as_ref()
                    .map_or(Value::Null, |m| pretty(&Value::Object(m.clone())).into()),
            ),
            (
                "result".into(),
                job.result
                    .as_ref()
                    .map_or(Value::Null, |r| pretty(r).into()),
            ),
            (
                "errors".into(),
                job.errors
                    .iter()
                    .map(|e| Value::String(pretty(e)))
                    .collect(),
            ),
            ("worker_id".into(), json!(job.worker_id)),
            ("tags".into(), json!(job.tags)),
            (
                "workflow_id".into(),
                json!(job.workflow_id.map(|w| w.to_string())),
            ),
            (
                "events".into(),
                events
                    .iter()
                    .map(|e| {
                        json!({
                            "type": e.event_type,
                            "time": time(&e.time),
                            "data": e.data.to_string(),
                        })
                    })
                    .collect(),
            ),
            (
                "cancellable".into(),
                matches!(
                    job.state.as_str(),
                    "available" | "scheduled" | "pending" | "active" | "retryable"
                )
                .into(),
            ),
            ("dead".into(), (job.state.as_str() == "discarded").into()),
        ]);
    }
    view
}

/// A queue's row on the overview, from its stats.
pub fn queue_row(stats: &QueueStats) -> Value {
    json!({
        "name": stats.name,
        "status": if stats.paused { "paused" } else { "active" },
        "counts": {
            "available": stats.available,
            "scheduled": stats.scheduled,
            "pending": stats.pending,
            "active": stats.active,
            "retryable": stats.retryable,
            "completed": stats.completed,
            "discarded": stats.discarded,
            "dead_letters": stats.dead_letters,
        },
        "throughput_per_second": stats.throughput_per_second,
    })
}

/// A stream's single-valued facts (counts, watermarks, rotation) as name/value rows.
pub fn stream_facts(info: &StreamInfo) -> Vec<Value> {
    json_object(info)
        .into_iter()
        .filter(|(_, v)| !v.is_object() && !v.is_array())
        .map(|(k, v)| json!({ "name": k, "value": v.as_str().map_or_else(|| v.to_string(), str::to_string) }))
        .collect()
}

/// A stream consumer with its lag.
pub fn consumer(c: &ConsumerInfo) -> Value {
    json!({
        "name": c.name,
        "last_tick": c.last_tick,
        "ticks_behind": c.ticks_behind,
        "cooperative": c.cooperative,
        "active_batches": c.active_batches.len(),
        "created_at": time(&c.created_at),
    })
}

/// A stream dead letter.
pub fn stream_dead_letter(d: &StreamDeadLetter) -> Value {
    json!({
        "id": d.id.to_string(),
        "event_id": d.event_id.to_string(),
        "consumer": d.consumer,
        "type": d.message_type,
        "payload": d.payload.get(),
        "retry_count": d.retry_count,
        "reason": d.reason,
        "failed_at": time(&d.failed_at),
    })
}

/// A cron registration.
pub fn cron(c: &CronEntry) -> Value {
    json!({
        "name": c.name,
        "expression": c.expression,
        "timezone": c.timezone,
        "overlap_policy": c.overlap_policy,
        "type": c.job_template.get("type").cloned().unwrap_or(Value::Null),
        "queue": c.job_template.pointer("/options/queue").cloned().unwrap_or(Value::Null),
        "enabled": c.enabled,
        "next_run_at": opt_time(&c.next_run_at),
        "last_run_at": opt_time(&c.last_run_at),
        "last_job_id": c.last_job_id.map(|id| id.to_string()),
    })
}

/// A worker of the registry.
pub fn worker(w: &crate::model::admin_system::WorkerInfo) -> Value {
    json!({
        "id": w.id,
        "state": w.state,
        "queues": w.queues,
        "active_jobs": w.active_jobs,
        "last_seen_at": time(&w.last_seen_at),
        "last_heartbeat_at": opt_time(&w.last_heartbeat_at),
        "started_at": time(&w.started_at),
    })
}

/// A workflow with its steps, each naming the steps it waits for by id.
pub fn workflow(w: &Workflow) -> Value {
    json!({
        "id": w.id.to_string(),
        "name": w.name,
        "type": w.kind,
        "state": w.state,
        "created_at": time(&w.created_at),
        "completed_at": opt_time(&w.completed_at),
        "cancelled_at": opt_time(&w.cancelled_at),
        "steps_total": w.steps_total,
        "steps_completed": w.steps_completed,
        "steps": w.steps.iter().map(|s| json!({
            "id": s.id,
            "type": s.job_type,
            "state": s.step_state().name(),
            "job_id": s.job_id.to_string(),
            "depends_on": w.depends_on_ids(s),
        })).collect::<Vec<_>>(),
    })
}
