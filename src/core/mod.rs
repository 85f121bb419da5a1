//! The one protocol-neutral service: validates requests, decides, and calls the store.
//! Both the HTTP and the gRPC adapter call these methods and only convert.

pub mod access;
pub mod admin;
pub mod admin_system;
pub mod browse;
pub mod cron;
pub use crate::model::error;
pub mod events;
pub mod json_text;
pub use crate::model::job;
pub mod page;
pub mod push;
pub mod stream;
pub mod timings;
pub mod validate;
pub mod workflow;

use std::time::{Duration, Instant};

use chrono::Utc;
use serde_json::json;

pub use crate::model::queue::{QueueConfig, QueueStats};
use crate::store::Store;
pub use access::{Grant, Role, Scope};
pub use error::{CoreError, ErrorKind};
pub use job::{
    AckJob, Completion, DeadLetterPage, EnqueueJob, Enqueued, FetchJobs, Heartbeat,
    HeartbeatOutcome, Job, JobState, JobTime, MaintenanceReport, NackJob, QueueSummary,
    WorkerDirective,
};
pub use validate::QueueConfigChanges;

/// Limits and defaults of the job operations.
#[derive(Debug, Clone)]
pub struct ServiceSettings {
    /// Lease length when neither the fetch nor the job sets one.
    pub default_visibility_timeout_ms: i64,
    /// Refuse ack/nack without a lease token.
    pub require_lease_token: bool,
    /// Most queues one fetch may name.
    pub max_fetch_queues: usize,
    /// Most jobs one fetch may claim.
    pub max_fetch_count: i64,
    /// Longest fetch long-poll.
    pub max_fetch_wait_ms: i64,
    /// Whether this gateway rejects mutations (reported by health and manifest).
    pub read_only: bool,
    /// How long terminal jobs are kept when their queue sets no retention.
    pub job_retention_ms: i64,
    /// Most rows one maintenance step touches per queue and kind of work.
    pub maintenance_batch: i32,
    /// Most jobs one batch enqueue may carry.
    pub max_batch_jobs: usize,
    /// Most long-lived streams open at once (server-sent events, gRPC server streams); beyond
    /// it a new one is refused with 429 / RESOURCE_EXHAUSTED.
    pub max_streams: usize,
    /// Largest request body the middleware accepts (reported by the manifest).
    pub max_body_bytes: usize,
}

impl Default for ServiceSettings {
    fn default() -> Self {
        ServiceSettings {
            default_visibility_timeout_ms: 1_800_000,
            require_lease_token: false,
            max_fetch_queues: 64,
            max_fetch_count: 100,
            max_fetch_wait_ms: 2_000,
            read_only: false,
            job_retention_ms: 86_400_000,
            maintenance_batch: 1000,
            max_batch_jobs: 1000,
            max_streams: 1000,
            max_body_bytes: 1_048_576,
        }
    }
}

/// What the manifest says about this server.
#[derive(Debug, Clone)]
pub struct Manifest {
    /// OJS version spoken.
    pub ojs_version: &'static str,
    /// Server version.
    pub version: &'static str,
    /// Highest OJS conformance level fully served.
    pub conformance_level: i32,
    /// Protocols served.
    pub protocols: Vec<&'static str>,
    /// Storage backend.
    pub backend: &'static str,
    /// Capability flags, each true only when implemented.
    pub capabilities: Vec<(&'static str, bool)>,
    /// Extensions beyond OJS.
    pub extensions: Vec<&'static str>,
    /// Limits clients should respect.
    pub limits: serde_json::Value,
}

/// Health of the server and its database.
#[derive(Debug, Clone)]
pub struct Health {
    /// Whether the database answered.
    pub database_ok: bool,
    /// Round-trip time of the probe.
    pub database_latency: Duration,
    /// The database error, if any.
    pub database_error: Option<String>,
    /// Seconds since start.
    pub uptime_seconds: u64,
    /// Whether this gateway is read-only.
    pub read_only: bool,
}

/// The pgvs3 service shared by every protocol adapter.
pub struct Service {
    store: Store,
    settings: ServiceSettings,
    started: Instant,
    totals: MaintenanceTotals,
    open_streams: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    timings: timings::JobTimings,
    admin: admin_system::AdminState,
}

/// One open long-lived stream, counted against `max_streams` until dropped.
pub struct StreamSlot(std::sync::Arc<std::sync::atomic::AtomicUsize>);

impl Drop for StreamSlot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
    }
}

