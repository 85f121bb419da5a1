//! `pgvs3-bench`: measures pgvs3 against a plain-SQL floor on the same PostgreSQL in the same run
//! and prints a table plus one JSON line per figure. It is a report, never an assertion: targets
//! print as PASS/MISS next to each figure and the exit status only says whether the run completed.
//!
//! Every scenario gets a fresh database; pgvs3 runs in-process on an ephemeral port with its
//! maintenance loop. Progress goes to stderr, the table and the JSON lines to stdout. Clients back
//! off from admission refusals and retry, as an SDK would (`backoff`).

mod backoff;
mod clients;
mod cpu;
mod db;
mod direct;
mod encoded;
mod floor;
mod report;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::{Parser, ValueEnum};
use sqlx::{AssertSqlSafe, Connection, PgConnection};
use tokio::task::JoinSet;

use clients::{Http, Jobs, Streams};
use cpu::{CpuTime, micros_per_job};
use db::{Database, Postgres, WalMark};
use report::{Figure, Report, Target};

/// Any error, with its message.
pub type BenchError = Box<dyn std::error::Error + Send + Sync>;
/// Result with [`BenchError`].
pub type Result<T> = std::result::Result<T, BenchError>;

/// A client protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    Http,
    Grpc,
}

impl Protocol {
    fn name(self) -> &'static str {
        match self {
            Protocol::Http => "http",
            Protocol::Grpc => "grpc",
        }
    }
}

/// Which protocols to measure.
#[derive(Debug, Clone, Copy, ValueEnum)]
enum Protocols {
    Http,
    Grpc,
    Both,
}

/// What to measure.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Scenario {
    /// Batched enqueue, work-offs, CPU and WAL per job, churn and single enqueues, per protocol.
    Jobs,
    /// Append, fan-out receive + ack, churn and end-to-end latency, per protocol.
    Streams,
    /// The plain-SQL floor of the jobs figures.
    Floor,
    /// The jobs work-off through the queue's SQL functions alone (no server): the database's share.
    Sql,
    /// Job pickup latency (idle long-poll fetch, one enqueue), per protocol.
    Latency,
    /// All of the above.
    All,
}

/// `synchronous_commit` for the bench databases.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum SyncCommit {
    On,
    Off,
}

impl SyncCommit {
    fn as_str(self) -> &'static str {
        match self {
            SyncCommit::On => "on",
            SyncCommit::Off => "off",
        }
    }
}

/// Measures pgvs3 (jobs and streams, over HTTP and gRPC) against a plain-SQL floor.
#[derive(Debug, Parser)]
#[command(name = "pgvs3-bench", version)]
pub struct Args {
    /// Jobs enqueued in batches and worked off.
    #[arg(long, default_value_t = 20_000)]
    jobs: usize,
    /// Concurrent workers (and floor connections) for the work-off.
    #[arg(long, default_value_t = 4)]
    workers: usize,
    /// Jobs per batch enqueue (and per multi-row INSERT of the floor).
    #[arg(long, default_value_t = 1_000)]
    batch: usize,
    /// Jobs claimed per fetch (and per floor claim statement); the `_f100` figures claim 100.
    #[arg(long, default_value_t = 10)]
    fetch: usize,
    /// Jobs enqueued one at a time, sequentially and again with --in-flight concurrent clients.
    #[arg(long, default_value_t = 1_000)]
    singles: usize,
    /// Concurrent single enqueues.
    #[arg(long, default_value_t = 16)]
    in_flight: usize,
    /// Samples per latency figure.
    #[arg(long, default_value_t = 50)]
    samples: usize,
    /// Stream messages appended and received by every consumer.
    #[arg(long, default_value_t = 100_000)]
    messages: usize,
    /// Messages per append.
    #[arg(long, default_value_t = 1_000)]
    append_batch: usize,
    /// Fan-out consumers.
    #[arg(long, default_value_t = 2)]
    consumers: usize,
    /// `max` of each receive.
    #[arg(long, default_value_t = 1_000)]
    receive_max: usize,
    /// Protocols to measure.
    #[arg(long, value_enum, default_value = "both")]
    protocol: Protocols,
    /// `synchronous_commit` of the bench databases (on = durable commits).
    #[arg(long, value_enum, default_value = "on")]
    synchronous_commit: SyncCommit,
    /// Scenarios to run (comma-separated).
    #[arg(long, value_enum, value_delimiter = ',', default_value = "all")]
    scenario: Vec<Scenario>,
    /// PostgreSQL to create the bench databases in (needs CREATEDB); none = a private cluster.
    #[arg(long, env = "DATABASE_URL")]
    database_url: Option<String>,
    /// Where the private cluster lives (initialised on first use, reused afterwards).
    #[arg(long, default_value = "target/pgvs3-bench")]
    data_dir: PathBuf,
    /// Database connections of the server under test.
    #[arg(long, default_value_t = 32)]
    db_pool_size: u32,
    /// Time between the server's maintenance passes, ms.
    #[arg(long, default_value_t = 500)]
    maintenance_interval_ms: u64,
}

