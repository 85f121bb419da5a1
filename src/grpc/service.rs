//! `ojs.v1.OJSService` implemented over the core service: conversion only.

use std::pin::Pin;
use std::sync::Arc;

use futures_util::{Stream, StreamExt};
use tonic::{Request, Response, Status};

use super::convert;
use super::proto::ojs::v1 as pb;
use super::proto::ojs::v1::ojs_service_server::OjsService;
use super::push::{self, EventStream, JobStream, event_message};
use super::status_of;
use super::{admission_slot, admit_queues, answer, request_id, shutdown_signal};
use crate::core::workflow::NewCron;
use crate::core::{CoreError, FetchJobs, Heartbeat, NackJob, Service};

/// The gRPC binding of the service.
#[derive(Clone)]
pub struct GrpcAdapter {
    service: Arc<Service>,
}

impl GrpcAdapter {
    /// An adapter over `service`.
    pub fn new(service: Arc<Service>) -> Self {
        GrpcAdapter { service }
    }
}

/// The W3C trace context the call carried in its metadata.
pub(super) fn carried_trace<T>(request: &Request<T>) -> Option<crate::core::job::TraceContext> {
    request
        .extensions()
        .get::<crate::middleware::CarriedTrace>()
        .map(|t| crate::core::job::TraceContext {
            parent: t.parent.clone(),
            state: t.state.clone(),
        })
}

type BoxStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send + 'static>>;

#[tonic::async_trait]
impl OjsService for GrpcAdapter {
    async fn manifest(
        &self,
        _: Request<pb::ManifestRequest>,
    ) -> Result<Response<pb::ManifestResponse>, Status> {
        let m = self.service.manifest();
        Ok(Response::new(pb::ManifestResponse {
            ojs_version: m.ojs_version.to_string(),
            implementation: Some(pb::Implementation {
                name: "pgvs3".to_string(),
                version: m.version.to_string(),
                language: "rust".to_string(),
            }),
            conformance_level: m.conformance_level,
            protocols: m.protocols.iter().map(|p| p.to_string()).collect(),
            backend: m.backend.to_string(),
            extensions: m.extensions.iter().map(|e| e.to_string()).collect(),
            schema_validation: m
                .capabilities
                .iter()
                .any(|(n, on)| *n == "schema_validation" && *on),
        }))
    }

    async fn health(
        &self,
        _: Request<pb::HealthRequest>,
    ) -> Result<Response<pb::HealthResponse>, Status> {
        let h = self.service.health().await;
        let details = serde_json::json!({
            "database": if h.database_ok { "ok" } else { "unhealthy" },
            "latency_ms": h.database_latency.as_millis() as u64,
            "uptime_seconds": h.uptime_seconds,
            "read_only": h.read_only,
            "error": h.database_error,
        });
        let now = chrono::Utc::now();
        Ok(Response::new(pb::HealthResponse {
            status: if h.database_ok {
                pb::HealthStatus::Ok
            } else {
                pb::HealthStatus::Unhealthy
            } as i32,
            timestamp: Some(convert::created_at(&now)),
            details: details.as_object().map(convert::to_struct),
        }))
    }

    async fn enqueue(
        &self,
        request: Request<pb::EnqueueRequest>,
    ) -> Result<Response<pb::EnqueueResponse>, Status> {
        let id = request_id(&request);
        let trace = carried_trace(&request);
        let (_, extensions, message) = request.into_parts();
        let result = match convert::enqueue(message) {
            Ok(mut job) => {
                admit_queues(&extensions, &id, [job.queue().to_string()])?;
                job.trace_context = trace;
                self.service.enqueue(job).await
            }
            Err(e) => Err(e),
        };
        answer(
            &id,
            result.map(|e| pb::EnqueueResponse {
                job: Some(convert::job(e.job, false)),
            }),
        )
    }

