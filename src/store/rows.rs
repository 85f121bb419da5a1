//! Rows as the SQL functions return them, read by sqlx, and their domain values.

use chrono::{DateTime, Utc};
use serde_json::{Map, Value};
use uuid::Uuid;

use crate::model::error::{CoreError, ErrorKind};
use crate::model::events::Event;
use crate::model::job::{Completion, Job, JobState, RetryPolicy};
use crate::model::workflow::CronEntry;

/// One row of `s3p.job`.
#[derive(sqlx::FromRow)]
pub struct JobRow {
    id: Uuid,
    queue: String,
    #[sqlx(rename = "type")]
    job_type: String,
    args: Option<Value>,
    meta: Option<Value>,
    extra: Option<Value>,
    state: String,
    previous_state: Option<String>,
    priority: Option<i32>,
    attempt: Option<i32>,
    max_attempts: Option<i32>,
    timeout_ms: Option<i64>,
    visibility_timeout_ms: Option<i64>,
    retry: Option<Value>,
    uniq: Option<Value>,
    tags: Option<Value>,
    created_at: Option<DateTime<Utc>>,
    enqueued_at: Option<DateTime<Utc>>,
    scheduled_at: Option<DateTime<Utc>>,
    expires_at: Option<DateTime<Utc>>,
    started_at: Option<DateTime<Utc>>,
    completed_at: Option<DateTime<Utc>>,
    cancelled_at: Option<DateTime<Utc>>,
    run_at: Option<DateTime<Utc>>,
    lease_token: Option<Uuid>,
    lease_expires_at: Option<DateTime<Utc>>,
    worker_id: Option<String>,
    result: Option<Value>,
    error: Option<Value>,
    errors: Option<Value>,
    retry_delay_ms: Option<i64>,
    workflow_id: Option<Uuid>,
    parent_results: Option<Value>,
}

impl TryFrom<JobRow> for Job {
    type Error = CoreError;

    fn try_from(row: JobRow) -> Result<Job, CoreError> {
        let state = stored_state(&row.state)?;
        Ok(Job {
            id: row.id,
            queue: row.queue,
            job_type: row.job_type,
            args: array(row.args),
            meta: object(row.meta),
            extra: object(row.extra).unwrap_or_default(),
            state,
            previous_state: row.previous_state.as_deref().and_then(JobState::parse),
            priority: row.priority.unwrap_or(0),
            attempt: row.attempt.unwrap_or(0),
            max_attempts: row.max_attempts.unwrap_or(1),
            timeout_ms: row.timeout_ms,
            visibility_timeout_ms: row.visibility_timeout_ms,
            retry: RetryPolicy::from_stored(row.retry),
            unique: row.uniq,
            tags: array(row.tags)
                .into_iter()
                .filter_map(|t| t.as_str().map(str::to_string))
                .collect(),
            created_at: row.created_at.unwrap_or_else(Utc::now),
            enqueued_at: row.enqueued_at,
            scheduled_at: row.scheduled_at,
            expires_at: row.expires_at,
            started_at: row.started_at,
            completed_at: row.completed_at,
            cancelled_at: row.cancelled_at,
            lease_token: row.lease_token,
            lease_expires_at: row.lease_expires_at,
            worker_id: row.worker_id,
            result: row.result,
            error: row.error,
            errors: array(row.errors),
            retry_delay_ms: row.retry_delay_ms,
            run_at: row.run_at,
            workflow_id: row.workflow_id,
            parent_results: row.parent_results,
        })
    }
}

pub fn jobs(rows: Vec<JobRow>) -> Result<Vec<Job>, CoreError> {
    rows.into_iter().map(Job::try_from).collect()
}

pub fn one(rows: Vec<JobRow>, id: Uuid) -> Result<Job, CoreError> {
    rows.into_iter()
        .next()
        .map(Job::try_from)
        .unwrap_or_else(|| Err(CoreError::not_found("job", &id.to_string())))
}

fn object(value: Option<Value>) -> Option<Map<String, Value>> {
    match value {
        Some(Value::Object(map)) => Some(map),
        _ => None,
    }
}

