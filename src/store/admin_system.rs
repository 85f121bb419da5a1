//! The Admin API's worker registry, maintenance mode and throughput rollup
//! (`sql/013_admin_workers.sql`): one SQL function call per operation.

use chrono::{DateTime, Utc};
use sqlx::types::Json;

use super::{Store, map_db_error};
use crate::model::access::Scope;
use crate::model::admin_system::{
    ActiveLease, MaintenanceState, StatsPoint, WorkerCounts, WorkerInfo,
};
use crate::model::error::CoreError;

/// A worker a gateway saw since its last tick, handed to `s3p.admin_tick`.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Sighting {
    /// Worker id.
    pub id: String,
    /// Queues it fetched from.
    pub queues: Vec<String>,
    /// When it was last seen.
    pub at: DateTime<Utc>,
    /// Whether a heartbeat was among the sightings.
    pub heartbeat: bool,
}

/// What every gateway follows, read on each tick.
#[derive(Debug, Clone, Default)]
pub struct SharedAdminState {
    /// Maintenance mode.
    pub maintenance: MaintenanceState,
    /// Workers asked to be quiet.
    pub quiet: Vec<String>,
}

#[derive(sqlx::FromRow)]
struct TickRow {
    maintenance: bool,
    reason: Option<String>,
    enabled_at: Option<DateTime<Utc>>,
    estimated_end: Option<DateTime<Utc>>,
    quiet: Vec<String>,
}

#[derive(sqlx::FromRow)]
struct MaintenanceRow {
    maintenance: bool,
    reason: Option<String>,
    enabled_at: Option<DateTime<Utc>>,
    estimated_end: Option<DateTime<Utc>>,
}

impl From<MaintenanceRow> for MaintenanceState {
    fn from(row: MaintenanceRow) -> Self {
        MaintenanceState {
            enabled: row.maintenance,
            reason: row.reason,
            enabled_at: row.enabled_at,
            estimated_end: row.estimated_end,
        }
    }
}

#[derive(sqlx::FromRow)]
struct WorkerRow {
    id: String,
    queues: Vec<String>,
    state: String,
    started_at: DateTime<Utc>,
    last_seen_at: DateTime<Utc>,
    last_heartbeat_at: Option<DateTime<Utc>>,
}

impl From<WorkerRow> for WorkerInfo {
    fn from(row: WorkerRow) -> Self {
        WorkerInfo {
            id: row.id,
            queues: row.queues,
            state: row.state,
            started_at: row.started_at,
            last_seen_at: row.last_seen_at,
            last_heartbeat_at: row.last_heartbeat_at,
            active_jobs: 0,
            jobs: Vec::new(),
        }
    }
}

#[derive(sqlx::FromRow)]
struct WorkerPageRow {
    id: Option<String>,
    queues: Option<Vec<String>>,
    state: Option<String>,
    started_at: Option<DateTime<Utc>>,
    last_seen_at: Option<DateTime<Utc>>,
    last_heartbeat_at: Option<DateTime<Utc>>,
    total: i64,
    running: i64,
    quiet: i64,
    stale: i64,
}

#[derive(sqlx::FromRow)]
struct LeaseRow {
    worker: String,
    active: i64,
    jobs: Option<Json<Vec<ActiveLease>>>,
}

#[derive(sqlx::FromRow)]
struct StatsRow {
    bucket: DateTime<Utc>,
    enqueued: i64,
    processed: i64,
    failed: i64,
}

/// A worker's leases: how many, and the first few.
pub type WorkerLeases = (i64, Vec<ActiveLease>);

impl Store {
    /// `s3p.admin_tick`: hands over the sightings, steps the rollup (`rollup_batch` log rows; 0:
    /// not in the tick), reads maintenance mode and the quiet workers.
    #[tracing::instrument(name = "db", skip_all, fields(op = "admin_tick"))]
    pub async fn admin_tick(
        &self,
        seen: &[Sighting],
        rollup_batch: i32,
    ) -> Result<SharedAdminState, CoreError> {
        let row: TickRow = sqlx::query_as(
            "SELECT maintenance, reason, enabled_at, estimated_end, quiet FROM s3p.admin_tick($1, $2)",
        )
        .bind(Json(seen))
        .bind(rollup_batch)
        .fetch_one(self.hot())
        .await
        .map_err(map_db_error)?;
        Ok(SharedAdminState {
            maintenance: MaintenanceState {
                enabled: row.maintenance,
                reason: row.reason,
                enabled_at: row.enabled_at,
                estimated_end: row.estimated_end,
            },
            quiet: row.quiet,
        })
    }

