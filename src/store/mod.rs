//! sqlx → PL/pgSQL: every operation is one SQL function call (`s3p`, or the queue's own
//! `s3q_<q>` on the grouped hot path); SQLSTATEs become core errors.

mod admin_jobs;
pub mod admin_system;
mod coalesce;
mod conflicts;
mod cron;
mod errors;
mod events;
mod grouped;
pub mod hosts;
mod hot;
mod liveness;
mod maintenance;
mod metrics;
pub mod migrate;
mod new_jobs;
mod queues;
mod routes;
mod rows;
pub mod signals;
mod stream;
pub mod tokens;
mod workflows;

use std::time::Duration;

use chrono::{DateTime, Utc};
use serde_json::Value;
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};
use uuid::Uuid;

use crate::model::access::Scope;
use crate::model::error::{CoreError, ErrorKind};
use crate::model::job::{Completion, Job, NewJob};
pub use errors::map_db_error;
pub use grouped::{AckItem, GroupingStats};
use maintenance::DueMarks;
pub use rows::EventsRead;
use rows::{jobs, one};
pub use signals::{Signals, Wakeups};

/// The database handle of the service.
#[derive(Clone)]
pub struct Store {
    pool: PgPool,
    /// The pool for single statements, keeping connections between them (see `hot`).
    hot: hot::HotPool,
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

/// A lease a heartbeat extended: job id, test directive, new lease end.
pub type ExtendedLease = (Uuid, Option<String>, DateTime<Utc>);

/// The queue of a plain job (see [`NewJob::is_plain`]): the jobs the queue's own
/// `insert_jobs` stores; others take `s3p.enqueue` for their per-job checks.
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
        let hot = hot::HotPool::new(pool.clone(), follower.clone());
        let grouped = std::sync::Arc::new(grouped::Grouped::new(hot.clone(), conflicts.clone()));
        Ok(Store {
            pool,
            hot,
            signals,
            grouped,
            conflicts,
            due_marks: Default::default(),
            token_cache: Default::default(),
            follower,
        })
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

    /// The pool for one-statement operations (see `hot`).
    pub(crate) fn hot(&self) -> &hot::HotPool {
        &self.hot
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
            .execute(&self.hot)
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
            None => grouped::enqueue_one(&self.hot, &self.conflicts, &row).await,
        }?;
        if let Some(at) = job.expires_at {
            self.mark_due(&job.queue, at);
        }
        Ok(job)
    }

    /// All or none: plain jobs of one known queue with the queue's own `insert_jobs`, anything
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
            && let Some(schema) = self.grouped.routes().schema(&self.hot, queue).await?
        {
            match new_jobs::insert_jobs(&self.hot, &self.conflicts, &schema, queue, rows).await {
                Err(error) if error.is_stale() => self.grouped.routes().forget(queue),
                stored => return stored.map_err(grouped::DbError::into_core),
            }
        }
        let rows = self
            .retry_conflicts(|| {
                sqlx::query_as("SELECT * FROM s3p.enqueue_batch($1)")
                    .bind(sqlx::types::Json(rows))
                    .fetch_all(&self.hot)
            })
            .await
            .map_err(map_db_error)?;
        jobs(rows)
    }

    /// The queues of the jobs among `ids` that exist (`s3p.job_queues`): what a scoped token's
    /// by-id operation is checked against.
    #[tracing::instrument(name = "db", skip_all, fields(op = "job_queues"))]
    pub async fn job_queues(&self, ids: &[Uuid]) -> Result<Vec<(Uuid, String)>, CoreError> {
        self.retry_conflicts(|| {
            sqlx::query_as("SELECT id, queue FROM s3p.job_queues($1)")
                .bind(ids)
                .fetch_all(&self.hot)
        })
        .await
        .map_err(map_db_error)
    }

    /// `s3p.get_job`.
    #[tracing::instrument(name = "db", skip_all, fields(op = "get_job"))]
    pub async fn get_job(&self, id: Uuid) -> Result<Job, CoreError> {
        let rows = self
            .retry_conflicts(|| {
                sqlx::query_as("SELECT * FROM s3p.get_job($1)")
                    .bind(id)
                    .fetch_all(&self.hot)
            })
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
                        .fetch_all(&self.hot)
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
        self.retry_conflicts(|| {
            sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM s3p.queues WHERE name = ANY($1))")
                .bind(queues)
                .fetch_one(&self.hot)
        })
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
        let job = self
            .grouped
            .ack::<Job>(vec![(id, token, result.cloned())])
            .await?
            .pop()
            .unwrap_or_else(|| Err(CoreError::not_found("job", &id.to_string())))?;
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
        let outcomes = self.grouped.ack::<Completion>(items).await?;
        // A completion is terminal: the queue's step removes it after the queue's retention.
        let now = Utc::now();
        for done in outcomes.iter().flatten() {
            self.mark_finished(&done.queue, now);
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
                    .fetch_all(&self.hot)
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
                    .fetch_all(&self.hot)
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
            .fetch_all(&self.hot)
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
            .fetch_all(&self.hot)
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
                    .fetch_all(&self.hot)
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
        let rows = self
            .retry_conflicts(|| {
                sqlx::query_as("SELECT * FROM s3p.dead_letters($1, $2, $3, $4)")
                    .bind(queue)
                    .bind(limit)
                    .bind(offset)
                    .bind(&patterns)
                    .fetch_all(&self.hot)
            })
            .await
            .map_err(map_db_error)?;
        let total: i64 = self
            .retry_conflicts(|| {
                sqlx::query_scalar("SELECT s3p.dead_letter_count($1, $2)")
                    .bind(queue)
                    .bind(&patterns)
                    .fetch_one(&self.hot)
            })
            .await
            .map_err(map_db_error)?;
        Ok((jobs(rows)?, total))
    }

    /// `s3p.retry_dead_letter`.
    #[tracing::instrument(name = "db", skip_all, fields(op = "retry_dead_letter"))]
    pub async fn retry_dead_letter(&self, id: Uuid) -> Result<Job, CoreError> {
        let rows = self
            .retry_conflicts(|| {
                sqlx::query_as("SELECT * FROM s3p.retry_dead_letter($1)")
                    .bind(id)
                    .fetch_all(&self.hot)
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
                    .fetch_all(&self.hot)
            })
            .await
            .map_err(map_db_error)?;
        one(rows, id)
    }

    /// Whether the database is a hot standby (read-only).
    #[tracing::instrument(name = "db", skip_all, fields(op = "in_recovery"))]
    pub async fn in_recovery(&self) -> Result<bool, CoreError> {
        sqlx::query_scalar("SELECT pg_is_in_recovery()")
            .fetch_one(&self.hot)
            .await
            .map_err(map_db_error)
    }
}
