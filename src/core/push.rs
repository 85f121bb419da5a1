//! Push delivery over long-lived streams, in core types (the adapters convert): `jobs` (claims
//! like a fetch under a cap on unacknowledged jobs; gRPC `StreamJobs`), `events` and
//! `follow_events` (the event log tailed with a cursor; gRPC `StreamEvents`, HTTP server-sent
//! events) and `batches` (a consumer's batches, one at a time; gRPC `ReceiveStream`).
//!
//! Each stream is a loop driven by the response body: when the client goes away the body, and
//! with it the loop, is dropped, so nothing more is claimed (jobs it had claimed come back when
//! their lease ends). A core error ends the stream with that error; server shutdown ends it with
//! `unavailable` once what was already claimed has been handed over; the revocation of the token
//! that opened it ends it with `unauthenticated` at once. Waiting uses the long polls
//! of `Service::fetch` and `Service::receive` (LISTEN/NOTIFY wake-ups), and short polls for what
//! has no notification (acks, the event log).

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures_util::{Stream, StreamExt};
use serde_json::Value;
use tokio::sync::watch;
use tokio::time::Instant;
use uuid::Uuid;

use crate::core::events::{Cursor, Event, EventQuery, parse_cursor};
use crate::core::stream::{Batch, MAX_RECEIVE_WAIT_MS, Receive};
use crate::core::validate::parse_job_id;
use crate::core::{CoreError, ErrorKind, FetchJobs, Job, JobState, Scope, Service, StreamSlot};
use crate::store::tokens::TokenCheck;

/// How often a `StreamJobs` stream at its cap looks for acks, nacks and cancels in the event log.
pub const SETTLE_INTERVAL: Duration = Duration::from_millis(250);
/// How often a `StreamJobs` stream at its cap re-reads its outstanding jobs (lease expiries, gaps).
pub const SWEEP_INTERVAL: Duration = Duration::from_secs(2);
/// Pause between claims when the long poll could not wait (none of the queues exists yet).
pub const IDLE_POLL: Duration = Duration::from_millis(250);
/// Most unacknowledged jobs one `StreamJobs` stream may hold.
pub const MAX_CONCURRENT: i32 = 1000;
/// How often an event stream polls the event log.
pub const EVENT_POLL_INTERVAL: Duration = Duration::from_millis(250);
/// An event stream sends a keepalive this often (the gRPC binding asks for at most 30 s, the
/// OJS real-time extension for at most 15 s).
pub const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(15);
/// How often `ReceiveStream` re-checks whether the batch it sent is still active.
pub const BATCH_RECHECK: Duration = Duration::from_millis(200);
/// How often a stream asks whether its token is still live (from the gateway's token cache,
/// which a revocation invalidates at once; without a listener its answers last 500 ms), so a
/// revoked token's streams end within a second, as its requests are refused.
pub const REVOCATION_CHECK: Duration = Duration::from_millis(250);

/// Page size when reading the event log.
const EVENT_PAGE: i64 = 1000;
/// Most event pages one poll reads while its filters leave nothing to hand over.
const MAX_PAGES: usize = 20;
/// Outstanding jobs re-read at once by a sweep.
const SWEEP_PARALLELISM: usize = 4;
/// Jobs whose workflow an event stream remembers before forgetting them all.
const WORKFLOW_CACHE: usize = 10_000;
/// Events that end (or take over) a claim.
const SETTLING_EVENTS: [&str; 4] = [
    "job.completed",
    "job.failed",
    "job.cancelled",
    "job.started",
];

/// What ends a stream from outside: the server's shutdown and, with auth on, the revocation
/// of the token that opened it (re-checked every `REVOCATION_CHECK`). Without a signal wired
/// the shutdown never fires; without a token nothing is re-checked.
#[derive(Clone, Debug, Default)]
pub struct Shutdown {
    signal: Option<watch::Receiver<bool>>,
    token: Option<TokenCheck>,
    next_check: Option<Instant>,
}

impl Shutdown {
    /// Fires once `signal` holds true.
    pub fn new(signal: watch::Receiver<bool>) -> Self {
        Shutdown {
            signal: Some(signal),
            ..Shutdown::default()
        }
    }

    /// Also ends the stream once `token` (the one the stream was opened with) is revoked.
    pub fn with_token(mut self, token: Option<TokenCheck>) -> Self {
        self.token = token;
        self.next_check = None;
        self
    }

