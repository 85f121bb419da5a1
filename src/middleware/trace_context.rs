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
    if !valid_traceparent(&parent) {
        return None;
    }
    let state = headers
        .get("tracestate")
        .and_then(|v| v.to_str().ok())
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty() && s.len() <= 512);
    Some((parent, state))
}

/// W3C `version-traceid-parentid-flags`: lowercase hex of 2, 32, 16 and 2 digits, version not
/// `ff`, ids not all zero.
fn valid_traceparent(text: &str) -> bool {
    let parts: Vec<&str> = text.split('-').collect();
    let hex = |p: &str, len: usize| {
        p.len() == len
            && p.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    };
    let nonzero = |p: &str| p.bytes().any(|b| b != b'0');
    parts.len() == 4
        && hex(parts[0], 2)
        && parts[0] != "ff"
        && hex(parts[1], 32)
        && nonzero(parts[1])
        && hex(parts[2], 16)
        && nonzero(parts[2])
        && hex(parts[3], 2)
}

#[cfg(test)]
mod tests {
    use super::valid_traceparent;

    #[test]
    fn only_w3c_traceparents_are_valid() {
        let ok = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        assert!(valid_traceparent(ok));
        for bad in [
            "000-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-1",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "garbage",
        ] {
            assert!(!valid_traceparent(bad), "{bad}");
        }
    }
}

/// The trace context a request carried, kept in its extensions for the adapters.
#[derive(Debug, Clone)]
pub struct CarriedTrace {
    /// `traceparent`.
    pub parent: String,
    /// `tracestate`.
    pub state: Option<String>,
}
