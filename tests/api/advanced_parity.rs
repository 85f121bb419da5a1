//! Advanced features over both protocols: a scheduled job, a chain workflow, a unique-job
//! conflict and queue pause/resume. Each scenario runs over HTTP and over gRPC, each protocol on
//! its own server and database; the traces (ids and timestamps left out) must be the same, and the
//! HTTP trace must be the expected one.
//!
//! Over gRPC the unique policy is `EnqueueOptions.unique` and a step's parent results are
//! `Job.parent_results` (pgvs3 field 1007). What the gRPC messages do not carry is derived or left
//! out of the traces: `ojs.v1.Workflow` has no `steps_completed` (counted from the step states) and
//! no workflow type (HTTP `chain` is the DAG form over gRPC), and PauseQueue/ResumeQueue answer an
//! empty message (the HTTP answer's `paused` is checked over HTTP only).

use crate::common;

use std::time::Duration;

use chrono::{DateTime, SecondsFormat, TimeDelta, Utc};
use pgvs3::grpc::proto::ojs::v1 as pb;
use prost_types::value::Kind;
use reqwest::Method;
use serde_json::{Map, Value, json};

/// A fetched job, as far as both protocols expose it.
#[derive(Debug, Clone)]
struct Claim {
    id: String,
    token: String,
    job_type: String,
    workflow_id: String,
    scheduled_at: Option<DateTime<Utc>>,
    started_at: Option<DateTime<Utc>>,
    /// `None` when the job has none (HTTP: absent; gRPC: the repeated field is empty).
    parent_results: Option<Value>,
}

/// A workflow as both protocols show it: state, (type, state) of each step in order, and the
/// number of completed steps.
#[derive(Debug, Clone, PartialEq)]
struct Flow {
    state: String,
    steps: Vec<(String, String)>,
    steps_completed: i64,
}

/// The queue statistics both protocols report.
#[derive(Debug, Clone, PartialEq)]
struct Stats {
    paused: bool,
    available: i64,
    scheduled: i64,
}

/// A refused call: the OJS code (HTTP `error.code`, gRPC ErrorInfo reason) and the transport's
/// status (HTTP status number, gRPC code name), which differ by protocol and stay out of traces.
#[derive(Debug, Clone)]
struct Refusal {
    code: String,
    status: String,
}

fn code(refusal: Refusal) -> String {
    refusal.code
}

type Grpc = pb::ojs_service_client::OjsServiceClient<tonic::transport::Channel>;

/// One protocol's view of the features under test.
enum Client {
    Http(reqwest::Client, String),
    Grpc(Grpc),
}

// ---------------------------------------------------------------------------------------------
// Conversions

fn pb_value(value: &Value) -> prost_types::Value {
    let kind = match value {
        Value::Null => Kind::NullValue(0),
        Value::Bool(b) => Kind::BoolValue(*b),
        Value::Number(n) => Kind::NumberValue(n.as_f64().unwrap_or_default()),
        Value::String(s) => Kind::StringValue(s.clone()),
        Value::Array(items) => Kind::ListValue(prost_types::ListValue {
            values: items.iter().map(pb_value).collect(),
        }),
        Value::Object(map) => Kind::StructValue(pb_struct(map)),
    };
    prost_types::Value { kind: Some(kind) }
}

fn pb_struct(map: &Map<String, Value>) -> prost_types::Struct {
    prost_types::Struct {
        fields: map.iter().map(|(k, v)| (k.clone(), pb_value(v))).collect(),
    }
}

/// Protobuf → JSON; integral numbers come back as integers, as over HTTP.
fn json_value(value: prost_types::Value) -> Value {
    match value.kind {
        None | Some(Kind::NullValue(_)) => Value::Null,
        Some(Kind::BoolValue(b)) => Value::Bool(b),
        Some(Kind::NumberValue(n)) if n.fract() == 0.0 && n.abs() < 9.0e15 => json!(n as i64),
        Some(Kind::NumberValue(n)) => json!(n),
        Some(Kind::StringValue(s)) => Value::String(s),
        Some(Kind::ListValue(list)) => list.values.into_iter().map(json_value).collect(),
        Some(Kind::StructValue(s)) => Value::Object(
            s.fields
                .into_iter()
                .map(|(k, v)| (k, json_value(v)))
                .collect(),
        ),
    }
}

