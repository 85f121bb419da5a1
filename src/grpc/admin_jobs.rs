//! The Admin API's queue, job, bulk and dead-letter reads and actions over gRPC (`AdminService`
//! methods in `admin.rs` call these): conversion only, the same core calls as the HTTP routes.

use tonic::{Request, Response, Status};

use super::convert::{created_at, job, scope};
use super::proto::pgvs3::v1 as pb;
use super::{admit_queues, answer, request_id};
use crate::core::admin::jobs::{FilterInput, ListInput};
use crate::core::admin::queues::{PurgeInput, QueueDetail};
use crate::core::{CoreError, QueueStats, Service};
use crate::model::admin::{BulkAction, CountedPage};

/// An empty string is an absent field.
fn given(text: String) -> Option<String> {
    (!text.is_empty()).then_some(text)
}

/// 0 is an absent number.
fn given_number(n: i64) -> Option<i64> {
    (n != 0).then_some(n)
}

fn pagination<T>(page: &CountedPage<T>) -> pb::AdminPagination {
    pb::AdminPagination {
        total: page.total,
        page: page.page,
        per_page: page.per_page,
        total_exact: page.total_exact,
    }
}

fn queue(stats: &QueueStats) -> pb::AdminQueue {
    pb::AdminQueue {
        name: stats.name.clone(),
        state: if stats.paused { "paused" } else { "active" }.to_string(),
        counts: Some(pb::AdminJobCounts {
            available: stats.available,
            active: stats.active,
            scheduled: stats.scheduled,
            retryable: stats.retryable,
            completed: stats.completed,
            discarded: stats.discarded,
            cancelled: stats.cancelled,
            pending: stats.pending,
        }),
        paused: stats.paused,
        created_at: Some(created_at(&stats.created_at)),
        processed_per_minute: stats.completed_last_hour as f64 / 60.0,
        failed_per_minute: stats.failed_last_hour as f64 / 60.0,
        oldest_available_at: None,
        rate_limit_per_second: None,
        job_retention_ms: 0,
    }
}

fn queue_detail(detail: &QueueDetail) -> pb::AdminQueue {
    pb::AdminQueue {
        oldest_available_at: detail.oldest_available_at.as_ref().map(created_at),
        rate_limit_per_second: detail.config.rate_limit_per_second,
        job_retention_ms: detail.job_retention_ms,
        ..queue(&detail.stats)
    }
}

fn filter(wire: Option<pb::AdminJobFilter>) -> FilterInput {
    let wire = wire.unwrap_or_default();
    FilterInput {
        queue: given(wire.queue),
        state: given(wire.state),
        job_type: given(wire.r#type),
        since: given(wire.since),
        until: given(wire.until),
    }
}

fn list_input(r: pb::ListAdminJobsRequest) -> ListInput {
    let page = r.page.unwrap_or_default();
    ListInput {
        filter: filter(r.filter),
        sort: given(r.sort),
        order: given(r.order),
        page: given_number(page.page),
        per_page: given_number(page.per_page),
    }
}

fn job_list(
    page: Result<CountedPage<crate::core::Job>, CoreError>,
) -> Result<pb::ListAdminJobsResponse, CoreError> {
    page.map(|page| pb::ListAdminJobsResponse {
        pagination: Some(pagination(&page)),
        jobs: page.items.into_iter().map(|j| job(j, false)).collect(),
    })
}

fn action(text: &str) -> Result<BulkAction, CoreError> {
    match text {
        "retry" => Ok(BulkAction::Retry),
        "cancel" => Ok(BulkAction::Cancel),
        "delete" => Ok(BulkAction::Delete),
        other => Err(CoreError::invalid(format!(
            "action {other:?} is not retry, cancel or delete"
        ))
        .with_detail("field", "action".into())),
    }
}

/// `AdminService`'s Admin API methods.
pub struct AdminJobs<'a>(pub &'a Service);