    /// `s3p.stats_rollup`: adds the events after the rollup's cursor (at most `batch` log rows)
    /// to the per-minute and per-hour counts; returns the events counted.
    #[tracing::instrument(name = "db", skip_all, fields(op = "stats_rollup"))]
    pub async fn stats_rollup(&self, batch: i32) -> Result<i64, CoreError> {
        sqlx::query_scalar("SELECT s3p.stats_rollup($1)")
            .bind(batch)
            .fetch_one(self.hot())
            .await
            .map_err(map_db_error)
    }

    /// `s3p.workers_page`: one page of workers in id order and the counts by state.
    #[tracing::instrument(name = "db", skip_all, fields(op = "workers_page"))]
    pub async fn workers_page(
        &self,
        scope: &Scope,
        offset: i64,
        limit: i64,
    ) -> Result<(Vec<WorkerInfo>, WorkerCounts), CoreError> {
        let rows: Vec<WorkerPageRow> = sqlx::query_as(
            "SELECT id, queues, state, started_at, last_seen_at, last_heartbeat_at,
                    total, running, quiet, stale
               FROM s3p.workers_page($1, $2, $3)",
        )
        .bind(i32::try_from(offset).unwrap_or(i32::MAX))
        .bind(i32::try_from(limit).unwrap_or(i32::MAX))
        .bind(scope.like_patterns())
        .fetch_all(self.hot())
        .await
        .map_err(map_db_error)?;
        let counts = rows
            .first()
            .map(|r| WorkerCounts {
                total: r.total,
                running: r.running,
                quiet: r.quiet,
                stale: r.stale,
            })
            .unwrap_or_default();
        let items = rows
            .into_iter()
            .filter_map(|r| {
                Some(WorkerInfo {
                    id: r.id?,
                    queues: r.queues.unwrap_or_default(),
                    state: r.state?,
                    started_at: r.started_at?,
                    last_seen_at: r.last_seen_at?,
                    last_heartbeat_at: r.last_heartbeat_at,
                    active_jobs: 0,
                    jobs: Vec::new(),
                })
            })
            .collect();
        Ok((items, counts))
    }

    /// `s3p.worker_get`: one worker in scope, if known.
    #[tracing::instrument(name = "db", skip_all, fields(op = "worker_get"))]
    pub async fn worker_get(
        &self,
        scope: &Scope,
        worker: &str,
    ) -> Result<Option<WorkerInfo>, CoreError> {
        let row: Option<WorkerRow> = sqlx::query_as(
            "SELECT id, queues, state, started_at, last_seen_at, last_heartbeat_at
               FROM s3p.worker_get($1, $2)",
        )
        .bind(worker)
        .bind(scope.like_patterns())
        .fetch_optional(self.hot())
        .await
        .map_err(map_db_error)?;
        Ok(row.map(WorkerInfo::from))
    }

    /// `s3p.worker_leases`: per worker, its lease count and first `per_worker` jobs.
    #[tracing::instrument(name = "db", skip_all, fields(op = "worker_leases"))]
    pub async fn worker_leases(
        &self,
        scope: &Scope,
        workers: &[String],
        per_worker: i32,
    ) -> Result<std::collections::HashMap<String, WorkerLeases>, CoreError> {
        let rows: Vec<LeaseRow> =
            sqlx::query_as("SELECT worker, active, jobs FROM s3p.worker_leases($1, $2, $3)")
                .bind(workers)
                .bind(per_worker)
                .bind(scope.like_patterns())
                .fetch_all(self.hot())
                .await
                .map_err(map_db_error)?;
        Ok(rows
            .into_iter()
            .map(|r| {
                (
                    r.worker,
                    (r.active, r.jobs.map(|j| j.0).unwrap_or_default()),
                )
            })
            .collect())
    }

    /// `s3p.worker_quiet`: marks a worker quiet (404 when unknown or out of scope).
    #[tracing::instrument(name = "db", skip_all, fields(op = "worker_quiet"))]
    pub async fn worker_quiet(&self, scope: &Scope, worker: &str) -> Result<WorkerInfo, CoreError> {
        let row: WorkerRow = sqlx::query_as(
            "SELECT id, queues, state, started_at, last_seen_at, last_heartbeat_at
               FROM s3p.worker_quiet($1, $2)",
        )
        .bind(worker)
        .bind(scope.like_patterns())
        .fetch_one(self.hot())
        .await
        .map_err(map_db_error)?;
        Ok(row.into())
    }

    /// `s3p.worker_deregister`: removes a stale worker (409 otherwise unless `force`), releasing
    /// its leases; returns how many.
    #[tracing::instrument(name = "db", skip_all, fields(op = "worker_deregister"))]
    pub async fn worker_deregister(
        &self,
        scope: &Scope,
        worker: &str,
        force: bool,
    ) -> Result<i64, CoreError> {
        self.retry_conflicts(|| {
            sqlx::query_scalar("SELECT s3p.worker_deregister($1, $2, $3)")
                .bind(worker)
                .bind(force)
                .bind(scope.like_patterns())
                .fetch_one(self.hot())
        })
        .await
        .map_err(map_db_error)
    }