impl Args {
    fn runs(&self, scenario: Scenario) -> bool {
        self.scenario.contains(&Scenario::All) || self.scenario.contains(&scenario)
    }

    fn protocols(&self) -> Vec<Protocol> {
        match self.protocol {
            Protocols::Http => vec![Protocol::Http],
            Protocols::Grpc => vec![Protocol::Grpc],
            Protocols::Both => vec![Protocol::Http, Protocol::Grpc],
        }
    }
}

/// glibc malloc spent more CPU per request than any one part of the server; mimalloc does not.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    pgvs3::memory::no_transparent_huge_pages();
    STARTED.get_or_init(Instant::now);
    let args = Args::parse();
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
    if let Err(error) = validate(&args) {
        eprintln!("pgvs3-bench: {error}");
        return ExitCode::from(2);
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("pgvs3-bench: cannot start the runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    let mut pg = match Postgres::start(
        args.database_url.as_deref(),
        &args.data_dir,
        args.synchronous_commit,
    ) {
        Ok(pg) => pg,
        Err(error) => {
            eprintln!("pgvs3-bench: no PostgreSQL: {error}");
            return ExitCode::FAILURE;
        }
    };
    let outcome = runtime.block_on(run(&args, &pg));
    drop(runtime);
    pg.stop();
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("pgvs3-bench: {error}");
            ExitCode::FAILURE
        }
    }
}

fn validate(args: &Args) -> Result<()> {
    let positive = [
        ("--jobs", args.jobs),
        ("--workers", args.workers),
        ("--batch", args.batch),
        ("--fetch", args.fetch),
        ("--singles", args.singles),
        ("--in-flight", args.in_flight),
        ("--samples", args.samples),
        ("--messages", args.messages),
        ("--append-batch", args.append_batch),
        ("--consumers", args.consumers),
        ("--receive-max", args.receive_max),
    ];
    for (flag, value) in positive {
        if value == 0 {
            return Err(format!("{flag} must be at least 1").into());
        }
    }
    if args.receive_max < args.append_batch {
        return Err(format!(
            "--receive-max ({}) must be at least --append-batch ({}): one append is one tick",
            args.receive_max, args.append_batch
        )
        .into());
    }
    Ok(())
}

/// When the run started, for progress lines.
static STARTED: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();

/// A progress line on stderr, stamped with the seconds since the start.
pub fn progress(message: std::fmt::Arguments<'_>) {
    let since = STARTED.get_or_init(Instant::now).elapsed();
    eprintln!("bench [{:6.1} s] {message}", since.as_secs_f64());
}

/// The 1-minute load average (Linux), to tell a quiet machine from a busy one.
fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|l| l.split_whitespace().next().map(str::to_string))
        .unwrap_or_else(|| "?".to_string())
}