    /// Resolves when the server starts shutting down.
    pub async fn requested(&mut self) {
        requested(&mut self.signal).await;
    }

    /// Whether the server has started shutting down.
    pub fn is_requested(&self) -> bool {
        self.signal.as_ref().is_some_and(|signal| *signal.borrow())
    }

    /// Resolves when the stream must end, with the error that ends it: `unavailable` at
    /// shutdown, `unauthenticated` once its token is revoked.
    pub async fn ended(&mut self) -> CoreError {
        tokio::select! {
            biased;
            () = requested(&mut self.signal) => shutting_down(),
            () = revoked(&self.token, &mut self.next_check) => token_revoked(),
        }
    }

    /// `unauthenticated` when a re-check of the token is due and finds it revoked (or one is
    /// not due, `None`): between items, so a stream with more to hand over stops all the same.
    async fn revoked_now(&mut self) -> Option<CoreError> {
        let token = self.token.as_ref()?;
        if self.next_check.is_some_and(|at| Instant::now() < at) {
            return None;
        }
        let live = token.is_live().await;
        self.next_check = Some(Instant::now() + REVOCATION_CHECK);
        (!live).then(token_revoked)
    }
}

/// Resolves when the server starts shutting down; never without a signal or once its sender
/// is gone (no shutdown will be announced then).
async fn requested(signal: &mut Option<watch::Receiver<bool>>) {
    let fired = match signal {
        Some(signal) => signal.wait_for(|stop| *stop).await.is_ok(),
        None => false,
    };
    if !fired {
        std::future::pending::<()>().await;
    }
}

/// Resolves when a re-check finds `token` revoked; never without one. `next_check` survives
/// the future, so re-creating it each step neither delays nor repeats a check.
async fn revoked(token: &Option<TokenCheck>, next_check: &mut Option<Instant>) {
    let Some(token) = token else {
        return std::future::pending::<()>().await;
    };
    loop {
        if let Some(at) = *next_check {
            tokio::time::sleep_until(at).await;
        }
        let live = token.is_live().await;
        *next_check = Some(Instant::now() + REVOCATION_CHECK);
        if !live {
            return;
        }
    }
}

fn token_revoked() -> CoreError {
    CoreError::new(ErrorKind::Unauthenticated, "the token was revoked")
}

fn shutting_down() -> CoreError {
    CoreError::new(ErrorKind::Unavailable, "the server is shutting down")
}

/// One push loop: each step waits for the next items (possibly none); an error ends the stream.
trait Pump: Send + 'static {
    type Item: Send + 'static;
    fn step(&mut self) -> impl Future<Output = Result<Vec<Self::Item>, CoreError>> + Send;
}

/// The stream of a pump's items, starting with `first`; ends after an error, at shutdown or
/// once the token that opened it is revoked. The stream holds `slot` (its place under
/// `max_streams`) until it is dropped.
fn drive<P: Pump>(
    pump: P,
    first: Vec<P::Item>,
    shutdown: Shutdown,
    slot: StreamSlot,
) -> impl Stream<Item = Result<P::Item, CoreError>> + Send + 'static {
    let state = ((pump, slot), VecDeque::from(first), shutdown, false);
    futures_util::stream::unfold(
        state,
        |((mut pump, slot), mut ready, mut shutdown, done)| async move {
            if done {
                return None;
            }
            // A revoked token gets nothing more, not even what was already claimed.
            if let Some(e) = shutdown.revoked_now().await {
                return Some((Err(e), ((pump, slot), ready, shutdown, true)));
            }
            loop {
                // What was already produced (claimed jobs) is handed over before anything else.
                if let Some(item) = ready.pop_front() {
                    return Some((Ok(item), ((pump, slot), ready, shutdown, false)));
                }
                // The step runs on while the token re-checks find it live.
                let stepped = tokio::select! {
                    biased;
                    e = shutdown.ended() => Err(e),
                    result = pump.step() => result,
                };
                match stepped {
                    Ok(items) => ready.extend(items),
                    Err(e) => return Some((Err(e), ((pump, slot), ready, shutdown, true))),
                }
            }
        },
    )
}

/// The position of the newest event a reader may pass now: the cursor of a stream that only
/// wants what happens from now on.
pub async fn log_end(service: &Service) -> Result<Cursor, CoreError> {
    service.events_end().await
}

