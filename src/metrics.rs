//! `GET /metrics` in the Prometheus text format: requests by operation, protocol and status with
//! latency histograms (from the middleware), jobs by queue and state, stream sizes, consumer lag
//! and dead letters (one SQL call), maintenance totals and database pool use.

use std::fmt::Write as _;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use serde_json::Value;

use crate::core::Service;
use crate::middleware::{LATENCY_BUCKETS, StackState};

/// What the /metrics handler reads.
#[derive(Clone)]
pub struct MetricsState {
    /// The service (database figures, maintenance totals).
    pub service: Arc<Service>,
    /// The middleware stack (request metrics).
    pub stack: Arc<StackState>,
}

/// A router serving `/metrics`.
pub fn router(state: MetricsState) -> axum::Router {
    axum::Router::new()
        .route("/metrics", axum::routing::get(scrape))
        .with_state(state)
}

/// Requests of the grouped operations and the statements (transactions) that served them.
fn render_grouping(stats: &crate::store::GroupingStats, out: &mut String) {
    let families = [
        (
            "pgvs3_grouped_requests_total",
            "Ack, single-queue fetch and single enqueue requests that reached the database.",
            [
                ("ack", stats.ack_requests),
                ("fetch", stats.fetch_requests),
                ("enqueue", stats.enqueue_requests),
            ],
        ),
        (
            "pgvs3_grouped_statements_total",
            "Statements, each its own transaction, that served them (concurrent requests share one).",
            [
                ("ack", stats.ack_statements),
                ("fetch", stats.fetch_statements),
                ("enqueue", stats.enqueue_statements),
            ],
        ),
    ];
    for (name, help, samples) in families {
        let _ = writeln!(out, "# HELP {name} {help}");
        let _ = writeln!(out, "# TYPE {name} counter");
        for (op, value) in samples {
            let _ = writeln!(out, "{name}{{op=\"{op}\"}} {value}");
        }
    }
}

