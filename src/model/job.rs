//! Jobs in the domain's own terms: states, retry policy, and the requests of the worker protocol.

use chrono::{DateTime, SecondsFormat, Utc};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use uuid::Uuid;

use super::time::{format_duration_ms, parse_duration_ms, parse_time};

/// The eight OJS job states.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum JobState {
    /// Waiting for its `scheduled_at`.
    Scheduled,
    /// Ready to be claimed.
    Available,
    /// Held until activated.
    Pending,
    /// Claimed by a worker under a lease.
    Active,
    /// Acknowledged.
    Completed,
    /// Failed, waiting for its next attempt.
    Retryable,
    /// Cancelled before completion.
    Cancelled,
    /// Failed for good.
    Discarded,
}

impl JobState {
    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            JobState::Scheduled => "scheduled",
            JobState::Available => "available",
            JobState::Pending => "pending",
            JobState::Active => "active",
            JobState::Completed => "completed",
            JobState::Retryable => "retryable",
            JobState::Cancelled => "cancelled",
            JobState::Discarded => "discarded",
        }
    }

    /// Parses a wire name.
    pub fn parse(name: &str) -> Option<JobState> {
        Some(match name {
            "scheduled" => JobState::Scheduled,
            "available" => JobState::Available,
            "pending" => JobState::Pending,
            "active" => JobState::Active,
            "completed" => JobState::Completed,
            "retryable" => JobState::Retryable,
            "cancelled" => JobState::Cancelled,
            "discarded" => JobState::Discarded,
            _ => return None,
        })
    }
}

/// A retry policy with every default filled in; stored with the job in this shape.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RetryPolicy {
    /// Total attempts including the first.
    pub max_attempts: i32,
    /// Delay before the first retry.
    pub initial_interval_ms: i64,
    /// Growth factor of exponential backoff (≥ 1).
    pub backoff_coefficient: f64,
    /// Cap on any delay.
    pub max_interval_ms: i64,
    /// Whether delays are multiplied by a random factor in [0.5, 1.5).
    pub jitter: bool,
    /// Error codes/types (exact or `prefix.*`) that are never retried.
    pub non_retryable_errors: Vec<String>,
    /// `discard` or `dead_letter`.
    pub on_exhaustion: String,
    /// `exponential`, `linear` or `constant`.
    pub backoff_type: String,
}

impl RetryPolicy {
    /// The policy as a job row keeps it: NULL for the default policy (nearly every job's), which
    /// SQL and the row reader take as the defaults, so the row a job rewrites at each transition
    /// does not carry ~240 bytes of JSON that say nothing.
    pub fn stored(&self) -> Value {
        if *self == RetryPolicy::default() {
            Value::Null
        } else {
            serde_json::to_value(self).unwrap_or(Value::Null)
        }
    }
}

impl RetryPolicy {
    /// The policy as stored: NULL, or anything that does not read as a policy, is the default.
    pub fn from_stored(stored: Option<Value>) -> RetryPolicy {
        // JSON null is the default without a failed parse (whose error message costs an
        // allocation per job in a batch).
        stored
            .filter(|r| !r.is_null())
            .and_then(|r| serde_json::from_value::<RetryPolicy>(r).ok())
            .unwrap_or_default()
    }
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            max_attempts: 3,
            initial_interval_ms: 1000,
            backoff_coefficient: 2.0,
            max_interval_ms: 300_000,
            jitter: true,
            non_retryable_errors: Vec::new(),
            on_exhaustion: "discard".to_string(),
            backoff_type: "exponential".to_string(),
        }
    }
}

