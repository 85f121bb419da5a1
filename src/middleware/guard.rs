//! The guard every route's handler is wrapped in, built from that route's operation: so the
//! operation a request is authorized as is, by construction, the one that serves it. In order: the
//! OJS version (HTTP), the declared body length, a global admission slot, the token and its role,
//! the read-only gate; then the handler, with the operation, grant, admission slot, per-queue gate
//! and a bounded body in the request. Token lookups come after the admission slot, so a flood of
//! requests with unknown tokens counts against the in-flight limit like any other.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::body::Body;
use axum::extract::Request;
use axum::response::{IntoResponse, Response};
use tower::{Layer, Service, ServiceExt as _};

use super::body_limit::{BodyLimit, BoundedBody, declared_length, drain, too_large};
use super::queue_admission::QueueGate;
use super::{Operation, Protocol, RequestId, StackState, admission, headers, read_only};
use crate::core::CoreError;

/// The bytes of a gRPC message frame's header (compression flag and length).
const GRPC_FRAME_HEADER: usize = 5;

/// Wraps a route's handler in the stack's checks for `operation`.
#[derive(Clone)]
pub struct Guard {
    state: Arc<StackState>,
    op: Operation,
}

impl StackState {
    /// The guard of a route serving `op`.
    pub fn guard(self: &Arc<Self>, op: Operation) -> Guard {
        Guard {
            state: self.clone(),
            op,
        }
    }
}

impl<S> Layer<S> for Guard {
    type Service = Guarded<S>;

    fn layer(&self, inner: S) -> Guarded<S> {
        Guarded {
            guard: self.clone(),
            inner,
        }
    }
}

/// A handler behind its guard.
#[derive(Clone)]
pub struct Guarded<S> {
    guard: Guard,
    inner: S,
}

impl<S> Service<Request> for Guarded<S>
where
    S: Service<Request, Error = Infallible> + Clone + Send + 'static,
    S::Response: IntoResponse,
    S::Future: Send + 'static,
{
    type Response = Response;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request) -> Self::Future {
        // The clone that was polled ready is the one called (tower's rule).
        let clone = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, clone);
        let guard = self.guard.clone();
        Box::pin(async move { Ok(guard.serve(request, inner).await) })
    }
}

impl Guard {
    async fn serve<S>(self, mut request: Request, inner: S) -> Response
    where
        S: Service<Request, Error = Infallible> + Send,
        S::Response: IntoResponse,
        S::Future: Send,
    {
        let Guard { state, op } = self;
        request.extensions_mut().insert(op);
        let max = state.max_body_bytes;
        let admitted = (|| {
            if op.protocol == Protocol::Http {
                headers::check_version(&request)?;
            }
            if declared_length(request.headers()).is_some_and(|len| len > max as u64) {
                return Err(too_large(max));
            }
            admission::acquire(&state)
        })();
        let slot = match admitted {
            Ok(slot) => slot,
            Err(error) => return refuse(&state, op, error, request).await,
        };
        if let Some(auth) = &state.auth {
            match auth.authenticate(op, request.headers()).await {
                Ok(Some((grant, check))) => {
                    request.extensions_mut().insert(grant);
                    request.extensions_mut().insert(check);
                }
                Ok(None) => {}
                Err(error) => return refuse(&state, op, error, request).await,
            }
        }
        if let Err(error) = read_only::check(&state, op) {
            return refuse(&state, op, error, request).await;
        }
        let limit = match op.protocol {
            Protocol::Http => max,
            // Every RPC takes one message, which tonic bounds by the same limit.
            Protocol::Grpc => max + GRPC_FRAME_HEADER,
        };
        let extensions = request.extensions_mut();
        extensions.insert(slot.clone());
        extensions.insert(BodyLimit(max));
        if let Some(gate) = QueueGate::of(&state.queue_limits) {
            extensions.insert(gate);
        }
        let request = request.map(|body| Body::new(BoundedBody::new(body, limit)));
        let mut response = match inner.oneshot(request).await {
            Ok(response) => response.into_response(),
            Err(never) => match never {},
        };
        response.extensions_mut().insert(op);
        admission::hold_until_sent(response, slot)
    }
}

/// Answers a request refused before its handler, in the terms of `op`'s protocol.
async fn refuse(state: &StackState, op: Operation, error: CoreError, request: Request) -> Response {
    let mut response = unserved(request, |id| state.reject(op.protocol, error, id)).await;
    response.extensions_mut().insert(op);
    response
}

/// The answer `render` makes (given the request id) to a request no handler serves: refused, or
/// matching no route. An HTTP/1.1 client may still be sending its body: it is read (up to a
/// bound) and dropped first, so the client reads the answer instead of a reset; past the bound the
/// connection closes after the answer. A client waiting for `100 Continue` sends nothing, so
/// nothing is read.
pub async fn unserved(request: Request, render: impl FnOnce(&str) -> Response) -> Response {
    let id = request
        .extensions()
        .get::<RequestId>()
        .map(|r| r.0.clone())
        .unwrap_or_default();
    let http1 = request.version() <= http::Version::HTTP_11;
    let waits_for_continue = request.headers().contains_key(http::header::EXPECT);
    let (parts, body) = request.into_parts();
    let drained = !http1 || waits_for_continue || drain(&parts.headers, body).await;
    let mut response = render(&id);
    if !drained {
        response.headers_mut().insert(
            http::header::CONNECTION,
            http::HeaderValue::from_static("close"),
        );
    }
    response
}
