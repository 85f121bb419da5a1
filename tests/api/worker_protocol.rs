//! The worker protocol beyond the basic lifecycle: dead letters, heartbeats and directives, the
//! `timeout_ms` bound, pending jobs, retention and id reuse, admission of long polls, and the
//! maintenance pass (expired leases, expired jobs). Each test runs on its own server and database;
//! behaviour that exists in both protocols is checked over HTTP and over gRPC.

use crate::common;

use common::codes::{error_code, grpc_code};
use common::wait::eventually;
use std::time::Duration;

use pgvs3::grpc::proto::ojs::v1 as pb;
use reqwest::StatusCode;
use serde_json::{Value, json};
use tokio::time::Instant;

type Grpc = common::grpc::Ojs;

common::http::module_http!(
    /// The shared HTTP client (without a timeout: long polls and held requests run long), with the
    /// worker protocol's calls.
);

impl Http {
    fn new(app: &common::TestApp) -> Self {
        Http(common::http::Http::with_client(
            &app.http_url,
            reqwest::Client::new(),
        ))
    }

    /// Enqueues; the answer must be 201. Returns the job.
    async fn enqueue(&self, body: Value) -> Value {
        let (status, answer) = self.post("/ojs/v1/jobs", body).await;
        assert_eq!(status, StatusCode::CREATED, "enqueue: {answer}");
        answer["job"].clone()
    }

    /// Fetches; the answer must be 200. Returns the claimed jobs.
    async fn fetch(&self, body: Value) -> Vec<Value> {
        let (status, answer) = self.post("/ojs/v1/workers/fetch", body).await;
        assert_eq!(status, StatusCode::OK, "fetch: {answer}");
        answer["jobs"].as_array().expect("jobs array").clone()
    }

    /// The job, which must exist.
    async fn job(&self, id: &str) -> Value {
        let (status, answer) = self.get(&format!("/ojs/v1/jobs/{id}")).await;
        assert_eq!(status, StatusCode::OK, "get {id}: {answer}");
        answer["job"].clone()
    }

    /// Nacks a claimed job with its lease token; the answer must be 200.
    async fn nack(&self, claimed: &Value) -> Value {
        let (status, answer) = self
            .post(
                "/ojs/v1/workers/nack",
                json!({"job_id": claimed["id"], "lease_token": claimed["lease_token"],
                       "error": {"code": "handler_error", "message": "boom"}}),
            )
            .await;
        assert_eq!(status, StatusCode::OK, "nack: {answer}");
        answer
    }

    /// Acks a claimed job with its lease token; the answer must be 200.
    async fn ack(&self, claimed: &Value) -> Value {
        let (status, answer) = self
            .post(
                "/ojs/v1/workers/ack",
                json!({"job_id": claimed["id"], "lease_token": claimed["lease_token"],
                       "result": {"ok": true}}),
            )
            .await;
        assert_eq!(status, StatusCode::OK, "ack: {answer}");
        answer
    }

    async fn heartbeat(&self, body: Value) -> (StatusCode, Value) {
        self.post("/ojs/v1/workers/heartbeat", body).await
    }

    /// A page of dead letters; the answer must be 200.
    async fn dead_letters(&self, query: &str) -> Value {
        let (status, answer) = self.get(&format!("/ojs/v1/dead-letter{query}")).await;
        assert_eq!(status, StatusCode::OK, "dead letters {query}: {answer}");
        answer
    }

    /// Enqueues a single-attempt dead-letter job into `queue`, fetches and nacks it.
    async fn make_dead_letter(&self, queue: &str) -> String {
        let id = id_of(
            &self
                .enqueue(json!({"type": "dlq.job", "args": [queue],
                    "options": {"queue": queue,
                                "retry": {"max_attempts": 1, "on_exhaustion": "dead_letter"}}}))
                .await,
        );
        let claimed = self.fetch(json!({"queues": [queue]})).await;
        assert_eq!(ids(&claimed), vec![id.clone()]);
        assert_eq!(self.nack(&claimed[0]).await["state"], "discarded");
        id
    }
}

fn id_of(job: &Value) -> String {
    job["id"].as_str().expect("job id").to_string()
}

fn ids(jobs: &[Value]) -> Vec<String> {
    jobs.iter().map(id_of).collect()
}

fn page_ids(page: &Value) -> Vec<String> {
    ids(page["jobs"].as_array().expect("jobs array"))
}

fn grpc_state(state: i32) -> String {
    pb::JobState::try_from(state)
        .map(|s| {
            s.as_str_name()
                .trim_start_matches("JOB_STATE_")
                .to_lowercase()
        })
        .unwrap_or_default()
}

fn dead_letter_policy(on_exhaustion: &str) -> pb::RetryPolicy {
    pb::RetryPolicy {
        max_attempts: 1,
        on_exhaustion: on_exhaustion.into(),
        ..Default::default()
    }
}

fn text(s: &str) -> prost_types::Value {
    prost_types::Value {
        kind: Some(prost_types::value::Kind::StringValue(s.into())),
    }
}

async fn grpc_enqueue(grpc: &mut Grpc, options: pb::EnqueueOptions) -> pb::Job {
    grpc_enqueue_request(
        grpc,
        pb::EnqueueRequest {
            r#type: "grpc.job".into(),
            args: vec![text("x")],
            options: Some(options),
            ..Default::default()
        },
    )
    .await
    .expect("enqueue")
}

async fn grpc_enqueue_request(
    grpc: &mut Grpc,
    request: pb::EnqueueRequest,
) -> Result<pb::Job, tonic::Status> {
    grpc.enqueue(request)
        .await
        .map(|r| r.into_inner().job.expect("job"))
}

async fn grpc_fetch(grpc: &mut Grpc, request: pb::FetchRequest) -> Vec<pb::Job> {
    grpc.fetch(request).await.expect("fetch").into_inner().jobs
}

fn fetch_of(queue: &str) -> pb::FetchRequest {
    pb::FetchRequest {
        queues: vec![queue.into()],
        count: 10,
        ..Default::default()
    }
}

async fn grpc_nack(grpc: &mut Grpc, claimed: &pb::Job) -> pb::NackResponse {
    grpc.nack(pb::NackRequest {
        job_id: claimed.id.clone(),
        lease_token: claimed.lease_token.clone(),
        error: Some(pb::JobError {
            code: "handler_error".into(),
            message: "boom".into(),
            ..Default::default()
        }),
        ..Default::default()
    })
    .await
    .expect("nack")
    .into_inner()
}

async fn grpc_get(grpc: &mut Grpc, id: &str) -> Result<pb::Job, tonic::Status> {
    grpc.get_job(pb::GetJobRequest { job_id: id.into() })
        .await
        .map(|r| r.into_inner().job.expect("job"))
}

async fn grpc_dead_letters(
    grpc: &mut Grpc,
    queue: &str,
    limit: i32,
    cursor: &str,
) -> pb::ListDeadLetterResponse {
    grpc.list_dead_letter(pb::ListDeadLetterRequest {
        queue: queue.into(),
        limit,
        cursor: cursor.into(),
    })
    .await
    .expect("list dead letters")
    .into_inner()
}

/// Enqueues a single-attempt dead-letter job over gRPC, fetches and nacks it.
async fn grpc_make_dead_letter(grpc: &mut Grpc, queue: &str) -> String {
    let job = grpc_enqueue(
        grpc,
        pb::EnqueueOptions {
            queue: queue.into(),
            retry: Some(dead_letter_policy("dead_letter")),
            ..Default::default()
        },
    )
    .await;
    let claimed = grpc_fetch(grpc, fetch_of(queue)).await;
    assert_eq!(claimed.len(), 1);
    assert_eq!(claimed[0].id, job.id);
    assert_eq!(
        grpc_state(grpc_nack(grpc, &claimed[0]).await.state),
        "discarded"
    );
    job.id
}

fn grpc_ids(jobs: &[pb::Job]) -> Vec<String> {
    jobs.iter().map(|j| j.id.clone()).collect()
}

// ---------------------------------------------------------------------------------------------
// 1. Dead letters.

