//! Wire shapes the official OJS SDKs read, each read here the way the SDK reads it: workflow
//! steps (`depends_on` as step ids, states by the proto's names on both protocols), cron entries
//! (type, args, options and meta at the top level; only options that were set), queue stats in
//! the HTTP binding's shape beside the conformance shape, one timestamp format, and
//! `--http-content-type json` for clients that read no other media type; a heartbeat naming only
//! its worker (the JS SDK's gRPC transport) keeps every lease that worker holds.

use crate::common;

use pgvs3::grpc::proto::ojs::v1 as pb;
use serde_json::{Value, json};

async fn call(method: reqwest::Method, url: String, body: Option<Value>) -> (u16, Value, String) {
    let client = reqwest::Client::new();
    let mut request = client.request(method, url);
    if let Some(body) = body {
        request = request.json(&body);
    }
    let response = request.send().await.expect("send");
    let status = response.status().as_u16();
    let content_type = response
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string();
    let body = response.json().await.unwrap_or(Value::Null);
    (status, body, content_type)
}

/// RFC 3339, UTC, ending in `Z`.
fn is_utc_z(text: &str) -> bool {
    text.ends_with('Z') && chrono::DateTime::parse_from_rfc3339(text).is_ok()
}

#[tokio::test]
async fn workflow_steps_name_their_dependencies_and_states_alike_on_both_protocols() {
    let app = common::spawn_app().await;
    let (status, created, _) = call(
        reqwest::Method::POST,
        format!("{}/ojs/v1/workflows", app.http_url),
        Some(json!({"name": "shapes", "steps": [
            {"id": "fetch-data", "type": "shape.fetch", "args": []},
            {"id": "build-report", "type": "shape.report", "args": [], "depends_on": ["fetch-data"]},
        ]})),
    )
    .await;
    assert_eq!(status, 201, "{created}");
    let id = created["workflow"]["id"].as_str().expect("id").to_string();
    let (_, read, _) = call(
        reqwest::Method::GET,
        format!("{}/ojs/v1/workflows/{id}", app.http_url),
        None,
    )
    .await;
    // The SDKs read steps[].depends_on as the ids they sent.
    let steps = read["workflow"]["steps"].as_array().expect("steps");
    assert_eq!(steps[0]["depends_on"], json!([]));
    assert_eq!(steps[1]["depends_on"], json!(["fetch-data"]));
    let http_states: Vec<&str> = steps
        .iter()
        .map(|s| s["state"].as_str().expect("state"))
        .collect();
    assert_eq!(http_states, ["pending", "waiting"]);

    let mut grpc = app.grpc().await;
    let workflow = grpc
        .get_workflow(pb::GetWorkflowRequest { workflow_id: id })
        .await
        .expect("get workflow")
        .into_inner()
        .workflow
        .expect("workflow");
    let grpc_states: Vec<String> = workflow
        .steps
        .iter()
        .map(|s| {
            pb::WorkflowStepState::try_from(s.state)
                .expect("a known state")
                .as_str_name()
                .trim_start_matches("WORKFLOW_STEP_STATE_")
                .to_ascii_lowercase()
        })
        .collect();
    assert_eq!(grpc_states, http_states, "the same names on both protocols");
    assert_eq!(workflow.steps[1].depends_on, ["fetch-data"]);
    app.stop().await;
}

#[tokio::test]
async fn cron_entries_carry_the_job_at_the_top_level_with_only_the_options_set() {
    let app = common::spawn_app().await;
    let (status, registered, _) = call(
        reqwest::Method::POST,
        format!("{}/ojs/v1/cron", app.http_url),
        Some(json!({"name": "nightly", "expression": "0 3 * * *",
                    "job_template": {"type": "report.nightly", "args": [7],
                                     "meta": {"team": "data"},
                                     "options": {"queue": "reports", "priority": 5}}})),
    )
    .await;
    assert_eq!(status, 201, "{registered}");
    let (_, listed, _) = call(
        reqwest::Method::GET,
        format!("{}/ojs/v1/cron", app.http_url),
        None,
    )
    .await;
    for entry in [&registered["cron"], &listed["cron_jobs"][0]] {
        assert_eq!(entry["type"], "report.nightly", "{entry}");
        assert_eq!(entry["args"], json!([7]));
        assert_eq!(entry["meta"], json!({"team": "data"}));
        assert_eq!(entry["options"]["queue"], "reports");
        assert_eq!(entry["options"]["priority"], 5);
        let options = entry["job_template"]["options"]
            .as_object()
            .expect("options");
        assert!(
            options.values().all(|v| !v.is_null()),
            "unset options are left out: {options:?}"
        );
        assert_eq!(entry["job_template"]["type"], "report.nightly");
        assert!(is_utc_z(entry["created_at"].as_str().expect("created_at")));
    }
    app.stop().await;
}

