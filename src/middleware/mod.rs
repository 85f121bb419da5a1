//! The one middleware stack of both protocols. Around the router (every request, routed or not):
//! request ids, the trace span, observation (metrics, log line) and OJS response headers. Inside
//! each route, around its handler: the `Guard` of the route's operation (OJS version, body limit,
//! admission, token and role, read-only gate, per-queue gate). Each rejection answers in the
//! protocol's own terms (HTTP status + OJS envelope, or gRPC status + ErrorInfo).

mod admission;
mod auth;
mod body_limit;
mod guard;
mod headers;
mod observe;
mod operation;
mod queue_admission;
mod read_only;
mod request_id;
mod trace_context;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::response::Response;
use tokio::sync::Semaphore;

use crate::core::CoreError;
pub use admission::AdmissionSlot;
pub use auth::{Auth, bearer};
pub use body_limit::{BodyLimit, BodyTooLarge, TOO_LARGE, too_large};
pub use guard::{Guard, Guarded, unserved};
pub use observe::{LATENCY_BUCKETS, RequestLabels, RequestMetrics};
pub use operation::{Operation, Protocol, is_grpc};
pub use queue_admission::{QueueAdmission, QueueGate, QueueLimits, admit_queues};
pub use request_id::RequestId;
pub use trace_context::CarriedTrace;

/// Shared state of the stack: one semaphore and one flag for every route and both protocols.
pub struct StackState {
    /// Mutations are rejected while set.
    pub read_only: AtomicBool,
    /// Global in-flight limit.
    pub admission: Arc<Semaphore>,
    /// Per-queue in-flight limits.
    pub queue_limits: Arc<QueueLimits>,
    /// Largest request body accepted, bytes.
    pub max_body_bytes: usize,
    /// Request counts and latencies for /metrics.
    pub metrics: RequestMetrics,
    /// Token checking; `None` serves everyone (`--auth off`).
    pub auth: Option<Auth>,
    /// The Content-Type of JSON answers over HTTP (`--http-content-type`).
    pub json_media_type: &'static str,
    /// Renders the stack's rejections.
    pub rejecter: Rejecter,
}

impl StackState {
    /// A stack allowing `max_in_flight` requests at once (`queue_max_in_flight` per queue, 0 = no
    /// per-queue limit) and bodies up to `max_body_bytes`, checking tokens with `auth`, answering
    /// JSON as `json_media_type`, rendering rejections with `rejecter`.
    pub fn new(
        read_only: bool,
        max_in_flight: usize,
        queue_max_in_flight: usize,
        max_body_bytes: usize,
        auth: Option<Auth>,
        json_media_type: &'static str,
        rejecter: Rejecter,
    ) -> Arc<Self> {
        Arc::new(StackState {
            read_only: AtomicBool::new(read_only),
            admission: Arc::new(Semaphore::new(max_in_flight)),
            queue_limits: QueueLimits::new(queue_max_in_flight),
            max_body_bytes,
            metrics: RequestMetrics::default(),
            auth,
            json_media_type,
            rejecter,
        })
    }

    /// Whether mutations are rejected.
    pub fn is_read_only(&self) -> bool {
        self.read_only.load(Ordering::Relaxed)
    }
}

/// Wraps `router` (HTTP and gRPC routes alike, each route already behind the `Guard` of its
/// operation) in the layers every request passes, routed or not.
pub fn apply(router: axum::Router, state: Arc<StackState>) -> axum::Router {
    use axum::middleware::from_fn_with_state;
    // The last layer added runs first.
    router
        .layer(from_fn_with_state(state.clone(), headers::ojs_headers))
        .layer(from_fn_with_state(state.clone(), observe::observe))
        .layer(
            tower_http::trace::TraceLayer::new_for_http().make_span_with(
                |request: &http::Request<axum::body::Body>| {
                    let request_id = request
                        .extensions()
                        .get::<RequestId>()
                        .map(|r| r.0.as_str())
                        .unwrap_or("");
                    let span = tracing::info_span!(
                        "request",
                        method = %request.method(),
                        path = %request.uri().path(),
                        request_id,
                    );
                    // Join the caller's trace when it sent W3C trace context.
                    use tracing_opentelemetry::OpenTelemetrySpanExt;
                    let _ = span.set_parent(trace_context::extract(request.headers()));
                    span
                },
            ),
        )
        .layer(axum::middleware::from_fn(request_id::request_id))
}

/// Renders a rejection in the terms of the request's protocol (HTTP status + OJS envelope, or
/// gRPC status + ErrorInfo). The server hands it in, so the stack imports no adapter.
pub type Rejecter = fn(Protocol, CoreError, &str) -> Response;

impl StackState {
    /// A rejection in the terms of the request's protocol.
    pub fn reject(&self, protocol: Protocol, error: CoreError, request_id: &str) -> Response {
        (self.rejecter)(protocol, error, request_id)
    }
}
