//! Per-queue admission (the seed's queue-concurrency): at most `--queue-max-in-flight` requests
//! in flight per queue, counted in one map shared by every route and listener, so one hot queue
//! cannot take every global slot. A request beyond it is refused at once (429 `rate_limited` +
//! `Retry-After`), never queued.
//!
//! The queue of an HTTP request comes from its path (`/ojs/v1/queues/{q}/...`) or, for JSON
//! bodies, from `options.queue` (enqueue; `default` when absent; every job's for a batch), `queue`
//! (stream ack/nack), `name` (queue creation) or every name in `queues` (fetch). A request naming
//! several queues takes all their permits or none. Such a body (already bounded by the body limit)
//! is buffered here and put back for the handler. Requests naming no queue (job ids, manifest,
//! health, queue list) count against the global limit alone. gRPC messages are only decoded by
//! tonic, after the stack: gRPC requests get the `QueueGate` and the adapters take their queues'
//! permits with `admit_queues`.
//!
//! Like the global permit, the queue permits live in the request's `AdmissionSlot`: held until
//! the response's last frame is produced, and given back when an operation goes idle (a long poll).
//!
//! The same queue list is where a token's queue scope is checked (`forbidden` naming the first
//! queue outside it), before any permit is taken; bodies are read for it even with limits off.

use std::collections::{BTreeSet, HashMap};
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};

use axum::body::Body;
use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::Response;
use bytes::Bytes;
use serde_json::Value;

use super::{AdmissionSlot, Operation, Protocol, RequestId, StackState};
use crate::core::{CoreError, ErrorKind, Grant};

/// In-flight request counts per queue: one counting semaphore per queue, kept in one map so a
/// fetch can take all of its queues' permits atomically.
#[derive(Debug)]
pub struct QueueLimits {
    max_in_flight: usize,
    in_flight: Mutex<HashMap<String, usize>>,
}

/// Permits held on some queues; dropping them gives them back.
#[derive(Debug)]
pub struct QueuePermits {
    limits: Arc<QueueLimits>,
    queues: Vec<String>,
}

impl QueueLimits {
    /// Limits of `max_in_flight` requests per queue; 0 turns them off.
    pub fn new(max_in_flight: usize) -> Arc<Self> {
        Arc::new(QueueLimits {
            max_in_flight,
            in_flight: Mutex::new(HashMap::new()),
        })
    }

    /// Whether per-queue limits apply.
    pub fn enabled(&self) -> bool {
        self.max_in_flight > 0
    }

    /// The limit per queue.
    pub fn max_in_flight(&self) -> usize {
        self.max_in_flight
    }

    fn counts(&self) -> MutexGuard<'_, HashMap<String, usize>> {
        // The map stays consistent across a panic elsewhere: every update is one statement.
        self.in_flight
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Takes one permit on each of `queues` (distinct names), or none; `Err` names a full queue.
    pub fn try_admit(self: &Arc<Self>, queues: Vec<String>) -> Result<QueuePermits, String> {
        let mut counts = self.counts();
        if let Some(full) = queues
            .iter()
            .find(|q| counts.get(*q).copied().unwrap_or(0) >= self.max_in_flight)
        {
            return Err(full.clone());
        }
        for queue in &queues {
            *counts.entry(queue.clone()).or_insert(0) += 1;
        }
        Ok(QueuePermits {
            limits: self.clone(),
            queues,
        })
    }

    /// Requests in flight on `queue`.
    pub fn in_flight(&self, queue: &str) -> usize {
        self.counts().get(queue).copied().unwrap_or(0)
    }
}

impl Drop for QueuePermits {
    fn drop(&mut self) {
        let mut counts = self.limits.counts();
        for queue in &self.queues {
            if let Some(n) = counts.get_mut(queue) {
                *n = n.saturating_sub(1);
                // Idle queues leave the map, so it only ever holds queues with requests in flight.
                if *n == 0 {
                    counts.remove(queue);
                }
            }
        }
    }
}

