//! Observation of every request, both protocols: the Prometheus request metrics and one
//! structured log line per request (request id, trace id, operation, status, duration).

use std::sync::Arc;
use std::time::Instant;

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::Response;
use opentelemetry::trace::TraceContextExt;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use tracing_opentelemetry::OpenTelemetrySpanExt;

use super::{Operation, Protocol, RequestId, StackState};

/// Upper bounds (seconds) of the request latency histogram buckets.
pub const LATENCY_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
];

/// The labels of a request series.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    /// operationId or gRPC method path (a fixed set), `unknown` for unrouted paths.
    pub operation: &'static str,
    /// `http` or `grpc`.
    pub protocol: &'static str,
    /// HTTP status or gRPC status code.
    pub status: String,
}

fn latency_histogram() -> Histogram {
    Histogram::new(LATENCY_BUCKETS.iter().copied())
}

/// Request counts and latency by (operation, protocol, status); `/metrics` registers clones
/// (they share the counts).
#[derive(Debug, Clone)]
pub struct RequestMetrics {
    /// Requests answered.
    pub requests: Family<RequestLabels, Counter>,
    /// Their latency, seconds.
    pub duration: Family<RequestLabels, Histogram, fn() -> Histogram>,
}

impl Default for RequestMetrics {
    fn default() -> Self {
        RequestMetrics {
            requests: Family::default(),
            duration: Family::new_with_constructor(latency_histogram),
        }
    }
}

impl RequestMetrics {
    fn record(&self, labels: RequestLabels, seconds: f64) {
        self.requests.get_or_create(&labels).inc();
        self.duration.get_or_create(&labels).observe(seconds);
    }
}

/// Records the request's metrics and writes its log line.
pub async fn observe(
    State(state): State<Arc<StackState>>,
    request: Request,
    next: Next,
) -> Response {
    let started = Instant::now();
    let request_id = request
        .extensions()
        .get::<RequestId>()
        .map(|r| r.0.clone())
        .unwrap_or_default();
    let path = request.uri().path().to_string();
    let grpc_request = super::is_grpc(request.headers());
    let response = next.run(request).await;
    let elapsed = started.elapsed();
    // The route's guard puts its operation on the answer; an unrouted request has none.
    let op = response.extensions().get::<Operation>().copied();
    let protocol_of = op.map_or(
        if grpc_request {
            Protocol::Grpc
        } else {
            Protocol::Http
        },
        |o| o.protocol,
    );
    let protocol = match protocol_of {
        Protocol::Grpc => "grpc",
        Protocol::Http => "http",
    };
    let status = match protocol_of {
        // Errors come back as trailers-only responses with grpc-status in the headers; a missing
        // header means the call went on to stream (OK unless its trailers say otherwise).
        Protocol::Grpc => response
            .headers()
            .get("grpc-status")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("0")
            .to_string(),
        _ => response.status().as_u16().to_string(),
    };
    let operation = op.map_or("unknown", |o| o.id);
    state.metrics.record(
        RequestLabels {
            operation,
            protocol,
            status: status.clone(),
        },
        elapsed.as_secs_f64(),
    );
    let trace_id = tracing::Span::current()
        .context()
        .span()
        .span_context()
        .trace_id();
    tracing::info!(
        target: "pgvs3::request",
        request_id,
        trace_id = %trace_id,
        operation,
        protocol,
        path,
        status,
        duration_ms = elapsed.as_secs_f64() * 1000.0,
        "request"
    );
    response
}
