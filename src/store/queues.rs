//! Queue namespaces: create, drop, adopt, configure, pause, list, count, and their stats.

use chrono::{DateTime, Utc};
use serde_json::Value;
use sqlx::types::Json;

use super::{Store, map_db_error};
use crate::model::access::Scope;
use crate::model::error::{CoreError, ErrorKind};
use crate::model::job::QueueSummary;
use crate::model::queue::{QueueConfig, QueueStats};

impl Store {
    /// `s3p.create_queue`: true when it was created now.
    #[tracing::instrument(name = "db", skip_all, fields(op = "create_queue"))]
    pub async fn create_queue(&self, queue: &str) -> Result<bool, CoreError> {
        self.retry_conflicts(|| {
            sqlx::query_scalar("SELECT s3p.create_queue($1)")
                .bind(queue)
                .fetch_one(&self.hot)
        })
        .await
        .map_err(map_db_error)
    }

    /// `s3p.drop_queue`.
    #[tracing::instrument(name = "db", skip_all, fields(op = "drop_queue"))]
    pub async fn drop_queue(&self, queue: &str) -> Result<(), CoreError> {
        let dropped = self
            .retry_conflicts(|| {
                sqlx::query("SELECT s3p.drop_queue($1)")
                    .bind(queue)
                    .execute(&self.hot)
            })
            .await
            .map(|_| ())
            .map_err(map_db_error);
        self.grouped.routes().forget(queue);
        dropped
    }

    /// `s3p.adopt_queue`: how many job ids were indexed.
    #[tracing::instrument(name = "db", skip_all, fields(op = "adopt_queue"))]
    pub async fn adopt_queue(&self, queue: &str) -> Result<i64, CoreError> {
        self.retry_conflicts(|| {
            sqlx::query_scalar("SELECT s3p.adopt_queue($1)")
                .bind(queue)
                .fetch_one(&self.hot)
        })
        .await
        .map_err(map_db_error)
    }

    /// `s3p.queue_stats`.
    #[tracing::instrument(name = "db", skip_all, fields(op = "queue_stats"))]
    pub async fn queue_stats(&self, queue: &str) -> Result<QueueStats, CoreError> {
        self.retry_conflicts(|| {
            sqlx::query_scalar("SELECT s3p.queue_stats($1)")
                .bind(queue)
                .fetch_one(&self.hot)
        })
        .await
        .map(|Json(stats)| stats)
        .map_err(map_db_error)
    }

    /// `s3p.queue_stats` of those of several queues that exist, in one round trip, in the order
    /// given. A queue dropped while it is read (a listing named it a moment before) is left out:
    /// the statement runs once more, and then no longer sees it.
    #[tracing::instrument(name = "db", skip_all, fields(op = "queue_stats_of"))]
    pub async fn queue_stats_of(&self, queues: &[String]) -> Result<Vec<QueueStats>, CoreError> {
        let read = || {
            self.retry_conflicts(|| {
                sqlx::query_scalar(
                    "SELECT s3p.queue_stats(u.name)
                       FROM unnest($1::text[]) WITH ORDINALITY AS u(name, i)
                      WHERE EXISTS (SELECT 1 FROM s3p.queues q WHERE q.name = u.name)
                      ORDER BY u.i",
                )
                .bind(queues)
                .fetch_all(&self.hot)
            })
        };
        let rows: Vec<Json<QueueStats>> = match read().await.map_err(map_db_error) {
            // The queue's own read found it gone after the listing saw it.
            Err(error) if error.kind == ErrorKind::NotFound => read().await.map_err(map_db_error),
            other => other,
        }?;
        Ok(rows.into_iter().map(|Json(stats)| stats).collect())
    }

    /// `s3p.queue_config`.
    #[tracing::instrument(name = "db", skip_all, fields(op = "queue_config"))]
    pub async fn queue_config(
        &self,
        queue: &str,
        changes: &Value,
    ) -> Result<QueueConfig, CoreError> {
        self.retry_conflicts(|| {
            sqlx::query_scalar("SELECT s3p.queue_config($1, $2)")
                .bind(queue)
                .bind(changes)
                .fetch_one(&self.hot)
        })
        .await
        .map(|Json(config)| config)
        .map_err(map_db_error)
    }

    /// `s3p.set_paused`.
    #[tracing::instrument(name = "db", skip_all, fields(op = "set_paused"))]
    pub async fn set_paused(&self, queue: &str, paused: bool) -> Result<bool, CoreError> {
        self.retry_conflicts(|| {
            sqlx::query_scalar("SELECT s3p.set_paused($1, $2)")
                .bind(queue)
                .bind(paused)
                .fetch_one(&self.hot)
        })
        .await
        .map_err(map_db_error)
    }

    /// `s3p.list_queues`; the available counts only when asked for.
    #[tracing::instrument(name = "db", skip_all, fields(op = "list_queues"))]
    pub async fn list_queues(
        &self,
        scope: &Scope,
        count_available: bool,
        after: Option<&str>,
        page_size: Option<i64>,
    ) -> Result<Vec<QueueSummary>, CoreError> {
        let rows: Vec<(String, bool, DateTime<Utc>, Option<i64>)> = self
            .retry_conflicts(|| {
                sqlx::query_as(
            "SELECT name, paused, created_at, available FROM s3p.list_queues($1, $2, $3, $4)",
        )
        .bind(count_available)
        .bind(after)
        .bind(page_size.map(|n| n as i32))
        .bind(scope.like_patterns())
        .fetch_all(&self.hot)
            })
            .await
            .map_err(map_db_error)?;
        Ok(rows
            .into_iter()
            .map(|(name, paused, created_at, available)| QueueSummary {
                name,
                paused,
                created_at,
                available,
            })
            .collect())
    }

    /// How many queue namespaces of `scope` exist.
    #[tracing::instrument(name = "db", skip_all, fields(op = "count_queues"))]
    pub async fn count_queues(&self, scope: &Scope) -> Result<i64, CoreError> {
        self.retry_conflicts(|| {
            sqlx::query_scalar("SELECT count(*) FROM s3p.queues WHERE s3p.in_scope(name, $1)")
                .bind(scope.like_patterns())
                .fetch_one(&self.hot)
        })
        .await
        .map_err(map_db_error)
    }
}
