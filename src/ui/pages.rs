//! The dashboard's pages and form actions. Each names the API operation it stands for (its role
//! is the one the API declares) and calls the same service method as the API adapters.

use std::collections::HashMap;
use std::sync::Arc;

use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::response::{IntoResponse, Redirect, Response};
use http::HeaderMap;
use serde_json::{Value, json};

use super::views;
use super::{Page, UiError, UiState};
use crate::core::browse::JOB_STATES;
use crate::core::page::PageRequest;
use crate::core::{CoreError, Grant, Scope};

/// How many jobs a queue page lists.
const JOBS_PER_PAGE: i64 = 50;
/// How many lifecycle events a job page shows.
const EVENTS_PER_JOB: i64 = 100;
/// How many queues the overview lists per page.
pub const QUEUES_PER_PAGE: i64 = 50;

type Params = Result<Query<HashMap<String, String>>, QueryRejection>;

/// The query parameters, none when they do not parse.
fn params(query: Params) -> HashMap<String, String> {
    query.map(|Query(q)| q).unwrap_or_default()
}

/// A path parameter, or the error page's reason.
fn path<T>(p: Result<Path<T>, PathRejection>) -> Result<T, UiError> {
    p.map(|Path(v)| v)
        .map_err(|e| UiError::Core(CoreError::invalid(e.body_text())))
}

/// The queues a grant (none: auth off) lets its holder see.
fn scope(grant: &Option<Grant>) -> Scope {
    Scope::of(grant.as_ref())
}

/// The overview rows of one page of queues (only those the token is scoped to), and the
/// cursor of the next page.
pub async fn overview(
    ui: &UiState,
    grant: &Option<Grant>,
    cursor: Option<String>,
) -> Result<(Vec<Value>, Option<String>), CoreError> {
    let page = ui
        .service
        .list_queues(
            &scope(grant),
            false,
            &PageRequest {
                limit: Some(QUEUES_PER_PAGE),
                cursor,
            },
        )
        .await?;
    let names: Vec<String> = page.items.iter().map(|q| q.name.clone()).collect();
    let stats = ui.service.queue_stats_of(&names).await?;
    Ok((
        stats.iter().map(views::queue_row).collect(),
        page.next_cursor,
    ))
}

/// `/ui`: the queues with their counts by state, status and throughput.
pub async fn queues(State(ui): State<Arc<UiState>>, headers: HeaderMap, query: Params) -> Response {
    let params = params(query);
    let page = async {
        let grant = ui.allow(&headers, "listQueues", None).await?;
        let cursor = params.get("cursor").cloned();
        let (rows, next) = overview(&ui, &grant, cursor.clone()).await?;
        Ok::<Page, UiError>((
            "queues.html",
            json!({ "queues": rows, "next_cursor": next, "cursor": cursor }),
        ))
    }
    .await;
    ui.render(page)
}

/// `/ui/queues/{q}`: a queue's stats and its jobs, filtered by state.
pub async fn queue(
    State(ui): State<Arc<UiState>>,
    headers: HeaderMap,
    q: Result<Path<String>, PathRejection>,
    query: Params,
) -> Response {
    let params = params(query);
    let page = async {
        let queue = path(q)?;
        ui.allow(&headers, "queueStats", Some(&queue)).await?;
        let stats = ui.service.queue_stats(&queue).await?;
        let state = params.get("state").filter(|s| !s.is_empty()).cloned();
        let page = match params.get("page").filter(|p| !p.is_empty()) {
            None => None,
            Some(p) => Some(p.parse::<i64>().map_err(|_| {
                CoreError::invalid(format!("page {p:?} is not a number"))
                    .with_detail("field", "page".into())
            })?),
        };
        let listed = ui
            .service
            .list_jobs(&queue, state.as_deref(), page, JOBS_PER_PAGE)
            .await?;
        let next = (listed.page * listed.per_page < listed.total).then_some(listed.page + 1);
        let jobs = listed.items;
        Ok::<Page, UiError>((
            "queue.html",
            json!({
                "queue": views::queue_row(&stats),
                "state": state,
                "states": JOB_STATES.iter().map(|s| s.as_str()).collect::<Vec<_>>(),
                "jobs": jobs.iter().map(views::job_row).collect::<Vec<_>>(),
                "next_page": next,
            }),
        ))
    }
    .await;
    ui.render(page)
}

