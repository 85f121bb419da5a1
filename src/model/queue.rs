//! A queue's configuration and statistics as `s3p.queue_config` and `s3p.queue_stats` report them.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::time::serialize_time;

/// A queue's whole configuration: catalog settings and its stream's.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct QueueConfig {
    /// Stream nacks before a message is dead-lettered.
    pub max_retries: i32,
    /// Stream minimum retention, ms.
    pub retention_ms: i64,
    /// How long a cooperative member's unacked batch stays its own, ms.
    pub takeover_ms: i64,
    /// Most events one stream tick adds (one transaction's events are never split).
    pub tick_max_events: i64,
    /// Most bytes one stream tick adds.
    pub tick_max_bytes: i64,
    /// How long terminal jobs are kept, ms; the server default when absent.
    #[serde(default)]
    pub job_retention_ms: Option<i64>,
    /// Quota on non-terminal jobs; none when absent.
    #[serde(default)]
    pub max_jobs: Option<i64>,
    /// Quota on retained stream events; none when absent.
    #[serde(default)]
    pub max_stream_events: Option<i64>,
    /// Storage parameters set on the jobs table.
    #[serde(default)]
    pub autovacuum: Option<Map<String, Value>>,
    /// Whether job lifecycle events are also appended to the queue's stream.
    #[serde(default)]
    pub mirror_job_events: bool,
    /// Claims per second the queue allows; none when absent.
    #[serde(default)]
    pub rate_limit_per_second: Option<f64>,
    /// The period the Admin API's rate limit was given over, ms (the limit reads back over it);
    /// one second when absent.
    #[serde(default)]
    pub rate_limit_period_ms: Option<i64>,
}

/// A queue's job counts by state, the last hour's figures and its stream's counts. Its JSON form
/// (`Serialize`) is the one both protocols answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct QueueStats {
    /// Queue name.
    pub name: String,
    /// Whether delivery is paused.
    pub paused: bool,
    /// When the namespace was created.
    #[serde(serialize_with = "serialize_time")]
    pub created_at: DateTime<Utc>,
    /// Jobs a fetch could claim now (due scheduled and retryable ones included).
    pub available: i64,
    /// Scheduled jobs not yet due.
    pub scheduled: i64,
    /// Pending jobs (waiting for activation).
    pub pending: i64,
    /// Jobs under lease.
    pub active: i64,
    /// Retryable jobs not yet due.
    pub retryable: i64,
    /// Completed jobs kept.
    pub completed: i64,
    /// Cancelled jobs kept.
    pub cancelled: i64,
    /// Discarded jobs kept.
    pub discarded: i64,
    /// Discarded jobs whose policy dead-letters them.
    pub dead_letters: i64,
    /// Jobs completed in the last hour.
    pub completed_last_hour: i64,
    /// Jobs discarded in the last hour.
    pub failed_last_hour: i64,
    /// Mean run time of the last hour's completions, ms.
    pub avg_duration_ms: f64,
    /// Mean wait from enqueue to start over the last hour, ms.
    pub avg_wait_ms: f64,
    /// The last hour's completions per second.
    pub throughput_per_second: f64,
    /// The queue's stream counts.
    pub stream: StreamCounts,
}

/// A stream's counts, as part of its queue's stats.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StreamCounts {
    /// Events retained.
    pub events: i64,
    /// Subscribed consumers.
    pub consumers: i64,
    /// Dead letters.
    pub dead_letters: i64,
    /// Events waiting for a retry.
    pub pending_retries: i64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stats_read_the_sql_json_and_write_times_as_every_answer_does() {
        // As PostgreSQL writes it: numeric with its scale, timestamptz with offset and micros.
        let sql = r#"{"name": "q", "paused": false, "created_at": "2026-01-02T03:04:05.678901+00:00",
            "available": 1, "scheduled": 0, "pending": 0, "active": 2, "retryable": 0,
            "completed": 3, "cancelled": 0, "discarded": 0, "dead_letters": 0,
            "completed_last_hour": 3, "failed_last_hour": 0, "avg_duration_ms": 0.000,
            "avg_wait_ms": 12.500, "throughput_per_second": 0.000833,
            "stream": {"events": 4, "consumers": 1, "dead_letters": 0, "pending_retries": 0}}"#;
        let stats: QueueStats = serde_json::from_str(sql).expect("the SQL shape");
        let json = serde_json::Value::Object(crate::model::json_object(&stats));
        assert_eq!(json["created_at"], "2026-01-02T03:04:05.678Z");
        assert_eq!(json["avg_duration_ms"].to_string(), "0.0");
        assert_eq!(json["avg_wait_ms"].to_string(), "12.5");
        assert_eq!(json["available"].to_string(), "1");
        assert_eq!(json["stream"]["events"].to_string(), "4");
    }
}
