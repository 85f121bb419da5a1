//! Wire forms of the Admin API's workers, statistics and system answers.

use super::api::types;
use crate::core::admin_system::stats::HistoryQuery;
use crate::model::admin_system::{
    ActiveLease, AggregateStats, MaintenanceState, StatsPoint, WorkerCounts, WorkerInfo, WorkerPage,
};
use crate::model::time::format_time;

fn lease(job: &ActiveLease) -> types::AdminWorkerLease {
    types::AdminWorkerLease {
        id: job.id.clone(),
        queue: job.queue.clone(),
        r#type: job.job_type.clone(),
        started_at: job.started_at.as_ref().map(format_time),
        lease_expires_at: job.lease_expires_at.as_ref().map(format_time),
    }
}

/// A worker; `with_jobs` adds its active jobs (detail).
pub fn worker(w: &WorkerInfo, with_jobs: bool) -> types::AdminWorker {
    types::AdminWorker {
        id: w.id.clone(),
        state: w.state.clone(),
        queues: w.queues.clone(),
        active_jobs: w.active_jobs,
        started_at: format_time(&w.started_at),
        // A worker that never heartbeats shows its last fetch: its last sign of life.
        last_heartbeat_at: format_time(w.last_heartbeat_at.as_ref().unwrap_or(&w.last_seen_at)),
        last_seen_at: format_time(&w.last_seen_at),
        jobs: with_jobs.then(|| w.jobs.iter().map(lease).collect()),
    }
}

/// Workers by state.
pub fn summary(c: &WorkerCounts) -> types::AdminWorkerSummary {
    types::AdminWorkerSummary {
        total: c.total,
        running: c.running,
        quiet: c.quiet,
        stale: c.stale,
    }
}

/// A page of workers.
pub fn worker_list(page: &WorkerPage) -> types::AdminWorkerList {
    types::AdminWorkerList {
        items: page.items.iter().map(|w| worker(w, false)).collect(),
        summary: summary(&page.counts),
        pagination: types::AdminPagePagination {
            total: page.counts.total,
            page: page.page,
            per_page: page.per_page,
        },
    }
}

/// Aggregate statistics.
pub fn stats(s: &AggregateStats) -> types::AdminStats {
    types::AdminStats {
        queues: s.queues,
        workers: s.workers.running + s.workers.quiet,
        jobs: s
            .jobs
            .iter()
            .map(|(state, n)| (state.clone(), serde_json::Value::from(*n)))
            .collect(),
        throughput: types::AdminThroughput {
            processed_per_minute: s.processed_per_minute,
            failed_per_minute: s.failed_per_minute,
        },
        uptime_seconds: i64::try_from(s.uptime_seconds).unwrap_or(i64::MAX),
        worker_summary: summary(&s.workers),
    }
}

/// A throughput series.
pub fn history(query: &HistoryQuery, points: &[StatsPoint]) -> types::AdminStatsHistory {
    types::AdminStatsHistory {
        period: query.period.clone(),
        since: format_time(&query.since),
        until: format_time(&query.until),
        queue: query.queue.clone(),
        data: points
            .iter()
            .map(|p| types::AdminStatsPoint {
                timestamp: format_time(&p.timestamp),
                processed: p.processed,
                failed: p.failed,
                enqueued: p.enqueued,
            })
            .collect(),
    }
}

/// Maintenance mode in both vocabularies (the spec's and the admin UI's).
pub fn maintenance(m: &MaintenanceState) -> types::AdminMaintenance {
    let enabled_at = m.enabled_at.as_ref().map(format_time);
    let estimated_end = m.estimated_end.as_ref().map(format_time);
    types::AdminMaintenance {
        maintenance: m.enabled,
        enabled: m.enabled,
        reason: m.reason.clone(),
        enabled_at: enabled_at.clone(),
        started_at: enabled_at,
        estimated_end: estimated_end.clone(),
        ends_at: estimated_end,
    }
}

/// A cron entry in the admin UI's names beside pgvs3's.
pub fn cron(c: &crate::model::workflow::CronEntry) -> types::AdminCron {
    let template = c.template();
    types::AdminCron {
        id: c.name.clone(),
        name: c.name.clone(),
        r#type: template
            .get("type")
            .and_then(serde_json::Value::as_str)
            .unwrap_or_default()
            .to_string(),
        queue: crate::model::job::queue_or_default(
            template
                .get("options")
                .and_then(|o| o.get("queue"))
                .and_then(serde_json::Value::as_str),
        )
        .to_string(),
        schedule: c.expression.clone(),
        expression: c.expression.clone(),
        timezone: c.timezone.clone(),
        overlap_policy: c.overlap_policy.clone(),
        args: template
            .get("args")
            .and_then(serde_json::Value::as_array)
            .cloned(),
        meta: template
            .get("meta")
            .and_then(serde_json::Value::as_object)
            .cloned(),
        enabled: c.enabled,
        status: c.status().to_string(),
        last_run_at: c.last_run_at.as_ref().map(format_time),
        next_run_at: c.next_run_at.as_ref().map(format_time),
        created_at: format_time(&c.created_at),
    }
}

/// A numbered page of cron entries.
pub fn cron_list(page: &crate::core::admin_system::crons::CronPage) -> types::AdminCronList {
    types::AdminCronList {
        items: page.items.iter().map(cron).collect(),
        pagination: types::AdminPagePagination {
            total: page.total,
            page: page.page,
            per_page: page.per_page,
        },
    }
}