#[tokio::test]
async fn dead_letters_over_http() {
    let app = common::spawn_app().await;
    let http = Http::new(&app);

    // A single-attempt dead_letter job, nacked: discarded and listed with its failure.
    let a = id_of(
        &http
            .enqueue(json!({"type": "dlq.job", "args": [1],
                "options": {"queue": "dlq-a",
                            "retry": {"max_attempts": 1, "on_exhaustion": "dead_letter"}}}))
            .await,
    );
    let claimed = http.fetch(json!({"queues": ["dlq-a"]})).await;
    assert_eq!(ids(&claimed), vec![a.clone()]);
    assert_eq!(http.nack(&claimed[0]).await["state"], "discarded");
    assert_eq!(http.job(&a).await["state"], "discarded");

    // The same with on_exhaustion discard: discarded, but not a dead letter.
    let b = id_of(
        &http
            .enqueue(json!({"type": "dlq.job", "args": [2],
                "options": {"queue": "dlq-a",
                            "retry": {"max_attempts": 1, "on_exhaustion": "discard"}}}))
            .await,
    );
    let claimed = http.fetch(json!({"queues": ["dlq-a"]})).await;
    assert_eq!(ids(&claimed), vec![b.clone()]);
    assert_eq!(http.nack(&claimed[0]).await["state"], "discarded");
    assert_eq!(http.job(&b).await["state"], "discarded");

    let page = http.dead_letters("").await;
    assert_eq!(page_ids(&page), vec![a.clone()], "only the dead_letter job");
    let listed = &page["jobs"][0];
    assert_eq!(listed["state"], "discarded");
    let errors = listed["errors"].as_array().expect("errors history");
    assert_eq!(errors.len(), 1, "one failure recorded: {listed}");
    assert_eq!(errors[0]["code"], "handler_error");
    assert_eq!(errors[0]["message"], "boom");
    assert_eq!(page["pagination"]["total"], 1);
    assert_eq!(page["pagination"]["has_more"], false);

    // Retry: available again with attempts reset, and no longer a dead letter.
    let (status, body) = http
        .post(&format!("/ojs/v1/dead-letter/{a}/retry"), json!({}))
        .await;
    assert_eq!(status, StatusCode::OK, "retry: {body}");
    assert_eq!(body["job"]["id"], a.as_str());
    assert_eq!(body["job"]["state"], "available");
    assert_eq!(body["job"]["attempt"], 0);
    let job = http.job(&a).await;
    assert_eq!(
        (job["state"].clone(), job["attempt"].clone()),
        (json!("available"), json!(0))
    );
    let page = http.dead_letters("").await;
    assert!(
        page_ids(&page).is_empty(),
        "retried job left the DLQ: {page}"
    );
    assert_eq!(page["pagination"]["total"], 0);

    // Fetched again as attempt 1, failed again: back in the DLQ.
    let claimed = http.fetch(json!({"queues": ["dlq-a"]})).await;
    assert_eq!(ids(&claimed), vec![a.clone()]);
    assert_eq!(claimed[0]["attempt"], 1);
    assert_eq!(http.nack(&claimed[0]).await["state"], "discarded");
    let page = http.dead_letters("").await;
    assert_eq!(page_ids(&page), vec![a.clone()]);
    assert_eq!(page["pagination"]["total"], 1);

    // Delete: gone from the list and from the job store.
    let (status, body) = http.delete(&format!("/ojs/v1/dead-letter/{a}")).await;
    assert_eq!(status, StatusCode::OK, "delete: {body}");
    assert_eq!(body, json!({"deleted": true, "job_id": a}));
    let page = http.dead_letters("").await;
    assert!(
        page_ids(&page).is_empty(),
        "deleted job still listed: {page}"
    );
    assert_eq!(page["pagination"]["total"], 0);
    let (status, body) = http.get(&format!("/ojs/v1/jobs/{a}")).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "deleted job: {body}");
    let (status, body) = http.delete(&format!("/ojs/v1/dead-letter/{a}")).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "delete again: {body}");
    assert_eq!(error_code(&body), "not_found");

    // Retry of ids that are not dead letters.
    let (status, body) = http
        .post(&format!("/ojs/v1/dead-letter/{b}/retry"), json!({}))
        .await;
    assert_eq!(
        status,
        StatusCode::NOT_FOUND,
        "retry of a discard-policy job: {body}"
    );
    assert_eq!(error_code(&body), "not_found");
    assert_eq!(http.job(&b).await["state"], "discarded", "unchanged");
    let unknown = uuid::Uuid::now_v7().to_string();
    let (status, body) = http
        .post(&format!("/ojs/v1/dead-letter/{unknown}/retry"), json!({}))
        .await;
    assert_eq!(
        status,
        StatusCode::NOT_FOUND,
        "retry of an unknown id: {body}"
    );
    assert_eq!(error_code(&body), "not_found");

    // Queue filter and pagination: three dead letters in dlq-p, one in dlq-q.
    let mut p = Vec::new();
    for _ in 0..3 {
        p.push(http.make_dead_letter("dlq-p").await);
    }
    let q = http.make_dead_letter("dlq-q").await;
    let newest_first: Vec<String> = p.iter().rev().cloned().collect();

    let all = http.dead_letters("").await;
    assert_eq!(all["pagination"]["total"], 4);
    assert_eq!(page_ids(&all).len(), 4);

    let only_p = http.dead_letters("?queue=dlq-p").await;
    assert_eq!(page_ids(&only_p), newest_first, "newest first");
    assert_eq!(only_p["pagination"]["total"], 3);
    let only_q = http.dead_letters("?queue=dlq-q").await;
    assert_eq!(page_ids(&only_q), vec![q.clone()]);
    assert_eq!(only_q["pagination"]["total"], 1);
    let only_a = http.dead_letters("?queue=dlq-a").await;
    assert!(page_ids(&only_a).is_empty(), "dlq-a has none: {only_a}");
    assert_eq!(only_a["pagination"]["total"], 0);

    let first = http.dead_letters("?queue=dlq-p&limit=2").await;
    assert_eq!(page_ids(&first), newest_first[..2].to_vec());
    assert_eq!(first["pagination"]["total"], 3);
    assert_eq!(first["pagination"]["has_more"], true);
    assert_eq!(first["pagination"]["limit"], 2);
    assert_eq!(first["pagination"]["offset"], 0);
    let second = http.dead_letters("?queue=dlq-p&limit=2&offset=2").await;
    assert_eq!(page_ids(&second), newest_first[2..].to_vec());
    assert_eq!(second["pagination"]["total"], 3);
    assert_eq!(second["pagination"]["has_more"], false);
    assert_eq!(second["pagination"]["offset"], 2);
}

#[tokio::test]
async fn dead_letters_over_grpc() {
    let app = common::spawn_app().await;
    let mut grpc = app.grpc().await;

    let a = grpc_enqueue(
        &mut grpc,
        pb::EnqueueOptions {
            queue: "dlq-a".into(),
            retry: Some(dead_letter_policy("dead_letter")),
            ..Default::default()
        },
    )
    .await
    .id;
    let claimed = grpc_fetch(&mut grpc, fetch_of("dlq-a")).await;
    assert_eq!(grpc_ids(&claimed), vec![a.clone()]);
    assert_eq!(
        grpc_state(grpc_nack(&mut grpc, &claimed[0]).await.state),
        "discarded"
    );

    let b = grpc_enqueue(
        &mut grpc,
        pb::EnqueueOptions {
            queue: "dlq-a".into(),
            retry: Some(dead_letter_policy("discard")),
            ..Default::default()
        },
    )
    .await
    .id;
    let claimed = grpc_fetch(&mut grpc, fetch_of("dlq-a")).await;
    assert_eq!(grpc_ids(&claimed), vec![b.clone()]);
    assert_eq!(
        grpc_state(grpc_nack(&mut grpc, &claimed[0]).await.state),
        "discarded"
    );

    let page = grpc_dead_letters(&mut grpc, "", 0, "").await;
    assert_eq!(
        grpc_ids(&page.jobs),
        vec![a.clone()],
        "only the dead_letter job"
    );
    assert_eq!(page.total_count, 1);
    assert_eq!(page.next_cursor, "");
    assert_eq!(grpc_state(page.jobs[0].state), "discarded");
    assert_eq!(page.jobs[0].errors.len(), 1, "one failure recorded");
    assert_eq!(page.jobs[0].errors[0].code, "handler_error");

    // Retry, fetch again as attempt 1, fail again: back in the DLQ.
    let retried = grpc
        .retry_dead_letter(pb::RetryDeadLetterRequest { job_id: a.clone() })
        .await
        .expect("retry dead letter")
        .into_inner()
        .job
        .expect("job");
    assert_eq!(grpc_state(retried.state), "available");
    assert_eq!(retried.attempt, 0);
    let page = grpc_dead_letters(&mut grpc, "", 0, "").await;
    assert!(page.jobs.is_empty());
    assert_eq!(page.total_count, 0);
    let claimed = grpc_fetch(&mut grpc, fetch_of("dlq-a")).await;
    assert_eq!(grpc_ids(&claimed), vec![a.clone()]);
    assert_eq!(claimed[0].attempt, 1);
    assert_eq!(
        grpc_state(grpc_nack(&mut grpc, &claimed[0]).await.state),
        "discarded"
    );
    let page = grpc_dead_letters(&mut grpc, "", 0, "").await;
    assert_eq!(grpc_ids(&page.jobs), vec![a.clone()]);

    // Delete; then the job is gone and a second delete is not_found.
    grpc.delete_dead_letter(pb::DeleteDeadLetterRequest { job_id: a.clone() })
        .await
        .expect("delete dead letter");
    let page = grpc_dead_letters(&mut grpc, "", 0, "").await;
    assert!(page.jobs.is_empty());
    assert_eq!(page.total_count, 0);
    let gone = grpc_get(&mut grpc, &a).await.expect_err("deleted job");
    assert_eq!(gone.code(), tonic::Code::NotFound);
    assert_eq!(grpc_code(&gone), "not_found");
    let again = grpc
        .delete_dead_letter(pb::DeleteDeadLetterRequest { job_id: a.clone() })
        .await
        .expect_err("delete again");
    assert_eq!(grpc_code(&again), "not_found");

    // Retry of ids that are not dead letters.
    let not_dead = grpc
        .retry_dead_letter(pb::RetryDeadLetterRequest { job_id: b.clone() })
        .await
        .expect_err("retry of a discard-policy job");
    assert_eq!(not_dead.code(), tonic::Code::NotFound);
    assert_eq!(grpc_code(&not_dead), "not_found");
    let unknown = grpc
        .retry_dead_letter(pb::RetryDeadLetterRequest {
            job_id: uuid::Uuid::now_v7().to_string(),
        })
        .await
        .expect_err("retry of an unknown id");
    assert_eq!(grpc_code(&unknown), "not_found");

    // Queue filter and cursor pagination.
    let mut p = Vec::new();
    for _ in 0..3 {
        p.push(grpc_make_dead_letter(&mut grpc, "dlq-p").await);
    }
    let q = grpc_make_dead_letter(&mut grpc, "dlq-q").await;
    let newest_first: Vec<String> = p.iter().rev().cloned().collect();

    assert_eq!(grpc_dead_letters(&mut grpc, "", 0, "").await.total_count, 4);
    let only_q = grpc_dead_letters(&mut grpc, "dlq-q", 0, "").await;
    assert_eq!(grpc_ids(&only_q.jobs), vec![q]);
    assert_eq!(only_q.total_count, 1);
    let first = grpc_dead_letters(&mut grpc, "dlq-p", 2, "").await;
    assert_eq!(grpc_ids(&first.jobs), newest_first[..2].to_vec());
    assert_eq!(first.total_count, 3);
    assert!(!first.next_cursor.is_empty(), "a second page follows");
    let second = grpc_dead_letters(&mut grpc, "dlq-p", 2, &first.next_cursor).await;
    assert_eq!(grpc_ids(&second.jobs), newest_first[2..].to_vec());
    assert_eq!(second.total_count, 3);
    assert_eq!(second.next_cursor, "", "the last page");
}

