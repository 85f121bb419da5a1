//! The job lifecycle over both protocols: each scenario runs through HTTP and through gRPC on a
//! real server and database, and the observable results must be the same.

use crate::common;

use common::codes::grpc_code;
use std::time::Duration;

use pgvs3::grpc::proto::ojs::v1 as pb;
use serde_json::{Value, json};

/// What a scenario sees of a job.
#[derive(Debug, Clone, PartialEq)]
struct Seen {
    state: String,
    attempt: i64,
}

/// A fetched job.
#[derive(Debug, Clone)]
struct Claim {
    id: String,
    token: String,
    attempt: i64,
}

/// One protocol's view of the worker protocol; errors are the OJS code.
enum Client {
    Http(reqwest::Client, String),
    Grpc(pb::ojs_service_client::OjsServiceClient<tonic::transport::Channel>),
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

impl Client {
    async fn post(&self, path: &str, body: Value) -> Result<Value, String> {
        let Client::Http(http, base) = self else {
            unreachable!()
        };
        let response = http
            .post(format!("{base}{path}"))
            .header("content-type", "application/openjobspec+json")
            .body(body.to_string())
            .send()
            .await
            .map_err(|e| e.to_string())?;
        let status = response.status();
        let body: Value = response.json().await.map_err(|e| e.to_string())?;
        if status.is_success() {
            Ok(body)
        } else {
            Err(body["error"]["code"].as_str().unwrap_or("?").to_string())
        }
    }

    async fn enqueue(&mut self, queue: &str, max_attempts: i64) -> String {
        match self {
            Client::Http(..) => {
                let body = json!({"type": "test.job", "args": [1, "two"],
                    "options": {"queue": queue, "retry": {"max_attempts": max_attempts, "initial_interval": "PT0.1S", "jitter": false}}});
                self.post("/ojs/v1/jobs", body).await.expect("enqueue")["job"]["id"]
                    .as_str()
                    .expect("id")
                    .to_string()
            }
            Client::Grpc(grpc) => {
                let request = pb::EnqueueRequest {
                    r#type: "test.job".into(),
                    args: vec![
                        prost_types::Value {
                            kind: Some(prost_types::value::Kind::NumberValue(1.0)),
                        },
                        prost_types::Value {
                            kind: Some(prost_types::value::Kind::StringValue("two".into())),
                        },
                    ],
                    options: Some(pb::EnqueueOptions {
                        queue: queue.into(),
                        retry: Some(pb::RetryPolicy {
                            max_attempts: max_attempts as i32,
                            initial_interval: Some(prost_types::Duration {
                                seconds: 0,
                                nanos: 100_000_000,
                            }),
                            jitter: false,
                            ..Default::default()
                        }),
                        ..Default::default()
                    }),
                    ..Default::default()
                };
                grpc.enqueue(request)
                    .await
                    .expect("enqueue")
                    .into_inner()
                    .job
                    .expect("job")
                    .id
            }
        }
    }

    async fn fetch(&mut self, queue: &str, visibility_ms: i64) -> Vec<Claim> {
        match self {
            Client::Http(..) => {
                let body =
                    json!({"queues": [queue], "count": 10, "visibility_timeout_ms": visibility_ms});
                let answer = self
                    .post("/ojs/v1/workers/fetch", body)
                    .await
                    .expect("fetch");
                answer["jobs"]
                    .as_array()
                    .expect("jobs")
                    .iter()
                    .map(|j| Claim {
                        id: j["id"].as_str().unwrap_or_default().into(),
                        token: j["lease_token"].as_str().unwrap_or_default().into(),
                        attempt: j["attempt"].as_i64().unwrap_or(-1),
                    })
                    .collect()
            }
            Client::Grpc(grpc) => grpc
                .fetch(pb::FetchRequest {
                    queues: vec![queue.into()],
                    count: 10,
                    visibility_timeout_ms: visibility_ms,
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
                    attempt: i64::from(j.attempt),
                })
                .collect(),
        }
    }

    async fn ack(&mut self, claim: &Claim) -> Result<String, String> {
        match self {
            Client::Http(..) => {
                let body = json!({"job_id": claim.id, "lease_token": claim.token, "result": {"done": true}});
                self.post("/ojs/v1/workers/ack", body)
                    .await
                    .map(|a| a["state"].as_str().unwrap_or_default().to_string())
            }
            Client::Grpc(grpc) => grpc
                .ack(pb::AckRequest {
                    job_id: claim.id.clone(),
                    lease_token: claim.token.clone(),
                    result: Some(prost_types::Struct {
                        fields: [(
                            "done".to_string(),
                            prost_types::Value {
                                kind: Some(prost_types::value::Kind::BoolValue(true)),
                            },
                        )]
                        .into_iter()
                        .collect(),
                    }),
                    ..Default::default()
                })
                .await
                .map(|a| grpc_state(a.into_inner().job.map_or(0, |j| j.state)))
                .map_err(|s| grpc_code(&s)),
        }
    }

