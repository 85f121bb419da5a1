//! The hot job operations — claim, ack, single enqueue — each grouped across concurrent
//! requests (see `coalesce`) and sent straight to the queue's own functions with statements
//! prepared once per connection (see `routes`), falling back to the `s3p` catalog path where a
//! hint does not hold.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use serde_json::Value;
use sqlx::AssertSqlSafe;
use sqlx::types::Json;
use uuid::Uuid;

use super::coalesce::{Coalescer, Runner};
use super::conflicts::Conflicts;
use super::hot::HotPool;
use super::map_db_error;
use super::routes::{Routes, is_stale};
use super::rows::{CompletionRow, JobRow, jobs, one};
use crate::model::error::{CoreError, ErrorKind};
use crate::model::job::{Completion, Job, NewJob};

/// Most items one grouped statement takes.
const MAX_GROUP: usize = 1000;

/// Statements of one lane in flight at once. With one, every request that arrives while it runs
/// shares the next: fewer, larger transactions, which cut CPU per job by a fifth and raised
/// concurrent single enqueues by a quarter against two in flight (docs/benchmarks.md, eleventh
/// session). A claim never waits on a row (SKIP LOCKED).
const LANE_STATEMENTS: usize = 1;

/// Ack statements of one lane in flight at once: two, because an ack waits on its job's row lock
/// (a long admin transaction, say), and with one the queue's other acks would wait behind it.
/// Two measured the same as one.
const ACK_LANE_STATEMENTS: usize = 2;

/// One ack: job id, lease token (none = any lease), result.
pub type AckItem = (Uuid, Option<Uuid>, Option<Value>);

/// What a group of acks reads back for each completed job: the whole [`Job`] (a single ack
/// answers with it) or its [`Completion`] (a batch ack answers with state and times). Each has a
/// coalescer of its own, so a group never mixes the two.
pub trait AckRead: Sized + Send + 'static {
    /// The row `ack_many` returns for it.
    type Row: for<'r> sqlx::FromRow<'r, sqlx::postgres::PgRow> + Send + Unpin;
    /// The columns to select from `ack_many`: the payload columns (args, meta, result, ...) cost
    /// PostgreSQL their output and this server their decoding, so only what the answer needs.
    const COLUMNS: &'static str;
    /// The job's id.
    fn id(&self) -> Uuid;
    /// From a job a single ack (the precise-error path) completed.
    fn from_job(job: Job) -> Self;
    /// From the rows of one `ack_many` statement.
    fn from_rows(rows: Vec<Self::Row>) -> Result<Vec<Self>, CoreError>;
    /// The coalescer of this shape.
    fn coalescer(grouped: &Grouped) -> &Arc<AckCoalescer<Self>>;
}

/// The coalescer of the acks that read back `T`.
pub type AckCoalescer<T> = Coalescer<AckLane, AckItem, Result<T, CoreError>>;

impl AckRead for Job {
    type Row = JobRow;
    const COLUMNS: &'static str = "*";

    fn id(&self) -> Uuid {
        self.id
    }

    fn from_job(job: Job) -> Job {
        job
    }

    fn from_rows(rows: Vec<JobRow>) -> Result<Vec<Job>, CoreError> {
        jobs(rows)
    }

    fn coalescer(grouped: &Grouped) -> &Arc<AckCoalescer<Job>> {
        &grouped.acks_whole
    }
}

impl AckRead for Completion {
    type Row = CompletionRow;
    const COLUMNS: &'static str = CompletionRow::COLUMNS;

    fn id(&self) -> Uuid {
        self.id
    }

    fn from_job(job: Job) -> Completion {
        Completion::from(&job)
    }

    fn from_rows(rows: Vec<CompletionRow>) -> Result<Vec<Completion>, CoreError> {
        rows.into_iter().map(Completion::try_from).collect()
    }

    fn coalescer(grouped: &Grouped) -> &Arc<AckCoalescer<Completion>> {
        &grouped.acks_brief
    }
}

/// Where the acks of a group go: a queue's schema (from the job → queue hint) or none (the
/// catalog path).
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct AckLane {
    schema: Option<Arc<str>>,
}

/// A claim lane: queue, its schema, the fetch's visibility timeout and the server default.
#[derive(Clone, PartialEq, Eq, Hash)]
struct ClaimLane {
    queue: Arc<str>,
    schema: Arc<str>,
    visibility_ms: Option<i64>,
    default_visibility_ms: i64,
}

/// An enqueue lane: the queue and its schema when known (none: the catalog path creates it).
#[derive(Clone, PartialEq, Eq, Hash)]
struct EnqueueLane {
    queue: Arc<str>,
    schema: Option<Arc<str>>,
}

