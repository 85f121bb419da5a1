//! The OJS Admin API's decisions on queues, jobs, bulk actions, dead letters and the workflow
//! list (`/ojs/v1/admin/...`); both adapters and the dashboard call these, so nothing is
//! computed twice. Limits: `per_page` 1..=100, a listing reaches at most `MAX_ROWS` rows in,
//! totals are exact up to `TOTAL_CAP`, a bulk action takes at most `BULK_MAX` jobs per call.

pub mod jobs;
pub mod queues;

use super::CoreError;
use crate::model::time::parse_time;
use chrono::{DateTime, Datelike, Utc};

/// Rows per page when the client names none.
pub const DEFAULT_PER_PAGE: i64 = 20;
/// The most rows per page.
pub const MAX_PER_PAGE: i64 = 100;
/// How deep a listing may page (page × per_page): deeper offsets cost a scan of every row before.
pub const MAX_ROWS: i64 = 10_000;
/// Totals are counted exactly up to this many rows, then reported as "at least".
pub const TOTAL_CAP: i64 = 10_000;
/// The most jobs one bulk call changes; the answer says when more matched.
pub const BULK_MAX: i64 = 1_000;
/// Rows one purge transaction deletes before the next starts.
pub const PURGE_BATCH: i32 = 10_000;

/// A checked page request: `page` from 1, `per_page` 1..=100, not past `MAX_ROWS`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PageNumber {
    /// 1-based page.
    pub page: i64,
    /// Rows per page.
    pub per_page: i64,
}

impl PageNumber {
    /// Checks the client's page and per_page (400 naming the field).
    pub fn check(page: Option<i64>, per_page: Option<i64>) -> Result<PageNumber, CoreError> {
        let page = page.unwrap_or(1);
        let per_page = per_page.unwrap_or(DEFAULT_PER_PAGE);
        if page < 1 {
            return Err(invalid(
                "page",
                format!("page must be at least 1, not {page}"),
            ));
        }
        if !(1..=MAX_PER_PAGE).contains(&per_page) {
            return Err(invalid(
                "per_page",
                format!("per_page must be between 1 and {MAX_PER_PAGE}, not {per_page}"),
            ));
        }
        if (page - 1).saturating_mul(per_page) >= MAX_ROWS {
            return Err(invalid(
                "page",
                format!("pages reach at most {MAX_ROWS} rows in; narrow the filter instead"),
            ));
        }
        Ok(PageNumber { page, per_page })
    }

    /// Rows before this page.
    pub fn skip(self) -> i32 {
        ((self.page - 1) * self.per_page) as i32
    }
}

/// 400 invalid_request naming `field`.
pub(crate) fn invalid(field: &str, message: String) -> CoreError {
    CoreError::invalid(message).with_detail("field", field.into())
}

/// An RFC 3339 time with a zone, in years 1..=9999 (what PostgreSQL and every client store).
pub(crate) fn parse_instant(field: &str, text: &str) -> Result<DateTime<Utc>, CoreError> {
    parse_time(text)
        .filter(|t| (1..=9999).contains(&t.year()))
        .ok_or_else(|| {
            invalid(
                field,
                format!("{field} {text:?} is not an RFC 3339 time with a zone (years 0001-9999)"),
            )
        })
}

/// The `confirm: true` interlock of destructive and bulk operations.
pub(crate) fn require_confirm(confirm: Option<bool>) -> Result<(), CoreError> {
    if confirm == Some(true) {
        Ok(())
    } else {
        Err(invalid(
            "confirm",
            "this operation needs \"confirm\": true in its body".to_string(),
        ))
    }
}