async fn run(args: &Args, pg: &Postgres) -> Result<()> {
    let started = Instant::now();
    let load_before = load_average();
    pg.drop_leftovers().await?;
    let facts = pg.facts().await?;
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let machine = format!(
        "{cores} cores shared by PostgreSQL, pgvs3 and the load; PostgreSQL {} ({}); fsync={}, \
         synchronous_commit={}, wal_sync_method={}, shared_buffers={}",
        facts.version,
        if facts.private {
            "private cluster"
        } else {
            "DATABASE_URL"
        },
        facts.fsync,
        facts.synchronous_commit,
        facts.wal_sync_method,
        facts.shared_buffers
    );
    progress(format_args!("{machine}"));

    let mut report = Report::default();
    if args.runs(Scenario::Floor) {
        floor::run(pg, args, &mut report).await?;
    }
    if args.runs(Scenario::Sql) {
        direct::run(pg, args, &mut report).await?;
    }
    for protocol in args.protocols() {
        if args.runs(Scenario::Jobs) {
            jobs_work(pg, args, protocol, &mut report).await?;
            jobs_singles(pg, args, protocol, &mut report).await?;
        }
        if args.runs(Scenario::Latency) {
            jobs_pickup(pg, args, protocol, &mut report).await?;
        }
        if args.runs(Scenario::Streams) {
            streams_throughput(pg, args, protocol, &mut report).await?;
            streams_latency(pg, args, protocol, &mut report).await?;
        }
    }
    let took = started.elapsed();
    println!("pgvs3-bench: {machine}");
    println!(
        "load average (1 min) {load_before} at start, {} at end",
        load_average()
    );
    println!(
        "ratios are figure / floor (throughput: higher is better; latency, CPU, WAL and churn: lower is better); run took {:.1} s",
        took.as_secs_f64()
    );
    println!();
    print!("{}", report.table());
    println!();
    for line in report.json_lines() {
        println!("{line}");
    }
    Ok(())
}

