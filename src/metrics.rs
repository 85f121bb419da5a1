//! `GET /metrics` in the OpenMetrics text format, encoded by `prometheus-client`: requests by
//! operation, protocol and status with latency histograms (from the middleware), job wait and
//! run time histograms by queue, jobs by queue and state, stream sizes, consumers, consumer lag
//! (per queue the largest, and per consumer for the 100 furthest behind) and dead letters (one SQL
//! call), maintenance totals and database pool use.

use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use prometheus_client::encoding::{EncodeMetric, MetricEncoder};
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::metrics::{MetricType, TypedMetric};
use prometheus_client::registry::{Registry, Unit};
use serde_json::Value;

use crate::core::timings::{QueueHistograms, QueueLabel};
use crate::core::{Scope, Service};
use crate::middleware::StackState;

/// The media type of the exposition (OpenMetrics text).
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

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
    let op = crate::contract::http_operation("getMetrics");
    let guard = state.stack.guard(crate::middleware::Operation::http(op));
    axum::Router::new()
        .route(op.path, axum::routing::get(scrape).route_layer(guard))
        .with_state(state)
}

/// Labels of the series built per scrape, in the order they are written.
type Labels = Vec<(&'static str, String)>;

/// Escapes a label value (the encoder writes label values as given).
fn label(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// A counter family with the given series.
fn counters(series: impl IntoIterator<Item = (Labels, u64)>) -> Family<Labels, Counter> {
    let family = Family::<Labels, Counter>::default();
    for (labels, value) in series {
        family.get_or_create(&labels).inc_by(value);
    }
    family
}

/// A gauge family with the given series.
fn gauges(series: impl IntoIterator<Item = (Labels, i64)>) -> Family<Labels, Gauge> {
    let family = Family::<Labels, Gauge>::default();
    for (labels, value) in series {
        family.get_or_create(&labels).set(value);
    }
    family
}

/// Requests of the grouped operations and the statements (transactions) that served them.
fn register_grouping(stats: &crate::store::GroupingStats, registry: &mut Registry) {
    let op = |name: &str| vec![("op", name.to_string())];
    registry.register(
        "pgvs3_grouped_requests",
        "Ack, single-queue fetch and single enqueue requests that reached the database",
        counters([
            (op("ack"), stats.ack_requests),
            (op("fetch"), stats.fetch_requests),
            (op("enqueue"), stats.enqueue_requests),
        ]),
    );
    registry.register(
        "pgvs3_grouped_statements",
        "Statements, each its own transaction, that served them (concurrent requests share one)",
        counters([
            (op("ack"), stats.ack_statements),
            (op("fetch"), stats.fetch_statements),
            (op("enqueue"), stats.enqueue_statements),
        ]),
    );
}

/// Some series of a histogram family by queue: those of the queues a scoped token sees.
#[derive(Debug)]
struct QueueSeries(Vec<(QueueLabel, Histogram)>);

impl QueueSeries {
    /// The series of `family` for `queues` (those it has).
    fn of<'a>(family: &QueueHistograms, queues: impl IntoIterator<Item = &'a str>) -> Self {
        QueueSeries(
            queues
                .into_iter()
                .filter_map(|queue| {
                    let label = QueueLabel {
                        queue: queue.to_string(),
                    };
                    let histogram = family.get(&label)?.clone();
                    Some((label, histogram))
                })
                .collect(),
        )
    }
}

impl TypedMetric for QueueSeries {
    const TYPE: MetricType = MetricType::Histogram;
}

impl EncodeMetric for QueueSeries {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        for (label, histogram) in &self.0 {
            histogram.encode(encoder.encode_family(label)?)?;
        }
        Ok(())
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Histogram
    }
}

/// The queue names of a database snapshot.
fn snapshot_queues(snapshot: &Value) -> impl Iterator<Item = &str> {
    snapshot
        .get("queues")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|q| q.get("queue").and_then(Value::as_str))
}