/// A stored job.
#[derive(Debug, Clone, PartialEq)]
pub struct Job {
    /// Lowercase UUID (v7 when the server made it).
    pub id: Uuid,
    /// The queue holding it.
    pub queue: String,
    /// The job type, e.g. `email.send`.
    pub job_type: String,
    /// Positional arguments.
    pub args: Vec<Value>,
    /// Caller metadata.
    pub meta: Option<Map<String, Value>>,
    /// Top-level fields the caller sent that OJS does not name (and `schema`), echoed back.
    pub extra: Map<String, Value>,
    /// The state a reader should see.
    pub state: JobState,
    /// The state before the last cancel or ack/nack.
    pub previous_state: Option<JobState>,
    /// Higher first; −100..100.
    pub priority: i32,
    /// Attempts started so far.
    pub attempt: i32,
    /// Attempts allowed in all.
    pub max_attempts: i32,
    /// Server-side bound on one attempt's lease.
    pub timeout_ms: Option<i64>,
    /// The job's own lease length, if set.
    pub visibility_timeout_ms: Option<i64>,
    /// The retry policy.
    pub retry: RetryPolicy,
    /// The unique policy as given (stored, not enforced yet).
    pub unique: Option<Value>,
    /// Tags.
    pub tags: Vec<String>,
    /// When it was stored.
    pub created_at: DateTime<Utc>,
    /// When it became available.
    pub enqueued_at: Option<DateTime<Utc>>,
    /// When it was scheduled to become available.
    pub scheduled_at: Option<DateTime<Utc>>,
    /// After this it is never claimed.
    pub expires_at: Option<DateTime<Utc>>,
    /// When the current or last attempt started.
    pub started_at: Option<DateTime<Utc>>,
    /// When it completed or was discarded.
    pub completed_at: Option<DateTime<Utc>>,
    /// When it was cancelled.
    pub cancelled_at: Option<DateTime<Utc>>,
    /// The current lease token while active.
    pub lease_token: Option<Uuid>,
    /// When the current lease ends.
    pub lease_expires_at: Option<DateTime<Utc>>,
    /// The worker holding or last holding it.
    pub worker_id: Option<String>,
    /// The ack result.
    pub result: Option<Value>,
    /// The last failure.
    pub error: Option<Value>,
    /// Failure history, oldest first.
    pub errors: Vec<Value>,
    /// The backoff computed at the last retryable failure.
    pub retry_delay_ms: Option<i64>,
    /// When a retryable job becomes due again.
    pub run_at: Option<DateTime<Utc>>,
    /// The workflow this job is a step of.
    pub workflow_id: Option<Uuid>,
    /// Results of the steps before it (chain workflows).
    pub parent_results: Option<Value>,
}

/// A validated new job as the enqueue functions store it: `s3p.job`'s field names, serialized
/// once into the statement's JSON argument (`jsonb_populate_recordset` reads it).
#[derive(Debug, Clone, Serialize)]
pub struct NewJob {
    /// Its id: the client's, or minted.
    pub id: Uuid,
    /// Whether the server minted the id (it then carries its queue: no `s3p.job_index` row).
    pub id_minted: bool,
    /// The queue to store it in.
    pub queue: String,
    /// The job type.
    #[serde(rename = "type")]
    pub job_type: String,
    /// Positional arguments.
    pub args: Vec<Value>,
    /// Metadata (with the producer's trace context).
    pub meta: Option<Map<String, Value>>,
    /// Top-level fields OJS does not name, echoed back.
    pub extra: Map<String, Value>,
    /// `pending` or `available`; SQL makes a job due later `scheduled`.
    pub state: &'static str,
    /// Higher first.
    pub priority: i64,
    /// Attempts allowed in all.
    pub max_attempts: i32,
    /// Server-side bound on one attempt's lease.
    pub timeout_ms: Option<i64>,
    /// The job's own lease length.
    pub visibility_timeout_ms: Option<i64>,
    /// The retry policy as stored (NULL for the default, see [`RetryPolicy::stored`]).
    pub retry: Value,
    /// The unique policy, normalised.
    pub uniq: Option<Value>,
    /// The unique key the policy computes.
    pub unique_key: Option<String>,
    /// Tags.
    pub tags: Vec<String>,
    /// When it becomes available.
    pub scheduled_at: Option<DateTime<Utc>>,
    /// After this it is never claimed.
    pub expires_at: Option<DateTime<Utc>>,
    /// Failure history: empty.
    pub errors: Vec<Value>,
    /// The queue's claim rate limit this job sets, if it sets one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rate_limit_per_second: Option<f64>,
}

impl NewJob {
    /// Whether the queue's own `insert_jobs` may store it: no unique key and no rate-limit
    /// setting, whose checks take `s3p.enqueue`'s per-job path.
    pub fn is_plain(&self) -> bool {
        self.unique_key.is_none() && self.rate_limit_per_second.is_none()
    }
}

/// What a batch ack answers for each job it completed: the job's new state and times, without
/// its payload (the server reads back only these columns).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Completion {
    /// The job.
    pub id: Uuid,
    /// The queue holding it.
    pub queue: String,
    /// Its state after the ack (`completed`).
    pub state: JobState,
    /// When the attempt the ack ended started.
    pub started_at: Option<DateTime<Utc>>,
    /// When it completed.
    pub completed_at: Option<DateTime<Utc>>,
}