// ---------------------------------------------------------------------------------------------
// 2. Heartbeats.

#[tokio::test]
async fn heartbeat_over_http_extends_only_the_workers_own_leases() {
    let app = common::spawn_app().await;
    let http = Http::new(&app);
    let mut enqueued = Vec::new();
    for n in 0..5 {
        enqueued.push(id_of(
            &http
                .enqueue(json!({"type": "hb.job", "args": [n], "options": {"queue": "hb"}}))
                .await,
        ));
    }
    let claimed = http
        .fetch(json!({"queues": ["hb"], "count": 5, "worker_id": "w1",
                      "visibility_timeout_ms": 400}))
        .await;
    let started = Instant::now();
    assert_eq!(ids(&claimed), enqueued, "all five claimed in order");
    let id = |i: usize| enqueued[i].clone();
    let token = |i: usize| claimed[i]["lease_token"].clone();

    tokio::time::sleep_until(started + Duration::from_millis(200)).await;
    // Form 1: active_jobs as an array of ids.
    let (status, one) = http
        .heartbeat(json!({"worker_id": "w1", "active_jobs": [id(0)],
                          "visibility_timeout_ms": 3000}))
        .await;
    // Form 2: active_jobs as a count, the ids in active_job_ids.
    let (status2, two) = http
        .heartbeat(
            json!({"worker_id": "w1", "active_jobs": 1, "active_job_ids": [id(1)],
                          "visibility_timeout_ms": 3000}),
        )
        .await;
    // Form 3: one job_id with its lease token.
    let (status3, three) = http
        .heartbeat(
            json!({"worker_id": "w1", "job_id": id(2), "lease_token": token(2),
                          "visibility_timeout_ms": 3000}),
        )
        .await;
    // Another worker cannot extend w1's lease.
    let (status4, other) = http
        .heartbeat(json!({"worker_id": "w2", "active_jobs": [id(3)],
                          "visibility_timeout_ms": 3000}))
        .await;
    // The right worker with a lease token that is not the job's lease does not extend it.
    let (status5, wrong) = http
        .heartbeat(json!({"worker_id": "w1", "job_id": id(4),
                          "lease_token": uuid::Uuid::new_v4().to_string(),
                          "visibility_timeout_ms": 3000}))
        .await;

    for (status, answer, i) in [(status, &one, 0), (status2, &two, 1), (status3, &three, 2)] {
        assert_eq!(status, StatusCode::OK, "heartbeat form {}: {answer}", i + 1);
        assert_eq!(
            answer["jobs_extended"],
            json!([id(i)]),
            "heartbeat form {} extends its job",
            i + 1
        );
        assert_eq!(answer["state"], "running");
        assert_eq!(answer["directive"], "running");
        assert!(answer["server_time"].is_string(), "{answer}");
    }
    for (status, answer, what) in [
        (status4, &other, "other worker"),
        (status5, &wrong, "wrong token"),
    ] {
        if status == StatusCode::OK {
            let extended = answer["jobs_extended"].as_array().expect("jobs_extended");
            assert!(extended.is_empty(), "{what} must not extend: {answer}");
        } else {
            assert_eq!(status, StatusCode::CONFLICT, "{what}: {answer}");
        }
    }

    // Past the original 400 ms lease: extended jobs are still active, the others expired.
    tokio::time::sleep_until(started + Duration::from_millis(800)).await;
    for i in 0..3 {
        assert_eq!(
            http.job(&id(i)).await["state"],
            "active",
            "job {i} was extended"
        );
    }
    assert_eq!(
        http.job(&id(3)).await["state"],
        "available",
        "another worker's heartbeat did not extend the lease"
    );
    assert_eq!(
        http.job(&id(4)).await["state"],
        "available",
        "a wrong lease token did not extend the lease"
    );
}

#[tokio::test]
async fn heartbeat_over_http_answers_the_directive() {
    let app = common::spawn_app().await;
    let http = Http::new(&app);
    let enqueue = async |directive: Option<&str>| {
        let mut options = json!({"queue": "directive"});
        if let Some(d) = directive {
            options["metadata"] = json!({"test_directive": d});
        }
        id_of(
            &http
                .enqueue(json!({"type": "hb.job", "args": [], "options": options}))
                .await,
        )
    };
    let quiet = enqueue(Some("quiet")).await;
    let terminate = enqueue(Some("terminate")).await;
    let plain = enqueue(None).await;
    let claimed = http
        .fetch(json!({"queues": ["directive"], "count": 3, "worker_id": "w1"}))
        .await;
    assert_eq!(claimed.len(), 3);

    let directive = async |jobs: Vec<&String>| {
        let wanted = jobs.len();
        let (status, answer) = http
            .heartbeat(json!({"worker_id": "w1", "active_jobs": jobs}))
            .await;
        assert_eq!(status, StatusCode::OK, "{answer}");
        assert_eq!(
            answer["jobs_extended"].as_array().map(Vec::len),
            Some(wanted),
            "{answer}"
        );
        assert_eq!(answer["directive"], answer["state"]);
        answer["state"].as_str().unwrap_or_default().to_string()
    };
    assert_eq!(directive(vec![&quiet]).await, "quiet");
    assert_eq!(directive(vec![&quiet, &terminate]).await, "terminate");
    assert_eq!(directive(vec![&terminate, &quiet]).await, "terminate");
    assert_eq!(directive(vec![&quiet, &plain]).await, "quiet");
    assert_eq!(directive(vec![&plain]).await, "running");
}

