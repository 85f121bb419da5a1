//! The operation a request is: attached to the route that serves it (the generated HTTP router
//! and the gRPC method routes each wrap their handler in a `Guard` built from the operation's row
//! of the generated tables), so what is authorized is by construction what is served. A request
//! no route matches never reaches a guard or a handler: it gets 404/405 from the fallback.

use crate::contract::{GrpcOperation, HttpOperation};
use crate::core::Role;

/// The wire protocol of a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    /// OJS JSON over HTTP.
    Http,
    /// gRPC.
    Grpc,
}

/// The operation a route serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Operation {
    /// The protocol.
    pub protocol: Protocol,
    /// operationId or gRPC method path.
    pub id: &'static str,
    /// Whether a read-only gateway serves it.
    pub read_only: bool,
    /// The role a token needs, as declared in the schemas.
    pub role: Role,
}

impl Operation {
    /// An operation of the OpenAPI document.
    pub const fn http(op: &'static HttpOperation) -> Self {
        Operation {
            protocol: Protocol::Http,
            id: op.id,
            read_only: op.read_only,
            role: op.role,
        }
    }

    /// A gRPC method.
    pub const fn grpc(op: &'static GrpcOperation) -> Self {
        Operation {
            protocol: Protocol::Grpc,
            id: op.path,
            read_only: op.read_only,
            role: op.role,
        }
    }
}

/// Whether a request is gRPC by its content type: only for answering requests no route
/// matched in the caller's terms; it never decides an operation or a role.
pub fn is_grpc(headers: &http::HeaderMap) -> bool {
    headers
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|ct| ct.starts_with("application/grpc"))
}