/// Decodes `%XX` escapes the way the router does before matching `{q}`.
fn percent_decode(segment: &str) -> String {
    let bytes = segment.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        if bytes[i] == b'%'
            && i + 2 < bytes.len()
            && let (Some(hi), Some(lo)) = (hex(bytes[i + 1]), hex(bytes[i + 2]))
        {
            out.push((hi * 16 + lo) as u8);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The queue named by a `/ojs/v1/queues/{q}[/...]` path.
pub fn queue_in_path(path: &str) -> Option<String> {
    let rest = path.strip_prefix("/ojs/v1/queues/")?;
    let segment = rest.split('/').next().unwrap_or("");
    (!segment.is_empty()).then(|| percent_decode(segment))
}

/// The operations whose JSON body names their queues.
fn reads_body(operation: &str) -> bool {
    matches!(
        operation,
        "enqueueJob" | "enqueueJobs" | "fetchJobs" | "streamAck" | "streamNack" | "createQueue"
    )
}

/// A job's queue: `options.queue`, else the envelope's top-level `queue`, `default` when both are
/// absent; none when it is not a string.
fn job_queue(job: &Value) -> Option<String> {
    let given = match job.pointer("/options/queue") {
        None | Some(Value::Null) => job.get("queue").filter(|q| !q.is_null()),
        other => other,
    };
    match given {
        None => Some(crate::model::job::DEFAULT_QUEUE.to_string()),
        Some(Value::String(q)) => Some(q.clone()),
        Some(_) => None,
    }
}

/// The distinct queues a JSON body of `operation` names; none when it does not parse (the
/// handler then refuses it without touching any queue).
pub fn queues_in_body(operation: &str, body: &[u8]) -> Vec<String> {
    let Ok(value) = serde_json::from_slice::<Value>(body) else {
        return Vec::new();
    };
    if !value.is_object() {
        return Vec::new();
    }
    let names: Vec<String> = match operation {
        "enqueueJob" => job_queue(&value).into_iter().collect(),
        "enqueueJobs" => value
            .get("jobs")
            .and_then(Value::as_array)
            .map(|jobs| jobs.iter().filter_map(job_queue).collect())
            .unwrap_or_default(),
        "fetchJobs" => value
            .get("queues")
            .and_then(Value::as_array)
            .map(|queues| {
                queues
                    .iter()
                    .filter_map(Value::as_str)
                    .map(str::to_string)
                    .collect()
            })
            .unwrap_or_default(),
        "createQueue" => value
            .get("name")
            .and_then(Value::as_str)
            .map(str::to_string)
            .into_iter()
            .collect(),
        "streamAck" | "streamNack" => value
            .get("queue")
            .and_then(Value::as_str)
            .map(str::to_string)
            .into_iter()
            .collect(),
        _ => Vec::new(),
    };
    // Distinct and sorted: a fetch naming a queue twice takes one permit on it.
    names
        .into_iter()
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect()
}

fn is_json(request: &Request) -> bool {
    request
        .headers()
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|ct| ct.split(';').next())
        .is_some_and(|essence| essence.trim().to_ascii_lowercase().ends_with("json"))
}

/// A body that fails with the error reading the original failed with, so the handler answers
/// exactly as it would have (e.g. 413 for a body cut off by the limit).
struct FailedBody(Option<axum::Error>);

impl http_body::Body for FailedBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, axum::Error>>> {
        Poll::Ready(self.0.take().map(Err))
    }
}

/// The request's queues, with its body buffered and put back when it had to be read.
async fn classify(request: Request, operation: &str) -> (Request, Vec<String>) {
    if let Some(queue) = queue_in_path(request.uri().path()) {
        return (request, vec![queue]);
    }
    if !reads_body(operation) || !is_json(&request) {
        return (request, Vec::new());
    }
    let (parts, body) = request.into_parts();
    // The body limit layer already bounds this body.
    match axum::body::to_bytes(body, usize::MAX).await {
        Ok(bytes) => {
            let queues = queues_in_body(operation, &bytes);
            (Request::from_parts(parts, Body::from(bytes)), queues)
        }
        Err(error) => (
            Request::from_parts(parts, Body::new(FailedBody(Some(error)))),
            Vec::new(),
        ),
    }
}

/// The per-queue limits, handed to gRPC adapters: tonic decodes their messages after this stack,
/// so they name their queues themselves (`admit_queues`).
#[derive(Debug, Clone)]
pub struct QueueGate(Arc<QueueLimits>);

/// Checks `queues` against the request's token scope (`forbidden`), then takes a permit on each
/// for the request whose extensions these are, held with its admission slot; `rate_limited` when
/// one of them is full. Without a gate (limits off, or no stack) every queue is admitted.
pub fn admit_queues(
    extensions: &http::Extensions,
    queues: impl IntoIterator<Item = String>,
) -> Result<(), CoreError> {
    let queues: Vec<String> = queues
        .into_iter()
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    if let Some(grant) = extensions.get::<Grant>() {
        grant.require_queues(queues.iter().map(String::as_str))?;
    }
    let Some(QueueGate(limits)) = extensions.get::<QueueGate>() else {
        return Ok(());
    };
    if queues.is_empty() {
        return Ok(());
    }
    let permits = limits
        .try_admit(queues)
        .map_err(|full| full_queue(limits, full))?;
    if let Some(slot) = extensions.get::<AdmissionSlot>() {
        slot.hold_queues(permits);
    }
    Ok(())
}

fn full_queue(limits: &QueueLimits, full: String) -> CoreError {
    CoreError::new(
        ErrorKind::RateLimited,
        format!(
            "queue {full} is at its in-flight request limit ({})",
            limits.max_in_flight()
        ),
    )
    .with_detail("queue", full.into())
}