// ---------------------------------------------------------------------------------------------
// StreamJobs

/// What a `StreamJobs` client asked for.
#[derive(Debug, Clone, Default)]
pub struct JobStream {
    /// Queues in claim order.
    pub queues: Vec<String>,
    /// The worker claiming (recorded on each job).
    pub worker_id: Option<String>,
    /// Most unacknowledged jobs at once; 0 means 1.
    pub max_concurrent: i32,
}

/// A claim this stream handed out and has not seen settled.
#[derive(Debug, Clone, Copy)]
struct Lease {
    token: Option<Uuid>,
    attempt: i32,
}

struct JobPump {
    service: Arc<Service>,
    queues: Vec<String>,
    worker_id: Option<String>,
    max_concurrent: usize,
    outstanding: HashMap<Uuid, Lease>,
    cursor: Cursor,
    next_sweep: Instant,
}

/// Claims jobs as they become available, never holding more than `max_concurrent` unsettled;
/// a slot frees when its job is acked, nacked or cancelled, or its lease passes to another claim.
/// The first claim happens before this returns, so a bad request fails the call itself.
pub async fn jobs(
    service: Arc<Service>,
    request: JobStream,
    shutdown: Shutdown,
) -> Result<impl Stream<Item = Result<Job, CoreError>> + Send + 'static, CoreError> {
    let max = match request.max_concurrent {
        0 => 1,
        n if (1..=MAX_CONCURRENT).contains(&n) => n,
        n => {
            return Err(CoreError::invalid(format!(
                "max_concurrent must be between 1 and {MAX_CONCURRENT}, not {n}"
            ))
            .with_detail("field", "max_concurrent".into()));
        }
    };
    let slot = service.stream_slot()?;
    let cursor = log_end(&service).await?;
    let mut pump = JobPump {
        service,
        queues: request.queues,
        worker_id: request.worker_id,
        max_concurrent: max as usize,
        outstanding: HashMap::new(),
        cursor,
        next_sweep: Instant::now(),
    };
    let first = pump.claim(0).await?;
    Ok(drive(pump, first, shutdown, slot))
}

impl JobPump {
    /// Claims up to the free slots, long-polling up to `wait_ms`.
    async fn claim(&mut self, wait_ms: i64) -> Result<Vec<Job>, CoreError> {
        let free = self.max_concurrent.saturating_sub(self.outstanding.len()) as i64;
        let count = free.min(self.service.settings().max_fetch_count).max(1);
        let jobs = self
            .service
            .fetch(FetchJobs {
                queues: self.queues.clone(),
                count: Some(count),
                worker_id: self.worker_id.clone(),
                visibility_timeout_ms: None,
                wait_ms: Some(wait_ms),
            })
            .await?;
        for job in &jobs {
            self.outstanding.insert(
                job.id,
                Lease {
                    token: job.lease_token,
                    attempt: job.attempt,
                },
            );
        }
        Ok(jobs)
    }

    /// Frees the slots of jobs whose claim has ended.
    async fn settle(&mut self) -> Result<(), CoreError> {
        for _ in 0..MAX_PAGES {
            let page = self
                .service
                // The stream's own admitted queues, named in the filter.
                .events(
                    &Scope::all(),
                    EventQuery {
                        after: Some(self.cursor.to_string()),
                        types: SETTLING_EVENTS.iter().map(|t| t.to_string()).collect(),
                        queues: self.queues.clone(),
                        job_types: Vec::new(),
                        limit: Some(EVENT_PAGE),
                    },
                )
                .await?;
            for event in &page.events {
                if let Some(id) = event.job_id
                    && let Some(lease) = self.outstanding.get(&id)
                    && ends_claim(event, lease)
                {
                    self.outstanding.remove(&id);
                }
            }
            self.cursor = page.events.last().map_or(self.cursor, Event::cursor);
            if !page.has_more {
                break;
            }
        }
        if self.outstanding.len() >= self.max_concurrent && Instant::now() >= self.next_sweep {
            self.sweep().await?;
            self.next_sweep = Instant::now() + SWEEP_INTERVAL;
        }
        Ok(())
    }