impl AdminJobs<'_> {
    /// `ListAdminQueues`.
    pub async fn list_queues(
        &self,
        request: Request<pb::ListAdminQueuesRequest>,
    ) -> Result<Response<pb::ListAdminQueuesResponse>, Status> {
        let id = request_id(&request);
        let scope = scope(&request);
        let page = request.into_inner().page.unwrap_or_default();
        let result = self
            .0
            .admin_queues(&scope, given_number(page.page), given_number(page.per_page))
            .await;
        answer(
            &id,
            result.map(|page| pb::ListAdminQueuesResponse {
                queues: page.items.iter().map(queue).collect(),
                pagination: Some(pagination(&page)),
            }),
        )
    }

    /// `GetAdminQueue`.
    pub async fn get_queue(
        &self,
        request: Request<pb::GetAdminQueueRequest>,
    ) -> Result<Response<pb::GetAdminQueueResponse>, Status> {
        let id = request_id(&request);
        admit_queues(request.extensions(), &id, [request.get_ref().queue.clone()])?;
        let queue = request.into_inner().queue;
        let result = self.0.admin_queue(&queue).await;
        answer(
            &id,
            result.map(|d| pb::GetAdminQueueResponse {
                queue: Some(queue_detail(&d)),
            }),
        )
    }

    /// `PurgeQueueJobs`.
    pub async fn purge_queue(
        &self,
        request: Request<pb::PurgeQueueJobsRequest>,
    ) -> Result<Response<pb::PurgeQueueJobsResponse>, Status> {
        let id = request_id(&request);
        admit_queues(request.extensions(), &id, [request.get_ref().queue.clone()])?;
        let r = request.into_inner();
        let input = PurgeInput {
            states: r.states,
            older_than: given(r.older_than),
            confirm: Some(r.confirm),
        };
        let result = self.0.admin_purge_queue(&r.queue, &input).await;
        answer(
            &id,
            result.map(|purged_count| pb::PurgeQueueJobsResponse { purged_count }),
        )
    }

    /// `ListAdminJobs`, or `ListAdminDeadLetters` with `dead_letters`.
    pub async fn list_jobs(
        &self,
        request: Request<pb::ListAdminJobsRequest>,
        dead_letters: bool,
    ) -> Result<Response<pb::ListAdminJobsResponse>, Status> {
        let id = request_id(&request);
        let scope = scope(&request);
        let input = list_input(request.into_inner());
        let result = if dead_letters {
            self.0.admin_dead_letters(&scope, &input).await
        } else {
            self.0.admin_jobs(&scope, &input).await
        };
        answer(&id, job_list(result))
    }

    /// `GetAdminJob`.
    pub async fn get_job(
        &self,
        request: Request<pb::GetAdminJobRequest>,
    ) -> Result<Response<pb::AdminJobResponse>, Status> {
        let id = request_id(&request);
        let scope = scope(&request);
        let result = self.0.admin_job(&scope, &request.into_inner().id).await;
        answer(
            &id,
            result.map(|j| pb::AdminJobResponse {
                job: Some(job(j, false)),
            }),
        )
    }

    /// `RetryAdminJob`.
    pub async fn retry_job(
        &self,
        request: Request<pb::RetryAdminJobRequest>,
    ) -> Result<Response<pb::AdminJobResponse>, Status> {
        let id = request_id(&request);
        let scope = scope(&request);
        let result = self
            .0
            .admin_retry_job(&scope, &request.into_inner().id)
            .await;
        answer(
            &id,
            result.map(|j| pb::AdminJobResponse {
                job: Some(job(j, false)),
            }),
        )
    }

    /// `BulkJobs`.
    pub async fn bulk(
        &self,
        request: Request<pb::BulkJobsRequest>,
    ) -> Result<Response<pb::BulkJobsResponse>, Status> {
        let id = request_id(&request);
        let scope = scope(&request);
        let r = request.into_inner();
        let result = match action(&r.action) {
            Ok(action) => {
                self.0
                    .admin_bulk(&scope, action, &filter(r.filter), Some(r.confirm))
                    .await
            }
            Err(e) => Err(e),
        };
        answer(
            &id,
            result.map(|o| pb::BulkJobsResponse {
                action: o.action.as_str().to_string(),
                matched: o.matched,
                succeeded: o.succeeded,
                failed: o.failed,
                errors: o
                    .errors
                    .into_iter()
                    .map(|e| pb::AdminBulkError {
                        job_id: e.job_id.to_string(),
                        error: e.error,
                    })
                    .collect(),
                has_more: o.has_more,
            }),
        )
    }
}
