//! Bad input over HTTP and gRPC: every validation rule answers the spec'd status and OJS error code
//! (envelope with `retryable: false` and the request id), and a rejected request changes nothing.

use crate::common;

use common::TestApp;
use pgvs3::grpc::proto::ojs::v1 as pb;
use reqwest::Method;
use reqwest::header::HeaderMap;
use serde_json::{Value, json};
use tonic::Code;
use tonic_types::StatusExt;
use uuid::Uuid;

const OJS_MEDIA_TYPE: &str = "application/openjobspec+json";

/// One HTTP answer, with the request id the test sent.
struct Reply {
    status: u16,
    headers: HeaderMap,
    body: Value,
    text: String,
    request_id: String,
    what: String,
}

impl Reply {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    /// Asserts an OJS error envelope with this status and code; returns the `error` object.
    fn expect_error(&self, status: u16, code: &str) -> &Value {
        self.expect_error_in(status, &[code])
    }

    /// Like `expect_error`, accepting any of `codes`.
    fn expect_error_in(&self, status: u16, codes: &[&str]) -> &Value {
        let what = &self.what;
        assert_eq!(self.status, status, "{what}: status (body: {})", self.text);
        assert_eq!(
            self.header("content-type"),
            Some(OJS_MEDIA_TYPE),
            "{what}: content type"
        );
        let error = &self.body["error"];
        assert!(
            error.is_object(),
            "{what}: no error envelope: {}",
            self.text
        );
        let code = error["code"].as_str().expect("error.code is a string");
        assert!(
            codes.contains(&code),
            "{what}: error.code {code:?}, expected one of {codes:?} (body: {})",
            self.text
        );
        assert_eq!(
            error["retryable"],
            json!(false),
            "{what}: error.retryable (body: {})",
            self.text
        );
        assert!(
            error["message"].as_str().is_some_and(|m| !m.is_empty()),
            "{what}: error.message (body: {})",
            self.text
        );
        assert_eq!(
            error["request_id"].as_str(),
            Some(self.request_id.as_str()),
            "{what}: error.request_id (body: {})",
            self.text
        );
        error
    }

    /// Asserts a success status; returns the body.
    fn expect_ok(&self, status: u16) -> &Value {
        assert_eq!(
            self.status, status,
            "{}: status (body: {})",
            self.what, self.text
        );
        &self.body
    }
}

/// An HTTP request to the app. Every request carries a fresh `X-Request-Id` (unless `headers`
/// names one); every answer must echo it and carry `OJS-Version: 1.0`.
async fn request(
    app: &TestApp,
    method: Method,
    path: &str,
    body: Option<(&str, String)>,
    headers: &[(&str, &str)],
) -> Reply {
    let client = reqwest::Client::new();
    let request_id = headers
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case("x-request-id"))
        .map_or_else(
            || format!("test-{}", Uuid::new_v4()),
            |(_, v)| v.to_string(),
        );
    let what = format!("{method} {path}");
    let mut builder = client
        .request(method, format!("{}{path}", app.http_url))
        .header("x-request-id", &request_id);
    for (k, v) in headers {
        if !k.eq_ignore_ascii_case("x-request-id") {
            builder = builder.header(*k, *v);
        }
    }
    if let Some((content_type, text)) = body {
        if !content_type.is_empty() {
            builder = builder.header("content-type", content_type);
        }
        builder = builder.body(text);
    }
    let response = builder.send().await.expect("send the request");
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    let text = response.text().await.expect("read the response body");
    let body = if text.is_empty() {
        Value::Null
    } else {
        serde_json::from_str(&text).unwrap_or(Value::Null)
    };
    let reply = Reply {
        status,
        headers,
        body,
        text,
        request_id,
        what,
    };
    assert_eq!(
        reply.header("ojs-version"),
        Some("1.0"),
        "{}: OJS-Version header",
        reply.what
    );
    assert_eq!(
        reply.header("x-request-id"),
        Some(reply.request_id.as_str()),
        "{}: X-Request-Id echo",
        reply.what
    );
    reply
}

async fn post_json(app: &TestApp, path: &str, body: &Value) -> Reply {
    post_raw(app, path, OJS_MEDIA_TYPE, body.to_string()).await
}

async fn post_raw(app: &TestApp, path: &str, content_type: &str, body: String) -> Reply {
    request(app, Method::POST, path, Some((content_type, body)), &[]).await
}

async fn get(app: &TestApp, path: &str) -> Reply {
    request(app, Method::GET, path, None, &[]).await
}

async fn enqueue(app: &TestApp, body: &Value) -> Reply {
    post_json(app, "/ojs/v1/jobs", body).await
}

/// Enqueues a valid job and returns it as stored.
async fn enqueue_ok(app: &TestApp, body: &Value) -> Value {
    let reply = enqueue(app, body).await;
    reply.expect_ok(201)["job"].clone()
}

async fn get_job(app: &TestApp, id: &str) -> Value {
    get(app, &format!("/ojs/v1/jobs/{id}")).await.expect_ok(200)["job"].clone()
}

/// Fetches one job from `queue`; returns it (with its lease token).
async fn fetch_one(app: &TestApp, queue: &str) -> Value {
    let reply = post_json(app, "/ojs/v1/workers/fetch", &json!({"queues": [queue]})).await;
    let jobs = reply.expect_ok(200)["jobs"]
        .as_array()
        .expect("jobs array")
        .clone();
    assert_eq!(jobs.len(), 1, "fetch: {}", reply.text);
    jobs[0].clone()
}

/// Asserts that `queue` has no job ready: a fetch answers none.
async fn assert_nothing_ready(app: &TestApp, queue: &str) {
    let reply = post_json(app, "/ojs/v1/workers/fetch", &json!({"queues": [queue]})).await;
    assert_eq!(reply.expect_ok(200)["jobs"], json!([]), "{queue}");
}

fn valid_job() -> Value {
    json!({"type": "email.send", "args": ["a@example.com", 1]})
}

/// Asserts that enqueueing `body` is rejected with `status` and `code`.
async fn assert_enqueue_rejected(app: &TestApp, body: Value, status: u16, code: &str) -> Value {
    let reply = enqueue(app, &body).await;
    let error = reply.expect_error(status, code).clone();
    assert!(
        reply.header("location").is_none(),
        "a rejected enqueue has no Location: {body}"
    );
    error
}

#[tokio::test]
async fn args_that_are_not_an_array_are_rejected() {
    let app = common::spawn_app().await;
    for args in [
        json!({"to": "a@example.com"}),
        json!("a@example.com"),
        json!(42),
        json!(true),
        Value::Null,
    ] {
        let body = json!({"type": "email.send", "args": args});
        assert_enqueue_rejected(&app, body, 400, "invalid_request").await;
    }
}

#[tokio::test]
async fn missing_args_is_rejected() {
    let app = common::spawn_app().await;
    assert_enqueue_rejected(&app, json!({"type": "email.send"}), 400, "invalid_request").await;
}

