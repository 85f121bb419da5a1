//! The OJS event log: job lifecycle events recorded by the SQL transitions, read with a cursor.

use super::validate::check_queue_name;
use super::{CoreError, Scope, Service};
pub use crate::model::events::{Cursor, Event};

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

/// How long a page waits for events held behind a transaction still in progress. A maintenance
/// step on a loaded machine can hold a fresh event back for over a second (seen in CI with 1 s).
const TAIL_WAIT: std::time::Duration = std::time::Duration::from_millis(5000);
/// How soon it looks again meanwhile (first); the pause doubles up to `TAIL_POLL_MAX`.
const TAIL_POLL: std::time::Duration = std::time::Duration::from_millis(5);
/// The longest pause between looks.
const TAIL_POLL_MAX: std::time::Duration = std::time::Duration::from_millis(100);

/// The position a cursor names: absent or empty is the start of the log.
pub fn parse_cursor(after: Option<&str>) -> Result<Cursor, CoreError> {
    let text = match after {
        None | Some("") => return Ok(Cursor::default()),
        Some(text) => text,
    };
    let number = |part: &str| part.parse::<i64>().ok().filter(|n| *n >= 0);
    let parsed = match text.split_once('-') {
        Some((txid, seq)) => number(txid).zip(number(seq)),
        None => number(text).map(|seq| (0, seq)),
    };
    parsed
        .map(|(txid, seq)| Cursor { txid, seq })
        .ok_or_else(|| {
            CoreError::invalid(format!("after {text:?} is not a cursor this server issued"))
                .with_detail("field", "after".into())
        })
}

impl Service {
    /// Events of queues in `scope` after the cursor that match the filters, oldest first.
    pub async fn events(&self, scope: &Scope, query: EventQuery) -> Result<EventPage, CoreError> {
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
        scope.require_named(query.queues.iter().map(String::as_str))?;
        for (field, values) in [("types", &query.types), ("job_types", &query.job_types)] {
            for value in values {
                super::validate::check_text(field, value)?;
            }
        }
        let list = |v: &Vec<String>| (!v.is_empty()).then(|| v.clone());
        // A page stops at the horizon (see s3p.events_horizon); when events wait behind it, the
        // tail is usually a commit away: wait a moment for it rather than answer short. Only
        // what was held at the first look is waited for (until a page's horizon passes its
        // newest transaction), not what keeps arriving meanwhile under steady writes.
        let deadline = tokio::time::Instant::now() + TAIL_WAIT;
        let mut pause = TAIL_POLL;
        let mut held_through: Option<i64> = None;
        let events = loop {
            let read = self
                .store
                .events(
                    scope,
                    after,
                    list(&query.types),
                    list(&query.queues),
                    list(&query.job_types),
                    limit as i32,
                )
                .await?;
            if read.events.len() as i64 == limit || tokio::time::Instant::now() >= deadline {
                break read.events;
            }
            // Judged by the page's own horizon: one that moved on since must not pass for whole.
            if held_through.is_none() {
                let resume = read.events.last().map_or(after, Event::cursor);
                held_through = self.store.events_held_through(resume, read.horizon).await?;
            }
            match held_through {
                Some(txid) if read.horizon <= txid => {}
                _ => break read.events,
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(TAIL_POLL_MAX);
        };
        let cursor = events.last().map_or(after, Event::cursor).to_string();
        Ok(EventPage {
            has_more: events.len() as i64 == limit,
            events,
            cursor,
        })
    }

    /// The position of the newest event a reader may pass now: where a follower that wants only
    /// what happens from now on starts.
    pub async fn events_end(&self) -> Result<Cursor, CoreError> {
        self.store.events_end().await
    }
}