impl From<&Job> for Completion {
    fn from(job: &Job) -> Completion {
        Completion {
            id: job.id,
            queue: job.queue.clone(),
            state: job.state,
            started_at: job.started_at,
            completed_at: job.completed_at,
        }
    }
}

/// A stored job and whether this request created it (false: a unique job answered with the
/// existing one).
#[derive(Debug, Clone)]
pub struct Enqueued {
    /// The job.
    pub job: Job,
    /// Whether it is new.
    pub created: bool,
}

/// Options of an enqueue request, as either protocol carries them (and as cron templates store them).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct JobOptions {
    /// Target queue; `default` when absent.
    pub queue: Option<String>,
    /// Priority, −100..100.
    pub priority: Option<i64>,
    /// Bound on one attempt, ms.
    pub timeout_ms: Option<i64>,
    /// Lease length, ms.
    pub visibility_timeout_ms: Option<i64>,
    /// When the job becomes due.
    pub scheduled_at: Option<JobTime>,
    /// When the job expires undelivered.
    pub expires_at: Option<JobTime>,
    /// Retry policy in any accepted spelling.
    pub retry: Option<Value>,
    /// Unique policy.
    pub unique: Option<Value>,
    /// Tags.
    pub tags: Option<Vec<String>>,
    /// Enqueue as `pending`.
    pub pending: bool,
    /// Merged into meta.
    pub metadata: Option<Map<String, Value>>,
    /// `{max_per_second}`: the queue's claim rate.
    pub rate_limit: Option<Value>,
}

/// A job option's time: an instant, or a span after the enqueue. Its text (`Display`, and its
/// serde form, in which cron templates keep it) is RFC 3339 or `+` and an ISO-8601 duration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JobTime {
    /// This instant.
    At(DateTime<Utc>),
    /// This many milliseconds after the enqueue.
    After(i64),
}

impl JobTime {
    /// Reads the text form; `None` when it is neither an RFC 3339 time with a zone nor `+PT..`.
    pub fn parse(text: &str) -> Option<JobTime> {
        match text.strip_prefix('+') {
            Some(relative) => parse_duration_ms(relative).map(JobTime::After),
            None => parse_time(text).map(JobTime::At),
        }
    }
}

impl std::fmt::Display for JobTime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            JobTime::At(t) => f.write_str(&t.to_rfc3339_opts(SecondsFormat::AutoSi, true)),
            JobTime::After(ms) => write!(f, "+{}", format_duration_ms(*ms)),
        }
    }
}

impl Serialize for JobTime {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for JobTime {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        JobTime::parse(&text).ok_or_else(|| {
            serde::de::Error::custom(format!(
                "{text:?} is neither an RFC 3339 time nor a +ISO-8601 duration"
            ))
        })
    }
}

/// A job to enqueue.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct EnqueueJob {
    /// Caller id, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// Job type.
    #[serde(rename = "type")]
    pub job_type: String,
    /// Positional arguments.
    pub args: Vec<Value>,
    /// Metadata.
    pub meta: Option<Map<String, Value>>,
    /// Unknown top-level fields to keep.
    pub extra: Map<String, Value>,
    /// Options.
    pub options: JobOptions,
    /// The producer's W3C trace context, stored in meta so workers can link to it.
    #[serde(skip)]
    pub trace_context: Option<TraceContext>,
}

/// A new job id the server mints for a job of `queue`: a UUIDv7 whose last three bytes are the
/// queue's tag (the first three bytes of the SHA-256 of its name; `s3p.queue_id_tag` in SQL
/// computes the same), so the database finds the job by its id without a cross-queue index.
pub fn mint_job_id(queue: &str) -> Uuid {
    use sha2::{Digest, Sha256};
    let tag = Sha256::digest(queue.as_bytes());
    let mut bytes = Uuid::now_v7().into_bytes();
    bytes[13..16].copy_from_slice(&tag[..3]);
    Uuid::from_bytes(bytes)
}

/// The queue of a job that names none.
pub const DEFAULT_QUEUE: &str = "default";

/// The queue a job lands in: the one it names, else `DEFAULT_QUEUE`.
pub fn queue_or_default(named: Option<&str>) -> &str {
    named.unwrap_or(DEFAULT_QUEUE)
}

impl EnqueueJob {
    /// The queue the job lands in: `options.queue`, else `default`.
    pub fn queue(&self) -> &str {
        queue_or_default(self.options.queue.as_deref())
    }
}

/// W3C trace context as a request carried it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceContext {
    /// `traceparent`.
    pub parent: String,
    /// `tracestate`.
    pub state: Option<String>,
}