/// The `q` quantile of samples by nearest rank (p99 of 50 samples is the largest).
pub fn percentile(samples: &[f64], q: f64) -> f64 {
    if samples.is_empty() {
        return f64::NAN;
    }
    let mut sorted = samples.to_vec();
    sorted.sort_by(f64::total_cmp);
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

fn millis(elapsed: Duration) -> f64 {
    elapsed.as_secs_f64() * 1000.0
}

fn per_second(count: usize, elapsed: Duration) -> f64 {
    count as f64 / elapsed.as_secs_f64()
}

/// A fresh database with pgvs3 serving it.
struct Served {
    database: Database,
    server: pgvs3::server::RunningServer,
    base: String,
}

async fn serve(pg: &Postgres, args: &Args, label: &str) -> Result<Served> {
    let database = pg.fresh(label).await?;
    let server = db::start_server(&database.url, args).await?;
    let base = format!("http://{}", server.addr);
    Ok(Served {
        database,
        server,
        base,
    })
}

impl Served {
    /// Stops the server and returns its database (still present).
    async fn stop(self) -> Database {
        self.server.shutdown().await;
        self.database
    }
}

/// Batched enqueue and the work-offs of the same jobs (enqueued again before each), the WAL of the
/// first enqueue + work-off, then the dead tuples they all left.
async fn jobs_work(
    pg: &Postgres,
    args: &Args,
    protocol: Protocol,
    report: &mut Report,
) -> Result<()> {
    let p = protocol.name();
    progress(format_args!("{p} jobs: batched enqueue and work-off"));
    let served = serve(pg, args, &format!("{p}_jobs")).await?;
    let queue = "bench";
    Http::new(&served.base)?.create_queue(queue).await?;
    let schema = db::queue_schema(&served.database.url, queue).await?;

    let bodies = Jobs::batches(protocol, queue, args.jobs, args.batch);
    let batches = bodies.len();
    let mut client = Jobs::connect(protocol, &served.base).await?;
    // WAL from before this enqueue to after the batch-ack work-off that follows it: the whole
    // cluster's, so nothing else may run in between (scenarios are sequential).
    let wal = WalMark::now(&served.database.url).await?;
    let retried = backoff::retries();
    let started = Instant::now();
    let mut stored = 0;
    for body in bodies {
        stored += client.enqueue_batch(body).await?;
    }
    let elapsed = started.elapsed();
    if stored != args.jobs {
        return Err(format!("{p} batch enqueue stored {stored} of {} jobs", args.jobs).into());
    }
    report.add(Figure {
        name: format!("{p}.jobs.enqueue_batch"),
        value: per_second(args.jobs, elapsed),
        unit: "jobs/s",
        floor: Some("floor.jobs.enqueue_batch".into()),
        target: Some(Target::RatioAtLeast(0.4)),
        note: format!(
            "{batches} batches of {}, 1 client{}",
            args.batch,
            backoff::note_since(retried)
        ),
    });
    let enqueue_retries = backoff::retries() - retried;

    for ack in AckMode::ALL {
        if ack != AckMode::Batch {
            // The same jobs again, for the next work-off.
            for body in Jobs::batches(protocol, queue, args.jobs, args.batch) {
                client.enqueue_batch(body).await?;
            }
        }
        let before = count_completed(&served.database.url, &schema).await?;
        let retried = backoff::retries();
        let cpu = CpuTime::now();
        let (elapsed, fetches, acks) = work_off(protocol, &served.base, args, queue, ack).await?;
        let busy = cpu.since();
        let work_retries = backoff::retries() - retried;
        let written = if ack == AckMode::Batch {
            Some(wal.written(&served.database.url).await?)
        } else {
            None
        };
        let completed = count_completed(&served.database.url, &schema).await? - before;
        let done: usize = acks.iter().map(|(_, n)| n).sum();
        if done != args.jobs || completed != args.jobs {
            return Err(format!(
                "{p} work-off acked {done} and completed {completed} of {} jobs",
                args.jobs
            )
            .into());
        }
        let ack_ms: Vec<f64> = acks.iter().map(|(ms, _)| *ms).collect();
        report.add(Figure {
            name: format!("{p}.jobs.{}", ack.figure()),
            value: per_second(args.jobs, elapsed),
            unit: "jobs/s",
            floor: Some(ack.floor().into()),
            target: ack.target(),
            note: format!(
                "{} workers, fetch {} then {}; fetch p50 {:.2} ms, ack p50 {:.2} / p99 {:.2} ms; \
                 {work_retries} admission retries",
                ack.workers(args),
                ack.fetch(args),
                ack.describe(),
                percentile(&fetches, 0.5),
                percentile(&ack_ms, 0.5),
                percentile(&ack_ms, 0.99)
            ),
        });
        if let Some((suffix, target)) = ack.cpu_figure()
            && let Some(us) = micros_per_job(busy, args.jobs)
        {
            report.add(Figure {
                name: format!("{p}.jobs.cpu_us_per_job{suffix}"),
                value: us,
                unit: "µs/job",
                floor: Some(format!("floor.jobs.cpu_us_per_job{suffix}")),
                target: Some(Target::RatioAtMost(target)),
                note: format!(
                    "busy CPU of the whole machine (/proc/stat) during the fetch-{} batch-ack \
                     work-off ÷ jobs; {work_retries} admission retries",
                    ack.fetch(args)
                ),
            });
        }
        if let Some(written) = written {
            report.add(Figure {
                name: format!("{p}.jobs.wal_bytes_per_job"),
                value: written.bytes / args.jobs as f64,
                unit: "B/job",
                floor: Some("floor.jobs.wal_bytes_per_job".into()),
                target: Some(Target::RatioAtMost(1.5)),
                note: format!(
                    "WAL of the whole cluster (pg_current_wal_lsn) from before the batched enqueue \
                     to after the fetch-{} batch-ack work-off ÷ jobs, nothing else running; {}; \
                     {} admission retries",
                    ack.fetch(args),
                    written.checkpoint_note(),
                    enqueue_retries + work_retries
                ),
            });
        }
    }

    let database = served.stop().await;
    let stats = db::settled_stats(&database).await?;
    // Every work-off completed `args.jobs` jobs, each enqueued for it.
    let jobs_done = AckMode::ALL.len() * args.jobs;
    let churn = db::churn(&stats, jobs_done as f64);
    report.add(Figure {
        name: format!("{p}.jobs.dead_tuples_per_job"),
        value: churn.updated_or_deleted as f64 / jobs_done as f64,
        unit: "tuples/job",
        floor: Some("floor.jobs.dead_tuples_per_job".into()),
        target: Some(Target::AtMost(2.0)),
        note: format!(
            "dead versions made by the enqueues + {} work-offs (n_dead_tup left {:.2}/job): {}",
            AckMode::ALL.len(),
            churn.dead as f64 / jobs_done as f64,
            churn.detail
        ),
    });
    pg.drop_database(database).await;
    Ok(())
}

/// How a work-off worker completes the jobs of one fetch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum AckMode {
    /// One batch-ack request per fetch of `--fetch` (the pgvs3 extension).
    Batch,
    /// One batch-ack request per fetch of 100.
    BatchF100,
    /// One ack request per job (the OJS worker protocol).
    Each,
    /// 32 workers, one ack request per job with up to a fetch's acks in flight (SDK workers
    /// with concurrency).
    EachW32,
}

