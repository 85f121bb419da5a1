//! `pgvs3.v1.AdminService` implemented over the core service: queue namespaces (create, drop,
//! adopt after a restore) and their configuration. Conversion only, mirroring the HTTP routes.

use std::sync::Arc;

use tonic::{Request, Response, Status};

use super::admin_jobs::AdminJobs;
use super::convert::{from_struct, to_struct};
use super::proto::pgvs3::v1 as pb;
use super::proto::pgvs3::v1::admin_service_server::AdminService;
use super::{admin_system, admit_queues, answer, request_id};
use crate::core::{CoreError, QueueConfig, QueueConfigChanges, Service};

/// The gRPC binding of queue administration.
#[derive(Clone)]
pub struct AdminAdapter {
    service: Arc<Service>,
}

impl AdminAdapter {
    /// An adapter over `service`.
    pub fn new(service: Arc<Service>) -> Self {
        AdminAdapter { service }
    }
}

/// A queue's configuration as a message.
fn config(config: &QueueConfig) -> pb::QueueConfig {
    pb::QueueConfig {
        max_retries: config.max_retries,
        retention: format!("{}ms", config.retention_ms),
        retention_ms: config.retention_ms,
        job_retention_ms: config.job_retention_ms,
        max_jobs: config.max_jobs,
        max_stream_events: config.max_stream_events,
        autovacuum: config.autovacuum.as_ref().map(to_struct),
        mirror_job_events: config.mirror_job_events,
        takeover_ms: config.takeover_ms,
        tick_max_events: config.tick_max_events,
        tick_max_bytes: config.tick_max_bytes,
    }
}

/// A quota change: set, cleared, or (neither) unchanged; both at once is a mistake.
fn quota(field: &str, set: Option<i64>, clear: bool) -> Result<Option<Option<i64>>, CoreError> {
    match (set, clear) {
        (Some(_), true) => Err(CoreError::invalid(format!(
            "{field} and clear_{field} cannot both be given"
        ))
        .with_detail("field", field.into())),
        (Some(n), false) => Ok(Some(Some(n))),
        (None, true) => Ok(Some(None)),
        (None, false) => Ok(None),
    }
}

fn changes(r: pb::SetQueueConfigRequest) -> Result<QueueConfigChanges, CoreError> {
    Ok(QueueConfigChanges {
        max_retries: r.max_retries,
        retention: r.retention,
        job_retention: r.job_retention,
        max_jobs: quota("max_jobs", r.max_jobs, r.clear_max_jobs)?,
        max_stream_events: quota(
            "max_stream_events",
            r.max_stream_events,
            r.clear_max_stream_events,
        )?,
        // An empty Struct is what an unset field looks like to some clients: no change.
        autovacuum: r
            .autovacuum
            .map(from_struct)
            .filter(|settings| !settings.is_empty()),
        mirror_job_events: r.mirror_job_events,
        takeover: r.takeover,
        tick_max_events: r.tick_max_events,
        tick_max_bytes: r.tick_max_bytes,
    })
}

#[tonic::async_trait]
impl AdminService for AdminAdapter {
    async fn create_queue(
        &self,
        request: Request<pb::CreateQueueRequest>,
    ) -> Result<Response<pb::CreateQueueResponse>, Status> {
        let id = request_id(&request);
        admit_queues(request.extensions(), &id, [request.get_ref().queue.clone()])?;
        let queue = request.into_inner().queue;
        let result = self.service.create_queue(&queue).await;
        answer(
            &id,
            result.map(|created| pb::CreateQueueResponse { queue, created }),
        )
    }

    async fn drop_queue(
        &self,
        request: Request<pb::DropQueueRequest>,
    ) -> Result<Response<pb::DropQueueResponse>, Status> {
        let id = request_id(&request);
        admit_queues(request.extensions(), &id, [request.get_ref().queue.clone()])?;
        let queue = request.into_inner().queue;
        let result = self.service.drop_queue(&queue).await;
        answer(
            &id,
            result.map(|()| pb::DropQueueResponse {
                dropped: true,
                queue,
            }),
        )
    }

