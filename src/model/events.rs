//! The OJS event log's entries and positions.

use chrono::{DateTime, Utc};
use serde_json::Value;
use uuid::Uuid;

/// A position in the event log, which is ordered by (writing transaction, sequence number).
/// As text, `txid-seq`; a bare number (an older server's cursor) is a seq in txid 0.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct Cursor {
    /// The transaction that wrote the event (`xid8`).
    pub txid: i64,
    /// The event's sequence number.
    pub seq: i64,
}

impl std::fmt::Display for Cursor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}-{}", self.txid, self.seq)
    }
}

/// One recorded event.
#[derive(Debug, Clone, PartialEq)]
pub struct Event {
    /// The transaction that wrote it (first part of its log position).
    pub txid: i64,
    /// Its sequence number (second part of its log position).
    pub seq: i64,
    /// Event id.
    pub id: Uuid,
    /// e.g. `job.completed`.
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

impl Event {
    /// The event's position in the log: a cursor that resumes after it.
    pub fn cursor(&self) -> Cursor {
        Cursor {
            txid: self.txid,
            seq: self.seq,
        }
    }
}
