//! Inputs off the tested path that used to reach PostgreSQL and come back as server errors, or be
//! stored wrong: a gRPC time past year 9999, a retry backoff that overflows, a heartbeat span that
//! overflows, and a workflow step that is itself a workflow (the JS SDK's nested group).

use crate::common;

use pgvs3::grpc::proto::ojs::v1 as pb;
use serde_json::{Value, json};
use tonic::Code;

#[tokio::test]
async fn a_grpc_time_past_year_9999_is_invalid_and_stores_nothing() {
    let app = common::spawn_app().await;
    let mut client = app.grpc().await;
    let refused = client
        .enqueue(pb::EnqueueRequest {
            r#type: "far.future".into(),
            options: Some(pb::EnqueueOptions {
                queue: "far".into(),
                // 10000-01-01T00:00:00Z
                delay_until: Some(prost_types::Timestamp {
                    seconds: 253_402_300_800,
                    nanos: 0,
                }),
                ..Default::default()
            }),
            ..Default::default()
        })
        .await
        .expect_err("refused");
    assert_eq!(refused.code(), Code::InvalidArgument, "{refused:?}");
    assert!(refused.message().contains("10000"), "{refused:?}");
    let http = common::http::Http::new(&app);
    let (_, queues) = http.get("/ojs/v1/queues").await;
    assert!(!queues.to_string().contains("\"far\""), "{queues}");
    app.stop().await;
}

#[tokio::test]
async fn retry_backoff_is_bounded_and_saturates_at_its_maximum() {
    let app = common::spawn_app().await;
    let http = common::http::Http::new(&app);
    let (status, body) = http
        .post(
            "/ojs/v1/jobs",
            json!({"type": "t", "args": [], "options": {"queue": "q",
                   "retry": {"max_attempts": 5, "backoff_coefficient": 1e300}}}),
        )
        .await;
    assert_eq!(status, 422, "{body}");
    assert_eq!(
        body["error"]["details"]["field"], "backoff_coefficient",
        "{body}"
    );
    // The delay of a late retry saturates at max_interval instead of overflowing power().
    let pool = sqlx::PgPool::connect(&app.database_url)
        .await
        .expect("connect");
    for (coefficient, retry) in [(2.0, 1_100), (100.0, 200), (100.0, 3)] {
        let policy = json!({"backoff_coefficient": coefficient, "initial_interval_ms": 1000,
                            "max_interval_ms": 300000, "jitter": false});
        let delay: i64 = sqlx::query_scalar("SELECT s3p.retry_delay_ms($1, $2)")
            .bind(&policy)
            .bind(retry)
            .fetch_one(&pool)
            .await
            .unwrap_or_else(|e| panic!("coefficient {coefficient}, retry {retry}: {e}"));
        assert_eq!(delay, 300_000, "coefficient {coefficient}, retry {retry}");
    }
    let early: i64 = sqlx::query_scalar("SELECT s3p.retry_delay_ms($1, 3)")
        .bind(
            json!({"backoff_coefficient": 2.0, "initial_interval_ms": 1000,
                     "max_interval_ms": 300000, "jitter": false}),
        )
        .fetch_one(&pool)
        .await
        .expect("delay");
    assert_eq!(early, 4_000, "below the cap the backoff is unchanged");
    pool.close().await;
    app.stop().await;
}

#[tokio::test]
async fn a_heartbeat_span_that_overflows_is_refused() {
    let app = common::spawn_app().await;
    let http = common::http::Http::new(&app);
    http.ok_post(
        "/ojs/v1/jobs",
        json!({"type": "t", "args": [], "options": {"queue": "hb"}}),
    )
    .await;
    let fetched = http
        .ok_post(
            "/ojs/v1/workers/fetch",
            json!({"queues": ["hb"], "worker_id": "w"}),
        )
        .await;
    let id = fetched["jobs"][0]["id"].as_str().expect("job").to_string();
    let mut client = app.grpc().await;
    let refused = client
        .heartbeat(pb::HeartbeatRequest {
            id: id.clone(),
            extend_by: Some(prost_types::Duration {
                seconds: i64::MAX / 10,
                nanos: 0,
            }),
            ..Default::default()
        })
        .await
        .expect_err("refused");
    assert_eq!(refused.code(), Code::InvalidArgument, "{refused:?}");
    let job = http.ok_get(&format!("/ojs/v1/jobs/{id}")).await;
    assert_eq!(job["job"]["state"], "active", "{job}");
    app.stop().await;
}

