//! Several gateways on one database: two writable gateways and a read-only one share the data
//! (jobs cross gateways, the read-only one serves every read and refuses every mutation over both
//! protocols), one maintenance pass at a time, a dropped and re-created queue without a trace of
//! its first life, per-queue admission, and the queue administration RPCs.

use crate::common;

use common::codes::{error_code, grpc_code};
use common::wait::eventually;
use std::time::Duration;

use pgvs3::grpc::proto::ojs::v1 as pb;
use pgvs3::grpc::proto::pgvs3::v1 as s3;
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use sqlx::{Connection, PgConnection};
use tokio::time::Instant;
use tonic::transport::Channel;

use common::grpc::{Admin, Ojs, Streams};

// ---------------------------------------------------------------------------------------------
// Helpers

common::http::module_http!(
    /// The shared HTTP client of one gateway, with this module's calls.
    #[derive(Clone)]
);

impl Http {
    fn new(app: &common::TestApp) -> Self {
        Http(common::http::Http::new(app))
    }

    /// Enqueues one job (201 expected); returns its id.
    async fn enqueue(&self, queue: &str, kind: &str) -> String {
        let (status, answer) = self
            .post(
                "/ojs/v1/jobs",
                json!({"type": kind, "args": [1], "options": {"queue": queue}}),
            )
            .await;
        assert_eq!(status, StatusCode::CREATED, "enqueue: {answer}");
        answer["job"]["id"].as_str().expect("job id").to_string()
    }

    /// Fetches up to `count` jobs of `queue`.
    async fn fetch(&self, queue: &str, count: i64) -> Vec<Value> {
        let answer = self
            .ok_post(
                "/ojs/v1/workers/fetch",
                json!({"queues": [queue], "count": count}),
            )
            .await;
        answer["jobs"].as_array().expect("jobs").clone()
    }

    async fn state(&self, id: &str) -> String {
        let job = self.ok_get(&format!("/ojs/v1/jobs/{id}")).await;
        job["job"]["state"].as_str().expect("state").to_string()
    }

    async fn queue_names(&self) -> Vec<String> {
        let list = self.ok_get("/ojs/v1/queues").await;
        list["queues"]
            .as_array()
            .expect("queues")
            .iter()
            .map(|q| q["name"].as_str().expect("name").to_string())
            .collect()
    }
}

async fn channel(app: &common::TestApp) -> Channel {
    common::grpc::channel(&app.grpc_url).await
}

fn text(s: &str) -> prost_types::Value {
    prost_types::Value {
        kind: Some(prost_types::value::Kind::StringValue(s.into())),
    }
}