/// A worker's request for jobs.
#[derive(Debug, Clone, Default)]
pub struct FetchJobs {
    /// Queues in claim order.
    pub queues: Vec<String>,
    /// How many jobs at most (default 1).
    pub count: Option<i64>,
    /// Who is asking.
    pub worker_id: Option<String>,
    /// Lease length for these claims.
    pub visibility_timeout_ms: Option<i64>,
    /// Long-poll bound when nothing is ready.
    pub wait_ms: Option<i64>,
}

/// A worker's completion of a job.
#[derive(Debug, Clone, Default)]
pub struct AckJob {
    /// The job.
    pub job_id: String,
    /// The lease being answered.
    pub lease_token: Option<String>,
    /// The job's result.
    pub result: Option<Value>,
}

/// What a worker reports when a job fails.
#[derive(Debug, Clone, Default)]
pub struct Failure {
    /// Error code, e.g. `handler_error`.
    pub code: Option<String>,
    /// Error type/class name.
    pub error_type: Option<String>,
    /// Message.
    pub message: String,
    /// `false` discards at once.
    pub retryable: Option<bool>,
    /// Structured details.
    pub details: Option<Map<String, Value>>,
    /// Stack trace, as given.
    pub backtrace: Option<Value>,
}

/// A worker's failure report for a job.
#[derive(Debug, Clone, Default)]
pub struct NackJob {
    /// The job.
    pub job_id: String,
    /// The lease being answered.
    pub lease_token: Option<String>,
    /// The failure.
    pub failure: Failure,
    /// Put the job straight back as available.
    pub requeue: bool,
}

/// A queue namespace.
#[derive(Debug, Clone, PartialEq)]
pub struct QueueSummary {
    /// Queue name.
    pub name: String,
    /// Whether delivery is paused.
    pub paused: bool,
    /// When the namespace was created.
    pub created_at: DateTime<Utc>,
    /// Jobs a fetch could claim now, when counted.
    pub available: Option<i64>,
}

/// A worker's heartbeat.
#[derive(Debug, Clone, Default)]
pub struct Heartbeat {
    /// The worker.
    pub worker_id: String,
    /// Jobs it holds.
    pub job_ids: Vec<String>,
    /// With a single job: the lease it holds.
    pub lease_token: Option<String>,
    /// New lease length.
    pub visibility_timeout_ms: Option<i64>,
}

/// What the server tells a worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum WorkerDirective {
    /// Keep working.
    Running,
    /// Finish current jobs, fetch no more.
    Quiet,
    /// Stop now.
    Terminate,
}

impl WorkerDirective {
    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            WorkerDirective::Running => "running",
            WorkerDirective::Quiet => "quiet",
            WorkerDirective::Terminate => "terminate",
        }
    }
}

/// The answer to a heartbeat.
#[derive(Debug, Clone)]
pub struct HeartbeatOutcome {
    /// The directive.
    pub directive: WorkerDirective,
    /// Jobs whose leases were extended, with their new lease ends.
    pub extended: Vec<(Uuid, DateTime<Utc>)>,
}

/// A page of dead letters.
#[derive(Debug, Clone)]
pub struct DeadLetterPage {
    /// The jobs.
    pub jobs: Vec<Job>,
    /// How many there are in all.
    pub total: i64,
    /// The offset of this page.
    pub offset: i64,
    /// The page size asked for.
    pub limit: i64,
}

impl DeadLetterPage {
    /// Where the next page starts; `None` on the last page.
    pub fn next_offset(&self) -> Option<i64> {
        let next = self.offset + self.jobs.len() as i64;
        (next < self.total).then_some(next)
    }
}

/// What one maintenance pass did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MaintenanceReport {
    /// Whether this gateway ran it (another may hold the pass).
    pub ran: bool,
    /// Expired leases released (available again, or discarded when exhausted).
    pub released: i64,
    /// Unstarted jobs discarded past expires_at.
    pub expired: i64,
    /// Terminal jobs removed after their retention.
    pub removed: i64,
    /// Stream retries moved back into the log.
    pub retries_moved: i64,
    /// Stream segments rotated.
    pub rotations: i64,
    /// Jobs tables vacuumed because dead row versions piled up.
    pub vacuums: i64,
    /// Steps that failed and were skipped: a queue's name, or "" for the shared step.
    pub failed_steps: Vec<String>,
    /// Queues stepped through (those due, not every queue).
    pub queues_stepped: i64,
}