#[tokio::test]
async fn a_nested_workflow_is_refused_and_nothing_is_stored() {
    let app = common::spawn_app().await;
    let http = common::http::Http::new(&app);
    // The JS SDK's chain(a, group(b, c)).
    let (status, body) = http
        .post(
            "/ojs/v1/workflows",
            json!({"type": "chain", "name": "nested", "steps": [
                {"type": "a.step", "args": [], "options": {"queue": "wf"}},
                {"type": "group", "jobs": [
                    {"type": "b.step", "args": []}, {"type": "c.step", "args": []}]}]}),
        )
        .await;
    assert_eq!(status, 400, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("steps[1]") && m.contains("nested")),
        "{body}"
    );
    let mut client = app.grpc().await;
    let refused = client
        .create_workflow(pb::CreateWorkflowRequest {
            name: "nested".into(),
            steps: vec![
                pb::WorkflowStep {
                    id: "a".into(),
                    r#type: "a.step".into(),
                    ..Default::default()
                },
                pb::WorkflowStep {
                    id: "g".into(),
                    r#type: "group".into(),
                    depends_on: vec!["a".into()],
                    ..Default::default()
                },
            ],
        })
        .await
        .expect_err("refused");
    assert_eq!(refused.code(), Code::InvalidArgument, "{refused:?}");
    // Nothing was enqueued: no queue `wf`, no job of either step.
    let (_, queues) = http.get("/ojs/v1/queues").await;
    let names: Vec<Value> = queues["queues"].as_array().cloned().unwrap_or_default();
    assert!(
        names
            .iter()
            .all(|q| q["name"] != "wf" && q["name"] != "default"),
        "{queues}"
    );
    app.stop().await;
}

/// Times that PostgreSQL cannot store (year 0, also reached from year 1 with an eastern offset)
/// are the client's error wherever a job takes a time, cron templates included: never a 500,
/// never a cron entry whose every firing fails.
#[tokio::test]
async fn times_in_year_zero_are_invalid_everywhere() {
    let app = common::spawn_app().await;
    let http = common::http::Http::new(&app);
    for time in ["0000-01-01T00:00:00Z", "0001-01-01T00:30:00+14:00"] {
        for field in ["scheduled_at", "expires_at"] {
            let options = json!({"queue": "y0", field: time});
            for (path, body) in [
                (
                    "/ojs/v1/jobs",
                    json!({"type": "t", "args": [], "options": options}),
                ),
                (
                    "/ojs/v1/jobs/batch",
                    json!({"jobs": [{"type": "t", "args": [], "options": options}]}),
                ),
                (
                    "/ojs/v1/cron",
                    json!({"name": "y0", "expression": "* * * * *", "type": "t",
                           "options": options}),
                ),
                (
                    "/ojs/v1/workflows",
                    json!({"type": "chain", "steps": [{"type": "t", "args": [], "options": options}]}),
                ),
            ] {
                let (status, answer) = http.post(path, body).await;
                assert_eq!(status, 400, "{path} {field} {time}: {answer}");
                assert!(
                    answer["error"]["message"]
                        .as_str()
                        .is_some_and(|m| m.contains("out of range")),
                    "{path} {field} {time}: {answer}"
                );
            }
        }
    }
    let (_, crons) = http.get("/ojs/v1/cron").await;
    assert!(!crons.to_string().contains("\"y0\""), "{crons}");
    app.stop().await;
}

/// A job step with steps or jobs of its own (a nested workflow in another spelling) is refused,
/// not stored without them.
#[tokio::test]
async fn a_step_with_steps_of_its_own_is_refused() {
    let app = common::spawn_app().await;
    let http = common::http::Http::new(&app);
    for key in ["steps", "jobs"] {
        let (status, body) = http
            .post(
                "/ojs/v1/workflows",
                json!({"type": "chain", "name": "n", "steps": [
                    {"type": "t", "args": [], "options": {"queue": "wfn"},
                     key: [{"type": "inner", "args": [9]}, {"type": "inner", "args": [9]}]}]}),
            )
            .await;
        assert_eq!(status, 400, "{key}: {body}");
        assert_eq!(body["error"]["details"]["field"], key, "{body}");
    }
    let (_, queues) = http.get("/ojs/v1/queues").await;
    assert!(!queues.to_string().contains("\"wfn\""), "{queues}");
    app.stop().await;
}