    async fn enqueue_batch(
        &self,
        request: Request<pb::EnqueueBatchRequest>,
    ) -> Result<Response<pb::EnqueueBatchResponse>, Status> {
        let id = request_id(&request);
        let (_, extensions, r) = request.into_parts();
        let jobs = r
            .jobs
            .into_iter()
            .map(|entry| {
                convert::enqueue(pb::EnqueueRequest {
                    r#type: entry.r#type,
                    args: entry.args,
                    options: entry.options.or_else(|| r.default_options.clone()),
                    ..Default::default()
                })
            })
            .collect::<Result<Vec<_>, _>>();
        let result = match jobs {
            Ok(jobs) => {
                admit_queues(&extensions, &id, jobs.iter().map(|j| j.queue().to_string()))?;
                self.service.enqueue_batch(jobs).await
            }
            Err(e) => Err(e),
        };
        answer(
            &id,
            result.map(|jobs| pb::EnqueueBatchResponse {
                count: jobs.len() as i32,
                jobs: jobs.into_iter().map(|j| convert::job(j, false)).collect(),
                errors: Default::default(),
            }),
        )
    }

    async fn get_job(
        &self,
        request: Request<pb::GetJobRequest>,
    ) -> Result<Response<pb::GetJobResponse>, Status> {
        let id = request_id(&request);
        let scope = convert::scope(&request);
        let result = self
            .service
            .get_job(&scope, &request.into_inner().job_id)
            .await;
        answer(
            &id,
            result.map(|job| pb::GetJobResponse {
                job: Some(convert::job(job, false)),
            }),
        )
    }

    async fn cancel_job(
        &self,
        request: Request<pb::CancelJobRequest>,
    ) -> Result<Response<pb::CancelJobResponse>, Status> {
        let id = request_id(&request);
        let scope = convert::scope(&request);
        let result = self
            .service
            .cancel_job(&scope, &request.into_inner().job_id)
            .await;
        answer(
            &id,
            result.map(|job| pb::CancelJobResponse {
                job: Some(convert::job(job, false)),
            }),
        )
    }

    async fn activate_job(
        &self,
        request: Request<pb::ActivateJobRequest>,
    ) -> Result<Response<pb::ActivateJobResponse>, Status> {
        let id = request_id(&request);
        let scope = convert::scope(&request);
        let result = self
            .service
            .activate_job(&scope, &request.into_inner().job_id)
            .await;
        answer(
            &id,
            result.map(|job| pb::ActivateJobResponse {
                job: Some(convert::job(job, false)),
            }),
        )
    }

    async fn fetch(
        &self,
        request: Request<pb::FetchRequest>,
    ) -> Result<Response<pb::FetchResponse>, Status> {
        let id = request_id(&request);
        admit_queues(request.extensions(), &id, request.get_ref().queues.clone())?;
        let slot = admission_slot(&request);
        let r = request.into_inner();
        let fetch = FetchJobs {
            queues: r.queues,
            count: (r.count != 0).then_some(i64::from(r.count)),
            worker_id: (!r.worker_id.is_empty()).then_some(r.worker_id),
            visibility_timeout_ms: (r.visibility_timeout_ms != 0)
                .then_some(r.visibility_timeout_ms),
            wait_ms: (r.wait_ms != 0).then_some(r.wait_ms),
        };
        let result = self.service.fetch_then_idle(fetch, || slot.release()).await;
        answer(
            &id,
            result.map(|jobs| pb::FetchResponse {
                jobs: jobs.into_iter().map(|j| convert::job(j, true)).collect(),
            }),
        )
    }

    async fn ack(
        &self,
        request: Request<pb::AckRequest>,
    ) -> Result<Response<pb::AckResponse>, Status> {
        let id = request_id(&request);
        let scope = convert::scope(&request);
        let acked = self
            .service
            .ack(&scope, convert::ack_job(request.into_inner()))
            .await;
        answer(
            &id,
            acked.map(|job| pb::AckResponse {
                acknowledged: true,
                job: Some(convert::job(job, false)),
            }),
        )
    }

    async fn nack(
        &self,
        request: Request<pb::NackRequest>,
    ) -> Result<Response<pb::NackResponse>, Status> {
        let id = request_id(&request);
        let scope = convert::scope(&request);
        let r = request.into_inner();
        let result = self
            .service
            .nack(
                &scope,
                NackJob {
                    job_id: r.job_id,
                    lease_token: (!r.lease_token.is_empty()).then_some(r.lease_token),
                    failure: convert::failure(r.error.unwrap_or_default()),
                    requeue: r.requeue,
                },
            )
            .await;
        answer(
            &id,
            result.map(|job| {
                let next_attempt_at = convert::next_attempt_at(&job);
                let (retry_delay_ms, attempt, max_attempts) = (
                    job.retry_delay_ms.unwrap_or(0),
                    job.attempt,
                    job.max_attempts,
                );
                let wire = convert::job(job, false);
                pb::NackResponse {
                    state: wire.state,
                    next_attempt_at,
                    retry_delay_ms,
                    attempt,
                    max_attempts,
                    job: Some(wire),
                }
            }),
        )
    }