    async fn nack(&mut self, claim: &Claim) -> Result<String, String> {
        match self {
            Client::Http(..) => {
                let body = json!({"job_id": claim.id, "lease_token": claim.token,
                    "error": {"code": "handler_error", "message": "boom"}});
                self.post("/ojs/v1/workers/nack", body)
                    .await
                    .map(|a| a["state"].as_str().unwrap_or_default().to_string())
            }
            Client::Grpc(grpc) => grpc
                .nack(pb::NackRequest {
                    job_id: claim.id.clone(),
                    lease_token: claim.token.clone(),
                    error: Some(pb::JobError {
                        code: "handler_error".into(),
                        message: "boom".into(),
                        ..Default::default()
                    }),
                    ..Default::default()
                })
                .await
                .map(|a| grpc_state(a.into_inner().state))
                .map_err(|s| grpc_code(&s)),
        }
    }

    async fn cancel(&mut self, id: &str) -> Result<String, String> {
        match self {
            Client::Http(http, base) => {
                let response = http
                    .delete(format!("{base}/ojs/v1/jobs/{id}"))
                    .send()
                    .await
                    .map_err(|e| e.to_string())?;
                let ok = response.status().is_success();
                let body: Value = response.json().await.map_err(|e| e.to_string())?;
                if ok {
                    Ok(body["job"]["state"]
                        .as_str()
                        .unwrap_or_default()
                        .to_string())
                } else {
                    Err(body["error"]["code"].as_str().unwrap_or("?").to_string())
                }
            }
            Client::Grpc(grpc) => grpc
                .cancel_job(pb::CancelJobRequest {
                    job_id: id.into(),
                    reason: String::new(),
                })
                .await
                .map(|r| grpc_state(r.into_inner().job.map_or(0, |j| j.state)))
                .map_err(|s| grpc_code(&s)),
        }
    }

