//! The OJS event log as server-sent events (`GET /ojs/v1/events` with
//! `Accept: text/event-stream`), each test on its own server and database (real PostgreSQL):
//! frames of a job's lifecycle in order, resuming after `Last-Event-ID`, errors as the OJS
//! envelope instead of a stream, no admission slot held while streaming, and the stream ending at
//! server shutdown.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{Value, json};

/// How long a test waits for the next frame before failing.
const FRAME_WAIT: Duration = Duration::from_secs(10);

/// The shared HTTP client, with this module's calls.
struct Api(common::http::Http);

impl std::ops::Deref for Api {
    type Target = common::http::Http;

    fn deref(&self) -> &common::http::Http {
        &self.0
    }
}

impl Api {
    fn new(base: &str) -> Api {
        // No overall timeout: event streams stay open; each read is bounded instead.
        Api(
            common::http::Http::with_client(base, reqwest::Client::new())
                .answering_within(FRAME_WAIT),
        )
    }

    async fn post(&self, path: &str, body: Value) -> Value {
        self.0.ok_post(path, body).await
    }

    async fn get(&self, path: &str) -> Value {
        self.get_200(path).await
    }

    /// Enqueues a job of type `sse.test` into `queue`; returns its id.
    async fn enqueue(&self, queue: &str) -> String {
        let answer = self
            .post(
                "/ojs/v1/jobs",
                json!({"type": "sse.test", "args": [1], "options": {"queue": queue}}),
            )
            .await;
        answer["job"]["id"].as_str().expect("job id").to_string()
    }

    /// Enqueues, fetches and acks one job of `queue`; returns its id.
    async fn run_one(&self, queue: &str) -> String {
        let id = self.enqueue(queue).await;
        let fetched = self
            .post(
                "/ojs/v1/workers/fetch",
                json!({"queues": [queue], "count": 1, "worker_id": "w1"}),
            )
            .await;
        assert_eq!(fetched["jobs"][0]["id"], id.as_str(), "{fetched}");
        let token = fetched["jobs"][0]["lease_token"].clone();
        self.post(
            "/ojs/v1/workers/ack",
            json!({"job_id": id, "lease_token": token, "result": {"ok": true}}),
        )
        .await;
        id
    }

    /// The cursors and events of the JSON page, one event per page, so every event's cursor
    /// is known.
    async fn cursors(&self, filter: &str) -> Vec<(String, Value)> {
        let mut after = String::new();
        let mut found = Vec::new();
        loop {
            let page = self
                .get(&format!("/ojs/v1/events?{filter}&limit=1&after={after}"))
                .await;
            let Some(event) = page["events"].get(0).cloned() else {
                return found;
            };
            after = page["cursor"].as_str().expect("cursor").to_string();
            found.push((after.clone(), event));
        }
    }

    /// Opens `GET /ojs/v1/events?{query}` asking for server-sent events.
    async fn open(&self, query: &str, headers: &[(&str, &str)]) -> reqwest::Response {
        let mut request = self
            .client
            .get(format!("{}/ojs/v1/events?{query}", self.base))
            .header("accept", "text/event-stream");
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        tokio::time::timeout(FRAME_WAIT, request.send())
            .await
            .expect("stream opened in time")
            .expect("open the stream")
    }

    async fn stream(&self, query: &str, headers: &[(&str, &str)]) -> Sse {
        let response = self.open(query, headers).await;
        assert_eq!(response.status(), StatusCode::OK);
        let content_type = response
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default();
        assert!(
            content_type.starts_with("text/event-stream"),
            "content type {content_type:?}"
        );
        Sse {
            response,
            buffer: String::new(),
        }
    }
}

/// One server-sent event frame.
#[derive(Debug, Default, Clone)]
struct Frame {
    id: Option<String>,
    event: Option<String>,
    data: String,
    comments: Vec<String>,
}

impl Frame {
    fn json(&self) -> Value {
        serde_json::from_str(&self.data).expect("frame data is JSON")
    }
}

/// A reader of a `text/event-stream` body.
struct Sse {
    response: reqwest::Response,
    buffer: String,
}