#[tokio::test]
async fn missing_type_is_exactly_400() {
    let app = common::spawn_app().await;
    let reply = enqueue(&app, &json!({"args": [1]})).await;
    reply.expect_error(400, "invalid_request");
}

#[tokio::test]
async fn bad_job_types_are_rejected() {
    let app = common::spawn_app().await;
    for job_type in ["Email.send", "1email", "email send", "email@send", ""] {
        let body = json!({"type": job_type, "args": []});
        assert_enqueue_rejected(&app, body, 400, "invalid_request").await;
    }
}

#[tokio::test]
async fn bad_queue_names_are_rejected() {
    let app = common::spawn_app().await;
    let long = "q".repeat(129);
    for queue in ["Default", "my_queue", "-queue", long.as_str()] {
        let body = json!({"type": "email.send", "args": [], "options": {"queue": queue}});
        assert_enqueue_rejected(&app, body, 400, "invalid_request").await;
    }
    // 128 characters is still a valid name.
    let body = json!({"type": "email.send", "args": [], "options": {"queue": "q".repeat(128)}});
    enqueue_ok(&app, &body).await;
}

#[tokio::test]
async fn bad_caller_ids_are_rejected() {
    let app = common::spawn_app().await;
    let upper_v7 = Uuid::now_v7().to_string().to_uppercase();
    let v4 = Uuid::new_v4().to_string();
    for id in [upper_v7.as_str(), v4.as_str(), "not-a-uuid", ""] {
        let body = json!({"id": id, "type": "email.send", "args": []});
        assert_enqueue_rejected(&app, body, 400, "invalid_request").await;
    }
    // A lowercase UUIDv7 is accepted and kept.
    let id = Uuid::now_v7().to_string();
    let job = enqueue_ok(&app, &json!({"id": id, "type": "email.send", "args": []})).await;
    assert_eq!(job["id"], json!(id));
}

#[tokio::test]
async fn priority_out_of_range_is_rejected() {
    let app = common::spawn_app().await;
    for priority in [101, -101] {
        let body = json!({"type": "email.send", "args": [], "options": {"priority": priority}});
        assert_enqueue_rejected(&app, body, 400, "invalid_request").await;
    }
    for priority in [100, -100] {
        let body = json!({"type": "email.send", "args": [], "options": {"priority": priority}});
        assert_eq!(enqueue_ok(&app, &body).await["priority"], json!(priority));
    }
}

#[tokio::test]
async fn negative_max_attempts_is_a_validation_error() {
    let app = common::spawn_app().await;
    let body =
        json!({"type": "email.send", "args": [], "options": {"retry": {"max_attempts": -1}}});
    let error = assert_enqueue_rejected(&app, body, 422, "validation_error").await;
    let message = error["message"].as_str().expect("message");
    assert!(message.contains("max_attempts"), "message: {message}");
    assert_eq!(error["type"], json!("validation_error"));
}

#[tokio::test]
async fn backoff_coefficient_below_one_is_a_validation_error() {
    let app = common::spawn_app().await;
    let body = json!({"type": "email.send", "args": [], "options": {"retry": {"backoff_coefficient": 0.5}}});
    let error = assert_enqueue_rejected(&app, body, 422, "validation_error").await;
    let message = error["message"].as_str().expect("message");
    assert!(
        message.contains("backoff_coefficient"),
        "message: {message}"
    );
    assert_eq!(error["type"], json!("validation_error"));
}

#[tokio::test]
async fn scheduled_at_without_a_zone_is_rejected() {
    let app = common::spawn_app().await;
    let body = json!({
        "type": "email.send",
        "args": [],
        "options": {"scheduled_at": "2030-01-01T10:00:00"}
    });
    assert_enqueue_rejected(&app, body, 400, "invalid_request").await;
}

#[tokio::test]
async fn malformed_json_is_invalid_payload_and_changes_nothing() {
    let app = common::spawn_app().await;
    let before = enqueue_ok(&app, &valid_job()).await;
    let id = before["id"].as_str().expect("id").to_string();
    let body = r#"{"type": "email.send", "args": ["#.to_string();
    let reply = post_raw(&app, "/ojs/v1/jobs", OJS_MEDIA_TYPE, body).await;
    reply.expect_error(400, "invalid_payload");
    // The same with application/json, and on a worker endpoint.
    let body = r#"{"job_id": "#.to_string();
    let reply = post_raw(&app, "/ojs/v1/workers/ack", "application/json", body).await;
    reply.expect_error(400, "invalid_payload");
    assert_eq!(get_job(&app, &id).await, before, "the stored job changed");
}

#[tokio::test]
async fn empty_body_is_invalid_payload() {
    let app = common::spawn_app().await;
    let reply = post_raw(&app, "/ojs/v1/jobs", OJS_MEDIA_TYPE, String::new()).await;
    reply.expect_error(400, "invalid_payload");
}

#[tokio::test]
async fn json_that_is_not_an_object_is_rejected() {
    let app = common::spawn_app().await;
    for body in ["[1]", "\"email.send\"", "42", "null"] {
        let reply = post_raw(&app, "/ojs/v1/jobs", OJS_MEDIA_TYPE, body.to_string()).await;
        reply.expect_error_in(400, &["invalid_payload", "invalid_request"]);
    }
}

#[tokio::test]
async fn wrong_content_type_is_rejected() {
    let app = common::spawn_app().await;
    let reply = post_raw(&app, "/ojs/v1/jobs", "text/plain", valid_job().to_string()).await;
    reply.expect_error(400, "invalid_request");
    // Nothing was enqueued.
    assert_nothing_ready(&app, "default").await;
}

#[tokio::test]
async fn oversized_body_is_413_and_changes_nothing() {
    let app = common::spawn_app().await;
    let before = enqueue_ok(&app, &valid_job()).await;
    let id = before["id"].as_str().expect("id").to_string();
    // 1.1 MiB of args.
    let big = "x".repeat(1_153_434);
    let body = json!({"type": "email.send", "args": [big]});
    let reply = enqueue(&app, &body).await;
    let error = reply.expect_error(413, "invalid_request");
    let message = error["message"].as_str().expect("message");
    assert!(
        message.contains("limit") && message.contains("1048576"),
        "the message names the limit: {message}"
    );
    // Also on an id the caller chose: nothing of it is stored.
    let chosen = Uuid::now_v7().to_string();
    let body = json!({"id": chosen, "type": "email.send", "args": ["y".repeat(1_153_434)]});
    enqueue(&app, &body)
        .await
        .expect_error(413, "invalid_request");
    get(&app, &format!("/ojs/v1/jobs/{chosen}"))
        .await
        .expect_error(404, "not_found");
    assert_eq!(get_job(&app, &id).await, before, "the stored job changed");
    // Just under the limit is accepted.
    let body = json!({"type": "email.send", "args": ["z".repeat(1_000_000)]});
    enqueue_ok(&app, &body).await;
}

