//! sqlx → PL/pgSQL: every operation is one SQL function call (`s3p`, or the queue's own
//! `s3q_<q>` on the grouped hot path); SQLSTATEs become core errors.

mod admin_jobs;
pub mod admin_system;
mod coalesce;
mod conflicts;
mod cron;
mod grouped;
pub mod hosts;
mod liveness;
pub mod migrate;
mod routes;
mod rows;
pub mod signals;
mod stream;
pub mod tokens;

use std::time::Duration;

use chrono::{DateTime, Utc};
use serde_json::{Map, Value};
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};
use sqlx::types::Json;
use uuid::Uuid;

use crate::model::access::Scope;
use crate::model::error::{CoreError, ErrorKind};
use crate::model::job::{
    Completion, Job, JobState, MaintenanceReport, NewJob, QueueSummary, RetryPolicy,
};
use crate::model::queue::{QueueConfig, QueueStats};
pub use grouped::{AckItem, GroupingStats};
use grouped::{AckShape, Acked};
pub use rows::EventsRead;
use rows::{EventReadRow, EventRow};
pub use signals::{Signals, Wakeups};

/// The database handle of the service.
#[derive(Clone)]
pub struct Store {
    pool: PgPool,
    signals: Signals,
    grouped: std::sync::Arc<grouped::Grouped>,
    conflicts: std::sync::Arc<conflicts::Conflicts>,
    due_marks: std::sync::Arc<std::sync::Mutex<DueMarks>>,
    /// This gateway's token cache, once started: its own revocations reach it at once, not
    /// only when the NOTIFY comes back.
    token_cache: std::sync::Arc<std::sync::OnceLock<std::sync::Arc<tokens::Shared>>>,
    /// The host follower, when the URL names several hosts (see `hosts`).
    follower: Option<std::sync::Arc<hosts::Follower>>,
}

/// One maintenance pass in this many also steps through queues whose jobs table waits for a
/// vacuum (with the default 500 ms interval, every 10 s).
const VACUUM_LOOK_EVERY: u32 = 20;

/// Queues this gateway's requests gave maintenance work, each with the earliest time it is due,
/// until the maintenance loop hands them to `s3p.mark_queues_due`.
#[derive(Default)]
struct DueMarks {
    by_queue: std::collections::HashMap<String, DateTime<Utc>>,
    /// Passes since the last look for jobs tables that wait for a vacuum.
    passes: u32,
}

/// One row of `s3p.job`.
#[derive(sqlx::FromRow)]
struct JobRow {
    id: Uuid,
    queue: String,
    #[sqlx(rename = "type")]
    job_type: String,
    args: Option<Value>,
    meta: Option<Value>,
    extra: Option<Value>,
    state: String,
    previous_state: Option<String>,
    priority: Option<i32>,
    attempt: Option<i32>,
    max_attempts: Option<i32>,
    timeout_ms: Option<i64>,
    visibility_timeout_ms: Option<i64>,
    retry: Option<Value>,
    uniq: Option<Value>,
    tags: Option<Value>,
    created_at: Option<DateTime<Utc>>,
    enqueued_at: Option<DateTime<Utc>>,
    scheduled_at: Option<DateTime<Utc>>,
    expires_at: Option<DateTime<Utc>>,
    started_at: Option<DateTime<Utc>>,
    completed_at: Option<DateTime<Utc>>,
    cancelled_at: Option<DateTime<Utc>>,
    run_at: Option<DateTime<Utc>>,
    lease_token: Option<Uuid>,
    lease_expires_at: Option<DateTime<Utc>>,
    worker_id: Option<String>,
    result: Option<Value>,
    error: Option<Value>,
    errors: Option<Value>,
    retry_delay_ms: Option<i64>,
    workflow_id: Option<Uuid>,
    parent_results: Option<Value>,
}

/// A lease a heartbeat extended: job id, test directive, new lease end.
pub type ExtendedLease = (Uuid, Option<String>, DateTime<Utc>);

/// One row of `s3p.maintain_queue`.
#[derive(sqlx::FromRow)]
struct QueueMaintenanceRow {
    released: i64,
    expired: i64,
    removed: i64,
    retries_moved: i64,
    rotated: bool,
}

/// Vacuums the queue's jobs table when `s3p.jobs_vacuum_due` says dead row versions piled up. A
/// table that went away (a queue dropped meanwhile) or is being vacuumed already is left alone.
async fn vacuum_if_due(
    conn: &mut sqlx::PgConnection,
    queue: &str,
    report: &mut MaintenanceReport,
) -> Result<(), CoreError> {
    let due: Option<String> = sqlx::query_scalar("SELECT s3p.jobs_vacuum_due($1)")
        .bind(queue)
        .fetch_one(&mut *conn)
        .await
        .map_err(map_db_error)?;
    let Some(table) = due else {
        return Ok(());
    };
    match sqlx::raw_sql(sqlx::AssertSqlSafe(format!("VACUUM (SKIP_LOCKED) {table}")))
        .execute(&mut *conn)
        .await
    {
        Ok(_) => report.vacuums += 1,
        Err(error) => tracing::warn!(queue, %error, "vacuum of the jobs table failed"),
    }
    Ok(())
}

/// The steps of a pass whose lock is held: each due queue in its own transaction (and, with
/// `with_vacuum`, each whose jobs table waits for a vacuum), then the shared step.
async fn maintenance_pass(
    conn: &mut sqlx::PgConnection,
    retention_ms: i64,
    batch: i32,
    with_vacuum: bool,
    report: &mut MaintenanceReport,
) -> Result<(), CoreError> {
    let queues: Vec<String> = sqlx::query_scalar("SELECT s3p.due_queues($1)")
        .bind(with_vacuum)
        .fetch_all(&mut *conn)
        .await
        .map_err(map_db_error)?;
    report.queues_stepped = queues.len() as i64;
    // One queue's failure is that queue's alone: logged, counted, and the pass goes on.
    for queue in queues {
        if let Err(error) = maintain_one_queue(conn, &queue, retention_ms, batch, report).await {
            tracing::warn!(queue, %error, "maintenance of a queue failed");
            report.failed_steps.push(queue);
        }
    }
    let shared = sqlx::query("SELECT s3p.maintain_shared($1)")
        .bind(batch)
        .execute(&mut *conn)
        .await;
    if let Err(error) = shared {
        tracing::warn!(%error, "the shared maintenance step failed");
        report.failed_steps.push(String::new());
    }
    Ok(())
}