    async fn heartbeat(
        &self,
        request: Request<pb::HeartbeatRequest>,
    ) -> Result<Response<pb::HeartbeatResponse>, Status> {
        let id = request_id(&request);
        let scope = convert::scope(&request);
        let r = request.into_inner();
        // `id` names a job when it parses as one; otherwise it is the worker's id.
        let mut job_ids = r.job_ids;
        let id_is_job = uuid::Uuid::try_parse(&r.id).is_ok();
        if id_is_job {
            job_ids.push(r.id.clone());
        }
        let worker_id = if !r.worker_id.is_empty() || id_is_job {
            r.worker_id
        } else {
            r.id
        };
        let visibility = if r.visibility_timeout_ms != 0 {
            Some(r.visibility_timeout_ms)
        } else {
            r.extend_by.as_ref().map(super::convert::duration_ms)
        };
        let result = self
            .service
            .heartbeat(
                &scope,
                Heartbeat {
                    worker_id,
                    job_ids,
                    lease_token: (!r.lease_token.is_empty()).then_some(r.lease_token),
                    visibility_timeout_ms: visibility,
                },
            )
            .await;
        answer(
            &id,
            result.map(|outcome| pb::HeartbeatResponse {
                directed_state: convert::directive(outcome.directive) as i32,
                new_deadline: outcome
                    .extended
                    .iter()
                    .map(|(_, until)| *until)
                    .min()
                    .map(|t| convert::created_at(&t)),
                jobs_extended: outcome
                    .extended
                    .iter()
                    .map(|(job, _)| job.to_string())
                    .collect(),
            }),
        )
    }

    type StreamJobsStream = BoxStream<pb::Job>;

    async fn stream_jobs(
        &self,
        request: Request<pb::StreamJobsRequest>,
    ) -> Result<Response<Self::StreamJobsStream>, Status> {
        let id = request_id(&request);
        admit_queues(request.extensions(), &id, request.get_ref().queues.clone())?;
        let slot = admission_slot(&request);
        let shutdown = shutdown_signal(&request);
        let r = request.into_inner();
        let wanted = JobStream {
            queues: r.queues,
            worker_id: (!r.worker_id.is_empty()).then_some(r.worker_id),
            max_concurrent: r.max_concurrent,
        };
        let jobs = push::jobs(self.service.clone(), wanted, shutdown)
            .await
            .map_err(|e| status_of(&e, &id))?;
        // A stream lasts as long as its worker: it holds no admission slot.
        slot.release();
        let stream = jobs.map(move |job| {
            job.map(|j| convert::job(j, true))
                .map_err(|e| status_of(&e, &id))
        });
        Ok(Response::new(Box::pin(stream)))
    }

    type StreamEventsStream = BoxStream<pb::Event>;

    async fn stream_events(
        &self,
        request: Request<pb::StreamEventsRequest>,
    ) -> Result<Response<Self::StreamEventsStream>, Status> {
        let id = request_id(&request);
        let slot = admission_slot(&request);
        let shutdown = shutdown_signal(&request);
        let scope = convert::scope(&request);
        let r = request.into_inner();
        let filter = EventStream {
            queues: r.queues,
            event_types: r.event_types,
            job_id: (!r.job_id.is_empty()).then_some(r.job_id),
            workflow_id: (!r.workflow_id.is_empty()).then_some(r.workflow_id),
        };
        let events = push::events(self.service.clone(), scope, filter, shutdown)
            .await
            .map_err(|e| status_of(&e, &id))?;
        slot.release();
        let stream = events.map(move |item| {
            item.map(|pushed| event_message(&pushed))
                .map_err(|e| status_of(&e, &id))
        });
        Ok(Response::new(Box::pin(stream)))
    }

