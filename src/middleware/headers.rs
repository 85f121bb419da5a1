//! OJS protocol headers on HTTP: `OJS-Version` on every response, refusal of other versions, and
//! the Content-Type of JSON answers (`application/openjobspec+json`, or `application/json` for
//! clients that read no other, with `--http-content-type json`).

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::Response;
use http::HeaderValue;

use super::{Operation, Protocol, RequestId, StackState};
use crate::contract::OJS_MEDIA_TYPE;
use crate::core::{CoreError, ErrorKind};

/// The OJS version spoken.
pub const OJS_VERSION: &str = "1.0";

/// Checks a client's `OJS-Version`, stamps ours on HTTP responses and sets their JSON media type.
pub async fn ojs_headers(
    State(state): State<Arc<StackState>>,
    request: Request,
    next: Next,
) -> Response {
    let http = request
        .extensions()
        .get::<Operation>()
        .is_none_or(|op| op.protocol == Protocol::Http);
    if !http {
        return next.run(request).await;
    }
    let requested = request
        .headers()
        .get("ojs-version")
        .map(|v| v.to_str().unwrap_or("").trim().to_string());
    let mut response = match requested {
        Some(v) if v != "1.0" && v != "1" => {
            let id = request
                .extensions()
                .get::<RequestId>()
                .map(|r| r.0.clone())
                .unwrap_or_default();
            state.reject(
                Protocol::Http,
                CoreError::new(
                    ErrorKind::Unsupported,
                    format!("OJS-Version {v:?} is not supported; this server speaks 1.0"),
                ),
                &id,
            )
        }
        _ => next.run(request).await,
    };
    let headers = response.headers_mut();
    headers.insert("ojs-version", HeaderValue::from_static(OJS_VERSION));
    if state.json_media_type != OJS_MEDIA_TYPE
        && headers
            .get(http::header::CONTENT_TYPE)
            .is_some_and(|ct| ct.as_bytes() == OJS_MEDIA_TYPE.as_bytes())
    {
        headers.insert(
            http::header::CONTENT_TYPE,
            HeaderValue::from_static(state.json_media_type),
        );
    }
    response
}