/// What one claim slot comes back as: the job claimed for it, or none.
type Slot = Result<Option<Job>, CoreError>;

/// What grouping saved so far: requests in, statements out, per operation.
#[derive(Debug, Clone, Copy, Default)]
pub struct GroupingStats {
    /// Ack requests (single and batch).
    pub ack_requests: u64,
    /// Statements (transactions) that completed them, fallbacks included.
    pub ack_statements: u64,
    /// Single-queue fetch requests that reached the database.
    pub fetch_requests: u64,
    /// Claim statements that served them.
    pub fetch_statements: u64,
    /// Single enqueues that could be grouped.
    pub enqueue_requests: u64,
    /// Statements that stored them.
    pub enqueue_statements: u64,
}

/// The shared parts every runner needs.
#[derive(Clone)]
struct Shared {
    pool: HotPool,
    conflicts: Arc<Conflicts>,
    routes: Arc<Routes>,
    counts: Arc<Counts>,
}

#[derive(Default)]
struct Counts {
    ack_requests: std::sync::atomic::AtomicU64,
    ack_statements: std::sync::atomic::AtomicU64,
    fetch_requests: std::sync::atomic::AtomicU64,
    fetch_statements: std::sync::atomic::AtomicU64,
    enqueue_requests: std::sync::atomic::AtomicU64,
    enqueue_statements: std::sync::atomic::AtomicU64,
}

fn bump(counter: &std::sync::atomic::AtomicU64) {
    counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
}

fn read(counter: &std::sync::atomic::AtomicU64) -> u64 {
    counter.load(std::sync::atomic::Ordering::Relaxed)
}

/// The grouped operations of one store.
pub struct Grouped {
    shared: Shared,
    acks_whole: Arc<AckCoalescer<Job>>,
    acks_brief: Arc<AckCoalescer<Completion>>,
    claims: Arc<Coalescer<ClaimLane, Option<String>, Slot>>,
    enqueues: Arc<Coalescer<EnqueueLane, NewJob, Result<Job, CoreError>>>,
}

impl Grouped {
    /// Grouped operations over `pool`, their conflicted statements rerun by `conflicts`.
    pub(super) fn new(pool: HotPool, conflicts: Arc<Conflicts>) -> Grouped {
        let shared = Shared {
            pool,
            conflicts,
            routes: Arc::new(Routes::default()),
            counts: Arc::new(Counts::default()),
        };
        let s = shared.clone();
        let acks_whole: Runner<AckLane, AckItem, Result<Job, CoreError>> =
            Arc::new(move |lane, items| {
                let s = s.clone();
                Box::pin(async move { s.run_acks(lane, items).await })
            });
        let s = shared.clone();
        let acks_brief: Runner<AckLane, AckItem, Result<Completion, CoreError>> =
            Arc::new(move |lane, items| {
                let s = s.clone();
                Box::pin(async move { s.run_acks(lane, items).await })
            });
        let s = shared.clone();
        let claims: Runner<ClaimLane, Option<String>, Slot> = Arc::new(move |lane, owners| {
            let s = s.clone();
            Box::pin(async move { s.run_claims(lane, owners).await })
        });
        let s = shared.clone();
        let enqueues: Runner<EnqueueLane, NewJob, Result<Job, CoreError>> =
            Arc::new(move |lane, rows| {
                let s = s.clone();
                Box::pin(async move { s.run_enqueues(lane, rows).await })
            });
        Grouped {
            shared,
            acks_whole: Coalescer::new(MAX_GROUP, ACK_LANE_STATEMENTS, acks_whole),
            acks_brief: Coalescer::new(MAX_GROUP, ACK_LANE_STATEMENTS, acks_brief),
            claims: Coalescer::new(MAX_GROUP, LANE_STATEMENTS, claims),
            enqueues: Coalescer::new(MAX_GROUP, LANE_STATEMENTS, enqueues),
        }
    }

    /// The queue → schema and job → queue hints.
    pub fn routes(&self) -> &Routes {
        &self.shared.routes
    }

    /// Requests and statements so far.
    pub fn stats(&self) -> GroupingStats {
        let c = &self.shared.counts;
        GroupingStats {
            ack_requests: read(&c.ack_requests),
            ack_statements: read(&c.ack_statements),
            fetch_requests: read(&c.fetch_requests),
            fetch_statements: read(&c.fetch_statements),
            enqueue_requests: read(&c.enqueue_requests),
            enqueue_statements: read(&c.enqueue_statements),
        }
    }