#[tokio::test]
async fn the_manifest_reports_the_body_limit_in_force() {
    let app = common::spawn_app_with(|s| s.max_body_bytes = 4096).await;
    let manifest = get(&app, "/ojs/manifest").await.expect_ok(200).clone();
    assert_eq!(manifest["limits"]["max_body_bytes"], 4096, "{manifest}");
    let body = json!({"type": "email.send", "args": ["x".repeat(5000)]});
    enqueue(&app, &body)
        .await
        .expect_error(413, "invalid_request");
}

#[tokio::test]
async fn chunked_oversized_body_is_413() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    let app = common::spawn_app().await;
    let before = enqueue_ok(&app, &valid_job()).await;
    let id = before["id"].as_str().expect("id").to_string();
    // No Content-Length: the limit must cut the body off while it streams.
    let body = json!({"type": "email.send", "args": ["x".repeat(1_153_434)]}).to_string();
    let address = app.http_url.trim_start_matches("http://");
    let mut stream = tokio::net::TcpStream::connect(address)
        .await
        .expect("connect");
    let head = format!(
        "POST /ojs/v1/jobs HTTP/1.1\r\nhost: {address}\r\ncontent-type: {OJS_MEDIA_TYPE}\r\n\
         x-request-id: chunked-1\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n"
    );
    let mut wire = head.into_bytes();
    for chunk in body.as_bytes().chunks(64 * 1024) {
        wire.extend_from_slice(format!("{:x}\r\n", chunk.len()).as_bytes());
        wire.extend_from_slice(chunk);
        wire.extend_from_slice(b"\r\n");
    }
    wire.extend_from_slice(b"0\r\n\r\n");
    // The server may answer (and stop reading) before the whole body is sent.
    let _ = stream.write_all(&wire).await;
    let mut answer = Vec::new();
    let _ = stream.read_to_end(&mut answer).await;
    let answer = String::from_utf8_lossy(&answer);
    let status_line = answer.lines().next().unwrap_or_default();
    assert!(
        status_line.starts_with("HTTP/1.1 413"),
        "status: {status_line:?} in {answer}"
    );
    let head_lower = answer.to_ascii_lowercase();
    assert!(
        head_lower.contains(&format!("content-type: {OJS_MEDIA_TYPE}")),
        "{answer}"
    );
    let json_start = answer.find("{\"error\"").expect("an error envelope");
    let json_end = answer.rfind('}').expect("end of the envelope");
    let envelope: Value =
        serde_json::from_str(&answer[json_start..=json_end]).expect("JSON envelope");
    let error = &envelope["error"];
    assert_eq!(error["code"], json!("invalid_request"), "{answer}");
    assert_eq!(error["retryable"], json!(false), "{answer}");
    assert_eq!(error["request_id"], json!("chunked-1"), "{answer}");
    let message = error["message"].as_str().expect("message");
    assert!(message.contains("1048576"), "{message}");
    assert_eq!(get_job(&app, &id).await, before, "the stored job changed");
}

#[tokio::test]
async fn unknown_job_ids_are_not_found() {
    let app = common::spawn_app().await;
    let id = Uuid::now_v7().to_string();
    let path = format!("/ojs/v1/jobs/{id}");
    let reply = get(&app, &path).await;
    let error = reply.expect_error(404, "not_found");
    assert!(error["hint"].is_string(), "hint: {}", reply.text);
    assert!(error["docs_url"].is_string(), "docs_url: {}", reply.text);
    request(&app, Method::DELETE, &path, None, &[])
        .await
        .expect_error(404, "not_found");
    post_json(&app, "/ojs/v1/workers/ack", &json!({"job_id": id}))
        .await
        .expect_error(404, "not_found");
    let nack = json!({"job_id": id, "error": {"message": "boom"}});
    post_json(&app, "/ojs/v1/workers/nack", &nack)
        .await
        .expect_error(404, "not_found");
}

#[tokio::test]
async fn non_uuid_job_id_is_rejected() {
    let app = common::spawn_app().await;
    get(&app, "/ojs/v1/jobs/not-a-uuid")
        .await
        .expect_error(400, "invalid_request");
}

#[tokio::test]
async fn fetch_limits_are_enforced() {
    let app = common::spawn_app().await;
    let many: Vec<String> = (0..65).map(|i| format!("q{i}")).collect();
    for body in [
        json!({"queues": []}),
        json!({"queues": many}),
        json!({"queues": ["default"], "count": 0}),
        json!({"queues": ["default"], "count": 101}),
        json!({"queues": ["default"], "wait_ms": 2001}),
    ] {
        let reply = post_json(&app, "/ojs/v1/workers/fetch", &body).await;
        let error = reply.expect_error(400, "invalid_request");
        assert!(error.is_object(), "{body}");
    }
}

#[tokio::test]
async fn fetching_an_unknown_queue_returns_nothing_and_creates_nothing() {
    let app = common::spawn_app().await;
    let reply = post_json(
        &app,
        "/ojs/v1/workers/fetch",
        &json!({"queues": ["ghost-queue"], "count": 5}),
    )
    .await;
    assert_eq!(reply.expect_ok(200)["jobs"], json!([]));
    let queues = get(&app, "/ojs/v1/queues").await;
    let list = queues.expect_ok(200)["queues"]
        .as_array()
        .expect("queues array");
    assert!(
        list.iter().all(|q| q["name"] != json!("ghost-queue")),
        "fetch created the queue: {}",
        queues.text
    );
}

#[tokio::test]
async fn stale_lease_token_is_refused_and_changes_nothing() {
    let app = common::spawn_app().await;
    let id = enqueue_ok(&app, &valid_job()).await["id"]
        .as_str()
        .expect("id")
        .to_string();
    let fetched = fetch_one(&app, "default").await;
    let token = fetched["lease_token"]
        .as_str()
        .expect("fetched job has a lease_token")
        .to_string();
    let other = Uuid::new_v4().to_string();
    assert_ne!(token, other);
    let ack = json!({"job_id": id, "lease_token": other, "result": {"ok": false}});
    post_json(&app, "/ojs/v1/workers/ack", &ack)
        .await
        .expect_error(409, "stale_lease");
    let job = get_job(&app, &id).await;
    assert_eq!(job["state"], json!("active"), "{job}");
    assert!(job["result"].is_null(), "{job}");
    let ack = json!({"job_id": id, "lease_token": token, "result": {"ok": true}});
    let reply = post_json(&app, "/ojs/v1/workers/ack", &ack).await;
    assert_eq!(reply.expect_ok(200)["state"], json!("completed"));
    let job = get_job(&app, &id).await;
    assert_eq!(job["state"], json!("completed"));
    assert_eq!(job["result"], json!({"ok": true}));
}