/// A time PostgreSQL cannot hold exactly (a leap second, digits past the microsecond) is
/// answered as it is stored: the enqueue's answer and a later GET say the same instant, on the
/// column path (plain jobs) and the JSON path (unique jobs) alike.
#[tokio::test]
async fn inexact_times_are_answered_as_stored() {
    let app = common::spawn_app().await;
    let http = common::http::Http::new(&app);
    let times = [
        ("2030-06-30T23:59:60Z", "2030-07-01T00:00:00Z"),
        ("2030-06-30T23:59:60.5Z", "2030-07-01T00:00:00.500Z"),
        ("2030-01-01T00:00:00.9999999Z", "2030-01-01T00:00:00.999Z"),
        ("1999-12-31T23:59:59.1234567Z", "1999-12-31T23:59:59.123Z"),
    ];
    for (sent, stored) in times {
        for unique in [false, true] {
            let mut options = json!({"queue": "inexact", "scheduled_at": sent, "expires_at": sent});
            if unique {
                options["unique"] = json!({"keys": ["type", "args"]});
            }
            let job = |route: &str| json!({"type": "t", "args": [sent, unique, route], "options": options});
            let batch = json!({"jobs": [job("batch")]});
            let (status, single) = http.post("/ojs/v1/jobs", job("single")).await;
            assert_eq!(status, 201, "{sent}: {single}");
            let (status, many) = http.post("/ojs/v1/jobs/batch", batch).await;
            assert!(status == 201 || status == 200, "{sent}: {many}");
            let answered = [single["job"].clone(), many["jobs"][0].clone()];
            for answer in answered {
                let id = answer["id"].as_str().expect("an id");
                let (_, read) = http.get(&format!("/ojs/v1/jobs/{id}")).await;
                for field in ["scheduled_at", "expires_at"] {
                    assert_eq!(answer[field], json!(stored), "{sent} {field}: {answer}");
                    assert_eq!(read["job"][field], answer[field], "{sent} {field}: {read}");
                }
            }
        }
    }
    app.stop().await;
}

/// Over gRPC, a time with nanoseconds is answered as stored (whole microseconds): the
/// enqueue's answer and GetJob give the same Timestamp.
#[tokio::test]
async fn a_grpc_time_with_nanoseconds_is_answered_as_stored() {
    let app = common::spawn_app().await;
    let mut client = app.grpc().await;
    let sent = prost_types::Timestamp {
        seconds: 1_924_992_000, // 2031-01-01T00:00:00Z
        nanos: 123_456_789,
    };
    let answered = client
        .enqueue(pb::EnqueueRequest {
            r#type: "t".into(),
            options: Some(pb::EnqueueOptions {
                queue: "nanos".into(),
                delay_until: Some(sent),
                ..Default::default()
            }),
            ..Default::default()
        })
        .await
        .expect("enqueued")
        .into_inner()
        .job
        .expect("a job");
    let stored = client
        .get_job(pb::GetJobRequest {
            job_id: answered.id.clone(),
        })
        .await
        .expect("found")
        .into_inner()
        .job
        .expect("a job");
    let micros = prost_types::Timestamp {
        seconds: 1_924_992_000,
        nanos: 123_456_000,
    };
    assert_eq!(answered.scheduled_at, Some(micros), "{answered:?}");
    assert_eq!(stored.scheduled_at, answered.scheduled_at, "{stored:?}");
    app.stop().await;
}

