//! What the contracts (`openapi/pgvs3.yaml`, `proto/`) say that more than one layer reads: the
//! operation tables build.rs generates (each operation's role and whether a read-only gateway
//! serves it) and the OJS media type. The middleware reads these without importing an adapter.

use crate::core::Role;

/// The largest request body or gRPC message accepted unless configured (1 MiB).
pub const DEFAULT_MAX_BODY_BYTES: usize = 1_048_576;

/// How long a request's body may take to arrive after its headers: a client that sends part of
/// a body and stalls would otherwise hold its admission slot for as long as it keeps the socket.
pub const BODY_READ_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

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

/// The HTTP operation `id` of the OpenAPI document; an id not in it stands for an operation only
/// an admin may call on a writable gateway, so a typo can only refuse, never grant.
pub fn http_operation(id: &str) -> &'static HttpOperation {
    const UNDECLARED: HttpOperation = HttpOperation {
        id: "undeclared",
        method: "GET",
        path: "",
        read_only: false,
        role: Role::Admin,
    };
    HTTP_OPERATIONS
        .iter()
        .find(|op| op.id == id)
        .unwrap_or(&UNDECLARED)
}

/// gRPC methods served from outside our protos: health checks and reflection. Both only read and
/// reveal nothing of any queue, so they are declared public here, as our protos declare theirs.
pub const OUTSIDE_GRPC_OPERATIONS: &[GrpcOperation] = &[
    GrpcOperation {
        path: "/grpc.health.v1.Health/Check",
        read_only: true,
        role: Role::Public,
    },
    GrpcOperation {
        path: "/grpc.health.v1.Health/Watch",
        read_only: true,
        role: Role::Public,
    },
    GrpcOperation {
        path: "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
        read_only: true,
        role: Role::Public,
    },
    GrpcOperation {
        path: "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
        read_only: true,
        role: Role::Public,
    },
];

/// The dashboard's pages (`/ui/...`): served to anyone by the stack, because each page
/// authorizes itself as the API operation it stands for (`ui::access`), with the token from the
/// bearer header or the login cookie; its form posts check the gateway is writable themselves.
pub const DASHBOARD_OPERATION: HttpOperation = HttpOperation {
    id: "dashboard",
    method: "GET",
    path: "/ui",
    read_only: true,
    role: Role::Public,
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn operations_served_outside_the_generated_router_are_declared() {
        assert_eq!(http_operation("getMetrics").role, Role::Reader);
        assert_eq!(http_operation("no such operation").role, Role::Admin);
    }
}
