//! Queue scopes wherever a queue becomes known (`--auth on`): a token scoped to `pub.*` with the
//! admin role (every role) meets the objects of queue `vault` only as ids that do not exist —
//! every by-id operation answers 404 / NOT_FOUND over both protocols and changes nothing; a
//! heartbeat by worker id extends none of vault's leases and names none of its jobs; every list,
//! event page, server-sent event stream, `StreamEvents`, dashboard page and `/metrics` holds
//! nothing of vault; cron and workflows may only be created on queues in scope; and a token
//! creates, lists and revokes only tokens within its own roles and scope.

use crate::common;

use std::time::Duration;

use common::codes::error_code;
use common::http::Http;
use common::tokens::create_token;
use pgvs3::grpc::proto::ojs::v1 as pb;
use pgvs3::grpc::proto::pgvs3::v1 as ext;
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use tonic::Code;

/// A gRPC request carrying `token`.
fn authed<T>(token: &str, message: T) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    request.metadata_mut().insert(
        "authorization",
        format!("Bearer {token}").parse().expect("metadata"),
    );
    request
}

/// A job's lease end, read in the database (the API shows it only to the worker's fetch).
async fn lease_of(database_url: &str, id: &str) -> chrono::DateTime<chrono::Utc> {
    use sqlx::Connection;
    let mut db = sqlx::PgConnection::connect(database_url)
        .await
        .expect("connect");
    sqlx::query_scalar("SELECT lease_expires_at FROM s3p.get_job($1::uuid)")
        .bind(id)
        .fetch_one(&mut db)
        .await
        .expect("the job's lease")
}

/// What vault holds, by id.
struct Vault {
    /// Active, leased to worker `w-vault`.
    leased: String,
    /// Its lease end before the scoped token acts.
    lease_until: chrono::DateTime<chrono::Utc>,
    /// A dead letter.
    dead: String,
    /// A running chain.
    workflow: String,
    /// A cron entry's name.
    cron: &'static str,
    /// A stream batch received by consumer `c`.
    batch: String,
}

