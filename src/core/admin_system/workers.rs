//! The worker registry's reads and actions: list, detail, quiet, deregister.

use crate::core::{CoreError, Scope, Service, validate};
use crate::model::admin_system::{WorkerInfo, WorkerPage};

/// Workers per page when the caller names no size.
pub const DEFAULT_PER_PAGE: i64 = 20;
/// The most workers one page holds.
pub const MAX_PER_PAGE: i64 = 1000;
/// Active jobs a worker's detail lists.
const JOBS_IN_DETAIL: i32 = 100;

/// Checks `page` (1-based) and `per_page`; returns (page, per_page, offset).
pub fn page_numbers(
    page: Option<i64>,
    per_page: Option<i64>,
) -> Result<(i64, i64, i64), CoreError> {
    let page = page.unwrap_or(1);
    if !(1..=1_000_000).contains(&page) {
        return Err(
            CoreError::invalid(format!("page must be between 1 and 1000000, not {page}"))
                .with_detail("field", "page".into()),
        );
    }
    let per_page = match per_page {
        None | Some(0) => DEFAULT_PER_PAGE,
        Some(n) if (1..=MAX_PER_PAGE).contains(&n) => n,
        Some(n) => {
            return Err(CoreError::invalid(format!(
                "per_page must be between 1 and {MAX_PER_PAGE}, not {n}"
            ))
            .with_detail("field", "per_page".into()));
        }
    };
    Ok((page, per_page, (page - 1) * per_page))
}

fn check_worker_id(id: &str) -> Result<(), CoreError> {
    if id.is_empty() || id.len() > 1024 {
        return Err(
            CoreError::invalid("a worker id is 1 to 1024 bytes").with_detail("field", "id".into())
        );
    }
    validate::check_text("id", id)
}

impl Service {
    /// One page of the workers the caller sees, in id order, with counts by state and each
    /// worker's number of leases.
    pub async fn list_workers(
        &self,
        scope: &Scope,
        page: Option<i64>,
        per_page: Option<i64>,
    ) -> Result<WorkerPage, CoreError> {
        let (page, per_page, offset) = page_numbers(page, per_page)?;
        let (mut items, counts) = self.store.workers_page(scope, offset, per_page).await?;
        if !items.is_empty() {
            let ids: Vec<String> = items.iter().map(|w| w.id.clone()).collect();
            let leases = self.store.worker_leases(scope, &ids, 0).await?;
            for worker in &mut items {
                if let Some((active, _)) = leases.get(&worker.id) {
                    worker.active_jobs = *active;
                }
            }
        }
        Ok(WorkerPage {
            items,
            counts,
            page,
            per_page,
        })
    }

    /// One worker with its active jobs (the first `JOBS_IN_DETAIL`); 404 when unknown or
    /// outside the caller's scope.
    pub async fn get_worker(&self, scope: &Scope, id: &str) -> Result<WorkerInfo, CoreError> {
        check_worker_id(id)?;
        let mut worker = self
            .store
            .worker_get(scope, id)
            .await?
            .ok_or_else(|| CoreError::not_found("worker", id))?;
        let leases = self
            .store
            .worker_leases(scope, std::slice::from_ref(&worker.id), JOBS_IN_DETAIL)
            .await?;
        if let Some((active, jobs)) = leases.get(&worker.id) {
            worker.active_jobs = *active;
            worker.jobs = jobs.clone();
        }
        Ok(worker)
    }

    /// Asks a worker to stop fetching: its next heartbeat answer says `quiet` (through this
    /// gateway at once, through the others from their next tick).
    pub async fn quiet_worker(&self, scope: &Scope, id: &str) -> Result<WorkerInfo, CoreError> {
        check_worker_id(id)?;
        self.store.worker_quiet(scope, id).await?;
        self.admin.mark_quiet(id);
        self.get_worker(scope, id).await
    }

    /// Removes a stale worker and releases its leases for redelivery; 409 while the worker is
    /// still seen, unless `force`. Returns the leases released.
    pub async fn deregister_worker(
        &self,
        scope: &Scope,
        id: &str,
        force: bool,
    ) -> Result<i64, CoreError> {
        check_worker_id(id)?;
        let released = self.store.worker_deregister(scope, id, force).await?;
        self.admin.forget(id);
        Ok(released)
    }
}