/// Admits an HTTP request if its token's scope covers each of its queues and each has a free
/// slot; gives gRPC requests the gate (their adapters call `admit_queues`).
pub async fn admit(
    State(state): State<Arc<StackState>>,
    mut request: Request,
    next: Next,
) -> Response {
    let limits = &state.queue_limits;
    let protocol = request
        .extensions()
        .get::<Operation>()
        .map(|op| op.protocol);
    if protocol == Some(Protocol::Grpc) {
        if limits.enabled() {
            request.extensions_mut().insert(QueueGate(limits.clone()));
        }
        return next.run(request).await;
    }
    let scope = request
        .extensions()
        .get::<Grant>()
        .filter(|grant| !grant.queues.is_empty())
        .cloned();
    let operation = request
        .extensions()
        .get::<Operation>()
        .filter(|op| op.protocol == Protocol::Http)
        .and_then(|op| op.id);
    let Some(operation) = operation.filter(|_| limits.enabled() || scope.is_some()) else {
        return next.run(request).await;
    };
    let (request, queues) = classify(request, operation).await;
    let request_id = |request: &Request| {
        request
            .extensions()
            .get::<RequestId>()
            .map(|r| r.0.clone())
            .unwrap_or_default()
    };
    if let Some(grant) = scope
        && let Err(error) = grant.require_queues(queues.iter().map(String::as_str))
    {
        return state.reject(Protocol::Http, error, &request_id(&request));
    }
    if queues.is_empty() || !limits.enabled() {
        return next.run(request).await;
    }
    match limits.try_admit(queues) {
        Err(full) => state.reject(
            Protocol::Http,
            full_queue(limits, full),
            &request_id(&request),
        ),
        Ok(permits) => match request.extensions().get::<AdmissionSlot>().cloned() {
            Some(slot) => {
                slot.hold_queues(permits);
                next.run(request).await
            }
            // Without the global layer there is no slot: hold the permits for the handler.
            None => {
                let response = next.run(request).await;
                drop(permits);
                response
            }
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queue_comes_from_the_path() {
        assert_eq!(
            queue_in_path("/ojs/v1/queues/mail/messages").as_deref(),
            Some("mail")
        );
        assert_eq!(
            queue_in_path("/ojs/v1/queues/mail").as_deref(),
            Some("mail")
        );
        assert_eq!(
            queue_in_path("/ojs/v1/queues/a%2Eb/stats").as_deref(),
            Some("a.b")
        );
        assert_eq!(queue_in_path("/ojs/v1/queues/%zz").as_deref(), Some("%zz"));
        assert_eq!(queue_in_path("/ojs/v1/queues"), None);
        assert_eq!(queue_in_path("/ojs/v1/queues/"), None);
        assert_eq!(queue_in_path("/ojs/v1/jobs/abc"), None);
    }

    #[test]
    fn queues_come_from_json_bodies() {
        let q = |op: &str, body: &str| queues_in_body(op, body.as_bytes());
        assert_eq!(q("enqueueJob", r#"{"type":"t","args":[]}"#), ["default"]);
        assert_eq!(
            q("enqueueJob", r#"{"type":"t","options":{"queue":"mail"}}"#),
            ["mail"]
        );
        assert_eq!(
            q("enqueueJob", r#"{"options":{"queue":null}}"#),
            ["default"]
        );
        assert!(q("enqueueJob", r#"{"options":{"queue":5}}"#).is_empty());
        assert_eq!(q("enqueueJob", r#"{"type":"t","queue":"top"}"#), ["top"]);
        assert_eq!(
            q("enqueueJob", r#"{"queue":"top","options":{"queue":"opt"}}"#),
            ["opt"]
        );
        assert_eq!(
            q("fetchJobs", r#"{"queues":["b","a","b"],"count":1}"#),
            ["a", "b"]
        );
        assert!(q("fetchJobs", r#"{"queues":"a"}"#).is_empty());
        assert_eq!(
            q(
                "enqueueJobs",
                r#"{"jobs":[{"options":{"queue":"x"}},{"type":"t"},{"options":{"queue":"x"}}]}"#
            ),
            ["default", "x"]
        );
        assert_eq!(q("streamAck", r#"{"queue":"s","batch_id":"x"}"#), ["s"]);
        assert_eq!(q("streamNack", r#"{"queue":"s"}"#), ["s"]);
        assert_eq!(q("createQueue", r#"{"name":"n"}"#), ["n"]);
        assert!(q("streamAck", r#"{"batch_id":"x"}"#).is_empty());
        assert!(q("enqueueJob", "{not json").is_empty());
        assert!(q("enqueueJob", "[1]").is_empty());
        assert!(q("getJob", r#"{"queue":"s"}"#).is_empty());
    }

    #[test]
    fn a_fetch_takes_all_its_permits_or_none() {
        let limits = QueueLimits::new(1);
        let hot = limits.try_admit(vec!["hot".into()]).expect("first");
        let refused = limits.try_admit(vec!["cold".into(), "hot".into()]);
        assert_eq!(refused.err().as_deref(), Some("hot"));
        assert_eq!(limits.in_flight("cold"), 0, "nothing taken on refusal");
        let cold = limits.try_admit(vec!["cold".into()]).expect("cold is free");
        drop(hot);
        assert_eq!(limits.in_flight("hot"), 0);
        assert!(limits.try_admit(vec!["hot".into()]).is_ok());
        drop(cold);
        assert!(limits.counts().is_empty(), "idle queues leave the map");
    }
}
