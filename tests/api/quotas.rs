//! Quotas: the server-wide queue limit and per-queue limits on non-terminal jobs and retained
//! stream events answer a retryable 429 `quota_exceeded` naming the quota, and change nothing.

use crate::common;

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

/// Quotas hold exactly under concurrent writers: 24 clients race to enqueue 4 jobs each (single
/// enqueues, which the server groups, and batches) into a queue whose quota is 40, and 24 more to
/// append 4 events each to a stream whose quota is 40. Exactly 40 of each are stored and every
/// other request is refused whole with 429.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quotas_hold_exactly_under_concurrent_writers() {
    let app = common::spawn_app().await;
    let http = reqwest::Client::new();
    let base = app.http_url.clone();
    for queue in ["race-jobs", "race-stream"] {
        let (status, body) = post(
            &http,
            format!("{base}/ojs/v1/queues"),
            json!({"name": queue}),
        )
        .await;
        assert!(status == 201 || status == 200, "{body}");
    }
    let (status, body) = post(
        &http,
        format!("{base}/ojs/v1/queues/race-jobs/config"),
        json!({"max_jobs": 40}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let (status, body) = post(
        &http,
        format!("{base}/ojs/v1/queues/race-stream/config"),
        json!({"max_stream_events": 40}),
    )
    .await;
    assert_eq!(status, 200, "{body}");

    let job = || json!({"type": "race.job", "args": [], "options": {"queue": "race-jobs"}});
    let mut writers = Vec::new();
    for n in 0..24 {
        let (http, base) = (http.clone(), base.clone());
        writers.push(tokio::spawn(async move {
            let mut stored = 0u64;
            if n % 2 == 0 {
                // Four single enqueues at once.
                let singles = (0..4).map(|_| post(&http, format!("{base}/ojs/v1/jobs"), job()));
                for (status, body) in futures_util::future::join_all(singles).await {
                    match status {
                        201 => stored += 1,
                        429 => assert_quota(status, &body, "max_jobs"),
                        _ => panic!("{status}: {body}"),
                    }
                }
            } else {
                let (status, body) = post(
                    &http,
                    format!("{base}/ojs/v1/jobs/batch"),
                    json!({"jobs": [job(), job(), job(), job()]}),
                )
                .await;
                match status {
                    200 | 201 => stored += 4,
                    429 => assert_quota(status, &body, "max_jobs"),
                    _ => panic!("{status}: {body}"),
                }
            }
            let messages: Vec<Value> = (0..4)
                .map(|i| json!({"type": "race.event", "payload": {"i": i}}))
                .collect();
            let (status, body) = post(
                &http,
                format!("{base}/ojs/v1/queues/race-stream/messages/batch"),
                json!({ "messages": messages }),
            )
            .await;
            let appended = match status {
                200 | 201 => 4,
                429 => {
                    assert_quota(status, &body, "max_stream_events");
                    0
                }
                _ => panic!("{status}: {body}"),
            };
            (stored, appended)
        }));
    }
    let (mut stored, mut appended) = (0, 0);
    for writer in writers {
        let (s, a) = writer.await.expect("writer");
        stored += s;
        appended += a;
    }
    assert_eq!(stored, 40, "jobs accepted");
    assert_eq!(appended, 40, "events accepted");
    let stats: Value = http
        .get(format!("{base}/ojs/v1/queues/race-jobs/stats"))
        .send()
        .await
        .expect("stats")
        .json()
        .await
        .expect("stats json");
    assert_eq!(stats["queue"]["available"], 40, "{stats}");
    let info: Value = http
        .get(format!("{base}/ojs/v1/queues/race-stream/info"))
        .send()
        .await
        .expect("info")
        .json()
        .await
        .expect("info json");
    assert_eq!(info["events"], 40, "{info}");
}

/// A replay of dead letters adds events, so it counts against the stream quota like an append:
/// over the quota it is refused whole with 429, and the dead letters stay where they were.
#[tokio::test]
async fn replaying_dead_letters_counts_against_the_stream_quota() {
    let app = common::spawn_app().await;
    let http = reqwest::Client::new();
    let base = format!("{}/ojs/v1", app.http_url);
    let (status, body) = post(
        &http,
        format!("{base}/queues/replays/consumers"),
        json!({"consumer": "c"}),
    )
    .await;
    assert!(status == 201 || status == 200, "{body}");
    let (status, body) = post(
        &http,
        format!("{base}/queues/replays/config"),
        json!({"max_retries": 0, "max_stream_events": 2}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let (status, body) = post(
        &http,
        format!("{base}/queues/replays/messages/batch"),
        json!({"messages": [{"type": "e", "payload": 1}, {"type": "e", "payload": 2}]}),
    )
    .await;
    assert_eq!(status, 201, "{body}");
    let (status, batch) = post(
        &http,
        format!("{base}/queues/replays/receive"),
        json!({"consumer": "c"}),
    )
    .await;
    assert_eq!(status, 200, "{batch}");
    let events = batch["events"].as_array().expect("events").clone();
    assert_eq!(events.len(), 2, "{batch}");
    for event in &events {
        let (status, body) = post(
            &http,
            format!("{base}/streams/nack"),
            json!({"queue": "replays", "batch_id": batch["batch_id"], "message_id": event["id"]}),
        )
        .await;
        assert_eq!(status, 200, "{body}");
    }
    let (status, body) = post(
        &http,
        format!("{base}/queues/replays/dlq/replay"),
        json!({}),
    )
    .await;
    assert_quota(status, &body, "max_stream_events");
    let info: Value = http
        .get(format!("{base}/queues/replays/info"))
        .send()
        .await
        .expect("info")
        .json()
        .await
        .expect("json");
    assert_eq!(info["events"], 2, "{info}");
    let dead: Value = http
        .get(format!("{base}/queues/replays/dlq"))
        .send()
        .await
        .expect("dlq")
        .json()
        .await
        .expect("json");
    assert_eq!(
        dead["dead_letters"].as_array().map(Vec::len),
        Some(2),
        "{dead}"
    );
}
