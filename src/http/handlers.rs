//! The generated `HttpApi` trait implemented over the core service: conversion only.

use std::sync::Arc;

use super::api::{self, types};
use super::{ApiError, RequestContext, convert};
use crate::core::time::format_time;
use crate::core::{AckJob, FetchJobs, NackJob, Service};

/// The HTTP binding of the service.
pub struct HttpAdapter {
    service: Arc<Service>,
}

impl HttpAdapter {
    /// An adapter over `service`.
    pub fn new(service: Arc<Service>) -> Self {
        HttpAdapter { service }
    }
}

impl api::HttpApi for HttpAdapter {
    async fn get_manifest(
        &self,
        _ctx: RequestContext,
    ) -> Result<api::GetManifestResponse, ApiError> {
        let m = self.service.manifest();
        let cap = |name: &str| m.capabilities.iter().any(|(n, on)| *n == name && *on);
        Ok(api::GetManifestResponse::Ok(types::Manifest {
            specversion: m.ojs_version.to_string(),
            ojs_version: m.ojs_version.to_string(),
            implementation: types::Implementation {
                name: "pgvs3".to_string(),
                version: m.version.to_string(),
                language: "rust".to_string(),
                repository: None,
            },
            conformance_level: i64::from(m.conformance_level),
            conformance_tier: Some("runtime".to_string()),
            protocols: m.protocols.iter().map(|p| p.to_string()).collect(),
            backend: m.backend.to_string(),
            capabilities: types::Capabilities {
                batch_enqueue: cap("batch_enqueue"),
                cron_jobs: cap("cron_jobs"),
                dead_letter: cap("dead_letter"),
                delayed_jobs: cap("delayed_jobs"),
                job_ttl: cap("job_ttl"),
                priority_queues: cap("priority_queues"),
                rate_limiting: cap("rate_limiting"),
                schema_validation: cap("schema_validation"),
                unique_jobs: cap("unique_jobs"),
                workflows: cap("workflows"),
                pause_resume: cap("pause_resume"),
            },
            extensions: m.extensions.iter().map(|e| e.to_string()).collect(),
            unique_job_strength: None,
            limits: m.limits.as_object().cloned(),
        }))
    }

    async fn get_health(&self, _ctx: RequestContext) -> Result<api::GetHealthResponse, ApiError> {
        let h = self.service.health().await;
        let body = types::Health {
            status: if h.database_ok { "ok" } else { "degraded" }.to_string(),
            version: env!("CARGO_PKG_VERSION").to_string(),
            uptime_seconds: h.uptime_seconds as i64,
            read_only: Some(h.read_only),
            backend: types::HealthBackend {
                r#type: "postgres".to_string(),
                status: if h.database_ok { "ok" } else { "unhealthy" }.to_string(),
                latency_ms: Some(h.database_latency.as_millis() as i64),
                error: h.database_error,
            },
        };
        Ok(if h.database_ok {
            api::GetHealthResponse::Ok(body)
        } else {
            api::GetHealthResponse::ServiceUnavailable(body)
        })
    }

    async fn enqueue_job(
        &self,
        _ctx: RequestContext,
        body: types::EnqueueRequest,
    ) -> Result<api::EnqueueJobResponse, ApiError> {
        let job = self.service.enqueue(convert::enqueue(body)).await?;
        Ok(api::EnqueueJobResponse::Created {
            location: format!("/ojs/v1/jobs/{}", job.id),
            body: types::JobEnvelope {
                job: convert::job(&job, false),
            },
        })
    }

    async fn get_job(
        &self,
        _ctx: RequestContext,
        id: String,
    ) -> Result<api::GetJobResponse, ApiError> {
        let job = self.service.get_job(&id).await?;
        Ok(api::GetJobResponse::Ok(types::JobEnvelope {
            job: convert::job(&job, false),
        }))
    }

    async fn cancel_job(
        &self,
        _ctx: RequestContext,
        id: String,
    ) -> Result<api::CancelJobResponse, ApiError> {
        let job = self.service.cancel_job(&id).await?;
        Ok(api::CancelJobResponse::Ok(types::JobEnvelope {
            job: convert::job(&job, false),
        }))
    }

    async fn fetch_jobs(
        &self,
        ctx: RequestContext,
        body: types::FetchRequest,
    ) -> Result<api::FetchJobsResponse, ApiError> {
        let request = FetchJobs {
            queues: body.queues,
            count: body.count,
            worker_id: body.worker_id,
            visibility_timeout_ms: body.visibility_timeout_ms,
            wait_ms: body.wait_ms,
        };
        let jobs = self
            .service
            .fetch_then_idle(request, || ctx.admission.release())
            .await?;
        let jobs: Vec<types::Job> = jobs.iter().map(|j| convert::job(j, true)).collect();
        Ok(api::FetchJobsResponse::Ok(types::FetchResponse {
            job: jobs.first().cloned(),
            jobs,
        }))
    }

