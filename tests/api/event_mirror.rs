//! Per-queue mirroring of job lifecycle events into the queue's stream (`mirror_job_events`),
//! each test on its own server and database (real PostgreSQL): off by default, turned on and off
//! through the HTTP config route and gRPC `AdminService/SetQueueConfig`, bad values refused, and
//! the mirrored messages as a stream consumer receives them.

use crate::common;

use std::time::{Duration, Instant};

use pgvs3::grpc::proto::pgvs3::v1 as s3;
use reqwest::StatusCode;
use serde_json::{Value, json};

/// The shared HTTP client, with this module's calls.
struct Api(common::http::Http);

impl std::ops::Deref for Api {
    type Target = common::http::Http;

    fn deref(&self) -> &common::http::Http {
        &self.0
    }
}

impl Api {
    fn new(app: &common::TestApp) -> Api {
        Api(common::http::Http::new(app))
    }

    async fn post(&self, path: &str, body: Value) -> Value {
        self.0.ok_post(path, body).await
    }

    async fn get(&self, path: &str) -> Value {
        self.get_200(path).await
    }

    async fn config(&self, queue: &str) -> Value {
        self.get(&format!("/ojs/v1/queues/{queue}/config")).await
    }

    async fn set_config(&self, queue: &str, changes: Value) -> (StatusCode, Value) {
        self.send(
            reqwest::Method::POST,
            &format!("/ojs/v1/queues/{queue}/config"),
            Some(changes),
        )
        .await
    }

    /// Enqueues one job; returns its id.
    async fn enqueue(&self, queue: &str) -> String {
        let (status, answer) = self
            .send(
                reqwest::Method::POST,
                "/ojs/v1/jobs",
                Some(json!({"type": "mirror.test", "args": [1], "options": {"queue": queue}})),
            )
            .await;
        assert_eq!(status, StatusCode::CREATED, "enqueue: {answer}");
        answer["job"]["id"].as_str().expect("job id").to_string()
    }

    /// Enqueues, fetches and acks one job; returns its id.
    async fn run_one(&self, queue: &str) -> String {
        let id = self.enqueue(queue).await;
        let fetched = self
            .post(
                "/ojs/v1/workers/fetch",
                json!({"queues": [queue], "count": 1, "worker_id": "w1"}),
            )
            .await;
        assert_eq!(fetched["jobs"][0]["id"], id.as_str(), "{fetched}");
        self.post(
            "/ojs/v1/workers/ack",
            json!({"job_id": id, "lease_token": fetched["jobs"][0]["lease_token"], "result": 7}),
        )
        .await;
        id
    }

    async fn subscribe(&self, queue: &str, consumer: &str) {
        self.post(
            &format!("/ojs/v1/queues/{queue}/consumers"),
            json!({"consumer": consumer}),
        )
        .await;
    }

    /// Receives and acks batches until `count` messages arrived (or, for `count` 0, until one
    /// receive came back empty); returns the messages.
    async fn drain(&self, queue: &str, consumer: &str, count: usize) -> Vec<Value> {
        let deadline = Instant::now() + Duration::from_secs(15);
        let mut messages = Vec::new();
        loop {
            let wait_ms = if count == 0 { 0 } else { 1000 };
            let batch = self
                .post(
                    &format!("/ojs/v1/queues/{queue}/receive"),
                    json!({"consumer": consumer, "wait_ms": wait_ms}),
                )
                .await;
            if let Some(batch_id) = batch["batch_id"].as_str() {
                messages.extend(batch["events"].as_array().cloned().unwrap_or_default());
                self.post(
                    "/ojs/v1/streams/ack",
                    json!({"queue": queue, "batch_id": batch_id}),
                )
                .await;
            } else if count == 0 {
                return messages;
            }
            if count > 0 && messages.len() >= count {
                return messages;
            }
            assert!(
                Instant::now() < deadline,
                "{count} messages expected, got {messages:?}"
            );
        }
    }
}

/// Whether the trigger that mirrors is there (and enabled): only while some queue mirrors, so
/// that recording an event costs nothing more when none does.
async fn mirror_trigger_enabled(app: &common::TestApp) -> bool {
    use sqlx::Connection;
    let mut db = sqlx::PgConnection::connect(&app.database_url)
        .await
        .expect("connect");
    let state: Option<String> = sqlx::query_scalar(
        "SELECT tgenabled::text FROM pg_trigger WHERE tgname = 'events_mirror_job_events'",
    )
    .fetch_optional(&mut db)
    .await
    .expect("the trigger");
    state.is_some_and(|s| s != "D")
}