    async fn adopt_queue(
        &self,
        request: Request<pb::AdoptQueueRequest>,
    ) -> Result<Response<pb::AdoptQueueResponse>, Status> {
        let id = request_id(&request);
        admit_queues(request.extensions(), &id, [request.get_ref().queue.clone()])?;
        let queue = request.into_inner().queue;
        let result = self.service.adopt_queue(&queue).await;
        answer(
            &id,
            result.map(|jobs_indexed| pb::AdoptQueueResponse {
                queue,
                jobs_indexed,
            }),
        )
    }

    async fn get_queue_config(
        &self,
        request: Request<pb::GetQueueConfigRequest>,
    ) -> Result<Response<pb::GetQueueConfigResponse>, Status> {
        let id = request_id(&request);
        admit_queues(request.extensions(), &id, [request.get_ref().queue.clone()])?;
        let queue = request.into_inner().queue;
        let result = self
            .service
            .queue_config(&queue, QueueConfigChanges::default())
            .await;
        answer(
            &id,
            result.map(|c| pb::GetQueueConfigResponse {
                config: Some(config(&c)),
            }),
        )
    }

    async fn set_queue_config(
        &self,
        request: Request<pb::SetQueueConfigRequest>,
    ) -> Result<Response<pb::SetQueueConfigResponse>, Status> {
        let id = request_id(&request);
        admit_queues(request.extensions(), &id, [request.get_ref().queue.clone()])?;
        let r = request.into_inner();
        let queue = r.queue.clone();
        let result = match changes(r) {
            Ok(changes) => self.service.queue_config(&queue, changes).await,
            Err(e) => Err(e),
        };
        answer(
            &id,
            result.map(|c| pb::SetQueueConfigResponse {
                config: Some(config(&c)),
            }),
        )
    }

    async fn create_token(
        &self,
        request: Request<pb::CreateTokenRequest>,
    ) -> Result<Response<pb::CreateTokenResponse>, Status> {
        let id = request_id(&request);
        let admission = crate::middleware::QueueAdmission::of(request.extensions());
        let r = request.into_inner();
        let name = (!r.name.is_empty()).then_some(r.name.as_str());
        let result = self
            .service
            .create_token(admission.grant(), name, &r.roles, &r.queues)
            .await;
        answer(
            &id,
            result.map(|created| pb::CreateTokenResponse {
                info: Some(token_info(&created.grant, &created.created_at, None)),
                token: created.token,
            }),
        )
    }

    async fn list_tokens(
        &self,
        request: Request<pb::ListTokensRequest>,
    ) -> Result<Response<pb::ListTokensResponse>, Status> {
        let id = request_id(&request);
        let scope = super::convert::scope(&request);
        let result = self.service.list_tokens(&scope).await;
        answer(
            &id,
            result.map(|tokens| pb::ListTokensResponse {
                tokens: tokens
                    .iter()
                    .map(|t| token_info(&t.grant, &t.created_at, t.revoked_at.as_ref()))
                    .collect(),
            }),
        )
    }

    async fn revoke_token(
        &self,
        request: Request<pb::RevokeTokenRequest>,
    ) -> Result<Response<pb::RevokeTokenResponse>, Status> {
        let id = request_id(&request);
        let scope = super::convert::scope(&request);
        let name = request.into_inner().name;
        let result = self.service.revoke_token(&scope, &name).await;
        answer(
            &id,
            result.map(|()| pb::RevokeTokenResponse {
                name,
                revoked: true,
            }),
        )
    }

    // --- OJS Admin API: queues, jobs, bulk, dead letters (conversions in `admin_jobs.rs`)

    async fn list_admin_queues(
        &self,
        request: Request<pb::ListAdminQueuesRequest>,
    ) -> Result<Response<pb::ListAdminQueuesResponse>, Status> {
        AdminJobs(&self.service).list_queues(request).await
    }