impl AckMode {
    /// The work-offs in the order they run: batch ack first, right after the timed enqueue (the
    /// WAL figure covers the two), and at fetch 100 second, as the floor's claim-100 work-off.
    const ALL: [AckMode; 4] = [
        AckMode::Batch,
        AckMode::BatchF100,
        AckMode::Each,
        AckMode::EachW32,
    ];

    fn figure(self) -> &'static str {
        match self {
            AckMode::Batch => "work_batch_ack",
            AckMode::BatchF100 => "work_batch_ack_f100",
            AckMode::Each => "work",
            AckMode::EachW32 => "work_ack_each_w32",
        }
    }

    /// The floor figure of the same claim size.
    fn floor(self) -> &'static str {
        match self {
            AckMode::BatchF100 => "floor.jobs.work_f100",
            _ => "floor.jobs.work",
        }
    }

    fn target(self) -> Option<Target> {
        match self {
            AckMode::Each => None,
            AckMode::Batch | AckMode::BatchF100 | AckMode::EachW32 => {
                Some(Target::RatioAtLeast(0.6))
            }
        }
    }

    /// The CPU figure's name suffix and its target (× the floor's at the same claim size).
    fn cpu_figure(self) -> Option<(&'static str, f64)> {
        match self {
            AckMode::Batch => Some(("", 2.5)),
            AckMode::BatchF100 => Some(("_f100", 2.0)),
            _ => None,
        }
    }

    fn workers(self, args: &Args) -> usize {
        match self {
            AckMode::EachW32 => 32,
            _ => args.workers,
        }
    }

    fn fetch(self, args: &Args) -> usize {
        match self {
            AckMode::BatchF100 => floor::FETCH_WIDE,
            _ => args.fetch,
        }
    }

    fn describe(self) -> &'static str {
        match self {
            AckMode::Each => "ack each",
            AckMode::Batch | AckMode::BatchF100 => "one batch ack per fetch",
            AckMode::EachW32 => "ack each, the fetch's acks in flight at once",
        }
    }
}

/// Latencies of one work-off: fetch times, and each ack request's time with the jobs it acked.
type WorkOff = (Duration, Vec<f64>, Vec<(f64, usize)>);

/// `args.workers` workers, each on its own connection, fetch (`wait_ms` 0) and ack until a fetch
/// comes back empty.
async fn work_off(
    protocol: Protocol,
    base: &str,
    args: &Args,
    queue: &'static str,
    ack: AckMode,
) -> Result<WorkOff> {
    let mut workers = JoinSet::new();
    for w in 0..ack.workers(args) {
        let mut client = Jobs::connect(protocol, base).await?;
        let fetch = ack.fetch(args);
        workers.spawn(async move {
            let worker = format!("bench-worker-{w}");
            let (mut fetches, mut acks) = (Vec::new(), Vec::new());
            loop {
                let started = Instant::now();
                let claims = client.fetch(queue, fetch, 0, &worker).await?;
                fetches.push(millis(started.elapsed()));
                if claims.is_empty() {
                    return Ok::<_, BenchError>((fetches, acks));
                }
                match ack {
                    AckMode::Each => {
                        for claim in &claims {
                            let started = Instant::now();
                            client.ack(claim, &worker).await?;
                            acks.push((millis(started.elapsed()), 1));
                        }
                    }
                    AckMode::Batch | AckMode::BatchF100 => {
                        let started = Instant::now();
                        client.ack_batch(&claims, &worker).await?;
                        acks.push((millis(started.elapsed()), claims.len()));
                    }
                    AckMode::EachW32 => {
                        let pending = claims.iter().map(|claim| {
                            let mut client = client.clone();
                            let worker = &worker;
                            async move {
                                let started = Instant::now();
                                client.ack(claim, worker).await?;
                                Ok::<_, BenchError>((millis(started.elapsed()), 1))
                            }
                        });
                        acks.extend(futures_util::future::try_join_all(pending).await?);
                    }
                }
            }
        });
    }
    let started = Instant::now();
    let (mut fetches, mut acks) = (Vec::new(), Vec::new());
    while let Some(result) = workers.join_next().await {
        let (f, a) = result??;
        fetches.extend(f);
        acks.extend(a);
    }
    Ok((started.elapsed(), fetches, acks))
}

