//! Plain new jobs of one queue stored through the queue's `insert_jobs`: the jobs go in column by
//! column (binary arrays, no JSON document to parse) and only what the store sets comes back.

use chrono::{DateTime, Utc};
use serde_json::{Map, Value};
use sqlx::AssertSqlSafe;
use sqlx::types::Json;
use uuid::Uuid;

use super::conflicts::Conflicts;
use super::grouped::DbError;
use super::hot::HotPool;
use super::rows::stored_state;
use crate::model::error::{CoreError, ErrorKind};
use crate::model::job::{Job, JobState, NewJob, RetryPolicy};

/// What `insert_jobs` set on the jobs it stored: their created_at, and their states, enqueued_at
/// and run_at in the order given, or none when every job is available from `stored_at` (then
/// also its enqueued_at and run_at).
#[derive(sqlx::FromRow)]
struct StoredBatch {
    stored_at: DateTime<Utc>,
    stored_states: Option<Vec<String>>,
    stored_enqueued_ats: Option<Vec<Option<DateTime<Utc>>>>,
    stored_run_ats: Option<Vec<DateTime<Utc>>>,
}

/// A column that may be NULL as a whole (`sparse`).
type Sparse<T> = Option<Vec<Option<T>>>;

/// The jobs as `insert_jobs`' arguments: element k of every column is job k. A column that is
/// NULL for every job goes as a NULL array: `unnest` pads it with NULLs, and the statement
/// receives (and the server encodes) one value instead of one per job.
struct Columns<'a> {
    given: Vec<Uuid>,
    ids: Vec<Uuid>,
    types: Vec<&'a str>,
    args: Vec<Json<&'a Vec<Value>>>,
    metas: Sparse<Json<&'a Map<String, Value>>>,
    extras: Sparse<Json<&'a Map<String, Value>>>,
    states: Vec<&'a str>,
    priorities: Vec<i32>,
    max_attempts: Vec<i32>,
    timeouts: Sparse<i64>,
    leases: Sparse<i64>,
    retries: Sparse<Json<&'a Value>>,
    uniqs: Sparse<Json<&'a Value>>,
    unique_keys: Sparse<&'a str>,
    tags: Sparse<Json<&'a Vec<String>>>,
    scheduled: Sparse<DateTime<Utc>>,
    expiries: Sparse<DateTime<Utc>>,
    histories: Sparse<Json<&'a Vec<Value>>>,
}

/// A column of optional values, or none when no job has one.
fn sparse<T>(values: impl Iterator<Item = Option<T>>) -> Sparse<T> {
    let column: Vec<Option<T>> = values.collect();
    column.iter().any(Option::is_some).then_some(column)
}

/// A JSON value as a column: JSON `null` is SQL NULL, as the JSON path stores it.
fn json_column(value: &Value) -> Option<Json<&Value>> {
    (!value.is_null()).then_some(Json(value))
}

/// An empty object or list as a column: SQL NULL, which every reader of a job row takes for
/// empty (rows.rs, and SQL that extends `errors`). An empty value would cost each row 5 bytes
/// and the statement one value to encode and unnest.
fn unless_empty<T>(value: &T, is_empty: impl Fn(&T) -> bool) -> Option<Json<&T>> {
    (!is_empty(value)).then_some(Json(value))
}