#[tokio::test]
async fn heartbeat_over_grpc_extends_and_directs() {
    let app = common::spawn_app().await;
    let mut grpc = app.grpc().await;
    let quiet = grpc_enqueue(
        &mut grpc,
        pb::EnqueueOptions {
            queue: "ghb".into(),
            meta: Some(prost_types::Struct {
                fields: [("test_directive".to_string(), text("quiet"))]
                    .into_iter()
                    .collect(),
            }),
            ..Default::default()
        },
    )
    .await
    .id;
    let plain = grpc_enqueue(
        &mut grpc,
        pb::EnqueueOptions {
            queue: "ghb".into(),
            ..Default::default()
        },
    )
    .await
    .id;
    let stranger = grpc_enqueue(
        &mut grpc,
        pb::EnqueueOptions {
            queue: "ghb".into(),
            ..Default::default()
        },
    )
    .await
    .id;
    let claimed = grpc_fetch(
        &mut grpc,
        pb::FetchRequest {
            queues: vec!["ghb".into()],
            count: 3,
            worker_id: "gw".into(),
            visibility_timeout_ms: 400,
            ..Default::default()
        },
    )
    .await;
    let started = Instant::now();
    assert_eq!(
        grpc_ids(&claimed),
        vec![quiet.clone(), plain.clone(), stranger.clone()]
    );

    tokio::time::sleep_until(started + Duration::from_millis(200)).await;
    let answer = grpc
        .heartbeat(pb::HeartbeatRequest {
            id: quiet.clone(),
            worker_id: "gw".into(),
            visibility_timeout_ms: 3000,
            ..Default::default()
        })
        .await
        .expect("heartbeat")
        .into_inner();
    assert_eq!(answer.jobs_extended, vec![quiet.clone()]);
    assert_eq!(answer.directed_state, pb::WorkerState::Quiet as i32);
    let deadline = answer.new_deadline.expect("new deadline");
    let now = chrono::Utc::now().timestamp_millis();
    let deadline_ms = deadline.seconds * 1000 + i64::from(deadline.nanos) / 1_000_000;
    assert!(
        deadline_ms >= now + 2000,
        "the lease now runs ~3 s: deadline {deadline_ms}, now {now}"
    );

    let answer = grpc
        .heartbeat(pb::HeartbeatRequest {
            worker_id: "gw".into(),
            job_ids: vec![plain.clone()],
            visibility_timeout_ms: 3000,
            ..Default::default()
        })
        .await
        .expect("heartbeat")
        .into_inner();
    assert_eq!(answer.jobs_extended, vec![plain.clone()]);
    assert_eq!(answer.directed_state, pb::WorkerState::Running as i32);

    let answer = grpc
        .heartbeat(pb::HeartbeatRequest {
            id: stranger.clone(),
            worker_id: "someone-else".into(),
            visibility_timeout_ms: 3000,
            ..Default::default()
        })
        .await
        .expect("heartbeat")
        .into_inner();
    assert!(
        answer.jobs_extended.is_empty(),
        "another worker must not extend: {answer:?}"
    );

    tokio::time::sleep_until(started + Duration::from_millis(800)).await;
    for id in [&quiet, &plain] {
        let job = grpc_get(&mut grpc, id).await.expect("get");
        assert_eq!(grpc_state(job.state), "active", "{id} was extended");
    }
    let job = grpc_get(&mut grpc, &stranger).await.expect("get");
    assert_eq!(
        grpc_state(job.state),
        "available",
        "not extended, lease expired"
    );
}

// ---------------------------------------------------------------------------------------------
// 3. timeout_ms bounds the lease.

#[tokio::test]
async fn timeout_ms_bounds_the_lease_even_with_heartbeats() {
    let app = common::spawn_app().await;
    let http = Http::new(&app);
    let mut grpc = app.grpc().await;
    let retried = id_of(
        &http
            .enqueue(json!({"type": "slow.job", "args": [],
                            "options": {"queue": "slow", "timeout_ms": 600}}))
            .await,
    );
    let single = id_of(
        &http
            .enqueue(json!({"type": "slow.job", "args": [],
                            "options": {"queue": "slow", "timeout_ms": 600,
                                        "retry": {"max_attempts": 1}}}))
            .await,
    );
    let over_grpc = grpc_enqueue(
        &mut grpc,
        pb::EnqueueOptions {
            queue: "slow-grpc".into(),
            timeout_ms: 600,
            ..Default::default()
        },
    )
    .await
    .id;

    let claimed = http
        .fetch(json!({"queues": ["slow"], "count": 2, "worker_id": "w1",
                      "visibility_timeout_ms": 10000}))
        .await;
    assert_eq!(ids(&claimed), vec![retried.clone(), single.clone()]);
    let claimed = grpc_fetch(
        &mut grpc,
        pb::FetchRequest {
            queues: vec!["slow-grpc".into()],
            worker_id: "gw".into(),
            visibility_timeout_ms: 10_000,
            ..Default::default()
        },
    )
    .await;
    assert_eq!(grpc_ids(&claimed), vec![over_grpc.clone()]);
    let started = Instant::now();

    // A heartbeat asking for 10 s more cannot push the lease past timeout_ms.
    tokio::time::sleep_until(started + Duration::from_millis(300)).await;
    let (status, answer) = http
        .heartbeat(json!({"worker_id": "w1", "active_jobs": [retried, single],
                          "visibility_timeout_ms": 10000}))
        .await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    grpc.heartbeat(pb::HeartbeatRequest {
        id: over_grpc.clone(),
        worker_id: "gw".into(),
        visibility_timeout_ms: 10_000,
        ..Default::default()
    })
    .await
    .expect("heartbeat");

    // Lease end ~600 ms, then the next maintenance pass (every 500 ms) releases it.
    tokio::time::sleep_until(started + Duration::from_millis(1500)).await;
    let within = Duration::from_millis(2500);
    eventually(
        within,
        "the timed-out job is available with a timeout error",
        async || {
            let job = http.job(&retried).await;
            job["state"] == "available" && job["error"]["code"] == "timeout"
        },
    )
    .await;
    let job = http.job(&retried).await;
    assert_eq!(job["attempt"], 1);
    eventually(within, "the single-attempt job is discarded", async || {
        http.job(&single).await["state"] == "discarded"
    })
    .await;
    assert_eq!(http.job(&single).await["error"]["code"], "timeout");
    let mut grpc2 = grpc.clone();
    eventually(within, "the gRPC job timed out", async || {
        let job = grpc_get(&mut grpc2, &over_grpc).await.expect("get");
        grpc_state(job.state) == "available" && job.errors.iter().any(|e| e.code == "timeout")
    })
    .await;
}

// ---------------------------------------------------------------------------------------------
// 4. Pending jobs and activation.

#[tokio::test]
async fn activate_over_http() {
    let app = common::spawn_app().await;
    let http = Http::new(&app);
    let job = http
        .enqueue(json!({"type": "staged.job", "args": [],
                        "options": {"queue": "staged", "pending": true}}))
        .await;
    assert_eq!(job["state"], "pending");
    let id = id_of(&job);
    assert_eq!(http.job(&id).await["state"], "pending");
    assert!(
        http.fetch(json!({"queues": ["staged"]})).await.is_empty(),
        "a pending job is not fetchable"
    );

    let (status, body) = http
        .post(&format!("/ojs/v1/jobs/{id}/activate"), json!({}))
        .await;
    assert_eq!(status, StatusCode::OK, "activate: {body}");
    assert_eq!(body["job"]["state"], "available");
    let (status, body) = http
        .post(&format!("/ojs/v1/jobs/{id}/activate"), json!({}))
        .await;
    assert_eq!(status, StatusCode::CONFLICT, "activate again: {body}");
    assert_eq!(error_code(&body), "conflict");

    let claimed = http.fetch(json!({"queues": ["staged"]})).await;
    assert_eq!(ids(&claimed), vec![id.clone()], "fetchable once activated");
    let (status, body) = http
        .post(&format!("/ojs/v1/jobs/{id}/activate"), json!({}))
        .await;
    assert_eq!(
        status,
        StatusCode::CONFLICT,
        "activate an active job: {body}"
    );
    assert_eq!(error_code(&body), "conflict");
}

#[tokio::test]
async fn activate_over_grpc() {
    let app = common::spawn_app().await;
    let mut grpc = app.grpc().await;
    let job = grpc_enqueue(
        &mut grpc,
        pb::EnqueueOptions {
            queue: "staged".into(),
            pending: true,
            ..Default::default()
        },
    )
    .await;
    assert_eq!(grpc_state(job.state), "pending");
    let id = job.id;
    assert!(
        grpc_fetch(&mut grpc, fetch_of("staged")).await.is_empty(),
        "a pending job is not fetchable"
    );
    let activated = grpc
        .activate_job(pb::ActivateJobRequest { job_id: id.clone() })
        .await
        .expect("activate")
        .into_inner()
        .job
        .expect("job");
    assert_eq!(grpc_state(activated.state), "available");
    let again = grpc
        .activate_job(pb::ActivateJobRequest { job_id: id.clone() })
        .await
        .expect_err("activate again");
    assert_eq!(grpc_code(&again), "conflict");
    assert_eq!(again.code(), tonic::Code::FailedPrecondition);
    let claimed = grpc_fetch(&mut grpc, fetch_of("staged")).await;
    assert_eq!(grpc_ids(&claimed), vec![id]);
}

