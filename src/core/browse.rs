//! Reads for looking around (the dashboard): a queue's jobs by state, a job's retained events
//! and the newest workflows. Each is a bounded page; none has an API operation of its own.

use serde_json::Value;

use super::admin::PageNumber;
use super::admin::jobs::{FilterInput, ListInput};
use super::events::Event;
use super::job::JobState;
use super::validate::{check_queue_name, parse_job_id};
use super::{CoreError, Job, Scope, Service};
use crate::model::admin::CountedPage;

/// The states a workflow is in.
const WORKFLOW_STATES: [&str; 4] = ["running", "completed", "failed", "cancelled"];

/// The most jobs, events or workflows one page holds.
pub const MAX_PAGE: i64 = 200;

/// The job states a listing may filter by (the stored states).
pub const JOB_STATES: [JobState; 8] = [
    JobState::Available,
    JobState::Scheduled,
    JobState::Pending,
    JobState::Active,
    JobState::Retryable,
    JobState::Completed,
    JobState::Cancelled,
    JobState::Discarded,
];

fn check_limit(limit: i64) -> Result<i32, CoreError> {
    if (1..=MAX_PAGE).contains(&limit) {
        Ok(limit as i32)
    } else {
        Err(CoreError::invalid(format!(
            "limit must be between 1 and {MAX_PAGE}, not {limit}"
        ))
        .with_detail("field", "limit".into()))
    }
}

impl Service {
    /// Page `page` (from 1) of a queue's jobs in `state` (all states when `None`), `limit` a
    /// page, newest first, with the total: the Admin API's job listing (`admin_jobs`) of one
    /// queue, so the dashboard and the API list jobs alike.
    pub async fn list_jobs(
        &self,
        queue: &str,
        state: Option<&str>,
        page: Option<i64>,
        limit: i64,
    ) -> Result<CountedPage<Job>, CoreError> {
        check_queue_name(queue)?;
        let input = ListInput {
            filter: FilterInput {
                queue: Some(queue.to_string()),
                state: state.map(str::to_string),
                ..FilterInput::default()
            },
            page,
            per_page: Some(limit),
            ..ListInput::default()
        };
        self.admin_jobs(&Scope::all(), &input).await
    }

    /// The lifecycle events the log still holds for a job, oldest first.
    pub async fn job_events(
        &self,
        scope: &Scope,
        id: &str,
        limit: i64,
    ) -> Result<Vec<Event>, CoreError> {
        let id = parse_job_id(id)?;
        let limit = check_limit(limit)?;
        self.job_in_scope(scope, id).await?;
        self.store.job_events(id, limit).await
    }

    /// A page of the workflows whose queues are all in `scope`, newest first, in `state` (any
    /// when `None`; `active` reads as `running`), with their step counts and the total. The
    /// Admin API's workflow list; `list_workflows` is its first page.
    pub async fn workflow_page(
        &self,
        scope: &Scope,
        state: Option<&str>,
        page: Option<i64>,
        per_page: Option<i64>,
    ) -> Result<CountedPage<Value>, CoreError> {
        let state = match state {
            None | Some("") => None,
            Some("active") => Some("running"),
            Some(s) if WORKFLOW_STATES.contains(&s) => Some(s),
            Some(other) => {
                return Err(CoreError::invalid(format!(
                    "state {other:?} is not a workflow state ({})",
                    WORKFLOW_STATES.join(", ")
                ))
                .with_detail("field", "state".into()));
            }
        };
        let page = PageNumber::check(page, per_page)?;
        let (items, total) = self
            .store
            .workflows_list(scope, state, page.skip(), page.per_page as i32)
            .await?;
        Ok(CountedPage {
            items,
            total,
            total_exact: true,
            page: page.page,
            per_page: page.per_page,
        })
    }

    /// The newest `limit` workflows whose queues are all in `scope`, with their step counts.
    pub async fn list_workflows(&self, scope: &Scope, limit: i64) -> Result<Vec<Value>, CoreError> {
        let page = self
            .store
            .workflows_page(scope, check_limit(limit)?)
            .await?;
        Ok(match page {
            Value::Array(items) => items,
            _ => Vec::new(),
        })
    }
}
