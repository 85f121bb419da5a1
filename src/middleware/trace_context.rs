//! W3C trace context: a request's `traceparent`/`tracestate` (HTTP header or gRPC metadata, the
//! same thing on the wire) become the parent of its span, so spans join the caller's trace.

use opentelemetry::propagation::{Extractor, TextMapPropagator};
use opentelemetry_sdk::propagation::TraceContextPropagator;

/// Reads propagation fields from HTTP headers.
struct Headers<'a>(&'a http::HeaderMap);

impl Extractor for Headers<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(|k| k.as_str()).collect()
    }
}

/// The caller's trace context, if the request carries one.
pub fn extract(headers: &http::HeaderMap) -> opentelemetry::Context {
    TraceContextPropagator::new().extract(&Headers(headers))
}

/// The caller's `traceparent` and `tracestate`, as sent, for storing with a job or message.
pub fn carried(headers: &http::HeaderMap) -> Option<(String, Option<String>)> {
    let parent = headers
        .get("traceparent")?
        .to_str()
        .ok()?
        .trim()
        .to_string();
    // version-traceid-spanid-flags; anything else is not W3C trace context.
    let parts: Vec<&str> = parent.split('-').collect();
    let valid = parts.len() == 4
        && parts[1].len() == 32
        && parts[2].len() == 16
        && parts
            .iter()
            .all(|p| p.chars().all(|c| c.is_ascii_hexdigit()));
    if !valid {
        return None;
    }
    let state = headers
        .get("tracestate")
        .and_then(|v| v.to_str().ok())
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty() && s.len() <= 512);
    Some((parent, state))
}

/// The trace context a request carried, kept in its extensions for the adapters.
#[derive(Debug, Clone)]
pub struct CarriedTrace {
    /// `traceparent`.
    pub parent: String,
    /// `tracestate`.
    pub state: Option<String>,
}