/// PostgreSQL sends a statement's error before it releases the statement's row locks, so a
/// refusal that had locked an available job made the very next claim skip it (SKIP LOCKED; the
/// activation test lost its job that way about once in twenty runs). A refused activation or ack
/// therefore locks nothing: here another transaction holds the job's row, and the refusals must
/// still answer at once (a refusal that locks would wait for that transaction).
#[tokio::test]
async fn refused_activations_and_acks_take_no_row_lock() {
    use sqlx::Connection;
    let app = common::spawn_app().await;
    let http = Http::new(&app);
    let job = http
        .enqueue(json!({"type": "refused.job", "args": [], "options": {"queue": "refusals"}}))
        .await;
    let id = id_of(&job);
    let claimed = http.fetch(json!({"queues": ["refusals"]})).await;
    assert_eq!(ids(&claimed), vec![id.clone()]);
    let stale = claimed[0]["lease_token"].clone();
    let (status, body) = http
        .post(
            "/ojs/v1/workers/nack",
            json!({"job_id": id, "lease_token": stale, "requeue": true,
                   "error": {"code": "handler_error", "message": "again"}}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "nack: {body}");

    let mut holder = sqlx::PgConnection::connect(&app.database_url)
        .await
        .expect("connect");
    let mut held = holder.begin().await.expect("begin");
    let schema: String =
        sqlx::query_scalar("SELECT schema_name FROM s3p.queues WHERE name = 'refusals'")
            .fetch_one(&mut *held)
            .await
            .expect("schema");
    let uuid: uuid::Uuid = id.parse().expect("uuid");
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "SELECT 1 FROM \"{schema}\".jobs WHERE id = $1 FOR UPDATE"
    )))
    .bind(uuid)
    .execute(&mut *held)
    .await
    .expect("lock the job's row");

    let within = Duration::from_secs(5);
    let activate = tokio::time::timeout(
        within,
        http.post(&format!("/ojs/v1/jobs/{id}/activate"), json!({})),
    )
    .await
    .expect("a refused activation does not wait for the row lock");
    assert_eq!(activate.0, StatusCode::CONFLICT, "activate: {}", activate.1);
    let ack = tokio::time::timeout(
        within,
        http.post(
            "/ojs/v1/workers/ack",
            json!({"job_id": id, "lease_token": stale}),
        ),
    )
    .await
    .expect("a refused ack does not wait for the row lock");
    assert!(ack.0.is_client_error(), "stale ack: {} {}", ack.0, ack.1);
    held.rollback().await.expect("rollback");

    let claimed = http.fetch(json!({"queues": ["refusals"]})).await;
    assert_eq!(ids(&claimed), vec![id], "the job is still there to claim");
}

// ---------------------------------------------------------------------------------------------
// 5. Retention and id reuse.

#[tokio::test]
async fn retention_removes_terminal_jobs_and_frees_their_ids() {
    let app = common::spawn_app_with(|s| s.service.job_retention_ms = 300).await;
    let http = Http::new(&app);
    let mut grpc = app.grpc().await;

    let http_id = uuid::Uuid::now_v7().to_string();
    let body = json!({"id": http_id, "type": "kept.job", "args": [], "options": {"queue": "kept"}});
    assert_eq!(id_of(&http.enqueue(body.clone()).await), http_id);
    let claimed = http.fetch(json!({"queues": ["kept"]})).await;
    assert_eq!(ids(&claimed), vec![http_id.clone()]);
    http.ack(&claimed[0]).await;

    let grpc_id = uuid::Uuid::now_v7().to_string();
    let request = pb::EnqueueRequest {
        id: grpc_id.clone(),
        r#type: "kept.job".into(),
        options: Some(pb::EnqueueOptions {
            queue: "kept-grpc".into(),
            ..Default::default()
        }),
        ..Default::default()
    };
    let job = grpc_enqueue_request(&mut grpc, request.clone())
        .await
        .expect("enqueue");
    assert_eq!(job.id, grpc_id);
    let claimed = grpc_fetch(&mut grpc, fetch_of("kept-grpc")).await;
    assert_eq!(grpc_ids(&claimed), vec![grpc_id.clone()]);
    grpc.ack(pb::AckRequest {
        job_id: grpc_id.clone(),
        lease_token: claimed[0].lease_token.clone(),
        ..Default::default()
    })
    .await
    .expect("ack");

    // A dead letter and a plain discarded job, both terminal.
    let dead = http.make_dead_letter("kept").await;
    let discarded = id_of(
        &http
            .enqueue(json!({"type": "kept.job", "args": [],
                            "options": {"queue": "kept", "retry": {"max_attempts": 1}}}))
            .await,
    );
    let claimed = http.fetch(json!({"queues": ["kept"]})).await;
    assert_eq!(ids(&claimed), vec![discarded.clone()]);
    assert_eq!(http.nack(&claimed[0]).await["state"], "discarded");

    // While the jobs are kept, their ids are taken.
    let (status, answer) = http.post("/ojs/v1/jobs", body.clone()).await;
    assert_eq!(status, StatusCode::CONFLICT, "{answer}");
    assert_eq!(error_code(&answer), "duplicate");
    let duplicate = grpc_enqueue_request(&mut grpc, request.clone())
        .await
        .expect_err("duplicate over gRPC");
    assert_eq!(grpc_code(&duplicate), "duplicate");
    assert_eq!(duplicate.code(), tonic::Code::AlreadyExists);

    // After the retention (300 ms) and a maintenance pass, they are gone.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    eventually(
        Duration::from_secs(3),
        "the completed job is removed",
        async || http.get(&format!("/ojs/v1/jobs/{http_id}")).await.0 == StatusCode::NOT_FOUND,
    )
    .await;
    let mut grpc2 = grpc.clone();
    eventually(
        Duration::from_secs(3),
        "the gRPC job is removed",
        async || {
            grpc_get(&mut grpc2, &grpc_id)
                .await
                .is_err_and(|e| grpc_code(&e) == "not_found")
        },
    )
    .await;
    let (status, answer) = http.get(&format!("/ojs/v1/jobs/{discarded}")).await;
    assert_eq!(
        status,
        StatusCode::NOT_FOUND,
        "a discard-policy job is removed: {answer}"
    );

    // The ids can be used again.
    let (status, answer) = http.post("/ojs/v1/jobs", body).await;
    assert_eq!(
        status,
        StatusCode::CREATED,
        "re-enqueue after retention: {answer}"
    );
    assert_eq!(answer["job"]["id"], http_id.as_str());
    assert_eq!(answer["job"]["state"], "available");
    let job = grpc_enqueue_request(&mut grpc, request)
        .await
        .expect("re-enqueue over gRPC after retention");
    assert_eq!(job.id, grpc_id);

    // A dead letter is not removed by retention.
    let page = http.dead_letters("").await;
    assert_eq!(page_ids(&page), vec![dead.clone()], "the dead letter stays");
    assert_eq!(http.job(&dead).await["state"], "discarded");
}

// ---------------------------------------------------------------------------------------------
// 6. Admission and long polls.

