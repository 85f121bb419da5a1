//! Core types ↔ OpenAPI wire types.

use crate::core::job::{Completion, Failure, Heartbeat, JobOptions, JobTime, RetryPolicy};
use crate::core::stream::{
    Appended, Batch, ConsumerInfo, NewMessage, StreamDeadLetter, StreamInfo,
};
use crate::core::validate;
use crate::core::workflow::{CronEntry, NewCron, NewStep, NewWorkflow, Workflow};
use crate::core::{
    CoreError, EnqueueJob, Job, JobState, QueueConfig, QueueConfigChanges, QueueStats,
};
use crate::model::json_object;
use crate::model::time::{format_duration_ms, format_time};

use serde_json::Value;

use super::api::types;

/// The retry policy as OJS echoes it, with ISO-8601 durations.
fn retry(policy: &RetryPolicy) -> types::RetryPolicy {
    types::RetryPolicy {
        max_attempts: Some(i64::from(policy.max_attempts)),
        initial_interval: Some(format_duration_ms(policy.initial_interval_ms)),
        backoff_coefficient: Some(policy.backoff_coefficient),
        max_interval: Some(format_duration_ms(policy.max_interval_ms)),
        jitter: Some(policy.jitter),
        non_retryable_errors: Some(policy.non_retryable_errors.clone()),
        on_exhaustion: Some(policy.on_exhaustion.clone()),
        backoff_type: Some(policy.backoff_type.clone()),
    }
}

/// A job on the wire; the lease token only goes to the worker that claimed it. Takes the job, so
/// its payload moves onto the wire instead of being copied.
pub fn job(job: Job, with_lease: bool) -> types::Job {
    let time = |t: Option<chrono::DateTime<chrono::Utc>>| t.as_ref().map(format_time);
    types::Job {
        specversion: "1.0".to_string(),
        id: job.id.to_string(),
        retry: Some(retry(&job.retry)),
        r#type: job.job_type,
        queue: job.queue,
        args: job.args,
        meta: Some(job.meta.unwrap_or_default()),
        schema: None,
        state: job.state.as_str().to_string(),
        priority: i64::from(job.priority),
        attempt: i64::from(job.attempt),
        max_attempts: i64::from(job.max_attempts),
        timeout_ms: job.timeout_ms,
        visibility_timeout_ms: job.visibility_timeout_ms,
        tags: (!job.tags.is_empty()).then_some(job.tags),
        unique: job.unique,
        created_at: format_time(&job.created_at),
        enqueued_at: time(job.enqueued_at),
        scheduled_at: time(job.scheduled_at),
        expires_at: time(job.expires_at),
        started_at: time(job.started_at),
        completed_at: time(job.completed_at),
        cancelled_at: time(job.cancelled_at),
        result: job.result,
        error: job.error.and_then(|e| match e {
            Value::Object(error) => Some(error),
            _ => None,
        }),
        errors: (!job.errors.is_empty()).then(|| {
            job.errors
                .into_iter()
                .filter_map(|e| match e {
                    Value::Object(error) => Some(error),
                    _ => None,
                })
                .collect()
        }),
        retry_delay_ms: job.retry_delay_ms,
        worker_id: job.worker_id,
        lease_token: if with_lease {
            job.lease_token.map(|t| t.to_string())
        } else {
            None
        },
        lease_expires_at: if with_lease {
            time(job.lease_expires_at)
        } else {
            None
        },
        previous_state: job.previous_state.map(|s| s.as_str().to_string()),
        workflow_id: job.workflow_id.map(|w| w.to_string()),
        parent_results: job.parent_results.and_then(|p| match p {
            Value::Array(results) => Some(results),
            _ => None,
        }),
        extra: job.extra,
    }
}

/// A job option's time, read from its text when given.
fn job_time(field: &str, text: Option<String>) -> Result<Option<JobTime>, CoreError> {
    text.map(|t| validate::job_time(field, &t)).transpose()
}