async fn count_completed(url: &str, schema: &str) -> Result<usize> {
    let mut conn = PgConnection::connect(url).await?;
    let n: i64 = sqlx::query_scalar(AssertSqlSafe(format!(
        "SELECT count(*) FROM {schema}.jobs WHERE state = 'completed'"
    )))
    .fetch_one(&mut conn)
    .await?;
    conn.close().await?;
    Ok(usize::try_from(n)?)
}

/// Single enqueues, one client sequentially, then `in_flight` clients at once.
async fn jobs_singles(
    pg: &Postgres,
    args: &Args,
    protocol: Protocol,
    report: &mut Report,
) -> Result<()> {
    let p = protocol.name();
    progress(format_args!("{p} jobs: single enqueues"));
    let served = serve(pg, args, &format!("{p}_singles")).await?;
    let queue = "single";
    Http::new(&served.base)?.create_queue(queue).await?;

    let mut client = Jobs::connect(protocol, &served.base).await?;
    let mut latencies = Vec::with_capacity(args.singles);
    let retried = backoff::retries();
    let started = Instant::now();
    for i in 0..args.singles {
        let sent = Instant::now();
        client.enqueue(queue, i).await?;
        latencies.push(millis(sent.elapsed()));
    }
    let elapsed = started.elapsed();
    report.add(Figure {
        name: format!("{p}.jobs.enqueue_single_seq"),
        value: per_second(args.singles, elapsed),
        unit: "jobs/s",
        floor: Some("floor.jobs.enqueue_single_seq".into()),
        target: None,
        note: format!(
            "{} enqueues, 1 client; p50 {:.2} ms{}",
            args.singles,
            percentile(&latencies, 0.5),
            backoff::note_since(retried)
        ),
    });

    let per_client = args.singles.div_ceil(args.in_flight);
    let mut clients = Vec::new();
    for _ in 0..args.in_flight {
        clients.push(Jobs::connect(protocol, &served.base).await?);
    }
    let mut tasks = JoinSet::new();
    let retried = backoff::retries();
    let started = Instant::now();
    for (c, mut client) in clients.into_iter().enumerate() {
        tasks.spawn(async move {
            let mut latencies = Vec::with_capacity(per_client);
            for i in c * per_client..(c + 1) * per_client {
                let sent = Instant::now();
                client.enqueue(queue, i).await?;
                latencies.push(millis(sent.elapsed()));
            }
            Ok::<_, BenchError>(latencies)
        });
    }
    let mut latencies = Vec::new();
    while let Some(result) = tasks.join_next().await {
        latencies.extend(result??);
    }
    let elapsed = started.elapsed();
    let total = latencies.len();
    report.add(Figure {
        name: format!("{p}.jobs.enqueue_single_concurrent"),
        value: per_second(total, elapsed),
        unit: "jobs/s",
        floor: Some("floor.jobs.enqueue_single_concurrent".into()),
        target: Some(Target::RatioAtLeast(0.6)),
        note: format!(
            "{total} enqueues, {} clients; p50 {:.2} / p99 {:.2} ms{}",
            args.in_flight,
            percentile(&latencies, 0.5),
            percentile(&latencies, 0.99),
            backoff::note_since(retried)
        ),
    });
    let database = served.stop().await;
    pg.drop_database(database).await;
    Ok(())
}

