//! The gRPC adapter: `ojs.v1.OJSService` (wire-compatible with the public OJS protos),
//! `pgvs3.v1.StreamService` and `pgvs3.v1.AdminService` over the core service. It converts messages
//! and errors; it holds no rule of its own. Also served: `grpc.health.v1.Health` and gRPC server
//! reflection (v1 and v1alpha).

mod admin;
mod convert;
mod error;
mod health;
pub mod push;
mod service;
mod streams;
mod workers;

use std::sync::Arc;

use tower::ServiceExt;

use crate::core::Service;
pub use admin::AdminAdapter;
pub use error::status_of;
pub use health::HealthAdapter;
pub use service::GrpcAdapter;
pub use streams::StreamAdapter;
pub use workers::WorkerAdapter;

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

/// The request id the middleware set (or a fresh one).
fn request_id<T>(request: &tonic::Request<T>) -> String {
    request
        .extensions()
        .get::<crate::middleware::RequestId>()
        .map(|r| r.0.clone())
        .unwrap_or_else(crate::middleware::RequestId::generate)
}

/// The request's admission slot, to give back when the operation goes idle (or a detached one).
fn admission_slot<T>(request: &tonic::Request<T>) -> crate::middleware::AdmissionSlot {
    request
        .extensions()
        .get::<crate::middleware::AdmissionSlot>()
        .cloned()
        .unwrap_or_default()
}

/// The server's shutdown signal and the request's token, which end long-lived streams.
fn shutdown_signal<T>(request: &tonic::Request<T>) -> push::Shutdown {
    let extensions = request.extensions();
    let token = extensions
        .get::<crate::store::tokens::TokenCheck>()
        .cloned();
    let shutdown = extensions.get::<push::Shutdown>().cloned();
    shutdown.unwrap_or_default().with_token(token)
}

/// Takes the request's per-queue admission permits (a gRPC message names its queues only once
/// tonic has decoded it, after the middleware), or the status that refuses the request.
fn admit_queues(
    extensions: &http::Extensions,
    id: &str,
    queues: impl IntoIterator<Item = String>,
) -> Result<(), tonic::Status> {
    crate::middleware::admit_queues(extensions, queues).map_err(|e| status_of(&e, id))
}

/// Maps a core result to a response, or to a status stamped with the request id.
fn answer<T>(
    id: &str,
    result: Result<T, crate::core::CoreError>,
) -> Result<tonic::Response<T>, tonic::Status> {
    result
        .map(tonic::Response::new)
        .map_err(|e| status_of(&e, id))
}

pub use crate::contract::{GRPC_OPERATIONS, GrpcOperation};

/// The descriptor set of every proto in `proto/`, as build.rs wrote it.
pub const FILE_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/grpc_descriptor.bin"));

/// The gRPC routes of the service, to merge into the HTTP router (one port) or serve alone;
/// long-lived streams end (UNAVAILABLE) once `shutdown` holds true.
pub fn router_until(
    service: Arc<Service>,
    max_message_bytes: usize,
    shutdown: tokio::sync::watch::Receiver<bool>,
) -> axum::Router {
    routes(service, max_message_bytes, push::Shutdown::new(shutdown))
}

/// Hands the shutdown signal to the handlers (they find it in the request's extensions) and
/// converts the body for tonic.
fn with_shutdown<S>(
    service: S,
    shutdown: push::Shutdown,
) -> impl tower::Service<
    http::Request<axum::body::Body>,
    Response = S::Response,
    Error = S::Error,
    Future = S::Future,
> + Clone
+ Send
+ 'static
where
    S: tower::Service<http::Request<tonic::body::Body>> + Clone + Send + 'static,
{
    service.map_request(move |mut request: http::Request<axum::body::Body>| {
        request.extensions_mut().insert(shutdown.clone());
        request.map(tonic::body::Body::new)
    })
}

/// Reflection keeps a stream open for as long as the client likes; it is cheap and read-only, so
/// it gives its admission slot back at once.
fn without_admission<S>(
    service: S,
) -> impl tower::Service<
    http::Request<axum::body::Body>,
    Response = S::Response,
    Error = S::Error,
    Future = S::Future,
> + Clone
+ Send
+ 'static
where
    S: tower::Service<http::Request<tonic::body::Body>> + Clone + Send + 'static,
{
    service.map_request(|request: http::Request<axum::body::Body>| {
        if let Some(slot) = request
            .extensions()
            .get::<crate::middleware::AdmissionSlot>()
        {
            slot.release();
        }
        request.map(tonic::body::Body::new)
    })
}

fn routes(
    service: Arc<Service>,
    max_message_bytes: usize,
    shutdown: push::Shutdown,
) -> axum::Router {
    use proto::ojs::v1::ojs_service_server::{OjsServiceServer, SERVICE_NAME as OJS};
    use proto::pgvs3::v1::admin_service_server::{AdminServiceServer, SERVICE_NAME as ADMIN};
    use proto::pgvs3::v1::stream_service_server::{SERVICE_NAME as STREAMS, StreamServiceServer};
    use proto::pgvs3::v1::worker_service_server::{SERVICE_NAME as WORKERS, WorkerServiceServer};
    use tonic_health::pb::health_server::{HealthServer, SERVICE_NAME as HEALTH};
    let ojs = OjsServiceServer::new(GrpcAdapter::new(service.clone()))
        .max_decoding_message_size(max_message_bytes);
    let streams = StreamServiceServer::new(StreamAdapter::new(service.clone()))
        .max_decoding_message_size(max_message_bytes);
    let admin = AdminServiceServer::new(AdminAdapter::new(service.clone()))
        .max_decoding_message_size(max_message_bytes);
    let workers = WorkerServiceServer::new(WorkerAdapter::new(service.clone()))
        .max_decoding_message_size(max_message_bytes);
    let health = HealthServer::new(HealthAdapter::new(
        service,
        vec![
            OJS.to_string(),
            STREAMS.to_string(),
            ADMIN.to_string(),
            WORKERS.to_string(),
            HEALTH.to_string(),
        ],
    ));
    let mut router = axum::Router::new()
        .route_service(
            &format!("/{OJS}/{{*rest}}"),
            with_shutdown(ojs, shutdown.clone()),
        )
        .route_service(
            &format!("/{STREAMS}/{{*rest}}"),
            with_shutdown(streams, shutdown.clone()),
        )
        .route_service(
            &format!("/{ADMIN}/{{*rest}}"),
            with_shutdown(admin, shutdown.clone()),
        )
        .route_service(
            &format!("/{WORKERS}/{{*rest}}"),
            with_shutdown(workers, shutdown.clone()),
        )
        .route_service(
            &format!("/{HEALTH}/{{*rest}}"),
            with_shutdown(health, shutdown),
        );
    let reflection = || {
        tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
    };
    match reflection().build_v1() {
        Ok(v1) => {
            router = router.route_service(
                "/grpc.reflection.v1.ServerReflection/{*rest}",
                without_admission(v1),
            );
        }
        Err(error) => tracing::warn!(%error, "gRPC reflection v1 is not served"),
    }
    match reflection().build_v1alpha() {
        Ok(v1alpha) => {
            router = router.route_service(
                "/grpc.reflection.v1alpha.ServerReflection/{*rest}",
                without_admission(v1alpha),
            );
        }
        Err(error) => tracing::warn!(%error, "gRPC reflection v1alpha is not served"),
    }
    router
}
