//! The database's share of the jobs work-off: the queue's own claim and batch-ack functions
//! (`claim`, `ack_many`) called straight from SQL clients, with no pgvs3 in between. Set beside
//! the floor and the served figures, it splits a job's cost into PostgreSQL's (this figure against
//! the floor) and the server's and its clients' (the served figure against this one).

use std::time::Instant;

use sqlx::postgres::PgPoolOptions;
use sqlx::{AssertSqlSafe, PgPool, Row};
use tokio::task::JoinSet;
use uuid::Uuid;

use crate::clients::{Http, Jobs};
use crate::cpu::{CpuTime, micros_per_job};
use crate::floor::FETCH_WIDE;
use crate::report::{Figure, Report};
use crate::{Args, BenchError, Protocol, Result, db, per_second, progress};

/// The visibility timeout the claims ask for (the server's default lease).
const VISIBILITY_MS: i64 = 30_000;

/// Stores the jobs through the server, stops it, then works them off through the SQL functions
/// at `--fetch` and at 100, and adds `sql.jobs.*` figures.
pub async fn run(pg: &db::Postgres, args: &Args, report: &mut Report) -> Result<()> {
    progress(format_args!(
        "sql jobs: the queue's claim and ack_many called directly (no server)"
    ));
    let queue = "bench";
    let database = pg.fresh("sql_jobs").await?;
    let pool = PgPoolOptions::new()
        .max_connections(u32::try_from(args.workers)? + 1)
        .connect(&database.url)
        .await?;
    let mut schema = None;
    for (fetch, suffix) in [(args.fetch, ""), (FETCH_WIDE, "_f100")] {
        // The server stores the jobs (and creates the queue), then stops: nothing but the
        // work-off runs while the CPU is read.
        let server = db::start_server(&database.url, args).await?;
        let base = format!("http://{}", server.addr);
        if schema.is_none() {
            Http::new(&base)?.create_queue(queue).await?;
            schema = Some(db::queue_schema(&database.url, queue).await?);
        }
        let mut client = Jobs::connect(Protocol::Http, &base).await?;
        let mut stored = 0;
        for body in Jobs::batches(Protocol::Http, queue, args.jobs, args.batch) {
            stored += client.enqueue_batch(body).await?;
        }
        drop(client);
        server.shutdown().await;
        if stored != args.jobs {
            return Err(format!("sql enqueue stored {stored} of {} jobs", args.jobs).into());
        }
        let schema = schema.as_deref().unwrap_or_default();
        let cpu = CpuTime::now();
        let started = Instant::now();
        let done = work_off(&pool, schema, queue, args.workers, fetch).await?;
        let elapsed = started.elapsed();
        let busy = cpu.since();
        if done != args.jobs {
            return Err(format!("sql work-off completed {done} of {} jobs", args.jobs).into());
        }
        report.add(Figure {
            name: format!("sql.jobs.work_batch_ack{suffix}"),
            value: per_second(args.jobs, elapsed),
            unit: "jobs/s",
            floor: Some(format!("floor.jobs.work{suffix}")),
            target: None,
            note: format!(
                "{} connections, {schema}.claim of {fetch} then one {schema}.ack_many of them, whole rows back, no server",
                args.workers
            ),
        });
        if let Some(us) = micros_per_job(busy, args.jobs) {
            report.add(Figure {
                name: format!("sql.jobs.cpu_us_per_job{suffix}"),
                value: us,
                unit: "µs/job",
                floor: Some(format!("floor.jobs.cpu_us_per_job{suffix}")),
                target: None,
                note: format!(
                    "busy CPU of the whole machine (/proc/stat) during the claim-{fetch} work-off \
                     through the SQL functions ÷ jobs"
                ),
            });
        }
    }
    pool.close().await;
    pg.drop_database(database).await;
    Ok(())
}

/// `workers` connections claim `fetch` jobs and ack them in one `ack_many` until a claim comes
/// back empty; returns the jobs completed.
async fn work_off(
    pool: &PgPool,
    schema: &str,
    queue: &str,
    workers: usize,
    fetch: usize,
) -> Result<usize> {
    // Whole rows, as the server asks for them; this client decodes only what it needs.
    let claim = format!("SELECT * FROM {schema}.claim($1, $2, $3, $4)");
    let ack = format!("SELECT * FROM {schema}.ack_many($1, $2, $3)");
    let mut tasks = JoinSet::new();
    for w in 0..workers {
        let (pool, claim, ack) = (pool.clone(), claim.clone(), ack.clone());
        let owners = vec![Some(format!("bench-sql-{w}")); fetch];
        let queue = queue.to_string();
        tasks.spawn(async move {
            let mut conn = pool.acquire().await?;
            let mut done = 0usize;
            loop {
                let rows = sqlx::query(AssertSqlSafe(claim.clone()))
                    .bind(&queue)
                    .bind(&owners)
                    .bind(None::<i64>)
                    .bind(VISIBILITY_MS)
                    .fetch_all(&mut *conn)
                    .await?;
                if rows.is_empty() {
                    return Ok::<usize, BenchError>(done);
                }
                let mut ids = Vec::with_capacity(rows.len());
                let mut tokens = Vec::with_capacity(rows.len());
                for row in &rows {
                    ids.push(row.try_get::<Uuid, _>("id")?);
                    tokens.push(row.try_get::<Option<Uuid>, _>("lease_token")?);
                }
                let results = vec![None::<serde_json::Value>; ids.len()];
                let completed = sqlx::query(AssertSqlSafe(ack.clone()))
                    .bind(&ids)
                    .bind(&tokens)
                    .bind(&results)
                    .fetch_all(&mut *conn)
                    .await?;
                done += completed.len();
            }
        });
    }
    let mut done = 0;
    while let Some(result) = tasks.join_next().await {
        done += result??;
    }
    Ok(done)
}