    async fn get_admin_queue(
        &self,
        request: Request<pb::GetAdminQueueRequest>,
    ) -> Result<Response<pb::GetAdminQueueResponse>, Status> {
        AdminJobs(&self.service).get_queue(request).await
    }

    async fn purge_queue_jobs(
        &self,
        request: Request<pb::PurgeQueueJobsRequest>,
    ) -> Result<Response<pb::PurgeQueueJobsResponse>, Status> {
        AdminJobs(&self.service).purge_queue(request).await
    }

    async fn list_admin_jobs(
        &self,
        request: Request<pb::ListAdminJobsRequest>,
    ) -> Result<Response<pb::ListAdminJobsResponse>, Status> {
        AdminJobs(&self.service).list_jobs(request, false).await
    }

    async fn list_admin_dead_letters(
        &self,
        request: Request<pb::ListAdminJobsRequest>,
    ) -> Result<Response<pb::ListAdminJobsResponse>, Status> {
        AdminJobs(&self.service).list_jobs(request, true).await
    }

    async fn get_admin_job(
        &self,
        request: Request<pb::GetAdminJobRequest>,
    ) -> Result<Response<pb::AdminJobResponse>, Status> {
        AdminJobs(&self.service).get_job(request).await
    }

    async fn retry_admin_job(
        &self,
        request: Request<pb::RetryAdminJobRequest>,
    ) -> Result<Response<pb::AdminJobResponse>, Status> {
        AdminJobs(&self.service).retry_job(request).await
    }

    async fn bulk_jobs(
        &self,
        request: Request<pb::BulkJobsRequest>,
    ) -> Result<Response<pb::BulkJobsResponse>, Status> {
        AdminJobs(&self.service).bulk(request).await
    }
    // --- end of OJS Admin API: queues, jobs, bulk, dead letters

    // --- OJS Admin API: workers, stats, system (messages in grpc/admin_system.rs) ---

    async fn list_workers(
        &self,
        request: Request<pb::ListWorkersRequest>,
    ) -> Result<Response<pb::ListWorkersResponse>, Status> {
        let id = request_id(&request);
        let scope = super::convert::scope(&request);
        let r = request.into_inner();
        let result = self
            .service
            .list_workers(&scope, (r.page != 0).then_some(r.page), Some(r.per_page))
            .await;
        answer(&id, result.map(|page| admin_system::worker_list(&page)))
    }

    async fn get_worker(
        &self,
        request: Request<pb::GetWorkerRequest>,
    ) -> Result<Response<pb::GetWorkerResponse>, Status> {
        let id = request_id(&request);
        let scope = super::convert::scope(&request);
        let worker = request.into_inner().id;
        let result = self.service.get_worker(&scope, &worker).await;
        answer(
            &id,
            result.map(|w| pb::GetWorkerResponse {
                worker: Some(admin_system::worker(&w, true)),
            }),
        )
    }

    async fn quiet_worker(
        &self,
        request: Request<pb::QuietWorkerRequest>,
    ) -> Result<Response<pb::QuietWorkerResponse>, Status> {
        let id = request_id(&request);
        let scope = super::convert::scope(&request);
        let worker = request.into_inner().id;
        let result = self.service.quiet_worker(&scope, &worker).await;
        answer(
            &id,
            result.map(|w| pb::QuietWorkerResponse {
                worker: Some(admin_system::worker(&w, true)),
            }),
        )
    }

    async fn deregister_worker(
        &self,
        request: Request<pb::DeregisterWorkerRequest>,
    ) -> Result<Response<pb::DeregisterWorkerResponse>, Status> {
        let id = request_id(&request);
        let scope = super::convert::scope(&request);
        let r = request.into_inner();
        let result = self.service.deregister_worker(&scope, &r.id, r.force).await;
        answer(
            &id,
            result.map(|released| pb::DeregisterWorkerResponse {
                id: r.id,
                deregistered: true,
                released_jobs: released,
            }),
        )
    }