    /// Re-reads every outstanding job: frees those no longer active under this stream's lease.
    async fn sweep(&mut self) -> Result<(), CoreError> {
        let service = &self.service;
        let checked: Vec<(Uuid, Result<Job, CoreError>)> =
            futures_util::stream::iter(self.outstanding.keys().copied().collect::<Vec<_>>())
                // Jobs this stream claimed itself, from the queues its request was admitted to.
                .map(
                    |id| async move { (id, service.get_job(&Scope::all(), &id.to_string()).await) },
                )
                .buffer_unordered(SWEEP_PARALLELISM)
                .collect()
                .await;
        for (id, result) in checked {
            let ended = match result {
                Ok(job) => {
                    job.state != JobState::Active
                        || self
                            .outstanding
                            .get(&id)
                            .is_some_and(|lease| lease.token != job.lease_token)
                }
                Err(e) if e.kind == ErrorKind::NotFound => true,
                Err(e) => return Err(e),
            };
            if ended {
                self.outstanding.remove(&id);
            }
        }
        Ok(())
    }
}

/// Whether a logged event ends this stream's claim: the same attempt completed, failed or was
/// cancelled, or a later attempt started (the lease expired and another claim took the job).
fn ends_claim(event: &Event, lease: &Lease) -> bool {
    let attempt = event.data.get("attempt").and_then(Value::as_i64);
    let ours = i64::from(lease.attempt);
    match event.event_type.as_str() {
        "job.started" => attempt.is_some_and(|a| a > ours),
        _ => attempt.is_none_or(|a| a >= ours),
    }
}

impl Pump for JobPump {
    type Item = Job;

    async fn step(&mut self) -> Result<Vec<Job>, CoreError> {
        if !self.outstanding.is_empty() {
            self.settle().await?;
        }
        if self.outstanding.len() >= self.max_concurrent {
            tokio::time::sleep(SETTLE_INTERVAL).await;
            return Ok(Vec::new());
        }
        let started = Instant::now();
        let wait_ms = self.service.settings().max_fetch_wait_ms.max(0);
        let jobs = self.claim(wait_ms).await?;
        if jobs.is_empty() && started.elapsed() < IDLE_POLL {
            // The long poll did not wait (no such queue yet): poll instead.
            tokio::time::sleep(IDLE_POLL).await;
        }
        Ok(jobs)
    }
}

// ---------------------------------------------------------------------------------------------
// StreamEvents, server-sent events

/// What a `StreamEvents` client asked for; filters are AND-combined, empty ones match all.
#[derive(Debug, Clone, Default)]
pub struct EventStream {
    /// Queues.
    pub queues: Vec<String>,
    /// Event types.
    pub event_types: Vec<String>,
    /// One job.
    pub job_id: Option<String>,
    /// One workflow's jobs.
    pub workflow_id: Option<String>,
}

/// One item of an event stream.
#[derive(Debug, Clone)]
pub enum Pushed {
    /// A logged event, with its job's workflow when known.
    Logged {
        /// The event.
        event: Event,
        /// The workflow of its job, if any and known.
        workflow_id: Option<String>,
    },
    /// Nothing happened for `KEEPALIVE_INTERVAL`: a sign of life for the client.
    Keepalive,
}

/// Which events an `EventPump` hands over.
#[derive(Debug, Clone, Default)]
struct EventFilter {
    types: Vec<String>,
    queues: Vec<String>,
    job_types: Vec<String>,
    job_id: Option<Uuid>,
    workflow_id: Option<String>,
}

struct EventPump {
    service: Arc<Service>,
    /// The queues the client's token may see: the log is read only for them.
    scope: Scope,
    filter: EventFilter,
    page: i64,
    cursor: Cursor,
    next_keepalive: Instant,
    workflows: HashMap<Uuid, Option<String>>,
}

/// Streams the events of queues in `scope` logged from now on that match the filters, and a
/// keepalive every `KEEPALIVE_INTERVAL`. The filters are checked before this returns.
pub async fn events(
    service: Arc<Service>,
    scope: Scope,
    filter: EventStream,
    shutdown: Shutdown,
) -> Result<impl Stream<Item = Result<Pushed, CoreError>> + Send + 'static, CoreError> {
    let job_id = filter.job_id.as_deref().map(parse_job_id).transpose()?;
    scope.require_named(filter.queues.iter().map(String::as_str))?;
    let cursor = log_end(&service).await?;
    let filter = EventFilter {
        types: filter.event_types,
        queues: filter.queues,
        job_types: Vec::new(),
        job_id,
        workflow_id: filter.workflow_id,
    };
    start_events(service, scope, filter, EVENT_PAGE, cursor, shutdown).await
}