#[tokio::test]
async fn ack_of_an_available_job_is_a_conflict() {
    let app = common::spawn_app().await;
    let id = enqueue_ok(&app, &valid_job()).await["id"]
        .as_str()
        .expect("id")
        .to_string();
    post_json(&app, "/ojs/v1/workers/ack", &json!({"job_id": id}))
        .await
        .expect_error(409, "conflict");
    assert_eq!(get_job(&app, &id).await["state"], json!("available"));
}

#[tokio::test]
async fn cancel_of_a_completed_job_is_a_conflict() {
    let app = common::spawn_app().await;
    let id = enqueue_ok(&app, &valid_job()).await["id"]
        .as_str()
        .expect("id")
        .to_string();
    let fetched = fetch_one(&app, "default").await;
    let ack = json!({"job_id": id, "lease_token": fetched["lease_token"]});
    post_json(&app, "/ojs/v1/workers/ack", &ack)
        .await
        .expect_ok(200);
    request(
        &app,
        Method::DELETE,
        &format!("/ojs/v1/jobs/{id}"),
        None,
        &[],
    )
    .await
    .expect_error(409, "conflict");
    assert_eq!(get_job(&app, &id).await["state"], json!("completed"));
}

/// Enqueues to a queue that already exists take the queue's own statement: a duplicate id there
/// (twice in one batch, already in this queue, already in another) still refuses the whole
/// batch, stores nothing from it and leaves the stored job as it was.
#[tokio::test]
async fn duplicate_ids_refuse_a_batch_to_an_existing_queue_whole() {
    let app = common::spawn_app().await;
    let job = |id: &str, n: i64, queue: &str| json!({"id": id, "type": "a.b", "args": [n], "options": {"queue": queue}});
    let here = Uuid::now_v7().to_string();
    let elsewhere = Uuid::now_v7().to_string();
    enqueue_ok(&app, &job(&here, 1, "known")).await;
    enqueue_ok(&app, &job(&elsewhere, 1, "other")).await;
    for (what, clash) in [
        ("twice in the batch", None),
        ("stored in this queue", Some(here.clone())),
        ("stored in another queue", Some(elsewhere.clone())),
    ] {
        let new_id = Uuid::now_v7().to_string();
        let second = clash.unwrap_or_else(|| new_id.clone());
        let body = json!({"jobs": [job(&new_id, 2, "known"), job(&second, 3, "known")]});
        let reply = post_json(&app, "/ojs/v1/jobs/batch", &body).await;
        let error = reply.expect_error(409, "duplicate");
        assert!(error.to_string().contains(&second), "{what}: {error}");
        get(&app, &format!("/ojs/v1/jobs/{new_id}"))
            .await
            .expect_error(404, "not_found");
    }
    assert_enqueue_rejected(&app, job(&here, 4, "known"), 409, "duplicate").await;
    assert_eq!(get_job(&app, &here).await["args"], json!([1]));
    assert_eq!(get_job(&app, &elsewhere).await["queue"], json!("other"));
}

#[tokio::test]
async fn duplicate_caller_id_is_refused_in_any_queue() {
    let app = common::spawn_app().await;
    let id = Uuid::now_v7().to_string();
    let first = enqueue_ok(
        &app,
        &json!({"id": id, "type": "email.send", "args": [1], "options": {"queue": "first"}}),
    )
    .await;
    let stored = get_job(&app, &id).await;
    let second = json!({
        "id": id,
        "type": "report.build",
        "args": [2],
        "options": {"queue": "second", "priority": 7}
    });
    assert_enqueue_rejected(&app, second, 409, "duplicate").await;
    let after = get_job(&app, &id).await;
    assert_eq!(after, stored, "the first job changed");
    assert_eq!(after["queue"], json!("first"));
    assert_eq!(after["args"], json!([1]));
    assert_eq!(first["type"], after["type"]);
}

#[tokio::test]
async fn unsupported_ojs_version_is_refused() {
    let app = common::spawn_app().await;
    let reply = request(
        &app,
        Method::POST,
        "/ojs/v1/jobs",
        Some((OJS_MEDIA_TYPE, valid_job().to_string())),
        &[("ojs-version", "2.0")],
    )
    .await;
    reply.expect_error(422, "unsupported");
    // Nothing was enqueued.
    assert_nothing_ready(&app, "default").await;
}

#[tokio::test]
async fn every_response_carries_the_ojs_headers() {
    let app = common::spawn_app().await;
    // `request` asserts OJS-Version: 1.0 and the X-Request-Id echo on each of these.
    let client_id = "client-chosen-id-42";
    let reply = request(
        &app,
        Method::POST,
        "/ojs/v1/jobs",
        Some((OJS_MEDIA_TYPE, valid_job().to_string())),
        &[("X-Request-Id", client_id)],
    )
    .await;
    reply.expect_ok(201);
    assert_eq!(reply.header("x-request-id"), Some(client_id));
    assert_eq!(reply.header("content-type"), Some(OJS_MEDIA_TYPE));
    get(&app, "/ojs/manifest").await.expect_ok(200);
    get(&app, "/ojs/v1/health").await.expect_ok(200);
    get(&app, "/ojs/v1/queues").await.expect_ok(200);
    get(&app, "/ojs/v1/jobs/not-a-uuid")
        .await
        .expect_error(400, "invalid_request");
    post_raw(&app, "/ojs/v1/jobs", OJS_MEDIA_TYPE, "{".to_string())
        .await
        .expect_error(400, "invalid_payload");
    // Without a client id the server makes one up.
    let response = reqwest::Client::new()
        .get(format!("{}/ojs/v1/health", app.http_url))
        .send()
        .await
        .expect("send");
    let headers = response.headers();
    assert_eq!(
        headers.get("ojs-version").and_then(|v| v.to_str().ok()),
        Some("1.0")
    );
    let generated = headers
        .get("x-request-id")
        .and_then(|v| v.to_str().ok())
        .expect("a generated X-Request-Id");
    assert!(generated.starts_with("req_"), "{generated}");
}

#[tokio::test]
async fn unknown_route_is_not_found_in_the_envelope() {
    let app = common::spawn_app().await;
    let reply = get(&app, "/ojs/v1/no-such-thing").await;
    let error = reply.expect_error(404, "not_found");
    assert!(error["hint"].is_string() && error["docs_url"].is_string());
    post_json(&app, "/nowhere", &json!({}))
        .await
        .expect_error(404, "not_found");
}

// ---------------------------------------------------------------------------------------------
// The same failures over gRPC.

fn string_value(s: &str) -> prost_types::Value {
    prost_types::Value {
        kind: Some(prost_types::value::Kind::StringValue(s.to_string())),
    }
}

fn grpc_job(job_type: &str) -> pb::EnqueueRequest {
    pb::EnqueueRequest {
        r#type: job_type.to_string(),
        args: vec![string_value("a@example.com")],
        ..Default::default()
    }
}

