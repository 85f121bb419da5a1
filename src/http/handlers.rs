//! The generated `HttpApi` trait implemented over the core service: conversion only.

use std::sync::Arc;

use super::api::{self, types};
use super::{ApiError, RequestContext, convert};
use crate::core::events::EventQuery;
use crate::core::push::{self, Shutdown};
use crate::core::stream::Receive;
use crate::core::{AckJob, CoreError, FetchJobs, NackJob, QueueConfigChanges, Service, validate};
use crate::model::admin::BulkAction;
use crate::model::time::format_time;

/// The HTTP binding of the service.
pub struct HttpAdapter {
    service: Arc<Service>,
    shutdown: Shutdown,
}

impl HttpAdapter {
    /// An adapter over `service`; its event streams end when `shutdown` fires.
    pub fn new(service: Arc<Service>, shutdown: Shutdown) -> Self {
        HttpAdapter { service, shutdown }
    }

    /// The Admin API's routes (`admin.rs`).
    fn admin(&self) -> super::admin::AdminRoutes<'_> {
        super::admin::AdminRoutes(&self.service)
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
            unique_job_strength: Some("strong".to_string()),
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
        ctx: RequestContext,
        body: types::EnqueueRequest,
    ) -> Result<api::EnqueueJobResponse, ApiError> {
        let mut job = convert::enqueue(body)?;
        ctx.admit([job.queue()])?;
        job.trace_context = ctx.trace.clone();
        let enqueued = self.service.enqueue(job).await?;
        let location = format!("/ojs/v1/jobs/{}", enqueued.job.id);
        let body = types::JobEnvelope {
            job: convert::job(enqueued.job, false),
        };
        Ok(if enqueued.created {
            api::EnqueueJobResponse::Created { location, body }
        } else {
            api::EnqueueJobResponse::Ok(body)
        })
    }

    async fn enqueue_jobs(
        &self,
        ctx: RequestContext,
        body: types::EnqueueBatchRequest,
    ) -> Result<api::EnqueueJobsResponse, ApiError> {
        let jobs: Vec<_> = body
            .jobs
            .into_iter()
            .enumerate()
            .map(|(i, j)| {
                let mut job = convert::enqueue(j).map_err(|e| validate::batch_item_error(i, e))?;
                job.trace_context = ctx.trace.clone();
                Ok(job)
            })
            .collect::<Result<_, CoreError>>()?;
        ctx.admit(jobs.iter().map(|j| j.queue()))?;
        let jobs = self.service.enqueue_batch(jobs).await?;
        Ok(api::EnqueueJobsResponse::Created(
            types::EnqueueBatchResponse {
                count: jobs.len() as i64,
                jobs: jobs.into_iter().map(|j| convert::job(j, false)).collect(),
            },
        ))
    }

    async fn get_job(
        &self,
        ctx: RequestContext,
        id: String,
    ) -> Result<api::GetJobResponse, ApiError> {
        let job = self.service.get_job(&ctx.scope(), &id).await?;
        Ok(api::GetJobResponse::Ok(types::JobEnvelope {
            job: convert::job(job, false),
        }))
    }

    async fn cancel_job(
        &self,
        ctx: RequestContext,
        id: String,
    ) -> Result<api::CancelJobResponse, ApiError> {
        let job = self.service.cancel_job(&ctx.scope(), &id).await?;
        Ok(api::CancelJobResponse::Ok(types::JobEnvelope {
            job: convert::job(job, false),
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
        ctx.admit(request.queues.iter().map(String::as_str))?;
        let jobs = self
            .service
            .fetch_then_idle(request, || ctx.admission.release())
            .await?;
        let jobs: Vec<types::Job> = jobs.into_iter().map(|j| convert::job(j, true)).collect();
        Ok(api::FetchJobsResponse::Ok(types::FetchResponse {
            job: jobs.first().cloned(),
            jobs,
        }))
    }

    async fn ack_job(
        &self,
        ctx: RequestContext,
        body: types::AckRequest,
    ) -> Result<api::AckJobResponse, ApiError> {
        let job = self
            .service
            .ack(
                &ctx.scope(),
                AckJob {
                    job_id: body.job_id,
                    lease_token: body.lease_token,
                    result: body.result,
                },
            )
            .await?;
        let completed_at = job
            .completed_at
            .as_ref()
            .map(format_time)
            .unwrap_or_default();
        let wire = convert::job(job, false);
        Ok(api::AckJobResponse::Ok(types::AckResponse {
            acknowledged: true,
            id: wire.id.clone(),
            job_id: wire.id.clone(),
            state: wire.state.clone(),
            completed_at,
            job: wire,
        }))
    }

    async fn ack_jobs(
        &self,
        ctx: RequestContext,
        body: types::AckBatchRequest,
    ) -> Result<api::AckJobsResponse, ApiError> {
        let ids: Vec<String> = body.acks.iter().map(|a| a.job_id.clone()).collect();
        let acks = body
            .acks
            .into_iter()
            .map(|a| AckJob {
                job_id: a.job_id,
                lease_token: a.lease_token,
                result: a.result,
            })
            .collect();
        let outcomes = self.service.ack_batch(&ctx.scope(), acks).await?;
        let results: Vec<types::AckOutcome> = ids
            .into_iter()
            .zip(outcomes)
            .map(|(id, outcome)| convert::ack_outcome(id, outcome, &ctx.request_id))
            .collect();
        Ok(api::AckJobsResponse::Ok(types::AckBatchResponse {
            acknowledged: results.iter().filter(|r| r.acknowledged).count() as i64,
            results,
        }))
    }

    async fn nack_job(
        &self,
        ctx: RequestContext,
        body: types::NackRequest,
    ) -> Result<api::NackJobResponse, ApiError> {
        let job = self
            .service
            .nack(
                &ctx.scope(),
                NackJob {
                    job_id: body.job_id,
                    lease_token: body.lease_token,
                    failure: convert::failure(body.error),
                    requeue: body.requeue.unwrap_or(false),
                },
            )
            .await?;
        Ok(api::NackJobResponse::Ok(convert::nack_response(&job)))
    }

    async fn list_queues(
        &self,
        ctx: RequestContext,
        query: api::ListQueuesQuery,
    ) -> Result<api::ListQueuesResponse, ApiError> {
        let page = self
            .service
            .list_queues(
                &ctx.scope(),
                false,
                &convert::page_request(query.limit, query.cursor),
            )
            .await?;
        let pagination = convert::pagination(&page);
        Ok(api::ListQueuesResponse::Ok(types::QueueList {
            queues: page
                .items
                .into_iter()
                .map(|q| types::QueueSummary {
                    name: q.name,
                    status: if q.paused { "paused" } else { "active" }.to_string(),
                    created_at: format_time(&q.created_at),
                })
                .collect(),
            pagination,
        }))
    }

    async fn activate_job(
        &self,
        ctx: RequestContext,
        id: String,
    ) -> Result<api::ActivateJobResponse, ApiError> {
        let job = self.service.activate_job(&ctx.scope(), &id).await?;
        Ok(api::ActivateJobResponse::Ok(types::JobEnvelope {
            job: convert::job(job, false),
        }))
    }

    async fn heartbeat(
        &self,
        ctx: RequestContext,
        body: types::HeartbeatRequest,
    ) -> Result<api::HeartbeatResponse, ApiError> {
        let outcome = self
            .service
            .heartbeat(&ctx.scope(), convert::heartbeat(body)?)
            .await?;
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
        ctx: RequestContext,
        query: api::ListDeadLetterQuery,
    ) -> Result<api::ListDeadLetterResponse, ApiError> {
        let page = self
            .service
            .dead_letters(
                &ctx.scope(),
                query.queue.as_deref(),
                query.limit,
                query.offset,
            )
            .await?;
        let has_more = page.next_offset().is_some();
        Ok(api::ListDeadLetterResponse::Ok(types::DeadLetterList {
            jobs: page
                .jobs
                .into_iter()
                .map(|j| convert::job(j, false))
                .collect(),
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
        ctx: RequestContext,
        id: String,
        _body: Option<types::Empty>,
    ) -> Result<api::RetryDeadLetterResponse, ApiError> {
        let job = self.service.retry_dead_letter(&ctx.scope(), &id).await?;
        Ok(api::RetryDeadLetterResponse::Ok(types::JobEnvelope {
            job: convert::job(job, false),
        }))
    }

    async fn delete_dead_letter(
        &self,
        ctx: RequestContext,
        id: String,
    ) -> Result<api::DeleteDeadLetterResponse, ApiError> {
        let job = self.service.delete_dead_letter(&ctx.scope(), &id).await?;
        Ok(api::DeleteDeadLetterResponse::Ok(types::Deleted {
            deleted: true,
            job_id: job.id.to_string(),
        }))
    }

    async fn append_message(
        &self,
        ctx: RequestContext,
        q: String,
        body: types::NewMessage,
    ) -> Result<api::AppendMessageResponse, ApiError> {
        ctx.admit([q.as_str()])?;
        let mut message = convert::message(body);
        message.trace_context = ctx.trace.clone();
        let appended = self.service.append(&q, &[message]).await?;
        let first = appended.into_iter().next().ok_or_else(|| {
            crate::core::CoreError::new(crate::core::ErrorKind::Backend, "append returned nothing")
        })?;
        Ok(api::AppendMessageResponse::Created(convert::appended(
            &q, &first,
        )))
    }

    async fn append_messages(
        &self,
        ctx: RequestContext,
        q: String,
        body: types::NewMessages,
    ) -> Result<api::AppendMessagesResponse, ApiError> {
        ctx.admit([q.as_str()])?;
        let messages: Vec<_> = body
            .messages
            .into_iter()
            .map(|m| {
                let mut message = convert::message(m);
                message.trace_context = ctx.trace.clone();
                message
            })
            .collect();
        let appended = self.service.append(&q, &messages).await?;
        Ok(api::AppendMessagesResponse::Created(types::AppendedBatch {
            count: appended.len() as i64,
            messages: appended.iter().map(|a| convert::appended(&q, a)).collect(),
            queue: q,
        }))
    }

    async fn subscribe(
        &self,
        ctx: RequestContext,
        q: String,
        body: types::SubscribeRequest,
    ) -> Result<api::SubscribeResponse, ApiError> {
        ctx.admit([q.as_str()])?;
        let s = self
            .service
            .subscribe(&q, &body.consumer, body.from_tick, body.cooperative)
            .await?;
        let envelope = types::SubscriptionEnvelope {
            consumer: types::Subscription {
                consumer: s.consumer,
                last_tick: s.last_tick,
                cooperative: s.cooperative,
                created: s.created,
            },
        };
        Ok(if s.created {
            api::SubscribeResponse::Created(envelope)
        } else {
            api::SubscribeResponse::Ok(envelope)
        })
    }

    async fn list_consumers(
        &self,
        ctx: RequestContext,
        q: String,
        query: api::ListConsumersQuery,
    ) -> Result<api::ListConsumersResponse, ApiError> {
        ctx.admit([q.as_str()])?;
        let page = self
            .service
            .consumers(&q, &convert::page_request(query.limit, query.cursor))
            .await?;
        Ok(api::ListConsumersResponse::Ok(types::ConsumerList {
            consumers: page.items.iter().map(convert::consumer).collect(),
            pagination: convert::pagination(&page),
        }))
    }

    async fn unsubscribe(
        &self,
        ctx: RequestContext,
        q: String,
        consumer: String,
    ) -> Result<api::UnsubscribeResponse, ApiError> {
        ctx.admit([q.as_str()])?;
        self.service.unsubscribe(&q, &consumer).await?;
        Ok(api::UnsubscribeResponse::Ok(types::Unsubscribed {
            deleted: true,
            consumer,
        }))
    }

    async fn receive(
        &self,
        ctx: RequestContext,
        q: String,
        body: types::ReceiveRequest,
    ) -> Result<api::ReceiveResponse, ApiError> {
        ctx.admit([q.as_str()])?;
        let request = Receive {
            consumer: body.consumer,
            member: body.member,
            max: body.max,
            max_bytes: body.max_bytes,
            wait_ms: body.wait_ms,
        };
        let batch = self
            .service
            .receive(&q, request, || ctx.admission.release())
            .await?;
        Ok(api::ReceiveResponse::Ok(convert::batch(batch)))
    }

    async fn get_batch(
        &self,
        ctx: RequestContext,
        q: String,
        id: String,
    ) -> Result<api::GetBatchResponse, ApiError> {
        ctx.admit([q.as_str()])?;
        let batch = self.service.batch(&q, &id).await?;
        Ok(api::GetBatchResponse::Ok(convert::batch(Some(batch))))
    }

    async fn stream_ack(
        &self,
        ctx: RequestContext,
        body: types::StreamAckRequest,
    ) -> Result<api::StreamAckResponse, ApiError> {
        ctx.admit([body.queue.as_str()])?;
        let cursor = self
            .service
            .stream_ack(&body.queue, &body.batch_id, body.consumer.as_deref())
            .await?;
        Ok(api::StreamAckResponse::Ok(types::StreamAckResponse {
            acknowledged: true,
            batch_id: body.batch_id,
            cursor_tick: cursor,
        }))
    }

    async fn stream_nack(
        &self,
        ctx: RequestContext,
        body: types::StreamNackRequest,
    ) -> Result<api::StreamNackResponse, ApiError> {
        ctx.admit([body.queue.as_str()])?;
        let outcome = self
            .service
            .stream_nack(
                &body.queue,
                &body.batch_id,
                &body.message_id,
                body.consumer.as_deref(),
                body.retry_after.as_deref(),
                body.reason.as_deref(),
            )
            .await?;
        Ok(api::StreamNackResponse::Ok(types::StreamNackResponse {
            outcome: outcome.outcome,
            retry_count: i64::from(outcome.retry_count),
            due_at: outcome.due_at.as_ref().map(format_time),
        }))
    }

    async fn stream_info(
        &self,
        ctx: RequestContext,
        q: String,
    ) -> Result<api::StreamInfoResponse, ApiError> {
        ctx.admit([q.as_str()])?;
        let info = self.service.stream_info(&q).await?;
        Ok(api::StreamInfoResponse::Ok(convert::stream_info(q, &info)))
    }

    async fn get_queue_config(
        &self,
        ctx: RequestContext,
        q: String,
    ) -> Result<api::GetQueueConfigResponse, ApiError> {
        ctx.admit([q.as_str()])?;
        let config = self
            .service
            .queue_config(&q, QueueConfigChanges::default())
            .await?;
        Ok(api::GetQueueConfigResponse::Ok(convert::queue_config(
            &config,
        )))
    }

    async fn set_queue_config(
        &self,
        ctx: RequestContext,
        q: String,
        body: types::QueueConfigUpdate,
    ) -> Result<api::SetQueueConfigResponse, ApiError> {
        ctx.admit([q.as_str()])?;
        let changes = convert::queue_config_changes(body)?;
        let config = self.service.queue_config(&q, changes).await?;
        Ok(api::SetQueueConfigResponse::Ok(convert::queue_config(
            &config,
        )))
    }

    async fn create_queue(
        &self,
        ctx: RequestContext,
        body: types::CreateQueueRequest,
    ) -> Result<api::CreateQueueResponse, ApiError> {
        ctx.admit([body.name.as_str()])?;
        let created = self.service.create_queue(&body.name).await?;
        let queue = self.service.queue_summary(&body.name).await?;
        let envelope = types::QueueEnvelope {
            queue: types::QueueSummary {
                name: queue.name,
                status: if queue.paused { "paused" } else { "active" }.to_string(),
                created_at: format_time(&queue.created_at),
            },
        };
        Ok(if created {
            api::CreateQueueResponse::Created(envelope)
        } else {
            api::CreateQueueResponse::Ok(envelope)
        })
    }

    async fn drop_queue(
        &self,
        ctx: RequestContext,
        q: String,
    ) -> Result<api::DropQueueResponse, ApiError> {
        ctx.admit([q.as_str()])?;
        self.service.drop_queue(&q).await?;
        Ok(api::DropQueueResponse::Ok(types::QueueDropped {
            dropped: true,
            queue: q,
        }))
    }

    async fn queue_stats(
        &self,
        ctx: RequestContext,
        q: String,
    ) -> Result<api::QueueStatsResponse, ApiError> {
        ctx.admit([q.as_str()])?;
        let stats = self.service.queue_stats(&q).await?;
        Ok(api::QueueStatsResponse::Ok(convert::queue_stats(q, &stats)))
    }

    async fn pause_queue(
        &self,
        ctx: RequestContext,
        q: String,
        _body: Option<types::Empty>,
    ) -> Result<api::PauseQueueResponse, ApiError> {
        ctx.admit([q.as_str()])?;
        let paused = self.service.set_paused(&q, true).await?;
        Ok(api::PauseQueueResponse::Ok(types::QueuePaused {
            queue: types::QueuePauseState { name: q, paused },
        }))
    }

    async fn resume_queue(
        &self,
        ctx: RequestContext,
        q: String,
        _body: Option<types::Empty>,
    ) -> Result<api::ResumeQueueResponse, ApiError> {
        ctx.admit([q.as_str()])?;
        let paused = self.service.set_paused(&q, false).await?;
        Ok(api::ResumeQueueResponse::Ok(types::QueuePaused {
            queue: types::QueuePauseState { name: q, paused },
        }))
    }

    async fn list_stream_dead_letters(
        &self,
        ctx: RequestContext,
        q: String,
        query: api::ListStreamDeadLettersQuery,
    ) -> Result<api::ListStreamDeadLettersResponse, ApiError> {
        ctx.admit([q.as_str()])?;
        let page = self
            .service
            .stream_dead_letters(&q, query.limit, query.offset)
            .await?;
        Ok(api::ListStreamDeadLettersResponse::Ok(
            types::StreamDeadLetterList {
                dead_letters: page
                    .letters
                    .iter()
                    .map(convert::stream_dead_letter)
                    .collect(),
                next_offset: page.next_offset,
            },
        ))
    }

    async fn purge_stream_dead_letters(
        &self,
        ctx: RequestContext,
        q: String,
        query: api::PurgeStreamDeadLettersQuery,
    ) -> Result<api::PurgeStreamDeadLettersResponse, ApiError> {
        ctx.admit([q.as_str()])?;
        let purged = self.service.stream_purge(&q, &query.older_than).await?;
        Ok(api::PurgeStreamDeadLettersResponse::Ok(types::Purged {
            purged: i64::from(purged),
        }))
    }

    async fn replay_stream_dead_letter(
        &self,
        ctx: RequestContext,
        q: String,
        id: String,
        _body: Option<types::Empty>,
    ) -> Result<api::ReplayStreamDeadLetterResponse, ApiError> {
        ctx.admit([q.as_str()])?;
        let replayed = self.service.stream_replay(&q, Some(&id)).await?;
        Ok(api::ReplayStreamDeadLetterResponse::Ok(types::Replayed {
            replayed: i64::from(replayed),
        }))
    }

    async fn replay_stream_dead_letters(
        &self,
        ctx: RequestContext,
        q: String,
        _body: Option<types::Empty>,
    ) -> Result<api::ReplayStreamDeadLettersResponse, ApiError> {
        ctx.admit([q.as_str()])?;
        let replayed = self.service.stream_replay(&q, None).await?;
        Ok(api::ReplayStreamDeadLettersResponse::Ok(types::Replayed {
            replayed: i64::from(replayed),
        }))
    }

    async fn list_cron(
        &self,
        ctx: RequestContext,
        query: api::ListCronQuery,
    ) -> Result<api::ListCronResponse, ApiError> {
        let page = self
            .service
            .list_crons(
                &ctx.scope(),
                &convert::page_request(query.limit, query.cursor),
            )
            .await?;
        let entries: Vec<_> = page.items.iter().map(convert::cron).collect();
        Ok(api::ListCronResponse::Ok(types::CronList {
            pagination: convert::pagination(&page),
            cron_jobs: entries.clone(),
            crons: entries,
        }))
    }

    async fn register_cron(
        &self,
        ctx: RequestContext,
        body: types::CronRequest,
    ) -> Result<api::RegisterCronResponse, ApiError> {
        let cron = convert::new_cron(body)?;
        ctx.admit([cron.queue()])?;
        let entry = self.service.register_cron(cron).await?;
        let wire = convert::cron(&entry);
        Ok(api::RegisterCronResponse::Created(types::CronEnvelope {
            cron_job: wire.clone(),
            cron: wire,
        }))
    }

    async fn unregister_cron(
        &self,
        ctx: RequestContext,
        name: String,
    ) -> Result<api::UnregisterCronResponse, ApiError> {
        let entry = self.service.unregister_cron(&ctx.scope(), &name).await?;
        let wire = convert::cron(&entry);
        Ok(api::UnregisterCronResponse::Ok(types::CronEnvelope {
            cron_job: wire.clone(),
            cron: wire,
        }))
    }

    async fn create_workflow(
        &self,
        ctx: RequestContext,
        body: types::WorkflowRequest,
    ) -> Result<api::CreateWorkflowResponse, ApiError> {
        let workflow = convert::new_workflow(body)?;
        ctx.admit(workflow.queues())?;
        let workflow = self.service.create_workflow(workflow).await?;
        Ok(api::CreateWorkflowResponse::Created {
            location: format!("/ojs/v1/workflows/{}", workflow.id),
            body: types::WorkflowEnvelope {
                workflow: convert::workflow(&workflow),
            },
        })
    }

    async fn get_workflow(
        &self,
        ctx: RequestContext,
        id: String,
    ) -> Result<api::GetWorkflowResponse, ApiError> {
        let workflow = self.service.get_workflow(&ctx.scope(), &id).await?;
        Ok(api::GetWorkflowResponse::Ok(types::WorkflowEnvelope {
            workflow: convert::workflow(&workflow),
        }))
    }

    async fn cancel_workflow(
        &self,
        ctx: RequestContext,
        id: String,
    ) -> Result<api::CancelWorkflowResponse, ApiError> {
        let workflow = self.service.cancel_workflow(&ctx.scope(), &id).await?;
        Ok(api::CancelWorkflowResponse::Ok(types::WorkflowEnvelope {
            workflow: convert::workflow(&workflow),
        }))
    }

    async fn list_events(
        &self,
        ctx: RequestContext,
        query: api::ListEventsQuery,
        headers: api::ListEventsHeaders,
        event_stream: bool,
    ) -> Result<api::ListEventsResponse, ApiError> {
        let split = |v: Option<String>| -> Vec<String> {
            v.map(|s| {
                s.split(',')
                    .map(str::trim)
                    .filter(|t| !t.is_empty())
                    .map(str::to_string)
                    .collect()
            })
            .unwrap_or_default()
        };
        let wanted = EventQuery {
            // An EventSource resuming sends the last id it saw; an explicit cursor wins.
            after: query
                .after
                .or(headers.last_event_id.filter(|id| !id.is_empty())),
            types: split(query.types),
            queues: split(query.queues),
            job_types: split(query.job_types),
            limit: query.limit,
        };
        if event_stream {
            let ends = self.shutdown.clone().with_token(ctx.token.clone());
            let events =
                push::follow_events(self.service.clone(), ctx.scope(), wanted, ends).await?;
            // A stream lasts as long as its client: it holds no admission slot.
            ctx.admission.release();
            return Ok(api::ListEventsResponse::OkEventStream(super::event_stream(
                events,
                ctx.request_id,
            )));
        }
        let page = self.service.events(&ctx.scope(), wanted).await?;
        Ok(api::ListEventsResponse::Ok(types::EventPage {
            events: page.events.iter().map(convert::event).collect(),
            cursor: page.cursor,
            has_more: page.has_more,
        }))
    }

    async fn create_token(
        &self,
        ctx: RequestContext,
        body: types::TokenRequest,
    ) -> Result<api::CreateTokenResponse, ApiError> {
        let created = self
            .service
            .create_token(
                ctx.queues.grant(),
                body.name.as_deref(),
                &body.roles,
                body.queues.as_deref().unwrap_or_default(),
            )
            .await?;
        let info = convert::token_info(&created.grant, created.created_at, None);
        Ok(api::CreateTokenResponse::Created(types::CreatedToken {
            name: info.name,
            token: created.token,
            roles: info.roles,
            queues: info.queues,
            created_at: info.created_at,
        }))
    }

    async fn list_tokens(&self, ctx: RequestContext) -> Result<api::ListTokensResponse, ApiError> {
        let tokens = self.service.list_tokens(&ctx.scope()).await?;
        Ok(api::ListTokensResponse::Ok(types::TokenList {
            tokens: tokens
                .iter()
                .map(|t| convert::token_info(&t.grant, t.created_at, t.revoked_at))
                .collect(),
        }))
    }

    async fn revoke_token(
        &self,
        ctx: RequestContext,
        name: String,
    ) -> Result<api::RevokeTokenResponse, ApiError> {
        self.service.revoke_token(&ctx.scope(), &name).await?;
        Ok(api::RevokeTokenResponse::Ok(types::TokenRevoked {
            name,
            revoked: true,
        }))
    }

    // --- OJS Admin API: queues, jobs, bulk, dead letters (conversions in `admin.rs`)

    async fn admin_list_queues(
        &self,
        ctx: RequestContext,
        query: api::AdminListQueuesQuery,
    ) -> Result<api::AdminListQueuesResponse, ApiError> {
        self.admin().list_queues(ctx, query).await
    }

    async fn admin_get_queue(
        &self,
        ctx: RequestContext,
        name: String,
    ) -> Result<api::AdminGetQueueResponse, ApiError> {
        self.admin().get_queue(ctx, name).await
    }

    async fn admin_pause_queue(
        &self,
        ctx: RequestContext,
        name: String,
        _body: Option<types::Empty>,
    ) -> Result<api::AdminPauseQueueResponse, ApiError> {
        let paused = self.admin().set_paused(ctx, name, true).await?;
        Ok(api::AdminPauseQueueResponse::Ok(paused))
    }

    async fn admin_resume_queue(
        &self,
        ctx: RequestContext,
        name: String,
        _body: Option<types::Empty>,
    ) -> Result<api::AdminResumeQueueResponse, ApiError> {
        let paused = self.admin().set_paused(ctx, name, false).await?;
        Ok(api::AdminResumeQueueResponse::Ok(paused))
    }

    async fn admin_purge_queue(
        &self,
        ctx: RequestContext,
        name: String,
        body: types::AdminPurgeRequest,
    ) -> Result<api::AdminPurgeQueueResponse, ApiError> {
        self.admin().purge_queue(ctx, name, body).await
    }

    async fn admin_set_queue_config(
        &self,
        ctx: RequestContext,
        name: String,
        body: types::AdminQueueConfigUpdate,
    ) -> Result<api::AdminSetQueueConfigResponse, ApiError> {
        self.admin().set_queue_config(ctx, name, body).await
    }

    async fn admin_list_jobs(
        &self,
        ctx: RequestContext,
        query: api::AdminListJobsQuery,
    ) -> Result<api::AdminListJobsResponse, ApiError> {
        self.admin().list_jobs(ctx, query).await
    }

    async fn admin_get_job(
        &self,
        ctx: RequestContext,
        id: String,
    ) -> Result<api::AdminGetJobResponse, ApiError> {
        self.admin().get_job(ctx, id).await
    }

    async fn admin_cancel_job(
        &self,
        ctx: RequestContext,
        id: String,
        _body: Option<types::Empty>,
    ) -> Result<api::AdminCancelJobResponse, ApiError> {
        self.admin().cancel_job(ctx, id).await
    }

    async fn admin_retry_job(
        &self,
        ctx: RequestContext,
        id: String,
        _body: Option<types::Empty>,
    ) -> Result<api::AdminRetryJobResponse, ApiError> {
        self.admin().retry_job(ctx, id).await
    }

    async fn admin_bulk_retry(
        &self,
        ctx: RequestContext,
        body: types::AdminBulkRequest,
    ) -> Result<api::AdminBulkRetryResponse, ApiError> {
        let result = self.admin().bulk(ctx, BulkAction::Retry, body).await?;
        Ok(api::AdminBulkRetryResponse::Ok(result))
    }

    async fn admin_bulk_cancel(
        &self,
        ctx: RequestContext,
        body: types::AdminBulkRequest,
    ) -> Result<api::AdminBulkCancelResponse, ApiError> {
        let result = self.admin().bulk(ctx, BulkAction::Cancel, body).await?;
        Ok(api::AdminBulkCancelResponse::Ok(result))
    }

    async fn admin_bulk_delete(
        &self,
        ctx: RequestContext,
        body: types::AdminBulkRequest,
    ) -> Result<api::AdminBulkDeleteResponse, ApiError> {
        let result = self.admin().bulk(ctx, BulkAction::Delete, body).await?;
        Ok(api::AdminBulkDeleteResponse::Ok(result))
    }

    async fn admin_list_dead_letters(
        &self,
        ctx: RequestContext,
        query: api::AdminListDeadLettersQuery,
    ) -> Result<api::AdminListDeadLettersResponse, ApiError> {
        self.admin().list_dead_letters(ctx, query).await
    }

    async fn admin_purge_dead_letters(
        &self,
        ctx: RequestContext,
        body: types::AdminDeadLetterPurge,
    ) -> Result<api::AdminPurgeDeadLettersResponse, ApiError> {
        self.admin().purge_dead_letters(ctx, body).await
    }

    async fn admin_dead_letter_stats(
        &self,
        ctx: RequestContext,
    ) -> Result<api::AdminDeadLetterStatsResponse, ApiError> {
        self.admin().dead_letter_stats(ctx).await
    }

    async fn admin_retry_dead_letters(
        &self,
        ctx: RequestContext,
        body: types::AdminBulkRequest,
    ) -> Result<api::AdminRetryDeadLettersResponse, ApiError> {
        self.admin().retry_dead_letters(ctx, body).await
    }

    async fn admin_retry_dead_letter(
        &self,
        ctx: RequestContext,
        id: String,
        _body: Option<types::Empty>,
    ) -> Result<api::AdminRetryDeadLetterResponse, ApiError> {
        self.admin().retry_dead_letter(ctx, id).await
    }

    async fn admin_delete_dead_letter(
        &self,
        ctx: RequestContext,
        id: String,
    ) -> Result<api::AdminDeleteDeadLetterResponse, ApiError> {
        self.admin().delete_dead_letter(ctx, id).await
    }

    async fn list_workflows(
        &self,
        ctx: RequestContext,
        query: api::ListWorkflowsQuery,
    ) -> Result<api::ListWorkflowsResponse, ApiError> {
        self.admin().list_workflows(ctx, query).await
    }
    // --- end of OJS Admin API: queues, jobs, bulk, dead letters

    // --- OJS Admin API: workers, stats, system (conversions in http/admin_system.rs) ---

    async fn admin_list_workers(
        &self,
        ctx: RequestContext,
        query: api::AdminListWorkersQuery,
    ) -> Result<api::AdminListWorkersResponse, ApiError> {
        let page = self
            .service
            .list_workers(&ctx.scope(), query.page, query.per_page)
            .await?;
        Ok(api::AdminListWorkersResponse::Ok(
            super::admin_system::worker_list(&page),
        ))
    }

    async fn admin_get_worker(
        &self,
        ctx: RequestContext,
        id: String,
    ) -> Result<api::AdminGetWorkerResponse, ApiError> {
        let worker = self.service.get_worker(&ctx.scope(), &id).await?;
        Ok(api::AdminGetWorkerResponse::Ok(
            super::admin_system::worker(&worker, true),
        ))
    }

    async fn admin_deregister_worker(
        &self,
        ctx: RequestContext,
        id: String,
        query: api::AdminDeregisterWorkerQuery,
    ) -> Result<api::AdminDeregisterWorkerResponse, ApiError> {
        let released = self
            .service
            .deregister_worker(&ctx.scope(), &id, query.force.unwrap_or(false))
            .await?;
        Ok(api::AdminDeregisterWorkerResponse::Ok(
            types::AdminWorkerDeregistered {
                id,
                deregistered: true,
                released_jobs: released,
            },
        ))
    }

    async fn admin_quiet_worker(
        &self,
        ctx: RequestContext,
        id: String,
        _body: Option<types::Empty>,
    ) -> Result<api::AdminQuietWorkerResponse, ApiError> {
        let worker = self.service.quiet_worker(&ctx.scope(), &id).await?;
        Ok(api::AdminQuietWorkerResponse::Ok(
            super::admin_system::worker(&worker, true),
        ))
    }

    async fn admin_stats(&self, ctx: RequestContext) -> Result<api::AdminStatsResponse, ApiError> {
        let stats = self.service.aggregate_stats(&ctx.scope()).await?;
        Ok(api::AdminStatsResponse::Ok(super::admin_system::stats(
            &stats,
        )))
    }

    async fn admin_stats_history(
        &self,
        ctx: RequestContext,
        query: api::AdminStatsHistoryQuery,
    ) -> Result<api::AdminStatsHistoryResponse, ApiError> {
        let scope = ctx.scope();
        let wanted = crate::core::admin_system::stats::history_query(
            &scope,
            query.period.as_deref(),
            query.since.as_deref(),
            query.until.as_deref(),
            query.queue.as_deref(),
        )?;
        let points = self.service.stats_history(&scope, &wanted).await?;
        Ok(api::AdminStatsHistoryResponse::Ok(
            super::admin_system::history(&wanted, &points),
        ))
    }

    async fn admin_get_maintenance(
        &self,
        _ctx: RequestContext,
    ) -> Result<api::AdminGetMaintenanceResponse, ApiError> {
        let state = self.service.maintenance().await?;
        Ok(api::AdminGetMaintenanceResponse::Ok(
            super::admin_system::maintenance(&state),
        ))
    }

    async fn admin_set_maintenance(
        &self,
        ctx: RequestContext,
        body: types::AdminMaintenanceRequest,
    ) -> Result<api::AdminSetMaintenanceResponse, ApiError> {
        let state = self
            .service
            .set_maintenance(
                &ctx.scope(),
                crate::core::admin_system::system::MaintenanceChange {
                    enabled: body.enabled,
                    reason: body.reason,
                    estimated_duration: body.estimated_duration.or(body.duration),
                    estimated_end: body.estimated_end,
                },
            )
            .await?;
        Ok(api::AdminSetMaintenanceResponse::Ok(
            super::admin_system::maintenance(&state),
        ))
    }

    async fn admin_system_config(
        &self,
        _ctx: RequestContext,
    ) -> Result<api::AdminSystemConfigResponse, ApiError> {
        let mut extra = self.service.public_config();
        let version = extra
            .remove("version")
            .and_then(|v| v.as_str().map(str::to_string))
            .unwrap_or_default();
        Ok(api::AdminSystemConfigResponse::Ok(
            types::AdminSystemConfig { version, extra },
        ))
    }

    async fn admin_list_crons(
        &self,
        ctx: RequestContext,
        query: api::AdminListCronsQuery,
    ) -> Result<api::AdminListCronsResponse, ApiError> {
        let page = self
            .service
            .cron_page(&ctx.scope(), query.page, query.per_page)
            .await?;
        Ok(api::AdminListCronsResponse::Ok(
            super::admin_system::cron_list(&page),
        ))
    }

    async fn admin_get_cron(
        &self,
        ctx: RequestContext,
        name: String,
    ) -> Result<api::AdminGetCronResponse, ApiError> {
        let entry = self.service.get_cron(&ctx.scope(), &name).await?;
        Ok(api::AdminGetCronResponse::Ok(super::admin_system::cron(
            &entry,
        )))
    }

    async fn admin_set_cron_enabled(
        &self,
        ctx: RequestContext,
        name: String,
        body: types::AdminCronPatch,
    ) -> Result<api::AdminSetCronEnabledResponse, ApiError> {
        let entry = self
            .service
            .set_cron_enabled(&ctx.scope(), &name, body.enabled)
            .await?;
        Ok(api::AdminSetCronEnabledResponse::Ok(
            super::admin_system::cron(&entry),
        ))
    }

    async fn admin_delete_cron(
        &self,
        ctx: RequestContext,
        name: String,
    ) -> Result<api::AdminDeleteCronResponse, ApiError> {
        let entry = self.service.unregister_cron(&ctx.scope(), &name).await?;
        Ok(api::AdminDeleteCronResponse::Ok(super::admin_system::cron(
            &entry,
        )))
    }
}