impl Sse {
    /// The next frame (comments included); `None` once the stream has ended.
    async fn frame(&mut self) -> Option<Frame> {
        loop {
            if let Some(end) = self.buffer.find("\n\n") {
                let text: String = self.buffer.drain(..end + 2).collect();
                let mut frame = Frame::default();
                for line in text.lines() {
                    let (field, value) = line.split_once(':').unwrap_or((line, ""));
                    let value = value.strip_prefix(' ').unwrap_or(value).to_string();
                    match field {
                        "" => frame.comments.push(value),
                        "id" => frame.id = Some(value),
                        "event" => frame.event = Some(value),
                        "data" => {
                            if !frame.data.is_empty() {
                                frame.data.push('\n');
                            }
                            frame.data.push_str(&value);
                        }
                        _ => {}
                    }
                }
                return Some(frame);
            }
            let chunk = tokio::time::timeout(FRAME_WAIT, self.response.chunk())
                .await
                .expect("a frame in time")
                .expect("read the stream")?;
            self.buffer
                .push_str(std::str::from_utf8(&chunk).expect("UTF-8 frames"));
        }
    }

    /// The next event frame (keepalive comments skipped).
    async fn event(&mut self) -> Frame {
        loop {
            let frame = self.frame().await.expect("the stream is still open");
            if frame.event.is_some() || !frame.data.is_empty() {
                return frame;
            }
        }
    }
}

/// A cursor as text (`txid-seq`) as the pair it orders by.
fn position(text: &str) -> (i64, i64) {
    text.split_once('-')
        .and_then(|(txid, seq)| Some((txid.parse().ok()?, seq.parse().ok()?)))
        .unwrap_or_else(|| panic!("{text:?} is not a txid-seq cursor"))
}

fn cursor(frame: &Frame) -> (i64, i64) {
    position(
        frame
            .id
            .as_deref()
            .unwrap_or_else(|| panic!("frame without an id: {frame:?}")),
    )
}

/// A job's lifecycle arrives as `job.enqueued`, `job.started`, `job.completed` frames, in order,
/// ids increasing, each carrying the same JSON object the polling page shows.
#[tokio::test]
async fn a_jobs_lifecycle_streams_as_frames_in_order() {
    // Reads the event log right after commits: not while conformance runs (common::db).
    let _log = common::db::reading_the_event_log_at_once().await;
    let app = common::spawn_app().await;
    let api = Api::new(&app.http_url);
    let mut stream = api.stream("queues=sse-a", &[]).await;

    let id = api.run_one("sse-a").await;
    let mut frames = Vec::new();
    while frames.len() < 3 {
        let frame = stream.event().await;
        assert_eq!(frame.json()["subject"], id.as_str(), "{frame:?}");
        frames.push(frame);
    }
    let types: Vec<&str> = frames.iter().filter_map(|f| f.event.as_deref()).collect();
    assert_eq!(types, ["job.enqueued", "job.started", "job.completed"]);
    let ids: Vec<(i64, i64)> = frames.iter().map(cursor).collect();
    assert!(ids.windows(2).all(|w| w[0] < w[1]), "ids increase: {ids:?}");
    for frame in &frames {
        let data = frame.json();
        assert_eq!(data["type"].as_str(), frame.event.as_deref());
        assert_eq!(data["data"]["job_id"], id.as_str());
        assert_eq!(data["data"]["queue"], "sse-a");
    }
    assert_eq!(frames[2].json()["data"]["result"], json!({"ok": true}));

    // The data is the polling route's event object, and the ids are its cursors.
    let polled = api.cursors("queues=sse-a").await;
    assert_eq!(polled.len(), 3, "{polled:?}");
    for (frame, (cursor, event)) in frames.iter().zip(&polled) {
        assert_eq!(frame.id.as_ref(), Some(cursor));
        assert_eq!(&frame.json(), event);
    }

    // Filters apply: a stream of another queue's events sees none of these.
    let mut other = api.stream("queues=sse-other&after=0", &[]).await;
    let later = api.enqueue("sse-other").await;
    let frame = other.event().await;
    assert_eq!(frame.json()["subject"], later.as_str(), "{frame:?}");
    // Closed first: the stop below is not about streams (shutdown_ends_the_stream is).
    drop((stream, other));
    app.stop().await;
}

