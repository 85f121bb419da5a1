//! The floor: the same jobs workload done directly in SQL on a plain `FOR UPDATE SKIP LOCKED`
//! table, on the same database server in the same run, so every jobs figure has something to be
//! divided by.

use std::time::{Duration, Instant};

use sqlx::postgres::{PgListener, PgPoolOptions};
use sqlx::{AssertSqlSafe, PgPool, Row};
use tokio::task::JoinSet;

use crate::clients::job_args;
use crate::cpu::{CpuTime, micros_per_job};
use crate::db::{self, Postgres, WalMark};
use crate::report::{Figure, Report};
use crate::{Args, BenchError, Result, percentile};

const SCHEMA: &str = "
CREATE TABLE floor_jobs (
    id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    queue        text NOT NULL,
    type         text NOT NULL,
    args         jsonb NOT NULL,
    state        text NOT NULL DEFAULT 'available',
    priority     int NOT NULL DEFAULT 0,
    attempt      int NOT NULL DEFAULT 0,
    run_at       timestamptz NOT NULL DEFAULT now(),
    created_at   timestamptz NOT NULL DEFAULT now(),
    started_at   timestamptz,
    completed_at timestamptz
);
CREATE INDEX floor_jobs_ready ON floor_jobs (priority DESC, run_at, id) WHERE state = 'available';
";

/// Claims up to $1 ready jobs (one statement, one transaction).
const CLAIM: &str = "
UPDATE floor_jobs j SET state = 'active', attempt = j.attempt + 1, started_at = now()
  FROM (SELECT id FROM floor_jobs
         WHERE state = 'available' AND run_at <= now()
         ORDER BY priority DESC, run_at, id
         LIMIT $1 FOR UPDATE SKIP LOCKED) r
 WHERE j.id = r.id
RETURNING j.id, j.type, j.args";

/// Completes the claimed jobs (one statement, one transaction).
const COMPLETE: &str = "
UPDATE floor_jobs SET state = 'completed', completed_at = now()
 WHERE id = ANY ($1) AND state = 'active'";

const INSERT_ONE: &str =
    "INSERT INTO floor_jobs (queue, type, args) VALUES ($1, $2, $3) RETURNING id";

/// Jobs per claim of the wide work-off (the server's largest fetch).
pub const FETCH_WIDE: usize = 100;

