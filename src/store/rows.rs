//! Rows as the SQL functions return them, read by sqlx, and their domain values.

use chrono::{DateTime, Utc};
use serde_json::Value;
use uuid::Uuid;

use crate::model::error::{CoreError, ErrorKind};
use crate::model::events::Event;
use crate::model::job::{Completion, JobState};
use crate::model::workflow::CronEntry;

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
        let state = JobState::parse(&row.state).ok_or_else(|| {
            CoreError::new(
                ErrorKind::Backend,
                format!("acked job has unknown state {}", row.state),
            )
        })?;
        Ok(Completion {
            id: row.id,
            queue: row.queue,
            state,
            started_at: row.started_at,
            completed_at: row.completed_at,
        })
    }
}