/// `Last-Event-ID` resumes after that cursor; an explicit `after` wins over it; without either
/// the stream starts with what happens next.
#[tokio::test]
async fn last_event_id_resumes_after_its_cursor() {
    // Reads the event log right after commits: not while conformance runs (common::db).
    let _log = common::db::reading_the_event_log_at_once().await;
    let app = common::spawn_app().await;
    let api = Api::new(&app.http_url);
    let mut jobs = Vec::new();
    for _ in 0..3 {
        jobs.push(api.enqueue("sse-r").await);
    }
    let polled = api.cursors("queues=sse-r").await;
    assert_eq!(polled.len(), 3);

    let mut resumed = api
        .stream("queues=sse-r", &[("last-event-id", polled[0].0.as_str())])
        .await;
    for (cursor, event) in &polled[1..] {
        let frame = resumed.event().await;
        assert_eq!(frame.id.as_ref(), Some(cursor));
        assert_eq!(&frame.json(), event);
    }

    let mut explicit = api
        .stream(
            &format!("queues=sse-r&after={}", polled[1].0),
            &[("last-event-id", "0")],
        )
        .await;
    let frame = explicit.event().await;
    assert_eq!(frame.json()["subject"], jobs[2].as_str(), "{frame:?}");

    // No cursor: only what is logged from now on.
    let mut live = api.stream("queues=sse-r", &[]).await;
    let fourth = api.enqueue("sse-r").await;
    let frame = live.event().await;
    assert_eq!(frame.json()["subject"], fourth.as_str(), "{frame:?}");
    assert!(cursor(&frame) > position(&polled[2].0));
    // The resumed streams see it too, right after what they already had.
    assert_eq!(resumed.event().await.json()["subject"], fourth.as_str());
    assert_eq!(explicit.event().await.json()["subject"], fourth.as_str());
    drop((resumed, explicit, live));
    app.stop().await;
}

/// A bad cursor, filter or limit is answered with the OJS error envelope, not a stream; the JSON
/// page stays the default answer.
#[tokio::test]
async fn bad_requests_get_the_error_envelope_not_a_stream() {
    let app = common::spawn_app().await;
    let api = Api::new(&app.http_url);
    for (query, headers) in [
        ("queues=Not_A_Queue", vec![]),
        ("limit=0", vec![]),
        ("after=-3", vec![]),
        ("", vec![("last-event-id", "not-a-cursor")]),
    ] {
        let response = api.open(query, &headers).await;
        assert_eq!(
            response.status(),
            StatusCode::BAD_REQUEST,
            "{query} {headers:?}"
        );
        let content_type = response
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_string();
        assert_eq!(content_type, "application/openjobspec+json");
        let body: Value =
            serde_json::from_str(&response.text().await.expect("body")).expect("JSON");
        assert_eq!(body["error"]["code"], "invalid_request", "{body}");
        assert!(body["error"]["request_id"].is_string(), "{body}");
    }

    // Without text/event-stream in Accept (wildcards included) the answer is the JSON page.
    let response = api
        .client
        .get(format!("{}/ojs/v1/events", api.base))
        .header("accept", "*/*")
        .send()
        .await
        .expect("page");
    assert_eq!(response.status(), StatusCode::OK);
    let page: Value = serde_json::from_str(&response.text().await.expect("body")).expect("JSON");
    assert!(page["events"].is_array(), "{page}");
    app.stop().await;
}

/// An open stream gives its admission slot back: with one request in flight allowed, requests
/// still get through while a stream is open.
#[tokio::test]
async fn an_open_stream_holds_no_admission_slot() {
    let app = common::spawn_app_with(|s| s.max_in_flight = 1).await;
    let api = Api::new(&app.http_url);
    let mut stream = api.stream("queues=sse-adm", &[]).await;
    for _ in 0..3 {
        api.get("/ojs/v1/health").await;
    }
    let id = api.enqueue("sse-adm").await;
    assert_eq!(stream.event().await.json()["subject"], id.as_str());
    drop(stream);
    app.stop().await;
}