/// One queue's maintenance step (its own transaction), then its vacuum when due.
async fn maintain_one_queue(
    conn: &mut sqlx::PgConnection,
    queue: &str,
    retention_ms: i64,
    batch: i32,
    report: &mut MaintenanceReport,
) -> Result<(), CoreError> {
    let row: QueueMaintenanceRow = sqlx::query_as(
        "SELECT released, expired, removed, retries_moved, rotated
           FROM s3p.maintain_queue($1, $2, $3)",
    )
    .bind(queue)
    .bind(retention_ms)
    .bind(batch)
    .fetch_one(&mut *conn)
    .await
    .map_err(map_db_error)?;
    report.released += row.released;
    report.expired += row.expired;
    report.removed += row.removed;
    report.retries_moved += row.retries_moved;
    report.rotations += i64::from(row.rotated);
    vacuum_if_due(conn, queue, report).await
}

/// The queue of a plain job (see [`NewJob::is_plain`]): the jobs the queue's own
/// `enqueue_plain` stores; others take `s3p.enqueue` for their per-job checks.
fn plain_queue(row: &NewJob) -> Option<&str> {
    row.is_plain().then_some(row.queue.as_str())
}

/// The one queue of a non-empty list of plain jobs, if they share one.
fn one_plain_queue(rows: &[NewJob]) -> Option<&str> {
    let (first, rest) = rows.split_first()?;
    let queue = plain_queue(first)?;
    rest.iter()
        .all(|row| plain_queue(row) == Some(queue))
        .then_some(queue)
}

fn object(value: Option<Value>) -> Option<Map<String, Value>> {
    match value {
        Some(Value::Object(map)) => Some(map),
        _ => None,
    }
}

fn array(value: Option<Value>) -> Vec<Value> {
    match value {
        Some(Value::Array(items)) => items,
        _ => Vec::new(),
    }
}

impl TryFrom<JobRow> for Job {
    type Error = CoreError;

    fn try_from(row: JobRow) -> Result<Job, CoreError> {
        let state = JobState::parse(&row.state).ok_or_else(|| {
            CoreError::new(
                ErrorKind::Backend,
                format!("stored job has unknown state {}", row.state),
            )
        })?;
        Ok(Job {
            id: row.id,
            queue: row.queue,
            job_type: row.job_type,
            args: array(row.args),
            meta: object(row.meta),
            extra: object(row.extra).unwrap_or_default(),
            state,
            previous_state: row.previous_state.as_deref().and_then(JobState::parse),
            priority: row.priority.unwrap_or(0),
            attempt: row.attempt.unwrap_or(0),
            max_attempts: row.max_attempts.unwrap_or(1),
            timeout_ms: row.timeout_ms,
            visibility_timeout_ms: row.visibility_timeout_ms,
            retry: row
                .retry
                .and_then(|r| serde_json::from_value::<RetryPolicy>(r).ok())
                .unwrap_or_default(),
            unique: row.uniq,
            tags: array(row.tags)
                .into_iter()
                .filter_map(|t| t.as_str().map(str::to_string))
                .collect(),
            created_at: row.created_at.unwrap_or_else(Utc::now),
            enqueued_at: row.enqueued_at,
            scheduled_at: row.scheduled_at,
            expires_at: row.expires_at,
            started_at: row.started_at,
            completed_at: row.completed_at,
            cancelled_at: row.cancelled_at,
            lease_token: row.lease_token,
            lease_expires_at: row.lease_expires_at,
            worker_id: row.worker_id,
            result: row.result,
            error: row.error,
            errors: array(row.errors),
            retry_delay_ms: row.retry_delay_ms,
            run_at: row.run_at,
            workflow_id: row.workflow_id,
            parent_results: row.parent_results,
        })
    }
}

/// Maps a database error to a core error: our SQLSTATEs to their codes, the rest to backend errors.
pub fn map_db_error(error: sqlx::Error) -> CoreError {
    match &error {
        sqlx::Error::Database(db) => {
            let kind = match db.code().as_deref() {
                Some("PV400") => ErrorKind::InvalidRequest,
                Some("PV404") => ErrorKind::NotFound,
                Some("PV409") => ErrorKind::Conflict,
                Some("PV410") => ErrorKind::StaleLease,
                Some("PV411") => {
                    let mut error = CoreError::new(ErrorKind::Duplicate, db.message().to_string());
                    if let Some(existing) = db
                        .try_downcast_ref::<sqlx::postgres::PgDatabaseError>()
                        .and_then(|e| e.detail())
                    {
                        error = error.with_detail("existing_job_id", existing.into());
                    }
                    return error;
                }
                Some("PV413") => ErrorKind::BatchTooLarge,
                Some("PV429") => {
                    let quota = db
                        .try_downcast_ref::<sqlx::postgres::PgDatabaseError>()
                        .and_then(|e| e.detail())
                        .unwrap_or("quota")
                        .to_string();
                    return CoreError::new(ErrorKind::QuotaExceeded, db.message().to_string())
                        .with_detail("quota", quota.into());
                }
                Some("PV422") => ErrorKind::ValidationError,
                // read_only_sql_transaction: the database is a standby.
                Some("25006") => ErrorKind::ReadOnly,
                // admin/crash shutdown, cannot connect now (starting, in recovery), connection
                // exceptions: the server went away or is not ready; a failover may be under way.
                Some(code) if code.starts_with("57P") || code.starts_with("08") => {
                    return CoreError::new(
                        ErrorKind::Unavailable,
                        format!("the database is unavailable: {}", db.message()),
                    );
                }
                _ => {
                    tracing::error!(error = %db, "database error");
                    return CoreError::new(
                        ErrorKind::Backend,
                        "the database failed to run the operation",
                    );
                }
            };
            CoreError::new(kind, db.message().to_string())
        }
        sqlx::Error::PoolTimedOut | sqlx::Error::Io(_) | sqlx::Error::PoolClosed => CoreError::new(
            ErrorKind::Unavailable,
            format!("the database is unavailable: {error}"),
        ),
        _ => {
            tracing::error!(%error, "database error");
            CoreError::new(
                ErrorKind::Backend,
                "the database failed to run the operation",
            )
        }
    }
}