/// `/ui/jobs/{id}`: a job with its timeline, errors and retained events.
pub async fn job(
    State(ui): State<Arc<UiState>>,
    headers: HeaderMap,
    id: Result<Path<String>, PathRejection>,
) -> Response {
    let page = async {
        let id = path(id)?;
        let scope = scope(&ui.allow(&headers, "getJob", None).await?);
        let job = ui.service.get_job(&scope, &id).await?;
        let events = ui.service.job_events(&scope, &id, EVENTS_PER_JOB).await?;
        Ok::<Page, UiError>((
            "job.html",
            json!({ "job": views::job_detail(&job, &events) }),
        ))
    }
    .await;
    ui.render(page)
}

/// `/ui/dead-letters`: dead letters of every queue (or `?queue=`), with retry and delete.
pub async fn dead_letters(
    State(ui): State<Arc<UiState>>,
    headers: HeaderMap,
    query: Params,
) -> Response {
    let params = params(query);
    let page = async {
        let queue = params.get("queue").filter(|s| !s.is_empty()).cloned();
        let grant = ui
            .allow(&headers, "listDeadLetter", queue.as_deref())
            .await?;
        let offset = match params.get("offset") {
            Some(text) => Some(
                text.parse::<i64>()
                    .map_err(|_| CoreError::invalid(format!("offset {text:?} is not a number")))?,
            ),
            None => None,
        };
        let letters = ui
            .service
            .dead_letters(&scope(&grant), queue.as_deref(), Some(50), offset)
            .await?;
        let shown: Vec<Value> = letters
            .jobs
            .iter()
            .map(|j| {
                let mut row = views::job_row(j);
                row["error"] = j
                    .error
                    .as_ref()
                    .and_then(|e| e.get("message"))
                    .cloned()
                    .unwrap_or(Value::Null);
                row
            })
            .collect();
        let next = letters.next_offset();
        Ok::<Page, UiError>((
            "dead_letters.html",
            json!({
                "queue": queue,
                "jobs": shown,
                "total": letters.total,
                "next_offset": next,
            }),
        ))
    }
    .await;
    ui.render(page)
}

/// `/ui/streams`: every queue's stream with its size, consumers and dead letters.
pub async fn streams(State(ui): State<Arc<UiState>>, headers: HeaderMap) -> Response {
    let page = async {
        let grant = ui.allow(&headers, "streamInfo", None).await?;
        let (snapshot, _) = ui.service.metrics_snapshot(&scope(&grant)).await?;
        let streams: Vec<Value> = snapshot
            .get("queues")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .map(|q| {
                let stream = q.get("stream").cloned().unwrap_or(Value::Null);
                json!({
                    "queue": q.get("queue"),
                    "events": stream.get("events"),
                    "dead_letters": stream.get("dead_letters"),
                    "rotations": stream.get("rotations"),
                    "consumers": stream.get("consumer_count").and_then(Value::as_i64).unwrap_or(0),
                })
            })
            .collect();
        Ok::<Page, UiError>(("streams.html", json!({ "streams": streams })))
    }
    .await;
    ui.render(page)
}

/// `/ui/streams/{q}`: a stream's facts, its consumers with their lag, and its dead letters.
pub async fn stream(
    State(ui): State<Arc<UiState>>,
    headers: HeaderMap,
    q: Result<Path<String>, PathRejection>,
) -> Response {
    let page = async {
        let queue = path(q)?;
        ui.allow(&headers, "streamInfo", Some(&queue)).await?;
        let info = ui.service.stream_info(&queue).await?;
        let consumers = ui
            .service
            .consumers(
                &queue,
                &PageRequest {
                    limit: Some(crate::core::page::MAX_PAGE),
                    cursor: None,
                },
            )
            .await?;
        let letters = ui
            .service
            .stream_dead_letters(&queue, Some(100), None)
            .await?;
        Ok::<Page, UiError>((
            "stream.html",
            json!({
                "queue": queue,
                "facts": views::stream_facts(&info),
                "consumers": consumers.items.iter().map(views::consumer).collect::<Vec<_>>(),
                "dead_letters": letters.letters.iter().map(views::stream_dead_letter).collect::<Vec<_>>(),
                "more_dead_letters": letters.next_offset.is_some(),
            }),
        ))
    }
    .await;
    ui.render(page)
}

