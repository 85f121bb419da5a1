//! Messages of the Admin API's workers, statistics and system RPCs (`pgvs3.v1.AdminService`).

use super::convert::created_at as timestamp;
use super::proto::pgvs3::v1 as pb;
use crate::model::admin_system::{
    AggregateStats, MaintenanceState, StatsPoint, WorkerCounts, WorkerInfo, WorkerPage,
};

/// A worker; `with_jobs` adds its active jobs.
pub fn worker(w: &WorkerInfo, with_jobs: bool) -> pb::Worker {
    pb::Worker {
        id: w.id.clone(),
        state: w.state.clone(),
        queues: w.queues.clone(),
        active_jobs: w.active_jobs,
        started_at: Some(timestamp(&w.started_at)),
        last_heartbeat_at: w.last_heartbeat_at.as_ref().map(timestamp),
        last_seen_at: Some(timestamp(&w.last_seen_at)),
        jobs: if with_jobs {
            w.jobs
                .iter()
                .map(|j| pb::WorkerLease {
                    id: j.id.clone(),
                    queue: j.queue.clone(),
                    r#type: j.job_type.clone(),
                    started_at: j.started_at.as_ref().map(timestamp),
                    lease_expires_at: j.lease_expires_at.as_ref().map(timestamp),
                })
                .collect()
        } else {
            Vec::new()
        },
    }
}

fn summary(c: &WorkerCounts) -> pb::WorkerSummary {
    pb::WorkerSummary {
        total: c.total,
        running: c.running,
        quiet: c.quiet,
        stale: c.stale,
    }
}

/// A page of workers.
pub fn worker_list(page: &WorkerPage) -> pb::ListWorkersResponse {
    pb::ListWorkersResponse {
        workers: page.items.iter().map(|w| worker(w, false)).collect(),
        summary: Some(summary(&page.counts)),
        total: page.counts.total,
        page: page.page,
        per_page: page.per_page,
    }
}

/// Aggregate statistics.
pub fn stats(s: &AggregateStats) -> pb::GetStatsResponse {
    pb::GetStatsResponse {
        queues: s.queues,
        workers: s.workers.running + s.workers.quiet,
        jobs: s.jobs.iter().map(|(k, v)| (k.clone(), *v)).collect(),
        processed_per_minute: s.processed_per_minute,
        failed_per_minute: s.failed_per_minute,
        uptime_seconds: i64::try_from(s.uptime_seconds).unwrap_or(i64::MAX),
        worker_summary: Some(summary(&s.workers)),
    }
}

/// A throughput series.
pub fn history(period: &str, points: &[StatsPoint]) -> pb::GetStatsHistoryResponse {
    pb::GetStatsHistoryResponse {
        period: period.to_string(),
        data: points
            .iter()
            .map(|p| pb::StatsPoint {
                timestamp: Some(timestamp(&p.timestamp)),
                processed: p.processed,
                failed: p.failed,
                enqueued: p.enqueued,
            })
            .collect(),
    }
}

/// Maintenance mode.
pub fn maintenance(m: &MaintenanceState) -> pb::MaintenanceStatus {
    pb::MaintenanceStatus {
        enabled: m.enabled,
        reason: m.reason.clone().unwrap_or_default(),
        enabled_at: m.enabled_at.as_ref().map(timestamp),
        estimated_end: m.estimated_end.as_ref().map(timestamp),
    }
}
