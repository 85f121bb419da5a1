//! Admin job listings, detail actions, bulk actions and dead letters.
//!
//! Filters: `queue` and `state` are exact (the state as a reader sees it: due scheduled and
//! retryable jobs read as available); `type` is exact, or a prefix when it ends in `*`;
//! `since`/`until` bound the creation time (`since` inclusive, `until` exclusive). Dead letters
//! are the spec's: every discarded job (pgvs3's `dead_letter` policy jobs among them).

use super::{BULK_MAX, PageNumber, TOTAL_CAP, invalid, parse_instant, require_confirm};
use crate::core::browse::JOB_STATES;
use crate::core::validate::{check_queue_name, check_text, parse_job_id};
use crate::core::{CoreError, Job, Scope, Service};
use crate::model::admin::{BulkAction, BulkOutcome, CountedPage, JobFilter, JobSort};

/// The longest job type a filter may name.
const MAX_TYPE_LEN: usize = 255;

/// A job filter as a client sent it (query parameters or a bulk body's `filter`).
#[derive(Debug, Clone, Default)]
pub struct FilterInput {
    /// Queue name.
    pub queue: Option<String>,
    /// Job state.
    pub state: Option<String>,
    /// Job type, exact or `prefix*`.
    pub job_type: Option<String>,
    /// RFC 3339: created at or after.
    pub since: Option<String>,
    /// RFC 3339: created before.
    pub until: Option<String>,
}

/// A listing as a client asked for it.
#[derive(Debug, Clone, Default)]
pub struct ListInput {
    /// The filter.
    pub filter: FilterInput,
    /// `created_at` (default), `scheduled_at` or `priority`.
    pub sort: Option<String>,
    /// `desc` (default) or `asc`.
    pub order: Option<String>,
    /// 1-based page.
    pub page: Option<i64>,
    /// Rows per page, 1..=100 (default 20).
    pub per_page: Option<i64>,
}

/// What a dead-letter purge removes.
#[derive(Debug, Clone, Default)]
pub struct DeadLetterPurge {
    /// One queue (else every queue in scope).
    pub queue: Option<String>,
    /// Only those discarded before this RFC 3339 time.
    pub older_than: Option<String>,
    /// Must be true.
    pub confirm: Option<bool>,
}

/// Dead letters by queue.
#[derive(Debug, Clone, PartialEq)]
pub struct DeadLetterStats {
    /// Every dead letter in scope.
    pub total: i64,
    /// Per queue (queues with none left out).
    pub by_queue: Vec<(String, i64)>,
}

impl FilterInput {
    /// Checks the filter against `scope`: a named queue must be in it (403 otherwise).
    pub fn check(&self, scope: &Scope) -> Result<JobFilter, CoreError> {
        if let Some(queue) = &self.queue {
            check_queue_name(queue)?;
            scope.require_named([queue.as_str()])?;
        }
        if let Some(state) = &self.state
            && !JOB_STATES.iter().any(|s| s.as_str() == state)
        {
            return Err(invalid(
                "state",
                format!("state {state:?} is not a job state"),
            ));
        }
        let (type_exact, type_prefix) = match self.job_type.as_deref() {
            None | Some("") => (None, None),
            Some(text) => {
                check_text("type", text)?;
                if text.len() > MAX_TYPE_LEN {
                    return Err(invalid(
                        "type",
                        format!("type is longer than {MAX_TYPE_LEN}"),
                    ));
                }
                match text.strip_suffix('*') {
                    Some(prefix) if !prefix.contains('*') => (None, Some(prefix.to_string())),
                    None if !text.contains('*') => (Some(text.to_string()), None),
                    _ => {
                        return Err(invalid(
                            "type",
                            format!("type {text:?}: `*` may only end a prefix"),
                        ));
                    }
                }
            }
        };
        let since = self
            .since
            .as_deref()
            .map(|t| parse_instant("since", t))
            .transpose()?;
        let until = self
            .until
            .as_deref()
            .map(|t| parse_instant("until", t))
            .transpose()?;
        Ok(JobFilter {
            queue: self.queue.clone(),
            state: self.state.clone(),
            type_exact,
            type_prefix,
            since,
            until,
        })
    }
}

