//! Revocation and the cost of token checks (`--auth on`), on real servers and PostgreSQL: a token
//! revoked through one gateway ends its open streams on another within a second (server-sent
//! events with a `stream.error` frame `unauthenticated`, the dashboard's live counts with an
//! `error` frame, gRPC `StreamJobs`, `StreamEvents` and `ReceiveStream` with UNAUTHENTICATED)
//! while another token's stream stays open; token lookups beyond their own limit are refused
//! with 429 `rate_limited` and `Retry-After` instead of queuing for the pool, while a known
//! token is served at once.

use crate::common;

use std::time::{Duration, Instant};

use common::tokens::create_token;
use futures_util::future::join_all;
use pgvs3::grpc::proto::ojs::v1 as pb;
use pgvs3::grpc::proto::pgvs3::v1 as spb;
use serde_json::Value;
use tonic::{Code, Streaming};

/// How long after its revocation a token's streams may still be open.
const BOUND: Duration = Duration::from_secs(1);
/// How long a test waits for something that should come.
const PATIENCE: Duration = Duration::from_secs(10);

/// `message` with the token as `authorization` metadata.
fn authed<T>(message: T, token: &str) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    request.metadata_mut().insert(
        "authorization",
        format!("Bearer {token}").parse().expect("metadata"),
    );
    request
}

/// Opens a server-sent-event stream at `url` with `token`.
async fn open_sse(client: &reqwest::Client, url: &str, token: &str) -> reqwest::Response {
    let response = tokio::time::timeout(
        PATIENCE,
        client
            .get(url)
            .header("accept", "text/event-stream")
            .bearer_auth(token)
            .send(),
    )
    .await
    .expect("stream opened in time")
    .expect("open the stream");
    assert_eq!(response.status(), 200, "{url}");
    response
}

/// Reads an event stream until it ends; the data of its last frame named `event`, or why not.
async fn last_frame(mut response: reqwest::Response, event: &str) -> Result<Value, String> {
    let mut text = String::new();
    while let Some(chunk) = response.chunk().await.map_err(|e| e.to_string())? {
        text.push_str(&String::from_utf8_lossy(&chunk));
    }
    let frame = text
        .split("\n\n")
        .filter(|frame| frame.lines().any(|line| line == format!("event: {event}")))
        .last()
        .ok_or_else(|| format!("the stream ended without an {event} frame: {text:?}"))?;
    let data: String = frame
        .lines()
        .filter_map(|line| line.strip_prefix("data: "))
        .collect();
    Ok(serde_json::from_str(&data).unwrap_or(Value::String(data)))
}

/// Reads a gRPC stream until it ends; its status.
async fn end_status<T>(mut stream: Streaming<T>) -> Result<tonic::Status, String> {
    loop {
        match stream.message().await {
            Ok(Some(_)) => continue,
            Ok(None) => return Err("the stream ended without an error".into()),
            Err(status) => return Ok(status),
        }
    }
}

/// Whether `ending` completes within `BOUND` of `since`; its output, or the time it took.
async fn within_bound<T>(
    since: Instant,
    what: &str,
    ending: impl Future<Output = T>,
) -> Result<T, String> {
    match tokio::time::timeout_at((since + BOUND).into(), ending).await {
        Ok(ended) => Ok(ended),
        Err(_) => Err(format!(
            "{what} is still open {:?} after the revocation",
            since.elapsed()
        )),
    }
}