/// Asserts the status code and its `google.rpc.ErrorInfo` (reason = OJS code).
fn assert_status(status: &tonic::Status, code: Code, reason: &str) {
    assert_eq!(status.code(), code, "status: {status:?}");
    let info = status
        .get_details_error_info()
        .unwrap_or_else(|| panic!("no ErrorInfo detail in {status:?}"));
    assert_eq!(info.reason, reason, "reason: {status:?}");
    assert_eq!(info.domain, "openjobspec.org");
    assert_eq!(
        info.metadata.get("retryable").map(String::as_str),
        Some("false"),
        "retryable: {info:?}"
    );
    assert!(
        info.metadata
            .get("request_id")
            .is_some_and(|id| !id.is_empty()),
        "request_id: {info:?}"
    );
}

#[tokio::test]
async fn grpc_bad_type_is_invalid_argument() {
    let app = common::spawn_app().await;
    let mut client = app.grpc().await;
    for job_type in ["Email.send", "1email", ""] {
        let status = client
            .enqueue(grpc_job(job_type))
            .await
            .expect_err("a bad type is refused");
        assert_status(&status, Code::InvalidArgument, "invalid_request");
    }
}

#[tokio::test]
async fn grpc_unknown_job_is_not_found() {
    let app = common::spawn_app().await;
    let mut client = app.grpc().await;
    let status = client
        .get_job(pb::GetJobRequest {
            job_id: Uuid::now_v7().to_string(),
        })
        .await
        .expect_err("unknown job");
    assert_status(&status, Code::NotFound, "not_found");
}

#[tokio::test]
async fn grpc_stale_lease_is_failed_precondition() {
    let app = common::spawn_app().await;
    let mut client = app.grpc().await;
    let job = client
        .enqueue(grpc_job("email.send"))
        .await
        .expect("enqueue")
        .into_inner()
        .job
        .expect("job");
    let fetched = client
        .fetch(pb::FetchRequest {
            queues: vec!["default".to_string()],
            count: 1,
            ..Default::default()
        })
        .await
        .expect("fetch")
        .into_inner()
        .jobs;
    assert_eq!(fetched.len(), 1);
    assert_eq!(fetched[0].id, job.id);
    assert!(!fetched[0].lease_token.is_empty(), "no lease token");
    let status = client
        .ack(pb::AckRequest {
            job_id: job.id.clone(),
            lease_token: Uuid::new_v4().to_string(),
            ..Default::default()
        })
        .await
        .expect_err("stale lease");
    assert_status(&status, Code::FailedPrecondition, "stale_lease");
    let current = client
        .get_job(pb::GetJobRequest {
            job_id: job.id.clone(),
        })
        .await
        .expect("get")
        .into_inner()
        .job
        .expect("job");
    assert_eq!(current.state, pb::JobState::Active as i32);
    client
        .ack(pb::AckRequest {
            job_id: job.id.clone(),
            lease_token: fetched[0].lease_token.clone(),
            ..Default::default()
        })
        .await
        .expect("ack with the right token");
}

