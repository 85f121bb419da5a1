//! The request body limit (1 MiB by default): a declared length over it is refused at once; HTTP
//! bodies are also cut off while streaming. gRPC messages are bounded by tonic with the same limit.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::Response;
use http_body_util::Limited;

use super::{Operation, Protocol, RequestId, StackState};
use crate::core::{CoreError, ErrorKind};

/// The body limit in force, for extractors that report it.
#[derive(Debug, Clone, Copy)]
pub struct BodyLimit(pub usize);

/// Refuses bodies over the limit.
pub async fn limit(
    State(state): State<Arc<StackState>>,
    mut request: Request,
    next: Next,
) -> Response {
    let max = state.max_body_bytes;
    let protocol = request
        .extensions()
        .get::<Operation>()
        .map_or(Protocol::Http, |op| op.protocol);
    let declared = request
        .headers()
        .get(http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|len| len > max as u64) {
        let id = request
            .extensions()
            .get::<RequestId>()
            .map(|r| r.0.clone())
            .unwrap_or_default();
        return state.reject(
            protocol,
            CoreError::new(
                ErrorKind::PayloadTooLarge,
                format!("request body exceeds the limit of {max} bytes"),
            ),
            &id,
        );
    }
    request.extensions_mut().insert(BodyLimit(max));
    if protocol == Protocol::Http {
        let (parts, body) = request.into_parts();
        request = Request::from_parts(parts, axum::body::Body::new(Limited::new(body, max)));
    }
    next.run(request).await
}