    async fn get(&mut self, id: &str) -> Seen {
        match self {
            Client::Http(http, base) => {
                let body: Value = http
                    .get(format!("{base}/ojs/v1/jobs/{id}"))
                    .send()
                    .await
                    .expect("get")
                    .json()
                    .await
                    .expect("json");
                Seen {
                    state: body["job"]["state"]
                        .as_str()
                        .unwrap_or_default()
                        .to_string(),
                    attempt: body["job"]["attempt"].as_i64().unwrap_or(-1),
                }
            }
            Client::Grpc(grpc) => {
                let job = grpc
                    .get_job(pb::GetJobRequest { job_id: id.into() })
                    .await
                    .expect("get")
                    .into_inner()
                    .job
                    .expect("job");
                Seen {
                    state: grpc_state(job.state),
                    attempt: i64::from(job.attempt),
                }
            }
        }
    }
}

/// The lifecycle scenarios; each returns the trace of what it observed.
async fn run_scenarios(client: &mut Client) -> Vec<(String, Vec<String>)> {
    let mut traces = Vec::new();

    // Success: enqueue → fetch → ack → completed.
    let id = client.enqueue("life-ok", 3).await;
    let mut trace = vec![format!("{:?}", client.get(&id).await)];
    let claims = client.fetch("life-ok", 30_000).await;
    assert_eq!(claims.len(), 1);
    assert_eq!(claims[0].id, id);
    assert!(!claims[0].token.is_empty(), "a claim carries a lease token");
    trace.push(format!("claimed attempt {}", claims[0].attempt));
    trace.push(format!("{:?}", client.get(&id).await));
    trace.push(format!("ack {:?}", client.ack(&claims[0]).await));
    trace.push(format!("{:?}", client.get(&id).await));
    trace.push(format!("ack again {:?}", client.ack(&claims[0]).await));
    traces.push(("success".to_string(), trace));

    // Retry then success: nack → retryable → due after the backoff → fetched again → ack.
    let id = client.enqueue("life-retry", 3).await;
    let claim = client.fetch("life-retry", 30_000).await.remove(0);
    let mut trace = vec![format!("nack {:?}", client.nack(&claim).await)];
    trace.push(format!(
        "immediately refetched {}",
        client.fetch("life-retry", 30_000).await.len()
    ));
    tokio::time::sleep(Duration::from_millis(250)).await;
    let again = client.fetch("life-retry", 30_000).await;
    trace.push(format!(
        "refetched {} attempt {}",
        again.len(),
        again[0].attempt
    ));
    trace.push(format!("ack {:?}", client.ack(&again[0]).await));
    trace.push(format!("{:?}", client.get(&id).await));
    traces.push(("retry then success".to_string(), trace));

    // Exhaustion: max_attempts 1 → nack → discarded, terminal.
    let id = client.enqueue("life-exhaust", 1).await;
    let claim = client.fetch("life-exhaust", 30_000).await.remove(0);
    let mut trace = vec![format!("nack {:?}", client.nack(&claim).await)];
    trace.push(format!("{:?}", client.get(&id).await));
    trace.push(format!("cancel {:?}", client.cancel(&id).await));
    traces.push(("exhaustion".to_string(), trace));

    // Cancel: available → cancelled, never delivered.
    let id = client.enqueue("life-cancel", 3).await;
    let mut trace = vec![format!("cancel {:?}", client.cancel(&id).await)];
    trace.push(format!(
        "fetched {}",
        client.fetch("life-cancel", 30_000).await.len()
    ));
    trace.push(format!("{:?}", client.get(&id).await));
    traces.push(("cancel".to_string(), trace));

    // Lease expiry and reclaim; the old token is stale afterwards.
    let id = client.enqueue("life-lease", 3).await;
    let first = client.fetch("life-lease", 200).await.remove(0);
    tokio::time::sleep(Duration::from_millis(400)).await;
    let mut trace = vec![format!("{:?}", client.get(&id).await)];
    // A maintenance pass may hold the released row for a moment (fetches skip locked rows).
    let mut second = None;
    for _ in 0..20 {
        if let Some(claim) = client.fetch("life-lease", 30_000).await.into_iter().next() {
            second = Some(claim);
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let second = second.expect("the expired lease is reclaimed");
    assert_ne!(first.token, second.token, "a reclaim mints a new token");
    trace.push(format!("reclaimed attempt {}", second.attempt));
    trace.push(format!("old token ack {:?}", client.ack(&first).await));
    trace.push(format!("old token nack {:?}", client.nack(&first).await));
    trace.push(format!("new token ack {:?}", client.ack(&second).await));
    trace.push(format!("{:?}", client.get(&id).await));
    traces.push(("lease expiry".to_string(), trace));

    traces
}

#[tokio::test]
async fn lifecycle_is_the_same_over_http_and_grpc() {
    let app = common::spawn_app().await;
    let mut http = Client::Http(reqwest::Client::new(), app.http_url.clone());
    let over_http = run_scenarios(&mut http).await;

    let app2 = common::spawn_app().await;
    let mut grpc = Client::Grpc(app2.grpc().await);
    let over_grpc = run_scenarios(&mut grpc).await;

    let expected: Vec<(&str, Vec<&str>)> = vec![
        (
            "success",
            vec![
                r#"Seen { state: "available", attempt: 0 }"#,
                "claimed attempt 1",
                r#"Seen { state: "active", attempt: 1 }"#,
                r#"ack Ok("completed")"#,
                r#"Seen { state: "completed", attempt: 1 }"#,
                r#"ack again Err("stale_lease")"#,
            ],
        ),
        (
            "retry then success",
            vec![
                r#"nack Ok("retryable")"#,
                "immediately refetched 0",
                "refetched 1 attempt 2",
                r#"ack Ok("completed")"#,
                r#"Seen { state: "completed", attempt: 2 }"#,
            ],
        ),
        (
            "exhaustion",
            vec![
                r#"nack Ok("discarded")"#,
                r#"Seen { state: "discarded", attempt: 1 }"#,
                r#"cancel Err("conflict")"#,
            ],
        ),
        (
            "cancel",
            vec![
                r#"cancel Ok("cancelled")"#,
                "fetched 0",
                r#"Seen { state: "cancelled", attempt: 0 }"#,
            ],
        ),
        (
            "lease expiry",
            vec![
                r#"Seen { state: "available", attempt: 1 }"#,
                "reclaimed attempt 2",
                r#"old token ack Err("stale_lease")"#,
                r#"old token nack Err("stale_lease")"#,
                r#"new token ack Ok("completed")"#,
                r#"Seen { state: "completed", attempt: 2 }"#,
            ],
        ),
    ];
    let expected: Vec<(String, Vec<String>)> = expected
        .into_iter()
        .map(|(n, t)| (n.to_string(), t.into_iter().map(str::to_string).collect()))
        .collect();
    assert_eq!(over_http, expected, "HTTP lifecycle");
    assert_eq!(over_grpc, over_http, "gRPC must match HTTP");
}

#[tokio::test]
async fn concurrent_fetches_claim_each_job_once() {
    let app = common::spawn_app().await;
    let http = reqwest::Client::new();
    for _ in 0..20 {
        let response = http
            .post(format!("{}/ojs/v1/jobs", app.http_url))
            .header("content-type", "application/json")
            .body(json!({"type": "race.job", "args": [], "options": {"queue": "race"}}).to_string())
            .send()
            .await
            .expect("enqueue");
        assert_eq!(response.status(), 201);
    }
    let mut fetches = Vec::new();
    for _ in 0..8 {
        let http = http.clone();
        let url = format!("{}/ojs/v1/workers/fetch", app.http_url);
        fetches.push(tokio::spawn(async move {
            let body: Value = http
                .post(url)
                .header("content-type", "application/json")
                .body(json!({"queues": ["race"], "count": 5}).to_string())
                .send()
                .await
                .expect("fetch")
                .json()
                .await
                .expect("json");
            body["jobs"]
                .as_array()
                .map(|jobs| {
                    jobs.iter()
                        .filter_map(|j| j["id"].as_str().map(str::to_string))
                        .collect::<Vec<_>>()
                })
                .unwrap_or_default()
        }));
    }
    let mut seen = Vec::new();
    for f in fetches {
        seen.extend(f.await.expect("join"));
    }
    let total = seen.len();
    seen.sort();
    seen.dedup();
    assert_eq!(total, 20, "all 20 jobs claimed");
    assert_eq!(seen.len(), 20, "no job claimed twice");
}

#[tokio::test]
async fn long_poll_fetch_wakes_on_enqueue() {
    let app = common::spawn_app().await;
    let http = reqwest::Client::new();
    let enqueue = |queue: &'static str| {
        let http = http.clone();
        let url = format!("{}/ojs/v1/jobs", app.http_url);
        async move {
            http.post(url)
                .header("content-type", "application/json")
                .body(
                    json!({"type": "poll.job", "args": [], "options": {"queue": queue}})
                        .to_string(),
                )
                .send()
                .await
                .expect("enqueue")
        }
    };
    // The queue must exist for a long poll to wait.
    enqueue("poll").await;
    let fetch = |wait_ms: i64| {
        let http = http.clone();
        let url = format!("{}/ojs/v1/workers/fetch", app.http_url);
        async move {
            let started = std::time::Instant::now();
            let body: Value = http
                .post(url)
                .header("content-type", "application/json")
                .body(json!({"queues": ["poll"], "wait_ms": wait_ms}).to_string())
                .send()
                .await
                .expect("fetch")
                .json()
                .await
                .expect("json");
            (
                body["jobs"].as_array().map_or(0, Vec::len),
                started.elapsed(),
            )
        }
    };
    assert_eq!(fetch(0).await.0, 1, "the first job is there at once");
    let waiting = tokio::spawn(fetch(2000));
    tokio::time::sleep(Duration::from_millis(300)).await;
    enqueue("poll").await;
    let (got, waited) = waiting.await.expect("join");
    assert_eq!(got, 1, "the waiting fetch received the new job");
    assert!(
        waited < Duration::from_millis(1900),
        "woken by the enqueue, not by the timeout: {waited:?}"
    );
    let (none, waited) = fetch(300).await;
    assert_eq!(none, 0);
    assert!(
        waited >= Duration::from_millis(290),
        "an idle long poll waits its wait_ms: {waited:?}"
    );
}

/// The maintenance pass vacuums a jobs table once dead row versions pile up (here two updates of
/// 6,000 jobs), instead of leaving claims to walk past them until autovacuum comes; a queue whose
/// autovacuum is turned off is left alone.
#[tokio::test]
async fn maintenance_vacuums_jobs_tables_full_of_dead_rows() {
    use sqlx::Connection;
    let app =
        common::spawn_app_with(|s| s.maintenance_interval = Some(Duration::from_millis(100))).await;
    let http = reqwest::Client::new();
    let post = |path: &str, body: Value| post_json(&http, &app.http_url, path, body);
    for queue in ["busy", "manual"] {
        for _ in 0..6 {
            let jobs: Vec<Value> = (0..1000)
                .map(|i| json!({"type": "t.v", "args": [i], "options": {"queue": queue}}))
                .collect();
            post("/ojs/v1/jobs/batch", json!({ "jobs": jobs })).await;
        }
    }
    post(
        "/ojs/v1/queues/manual/config",
        json!({"autovacuum": {"autovacuum_enabled": false}}),
    )
    .await;
    let mut db = sqlx::PgConnection::connect(&app.database_url)
        .await
        .expect("connect");
    // Autovacuum must not clear the busy table's dead rows first: with one database per test,
    // its launcher visits this one every few hundred milliseconds during a full run. A threshold
    // (unlike `autovacuum_enabled = false`) leaves the table wanted by the maintenance rule.
    sqlx::raw_sql(
        "ALTER TABLE s3q_busy.jobs SET (autovacuum_vacuum_threshold = 2000000000,
                                        autovacuum_vacuum_insert_threshold = -1)",
    )
    .execute(&mut db)
    .await
    .expect("keep autovacuum away");
    // Each update changes an indexed column, so it is not HOT: a HOT version (possible now that
    // jobs tables keep free space on their pages) is pruned on the page and never needs a vacuum.
    for queue in ["busy", "manual"] {
        for _ in 0..2 {
            sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
                "UPDATE s3q_{queue}.jobs SET priority = priority + 1"
            )))
            .execute(&mut db)
            .await
            .expect("update");
        }
    }
    sqlx::query("SELECT pg_stat_force_next_flush()")
        .execute(&mut db)
        .await
        .expect("flush stats");
    let vacuums = |queue: &'static str| {
        sqlx::query_scalar::<_, i64>(sqlx::AssertSqlSafe(format!(
            "SELECT pg_stat_get_vacuum_count('s3q_{queue}.jobs'::regclass)"
        )))
    };
    let mut busy = 0;
    for _ in 0..100 {
        busy = vacuums("busy").fetch_one(&mut db).await.expect("count");
        if busy > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(busy, 1, "the busy queue's jobs table was vacuumed once");
    // A few more passes: the vacuumed table is not due again, the other never is.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(vacuums("busy").fetch_one(&mut db).await.expect("count"), 1);
    assert_eq!(
        vacuums("manual").fetch_one(&mut db).await.expect("count"),
        0
    );
    let metrics = http
        .get(format!("{}/metrics", app.http_url))
        .send()
        .await
        .expect("metrics")
        .text()
        .await
        .expect("metrics text");
    assert!(
        metrics.contains("pgvs3_jobs_vacuums_total 1"),
        "metrics: {}",
        metrics
            .lines()
            .filter(|l| l.contains("vacuum"))
            .collect::<Vec<_>>()
            .join("\n")
    );
}

