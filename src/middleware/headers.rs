//! OJS protocol headers on HTTP: `OJS-Version` on every response, and refusal of other versions.

use axum::extract::Request;
use axum::middleware::Next;
use axum::response::Response;
use http::HeaderValue;

use super::{Operation, Protocol, RequestId, reject};
use crate::core::{CoreError, ErrorKind};

/// The OJS version spoken.
pub const OJS_VERSION: &str = "1.0";

/// Checks a client's `OJS-Version` and stamps ours on HTTP responses.
pub async fn ojs_headers(request: Request, next: Next) -> Response {
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
            reject(
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
    response
        .headers_mut()
        .insert("ojs-version", HeaderValue::from_static(OJS_VERSION));
    response
}