fn jobs(rows: Vec<JobRow>) -> Result<Vec<Job>, CoreError> {
    rows.into_iter().map(Job::try_from).collect()
}

fn one(rows: Vec<JobRow>, id: Uuid) -> Result<Job, CoreError> {
    rows.into_iter()
        .next()
        .map(Job::try_from)
        .unwrap_or_else(|| Err(CoreError::not_found("job", &id.to_string())))
}

impl Store {
    /// Connects a pool of `max_connections` and starts the signal listener. `max_queues` (0 =
    /// unlimited) is the server-wide namespace quota, handed to SQL as the `s3p.max_queues` setting.
    /// `read_only` opens every session with `default_transaction_read_only`, so PostgreSQL itself
    /// refuses any write a request could still reach (the second check behind the read-only gate).
    #[tracing::instrument(name = "db", skip_all, fields(op = "connect"))]
    pub async fn connect(
        url: &str,
        max_connections: u32,
        max_queues: i64,
        read_only: bool,
    ) -> Result<Store, CoreError> {
        let hosts = hosts::Hosts::parse(url).map_err(CoreError::invalid)?;
        let selects = hosts.selects();
        // With several hosts a writable gateway leaves `default_transaction_read_only` to the
        // server: the HA manager sets it on a node it is not yet sure may take writes.
        let session = move |options: PgConnectOptions| {
            let mut settings = vec![("s3p.max_queues", max_queues.max(0).to_string())];
            if read_only || !selects {
                let value = if read_only { "on" } else { "off" };
                settings.push(("default_transaction_read_only", value.to_string()));
            }
            options
                .options(settings)
                // Each queue has its own prepared statements (claim, ack) on every connection.
                .statement_cache_capacity(1024)
        };
        // While a failover is under way a request waits for a connection this long, then gets
        // 503; with several hosts, shorter: the pool retries a refused host with a backoff of up
        // to a fifth of it, which delays requests once the new primary is there.
        let wait = if selects { 5 } else { 10 };
        let pool_options = PgPoolOptions::new()
            .max_connections(max_connections)
            .acquire_timeout(Duration::from_secs(wait))
            // Pinged only after sitting idle (see `liveness`), not before every statement.
            .test_before_acquire(false)
            .before_acquire(|conn, meta| Box::pin(liveness::check(conn, meta)));
        let (pool, follower) = if selects {
            let want = if read_only {
                hosts::Want::PreferStandby
            } else {
                hosts::Want::ReadWrite
            };
            let follower = hosts::Follower::new(hosts, want, session);
            let pool = follower.connect(pool_options).await.map_err(map_db_error)?;
            (pool, Some(follower))
        } else {
            let options = hosts
                .first()
                .cloned()
                .ok_or_else(|| CoreError::invalid("DATABASE_URL names no host"))?;
            let pool = pool_options
                .connect_with(session(options))
                .await
                .map_err(map_db_error)?;
            (pool, None)
        };
        let signals = Signals::start(&pool).await?;
        let conflicts = std::sync::Arc::new(conflicts::Conflicts::default());
        let grouped = std::sync::Arc::new(grouped::Grouped::new(pool.clone(), conflicts.clone()));
        Ok(Store {
            pool,
            signals,
            grouped,
            conflicts,
            due_marks: Default::default(),
            token_cache: Default::default(),
            follower,
        })
    }

    /// Records that `queue` has maintenance work due at `at` (a lease end, a TTL, a retry).
    fn mark_due(&self, queue: &str, at: DateTime<Utc>) {
        if let Ok(mut marks) = self.due_marks.lock() {
            let due = marks.by_queue.entry(queue.to_string()).or_insert(at);
            *due = (*due).min(at);
        }
    }