/// An enqueue request in core terms.
pub fn enqueue(body: types::EnqueueRequest) -> Result<EnqueueJob, CoreError> {
    let mut extra = body.extra;
    if let Some(schema) = body.schema {
        extra.insert("schema".to_string(), schema.into());
    }
    let o = body.options.unwrap_or_default();
    Ok(EnqueueJob {
        id: body.id,
        job_type: body.r#type,
        args: body.args,
        meta: body.meta,
        extra,
        options: JobOptions {
            queue: o.queue.or(body.queue),
            priority: o.priority,
            timeout_ms: o.timeout_ms,
            visibility_timeout_ms: o.visibility_timeout_ms,
            scheduled_at: job_time("scheduled_at", o.delay_until.or(o.scheduled_at))?,
            expires_at: job_time("expires_at", o.expires_at)?,
            retry: o.retry.or(o.retry_policy),
            unique: o.unique,
            tags: o.tags,
            pending: o.pending.unwrap_or(false),
            metadata: o.metadata,
            rate_limit: o.rate_limit.map(serde_json::Value::Object),
        },
        trace_context: None,
    })
}

/// A nack error in core terms.
pub fn failure(error: types::NackError) -> Failure {
    Failure {
        code: error.code,
        error_type: error.r#type,
        message: error.message,
        retryable: error.retryable,
        details: error.details,
        backtrace: error.backtrace,
    }
}

/// The nack answer: the new state and, by state, when it runs again or when it ended.
pub fn nack_response(job: &Job) -> types::NackResponse {
    let wire = self::job(job.clone(), false);
    types::NackResponse {
        id: wire.id.clone(),
        job_id: wire.id.clone(),
        state: wire.state.clone(),
        attempt: wire.attempt,
        max_attempts: wire.max_attempts,
        next_attempt_at: (job.state == JobState::Retryable)
            .then(|| job.run_at.as_ref().map(format_time))
            .flatten(),
        retry_delay_ms: (job.state == JobState::Retryable)
            .then_some(job.retry_delay_ms)
            .flatten(),
        discarded_at: (job.state == JobState::Discarded)
            .then(|| wire.completed_at.clone())
            .flatten(),
        completed_at: wire.completed_at.clone(),
        job: wire,
    }
}

/// A heartbeat in core terms: job ids from `active_jobs` (array, or a count with
/// `active_job_ids`), `active_job_ids` and `job_id`.
pub fn heartbeat(body: types::HeartbeatRequest) -> Result<Heartbeat, CoreError> {
    let mut job_ids = Vec::new();
    match body.active_jobs {
        None | Some(serde_json::Value::Null) | Some(serde_json::Value::Number(_)) => {}
        Some(serde_json::Value::Array(items)) => {
            for item in items {
                match item {
                    serde_json::Value::String(id) => job_ids.push(id),
                    _ => {
                        return Err(CoreError::invalid(
                            "active_jobs must list job ids as strings",
                        ));
                    }
                }
            }
        }
        Some(_) => {
            return Err(CoreError::invalid(
                "active_jobs must be an array of job ids or a count",
            ));
        }
    }
    job_ids.extend(body.active_job_ids.unwrap_or_default());
    job_ids.extend(body.job_id);
    Ok(Heartbeat {
        worker_id: body.worker_id,
        job_ids,
        lease_token: body.lease_token,
        visibility_timeout_ms: body.visibility_timeout_ms,
    })
}

/// A message to append, in core terms.
pub fn message(m: types::NewMessage) -> NewMessage {
    NewMessage {
        id: m.id,
        message_type: m.r#type,
        payload: m.payload,
        headers: m.headers,
        trace_context: None,
    }
}

/// An appended message on the wire.
pub fn appended(queue: &str, a: &Appended) -> types::Appended {
    types::Appended {
        id: a.id.to_string(),
        seq: a.seq,
        queue: queue.to_string(),
    }
}

