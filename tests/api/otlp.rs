//! Spans over OTLP: a small OTLP/gRPC trace collector runs in the test, pgvs3's telemetry is
//! pointed at it through `OTEL_EXPORTER_OTLP_ENDPOINT`, and the exported spans and their parent
//! links are checked: the request span joins the caller's W3C trace, database spans hang below it.
//! Setting the environment and installing the global subscriber change the whole process, which
//! the other tests of this binary share: the checks run in a child process of this binary that
//! runs them alone.

use crate::common;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::KeyValue;
use opentelemetry_proto::tonic::common::v1::any_value::Value as AnyValue;
use opentelemetry_proto::tonic::trace::v1::Span;
use pgvs3::grpc::proto::ojs::v1 as pb;

/// Collects every export request it receives.
#[derive(Clone, Default)]
struct Collector {
    requests: Arc<Mutex<Vec<ExportTraceServiceRequest>>>,
}

#[tonic::async_trait]
impl TraceService for Collector {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        self.requests
            .lock()
            .expect("collector lock")
            .push(request.into_inner());
        Ok(tonic::Response::new(ExportTraceServiceResponse {
            partial_success: None,
        }))
    }
}

/// One exported span with its resource's service name.
#[derive(Debug, Clone)]
struct Exported {
    service: Option<String>,
    span: Span,
}