    /// Marks the queues of `jobs`: at the lease end of active ones, else now (a transition the
    /// queue's next step may have work from: retention, retries, workflow steps).
    fn mark_jobs<'a>(&self, jobs: impl IntoIterator<Item = &'a Job>) {
        let now = Utc::now();
        for job in jobs {
            let at = match job.state {
                JobState::Active => job.lease_expires_at.unwrap_or(now),
                _ => now,
            };
            self.mark_due(&job.queue, at);
        }
    }

    /// Hands the marks to the database (every writable gateway, each maintenance interval).
    async fn flush_due_marks(&self) -> Result<(), CoreError> {
        let marks = match self.due_marks.lock() {
            Ok(mut marks) => std::mem::take(&mut marks.by_queue),
            Err(_) => return Ok(()),
        };
        if marks.is_empty() {
            return Ok(());
        }
        let (names, dues): (Vec<String>, Vec<DateTime<Utc>>) = marks.into_iter().unzip();
        let flushed = self
            .retry_conflicts(|| {
                sqlx::query("SELECT s3p.mark_queues_due($1, $2)")
                    .bind(&names)
                    .bind(&dues)
                    .execute(&self.pool)
            })
            .await;
        if let Err(error) = flushed {
            // The database was away (a restart, a failover): keep the marks for the next pass,
            // else a lease that ends meanwhile waits for the slow look at every queue.
            for (queue, at) in names.iter().zip(dues) {
                self.mark_due(queue, at);
            }
            return Err(map_db_error(error));
        }
        Ok(())
    }

    /// Runs a one-statement operation, again when PostgreSQL aborted it to break a deadlock or a
    /// serialization conflict (see `conflicts`).
    pub(crate) async fn retry_conflicts<T, F, Fut>(&self, run: F) -> Result<T, sqlx::Error>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<T, sqlx::Error>>,
    {
        self.conflicts.rerun(run).await
    }

    /// Statements run again after a deadlock or serialization failure, since start.
    pub fn conflict_retries(&self) -> u64 {
        self.conflicts.reruns()
    }

    /// The connection pool.
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// Wake-ups for long polls (jobs and streams), fed by LISTEN/NOTIFY.
    pub fn signals(&self) -> &Signals {
        &self.signals
    }

    /// Applies migrations and upgrades every queue schema.
    #[tracing::instrument(name = "db", skip_all, fields(op = "migrate"))]
    pub async fn migrate(&self) -> Result<(), CoreError> {
        migrate::run(&self.pool).await
    }

    /// Closes the pool, waiting for connections in use.
    #[tracing::instrument(name = "db", skip_all, fields(op = "close"))]
    pub async fn close(&self) {
        self.signals.stop();
        if let Some(follower) = &self.follower {
            follower.stop();
        }
        self.pool.close().await;
    }

    /// Stops the LISTEN connection's task, so a dropped server does not keep reconnecting it.
    pub fn stop_listening(&self) {
        self.signals.stop();
        if let Some(follower) = &self.follower {
            follower.stop();
        }
    }

    /// Why the database cannot take this gateway's requests just now, when it follows several
    /// hosts and none fits (a failover under way); `None` otherwise.
    pub fn host_problem(&self) -> Option<String> {
        let follower = self.follower.as_ref()?;
        (!follower.fits()).then(|| {
            format!(
                "no database host is {} (last used: {}); a failover may be under way",
                follower.wanted(),
                follower.host()
            )
        })
    }

    /// A round trip bounded for health checks: following several hosts, a ping that waits for a
    /// host (a failover) answers after 2 s instead of the pool's wait.
    pub async fn health_ping(&self) -> Result<(), CoreError> {
        if let Some(problem) = self.host_problem() {
            return Err(CoreError::new(ErrorKind::Unavailable, problem));
        }
        if self.follower.is_none() {
            return self.ping().await;
        }
        match tokio::time::timeout(Duration::from_secs(2), self.ping()).await {
            Ok(answer) => answer,
            Err(_) => Err(CoreError::new(
                ErrorKind::Unavailable,
                "the database did not answer within 2 s; a failover may be under way",
            )),
        }
    }

    /// The database host in use, as `host:port`, when the URL names several.
    pub fn current_host(&self) -> Option<String> {
        self.follower.as_ref().map(|f| f.host())
    }

    /// A trivial round trip.
    #[tracing::instrument(name = "db", skip_all, fields(op = "ping"))]
    pub async fn ping(&self) -> Result<(), CoreError> {
        sqlx::query("SELECT 1")
            .execute(&self.pool)
            .await
            .map(|_| ())
            .map_err(map_db_error)
    }

    /// `s3p.enqueue`. Plain jobs (no unique key, no rate-limit setting) are grouped with
    /// concurrent single enqueues of their queue into one statement.
    #[tracing::instrument(name = "db", skip_all, fields(op = "enqueue"))]
    pub async fn enqueue(&self, row: NewJob) -> Result<Job, CoreError> {
        let job = match plain_queue(&row) {
            Some(queue) => {
                let queue = queue.to_string();
                self.grouped.enqueue(&queue, row).await
            }
            None => grouped::enqueue_one(&self.pool, &self.conflicts, &row).await,
        }?;
        if let Some(at) = job.expires_at {
            self.mark_due(&job.queue, at);
        }
        Ok(job)
    }

    /// All or none: plain jobs of one known queue with the queue's own `enqueue_plain`, anything
    /// else with `s3p.enqueue_batch`.
    #[tracing::instrument(name = "db", skip_all, fields(op = "enqueue_batch"))]
    pub async fn enqueue_batch(&self, rows: &[NewJob]) -> Result<Vec<Job>, CoreError> {
        let stored = self.enqueue_batch_unmarked(rows).await?;
        for job in &stored {
            if let Some(at) = job.expires_at {
                self.mark_due(&job.queue, at);
            }
        }
        Ok(stored)
    }

    async fn enqueue_batch_unmarked(&self, rows: &[NewJob]) -> Result<Vec<Job>, CoreError> {
        if let Some(queue) = one_plain_queue(rows)
            && let Some(schema) = self.grouped.routes().schema(&self.pool, queue).await?
        {
            match grouped::enqueue_plain(&self.pool, &self.conflicts, &schema, queue, rows).await {
                Err(error) if error.is_stale() => self.grouped.routes().forget(queue),
                stored => return stored.map_err(grouped::DbError::into_core),
            }
        }
        let rows = self
            .retry_conflicts(|| {
                sqlx::query_as("SELECT * FROM s3p.enqueue_batch($1)")
                    .bind(sqlx::types::Json(rows))
                    .fetch_all(&self.pool)
            })
            .await
            .map_err(map_db_error)?;
        jobs(rows)
    }

    /// The queues of the jobs among `ids` that exist (`s3p.job_queues`): what a scoped token's
    /// by-id operation is checked against.
    #[tracing::instrument(name = "db", skip_all, fields(op = "job_queues"))]
    pub async fn job_queues(&self, ids: &[Uuid]) -> Result<Vec<(Uuid, String)>, CoreError> {
        sqlx::query_as("SELECT id, queue FROM s3p.job_queues($1)")
            .bind(ids)
            .fetch_all(&self.pool)
            .await
            .map_err(map_db_error)
    }

    /// Whether every queue of workflow `id` is in `scope` (true for a workflow that does not
    /// exist: its own lookup answers not found).
    #[tracing::instrument(name = "db", skip_all, fields(op = "workflow_in_scope"))]
    pub async fn workflow_in_scope(&self, scope: &Scope, id: Uuid) -> Result<bool, CoreError> {
        sqlx::query_scalar("SELECT s3p.workflow_in_scope($1, $2)")
            .bind(id)
            .bind(scope.like_patterns())
            .fetch_one(&self.pool)
            .await
            .map_err(map_db_error)
    }

    /// `s3p.get_job`.
    #[tracing::instrument(name = "db", skip_all, fields(op = "get_job"))]
    pub async fn get_job(&self, id: Uuid) -> Result<Job, CoreError> {
        let rows = sqlx::query_as("SELECT * FROM s3p.get_job($1)")
            .bind(id)
            .fetch_all(&self.pool)
            .await
            .map_err(map_db_error)?;
        one(rows, id)
    }

    /// Claims jobs: from one queue with its own claim statement, grouped with concurrent fetches
    /// of that queue; from several with `s3p.fetch`, which tries them in order.
    #[tracing::instrument(name = "db", skip_all, fields(op = "fetch"))]
    pub async fn fetch(
        &self,
        queues: &[String],
        count: i32,
        worker: Option<&str>,
        visibility_ms: Option<i64>,
        default_visibility_ms: i64,
    ) -> Result<Vec<Job>, CoreError> {
        let claimed = if let [queue] = queues {
            self.grouped
                .claim(
                    queue,
                    usize::try_from(count).unwrap_or(0),
                    worker,
                    visibility_ms,
                    default_visibility_ms,
                )
                .await?
        } else {
            let rows = self
                .retry_conflicts(|| {
                    sqlx::query_as("SELECT * FROM s3p.fetch($1, $2, $3, $4, $5)")
                        .bind(queues)
                        .bind(count)
                        .bind(worker)
                        .bind(visibility_ms)
                        .bind(default_visibility_ms)
                        .fetch_all(&self.pool)
                })
                .await
                .map_err(map_db_error)?;
            jobs(rows)?
        };
        self.mark_jobs(&claimed);
        Ok(claimed)
    }

    /// Whether any of the queues exists.
    #[tracing::instrument(name = "db", skip_all, fields(op = "any_queue_exists"))]
    pub async fn any_queue_exists(&self, queues: &[String]) -> Result<bool, CoreError> {
        sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM s3p.queues WHERE name = ANY($1))")
            .bind(queues)
            .fetch_one(&self.pool)
            .await
            .map_err(map_db_error)
    }

    /// Completes an active job; grouped with the acks in flight (see `ack_each`).
    #[tracing::instrument(name = "db", skip_all, fields(op = "ack"))]
    pub async fn ack(
        &self,
        id: Uuid,
        token: Option<Uuid>,
        result: Option<&Value>,
    ) -> Result<Job, CoreError> {
        let outcome = self
            .grouped
            .ack(vec![(id, token, result.cloned())], AckShape::Whole)
            .await?
            .pop()
            .unwrap_or_else(|| Err(CoreError::not_found("job", &id.to_string())))?;
        let job = match outcome {
            Acked::Whole(job) => *job,
            Acked::Brief(_) => {
                return Err(CoreError::new(
                    ErrorKind::Backend,
                    "a single ack read back only the completion",
                ));
            }
        };
        self.mark_jobs([&job]);
        Ok(job)
    }

    /// Completes jobs, each outcome what a single ack of it answers (reading back only state and
    /// times), in order. Acks that arrive while another group's commit is in flight join the next
    /// group: one statement and one commit for all of them (plus one statement per ack it could
    /// not complete, which names the reason).
    #[tracing::instrument(name = "db", skip_all, fields(op = "ack_each", jobs = items.len()))]
    pub async fn ack_each(
        &self,
        items: Vec<AckItem>,
    ) -> Result<Vec<Result<Completion, CoreError>>, CoreError> {
        let outcomes: Vec<Result<Completion, CoreError>> = self
            .grouped
            .ack(items, AckShape::Brief)
            .await?
            .into_iter()
            .map(|outcome| {
                outcome.map(|acked| match acked {
                    Acked::Brief(done) => done,
                    Acked::Whole(job) => Completion::from(job.as_ref()),
                })
            })
            .collect();
        // A completion is terminal: the queue's maintenance is due now, as after any ack.
        let now = Utc::now();
        for done in outcomes.iter().flatten() {
            self.mark_due(&done.queue, now);
        }
        Ok(outcomes)
    }

    /// Requests and statements of the grouped operations so far.
    pub fn grouping_stats(&self) -> GroupingStats {
        self.grouped.stats()
    }

    /// `s3p.nack`.
    #[tracing::instrument(name = "db", skip_all, fields(op = "nack"))]
    pub async fn nack(
        &self,
        id: Uuid,
        token: Option<Uuid>,
        failure: &Value,
        requeue: bool,
    ) -> Result<Job, CoreError> {
        let rows = self
            .retry_conflicts(|| {
                sqlx::query_as("SELECT * FROM s3p.nack($1, $2, $3, $4)")
                    .bind(id)
                    .bind(token)
                    .bind(failure)
                    .bind(requeue)
                    .fetch_all(&self.pool)
            })
            .await
            .map_err(map_db_error)?;
        self.grouped.routes().release([id]);
        let job = one(rows, id)?;
        self.mark_jobs([&job]);
        Ok(job)
    }

    /// `s3p.cancel`.
    #[tracing::instrument(name = "db", skip_all, fields(op = "cancel"))]
    pub async fn cancel(&self, id: Uuid) -> Result<Job, CoreError> {
        let rows = self
            .retry_conflicts(|| {
                sqlx::query_as("SELECT * FROM s3p.cancel($1)")
                    .bind(id)
                    .fetch_all(&self.pool)
            })
            .await
            .map_err(map_db_error)?;
        let job = one(rows, id)?;
        self.mark_jobs([&job]);
        Ok(job)
    }

    /// `s3p.heartbeat`: the extended jobs with their directive and new lease end.
    #[tracing::instrument(name = "db", skip_all, fields(op = "heartbeat"))]
    pub async fn heartbeat(
        &self,
        ids: &[Uuid],
        worker: &str,
        token: Option<Uuid>,
        visibility_ms: Option<i64>,
        default_visibility_ms: i64,
    ) -> Result<Vec<ExtendedLease>, CoreError> {
        self.retry_conflicts(|| {
            sqlx::query_as(
                "SELECT id, directive, lease_expires_at FROM s3p.heartbeat($1, $2, $3, $4, $5)",
            )
            .bind(ids)
            .bind(worker)
            .bind(token)
            .bind(visibility_ms)
            .bind(default_visibility_ms)
            .fetch_all(&self.pool)
        })
        .await
        .map_err(map_db_error)
    }

    /// `s3p.heartbeat_worker`: extends every lease `worker` holds in a queue of `scope`.
    #[tracing::instrument(name = "db", skip_all, fields(op = "heartbeat_worker"))]
    pub async fn heartbeat_worker(
        &self,
        scope: &Scope,
        worker: &str,
        visibility_ms: Option<i64>,
        default_visibility_ms: i64,
    ) -> Result<Vec<ExtendedLease>, CoreError> {
        let scope = scope.like_patterns();
        self.retry_conflicts(|| {
            sqlx::query_as(
                "SELECT id, directive, lease_expires_at FROM s3p.heartbeat_worker($1, $2, $3, $4)",
            )
            .bind(worker)
            .bind(visibility_ms)
            .bind(default_visibility_ms)
            .bind(&scope)
            .fetch_all(&self.pool)
        })
        .await
        .map_err(map_db_error)
    }

    /// `s3p.activate`.
    #[tracing::instrument(name = "db", skip_all, fields(op = "activate"))]
    pub async fn activate(&self, id: Uuid) -> Result<Job, CoreError> {
        let rows = self
            .retry_conflicts(|| {
                sqlx::query_as("SELECT * FROM s3p.activate($1)")
                    .bind(id)
                    .fetch_all(&self.pool)
            })
            .await
            .map_err(map_db_error)?;
        one(rows, id)
    }

    /// `s3p.dead_letters` and `s3p.dead_letter_count`.
    #[tracing::instrument(name = "db", skip_all, fields(op = "dead_letters"))]
    pub async fn dead_letters(
        &self,
        scope: &Scope,
        queue: Option<&str>,
        limit: i64,
        offset: i64,
    ) -> Result<(Vec<Job>, i64), CoreError> {
        // The core bounds the limit (1..=200); the offset goes to SQL whole, never cut to 32 bits.
        let limit = i32::try_from(limit).map_err(|_| {
            CoreError::invalid(format!("limit must be between 1 and 200, not {limit}"))
        })?;
        let patterns = scope.like_patterns();
        let rows = sqlx::query_as("SELECT * FROM s3p.dead_letters($1, $2, $3, $4)")
            .bind(queue)
            .bind(limit)
            .bind(offset)
            .bind(&patterns)
            .fetch_all(&self.pool)
            .await
            .map_err(map_db_error)?;
        let total: i64 = sqlx::query_scalar("SELECT s3p.dead_letter_count($1, $2)")
            .bind(queue)
            .bind(&patterns)
            .fetch_one(&self.pool)
            .await
            .map_err(map_db_error)?;
        Ok((jobs(rows)?, total))
    }

    /// `s3p.job_events`: the retained events of one job, oldest first.
    #[tracing::instrument(name = "db", skip_all, fields(op = "job_events"))]
    pub async fn job_events(
        &self,
        id: Uuid,
        limit: i32,
    ) -> Result<Vec<crate::model::events::Event>, CoreError> {
        sqlx::query_as::<_, EventRow>("SELECT * FROM s3p.job_events($1, $2)")
            .bind(id)
            .bind(limit)
            .fetch_all(&self.pool)
            .await
            .map(|rows| {
                rows.into_iter()
                    .map(crate::model::events::Event::from)
                    .collect()
            })
            .map_err(map_db_error)
    }

    /// The newest workflows with their progress (the first page of `s3p.workflows_list`).
    pub async fn workflows_page(&self, scope: &Scope, limit: i32) -> Result<Value, CoreError> {
        let (items, _) = self.workflows_list(scope, None, 0, limit).await?;
        Ok(Value::Array(items))
    }

    /// `s3p.retry_dead_letter`.
    #[tracing::instrument(name = "db", skip_all, fields(op = "retry_dead_letter"))]
    pub async fn retry_dead_letter(&self, id: Uuid) -> Result<Job, CoreError> {
        let rows = self
            .retry_conflicts(|| {
                sqlx::query_as("SELECT * FROM s3p.retry_dead_letter($1)")
                    .bind(id)
                    .fetch_all(&self.pool)
            })
            .await
            .map_err(map_db_error)?;
        one(rows, id)
    }

    /// `s3p.delete_dead_letter`.
    #[tracing::instrument(name = "db", skip_all, fields(op = "delete_dead_letter"))]
    pub async fn delete_dead_letter(&self, id: Uuid) -> Result<Job, CoreError> {
        let rows = self
            .retry_conflicts(|| {
                sqlx::query_as("SELECT * FROM s3p.delete_dead_letter($1)")
                    .bind(id)
                    .fetch_all(&self.pool)
            })
            .await
            .map_err(map_db_error)?;
        one(rows, id)
    }

    /// One maintenance pass: `s3p.maintain_queue` for each queue, each its own transaction, then
    /// `s3p.maintain_shared`, all under the maintenance lock held for this connection's session
    /// (the lock `s3p.maintain` takes for its transaction), so one pass runs at a time across
    /// gateways and SQL callers. Skipped at once when another holds it.
    #[tracing::instrument(name = "db", skip_all, fields(op = "maintain"))]
    pub async fn maintain(
        &self,
        retention_ms: i64,
        batch: i32,
    ) -> Result<MaintenanceReport, CoreError> {
        // Every writable gateway hands over its marks, whether or not it runs the pass.
        if let Err(error) = self.flush_due_marks().await {
            tracing::warn!(%error, "marking queues due for maintenance failed");
        }
        // Looking for jobs tables that wait for a vacuum reads every queue's statistics: one
        // pass in VACUUM_LOOK_EVERY does it.
        let with_vacuum = match self.due_marks.lock() {
            Ok(mut marks) => {
                marks.passes = (marks.passes + 1) % VACUUM_LOOK_EVERY;
                marks.passes == 1
            }
            Err(_) => true,
        };
        let mut conn = self.pool.acquire().await.map_err(map_db_error)?;
        let held: bool =
            sqlx::query_scalar("SELECT pg_try_advisory_lock(hashtext('s3p.maintain'))")
                .fetch_one(&mut *conn)
                .await
                .map_err(map_db_error)?;
        let mut report = MaintenanceReport {
            ran: held,
            ..Default::default()
        };
        if !held {
            return Ok(report);
        }
        let pass = maintenance_pass(&mut conn, retention_ms, batch, with_vacuum, &mut report).await;
        let unlocked = sqlx::query("SELECT pg_advisory_unlock(hashtext('s3p.maintain'))")
            .execute(&mut *conn)
            .await;
        if unlocked.is_err() {
            // Never hand a session that may still hold the lock back to the pool.
            conn.close_on_drop();
        }
        pass.map(|()| report)
    }

    /// Whether the database is a hot standby (read-only).
    #[tracing::instrument(name = "db", skip_all, fields(op = "in_recovery"))]
    pub async fn in_recovery(&self) -> Result<bool, CoreError> {
        sqlx::query_scalar("SELECT pg_is_in_recovery()")
            .fetch_one(&self.pool)
            .await
            .map_err(map_db_error)
    }

    /// `s3p.create_queue`: true when it was created now.
    #[tracing::instrument(name = "db", skip_all, fields(op = "create_queue"))]
    pub async fn create_queue(&self, queue: &str) -> Result<bool, CoreError> {
        sqlx::query_scalar("SELECT s3p.create_queue($1)")
            .bind(queue)
            .fetch_one(&self.pool)
            .await
            .map_err(map_db_error)
    }

    /// `s3p.drop_queue`.
    #[tracing::instrument(name = "db", skip_all, fields(op = "drop_queue"))]
    pub async fn drop_queue(&self, queue: &str) -> Result<(), CoreError> {
        let dropped = sqlx::query("SELECT s3p.drop_queue($1)")
            .bind(queue)
            .execute(&self.pool)
            .await
            .map(|_| ())
            .map_err(map_db_error);
        self.grouped.routes().forget(queue);
        dropped
    }

    /// `s3p.adopt_queue`: how many job ids were indexed.
    #[tracing::instrument(name = "db", skip_all, fields(op = "adopt_queue"))]
    pub async fn adopt_queue(&self, queue: &str) -> Result<i64, CoreError> {
        sqlx::query_scalar("SELECT s3p.adopt_queue($1)")
            .bind(queue)
            .fetch_one(&self.pool)
            .await
            .map_err(map_db_error)
    }

    /// `s3p.queue_stats`.
    #[tracing::instrument(name = "db", skip_all, fields(op = "queue_stats"))]
    pub async fn queue_stats(&self, queue: &str) -> Result<QueueStats, CoreError> {
        sqlx::query_scalar("SELECT s3p.queue_stats($1)")
            .bind(queue)
            .fetch_one(&self.pool)
            .await
            .map(|Json(stats)| stats)
            .map_err(map_db_error)
    }

    /// `s3p.queue_stats` of several queues in one round trip, in the order given.
    #[tracing::instrument(name = "db", skip_all, fields(op = "queue_stats_of"))]
    pub async fn queue_stats_of(&self, queues: &[String]) -> Result<Vec<QueueStats>, CoreError> {
        sqlx::query_scalar(
            "SELECT s3p.queue_stats(u.name) FROM unnest($1::text[]) WITH ORDINALITY AS u(name, i) \
             ORDER BY u.i",
        )
        .bind(queues)
        .fetch_all(&self.pool)
        .await
        .map(|rows| rows.into_iter().map(|Json(stats)| stats).collect())
        .map_err(map_db_error)
    }

    /// `s3p.queue_config`.
    #[tracing::instrument(name = "db", skip_all, fields(op = "queue_config"))]
    pub async fn queue_config(
        &self,
        queue: &str,
        changes: &Value,
    ) -> Result<QueueConfig, CoreError> {
        sqlx::query_scalar("SELECT s3p.queue_config($1, $2)")
            .bind(queue)
            .bind(changes)
            .fetch_one(&self.pool)
            .await
            .map(|Json(config)| config)
            .map_err(map_db_error)
    }

    /// `s3p.set_paused`.
    #[tracing::instrument(name = "db", skip_all, fields(op = "set_paused"))]
    pub async fn set_paused(&self, queue: &str, paused: bool) -> Result<bool, CoreError> {
        sqlx::query_scalar("SELECT s3p.set_paused($1, $2)")
            .bind(queue)
            .bind(paused)
            .fetch_one(&self.pool)
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
        let rows: Vec<(String, bool, DateTime<Utc>, Option<i64>)> = sqlx::query_as(
            "SELECT name, paused, created_at, available FROM s3p.list_queues($1, $2, $3, $4)",
        )
        .bind(count_available)
        .bind(after)
        .bind(page_size.map(|n| n as i32))
        .bind(scope.like_patterns())
        .fetch_all(&self.pool)
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
}