/// Running totals of what this gateway's maintenance passes did (for /metrics).
#[derive(Debug, Default)]
pub struct MaintenanceTotals {
    /// Expired leases released.
    pub lease_expiries: std::sync::atomic::AtomicU64,
    /// Stream segment rotations.
    pub rotations: std::sync::atomic::AtomicU64,
    /// Passes this gateway ran.
    pub passes: std::sync::atomic::AtomicU64,
    /// Jobs tables vacuumed for their dead row versions.
    pub vacuums: std::sync::atomic::AtomicU64,
    /// Queue steps run (a pass steps only through due queues).
    pub queue_steps: std::sync::atomic::AtomicU64,
    /// Failed maintenance steps by queue ("" for the shared step).
    pub failures: std::sync::Mutex<std::collections::BTreeMap<String, u64>>,
}

impl Service {
    /// A service over `store`.
    pub fn new(store: Store, settings: ServiceSettings) -> Self {
        Service {
            store,
            settings,
            started: Instant::now(),
            totals: MaintenanceTotals::default(),
            open_streams: Default::default(),
            timings: Default::default(),
            admin: Default::default(),
        }
    }

    /// A slot for a new long-lived stream, or 429 when `max_streams` are open already.
    pub fn stream_slot(&self) -> Result<StreamSlot, CoreError> {
        let open = self
            .open_streams
            .fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        let slot = StreamSlot(self.open_streams.clone());
        if open >= self.settings.max_streams {
            return Err(CoreError::new(
                ErrorKind::RateLimited,
                format!(
                    "{} long-lived streams are open, the most this server keeps; retry later",
                    self.settings.max_streams
                ),
            ));
        }
        Ok(slot)
    }

    /// Long-lived streams open now (for /metrics).
    pub fn open_streams(&self) -> usize {
        self.open_streams.load(std::sync::atomic::Ordering::Acquire)
    }

    /// The settings in force.
    pub fn settings(&self) -> &ServiceSettings {
        &self.settings
    }

    /// The manifest.
    pub fn manifest(&self) -> Manifest {
        Manifest {
            ojs_version: "1.0",
            version: env!("CARGO_PKG_VERSION"),
            conformance_level: 4,
            protocols: vec!["http", "grpc"],
            backend: "postgres",
            capabilities: vec![
                ("batch_enqueue", true),
                ("cron_jobs", true),
                ("dead_letter", true),
                ("delayed_jobs", true),
                ("job_ttl", true),
                ("priority_queues", true),
                ("rate_limiting", true),
                ("schema_validation", false),
                ("unique_jobs", true),
                ("workflows", true),
                ("pause_resume", true),
            ],
            extensions: vec![
                "lease-tokens",
                "long-poll-fetch",
                "streams",
                "queue-namespaces",
                // The OJS Admin API (spec/ojs-admin-api.md) under /ojs/v1/admin/.
                "urn:ojs:ext:admin-api",
            ],
            limits: json!({
                "max_body_bytes": self.settings.max_body_bytes,
                "max_fetch_queues": self.settings.max_fetch_queues,
                "max_fetch_count": self.settings.max_fetch_count,
                "max_fetch_wait_ms": self.settings.max_fetch_wait_ms,
            }),
        }
    }

