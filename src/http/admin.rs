//! Conversions of the OJS Admin API's queue, job, bulk, dead-letter and workflow-list routes
//! (`HttpApi` methods in `handlers.rs` call these): wire ↔ core only.

use serde_json::{Map, Value, json};

use super::api::{self, types};
use super::{ApiError, RequestContext, convert};
use crate::core::admin::jobs::{DeadLetterPurge, FilterInput, ListInput};
use crate::core::admin::queues::{ConfigInput, PurgeInput, QueueDetail, retention_text};
use crate::core::{Job, QueueStats, Service};
use crate::model::admin::{BulkAction, BulkOutcome, CountedPage};
use crate::model::time::{format_duration_ms, format_time};

fn pagination<T>(page: &CountedPage<T>) -> types::AdminPagination {
    types::AdminPagination {
        total: page.total,
        page: page.page,
        per_page: page.per_page,
        total_exact: page.total_exact,
    }
}

fn counts(stats: &QueueStats) -> types::AdminJobCounts {
    types::AdminJobCounts {
        available: stats.available,
        active: stats.active,
        scheduled: stats.scheduled,
        retryable: stats.retryable,
        completed: stats.completed,
        discarded: stats.discarded,
        cancelled: stats.cancelled,
        pending: stats.pending,
    }
}

fn throughput(stats: &QueueStats) -> types::AdminThroughput {
    types::AdminThroughput {
        processed_per_minute: stats.completed_last_hour as f64 / 60.0,
        failed_per_minute: stats.failed_last_hour as f64 / 60.0,
    }
}

fn state(paused: bool) -> String {
    if paused { "paused" } else { "active" }.to_string()
}

/// A queue's summary as the Admin API lists it.
pub fn queue(stats: &QueueStats) -> types::AdminQueue {
    types::AdminQueue {
        name: stats.name.clone(),
        state: state(stats.paused),
        counts: counts(stats),
        throughput: throughput(stats),
        paused: stats.paused,
        created_at: format_time(&stats.created_at),
    }
}

/// `x` to 12 significant digits: a limit stored as a rate and multiplied back by its period
/// reads as given (13 a day, not 13.000000000000002).
fn significant(x: f64) -> f64 {
    if x == 0.0 || !x.is_finite() {
        return x;
    }
    let scale = 10f64.powi(11 - x.abs().log10().floor() as i32);
    (x * scale).round() / scale
}

/// A queue's detail.
pub fn queue_detail(detail: &QueueDetail) -> types::AdminQueueDetail {
    let stats = &detail.stats;
    let retention = retention_text(detail.job_retention_ms);
    // The limit over the period it was given with (a job's own rate limit, which sets the rate
    // alone, reads back over that period too).
    let period_ms = detail.config.rate_limit_period_ms.unwrap_or(1000);
    let rate_limit = detail
        .config
        .rate_limit_per_second
        .map(|per_second| types::AdminRateLimit {
            limit: significant(per_second * (period_ms as f64 / 1000.0)),
            period: format_duration_ms(period_ms),
        });
    types::AdminQueueDetail {
        name: stats.name.clone(),
        state: state(stats.paused),
        counts: counts(stats),
        throughput: throughput(stats),
        paused: stats.paused,
        created_at: format_time(&stats.created_at),
        configuration: types::AdminQueueConfiguration {
            rate_limit,
            retention: types::AdminRetention {
                completed: retention.clone(),
                discarded: retention,
            },
            max_jobs: detail.config.max_jobs,
        },
        oldest_available_at: detail.oldest_available_at.as_ref().map(format_time),
    }
}