/// A batch on the wire; `None` is the empty answer (no batch id, no events). Takes the batch so
/// payloads move instead of being copied: a batch holds up to thousands of events.
pub fn batch(batch: Option<Batch>) -> types::ReceivedBatch {
    let Some(b) = batch else {
        return types::ReceivedBatch {
            count: 0,
            events: Vec::new(),
            ..Default::default()
        };
    };
    types::ReceivedBatch {
        batch_id: Some(b.id.to_string()),
        count: b.events.len() as i64,
        consumer: Some(b.consumer),
        member: b.member,
        start_tick: Some(b.start_tick),
        end_tick: Some(b.end_tick),
        state: Some(b.state),
        created_at: Some(format_time(&b.created_at)),
        events: b
            .events
            .into_iter()
            .map(|e| types::StreamEvent {
                id: e.id.to_string(),
                seq: e.seq,
                r#type: e.message_type,
                payload: e.payload,
                headers: match e.headers {
                    Some(serde_json::Value::Object(h)) => Some(h),
                    _ => None,
                },
                retry_count: i64::from(e.retry_count),
                created_at: format_time(&e.created_at),
            })
            .collect(),
    }
}

/// A consumer on the wire.
pub fn consumer(c: &ConsumerInfo) -> types::ConsumerInfo {
    types::ConsumerInfo {
        consumer: c.name.clone(),
        last_tick: c.last_tick,
        next_tick: c.next_tick,
        cooperative: c.cooperative,
        created_at: format_time(&c.created_at),
        ticks_behind: c.ticks_behind,
        active_batches: c.active_batches.iter().map(json_object).collect(),
    }
}

/// A queue configuration on the wire.
pub fn queue_config(config: &QueueConfig) -> types::QueueConfig {
    types::QueueConfig {
        max_retries: i64::from(config.max_retries),
        retention: format!("{}ms", config.retention_ms),
        retention_ms: config.retention_ms,
        job_retention_ms: config.job_retention_ms,
        max_jobs: config.max_jobs,
        max_stream_events: config.max_stream_events,
        autovacuum: config.autovacuum.clone(),
        mirror_job_events: Some(config.mirror_job_events),
        takeover_ms: Some(config.takeover_ms),
        tick_max_events: Some(config.tick_max_events),
        tick_max_bytes: Some(config.tick_max_bytes),
    }
}

/// Configuration changes in core terms; a quota may be an integer or null (cleared).
pub fn queue_config_changes(
    body: types::QueueConfigUpdate,
) -> Result<QueueConfigChanges, CoreError> {
    let quota =
        |field: &str, value: Option<serde_json::Value>| -> Result<Option<Option<i64>>, CoreError> {
            match value {
                None => Ok(None),
                Some(serde_json::Value::Null) => Ok(Some(None)),
                Some(v) => v.as_i64().map(|n| Some(Some(n))).ok_or_else(|| {
                    CoreError::invalid(format!("{field} must be an integer or null"))
                        .with_detail("field", field.into())
                }),
            }
        };
    Ok(QueueConfigChanges {
        max_retries: body.max_retries,
        retention: body.retention,
        job_retention: body.job_retention,
        max_jobs: quota("max_jobs", body.max_jobs)?,
        max_stream_events: quota("max_stream_events", body.max_stream_events)?,
        autovacuum: body.autovacuum,
        mirror_job_events: body.mirror_job_events,
        takeover: body.takeover,
        tick_max_events: body.tick_max_events,
        tick_max_bytes: body.tick_max_bytes,
    })
}

/// A stream dead letter on the wire.
pub fn stream_dead_letter(d: &StreamDeadLetter) -> types::StreamDeadLetter {
    types::StreamDeadLetter {
        id: d.id.to_string(),
        message_id: d.event_id.to_string(),
        consumer: d.consumer.clone(),
        r#type: d.message_type.clone(),
        payload: d.payload.clone(),
        headers: d.headers.as_ref().and_then(|h| h.as_object().cloned()),
        retry_count: i64::from(d.retry_count),
        reason: d.reason.clone(),
        failed_at: format_time(&d.failed_at),
    }
}

/// A workflow's job in core terms; an error names the job as the core does (`steps[1]: ...`).
fn workflow_job(job: types::WorkflowJob, what: &str) -> Result<EnqueueJob, CoreError> {
    enqueue(types::EnqueueRequest {
        r#type: job.r#type,
        args: job.args.unwrap_or_default(),
        meta: job.meta,
        options: job.options,
        extra: job.extra,
        ..Default::default()
    })
    .map_err(|e| validate::within(what, e))
}