/// Pickup latency: an idle worker in a long-poll fetch (wait_ms 2000), one enqueue, time until
/// the fetch answers with the job.
async fn jobs_pickup(
    pg: &Postgres,
    args: &Args,
    protocol: Protocol,
    report: &mut Report,
) -> Result<()> {
    let p = protocol.name();
    progress(format_args!("{p} jobs: pickup latency"));
    let served = serve(pg, args, &format!("{p}_pickup")).await?;
    let queue = "pickup";
    Http::new(&served.base)?.create_queue(queue).await?;
    let mut producer = Jobs::connect(protocol, &served.base).await?;
    let mut worker = Jobs::connect(protocol, &served.base).await?;
    let fetch = args.fetch;
    let mut samples = Vec::with_capacity(args.samples);
    let retried = backoff::retries();
    for i in 0..args.samples {
        let waiting = tokio::spawn(async move {
            let claims = worker.fetch(queue, fetch, 2_000, "bench-idle").await;
            (claims, Instant::now(), worker)
        });
        // Let the fetch find nothing and settle into its wait.
        tokio::time::sleep(Duration::from_millis(30)).await;
        let sent = Instant::now();
        producer.enqueue(queue, i).await?;
        let (claims, delivered, back) = waiting.await?;
        worker = back;
        let claims = claims?;
        if claims.is_empty() {
            return Err(format!("{p} pickup: the job was not delivered within 2 s").into());
        }
        samples.push(millis(delivered.duration_since(sent)));
        for claim in &claims {
            worker.ack(claim, "bench-idle").await?;
        }
    }
    for (q, name, target) in [(0.50, "p50", 5.0), (0.99, "p99", 25.0)] {
        report.add(Figure {
            name: format!("{p}.jobs.pickup_{name}"),
            value: percentile(&samples, q),
            unit: "ms",
            floor: Some(format!("floor.jobs.pickup_{name}")),
            target: Some(Target::AtMost(target)),
            note: format!(
                "{} samples, fetch wait_ms 2000{}",
                samples.len(),
                backoff::note_since(retried)
            ),
        });
    }
    let database = served.stop().await;
    pg.drop_database(database).await;
    Ok(())
}