impl Store {
    /// How many queue namespaces of `scope` exist.
    #[tracing::instrument(name = "db", skip_all, fields(op = "count_queues"))]
    pub async fn count_queues(&self, scope: &Scope) -> Result<i64, CoreError> {
        sqlx::query_scalar("SELECT count(*) FROM s3p.queues WHERE s3p.in_scope(name, $1)")
            .bind(scope.like_patterns())
            .fetch_one(&self.pool)
            .await
            .map_err(map_db_error)
    }

    /// `s3p.create_workflow`: the new workflow's view.
    #[tracing::instrument(name = "db", skip_all, fields(op = "create_workflow"))]
    pub async fn create_workflow(
        &self,
        id: Uuid,
        name: &str,
        kind: &str,
        steps: &Value,
        callbacks: &Value,
    ) -> Result<Value, CoreError> {
        self.retry_conflicts(|| {
            sqlx::query_scalar("SELECT s3p.create_workflow($1, $2, $3, $4, $5)")
                .bind(id)
                .bind(name)
                .bind(kind)
                .bind(steps)
                .bind(callbacks)
                .fetch_one(&self.pool)
        })
        .await
        .map_err(map_db_error)
    }

    /// `s3p.workflow_view`.
    #[tracing::instrument(name = "db", skip_all, fields(op = "workflow"))]
    pub async fn workflow(&self, id: Uuid) -> Result<Value, CoreError> {
        sqlx::query_scalar("SELECT s3p.workflow_view($1)")
            .bind(id)
            .fetch_one(&self.pool)
            .await
            .map_err(map_db_error)
    }