    async fn list_queues(
        &self,
        request: Request<pb::ListQueuesRequest>,
    ) -> Result<Response<pb::ListQueuesResponse>, Status> {
        let id = request_id(&request);
        let scope = convert::scope(&request);
        let r = request.into_inner();
        let page = crate::core::page::PageRequest {
            limit: Some(i64::from(r.limit)),
            cursor: Some(r.cursor),
        };
        let result = self.service.list_queues(&scope, true, &page).await;
        answer(
            &id,
            result.map(|page| pb::ListQueuesResponse {
                queues: page
                    .items
                    .iter()
                    .map(|q| pb::QueueInfo {
                        name: q.name.clone(),
                        paused: q.paused,
                        available_count: q.available.unwrap_or_default(),
                        created_at: Some(convert::created_at(&q.created_at)),
                    })
                    .collect(),
                next_cursor: page.next_cursor.unwrap_or_default(),
            }),
        )
    }

    async fn queue_stats(
        &self,
        request: Request<pb::QueueStatsRequest>,
    ) -> Result<Response<pb::QueueStatsResponse>, Status> {
        let id = request_id(&request);
        admit_queues(request.extensions(), &id, [request.get_ref().queue.clone()])?;
        let queue = request.into_inner().queue;
        let result = self.service.queue_stats(&queue).await;
        answer(
            &id,
            result.map(|stats| pb::QueueStatsResponse {
                queue,
                stats: Some(pb::QueueStatistics {
                    available: stats.available,
                    active: stats.active,
                    scheduled: stats.scheduled,
                    retryable: stats.retryable,
                    dead: stats.dead_letters,
                    completed_last_hour: stats.completed_last_hour,
                    failed_last_hour: stats.failed_last_hour,
                    paused: stats.paused,
                    avg_duration_ms: stats.avg_duration_ms,
                    avg_wait_ms: stats.avg_wait_ms,
                    throughput_per_second: stats.throughput_per_second,
                }),
            }),
        )
    }

    async fn pause_queue(
        &self,
        request: Request<pb::PauseQueueRequest>,
    ) -> Result<Response<pb::PauseQueueResponse>, Status> {
        let id = request_id(&request);
        admit_queues(request.extensions(), &id, [request.get_ref().queue.clone()])?;
        let queue = request.into_inner().queue;
        let result = self.service.set_paused(&queue, true).await;
        answer(&id, result.map(|_| pb::PauseQueueResponse {}))
    }

    async fn resume_queue(
        &self,
        request: Request<pb::ResumeQueueRequest>,
    ) -> Result<Response<pb::ResumeQueueResponse>, Status> {
        let id = request_id(&request);
        admit_queues(request.extensions(), &id, [request.get_ref().queue.clone()])?;
        let queue = request.into_inner().queue;
        let result = self.service.set_paused(&queue, false).await;
        answer(&id, result.map(|_| pb::ResumeQueueResponse {}))
    }

    async fn list_dead_letter(
        &self,
        request: Request<pb::ListDeadLetterRequest>,
    ) -> Result<Response<pb::ListDeadLetterResponse>, Status> {
        let id = request_id(&request);
        let scope = convert::scope(&request);
        let r = request.into_inner();
        // The cursor is the offset of the next page.
        let offset = match r.cursor.as_str() {
            "" => Ok(None),
            cursor => cursor.parse::<i64>().map(Some).map_err(|_| {
                CoreError::invalid(format!(
                    "cursor {cursor:?} is not a cursor this server issued"
                ))
            }),
        };
        let result = match offset {
            Ok(offset) => {
                let queue = (!r.queue.is_empty()).then_some(r.queue);
                let limit = (r.limit != 0).then_some(i64::from(r.limit));
                self.service
                    .dead_letters(&scope, queue.as_deref(), limit, offset)
                    .await
            }
            Err(e) => Err(e),
        };
        answer(
            &id,
            result.map(|page| pb::ListDeadLetterResponse {
                next_cursor: page
                    .next_offset()
                    .map(|n| n.to_string())
                    .unwrap_or_default(),
                total_count: page.total,
                jobs: page
                    .jobs
                    .into_iter()
                    .map(|j| convert::job(j, false))
                    .collect(),
            }),
        )
    }

    async fn retry_dead_letter(
        &self,
        request: Request<pb::RetryDeadLetterRequest>,
    ) -> Result<Response<pb::RetryDeadLetterResponse>, Status> {
        let id = request_id(&request);
        let scope = convert::scope(&request);
        let result = self
            .service
            .retry_dead_letter(&scope, &request.into_inner().job_id)
            .await;
        answer(
            &id,
            result.map(|job| pb::RetryDeadLetterResponse {
                job: Some(convert::job(job, false)),
            }),
        )
    }