fn sort(text: Option<&str>) -> Result<JobSort, CoreError> {
    match text.unwrap_or("created_at") {
        "created_at" => Ok(JobSort::CreatedAt),
        "scheduled_at" => Ok(JobSort::ScheduledAt),
        "priority" => Ok(JobSort::Priority),
        other => Err(invalid(
            "sort",
            format!("sort {other:?} is not created_at, scheduled_at or priority"),
        )),
    }
}

fn descending(text: Option<&str>) -> Result<bool, CoreError> {
    match text.unwrap_or("desc") {
        "desc" => Ok(true),
        "asc" => Ok(false),
        other => Err(invalid(
            "order",
            format!("order {other:?} is not asc or desc"),
        )),
    }
}

impl Service {
    /// A page of the jobs in `scope` matching the listing's filter, in its order, with the
    /// matching total (exact up to `TOTAL_CAP`).
    pub async fn admin_jobs(
        &self,
        scope: &Scope,
        input: &ListInput,
    ) -> Result<CountedPage<Job>, CoreError> {
        let filter = input.filter.check(scope)?;
        self.admin_jobs_of(scope, filter, input).await
    }

    async fn admin_jobs_of(
        &self,
        scope: &Scope,
        filter: JobFilter,
        input: &ListInput,
    ) -> Result<CountedPage<Job>, CoreError> {
        let sort = sort(input.sort.as_deref())?;
        let descending = descending(input.order.as_deref())?;
        let page = PageNumber::check(input.page, input.per_page)?;
        let items = self
            .store
            .admin_jobs(
                scope,
                &filter,
                sort.column(),
                descending,
                page.skip(),
                page.per_page as i32,
            )
            .await?;
        let counted = self
            .store
            .admin_jobs_count(scope, &filter, (TOTAL_CAP + 1) as i32)
            .await?;
        Ok(CountedPage {
            items,
            total: counted.min(TOTAL_CAP),
            total_exact: counted <= TOTAL_CAP,
            page: page.page,
            per_page: page.per_page,
        })
    }

    /// A job in full (the admin detail reads what `getJob` reads).
    pub async fn admin_job(&self, scope: &Scope, id: &str) -> Result<Job, CoreError> {
        self.get_job(scope, id).await
    }

    /// Puts a discarded or cancelled job back as available, attempts reset; 409 for any other
    /// state.
    pub async fn admin_retry_job(&self, scope: &Scope, id: &str) -> Result<Job, CoreError> {
        let id = parse_job_id(id)?;
        self.job_in_scope(scope, id).await?;
        self.store.admin_retry_job(id).await
    }

    /// `action` on the first `BULK_MAX` jobs (oldest first) in `scope` that match `filter` and
    /// are in a state the action applies to; needs `confirm: true`. Each job is changed only if
    /// its state still allows it once locked, so a job a worker acks meanwhile is either acked
    /// or changed, never both.
    pub async fn admin_bulk(
        &self,
        scope: &Scope,
        action: BulkAction,
        filter: &FilterInput,
        confirm: Option<bool>,
    ) -> Result<BulkOutcome, CoreError> {
        let filter = filter.check(scope)?;
        require_confirm(confirm)?;
        if let Some(state) = &filter.state
            && !action.states().contains(&state.as_str())
        {
            return Err(invalid(
                "filter.state",
                format!(
                    "bulk {} applies to jobs that are {}, not {state}",
                    action.as_str(),
                    action.states().join(", ")
                ),
            ));
        }
        let rows = self
            .store
            .admin_bulk(action, scope, &filter, BULK_MAX as i32)
            .await?;
        let failed = rows.errors.len() as i64;
        Ok(BulkOutcome {
            action,
            matched: rows.done + failed,
            succeeded: rows.done,
            failed,
            errors: rows.errors,
            has_more: rows.has_more,
        })
    }