/// A job in full: the data plane's envelope plus the spec's `retry_policy` and `metadata`
/// (every lifecycle time, null when it has not happened).
pub fn job_detail(job: &Job) -> types::Job {
    let mut wire = convert::job(job.clone(), false);
    let time = |t: &Option<chrono::DateTime<chrono::Utc>>| match t {
        Some(t) => Value::String(format_time(t)),
        None => Value::Null,
    };
    let discarded_at = if job.state.as_str() == "discarded" {
        time(&job.completed_at)
    } else {
        Value::Null
    };
    let completed_at = if job.state.as_str() == "completed" {
        time(&job.completed_at)
    } else {
        Value::Null
    };
    wire.extra.insert(
        "metadata".into(),
        json!({
            "created_at": format_time(&job.created_at),
            "enqueued_at": time(&job.enqueued_at),
            "started_at": time(&job.started_at),
            "scheduled_at": time(&job.scheduled_at),
            "completed_at": completed_at,
            "cancelled_at": time(&job.cancelled_at),
            "discarded_at": discarded_at,
        }),
    );
    if let Some(retry) = &wire.retry
        && let Ok(policy) = serde_json::to_value(retry)
    {
        wire.extra.insert("retry_policy".into(), policy);
    }
    if wire.errors.is_none() {
        wire.errors = Some(Vec::new());
    }
    wire
}

fn job_list(page: &CountedPage<Job>) -> types::AdminJobList {
    types::AdminJobList {
        items: page
            .items
            .iter()
            .map(|j| convert::job(j.clone(), false))
            .collect(),
        pagination: pagination(page),
    }
}

fn bulk(outcome: BulkOutcome) -> types::AdminBulkResult {
    types::AdminBulkResult {
        action: outcome.action.as_str().to_string(),
        matched: outcome.matched,
        succeeded: outcome.succeeded,
        failed: outcome.failed,
        errors: outcome
            .errors
            .into_iter()
            .map(|e| types::AdminBulkError {
                job_id: e.job_id.to_string(),
                error: e.error,
            })
            .collect(),
        has_more: outcome.has_more,
    }
}

fn filter(wire: types::AdminJobFilter) -> FilterInput {
    FilterInput {
        queue: wire.queue,
        state: wire.state,
        job_type: wire.r#type,
        since: wire.since,
        until: wire.until,
    }
}

/// The listing a job query asks for (the job and dead-letter listings share its parameters).
fn list_input(query: api::AdminListJobsQuery) -> ListInput {
    ListInput {
        filter: FilterInput {
            queue: query.queue,
            state: query.state,
            job_type: query.r#type,
            since: query.since,
            until: query.until,
        },
        sort: query.sort,
        order: query.order,
        page: query.page,
        per_page: query.per_page,
    }
}

/// The Admin API's routes over the service (called by `HttpAdapter`).
pub struct AdminRoutes<'a>(pub &'a Service);