#[tokio::test]
async fn long_polls_give_back_their_admission_slot() {
    let app = common::spawn_app_with(|s| s.max_in_flight = 2).await;
    let http = Http::new(&app);
    // The queue must exist for a long poll to wait; empty it again.
    http.enqueue(json!({"type": "slot.job", "args": [], "options": {"queue": "slot"}}))
        .await;
    assert_eq!(http.fetch(json!({"queues": ["slot"]})).await.len(), 1);

    // Over HTTP: two long polls, as many as the limit.
    let mut polls = Vec::new();
    for _ in 0..2 {
        let client = reqwest::Client::new();
        let url = format!("{}/ojs/v1/workers/fetch", app.http_url);
        polls.push(tokio::spawn(async move {
            let response = client
                .post(url)
                .header("content-type", "application/json")
                .body(json!({"queues": ["slot"], "wait_ms": 1500}).to_string())
                .send()
                .await
                .expect("long poll");
            assert_eq!(response.status(), StatusCode::OK);
            let body: Value =
                serde_json::from_slice(&response.bytes().await.expect("body")).expect("json");
            ids(body["jobs"].as_array().expect("jobs"))
        }));
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (status, body) = http.get("/ojs/manifest").await;
    assert_eq!(
        status,
        StatusCode::OK,
        "waiting long polls hold no slot: {body}"
    );
    let (status, body) = http
        .post(
            "/ojs/v1/jobs",
            json!({"type": "slot.job", "args": [], "options": {"queue": "slot"}}),
        )
        .await;
    assert_eq!(
        status,
        StatusCode::CREATED,
        "enqueue beside the long polls: {body}"
    );
    let woken_for = id_of(&body["job"]);
    let mut got = Vec::new();
    for poll in polls {
        got.extend(poll.await.expect("join"));
    }
    assert_eq!(got, vec![woken_for], "one waiting fetch received the job");

    // Over gRPC: the same with two long-polling Fetch calls.
    let grpc = app.grpc().await;
    let mut polls = Vec::new();
    for _ in 0..2 {
        let mut grpc = grpc.clone();
        polls.push(tokio::spawn(async move {
            grpc_ids(
                &grpc_fetch(
                    &mut grpc,
                    pb::FetchRequest {
                        queues: vec!["slot".into()],
                        wait_ms: 1500,
                        ..Default::default()
                    },
                )
                .await,
            )
        }));
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut manifest_client = grpc.clone();
    manifest_client
        .manifest(pb::ManifestRequest {})
        .await
        .expect("waiting gRPC long polls hold no slot");
    let (status, body) = http.get("/ojs/manifest").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let woken_for = grpc_enqueue(
        &mut grpc.clone(),
        pb::EnqueueOptions {
            queue: "slot".into(),
            ..Default::default()
        },
    )
    .await
    .id;
    let mut got = Vec::new();
    for poll in polls {
        got.extend(poll.await.expect("join"));
    }
    assert_eq!(
        got,
        vec![woken_for],
        "one waiting gRPC fetch received the job"
    );
}

/// The limit itself: a request held open (headers sent, body still coming) keeps its slot, so with
/// `max_in_flight = 1` the next request of either protocol is refused; once it ends, requests pass.
#[tokio::test]
async fn admission_refuses_requests_beyond_max_in_flight() {
    use tokio::io::AsyncWriteExt;

    let app = common::spawn_app_with(|s| s.max_in_flight = 1).await;
    let http = Http::new(&app);
    let mut grpc = app.grpc().await;
    let (status, _) = http.get("/ojs/manifest").await;
    assert_eq!(status, StatusCode::OK);

    let addr = app.http_url.trim_start_matches("http://").to_string();
    let mut held = tokio::net::TcpStream::connect(&addr)
        .await
        .expect("connect");
    held.write_all(
        format!(
            "POST /ojs/v1/jobs HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
             Content-Length: 200\r\n\r\n{{\"type\":"
        )
        .as_bytes(),
    )
    .await
    .expect("write the head of a request");
    held.flush().await.expect("flush");

    let mut refused = Value::Null;
    eventually(
        Duration::from_secs(3),
        "a request beyond the limit gets 429",
        async || {
            let response = http
                .client
                .get(format!("{}/ojs/manifest", app.http_url))
                .send()
                .await
                .expect("manifest");
            if response.status() != StatusCode::TOO_MANY_REQUESTS {
                return false;
            }
            assert!(
                response.headers().contains_key("retry-after"),
                "429 carries Retry-After"
            );
            refused = serde_json::from_slice(&response.bytes().await.expect("body")).expect("json");
            true
        },
    )
    .await;
    assert_eq!(error_code(&refused), "rate_limited");
    let status = grpc
        .manifest(pb::ManifestRequest {})
        .await
        .expect_err("gRPC beyond the limit");
    assert_eq!(status.code(), tonic::Code::ResourceExhausted);
    assert_eq!(grpc_code(&status), "rate_limited");

    // Abandoning the held request frees its slot.
    drop(held);
    eventually(Duration::from_secs(3), "the slot comes back", async || {
        http.get("/ojs/manifest").await.0 == StatusCode::OK
    })
    .await;
}

// ---------------------------------------------------------------------------------------------
// 7. Maintenance discards exhausted expired leases.

#[tokio::test]
async fn exhausted_expired_lease_is_discarded_by_maintenance() {
    let app = common::spawn_app().await;
    let http = Http::new(&app);
    let mut grpc = app.grpc().await;
    let over_http = id_of(
        &http
            .enqueue(json!({"type": "lost.job", "args": [],
                            "options": {"queue": "lost", "retry": {"max_attempts": 1}}}))
            .await,
    );
    let over_grpc = grpc_enqueue(
        &mut grpc,
        pb::EnqueueOptions {
            queue: "lost-grpc".into(),
            retry: Some(pb::RetryPolicy {
                max_attempts: 1,
                ..Default::default()
            }),
            ..Default::default()
        },
    )
    .await
    .id;
    let claimed = http
        .fetch(json!({"queues": ["lost"], "visibility_timeout_ms": 200}))
        .await;
    assert_eq!(ids(&claimed), vec![over_http.clone()]);
    let claimed = grpc_fetch(
        &mut grpc,
        pb::FetchRequest {
            queues: vec!["lost-grpc".into()],
            visibility_timeout_ms: 200,
            ..Default::default()
        },
    )
    .await;
    assert_eq!(grpc_ids(&claimed), vec![over_grpc.clone()]);

    tokio::time::sleep(Duration::from_millis(1200)).await;
    eventually(
        Duration::from_secs(2),
        "the HTTP job is discarded",
        async || http.job(&over_http).await["state"] == "discarded",
    )
    .await;
    let job = http.job(&over_http).await;
    assert_eq!(job["error"]["code"], "timeout", "{job}");
    assert!(job["completed_at"].is_string(), "{job}");
    assert!(http.fetch(json!({"queues": ["lost"]})).await.is_empty());

    let mut grpc2 = grpc.clone();
    eventually(
        Duration::from_secs(2),
        "the gRPC job is discarded",
        async || {
            grpc_state(grpc_get(&mut grpc2, &over_grpc).await.expect("get").state) == "discarded"
        },
    )
    .await;
    assert!(
        grpc_fetch(&mut grpc, fetch_of("lost-grpc"))
            .await
            .is_empty()
    );
}

// ---------------------------------------------------------------------------------------------
// 8. Expired jobs are never delivered.

#[tokio::test]
async fn expired_jobs_are_never_delivered() {
    let app = common::spawn_app().await;
    let http = Http::new(&app);
    let mut grpc = app.grpc().await;
    let over_http = id_of(
        &http
            .enqueue(json!({"type": "stale.job", "args": [],
                            "options": {"queue": "stale", "expires_at": "+PT0.3S"}}))
            .await,
    );
    let over_grpc = grpc_enqueue(
        &mut grpc,
        pb::EnqueueOptions {
            queue: "stale-grpc".into(),
            ttl: Some(prost_types::Duration {
                seconds: 0,
                nanos: 300_000_000,
            }),
            ..Default::default()
        },
    )
    .await
    .id;

    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(
        http.fetch(json!({"queues": ["stale"]})).await.is_empty(),
        "an expired job is not delivered"
    );
    assert!(
        grpc_fetch(&mut grpc, fetch_of("stale-grpc"))
            .await
            .is_empty(),
        "an expired job is not delivered over gRPC"
    );
    eventually(
        Duration::from_secs(2),
        "the expired job is discarded",
        async || http.job(&over_http).await["state"] == "discarded",
    )
    .await;
    let job = http.job(&over_http).await;
    assert!(job.get("completed_at").is_none(), "never completed: {job}");
    assert_eq!(job["attempt"], 0, "never started: {job}");
    assert_eq!(job["error"]["code"], "expired", "{job}");

    let mut grpc2 = grpc.clone();
    eventually(
        Duration::from_secs(2),
        "the gRPC job is discarded",
        async || {
            grpc_state(grpc_get(&mut grpc2, &over_grpc).await.expect("get").state) == "discarded"
        },
    )
    .await;
    let job = grpc_get(&mut grpc, &over_grpc).await.expect("get");
    assert!(job.completed_at.is_none(), "never completed: {job:?}");
    assert_eq!(job.attempt, 0);
}

/// The batch-ack extension completes every job whose lease holds with one request and answers
/// the others exactly as single acks would (stale lease, not active, unknown), in request order.
#[tokio::test]
async fn batch_ack_over_http_completes_valid_acks_and_names_each_failure() {
    // Reads the event log right after commits: not while conformance runs (common::db).
    let _log = common::db::reading_the_event_log_at_once().await;
    let app = common::spawn_app().await;
    let http = Http::new(&app);
    for n in 0..4 {
        http.enqueue(json!({"type": "batch.ack", "args": [n], "options": {"queue": "bat"}}))
            .await;
    }
    let claimed = http.fetch(json!({"queues": ["bat"], "count": 4})).await;
    assert_eq!(claimed.len(), 4);
    // One job is already completed: acking it again (without a token) is a conflict.
    http.ack(&claimed[3]).await;
    let unknown = "019a0000-0000-7000-8000-000000000001";
    let (status, answer) = http
        .post(
            "/ojs/v1/workers/ack/batch",
            json!({"acks": [
                {"job_id": claimed[0]["id"], "lease_token": claimed[0]["lease_token"], "result": {"n": 0}},
                {"job_id": claimed[1]["id"], "lease_token": "019a0000-0000-7000-8000-0000000000ff"},
                {"job_id": claimed[2]["id"], "lease_token": claimed[2]["lease_token"], "result": [2]},
                {"job_id": claimed[3]["id"]},
                {"job_id": unknown},
            ]}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "batch ack: {answer}");
    assert_eq!(answer["acknowledged"], 2, "{answer}");
    let results = answer["results"].as_array().expect("results");
    let outcome: Vec<(String, bool, Value)> = results
        .iter()
        .map(|r| {
            (
                r["job_id"].as_str().expect("job_id").to_string(),
                r["acknowledged"].as_bool().expect("acknowledged"),
                r["error"]["code"].clone(),
            )
        })
        .collect();
    assert_eq!(
        outcome,
        vec![
            (id_of(&claimed[0]), true, Value::Null),
            (id_of(&claimed[1]), false, json!("stale_lease")),
            (id_of(&claimed[2]), true, Value::Null),
            (id_of(&claimed[3]), false, json!("conflict")),
            (unknown.to_string(), false, json!("not_found")),
        ]
    );
    assert_eq!(results[0]["state"], "completed");
    let first = http.job(&id_of(&claimed[0])).await;
    assert_eq!(
        (first["state"].clone(), first["result"].clone()),
        (json!("completed"), json!({"n": 0}))
    );
    assert_eq!(http.job(&id_of(&claimed[2])).await["result"], json!([2]));
    // The stale ack changed nothing: the job is still active under its real lease.
    assert_eq!(http.job(&id_of(&claimed[1])).await["state"], "active");
    http.ack(&claimed[1]).await;

    // Malformed batches are refused whole and change nothing.
    for bad in [
        json!({"acks": []}),
        json!({"acks": [{"job_id": "not-a-uuid"}]}),
        json!({"acks": [{"job_id": claimed[0]["id"]}, {"job_id": claimed[0]["id"]}]}),
        json!({"acks": "all"}),
    ] {
        let (status, answer) = http.post("/ojs/v1/workers/ack/batch", bad.clone()).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{bad}: {answer}");
        assert_eq!(
            answer["error"]["code"], "invalid_request",
            "{bad}: {answer}"
        );
    }
    let events = http
        .get("/ojs/v1/events?types=job.completed&queues=bat&limit=100")
        .await
        .1;
    let completed: Vec<&Value> = events["events"]
        .as_array()
        .expect("events")
        .iter()
        .filter(|e| e["data"]["queue"] == "bat")
        .collect();
    assert_eq!(
        completed.len(),
        4,
        "one job.completed per completed job: {events}"
    );
    app.stop().await;
}

/// The same extension over gRPC (`pgvs3.v1.WorkerService/AckBatch`).
#[tokio::test]
async fn batch_ack_over_grpc_completes_valid_acks_and_names_each_failure() {
    use pgvs3::grpc::proto::pgvs3::v1 as ext;
    let app = common::spawn_app().await;
    let mut grpc = app.grpc().await;
    let mut workers =
        ext::worker_service_client::WorkerServiceClient::connect(app.grpc_url.clone())
            .await
            .expect("connect gRPC");
    for _ in 0..2 {
        grpc_enqueue(
            &mut grpc,
            pb::EnqueueOptions {
                queue: "gbat".into(),
                ..Default::default()
            },
        )
        .await;
    }
    let claimed = grpc_fetch(
        &mut grpc,
        pb::FetchRequest {
            queues: vec!["gbat".into()],
            count: 2,
            ..Default::default()
        },
    )
    .await;
    assert_eq!(claimed.len(), 2);
    let ack = |job: &pb::Job, token: &str| pb::AckRequest {
        job_id: job.id.clone(),
        lease_token: token.to_string(),
        ..Default::default()
    };
    let answer = workers
        .ack_batch(ext::AckBatchRequest {
            acks: vec![
                ack(&claimed[0], &claimed[0].lease_token),
                ack(&claimed[1], "019a0000-0000-7000-8000-0000000000ff"),
            ],
        })
        .await
        .expect("ack batch")
        .into_inner();
    assert_eq!(answer.acknowledged, 1);
    assert!(answer.results[0].acknowledged);
    assert_eq!(answer.results[0].state, "completed");
    assert_eq!(
        answer.results[1].error.as_ref().map(|e| e.code.as_str()),
        Some("stale_lease")
    );
    assert_eq!(
        grpc_state(
            grpc_get(&mut grpc, &claimed[1].id)
                .await
                .expect("job")
                .state
        ),
        "active"
    );
    let refused = workers
        .ack_batch(ext::AckBatchRequest { acks: vec![] })
        .await
        .expect_err("an empty batch is refused");
    assert_eq!(refused.code(), tonic::Code::InvalidArgument);
    app.stop().await;
}

/// A batch spanning queues is stored queue by queue but answered in the order it was sent.
#[tokio::test]
async fn batch_enqueue_across_queues_answers_in_request_order() {
    let app = common::spawn_app().await;
    let http = Http::new(&app);
    let queues = ["qa", "qb", "qa", "qc", "qb", "qa"];
    let jobs: Vec<Value> = queues
        .iter()
        .enumerate()
        .map(|(i, q)| json!({"type": "mixed.batch", "args": [i], "options": {"queue": q}}))
        .collect();
    let (status, answer) = http.post("/ojs/v1/jobs/batch", json!({"jobs": jobs})).await;
    assert_eq!(status, StatusCode::CREATED, "batch: {answer}");
    let stored: Vec<(Value, Value)> = answer["jobs"]
        .as_array()
        .expect("jobs")
        .iter()
        .map(|j| (j["args"][0].clone(), j["queue"].clone()))
        .collect();
    let sent: Vec<(Value, Value)> = queues
        .iter()
        .enumerate()
        .map(|(i, q)| (json!(i), json!(q)))
        .collect();
    assert_eq!(stored, sent);
    // Each queue got its own jobs, in the order sent.
    let claimed = http.fetch(json!({"queues": ["qa"], "count": 10})).await;
    let args: Vec<Value> = claimed.iter().map(|j| j["args"][0].clone()).collect();
    assert_eq!(args, vec![json!(0), json!(2), json!(5)]);
    app.stop().await;
}

/// Queue listings count what a fetch could claim, and queue statistics measure the last hour's
/// run time, wait and throughput (over gRPC and in the HTTP stats object).
#[tokio::test]
async fn queue_statistics_measure_the_last_hour() {
    let app = common::spawn_app().await;
    let http = Http::new(&app);
    let mut grpc = app.grpc().await;
    for n in 0..3 {
        http.enqueue(json!({"type": "stats.job", "args": [n], "options": {"queue": "stq"}}))
            .await;
    }
    let claimed = http.fetch(json!({"queues": ["stq"]})).await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    http.ack(&claimed[0]).await;

    let listed = grpc
        .list_queues(pb::ListQueuesRequest::default())
        .await
        .expect("list queues")
        .into_inner();
    let stq = listed
        .queues
        .iter()
        .find(|q| q.name == "stq")
        .expect("stq listed");
    assert_eq!(stq.available_count, 2);

    let stats = grpc
        .queue_stats(pb::QueueStatsRequest {
            queue: "stq".into(),
        })
        .await
        .expect("queue stats")
        .into_inner()
        .stats
        .expect("stats");
    assert!(stats.avg_duration_ms >= 50.0, "{stats:?}");
    assert!(stats.avg_wait_ms >= 0.0, "{stats:?}");
    assert!(
        (stats.throughput_per_second - 1.0 / 3600.0).abs() < 1e-6,
        "{stats:?}"
    );

    let (status, answer) = http.get("/ojs/v1/queues/stq/stats").await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    let q = &answer["queue"];
    assert_eq!(
        q["avg_duration_ms"].as_f64(),
        Some(stats.avg_duration_ms),
        "{answer}"
    );
    assert_eq!(
        q["throughput_per_second"].as_f64(),
        Some(stats.throughput_per_second)
    );
    app.stop().await;
}

/// The grouped-operation counters of /metrics: (requests, statements) of `op`.
async fn grouped_counts(http: &Http, op: &str) -> (u64, u64) {
    let text = http
        .client
        .get(format!("{}/metrics", http.base))
        .send()
        .await
        .expect("scrape")
        .text()
        .await
        .expect("metrics text");
    let read = |name: &str| {
        let prefix = format!("{name}{{op=\"{op}\"}} ");
        text.lines()
            .find_map(|l| l.strip_prefix(prefix.as_str()))
            .and_then(|v| v.trim().parse::<u64>().ok())
            .unwrap_or_else(|| panic!("{name} for {op} in /metrics"))
    };
    (
        read("pgvs3_grouped_requests_total"),
        read("pgvs3_grouped_statements_total"),
    )
}

/// Acks that arrive together, over both protocols, are committed by fewer statements (each its
/// own transaction) than there are requests, and each still gets exactly its own outcome: good
/// acks complete, a stale lease, an unknown job and the second ack of one job fail alone.
#[tokio::test]
async fn concurrent_acks_share_transactions_and_keep_their_outcomes() {
    let app = common::spawn_app().await;
    let http = Http::new(&app);
    for i in 0..48 {
        http.enqueue(json!({"type": "group.ack", "args": [i], "options": {"queue": "grouped"}}))
            .await;
    }
    let claimed = http
        .fetch(json!({"queues": ["grouped"], "count": 48, "worker_id": "w"}))
        .await;
    assert_eq!(claimed.len(), 48);
    let token = |j: &Value| j["lease_token"].as_str().expect("lease token").to_string();
    let id = |j: &Value| id_of(j);

    // 40 good acks (half HTTP, half gRPC), 4 with a stale lease token, 2 of unknown jobs, and
    // the last two jobs each acked twice at once.
    #[derive(Debug, PartialEq)]
    enum Want {
        Done,
        Stale,
        Unknown,
        Twice,
    }
    let mut acks: Vec<(String, String, Want)> = Vec::new();
    for job in &claimed[..40] {
        acks.push((id(job), token(job), Want::Done));
    }
    for job in &claimed[40..44] {
        acks.push((id(job), uuid::Uuid::new_v4().to_string(), Want::Stale));
    }
    for _ in 0..2 {
        let token = uuid::Uuid::new_v4().to_string();
        acks.push((uuid::Uuid::now_v7().to_string(), token, Want::Unknown));
    }
    for job in &claimed[44..46] {
        acks.push((id(job), token(job), Want::Twice));
        acks.push((id(job), token(job), Want::Twice));
    }

    let (requests_before, statements_before) = grouped_counts(&http, "ack").await;
    let grpc = app.grpc().await;
    let answers =
        futures_util::future::join_all(acks.iter().enumerate().map(|(i, (job, tok, _))| {
            let (http, mut grpc) = (&http, grpc.clone());
            async move {
                if i % 2 == 0 {
                    let (status, body) = http
                        .post(
                            "/ojs/v1/workers/ack",
                            json!({"job_id": job, "lease_token": tok}),
                        )
                        .await;
                    if status == StatusCode::OK {
                        assert_eq!(body["state"], "completed", "{body}");
                        Ok(())
                    } else {
                        Err((status.as_u16(), error_code(&body).to_string()))
                    }
                } else {
                    match grpc
                        .ack(pb::AckRequest {
                            job_id: job.clone(),
                            lease_token: tok.clone(),
                            ..Default::default()
                        })
                        .await
                    {
                        Ok(_) => Ok(()),
                        Err(status) => Err((0, grpc_code(&status))),
                    }
                }
            }
        }))
        .await;
    let (requests_after, statements_after) = grouped_counts(&http, "ack").await;

    let mut twice_done = 0;
    let mut twice_refused = 0;
    for ((job, _, want), answer) in acks.iter().zip(&answers) {
        match want {
            Want::Done => assert_eq!(answer, &Ok(()), "ack of {job}"),
            Want::Stale => assert!(
                matches!(answer, Err((409 | 0, code)) if code == "stale_lease"),
                "stale ack of {job}: {answer:?}"
            ),
            Want::Unknown => assert!(
                matches!(answer, Err((404 | 0, code)) if code == "not_found"),
                "ack of unknown {job}: {answer:?}"
            ),
            Want::Twice => match answer {
                Ok(()) => twice_done += 1,
                // As a second ack after the first: the lease ended with the completion.
                Err((409 | 0, code)) if code == "stale_lease" => twice_refused += 1,
                other => panic!("second ack of {job}: {other:?}"),
            },
        }
    }
    assert_eq!(
        (twice_done, twice_refused),
        (2, 2),
        "each doubled job completes once"
    );

    // Stored states agree: completed, or still active under the lease the stale acks missed.
    for (job, _, want) in &acks {
        let expected = match want {
            Want::Done | Want::Twice => "completed",
            Want::Stale => "active",
            Want::Unknown => continue,
        };
        assert_eq!(http.job(job).await["state"], expected, "state of {job}");
    }

    let requests = requests_after - requests_before;
    let statements = statements_after - statements_before;
    assert_eq!(requests, acks.len() as u64, "every ack counted once");
    // Each failed ack costs a statement of its own (it names the reason); the 42 that complete
    // share far fewer.
    assert!(
        statements < requests,
        "{requests} concurrent acks took {statements} statements"
    );
    app.stop().await;
}

/// A dead-letter page far past the end is empty over both protocols: an offset (or cursor) beyond
/// 32 bits reaches SQL whole instead of wrapping around (2^32 once read as page 0) or failing.
#[tokio::test]
async fn dead_letter_pages_far_past_the_end_are_empty() {
    let app = common::spawn_app().await;
    let http = Http::new(&app);
    let id = http.make_dead_letter("far").await;
    assert_eq!(page_ids(&http.dead_letters("?queue=far").await), vec![id]);
    for offset in ["2147483648", "4294967296", "9223372036854775807"] {
        let page = http
            .dead_letters(&format!("?queue=far&offset={offset}"))
            .await;
        assert!(page_ids(&page).is_empty(), "offset {offset}: {page}");
        assert_eq!(page["pagination"]["total"], 1, "offset {offset}: {page}");
    }
    let mut grpc = app.grpc().await;
    for cursor in ["2147483648", "4294967296"] {
        let page = grpc_dead_letters(&mut grpc, "far", 10, cursor).await;
        assert!(page.jobs.is_empty(), "cursor {cursor}: {page:?}");
        assert_eq!(page.total_count, 1);
    }
    app.stop().await;
}

/// Single enqueues and fetches that arrive together, over both protocols, are grouped too and
/// each still gets exactly its own answer: a group holding a duplicate id refuses only that
/// enqueue, and jobs claimed by one grouped claim are split between the fetches, each job leased
/// to the worker that fetched it.
#[tokio::test]
async fn concurrent_enqueues_and_fetches_are_grouped_with_exact_outcomes() {
    let app = common::spawn_app().await;
    let http = Http::new(&app);
    let taken = id_of(
        &http
            .enqueue(json!({"type": "group.job", "args": [0], "options": {"queue": "grouped"}}))
            .await,
    );
    // 30 new jobs (caller ids, half over gRPC) and 2 that reuse a stored id.
    let mut ids: Vec<String> = (0..30).map(|_| uuid::Uuid::now_v7().to_string()).collect();
    ids.push(taken.clone());
    ids.push(taken.clone());
    let (requests_before, statements_before) = grouped_counts(&http, "enqueue").await;
    let grpc = app.grpc().await;
    let answers = futures_util::future::join_all(ids.iter().enumerate().map(|(i, id)| {
        let (http, mut grpc) = (&http, grpc.clone());
        async move {
            if i % 2 == 0 {
                let (status, body) = http
                    .post(
                        "/ojs/v1/jobs",
                        json!({"id": id, "type": "group.job", "args": [i],
                               "options": {"queue": "grouped"}}),
                    )
                    .await;
                match status {
                    StatusCode::CREATED => Ok(id_of(&body["job"])),
                    _ => Err(error_code(&body).to_string()),
                }
            } else {
                grpc.enqueue(pb::EnqueueRequest {
                    id: id.clone(),
                    r#type: "group.job".into(),
                    options: Some(pb::EnqueueOptions {
                        queue: "grouped".into(),
                        ..Default::default()
                    }),
                    ..Default::default()
                })
                .await
                .map(|r| r.into_inner().job.expect("job").id)
                .map_err(|status| grpc_code(&status))
            }
        }
    }))
    .await;
    let (requests_after, statements_after) = grouped_counts(&http, "enqueue").await;
    for (id, answer) in ids.iter().zip(&answers) {
        if *id == taken {
            assert_eq!(answer, &Err("duplicate".to_string()), "reused id {id}");
        } else {
            assert_eq!(answer, &Ok(id.clone()), "new job {id}");
        }
    }
    // A refused group is stored again job by job, so the count of statements may reach the
    // requests; never more than one group statement per request plus one per job.
    assert_eq!(requests_after - requests_before, ids.len() as u64);
    assert!(statements_after - statements_before <= 2 * ids.len() as u64);

    // 8 fetches of 4 at once for 31 jobs: all distinct, all claimed, each for its fetcher.
    let (requests_before, statements_before) = grouped_counts(&http, "fetch").await;
    let fetched = futures_util::future::join_all((0..8).map(|w| {
        let (http, mut grpc) = (&http, grpc.clone());
        let worker = format!("w{w}");
        async move {
            let ids: Vec<String> = if w % 2 == 0 {
                http.fetch(json!({"queues": ["grouped"], "count": 4, "worker_id": worker}))
                    .await
                    .iter()
                    .map(id_of)
                    .collect()
            } else {
                grpc_fetch(
                    &mut grpc,
                    pb::FetchRequest {
                        queues: vec!["grouped".into()],
                        count: 4,
                        worker_id: worker.clone(),
                        ..Default::default()
                    },
                )
                .await
                .into_iter()
                .map(|j| j.id)
                .collect()
            };
            (worker, ids)
        }
    }))
    .await;
    let (requests_after, statements_after) = grouped_counts(&http, "fetch").await;
    let mut all = std::collections::HashSet::new();
    for (worker, ids) in &fetched {
        assert!(ids.len() <= 4, "{worker} got {ids:?}");
        for id in ids {
            assert!(all.insert(id.clone()), "{id} claimed twice");
            let job = http.job(id).await;
            assert_eq!(job["state"], "active");
            assert_eq!(job["worker_id"], worker.as_str(), "lease of {id}");
        }
    }
    assert_eq!(all.len(), 31, "every job claimed once");
    assert_eq!(requests_after - requests_before, 8);
    assert!(statements_after - statements_before <= 8);
    app.stop().await;
}