    async fn get_stats(
        &self,
        request: Request<pb::GetStatsRequest>,
    ) -> Result<Response<pb::GetStatsResponse>, Status> {
        let id = request_id(&request);
        let scope = super::convert::scope(&request);
        let result = self.service.aggregate_stats(&scope).await;
        answer(&id, result.map(|s| admin_system::stats(&s)))
    }

    async fn get_stats_history(
        &self,
        request: Request<pb::GetStatsHistoryRequest>,
    ) -> Result<Response<pb::GetStatsHistoryResponse>, Status> {
        let id = request_id(&request);
        let scope = super::convert::scope(&request);
        let r = request.into_inner();
        let result = async {
            let wanted = crate::core::admin_system::stats::history_query(
                &scope,
                Some(&r.period),
                Some(&r.since),
                Some(&r.until),
                Some(&r.queue),
            )?;
            let points = self.service.stats_history(&scope, &wanted).await?;
            Ok(admin_system::history(&wanted.period, &points))
        }
        .await;
        answer(&id, result)
    }

    async fn get_maintenance(
        &self,
        request: Request<pb::GetMaintenanceRequest>,
    ) -> Result<Response<pb::MaintenanceStatus>, Status> {
        let id = request_id(&request);
        let result = self.service.maintenance().await;
        answer(&id, result.map(|m| admin_system::maintenance(&m)))
    }

    async fn set_maintenance(
        &self,
        request: Request<pb::SetMaintenanceRequest>,
    ) -> Result<Response<pb::MaintenanceStatus>, Status> {
        let id = request_id(&request);
        let scope = super::convert::scope(&request);
        let r = request.into_inner();
        let change = crate::core::admin_system::system::MaintenanceChange {
            enabled: r.enabled,
            reason: (!r.reason.is_empty()).then_some(r.reason),
            estimated_duration: (!r.estimated_duration.is_empty()).then_some(r.estimated_duration),
            estimated_end: (!r.estimated_end.is_empty()).then_some(r.estimated_end),
        };
        let result = self.service.set_maintenance(&scope, change).await;
        answer(&id, result.map(|m| admin_system::maintenance(&m)))
    }
}

/// A token as listed (never the token itself).
fn token_info(
    grant: &crate::core::Grant,
    created_at: &chrono::DateTime<chrono::Utc>,
    revoked_at: Option<&chrono::DateTime<chrono::Utc>>,
) -> pb::TokenInfo {
    pb::TokenInfo {
        name: grant.name.clone(),
        roles: grant.roles.iter().map(|r| r.name().to_string()).collect(),
        queues: grant.queues.clone(),
        created_at: Some(super::convert::created_at(created_at)),
        revoked_at: revoked_at.map(super::convert::created_at),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quota_changes_are_set_cleared_or_left() {
        assert_eq!(quota("max_jobs", Some(5), false).ok(), Some(Some(Some(5))));
        assert_eq!(quota("max_jobs", None, true).ok(), Some(Some(None)));
        assert_eq!(quota("max_jobs", None, false).ok(), Some(None));
        assert!(quota("max_jobs", Some(5), true).is_err());
    }

    #[test]
    fn config_becomes_the_message() {
        let mut autovacuum = serde_json::Map::new();
        autovacuum.insert("fillfactor".into(), 90.into());
        let c = config(&QueueConfig {
            max_retries: 3,
            retention_ms: 2000,
            takeover_ms: 300_000,
            job_retention_ms: None,
            max_jobs: Some(10),
            max_stream_events: None,
            autovacuum: Some(autovacuum),
            mirror_job_events: false,
            rate_limit_per_second: None,
            rate_limit_period_ms: None,
            tick_max_events: 1000,
            tick_max_bytes: 4_194_304,
        });
        assert_eq!((c.max_retries, c.retention.as_str()), (3, "2000ms"));
        assert_eq!((c.max_jobs, c.max_stream_events), (Some(10), None));
        assert!(
            c.autovacuum
                .is_some_and(|a| a.fields.contains_key("fillfactor"))
        );
    }
}