    /// Completes jobs; one outcome per ack, in order, each what a single ack of it answers, read
    /// back as `T`. Acks of jobs this gateway claimed go to their queue's schema, grouped per
    /// queue.
    pub async fn ack<T: AckRead>(
        &self,
        items: Vec<AckItem>,
    ) -> Result<Vec<Result<T, CoreError>>, CoreError> {
        bump(&self.shared.counts.ack_requests);
        // Items by the queue their job is remembered in, then each queue's schema looked up once.
        let routes = &self.shared.routes;
        let mut by_queue: Vec<(Option<Arc<str>>, Vec<usize>)> = Vec::new();
        for (i, (id, _, _)) in items.iter().enumerate() {
            let queue = routes.queue_of(id);
            match by_queue.iter_mut().find(|(q, _)| *q == queue) {
                Some((_, at)) => at.push(i),
                None => by_queue.push((queue, vec![i])),
            }
        }
        let mut lanes: Vec<(AckLane, Vec<usize>)> = Vec::with_capacity(by_queue.len());
        for (queue, at) in by_queue {
            let schema = match queue {
                Some(queue) => routes.schema(&self.shared.pool, &queue).await?,
                None => None,
            };
            let lane = AckLane { schema };
            match lanes.iter_mut().find(|(l, _)| *l == lane) {
                Some((_, all)) => all.extend(at),
                None => lanes.push((lane, at)),
            }
        }
        let mut items: Vec<Option<AckItem>> = items.into_iter().map(Some).collect();
        let mut outcomes: Vec<Option<Result<T, CoreError>>> =
            std::iter::repeat_with(|| None).take(items.len()).collect();
        for (lane, at) in lanes {
            let group = at.iter().filter_map(|&i| items[i].take()).collect();
            let answered = T::coalescer(self).run(lane, group).await?;
            for (&i, outcome) in at.iter().zip(answered) {
                outcomes[i] = Some(outcome);
            }
        }
        Ok(outcomes
            .into_iter()
            .map(|o| {
                o.unwrap_or_else(|| {
                    Err(CoreError::new(ErrorKind::Backend, "an ack got no outcome"))
                })
            })
            .collect())
    }

    /// Claims up to `count` jobs of one queue for `worker`, grouped with concurrent claims of the
    /// same queue and visibility timeout. An unknown queue has nothing to claim.
    pub async fn claim(
        &self,
        queue: &str,
        count: usize,
        worker: Option<&str>,
        visibility_ms: Option<i64>,
        default_visibility_ms: i64,
    ) -> Result<Vec<Job>, CoreError> {
        let Some(schema) = self.shared.routes.schema(&self.shared.pool, queue).await? else {
            return Ok(Vec::new());
        };
        bump(&self.shared.counts.fetch_requests);
        let lane = ClaimLane {
            queue: queue.into(),
            schema,
            visibility_ms,
            default_visibility_ms,
        };
        let owners = vec![worker.map(str::to_string); count];
        let slots = self.claims.run(lane, owners).await?;
        let mut claimed = Vec::with_capacity(count);
        for slot in slots {
            if let Some(job) = slot? {
                claimed.push(job);
            }
        }
        Ok(claimed)
    }

    /// Stores one job (no unique key, no rate-limit setting), grouped with concurrent single
    /// enqueues to the same queue.
    pub async fn enqueue(&self, queue: &str, row: NewJob) -> Result<Job, CoreError> {
        bump(&self.shared.counts.enqueue_requests);
        let lane = EnqueueLane {
            queue: queue.into(),
            schema: self.shared.routes.schema(&self.shared.pool, queue).await?,
        };
        let mut outcome = self.enqueues.run(lane, vec![row]).await?;
        outcome
            .pop()
            .unwrap_or_else(|| Err(CoreError::new(ErrorKind::Backend, "enqueue got no outcome")))
    }
}

