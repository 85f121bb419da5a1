//! `pgvs3.v1.WorkerService` implemented over the core service: the worker extensions (batch ack),
//! conversion only.

use std::sync::Arc;

use tonic::{Request, Response, Status};

use super::convert::{self, created_at};
use super::proto::pgvs3::v1 as pb;
use super::proto::pgvs3::v1::worker_service_server::WorkerService;
use super::{answer, request_id};
use crate::core::{AckJob, Service};

/// The gRPC binding of the worker extensions.
#[derive(Clone)]
pub struct WorkerAdapter {
    service: Arc<Service>,
}

impl WorkerAdapter {
    /// An adapter over `service`.
    pub fn new(service: Arc<Service>) -> Self {
        WorkerAdapter { service }
    }
}

#[tonic::async_trait]
impl WorkerService for WorkerAdapter {
    async fn ack_batch(
        &self,
        request: Request<pb::AckBatchRequest>,
    ) -> Result<Response<pb::AckBatchResponse>, Status> {
        let id = request_id(&request);
        let scope = super::convert::scope(&request);
        let acks: Vec<AckJob> = request
            .into_inner()
            .acks
            .into_iter()
            .map(convert::ack_job)
            .collect();
        let ids: Vec<String> = acks.iter().map(|a| a.job_id.clone()).collect();
        let outcomes = self.service.ack_batch(&scope, acks).await;
        answer(
            &id,
            outcomes.map(|outcomes| {
                let results: Vec<pb::AckOutcome> = ids
                    .into_iter()
                    .zip(outcomes)
                    .map(|(job_id, outcome)| match outcome {
                        Ok(done) => pb::AckOutcome {
                            job_id,
                            acknowledged: true,
                            state: done.state.as_str().to_string(),
                            completed_at: done.completed_at.as_ref().map(created_at),
                            error: None,
                        },
                        Err(error) => pb::AckOutcome {
                            job_id,
                            acknowledged: false,
                            state: String::new(),
                            completed_at: None,
                            error: Some(pb::AckError {
                                code: error.kind.code().to_string(),
                                message: error.message,
                                retryable: error.kind.retryable(),
                            }),
                        },
                    })
                    .collect();
                pb::AckBatchResponse {
                    acknowledged: results.iter().filter(|r| r.acknowledged).count() as i32,
                    results,
                }
            }),
        )
    }
}