fn grpc_enqueue_request(queue: &str) -> pb::EnqueueRequest {
    pb::EnqueueRequest {
        r#type: "grpc.job".into(),
        args: vec![text("x")],
        options: Some(pb::EnqueueOptions {
            queue: queue.into(),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// Sends an empty message to any gRPC method (every proto3 message accepts zero bytes).
async fn grpc_raw(channel: &Channel, path: &'static str) -> Result<(), tonic::Status> {
    let mut grpc = tonic::client::Grpc::new(channel.clone());
    grpc.ready()
        .await
        .map_err(|e| tonic::Status::unavailable(e.to_string()))?;
    let codec = tonic_prost::ProstCodec::<(), ()>::default();
    grpc.unary(
        tonic::Request::new(()),
        http::uri::PathAndQuery::from_static(path),
        codec,
    )
    .await
    .map(|_| ())
}

/// `Enqueue` sent to the gRPC route with gRPC framing but `Content-Type: application/json`:
/// the HTTP status and the `grpc-status` (header or trailer).
async fn disguised_grpc_enqueue(channel: &Channel, queue: &str) -> (u16, Option<String>) {
    use http_body_util::BodyExt;
    use prost::Message;
    use tower::ServiceExt;
    let message = pb::EnqueueRequest {
        r#type: "disguised.job".into(),
        options: Some(pb::EnqueueOptions {
            queue: queue.into(),
            ..Default::default()
        }),
        ..Default::default()
    }
    .encode_to_vec();
    let mut framed = vec![0u8];
    framed.extend_from_slice(&(message.len() as u32).to_be_bytes());
    framed.extend_from_slice(&message);
    let request = http::Request::post("http://gateway/ojs.v1.OJSService/Enqueue")
        .header("content-type", "application/json")
        .header("te", "trailers")
        .body(tonic::body::Body::new(http_body_util::Full::new(
            bytes::Bytes::from(framed),
        )))
        .expect("request");
    let response = channel
        .clone()
        .oneshot(request)
        .await
        .expect("the disguised call is answered");
    let status = response.status().as_u16();
    let header = response
        .headers()
        .get("grpc-status")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let collected = response.into_body().collect().await.expect("body");
    let trailer = collected
        .trailers()
        .and_then(|t| t.get("grpc-status"))
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    (status, header.or(trailer))
}

async fn db(url: &str) -> PgConnection {
    PgConnection::connect(url)
        .await
        .expect("connect to the test database")
}

/// Three gateways on one fresh database: two writable (maintenance every 200 ms) and one read-only.
async fn three_gateways() -> (common::TestApp, common::TestApp, common::TestApp) {
    let (database, url) = common::fresh_database().await;
    let fast = |s: &mut pgvs3::server::ServerSettings| {
        s.maintenance_interval = Some(Duration::from_millis(200));
    };
    let a = common::spawn_app_on(&database, &url, fast).await;
    let b = common::spawn_app_on(&database, &url, fast).await;
    let read_only = common::spawn_app_on(&database, &url, |s| s.service.read_only = true).await;
    (a, b, read_only)
}

// ---------------------------------------------------------------------------------------------
// Two writable gateways and a read-only one

/// Jobs enqueued through one gateway are fetched and acked through another, over both protocols;
/// the read-only gateway sees all of it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_cross_gateways_on_one_database() {
    let (a, b, ro) = three_gateways().await;
    let (ha, hb, hro) = (Http::new(&a), Http::new(&b), Http::new(&ro));

    // HTTP: enqueue through A, fetch through B, ack one through B and one through A, nack one.
    let ids = [
        ha.enqueue("shared", "cross.one").await,
        ha.enqueue("shared", "cross.two").await,
        ha.enqueue("shared", "cross.three").await,
    ];
    let claimed = hb.fetch("shared", 10).await;
    let claimed_ids: Vec<&str> = claimed.iter().filter_map(|j| j["id"].as_str()).collect();
    assert_eq!(
        claimed_ids,
        ids.iter().map(String::as_str).collect::<Vec<_>>()
    );
    let token = |n: usize| claimed[n]["lease_token"].clone();
    hb.ok_post(
        "/ojs/v1/workers/ack",
        json!({"job_id": ids[0], "lease_token": token(0), "result": {"by": "b"}}),
    )
    .await;
    ha.ok_post(
        "/ojs/v1/workers/ack",
        json!({"job_id": ids[1], "lease_token": token(1), "result": {"by": "a"}}),
    )
    .await;
    hb.ok_post(
        "/ojs/v1/workers/nack",
        json!({"job_id": ids[2], "lease_token": token(2),
               "error": {"code": "boom", "message": "no"}, "requeue": true}),
    )
    .await;
    assert_eq!(hro.state(&ids[0]).await, "completed");
    assert_eq!(hro.state(&ids[1]).await, "completed");
    assert_eq!(hro.state(&ids[2]).await, "available");
    // The requeued job is claimable through the third writable path: A.
    let again = ha.fetch("shared", 10).await;
    assert_eq!(again.len(), 1);
    assert_eq!(again[0]["id"], ids[2].as_str());

    // gRPC: enqueue through B, fetch and ack through A, read through the read-only gateway.
    let mut ga = Ojs::new(channel(&a).await);
    let mut gb = Ojs::new(channel(&b).await);
    let mut gro = Ojs::new(channel(&ro).await);
    let job = gb
        .enqueue(grpc_enqueue_request("shared-grpc"))
        .await
        .expect("enqueue through B")
        .into_inner()
        .job
        .expect("job");
    let fetched = ga
        .fetch(pb::FetchRequest {
            queues: vec!["shared-grpc".into()],
            count: 5,
            ..Default::default()
        })
        .await
        .expect("fetch through A")
        .into_inner()
        .jobs;
    assert_eq!(fetched.len(), 1);
    assert_eq!(fetched[0].id, job.id);
    ga.ack(pb::AckRequest {
        job_id: job.id.clone(),
        lease_token: fetched[0].lease_token.clone(),
        ..Default::default()
    })
    .await
    .expect("ack through A");
    let seen = gro
        .get_job(pb::GetJobRequest {
            job_id: job.id.clone(),
        })
        .await
        .expect("read through the read-only gateway")
        .into_inner()
        .job
        .expect("job");
    assert_eq!(seen.state, pb::JobState::Completed as i32);
    assert_eq!(hro.state(&job.id).await, "completed");
}

/// The read-only gateway serves every read (job info, queue list and stats, manifest, health,
/// stream info, config, consumers, batches, DLQ) and refuses every mutation of both protocols
/// with 403 `read_only` / PERMISSION_DENIED, changing nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_only_gateway_serves_reads_and_refuses_every_mutation() {
    let (a, _b, ro) = three_gateways().await;
    let (ha, hro) = (Http::new(&a), Http::new(&ro));
    let q = "ro-queue";

    // Data to read: a completed job, a pending one, a stream with a consumer, a batch and a
    // dead letter.
    let done = ha.enqueue(q, "ro.done").await;
    let claimed = ha.fetch(q, 1).await;
    ha.ok_post(
        "/ojs/v1/workers/ack",
        json!({"job_id": done, "lease_token": claimed[0]["lease_token"]}),
    )
    .await;
    let waiting = ha.enqueue(q, "ro.waiting").await;
    ha.ok_post(
        &format!("/ojs/v1/queues/{q}/config"),
        json!({"max_retries": 0}),
    )
    .await;
    ha.ok_post(
        &format!("/ojs/v1/queues/{q}/consumers"),
        json!({"consumer": "c1", "from_tick": 0}),
    )
    .await;
    let appended = ha
        .ok_post(
            &format!("/ojs/v1/queues/{q}/messages/batch"),
            json!({"messages": [{"type": "e.one", "payload": 1}, {"type": "e.two", "payload": 2}]}),
        )
        .await;
    let first_message = appended["messages"][0]["id"]
        .as_str()
        .expect("id")
        .to_string();
    let batch = ha
        .ok_post(
            &format!("/ojs/v1/queues/{q}/receive"),
            json!({"consumer": "c1"}),
        )
        .await;
    let batch_id = batch["batch_id"].as_str().expect("batch").to_string();
    let nacked = ha
        .ok_post(
            "/ojs/v1/streams/nack",
            json!({"queue": q, "batch_id": batch_id, "message_id": first_message}),
        )
        .await;
    assert_eq!(nacked["outcome"], "dead_letter", "{nacked}");
    let letters = ha.ok_get(&format!("/ojs/v1/queues/{q}/dlq")).await;
    let letter = letters["dead_letters"][0]["id"]
        .as_str()
        .expect("dead letter")
        .to_string();

    // Reads over HTTP.
    assert_eq!(hro.state(&done).await, "completed");
    assert_eq!(hro.state(&waiting).await, "available");
    assert_eq!(hro.queue_names().await, vec![q.to_string()]);
    let stats = hro.ok_get(&format!("/ojs/v1/queues/{q}/stats")).await;
    assert_eq!(stats["queue"]["available"], 1, "{stats}");
    assert_eq!(stats["queue"]["completed"], 1, "{stats}");
    let manifest = hro.ok_get("/ojs/manifest").await;
    assert_eq!(manifest["backend"], "postgres");
    let health = hro.ok_get("/ojs/v1/health").await;
    assert_eq!(health["read_only"], true, "{health}");
    let info = hro.ok_get(&format!("/ojs/v1/queues/{q}/info")).await;
    assert_eq!(info["dead_letters"], 1, "{info}");
    let config = hro.ok_get(&format!("/ojs/v1/queues/{q}/config")).await;
    assert_eq!(config["max_retries"], 0, "{config}");
    let consumers = hro.ok_get(&format!("/ojs/v1/queues/{q}/consumers")).await;
    assert_eq!(consumers["consumers"][0]["consumer"], "c1", "{consumers}");
    let seen = hro
        .ok_get(&format!("/ojs/v1/queues/{q}/batches/{batch_id}"))
        .await;
    assert_eq!(seen["batch_id"], batch_id.as_str());
    let dlq = hro.ok_get(&format!("/ojs/v1/queues/{q}/dlq")).await;
    assert_eq!(dlq["dead_letters"].as_array().map(Vec::len), Some(1));
    hro.ok_get("/ojs/v1/dead-letter").await;

    // Reads over gRPC.
    let ch = channel(&ro).await;
    let mut ojs = Ojs::new(ch.clone());
    let mut streams = Streams::new(ch.clone());
    let mut admin = Admin::new(ch.clone());
    ojs.manifest(pb::ManifestRequest {})
        .await
        .expect("manifest");
    ojs.health(pb::HealthRequest {}).await.expect("health");
    ojs.get_job(pb::GetJobRequest {
        job_id: done.clone(),
    })
    .await
    .expect("get job");
    let listed = ojs
        .list_queues(pb::ListQueuesRequest::default())
        .await
        .expect("list queues")
        .into_inner();
    assert_eq!(listed.queues.len(), 1);
    let stats = ojs
        .queue_stats(pb::QueueStatsRequest { queue: q.into() })
        .await
        .expect("queue stats")
        .into_inner()
        .stats
        .expect("stats");
    assert_eq!(stats.available, 1);
    ojs.list_dead_letter(pb::ListDeadLetterRequest::default())
        .await
        .expect("list dead letters");
    streams
        .info(s3::InfoRequest { queue: q.into() })
        .await
        .expect("stream info");
    streams
        .get_config(s3::GetConfigRequest { queue: q.into() })
        .await
        .expect("stream config");
    let listed = streams
        .list_consumers(s3::ListConsumersRequest {
            queue: q.into(),
            ..Default::default()
        })
        .await
        .expect("consumers")
        .into_inner();
    assert_eq!(listed.consumers.len(), 1);
    streams
        .get_batch(s3::GetBatchRequest {
            queue: q.into(),
            batch_id: batch_id.clone(),
        })
        .await
        .expect("batch");
    streams
        .list_dead_letters(s3::ListDeadLettersRequest {
            queue: q.into(),
            ..Default::default()
        })
        .await
        .expect("stream dead letters");
    admin
        .get_queue_config(s3::GetQueueConfigRequest { queue: q.into() })
        .await
        .expect("queue config");

    // Every mutation named by the issue, over HTTP, with real bodies.
    let job_body = json!({"type": "ro.no", "args": [], "options": {"queue": q}});
    let http_mutations: Vec<(Method, String, Option<Value>)> = vec![
        (Method::POST, "/ojs/v1/jobs".into(), Some(job_body.clone())),
        (
            Method::POST,
            "/ojs/v1/jobs/batch".into(),
            Some(json!({"jobs": [job_body]})),
        ),
        (
            Method::POST,
            "/ojs/v1/workers/fetch".into(),
            Some(json!({"queues": [q]})),
        ),
        (
            Method::POST,
            "/ojs/v1/workers/ack".into(),
            Some(json!({"job_id": waiting})),
        ),
        (
            Method::POST,
            "/ojs/v1/workers/nack".into(),
            Some(json!({"job_id": waiting, "error": {"message": "x"}})),
        ),
        (Method::DELETE, format!("/ojs/v1/jobs/{waiting}"), None),
        (
            Method::POST,
            format!("/ojs/v1/queues/{q}/messages"),
            Some(json!({"type": "e", "payload": 1})),
        ),
        (
            Method::POST,
            format!("/ojs/v1/queues/{q}/consumers"),
            Some(json!({"consumer": "c2"})),
        ),
        (
            Method::DELETE,
            format!("/ojs/v1/queues/{q}/consumers/c1"),
            None,
        ),
        (
            Method::POST,
            format!("/ojs/v1/queues/{q}/receive"),
            Some(json!({"consumer": "c1"})),
        ),
        (
            Method::POST,
            "/ojs/v1/streams/ack".into(),
            Some(json!({"queue": q, "batch_id": batch_id})),
        ),
        (
            Method::POST,
            "/ojs/v1/streams/nack".into(),
            Some(json!({"queue": q, "batch_id": batch_id, "message_id": first_message})),
        ),
        (
            Method::POST,
            format!("/ojs/v1/queues/{q}/dlq/{letter}/replay"),
            Some(json!({})),
        ),
        (
            Method::POST,
            format!("/ojs/v1/queues/{q}/dlq/replay"),
            Some(json!({})),
        ),
        (
            Method::DELETE,
            format!("/ojs/v1/queues/{q}/dlq?older_than=1s"),
            None,
        ),
        (
            Method::POST,
            "/ojs/v1/queues".into(),
            Some(json!({"name": "ro-new"})),
        ),
        (Method::DELETE, format!("/ojs/v1/queues/{q}"), None),
        (
            Method::POST,
            format!("/ojs/v1/queues/{q}/pause"),
            Some(json!({})),
        ),
        (
            Method::POST,
            format!("/ojs/v1/queues/{q}/resume"),
            Some(json!({})),
        ),
        (
            Method::POST,
            format!("/ojs/v1/queues/{q}/config"),
            Some(json!({"max_retries": 5})),
        ),
    ];
    for (method, path, body) in http_mutations {
        let (status, answer) = hro.send(method.clone(), &path, body).await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{method} {path}: {answer}");
        assert_eq!(
            error_code(&answer),
            "read_only",
            "{method} {path}: {answer}"
        );
    }

    // And every mutation of the generated operation table, whatever it grows to.
    for op in pgvs3::http::api::HTTP_OPERATIONS {
        // Path parameters: the queue, a consumer, else an id.
        let path = op
            .path
            .split('/')
            .map(|segment| match segment {
                "{q}" => q,
                "{consumer}" => "c1",
                s if s.starts_with('{') => done.as_str(),
                s => s,
            })
            .collect::<Vec<_>>()
            .join("/");
        let method = Method::from_bytes(op.method.as_bytes()).expect("method");
        let body = (method != Method::GET && method != Method::DELETE).then(|| json!({}));
        let (status, answer) = hro.send(method, &path, body).await;
        if op.read_only {
            assert_ne!(
                status,
                StatusCode::FORBIDDEN,
                "{} is a read: {answer}",
                op.id
            );
        } else {
            assert_eq!(status, StatusCode::FORBIDDEN, "{}: {answer}", op.id);
            assert_eq!(error_code(&answer), "read_only", "{}: {answer}", op.id);
        }
    }

    // The named gRPC mutations, with real messages.
    let denied = |result: Result<(), tonic::Status>, what: &str| {
        let status = result.expect_err(what);
        assert_eq!(
            status.code(),
            tonic::Code::PermissionDenied,
            "{what}: {status:?}"
        );
        assert_eq!(grpc_code(&status), "read_only", "{what}");
    };
    denied(
        ojs.enqueue(grpc_enqueue_request(q)).await.map(drop),
        "Enqueue",
    );
    denied(
        ojs.fetch(pb::FetchRequest {
            queues: vec![q.into()],
            ..Default::default()
        })
        .await
        .map(drop),
        "Fetch",
    );
    denied(
        ojs.ack(pb::AckRequest {
            job_id: waiting.clone(),
            ..Default::default()
        })
        .await
        .map(drop),
        "Ack",
    );
    denied(
        ojs.nack(pb::NackRequest {
            job_id: waiting.clone(),
            ..Default::default()
        })
        .await
        .map(drop),
        "Nack",
    );
    denied(
        ojs.cancel_job(pb::CancelJobRequest {
            job_id: waiting.clone(),
            ..Default::default()
        })
        .await
        .map(drop),
        "CancelJob",
    );
    denied(
        ojs.pause_queue(pb::PauseQueueRequest { queue: q.into() })
            .await
            .map(drop),
        "PauseQueue",
    );
    denied(
        ojs.resume_queue(pb::ResumeQueueRequest { queue: q.into() })
            .await
            .map(drop),
        "ResumeQueue",
    );
    denied(
        streams
            .append(s3::AppendRequest {
                queue: q.into(),
                messages: vec![s3::Message {
                    r#type: "e".into(),
                    ..Default::default()
                }],
            })
            .await
            .map(drop),
        "Append",
    );
    denied(
        streams
            .subscribe(s3::SubscribeRequest {
                queue: q.into(),
                consumer: "c3".into(),
                ..Default::default()
            })
            .await
            .map(drop),
        "Subscribe",
    );
    denied(
        streams
            .receive(s3::ReceiveRequest {
                queue: q.into(),
                consumer: "c1".into(),
                ..Default::default()
            })
            .await
            .map(drop),
        "Receive",
    );
    denied(
        streams
            .ack(s3::AckRequest {
                queue: q.into(),
                batch_id: batch_id.clone(),
                ..Default::default()
            })
            .await
            .map(drop),
        "stream Ack",
    );
    denied(
        streams
            .nack(s3::NackRequest {
                queue: q.into(),
                batch_id: batch_id.clone(),
                message_id: first_message.clone(),
                ..Default::default()
            })
            .await
            .map(drop),
        "stream Nack",
    );
    denied(
        streams
            .replay_dead_letter(s3::ReplayDeadLetterRequest {
                queue: q.into(),
                id: letter.clone(),
            })
            .await
            .map(drop),
        "ReplayDeadLetter",
    );
    denied(
        streams
            .purge_dead_letters(s3::PurgeDeadLettersRequest {
                queue: q.into(),
                older_than: "1s".into(),
            })
            .await
            .map(drop),
        "PurgeDeadLetters",
    );
    denied(
        admin
            .create_queue(s3::CreateQueueRequest {
                queue: "ro-new".into(),
            })
            .await
            .map(drop),
        "CreateQueue",
    );
    denied(
        admin
            .drop_queue(s3::DropQueueRequest { queue: q.into() })
            .await
            .map(drop),
        "DropQueue",
    );
    denied(
        admin
            .adopt_queue(s3::AdoptQueueRequest { queue: q.into() })
            .await
            .map(drop),
        "AdoptQueue",
    );
    denied(
        admin
            .set_queue_config(s3::SetQueueConfigRequest {
                queue: q.into(),
                max_retries: Some(5),
                ..Default::default()
            })
            .await
            .map(drop),
        "SetQueueConfig",
    );

    // And every gRPC method the proto tables call a mutation; reads are never refused.
    for op in pgvs3::grpc::GRPC_OPERATIONS {
        // A server-streaming read (StreamEvents) answers by streaming and never ends: a read that
        // is still answering after two seconds was not refused.
        let Ok(result) =
            tokio::time::timeout(std::time::Duration::from_secs(2), grpc_raw(&ch, op.path)).await
        else {
            assert!(op.read_only, "{} did not answer", op.path);
            continue;
        };
        if op.read_only {
            if let Err(status) = &result {
                assert_ne!(
                    status.code(),
                    tonic::Code::PermissionDenied,
                    "{} is a read: {status:?}",
                    op.path
                );
            }
        } else {
            let status = result.expect_err(op.path);
            assert_eq!(
                status.code(),
                tonic::Code::PermissionDenied,
                "{}: {status:?}",
                op.path
            );
            assert_eq!(grpc_code(&status), "read_only", "{}", op.path);
        }
    }

    // A gRPC mutation in disguise: the gRPC route and framing with another content type. The
    // gate classifies by route, so it is refused like any gRPC mutation.
    let (status, grpc_status) = disguised_grpc_enqueue(&ch, q).await;
    assert_eq!(status, 200, "gRPC errors travel in a 200 with grpc-status");
    assert_eq!(grpc_status.as_deref(), Some("7"), "PERMISSION_DENIED");

    // Nothing changed.
    assert_eq!(ha.state(&waiting).await, "available");
    assert_eq!(ha.queue_names().await, vec![q.to_string()]);
    let after = ha.ok_get(&format!("/ojs/v1/queues/{q}/stats")).await;
    assert_eq!(after["queue"]["paused"], false);
    assert_eq!(after["queue"]["available"], 1);
    let info = ha.ok_get(&format!("/ojs/v1/queues/{q}/info")).await;
    assert_eq!(
        (&info["events"], &info["consumers"]),
        (&json!(2), &json!(1))
    );
    assert_eq!(info["dead_letters"], 1);
    let config = ha.ok_get(&format!("/ojs/v1/queues/{q}/config")).await;
    assert_eq!(config["max_retries"], 0);
}

// ---------------------------------------------------------------------------------------------
// One maintenance pass at a time

/// While one pass holds the maintenance lock inside an open transaction, every other pass (another
/// SQL session, and both gateways' own timers) is skipped at once rather than run or queued.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exactly_one_maintenance_pass_runs_at_a_time() {
    let (a, b, _ro) = three_gateways().await;
    let url = a.database_url.clone();
    let mut first = db(&url).await;
    let mut second = db(&url).await;
    let pass = "SELECT ran FROM s3p.maintain(86400000, 1000)";

    // Take a pass inside a transaction; a gateway's own pass may hold it for a moment.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        sqlx::raw_sql("BEGIN")
            .execute(&mut first)
            .await
            .expect("begin");
        let ran: bool = sqlx::query_scalar(pass)
            .fetch_one(&mut first)
            .await
            .expect("first pass");
        if ran {
            break;
        }
        sqlx::raw_sql("ROLLBACK")
            .execute(&mut first)
            .await
            .expect("rollback");
        assert!(Instant::now() < deadline, "never got the maintenance lock");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let first_pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(&mut first)
        .await
        .expect("pid");

    // Held: the other session is skipped at once, again and again, without waiting.
    for _ in 0..5 {
        let started = Instant::now();
        let ran: bool = sqlx::query_scalar(pass)
            .fetch_one(&mut second)
            .await
            .expect("second pass");
        assert!(!ran, "a second pass ran while the first was open");
        assert!(started.elapsed() < Duration::from_secs(2), "it waited");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The one holder of the advisory lock is the first session, although both gateways keep
    // trying every 200 ms; they keep serving meanwhile.
    let holders: Vec<i32> = sqlx::query_scalar(
        "SELECT pid FROM pg_locks
          WHERE locktype = 'advisory' AND granted AND objsubid = 1
            AND objid = (hashtext('s3p.maintain')::bigint & 4294967295)::oid
            -- Tests in parallel run gateways on other databases of the same cluster.
            AND database = (SELECT oid FROM pg_database WHERE datname = current_database())",
    )
    .fetch_all(&mut second)
    .await
    .expect("pg_locks");
    assert_eq!(holders, vec![first_pid]);
    let (status, _) = Http::new(&b).get("/ojs/v1/health").await;
    assert_eq!(status, StatusCode::OK);

    // Released at commit: the next pass runs (one of the gateways may get there first).
    sqlx::raw_sql("COMMIT")
        .execute(&mut first)
        .await
        .expect("commit");
    eventually(Duration::from_secs(5), "a pass runs again", async || {
        sqlx::query_scalar::<_, bool>(pass)
            .fetch_one(&mut second)
            .await
            .expect("pass")
    })
    .await;
}

// ---------------------------------------------------------------------------------------------
// Drop and re-create

/// A gateway's cached routes (queue → schema, job → queue) stay right when another gateway drops
/// the queue and creates it again: a fetch finds the new life's jobs (and nothing once it is gone),
/// an ack of a first-life job is not found, and an ack at a gateway that did not hand out the lease
/// completes the job.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn routes_cached_by_one_gateway_follow_another_gateways_drop_and_create() {
    let (database, url) = common::fresh_database().await;
    let a = common::spawn_app_on(&database, &url, |_| {}).await;
    let b = common::spawn_app_on(&database, &url, |_| {}).await;
    let (ha, hb) = (Http::new(&a), Http::new(&b));
    let q = "rebirth";

    // A claims through its prepared statements and remembers the job's queue.
    let first = ha.enqueue(q, "life.one").await;
    ha.enqueue(q, "life.one.more").await;
    let claimed = ha.fetch(q, 1).await;
    assert_eq!(claimed[0]["id"], first.as_str());
    let first_lease = claimed[0]["lease_token"].clone();

    // B drops the queue: A's next fetch finds nothing, and A's ack of the first life's job finds
    // no job.
    let (status, answer) = hb.delete(&format!("/ojs/v1/queues/{q}")).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    assert!(
        ha.fetch(q, 5).await.is_empty(),
        "a dropped queue has no work"
    );
    let (status, answer) = ha
        .post(
            "/ojs/v1/workers/ack",
            json!({"job_id": first, "lease_token": first_lease}),
        )
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{answer}");
    assert_eq!(answer["error"]["code"], "not_found");

    // B creates it again by enqueueing: A fetches the second life's job through the same
    // statement names, and B completes what A claimed.
    let second = hb.enqueue(q, "life.two").await;
    let claimed = ha.fetch(q, 5).await;
    let ids: Vec<&str> = claimed.iter().filter_map(|j| j["id"].as_str()).collect();
    assert_eq!(ids, vec![second.as_str()], "only the second life's job");
    let acked = hb
        .ok_post(
            "/ojs/v1/workers/ack",
            json!({"job_id": second, "lease_token": claimed[0]["lease_token"]}),
        )
        .await;
    assert_eq!(acked["state"], "completed", "{acked}");
    assert_eq!(ha.state(&second).await, "completed");
    a.stop().await;
    b.stop().await;
}

/// Reads of a queue and its jobs (a job by id, queue stats, queue config, the admin queue and
/// job listing) that wait on the queue being dropped answer as if they came after the drop: 404,
/// or an empty listing; never a backend error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_waiting_on_a_dropping_queue_answer_after_it() {
    let app = common::spawn_app().await;
    let http = Http::new(&app);
    let q = "dropping-reads";
    let id = http.enqueue(q, "drop.read").await;

    let commit = common::db::hold_drop(&app.database_url, q).await;
    let paths = [
        format!("/ojs/v1/jobs/{id}"),
        format!("/ojs/v1/queues/{q}/stats"),
        format!("/ojs/v1/queues/{q}/config"),
        format!("/ojs/v1/admin/queues/{q}"),
        format!("/ojs/v1/admin/jobs?queue={q}"),
        "/ojs/v1/admin/queues".to_string(),
        "/ojs/v1/admin/dead-letter/stats".to_string(),
    ];
    let (job, stats, config, admin_queue, admin_jobs, queues, dead_letters, ()) = tokio::join!(
        http.get(&paths[0]),
        http.get(&paths[1]),
        http.get(&paths[2]),
        http.get(&paths[3]),
        http.get(&paths[4]),
        http.get(&paths[5]),
        http.get(&paths[6]),
        commit
    );
    // Listings leave the dropped queue out instead of failing whole.
    for (route, (status, body)) in [("queues", &queues), ("dead-letter stats", &dead_letters)] {
        assert_eq!(*status, StatusCode::OK, "{route}: {body}");
        assert!(!body.to_string().contains(q), "{route}: {body}");
    }
    for (route, (status, body)) in [
        ("job", &job),
        ("stats", &stats),
        ("config", &config),
        ("admin queue", &admin_queue),
    ] {
        assert_eq!(*status, StatusCode::NOT_FOUND, "{route}: {body}");
        assert_eq!(error_code(body), "not_found", "{route}: {body}");
    }
    let (status, body) = admin_jobs;
    assert_eq!(status, StatusCode::OK, "admin jobs: {body}");
    assert_eq!(body["items"], json!([]), "admin jobs: {body}");
}