impl AdminRoutes<'_> {
    /// `GET /admin/queues`.
    pub async fn list_queues(
        &self,
        ctx: RequestContext,
        query: api::AdminListQueuesQuery,
    ) -> Result<api::AdminListQueuesResponse, ApiError> {
        let page = self
            .0
            .admin_queues(&ctx.scope(), query.page, query.per_page)
            .await?;
        Ok(api::AdminListQueuesResponse::Ok(types::AdminQueueList {
            items: page.items.iter().map(queue).collect(),
            pagination: pagination(&page),
        }))
    }

    /// `GET /admin/queues/{name}`.
    pub async fn get_queue(
        &self,
        ctx: RequestContext,
        name: String,
    ) -> Result<api::AdminGetQueueResponse, ApiError> {
        ctx.admit([name.as_str()])?;
        let detail = self.0.admin_queue(&name).await?;
        Ok(api::AdminGetQueueResponse::Ok(queue_detail(&detail)))
    }

    /// `POST /admin/queues/{name}/pause` and `/resume`.
    pub async fn set_paused(
        &self,
        ctx: RequestContext,
        name: String,
        paused: bool,
    ) -> Result<types::AdminQueuePaused, ApiError> {
        ctx.admit([name.as_str()])?;
        let paused = self.0.admin_set_paused(&name, paused).await?;
        Ok(types::AdminQueuePaused { name, paused })
    }

    /// `DELETE /admin/queues/{name}/jobs`.
    pub async fn purge_queue(
        &self,
        ctx: RequestContext,
        name: String,
        body: types::AdminPurgeRequest,
    ) -> Result<api::AdminPurgeQueueResponse, ApiError> {
        ctx.admit([name.as_str()])?;
        let input = PurgeInput {
            states: body.states,
            older_than: body.older_than,
            confirm: body.confirm,
        };
        let purged = self.0.admin_purge_queue(&name, &input).await?;
        Ok(api::AdminPurgeQueueResponse::Ok(types::AdminPurged {
            purged_count: purged,
            states: Some(input.states),
        }))
    }

    /// `PUT /admin/queues/{name}/config`.
    pub async fn set_queue_config(
        &self,
        ctx: RequestContext,
        name: String,
        body: types::AdminQueueConfigUpdate,
    ) -> Result<api::AdminSetQueueConfigResponse, ApiError> {
        ctx.admit([name.as_str()])?;
        let input = ConfigInput { fields: body.extra };
        let detail = self.0.admin_queue_config(&name, &input).await?;
        Ok(api::AdminSetQueueConfigResponse::Ok(queue_detail(&detail)))
    }

    /// `GET /admin/jobs`.
    pub async fn list_jobs(
        &self,
        ctx: RequestContext,
        query: api::AdminListJobsQuery,
    ) -> Result<api::AdminListJobsResponse, ApiError> {
        let page = self.0.admin_jobs(&ctx.scope(), &list_input(query)).await?;
        Ok(api::AdminListJobsResponse::Ok(job_list(&page)))
    }

    /// `GET /admin/jobs/{id}`.
    pub async fn get_job(
        &self,
        ctx: RequestContext,
        id: String,
    ) -> Result<api::AdminGetJobResponse, ApiError> {
        let job = self.0.admin_job(&ctx.scope(), &id).await?;
        Ok(api::AdminGetJobResponse::Ok(job_detail(&job)))
    }

    /// `POST /admin/jobs/{id}/cancel`.
    pub async fn cancel_job(
        &self,
        ctx: RequestContext,
        id: String,
    ) -> Result<api::AdminCancelJobResponse, ApiError> {
        let job = self.0.cancel_job(&ctx.scope(), &id).await?;
        Ok(api::AdminCancelJobResponse::Ok(job_detail(&job)))
    }

    /// `POST /admin/jobs/{id}/retry`.
    pub async fn retry_job(
        &self,
        ctx: RequestContext,
        id: String,
    ) -> Result<api::AdminRetryJobResponse, ApiError> {
        let job = self.0.admin_retry_job(&ctx.scope(), &id).await?;
        Ok(api::AdminRetryJobResponse::Ok(job_detail(&job)))
    }

    /// `POST /admin/jobs/bulk/{action}`.
    pub async fn bulk(
        &self,
        ctx: RequestContext,
        action: BulkAction,
        body: types::AdminBulkRequest,
    ) -> Result<types::AdminBulkResult, ApiError> {
        let outcome = self
            .0
            .admin_bulk(&ctx.scope(), action, &filter(body.filter), body.confirm)
            .await?;
        Ok(bulk(outcome))
    }

    /// `GET /admin/dead-letter`.
    pub async fn list_dead_letters(
        &self,
        ctx: RequestContext,
        query: api::AdminListDeadLettersQuery,
    ) -> Result<api::AdminListDeadLettersResponse, ApiError> {
        let query = api::AdminListJobsQuery {
            queue: query.queue,
            state: query.state,
            r#type: query.r#type,
            since: query.since,
            until: query.until,
            sort: query.sort,
            order: query.order,
            page: query.page,
            per_page: query.per_page,
        };
        let page = self
            .0
            .admin_dead_letters(&ctx.scope(), &list_input(query))
            .await?;
        Ok(api::AdminListDeadLettersResponse::Ok(job_list(&page)))
    }

    /// `DELETE /admin/dead-letter`.
    pub async fn purge_dead_letters(
        &self,
        ctx: RequestContext,
        body: types::AdminDeadLetterPurge,
    ) -> Result<api::AdminPurgeDeadLettersResponse, ApiError> {
        let purge = DeadLetterPurge {
            queue: body.queue,
            older_than: body.older_than,
            confirm: body.confirm,
        };
        let purged = self
            .0
            .admin_purge_dead_letters(&ctx.scope(), &purge)
            .await?;
        Ok(api::AdminPurgeDeadLettersResponse::Ok(types::AdminPurged {
            purged_count: purged,
            states: Some(vec!["discarded".to_string()]),
        }))
    }

    /// `GET /admin/dead-letter/stats`.
    pub async fn dead_letter_stats(
        &self,
        ctx: RequestContext,
    ) -> Result<api::AdminDeadLetterStatsResponse, ApiError> {
        let stats = self.0.admin_dead_letter_stats(&ctx.scope()).await?;
        let by_queue: Map<String, Value> = stats
            .by_queue
            .into_iter()
            .map(|(q, n)| (q, json!(n)))
            .collect();
        Ok(api::AdminDeadLetterStatsResponse::Ok(
            types::AdminDeadLetterStats {
                total: stats.total,
                by_queue,
            },
        ))
    }

    /// `POST /admin/dead-letter/retry`.
    pub async fn retry_dead_letters(
        &self,
        ctx: RequestContext,
        body: types::AdminBulkRequest,
    ) -> Result<api::AdminRetryDeadLettersResponse, ApiError> {
        let outcome = self
            .0
            .admin_retry_dead_letters(&ctx.scope(), &filter(body.filter), body.confirm)
            .await?;
        Ok(api::AdminRetryDeadLettersResponse::Ok(bulk(outcome)))
    }

    /// `POST /admin/dead-letter/{id}/retry`.
    pub async fn retry_dead_letter(
        &self,
        ctx: RequestContext,
        id: String,
    ) -> Result<api::AdminRetryDeadLetterResponse, ApiError> {
        let job = self.0.admin_retry_dead_letter(&ctx.scope(), &id).await?;
        Ok(api::AdminRetryDeadLetterResponse::Ok(job_detail(&job)))
    }

    /// `DELETE /admin/dead-letter/{id}`.
    pub async fn delete_dead_letter(
        &self,
        ctx: RequestContext,
        id: String,
    ) -> Result<api::AdminDeleteDeadLetterResponse, ApiError> {
        let job = self.0.admin_delete_dead_letter(&ctx.scope(), &id).await?;
        Ok(api::AdminDeleteDeadLetterResponse::Ok(types::Deleted {
            deleted: true,
            job_id: job.id.to_string(),
        }))
    }

    /// `GET /ojs/v1/workflows`.
    pub async fn list_workflows(
        &self,
        ctx: RequestContext,
        query: api::ListWorkflowsQuery,
    ) -> Result<api::ListWorkflowsResponse, ApiError> {
        let page = self
            .0
            .workflow_page(
                &ctx.scope(),
                query.state.as_deref(),
                query.page,
                query.per_page,
            )
            .await?;
        let items = page
            .items
            .iter()
            .map(|w| {
                let text = |k: &str| {
                    w.get(k)
                        .and_then(Value::as_str)
                        .unwrap_or_default()
                        .to_string()
                };
                let count = |k: &str| w.get(k).and_then(Value::as_i64).unwrap_or_default();
                types::AdminWorkflowSummary {
                    id: text("id"),
                    name: text("name"),
                    r#type: text("type"),
                    state: text("state"),
                    steps_total: count("steps_total"),
                    steps_completed: count("steps_completed"),
                    created_at: w
                        .get("created_at")
                        .and_then(Value::as_str)
                        .and_then(crate::model::time::parse_time)
                        .map(|t| format_time(&t))
                        .unwrap_or_default(),
                    completed_at: w
                        .get("completed_at")
                        .and_then(Value::as_str)
                        .and_then(crate::model::time::parse_time)
                        .map(|t| format_time(&t)),
                }
            })
            .collect();
        Ok(api::ListWorkflowsResponse::Ok(types::AdminWorkflowList {
            items,
            pagination: pagination(&page),
        }))
    }
}