#[tokio::test]
async fn grpc_duplicate_id_is_already_exists() {
    let app = common::spawn_app().await;
    let mut client = app.grpc().await;
    let id = Uuid::now_v7().to_string();
    let mut first = grpc_job("email.send");
    first.id = id.clone();
    client.enqueue(first).await.expect("first enqueue");
    let mut second = grpc_job("report.build");
    second.id = id.clone();
    second.options = Some(pb::EnqueueOptions {
        queue: "elsewhere".to_string(),
        ..Default::default()
    });
    let status = client.enqueue(second).await.expect_err("duplicate id");
    assert_status(&status, Code::AlreadyExists, "duplicate");
    let stored = client
        .get_job(pb::GetJobRequest { job_id: id })
        .await
        .expect("get")
        .into_inner()
        .job
        .expect("job");
    assert_eq!(stored.r#type, "email.send");
    assert_eq!(stored.queue, "default");
}

#[tokio::test]
async fn grpc_ack_of_an_available_job_is_a_conflict() {
    let app = common::spawn_app().await;
    let mut client = app.grpc().await;
    let job = client
        .enqueue(grpc_job("email.send"))
        .await
        .expect("enqueue")
        .into_inner()
        .job
        .expect("job");
    let status = client
        .ack(pb::AckRequest {
            job_id: job.id,
            ..Default::default()
        })
        .await
        .expect_err("ack of an available job");
    assert_status(&status, Code::FailedPrecondition, "conflict");
}

/// Lease lengths are bounded (1 ms .. 7 days) on enqueue, fetch and heartbeat over both
/// protocols: a larger one is refused with 400 / INVALID_ARGUMENT and nothing is stored, so a
/// lease end that does not fit a timestamp can never make the queue's claims fail.
#[tokio::test]
async fn lease_lengths_past_seven_days_are_refused_over_both_protocols() {
    const HUGE: i64 = 9_000_000_000_000_000_000;
    const JUST_OVER: i64 = 7 * 24 * 3600 * 1000 + 1;
    let app = common::spawn_app().await;
    for ms in [JUST_OVER, HUGE] {
        for field in ["visibility_timeout_ms", "timeout_ms"] {
            let body = json!({"type": "lease.job", "args": [],
                              "options": {"queue": "leases", field: ms}});
            let error = assert_enqueue_rejected(&app, body, 400, "invalid_request").await;
            assert_eq!(error["details"]["field"], field, "{error}");
        }
    }
    // The bound itself is accepted, and the queue's claims keep working.
    let job = enqueue_ok(
        &app,
        &json!({"type": "lease.job", "args": [],
                "options": {"queue": "leases", "visibility_timeout_ms": 7 * 24 * 3600 * 1000}}),
    )
    .await;
    for ms in [JUST_OVER, HUGE] {
        post_json(
            &app,
            "/ojs/v1/workers/fetch",
            &json!({"queues": ["leases"], "visibility_timeout_ms": ms}),
        )
        .await
        .expect_error(400, "invalid_request");
    }
    let claimed = fetch_one(&app, "leases").await;
    assert_eq!(claimed["id"], job["id"]);
    post_json(
        &app,
        "/ojs/v1/workers/heartbeat",
        &json!({"worker_id": "w", "job_id": claimed["id"], "visibility_timeout_ms": HUGE}),
    )
    .await
    .expect_error(400, "invalid_request");

    let mut client = app.grpc().await;
    let status = client
        .enqueue(pb::EnqueueRequest {
            options: Some(pb::EnqueueOptions {
                queue: "leases".into(),
                visibility_timeout_ms: HUGE,
                ..Default::default()
            }),
            ..grpc_job("lease.job")
        })
        .await
        .expect_err("a huge lease is refused");
    assert_status(&status, Code::InvalidArgument, "invalid_request");
    let status = client
        .fetch(pb::FetchRequest {
            queues: vec!["leases".to_string()],
            count: 1,
            visibility_timeout_ms: HUGE,
            ..Default::default()
        })
        .await
        .expect_err("a huge lease is refused");
    assert_status(&status, Code::InvalidArgument, "invalid_request");
    let status = client
        .heartbeat(pb::HeartbeatRequest {
            worker_id: "w".into(),
            job_ids: vec![claimed["id"].as_str().expect("id").to_string()],
            visibility_timeout_ms: HUGE,
            ..Default::default()
        })
        .await
        .expect_err("a huge lease is refused");
    assert_status(&status, Code::InvalidArgument, "invalid_request");
    // Nothing refused was stored: the one accepted job is the only one.
    let stats = get(&app, "/ojs/v1/queues/leases/stats")
        .await
        .expect_ok(200)
        .clone();
    assert_eq!(stats["queue"]["active"], 1, "{stats}");
    assert_eq!(stats["queue"]["available"], 0, "{stats}");
}

/// Durations and times past their bounds (10 years; a time chrono and PostgreSQL can hold) are
/// refused over both protocols, naming the field, and nothing is stored: queue retention, job
/// retention and takeover; relative scheduled_at / expires_at (and gRPC ttl / delay_until);
/// retry intervals and unique periods; stream nack retry_after and dead-letter purge older_than;
/// autovacuum settings PostgreSQL refuses; NUL characters in event filters and nack reasons.
/// Before, the config was stored and every maintenance pass then failed on that queue, and the
/// relative times panicked with no answer at all.
#[tokio::test]
async fn durations_and_times_past_their_bounds_are_refused_over_both_protocols() {
    use pgvs3::grpc::proto::pgvs3::v1 as s3;
    use sqlx::Connection;
    const HUGE: &str = "20000000d";
    let app = common::spawn_app_with(|s| s.maintenance_interval = None).await;
    let q = "bounds";
    enqueue_ok(
        &app,
        &json!({"type": "bound.job", "args": [], "options": {"queue": q}}),
    )
    .await;
    let config_path = format!("/ojs/v1/queues/{q}/config");
    let before = get(&app, &config_path).await.expect_ok(200).clone();
    for field in ["retention", "job_retention", "takeover"] {
        let error = post_json(&app, &config_path, &json!({ field: HUGE }))
            .await
            .expect_error(400, "invalid_request")
            .clone();
        assert_eq!(error["details"]["field"], field, "{error}");
    }
    post_json(
        &app,
        &config_path,
        &json!({"autovacuum": {"autovacuum_vacuum_scale_factor": 1e30}}),
    )
    .await
    .expect_error(400, "invalid_request");
    post_json(
        &app,
        &config_path,
        &json!({"autovacuum": {"fillfactor": 5}}),
    )
    .await
    .expect_error(400, "invalid_request");
    // A fraction PostgreSQL would round into range (or in effect ignore) is refused too.
    for fraction in [100.4, 9.9999999, 50.5] {
        post_json(
            &app,
            &config_path,
            &json!({"autovacuum": {"fillfactor": fraction}}),
        )
        .await
        .expect_error(400, "invalid_request");
    }
    assert_eq!(get(&app, &config_path).await.expect_ok(200), &before);
    // The largest accepted retention still leaves the queue maintainable.
    post_json(
        &app,
        &config_path,
        &json!({"retention": "3650d", "job_retention": "3650d"}),
    )
    .await
    .expect_ok(200);

    for field in ["scheduled_at", "expires_at"] {
        let body = json!({"type": "bound.job", "args": [],
                          "options": {"queue": q, field: "+P100000000D"}});
        let error = assert_enqueue_rejected(&app, body, 400, "invalid_request").await;
        assert_eq!(error["details"]["field"], field, "{error}");
    }
    let body = json!({"type": "bound.job", "args": [],
                      "options": {"queue": q, "retry": {"max_interval": "P100000000D"}}});
    // Retry policies are validated as OJS validation errors (422), like every retry field.
    assert_enqueue_rejected(&app, body, 422, "validation_error").await;
    let body = json!({"type": "bound.job", "args": [],
                      "options": {"queue": q, "unique": {"period": "P100000000D"}}});
    assert_enqueue_rejected(&app, body, 400, "invalid_request").await;

    // Streams: a nack's retry_after, a purge's older_than; NUL characters.
    post_json(
        &app,
        &format!("/ojs/v1/queues/{q}/consumers"),
        &json!({"consumer": "c"}),
    )
    .await
    .expect_ok(201);
    post_json(
        &app,
        &format!("/ojs/v1/queues/{q}/messages"),
        &json!({"type": "bound.event", "payload": {}}),
    )
    .await
    .expect_ok(201);
    let batch = post_json(
        &app,
        &format!("/ojs/v1/queues/{q}/receive"),
        &json!({"consumer": "c", "max": 10}),
    )
    .await
    .expect_ok(200)
    .clone();
    let batch_id = batch["batch_id"].as_str().expect("batch").to_string();
    let message_id = batch["events"][0]["id"]
        .as_str()
        .expect("event")
        .to_string();
    let nack = |extra: Value| {
        let mut body = json!({"queue": q, "batch_id": batch_id, "message_id": message_id});
        body.as_object_mut()
            .expect("object")
            .extend(extra.as_object().expect("object").clone());
        body
    };
    let error = post_json(
        &app,
        "/ojs/v1/streams/nack",
        &nack(json!({"retry_after": HUGE})),
    )
    .await
    .expect_error(400, "invalid_request")
    .clone();
    assert_eq!(error["details"]["field"], "retry_after", "{error}");
    let error = post_json(
        &app,
        "/ojs/v1/streams/nack",
        &nack(json!({"reason": "a\u{0}b"})),
    )
    .await
    .expect_error(400, "invalid_request")
    .clone();
    assert_eq!(error["details"]["field"], "reason", "{error}");
    // A payload is stored as the text sent: a NUL (escaped, in a value or a key) is refused
    // whole, while the six characters `\u0000` after an escaped backslash are not a NUL.
    for payload in [
        json!({"text": "a\u{0}b"}),
        json!([{"nested": ["\u{0}"]}]),
        json!({"k\u{0}ey": 1}),
    ] {
        let error = post_json(
            &app,
            &format!("/ojs/v1/queues/{q}/messages/batch"),
            &json!({"messages": [{"type": "bound.event", "payload": {}},
                                 {"type": "bound.event", "payload": payload}]}),
        )
        .await
        .expect_error(400, "invalid_request")
        .clone();
        assert_eq!(error["details"]["field"], "payload", "{error}");
    }
    // Text the server does not parse is checked as a parse would: a NUL hidden by a duplicate
    // key, a lone surrogate, a number past a double or past jsonb's exponents, nesting too deep.
    let deep = format!("{}1{}", "[".repeat(200), "]".repeat(200));
    for payload in [
        r#"{"a": "\u0000", "a": 1}"#,
        r#"{"a": {"k\u0000": 1}, "a": 1}"#,
        r#""\ud800""#,
        r#"{"\udc00": 1}"#,
        "1e400",
        "1e-16384",
        deep.as_str(),
    ] {
        let body = format!(
            r#"{{"messages": [{{"type": "bound.event", "payload": 1}},
                              {{"type": "bound.event", "payload": {payload}}}]}}"#
        );
        let error = post_raw(
            &app,
            &format!("/ojs/v1/queues/{q}/messages/batch"),
            "application/json",
            body,
        )
        .await
        .expect_error(400, "invalid_request")
        .clone();
        assert_eq!(error["details"]["field"], "payload", "{payload}: {error}");
    }
    let stored = post_raw(
        &app,
        &format!("/ojs/v1/queues/{q}/messages"),
        "application/json",
        r#"{"type": "bound.event", "payload": {"text": "a\\u0000b"}}"#.to_string(),
    )
    .await
    .expect_ok(201)
    .clone();
    let info = post_json(
        &app,
        &format!("/ojs/v1/queues/{q}/consumers"),
        &json!({"consumer": "nul_reader", "from_tick": 0}),
    )
    .await
    .expect_ok(201)
    .clone();
    assert!(info.is_object(), "{info}");
    let texts = post_json(
        &app,
        &format!("/ojs/v1/queues/{q}/receive"),
        &json!({"consumer": "nul_reader", "max": 100}),
    )
    .await
    .expect_ok(200)
    .clone();
    let events = texts["events"].as_array().expect("events");
    // Only the two accepted messages: the refused batches stored nothing.
    assert_eq!(events.len(), 2, "{texts}");
    assert_eq!(events[1]["id"], stored["id"], "{texts} {stored}");
    assert_eq!(
        events[1]["payload"],
        json!({"text": "a\\u0000b"}),
        "{texts}"
    );
    let error = request(
        &app,
        Method::DELETE,
        &format!("/ojs/v1/queues/{q}/dlq?older_than={HUGE}"),
        None,
        &[],
    )
    .await
    .expect_error(400, "invalid_request")
    .clone();
    assert_eq!(error["details"]["field"], "older_than", "{error}");
    for filter in ["types", "job_types"] {
        get(&app, &format!("/ojs/v1/events?{filter}=a%00b"))
            .await
            .expect_error(400, "invalid_request");
    }

    // gRPC: the same bounds through typed durations and times.
    let mut ojs = app.grpc().await;
    let huge = prost_types::Duration {
        seconds: i64::MAX,
        nanos: 0,
    };
    for options in [
        pb::EnqueueOptions {
            queue: q.into(),
            ttl: Some(huge),
            ..Default::default()
        },
        pb::EnqueueOptions {
            queue: q.into(),
            delay_until: Some(prost_types::Timestamp {
                seconds: i64::MAX,
                nanos: 0,
            }),
            ..Default::default()
        },
    ] {
        let status = ojs
            .enqueue(pb::EnqueueRequest {
                options: Some(options),
                ..grpc_job("bound.job")
            })
            .await
            .expect_err("an unrepresentable time is refused");
        assert_status(&status, Code::InvalidArgument, "invalid_request");
    }
    let channel = common::grpc::channel(&app.grpc_url).await;
    let mut admin = s3::admin_service_client::AdminServiceClient::new(channel.clone());
    let status = admin
        .set_queue_config(s3::SetQueueConfigRequest {
            queue: q.into(),
            retention: Some(HUGE.into()),
            ..Default::default()
        })
        .await
        .expect_err("a huge retention is refused");
    assert_status(&status, Code::InvalidArgument, "invalid_request");
    let status = admin
        .set_queue_config(s3::SetQueueConfigRequest {
            queue: q.into(),
            autovacuum: Some(prost_types::Struct {
                fields: [(
                    "fillfactor".to_string(),
                    prost_types::Value {
                        kind: Some(prost_types::value::Kind::NumberValue(100.4)),
                    },
                )]
                .into(),
            }),
            ..Default::default()
        })
        .await
        .expect_err("a fractional fillfactor is refused");
    assert_status(&status, Code::InvalidArgument, "invalid_request");
    let mut streams = s3::stream_service_client::StreamServiceClient::new(channel);
    let status = streams
        .nack(s3::NackRequest {
            queue: q.into(),
            batch_id: batch_id.clone(),
            message_id: message_id.clone(),
            retry_after: Some(HUGE.into()),
            ..Default::default()
        })
        .await
        .expect_err("a huge retry_after is refused");
    assert_status(&status, Code::InvalidArgument, "invalid_request");
    let status = streams
        .purge_dead_letters(s3::PurgeDeadLettersRequest {
            queue: q.into(),
            older_than: HUGE.into(),
        })
        .await
        .expect_err("a huge older_than is refused");
    assert_status(&status, Code::InvalidArgument, "invalid_request");

    // Nothing refused was stored, and the queue's maintenance still runs.
    let stats = get(&app, &format!("/ojs/v1/queues/{q}/stats"))
        .await
        .expect_ok(200)
        .clone();
    assert_eq!(stats["queue"]["available"], 1, "{stats}");
    post_json(
        &app,
        "/ojs/v1/streams/ack",
        &json!({"queue": q, "batch_id": batch_id}),
    )
    .await
    .expect_ok(200);
    let mut db = sqlx::PgConnection::connect(&app.database_url)
        .await
        .expect("connect");
    let ran: bool = sqlx::query_scalar("SELECT ran FROM s3p.maintain(86400000, 1000)")
        .fetch_one(&mut db)
        .await
        .expect("a maintenance pass over the queue");
    assert!(ran);
}

