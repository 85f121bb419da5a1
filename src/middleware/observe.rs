//! Observation of every request, both protocols: the Prometheus request metrics and one
//! structured log line per request (request id, trace id, operation, status, duration).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::Response;
use opentelemetry::trace::TraceContextExt;
use tracing_opentelemetry::OpenTelemetrySpanExt;

use super::{Operation, Protocol, RequestId, StackState};

/// Upper bounds (seconds) of the request latency histogram buckets.
pub const LATENCY_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
];

/// Counts and latency of one (operation, protocol, status).
#[derive(Debug, Clone, Default)]
pub struct RequestSeries {
    /// Requests answered.
    pub count: u64,
    /// Sum of their durations, seconds.
    pub seconds: f64,
    /// Cumulative counts per bucket of `LATENCY_BUCKETS`.
    pub buckets: Vec<u64>,
}

/// Request metrics keyed by (operation, protocol, status).
#[derive(Debug, Default)]
pub struct RequestMetrics {
    series: Mutex<HashMap<(String, &'static str, String), RequestSeries>>,
}

impl RequestMetrics {
    fn record(&self, operation: &str, protocol: &'static str, status: &str, seconds: f64) {
        let Ok(mut series) = self.series.lock() else {
            return;
        };
        let entry = series
            .entry((operation.to_string(), protocol, status.to_string()))
            .or_insert_with(|| RequestSeries {
                buckets: vec![0; LATENCY_BUCKETS.len()],
                ..Default::default()
            });
        entry.count += 1;
        entry.seconds += seconds;
        for (bucket, bound) in entry.buckets.iter_mut().zip(LATENCY_BUCKETS) {
            if seconds <= *bound {
                *bucket += 1;
            }
        }
    }

    /// A copy of every series.
    pub fn snapshot(&self) -> Vec<((String, &'static str, String), RequestSeries)> {
        self.series
            .lock()
            .map(|s| s.iter().map(|(k, v)| (k.clone(), v.clone())).collect())
            .unwrap_or_default()
    }
}

/// Records the request's metrics and writes its log line.
pub async fn observe(
    State(state): State<Arc<StackState>>,
    request: Request,
    next: Next,
) -> Response {
    let started = Instant::now();
    let op = request.extensions().get::<Operation>().copied();
    let request_id = request
        .extensions()
        .get::<RequestId>()
        .map(|r| r.0.clone())
        .unwrap_or_default();
    let path = request.uri().path().to_string();
    let response = next.run(request).await;
    let elapsed = started.elapsed();
    let protocol = match op.map(|o| o.protocol) {
        Some(Protocol::Grpc) => "grpc",
        _ => "http",
    };
    let status = match op.map(|o| o.protocol) {
        // Errors come back as trailers-only responses with grpc-status in the headers; a missing
        // header means the call went on to stream (OK unless its trailers say otherwise).
        Some(Protocol::Grpc) => response
            .headers()
            .get("grpc-status")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("0")
            .to_string(),
        _ => response.status().as_u16().to_string(),
    };
    let operation = op.and_then(|o| o.id).unwrap_or("unknown");
    state
        .metrics
        .record(operation, protocol, &status, elapsed.as_secs_f64());
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