fn types(messages: &[Value]) -> Vec<&str> {
    messages.iter().filter_map(|m| m["type"].as_str()).collect()
}

/// Off by default: a job's lifecycle leaves the stream empty. Turned on over HTTP, each event is
/// one message (type = event type, payload = the event log row, header `pgvs3-event: job`); bad
/// values get 400 and change nothing; turned off, mirroring stops.
#[tokio::test]
async fn mirroring_is_off_by_default_and_set_over_http() {
    // Reads the event log right after commits: not while conformance runs (common::db).
    let _log = common::db::reading_the_event_log_at_once().await;
    let app = common::spawn_app().await;
    let api = Api::new(&app);
    let queue = "mirrored";
    api.subscribe(queue, "c1").await;
    assert_eq!(api.config(queue).await["mirror_job_events"], false);
    assert!(!mirror_trigger_enabled(&app).await);

    api.run_one(queue).await;
    assert_eq!(api.drain(queue, "c1", 0).await, Vec::<Value>::new());

    for bad in [json!("yes"), json!(1), json!({"on": true})] {
        let (status, answer) = api
            .set_config(queue, json!({"mirror_job_events": bad, "max_retries": 9}))
            .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{bad}: {answer}");
        assert_eq!(answer["error"]["code"], "invalid_request", "{answer}");
    }
    let config = api.config(queue).await;
    assert_eq!(config["mirror_job_events"], false, "{config}");
    assert_ne!(
        config["max_retries"], 9,
        "a refused change changes nothing: {config}"
    );

    let (status, set) = api
        .set_config(queue, json!({"mirror_job_events": true}))
        .await;
    assert_eq!(status, StatusCode::OK, "{set}");
    assert_eq!(set["mirror_job_events"], true, "{set}");
    assert_eq!(api.config(queue).await["mirror_job_events"], true);
    assert!(mirror_trigger_enabled(&app).await);

    let id = api.run_one(queue).await;
    let messages = api.drain(queue, "c1", 3).await;
    assert_eq!(
        types(&messages),
        ["job.enqueued", "job.started", "job.completed"],
        "{messages:?}"
    );
    let polled = api.get(&format!("/ojs/v1/events?queues={queue}")).await;
    let logged: Vec<&Value> = polled["events"]
        .as_array()
        .expect("events")
        .iter()
        .filter(|e| e["subject"] == id.as_str())
        .collect();
    assert_eq!(logged.len(), 3, "{polled}");
    let mut last_seq = 0;
    for (message, event) in messages.iter().zip(logged) {
        let payload = &message["payload"];
        assert_eq!(payload["type"], message["type"], "{message}");
        assert_eq!(payload["job_id"], id.as_str(), "{message}");
        assert_eq!(payload["queue"], queue, "{message}");
        assert_eq!(payload["job_type"], "mirror.test", "{message}");
        assert_eq!(payload["data"], event["data"], "the logged event's data");
        assert_eq!(
            event["id"].as_str(),
            Some(format!("evt_{}", message["id"].as_str().expect("id")).as_str()),
            "the message id is the event id"
        );
        let seq = payload["seq"].as_i64().expect("seq");
        assert!(seq > last_seq, "seq increases: {messages:?}");
        last_seq = seq;
        assert_eq!(
            message["headers"],
            json!({"pgvs3-event": "job"}),
            "{message}"
        );
    }
    assert_eq!(messages[2]["payload"]["data"]["result"], 7);

    let (status, answer) = api
        .set_config(queue, json!({"mirror_job_events": "off"}))
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{answer}");
    assert_eq!(api.config(queue).await["mirror_job_events"], true);

    api.set_config(queue, json!({"mirror_job_events": false}))
        .await;
    assert_eq!(api.config(queue).await["mirror_job_events"], false);
    assert!(!mirror_trigger_enabled(&app).await);
    api.run_one(queue).await;
    assert_eq!(api.drain(queue, "c1", 0).await, Vec::<Value>::new());
    app.stop().await;
}

