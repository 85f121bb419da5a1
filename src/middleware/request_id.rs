//! Request ids: echoed from `X-Request-Id` / `x-ojs-request-id`, or generated as `req_<uuidv7>`;
//! also notes the W3C trace context the request carried, for the adapters to store.

use axum::extract::Request;
use axum::middleware::Next;
use axum::response::Response;
use http::HeaderValue;

/// The id of the request being served.
#[derive(Debug, Clone)]
pub struct RequestId(pub String);

impl RequestId {
    /// A fresh server-generated id.
    pub fn generate() -> String {
        format!("req_{}", uuid::Uuid::now_v7())
    }
}

fn acceptable(id: &str) -> bool {
    !id.is_empty() && id.len() <= 128 && id.bytes().all(|b| b.is_ascii_graphic())
}

/// Sets the request id on the request and echoes it on the response.
pub async fn request_id(mut request: Request, next: Next) -> Response {
    let id = ["x-request-id", "x-ojs-request-id"]
        .iter()
        .find_map(|name| {
            request
                .headers()
                .get(*name)?
                .to_str()
                .ok()
                .filter(|v| acceptable(v))
        })
        .map(str::to_string)
        .unwrap_or_else(RequestId::generate);
    request.extensions_mut().insert(RequestId(id.clone()));
    if let Some((parent, state)) = super::trace_context::carried(request.headers()) {
        request
            .extensions_mut()
            .insert(super::CarriedTrace { parent, state });
    }
    let mut response = next.run(request).await;
    if let Ok(value) = HeaderValue::from_str(&id) {
        response.headers_mut().insert("x-request-id", value.clone());
        response.headers_mut().insert("x-ojs-request-id", value);
    }
    response
}