fn array(value: Option<Value>) -> Vec<Value> {
    match value {
        Some(Value::Array(items)) => items,
        _ => Vec::new(),
    }
}

/// The state of a stored job row; one the model does not know is a backend error.
pub(super) fn stored_state(state: &str) -> Result<JobState, CoreError> {
    JobState::parse(state).ok_or_else(|| {
        CoreError::new(
            ErrorKind::Backend,
            format!("stored job has unknown state {state}"),
        )
    })
}

/// A row of `s3p.events_page` / `s3p.job_events`.
#[derive(sqlx::FromRow)]
pub struct EventRow {
    txid: i64,
    seq: i64,
    id: Uuid,
    #[sqlx(rename = "type")]
    event_type: String,
    job_id: Option<Uuid>,
    queue: Option<String>,
    job_type: Option<String>,
    data: Value,
    time: DateTime<Utc>,
}

impl From<EventRow> for Event {
    fn from(row: EventRow) -> Event {
        Event {
            txid: row.txid,
            seq: row.seq,
            id: row.id,
            event_type: row.event_type,
            job_id: row.job_id,
            queue: row.queue,
            job_type: row.job_type,
            data: row.data,
            time: row.time,
        }
    }
}

/// A row of `s3p.events_read`: the page's horizon, and an event unless the page is empty.
#[derive(sqlx::FromRow)]
pub struct EventReadRow {
    /// The horizon the page stopped at, on every row.
    pub horizon: i64,
    txid: Option<i64>,
    seq: Option<i64>,
    id: Option<Uuid>,
    #[sqlx(rename = "type")]
    event_type: Option<String>,
    job_id: Option<Uuid>,
    queue: Option<String>,
    job_type: Option<String>,
    data: Option<Value>,
    time: Option<DateTime<Utc>>,
}

impl EventReadRow {
    /// The event of the row; none on the one row of an empty page.
    pub fn event(self) -> Option<Event> {
        Some(Event {
            txid: self.txid?,
            seq: self.seq?,
            id: self.id?,
            event_type: self.event_type?,
            job_id: self.job_id,
            queue: self.queue,
            job_type: self.job_type,
            data: self.data?,
            time: self.time?,
        })
    }
}

/// A page of events and the horizon it stopped at.
pub struct EventsRead {
    /// The events, in log order.
    pub events: Vec<Event>,
    /// The page's horizon (a transaction id), for `Store::events_held_through`.
    pub horizon: i64,
}

/// A row of the `s3p.cron_*` functions.
#[derive(sqlx::FromRow)]
pub struct CronRow {
    name: String,
    expression: String,
    timezone: String,
    overlap_policy: String,
    job_template: Value,
    enabled: bool,
    next_run_at: Option<DateTime<Utc>>,
    last_run_at: Option<DateTime<Utc>>,
    last_job_id: Option<Uuid>,
    created_at: DateTime<Utc>,
}

impl From<CronRow> for CronEntry {
    fn from(row: CronRow) -> CronEntry {
        CronEntry {
            name: row.name,
            expression: row.expression,
            timezone: row.timezone,
            overlap_policy: row.overlap_policy,
            job_template: row.job_template,
            enabled: row.enabled,
            next_run_at: row.next_run_at,
            last_run_at: row.last_run_at,
            last_job_id: row.last_job_id,
            created_at: row.created_at,
        }
    }
}

/// A row of `ack_many` as a batch ack reads it: only what the answer needs.
#[derive(sqlx::FromRow)]
pub struct CompletionRow {
    id: Uuid,
    queue: String,
    state: String,
    started_at: Option<DateTime<Utc>>,
    completed_at: Option<DateTime<Utc>>,
}

impl CompletionRow {
    /// The columns to select from `ack_many` for this row.
    pub const COLUMNS: &'static str = "id, queue, state, started_at, completed_at";
}

impl TryFrom<CompletionRow> for Completion {
    type Error = CoreError;

    fn try_from(row: CompletionRow) -> Result<Completion, CoreError> {
        let state = stored_state(&row.state)?;
        Ok(Completion {
            id: row.id,
            queue: row.queue,
            state,
            started_at: row.started_at,
            completed_at: row.completed_at,
        })
    }
}
