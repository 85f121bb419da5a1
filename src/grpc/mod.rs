//! The gRPC adapter: `ojs.v1.OJSService` (wire-compatible with the public OJS protos),
//! `pgvs3.v1.StreamService` and `pgvs3.v1.AdminService` over the core service. It converts messages
//! and errors; it holds no rule of its own. Also served: `grpc.health.v1.Health` and gRPC server
//! reflection (v1 and v1alpha).

mod admin;
mod admin_jobs;
mod admin_system;
mod convert;
mod error;
mod health;
pub mod push;
mod service;
mod streams;
mod workers;

use std::sync::Arc;

use tower::ServiceExt;

use crate::contract::OUTSIDE_GRPC_OPERATIONS;
use crate::core::Service;
use crate::middleware::StackState;
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

/// The gRPC routes of the service, one per method, each behind the guard `stack` makes for its
/// row of the operation tables, to merge into the HTTP router (one port) or serve alone;
/// long-lived streams end (UNAVAILABLE) once `shutdown` holds true.
pub fn router_until(
    service: Arc<Service>,
    stack: &Arc<StackState>,
    max_message_bytes: usize,
    shutdown: tokio::sync::watch::Receiver<bool>,
) -> axum::Router {
    let routes = Routes {
        router: axum::Router::new(),
        stack: stack.clone(),
    };
    routes
        .build(service, max_message_bytes, push::Shutdown::new(shutdown))
        .router
}

/// The method routes built so far.
struct Routes {
    router: axum::Router,
    stack: Arc<StackState>,
}

impl Routes {
    /// Routes every method of `service_name` in `table` to `service`, each behind its guard.
    /// Methods a table does not name have no route: they get the unrouted answer.
    fn service<S>(mut self, table: &'static [GrpcOperation], service_name: &str, service: S) -> Self
    where
        S: tower::Service<http::Request<axum::body::Body>, Error = std::convert::Infallible>
            + Clone
            + Send
            + Sync
            + 'static,
        S::Response: axum::response::IntoResponse + 'static,
        S::Future: Send + 'static,
    {
        let prefix = format!("/{service_name}/");
        for op in table.iter().filter(|op| op.path.starts_with(&prefix)) {
            let guard = self.stack.guard(crate::middleware::Operation::grpc(op));
            self.router = self.router.route(
                op.path,
                axum::routing::post_service(service.clone()).route_layer(guard),
            );
        }
        self
    }
}

/// Hands the shutdown signal to the handlers (they find it in the request's extensions),
/// converts the body for tonic, and answers tonic's own refusals of a request it could not read
/// as the client's error (see `client_error`).
fn with_shutdown<S>(
    service: S,
    shutdown: push::Shutdown,
) -> impl tower::Service<
    http::Request<axum::body::Body>,
    Response = http::Response<tonic::body::Body>,
    Error = std::convert::Infallible,
    Future = impl std::future::Future<
        Output = Result<http::Response<tonic::body::Body>, std::convert::Infallible>,
    > + Send,
> + Clone
+ Send
+ 'static
where
    S: tower::Service<
            http::Request<tonic::body::Body>,
            Response = http::Response<tonic::body::Body>,
            Error = std::convert::Infallible,
        > + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
{
    tower::service_fn(move |mut request: http::Request<axum::body::Body>| {
        request.extensions_mut().insert(shutdown.clone());
        let id = request
            .extensions()
            .get::<crate::middleware::RequestId>()
            .map(|r| r.0.clone())
            .unwrap_or_default();
        let call = service.clone().oneshot(request.map(tonic::body::Body::new));
        async move {
            let response = call.await?;
            Ok(client_error(response, &id))
        }
    })
}

/// Tonic refuses a message it cannot decode (or one over the size limit) with a bare status of
/// its own: INTERNAL for bytes that are not the message, RESOURCE_EXHAUSTED for size, and no
/// `ErrorInfo`. Both are the client's doing: answer INVALID_ARGUMENT / RESOURCE_EXHAUSTED with the
/// OJS `ErrorInfo`, as for every other bad request. Our own statuses always carry details.
fn client_error(
    response: http::Response<tonic::body::Body>,
    request_id: &str,
) -> http::Response<tonic::body::Body> {
    let headers = response.headers();
    if headers.contains_key("grpc-status-details-bin") {
        return response;
    }
    let Some(status) = tonic::Status::from_header_map(headers) else {
        return response;
    };
    let error = match status.code() {
        tonic::Code::Internal
            if status.message().starts_with("failed to decode")
                || status.message().starts_with("protocol error")
                || status.message().starts_with("Unexpected EOF decoding")
                || status.message().starts_with("Missing request message") =>
        {
            crate::core::CoreError::invalid(format!(
                "the request message could not be decoded: {}",
                status.message()
            ))
        }
        // A body past the limit (several messages, no declared length) ends in our own
        // `BodyTooLarge`, which tonic reports as UNKNOWN.
        tonic::Code::Unknown if status.message().starts_with(crate::middleware::TOO_LARGE) => {
            crate::core::CoreError::new(
                crate::core::ErrorKind::PayloadTooLarge,
                status.message().to_string(),
            )
        }
        tonic::Code::ResourceExhausted => crate::core::CoreError::new(
            crate::core::ErrorKind::PayloadTooLarge,
            status.message().to_string(),
        ),
        _ => return response,
    };
    status_of(&error, request_id).into_http()
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

impl Routes {
    fn build(
        self,
        service: Arc<Service>,
        max_message_bytes: usize,
        shutdown: push::Shutdown,
    ) -> Self {
        use proto::ojs::v1::ojs_service_server::{OjsServiceServer, SERVICE_NAME as OJS};
        use proto::pgvs3::v1::admin_service_server::{AdminServiceServer, SERVICE_NAME as ADMIN};
        use proto::pgvs3::v1::stream_service_server::{
            SERVICE_NAME as STREAMS, StreamServiceServer,
        };
        use proto::pgvs3::v1::worker_service_server::{
            SERVICE_NAME as WORKERS, WorkerServiceServer,
        };
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
        let mut routes = self
            .service(GRPC_OPERATIONS, OJS, with_shutdown(ojs, shutdown.clone()))
            .service(
                GRPC_OPERATIONS,
                STREAMS,
                with_shutdown(streams, shutdown.clone()),
            )
            .service(
                GRPC_OPERATIONS,
                ADMIN,
                with_shutdown(admin, shutdown.clone()),
            )
            .service(
                GRPC_OPERATIONS,
                WORKERS,
                with_shutdown(workers, shutdown.clone()),
            )
            .service(
                OUTSIDE_GRPC_OPERATIONS,
                HEALTH,
                with_shutdown(health, shutdown),
            );
        let reflection = || {
            tonic_reflection::server::Builder::configure()
                .register_encoded_file_descriptor_set(FILE_DESCRIPTOR_SET)
                .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        };
        match reflection().build_v1() {
            Ok(v1) => {
                routes = routes.service(
                    OUTSIDE_GRPC_OPERATIONS,
                    "grpc.reflection.v1.ServerReflection",
                    without_admission(v1),
                );
            }
            Err(error) => tracing::warn!(%error, "gRPC reflection v1 is not served"),
        }
        match reflection().build_v1alpha() {
            Ok(v1alpha) => {
                routes = routes.service(
                    OUTSIDE_GRPC_OPERATIONS,
                    "grpc.reflection.v1alpha.ServerReflection",
                    without_admission(v1alpha),
                );
            }
            Err(error) => tracing::warn!(%error, "gRPC reflection v1alpha is not served"),
        }
        routes
    }
}