/// One queue whose maintenance step fails (here its maintain function is gone) is logged and
/// counted in /metrics, and the pass goes on: a queue after it still has its expired lease
/// released, and the shared step still runs (an orphaned unique key is removed).
#[tokio::test]
async fn a_queue_whose_maintenance_fails_does_not_stop_the_others() {
    use sqlx::Connection;
    let app =
        common::spawn_app_with(|s| s.maintenance_interval = Some(Duration::from_millis(100))).await;
    let http = reqwest::Client::new();
    let post = |path: &str, body: Value| post_json(&http, &app.http_url, path, body);
    for queue in ["broken", "healthy"] {
        post(
            "/ojs/v1/jobs",
            json!({"type": "t.m", "args": [], "options": {"queue": queue}}),
        )
        .await;
    }
    let mut db = sqlx::PgConnection::connect(&app.database_url)
        .await
        .expect("connect");
    sqlx::raw_sql(
        "DROP FUNCTION s3q_broken.maintain(bigint, int);
         INSERT INTO s3p.unique_keys (key, job_id, queue) VALUES ('orphan', gen_random_uuid(), 'healthy');
         -- Both queues due now (passes step only through due queues).
         UPDATE s3p.queues SET maintain_after = NULL",
    )
    .execute(&mut db)
    .await
    .expect("break one queue");
    // "healthy" sorts after "broken": a pass that stopped at the failure would never reach it.
    let fetched = post(
        "/ojs/v1/workers/fetch",
        json!({"queues": ["healthy"], "count": 1, "visibility_timeout_ms": 1}),
    )
    .await;
    let id = fetched["jobs"][0]["id"]
        .as_str()
        .expect("a job was fetched")
        .to_string();
    let (mut state, mut orphans) = (String::new(), 1);
    for _ in 0..100 {
        // The stored row, not the answer of GET (which shows an expired lease as available).
        state = sqlx::query_scalar("SELECT state FROM s3q_healthy.jobs WHERE id = $1::uuid")
            .bind(&id)
            .fetch_one(&mut db)
            .await
            .expect("state");
        orphans = sqlx::query_scalar("SELECT count(*) FROM s3p.unique_keys WHERE key = 'orphan'")
            .fetch_one(&mut db)
            .await
            .expect("count");
        if state != "active" && orphans == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_ne!(
        state, "active",
        "the expired lease of the later queue was released"
    );
    assert_eq!(orphans, 0_i64, "the shared step ran");
    // A pass counts its failed steps when it ends, which may be after the later queue's release
    // is visible: scrape until the count shows (or give up after 10 s).
    let broken_line = "pgvs3_maintenance_failures_total{step=\"queue\",queue=\"broken\"}";
    let mut metrics = String::new();
    for _ in 0..100 {
        // A pass already running when the queues were made due may have stepped "broken" just
        // before its function was dropped and set its next due time after: due again, at once.
        sqlx::query("UPDATE s3p.queues SET maintain_after = NULL WHERE name = 'broken'")
            .execute(&mut db)
            .await
            .expect("due again");
        metrics = http
            .get(format!("{}/metrics", app.http_url))
            .send()
            .await
            .expect("metrics")
            .text()
            .await
            .expect("metrics text");
        if metrics.contains(broken_line) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        metrics.contains(broken_line),
        "{}",
        metrics
            .lines()
            .filter(|l| l.contains("maintenance"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    assert!(
        !metrics
            .lines()
            .any(|l| l.starts_with("pgvs3_maintenance_failures_total") && l.contains("healthy")),
        "only the broken queue failed"
    );
}

/// Workflow cancels racing workers that complete the same workflows' jobs (single and batch acks,
/// each job's transition then its workflow) take the rows in one order, jobs before workflows: no
/// answer is a server error, no statement needed a rerun for a deadlock, and every workflow ends
/// settled with none of its steps left enqueued.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workflow_cancel_and_acks_take_locks_in_one_order() {
    let app = common::spawn_app().await;
    let http = reqwest::Client::new();
    let base = app.http_url.clone();
    let call = {
        let (http, base) = (http.clone(), base.clone());
        move |method: reqwest::Method, path: String, body: Option<Value>| {
            let mut request = http.request(method, format!("{base}{path}"));
            if let Some(body) = body {
                request = request.json(&body);
            }
            async move {
                let response = request.send().await.expect("send");
                let status = response.status().as_u16();
                let answer: Value = response.json().await.unwrap_or(Value::Null);
                (status, answer)
            }
        }
    };
    let queue = "wf-locks";
    let mut workflows = Vec::new();
    for n in 0..60 {
        let steps: Vec<Value> = (0..5)
            .map(|i| json!({"type": "wf.step", "args": [n, i], "options": {"queue": queue}}))
            .collect();
        let (status, answer) = call(
            reqwest::Method::POST,
            "/ojs/v1/workflows".into(),
            Some(json!({"type": "group", "name": format!("g{n}"), "steps": steps})),
        )
        .await;
        assert_eq!(status, 201, "{answer}");
        workflows.push(answer["workflow"]["id"].as_str().expect("id").to_string());
    }
    let workflows = std::sync::Arc::new(workflows);

    // Each worker fetches, then acks its jobs while it cancels their workflows at the same time.
    let statuses = std::sync::Arc::new(std::sync::Mutex::new(Vec::<u16>::new()));
    let mut workers = Vec::new();
    for w in 0..4 {
        let (call, statuses, workflows) = (call.clone(), statuses.clone(), workflows.clone());
        workers.push(tokio::spawn(async move {
            loop {
                let (status, answer) = call(
                    reqwest::Method::POST,
                    "/ojs/v1/workers/fetch".into(),
                    Some(json!({"queues": [queue], "count": 10})),
                )
                .await;
                statuses.lock().expect("statuses").push(status);
                let jobs = answer["jobs"].as_array().cloned().unwrap_or_default();
                if jobs.is_empty() {
                    break;
                }
                let mut owners: Vec<usize> = jobs
                    .iter()
                    .filter_map(|j| j["args"][0].as_u64())
                    .map(|n| n as usize)
                    .collect();
                owners.dedup();
                let cancels = owners.iter().map(|n| {
                    call(
                        reqwest::Method::DELETE,
                        format!("/ojs/v1/workflows/{}", workflows[*n]),
                        None,
                    )
                });
                let acks: Vec<Value> = jobs
                    .iter()
                    .map(|j| json!({"job_id": j["id"], "lease_token": j["lease_token"]}))
                    .collect();
                let acked = async {
                    if w % 2 == 0 {
                        vec![
                            call(
                                reqwest::Method::POST,
                                "/ojs/v1/workers/ack/batch".into(),
                                Some(json!({ "acks": acks })),
                            )
                            .await,
                        ]
                    } else {
                        let singles = acks.into_iter().map(|ack| {
                            call(
                                reqwest::Method::POST,
                                "/ojs/v1/workers/ack".into(),
                                Some(ack),
                            )
                        });
                        futures_util::future::join_all(singles).await
                    }
                };
                let (acked, cancelled) =
                    tokio::join!(acked, futures_util::future::join_all(cancels));
                let mut statuses = statuses.lock().expect("statuses");
                statuses.extend(acked.iter().map(|(status, _)| *status));
                for (status, answer) in &cancelled {
                    assert!(
                        *status == 200 || *status == 409,
                        "cancel: {status} {answer}"
                    );
                }
                statuses.extend(cancelled.iter().map(|(status, _)| *status));
            }
        }));
    }
    for worker in workers {
        worker.await.expect("worker");
    }
    let all = statuses.lock().expect("statuses").clone();
    assert!(
        all.iter().all(|status| *status < 500),
        "server errors: {:?}",
        all.iter().filter(|s| **s >= 500).collect::<Vec<_>>()
    );
    for id in workflows.iter() {
        let (status, answer) = call(
            reqwest::Method::GET,
            format!("/ojs/v1/workflows/{id}"),
            None,
        )
        .await;
        assert_eq!(status, 200, "{answer}");
        let workflow = &answer["workflow"];
        assert_ne!(workflow["state"], "running", "{workflow}");
        let steps = workflow["steps"].as_array().expect("steps");
        assert!(
            steps
                .iter()
                .all(|s| s["state"] != "pending" && s["state"] != "waiting"),
            "{workflow}"
        );
    }
    let metrics = http
        .get(format!("{base}/metrics"))
        .send()
        .await
        .expect("metrics")
        .text()
        .await
        .expect("metrics text");
    assert!(
        metrics.contains("pgvs3_lock_conflict_retries_total 0"),
        "a statement hit a deadlock: {}",
        metrics
            .lines()
            .filter(|l| l.contains("conflict"))
            .collect::<Vec<_>>()
            .join("\n")
    );
}

/// Reads one unlabelled counter from /metrics.
async fn counter(http: &reqwest::Client, base: &str, name: &str) -> u64 {
    let text = http
        .get(format!("{base}/metrics"))
        .send()
        .await
        .expect("metrics")
        .text()
        .await
        .expect("metrics text");
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{name} ")))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {name} in /metrics"))
}

/// POSTs `body` to `path` at `base` and answers its JSON; a status other than 2xx fails the test.
fn post_json(
    http: &reqwest::Client,
    base: &str,
    path: &str,
    body: Value,
) -> impl std::future::Future<Output = Value> + use<> {
    let request = http.post(format!("{base}{path}")).json(&body);
    async move {
        let response = request.send().await.expect("send");
        let status = response.status();
        let text = response.text().await.expect("body");
        assert!(status.is_success(), "{status}: {text}");
        serde_json::from_str::<Value>(&text).expect("a JSON answer")
    }
}

/// Asserts that passes ran (at least `passes_at_least` in all) without a queue step since the
/// steps counter read `steps`.
async fn assert_passes_stepped_nothing(
    http: &reqwest::Client,
    base: &str,
    (passes_at_least, steps): (u64, u64),
    stepped: &str,
) {
    assert!(
        counter(http, base, "pgvs3_maintenance_passes_total").await >= passes_at_least,
        "passes kept running"
    );
    assert_eq!(
        counter(http, base, "pgvs3_maintenance_queue_steps_total").await,
        steps,
        "{stepped}"
    );
}

/// Waits until the maintenance pass stepped `new_queues` new queues (each is due once), then the
/// passes and queue steps counted so far.
async fn after_first_steps(http: &reqwest::Client, base: &str, new_queues: u64) -> (u64, u64) {
    counter_reaches(
        http,
        base,
        "pgvs3_maintenance_queue_steps_total",
        new_queues,
        "the new queues were never stepped",
    )
    .await;
    (
        counter(http, base, "pgvs3_maintenance_passes_total").await,
        counter(http, base, "pgvs3_maintenance_queue_steps_total").await,
    )
}

/// Waits (up to 20 s) until the counter `name` reaches `at_least`, else fails saying `never`.
async fn counter_reaches(
    http: &reqwest::Client,
    base: &str,
    name: &str,
    at_least: u64,
    never: &str,
) {
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while counter(http, base, name).await < at_least {
        assert!(std::time::Instant::now() < deadline, "{never}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A maintenance pass steps only through queues with due work: 40 queues holding a job each are
/// stepped through once, then passes go by without visiting them; a claim whose lease runs out
/// makes its queue due at the lease end, and the pass releases that lease (one queue stepped, not
/// forty).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn maintenance_steps_only_through_queues_with_due_work() {
    let app =
        common::spawn_app_with(|s| s.maintenance_interval = Some(Duration::from_millis(100))).await;
    let http = reqwest::Client::new();
    let base = app.http_url.clone();
    for n in 0..40 {
        let response = http
            .post(format!("{base}/ojs/v1/jobs"))
            .json(&json!({"type": "idle.job", "args": [n], "options": {"queue": format!("idle-{n:02}")}}))
            .send()
            .await
            .expect("enqueue");
        assert_eq!(response.status(), 201);
    }
    let (passes, steps) = after_first_steps(&http, &base, 40).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_passes_stepped_nothing(
        &http,
        &base,
        (passes + 5, steps),
        "idle queues are not stepped through",
    )
    .await;

    // A lease that runs out makes its queue due; the pass releases it.
    let fetched: Value = http
        .post(format!("{base}/ojs/v1/workers/fetch"))
        .json(&json!({"queues": ["idle-07"], "count": 1, "visibility_timeout_ms": 300}))
        .send()
        .await
        .expect("fetch")
        .json()
        .await
        .expect("fetch json");
    assert_eq!(
        fetched["jobs"].as_array().map(Vec::len),
        Some(1),
        "{fetched}"
    );
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while counter(&http, &base, "pgvs3_lease_expiries_total").await < 1 {
        assert!(
            std::time::Instant::now() < deadline,
            "the expired lease was never released"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let stepped = counter(&http, &base, "pgvs3_maintenance_queue_steps_total").await - steps;
    assert!(
        (1..=4).contains(&stepped),
        "{stepped} queue steps for one queue with due work"
    );
}

/// Acks do not make their queue due: a completed job is due for removal only when the queue's
/// retention has passed (a day here), so a queue worked off steadily is not stepped on every pass.
/// (`retention_removes_terminal_jobs_and_frees_their_ids` covers a short retention.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acks_make_their_queue_due_only_at_its_retention() {
    let app =
        common::spawn_app_with(|s| s.maintenance_interval = Some(Duration::from_millis(100))).await;
    let http = reqwest::Client::new();
    let base = app.http_url.clone();
    let post = |path: &str, body: Value| post_json(&http, &base, path, body);
    let jobs: Vec<Value> = (0..15)
        .map(|n| json!({"type": "steady.job", "args": [n], "options": {"queue": "steady"}}))
        .collect();
    post("/ojs/v1/jobs/batch", json!({"jobs": jobs})).await;
    let (passes, steps) = after_first_steps(&http, &base, 1).await;
    // Single acks and batch acks in turn (each marks its queue on its own path).
    for n in 0..15 {
        let fetched = post(
            "/ojs/v1/workers/fetch",
            json!({"queues": ["steady"], "count": 1, "visibility_timeout_ms": 60000}),
        )
        .await;
        let ack = json!({"job_id": fetched["jobs"][0]["id"], "lease_token": fetched["jobs"][0]["lease_token"]});
        if n % 2 == 0 {
            post("/ojs/v1/workers/ack", ack).await;
        } else {
            let answer = post("/ojs/v1/workers/ack/batch", json!({"acks": [ack]})).await;
            assert_eq!(answer["results"][0]["state"], "completed", "{answer}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_passes_stepped_nothing(
        &http,
        &base,
        (passes + 10, steps),
        "15 acks over as many passes stepped their queue",
    )
    .await;
}

/// The same over gRPC: `Ack`, `WorkerService/AckBatch` and `CancelJob` end jobs through the
/// same marks, so none of them steps the queue on the passes that follow.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_acks_and_cancels_make_their_queue_due_only_at_its_retention() {
    use pgvs3::grpc::proto::pgvs3::v1 as ext;
    let app =
        common::spawn_app_with(|s| s.maintenance_interval = Some(Duration::from_millis(100))).await;
    let http = reqwest::Client::new();
    let base = app.http_url.clone();
    let mut grpc = Client::Grpc(app.grpc().await);
    let mut workers =
        ext::worker_service_client::WorkerServiceClient::connect(app.grpc_url.clone())
            .await
            .expect("connect gRPC");
    let mut ids = Vec::new();
    for _ in 0..53 {
        ids.push(grpc.enqueue("gsteady", 3).await);
    }
    let (passes, steps) = after_first_steps(&http, &base, 1).await;
    // Three pending jobs cancelled, then single acks and batch acks of ten in turn.
    for id in &ids[50..] {
        assert_eq!(grpc.cancel(id).await.as_deref(), Ok("cancelled"));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for n in 0..5 {
        let claims = grpc.fetch("gsteady", 60_000).await;
        assert_eq!(claims.len(), 10, "round {n}");
        if n % 2 == 0 {
            for claim in &claims {
                assert_eq!(grpc.ack(claim).await.as_deref(), Ok("completed"));
            }
        } else {
            let acks = claims
                .iter()
                .map(|c| pb::AckRequest {
                    job_id: c.id.clone(),
                    lease_token: c.token.clone(),
                    ..Default::default()
                })
                .collect();
            let answer = workers
                .ack_batch(ext::AckBatchRequest { acks })
                .await
                .expect("ack batch")
                .into_inner();
            assert_eq!(answer.acknowledged as usize, claims.len(), "{answer:?}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_passes_stepped_nothing(
        &http,
        &base,
        (passes + 10, steps),
        "gRPC acks and cancels over as many passes stepped their queue",
    )
    .await;
}

/// A gateway keeps its due marks in memory until its next pass, so they die with it. A gateway
/// that starts makes every queue due once: a lease end the dead one marked (here one that never
/// runs a pass) is released at once, not at the 20-40 minute look.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_starting_gateway_makes_every_queue_due_once() {
    use sqlx::Connection;
    let (database, url) = common::fresh_database().await;
    let first = common::spawn_app_on(&database, &url, |s| s.maintenance_interval = None).await;
    let http = reqwest::Client::new();
    let post = |path: &str, body: Value| post_json(&http, &first.http_url, path, body);
    post(
        "/ojs/v1/jobs",
        json!({"type": "t.orphan", "args": [], "options": {"queue": "orphaned"}}),
    )
    .await;
    let fetched = post(
        "/ojs/v1/workers/fetch",
        json!({"queues": ["orphaned"], "count": 1, "visibility_timeout_ms": 300}),
    )
    .await;
    assert_eq!(
        fetched["jobs"].as_array().map(Vec::len),
        Some(1),
        "{fetched}"
    );
    // As a step would have left the queue: nothing due for half an hour.
    let mut db = sqlx::PgConnection::connect(&url).await.expect("connect");
    sqlx::query("UPDATE s3p.queues SET maintain_after = now() + interval '30 minutes'")
        .execute(&mut db)
        .await
        .expect("not due");
    let second = common::spawn_app_on(&database, &url, |s| {
        s.maintenance_interval = Some(Duration::from_millis(100))
    })
    .await;
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let state: String = sqlx::query_scalar("SELECT state FROM s3q_orphaned.jobs LIMIT 1")
            .fetch_one(&mut db)
            .await
            .expect("state");
        if state != "active" {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the lease the first gateway marked was never released"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    drop((first, second));
}

/// The pool checks a connection that sat idle before it hands it out (it no longer pings before
/// every statement): when PostgreSQL ends every connection of a gateway (a restart, an idle
/// timeout, a proxy), the next requests are answered, not failed on a dead connection.
#[tokio::test]
async fn connections_lost_while_idle_do_not_fail_the_next_requests() {
    use sqlx::Connection;
    // No maintenance pass: it would take (and so discard) dead connections before the requests.
    let app = common::spawn_app_with(|s| s.maintenance_interval = None).await;
    let http = common::http::Http::new(&app);
    let mut ids = Vec::new();
    for i in 0..8 {
        let job = http
            .ok_post(
                "/ojs/v1/jobs",
                json!({"type": "idle.lost", "args": [i], "options": {"queue": "idle-lost"}}),
            )
            .await;
        ids.push(job["job"]["id"].as_str().expect("job id").to_string());
    }
    // Concurrent reads open several pooled connections.
    for _ in 0..3 {
        let reads = ids.iter().map(|id| {
            let (http, path) = (&http, format!("/ojs/v1/jobs/{id}"));
            async move { http.get_200(&path).await }
        });
        futures_util::future::join_all(reads).await;
    }

    let mut admin = sqlx::PgConnection::connect(&app.database_url)
        .await
        .expect("connect");
    let ended: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM (SELECT pg_terminate_backend(a.pid) FROM pg_stat_activity a
          WHERE a.datname = current_database() AND a.pid <> pg_backend_pid()) t",
    )
    .fetch_one(&mut admin)
    .await
    .expect("end the gateway's connections");
    assert!(ended >= 3, "the gateway held several connections: {ended}");
    // Past the pool's idle threshold (100 ms), and too soon for the admin tick (every 500 ms, one
    // connection each) to have met every dead connection first.
    tokio::time::sleep(Duration::from_millis(300)).await;

    // Plain reads, one at a time: no grouping or fallback between them and the pool.
    for id in &ids {
        let job = http.get_200(&format!("/ojs/v1/jobs/{id}")).await;
        assert_eq!(job["job"]["state"], "available", "{job}");
    }
    let mut grpc = app.grpc().await;
    let fetched = grpc
        .fetch(pb::FetchRequest {
            queues: vec!["idle-lost".into()],
            count: 16,
            worker_id: "w-idle".into(),
            ..Default::default()
        })
        .await
        .expect("a fetch after the connections were lost")
        .into_inner();
    assert_eq!(fetched.jobs.len(), 8, "every job stored before is there");
    app.stop().await;
}
