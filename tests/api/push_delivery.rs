//! Push delivery over gRPC: `StreamJobs` (max_concurrent, slots freed by acks, leases of closed
//! streams), `StreamEvents` (lifecycle events and filters), `ReceiveStream` (one batch at a time),
//! `grpc.health.v1.Health` and server reflection.

use crate::common;

use std::time::Duration;

use pgvs3::grpc::proto::ojs::v1 as pb;
use pgvs3::grpc::proto::ojs::v1::ojs_service_client::OjsServiceClient;
use pgvs3::grpc::proto::pgvs3::v1 as spb;
use tonic::Streaming;
use tonic::transport::Channel;

use common::grpc::channel;

/// How long a test waits for something that should come.
const PATIENCE: Duration = Duration::from_secs(10);

async fn enqueue(client: &mut OjsServiceClient<Channel>, queue: &str, lease_ms: i64) -> String {
    let response = client
        .enqueue(pb::EnqueueRequest {
            r#type: "push.test".to_string(),
            args: vec![prost_types::Value {
                kind: Some(prost_types::value::Kind::StringValue(queue.to_string())),
            }],
            options: Some(pb::EnqueueOptions {
                queue: queue.to_string(),
                visibility_timeout_ms: lease_ms,
                ..Default::default()
            }),
            ..Default::default()
        })
        .await
        .expect("enqueue");
    response.into_inner().job.expect("job").id
}

/// The next message of a stream, failing the test if none comes within `PATIENCE`.
async fn next<T>(stream: &mut Streaming<T>) -> T {
    tokio::time::timeout(PATIENCE, stream.message())
        .await
        .expect("a message in time")
        .expect("no stream error")
        .expect("the stream is still open")
}

/// Asserts that nothing arrives on `stream` for `quiet`.
async fn nothing_for<T: std::fmt::Debug>(stream: &mut Streaming<T>, quiet: Duration) {
    if let Ok(got) = tokio::time::timeout(quiet, stream.message()).await {
        panic!("expected nothing, got {got:?}");
    }
}

async fn ack(client: &mut OjsServiceClient<Channel>, job: &pb::Job) {
    client
        .ack(pb::AckRequest {
            job_id: job.id.clone(),
            lease_token: job.lease_token.clone(),
            ..Default::default()
        })
        .await
        .expect("ack");
}

#[tokio::test]
async fn stream_jobs_honours_max_concurrent_and_frees_a_slot_on_ack() {
    let app = common::spawn_app().await;
    let mut client = app.grpc().await;
    // The stream starts before its queue exists: jobs are pushed as they become available.
    let mut stream = client
        .stream_jobs(pb::StreamJobsRequest {
            queues: vec!["push-cap".to_string()],
            worker_id: "streamer".to_string(),
            max_concurrent: 2,
        })
        .await
        .expect("stream jobs")
        .into_inner();
    let mut enqueued = Vec::new();
    for _ in 0..5 {
        enqueued.push(enqueue(&mut client, "push-cap", 0).await);
    }

    let first = next(&mut stream).await;
    let second = next(&mut stream).await;
    for job in [&first, &second] {
        assert_eq!(job.state, pb::JobState::Active as i32, "{job:?}");
        assert!(!job.lease_token.is_empty(), "each push is a claim");
        assert_eq!(job.queue, "push-cap");
    }
    assert_ne!(first.id, second.id);
    // In enqueue order, like Fetch.
    assert_eq!(
        [first.id.clone(), second.id.clone()],
        [enqueued[0].clone(), enqueued[1].clone()]
    );
    nothing_for(&mut stream, Duration::from_millis(1500)).await;

    // An ack frees one slot: exactly one more arrives, promptly.
    ack(&mut client, &first).await;
    let acked_at = tokio::time::Instant::now();
    let third = next(&mut stream).await;
    assert!(
        acked_at.elapsed() < Duration::from_secs(2),
        "the freed slot was refilled after {:?}",
        acked_at.elapsed()
    );
    assert_eq!(third.id, enqueued[2]);
    nothing_for(&mut stream, Duration::from_millis(800)).await;

    // A nack frees one too; the jobs left stay available.
    client
        .nack(pb::NackRequest {
            job_id: second.id.clone(),
            lease_token: second.lease_token.clone(),
            error: Some(pb::JobError {
                code: "boom".to_string(),
                message: "failed on purpose".to_string(),
                ..Default::default()
            }),
            ..Default::default()
        })
        .await
        .expect("nack");
    let fourth = next(&mut stream).await;
    assert_eq!(fourth.id, enqueued[3]);
    nothing_for(&mut stream, Duration::from_millis(800)).await;
    let left = client
        .get_job(pb::GetJobRequest {
            job_id: enqueued[4].clone(),
        })
        .await
        .expect("get job")
        .into_inner()
        .job
        .expect("job");
    assert_eq!(left.state, pb::JobState::Available as i32);
    drop(stream);
}

