//! What the OJS Admin API's job listings and bulk actions take and answer: a checked job filter,
//! the listing order and page, and the outcome of a bulk action.

use chrono::{DateTime, Utc};
use uuid::Uuid;

/// A checked job filter (every field optional; all given ones must hold).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct JobFilter {
    /// One queue (else every queue of the caller's scope).
    pub queue: Option<String>,
    /// A job state as a reader sees it (due scheduled jobs read as available).
    pub state: Option<String>,
    /// An exact job type.
    pub type_exact: Option<String>,
    /// A job type prefix (the client's `prefix*`).
    pub type_prefix: Option<String>,
    /// Created at or after.
    pub since: Option<DateTime<Utc>>,
    /// Created before.
    pub until: Option<DateTime<Utc>>,
}

/// Which field a job listing is ordered by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JobSort {
    /// Creation time.
    CreatedAt,
    /// Scheduled time (jobs without one last).
    ScheduledAt,
    /// Priority.
    Priority,
}

impl JobSort {
    /// The column name SQL sorts by.
    pub fn column(self) -> &'static str {
        match self {
            JobSort::CreatedAt => "created_at",
            JobSort::ScheduledAt => "scheduled_at",
            JobSort::Priority => "priority",
        }
    }
}

/// A checked listing request: filter, order and the rows wanted.
#[derive(Debug, Clone, PartialEq)]
pub struct JobListing {
    /// The filter.
    pub filter: JobFilter,
    /// Order field.
    pub sort: JobSort,
    /// Descending (the default) or ascending.
    pub descending: bool,
    /// 1-based page number.
    pub page: i64,
    /// Rows per page.
    pub per_page: i64,
}

/// A bulk action on the jobs a filter matches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BulkAction {
    /// Discarded or cancelled jobs back to available, attempts reset.
    Retry,
    /// Jobs not yet terminal cancelled.
    Cancel,
    /// Terminal jobs deleted.
    Delete,
}

impl BulkAction {
    /// The action's name on the wire and in SQL.
    pub fn as_str(self) -> &'static str {
        match self {
            BulkAction::Retry => "retry",
            BulkAction::Cancel => "cancel",
            BulkAction::Delete => "delete",
        }
    }

    /// The stored states the action applies to.
    pub fn states(self) -> &'static [&'static str] {
        match self {
            BulkAction::Retry => &["discarded", "cancelled"],
            BulkAction::Cancel => &["available", "scheduled", "pending", "active", "retryable"],
            BulkAction::Delete => &["completed", "cancelled", "discarded"],
        }
    }
}

/// One job a bulk action could not change, and why.
#[derive(Debug, Clone, PartialEq)]
pub struct BulkError {
    /// The job.
    pub job_id: Uuid,
    /// Why (its state no longer allowed the action, or it was gone).
    pub error: String,
}

/// What a bulk action did.
#[derive(Debug, Clone, PartialEq)]
pub struct BulkOutcome {
    /// The action.
    pub action: BulkAction,
    /// Jobs the call took on (at most the bound).
    pub matched: i64,
    /// Jobs changed.
    pub succeeded: i64,
    /// Jobs left alone (`errors`).
    pub failed: i64,
    /// Each job left alone.
    pub errors: Vec<BulkError>,
    /// Whether more jobs matched than one call takes (call again).
    pub has_more: bool,
}

/// One page of a listing that counts its total up to a cap.
#[derive(Debug, Clone, PartialEq)]
pub struct CountedPage<T> {
    /// The rows.
    pub items: Vec<T>,
    /// Matching rows, exact up to the cap.
    pub total: i64,
    /// Whether `total` is exact (false: at least that many).
    pub total_exact: bool,
    /// 1-based page number.
    pub page: i64,
    /// Rows per page asked.
    pub per_page: i64,
}