#[tokio::test]
async fn queue_stats_also_answer_in_the_binding_shape_with_utc_times() {
    let app = common::spawn_app().await;
    for _ in 0..2 {
        let (status, _, _) = call(
            reqwest::Method::POST,
            format!("{}/ojs/v1/jobs", app.http_url),
            Some(json!({"type": "shape.job", "args": [], "options": {"queue": "shapes"}})),
        )
        .await;
        assert_eq!(status, 201);
    }
    let stats_url = format!("{}/ojs/v1/queues/shapes/stats", app.http_url);
    let (_, stats, _) = call(reqwest::Method::GET, stats_url.clone(), None).await;
    // The binding's shape, as the SDKs read it.
    assert_eq!(stats["status"], "active", "{stats}");
    assert_eq!(stats["stats"]["available"], 2);
    for field in [
        "active",
        "scheduled",
        "retryable",
        "dead",
        "discarded",
        "completed_last_hour",
        "failed_last_hour",
        "avg_duration_ms",
        "avg_wait_ms",
        "throughput_per_second",
    ] {
        assert!(stats["stats"][field].is_number(), "{field}: {stats}");
    }
    assert!(is_utc_z(
        stats["computed_at"].as_str().expect("computed_at")
    ));
    // The conformance shape beside it, its times in the same format.
    assert_eq!(stats["queue"]["name"], "shapes");
    assert_eq!(stats["queue"]["available"], 2);
    let created_at = stats["queue"]["created_at"].as_str().expect("created_at");
    assert!(is_utc_z(created_at), "{created_at}");

    let (status, _, _) = call(
        reqwest::Method::POST,
        format!("{}/ojs/v1/queues/shapes/pause", app.http_url),
        None,
    )
    .await;
    assert_eq!(status, 200);
    let (_, paused, _) = call(reqwest::Method::GET, stats_url, None).await;
    assert_eq!(paused["status"], "paused");
    assert_eq!(paused["queue"]["paused"], true);
    app.stop().await;
}

#[tokio::test]
async fn json_content_type_is_a_switch() {
    let plain = common::spawn_app().await;
    let json_app = common::spawn_app_with(|s| s.json_media_type = "application/json").await;
    let enqueue = json!({"type": "shape.job", "args": []});
    let (_, _, default_type) = call(
        reqwest::Method::POST,
        format!("{}/ojs/v1/jobs", plain.http_url),
        Some(enqueue.clone()),
    )
    .await;
    assert_eq!(default_type, "application/openjobspec+json");
    // The Python SDK ignores bodies whose Content-Type lacks application/json.
    let (status, body, content_type) = call(
        reqwest::Method::POST,
        format!("{}/ojs/v1/jobs", json_app.http_url),
        Some(enqueue),
    )
    .await;
    assert_eq!(status, 201);
    assert_eq!(content_type, "application/json");
    assert!(body["job"]["id"].is_string(), "{body}");
    let (status, error, content_type) = call(
        reqwest::Method::GET,
        format!("{}/ojs/v1/jobs/not-a-job", json_app.http_url),
        None,
    )
    .await;
    assert!(status >= 400, "{error}");
    assert_eq!(content_type, "application/json");
    assert!(error["error"]["code"].is_string(), "{error}");
    json_app.stop().await;
    plain.stop().await;
}

/// Enqueues one job on `queue` and claims it for `worker` with a 500 ms lease; its id.
async fn claim_short(app: &common::TestApp, queue: &str, worker: &str) -> String {
    let (status, _, _) = call(
        reqwest::Method::POST,
        format!("{}/ojs/v1/jobs", app.http_url),
        Some(json!({"type": "long.job", "args": [], "options": {"queue": queue}})),
    )
    .await;
    assert_eq!(status, 201);
    let (status, fetched, _) = call(
        reqwest::Method::POST,
        format!("{}/ojs/v1/workers/fetch", app.http_url),
        Some(json!({"queues": [queue], "worker_id": worker, "visibility_timeout_ms": 500})),
    )
    .await;
    assert_eq!(status, 200, "{fetched}");
    fetched["jobs"][0]["id"]
        .as_str()
        .expect("claimed")
        .to_string()
}

#[tokio::test]
async fn a_heartbeat_naming_only_its_worker_keeps_every_lease_it_holds() {
    let app = common::spawn_app().await;
    let started = tokio::time::Instant::now();
    let js = claim_short(&app, "render", "w-js").await;
    let js_other_queue = claim_short(&app, "thumbs", "w-js").await;
    let http = claim_short(&app, "render", "w-http").await;
    let stranger = claim_short(&app, "render", "w-stranger").await;

    // The JS gRPC transport: the worker id alone, no job, no lease length.
    let mut grpc = app.grpc().await;
    let answer = grpc
        .heartbeat(pb::HeartbeatRequest {
            worker_id: "w-js".into(),
            ..Default::default()
        })
        .await
        .expect("heartbeat")
        .into_inner();
    let mut extended = answer.jobs_extended.clone();
    extended.sort();
    let mut expected = vec![js.clone(), js_other_queue.clone()];
    expected.sort();
    assert_eq!(extended, expected, "both of its jobs, in both queues");
    // Over HTTP the same: `{"worker_id"}` alone.
    let (status, beat, _) = call(
        reqwest::Method::POST,
        format!("{}/ojs/v1/workers/heartbeat", app.http_url),
        Some(json!({"worker_id": "w-http"})),
    )
    .await;
    assert_eq!(status, 200, "{beat}");
    assert_eq!(beat["jobs_extended"], json!([http]));

    // Past the 500 ms leases: the extended jobs are still held, the stranger's is not.
    tokio::time::sleep_until(started + std::time::Duration::from_millis(1200)).await;
    let state = async |id: &str| {
        let (_, job, _) = call(
            reqwest::Method::GET,
            format!("{}/ojs/v1/jobs/{id}", app.http_url),
            None,
        )
        .await;
        job["job"]["state"].as_str().unwrap_or_default().to_string()
    };
    for id in [&js, &js_other_queue, &http] {
        assert_eq!(state(id).await, "active", "{id} kept its lease");
    }
    assert_eq!(
        state(&stranger).await,
        "available",
        "no heartbeat, lease expired"
    );
    app.stop().await;
}