#[tokio::test]
async fn a_closed_streams_unacked_job_returns_after_its_lease() {
    let app = common::spawn_app().await;
    let mut client = app.grpc().await;
    let leased = enqueue(&mut client, "push-lease", 1500).await;
    let mut stream = client
        .stream_jobs(pb::StreamJobsRequest {
            queues: vec!["push-lease".to_string()],
            worker_id: "gone".to_string(),
            max_concurrent: 2,
        })
        .await
        .expect("stream jobs")
        .into_inner();
    let claimed = next(&mut stream).await;
    assert_eq!(claimed.id, leased);
    let claimed_at = tokio::time::Instant::now();
    drop(stream);
    tokio::time::sleep(Duration::from_millis(300)).await;

    // The stream had a free slot, but it is gone: it claims nothing more.
    let other = enqueue(&mut client, "push-lease", 0).await;
    let fetch = |client: &mut OjsServiceClient<Channel>| {
        let mut client = client.clone();
        async move {
            client
                .fetch(pb::FetchRequest {
                    queues: vec!["push-lease".to_string()],
                    count: 2,
                    worker_id: "after".to_string(),
                    ..Default::default()
                })
                .await
                .expect("fetch")
                .into_inner()
                .jobs
        }
    };
    let now = fetch(&mut client).await;
    assert_eq!(
        now.iter().map(|j| j.id.clone()).collect::<Vec<_>>(),
        vec![other],
        "only the new job is available while the old lease runs"
    );

    // After the lease, the unacked job comes back to a plain Fetch.
    tokio::time::sleep_until(claimed_at + Duration::from_millis(1700)).await;
    let later = fetch(&mut client).await;
    assert_eq!(later.len(), 1, "{later:?}");
    assert_eq!(later[0].id, leased);
    assert_eq!(later[0].attempt, 2);
}

/// Lifecycle events of interest (keepalives skipped) until `until` has been seen for `job`.
async fn events_until(stream: &mut Streaming<pb::Event>, job: &str, until: &str) -> Vec<pb::Event> {
    let mut seen = Vec::new();
    loop {
        let event = next(stream).await;
        if event.r#type == "stream.keepalive" {
            continue;
        }
        let done = event.job_id == job && event.r#type == until;
        seen.push(event);
        if done {
            return seen;
        }
    }
}