    async fn delete_dead_letter(
        &self,
        request: Request<pb::DeleteDeadLetterRequest>,
    ) -> Result<Response<pb::DeleteDeadLetterResponse>, Status> {
        let id = request_id(&request);
        let scope = convert::scope(&request);
        let result = self
            .service
            .delete_dead_letter(&scope, &request.into_inner().job_id)
            .await;
        answer(&id, result.map(|_| pb::DeleteDeadLetterResponse {}))
    }

    async fn register_cron(
        &self,
        request: Request<pb::RegisterCronRequest>,
    ) -> Result<Response<pb::RegisterCronResponse>, Status> {
        let id = request_id(&request);
        let (_, extensions, r) = request.into_parts();
        let result = match convert::enqueue(pb::EnqueueRequest {
            r#type: r.r#type,
            args: r.args,
            options: r.options,
            ..Default::default()
        }) {
            Ok(template) => {
                let cron = NewCron {
                    name: r.name,
                    expression: r.cron,
                    timezone: (!r.timezone.is_empty()).then_some(r.timezone),
                    overlap_policy: None,
                    template,
                };
                admit_queues(&extensions, &id, [cron.queue().to_string()])?;
                self.service.register_cron(cron).await
            }
            Err(e) => Err(e),
        };
        answer(
            &id,
            result.map(|c| pb::RegisterCronResponse {
                name: c.name,
                next_run_at: c.next_run_at.as_ref().map(convert::created_at),
            }),
        )
    }

    async fn unregister_cron(
        &self,
        request: Request<pb::UnregisterCronRequest>,
    ) -> Result<Response<pb::UnregisterCronResponse>, Status> {
        let id = request_id(&request);
        let scope = convert::scope(&request);
        let result = self
            .service
            .unregister_cron(&scope, &request.into_inner().name)
            .await;
        answer(&id, result.map(|_| pb::UnregisterCronResponse {}))
    }

    async fn list_cron(
        &self,
        request: Request<pb::ListCronRequest>,
    ) -> Result<Response<pb::ListCronResponse>, Status> {
        let id = request_id(&request);
        let scope = convert::scope(&request);
        let r = request.into_inner();
        let page = crate::core::page::PageRequest {
            limit: Some(i64::from(r.limit)),
            cursor: Some(r.cursor),
        };
        let result = self.service.list_crons(&scope, &page).await;
        answer(
            &id,
            result.map(|page| pb::ListCronResponse {
                entries: page.items.iter().map(convert::cron_entry).collect(),
                next_cursor: page.next_cursor.unwrap_or_default(),
            }),
        )
    }

    async fn create_workflow(
        &self,
        request: Request<pb::CreateWorkflowRequest>,
    ) -> Result<Response<pb::CreateWorkflowResponse>, Status> {
        let id = request_id(&request);
        let (_, extensions, message) = request.into_parts();
        let result = match convert::new_workflow(message) {
            Ok(workflow) => {
                admit_queues(
                    &extensions,
                    &id,
                    workflow.queues().map(str::to_string).collect::<Vec<_>>(),
                )?;
                self.service.create_workflow(workflow).await
            }
            Err(e) => Err(e),
        };
        answer(
            &id,
            result.map(|w| pb::CreateWorkflowResponse {
                workflow: Some(convert::workflow(&w)),
            }),
        )
    }

    async fn get_workflow(
        &self,
        request: Request<pb::GetWorkflowRequest>,
    ) -> Result<Response<pb::GetWorkflowResponse>, Status> {
        let id = request_id(&request);
        let scope = convert::scope(&request);
        let result = self
            .service
            .get_workflow(&scope, &request.into_inner().workflow_id)
            .await;
        answer(
            &id,
            result.map(|w| pb::GetWorkflowResponse {
                workflow: Some(convert::workflow(&w)),
            }),
        )
    }

    async fn cancel_workflow(
        &self,
        request: Request<pb::CancelWorkflowRequest>,
    ) -> Result<Response<pb::CancelWorkflowResponse>, Status> {
        let id = request_id(&request);
        let scope = convert::scope(&request);
        let result = self
            .service
            .cancel_workflow(&scope, &request.into_inner().workflow_id)
            .await;
        answer(
            &id,
            result.map(|w| pb::CancelWorkflowResponse {
                workflow: Some(convert::workflow(&w)),
            }),
        )
    }
}