/// A token revoked through one gateway ends every long-lived stream it opened on the other
/// within a second, each with an error its client can read; another token's stream stays open.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoked_tokens_streams_end_on_every_gateway_within_a_second() {
    let (database, url) = common::fresh_database().await;
    let first = common::spawn_app_on(&database, &url, |s| s.auth = true).await;
    let second = common::spawn_app_on(&database, &url, |s| s.auth = true).await;
    let admin = create_token(&url, "revoker", &["admin"], None);
    let doomed = create_token(&url, "doomed", &["reader", "worker"], None);
    let other = create_token(&url, "other", &["reader"], None);
    let client = reqwest::Client::new();
    let events_url = |app: &common::TestApp| format!("{}/ojs/v1/events", app.http_url);

    // Server-sent events on both gateways, the dashboard's live counts and the three gRPC
    // streams on the second.
    let sse_first = open_sse(&client, &events_url(&first), &doomed).await;
    let sse_second = open_sse(&client, &events_url(&second), &doomed).await;
    let mut live = open_sse(&client, &format!("{}/ui/live", second.http_url), &doomed).await;
    // The live counts read once at once, then every 2 s: the revocation comes right after.
    let counted = tokio::time::timeout(PATIENCE, live.chunk())
        .await
        .expect("the first counts in time")
        .expect("read the counts");
    assert!(counted.is_some(), "the live counts ended at once");
    let kept = open_sse(&client, &events_url(&second), &other).await;

    let mut ojs = second.grpc().await;
    let mut streams = common::grpc::streams(&second.grpc_url).await;
    streams
        .subscribe(authed(
            spb::SubscribeRequest {
                queue: "revoked-q".to_string(),
                consumer: "c1".to_string(),
                ..Default::default()
            },
            &doomed,
        ))
        .await
        .expect("subscribe");
    let jobs = ojs
        .stream_jobs(authed(
            pb::StreamJobsRequest {
                queues: vec!["revoked-q".to_string()],
                worker_id: "w".to_string(),
                max_concurrent: 1,
            },
            &doomed,
        ))
        .await
        .expect("stream jobs")
        .into_inner();
    let events = ojs
        .stream_events(authed(pb::StreamEventsRequest::default(), &doomed))
        .await
        .expect("stream events")
        .into_inner();
    let batches = streams
        .receive_stream(authed(
            spb::ReceiveStreamRequest {
                queue: "revoked-q".to_string(),
                consumer: "c1".to_string(),
                ..Default::default()
            },
            &doomed,
        ))
        .await
        .expect("receive stream")
        .into_inner();

    // Revoked through the first gateway's admin API.
    let revoked = client
        .delete(format!("{}/ojs/v1/admin/tokens/doomed", first.http_url))
        .bearer_auth(&admin)
        .send()
        .await
        .expect("revoke");
    assert_eq!(revoked.status(), 200, "{:?}", revoked.text().await);
    let at = Instant::now();

    let sse_ends = [sse_first, sse_second].map(|response| async move {
        let frame =
            within_bound(at, "an event stream", last_frame(response, "stream.error")).await??;
        match frame["error"]["code"].as_str() {
            Some("unauthenticated") => Ok(()),
            _ => Err(format!("ended with {frame}")),
        }
    });
    let live_ends = async {
        let frame = within_bound(at, "the live counts", last_frame(live, "error")).await??;
        match frame.as_str() {
            Some(message) if message.contains("revoked") => Ok(()),
            _ => Err(format!("the live counts ended with {frame}")),
        }
    };
    let (sse, live, jobs, events, batches) = tokio::join!(
        join_all(sse_ends),
        live_ends,
        within_bound(at, "StreamJobs", end_status(jobs)),
        within_bound(at, "StreamEvents", end_status(events)),
        within_bound(at, "ReceiveStream", end_status(batches)),
    );
    let mut failures: Vec<String> = sse.into_iter().filter_map(Result::err).collect();
    failures.extend(live.err());
    let grpc_ends = [
        ("StreamJobs", jobs),
        ("StreamEvents", events),
        ("ReceiveStream", batches),
    ];
    for (name, ended) in grpc_ends {
        match ended.and_then(|status| status) {
            Ok(status) if status.code() == Code::Unauthenticated => {}
            Ok(status) => failures.push(format!("{name} ended with {status:?}")),
            Err(why) => failures.push(format!("{name}: {why}")),
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");

    // The other token's stream is still open.
    let mut kept = kept;
    match tokio::time::timeout(Duration::from_millis(500), kept.chunk()).await {
        Err(_) => {}
        Ok(Ok(Some(chunk))) => assert!(
            !String::from_utf8_lossy(&chunk).contains("stream.error"),
            "{chunk:?}"
        ),
        Ok(other) => panic!("the other token's stream ended: {other:?}"),
    }
    second.stop().await;
    first.stop().await;
}

/// Token lookups have a limit of their own (a quarter of the pool: 2 here): a flood of made-up
/// tokens gets 401 or 429 `rate_limited` with `Retry-After`, never a wait for the pool, while
/// a known token's requests are answered at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_unknown_tokens_is_refused_while_a_known_token_is_served() {
    let app = common::spawn_app_with(|s| s.auth = true).await;
    let known = create_token(&app.database_url, "known", &["reader"], None);
    let client = reqwest::Client::new();
    let queues = format!("{}/ojs/v1/queues", app.http_url);
    let call = |token: String| {
        let client = client.clone();
        let queues = queues.clone();
        async move {
            let response =
                tokio::time::timeout(PATIENCE, client.get(&queues).bearer_auth(token).send())
                    .await
                    .expect("answered in time")
                    .expect("send");
            let status = response.status().as_u16();
            let retry_after = response.headers().get("retry-after").is_some();
            let body: Value = response.json().await.unwrap_or_default();
            let code = body["error"]["code"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            (status, code, retry_after)
        }
    };
    assert_eq!(call(known.clone()).await.0, 200);

    let flood =
        join_all((0..300).map(|_| call(format!("pgvs3_{}", uuid::Uuid::new_v4().simple()))));
    let served = async {
        // Started while the flood is in flight.
        tokio::time::sleep(Duration::from_millis(20)).await;
        let started = Instant::now();
        let answers = join_all((0..5).map(|_| call(known.clone()))).await;
        (answers, started.elapsed())
    };
    let (flooded, (answers, took)) = tokio::join!(flood, served);

    for answer in &answers {
        assert_eq!(answer.0, 200, "the known token: {answer:?}");
    }
    assert!(took < BOUND, "the known token waited {took:?}");
    let mut limited = 0;
    for answer in &flooded {
        match answer {
            (401, code, _) if code == "unauthenticated" => {}
            (429, code, true) if code == "rate_limited" => limited += 1,
            other => panic!("a made-up token got {other:?}"),
        }
    }
    assert!(
        limited > 0,
        "none of {} made-up tokens was refused 429",
        flooded.len()
    );
    app.stop().await;
}