/// Runs the floor and adds its figures.
pub async fn run(pg: &Postgres, args: &Args, report: &mut Report) -> Result<()> {
    crate::progress(format_args!(
        "floor (plain SQL table, FOR UPDATE SKIP LOCKED)"
    ));
    let database = pg.fresh("floor").await?;
    let pool = PgPoolOptions::new()
        .max_connections(u32::try_from(args.in_flight.max(args.workers))? + 2)
        .connect(&database.url)
        .await?;
    sqlx::raw_sql(SCHEMA).execute(&pool).await?;

    // WAL from before the enqueue to after the work-off at `--fetch`: the whole cluster's, so
    // nothing else may run in between (scenarios are sequential).
    let wal = WalMark::now(&database.url).await?;
    let started = Instant::now();
    let stored = enqueue(&pool, args).await?;
    let elapsed = started.elapsed();
    check_count("floor enqueue", stored, args.jobs)?;
    report.add(Figure {
        name: "floor.jobs.enqueue_batch".into(),
        value: args.jobs as f64 / elapsed.as_secs_f64(),
        unit: "jobs/s",
        floor: None,
        target: None,
        note: format!(
            "{} multi-row INSERTs of {}, 1 connection",
            args.jobs.div_ceil(args.batch),
            args.batch
        ),
    });

    // Work-off: claim N, complete N per statement, W connections; at `--fetch`, then at 100 on
    // the same jobs enqueued again.
    for (fetch, suffix) in [(args.fetch, ""), (FETCH_WIDE, "_f100")] {
        if !suffix.is_empty() {
            let stored = enqueue(&pool, args).await?;
            check_count("floor enqueue", stored, args.jobs)?;
        }
        let cpu = CpuTime::now();
        let started = Instant::now();
        let done = work_off(&pool, args.workers, fetch).await?;
        let elapsed = started.elapsed();
        let cpu_us = micros_per_job(cpu.since(), done);
        let written = if suffix.is_empty() {
            Some(wal.written(&database.url).await?)
        } else {
            None
        };
        check_count("floor work-off", done, args.jobs)?;
        report.add(Figure {
            name: format!("floor.jobs.work{suffix}"),
            value: args.jobs as f64 / elapsed.as_secs_f64(),
            unit: "jobs/s",
            floor: None,
            target: None,
            note: format!(
                "{} connections, claim {fetch} + complete {fetch} per statement",
                args.workers
            ),
        });
        if let Some(us) = cpu_us {
            report.add(Figure {
                name: format!("floor.jobs.cpu_us_per_job{suffix}"),
                value: us,
                unit: "µs/job",
                floor: None,
                target: None,
                note: format!(
                    "busy CPU of the whole machine (/proc/stat) during the claim-{fetch} work-off ÷ jobs"
                ),
            });
        }
        if let Some(written) = written {
            report.add(Figure {
                name: "floor.jobs.wal_bytes_per_job".into(),
                value: written.bytes / args.jobs as f64,
                unit: "B/job",
                floor: None,
                target: None,
                note: format!(
                    "WAL of the whole cluster (pg_current_wal_lsn) from before the enqueue to after \
                     the claim-{fetch} work-off ÷ jobs, nothing else running; {}",
                    written.checkpoint_note()
                ),
            });
        }
    }
    pool.close().await;
    let stats = db::settled_stats(&database).await?;
    // Two enqueues and two work-offs (claim `--fetch`, claim 100) of `args.jobs` jobs each.
    let jobs_done = 2 * args.jobs;
    let churn = db::churn(&stats, jobs_done as f64);
    report.add(Figure {
        name: "floor.jobs.dead_tuples_per_job".into(),
        value: churn.updated_or_deleted as f64 / jobs_done as f64,
        unit: "tuples/job",
        floor: None,
        target: None,
        note: format!(
            "dead versions made by the enqueues + both work-offs (n_dead_tup left {:.2}/job): {}",
            churn.dead as f64 / jobs_done as f64,
            churn.detail
        ),
    });

    // Single enqueues: sequential, then with `in_flight` connections.
    let pool = PgPoolOptions::new()
        .max_connections(u32::try_from(args.in_flight)? + 2)
        .connect(&database.url)
        .await?;
    let mut conn = pool.acquire().await?;
    let started = Instant::now();
    for i in 0..args.singles {
        sqlx::query(INSERT_ONE)
            .bind("single")
            .bind("bench.job")
            .bind(job_args(i))
            .fetch_one(&mut *conn)
            .await?;
    }
    let elapsed = started.elapsed();
    drop(conn);
    report.add(Figure {
        name: "floor.jobs.enqueue_single_seq".into(),
        value: args.singles as f64 / elapsed.as_secs_f64(),
        unit: "jobs/s",
        floor: None,
        target: None,
        note: format!("{} single-row INSERTs, 1 connection", args.singles),
    });
    let per_task = args.singles.div_ceil(args.in_flight.max(1));
    let mut tasks = JoinSet::new();
    let mut conns = Vec::new();
    for _ in 0..args.in_flight {
        conns.push(pool.acquire().await?);
    }
    let started = Instant::now();
    for (t, mut conn) in conns.into_iter().enumerate() {
        tasks.spawn(async move {
            for i in t * per_task..(t + 1) * per_task {
                sqlx::query(INSERT_ONE)
                    .bind("single")
                    .bind("bench.job")
                    .bind(job_args(i))
                    .fetch_one(&mut *conn)
                    .await?;
            }
            Ok::<usize, BenchError>(per_task)
        });
    }
    let mut total = 0;
    while let Some(result) = tasks.join_next().await {
        total += result??;
    }
    let elapsed = started.elapsed();
    report.add(Figure {
        name: "floor.jobs.enqueue_single_concurrent".into(),
        value: total as f64 / elapsed.as_secs_f64(),
        unit: "jobs/s",
        floor: None,
        target: None,
        note: format!("{total} single-row INSERTs, {} connections", args.in_flight),
    });

    // Pickup: an idle worker waits in LISTEN; INSERT + NOTIFY in one statement; time to claim.
    let samples = pickup(&pool, &database.url, args).await?;
    for (q, name) in [(0.50, "p50"), (0.99, "p99")] {
        report.add(Figure {
            name: format!("floor.jobs.pickup_{name}"),
            value: percentile(&samples, q),
            unit: "ms",
            floor: None,
            target: None,
            note: format!(
                "{} samples: LISTEN wake-up, claim {}",
                samples.len(),
                args.fetch
            ),
        });
    }
    pool.close().await;
    pg.drop_database(database).await;
    Ok(())
}

