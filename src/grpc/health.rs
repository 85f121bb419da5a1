//! `grpc.health.v1.Health`: SERVING while the database answers a ping, NOT_SERVING otherwise, for
//! the server as a whole (empty service name) and for each gRPC service it serves.

use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use futures_util::Stream;
use tonic::{Request, Response, Status};
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_server::Health;
use tonic_health::pb::{HealthCheckRequest, HealthCheckResponse};

use super::{admission_slot, shutdown_signal};
use crate::core::Service;

/// How often a `Watch` stream probes the database again.
pub const WATCH_INTERVAL: Duration = Duration::from_secs(5);

/// The health service over the core service's database probe.
#[derive(Clone)]
pub struct HealthAdapter {
    service: Arc<Service>,
    services: Arc<Vec<String>>,
}

impl HealthAdapter {
    /// Health of `service`, answering for the empty name and for each of `services`.
    pub fn new(service: Arc<Service>, services: Vec<String>) -> Self {
        HealthAdapter {
            service,
            services: Arc::new(services),
        }
    }

    fn knows(&self, name: &str) -> bool {
        name.is_empty() || self.services.iter().any(|s| s == name)
    }
}

async fn probe(service: &Service) -> HealthCheckResponse {
    let status = if service.health().await.database_ok {
        ServingStatus::Serving
    } else {
        ServingStatus::NotServing
    };
    HealthCheckResponse {
        status: status as i32,
    }
}

type WatchStream = Pin<Box<dyn Stream<Item = Result<HealthCheckResponse, Status>> + Send>>;

#[tonic::async_trait]
impl Health for HealthAdapter {
    async fn check(
        &self,
        request: Request<HealthCheckRequest>,
    ) -> Result<Response<HealthCheckResponse>, Status> {
        let name = request.into_inner().service;
        if !self.knows(&name) {
            return Err(Status::not_found(format!("unknown service {name:?}")));
        }
        Ok(Response::new(probe(&self.service).await))
    }

    type WatchStream = WatchStream;

    async fn watch(
        &self,
        request: Request<HealthCheckRequest>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        // A watch lasts as long as the client wants: it holds no admission slot.
        admission_slot(&request).release();
        let shutdown = shutdown_signal(&request);
        let name = request.into_inner().service;
        let known = self.knows(&name);
        // The status at once, then again on each change (SERVICE_UNKNOWN once for an unknown
        // name); the stream stays open until the client leaves or the server shuts down.
        let state = (self.service.clone(), None::<i32>, shutdown);
        let stream =
            futures_util::stream::unfold(state, move |(service, last, mut shutdown)| async move {
                loop {
                    if last.is_some() {
                        tokio::select! {
                            _ = shutdown.requested() => return None,
                            _ = tokio::time::sleep(WATCH_INTERVAL) => {}
                        }
                    }
                    let now = if known {
                        probe(&service).await
                    } else {
                        HealthCheckResponse {
                            status: ServingStatus::ServiceUnknown as i32,
                        }
                    };
                    if last != Some(now.status) {
                        let status = now.status;
                        return Some((Ok(now), (service, Some(status), shutdown)));
                    }
                }
            });
        Ok(Response::new(Box::pin(stream)))
    }
}