/// A heartbeat whose lease token is not the job's current lease answers 409 `stale_lease` /
/// FAILED_PRECONDITION (spec/ojs.md 0.1); the current token still extends the lease.
#[tokio::test]
async fn heartbeat_with_a_stale_lease_token_is_a_conflict_over_both_protocols() {
    let app = common::spawn_app().await;
    enqueue_ok(
        &app,
        &json!({"type": "beat.job", "args": [], "options": {"queue": "beats"}}),
    )
    .await;
    let claimed = fetch_one(&app, "beats").await;
    let id = claimed["id"].as_str().expect("id").to_string();
    let stale = Uuid::now_v7().to_string();
    let beat = |token: &str| json!({"worker_id": "w", "job_id": id, "lease_token": token});
    post_json(&app, "/ojs/v1/workers/heartbeat", &beat(&stale))
        .await
        .expect_error(409, "stale_lease");
    let mut client = app.grpc().await;
    let status = client
        .heartbeat(pb::HeartbeatRequest {
            worker_id: "w".into(),
            job_ids: vec![id.clone()],
            lease_token: stale.clone(),
            ..Default::default()
        })
        .await
        .expect_err("a stale token is refused");
    assert_status(&status, Code::FailedPrecondition, "stale_lease");
    assert_eq!(get_job(&app, &id).await["state"], "active");
    let token = claimed["lease_token"].as_str().expect("token");
    let extended = post_json(&app, "/ojs/v1/workers/heartbeat", &beat(token))
        .await
        .expect_ok(200)
        .clone();
    assert_eq!(
        extended["jobs_extended"].as_array().map(Vec::len),
        Some(1),
        "{extended}"
    );
}