/// Streams the events of queues in `scope` after `query.after` that match its filters (those of
/// an event page), then
/// every matching event as it is logged, and a keepalive every `KEEPALIVE_INTERVAL`. Without a
/// cursor it starts at the end of the log (only what happens from now on). `query.limit` is the
/// page size of each read of the log. The cursor and filters are checked, and the first read
/// made, before this returns, so a bad request fails the call itself.
pub async fn follow_events(
    service: Arc<Service>,
    scope: Scope,
    query: EventQuery,
    shutdown: Shutdown,
) -> Result<impl Stream<Item = Result<Pushed, CoreError>> + Send + 'static, CoreError> {
    scope.require_named(query.queues.iter().map(String::as_str))?;
    let cursor = match query.after.as_deref() {
        Some(text) => parse_cursor(Some(text))?,
        None => log_end(&service).await?,
    };
    let filter = EventFilter {
        types: query.types,
        queues: query.queues,
        job_types: query.job_types,
        job_id: None,
        workflow_id: None,
    };
    let page = query.limit.unwrap_or(EVENT_PAGE);
    start_events(service, scope, filter, page, cursor, shutdown).await
}

/// The pump after `cursor`; its first read (which checks the filters) happens before it returns.
async fn start_events(
    service: Arc<Service>,
    scope: Scope,
    filter: EventFilter,
    page: i64,
    cursor: Cursor,
    shutdown: Shutdown,
) -> Result<impl Stream<Item = Result<Pushed, CoreError>> + Send + 'static, CoreError> {
    let slot = service.stream_slot()?;
    let mut pump = EventPump {
        service,
        scope,
        filter,
        page,
        cursor,
        next_keepalive: Instant::now() + KEEPALIVE_INTERVAL,
        workflows: HashMap::new(),
    };
    let (first, _) = pump.poll().await?;
    Ok(drive(pump, first, shutdown, slot))
}

/// The workflow id an event names in its data, if any.
fn workflow_in_data(event: &Event) -> Option<String> {
    event
        .data
        .get("workflow_id")
        .and_then(Value::as_str)
        .map(str::to_string)
}

impl EventPump {
    /// The workflow of an event's job: from the event's data, else from the job (remembered).
    async fn workflow_of(&mut self, event: &Event) -> Result<Option<String>, CoreError> {
        if let Some(id) = workflow_in_data(event) {
            return Ok(Some(id));
        }
        let Some(job_id) = event.job_id else {
            return Ok(None);
        };
        if let Some(known) = self.workflows.get(&job_id) {
            return Ok(known.clone());
        }
        let workflow = match self.service.get_job(&self.scope, &job_id.to_string()).await {
            Ok(job) => job.workflow_id.map(|w| w.to_string()),
            Err(e) if e.kind == ErrorKind::NotFound => None,
            Err(e) => return Err(e),
        };
        if self.workflows.len() >= WORKFLOW_CACHE {
            self.workflows.clear();
        }
        self.workflows.insert(job_id, workflow.clone());
        Ok(workflow)
    }

    /// Reads the log after the cursor; true in the second place when more may be waiting.
    async fn poll(&mut self) -> Result<(Vec<Pushed>, bool), CoreError> {
        let mut found = Vec::new();
        for _ in 0..MAX_PAGES {
            let page = self
                .service
                .events(
                    &self.scope,
                    EventQuery {
                        after: Some(self.cursor.to_string()),
                        types: self.filter.types.clone(),
                        queues: self.filter.queues.clone(),
                        job_types: self.filter.job_types.clone(),
                        limit: Some(self.page),
                    },
                )
                .await?;
            self.cursor = page.events.last().map_or(self.cursor, Event::cursor);
            for event in page.events {
                if self.filter.job_id.is_some() && event.job_id != self.filter.job_id {
                    continue;
                }
                let workflow_id = match self.filter.workflow_id.clone() {
                    Some(wanted) => match self.workflow_of(&event).await? {
                        Some(w) if w == wanted => Some(w),
                        _ => continue,
                    },
                    None => workflow_in_data(&event),
                };
                found.push(Pushed::Logged { event, workflow_id });
            }
            if !page.has_more {
                return Ok((found, false));
            }
            // One page found is handed over before the next is read: a stream holds at most a
            // page of events (pages the filters empty are read on, up to MAX_PAGES).
            if !found.is_empty() {
                return Ok((found, true));
            }
        }
        Ok((found, true))
    }
}

