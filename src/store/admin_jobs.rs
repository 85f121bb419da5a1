//! The Admin API's job reads and actions (`sql/012_admin_jobs.sql`): filtered listings across a
//! scope's queues, bulk actions, purges, a queue's oldest ready job, the workflow list.

use chrono::{DateTime, Utc};
use serde_json::Value;
use uuid::Uuid;

use super::rows::{JobRow, jobs, one};
use super::{Store, map_db_error};
use crate::model::access::Scope;
use crate::model::admin::{BulkAction, BulkError, JobFilter};
use crate::model::error::{CoreError, ErrorKind};
use crate::model::job::Job;

/// One row of `s3p.admin_bulk`.
#[derive(sqlx::FromRow)]
struct BulkRow {
    job_id: Uuid,
    error: Option<String>,
    more: bool,
}

/// What `s3p.admin_bulk` did: each job looked at with its error (None: done), and whether more
/// matched.
pub struct BulkRows {
    /// Jobs done.
    pub done: i64,
    /// Jobs left alone and why.
    pub errors: Vec<BulkError>,
    /// Whether more jobs matched than the bound.
    pub has_more: bool,
}

impl Store {
    /// `s3p.admin_jobs`: a page of the jobs matching `filter` in `scope`.
    #[tracing::instrument(name = "db", skip_all, fields(op = "admin_jobs"))]
    #[allow(clippy::too_many_arguments)]
    pub async fn admin_jobs(
        &self,
        scope: &Scope,
        filter: &JobFilter,
        sort: &str,
        descending: bool,
        skip: i32,
        take: i32,
    ) -> Result<Vec<Job>, CoreError> {
        let rows: Vec<JobRow> = self
            .retry_conflicts(|| {
                sqlx::query_as(
                    "SELECT * FROM s3p.admin_jobs($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)",
                )
                .bind(filter.queue.as_deref())
                .bind(scope.like_patterns())
                .bind(filter.state.as_deref())
                .bind(filter.type_exact.as_deref())
                .bind(filter.type_prefix.as_deref())
                .bind(filter.since)
                .bind(filter.until)
                .bind(sort)
                .bind(descending)
                .bind(skip)
                .bind(take)
                .fetch_all(&self.hot)
            })
            .await
            .map_err(map_db_error)?;
        jobs(rows)
    }

    /// `s3p.admin_jobs_count`: matching jobs, counted up to `cap`.
    #[tracing::instrument(name = "db", skip_all, fields(op = "admin_jobs_count"))]
    pub async fn admin_jobs_count(
        &self,
        scope: &Scope,
        filter: &JobFilter,
        cap: i32,
    ) -> Result<i64, CoreError> {
        self.retry_conflicts(|| {
            sqlx::query_scalar("SELECT s3p.admin_jobs_count($1, $2, $3, $4, $5, $6, $7, $8)")
                .bind(filter.queue.as_deref())
                .bind(scope.like_patterns())
                .bind(filter.state.as_deref())
                .bind(filter.type_exact.as_deref())
                .bind(filter.type_prefix.as_deref())
                .bind(filter.since)
                .bind(filter.until)
                .bind(cap)
                .fetch_one(&self.hot)
        })
        .await
        .map_err(map_db_error)
    }

    /// `s3p.admin_bulk`: `action` on up to `max` jobs matching `filter` in `scope`. It locks
    /// job rows, so a deadlock victim is run again (`Conflicts::rerun`).
    #[tracing::instrument(name = "db", skip_all, fields(op = "admin_bulk"))]
    pub async fn admin_bulk(
        &self,
        action: BulkAction,
        scope: &Scope,
        filter: &JobFilter,
        max: i32,
    ) -> Result<BulkRows, CoreError> {
        let patterns = scope.like_patterns();
        let rows: Vec<BulkRow> = self
            .retry_conflicts(|| {
                sqlx::query_as(
                    "SELECT job_id, error, more FROM s3p.admin_bulk($1, $2, $3, $4, $5, $6, $7, $8, $9)",
                )
                .bind(action.as_str())
                .bind(filter.queue.as_deref())
                .bind(&patterns)
                .bind(filter.state.as_deref())
                .bind(filter.type_exact.as_deref())
                .bind(filter.type_prefix.as_deref())
                .bind(filter.since)
                .bind(filter.until)
                .bind(max)
                .fetch_all(&self.hot)
            })
            .await
            .map_err(map_db_error)?;
        let has_more = rows.iter().any(|r| r.more);
        let mut done = 0;
        let mut errors = Vec::new();
        for row in rows {
            match row.error {
                None => done += 1,
                Some(error) => errors.push(BulkError {
                    job_id: row.job_id,
                    error,
                }),
            }
        }
        Ok(BulkRows {
            done,
            errors,
            has_more,
        })
    }