impl Collector {
    fn spans(&self) -> Vec<Exported> {
        let requests = self.requests.lock().expect("collector lock");
        let mut out = Vec::new();
        for request in requests.iter() {
            for resource_spans in &request.resource_spans {
                let service = resource_spans
                    .resource
                    .as_ref()
                    .and_then(|r| string_attribute(&r.attributes, "service.name"));
                for scope_spans in &resource_spans.scope_spans {
                    for span in &scope_spans.spans {
                        out.push(Exported {
                            service: service.clone(),
                            span: span.clone(),
                        });
                    }
                }
            }
        }
        out
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn string_attribute(attributes: &[KeyValue], key: &str) -> Option<String> {
    attributes
        .iter()
        .find(|kv| kv.key == key)
        .and_then(|kv| kv.value.as_ref())
        .and_then(|v| match &v.value {
            Some(AnyValue::StringValue(s)) => Some(s.clone()),
            Some(AnyValue::IntValue(i)) => Some(i.to_string()),
            Some(AnyValue::BoolValue(b)) => Some(b.to_string()),
            _ => None,
        })
}

fn describe(spans: &[Exported]) -> String {
    spans
        .iter()
        .map(|e| {
            let s = &e.span;
            let attrs: Vec<String> = s
                .attributes
                .iter()
                .filter(|kv| !kv.key.starts_with("code.") && !kv.key.starts_with("thread."))
                .map(|kv| {
                    format!(
                        "{}={}",
                        kv.key,
                        string_attribute(std::slice::from_ref(kv), &kv.key).unwrap_or_default()
                    )
                })
                .collect();
            format!(
                "  {} trace={} span={} parent={} [{}]",
                s.name,
                hex(&s.trace_id),
                hex(&s.span_id),
                hex(&s.parent_span_id),
                attrs.join(" ")
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Whether `span` is `ancestor` or below it, following parent links among `by_id`.
fn descends_from(span: &Span, ancestor: &[u8], by_id: &HashMap<Vec<u8>, &Span>) -> bool {
    let mut current = span;
    for _ in 0..64 {
        if current.parent_span_id == ancestor {
            return true;
        }
        match by_id.get(&current.parent_span_id) {
            Some(parent) => current = parent,
            None => return false,
        }
    }
    false
}

/// What the test looks for in one trace: the request span (with the caller's span as parent)
/// and a `db` span of operation `db_op` below it.
fn find_request_and_db<'a>(
    spans: &'a [Exported],
    trace_id: &str,
    parent_id: &str,
    path: &str,
    db_op: &str,
) -> Option<(&'a Exported, &'a Exported)> {
    let in_trace: Vec<&Exported> = spans
        .iter()
        .filter(|e| hex(&e.span.trace_id) == trace_id)
        .collect();
    let by_id: HashMap<Vec<u8>, &Span> = in_trace
        .iter()
        .map(|e| (e.span.span_id.clone(), &e.span))
        .collect();
    let request = in_trace.iter().find(|e| {
        e.span.name == "request"
            && hex(&e.span.parent_span_id) == parent_id
            && string_attribute(&e.span.attributes, "path").as_deref() == Some(path)
    })?;
    let db = in_trace.iter().find(|e| {
        e.span.name == "db"
            && string_attribute(&e.span.attributes, "op").as_deref() == Some(db_op)
            && descends_from(&e.span, &request.span.span_id, &by_id)
    })?;
    Some((request, db))
}

/// Names the database the child process serves (set only in that child).
const CHILD_DATABASE_URL: &str = "PGVS3_OTLP_CHILD_DATABASE_URL";

/// The test: runs `spans_in_a_process_of_their_own` in a child process of this test binary, on a
/// database made here. In this process the body's `set_var` would race every other test reading
/// the environment, and its global subscriber would log and export the spans of every test that
/// runs after it.
#[tokio::test]
async fn request_and_db_spans_reach_an_otlp_collector_in_the_callers_trace() {
    let (database, url) = common::fresh_database().await;
    let output = tokio::process::Command::new(std::env::current_exe().expect("this test binary"))
        .args([
            "otlp::spans_in_a_process_of_their_own",
            "--exact",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_DATABASE_URL, &url)
        .output()
        .await
        .expect("run the child test process");
    common::db::drop_database(database);
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success() && stdout.contains("1 passed"),
        "the child test process ({}):\n{stdout}\n{stderr}",
        output.status
    );
}

/// The body of the test above, in a process of its own (run by it: ignored otherwise).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "run in a child process by request_and_db_spans_reach_an_otlp_collector_in_the_callers_trace"]
async fn spans_in_a_process_of_their_own() {
    let Ok(url) = std::env::var(CHILD_DATABASE_URL) else {
        eprintln!("not in the child process of the otlp test: nothing to do");
        return;
    };
    // The collector.
    let collector = Collector::default();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind the collector");
    let collector_addr = listener.local_addr().expect("collector address");
    let server = tonic::transport::Server::builder()
        .add_service(TraceServiceServer::new(collector.clone()))
        .serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener));
    tokio::spawn(async move {
        if let Err(error) = server.await {
            eprintln!("collector stopped: {error}");
        }
    });

    // SAFETY: set before any other thread of this process reads the environment (the child process
    // runs this test alone; the exporter and batch processor read them in `init`).
    unsafe {
        std::env::set_var(
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            format!("http://{collector_addr}"),
        );
        std::env::set_var("OTEL_BSP_SCHEDULE_DELAY", "100");
        // Spans are filtered with events: keep pgvs3's spans at info, the rest quiet.
        std::env::set_var(
            "RUST_LOG",
            "warn,pgvs3::middleware=info,pgvs3::store=info,pgvs3::grpc=info,pgvs3::http=info,pgvs3::core=info",
        );
    }
    let guard = pgvs3::telemetry::init(pgvs3::config::LogFormat::Json);

    // The database belongs to the parent process, which drops it (no name: not dropped here).
    let app = common::spawn_app_on("", &url, |_| {}).await;

    // HTTP: an enqueue carrying the caller's trace context.
    let trace_id = uuid::Uuid::new_v4().simple().to_string();
    let parent_id = uuid::Uuid::new_v4().simple().to_string()[..16].to_string();
    let request_id = format!("req-otlp-{}", uuid::Uuid::new_v4().simple());
    let response = reqwest::Client::new()
        .post(format!("{}/ojs/v1/jobs", app.http_url))
        .header("content-type", "application/json")
        .header("traceparent", format!("00-{trace_id}-{parent_id}-01"))
        .header("tracestate", "k=v")
        .header("x-request-id", &request_id)
        .body(r#"{"type":"otlp.job","args":[1],"options":{"queue":"otlp"}}"#)
        .send()
        .await
        .expect("enqueue");
    assert_eq!(response.status(), reqwest::StatusCode::CREATED);

    // gRPC: a GetJob carrying another trace in its metadata.
    let grpc_trace = uuid::Uuid::new_v4().simple().to_string();
    let grpc_parent = uuid::Uuid::new_v4().simple().to_string()[..16].to_string();
    let job_id = response.json::<serde_json::Value>().await.expect("job")["job"]["id"]
        .as_str()
        .expect("job id")
        .to_string();
    let mut call = tonic::Request::new(pb::GetJobRequest { job_id });
    call.metadata_mut().insert(
        "traceparent",
        format!("00-{grpc_trace}-{grpc_parent}-01")
            .parse()
            .expect("metadata"),
    );
    app.grpc().await.get_job(call).await.expect("gRPC GetJob");

    // Spans arrive after the batch delay (100 ms) ... or at the latest when the guard is dropped.
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut flushed_by_drop = false;
    let mut guard = Some(guard);
    loop {
        let spans = collector.spans();
        let http = find_request_and_db(&spans, &trace_id, &parent_id, "/ojs/v1/jobs", "enqueue");
        let grpc = find_request_and_db(
            &spans,
            &grpc_trace,
            &grpc_parent,
            "/ojs.v1.OJSService/GetJob",
            "get_job",
        );
        if http.is_some() && grpc.is_some() {
            break;
        }
        if Instant::now() > deadline {
            if let Some(guard) = guard.take() {
                // Shutting the provider down flushes; it blocks, so off the async worker.
                tokio::task::block_in_place(|| drop(guard));
                flushed_by_drop = true;
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue;
            }
            panic!(
                "the spans did not arrive ({} export requests; spans:\n{})",
                collector.requests.lock().expect("lock").len(),
                describe(&spans)
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        !flushed_by_drop,
        "spans arrived only when the provider shut down, not after OTEL_BSP_SCHEDULE_DELAY"
    );

    let spans = collector.spans();
    let (request, db) =
        find_request_and_db(&spans, &trace_id, &parent_id, "/ojs/v1/jobs", "enqueue")
            .expect("found above");
    let r = &request.span;
    assert_eq!(hex(&r.trace_id), trace_id, "the caller's trace");
    assert_eq!(
        hex(&r.parent_span_id),
        parent_id,
        "the caller's span is the parent"
    );
    assert_ne!(hex(&r.span_id), parent_id, "a span of its own");
    assert_eq!(
        r.trace_state, "k=v",
        "tracestate carried into the span context"
    );
    assert_eq!(
        string_attribute(&r.attributes, "method").as_deref(),
        Some("POST"),
        "{}",
        describe(std::slice::from_ref(request))
    );
    assert_eq!(
        string_attribute(&r.attributes, "path").as_deref(),
        Some("/ojs/v1/jobs")
    );
    assert_eq!(
        string_attribute(&r.attributes, "request_id").as_deref(),
        Some(request_id.as_str())
    );
    assert_eq!(
        request.service.as_deref(),
        Some("pgvs3"),
        "resource service.name"
    );
    assert!(
        r.end_time_unix_nano >= r.start_time_unix_nano && r.start_time_unix_nano > 0,
        "request span times"
    );
    let d = &db.span;
    assert_eq!(hex(&d.trace_id), trace_id);
    assert!(
        d.start_time_unix_nano >= r.start_time_unix_nano
            && d.end_time_unix_nano <= r.end_time_unix_nano,
        "the db span lies within the request span"
    );

    let (grpc_request, _) = find_request_and_db(
        &spans,
        &grpc_trace,
        &grpc_parent,
        "/ojs.v1.OJSService/GetJob",
        "get_job",
    )
    .expect("found above");
    assert_eq!(
        string_attribute(&grpc_request.span.attributes, "method").as_deref(),
        Some("POST")
    );

    // No request span of these traces is a root: each joined the caller's trace.
    for e in &spans {
        let t = hex(&e.span.trace_id);
        if (t == trace_id || t == grpc_trace) && e.span.name == "request" {
            assert!(
                !e.span.parent_span_id.is_empty(),
                "request span without parent: {}",
                describe(std::slice::from_ref(e))
            );
        }
    }

    app.stop().await;
    if let Some(guard) = guard.take() {
        tokio::task::block_in_place(|| drop(guard));
    }
}