    /// `s3p.set_maintenance`.
    #[tracing::instrument(name = "db", skip_all, fields(op = "set_maintenance"))]
    pub async fn set_maintenance(
        &self,
        enabled: bool,
        reason: Option<&str>,
        estimated_end: Option<DateTime<Utc>>,
    ) -> Result<MaintenanceState, CoreError> {
        let row: MaintenanceRow = sqlx::query_as(
            "SELECT maintenance, reason, enabled_at, estimated_end
               FROM s3p.set_maintenance($1, $2, $3)",
        )
        .bind(enabled)
        .bind(reason)
        .bind(estimated_end)
        .fetch_one(self.hot())
        .await
        .map_err(map_db_error)?;
        Ok(row.into())
    }

    /// `s3p.stats_history`: buckets of `period_s` seconds (zeros where nothing happened).
    #[tracing::instrument(name = "db", skip_all, fields(op = "stats_history"))]
    pub async fn stats_history(
        &self,
        scope: &Scope,
        period_s: i32,
        since: DateTime<Utc>,
        until: DateTime<Utc>,
        queue: Option<&str>,
    ) -> Result<Vec<StatsPoint>, CoreError> {
        let rows: Vec<StatsRow> = sqlx::query_as(
            "SELECT bucket, enqueued, processed, failed FROM s3p.stats_history($1, $2, $3, $4, $5)",
        )
        .bind(period_s)
        .bind(since)
        .bind(until)
        .bind(queue)
        .bind(scope.like_patterns())
        .fetch_all(self.hot())
        .await
        .map_err(map_db_error)?;
        Ok(rows
            .into_iter()
            .map(|r| StatsPoint {
                timestamp: r.bucket,
                processed: r.processed,
                failed: r.failed,
                enqueued: r.enqueued,
            })
            .collect())
    }

    /// `s3p.stats_recent`: completions and failed attempts of the last `minutes` minutes.
    #[tracing::instrument(name = "db", skip_all, fields(op = "stats_recent"))]
    pub async fn stats_recent(&self, scope: &Scope, minutes: i32) -> Result<(i64, i64), CoreError> {
        sqlx::query_as("SELECT processed, failed FROM s3p.stats_recent($1, $2)")
            .bind(minutes)
            .bind(scope.like_patterns())
            .fetch_one(self.hot())
            .await
            .map_err(map_db_error)
    }
}

impl Store {
    /// `s3p.cron_page_at`: a page of cron entries by offset, in name order.
    #[tracing::instrument(name = "db", skip_all, fields(op = "cron_page_at"))]
    pub async fn cron_page_at(
        &self,
        scope: &Scope,
        offset: i64,
        limit: i64,
    ) -> Result<Vec<crate::model::workflow::CronEntry>, CoreError> {
        sqlx::query_as::<_, super::rows::CronRow>("SELECT * FROM s3p.cron_page_at($1, $2, $3)")
            .bind(scope.like_patterns())
            .bind(i32::try_from(offset).unwrap_or(i32::MAX))
            .bind(i32::try_from(limit).unwrap_or(i32::MAX))
            .fetch_all(self.hot())
            .await
            .map(|rows| rows.into_iter().map(Into::into).collect())
            .map_err(map_db_error)
    }

    /// `s3p.cron_get`: one cron entry in scope (404 otherwise).
    #[tracing::instrument(name = "db", skip_all, fields(op = "cron_get"))]
    pub async fn cron_get(
        &self,
        scope: &Scope,
        name: &str,
    ) -> Result<crate::model::workflow::CronEntry, CoreError> {
        sqlx::query_as::<_, super::rows::CronRow>("SELECT * FROM s3p.cron_get($1, $2)")
            .bind(name)
            .bind(scope.like_patterns())
            .fetch_one(self.hot())
            .await
            .map(Into::into)
            .map_err(map_db_error)
    }

    /// `s3p.cron_set_enabled`: pauses or resumes a cron entry.
    #[tracing::instrument(name = "db", skip_all, fields(op = "cron_set_enabled"))]
    pub async fn cron_set_enabled(
        &self,
        scope: &Scope,
        name: &str,
        enabled: bool,
        next_run: Option<DateTime<Utc>>,
    ) -> Result<crate::model::workflow::CronEntry, CoreError> {
        sqlx::query_as::<_, super::rows::CronRow>(
            "SELECT * FROM s3p.cron_set_enabled($1, $2, $3, $4)",
        )
        .bind(name)
        .bind(enabled)
        .bind(next_run)
        .bind(scope.like_patterns())
        .fetch_one(self.hot())
        .await
        .map(Into::into)
        .map_err(map_db_error)
    }
}