/// A queue created, filled (jobs in several states, stream events, consumers, a dead letter,
/// config, pause), dropped and re-created has no trace of its first life.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_and_recreated_queue_leaves_no_trace() {
    let app = common::spawn_app().await;
    let http = Http::new(&app);
    let q = "phoenix";
    let (status, created) = http.post("/ojs/v1/queues", json!({"name": q})).await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    // A control queue shows what a new queue looks like.
    http.ok_post("/ojs/v1/queues", json!({"name": "control"}))
        .await;

    // First life.
    let caller_id = uuid::Uuid::now_v7().to_string();
    let (status, answer) = http
        .post(
            "/ojs/v1/jobs",
            json!({"id": caller_id, "type": "life.one", "args": [], "options": {"queue": q}}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{answer}");
    let active = http.enqueue(q, "life.active").await;
    let done = http.enqueue(q, "life.waiting").await;
    let claimed = http.fetch(q, 2).await;
    assert_eq!(claimed.len(), 2);
    let lease = |id: &str| {
        claimed
            .iter()
            .find(|j| j["id"] == id)
            .map(|j| j["lease_token"].clone())
    };
    // FIFO: the caller-id job and `active` are claimed; the first completes, `done` stays
    // available.
    let (caller_lease, active_lease) = (lease(&caller_id), lease(&active));
    assert!(
        caller_lease.is_some() && active_lease.is_some(),
        "{claimed:?}"
    );
    http.ok_post(
        "/ojs/v1/workers/ack",
        json!({"job_id": caller_id, "lease_token": caller_lease}),
    )
    .await;
    http.ok_post(
        "/ojs/v1/queues/phoenix/config",
        json!({"max_retries": 0, "max_jobs": 50, "job_retention": "2h",
               "autovacuum": {"fillfactor": 80}}),
    )
    .await;
    http.ok_post(&format!("/ojs/v1/queues/{q}/pause"), json!({}))
        .await;
    for consumer in ["c1", "c2"] {
        http.ok_post(
            &format!("/ojs/v1/queues/{q}/consumers"),
            json!({"consumer": consumer, "from_tick": 0}),
        )
        .await;
    }
    let appended = http
        .ok_post(
            &format!("/ojs/v1/queues/{q}/messages/batch"),
            json!({"messages": [{"type": "old.one", "payload": 1}, {"type": "old.two", "payload": 2}]}),
        )
        .await;
    let old_message = appended["messages"][0]["id"]
        .as_str()
        .expect("id")
        .to_string();
    let batch = http
        .ok_post(
            &format!("/ojs/v1/queues/{q}/receive"),
            json!({"consumer": "c1"}),
        )
        .await;
    let old_batch = batch["batch_id"].as_str().expect("batch").to_string();
    let nacked = http
        .ok_post(
            "/ojs/v1/streams/nack",
            json!({"queue": q, "batch_id": old_batch, "message_id": old_message}),
        )
        .await;
    assert_eq!(nacked["outcome"], "dead_letter");
    let before = http.ok_get(&format!("/ojs/v1/queues/{q}/stats")).await;
    assert_eq!(before["queue"]["paused"], true);
    assert_eq!(before["queue"]["stream"]["consumers"], 2, "{before}");

    // Drop, with a lease and a batch still open.
    let (status, dropped) = http.delete(&format!("/ojs/v1/queues/{q}")).await;
    assert_eq!(status, StatusCode::OK, "{dropped}");
    assert_eq!(dropped["dropped"], true);
    for id in [&caller_id, &active, &done] {
        let (status, _) = http.get(&format!("/ojs/v1/jobs/{id}")).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "job {id} outlived its queue");
    }
    let (status, _) = http.get(&format!("/ojs/v1/queues/{q}/stats")).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert!(!http.queue_names().await.contains(&q.to_string()));
    let (status, _) = http.delete(&format!("/ojs/v1/queues/{q}")).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "a second drop finds nothing");

    // Second life.
    let (status, created) = http.post("/ojs/v1/queues", json!({"name": q})).await;
    assert_eq!(status, StatusCode::CREATED, "re-created as new: {created}");
    let names = http.queue_names().await;
    assert_eq!(names.iter().filter(|n| *n == q).count(), 1, "{names:?}");
    let mut conn = db(&app.database_url).await;
    let schemas: i64 =
        sqlx::query_scalar("SELECT count(*) FROM pg_namespace WHERE nspname LIKE 's3q\\_phoenix%'")
            .fetch_one(&mut conn)
            .await
            .expect("schemas");
    assert_eq!(schemas, 1);
    let indexed: i64 = sqlx::query_scalar("SELECT count(*) FROM s3p.job_index WHERE queue = $1")
        .bind(q)
        .fetch_one(&mut conn)
        .await
        .expect("job index");
    assert_eq!(indexed, 0, "no job id of the first life is indexed");

    // Same stats, stream info and config as the control queue.
    let strip = |mut v: Value| {
        if let Some(o) = v.as_object_mut() {
            for key in [
                "name",
                "queue",
                "created_at",
                "segment_started_at",
                "segments",
            ] {
                o.remove(key);
            }
        }
        v
    };
    let stats = http.ok_get(&format!("/ojs/v1/queues/{q}/stats")).await;
    let control = http.ok_get("/ojs/v1/queues/control/stats").await;
    assert_eq!(
        strip(stats["queue"].clone()),
        strip(control["queue"].clone())
    );
    assert_eq!(stats["queue"]["paused"], false);
    assert_eq!(stats["queue"]["completed"], 0);
    let info = http.ok_get(&format!("/ojs/v1/queues/{q}/info")).await;
    let control_info = http.ok_get("/ojs/v1/queues/control/info").await;
    for key in [
        "events",
        "consumers",
        "dead_letters",
        "pending_retries",
        "active_batches",
        "min_seq",
        "max_seq",
        "ticks",
        "rotations",
    ] {
        assert_eq!(
            info[key], control_info[key],
            "{key}: {info} vs {control_info}"
        );
    }
    assert_eq!(info["events"], 0);
    assert_eq!(
        http.ok_get(&format!("/ojs/v1/queues/{q}/config")).await,
        http.ok_get("/ojs/v1/queues/control/config").await
    );
    let consumers = http.ok_get(&format!("/ojs/v1/queues/{q}/consumers")).await;
    assert_eq!(consumers["consumers"], json!([]));
    let dlq = http.ok_get(&format!("/ojs/v1/queues/{q}/dlq")).await;
    assert_eq!(dlq["dead_letters"], json!([]));
    let (status, _) = http
        .get(&format!("/ojs/v1/queues/{q}/batches/{old_batch}"))
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND, "the old batch is gone");

    // Old ids are unknown and reusable; the old lease and batch are dead; the stream is empty.
    for id in [&caller_id, &active, &done] {
        let (status, _) = http.get(&format!("/ojs/v1/jobs/{id}")).await;
        assert_eq!(status, StatusCode::NOT_FOUND);
    }
    let (status, answer) = http
        .post(
            "/ojs/v1/workers/ack",
            json!({"job_id": active, "lease_token": active_lease}),
        )
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND, "old lease: {answer}");
    let (status, answer) = http
        .post(
            "/ojs/v1/streams/ack",
            json!({"queue": q, "batch_id": old_batch, "consumer": "c1"}),
        )
        .await;
    assert!(
        status == StatusCode::NOT_FOUND,
        "old batch ack: {status} {answer}"
    );
    let (status, answer) = http
        .post(
            "/ojs/v1/jobs",
            json!({"id": caller_id, "type": "life.two", "args": [], "options": {"queue": q}}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "old id reused: {answer}");
    assert_eq!(answer["job"]["type"], "life.two");
    http.ok_post(
        &format!("/ojs/v1/queues/{q}/consumers"),
        json!({"consumer": "fresh", "from_tick": 0}),
    )
    .await;
    http.ok_post(
        &format!("/ojs/v1/queues/{q}/messages"),
        json!({"type": "new.one", "payload": 3}),
    )
    .await;
    let batch = http
        .ok_post(
            &format!("/ojs/v1/queues/{q}/receive"),
            json!({"consumer": "fresh"}),
        )
        .await;
    let kinds: Vec<&str> = batch["events"]
        .as_array()
        .expect("events")
        .iter()
        .filter_map(|e| e["type"].as_str())
        .collect();
    assert_eq!(kinds, vec!["new.one"], "only the second life's event");
    let fetched = http.fetch(q, 10).await;
    let fetched: Vec<&str> = fetched.iter().filter_map(|j| j["id"].as_str()).collect();
    assert_eq!(
        fetched,
        vec![caller_id.as_str()],
        "only the second life's job"
    );
}

