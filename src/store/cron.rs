//! The cron calls: one `s3p.cron_*` function each.

use chrono::{DateTime, Utc};
use serde_json::Value;
use uuid::Uuid;

use super::rows::CronRow;
use super::{Store, map_db_error};
use crate::model::access::Scope;
use crate::model::error::CoreError;
use crate::model::job::NewJob;
use crate::model::workflow::CronEntry;

impl Store {
    /// `s3p.cron_register`.
    #[tracing::instrument(name = "db", skip_all, fields(op = "register_cron"))]
    pub async fn register_cron(
        &self,
        name: &str,
        expression: &str,
        timezone: &str,
        overlap: &str,
        template: &Value,
        first_run: Option<DateTime<Utc>>,
    ) -> Result<CronEntry, CoreError> {
        self.retry_conflicts(|| {
            sqlx::query_as::<_, CronRow>("SELECT * FROM s3p.cron_register($1, $2, $3, $4, $5, $6)")
                .bind(name)
                .bind(expression)
                .bind(timezone)
                .bind(overlap)
                .bind(template)
                .bind(first_run)
                .fetch_one(&self.hot)
        })
        .await
        .map(CronEntry::from)
        .map_err(map_db_error)
    }

    /// `s3p.cron_unregister`: an entry of a queue outside `scope` is not found.
    #[tracing::instrument(name = "db", skip_all, fields(op = "unregister_cron"))]
    pub async fn unregister_cron(&self, scope: &Scope, name: &str) -> Result<CronEntry, CoreError> {
        self.retry_conflicts(|| {
            sqlx::query_as::<_, CronRow>("SELECT * FROM s3p.cron_unregister($1, $2)")
                .bind(name)
                .bind(scope.like_patterns())
                .fetch_one(&self.hot)
        })
        .await
        .map(CronEntry::from)
        .map_err(map_db_error)
    }

    /// `s3p.cron_list`: up to `page_size` entries of `scope` named after `after`, in name order.
    #[tracing::instrument(name = "db", skip_all, fields(op = "list_crons"))]
    pub async fn list_crons(
        &self,
        scope: &Scope,
        after: Option<&str>,
        page_size: i64,
    ) -> Result<Vec<CronEntry>, CoreError> {
        self.retry_conflicts(|| {
            sqlx::query_as::<_, CronRow>("SELECT * FROM s3p.cron_list($1, $2, $3)")
                .bind(scope.like_patterns())
                .bind(after)
                .bind(i32::try_from(page_size).unwrap_or(i32::MAX))
                .fetch_all(&self.hot)
        })
        .await
        .map(|rows| rows.into_iter().map(CronEntry::from).collect())
        .map_err(map_db_error)
    }

    /// `s3p.cron_count`: how many entries `scope` covers.
    #[tracing::instrument(name = "db", skip_all, fields(op = "count_crons"))]
    pub async fn count_crons(&self, scope: &Scope) -> Result<i64, CoreError> {
        self.retry_conflicts(|| {
            sqlx::query_scalar("SELECT s3p.cron_count($1)")
                .bind(scope.like_patterns())
                .fetch_one(&self.hot)
        })
        .await
        .map_err(map_db_error)
    }

    /// `s3p.cron_due`.
    #[tracing::instrument(name = "db", skip_all, fields(op = "due_crons"))]
    pub async fn due_crons(&self, max: i32) -> Result<Vec<CronEntry>, CoreError> {
        self.retry_conflicts(|| {
            sqlx::query_as::<_, CronRow>("SELECT * FROM s3p.cron_due($1)")
                .bind(max)
                .fetch_all(&self.hot)
        })
        .await
        .map(|rows| rows.into_iter().map(CronEntry::from).collect())
        .map_err(map_db_error)
    }

    /// `s3p.cron_fire`: the enqueued job id, or None (skipped or fired elsewhere).
    #[tracing::instrument(name = "db", skip_all, fields(op = "fire_cron"))]
    pub async fn fire_cron(
        &self,
        name: &str,
        expected: DateTime<Utc>,
        following: Option<DateTime<Utc>>,
        job: &NewJob,
    ) -> Result<Option<Uuid>, CoreError> {
        // Firing enqueues a job (unique keys, the job index): a conflict is run again.
        self.retry_conflicts(|| {
            sqlx::query_scalar("SELECT s3p.cron_fire($1, $2, $3, $4)")
                .bind(name)
                .bind(expected)
                .bind(following)
                .bind(sqlx::types::Json(job))
                .fetch_one(&self.hot)
        })
        .await
        .map_err(map_db_error)
    }
}