/// A workflow request in core terms: `type` chain / group / batch, or steps with `depends_on`.
pub fn new_workflow(body: types::WorkflowRequest) -> Result<NewWorkflow, CoreError> {
    // `jobs` and `steps` name the same list; without a type only `steps` may hold a DAG.
    let jobs = match body.r#type.as_deref() {
        Some("group" | "batch") => body.jobs.or(body.steps),
        Some(_) => body.steps.or(body.jobs),
        None => body.steps,
    }
    .unwrap_or_default();
    let steps = jobs
        .into_iter()
        .enumerate()
        .map(|(i, j)| {
            Ok(NewStep {
                key: j.id.clone(),
                depends_on: j.depends_on.clone().unwrap_or_default(),
                job: workflow_job(j, &format!("steps[{i}]"))?,
            })
        })
        .collect::<Result<_, CoreError>>()?;
    let mut callbacks = Vec::new();
    if let Some(c) = body.callbacks {
        for (name, job) in [
            ("on_complete", c.on_complete),
            ("on_success", c.on_success),
            ("on_failure", c.on_failure),
        ] {
            if let Some(job) = job {
                let job = workflow_job(job, &format!("callbacks.{name}"))?;
                callbacks.push((name.to_string(), job));
            }
        }
    }
    Ok(NewWorkflow {
        kind: body.r#type,
        name: body.name,
        steps,
        callbacks,
    })
}

/// A workflow on the wire; group and batch also count as jobs.
pub fn workflow(w: &Workflow) -> types::WorkflowView {
    types::WorkflowView {
        id: w.id.to_string(),
        name: w.name.clone(),
        r#type: w.kind.clone(),
        state: w.state.clone(),
        steps_total: w.steps_total,
        steps_completed: w.steps_completed,
        jobs_total: w.steps_total,
        jobs_completed: w.steps_completed,
        created_at: format_time(&w.created_at),
        completed_at: w.completed_at.as_ref().map(format_time),
        cancelled_at: w.cancelled_at.as_ref().map(format_time),
        steps_cancelled: w.steps_cancelled,
        steps_already_completed: w.steps_already_completed,
        steps: w
            .steps
            .iter()
            .map(|s| types::WorkflowStepView {
                id: s.id.clone(),
                r#type: s.job_type.clone(),
                state: s.step_state().name().to_string(),
                job_id: s.job_id.to_string(),
                depends_on: w.depends_on_ids(s),
            })
            .collect(),
    }
}

/// A cron request in core terms: `expression`/`job_template` or `cron`/flat `type`, `args`.
pub fn new_cron(body: types::CronRequest) -> Result<NewCron, CoreError> {
    let expression = body.expression.or(body.cron).ok_or_else(|| {
        CoreError::invalid("expression (or cron) is required")
            .with_detail("field", "expression".into())
    })?;
    let template = match (body.job_template, body.r#type) {
        (Some(t), _) => enqueue(t),
        (None, Some(job_type)) => enqueue(types::EnqueueRequest {
            r#type: job_type,
            args: body.args.unwrap_or_default(),
            meta: body.meta,
            options: body.options,
            ..Default::default()
        }),
        (None, None) => {
            return Err(
                CoreError::invalid("job_template (or type and args) is required")
                    .with_detail("field", "job_template".into()),
            );
        }
    }
    .map_err(|e| validate::within("job_template", e))?;
    Ok(NewCron {
        name: body.name,
        expression,
        timezone: body.timezone,
        overlap_policy: body.overlap_policy,
        template,
    })
}

/// A cron registration on the wire: the template's type, args, options and meta also at the top
/// level, where the SDKs read them.
pub fn cron(c: &CronEntry) -> types::CronEntry {
    let template = c.template();
    let object = |key: &str| template.get(key).and_then(Value::as_object).cloned();
    types::CronEntry {
        r#type: template
            .get("type")
            .and_then(Value::as_str)
            .map(str::to_string),
        args: template.get("args").and_then(Value::as_array).cloned(),
        options: object("options"),
        meta: object("meta"),
        name: c.name.clone(),
        expression: c.expression.clone(),
        cron: c.expression.clone(),
        timezone: c.timezone.clone(),
        overlap_policy: c.overlap_policy.clone(),
        enabled: c.enabled,
        status: c.status().to_string(),
        next_run_at: c.next_run_at.as_ref().map(format_time),
        last_run_at: c.last_run_at.as_ref().map(format_time),
        created_at: format_time(&c.created_at),
        job_template: template.clone(),
    }
}

