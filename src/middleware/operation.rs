//! Which operation a request is, from the generated HTTP and gRPC operation tables.

use axum::extract::Request;
use axum::middleware::Next;
use axum::response::Response;

use crate::contract::{GRPC_OPERATIONS, HTTP_OPERATIONS};
use crate::core::Role;

/// gRPC services outside our protos that only read.
const READ_ONLY_SERVICES: &[&str] = &[
    "/grpc.health.v1.Health/",
    "/grpc.reflection.v1.ServerReflection/",
    "/grpc.reflection.v1alpha.ServerReflection/",
];

/// The wire protocol of a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    /// OJS JSON over HTTP.
    Http,
    /// gRPC.
    Grpc,
}

/// A classified request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Operation {
    /// The protocol.
    pub protocol: Protocol,
    /// operationId or gRPC method path; `None` for routes in neither table.
    pub id: Option<&'static str>,
    /// Whether a read-only gateway serves it.
    pub read_only: bool,
    /// The role a token needs (declared in the schemas; `Public` for routes in neither table,
    /// which only answer 404, and for health and reflection).
    pub role: Role,
}

fn path_matches(template: &str, path: &str) -> bool {
    let mut t = template.split('/');
    let mut p = path.split('/');
    loop {
        match (t.next(), p.next()) {
            (None, None) => return true,
            (Some(ts), Some(ps)) if ts.starts_with('{') || ts == ps => {}
            _ => return false,
        }
    }
}

/// Whether a path is routed to the gRPC services: a method of the generated table or of a
/// service outside our protos. Routing goes by path, so the content type must not decide.
fn is_grpc_route(path: &str) -> bool {
    GRPC_OPERATIONS.iter().any(|op| op.path == path)
        || READ_ONLY_SERVICES
            .iter()
            .any(|prefix| path.starts_with(prefix))
}

/// Classifies a request by protocol, method and path. `grpc` (the content type says gRPC) only
/// decides for routes in neither table, which answer as errors of that protocol.
pub fn classify(method: &http::Method, path: &str, grpc: bool) -> Operation {
    if grpc || is_grpc_route(path) {
        let found = GRPC_OPERATIONS.iter().find(|op| op.path == path);
        return Operation {
            protocol: Protocol::Grpc,
            id: found.map(|op| op.path),
            // Health checks and reflection only read.
            read_only: found.is_some_and(|op| op.read_only)
                || READ_ONLY_SERVICES
                    .iter()
                    .any(|prefix| path.starts_with(prefix)),
            role: found.map_or(Role::Public, |op| op.role),
        };
    }
    let found = HTTP_OPERATIONS
        .iter()
        .find(|op| op.method == method.as_str() && path_matches(op.path, path));
    Operation {
        protocol: Protocol::Http,
        id: found.map(|op| op.id),
        // Unknown routes only ever answer 404/405, so they may pass the gate.
        read_only: found.is_none_or(|op| op.read_only),
        role: found.map_or(Role::Public, |op| op.role),
    }
}

/// Whether a request is gRPC, by its content type.
pub fn is_grpc(request: &Request) -> bool {
    request
        .headers()
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|ct| ct.starts_with("application/grpc"))
}

/// Stores the request's `Operation` for the layers after it.
pub async fn classify_request(mut request: Request, next: Next) -> Response {
    let op = classify(request.method(), request.uri().path(), is_grpc(&request));
    request.extensions_mut().insert(op);
    next.run(request).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classifies_from_the_generated_tables() {
        let get = classify(&http::Method::GET, "/ojs/v1/jobs/abc", false);
        assert_eq!((get.id, get.read_only), (Some("getJob"), true));
        let cancel = classify(&http::Method::DELETE, "/ojs/v1/jobs/abc", false);
        assert_eq!((cancel.id, cancel.read_only), (Some("cancelJob"), false));
        let fetch = classify(&http::Method::POST, "/ojs/v1/workers/fetch", false);
        assert!(!fetch.read_only);
        let grpc_get = classify(&http::Method::POST, "/ojs.v1.OJSService/GetJob", true);
        assert!(grpc_get.read_only);
        let health = classify(&http::Method::POST, "/grpc.health.v1.Health/Check", true);
        assert!(health.read_only);
        let grpc_fetch = classify(&http::Method::POST, "/ojs.v1.OJSService/Fetch", true);
        assert!(!grpc_fetch.read_only && grpc_fetch.id.is_some());
        // A gRPC route is gRPC whatever the content type says.
        let disguised = classify(&http::Method::POST, "/ojs.v1.OJSService/Enqueue", false);
        assert_eq!(disguised.protocol, Protocol::Grpc);
        assert!(!disguised.read_only && disguised.id.is_some());
    }
}