    /// Probes the database.
    pub async fn health(&self) -> Health {
        let started = Instant::now();
        let probe = self.store.health_ping().await;
        Health {
            database_ok: probe.is_ok(),
            database_latency: started.elapsed(),
            database_error: probe.err().map(|e| e.message),
            uptime_seconds: self.started.elapsed().as_secs(),
            read_only: self.settings.read_only,
        }
    }

    /// Validates and stores a job; the queue is created on first use. A unique job whose policy
    /// says `ignore` may answer with the existing job (`created: false`).
    pub async fn enqueue(&self, job: EnqueueJob) -> Result<Enqueued, CoreError> {
        let row = validate::new_job_row(&job, Utc::now())?;
        let requested = row.id;
        let job = self.store.enqueue(row).await?;
        let created = job.id == requested;
        Ok(Enqueued { job, created })
    }

    /// Validates every job, then stores all of them or none.
    pub async fn enqueue_batch(&self, jobs: Vec<EnqueueJob>) -> Result<Vec<Job>, CoreError> {
        if jobs.is_empty() || jobs.len() > self.settings.max_batch_jobs {
            return Err(CoreError::invalid(format!(
                "jobs must hold between 1 and {} jobs",
                self.settings.max_batch_jobs
            ))
            .with_detail("field", "jobs".into()));
        }
        let now = Utc::now();
        let rows = jobs
            .iter()
            .enumerate()
            .map(|(i, job)| {
                validate::new_job_row(job, now).map_err(|e| validate::batch_item_error(i, e))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let order: std::collections::HashMap<uuid::Uuid, usize> = rows
            .iter()
            .enumerate()
            .map(|(i, row)| (row.id, i))
            .collect();
        let mut stored = self.store.enqueue_batch(&rows).await?;
        // The store answers queue by queue; the caller gets its own order back. (A unique job
        // answered with an existing job keeps the store's order, which is already the caller's.)
        if stored.iter().all(|j| order.contains_key(&j.id)) {
            stored.sort_by_key(|j| order.get(&j.id).copied());
        }
        Ok(stored)
    }

    /// `not_found` unless job `id` lies in a queue of `scope`: an id of another queue answers
    /// as one that does not exist. Free for every-queue scopes (no round trip); one index lookup
    /// for a scoped token. Every operation that names a job by id passes here first.
    async fn job_in_scope(&self, scope: &Scope, id: uuid::Uuid) -> Result<(), CoreError> {
        if scope.is_all() {
            return Ok(());
        }
        match self.store.job_queues(&[id]).await?.first() {
            Some((_, queue)) => scope.require_visible(queue, "job", &id.to_string()),
            None => Err(CoreError::not_found("job", &id.to_string())),
        }
    }

    /// The jobs among `ids` that lie in a queue of `scope` (all of them for every-queue scopes,
    /// without a round trip).
    async fn jobs_in_scope(
        &self,
        scope: &Scope,
        ids: &[uuid::Uuid],
    ) -> Result<std::collections::HashSet<uuid::Uuid>, CoreError> {
        if scope.is_all() {
            return Ok(ids.iter().copied().collect());
        }
        Ok(self
            .store
            .job_queues(ids)
            .await?
            .into_iter()
            .filter(|(_, queue)| scope.covers(queue))
            .map(|(id, _)| id)
            .collect())
    }

    /// One job in its effective state.
    pub async fn get_job(&self, scope: &Scope, id: &str) -> Result<Job, CoreError> {
        let id = validate::parse_job_id(id)?;
        self.job_in_scope(scope, id).await?;
        self.store.get_job(id).await
    }

    /// Cancels a job that is not terminal.
    pub async fn cancel_job(&self, scope: &Scope, id: &str) -> Result<Job, CoreError> {
        let id = validate::parse_job_id(id)?;
        self.job_in_scope(scope, id).await?;
        self.store.cancel(id).await
    }

    /// Claims jobs for a worker, long-polling up to `wait_ms` when none is ready.
    pub async fn fetch(&self, request: FetchJobs) -> Result<Vec<Job>, CoreError> {
        self.fetch_then_idle(request, || {}).await
    }

    /// Like `fetch`; `before_wait` runs once, just before a long poll starts waiting (the adapters
    /// use it to give back the request's admission slot).
    pub async fn fetch_then_idle(
        &self,
        request: FetchJobs,
        before_wait: impl FnOnce() + Send,
    ) -> Result<Vec<Job>, CoreError> {
        let mut before_wait = Some(before_wait);
        let s = &self.settings;
        if request.queues.is_empty() || request.queues.len() > s.max_fetch_queues {
            return Err(CoreError::invalid(format!(
                "queues must name between 1 and {} queues",
                s.max_fetch_queues
            ))
            .with_detail("field", "queues".into()));
        }
        for queue in &request.queues {
            validate::check_queue_name(queue)?;
        }
        if let Some(worker) = &request.worker_id {
            validate::check_text("worker_id", worker)?;
        }
        let count = request.count.unwrap_or(1);
        if !(1..=s.max_fetch_count).contains(&count) {
            return Err(CoreError::invalid(format!(
                "count must be between 1 and {}, not {count}",
                s.max_fetch_count
            ))
            .with_detail("field", "count".into()));
        }
        validate::lease_ms(
            "visibility_timeout_ms",
            request.visibility_timeout_ms,
            |ms| {
                CoreError::invalid(format!("visibility_timeout_ms must be positive, not {ms}"))
                    .with_detail("field", "visibility_timeout_ms".into())
            },
        )?;
        let wait_ms = request.wait_ms.unwrap_or(0);
        if !(0..=s.max_fetch_wait_ms).contains(&wait_ms) {
            return Err(CoreError::invalid(format!(
                "wait_ms must be between 0 and {}, not {wait_ms}",
                s.max_fetch_wait_ms
            ))
            .with_detail("field", "wait_ms".into()));
        }
        let deadline = tokio::time::Instant::now() + Duration::from_millis(wait_ms as u64);
        if let Some(worker) = &request.worker_id {
            self.admin.note(worker, &request.queues, false);
        }
        // Maintenance mode: no job leaves; a long poll waits out its time (no busy loop).
        if self.admin.in_maintenance() {
            if let Some(release) = before_wait.take() {
                release();
            }
            tokio::time::sleep_until(deadline).await;
            return Ok(Vec::new());
        }
        // Subscribe before the first claim so an enqueue between claim and wait is not missed.
        let mut wakeups = self.store.signals().subscribe();
        loop {
            let jobs = self
                .store
                .fetch(
                    &request.queues,
                    count as i32,
                    request.worker_id.as_deref(),
                    request.visibility_timeout_ms,
                    s.default_visibility_timeout_ms,
                )
                .await?;
            if !jobs.is_empty() || wait_ms == 0 {
                self.timings.fetched(&jobs);
                return Ok(jobs);
            }
            // Long polls only wait on queues that exist.
            if !self.store.any_queue_exists(&request.queues).await? {
                return Ok(jobs);
            }
            if let Some(release) = before_wait.take() {
                release();
            }
            if !wakeups.wait_for(&request.queues, deadline).await {
                return Ok(Vec::new());
            }
        }
    }

    fn lease_token(&self, token: Option<&str>) -> Result<Option<uuid::Uuid>, CoreError> {
        let token = validate::parse_lease_token(token)?;
        if token.is_none() && self.settings.require_lease_token {
            return Err(CoreError::invalid(
                "lease_token is required by this server (--require-lease-token)",
            )
            .with_detail("field", "lease_token".into()));
        }
        Ok(token)
    }

    /// Completes an active job.
    pub async fn ack(&self, scope: &Scope, request: AckJob) -> Result<Job, CoreError> {
        let id = validate::parse_job_id(&request.job_id)?;
        let token = self.lease_token(request.lease_token.as_deref())?;
        if let Some(result) = &request.result {
            validate::check_no_nul("result", result)?;
        }
        self.job_in_scope(scope, id).await?;
        let job = self.store.ack(id, token, request.result.as_ref()).await?;
        self.timings.completed(&Completion::from(&job));
        Ok(job)
    }

    /// Completes many active jobs with one commit (the batch-ack extension). The request is
    /// refused whole when malformed; otherwise each ack gets its own outcome, in request order,
    /// as a single ack of it would have answered (its completion, not the whole job).
    pub async fn ack_batch(
        &self,
        scope: &Scope,
        acks: Vec<AckJob>,
    ) -> Result<Vec<Result<Completion, CoreError>>, CoreError> {
        if acks.is_empty() || acks.len() > self.settings.max_batch_jobs {
            return Err(CoreError::invalid(format!(
                "acks must hold between 1 and {} acks",
                self.settings.max_batch_jobs
            ))
            .with_detail("field", "acks".into()));
        }
        let mut items = Vec::with_capacity(acks.len());
        let mut seen = std::collections::HashSet::with_capacity(acks.len());
        for (i, ack) in acks.into_iter().enumerate() {
            let at = |e: CoreError| {
                let field = format!("acks[{i}]");
                CoreError::invalid(format!("{field}: {}", e.message))
                    .with_detail("field", field.into())
            };
            let id = validate::parse_job_id(&ack.job_id).map_err(at)?;
            let token = self.lease_token(ack.lease_token.as_deref()).map_err(at)?;
            if let Some(result) = &ack.result {
                validate::check_no_nul("result", result).map_err(at)?;
            }
            if !seen.insert(id) {
                return Err(at(CoreError::invalid(format!(
                    "job {id} is acked twice in one batch"
                ))));
            }
            items.push((id, token, ack.result));
        }
        let outcomes = if scope.is_all() {
            self.store.ack_each(items).await?
        } else {
            self.ack_each_in_scope(scope, items).await?
        };
        for done in outcomes.iter().flatten() {
            self.timings.completed(done);
        }
        Ok(outcomes)
    }

    /// `ack_each` for a scoped token: an ack of another queue's job answers as one of a job that
    /// does not exist; the others are acked together, each outcome in its place.
    async fn ack_each_in_scope(
        &self,
        scope: &Scope,
        items: Vec<crate::store::AckItem>,
    ) -> Result<Vec<Result<Completion, CoreError>>, CoreError> {
        let ids: Vec<uuid::Uuid> = items.iter().map(|(id, _, _)| *id).collect();
        let visible = self.jobs_in_scope(scope, &ids).await?;
        let mut outcomes: Vec<Result<Completion, CoreError>> = ids
            .iter()
            .map(|id| Err(CoreError::not_found("job", &id.to_string())))
            .collect();
        let (at, mine): (Vec<usize>, Vec<_>) = items
            .into_iter()
            .enumerate()
            .filter(|(_, (id, _, _))| visible.contains(id))
            .unzip();
        if !mine.is_empty() {
            for (i, outcome) in at.into_iter().zip(self.store.ack_each(mine).await?) {
                outcomes[i] = outcome;
            }
        }
        Ok(outcomes)
    }

    /// Fails an active job: retried, requeued or discarded by its policy.
    pub async fn nack(&self, scope: &Scope, request: NackJob) -> Result<Job, CoreError> {
        let id = validate::parse_job_id(&request.job_id)?;
        let token = self.lease_token(request.lease_token.as_deref())?;
        let f = &request.failure;
        let code = f.code.clone().or_else(|| f.error_type.clone());
        let failure = json!({
            "code": code.unwrap_or_else(|| "handler_error".to_string()),
            "type": f.error_type.clone().or_else(|| f.code.clone()),
            "message": f.message,
            "retryable": f.retryable,
            "details": f.details,
            "backtrace": f.backtrace,
        });
        // Drop nulls so the stored error only has what the worker said.
        let failure = match failure {
            serde_json::Value::Object(map) => {
                serde_json::Value::Object(map.into_iter().filter(|(_, v)| !v.is_null()).collect())
            }
            other => other,
        };
        validate::check_no_nul("error", &failure)?;
        self.job_in_scope(scope, id).await?;
        self.store.nack(id, token, &failure, request.requeue).await
    }

    /// Extends the leases of a worker's jobs (those named, or all it holds when none is) and
    /// tells it what to do. A job whose meta carries `test_directive` (`quiet`/`terminate`, the
    /// OJS conformance hook) sets the directive. Only leases in queues of `scope` are extended
    /// (a job of another queue is one the worker does not hold).
    pub async fn heartbeat(
        &self,
        scope: &Scope,
        request: Heartbeat,
    ) -> Result<HeartbeatOutcome, CoreError> {
        if request.worker_id.is_empty() {
            return Err(CoreError::invalid("worker_id is required")
                .with_detail("field", "worker_id".into()));
        }
        let mut ids = request
            .job_ids
            .iter()
            .map(|id| validate::parse_job_id(id))
            .collect::<Result<Vec<_>, _>>()?;
        // A job named twice (as `job_id` and in `active_jobs`, or as `id` and in `job_ids`) is
        // one job.
        ids.sort();
        ids.dedup();
        if ids.len() > 1 && request.lease_token.is_some() {
            return Err(CoreError::invalid("lease_token applies to a single job_id"));
        }
        let token = validate::parse_lease_token(request.lease_token.as_deref())?;
        validate::lease_ms(
            "visibility_timeout_ms",
            request.visibility_timeout_ms,
            |ms| CoreError::invalid(format!("visibility_timeout_ms must be positive, not {ms}")),
        )?;
        validate::check_text("worker_id", &request.worker_id)?;
        // A heartbeat naming no job speaks for every job the worker holds.
        let extended = if ids.is_empty() {
            if token.is_some() {
                return Err(CoreError::invalid("lease_token applies to a single job_id"));
            }
            self.store
                .heartbeat_worker(
                    scope,
                    &request.worker_id,
                    request.visibility_timeout_ms,
                    self.settings.default_visibility_timeout_ms,
                )
                .await?
        } else {
            if !scope.is_all() {
                let visible = self.jobs_in_scope(scope, &ids).await?;
                ids.retain(|id| visible.contains(id));
            }
            if ids.is_empty() {
                return Ok(HeartbeatOutcome {
                    directive: self.registry_directive(scope, &request.worker_id, false),
                    extended: Vec::new(),
                });
            }
            self.store
                .heartbeat(
                    &ids,
                    &request.worker_id,
                    token,
                    request.visibility_timeout_ms,
                    self.settings.default_visibility_timeout_ms,
                )
                .await?
        };
        // spec/ojs.md 0.1: a token that is not the job's current lease is a stale lease.
        if let (Some(token), [id], true) = (token, ids.as_slice(), extended.is_empty()) {
            match self.store.get_job(*id).await {
                Ok(job) if job.lease_token != Some(token) => {
                    return Err(CoreError::new(
                        ErrorKind::StaleLease,
                        format!("lease token is not the current lease of job {id}"),
                    ));
                }
                Ok(_) => {}
                Err(e) if e.kind == ErrorKind::NotFound => {}
                Err(e) => return Err(e),
            }
        }
        let directive = extended
            .iter()
            .map(|(_, directive, _)| match directive.as_deref() {
                Some("terminate") => WorkerDirective::Terminate,
                Some("quiet") => WorkerDirective::Quiet,
                _ => WorkerDirective::Running,
            })
            .max()
            .unwrap_or(WorkerDirective::Running)
            .max(self.registry_directive(scope, &request.worker_id, !extended.is_empty()));
        Ok(HeartbeatOutcome {
            directive,
            extended: extended
                .into_iter()
                .map(|(id, _, until)| (id, until))
                .collect(),
        })
    }

    /// Notes a heartbeat in the worker registry and says `quiet` when the Admin API asked so.
    /// Only a heartbeat whose token sees every queue, or that extended a lease, speaks for its
    /// worker: a scoped token cannot keep another scope's worker alive or learn its state.
    fn registry_directive(&self, scope: &Scope, worker: &str, extended: bool) -> WorkerDirective {
        if !(scope.is_all() || extended) {
            return WorkerDirective::Running;
        }
        self.admin.note(worker, &[], true);
        if self.admin.is_quiet(worker) {
            WorkerDirective::Quiet
        } else {
            WorkerDirective::Running
        }
    }

    /// Makes a pending job available.
    pub async fn activate_job(&self, scope: &Scope, id: &str) -> Result<Job, CoreError> {
        let id = validate::parse_job_id(id)?;
        self.job_in_scope(scope, id).await?;
        self.store.activate(id).await
    }

    /// A page of dead letters, of one queue or of all, within `scope`.
    pub async fn dead_letters(
        &self,
        scope: &Scope,
        queue: Option<&str>,
        limit: Option<i64>,
        offset: Option<i64>,
    ) -> Result<DeadLetterPage, CoreError> {
        if let Some(q) = queue {
            validate::check_queue_name(q)?;
        }
        scope.require_named(queue)?;
        let limit = limit.unwrap_or(50);
        if !(1..=200).contains(&limit) {
            return Err(CoreError::invalid(format!(
                "limit must be between 1 and 200, not {limit}"
            )));
        }
        let offset = offset.unwrap_or(0);
        if offset < 0 {
            return Err(CoreError::invalid(format!(
                "offset must not be negative, not {offset}"
            )));
        }
        let (jobs, total) = self.store.dead_letters(scope, queue, limit, offset).await?;
        Ok(DeadLetterPage {
            jobs,
            total,
            offset,
            limit,
        })
    }

    /// Puts a dead letter back as available with its attempts reset.
    pub async fn retry_dead_letter(&self, scope: &Scope, id: &str) -> Result<Job, CoreError> {
        let id = validate::parse_job_id(id)?;
        self.job_in_scope(scope, id).await?;
        self.store.retry_dead_letter(id).await
    }

    /// Deletes a dead letter for good.
    pub async fn delete_dead_letter(&self, scope: &Scope, id: &str) -> Result<Job, CoreError> {
        let id = validate::parse_job_id(id)?;
        self.job_in_scope(scope, id).await?;
        self.store.delete_dead_letter(id).await
    }

    /// Makes every queue due for its next maintenance step (a gateway starting).
    pub async fn mark_every_queue_due(&self) -> Result<(), CoreError> {
        self.store.mark_every_queue_due().await
    }

    /// One maintenance pass (skipped at once when another gateway holds it).
    pub async fn maintain(&self) -> Result<MaintenanceReport, CoreError> {
        use std::sync::atomic::Ordering::Relaxed;
        let report = self
            .store
            .maintain(
                self.settings.job_retention_ms,
                self.settings.maintenance_batch,
            )
            .await?;
        if report.ran {
            self.totals.passes.fetch_add(1, Relaxed);
            self.totals
                .lease_expiries
                .fetch_add(report.released.max(0) as u64, Relaxed);
            self.totals
                .rotations
                .fetch_add(report.rotations.max(0) as u64, Relaxed);
            self.totals
                .vacuums
                .fetch_add(report.vacuums.max(0) as u64, Relaxed);
            self.totals
                .queue_steps
                .fetch_add(report.queues_stepped.max(0) as u64, Relaxed);
            let mut failures = self
                .totals
                .failures
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            for step in &report.failed_steps {
                *failures.entry(step.clone()).or_insert(0) += 1;
            }
        }
        // The throughput rollup follows the event log beside the pass (one gateway at a time).
        if let Err(error) = self.stats_rollup().await {
            tracing::warn!(%error, "the throughput rollup failed");
        }
        Ok(report)
    }

    /// Requests and statements of the grouped job operations so far (for /metrics).
    pub fn grouping_stats(&self) -> crate::store::GroupingStats {
        self.store.grouping_stats()
    }

    /// Statements run again after a deadlock or serialization failure (for /metrics).
    pub fn conflict_retries(&self) -> u64 {
        self.store.conflict_retries()
    }

    /// Job wait and run time histograms (for /metrics).
    pub fn job_timings(&self) -> &timings::JobTimings {
        &self.timings
    }

    /// What this gateway's maintenance passes did so far.
    pub fn maintenance_totals(&self) -> &MaintenanceTotals {
        &self.totals
    }

    /// Per-queue job and stream figures of the queues in `scope`, and the pool's (open, idle)
    /// connections.
    pub async fn metrics_snapshot(
        &self,
        scope: &Scope,
    ) -> Result<(serde_json::Value, (u32, usize)), CoreError> {
        Ok((
            self.store.metrics_snapshot(scope).await?,
            self.store.pool_usage(),
        ))
    }

    /// Creates a queue namespace; true when it did not exist before.
    pub async fn create_queue(&self, queue: &str) -> Result<bool, CoreError> {
        validate::check_queue_name(queue)?;
        self.store.create_queue(queue).await
    }

    /// Drops a queue namespace with both its views.
    pub async fn drop_queue(&self, queue: &str) -> Result<(), CoreError> {
        validate::check_queue_name(queue)?;
        self.store.drop_queue(queue).await?;
        self.timings.forget(queue);
        Ok(())
    }

    /// Registers a queue schema restored from a dump; returns the job ids indexed.
    pub async fn adopt_queue(&self, queue: &str) -> Result<i64, CoreError> {
        validate::check_queue_name(queue)?;
        self.store.adopt_queue(queue).await
    }

    /// Job state counts and stream counts.
    pub async fn queue_stats(&self, queue: &str) -> Result<QueueStats, CoreError> {
        validate::check_queue_name(queue)?;
        self.store.queue_stats(queue).await
    }

    /// `queue_stats` of several queues, in one database round trip.
    pub async fn queue_stats_of(&self, queues: &[String]) -> Result<Vec<QueueStats>, CoreError> {
        for queue in queues {
            validate::check_queue_name(queue)?;
        }
        self.store.queue_stats_of(queues).await
    }

    /// Pauses (true) or resumes (false) job delivery of a queue.
    pub async fn set_paused(&self, queue: &str, paused: bool) -> Result<bool, CoreError> {
        validate::check_queue_name(queue)?;
        self.store.set_paused(queue, paused).await
    }

    /// Reads (`changes` empty) or updates a queue's configuration; returns all of it.
    pub async fn queue_config(
        &self,
        queue: &str,
        changes: QueueConfigChanges,
    ) -> Result<QueueConfig, CoreError> {
        validate::check_queue_name(queue)?;
        let row = validate::queue_config_changes(&changes)?;
        self.store.queue_config(queue, &row).await
    }

    /// A page of the queue namespaces in `scope`, in name order; with `count_available`, each
    /// with the jobs a fetch could claim now.
    pub async fn list_queues(
        &self,
        scope: &Scope,
        count_available: bool,
        page: &page::PageRequest,
    ) -> Result<page::Page<QueueSummary>, CoreError> {
        let spec = page.check()?;
        let mut queues = self
            .store
            .list_queues(
                scope,
                count_available,
                spec.after.as_deref(),
                Some(spec.limit + 1),
            )
            .await?;
        let total = self.store.count_queues(scope).await?;
        Ok(spec.finish(&mut queues, total, |q| q.name.as_str()))
    }

    /// One queue namespace's summary (the adapters admitted the queue it names).
    pub async fn queue_summary(&self, queue: &str) -> Result<QueueSummary, CoreError> {
        validate::check_queue_name(queue)?;
        self.store
            .list_queues(&Scope::all(), false, None, None)
            .await?
            .into_iter()
            .find(|q| q.name == queue)
            .ok_or_else(|| CoreError::not_found("queue", queue))
    }
}