/// At shutdown the stream ends at once with a `stream.error` frame (`backend_unavailable`), so a
/// graceful shutdown does not wait for its client.
#[tokio::test]
async fn shutdown_ends_the_stream() {
    let (_database, url) = common::fresh_database().await;
    let store = pgvs3::store::Store::connect(&url, 4, 0, false)
        .await
        .expect("connect");
    store.migrate().await.expect("migrate");
    let service = Arc::new(pgvs3::core::Service::new(
        store,
        pgvs3::core::ServiceSettings::default(),
    ));
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let stack = common::bare_stack();
    let app = pgvs3::middleware::apply(
        pgvs3::http::router_until(service, &stack, stopped.clone()),
        stack.clone(),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let base = format!("http://{}", listener.local_addr().expect("address"));
    let mut wait = stopped;
    let server = tokio::spawn(async move {
        axum::serve(listener, app)
            .with_graceful_shutdown(async move {
                let _ = wait.wait_for(|s| *s).await;
            })
            .await
    });

    let api = Api::new(&base);
    let mut stream = api.stream("after=0", &[]).await;
    let id = api.enqueue("sse-stop").await;
    assert_eq!(stream.event().await.json()["subject"], id.as_str());

    stop.send(true).expect("signal shutdown");
    let last = stream.event().await;
    assert_eq!(last.event.as_deref(), Some("stream.error"), "{last:?}");
    assert_eq!(
        last.json()["error"]["code"],
        "backend_unavailable",
        "{last:?}"
    );
    assert!(stream.frame().await.is_none(), "the stream ended");
    tokio::time::timeout(Duration::from_secs(5), server)
        .await
        .expect("graceful shutdown did not wait for the stream")
        .expect("server task")
        .expect("server");
}

/// The event log never skips an event whose transaction commits late: while a transaction holds
/// an uncommitted event (an application writing inside its own transaction), a later event that
/// committed waits behind it, in the JSON pages and on a stream resumed with `Last-Event-ID`;
/// once it commits, both come, the late one first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_commit_is_delivered_not_skipped() {
    // Reads the event log right after commits: not while conformance runs (common::db).
    let _log = common::db::reading_the_event_log_at_once().await;
    use sqlx::Connection;
    let app = common::spawn_app().await;
    let api = Api::new(&app.http_url);
    api.enqueue("late-log").await;
    let before = api.cursors("queues=late-log").await;
    assert_eq!(before.len(), 1);
    let start = before[0].0.clone();

    let mut held = sqlx::PgConnection::connect(&app.database_url)
        .await
        .expect("connect");
    let mut tx = held.begin().await.expect("begin");
    sqlx::query(
        "INSERT INTO s3p.events (type, queue, job_type, state, attempt)
         VALUES ('job.held', 'late-log', 'sse.test', 'available', 0)",
    )
    .execute(&mut *tx)
    .await
    .expect("an event in an open transaction");
    let later = api.enqueue("late-log").await;

    let page = api
        .get(&format!("/ojs/v1/events?queues=late-log&after={start}"))
        .await;
    assert_eq!(
        page["events"],
        json!([]),
        "nothing passes the open writer: {page}"
    );
    assert_eq!(page["cursor"], start.as_str(), "the cursor stays: {page}");
    let mut resumed = api
        .stream("queues=late-log", &[("last-event-id", start.as_str())])
        .await;

    tx.commit().await.expect("commit the late writer");
    let page = api
        .get(&format!("/ojs/v1/events?queues=late-log&after={start}"))
        .await;
    let types: Vec<&str> = page["events"]
        .as_array()
        .expect("events")
        .iter()
        .filter_map(|e| e["type"].as_str())
        .collect();
    assert_eq!(types, ["job.held", "job.enqueued"], "{page}");
    assert_eq!(page["events"][1]["subject"], later.as_str());
    let first = resumed.event().await;
    assert_eq!(first.event.as_deref(), Some("job.held"), "{first:?}");
    let second = resumed.event().await;
    assert_eq!(second.json()["subject"], later.as_str(), "{second:?}");
    assert!(cursor(&first) < cursor(&second));
    drop(resumed);
    app.stop().await;
}

/// A page held short by a transaction in progress is judged "held" by its own horizon: when the
/// holder ends between the page and the check (the race a reader polling once met), the check
/// still names the transaction to wait past, and the next read returns the events. A check
/// against a new horizon would have called the short page whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_page_short_of_held_events_is_judged_by_its_own_horizon() {
    let _log = common::db::reading_the_event_log_at_once().await;
    use sqlx::Connection;
    let app = common::spawn_app().await;
    let api = Api::new(&app.http_url);
    api.enqueue("held-check").await;
    let start = api.cursors("queues=held-check").await[0].0.clone();
    let (txid, seq) = start.split_once('-').expect("cursor txid-seq");
    let (txid, seq): (i64, i64) = (txid.parse().expect("txid"), seq.parse().expect("seq"));

    // A transaction with an id and no event: it holds the horizon below the next enqueue.
    let mut holder = sqlx::PgConnection::connect(&app.database_url)
        .await
        .expect("connect");
    let mut tx = holder.begin().await.expect("begin");
    let holder_xid: i64 = sqlx::query_scalar("SELECT pg_current_xact_id()::text::bigint")
        .fetch_one(&mut *tx)
        .await
        .expect("an id for the holder");
    let later = api.enqueue("held-check").await;

    let mut reader = sqlx::PgConnection::connect(&app.database_url)
        .await
        .expect("connect");
    let page: Vec<(i64, Option<uuid::Uuid>)> = sqlx::query_as(
        "SELECT horizon, job_id FROM s3p.events_read($1, $2, NULL, ARRAY['held-check'], NULL, 100)",
    )
    .bind(txid)
    .bind(seq)
    .fetch_all(&mut reader)
    .await
    .expect("a page");
    assert_eq!(page.len(), 1, "one row for an empty page: {page:?}");
    let (horizon, event) = page[0];
    assert_eq!(event, None, "the enqueue waits behind the holder: {page:?}");
    assert!(
        horizon <= holder_xid,
        "the page stopped at the holder: {page:?}"
    );

    tx.commit().await.expect("the holder ends");
    let held: Option<i64> = sqlx::query_scalar("SELECT s3p.events_held_through($1, $2, $3)")
        .bind(txid)
        .bind(seq)
        .bind(horizon)
        .fetch_one(&mut reader)
        .await
        .expect("held check");
    let held = held.expect("past the page's horizon lies an event: read again");
    assert!(
        held > holder_xid,
        "the enqueue's transaction came after the holder's"
    );
    let page = api
        .get(&format!("/ojs/v1/events?queues=held-check&after={start}"))
        .await;
    assert_eq!(page["events"][0]["subject"], later.as_str(), "{page}");
    app.stop().await;
}