/// An event in the OJS envelope (CloudEvents-like).
pub fn event(e: &crate::core::events::Event) -> types::Event {
    types::Event {
        specversion: "1.0".to_string(),
        id: format!("evt_{}", e.id),
        r#type: e.event_type.clone(),
        source: "ojs://pgvs3".to_string(),
        time: format_time(&e.time),
        subject: e.job_id.map(|j| j.to_string()),
        datacontenttype: Some("application/json".to_string()),
        data: e.data.as_object().cloned().unwrap_or_default(),
    }
}

/// One ack of a batch: the completed job, or the error a single ack would have answered.
pub fn ack_outcome(
    job_id: String,
    outcome: Result<Completion, CoreError>,
    request_id: &str,
) -> types::AckOutcome {
    match outcome {
        Ok(done) => types::AckOutcome {
            job_id,
            acknowledged: true,
            state: Some(done.state.as_str().to_string()),
            completed_at: done.completed_at.as_ref().map(format_time),
            error: None,
        },
        Err(error) => types::AckOutcome {
            job_id,
            acknowledged: false,
            state: None,
            completed_at: None,
            error: Some(super::error::error_body(&error, Some(request_id))),
        },
    }
}

/// A page request from `limit` and `cursor` query parameters.
pub fn page_request(limit: Option<i64>, cursor: Option<String>) -> crate::core::page::PageRequest {
    crate::core::page::PageRequest { limit, cursor }
}

/// The `pagination` object of a page.
pub fn pagination<T>(page: &crate::core::page::Page<T>) -> types::Pagination {
    types::Pagination {
        total: page.total,
        has_more: page.next_cursor.is_some(),
        limit: Some(page.limit),
        offset: None,
        next_cursor: page.next_cursor.clone(),
    }
}

/// A token as listed: name, roles, scope and times (never the token).
pub fn token_info(
    grant: &crate::core::Grant,
    created_at: chrono::DateTime<chrono::Utc>,
    revoked_at: Option<chrono::DateTime<chrono::Utc>>,
) -> types::TokenInfo {
    types::TokenInfo {
        name: grant.name.clone(),
        roles: grant.roles.iter().map(|r| r.name().to_string()).collect(),
        queues: grant.queues.clone(),
        created_at: crate::model::time::format_time(&created_at),
        revoked_at: revoked_at.map(|t| crate::model::time::format_time(&t)),
    }
}

/// A queue's stats on the wire: the conformance shape (`queue`) beside the HTTP binding's
/// (`status`, `stats`).
pub fn queue_stats(name: String, stats: &QueueStats) -> types::QueueStatsEnvelope {
    let mut extra = json_object(stats);
    extra.remove("name");
    extra.remove("paused");
    types::QueueStatsEnvelope {
        status: if stats.paused { "paused" } else { "active" }.to_string(),
        stats: types::QueueStatsSummary {
            available: stats.available,
            active: stats.active,
            scheduled: stats.scheduled,
            retryable: stats.retryable,
            dead: stats.dead_letters,
            discarded: stats.discarded,
            completed_last_hour: stats.completed_last_hour,
            failed_last_hour: stats.failed_last_hour,
            avg_duration_ms: stats.avg_duration_ms,
            avg_wait_ms: stats.avg_wait_ms,
            throughput_per_second: stats.throughput_per_second,
        },
        computed_at: format_time(&chrono::Utc::now()),
        queue: types::QueueStats {
            name,
            paused: stats.paused,
            extra,
        },
    }
}

/// A stream's info on the wire.
pub fn stream_info(queue: String, info: &StreamInfo) -> types::StreamInfo {
    types::StreamInfo {
        queue: Some(queue),
        extra: json_object(info),
    }
}