    /// `s3p.cancel_workflow`.
    #[tracing::instrument(name = "db", skip_all, fields(op = "cancel_workflow"))]
    pub async fn cancel_workflow(&self, id: Uuid) -> Result<Value, CoreError> {
        self.retry_conflicts(|| {
            sqlx::query_scalar("SELECT s3p.cancel_workflow($1)")
                .bind(id)
                .fetch_one(&self.pool)
        })
        .await
        .map_err(map_db_error)
    }
}

impl Store {
    /// `s3p.events_read`: a page of events and the horizon it stopped at.
    #[tracing::instrument(name = "db", skip_all, fields(op = "events"))]
    pub async fn events(
        &self,
        scope: &Scope,
        after: crate::model::events::Cursor,
        types: Option<Vec<String>>,
        queues: Option<Vec<String>>,
        job_types: Option<Vec<String>>,
        limit: i32,
    ) -> Result<EventsRead, CoreError> {
        let rows = sqlx::query_as::<_, EventReadRow>(
            "SELECT * FROM s3p.events_read($1, $2, $3, $4, $5, $6, $7)",
        )
        .bind(after.txid)
        .bind(after.seq)
        .bind(types)
        .bind(queues)
        .bind(job_types)
        .bind(limit)
        .bind(scope.like_patterns())
        .fetch_all(&self.pool)
        .await
        .map_err(map_db_error)?;
        let horizon = rows.first().map_or(0, |row| row.horizon);
        Ok(EventsRead {
            events: rows.into_iter().filter_map(EventReadRow::event).collect(),
            horizon,
        })
    }

