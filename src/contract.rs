//! What the contracts (`openapi/pgvs3.yaml`, `proto/`) say that more than one layer reads: the
//! operation tables build.rs generates (each operation's role and whether a read-only gateway
//! serves it) and the OJS media type. The middleware reads these without importing an adapter.

use crate::core::Role;

/// The OJS media type of every JSON response.
pub const OJS_MEDIA_TYPE: &str = "application/openjobspec+json";

/// One HTTP operation of the OpenAPI document.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HttpOperation {
    /// The operationId.
    pub id: &'static str,
    /// The HTTP method, upper case.
    pub method: &'static str,
    /// The path template, `{name}` for a parameter.
    pub path: &'static str,
    /// Whether a read-only gateway serves it.
    pub read_only: bool,
    /// The role a token needs (`x-role`).
    pub role: Role,
}

include!(concat!(env!("OUT_DIR"), "/http_operations.rs"));

/// One gRPC method with whether a read-only gateway serves it and the role it needs.
#[derive(Debug, Clone, Copy)]
pub struct GrpcOperation {
    /// `/package.Service/Method`.
    pub path: &'static str,
    /// Declared `idempotency_level = NO_SIDE_EFFECTS`.
    pub read_only: bool,
    /// Declared `(pgvs3.v1.role)`.
    pub role: Role,
}

include!(concat!(env!("OUT_DIR"), "/grpc_operations.rs"));