/// `/ui/cron`: the cron registrations.
pub async fn cron(State(ui): State<Arc<UiState>>, headers: HeaderMap) -> Response {
    let page = async {
        let grant = ui.allow(&headers, "listCron", None).await?;
        let entries = ui
            .service
            .list_crons(
                &scope(&grant),
                &PageRequest {
                    limit: Some(crate::core::page::MAX_PAGE),
                    cursor: None,
                },
            )
            .await?;
        Ok::<Page, UiError>((
            "cron.html",
            json!({ "entries": entries.items.iter().map(views::cron).collect::<Vec<_>>(), "total": entries.total }),
        ))
    }
    .await;
    ui.render(page)
}

/// `/ui/workers`: the worker registry, maintenance mode and throughput, read through the same
/// core calls as the Admin API (`adminListWorkers`, `adminStats`).
pub async fn workers(State(ui): State<Arc<UiState>>, headers: HeaderMap) -> Response {
    let page = async {
        let grant = ui.allow(&headers, "adminListWorkers", None).await?;
        let scope = scope(&grant);
        let list = ui.service.list_workers(&scope, Some(1), Some(100)).await?;
        let stats = ui.service.aggregate_stats(&scope).await?;
        let maintenance = ui.service.maintenance().await?;
        Ok::<Page, UiError>((
            "workers.html",
            json!({
                "workers": list.items.iter().map(views::worker).collect::<Vec<_>>(),
                "summary": {
                    "total": list.counts.total,
                    "running": list.counts.running,
                    "quiet": list.counts.quiet,
                    "stale": list.counts.stale,
                },
                "processed_per_minute": format!("{:.1}", stats.processed_per_minute),
                "failed_per_minute": format!("{:.1}", stats.failed_per_minute),
                "maintenance": {
                    "enabled": maintenance.enabled,
                    "reason": maintenance.reason,
                    "enabled_at": maintenance.enabled_at.as_ref().map(views::time),
                },
            }),
        ))
    }
    .await;
    ui.render(page)
}

/// `/ui/workflows`: the newest workflows.
pub async fn workflows(State(ui): State<Arc<UiState>>, headers: HeaderMap) -> Response {
    let page = async {
        let grant = ui.allow(&headers, "getWorkflow", None).await?;
        let mut list = ui.service.list_workflows(&scope(&grant), 100).await?;
        for w in &mut list {
            if let Some(at) = w
                .get("created_at")
                .and_then(Value::as_str)
                .and_then(crate::model::time::parse_time)
            {
                w["created_at"] = views::time(&at).into();
            }
        }
        Ok::<Page, UiError>(("workflows.html", json!({ "workflows": list })))
    }
    .await;
    ui.render(page)
}

/// `/ui/workflows/{id}`: a workflow's steps and their states.
pub async fn workflow(
    State(ui): State<Arc<UiState>>,
    headers: HeaderMap,
    id: Result<Path<String>, PathRejection>,
) -> Response {
    let page = async {
        let id = path(id)?;
        let grant = ui.allow(&headers, "getWorkflow", None).await?;
        let workflow = ui.service.get_workflow(&scope(&grant), &id).await?;
        Ok::<Page, UiError>((
            "workflow.html",
            json!({ "workflow": views::workflow(&workflow) }),
        ))
    }
    .await;
    ui.render(page)
}

/// `/ui/login`: the token form.
pub async fn login_form(State(ui): State<Arc<UiState>>) -> Response {
    ui.render(Ok(("login.html", json!({}))))
}

/// Runs an action and sends the browser to `then`, or shows why it was refused.
fn after_action(ui: &UiState, done: Result<String, UiError>) -> Response {
    match done {
        Ok(then) => Redirect::to(&then).into_response(),
        Err(error) => ui.render(Err(error)),
    }
}

/// Where a queue's page is.
fn queue_url(queue: &str) -> String {
    format!("/ui/queues/{}", utf8_percent_encode(queue))
}

