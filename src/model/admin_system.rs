//! What the OJS Admin API reports about workers, throughput and the system: the worker registry,
//! maintenance mode and the per-minute / per-hour throughput rollup.

use chrono::{DateTime, Utc};

/// A worker as the registry knows it.
#[derive(Debug, Clone, PartialEq)]
pub struct WorkerInfo {
    /// The worker id its fetches and heartbeats carry.
    pub id: String,
    /// Queues it fetched from (at most 64).
    pub queues: Vec<String>,
    /// `running`, `quiet` (asked to stop fetching) or `stale` (not seen within the stale interval).
    pub state: String,
    /// When it was first seen.
    pub started_at: DateTime<Utc>,
    /// When it last fetched or heartbeated.
    pub last_seen_at: DateTime<Utc>,
    /// When it last heartbeated, if ever.
    pub last_heartbeat_at: Option<DateTime<Utc>>,
    /// Jobs it holds a lease on (in queues the caller sees).
    pub active_jobs: i64,
    /// The first of those jobs (detail only).
    pub jobs: Vec<ActiveLease>,
}

/// One job a worker holds.
#[derive(Debug, Clone, PartialEq, serde::Deserialize)]
pub struct ActiveLease {
    /// Job id.
    pub id: String,
    /// Its queue.
    pub queue: String,
    /// Its type.
    #[serde(rename = "type")]
    pub job_type: String,
    /// When this attempt started.
    pub started_at: Option<DateTime<Utc>>,
    /// When the lease ends.
    pub lease_expires_at: Option<DateTime<Utc>>,
}

/// Workers by state.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WorkerCounts {
    /// All workers the caller sees.
    pub total: i64,
    /// Seen recently, not quiet.
    pub running: i64,
    /// Asked to stop fetching.
    pub quiet: i64,
    /// Not seen within the stale interval.
    pub stale: i64,
}

/// One page of workers.
#[derive(Debug, Clone, Default)]
pub struct WorkerPage {
    /// The workers, in id order.
    pub items: Vec<WorkerInfo>,
    /// Counts over every worker the caller sees.
    pub counts: WorkerCounts,
    /// 1-based page number.
    pub page: i64,
    /// Page size.
    pub per_page: i64,
}

/// Maintenance mode as stored (one row for every gateway).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct MaintenanceState {
    /// Whether it is on.
    pub enabled: bool,
    /// Why, as the operator said.
    pub reason: Option<String>,
    /// When it was turned on.
    pub enabled_at: Option<DateTime<Utc>>,
    /// When the operator expects it to end.
    pub estimated_end: Option<DateTime<Utc>>,
}

/// One bucket of the throughput history.
#[derive(Debug, Clone, PartialEq)]
pub struct StatsPoint {
    /// Start of the bucket.
    pub timestamp: DateTime<Utc>,
    /// Jobs completed.
    pub processed: i64,
    /// Failed attempts.
    pub failed: i64,
    /// Jobs enqueued (scheduled ones included).
    pub enqueued: i64,
}

/// Aggregate figures across the queues a caller sees.
#[derive(Debug, Clone, Default)]
pub struct AggregateStats {
    /// Queues in scope.
    pub queues: i64,
    /// Jobs by stored state (`available`, `active`, ...), summed over those queues.
    pub jobs: std::collections::BTreeMap<String, i64>,
    /// Completions per minute, over the last five minutes.
    pub processed_per_minute: f64,
    /// Failed attempts per minute, over the last five minutes.
    pub failed_per_minute: f64,
    /// Workers by state.
    pub workers: WorkerCounts,
    /// Seconds since this gateway started.
    pub uptime_seconds: u64,
}
