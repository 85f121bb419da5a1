//! The gRPC adapter: `ojs.v1.OJSService` (wire-compatible with the public OJS protos),
//! `pgvs3.v1.StreamService` and `pgvs3.v1.AdminService` over the core service. It converts messages
//! and errors; it holds no rule of its own.

mod admin;
mod convert;
mod error;
mod service;
mod streams;

use std::sync::Arc;

use tower::ServiceExt;

use crate::core::Service;
pub use admin::AdminAdapter;
pub use error::status_of;
pub use service::GrpcAdapter;
pub use streams::StreamAdapter;

/// Messages and services generated from `proto/` by build.rs.
#[allow(missing_docs, clippy::all)]
pub mod proto {
    /// The OJS gRPC binding.
    pub mod ojs {
        /// Version 1.
        pub mod v1 {
            tonic::include_proto!("ojs.v1");
        }
    }
    /// pgvs3's own services.
    pub mod pgvs3 {
        /// Version 1.
        pub mod v1 {
            tonic::include_proto!("pgvs3.v1");
        }
    }
}

/// One gRPC method with whether a read-only gateway serves it.
#[derive(Debug, Clone, Copy)]
pub struct GrpcOperation {
    /// `/package.Service/Method`.
    pub path: &'static str,
    /// Declared `idempotency_level = NO_SIDE_EFFECTS`.
    pub read_only: bool,
}

include!(concat!(env!("OUT_DIR"), "/grpc_operations.rs"));

/// The gRPC routes of the service, to merge into the HTTP router (one port) or serve alone.
pub fn router(service: Arc<Service>, max_message_bytes: usize) -> axum::Router {
    use proto::ojs::v1::ojs_service_server::{OjsServiceServer, SERVICE_NAME as OJS};
    use proto::pgvs3::v1::admin_service_server::{AdminServiceServer, SERVICE_NAME as ADMIN};
    use proto::pgvs3::v1::stream_service_server::{SERVICE_NAME as STREAMS, StreamServiceServer};
    let ojs = OjsServiceServer::new(GrpcAdapter::new(service.clone()))
        .max_decoding_message_size(max_message_bytes);
    let streams = StreamServiceServer::new(StreamAdapter::new(service.clone()))
        .max_decoding_message_size(max_message_bytes);
    let admin = AdminServiceServer::new(AdminAdapter::new(service))
        .max_decoding_message_size(max_message_bytes);
    axum::Router::new()
        .route_service(
            &format!("/{OJS}/{{*rest}}"),
            ojs.map_request(|req: http::Request<axum::body::Body>| req.map(tonic::body::Body::new)),
        )
        .route_service(
            &format!("/{STREAMS}/{{*rest}}"),
            streams.map_request(|req: http::Request<axum::body::Body>| {
                req.map(tonic::body::Body::new)
            }),
        )
        .route_service(
            &format!("/{ADMIN}/{{*rest}}"),
            admin.map_request(|req: http::Request<axum::body::Body>| {
                req.map(tonic::body::Body::new)
            }),
        )
}