/// Percent-encodes a path segment (queue names are `[a-z0-9._-]`, but the check is here too).
fn utf8_percent_encode(segment: &str) -> String {
    segment
        .bytes()
        .map(|b| match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

async fn set_paused(
    ui: &UiState,
    headers: &HeaderMap,
    queue: String,
    paused: bool,
) -> Result<String, UiError> {
    let operation = if paused { "pauseQueue" } else { "resumeQueue" };
    ui.allow_action(headers, operation, Some(&queue)).await?;
    ui.service.set_paused(&queue, paused).await?;
    Ok(queue_url(&queue))
}

/// Pauses a queue (as `pauseQueue`).
pub async fn pause(
    State(ui): State<Arc<UiState>>,
    headers: HeaderMap,
    q: Result<Path<String>, PathRejection>,
) -> Response {
    let done = async { set_paused(&ui, &headers, path(q)?, true).await }.await;
    after_action(&ui, done)
}

/// Resumes a queue (as `resumeQueue`).
pub async fn resume(
    State(ui): State<Arc<UiState>>,
    headers: HeaderMap,
    q: Result<Path<String>, PathRejection>,
) -> Response {
    let done = async { set_paused(&ui, &headers, path(q)?, false).await }.await;
    after_action(&ui, done)
}

/// What an action on one job does.
#[derive(Clone, Copy)]
enum JobAction {
    Cancel,
    RetryDeadLetter,
    DeleteDeadLetter,
}

impl JobAction {
    /// The API operation it stands for.
    fn operation(self) -> &'static str {
        match self {
            JobAction::Cancel => "cancelJob",
            JobAction::RetryDeadLetter => "retryDeadLetter",
            JobAction::DeleteDeadLetter => "deleteDeadLetter",
        }
    }
}

/// Runs an action on the job `id` with the operation's role on the job's queue; where the
/// browser goes next.
async fn act_on_job(
    ui: &UiState,
    headers: &HeaderMap,
    id: Result<Path<String>, PathRejection>,
    action: JobAction,
) -> Result<String, UiError> {
    let id = path(id)?;
    let operation = action.operation();
    // The role first, so that a caller without it learns nothing about the job; a job of a
    // queue outside the token's scope is not found.
    let scope = scope(&ui.allow_action(headers, operation, None).await?);
    Ok(match action {
        JobAction::Cancel => {
            let job = ui.service.cancel_job(&scope, &id).await?;
            format!("/ui/jobs/{}", job.id)
        }
        JobAction::RetryDeadLetter => {
            ui.service.retry_dead_letter(&scope, &id).await?;
            "/ui/dead-letters".to_string()
        }
        JobAction::DeleteDeadLetter => {
            ui.service.delete_dead_letter(&scope, &id).await?;
            "/ui/dead-letters".to_string()
        }
    })
}

/// Cancels a job (as `cancelJob`).
pub async fn cancel_job(
    State(ui): State<Arc<UiState>>,
    headers: HeaderMap,
    id: Result<Path<String>, PathRejection>,
) -> Response {
    let done = act_on_job(&ui, &headers, id, JobAction::Cancel).await;
    after_action(&ui, done)
}

/// Retries a dead letter (as `retryDeadLetter`).
pub async fn retry_dead_letter(
    State(ui): State<Arc<UiState>>,
    headers: HeaderMap,
    id: Result<Path<String>, PathRejection>,
) -> Response {
    let done = act_on_job(&ui, &headers, id, JobAction::RetryDeadLetter).await;
    after_action(&ui, done)
}

/// Deletes a dead letter (as `deleteDeadLetter`).
pub async fn delete_dead_letter(
    State(ui): State<Arc<UiState>>,
    headers: HeaderMap,
    id: Result<Path<String>, PathRejection>,
) -> Response {
    let done = act_on_job(&ui, &headers, id, JobAction::DeleteDeadLetter).await;
    after_action(&ui, done)
}

/// Replays a stream dead letter to its consumer (as `replayStreamDeadLetter`).
pub async fn replay_stream_dead_letter(
    State(ui): State<Arc<UiState>>,
    headers: HeaderMap,
    p: Result<Path<(String, String)>, PathRejection>,
) -> Response {
    let done = async {
        let (queue, id) = path(p)?;
        ui.allow_action(&headers, "replayStreamDeadLetter", Some(&queue))
            .await?;
        ui.service.stream_replay(&queue, Some(&id)).await?;
        Ok(format!("/ui/streams/{}", utf8_percent_encode(&queue)))
    }
    .await;
    after_action(&ui, done)
}