/// A read waits only for the events held back at its first look: once the transaction that held
/// them ends, it answers, although a later transaction still holds newer events back (under
/// steady writes there is always one, and waiting for all of them used up the 5 s budget).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_waits_for_what_was_held_not_for_what_arrives_meanwhile() {
    let _log = common::db::reading_the_event_log_at_once().await;
    use sqlx::Connection;
    let app = common::spawn_app().await;
    let api = Arc::new(Api::new(&app.http_url));
    api.enqueue("held-more").await;
    let start = api.cursors("queues=held-more").await[0].0.clone();

    let open = |url: String| async move {
        let mut conn = sqlx::PgConnection::connect(&url).await.expect("connect");
        sqlx::query("BEGIN")
            .execute(&mut conn)
            .await
            .expect("begin");
        sqlx::query("SELECT pg_current_xact_id()")
            .execute(&mut conn)
            .await
            .expect("an id for the holder");
        conn
    };
    let mut first_holder = open(app.database_url.clone()).await;
    let held = api.enqueue("held-more").await;
    let reader = tokio::spawn({
        let (api, start) = (Arc::clone(&api), start.clone());
        async move {
            api.get(&format!("/ojs/v1/events?queues=held-more&after={start}"))
                .await
        }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    // A second holder, with an event behind it, before the first ends.
    let mut second_holder = open(app.database_url.clone()).await;
    let newer = api.enqueue("held-more").await;
    sqlx::query("COMMIT")
        .execute(&mut first_holder)
        .await
        .expect("the first holder ends");
    // The second ends well after the reader should have answered, well before its 5 s budget.
    let second = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_secs(3)).await;
        sqlx::query("COMMIT")
            .execute(&mut second_holder)
            .await
            .expect("the second holder ends");
    });

    let page = reader.await.expect("reader");
    let subjects: Vec<&str> = page["events"]
        .as_array()
        .expect("events")
        .iter()
        .filter_map(|e| e["subject"].as_str())
        .collect();
    assert_eq!(
        subjects,
        [held.as_str()],
        "the held event, without waiting for the newer one ({newer}): {page}"
    );
    second.await.expect("second holder");
    let next = api
        .get(&format!(
            "/ojs/v1/events?queues=held-more&after={}",
            page["cursor"].as_str().expect("cursor")
        ))
        .await;
    assert_eq!(next["events"][0]["subject"], newer.as_str(), "{next}");
    app.stop().await;
}

/// Long-lived streams count against `max_streams` over both protocols: past it a new server-sent
/// event stream is 429 `rate_limited` and a gRPC server stream RESOURCE_EXHAUSTED; closing one
/// frees its place.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn open_streams_are_capped_over_both_protocols() {
    let app = common::spawn_app_with(|s| s.service.max_streams = 2).await;
    let api = Api::new(&app.http_url);
    let first = api.stream("queues=cap", &[]).await;
    let mut ojs = app.grpc().await;
    let second = ojs
        .stream_events(pgvs3::grpc::proto::ojs::v1::StreamEventsRequest::default())
        .await
        .expect("a second stream fits");
    let refused = api.open("queues=cap", &[]).await;
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    let body: Value = refused.json().await.expect("error envelope");
    assert_eq!(body["error"]["code"], "rate_limited", "{body}");
    let status = ojs
        .stream_events(pgvs3::grpc::proto::ojs::v1::StreamEventsRequest::default())
        .await
        .expect_err("a third stream is refused");
    assert_eq!(status.code(), tonic::Code::ResourceExhausted, "{status:?}");

    drop(first);
    // The server notices the closed connection on its next write (a keepalive at the latest);
    // the place is free once it has.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let again = api.open("queues=cap", &[]).await;
        if again.status() == StatusCode::OK {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the closed stream's place never freed"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    drop(second);
    app.stop().await;
}
