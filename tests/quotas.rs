//! Quotas: the server-wide queue limit and per-queue limits on non-terminal jobs and retained
//! stream events answer a retryable 429 `quota_exceeded` naming the quota, and change nothing.

mod common;

use pgvs3::grpc::proto::ojs::v1 as pb;
use serde_json::{Value, json};

async fn post(http: &reqwest::Client, url: String, body: Value) -> (u16, Value) {
    let response = http
        .post(url)
        .header("content-type", "application/json")
        .body(body.to_string())
        .send()
        .await
        .expect("request");
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
}

fn assert_quota(status: u16, body: &Value, quota: &str) {
    assert_eq!(status, 429, "{body}");
    assert_eq!(body["error"]["code"], "quota_exceeded", "{body}");
    assert_eq!(body["error"]["retryable"], true, "{body}");
    assert_eq!(body["error"]["details"]["quota"], quota, "{body}");
}

#[tokio::test]
async fn the_queue_quota_refuses_new_namespaces_only() {
    let app = common::spawn_app_with(|s| s.max_queues = 2).await;
    let http = reqwest::Client::new();
    let jobs = format!("{}/ojs/v1/jobs", app.http_url);
    for queue in ["q1", "q2"] {
        let (status, body) = post(
            &http,
            jobs.clone(),
            json!({"type": "t", "args": [], "options": {"queue": queue}}),
        )
        .await;
        assert_eq!(status, 201, "{body}");
    }
    let (status, body) = post(
        &http,
        jobs.clone(),
        json!({"type": "t", "args": [], "options": {"queue": "q3"}}),
    )
    .await;
    assert_quota(status, &body, "max_queues");
    let (status, body) = post(
        &http,
        format!("{}/ojs/v1/queues/q4/messages", app.http_url),
        json!({"type": "e", "payload": {}}),
    )
    .await;
    assert_quota(status, &body, "max_queues");
    let listed: Value = http
        .get(format!("{}/ojs/v1/queues", app.http_url))
        .send()
        .await
        .expect("list")
        .json()
        .await
        .expect("json");
    let names: Vec<&str> = listed["queues"]
        .as_array()
        .expect("queues")
        .iter()
        .filter_map(|q| q["name"].as_str())
        .collect();
    assert_eq!(names, ["q1", "q2"]);
    // Existing queues keep working.
    let (status, _) = post(
        &http,
        jobs,
        json!({"type": "t", "args": [], "options": {"queue": "q1"}}),
    )
    .await;
    assert_eq!(status, 201);
    // gRPC answers in its own terms.
    let mut grpc = app.grpc().await;
    let status = grpc
        .enqueue(pb::EnqueueRequest {
            r#type: "t".into(),
            options: Some(pb::EnqueueOptions {
                queue: "q5".into(),
                ..Default::default()
            }),
            ..Default::default()
        })
        .await
        .expect_err("quota");
    assert_eq!(status.code(), tonic::Code::ResourceExhausted);
    use tonic_types::StatusExt;
    let info = status.get_details_error_info().expect("error info");
    assert_eq!(info.reason, "quota_exceeded");
    assert_eq!(
        info.metadata.get("retryable").map(String::as_str),
        Some("true")
    );
}

#[tokio::test]
async fn the_job_quota_counts_non_terminal_jobs_and_batches_are_all_or_nothing() {
    let app = common::spawn_app().await;
    let http = reqwest::Client::new();
    let jobs = format!("{}/ojs/v1/jobs", app.http_url);
    let (status, _) = post(
        &http,
        format!("{}/ojs/v1/queues", app.http_url),
        json!({"name": "capped"}),
    )
    .await;
    assert_eq!(status, 201);
    let (status, body) = post(
        &http,
        format!("{}/ojs/v1/queues/capped/config", app.http_url),
        json!({"max_jobs": 2}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["max_jobs"], 2);
    let job = || json!({"type": "t", "args": [], "options": {"queue": "capped"}});
    for _ in 0..2 {
        let (status, body) = post(&http, jobs.clone(), job()).await;
        assert_eq!(status, 201, "{body}");
    }
    let (status, body) = post(&http, jobs.clone(), job()).await;
    assert_quota(status, &body, "max_jobs");
    // Finish one: a slot frees up.
    let (_, fetched) = post(
        &http,
        format!("{}/ojs/v1/workers/fetch", app.http_url),
        json!({"queues": ["capped"]}),
    )
    .await;
    let id = fetched["jobs"][0]["id"]
        .as_str()
        .expect("fetched")
        .to_string();
    let (status, _) = post(
        &http,
        format!("{}/ojs/v1/workers/ack", app.http_url),
        json!({"job_id": id}),
    )
    .await;
    assert_eq!(status, 200);
    // A batch of two with one slot free is refused whole.
    let (status, body) = post(
        &http,
        format!("{}/ojs/v1/jobs/batch", app.http_url),
        json!({"jobs": [job(), job()]}),
    )
    .await;
    assert_quota(status, &body, "max_jobs");
    let stats: Value = http
        .get(format!("{}/ojs/v1/queues/capped/stats", app.http_url))
        .send()
        .await
        .expect("stats")
        .json()
        .await
        .expect("json");
    assert_eq!(stats["queue"]["available"], 1, "{stats}");
    assert_eq!(stats["queue"]["completed"], 1, "{stats}");
    let (status, body) = post(&http, jobs.clone(), job()).await;
    assert_eq!(status, 201, "{body}");
    // Clearing the quota lifts it.
    let (status, body) = post(
        &http,
        format!("{}/ojs/v1/queues/capped/config", app.http_url),
        json!({"max_jobs": null}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert!(
        body.get("max_jobs").is_none() || body["max_jobs"].is_null(),
        "{body}"
    );
    let (status, _) = post(&http, jobs, job()).await;
    assert_eq!(status, 201);
}

#[tokio::test]
async fn the_stream_quota_counts_retained_events() {
    let app = common::spawn_app().await;
    let http = reqwest::Client::new();
    let messages = format!("{}/ojs/v1/queues/feed/messages", app.http_url);
    let (status, _) = post(&http, messages.clone(), json!({"type": "e", "payload": 1})).await;
    assert_eq!(status, 201);
    let (status, body) = post(
        &http,
        format!("{}/ojs/v1/queues/feed/config", app.http_url),
        json!({"max_stream_events": 3}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let (status, body) = post(
        &http,
        format!("{messages}/batch"),
        json!({"messages": [{"type": "e", "payload": 2}, {"type": "e", "payload": 3}]}),
    )
    .await;
    assert_eq!(status, 201, "{body}");
    let (status, body) = post(&http, messages, json!({"type": "e", "payload": 4})).await;
    assert_quota(status, &body, "max_stream_events");
    let info: Value = http
        .get(format!("{}/ojs/v1/queues/feed/info", app.http_url))
        .send()
        .await
        .expect("info")
        .json()
        .await
        .expect("json");
    assert_eq!(info["events"], 3, "{info}");
}