/// Escapes a label value.
fn label(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

async fn scrape(State(state): State<MetricsState>) -> Response {
    let mut out = String::new();
    render_requests(&state.stack, &mut out);
    let totals = state.service.maintenance_totals();
    let _ = writeln!(
        out,
        "# HELP pgvs3_maintenance_passes_total Maintenance passes this gateway ran."
    );
    let _ = writeln!(out, "# TYPE pgvs3_maintenance_passes_total counter");
    let _ = writeln!(
        out,
        "pgvs3_maintenance_passes_total {}",
        totals.passes.load(Relaxed)
    );
    let _ = writeln!(
        out,
        "# HELP pgvs3_lease_expiries_total Expired job leases released by maintenance."
    );
    let _ = writeln!(out, "# TYPE pgvs3_lease_expiries_total counter");
    let _ = writeln!(
        out,
        "pgvs3_lease_expiries_total {}",
        totals.lease_expiries.load(Relaxed)
    );
    let _ = writeln!(
        out,
        "# HELP pgvs3_stream_rotations_total Stream segment rotations by this gateway's passes."
    );
    let _ = writeln!(out, "# TYPE pgvs3_stream_rotations_total counter");
    let _ = writeln!(
        out,
        "pgvs3_stream_rotations_total {}",
        totals.rotations.load(Relaxed)
    );
    let _ = writeln!(
        out,
        "# HELP pgvs3_jobs_vacuums_total Jobs tables this gateway's passes vacuumed for their dead row versions."
    );
    let _ = writeln!(out, "# TYPE pgvs3_jobs_vacuums_total counter");
    let _ = writeln!(
        out,
        "pgvs3_jobs_vacuums_total {}",
        totals.vacuums.load(Relaxed)
    );
    let _ = writeln!(
        out,
        "# HELP pgvs3_maintenance_queue_steps_total Queue steps this gateway's passes ran (only queues with due work)."
    );
    let _ = writeln!(out, "# TYPE pgvs3_maintenance_queue_steps_total counter");
    let _ = writeln!(
        out,
        "pgvs3_maintenance_queue_steps_total {}",
        totals.queue_steps.load(Relaxed)
    );
    let _ = writeln!(
        out,
        "# HELP pgvs3_maintenance_failures_total Maintenance steps that failed and were skipped (the pass went on), by queue; step=\"shared\" is the database-wide step."
    );
    let _ = writeln!(out, "# TYPE pgvs3_maintenance_failures_total counter");
    let failures = totals
        .failures
        .lock()
        .map(|f| f.clone())
        .unwrap_or_else(|p| p.into_inner().clone());
    for (queue, n) in failures {
        if queue.is_empty() {
            let _ = writeln!(
                out,
                "pgvs3_maintenance_failures_total{{step=\"shared\"}} {n}"
            );
        } else {
            let _ = writeln!(
                out,
                "pgvs3_maintenance_failures_total{{step=\"queue\",queue=\"{}\"}} {n}",
                label(&queue)
            );
        }
    }
    render_grouping(&state.service.grouping_stats(), &mut out);
    let _ = writeln!(
        out,
        "# HELP pgvs3_lock_conflict_retries_total Statements run again after PostgreSQL aborted them for a deadlock or serialization failure."
    );
    let _ = writeln!(out, "# TYPE pgvs3_lock_conflict_retries_total counter");
    let _ = writeln!(
        out,
        "pgvs3_lock_conflict_retries_total {}",
        state.service.conflict_retries()
    );
    let _ = writeln!(
        out,
        "# HELP pgvs3_open_streams Long-lived streams (server-sent events, gRPC server streams) open now."
    );
    let _ = writeln!(out, "# TYPE pgvs3_open_streams gauge");
    let _ = writeln!(out, "pgvs3_open_streams {}", state.service.open_streams());
    match state.service.metrics_snapshot().await {
        Ok((snapshot, (open, idle))) => {
            render_queues(&snapshot, &mut out);
            let _ = writeln!(
                out,
                "# HELP pgvs3_db_pool_connections Database pool connections by state."
            );
            let _ = writeln!(out, "# TYPE pgvs3_db_pool_connections gauge");
            let _ = writeln!(out, "pgvs3_db_pool_connections{{state=\"idle\"}} {idle}");
            let _ = writeln!(
                out,
                "pgvs3_db_pool_connections{{state=\"in_use\"}} {}",
                (open as usize).saturating_sub(idle)
            );
            let _ = writeln!(
                out,
                "# HELP pgvs3_up Whether the database answered the scrape."
            );
            let _ = writeln!(out, "# TYPE pgvs3_up gauge");
            let _ = writeln!(out, "pgvs3_up 1");
        }
        Err(error) => {
            tracing::warn!(%error, "metrics snapshot failed");
            let _ = writeln!(out, "# TYPE pgvs3_up gauge");
            let _ = writeln!(out, "pgvs3_up 0");
        }
    }
    (
        [(
            http::header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        out,
    )
        .into_response()
}

fn render_requests(stack: &StackState, out: &mut String) {
    let mut series = stack.metrics.snapshot();
    series.sort_by(|a, b| a.0.cmp(&b.0));
    let _ = writeln!(
        out,
        "# HELP pgvs3_requests_total Requests answered, by operation, protocol and status."
    );
    let _ = writeln!(out, "# TYPE pgvs3_requests_total counter");
    for ((op, protocol, status), s) in &series {
        let _ = writeln!(
            out,
            "pgvs3_requests_total{{operation=\"{}\",protocol=\"{protocol}\",status=\"{}\"}} {}",
            label(op),
            label(status),
            s.count
        );
    }
    let _ = writeln!(
        out,
        "# HELP pgvs3_request_duration_seconds Request latency, by operation and protocol."
    );
    let _ = writeln!(out, "# TYPE pgvs3_request_duration_seconds histogram");
    for ((op, protocol, status), s) in &series {
        let labels = format!(
            "operation=\"{}\",protocol=\"{protocol}\",status=\"{}\"",
            label(op),
            label(status)
        );
        for (bound, count) in LATENCY_BUCKETS.iter().zip(&s.buckets) {
            let _ = writeln!(
                out,
                "pgvs3_request_duration_seconds_bucket{{{labels},le=\"{bound}\"}} {count}"
            );
        }
        let _ = writeln!(
            out,
            "pgvs3_request_duration_seconds_bucket{{{labels},le=\"+Inf\"}} {}",
            s.count
        );
        let _ = writeln!(
            out,
            "pgvs3_request_duration_seconds_sum{{{labels}}} {}",
            s.seconds
        );
        let _ = writeln!(
            out,
            "pgvs3_request_duration_seconds_count{{{labels}}} {}",
            s.count
        );
    }
}

fn render_queues(snapshot: &Value, out: &mut String) {
    let queues = snapshot
        .get("queues")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let gauge = |out: &mut String, name: &str, help: &str| {
        let _ = writeln!(out, "# HELP {name} {help}");
        let _ = writeln!(out, "# TYPE {name} gauge");
    };
    gauge(out, "pgvs3_jobs", "Jobs by queue and state.");
    for q in &queues {
        let name = label(q.get("queue").and_then(Value::as_str).unwrap_or_default());
        if let Some(states) = q.get("jobs").and_then(Value::as_object) {
            for (state, n) in states {
                let _ = writeln!(
                    out,
                    "pgvs3_jobs{{queue=\"{name}\",state=\"{}\"}} {}",
                    label(state),
                    n.as_i64().unwrap_or(0)
                );
            }
        }
    }
    for (metric, key, help) in [
        (
            "pgvs3_stream_events",
            "events",
            "Stream events retained, by queue.",
        ),
        (
            "pgvs3_stream_dead_letters",
            "dead_letters",
            "Stream dead letters, by queue.",
        ),
        (
            "pgvs3_stream_segment_rotations",
            "rotations",
            "Stream segment rotations so far, by queue.",
        ),
    ] {
        gauge(out, metric, help);
        for q in &queues {
            let name = label(q.get("queue").and_then(Value::as_str).unwrap_or_default());
            let n = q
                .pointer(&format!("/stream/{key}"))
                .and_then(Value::as_i64)
                .unwrap_or(0);
            let _ = writeln!(out, "{metric}{{queue=\"{name}\"}} {n}");
        }
    }
    for (metric, key, help) in [
        (
            "pgvs3_stream_consumer_lag_ticks",
            "ticks_behind",
            "Ticks after a consumer's cursor.",
        ),
        (
            "pgvs3_stream_consumer_lag_events",
            "events_behind",
            "Events after a consumer's cursor (by sequence).",
        ),
    ] {
        gauge(out, metric, help);
        for q in &queues {
            let name = label(q.get("queue").and_then(Value::as_str).unwrap_or_default());
            for c in q
                .pointer("/stream/consumers")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                let consumer = label(
                    c.get("consumer")
                        .and_then(Value::as_str)
                        .unwrap_or_default(),
                );
                let n = c.get(key).and_then(Value::as_i64).unwrap_or(0);
                let _ = writeln!(
                    out,
                    "{metric}{{queue=\"{name}\",consumer=\"{consumer}\"}} {n}"
                );
            }
        }
    }
}