    async fn ack_job(
        &self,
        _ctx: RequestContext,
        body: types::AckRequest,
    ) -> Result<api::AckJobResponse, ApiError> {
        let job = self
            .service
            .ack(AckJob {
                job_id: body.job_id,
                lease_token: body.lease_token,
                result: body.result,
            })
            .await?;
        let wire = convert::job(&job, false);
        Ok(api::AckJobResponse::Ok(types::AckResponse {
            acknowledged: true,
            id: wire.id.clone(),
            job_id: wire.id.clone(),
            state: wire.state.clone(),
            completed_at: job
                .completed_at
                .as_ref()
                .map(format_time)
                .unwrap_or_default(),
            job: wire,
        }))
    }

    async fn nack_job(
        &self,
        _ctx: RequestContext,
        body: types::NackRequest,
    ) -> Result<api::NackJobResponse, ApiError> {
        let job = self
            .service
            .nack(NackJob {
                job_id: body.job_id,
                lease_token: body.lease_token,
                failure: convert::failure(body.error),
                requeue: body.requeue.unwrap_or(false),
            })
            .await?;
        Ok(api::NackJobResponse::Ok(convert::nack_response(&job)))
    }

    async fn list_queues(&self, _ctx: RequestContext) -> Result<api::ListQueuesResponse, ApiError> {
        let queues = self.service.list_queues().await?;
        let total = queues.len() as i64;
        Ok(api::ListQueuesResponse::Ok(types::QueueList {
            queues: queues
                .into_iter()
                .map(|q| types::QueueSummary {
                    name: q.name,
                    status: if q.paused { "paused" } else { "active" }.to_string(),
                    created_at: format_time(&q.created_at),
                })
                .collect(),
            pagination: types::Pagination {
                total,
                has_more: false,
                limit: None,
                offset: None,
                next_cursor: None,
            },
        }))
    }

    async fn activate_job(
        &self,
        _ctx: RequestContext,
        id: String,
    ) -> Result<api::ActivateJobResponse, ApiError> {
        let job = self.service.activate_job(&id).await?;
        Ok(api::ActivateJobResponse::Ok(types::JobEnvelope {
            job: convert::job(&job, false),
        }))
    }

    async fn heartbeat(
        &self,
        _ctx: RequestContext,
        body: types::HeartbeatRequest,
    ) -> Result<api::HeartbeatResponse, ApiError> {
        let outcome = self.service.heartbeat(convert::heartbeat(body)?).await?;
        let directive = outcome.directive.as_str().to_string();
        Ok(api::HeartbeatResponse::Ok(types::HeartbeatResponse {
            state: directive.clone(),
            directive,
            jobs_extended: outcome
                .extended
                .iter()
                .map(|(id, _)| id.to_string())
                .collect(),
            server_time: format_time(&chrono::Utc::now()),
        }))
    }

    async fn list_dead_letter(
        &self,
        _ctx: RequestContext,
        query: api::ListDeadLetterQuery,
    ) -> Result<api::ListDeadLetterResponse, ApiError> {
        let page = self
            .service
            .dead_letters(query.queue.as_deref(), query.limit, query.offset)
            .await?;
        let has_more = page.offset + (page.jobs.len() as i64) < page.total;
        Ok(api::ListDeadLetterResponse::Ok(types::DeadLetterList {
            jobs: page.jobs.iter().map(|j| convert::job(j, false)).collect(),
            pagination: types::Pagination {
                total: page.total,
                has_more,
                limit: Some(page.limit),
                offset: Some(page.offset),
                next_cursor: None,
            },
        }))
    }

    async fn retry_dead_letter(
        &self,
        _ctx: RequestContext,
        id: String,
        _body: Option<types::Empty>,
    ) -> Result<api::RetryDeadLetterResponse, ApiError> {
        let job = self.service.retry_dead_letter(&id).await?;
        Ok(api::RetryDeadLetterResponse::Ok(types::JobEnvelope {
            job: convert::job(&job, false),
        }))
    }

    async fn delete_dead_letter(
        &self,
        _ctx: RequestContext,
        id: String,
    ) -> Result<api::DeleteDeadLetterResponse, ApiError> {
        let job = self.service.delete_dead_letter(&id).await?;
        Ok(api::DeleteDeadLetterResponse::Ok(types::Deleted {
            deleted: true,
            job_id: job.id.to_string(),
        }))
    }
}
