//! Aggregate statistics and the throughput history. Counts by state come from the snapshot
//! `/metrics` scrapes (`Service::metrics_snapshot`); throughput and history from the rollup of
//! the event log (`s3p.stats_minute`, `s3p.stats_hour`), never from the jobs.

use chrono::{DateTime, Duration, Utc};

use crate::core::{CoreError, Scope, Service, validate};
use crate::model::admin_system::{AggregateStats, StatsPoint};
use crate::model::time::parse_time;

/// Minutes the per-minute throughput of `AggregateStats` averages over.
pub const THROUGHPUT_MINUTES: i32 = 5;
/// The most buckets one history answer holds (a day at one minute).
pub const MAX_BUCKETS: i64 = 1441;
/// The states `AggregateStats.jobs` always names (zero when a queue holds none).
pub const STATES: [&str; 8] = [
    "available",
    "scheduled",
    "pending",
    "active",
    "retryable",
    "completed",
    "cancelled",
    "discarded",
];

/// A checked history request.
#[derive(Debug, Clone)]
pub struct HistoryQuery {
    /// Period as given (`1m`, `5m`, `1h`, `1d`).
    pub period: String,
    /// Its length in seconds.
    pub period_s: i32,
    /// Start of the range.
    pub since: DateTime<Utc>,
    /// End of the range.
    pub until: DateTime<Utc>,
    /// One queue, or all in scope.
    pub queue: Option<String>,
}

fn time_param(field: &str, text: Option<&str>) -> Result<Option<DateTime<Utc>>, CoreError> {
    match text.filter(|t| !t.is_empty()) {
        None => Ok(None),
        Some(t) => parse_time(t).map(Some).ok_or_else(|| {
            CoreError::invalid(format!(
                "{field} must be an RFC 3339 time with a zone, not {t:?}"
            ))
            .with_detail("field", field.into())
        }),
    }
}

/// Checks a history request: period one of 1m/5m/1h/1d (default 5m), since before until
/// (defaults: an hour ago, now), at most `MAX_BUCKETS` buckets, a queue in scope.
pub fn history_query(
    scope: &Scope,
    period: Option<&str>,
    since: Option<&str>,
    until: Option<&str>,
    queue: Option<&str>,
) -> Result<HistoryQuery, CoreError> {
    let period = period.filter(|p| !p.is_empty()).unwrap_or("5m");
    let period_s = match period {
        "1m" => 60,
        "5m" => 300,
        "1h" => 3600,
        "1d" => 86_400,
        other => {
            return Err(CoreError::invalid(format!(
                "period must be one of 1m, 5m, 1h, 1d, not {other:?}"
            ))
            .with_detail("field", "period".into()));
        }
    };
    let now = Utc::now();
    let until = time_param("until", until)?.unwrap_or(now);
    let since = time_param("since", since)?.unwrap_or(until - Duration::hours(1));
    if since >= until {
        return Err(
            CoreError::invalid("since must be before until").with_detail("field", "since".into())
        );
    }
    let buckets = (until - since).num_seconds() / i64::from(period_s) + 1;
    if buckets > MAX_BUCKETS {
        return Err(CoreError::invalid(format!(
            "the range holds {buckets} buckets of {period}; at most {MAX_BUCKETS}: use a longer period or a shorter range"
        ))
        .with_detail("field", "since".into()));
    }
    let queue = queue.filter(|q| !q.is_empty());
    if let Some(q) = queue {
        validate::check_queue_name(q)?;
        scope.require_named([q])?;
    }
    Ok(HistoryQuery {
        period: period.to_string(),
        period_s,
        since,
        until,
        queue: queue.map(str::to_string),
    })
}

impl Service {
    /// Counts by state over the queues in scope, throughput of the last minutes, workers.
    pub async fn aggregate_stats(&self, scope: &Scope) -> Result<AggregateStats, CoreError> {
        let (snapshot, _) = self.metrics_snapshot(scope).await?;
        let mut stats = AggregateStats {
            uptime_seconds: self.started.elapsed().as_secs(),
            ..Default::default()
        };
        for state in STATES {
            stats.jobs.insert(state.to_string(), 0);
        }
        for queue in snapshot
            .get("queues")
            .and_then(serde_json::Value::as_array)
            .into_iter()
            .flatten()
        {
            stats.queues += 1;
            for (state, n) in queue
                .get("jobs")
                .and_then(serde_json::Value::as_object)
                .into_iter()
                .flatten()
            {
                *stats.jobs.entry(state.clone()).or_insert(0) += n.as_i64().unwrap_or(0);
            }
        }
        let (processed, failed) = self.store.stats_recent(scope, THROUGHPUT_MINUTES).await?;
        // The window is the last THROUGHPUT_MINUTES whole minutes and the current one.
        let minutes = f64::from(THROUGHPUT_MINUTES) + 1.0;
        stats.processed_per_minute = processed as f64 / minutes;
        stats.failed_per_minute = failed as f64 / minutes;
        stats.workers = self.store.workers_page(scope, 0, 0).await?.1;
        Ok(stats)
    }

    /// The throughput history of a checked request.
    pub async fn stats_history(
        &self,
        scope: &Scope,
        query: &HistoryQuery,
    ) -> Result<Vec<StatsPoint>, CoreError> {
        self.store
            .stats_history(
                scope,
                query.period_s,
                query.since,
                query.until,
                query.queue.as_deref(),
            )
            .await
    }
}