async fn stock_vault(admin: &Http, database_url: &str) -> Vault {
    // A dead letter: one attempt, failed.
    let dead = admin
        .ok_post(
            "/ojs/v1/jobs",
            json!({"type": "vault.open", "args": [],
                   "options": {"queue": "vault",
                               "retry": {"max_attempts": 1, "on_exhaustion": "dead_letter"}}}),
        )
        .await["job"]["id"]
        .as_str()
        .expect("id")
        .to_string();
    admin
        .ok_post(
            "/ojs/v1/workers/fetch",
            json!({"queues": ["vault"], "worker_id": "w-dead"}),
        )
        .await;
    admin
        .ok_post(
            "/ojs/v1/workers/nack",
            json!({"job_id": dead, "error": {"code": "boom", "message": "no"}}),
        )
        .await;
    // A job leased to worker w-vault.
    let leased = admin
        .ok_post(
            "/ojs/v1/jobs",
            json!({"type": "vault.count", "args": [], "options": {"queue": "vault"}}),
        )
        .await["job"]["id"]
        .as_str()
        .expect("id")
        .to_string();
    let fetched = admin
        .ok_post(
            "/ojs/v1/workers/fetch",
            json!({"queues": ["vault"], "worker_id": "w-vault", "visibility_timeout_ms": 600000}),
        )
        .await;
    assert_eq!(fetched["jobs"][0]["id"], leased.as_str(), "{fetched}");
    let lease_until = lease_of(database_url, &leased).await;
    let workflow = admin
        .ok_post(
            "/ojs/v1/workflows",
            json!({"type": "chain", "name": "vault-flow", "steps": [
                {"type": "vault.a", "args": [], "options": {"queue": "vault"}},
                {"type": "vault.b", "args": [], "options": {"queue": "vault"}}]}),
        )
        .await["workflow"]["id"]
        .as_str()
        .expect("workflow id")
        .to_string();
    let cron = "nightly-audit";
    admin
        .ok_post(
            "/ojs/v1/cron",
            json!({"name": cron, "expression": "0 3 * * *",
                   "job_template": {"type": "vault.audit", "args": [], "options": {"queue": "vault"}}}),
        )
        .await;
    admin
        .ok_post("/ojs/v1/queues/vault/consumers", json!({"consumer": "c"}))
        .await;
    admin
        .ok_post(
            "/ojs/v1/queues/vault/messages",
            json!({"type": "vault.moved", "payload": {"n": 1}}),
        )
        .await;
    let received = admin
        .ok_post("/ojs/v1/queues/vault/receive", json!({"consumer": "c"}))
        .await;
    let batch = received["batch"]["id"]
        .as_str()
        .or_else(|| received["batch_id"].as_str())
        .unwrap_or_else(|| panic!("a batch: {received}"))
        .to_string();
    Vault {
        leased,
        lease_until,
        dead,
        workflow,
        cron,
        batch,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scoped_token_meets_another_queues_objects_only_as_ids_that_do_not_exist() {
    let app = common::spawn_app_with(|s| s.auth = true).await;
    let url = &app.database_url;
    let admin_token = create_token(url, "ops", &["admin"], None);
    let scoped_token = create_token(url, "pub-all", &["admin"], Some("pub.*"));
    let admin = Http::new(&app).bearer(&admin_token);
    let scoped = Http::new(&app).bearer(&scoped_token);
    let vault = stock_vault(&admin, url).await;
    // Something of its own, so its lists are not empty by accident.
    scoped
        .ok_post(
            "/ojs/v1/jobs",
            json!({"type": "pub.hello", "args": [], "options": {"queue": "pub.a"}}),
        )
        .await;

    // Every by-id operation over HTTP: 404 not_found, exactly as for an id that does not exist.
    let (leased, dead, workflow) = (&vault.leased, &vault.dead, &vault.workflow);
    let calls: Vec<(Method, String, Option<Value>)> = vec![
        (Method::GET, format!("/ojs/v1/jobs/{leased}"), None),
        (Method::DELETE, format!("/ojs/v1/jobs/{leased}"), None),
        (
            Method::POST,
            format!("/ojs/v1/jobs/{leased}/activate"),
            Some(json!({})),
        ),
        (
            Method::POST,
            "/ojs/v1/workers/ack".into(),
            Some(json!({"job_id": leased})),
        ),
        (
            Method::POST,
            "/ojs/v1/workers/nack".into(),
            Some(json!({"job_id": leased, "error": {"code": "x", "message": "x"}})),
        ),
        (
            Method::POST,
            format!("/ojs/v1/dead-letter/{dead}/retry"),
            Some(json!({})),
        ),
        (Method::DELETE, format!("/ojs/v1/dead-letter/{dead}"), None),
        (Method::GET, format!("/ojs/v1/workflows/{workflow}"), None),
        (
            Method::DELETE,
            format!("/ojs/v1/workflows/{workflow}"),
            None,
        ),
        (Method::DELETE, format!("/ojs/v1/cron/{}", vault.cron), None),
        // A batch id of vault under a queue of the token's own.
        (
            Method::GET,
            format!("/ojs/v1/queues/pub.a/batches/{}", vault.batch),
            None,
        ),
    ];
    for (method, path, body) in calls {
        let (status, answer) = scoped.send(method.clone(), &path, body).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{method} {path}: {answer}");
        assert_eq!(
            error_code(&answer),
            "not_found",
            "{method} {path}: {answer}"
        );
        assert!(!answer.to_string().contains("vault"), "{answer}");
    }
    // Naming vault itself stays a 403 (the queue is named, nothing to hide).
    let (status, answer) = scoped
        .get(&format!("/ojs/v1/queues/vault/batches/{}", vault.batch))
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{answer}");
    // A batch ack answers vault's job as unknown.
    let batch = scoped
        .ok_post(
            "/ojs/v1/workers/ack/batch",
            json!({"acks": [{"job_id": leased}]}),
        )
        .await;
    assert_eq!(batch["acknowledged"], 0, "{batch}");
    assert_eq!(batch["results"][0]["error"]["code"], "not_found", "{batch}");
    // Heartbeats: by job id and by worker id, nothing of vault is extended or named.
    for body in [
        json!({"worker_id": "w-vault", "job_ids": [leased], "visibility_timeout_ms": 3600000}),
        json!({"worker_id": "w-vault", "visibility_timeout_ms": 3600000}),
    ] {
        let beat = scoped
            .ok_post("/ojs/v1/workers/heartbeat", body.clone())
            .await;
        assert_eq!(beat["jobs_extended"], json!([]), "{body}: {beat}");
    }

    // The same over gRPC: NOT_FOUND.
    let mut grpc = app.grpc().await;
    let t = scoped_token.as_str();
    let not_found = |what: &str, result: Result<(), tonic::Status>| {
        let status = result.expect_err(what);
        assert_eq!(status.code(), Code::NotFound, "{what}: {status:?}");
        assert!(!status.message().contains("vault"), "{what}: {status:?}");
    };
    let job = |id: &str| id.to_string();
    not_found(
        "GetJob",
        grpc.get_job(authed(
            t,
            pb::GetJobRequest {
                job_id: job(leased),
            },
        ))
        .await
        .map(drop),
    );
    not_found(
        "CancelJob",
        grpc.cancel_job(authed(
            t,
            pb::CancelJobRequest {
                job_id: job(leased),
                ..Default::default()
            },
        ))
        .await
        .map(drop),
    );
    not_found(
        "ActivateJob",
        grpc.activate_job(authed(
            t,
            pb::ActivateJobRequest {
                job_id: job(leased),
            },
        ))
        .await
        .map(drop),
    );
    not_found(
        "Ack",
        grpc.ack(authed(
            t,
            pb::AckRequest {
                job_id: job(leased),
                ..Default::default()
            },
        ))
        .await
        .map(drop),
    );
    not_found(
        "Nack",
        grpc.nack(authed(
            t,
            pb::NackRequest {
                job_id: job(leased),
                ..Default::default()
            },
        ))
        .await
        .map(drop),
    );
    not_found(
        "RetryDeadLetter",
        grpc.retry_dead_letter(authed(t, pb::RetryDeadLetterRequest { job_id: job(dead) }))
            .await
            .map(drop),
    );
    not_found(
        "DeleteDeadLetter",
        grpc.delete_dead_letter(authed(t, pb::DeleteDeadLetterRequest { job_id: job(dead) }))
            .await
            .map(drop),
    );
    not_found(
        "GetWorkflow",
        grpc.get_workflow(authed(
            t,
            pb::GetWorkflowRequest {
                workflow_id: workflow.clone(),
            },
        ))
        .await
        .map(drop),
    );
    not_found(
        "CancelWorkflow",
        grpc.cancel_workflow(authed(
            t,
            pb::CancelWorkflowRequest {
                workflow_id: workflow.clone(),
                ..Default::default()
            },
        ))
        .await
        .map(drop),
    );
    not_found(
        "UnregisterCron",
        grpc.unregister_cron(authed(
            t,
            pb::UnregisterCronRequest {
                name: vault.cron.into(),
            },
        ))
        .await
        .map(drop),
    );
    let mut workers = ext::worker_service_client::WorkerServiceClient::new(
        common::grpc::channel(&app.grpc_url).await,
    );
    let acked = workers
        .ack_batch(authed(
            t,
            ext::AckBatchRequest {
                acks: vec![pb::AckRequest {
                    job_id: job(leased),
                    ..Default::default()
                }],
            },
        ))
        .await
        .expect("AckBatch")
        .into_inner();
    assert_eq!(acked.acknowledged, 0);
    assert_eq!(
        acked.results[0].error.as_ref().map(|e| e.code.as_str()),
        Some("not_found")
    );
    for request in [
        pb::HeartbeatRequest {
            worker_id: "w-vault".into(),
            job_ids: vec![job(leased)],
            visibility_timeout_ms: 3_600_000,
            ..Default::default()
        },
        pb::HeartbeatRequest {
            id: "w-vault".into(),
            visibility_timeout_ms: 3_600_000,
            ..Default::default()
        },
    ] {
        let beat = grpc
            .heartbeat(authed(t, request))
            .await
            .expect("Heartbeat")
            .into_inner();
        assert!(beat.jobs_extended.is_empty(), "{beat:?}");
    }

    // Nothing of vault changed.
    let seen = admin.ok_get(&format!("/ojs/v1/jobs/{leased}")).await;
    assert_eq!(seen["job"]["state"], "active", "{seen}");
    assert_eq!(
        lease_of(url, leased).await,
        vault.lease_until,
        "the lease moved"
    );
    let seen = admin.ok_get(&format!("/ojs/v1/jobs/{dead}")).await;
    assert_eq!(seen["job"]["state"], "discarded", "{seen}");
    let seen = admin.ok_get(&format!("/ojs/v1/workflows/{workflow}")).await;
    assert_eq!(seen["workflow"]["state"], "running", "{seen}");
    let crons = admin.ok_get("/ojs/v1/cron").await;
    assert!(crons.to_string().contains(vault.cron), "{crons}");

    // Lists over HTTP hold nothing of vault (the admin's do: the control).
    for path in [
        "/ojs/v1/queues",
        "/ojs/v1/dead-letter",
        "/ojs/v1/cron",
        "/ojs/v1/events?limit=1000",
    ] {
        let mine = scoped.ok_get(path).await;
        assert!(!mine.to_string().contains("vault"), "{path}: {mine}");
        let all = admin.ok_get(path).await;
        assert!(all.to_string().contains("vault"), "control {path}: {all}");
    }
    // A filter naming a queue outside the scope is refused, as an operation naming it is.
    for path in [
        "/ojs/v1/dead-letter?queue=vault",
        "/ojs/v1/events?queues=vault&limit=1000",
    ] {
        let (status, answer) = scoped.get(path).await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{path}: {answer}");
    }
    let letters = scoped.ok_get("/ojs/v1/dead-letter").await;
    assert_eq!(letters["pagination"]["total"], 0, "{letters}");
    let queues = scoped.ok_get("/ojs/v1/queues").await;
    assert_eq!(queues["pagination"]["total"], 1, "{queues}");
    // Server-sent events from the start of the log: pub.a's enqueue arrives, vault's never.
    let sse = sse_text(&app, &scoped_token, "/ojs/v1/events?after=0").await;
    assert!(sse.contains("pub.a"), "{sse}");
    assert!(!sse.contains("vault"), "{sse}");

    // Lists over gRPC.
    let queues = grpc
        .list_queues(authed(t, pb::ListQueuesRequest::default()))
        .await
        .expect("ListQueues")
        .into_inner();
    assert!(
        queues.queues.iter().all(|q| q.name != "vault"),
        "{queues:?}"
    );
    assert!(!queues.queues.is_empty());
    let letters = grpc
        .list_dead_letter(authed(t, pb::ListDeadLetterRequest::default()))
        .await
        .expect("ListDeadLetter")
        .into_inner();
    assert!(
        letters.jobs.is_empty() && letters.total_count == 0,
        "{letters:?}"
    );
    let crons = grpc
        .list_cron(authed(t, pb::ListCronRequest::default()))
        .await
        .expect("ListCron")
        .into_inner();
    assert!(crons.entries.is_empty(), "{crons:?}");
    // StreamEvents: vault's next event never arrives, pub.a's (logged after it) does.
    let mut events = grpc
        .stream_events(authed(t, pb::StreamEventsRequest::default()))
        .await
        .expect("StreamEvents")
        .into_inner();
    admin
        .ok_post(
            "/ojs/v1/jobs",
            json!({"type": "vault.later", "args": [], "options": {"queue": "vault"}}),
        )
        .await;
    scoped
        .ok_post(
            "/ojs/v1/jobs",
            json!({"type": "pub.later", "args": [], "options": {"queue": "pub.a"}}),
        )
        .await;
    let mut seen = Vec::new();
    let found = tokio::time::timeout(Duration::from_secs(20), async {
        while let Some(event) = events.message().await.expect("event") {
            let text = format!("{event:?}");
            seen.push(text.clone());
            if text.contains("pub.later") {
                return true;
            }
        }
        false
    })
    .await;
    assert_eq!(found, Ok(true), "{seen:?}");
    assert!(seen.iter().all(|e| !e.contains("vault")), "{seen:?}");

    // The dashboard: pages list nothing of vault; vault's ids are not found.
    for page in [
        "/ui",
        "/ui/dead-letters",
        "/ui/cron",
        "/ui/workflows",
        "/ui/streams",
    ] {
        let (status, body) = scoped.get(page).await;
        assert_eq!(status, StatusCode::OK, "{page}: {body}");
        assert!(!body.to_string().contains("vault"), "{page}: {body}");
        let (_, all) = admin.get(page).await;
        assert!(all.to_string().contains("vault"), "control {page}: {all}");
    }
    for page in [
        format!("/ui/jobs/{leased}"),
        format!("/ui/jobs/{dead}"),
        format!("/ui/workflows/{workflow}"),
    ] {
        let (status, body) = scoped.get(&page).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{page}: {body}");
        assert!(!body.to_string().contains("vault"), "{page}: {body}");
    }

    // /metrics: only the token's queues' series.
    let (status, mine) = scoped.get("/metrics").await;
    assert_eq!(status, StatusCode::OK);
    let mine = mine.as_str().unwrap_or_default().to_string();
    assert!(mine.contains("queue=\"pub.a\""), "{mine}");
    assert!(!mine.contains("vault"), "{mine}");
    let (_, all) = admin.get("/metrics").await;
    let all = all.as_str().unwrap_or_default();
    assert!(
        all.contains("pgvs3_job_wait_seconds_count{queue=\"vault\"}"),
        "{all}"
    );
    assert!(all.contains("pgvs3_jobs{queue=\"vault\""), "{all}");

    // Cron and workflows go only to queues in scope (403 naming the queue, as for an enqueue).
    let (status, answer) = scoped
        .post(
            "/ojs/v1/cron",
            json!({"name": "sneaky", "expression": "0 3 * * *",
                   "job_template": {"type": "x", "args": [], "options": {"queue": "vault"}}}),
        )
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{answer}");
    let (status, answer) = scoped
        .post(
            "/ojs/v1/workflows",
            json!({"type": "chain", "steps": [
                {"type": "x", "args": [], "options": {"queue": "pub.a"}},
                {"type": "y", "args": [], "options": {"queue": "vault"}}]}),
        )
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{answer}");
    let refused = grpc
        .register_cron(authed(
            t,
            pb::RegisterCronRequest {
                name: "sneaky".into(),
                cron: "0 3 * * *".into(),
                r#type: "x".into(),
                options: Some(pb::EnqueueOptions {
                    queue: "vault".into(),
                    ..Default::default()
                }),
                ..Default::default()
            },
        ))
        .await
        .expect_err("RegisterCron on vault");
    assert_eq!(refused.code(), Code::PermissionDenied, "{refused:?}");
    app.stop().await;
}

/// The text of a server-sent event stream read for a few seconds.
async fn sse_text(app: &common::TestApp, token: &str, path: &str) -> String {
    let mut response = reqwest::Client::new()
        .get(format!("{}{path}", app.http_url))
        .bearer_auth(token)
        .header("accept", "text/event-stream")
        .send()
        .await
        .expect("event stream");
    assert_eq!(response.status(), StatusCode::OK);
    let mut text = String::new();
    let until = tokio::time::Instant::now() + Duration::from_secs(3);
    while let Ok(Ok(Some(chunk))) = tokio::time::timeout_at(until, response.chunk()).await {
        text.push_str(&String::from_utf8_lossy(&chunk));
    }
    text
}

#[tokio::test]
async fn a_token_creates_lists_and_revokes_only_tokens_within_its_own_scope() {
    let app = common::spawn_app_with(|s| s.auth = true).await;
    let url = &app.database_url;
    create_token(url, "ops", &["admin"], None);
    let billing_token = create_token(url, "billing-admin", &["admin"], Some("billing.*"));
    let billing = Http::new(&app).bearer(&billing_token);
    for (what, body) in [
        ("unscoped", json!({"name": "t1", "roles": ["reader"]})),
        (
            "wider",
            json!({"name": "t2", "roles": ["reader"], "queues": ["billing*"]}),
        ),
        (
            "everything",
            json!({"name": "t3", "roles": ["admin"], "queues": ["*"]}),
        ),
        (
            "partly outside",
            json!({"name": "t4", "roles": ["reader"], "queues": ["billing.eu.*", "mail"]}),
        ),
    ] {
        let (status, answer) = billing.post("/ojs/v1/admin/tokens", body).await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{what}: {answer}");
        assert_eq!(error_code(&answer), "forbidden", "{what}: {answer}");
    }
    let created = billing
        .ok_post(
            "/ojs/v1/admin/tokens",
            json!({"name": "eu", "roles": ["admin"], "queues": ["billing.eu.*"]}),
        )
        .await;
    assert_eq!(created["queues"], json!(["billing.eu.*"]), "{created}");
    // The same refusal over gRPC.
    let mut admin = common::grpc::admin(&app.grpc_url).await;
    let refused = admin
        .create_token(authed(
            &billing_token,
            ext::CreateTokenRequest {
                name: "t5".into(),
                roles: vec!["reader".into()],
                queues: Vec::new(),
            },
        ))
        .await
        .expect_err("unscoped token from a scoped admin");
    assert_eq!(refused.code(), Code::PermissionDenied, "{refused:?}");
    // Its list holds itself and what it made, never the operator's unscoped token.
    let listed = billing.ok_get("/ojs/v1/admin/tokens").await;
    let names: Vec<&str> = listed["tokens"]
        .as_array()
        .expect("tokens")
        .iter()
        .filter_map(|t| t["name"].as_str())
        .collect();
    assert_eq!(names, ["billing-admin", "eu"], "{listed}");
    let listed = admin
        .list_tokens(authed(&billing_token, ext::ListTokensRequest::default()))
        .await
        .expect("ListTokens")
        .into_inner();
    let names: Vec<&str> = listed.tokens.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names, ["billing-admin", "eu"], "{listed:?}");
    // Revoking the operator's token: not found; its own child: done.
    let (status, answer) = billing.delete("/ojs/v1/admin/tokens/ops").await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{answer}");
    let refused = admin
        .revoke_token(authed(
            &billing_token,
            ext::RevokeTokenRequest { name: "ops".into() },
        ))
        .await
        .expect_err("revoke ops");
    assert_eq!(refused.code(), Code::NotFound, "{refused:?}");
    let (status, answer) = billing.delete("/ojs/v1/admin/tokens/eu").await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    app.stop().await;
}

/// An answer with its request id and the id it names blanked, to compare two refusals.
fn without_ids(answer: &Value, id: &str) -> String {
    let mut answer = answer.clone();
    if let Some(error) = answer.get_mut("error").and_then(Value::as_object_mut) {
        error.remove("request_id");
    }
    answer.to_string().replace(id, "ID")
}

#[tokio::test]
async fn another_queues_ids_read_exactly_as_ids_that_do_not_exist() {
    let app = common::spawn_app_with(|s| s.auth = true).await;
    let url = &app.database_url;
    let admin_token = create_token(url, "ops", &["admin"], None);
    let scoped_token = create_token(url, "pub-all", &["admin"], Some("pub.*"));
    let admin = Http::new(&app).bearer(&admin_token);
    let scoped = Http::new(&app).bearer(&scoped_token);
    let vault = stock_vault(&admin, url).await;
    let missing = "01900000-0000-7000-8000-000000000abc";
    for (what, real) in [("job", &vault.leased), ("workflow", &vault.workflow)] {
        for method in [Method::GET, Method::DELETE] {
            let path = |id: &str| format!("/ojs/v1/{what}s/{id}");
            let (status, of_vault) = scoped.send(method.clone(), &path(real), None).await;
            assert_eq!(status, StatusCode::NOT_FOUND, "{of_vault}");
            let (status, of_none) = scoped.send(method.clone(), &path(missing), None).await;
            assert_eq!(status, StatusCode::NOT_FOUND, "{of_none}");
            assert_eq!(
                without_ids(&of_vault, real),
                without_ids(&of_none, missing),
                "{method} {what}"
            );
        }
    }
    let mut grpc = app.grpc().await;
    let mut details = Vec::new();
    for id in [vault.workflow.as_str(), missing] {
        let refused = grpc
            .get_workflow(authed(
                &scoped_token,
                pb::GetWorkflowRequest {
                    workflow_id: id.to_string(),
                },
            ))
            .await
            .expect_err("not found");
        assert_eq!(refused.code(), Code::NotFound);
        let info = tonic_types::StatusExt::get_error_details(&refused)
            .error_info()
            .map(|i| {
                let mut keys: Vec<String> = i.metadata.keys().cloned().collect();
                keys.sort();
                (i.reason.clone(), keys)
            });
        details.push((refused.message().replace(id, "ID"), info));
    }
    assert_eq!(
        details[0], details[1],
        "GetWorkflow of vault's and of no workflow"
    );
    app.stop().await;
}