    /// `s3p.purge_queue_jobs` until a batch comes back short: each batch its own transaction,
    /// so a large purge never holds its locks long. Returns the jobs deleted.
    #[tracing::instrument(name = "db", skip_all, fields(op = "purge_queue_jobs"))]
    pub async fn purge_queue_jobs(
        &self,
        queue: &str,
        states: &[String],
        older_than: Option<DateTime<Utc>>,
        batch: i32,
    ) -> Result<i64, CoreError> {
        let mut total = 0i64;
        loop {
            let removed: i32 = self
                .retry_conflicts(|| {
                    sqlx::query_scalar("SELECT s3p.purge_queue_jobs($1, $2, $3, $4)")
                        .bind(queue)
                        .bind(states)
                        .bind(older_than)
                        .bind(batch)
                        .fetch_one(&self.hot)
                })
                .await
                .map_err(map_db_error)?;
            total += i64::from(removed);
            if removed < batch {
                return Ok(total);
            }
        }
    }

    /// `s3p.admin_retry_job`: a discarded or cancelled job back to available.
    #[tracing::instrument(name = "db", skip_all, fields(op = "admin_retry_job"))]
    pub async fn admin_retry_job(&self, id: Uuid) -> Result<Job, CoreError> {
        let rows = self
            .retry_conflicts(|| {
                sqlx::query_as("SELECT * FROM s3p.admin_retry_job($1)")
                    .bind(id)
                    .fetch_all(&self.hot)
            })
            .await
            .map_err(map_db_error)?;
        one(rows, id)
    }

    /// Deletes one terminal job (`s3p.admin_act` on it): 409 when its state does not allow it.
    #[tracing::instrument(name = "db", skip_all, fields(op = "admin_delete_job"))]
    pub async fn admin_delete_job(&self, id: Uuid) -> Result<(), CoreError> {
        let error: Option<String> = self
            .retry_conflicts(|| {
                sqlx::query_scalar(
                    "SELECT a.error FROM s3p.admin_act('delete', s3p.job_schema($1), ARRAY[$1]) a",
                )
                .bind(id)
                .fetch_one(&self.hot)
            })
            .await
            .map_err(map_db_error)?;
        match error {
            None => Ok(()),
            Some(why) => Err(CoreError::new(ErrorKind::Conflict, why)),
        }
    }

    /// `s3p.oldest_available_at`: when the oldest job a fetch could claim now became ready.
    #[tracing::instrument(name = "db", skip_all, fields(op = "oldest_available_at"))]
    pub async fn oldest_available_at(
        &self,
        queue: &str,
    ) -> Result<Option<DateTime<Utc>>, CoreError> {
        self.retry_conflicts(|| {
            sqlx::query_scalar("SELECT s3p.oldest_available_at($1)")
                .bind(queue)
                .fetch_one(&self.hot)
        })
        .await
        .map_err(map_db_error)
    }

    /// `s3p.workflows_list`: a page of workflows in `scope` (their summaries) and how many
    /// there are.
    #[tracing::instrument(name = "db", skip_all, fields(op = "workflows_list"))]
    pub async fn workflows_list(
        &self,
        scope: &Scope,
        state: Option<&str>,
        skip: i32,
        take: i32,
    ) -> Result<(Vec<Value>, i64), CoreError> {
        let (items, total): (Value, i64) = self
            .retry_conflicts(|| {
                sqlx::query_as("SELECT items, total FROM s3p.workflows_list($1, $2, $3, $4)")
                    .bind(scope.like_patterns())
                    .bind(state)
                    .bind(skip)
                    .bind(take)
                    .fetch_one(&self.hot)
            })
            .await
            .map_err(map_db_error)?;
        Ok((
            match items {
                Value::Array(items) => items,
                _ => Vec::new(),
            },
            total,
        ))
    }
}