/// A unique policy on a workflow step or callback is refused when the workflow is made (over
/// HTTP and gRPC), and nothing is stored: the step's job would be enqueued inside the previous
/// step's ack, where a duplicate left the workflow waiting for a job never stored (ignore) or
/// refused the worker's ack (reject).
#[tokio::test]
async fn a_unique_policy_on_a_workflow_step_is_refused_and_nothing_is_stored() {
    let app = common::spawn_app().await;
    let http = common::http::Http::new(&app);
    let unique = json!({"keys": ["type"], "on_conflict": "ignore"});
    let plain = json!({"type": "u.first", "args": [], "options": {"queue": "wfu"}});
    let with_unique =
        json!({"type": "u.second", "args": [], "options": {"queue": "wfu", "unique": unique}});
    let bodies = [
        json!({"type": "chain", "name": "u", "steps": [plain, with_unique]}),
        json!({"type": "batch", "name": "u", "jobs": [plain],
               "callbacks": {"on_complete": with_unique}}),
    ];
    for body in bodies {
        let (status, answer) = http.post("/ojs/v1/workflows", body.clone()).await;
        assert_eq!(status, 400, "{body}: {answer}");
        assert_eq!(answer["error"]["code"], "invalid_request", "{answer}");
        assert_eq!(
            answer["error"]["details"]["field"], "options.unique",
            "{answer}"
        );
    }
    let mut client = app.grpc().await;
    let refused = client
        .create_workflow(pb::CreateWorkflowRequest {
            name: "u".into(),
            steps: vec![pb::WorkflowStep {
                id: "a".into(),
                r#type: "u.first".into(),
                options: Some(pb::EnqueueOptions {
                    queue: "wfu".into(),
                    unique: Some(pb::UniquePolicy {
                        key: vec!["type".into()],
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            }],
        })
        .await
        .expect_err("refused");
    assert_eq!(refused.code(), Code::InvalidArgument, "{refused:?}");
    let (_, workflows) = http.get("/ojs/v1/workflows").await;
    assert_eq!(workflows["pagination"]["total"], 0, "{workflows}");
    let (_, queues) = http.get("/ojs/v1/queues").await;
    assert!(!queues.to_string().contains("\"wfu\""), "{queues}");
    app.stop().await;
}

/// Every queue a workflow's steps and callbacks name exists once the workflow is made: a later
/// step is enqueued inside an ack that holds workflow rows, where making its queue then would
/// wait for the creators' lock (two such acks through two gateways deadlocked on it).
#[tokio::test]
async fn a_workflows_queues_all_exist_once_it_is_made() {
    let app = common::spawn_app().await;
    let http = common::http::Http::new(&app);
    http.ok_post(
        "/ojs/v1/workflows",
        json!({"type": "chain", "name": "later", "steps": [step("a", "wq-first"), step("b", "wq-later")]}),
    )
    .await;
    http.ok_post(
        "/ojs/v1/workflows",
        json!({"type": "batch", "name": "callbacks", "jobs": [step("c", "wq-first")],
               "callbacks": {"on_failure": step("f", "wq-callback")}}),
    )
    .await;
    let (_, queues) = http.get("/ojs/v1/queues").await;
    for name in ["wq-first", "wq-later", "wq-callback"] {
        assert!(
            queues["queues"]
                .as_array()
                .is_some_and(|qs| qs.iter().any(|q| q["name"] == name)),
            "{name}: {queues}"
        );
    }
    app.stop().await;
}

/// A queue a running workflow still needs (a step waiting or enqueued there, or a callback) is
/// not dropped: 409 over both protocols, with its jobs and the workflow as they were. Once the
/// workflow ends, the drop goes through.
#[tokio::test]
async fn a_queue_a_running_workflow_needs_is_not_dropped() {
    use pgvs3::grpc::proto::pgvs3::v1 as ext;
    let app = common::spawn_app().await;
    let http = common::http::Http::new(&app);
    let mut admin = common::grpc::admin(&app.grpc_url).await;
    let chain = http
        .ok_post(
            "/ojs/v1/workflows",
            json!({"type": "chain", "name": "needs", "steps": [step("a", "wd-first"), step("b", "wd-later")]}),
        )
        .await;
    let chain = chain["workflow"]["id"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    http.ok_post(
        "/ojs/v1/workflows",
        json!({"type": "batch", "name": "calls", "jobs": [step("c", "wd-first")],
               "callbacks": {"on_complete": step("f", "wd-callback")}}),
    )
    .await;
    // The first step is enqueued, the second waits, the callback is still to come.
    for queue in ["wd-first", "wd-later", "wd-callback"] {
        let (status, answer) = http.delete(&format!("/ojs/v1/queues/{queue}")).await;
        assert_eq!(status, 409, "{queue}: {answer}");
        assert_eq!(answer["error"]["code"], "conflict", "{answer}");
        let refused = admin
            .drop_queue(ext::DropQueueRequest {
                queue: queue.into(),
            })
            .await
            .expect_err("refused");
        assert_eq!(refused.code(), Code::FailedPrecondition, "{refused:?}");
    }
    let first = http.ok_get("/ojs/v1/admin/queues/wd-first").await;
    assert_eq!(first["counts"]["available"], 2, "{first}");
    let flow = http.ok_get(&format!("/ojs/v1/workflows/{chain}")).await;
    assert_eq!(flow["workflow"]["state"], "running", "{flow}");

    // A queue no running workflow needs any more goes.
    let (status, answer) = http.delete(&format!("/ojs/v1/workflows/{chain}")).await;
    assert!(status.is_success(), "{answer}");
    let (status, answer) = http.delete("/ojs/v1/queues/wd-later").await;
    assert!(status.is_success(), "{answer}");
    app.stop().await;
}

/// A job of type `t` on queue `q`, as a workflow step or callback.
fn step(t: &str, q: &str) -> Value {
    json!({"type": t, "args": [], "options": {"queue": q}})
}