#[tokio::test]
async fn stream_events_delivers_lifecycle_events_and_filters() {
    let app = common::spawn_app().await;
    let mut client = app.grpc().await;
    // Events from before the stream are not replayed.
    let before = enqueue(&mut client, "ev-q", 0).await;
    let mut by_queue = client
        .stream_events(pb::StreamEventsRequest {
            queues: vec!["ev-q".to_string()],
            ..Default::default()
        })
        .await
        .expect("stream events")
        .into_inner();
    let job = enqueue(&mut client, "ev-q", 0).await;
    let mut completed_only = client
        .stream_events(pb::StreamEventsRequest {
            event_types: vec!["job.completed".to_string()],
            job_id: job.clone(),
            ..Default::default()
        })
        .await
        .expect("stream events")
        .into_inner();
    enqueue(&mut client, "ev-other", 0).await;
    let claimed = client
        .fetch(pb::FetchRequest {
            queues: vec!["ev-q".to_string()],
            count: 2,
            worker_id: "w1".to_string(),
            ..Default::default()
        })
        .await
        .expect("fetch")
        .into_inner()
        .jobs;
    for j in &claimed {
        if j.id == job {
            ack(&mut client, j).await;
        }
    }

    let seen = events_until(&mut by_queue, &job, "job.completed").await;
    let ours: Vec<&str> = seen
        .iter()
        .filter(|e| e.job_id == job)
        .map(|e| e.r#type.as_str())
        .collect();
    assert_eq!(ours, ["job.enqueued", "job.started", "job.completed"]);
    for event in &seen {
        assert_eq!(event.queue, "ev-q", "filtered by queue: {event:?}");
        assert!(event.id.starts_with("evt_"), "{event:?}");
        assert!(event.timestamp.is_some());
        assert!(
            !(event.job_id == before && event.r#type == "job.enqueued"),
            "no replay of events before the stream"
        );
    }
    let started = seen
        .iter()
        .find(|e| e.job_id == job && e.r#type == "job.started")
        .expect("started");
    assert_eq!(started.job_type, "push.test");
    let data = started.data.as_ref().expect("data");
    assert!(data.fields.contains_key("attempt"), "{data:?}");

    // The type and job filters combine: one event.
    let only = events_until(&mut completed_only, &job, "job.completed").await;
    assert_eq!(only.len(), 1, "{only:?}");

    // Bad filters fail the call itself.
    let bad = client
        .stream_events(pb::StreamEventsRequest {
            job_id: "not-a-job-id".to_string(),
            ..Default::default()
        })
        .await
        .expect_err("bad job id");
    assert_eq!(bad.code(), tonic::Code::InvalidArgument);
}

#[tokio::test]
async fn stream_events_filters_by_workflow() {
    let app = common::spawn_app().await;
    let mut client = app.grpc().await;
    let step = |id: &str| pb::WorkflowStep {
        id: id.to_string(),
        r#type: "push.step".to_string(),
        options: Some(pb::EnqueueOptions {
            queue: "wf-q".to_string(),
            ..Default::default()
        }),
        ..Default::default()
    };
    let workflow = client
        .create_workflow(pb::CreateWorkflowRequest {
            name: "push-wf".to_string(),
            steps: vec![step("a")],
        })
        .await
        .expect("create workflow")
        .into_inner()
        .workflow
        .expect("workflow");
    let mut stream = client
        .stream_events(pb::StreamEventsRequest {
            workflow_id: workflow.id.clone(),
            ..Default::default()
        })
        .await
        .expect("stream events")
        .into_inner();
    let unrelated = enqueue(&mut client, "wf-q", 0).await;
    let claimed = client
        .fetch(pb::FetchRequest {
            queues: vec!["wf-q".to_string()],
            count: 2,
            worker_id: "w1".to_string(),
            ..Default::default()
        })
        .await
        .expect("fetch")
        .into_inner()
        .jobs;
    assert_eq!(claimed.len(), 2);
    let step_job = claimed
        .iter()
        .find(|j| j.id != unrelated)
        .expect("the step's job")
        .clone();
    for job in &claimed {
        ack(&mut client, job).await;
    }
    let seen = events_until(&mut stream, &step_job.id, "job.completed").await;
    assert_eq!(
        seen.iter().map(|e| e.r#type.as_str()).collect::<Vec<_>>(),
        ["job.started", "job.completed"]
    );
    for event in &seen {
        assert_eq!(event.job_id, step_job.id);
        assert_eq!(event.workflow_id, workflow.id);
    }
}

fn message(n: i64) -> spb::Message {
    spb::Message {
        r#type: "push.msg".to_string(),
        payload: Some(prost_types::Value {
            kind: Some(prost_types::value::Kind::NumberValue(n as f64)),
        }),
        ..Default::default()
    }
}

#[tokio::test]
async fn receive_stream_sends_the_next_batch_after_an_ack() {
    let app = common::spawn_app().await;
    let mut streams = common::grpc::streams(&app.grpc_url).await;
    streams
        .subscribe(spb::SubscribeRequest {
            queue: "rs-q".to_string(),
            consumer: "c1".to_string(),
            ..Default::default()
        })
        .await
        .expect("subscribe");
    streams
        .append(spb::AppendRequest {
            queue: "rs-q".to_string(),
            messages: vec![message(1)],
        })
        .await
        .expect("append");
    let mut batches = streams
        .receive_stream(spb::ReceiveStreamRequest {
            queue: "rs-q".to_string(),
            consumer: "c1".to_string(),
            ..Default::default()
        })
        .await
        .expect("receive stream")
        .into_inner();
    let first = next(&mut batches).await;
    assert_eq!(first.count, 1);
    assert_eq!(first.state, "active");

    streams
        .append(spb::AppendRequest {
            queue: "rs-q".to_string(),
            messages: vec![message(2)],
        })
        .await
        .expect("append");
    // Not acked yet: nothing new, and the active batch is not sent again.
    nothing_for(&mut batches, Duration::from_millis(800)).await;
    streams
        .ack(spb::AckRequest {
            queue: "rs-q".to_string(),
            batch_id: first.batch_id.clone(),
            consumer: Some("c1".to_string()),
        })
        .await
        .expect("ack");
    let second = next(&mut batches).await;
    assert_ne!(second.batch_id, first.batch_id);
    // Batches cover (start_tick, end_tick]: the second picks up where the first ended.
    assert_eq!(
        second.start_tick, first.end_tick,
        "{first:?} then {second:?}"
    );
    let payloads: Vec<_> = [&first, &second]
        .iter()
        .flat_map(|b| b.events.iter())
        .map(|e| e.payload.clone())
        .collect();
    assert_eq!(
        payloads,
        vec![message(1).payload, message(2).payload],
        "in order"
    );

    // An unknown consumer fails the call itself.
    let unknown = streams
        .receive_stream(spb::ReceiveStreamRequest {
            queue: "rs-q".to_string(),
            consumer: "nobody".to_string(),
            ..Default::default()
        })
        .await
        .expect_err("unknown consumer");
    assert_eq!(unknown.code(), tonic::Code::NotFound);
}

#[tokio::test]
async fn health_check_reports_serving() {
    use tonic_health::pb::HealthCheckRequest;
    use tonic_health::pb::health_check_response::ServingStatus;
    use tonic_health::pb::health_client::HealthClient;

    let app = common::spawn_app().await;
    let mut health = HealthClient::new(channel(&app.grpc_url).await);
    for service in ["", "ojs.v1.OJSService", "pgvs3.v1.StreamService"] {
        let status = health
            .check(HealthCheckRequest {
                service: service.to_string(),
            })
            .await
            .expect("check")
            .into_inner()
            .status;
        assert_eq!(status, ServingStatus::Serving as i32, "{service:?}");
    }
    let unknown = health
        .check(HealthCheckRequest {
            service: "no.such.Service".to_string(),
        })
        .await
        .expect_err("unknown service");
    assert_eq!(unknown.code(), tonic::Code::NotFound);

    let mut watch = health
        .watch(HealthCheckRequest::default())
        .await
        .expect("watch")
        .into_inner();
    assert_eq!(next(&mut watch).await.status, ServingStatus::Serving as i32);
}

#[tokio::test]
async fn reflection_lists_the_services() {
    use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
    use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
    use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;
    use tonic_reflection::pb::v1::{ServerReflectionRequest, ServerReflectionResponse};

    let app = common::spawn_app().await;
    let mut reflection = ServerReflectionClient::new(channel(&app.grpc_url).await);
    let requests = vec![
        ServerReflectionRequest {
            host: String::new(),
            message_request: Some(MessageRequest::ListServices(String::new())),
        },
        ServerReflectionRequest {
            host: String::new(),
            message_request: Some(MessageRequest::FileContainingSymbol(
                "ojs.v1.OJSService".to_string(),
            )),
        },
    ];
    let mut responses = reflection
        .server_reflection_info(futures_util::stream::iter(requests))
        .await
        .expect("reflection")
        .into_inner();
    let listed: ServerReflectionResponse = next(&mut responses).await;
    let Some(MessageResponse::ListServicesResponse(list)) = listed.message_response else {
        panic!("not a service list: {listed:?}");
    };
    let names: Vec<String> = list.service.into_iter().map(|s| s.name).collect();
    for name in [
        "ojs.v1.OJSService",
        "pgvs3.v1.StreamService",
        "pgvs3.v1.AdminService",
        "grpc.health.v1.Health",
    ] {
        assert!(names.iter().any(|n| n == name), "{name} in {names:?}");
    }
    let file = next(&mut responses).await;
    let Some(MessageResponse::FileDescriptorResponse(files)) = file.message_response else {
        panic!("not a file descriptor: {file:?}");
    };
    assert!(!files.file_descriptor_proto.is_empty());
}

#[tokio::test]
async fn streams_end_with_unavailable_at_shutdown() {
    use std::sync::Arc;

    use pgvs3::core::{Service, ServiceSettings};
    use pgvs3::store::Store;

    // A migrated database from the harness, served here by a router wired to a shutdown signal.
    let app = common::spawn_app().await;
    let store = Store::connect(&app.database_url, 4, 0, false)
        .await
        .expect("connect");
    let service = Arc::new(Service::new(store, ServiceSettings::default()));
    let (stop, signal) = tokio::sync::watch::channel(false);
    let stack = common::bare_stack();
    let router = pgvs3::grpc::router_until(service, &stack, 1 << 20, signal);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("address"));
    tokio::spawn(async move { axum::serve(listener, router).await });

    let mut client = OjsServiceClient::new(channel(&url).await);
    let mut jobs = client
        .stream_jobs(pb::StreamJobsRequest {
            queues: vec!["shut-q".to_string()],
            ..Default::default()
        })
        .await
        .expect("stream jobs")
        .into_inner();
    let mut events = client
        .stream_events(pb::StreamEventsRequest::default())
        .await
        .expect("stream events")
        .into_inner();
    nothing_for(&mut jobs, Duration::from_millis(300)).await;

    let _ = stop.send(true);
    let ended = [
        tokio::time::timeout(PATIENCE, jobs.message())
            .await
            .map(|r| r.map(|_| ())),
        tokio::time::timeout(PATIENCE, events.message())
            .await
            .map(|r| r.map(|_| ())),
    ];
    for status in ended {
        let status = status.expect("ended in time").expect_err("an error status");
        assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
    }
}