    /// A page of dead letters (discarded jobs) in `scope`; the filter's state, if any, must be
    /// `discarded`.
    pub async fn admin_dead_letters(
        &self,
        scope: &Scope,
        input: &ListInput,
    ) -> Result<CountedPage<Job>, CoreError> {
        let filter = dead_letter_filter(&input.filter)?.check(scope)?;
        self.admin_jobs_of(scope, filter, input).await
    }

    /// Retries one dead letter (a discarded job): 409 for a job in another state.
    pub async fn admin_retry_dead_letter(&self, scope: &Scope, id: &str) -> Result<Job, CoreError> {
        let job = self.get_job(scope, id).await?;
        require_discarded(&job)?;
        self.store.admin_retry_job(job.id).await
    }

    /// Deletes one dead letter (a discarded job): 409 for a job in another state.
    pub async fn admin_delete_dead_letter(
        &self,
        scope: &Scope,
        id: &str,
    ) -> Result<Job, CoreError> {
        let job = self.get_job(scope, id).await?;
        require_discarded(&job)?;
        self.store.admin_delete_job(job.id).await?;
        Ok(job)
    }

    /// Bulk retry of dead letters matching `filter` (state forced to discarded).
    pub async fn admin_retry_dead_letters(
        &self,
        scope: &Scope,
        filter: &FilterInput,
        confirm: Option<bool>,
    ) -> Result<BulkOutcome, CoreError> {
        let filter = dead_letter_filter(filter)?;
        self.admin_bulk(scope, BulkAction::Retry, &filter, confirm)
            .await
    }

    /// Deletes the dead letters of one queue or of every queue in `scope`, those discarded
    /// before `older_than` when given; needs `confirm: true`. Returns how many.
    pub async fn admin_purge_dead_letters(
        &self,
        scope: &Scope,
        purge: &DeadLetterPurge,
    ) -> Result<i64, CoreError> {
        if let Some(queue) = &purge.queue {
            check_queue_name(queue)?;
            scope.require_named([queue.as_str()])?;
        }
        let older_than = purge
            .older_than
            .as_deref()
            .map(|t| parse_instant("older_than", t))
            .transpose()?;
        require_confirm(purge.confirm)?;
        let queues = match &purge.queue {
            Some(queue) => vec![queue.clone()],
            None => self.admin_queue_names(scope).await?,
        };
        let mut total = 0;
        for queue in queues {
            total += self
                .store
                .purge_queue_jobs(
                    &queue,
                    &["discarded".to_string()],
                    older_than,
                    super::PURGE_BATCH,
                )
                .await?;
        }
        Ok(total)
    }

    /// Dead letters per queue in `scope`, from the same counts as the queue listing.
    pub async fn admin_dead_letter_stats(
        &self,
        scope: &Scope,
    ) -> Result<DeadLetterStats, CoreError> {
        let names = self.admin_queue_names(scope).await?;
        let stats = self.queue_stats_of(&names).await?;
        let by_queue: Vec<(String, i64)> = stats
            .into_iter()
            .filter(|s| s.discarded > 0)
            .map(|s| (s.name, s.discarded))
            .collect();
        Ok(DeadLetterStats {
            total: by_queue.iter().map(|(_, n)| n).sum(),
            by_queue,
        })
    }
}

/// The filter of a dead-letter listing: state discarded (naming another is a 400).
fn dead_letter_filter(filter: &FilterInput) -> Result<FilterInput, CoreError> {
    match filter.state.as_deref() {
        None | Some("discarded") => Ok(FilterInput {
            state: Some("discarded".to_string()),
            ..filter.clone()
        }),
        Some(other) => Err(invalid(
            "state",
            format!("dead letters are discarded jobs, not {other}"),
        )),
    }
}

fn require_discarded(job: &Job) -> Result<(), CoreError> {
    if job.state.as_str() == "discarded" {
        Ok(())
    } else {
        Err(CoreError::new(
            crate::core::ErrorKind::Conflict,
            format!(
                "job {} is {}, not a dead letter",
                job.id,
                job.state.as_str()
            ),
        ))
    }
}