impl Pump for EventPump {
    type Item = Pushed;

    async fn step(&mut self) -> Result<Vec<Pushed>, CoreError> {
        let (mut found, more) = self.poll().await?;
        let now = Instant::now();
        if now >= self.next_keepalive {
            found.push(Pushed::Keepalive);
            self.next_keepalive = now + KEEPALIVE_INTERVAL;
        }
        if found.is_empty() && !more {
            tokio::time::sleep_until((now + EVENT_POLL_INTERVAL).min(self.next_keepalive)).await;
        }
        Ok(found)
    }
}

// ---------------------------------------------------------------------------------------------
// ReceiveStream

struct BatchPump {
    service: Arc<Service>,
    queue: String,
    consumer: String,
    member: Option<String>,
    max: Option<i64>,
    max_bytes: Option<i64>,
    /// The batch sent last while it may still be active.
    sent: Option<Uuid>,
}

/// Sends a consumer's batches as they become available, the next one only once the previous is
/// no longer active (acked, or taken over). The first receive happens before this returns.
pub async fn batches(
    service: Arc<Service>,
    queue: String,
    receive: Receive,
    shutdown: Shutdown,
) -> Result<impl Stream<Item = Result<Batch, CoreError>> + Send + 'static, CoreError> {
    let slot = service.stream_slot()?;
    let mut pump = BatchPump {
        service,
        queue,
        consumer: receive.consumer,
        member: receive.member,
        max: receive.max,
        max_bytes: receive.max_bytes,
        sent: None,
    };
    let first = pump.receive(0).await?;
    Ok(drive(pump, first, shutdown, slot))
}

impl BatchPump {
    async fn receive(&mut self, wait_ms: i64) -> Result<Vec<Batch>, CoreError> {
        let receive = Receive {
            consumer: self.consumer.clone(),
            member: self.member.clone(),
            max: self.max,
            max_bytes: self.max_bytes,
            wait_ms: Some(wait_ms),
        };
        let batch = self.service.receive(&self.queue, receive, || {}).await?;
        self.sent = batch.as_ref().map(|b| b.id);
        Ok(batch.into_iter().collect())
    }

    /// Whether the batch sent last is still active; reads its state only, not its events.
    async fn still_active(&self, id: Uuid) -> Result<bool, CoreError> {
        match self.service.batch_is_active(&self.queue, id).await {
            // Gone (consumer or queue removed): the next receive tells what holds now.
            Err(e) if e.kind == ErrorKind::NotFound => Ok(false),
            other => other,
        }
    }
}

impl Pump for BatchPump {
    type Item = Batch;

    async fn step(&mut self) -> Result<Vec<Batch>, CoreError> {
        if let Some(id) = self.sent {
            if self.still_active(id).await? {
                tokio::time::sleep(BATCH_RECHECK).await;
                return Ok(Vec::new());
            }
            self.sent = None;
        }
        self.receive(MAX_RECEIVE_WAIT_MS).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(event_type: &str, attempt: Option<i64>) -> Event {
        Event {
            txid: 1,
            seq: 1,
            id: Uuid::nil(),
            event_type: event_type.to_string(),
            job_id: Some(Uuid::nil()),
            queue: Some("q".to_string()),
            job_type: Some("t".to_string()),
            data: attempt.map_or(Value::Null, |a| serde_json::json!({ "attempt": a })),
            time: chrono::Utc::now(),
        }
    }

    #[test]
    fn a_claim_ends_on_its_own_settlement_or_a_later_claim() {
        let lease = Lease {
            token: None,
            attempt: 2,
        };
        assert!(ends_claim(&event("job.completed", Some(2)), &lease));
        assert!(ends_claim(&event("job.failed", Some(2)), &lease));
        assert!(ends_claim(&event("job.cancelled", None), &lease));
        // An earlier attempt's failure, logged before this claim, does not end it.
        assert!(!ends_claim(&event("job.failed", Some(1)), &lease));
        // Its own start does not; a later attempt's start (lease expired, reclaimed) does.
        assert!(!ends_claim(&event("job.started", Some(2)), &lease));
        assert!(ends_claim(&event("job.started", Some(3)), &lease));
    }
}