// ---------------------------------------------------------------------------------------------
// Per-queue admission

/// With `queue_max_in_flight = 1`, a request held open on one queue makes every other request
/// naming that queue (in its path or its JSON body, alone or among others) get 429 at once, while
/// other queues and requests naming no queue still work; a long poll gives its queue back while
/// it waits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_queue_admission_refuses_one_queue_while_another_works() {
    let app = common::spawn_app_with(|s| s.queue_max_in_flight = 1).await;
    let http = Http::new(&app);
    let job = http.enqueue("hot", "hot.job").await;
    http.enqueue("cold", "cold.job").await;

    // Hold a request on `hot` in flight: a resume of it, admitted and then waiting for the queue's
    // catalog row, which another transaction holds. (Queue permits are taken once a request is
    // decoded, so a request whose body is still arriving holds none.) A probe can take the
    // queue's slot first; then the held request is the one refused, and it is sent again.
    let mut lock = db(&app.database_url).await;
    sqlx::query("BEGIN")
        .execute(&mut lock)
        .await
        .expect("begin");
    sqlx::query("SELECT 1 FROM s3p.queues WHERE name = 'hot' FOR UPDATE")
        .execute(&mut lock)
        .await
        .expect("lock hot's catalog row");
    let resume = || {
        let client = http.client.clone();
        let url = format!("{}/ojs/v1/queues/hot/resume", app.http_url);
        tokio::spawn(async move { client.post(url).json(&json!({})).send().await })
    };
    let mut held = resume();
    let mut refused = Value::Null;
    eventually(
        Duration::from_secs(5),
        "a request on the held queue gets 429",
        async || {
            if held.is_finished() {
                held = resume();
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            let response = http
                .client
                .get(format!("{}/ojs/v1/queues/hot/stats", app.http_url))
                .send()
                .await
                .expect("stats");
            if response.status() != StatusCode::TOO_MANY_REQUESTS || held.is_finished() {
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
    assert!(!held.is_finished(), "the held request is still in flight");
    assert_eq!(error_code(&refused), "rate_limited", "{refused}");
    assert_eq!(refused["error"]["retryable"], true, "{refused}");
    assert_eq!(refused["error"]["details"]["queue"], "hot", "{refused}");

    // Every way of naming `hot` is refused; nothing of it is applied.
    let hot_requests = [
        (
            "/ojs/v1/jobs",
            json!({"type": "t", "args": [], "options": {"queue": "hot"}}),
        ),
        (
            "/ojs/v1/jobs/batch",
            json!({"jobs": [{"type": "t", "args": [], "options": {"queue": "cold"}},
                            {"type": "t", "args": [], "options": {"queue": "hot"}}]}),
        ),
        (
            "/ojs/v1/workers/fetch",
            json!({"queues": ["cold", "hot"], "count": 10}),
        ),
        (
            "/ojs/v1/streams/ack",
            json!({"queue": "hot", "batch_id": uuid::Uuid::now_v7()}),
        ),
        ("/ojs/v1/queues/hot/pause", json!({})),
    ];
    for (path, body) in hot_requests {
        let (status, answer) = http.post(path, body).await;
        assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{path}: {answer}");
        assert_eq!(error_code(&answer), "rate_limited", "{path}: {answer}");
    }
    let (status, _) = http.get("/ojs/v1/queues/hot/stats").await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);

    // The held request is the one counted: it has had no answer.
    assert!(!held.is_finished(), "the held request was answered");

    // Another queue, and requests naming no queue, still work; the refused fetch took no permit
    // on `cold`, and its cold job is still there.
    let cold = http.fetch("cold", 10).await;
    assert_eq!(
        cold.len(),
        1,
        "the cold job was not claimed by the refused fetch"
    );
    http.enqueue("cold", "cold.two").await;
    http.ok_get("/ojs/v1/queues/cold/stats").await;
    http.ok_post(
        "/ojs/v1/queues/cold/messages",
        json!({"type": "e", "payload": 1}),
    )
    .await;
    http.ok_get("/ojs/manifest").await;
    assert_eq!(http.state(&job).await, "available");
    // gRPC requests count against the same per-queue limits once their message is decoded.
    let mut grpc = app.grpc().await;
    let refused = grpc
        .enqueue(grpc_enqueue_request("hot"))
        .await
        .expect_err("gRPC enqueue on the held queue");
    assert_eq!(refused.code(), tonic::Code::ResourceExhausted);
    assert_eq!(grpc_code(&refused), "rate_limited");
    let refused = grpc
        .fetch(pb::FetchRequest {
            queues: vec!["cold".into(), "hot".into()],
            count: 10,
            ..Default::default()
        })
        .await
        .expect_err("gRPC fetch naming the held queue");
    assert_eq!(grpc_code(&refused), "rate_limited");
    let mut streams =
        pgvs3::grpc::proto::pgvs3::v1::stream_service_client::StreamServiceClient::new(
            channel(&app).await,
        );
    let refused = streams
        .info(pgvs3::grpc::proto::pgvs3::v1::InfoRequest {
            queue: "hot".into(),
        })
        .await
        .expect_err("gRPC stream info of the held queue");
    assert_eq!(grpc_code(&refused), "rate_limited");
    grpc.enqueue(grpc_enqueue_request("cold"))
        .await
        .expect("gRPC on another queue works");

    // Once the held request is answered, `hot` is back.
    sqlx::query("ROLLBACK")
        .execute(&mut lock)
        .await
        .expect("rollback");
    let resumed = held.await.expect("join").expect("the held request");
    assert_eq!(resumed.status(), StatusCode::OK);
    eventually(Duration::from_secs(3), "the queue comes back", async || {
        http.post(
            "/ojs/v1/queues/hot/messages",
            json!({"type": "e", "payload": 2}),
        )
        .await
        .0 == StatusCode::CREATED
    })
    .await;

    // A long poll holds its queue only until it starts waiting.
    let drained = http.fetch("hot", 10).await;
    assert_eq!(
        drained.len(),
        1,
        "the HTTP hot job; the refused gRPC enqueue stored nothing"
    );
    let poller = http.clone();
    let poll = tokio::spawn(async move {
        poller
            .ok_post(
                "/ojs/v1/workers/fetch",
                json!({"queues": ["hot"], "wait_ms": 2000}),
            )
            .await
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!poll.is_finished(), "the poll is waiting");
    let woken = http.enqueue("hot", "hot.wake").await;
    let polled = poll.await.expect("poll task");
    assert_eq!(polled["jobs"][0]["id"], woken.as_str(), "{polled}");
}

// ---------------------------------------------------------------------------------------------
// Queue administration over gRPC

/// AdminService and the OJS queue RPCs over the same core as the HTTP routes.
#[tokio::test]
async fn queue_administration_over_grpc() {
    let app = common::spawn_app().await;
    let http = Http::new(&app);
    let ch = channel(&app).await;
    let mut ojs = Ojs::new(ch.clone());
    let mut admin = Admin::new(ch);

    let created = admin
        .create_queue(s3::CreateQueueRequest {
            queue: "admin-q".into(),
        })
        .await
        .expect("create")
        .into_inner();
    assert!(created.created);
    let again = admin
        .create_queue(s3::CreateQueueRequest {
            queue: "admin-q".into(),
        })
        .await
        .expect("create again")
        .into_inner();
    assert!(!again.created);
    let bad = admin
        .create_queue(s3::CreateQueueRequest {
            queue: "Bad Name".into(),
        })
        .await
        .expect_err("bad name");
    assert_eq!(bad.code(), tonic::Code::InvalidArgument);

    // Stats over gRPC match HTTP.
    let id = http.enqueue("admin-q", "a.job").await;
    http.enqueue("admin-q", "a.job").await;
    let claimed = http.fetch("admin-q", 1).await;
    assert_eq!(claimed[0]["id"], id.as_str());
    let stats = ojs
        .queue_stats(pb::QueueStatsRequest {
            queue: "admin-q".into(),
        })
        .await
        .expect("stats")
        .into_inner();
    assert_eq!(stats.queue, "admin-q");
    let s = stats.stats.expect("stats");
    assert_eq!((s.available, s.active, s.paused), (1, 1, false));
    let missing = ojs
        .queue_stats(pb::QueueStatsRequest {
            queue: "nowhere".into(),
        })
        .await
        .expect_err("unknown queue");
    assert_eq!(missing.code(), tonic::Code::NotFound);
    assert_eq!(grpc_code(&missing), "not_found");

    // Pause and resume.
    ojs.pause_queue(pb::PauseQueueRequest {
        queue: "admin-q".into(),
    })
    .await
    .expect("pause");
    let paused = http.ok_get("/ojs/v1/queues/admin-q/stats").await;
    assert_eq!(paused["queue"]["paused"], true);
    assert!(
        http.fetch("admin-q", 5).await.is_empty(),
        "a paused queue delivers nothing"
    );
    ojs.resume_queue(pb::ResumeQueueRequest {
        queue: "admin-q".into(),
    })
    .await
    .expect("resume");
    let s = ojs
        .queue_stats(pb::QueueStatsRequest {
            queue: "admin-q".into(),
        })
        .await
        .expect("stats")
        .into_inner()
        .stats
        .expect("stats");
    assert!(!s.paused);
    assert_eq!(http.fetch("admin-q", 5).await.len(), 1);

    // Configuration.
    let set = admin
        .set_queue_config(s3::SetQueueConfigRequest {
            queue: "admin-q".into(),
            max_retries: Some(4),
            retention: Some("2h".into()),
            job_retention: Some("30m".into()),
            takeover: Some("45s".into()),
            max_jobs: Some(100),
            autovacuum: Some(prost_types::Struct {
                fields: [(
                    "autovacuum_vacuum_scale_factor".to_string(),
                    prost_types::Value {
                        kind: Some(prost_types::value::Kind::NumberValue(0.05)),
                    },
                )]
                .into(),
            }),
            ..Default::default()
        })
        .await
        .expect("set config")
        .into_inner()
        .config
        .expect("config");
    assert_eq!(set.max_retries, 4);
    assert_eq!(set.retention_ms, 7_200_000);
    assert_eq!(set.job_retention_ms, Some(1_800_000));
    assert_eq!(set.max_jobs, Some(100));
    assert_eq!(set.takeover_ms, 45_000);
    assert!(set.autovacuum.is_some());
    let http_config = http.ok_get("/ojs/v1/queues/admin-q/config").await;
    assert_eq!(http_config["max_jobs"], 100, "{http_config}");
    assert_eq!(http_config["takeover_ms"], 45_000, "{http_config}");
    assert_eq!(
        http_config["autovacuum"]["autovacuum_vacuum_scale_factor"], 0.05,
        "{http_config}"
    );
    let cleared = admin
        .set_queue_config(s3::SetQueueConfigRequest {
            queue: "admin-q".into(),
            clear_max_jobs: true,
            ..Default::default()
        })
        .await
        .expect("clear quota")
        .into_inner()
        .config
        .expect("config");
    assert_eq!(cleared.max_jobs, None);
    assert_eq!(cleared.max_retries, 4, "the rest stays");
    let read = admin
        .get_queue_config(s3::GetQueueConfigRequest {
            queue: "admin-q".into(),
        })
        .await
        .expect("get config")
        .into_inner()
        .config
        .expect("config");
    assert_eq!(read, cleared);
    let both = admin
        .set_queue_config(s3::SetQueueConfigRequest {
            queue: "admin-q".into(),
            max_jobs: Some(1),
            clear_max_jobs: true,
            ..Default::default()
        })
        .await
        .expect_err("set and clear");
    assert_eq!(both.code(), tonic::Code::InvalidArgument);
    let bad = admin
        .set_queue_config(s3::SetQueueConfigRequest {
            queue: "admin-q".into(),
            retention: Some("soon".into()),
            ..Default::default()
        })
        .await
        .expect_err("bad duration");
    assert_eq!(bad.code(), tonic::Code::InvalidArgument);
    assert_eq!(grpc_code(&bad), "invalid_request");

    // Adopting a queue whose schema does not exist finds nothing.
    let missing = admin
        .adopt_queue(s3::AdoptQueueRequest {
            queue: "never-dumped".into(),
        })
        .await
        .expect_err("nothing to adopt");
    assert_eq!(missing.code(), tonic::Code::NotFound);

    // Drop.
    let dropped = admin
        .drop_queue(s3::DropQueueRequest {
            queue: "admin-q".into(),
        })
        .await
        .expect("drop")
        .into_inner();
    assert!(dropped.dropped);
    let (status, _) = http.get(&format!("/ojs/v1/jobs/{id}")).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let gone = admin
        .drop_queue(s3::DropQueueRequest {
            queue: "admin-q".into(),
        })
        .await
        .expect_err("dropped twice");
    assert_eq!(gone.code(), tonic::Code::NotFound);
    assert!(http.queue_names().await.is_empty());
}

/// The second read-only check, independent of the gate: a read-only store's sessions refuse
/// every write in PostgreSQL itself (`default_transaction_read_only`), answered as `read_only`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_only_store_refuses_writes_by_itself() {
    let app = common::spawn_app().await;
    let http = Http::new(&app);
    let existing = http.enqueue("ro-store", "ro.job").await;
    let store = pgvs3::store::Store::connect(&app.database_url, 2, 0, true)
        .await
        .expect("a read-only store");
    let error = store
        .create_queue("ro-new")
        .await
        .expect_err("a write is refused");
    assert_eq!(error.kind, pgvs3::core::ErrorKind::ReadOnly, "{error:?}");
    let error = store
        .cancel(existing.parse().expect("uuid"))
        .await
        .expect_err("a write is refused");
    assert_eq!(error.kind, pgvs3::core::ErrorKind::ReadOnly, "{error:?}");
    // Reads still work.
    let job = store
        .get_job(existing.parse().expect("uuid"))
        .await
        .expect("a read");
    assert_eq!(job.state, pgvs3::core::JobState::Available);
    store.close().await;
    assert_eq!(http.state(&existing).await, "available");
    assert_eq!(http.queue_names().await, vec!["ro-store".to_string()]);
}

// ---------------------------------------------------------------------------------------------
// Pagination

/// Walks an HTTP list route a page of `limit` at a time; returns every name in page order.
async fn walk_http(http: &Http, path: &str, field: &str, name: &str, limit: i64) -> Vec<String> {
    let mut cursor = String::new();
    let mut names = Vec::new();
    for _ in 0..20 {
        let page = http
            .ok_get(&format!("{path}?limit={limit}&cursor={cursor}"))
            .await;
        let items = page[field].as_array().expect("items");
        assert!(items.len() as i64 <= limit, "{page}");
        names.extend(
            items
                .iter()
                .map(|i| i[name].as_str().expect("name").to_string()),
        );
        let pagination = &page["pagination"];
        assert_eq!(pagination["limit"], limit, "{page}");
        match pagination["next_cursor"].as_str() {
            Some(next) => {
                assert_eq!(pagination["has_more"], true, "{page}");
                cursor = next.to_string();
            }
            None => {
                assert_eq!(pagination["has_more"], false, "{page}");
                assert_eq!(pagination["total"], names.len(), "{page}");
                return names;
            }
        }
    }
    panic!("{path} never reached its last page");
}

/// Queues, consumers and cron registrations are listed a page at a time over both protocols: in
/// name order, each entry once, `limit` at most per page, a cursor to the next page; a bad limit
/// is 400 / INVALID_ARGUMENT.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lists_that_grow_with_use_are_paginated_over_both_protocols() {
    let app = common::spawn_app().await;
    let http = Http::new(&app);
    let queues: Vec<String> = (0..7).map(|i| format!("page-q{i}")).collect();
    for q in &queues {
        http.ok_post("/ojs/v1/queues", json!({ "name": q })).await;
    }
    let consumers: Vec<String> = (0..5).map(|i| format!("c{i}")).collect();
    for c in &consumers {
        http.ok_post("/ojs/v1/queues/page-q0/consumers", json!({ "consumer": c }))
            .await;
    }
    let crons: Vec<String> = (0..4).map(|i| format!("cron-{i}")).collect();
    for name in &crons {
        http.ok_post(
            "/ojs/v1/cron",
            json!({"name": name, "expression": "0 0 * * *",
                   "job_template": {"type": "page.job", "args": []}}),
        )
        .await;
    }

    assert_eq!(
        walk_http(&http, "/ojs/v1/queues", "queues", "name", 3).await,
        queues
    );
    assert_eq!(
        walk_http(
            &http,
            "/ojs/v1/queues/page-q0/consumers",
            "consumers",
            "consumer",
            2
        )
        .await,
        consumers
    );
    assert_eq!(
        walk_http(&http, "/ojs/v1/cron", "cron_jobs", "name", 3).await,
        crons
    );
    for path in [
        "/ojs/v1/queues?limit=1001",
        "/ojs/v1/cron?limit=-1",
        "/ojs/v1/queues/page-q0/consumers?limit=5000",
    ] {
        let (status, answer) = http.get(path).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{path}: {answer}");
    }

    let ch = channel(&app).await;
    let mut ojs = pb::ojs_service_client::OjsServiceClient::new(ch.clone());
    let mut streams = s3::stream_service_client::StreamServiceClient::new(ch);
    let (mut seen_queues, mut seen_consumers, mut seen_crons) =
        (Vec::new(), Vec::new(), Vec::new());
    let mut cursor = String::new();
    loop {
        let page = ojs
            .list_queues(pb::ListQueuesRequest {
                limit: 3,
                cursor: cursor.clone(),
            })
            .await
            .expect("ListQueues")
            .into_inner();
        assert!(page.queues.len() <= 3);
        seen_queues.extend(page.queues.into_iter().map(|q| q.name));
        if page.next_cursor.is_empty() {
            break;
        }
        cursor = page.next_cursor;
    }
    cursor = String::new();
    loop {
        let page = streams
            .list_consumers(s3::ListConsumersRequest {
                queue: "page-q0".into(),
                limit: 2,
                cursor: cursor.clone(),
            })
            .await
            .expect("ListConsumers")
            .into_inner();
        assert!(page.consumers.len() <= 2);
        seen_consumers.extend(page.consumers.into_iter().map(|c| c.consumer));
        if page.next_cursor.is_empty() {
            break;
        }
        cursor = page.next_cursor;
    }
    cursor = String::new();
    loop {
        let page = ojs
            .list_cron(pb::ListCronRequest {
                limit: 3,
                cursor: cursor.clone(),
            })
            .await
            .expect("ListCron")
            .into_inner();
        assert!(page.entries.len() <= 3);
        seen_crons.extend(page.entries.into_iter().map(|c| c.name));
        if page.next_cursor.is_empty() {
            break;
        }
        cursor = page.next_cursor;
    }
    assert_eq!(seen_queues, queues);
    assert_eq!(seen_consumers, consumers);
    assert_eq!(seen_crons, crons);
    let status = ojs
        .list_queues(pb::ListQueuesRequest {
            limit: 1001,
            cursor: String::new(),
        })
        .await
        .expect_err("a page over the bound");
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
}