impl Shared {
    /// One statement for a group of acks; those it leaves out get a single ack each, which says
    /// why (or finds the job where the hint was wrong). A job acked twice in one group: the later
    /// acks go after the statement, as they would have after a separate one.
    async fn run_acks<T: AckRead>(
        &self,
        lane: AckLane,
        items: Vec<AckItem>,
    ) -> Vec<Result<T, CoreError>> {
        let mut seen = HashSet::with_capacity(items.len());
        let first: Vec<bool> = items.iter().map(|(id, _, _)| seen.insert(*id)).collect();
        let (mut ids, mut tokens, mut results) = (Vec::new(), Vec::new(), Vec::new());
        for ((id, token, result), first) in items.iter().zip(&first) {
            if *first {
                ids.push(*id);
                tokens.push(*token);
                results.push(result.clone());
            }
        }
        bump(&self.counts.ack_statements);
        let mut grouped = self
            .ack_many::<T>(lane.schema.as_deref(), &ids, &tokens, &results)
            .await;
        if lane.schema.is_some() && grouped.as_ref().is_err_and(|e| e.is_stale()) {
            // The queue went away under the hint: the catalog path knows where each job is.
            bump(&self.counts.ack_statements);
            grouped = self.ack_many::<T>(None, &ids, &tokens, &results).await;
        }
        let mut completed: HashMap<Uuid, T> = match grouped {
            Ok(acked) => acked.into_iter().map(|a| (a.id(), a)).collect(),
            // Answer each on its own: one ack's failure must not become the others'.
            Err(_) => HashMap::new(),
        };
        let mut outcomes = Vec::with_capacity(items.len());
        for ((id, token, result), first) in items.into_iter().zip(first) {
            let done = if first { completed.remove(&id) } else { None };
            outcomes.push(match done {
                Some(acked) => Ok(acked),
                None => {
                    bump(&self.counts.ack_statements);
                    self.ack_one(id, token, result.as_ref())
                        .await
                        .map(T::from_job)
                }
            });
        }
        self.routes
            .release(outcomes.iter().filter_map(|o| o.as_ref().ok().map(T::id)));
        outcomes
    }

    /// One `ack_many` statement, reading back `T`'s columns.
    async fn ack_many<T: AckRead>(
        &self,
        schema: Option<&str>,
        ids: &[Uuid],
        tokens: &[Option<Uuid>],
        results: &[Option<Value>],
    ) -> Result<Vec<T>, DbError> {
        let sql = format!(
            "SELECT {} FROM {}.ack_many($1, $2, $3)",
            T::COLUMNS,
            schema.unwrap_or("s3p")
        );
        let rows: Vec<T::Row> = self.ack_rows(&sql, ids, tokens, results).await?;
        T::from_rows(rows).map_err(DbError::Core)
    }

    async fn ack_rows<R>(
        &self,
        sql: &str,
        ids: &[Uuid],
        tokens: &[Option<Uuid>],
        results: &[Option<Value>],
    ) -> Result<Vec<R>, DbError>
    where
        R: for<'r> sqlx::FromRow<'r, sqlx::postgres::PgRow> + Send + Unpin,
    {
        self.conflicts
            .rerun(|| {
                sqlx::query_as(AssertSqlSafe(sql.to_string()))
                    .bind(ids)
                    .bind(tokens)
                    .bind(results)
                    .fetch_all(&self.pool)
            })
            .await
            .map_err(DbError::Sql)
    }

    /// `s3p.ack` of one job: completes it or raises the precise error.
    async fn ack_one(
        &self,
        id: Uuid,
        token: Option<Uuid>,
        result: Option<&Value>,
    ) -> Result<Job, CoreError> {
        let rows: Vec<JobRow> = self
            .conflicts
            .rerun(|| {
                sqlx::query_as("SELECT * FROM s3p.ack($1, $2, $3)")
                    .bind(id)
                    .bind(token)
                    .bind(result)
                    .fetch_all(&self.pool)
            })
            .await
            .map_err(map_db_error)?;
        one(rows, id)
    }

    /// One claim statement for a group of fetches: a slot per job wanted, its worker id in it;
    /// the claimed jobs fill the slots in order.
    async fn run_claims(&self, lane: ClaimLane, owners: Vec<Option<String>>) -> Vec<Slot> {
        let wanted = owners.len();
        bump(&self.counts.fetch_statements);
        let mut claimed = self.claim(&lane.schema, &lane, &owners).await;
        if claimed.as_ref().is_err_and(|e| e.is_stale()) {
            // Dropped (and maybe created again): ask the catalog once more.
            self.routes.forget(&lane.queue);
            claimed = match self.routes.schema(&self.pool, &lane.queue).await {
                Ok(Some(schema)) => {
                    bump(&self.counts.fetch_statements);
                    self.claim(&schema, &lane, &owners).await
                }
                Ok(None) => Ok(Vec::new()),
                Err(e) => Err(DbError::Core(e)),
            };
        }
        match claimed {
            Ok(jobs) => {
                self.routes.remember(&lane.queue, &jobs);
                let mut slots: Vec<Slot> = jobs.into_iter().map(|job| Ok(Some(job))).collect();
                slots.resize_with(wanted, || Ok(None));
                slots
            }
            Err(error) => {
                let error = error.into_core();
                (0..wanted).map(|_| Err(error.clone())).collect()
            }
        }
    }