/// The maintenance totals of this gateway's passes (failures only of queues in `scope`; the
/// shared step's only for every-queue scopes).
fn register_maintenance(
    totals: &crate::core::MaintenanceTotals,
    scope: &Scope,
    registry: &mut Registry,
) {
    for (name, help, value) in [
        (
            "pgvs3_maintenance_passes",
            "Maintenance passes this gateway ran",
            &totals.passes,
        ),
        (
            "pgvs3_lease_expiries",
            "Expired job leases released by maintenance",
            &totals.lease_expiries,
        ),
        (
            "pgvs3_stream_rotations",
            "Stream segment rotations by this gateway's passes",
            &totals.rotations,
        ),
        (
            "pgvs3_jobs_vacuums",
            "Jobs tables this gateway's passes vacuumed for their dead row versions",
            &totals.vacuums,
        ),
        (
            "pgvs3_maintenance_queue_steps",
            "Queue steps this gateway's passes ran (only queues with due work)",
            &totals.queue_steps,
        ),
    ] {
        registry.register(name, help, ConstCounter::new(value.load(Relaxed)));
    }
    let failures = totals
        .failures
        .lock()
        .map(|f| f.clone())
        .unwrap_or_else(|p| p.into_inner().clone());
    registry.register(
        "pgvs3_maintenance_failures",
        "Maintenance steps that failed and were skipped (the pass went on), by queue; step shared is the database-wide step",
        counters(failures.into_iter().filter(|(queue, _)| if queue.is_empty() { scope.is_all() } else { scope.covers(queue) }).map(|(queue, n)| {
            let labels = if queue.is_empty() {
                vec![("step", "shared".to_string())]
            } else {
                vec![("step", "queue".to_string()), ("queue", label(&queue))]
            };
            (labels, n)
        })),
    );
}

// One registry per scrape: the long-lived families are shared clones, the rest are read now
// (atomics, the database snapshot), so no state outlives the scrape and nothing is registered twice.
// A token scoped to some queues sees only their series (request counts name no queue).
async fn scrape(State(state): State<MetricsState>, request: axum::extract::Request) -> Response {
    let scope = crate::middleware::QueueAdmission::of(request.extensions()).scope();
    let snapshot = state.service.metrics_snapshot(&scope).await;
    let mut registry = Registry::default();
    let requests = &state.stack.metrics;
    registry.register(
        "pgvs3_requests",
        "Requests answered, by operation, protocol and status",
        requests.requests.clone(),
    );
    registry.register_with_unit(
        "pgvs3_request_duration",
        "Request latency, by operation, protocol and status",
        Unit::Seconds,
        requests.duration.clone(),
    );
    let timings = state.service.job_timings();
    for (name, help, family) in [
        (
            "pgvs3_job_wait",
            "Time from when a job was due to its fetch by a worker, by queue",
            &timings.wait,
        ),
        (
            "pgvs3_job_run",
            "Time from a job's fetch to its ack, by queue",
            &timings.run,
        ),
    ] {
        if scope.is_all() {
            registry.register_with_unit(name, help, Unit::Seconds, family.clone());
        } else {
            let queues = snapshot
                .as_ref()
                .map(|(s, _)| snapshot_queues(s).collect::<Vec<_>>());
            let series = QueueSeries::of(family, queues.unwrap_or_default());
            registry.register_with_unit(name, help, Unit::Seconds, series);
        }
    }
    register_maintenance(state.service.maintenance_totals(), &scope, &mut registry);
    register_grouping(&state.service.grouping_stats(), &mut registry);
    registry.register(
        "pgvs3_lock_conflict_retries",
        "Statements run again after PostgreSQL aborted them for a deadlock or serialization failure",
        ConstCounter::new(state.service.conflict_retries()),
    );
    registry.register(
        "pgvs3_open_streams",
        "Long-lived streams (server-sent events, gRPC server streams) open now",
        ConstGauge::new(i64::try_from(state.service.open_streams()).unwrap_or(i64::MAX)),
    );
    let up = match snapshot {
        Ok((snapshot, (open, idle))) => {
            register_queues(&snapshot, &mut registry);
            let idle = i64::try_from(idle).unwrap_or(i64::MAX);
            registry.register(
                "pgvs3_db_pool_connections",
                "Database pool connections by state",
                gauges([
                    (vec![("state", "idle".to_string())], idle),
                    (
                        vec![("state", "in_use".to_string())],
                        (i64::from(open) - idle).max(0),
                    ),
                ]),
            );
            1
        }
        Err(error) => {
            tracing::warn!(%error, "metrics snapshot failed");
            0
        }
    };
    registry.register(
        "pgvs3_up",
        "Whether the database answered the scrape",
        ConstGauge::new(up),
    );
    let mut out = String::new();
    if let Err(error) = prometheus_client::encoding::text::encode(&mut out, &registry) {
        tracing::warn!(%error, "metrics encoding failed");
        return http::StatusCode::INTERNAL_SERVER_ERROR.into_response();
    }
    ([(http::header::CONTENT_TYPE, CONTENT_TYPE)], out).into_response()
}

