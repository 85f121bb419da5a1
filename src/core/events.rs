//! The OJS event log: job lifecycle events recorded by the SQL transitions, read with a cursor.

use chrono::{DateTime, Utc};
use serde_json::Value;
use uuid::Uuid;

use super::validate::check_queue_name;
use super::{CoreError, Service};

/// One recorded event.
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct Event {
    /// Position in the log (the cursor).
    pub seq: i64,
    /// Event id.
    pub id: Uuid,
    /// e.g. `job.completed`.
    #[sqlx(rename = "type")]
    pub event_type: String,
    /// The job.
    pub job_id: Option<Uuid>,
    /// Its queue.
    pub queue: Option<String>,
    /// Its type.
    pub job_type: Option<String>,
    /// Event data.
    pub data: Value,
    /// When it happened.
    pub time: DateTime<Utc>,
}

/// Filters of an event page; empty lists match everything.
#[derive(Debug, Clone, Default)]
pub struct EventQuery {
    /// Cursor of the previous page.
    pub after: Option<String>,
    /// Event types.
    pub types: Vec<String>,
    /// Queues.
    pub queues: Vec<String>,
    /// Job types.
    pub job_types: Vec<String>,
    /// Page size (default 100, at most 1000).
    pub limit: Option<i64>,
}

/// A page of events and the cursor after it.
#[derive(Debug, Clone)]
pub struct EventPage {
    /// The events.
    pub events: Vec<Event>,
    /// Where the next page starts.
    pub cursor: String,
    /// Whether the page was full (more may follow).
    pub has_more: bool,
}

/// The position a cursor names: absent or empty is the start of the log.
pub fn parse_cursor(after: Option<&str>) -> Result<i64, CoreError> {
    match after {
        None | Some("") => Ok(0),
        Some(text) => text.parse::<i64>().ok().filter(|n| *n >= 0).ok_or_else(|| {
            CoreError::invalid(format!("after {text:?} is not a cursor this server issued"))
        }),
    }
}

impl Service {
    /// Events after the cursor that match the filters, oldest first.
    pub async fn events(&self, query: EventQuery) -> Result<EventPage, CoreError> {
        let limit = query.limit.unwrap_or(100);
        if !(1..=1000).contains(&limit) {
            return Err(CoreError::invalid(format!(
                "limit must be between 1 and 1000, not {limit}"
            )));
        }
        let after = parse_cursor(query.after.as_deref())?;
        for queue in &query.queues {
            check_queue_name(queue)?;
        }
        for (field, values) in [("types", &query.types), ("job_types", &query.job_types)] {
            for value in values {
                super::validate::check_text(field, value)?;
            }
        }
        let list = |v: &Vec<String>| (!v.is_empty()).then(|| v.clone());
        let events = self
            .store
            .events(
                after,
                list(&query.types),
                list(&query.queues),
                list(&query.job_types),
                limit as i32,
            )
            .await?;
        let cursor = events.last().map_or(after, |e| e.seq).to_string();
        Ok(EventPage {
            has_more: events.len() as i64 == limit,
            events,
            cursor,
        })
    }
}