    async fn claim(
        &self,
        schema: &str,
        lane: &ClaimLane,
        owners: &[Option<String>],
    ) -> Result<Vec<Job>, DbError> {
        let sql = format!("SELECT * FROM {schema}.claim($1, $2, $3, $4)");
        let rows: Vec<JobRow> = self
            .conflicts
            .rerun(|| {
                sqlx::query_as(AssertSqlSafe(sql.clone()))
                    .bind(&*lane.queue)
                    .bind(owners)
                    .bind(lane.visibility_ms)
                    .bind(lane.default_visibility_ms)
                    .fetch_all(&self.pool)
            })
            .await
            .map_err(DbError::Sql)?;
        jobs(rows).map_err(DbError::Core)
    }

    /// One statement for a group of single enqueues (the queue's `insert_jobs`, else
    /// `s3p.enqueue_batch`: all or none); when a group fails, each is stored on its own so that
    /// each gets its own answer. Once the group's statement has committed nothing is stored again.
    async fn run_enqueues(
        &self,
        lane: EnqueueLane,
        rows: Vec<NewJob>,
    ) -> Vec<Result<Job, CoreError>> {
        let ids: Vec<Uuid> = rows.iter().map(|row| row.id).collect();
        if let Some(schema) = &lane.schema {
            bump(&self.counts.enqueue_statements);
            match super::new_jobs::insert_jobs(
                &self.pool,
                &self.conflicts,
                schema,
                &lane.queue,
                &rows,
            )
            .await
            {
                Ok(stored) => return by_given_id(Ok(stored), ids),
                Err(error) if error.is_stale() => self.routes.forget(&lane.queue),
                // One job: its own precise answer.
                Err(error) if ids.len() == 1 => return vec![Err(error.into_core())],
                Err(_) => {}
            }
            return self.store_each(&rows).await;
        }
        if rows.len() > 1 {
            bump(&self.counts.enqueue_statements);
            let stored: Result<Vec<JobRow>, sqlx::Error> = self
                .conflicts
                .rerun(|| {
                    sqlx::query_as("SELECT * FROM s3p.enqueue_batch($1)")
                        .bind(Json(&rows))
                        .fetch_all(&self.pool)
                })
                .await;
            if let Ok(stored) = stored {
                return by_given_id(jobs(stored), ids);
            }
        }
        self.store_each(&rows).await
    }

    /// Each job stored on its own (`s3p.enqueue`), each with its own answer.
    async fn store_each(&self, rows: &[NewJob]) -> Vec<Result<Job, CoreError>> {
        let mut outcomes = Vec::with_capacity(rows.len());
        for row in rows {
            bump(&self.counts.enqueue_statements);
            outcomes.push(enqueue_one(&self.pool, &self.conflicts, row).await);
        }
        outcomes
    }
}

/// The stored jobs in the order their ids were given. Plain jobs only (the store's rule), so
/// every stored job has the id it was given.
fn by_given_id(stored: Result<Vec<Job>, CoreError>, ids: Vec<Uuid>) -> Vec<Result<Job, CoreError>> {
    let stored = match stored {
        Ok(stored) => stored,
        Err(error) => return ids.iter().map(|_| Err(error.clone())).collect(),
    };
    let mut by_id: HashMap<Uuid, Job> = stored.into_iter().map(|job| (job.id, job)).collect();
    ids.into_iter()
        .map(|id| {
            by_id
                .remove(&id)
                .ok_or_else(|| CoreError::new(ErrorKind::Backend, "enqueue got no outcome"))
        })
        .collect()
}

/// `s3p.enqueue` of one job.
pub(super) async fn enqueue_one(
    pool: &HotPool,
    conflicts: &Conflicts,
    row: &NewJob,
) -> Result<Job, CoreError> {
    let rows: Vec<JobRow> = conflicts
        .rerun(|| {
            sqlx::query_as("SELECT * FROM s3p.enqueue($1)")
                .bind(Json(row))
                .fetch_all(pool)
        })
        .await
        .map_err(map_db_error)?;
    rows.into_iter()
        .next()
        .map(Job::try_from)
        .unwrap_or_else(|| {
            Err(CoreError::new(
                ErrorKind::Backend,
                format!("enqueue of {} returned no job", row.id),
            ))
        })
}

/// A database error kept whole until it is known whether it means a stale hint.
pub(super) enum DbError {
    Sql(sqlx::Error),
    Core(CoreError),
}

impl DbError {
    pub(super) fn is_stale(&self) -> bool {
        matches!(self, DbError::Sql(e) if is_stale(e))
    }

    pub(super) fn into_core(self) -> CoreError {
        match self {
            DbError::Sql(e) => map_db_error(e),
            DbError::Core(e) => e,
        }
    }
}