    /// `s3p.events_held_through`: the newest transaction holding events after `after` at or past
    /// `horizon`, the one a page stopped at (held back then: wait until a page passes it).
    #[tracing::instrument(name = "db", skip_all, fields(op = "events_held"))]
    pub async fn events_held_through(
        &self,
        after: crate::model::events::Cursor,
        horizon: i64,
    ) -> Result<Option<i64>, CoreError> {
        sqlx::query_scalar("SELECT s3p.events_held_through($1, $2, $3)")
            .bind(after.txid)
            .bind(after.seq)
            .bind(horizon)
            .fetch_one(&self.pool)
            .await
            .map_err(map_db_error)
    }

    /// `s3p.events_end`.
    #[tracing::instrument(name = "db", skip_all, fields(op = "events_end"))]
    pub async fn events_end(&self) -> Result<crate::model::events::Cursor, CoreError> {
        let (txid, seq): (i64, i64) = sqlx::query_as("SELECT * FROM s3p.events_end()")
            .fetch_one(&self.pool)
            .await
            .map_err(map_db_error)?;
        Ok(crate::model::events::Cursor { txid, seq })
    }
}

impl Store {
    /// `s3p.metrics_snapshot`: per-queue job and stream figures, `{"queues": [...]}`, read a page
    /// of queues per statement so no transaction locks every queue's tables at once.
    #[tracing::instrument(name = "db", skip_all, fields(op = "metrics_snapshot"))]
    pub async fn metrics_snapshot(&self, scope: &Scope) -> Result<Value, CoreError> {
        const PAGE: i32 = 25;
        let patterns = scope.like_patterns();
        let mut queues: Vec<Value> = Vec::new();
        let mut after: Option<String> = None;
        loop {
            let mut page: Value = sqlx::query_scalar("SELECT s3p.metrics_snapshot($1, $2, $3)")
                .bind(after.as_deref())
                .bind(PAGE)
                .bind(&patterns)
                .fetch_one(&self.pool)
                .await
                .map_err(map_db_error)?;
            let Some(Value::Array(rows)) = page.get_mut("queues").map(Value::take) else {
                break;
            };
            let full = rows.len() == PAGE as usize;
            after = rows
                .last()
                .and_then(|q| q.get("queue"))
                .and_then(Value::as_str)
                .map(str::to_string);
            queues.extend(rows);
            if !full || after.is_none() {
                break;
            }
        }
        Ok(serde_json::json!({ "queues": queues }))
    }

    /// Connections open and idle in the pool.
    pub fn pool_usage(&self) -> (u32, usize) {
        (self.pool.size(), self.pool.num_idle())
    }
}