fn pb_time(t: &DateTime<Utc>) -> prost_types::Timestamp {
    prost_types::Timestamp {
        seconds: t.timestamp(),
        nanos: t.timestamp_subsec_nanos() as i32,
    }
}

fn grpc_time(t: Option<prost_types::Timestamp>) -> Option<DateTime<Utc>> {
    t.and_then(|t| DateTime::from_timestamp(t.seconds, t.nanos.max(0) as u32))
}

fn http_time(value: &Value) -> Option<DateTime<Utc>> {
    value
        .as_str()
        .and_then(|s| DateTime::parse_from_rfc3339(s).ok())
        .map(|t| t.with_timezone(&Utc))
}

fn grpc_job_state(state: i32) -> String {
    pb::JobState::try_from(state)
        .map(|s| {
            s.as_str_name()
                .trim_start_matches("JOB_STATE_")
                .to_lowercase()
        })
        .unwrap_or_default()
}

fn grpc_refusal(status: tonic::Status) -> Refusal {
    use tonic_types::StatusExt;
    Refusal {
        code: status
            .get_details_error_info()
            .map(|info| info.reason)
            .unwrap_or_default(),
        status: format!("{:?}", status.code()),
    }
}

/// A gRPC workflow in the HTTP vocabulary. The proto has no ENQUEUED step state: convert.rs maps
/// the core's `enqueued` to WORKFLOW_STEP_STATE_PENDING, so PENDING reads back as `enqueued`.
fn grpc_flow(w: pb::Workflow) -> Flow {
    let state = pb::WorkflowState::try_from(w.state)
        .map(|s| {
            s.as_str_name()
                .trim_start_matches("WORKFLOW_STATE_")
                .to_lowercase()
        })
        .unwrap_or_default();
    let steps: Vec<(String, String)> = w
        .steps
        .into_iter()
        .map(|s| {
            let state = match pb::WorkflowStepState::try_from(s.state) {
                Ok(pb::WorkflowStepState::Waiting) => "waiting",
                Ok(pb::WorkflowStepState::Pending) => "pending",
                Ok(pb::WorkflowStepState::Active) => "active",
                Ok(pb::WorkflowStepState::Completed) => "completed",
                Ok(pb::WorkflowStepState::Failed) => "failed",
                Ok(pb::WorkflowStepState::Cancelled) => "cancelled",
                _ => "unspecified",
            };
            (s.r#type, state.to_string())
        })
        .collect();
    // The Workflow message has no steps_completed: count the completed steps.
    let steps_completed = steps.iter().filter(|(_, s)| s == "completed").count() as i64;
    Flow {
        state,
        steps,
        steps_completed,
    }
}

fn http_flow(w: &Value) -> Flow {
    Flow {
        state: w["state"].as_str().unwrap_or_default().to_string(),
        steps: w["steps"]
            .as_array()
            .map(|steps| {
                steps
                    .iter()
                    .map(|s| {
                        (
                            s["type"].as_str().unwrap_or_default().to_string(),
                            s["state"].as_str().unwrap_or_default().to_string(),
                        )
                    })
                    .collect()
            })
            .unwrap_or_default(),
        steps_completed: w["steps_completed"].as_i64().unwrap_or(-1),
    }
}

// ---------------------------------------------------------------------------------------------
// The client

impl Client {
    /// One HTTP call; a non-2xx answer is a refusal.
    async fn call(
        &self,
        method: Method,
        path: &str,
        body: Option<Value>,
    ) -> Result<Value, Refusal> {
        let Client::Http(http, base) = self else {
            unreachable!("HTTP call on a gRPC client")
        };
        let mut request = http.request(method, format!("{base}{path}"));
        if let Some(body) = body {
            request = request
                .header("content-type", "application/openjobspec+json")
                .body(body.to_string());
        }
        let response = request.send().await.expect("send the request");
        let status = response.status();
        let body: Value = response.json().await.expect("a JSON body");
        if status.is_success() {
            Ok(body)
        } else {
            Err(Refusal {
                code: body["error"]["code"].as_str().unwrap_or("?").to_string(),
                status: status.as_u16().to_string(),
            })
        }
    }

    fn grpc(&mut self) -> &mut Grpc {
        match self {
            Client::Grpc(grpc) => grpc,
            Client::Http(..) => unreachable!("gRPC call on an HTTP client"),
        }
    }

    fn is_http(&self) -> bool {
        matches!(self, Client::Http(..))
    }

    /// Enqueues a job; `due` schedules it, `unique` adds a reject-on-conflict unique policy over
    /// type, queue and args. Returns the id and state.
    async fn enqueue(
        &mut self,
        queue: &str,
        job_type: &str,
        due: Option<DateTime<Utc>>,
        unique: bool,
    ) -> Result<(String, String), Refusal> {
        if self.is_http() {
            let mut options = json!({"queue": queue});
            if let Some(due) = due {
                options["scheduled_at"] = due.to_rfc3339_opts(SecondsFormat::Millis, true).into();
            }
            if unique {
                options["unique"] =
                    json!({"keys": ["type", "queue", "args"], "on_conflict": "reject"});
            }
            let body = json!({"type": job_type, "args": [1, "two"], "options": options});
            let answer = self.call(Method::POST, "/ojs/v1/jobs", Some(body)).await?;
            return Ok((
                answer["job"]["id"].as_str().unwrap_or_default().to_string(),
                answer["job"]["state"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
            ));
        }
        let request = pb::EnqueueRequest {
            r#type: job_type.into(),
            args: vec![pb_value(&json!(1)), pb_value(&json!("two"))],
            options: Some(pb::EnqueueOptions {
                queue: queue.into(),
                delay_until: due.as_ref().map(pb_time),
                unique: unique.then(|| pb::UniquePolicy {
                    key: vec!["type".into(), "queue".into(), "args".into()],
                    on_conflict: pb::UniqueConflictAction::Reject as i32,
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        };
        let job = self
            .grpc()
            .enqueue(request)
            .await
            .map_err(grpc_refusal)?
            .into_inner()
            .job
            .expect("a job");
        Ok((job.id, grpc_job_state(job.state)))
    }

    /// Claims up to 10 jobs of `queue`.
    async fn fetch(&mut self, queue: &str) -> Vec<Claim> {
        if self.is_http() {
            let body = json!({"queues": [queue], "count": 10, "visibility_timeout_ms": 30_000});
            let answer = self
                .call(Method::POST, "/ojs/v1/workers/fetch", Some(body))
                .await
                .expect("fetch");
            return answer["jobs"]
                .as_array()
                .expect("jobs")
                .iter()
                .map(|j| Claim {
                    id: j["id"].as_str().unwrap_or_default().into(),
                    token: j["lease_token"].as_str().unwrap_or_default().into(),
                    job_type: j["type"].as_str().unwrap_or_default().into(),
                    workflow_id: j["workflow_id"].as_str().unwrap_or_default().into(),
                    scheduled_at: http_time(&j["scheduled_at"]),
                    started_at: http_time(&j["started_at"]),
                    parent_results: j.get("parent_results").filter(|p| !p.is_null()).cloned(),
                })
                .collect();
        }
        self.grpc()
            .fetch(pb::FetchRequest {
                queues: vec![queue.into()],
                count: 10,
                visibility_timeout_ms: 30_000,
                ..Default::default()
            })
            .await
            .expect("fetch")
            .into_inner()
            .jobs
            .into_iter()
            .map(|j| Claim {
                id: j.id,
                token: j.lease_token,
                job_type: j.r#type,
                workflow_id: j.workflow_id,
                scheduled_at: grpc_time(j.scheduled_at),
                started_at: grpc_time(j.started_at),
                parent_results: (!j.parent_results.is_empty())
                    .then(|| j.parent_results.into_iter().map(json_value).collect()),
            })
            .collect()
    }

    /// Acks a claim with `result` (an object); returns the new state.
    async fn ack(&mut self, claim: &Claim, result: Value) -> Result<String, Refusal> {
        if self.is_http() {
            let body = json!({"job_id": claim.id, "lease_token": claim.token, "result": result});
            let answer = self
                .call(Method::POST, "/ojs/v1/workers/ack", Some(body))
                .await?;
            return Ok(answer["state"].as_str().unwrap_or_default().to_string());
        }
        let answer = self
            .grpc()
            .ack(pb::AckRequest {
                job_id: claim.id.clone(),
                lease_token: claim.token.clone(),
                result: result.as_object().map(pb_struct),
                ..Default::default()
            })
            .await
            .map_err(grpc_refusal)?
            .into_inner();
        Ok(grpc_job_state(answer.job.map_or(0, |j| j.state)))
    }

    /// A job's state and result.
    async fn get(&mut self, id: &str) -> (String, Value) {
        if self.is_http() {
            let answer = self
                .call(Method::GET, &format!("/ojs/v1/jobs/{id}"), None)
                .await
                .expect("get job");
            let job = &answer["job"];
            return (
                job["state"].as_str().unwrap_or_default().to_string(),
                job.get("result").cloned().unwrap_or(Value::Null),
            );
        }
        let job = self
            .grpc()
            .get_job(pb::GetJobRequest { job_id: id.into() })
            .await
            .expect("get job")
            .into_inner()
            .job
            .expect("a job");
        let result = match (job.result_value, job.result) {
            (Some(value), _) => json_value(value),
            (None, Some(s)) => json_value(prost_types::Value {
                kind: Some(Kind::StructValue(s)),
            }),
            (None, None) => Value::Null,
        };
        (grpc_job_state(job.state), result)
    }

    /// Creates a chain of steps of the given types on `queue`: HTTP `type: chain`; over gRPC the
    /// DAG form where each step depends on the previous one. Returns the workflow id and view.
    async fn create_chain(&mut self, name: &str, queue: &str, types: &[&str]) -> (String, Flow) {
        if self.is_http() {
            let steps: Vec<Value> = types
                .iter()
                .map(|t| json!({"type": t, "args": [], "options": {"queue": queue}}))
                .collect();
            let body = json!({"type": "chain", "name": name, "steps": steps});
            let answer = self
                .call(Method::POST, "/ojs/v1/workflows", Some(body))
                .await
                .expect("create workflow");
            let w = &answer["workflow"];
            return (
                w["id"].as_str().unwrap_or_default().to_string(),
                http_flow(w),
            );
        }
        let steps = types
            .iter()
            .enumerate()
            .map(|(i, t)| pb::WorkflowStep {
                id: format!("step{i}"),
                r#type: t.to_string(),
                args: Vec::new(),
                depends_on: if i == 0 {
                    Vec::new()
                } else {
                    vec![format!("step{}", i - 1)]
                },
                options: Some(pb::EnqueueOptions {
                    queue: queue.into(),
                    ..Default::default()
                }),
            })
            .collect();
        let w = self
            .grpc()
            .create_workflow(pb::CreateWorkflowRequest {
                name: name.into(),
                steps,
            })
            .await
            .expect("create workflow")
            .into_inner()
            .workflow
            .expect("a workflow");
        (w.id.clone(), grpc_flow(w))
    }

    async fn workflow(&mut self, id: &str) -> Flow {
        if self.is_http() {
            let answer = self
                .call(Method::GET, &format!("/ojs/v1/workflows/{id}"), None)
                .await
                .expect("get workflow");
            return http_flow(&answer["workflow"]);
        }
        let w = self
            .grpc()
            .get_workflow(pb::GetWorkflowRequest {
                workflow_id: id.into(),
            })
            .await
            .expect("get workflow")
            .into_inner()
            .workflow
            .expect("a workflow");
        grpc_flow(w)
    }

    /// Pauses (true) or resumes (false) a queue.
    async fn set_paused(&mut self, queue: &str, paused: bool) -> Result<(), Refusal> {
        if self.is_http() {
            let verb = if paused { "pause" } else { "resume" };
            let answer = self
                .call(
                    Method::POST,
                    &format!("/ojs/v1/queues/{queue}/{verb}"),
                    Some(json!({})),
                )
                .await?;
            assert_eq!(
                answer["queue"],
                json!({"name": queue, "paused": paused}),
                "the {verb} answer"
            );
            return Ok(());
        }
        let grpc = self.grpc();
        if paused {
            grpc.pause_queue(pb::PauseQueueRequest {
                queue: queue.into(),
            })
            .await
            .map(drop)
            .map_err(grpc_refusal)
        } else {
            grpc.resume_queue(pb::ResumeQueueRequest {
                queue: queue.into(),
            })
            .await
            .map(drop)
            .map_err(grpc_refusal)
        }
    }

    async fn stats(&mut self, queue: &str) -> Stats {
        if self.is_http() {
            let answer = self
                .call(Method::GET, &format!("/ojs/v1/queues/{queue}/stats"), None)
                .await
                .expect("queue stats");
            let q = &answer["queue"];
            return Stats {
                paused: q["paused"].as_bool().expect("paused"),
                available: q["available"].as_i64().unwrap_or(-1),
                scheduled: q["scheduled"].as_i64().unwrap_or(-1),
            };
        }
        let stats = self
            .grpc()
            .queue_stats(pb::QueueStatsRequest {
                queue: queue.into(),
            })
            .await
            .expect("queue stats")
            .into_inner()
            .stats
            .expect("stats");
        Stats {
            paused: stats.paused,
            available: stats.available,
            scheduled: stats.scheduled,
        }
    }
}

fn types(claims: &[Claim]) -> Vec<&str> {
    claims.iter().map(|c| c.job_type.as_str()).collect()
}

// ---------------------------------------------------------------------------------------------
// Scenarios

/// How long ahead the scheduled job is due, and how late it may be delivered.
const DUE_IN: TimeDelta = TimeDelta::milliseconds(1500);
const GRACE: TimeDelta = TimeDelta::milliseconds(1500);

/// A job scheduled ahead: scheduled, not fetchable before it is due, delivered once due.
async fn scheduled_job(client: &mut Client) -> Vec<String> {
    let queue = "adv-sched";
    // Millisecond precision: what both the RFC 3339 text and the Timestamp carry here.
    let due =
        DateTime::from_timestamp_millis((Utc::now() + DUE_IN).timestamp_millis()).expect("a time");
    let (id, state) = client
        .enqueue(queue, "adv.scheduled", Some(due), false)
        .await
        .expect("enqueue");
    let mut trace = vec![format!("enqueued {state}")];
    trace.push(format!("get {}", client.get(&id).await.0));
    trace.push(format!("{:?}", client.stats(queue).await));
    let fetched = client.fetch(queue).await.len();
    assert!(
        Utc::now() < due,
        "the first fetch must run before the due time"
    );
    trace.push(format!("fetched before due {fetched}"));

    // Poll until delivered: never before the due time, and within GRACE after it.
    let mut early_fetches = 0;
    let claim = loop {
        let claims = client.fetch(queue).await;
        let now = Utc::now();
        if let Some(claim) = claims.into_iter().next() {
            assert!(
                now >= due,
                "delivered {} ms before it was due",
                (due - now).num_milliseconds()
            );
            break claim;
        }
        assert!(
            now < due + GRACE,
            "not delivered within {} ms after it was due",
            GRACE.num_milliseconds()
        );
        if now < due {
            early_fetches += 1;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(early_fetches > 0, "some polls ran before the due time");
    trace.push(format!("delivered the job {}", claim.id == id));
    trace.push(format!(
        "scheduled_at as requested {}",
        claim.scheduled_at == Some(due)
    ));
    // The server's own clock: the claim did not start before the scheduled time.
    trace.push(format!(
        "started no earlier than scheduled {}",
        matches!((claim.started_at, claim.scheduled_at), (Some(s), Some(d)) if s >= d)
    ));
    trace.push(format!("get {}", client.get(&id).await.0));
    trace
}

/// A two-step chain: step 2 runs after step 1 completes and sees its result.
async fn chain_workflow(client: &mut Client) -> Vec<String> {
    let queue = "adv-chain";
    let (wf, flow) = client
        .create_chain("adv-chain", queue, &["adv.step1", "adv.step2"])
        .await;
    let mut trace = vec![format!("created {flow:?}")];

    let first = client.fetch(queue).await;
    trace.push(format!("fetched {:?}", types(&first)));
    let first = first.into_iter().next().expect("step 1 is fetchable");
    trace.push(format!(
        "step 1 in the workflow {}",
        first.workflow_id == wf
    ));
    trace.push(format!("step 1 parent_results {:?}", first.parent_results));
    trace.push(format!(
        "ack step 1 {:?}",
        client.ack(&first, json!({"value": 42})).await.map_err(code)
    ));
    trace.push(format!("after step 1 {:?}", client.workflow(&wf).await));

    let second = client.fetch(queue).await;
    trace.push(format!("fetched {:?}", types(&second)));
    let second = second.into_iter().next().expect("step 2 is fetchable");
    trace.push(format!(
        "step 2 in the workflow {}",
        second.workflow_id == wf
    ));
    trace.push(format!(
        "step 2 parent_results {}",
        second.parent_results.clone().unwrap_or(Value::Null)
    ));
    trace.push(format!("step 1 result {}", client.get(&first.id).await.1));
    trace.push(format!(
        "ack step 2 {:?}",
        client
            .ack(&second, json!({"value": 43}))
            .await
            .map_err(code)
    ));
    trace.push(format!("after step 2 {:?}", client.workflow(&wf).await));
    trace.push(format!(
        "fetched afterwards {}",
        client.fetch(queue).await.len()
    ));
    trace
}

/// Two enqueues with the same unique key and on_conflict reject: the second is a duplicate.
async fn unique_conflict(client: &mut Client) -> Vec<String> {
    let queue = "adv-unique";
    let first = client.enqueue(queue, "adv.unique", None, true).await;
    let mut trace = vec![format!(
        "first {:?}",
        first.clone().map(|(_, state)| state).map_err(code)
    )];
    let second = client.enqueue(queue, "adv.unique", None, true).await;
    if let Err(refusal) = &second {
        let expected = if client.is_http() {
            "409"
        } else {
            "AlreadyExists"
        };
        assert_eq!(
            refusal.status, expected,
            "the transport status of a duplicate"
        );
    }
    trace.push(format!(
        "second {:?}",
        second.map(|(_, state)| state).map_err(code)
    ));
    let claims = client.fetch(queue).await;
    trace.push(format!("fetched {}", claims.len()));
    trace.push(format!(
        "the first job {}",
        matches!((&first, claims.first()), (Ok((id, _)), Some(c)) if *id == c.id)
    ));
    trace
}

/// A paused queue takes jobs but delivers none until resumed.
async fn pause_resume(client: &mut Client) -> Vec<String> {
    let queue = "adv-pause";
    let mut trace = vec![format!(
        "pause {:?}",
        client.set_paused(queue, true).await.map_err(code)
    )];
    let (id, state) = client
        .enqueue(queue, "adv.paused", None, false)
        .await
        .expect("enqueue into a paused queue");
    trace.push(format!("enqueued {state}"));
    trace.push(format!(
        "fetched while paused {}",
        client.fetch(queue).await.len()
    ));
    trace.push(format!("{:?}", client.stats(queue).await));
    trace.push(format!(
        "resume {:?}",
        client.set_paused(queue, false).await.map_err(code)
    ));
    trace.push(format!("{:?}", client.stats(queue).await));
    let claims = client.fetch(queue).await;
    trace.push(format!(
        "fetched after resume {} the job {}",
        claims.len(),
        claims.first().is_some_and(|c| c.id == id)
    ));
    trace.push(format!("get {}", client.get(&id).await.0));
    trace
}

/// The scenarios both protocols run; each returns the trace of what it observed.
async fn run_scenarios(client: &mut Client) -> Vec<(String, Vec<String>)> {
    vec![
        ("scheduled".to_string(), scheduled_job(client).await),
        ("chain".to_string(), chain_workflow(client).await),
        ("unique conflict".to_string(), unique_conflict(client).await),
        ("pause/resume".to_string(), pause_resume(client).await),
    ]
}

fn owned(trace: Vec<&str>) -> Vec<String> {
    trace.into_iter().map(str::to_string).collect()
}

fn expected_traces() -> Vec<(String, Vec<String>)> {
    vec![
        (
            "scheduled".to_string(),
            owned(vec![
                "enqueued scheduled",
                "get scheduled",
                "Stats { paused: false, available: 0, scheduled: 1 }",
                "fetched before due 0",
                "delivered the job true",
                "scheduled_at as requested true",
                "started no earlier than scheduled true",
                "get active",
            ]),
        ),
        (
            "chain".to_string(),
            owned(vec![
                r#"created Flow { state: "running", steps: [("adv.step1", "pending"), ("adv.step2", "waiting")], steps_completed: 0 }"#,
                r#"fetched ["adv.step1"]"#,
                "step 1 in the workflow true",
                "step 1 parent_results None",
                r#"ack step 1 Ok("completed")"#,
                r#"after step 1 Flow { state: "running", steps: [("adv.step1", "completed"), ("adv.step2", "pending")], steps_completed: 1 }"#,
                r#"fetched ["adv.step2"]"#,
                "step 2 in the workflow true",
                r#"step 2 parent_results [{"value":42}]"#,
                r#"step 1 result {"value":42}"#,
                r#"ack step 2 Ok("completed")"#,
                r#"after step 2 Flow { state: "completed", steps: [("adv.step1", "completed"), ("adv.step2", "completed")], steps_completed: 2 }"#,
                "fetched afterwards 0",
            ]),
        ),
        (
            "unique conflict".to_string(),
            owned(vec![
                r#"first Ok("available")"#,
                r#"second Err("duplicate")"#,
                "fetched 1",
                "the first job true",
            ]),
        ),
        (
            "pause/resume".to_string(),
            owned(vec![
                "pause Ok(())",
                "enqueued available",
                "fetched while paused 0",
                "Stats { paused: true, available: 1, scheduled: 0 }",
                "resume Ok(())",
                "Stats { paused: false, available: 1, scheduled: 0 }",
                "fetched after resume 1 the job true",
                "get active",
            ]),
        ),
    ]
}

#[tokio::test]
async fn advanced_features_are_the_same_over_http_and_grpc() {
    let app = common::spawn_app().await;
    let mut http = Client::Http(reqwest::Client::new(), app.http_url.clone());
    let over_http = run_scenarios(&mut http).await;

    let app2 = common::spawn_app().await;
    let mut grpc = Client::Grpc(app2.grpc().await);
    let over_grpc = run_scenarios(&mut grpc).await;

    assert_eq!(over_http, expected_traces(), "HTTP traces");
    assert_eq!(over_grpc, over_http, "gRPC must match HTTP");
}