/// Append throughput, fan-out receive + ack throughput, and the dead tuples left per event.
///
/// All appends come first, then the consumers receive: the worst backlog. No manual tick: the
/// receives (and the maintenance pass) cut ticks of at most the queue's `tick_max_events`, so
/// consumers with `max` 1000 keep up without a 413.
async fn streams_throughput(
    pg: &Postgres,
    args: &Args,
    protocol: Protocol,
    report: &mut Report,
) -> Result<()> {
    let p = protocol.name();
    progress(format_args!(
        "{p} streams: append and fan-out receive + ack"
    ));
    let served = serve(pg, args, &format!("{p}_streams")).await?;
    let queue = "stream";
    let mut producer = Streams::connect(protocol, &served.base).await?;
    let consumers: Vec<String> = (0..args.consumers)
        .map(|c| format!("bench-consumer-{c}"))
        .collect();
    for consumer in &consumers {
        producer.subscribe(queue, consumer).await?;
    }

    let bodies = Streams::batches(protocol, queue, args.messages, args.append_batch);
    let batches = bodies.len();
    let mut appending = Duration::ZERO;
    let mut appended = 0;
    let retried = backoff::retries();
    let mut latencies = Vec::with_capacity(batches);
    for body in bodies {
        let started = Instant::now();
        appended += producer.append(queue, body).await?;
        let took = started.elapsed();
        appending += took;
        latencies.push(millis(took));
    }
    if appended != args.messages {
        return Err(format!("{p} append stored {appended} of {} messages", args.messages).into());
    }
    report.add(Figure {
        name: format!("{p}.streams.append"),
        value: per_second(args.messages, appending),
        unit: "msg/s",
        floor: Some("floor.jobs.enqueue_batch".into()),
        target: Some(Target::RatioAtLeast(0.8)),
        note: format!(
            "{batches} appends of {}, 1 client, p50 {:.2} ms{}",
            args.append_batch,
            percentile(&latencies, 0.5),
            backoff::note_since(retried)
        ),
    });

    let mut tasks = JoinSet::new();
    let retried = backoff::retries();
    for consumer in consumers {
        let mut client = Streams::connect(protocol, &served.base).await?;
        let (messages, max) = (args.messages, args.receive_max);
        tasks.spawn(async move {
            let started = Instant::now();
            let mut received = 0;
            let mut empty = 0;
            let (mut receives, mut acks) = (Vec::new(), Vec::new());
            while received < messages {
                let asked = Instant::now();
                match client.receive(queue, &consumer, max, 0).await? {
                    Some(batch) => {
                        receives.push(millis(asked.elapsed()));
                        received += batch.count;
                        let acking = Instant::now();
                        client.ack(queue, &consumer, &batch.batch_id).await?;
                        acks.push(millis(acking.elapsed()));
                    }
                    None => {
                        empty += 1;
                        if empty > 100 {
                            return Err::<_, BenchError>(
                                format!("{consumer} stopped receiving at {received}").into(),
                            );
                        }
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                }
            }
            Ok((consumer, received, started.elapsed(), receives, acks))
        });
    }
    let mut rates = Vec::new();
    let (mut receives, mut acks) = (Vec::new(), Vec::new());
    while let Some(result) = tasks.join_next().await {
        let (consumer, received, elapsed, r, a) = result??;
        receives.extend(r);
        acks.extend(a);
        if received != args.messages {
            return Err(format!("{consumer} received {received} of {}", args.messages).into());
        }
        rates.push(per_second(received, elapsed));
    }
    let slowest = rates.iter().copied().fold(f64::INFINITY, f64::min);
    report.add(Figure {
        name: format!("{p}.streams.receive_ack"),
        value: slowest,
        unit: "msg/s",
        floor: None,
        target: Some(Target::AtLeast(200_000.0)),
        note: format!(
            "slowest of {} concurrent consumers (all: {}), max {}; receive p50 {:.2} ms, ack p50 {:.2} ms{}",
            rates.len(),
            rates
                .iter()
                .map(|r| format!("{r:.0}"))
                .collect::<Vec<_>>()
                .join(", "),
            args.receive_max,
            percentile(&receives, 0.5),
            percentile(&acks, 0.5),
            backoff::note_since(retried)
        ),
    });

    let database = served.stop().await;
    let stats = db::settled_stats(&database).await?;
    let churn = db::churn(&stats, args.messages as f64);
    report.add(Figure {
        name: format!("{p}.streams.dead_tuples_per_event"),
        value: churn.updated_or_deleted as f64 / args.messages as f64,
        unit: "tuples/event",
        floor: None,
        target: Some(Target::AtMost(0.0)),
        note: format!(
            "dead versions made by append + {} consumers (n_dead_tup left {:.2}/event): {}",
            args.consumers,
            churn.dead as f64 / args.messages as f64,
            churn.detail
        ),
    });
    pg.drop_database(database).await;
    Ok(())
}

/// End-to-end latency: a consumer long-polls a receive (wait_ms 2000), one message is appended,
/// time until the receive answers with it.
async fn streams_latency(
    pg: &Postgres,
    args: &Args,
    protocol: Protocol,
    report: &mut Report,
) -> Result<()> {
    let p = protocol.name();
    progress(format_args!("{p} streams: end-to-end latency"));
    let served = serve(pg, args, &format!("{p}_e2e")).await?;
    let queue = "e2e";
    let consumer = "bench-e2e";
    let mut producer = Streams::connect(protocol, &served.base).await?;
    producer.subscribe(queue, consumer).await?;
    let mut receiver = Streams::connect(protocol, &served.base).await?;
    let max = args.receive_max;
    let mut samples = Vec::with_capacity(args.samples);
    let retried = backoff::retries();
    for i in 0..args.samples {
        let waiting = tokio::spawn(async move {
            let batch = receiver.receive(queue, consumer, max, 2_000).await;
            (batch, Instant::now(), receiver)
        });
        tokio::time::sleep(Duration::from_millis(30)).await;
        let sent = Instant::now();
        producer.append_one(queue, i).await?;
        let (batch, delivered, back) = waiting.await?;
        receiver = back;
        let batch = batch?.ok_or_else(|| {
            BenchError::from(format!("{p} e2e: the message was not received within 2 s"))
        })?;
        samples.push(millis(delivered.duration_since(sent)));
        receiver.ack(queue, consumer, &batch.batch_id).await?;
    }
    for (q, name) in [(0.50, "p50"), (0.99, "p99")] {
        report.add(Figure {
            name: format!("{p}.streams.e2e_{name}"),
            value: percentile(&samples, q),
            unit: "ms",
            floor: None,
            target: None,
            note: format!(
                "{} samples, receive wait_ms 2000{}",
                samples.len(),
                backoff::note_since(retried)
            ),
        });
    }
    let database = served.stop().await;
    pg.drop_database(database).await;
    Ok(())
}
