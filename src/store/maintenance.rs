//! The maintenance pass (each due queue in its own transaction, vacuums) and its due marks.

use chrono::{DateTime, Utc};

use super::{Store, map_db_error};
use crate::model::error::CoreError;
use crate::model::job::{Job, JobState, MaintenanceReport};

/// When a queue's maintenance is due, by what this gateway saw (the earliest of each kind).
#[derive(Default, Clone, Copy)]
struct DueMark {
    /// A time the queue has work (a lease end, a TTL, a retry).
    at: Option<DateTime<Utc>>,
    /// When one of its jobs ended: due once the queue's retention has passed (known in SQL).
    finished: Option<DateTime<Utc>>,
}

impl DueMark {
    /// Keeps the earlier time of each kind.
    fn merge(&mut self, other: DueMark) {
        let earliest = |a: Option<DateTime<Utc>>, b: Option<DateTime<Utc>>| match (a, b) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        self.at = earliest(self.at, other.at);
        self.finished = earliest(self.finished, other.finished);
    }
}

/// One maintenance pass in this many also steps through queues whose jobs table waits for a
/// vacuum (with the default 500 ms interval, every 10 s).
const VACUUM_LOOK_EVERY: u32 = 20;

/// Queues this gateway's requests gave maintenance work, each with the earliest time it is due,
/// until the maintenance loop hands them to `s3p.mark_queues_due`.
#[derive(Default)]
pub(super) struct DueMarks {
    by_queue: std::collections::HashMap<String, DueMark>,
    /// Passes since the last look for jobs tables that wait for a vacuum.
    passes: u32,
}

/// The most transactions of a few ticks each (`s3p.stream_tick_some`) one queue's step runs in a
/// pass (4,000 ticks); receives cut the rest on demand, and the next pass goes on.
const TICK_TRANSACTIONS: usize = 1_000;

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

/// Which jobs tables a pass looks at for a vacuum, beside those of the queues it steps.
struct VacuumLook<'a> {
    /// Every queue's (`s3p.due_queues(true)`), one pass in VACUUM_LOOK_EVERY.
    every_queue: bool,
    /// The queues this gateway marked since its last pass: their claims and acks leave dead row
    /// versions, which claims walk past until a vacuum.
    marked: &'a [String],
}