/// A direct SQL caller may name a queue anything: a quote or a dollar sign in the name no longer
/// breaks the schema template (the schema gets a cleaned, hashed name), and the queue works.
#[tokio::test]
async fn queue_names_with_quotes_and_dollars_are_safe_from_sql() {
    use sqlx::Connection;
    let app = common::spawn_app().await;
    let mut db = sqlx::PgConnection::connect(&app.database_url)
        .await
        .expect("connect");
    for name in ["it's", "a$fn$b", "Ünï côdé"] {
        let schema: String = sqlx::query_scalar("SELECT s3p.ensure_queue_schema($1)")
            .bind(name)
            .fetch_one(&mut db)
            .await
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(
            schema
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || "._-".contains(c)),
            "{name} -> {schema}"
        );
        let appended: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM s3p.stream_append($1, '[{\"type\": \"x.y\", \"payload\": {}}]')",
        )
        .bind(name)
        .fetch_one(&mut db)
        .await
        .unwrap_or_else(|e| panic!("append to {name}: {e}"));
        assert_eq!(appended, 1);
        let config: Value = sqlx::query_scalar("SELECT s3p.queue_config($1, '{}')")
            .bind(name)
            .fetch_one(&mut db)
            .await
            .unwrap_or_else(|e| panic!("config of {name}: {e}"));
        assert_eq!(config["max_retries"], 5, "{config}");
    }
}

/// A field written twice in one object is ambiguous: 400 naming it, and nothing is stored.
#[tokio::test]
async fn a_field_written_twice_is_rejected_and_stores_nothing() {
    let app = common::spawn_app().await;
    for (body, field) in [
        (r#"{"type": "a.b", "type": "c.d", "args": []}"#, "type"),
        (
            r#"{"type": "a.b", "args": [], "options": {"queue": "twice", "queue": "other"}}"#,
            "options: duplicate field `queue`",
        ),
    ] {
        let reply = post_raw(&app, "/ojs/v1/jobs", "application/json", body.into()).await;
        let error = reply.expect_error(400, "invalid_request");
        assert!(
            error["message"]
                .as_str()
                .is_some_and(|m| m.contains("duplicate field") && m.contains(field)),
            "{body}: {error}"
        );
    }
    for queue in ["default", "twice", "other"] {
        assert_nothing_ready(&app, queue).await;
    }
}

/// Whether the text is JSON decides the code, whichever problem the decoder met first: text that
/// is not JSON is `invalid_payload` even when its object also lacks a field; JSON of the wrong
/// shape is `invalid_request`.
#[tokio::test]
async fn body_errors_are_classified_by_whether_the_text_is_json() {
    let app = common::spawn_app().await;
    for body in [
        "{} x",
        r#"{"type":5 garbage"#,
        r#"{"type":"a","type":"b" x"#,
    ] {
        let reply = post_raw(&app, "/ojs/v1/jobs", "application/json", body.into()).await;
        reply.expect_error(400, "invalid_payload");
        let reply = post_raw(
            &app,
            "/ojs/v1/workers/fetch",
            "application/json",
            body.into(),
        )
        .await;
        reply.expect_error(400, "invalid_payload");
    }
    let shapeless = r#"{"type":"t","args":[],"options":[null,null,null,null,7,"q",null,null,null,null,null,null,null,null,null,null,null,null,null,null,null,null,null]}"#;
    let reply = post_raw(&app, "/ojs/v1/jobs", "application/json", shapeless.into()).await;
    reply.expect_error(400, "invalid_request");
}

/// A body that stops arriving does not hold its connection and admission slot: 408 after
/// `BODY_READ_TIMEOUT`, and nothing is stored.
#[tokio::test]
async fn a_stalled_body_gets_408() {
    let app = common::spawn_app().await;
    let address = app.http_url.trim_start_matches("http://");
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let mut stream = tokio::net::TcpStream::connect(address)
        .await
        .expect("connect");
    let head = format!(
        "POST /ojs/v1/jobs HTTP/1.1\r\nhost: {address}\r\ncontent-type: application/json\r\n\
         content-length: 100\r\n\r\n{{\"type\":"
    );
    stream.write_all(head.as_bytes()).await.expect("send");
    let mut answer = vec![0u8; 4096];
    let read = tokio::time::timeout(
        pgvs3::contract::BODY_READ_TIMEOUT + std::time::Duration::from_secs(5),
        stream.read(&mut answer),
    )
    .await
    .expect("an answer before the timeout plus 5 s")
    .expect("read");
    let answer = String::from_utf8_lossy(&answer[..read]);
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(answer.contains("invalid_request"), "{answer}");
    assert_nothing_ready(&app, "default").await;
}

/// A gRPC message over the server's message limit (`--max-body-bytes`, 1 MiB here) is refused by
/// tonic with OUT_OF_RANGE (as the README says) before any handler runs: nothing is stored.
#[tokio::test]
async fn a_grpc_message_over_the_limit_is_out_of_range_and_stores_nothing() {
    use pgvs3::grpc::proto::pgvs3::v1 as s3;
    use sqlx::Connection;
    let app = common::spawn_app().await;
    let q = "grpcbig";
    let mut streams = common::grpc::streams(&app.grpc_url).await;
    let message = |text: String| s3::Message {
        r#type: "big".into(),
        payload: Some(prost_types::Value {
            kind: Some(prost_types::value::Kind::StringValue(text)),
        }),
        ..Default::default()
    };
    streams
        .append(s3::AppendRequest {
            queue: q.into(),
            messages: vec![message("small".into())],
        })
        .await
        .expect("a small append");
    let status = streams
        .append(s3::AppendRequest {
            queue: q.into(),
            messages: vec![message("x".repeat(1_100_000))],
        })
        .await
        .expect_err("a message over 1 MiB is refused");
    assert_eq!(status.code(), Code::OutOfRange, "{status:?}");
    let mut db = sqlx::PgConnection::connect(&app.database_url)
        .await
        .expect("connect");
    let schema: String =
        sqlx::query_scalar("SELECT quote_ident(schema_name) FROM s3p.queues WHERE name = $1")
            .bind(q)
            .fetch_one(&mut db)
            .await
            .expect("the queue");
    let stored: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT count(*) FROM {schema}.stream_events"
    )))
    .fetch_one(&mut db)
    .await
    .expect("count");
    assert_eq!(stored, 1);
}