/// Per-queue figures of the database snapshot.
fn register_queues(snapshot: &Value, registry: &mut Registry) {
    let queues = snapshot
        .get("queues")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default();
    let name = |q: &Value| label(q.get("queue").and_then(Value::as_str).unwrap_or_default());
    registry.register(
        "pgvs3_jobs",
        "Jobs by queue and state",
        gauges(queues.iter().flat_map(|q| {
            let queue = name(q);
            q.get("jobs")
                .and_then(Value::as_object)
                .into_iter()
                .flatten()
                .map(move |(state, n)| {
                    (
                        vec![("queue", queue.clone()), ("state", label(state))],
                        n.as_i64().unwrap_or(0),
                    )
                })
        })),
    );
    for (metric, key, help) in [
        (
            "pgvs3_stream_events",
            "events",
            "Stream events retained, by queue",
        ),
        (
            "pgvs3_stream_dead_letters",
            "dead_letters",
            "Stream dead letters, by queue",
        ),
        (
            "pgvs3_stream_segment_rotations",
            "rotations",
            "Stream segment rotations so far, by queue",
        ),
        (
            "pgvs3_stream_consumers",
            "consumer_count",
            "Stream consumers, by queue",
        ),
        (
            "pgvs3_stream_consumer_max_lag_ticks",
            "max_ticks_behind",
            "Ticks after the cursor of the consumer furthest behind, by queue",
        ),
        (
            "pgvs3_stream_consumer_max_lag_events",
            "max_events_behind",
            "Events after the cursor of the consumer furthest behind (by sequence), by queue",
        ),
    ] {
        registry.register(
            metric,
            help,
            gauges(queues.iter().map(|q| {
                let n = q
                    .pointer(&format!("/stream/{key}"))
                    .and_then(Value::as_i64)
                    .unwrap_or(0);
                (vec![("queue", name(q))], n)
            })),
        );
    }
    for (metric, key, help) in [
        (
            "pgvs3_stream_consumer_lag_ticks",
            "ticks_behind",
            "Ticks after a consumer's cursor, for the 100 consumers of each queue furthest behind",
        ),
        (
            "pgvs3_stream_consumer_lag_events",
            "events_behind",
            "Events after a consumer's cursor (by sequence), for the 100 consumers of each queue furthest behind",
        ),
    ] {
        registry.register(
            metric,
            help,
            gauges(queues.iter().flat_map(|q| {
                let queue = name(q);
                q.pointer("/stream/consumers")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                    .map(move |c| {
                        let consumer = label(
                            c.get("consumer")
                                .and_then(Value::as_str)
                                .unwrap_or_default(),
                        );
                        (
                            vec![("queue", queue.clone()), ("consumer", consumer)],
                            c.get(key).and_then(Value::as_i64).unwrap_or(0),
                        )
                    })
            })),
        );
    }
}