/// The steps of a pass whose lock is held: each due queue in its own transaction (and each
/// whose jobs table waits for a vacuum, by `look`), then the shared step.
async fn maintenance_pass(
    conn: &mut sqlx::PgConnection,
    retention_ms: i64,
    batch: i32,
    look: VacuumLook<'_>,
    report: &mut MaintenanceReport,
) -> Result<(), CoreError> {
    let queues: Vec<String> = sqlx::query_scalar("SELECT s3p.due_queues($1)")
        .bind(look.every_queue)
        .fetch_all(&mut *conn)
        .await
        .map_err(map_db_error)?;
    report.queues_stepped = queues.len() as i64;
    // One queue's failure is that queue's alone: logged, counted, and the pass goes on.
    for queue in &queues {
        if let Err(error) = maintain_one_queue(conn, queue, retention_ms, batch, report).await {
            tracing::warn!(queue, %error, "maintenance of a queue failed");
            report.failed_steps.push(queue.clone());
        }
    }
    for queue in look.marked.iter().filter(|q| !queues.contains(q)) {
        if let Err(error) = vacuum_if_due(conn, queue, report).await {
            tracing::warn!(queue, %error, "the vacuum look at a queue failed");
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

/// One queue's maintenance step: its stream's ticks, then `s3p.maintain_queue` (each in
/// transactions of their own), then its vacuum when due.
async fn maintain_one_queue(
    conn: &mut sqlx::PgConnection,
    queue: &str,
    retention_ms: i64,
    batch: i32,
    report: &mut MaintenanceReport,
) -> Result<(), CoreError> {
    // Un-ticked stream events first, a few ticks per transaction.
    for _ in 0..TICK_TRANSACTIONS {
        let done: bool = sqlx::query_scalar("SELECT s3p.stream_tick_some($1)")
            .bind(queue)
            .fetch_one(&mut *conn)
            .await
            .map_err(map_db_error)?;
        if done {
            break;
        }
    }
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

impl Store {
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
        let marked = self
            .flush_due_marks(retention_ms)
            .await
            .unwrap_or_else(|error| {
                tracing::warn!(%error, "marking queues due for maintenance failed");
                Vec::new()
            });
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
        let look = VacuumLook {
            every_queue: with_vacuum,
            marked: &marked,
        };
        let pass = maintenance_pass(&mut conn, retention_ms, batch, look, &mut report).await;
        let unlocked = sqlx::query("SELECT pg_advisory_unlock(hashtext('s3p.maintain'))")
            .execute(&mut *conn)
            .await;
        if unlocked.is_err() {
            // Never hand a session that may still hold the lock back to the pool.
            conn.close_on_drop();
        }
        pass.map(|()| report)
    }

    /// `s3p.mark_every_queue_due`: every queue due once, as a gateway starts (the marks of one
    /// that died before handing them over are lost with it).
    #[tracing::instrument(name = "db", skip_all, fields(op = "mark_every_queue_due"))]
    pub async fn mark_every_queue_due(&self) -> Result<(), CoreError> {
        self.retry_conflicts(|| sqlx::query("SELECT s3p.mark_every_queue_due()").execute(&self.hot))
            .await
            .map(drop)
            .map_err(map_db_error)
    }

    /// Records that `queue` has maintenance work due at `at` (a lease end, a TTL, a retry).
    pub(super) fn mark_due(&self, queue: &str, at: DateTime<Utc>) {
        self.mark(
            queue,
            DueMark {
                at: Some(at),
                finished: None,
            },
        );
    }

    /// Records that a job of `queue` ended by `at` (its answer's time: at most a request's latency
    /// after the stored end): its removal is due after the queue's retention.
    pub(super) fn mark_finished(&self, queue: &str, at: DateTime<Utc>) {
        self.mark(
            queue,
            DueMark {
                at: None,
                finished: Some(at),
            },
        );
    }

    fn mark(&self, queue: &str, due: DueMark) {
        if let Ok(mut marks) = self.due_marks.lock() {
            match marks.by_queue.get_mut(queue) {
                Some(mark) => mark.merge(due),
                None => {
                    marks.by_queue.insert(queue.to_string(), due);
                }
            }
        }
    }

    /// Marks the queues of `jobs`: at the lease end of active ones, the end of terminal ones, else
    /// now (a transition the queue's next step may have work from: retries, workflow steps).
    pub(super) fn mark_jobs<'a>(&self, jobs: impl IntoIterator<Item = &'a Job>) {
        let now = Utc::now();
        for job in jobs {
            match job.state {
                JobState::Active => self.mark_due(&job.queue, job.lease_expires_at.unwrap_or(now)),
                JobState::Completed | JobState::Cancelled | JobState::Discarded => {
                    self.mark_finished(&job.queue, now)
                }
                _ => self.mark_due(&job.queue, now),
            }
        }
    }

    /// Hands the marks to the database (every writable gateway, each maintenance interval) and
    /// names the queues marked; `retention_ms` is the retention of queues without their own.
    async fn flush_due_marks(&self, retention_ms: i64) -> Result<Vec<String>, CoreError> {
        let marks = match self.due_marks.lock() {
            Ok(mut marks) => std::mem::take(&mut marks.by_queue),
            Err(_) => return Ok(Vec::new()),
        };
        if marks.is_empty() {
            return Ok(Vec::new());
        }
        let mut names = Vec::with_capacity(marks.len());
        let mut dues = Vec::with_capacity(marks.len());
        let mut finished = Vec::with_capacity(marks.len());
        for (queue, due) in &marks {
            names.push(queue.as_str());
            dues.push(due.at);
            finished.push(due.finished);
        }
        let flushed = self
            .retry_conflicts(|| {
                sqlx::query("SELECT s3p.mark_queues_due($1, $2, $3, $4)")
                    .bind(&names)
                    .bind(&dues)
                    .bind(&finished)
                    .bind(retention_ms)
                    .execute(&self.hot)
            })
            .await;
        if let Err(error) = flushed {
            // The database was away (a restart, a failover): keep the marks for the next pass,
            // else a lease that ends meanwhile waits for the slow look at every queue.
            for (queue, due) in &marks {
                self.mark(queue, *due);
            }
            return Err(map_db_error(error));
        }
        Ok(marks.into_keys().collect())
    }
}
