//! OJS protocol headers on HTTP: `OJS-Version` on every response, refusal of versions other than
//! 1.x, and the Content-Type of JSON answers (`application/openjobspec+json`, or
//! `application/json` for clients that read no other, with `--http-content-type json`).

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::Response;
use http::HeaderValue;

use super::{Operation, Protocol, StackState};
use crate::contract::OJS_MEDIA_TYPE;
use crate::core::{CoreError, ErrorKind};

/// The OJS version spoken.
pub const OJS_VERSION: &str = "1.0";

/// Whether a client's `OJS-Version` names a 1.x version: major 1 in semantic-version terms
/// (`1`, `1.0`, `1.0.0`, `1.1`, `1.0.0-rc.1`, `1.0.0+build`).
fn speaks_v1(version: &str) -> bool {
    let core = version.split(['-', '+']).next().unwrap_or("");
    let mut parts = core.split('.');
    parts.next() == Some("1")
        && core.split('.').count() <= 3
        && parts.all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
        && version
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b".-+".contains(&b))
}

/// `unsupported` when an HTTP request asks for an OJS version other than 1.x, or names versions
/// in several `OJS-Version` headers (one checked, another meant: refused like an unknown one).
pub fn check_version(request: &Request) -> Result<(), CoreError> {
    let mut values = request.headers().get_all("ojs-version").iter();
    let Some(value) = values.next() else {
        return Ok(());
    };
    let version = value.to_str().unwrap_or("").trim();
    if values.next().is_none() && speaks_v1(version) {
        return Ok(());
    }
    Err(CoreError::new(
        ErrorKind::Unsupported,
        format!(
            "OJS-Version {version:?} is not supported; this server speaks {OJS_VERSION} (any 1.x is accepted)"
        ),
    ))
}

/// Stamps `OJS-Version` on HTTP responses and sets their JSON media type. A response is gRPC
/// when its route said so, or, unrouted, when it is a gRPC answer.
pub async fn ojs_headers(
    State(state): State<Arc<StackState>>,
    request: Request,
    next: Next,
) -> Response {
    let mut response = next.run(request).await;
    let grpc = match response.extensions().get::<Operation>() {
        Some(op) => op.protocol == Protocol::Grpc,
        None => super::operation::is_grpc(response.headers()),
    };
    if grpc {
        return response;
    }
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

#[cfg(test)]
mod tests {
    use super::speaks_v1;

    #[test]
    fn every_1x_spelling_is_spoken() {
        for v in ["1", "1.0", "1.0.0", "1.1", "1.0.0-rc.1", "1.2.3+build.5"] {
            assert!(speaks_v1(v), "{v}");
        }
        for v in [
            "2.0", "0.9", "", "1.", "1..0", "1.0.0.0", "v1", "1.x", "10", "1.0 ; x",
        ] {
            assert!(!speaks_v1(v), "{v}");
        }
    }
}