impl<'a> Columns<'a> {
    fn of(jobs: &'a [NewJob]) -> Result<Columns<'a>, CoreError> {
        let priority = |job: &NewJob| {
            i32::try_from(job.priority)
                .map_err(|_| CoreError::new(ErrorKind::InvalidRequest, "priority is out of range"))
        };
        Ok(Columns {
            given: jobs.iter().filter(|j| !j.id_minted).map(|j| j.id).collect(),
            ids: jobs.iter().map(|j| j.id).collect(),
            types: jobs.iter().map(|j| j.job_type.as_str()).collect(),
            args: jobs.iter().map(|j| Json(&j.args)).collect(),
            metas: sparse(jobs.iter().map(|j| j.meta.as_ref().map(Json))),
            extras: sparse(jobs.iter().map(|j| unless_empty(&j.extra, Map::is_empty))),
            states: jobs.iter().map(|j| j.state).collect(),
            priorities: jobs.iter().map(priority).collect::<Result<_, _>>()?,
            max_attempts: jobs.iter().map(|j| j.max_attempts).collect(),
            timeouts: sparse(jobs.iter().map(|j| j.timeout_ms)),
            leases: sparse(jobs.iter().map(|j| j.visibility_timeout_ms)),
            retries: sparse(jobs.iter().map(|j| json_column(&j.retry))),
            uniqs: sparse(jobs.iter().map(|j| j.uniq.as_ref().and_then(json_column))),
            unique_keys: sparse(jobs.iter().map(|j| j.unique_key.as_deref())),
            tags: sparse(jobs.iter().map(|j| unless_empty(&j.tags, Vec::is_empty))),
            scheduled: sparse(jobs.iter().map(|j| j.scheduled_at)),
            expiries: sparse(jobs.iter().map(|j| j.expires_at)),
            histories: sparse(jobs.iter().map(|j| unless_empty(&j.errors, Vec::is_empty))),
        })
    }
}

/// Stores plain jobs of one queue (schema from the route hint) with the queue's own
/// `insert_jobs`: all or none, answered in the order given.
pub(super) async fn insert_jobs(
    pool: &HotPool,
    conflicts: &Conflicts,
    schema: &str,
    queue: &str,
    jobs: &[NewJob],
) -> Result<Vec<Job>, DbError> {
    let columns = Columns::of(jobs).map_err(DbError::Core)?;
    let sql = format!(
        "SELECT stored_at, stored_states, stored_enqueued_ats, stored_run_ats
           FROM {schema}.insert_jobs($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14,
                                     $15, $16, $17, $18, $19, NULL, NULL)"
    );
    let c = &columns;
    let stored: StoredBatch = conflicts
        .rerun(|| {
            sqlx::query_as(AssertSqlSafe(sql.clone()))
                .bind(queue)
                .bind(&c.given)
                .bind(&c.ids)
                .bind(&c.types)
                .bind(&c.args)
                .bind(&c.metas)
                .bind(&c.extras)
                .bind(&c.states)
                .bind(&c.priorities)
                .bind(&c.max_attempts)
                .bind(&c.timeouts)
                .bind(&c.leases)
                .bind(&c.retries)
                .bind(&c.uniqs)
                .bind(&c.unique_keys)
                .bind(&c.tags)
                .bind(&c.scheduled)
                .bind(&c.expiries)
                .bind(&c.histories)
                .fetch_one(pool)
        })
        .await
        .map_err(DbError::Sql)?;
    stored_jobs(jobs, stored).map_err(DbError::Core)
}

/// The jobs as stored: what was given, and what the store set.
fn stored_jobs(jobs: &[NewJob], stored: StoredBatch) -> Result<Vec<Job>, CoreError> {
    let at = stored.stored_at;
    match (
        stored.stored_states,
        stored.stored_enqueued_ats,
        stored.stored_run_ats,
    ) {
        (None, None, None) => Ok(jobs
            .iter()
            .map(|job| stored_job(job, JobState::Available, at, Some(at), Some(at)))
            .collect()),
        (Some(states), Some(enqueued_ats), Some(run_ats))
            if states.len() == jobs.len()
                && enqueued_ats.len() == jobs.len()
                && run_ats.len() == jobs.len() =>
        {
            jobs.iter()
                .zip(states.iter().zip(enqueued_ats.into_iter().zip(run_ats)))
                .map(|(job, (state, (enqueued_at, run_at)))| {
                    Ok(stored_job(
                        job,
                        stored_state(state)?,
                        at,
                        enqueued_at,
                        Some(run_at),
                    ))
                })
                .collect()
        }
        _ => Err(CoreError::new(
            ErrorKind::Backend,
            format!(
                "insert_jobs answered states or times not one per job of {}",
                jobs.len()
            ),
        )),
    }
}

/// One job as stored: what was given, and what the store set.
fn stored_job(
    job: &NewJob,
    state: JobState,
    created_at: DateTime<Utc>,
    enqueued_at: Option<DateTime<Utc>>,
    run_at: Option<DateTime<Utc>>,
) -> Job {
    Job {
        id: job.id,
        queue: job.queue.clone(),
        job_type: job.job_type.clone(),
        args: job.args.clone(),
        meta: job.meta.clone(),
        extra: job.extra.clone(),
        state,
        previous_state: None,
        priority: i32::try_from(job.priority).unwrap_or_default(),
        attempt: 0,
        max_attempts: job.max_attempts,
        timeout_ms: job.timeout_ms,
        visibility_timeout_ms: job.visibility_timeout_ms,
        retry: RetryPolicy::from_stored(Some(job.retry.clone())),
        unique: job.uniq.as_ref().and_then(json_column).map(|u| u.0.clone()),
        tags: job.tags.clone(),
        created_at,
        enqueued_at,
        scheduled_at: job.scheduled_at,
        expires_at: job.expires_at,
        started_at: None,
        completed_at: None,
        cancelled_at: None,
        lease_token: None,
        lease_expires_at: None,
        worker_id: None,
        result: None,
        error: None,
        errors: job.errors.clone(),
        retry_delay_ms: None,
        run_at,
        workflow_id: None,
        parent_results: None,
    }
}