/// Stores jobs `0..args.jobs` with one multi-row INSERT per `args.batch`, from one connection.
async fn enqueue(pool: &PgPool, args: &Args) -> Result<usize> {
    let batch = args.batch.max(1);
    let values: Vec<String> = (0..batch)
        .map(|r| format!("(${}, ${}, ${})", 3 * r + 1, 3 * r + 2, 3 * r + 3))
        .collect();
    let insert = |rows: usize| {
        format!(
            "INSERT INTO floor_jobs (queue, type, args) VALUES {} RETURNING id",
            values[..rows].join(", ")
        )
    };
    let insert_batch = insert(batch);
    let mut conn = pool.acquire().await?;
    let mut stored = 0;
    for first in (0..args.jobs).step_by(batch) {
        let rows = (first + batch).min(args.jobs) - first;
        let sql = if rows == batch {
            insert_batch.clone()
        } else {
            insert(rows)
        };
        let mut query = sqlx::query(AssertSqlSafe(sql));
        for i in first..first + rows {
            query = query.bind("bench").bind("bench.job").bind(job_args(i));
        }
        stored += query.fetch_all(&mut *conn).await?.len();
    }
    Ok(stored)
}

/// `workers` connections claim `fetch` and complete them per statement until a claim is empty;
/// returns the jobs completed.
async fn work_off(pool: &PgPool, workers: usize, fetch: usize) -> Result<usize> {
    let mut tasks = JoinSet::new();
    for _ in 0..workers {
        let pool = pool.clone();
        let fetch = i64::try_from(fetch)?;
        tasks.spawn(async move {
            let mut conn = pool.acquire().await?;
            let mut done = 0usize;
            loop {
                let rows = sqlx::query(CLAIM).bind(fetch).fetch_all(&mut *conn).await?;
                if rows.is_empty() {
                    return Ok::<usize, BenchError>(done);
                }
                let ids = rows
                    .iter()
                    .map(|r| r.try_get::<i64, _>("id"))
                    .collect::<std::result::Result<Vec<_>, _>>()?;
                let completed = sqlx::query(COMPLETE).bind(&ids).execute(&mut *conn).await?;
                done += usize::try_from(completed.rows_affected())?;
            }
        });
    }
    let mut done = 0;
    while let Some(result) = tasks.join_next().await {
        done += result??;
    }
    Ok(done)
}

/// Pickup latency samples in milliseconds.
async fn pickup(pool: &PgPool, url: &str, args: &Args) -> Result<Vec<f64>> {
    sqlx::query("DELETE FROM floor_jobs").execute(pool).await?;
    let mut listener = PgListener::connect(url).await?;
    listener.listen("floor_jobs").await?;
    let mut samples = Vec::with_capacity(args.samples);
    let fetch = i64::try_from(args.fetch)?;
    for i in 0..args.samples {
        let worker_pool = pool.clone();
        let mut waiting = listener;
        let worker = tokio::spawn(async move {
            let mut conn = worker_pool.acquire().await?;
            let deadline = Instant::now() + Duration::from_millis(2000);
            loop {
                let rows = sqlx::query(CLAIM).bind(fetch).fetch_all(&mut *conn).await?;
                if !rows.is_empty() {
                    let at = Instant::now();
                    let ids = rows
                        .iter()
                        .map(|r| r.try_get::<i64, _>("id"))
                        .collect::<std::result::Result<Vec<_>, _>>()?;
                    sqlx::query(COMPLETE).bind(&ids).execute(&mut *conn).await?;
                    return Ok::<_, BenchError>((Some(at), waiting));
                }
                let left = deadline.saturating_duration_since(Instant::now());
                match tokio::time::timeout(left, waiting.recv()).await {
                    Ok(notification) => drop(notification?),
                    Err(_) => return Ok((None, waiting)),
                }
            }
        });
        tokio::time::sleep(Duration::from_millis(30)).await;
        let sent = Instant::now();
        sqlx::query(
            "WITH j AS (INSERT INTO floor_jobs (queue, type, args) VALUES ($1, $2, $3) RETURNING id)
             SELECT pg_notify('floor_jobs', 'pickup') FROM j",
        )
        .bind("pickup")
        .bind("bench.job")
        .bind(job_args(i))
        .execute(pool)
        .await?;
        let (delivered, back) = worker.await??;
        listener = back;
        let delivered = delivered.ok_or("floor pickup: the job was not claimed within 2 s")?;
        samples.push(delivered.duration_since(sent).as_secs_f64() * 1000.0);
    }
    Ok(samples)
}

fn check_count(what: &str, got: usize, wanted: usize) -> Result<()> {
    if got == wanted {
        Ok(())
    } else {
        Err(format!("{what}: {got} jobs instead of {wanted}").into())
    }
}