/// `AdminService/SetQueueConfig` turns mirroring on and off; leaving the field unset changes
/// nothing; `GetQueueConfig` reports it; dropping the queue ends it.
/// A transition whose mirrored events could not be received (more than the 16 MiB one receive
/// answers; jsonb prints `1e300` in 301 digits) is refused with 413, changing nothing: the
/// mirrored append is one transaction, never split across ticks. The job stays active and can
/// still be acked.
#[tokio::test]
async fn a_transition_mirroring_more_than_a_receive_answers_is_refused() {
    let app = common::spawn_app().await;
    let api = Api::new(&app);
    let queue = "mirror-big";
    api.subscribe(queue, "c").await;
    let (status, body) = api
        .set_config(queue, json!({"mirror_job_events": true}))
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let id = api.enqueue(queue).await;
    let fetched = api
        .post(
            "/ojs/v1/workers/fetch",
            json!({"queues": [queue], "count": 1, "worker_id": "w1"}),
        )
        .await;
    let token = fetched["jobs"][0]["lease_token"].clone();
    // Under 1 MiB as sent, about 36 MB as jsonb prints it.
    let (status, body) = api
        .send(
            reqwest::Method::POST,
            "/ojs/v1/workers/nack",
            Some(json!({"job_id": id, "lease_token": token, "error": {
                "code": "big", "message": "big", "details": {"v": vec![1e300; 120_000]}}})),
        )
        .await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE, "{body}");
    assert_eq!(body["error"]["code"], "batch_too_large", "{body}");
    let job = api.get(&format!("/ojs/v1/jobs/{id}")).await;
    assert_eq!(job["job"]["state"], "active", "{job}");
    api.post(
        "/ojs/v1/workers/ack",
        json!({"job_id": id, "lease_token": token}),
    )
    .await;
    let messages = api.drain(queue, "c", 0).await;
    assert_eq!(
        types(&messages),
        ["job.enqueued", "job.started", "job.completed"],
        "{messages:?}"
    );
}

#[tokio::test]
async fn mirroring_is_set_over_grpc() {
    let app = common::spawn_app().await;
    let api = Api::new(&app);
    let queue = "mirrored-grpc";
    api.subscribe(queue, "c1").await;
    let channel = common::grpc::channel(&app.grpc_url).await;
    let mut admin = s3::admin_service_client::AdminServiceClient::new(channel);
    let client = admin.clone();
    let set = move |mirror: Option<bool>| {
        let request = s3::SetQueueConfigRequest {
            queue: queue.into(),
            mirror_job_events: mirror,
            max_retries: mirror.is_none().then_some(4),
            ..Default::default()
        };
        let mut admin = client.clone();
        async move {
            admin
                .set_queue_config(request)
                .await
                .expect("SetQueueConfig")
                .into_inner()
                .config
                .expect("config")
        }
    };
    assert!(set(Some(true)).await.mirror_job_events);
    // Unset: unchanged.
    let config = set(None).await;
    assert!(config.mirror_job_events);
    assert_eq!(config.max_retries, 4);
    let read = admin
        .get_queue_config(s3::GetQueueConfigRequest {
            queue: queue.into(),
        })
        .await
        .expect("GetQueueConfig")
        .into_inner()
        .config
        .expect("config");
    assert!(read.mirror_job_events);

    let id = api.enqueue(queue).await;
    let messages = api.drain(queue, "c1", 1).await;
    assert_eq!(types(&messages), ["job.enqueued"]);
    assert_eq!(messages[0]["payload"]["job_id"], id.as_str());

    assert!(!set(Some(false)).await.mirror_job_events);
    assert_eq!(api.config(queue).await["mirror_job_events"], false);
    api.enqueue(queue).await;
    assert_eq!(api.drain(queue, "c1", 0).await, Vec::<Value>::new());
    assert!(!mirror_trigger_enabled(&app).await);

    // Dropping the last queue that mirrors turns the trigger off too.
    assert!(set(Some(true)).await.mirror_job_events);
    assert!(mirror_trigger_enabled(&app).await);
    let (status, answer) = api
        .send(
            reqwest::Method::DELETE,
            &format!("/ojs/v1/queues/{queue}"),
            None,
        )
        .await;
    assert!(status.is_success(), "drop: {answer}");
    assert!(!mirror_trigger_enabled(&app).await);
    app.stop().await;
}
