//! The OJS JSON-over-HTTP adapter: the router and trait generated from `openapi/pgvs3.yaml`, the
//! extractors that answer bad input in the OJS error envelope, and the conversions to the core.

mod admin;
mod admin_system;
mod convert;
mod error;
mod extract;
mod handlers;
mod sse;

/// Code generated from `openapi/pgvs3.yaml` by build.rs.
#[allow(missing_docs, clippy::all)]
pub mod api {
    pub use crate::contract::{HTTP_OPERATIONS, HttpOperation};
    include!(concat!(env!("OUT_DIR"), "/openapi.rs"));
}

use std::sync::Arc;

use axum::response::{IntoResponse, Response};
use http::{HeaderValue, StatusCode};
use serde::Serialize;
use tokio::sync::watch;

use crate::core::push::Shutdown;
use crate::core::{CoreError, ErrorKind, Service};
use crate::middleware::StackState;
pub use error::{ApiError, status_of};
pub use extract::{OjsJson, OjsPath, OjsQuery, OptionalOjsJson, RequestContext, header_param};
pub use handlers::HttpAdapter;
pub use sse::{ERROR_EVENT, EventStream, KEEPALIVE_COMMENT, accepts_event_stream, event_stream};

/// Deserializes a present JSON value (null included) as `Some`; absent fields default to `None`.
pub fn present<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<Option<serde_json::Value>, D::Error> {
    <serde_json::Value as serde::Deserialize>::deserialize(d).map(Some)
}

pub use crate::contract::OJS_MEDIA_TYPE;

/// A JSON response with the OJS media type.
pub fn ojs_json<T: Serialize>(status: StatusCode, body: &T) -> Response {
    match serde_json::to_vec(body) {
        Ok(bytes) => {
            let mut response = (status, bytes).into_response();
            response.headers_mut().insert(
                http::header::CONTENT_TYPE,
                HeaderValue::from_static(OJS_MEDIA_TYPE),
            );
            response
        }
        Err(e) => ApiError::from(CoreError::new(
            ErrorKind::Backend,
            format!("response could not be encoded: {e}"),
        ))
        .into_response(),
    }
}

/// Turns an operation's result into a response, stamping errors with the request id.
pub fn respond<R: IntoResponse>(ctx: &RequestContext, result: Result<R, ApiError>) -> Response {
    match result {
        Ok(r) => r.into_response(),
        Err(e) => e.with_request_id(&ctx.request_id).into_response(),
    }
}

/// The HTTP router of the service, each operation behind the guard `stack` makes for it;
/// server-sent event streams end (with a `stream.error` frame) once `shutdown` holds true, so a
/// graceful shutdown does not wait on them.
pub fn router_until(
    service: Arc<Service>,
    stack: &Arc<StackState>,
    shutdown: watch::Receiver<bool>,
) -> axum::Router {
    let adapter = HttpAdapter::new(service, Shutdown::new(shutdown));
    api::router(Arc::new(adapter), |op| stack.guard(op))
}

/// The OJS answer to a path no route serves.
pub fn unknown_route(request_id: &str, path: &str) -> Response {
    ApiError::from(CoreError::not_found("route", path))
        .with_request_id(request_id)
        .into_response()
}

/// The OJS answer to a method a route does not serve.
pub fn method_not_allowed(request_id: &str, method: &http::Method, path: &str) -> Response {
    let mut response = ApiError::from(CoreError::invalid(format!(
        "method {method} is not allowed on {path}"
    )))
    .with_request_id(request_id)
    .into_response();
    *response.status_mut() = StatusCode::METHOD_NOT_ALLOWED;
    response
}
