//! Tokens and roles (`--auth on`): every operation of the generated HTTP and gRPC tables, called
//! by every role, by a revoked token and by no token, is allowed exactly where the schemas
//! declare it and refused 401/403 (UNAUTHENTICATED / PERMISSION_DENIED) elsewhere; queue scopes
//! hold for operations naming queues; tokens made by the CLI work on every gateway of the
//! database, and a revoked one is refused by all of them within a second.

use crate::common;

use std::time::{Duration, Instant};

use common::raw::Raw;
use common::tokens::{cli, create_token};
use pgvs3::core::{Grant, Role};
use pgvs3::grpc::GRPC_OPERATIONS;
use pgvs3::http::api::HTTP_OPERATIONS;
use serde_json::{Value, json};
use tonic::Code;

/// Who calls: a name, the token sent (if any), and the grant it stands for (if live).
struct Caller {
    name: &'static str,
    token: Option<String>,
    grant: Option<Grant>,
}

fn grant(name: &str, roles: &[Role]) -> Grant {
    Grant {
        name: name.to_string(),
        roles: roles.to_vec(),
        queues: Vec::new(),
    }
}

/// What the schemas say a caller gets for an operation needing `role`.
#[derive(Debug, PartialEq)]
enum Expected {
    Allowed,
    Unauthenticated,
    Forbidden,
}

fn expected(caller: &Caller, role: Role) -> Expected {
    if role == Role::Public {
        return Expected::Allowed;
    }
    match &caller.grant {
        None => Expected::Unauthenticated,
        Some(grant) if grant.has_role(role) => Expected::Allowed,
        Some(_) => Expected::Forbidden,
    }
}

fn fill_path(template: &str) -> String {
    template
        .split('/')
        .map(|segment| match segment {
            "{q}" => "authq",
            s if s.starts_with('{') => "01900000-0000-7000-8000-000000000000",
            s => s,
        })
        .collect::<Vec<_>>()
        .join("/")
}

/// The outcome of one HTTP call, from its status and error code.
async fn http_outcome(
    client: &reqwest::Client,
    base: &str,
    method: &str,
    path: &str,
    token: Option<&str>,
) -> (Expected, String) {
    let mut request = client.request(
        reqwest::Method::from_bytes(method.as_bytes()).expect("method"),
        format!("{base}{path}"),
    );
    if matches!(method, "POST" | "PUT" | "PATCH") {
        request = request
            .header("content-type", "application/openjobspec+json")
            .body("{}");
    }
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    let response = match tokio::time::timeout(Duration::from_secs(5), request.send()).await {
        // Refusals are immediate: an answer still pending got past the check.
        Err(_) => return (Expected::Allowed, "pending".into()),
        Ok(response) => response.expect("send"),
    };
    let status = response.status().as_u16();
    let body = tokio::time::timeout(Duration::from_millis(500), response.text())
        .await
        .ok()
        .and_then(Result::ok)
        .unwrap_or_default();
    let code = serde_json::from_str::<Value>(&body)
        .ok()
        .and_then(|v| {
            v.pointer("/error/code")
                .and_then(Value::as_str)
                .map(str::to_string)
        })
        .unwrap_or_default();
    let outcome = match (status, code.as_str()) {
        (401, "unauthenticated") => Expected::Unauthenticated,
        (403, "forbidden") => Expected::Forbidden,
        (401 | 403, _) => panic!("{method} {path}: {status} with code {code:?}: {body}"),
        _ => Expected::Allowed,
    };
    (outcome, format!("{status} {body}"))
}

/// Calls `path` with an empty message; the status code (`Ok` for any answer or a stream still
/// open after a second).
async fn grpc_code(
    channel: &tonic::transport::Channel,
    path: &str,
    token: Option<&str>,
    body: Vec<u8>,
) -> (Code, String) {
    let mut grpc = tonic::client::Grpc::new(channel.clone());
    grpc.ready().await.expect("channel ready");
    let route = http::uri::PathAndQuery::try_from(path).expect("path");
    let codec = tonic_prost::ProstCodec::<Raw, Raw>::default();
    let mut request = tonic::Request::new(Raw(body));
    if let Some(token) = token {
        request.metadata_mut().insert(
            "authorization",
            format!("Bearer {token}").parse().expect("metadata"),
        );
    }
    let call = async {
        let mut stream = grpc
            .server_streaming(request, route, codec)
            .await?
            .into_inner();
        stream.message().await.map(|_| ())
    };
    match tokio::time::timeout(Duration::from_secs(1), call).await {
        Err(_) | Ok(Ok(())) => (Code::Ok, String::new()),
        Ok(Err(status)) => (status.code(), status.message().to_string()),
    }
}

fn grpc_outcome(code: Code, message: &str) -> Expected {
    match code {
        Code::Unauthenticated => Expected::Unauthenticated,
        Code::PermissionDenied if message.contains("lacks role") => Expected::Forbidden,
        _ => Expected::Allowed,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_operation_allows_exactly_its_declared_roles_on_both_protocols() {
    let app = common::spawn_app_with(|s| s.auth = true).await;
    let url = &app.database_url;
    let mut callers = vec![Caller {
        name: "no token",
        token: None,
        grant: None,
    }];
    for (name, role) in [
        ("reader", Role::Reader),
        ("producer", Role::Producer),
        ("worker", Role::Worker),
        ("admin", Role::Admin),
    ] {
        callers.push(Caller {
            name,
            token: Some(create_token(url, name, &[role.name()], None)),
            grant: Some(grant(name, &[role])),
        });
    }
    let revoked = create_token(url, "revoked", &["admin"], None);
    cli(url, &["revoke", "revoked"]);
    callers.push(Caller {
        name: "revoked",
        token: Some(revoked),
        grant: None,
    });
    callers.push(Caller {
        name: "unknown",
        token: Some("pgvs3_not-a-token".into()),
        grant: None,
    });

    // Every HTTP operation. Admin last, so the queue it drops is not needed afterwards.
    let client = reqwest::Client::new();
    let mut mismatches = Vec::new();
    let mut checked = 0;
    for caller in &callers {
        for op in HTTP_OPERATIONS {
            let path = fill_path(op.path);
            let (got, answer) = http_outcome(
                &client,
                &app.http_url,
                op.method,
                &path,
                caller.token.as_deref(),
            )
            .await;
            let want = expected(caller, op.role);
            checked += 1;
            if got != want {
                mismatches.push(format!(
                    "HTTP {} ({}) as {}: want {want:?}, got {got:?}: {answer}",
                    op.id,
                    op.role.name(),
                    caller.name
                ));
            }
        }
    }
    // Every gRPC method, each caller on a connection of its own.
    for caller in &callers {
        let channel = common::grpc::channel(&app.grpc_url).await;
        for op in GRPC_OPERATIONS {
            let (code, message) =
                grpc_code(&channel, op.path, caller.token.as_deref(), Vec::new()).await;
            let got = grpc_outcome(code, &message);
            let want = expected(caller, op.role);
            checked += 1;
            if got != want {
                mismatches.push(format!(
                    "gRPC {} ({}) as {}: want {want:?}, got {code:?} {message}",
                    op.path,
                    op.role.name(),
                    caller.name
                ));
            }
        }
    }
    assert!(
        checked >= (HTTP_OPERATIONS.len() + GRPC_OPERATIONS.len()) * 7,
        "{checked}"
    );
    assert!(
        mismatches.is_empty(),
        "{} of {checked} calls disagree with the declared roles:\n{}",
        mismatches.len(),
        mismatches.join("\n")
    );
    // Every role is declared somewhere, and each kind of refusal happened.
    for role in [
        Role::Public,
        Role::Reader,
        Role::Producer,
        Role::Worker,
        Role::Admin,
    ] {
        assert!(HTTP_OPERATIONS.iter().any(|op| op.role == role), "{role:?}");
        assert!(GRPC_OPERATIONS.iter().any(|op| op.role == role), "{role:?}");
    }
    app.stop().await;
}

/// A gRPC FetchRequest naming `queues` (field 1, repeated string), hand-encoded.
fn fetch_request(queues: &[&str]) -> Vec<u8> {
    let mut out = Vec::new();
    for queue in queues {
        out.push(0x0a);
        out.push(u8::try_from(queue.len()).expect("short name"));
        out.extend_from_slice(queue.as_bytes());
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queue_scopes_cover_every_queue_an_operation_names() {
    let app = common::spawn_app_with(|s| s.auth = true).await;
    let url = &app.database_url;
    let worker = create_token(url, "billing-worker", &["worker"], Some("billing.*"));
    let producer = create_token(
        url,
        "billing-producer",
        &["producer"],
        Some("billing.*,mail"),
    );
    let admin = create_token(url, "admin", &["admin"], None);
    let client = reqwest::Client::new();
    let post = |token: &str, path: &str, body: Value| {
        client
            .post(format!("{}{path}", app.http_url))
            .bearer_auth(token)
            .json(&body)
            .send()
    };

    // HTTP: a fetch naming one queue outside the scope is refused whole.
    let inside = post(
        &worker,
        "/ojs/v1/workers/fetch",
        json!({"queues": ["billing.a"], "count": 1}),
    )
    .await
    .expect("fetch");
    assert_eq!(inside.status(), 200);
    let outside = post(
        &worker,
        "/ojs/v1/workers/fetch",
        json!({"queues": ["billing.a", "reports"], "count": 1}),
    )
    .await
    .expect("fetch");
    assert_eq!(outside.status(), 403);
    let body: Value = outside.json().await.expect("json");
    assert_eq!(body["error"]["code"], "forbidden");
    assert!(
        body["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("reports")),
        "{body}"
    );

    // A batch spanning queues needs every one; nothing of a refused batch is stored.
    let batch = json!({"jobs": [
        {"type": "scope.job", "args": [], "options": {"queue": "billing.x"}},
        {"type": "scope.job", "args": [], "options": {"queue": "other"}},
    ]});
    let refused = post(&producer, "/ojs/v1/jobs/batch", batch)
        .await
        .expect("batch");
    assert_eq!(refused.status(), 403);
    let ok = post(
        &producer,
        "/ojs/v1/jobs/batch",
        json!({"jobs": [
            {"type": "scope.job", "args": [], "options": {"queue": "billing.x"}},
            {"type": "scope.job", "args": [], "options": {"queue": "mail"}},
        ]}),
    )
    .await
    .expect("batch");
    assert_eq!(ok.status(), 201, "{}", ok.text().await.unwrap_or_default());
    // Enqueue without a queue goes to `default`, outside this scope.
    let default = post(
        &producer,
        "/ojs/v1/jobs",
        json!({"type": "scope.job", "args": []}),
    )
    .await
    .expect("enqueue");
    assert_eq!(default.status(), 403);
    let stats: Value = client
        .get(format!("{}/ojs/v1/queues/other/stats", app.http_url))
        .bearer_auth(&admin)
        .send()
        .await
        .expect("stats")
        .json()
        .await
        .expect("json");
    assert_ne!(
        stats["queue"], "other",
        "nothing was stored in other: {stats}"
    );
    // A path naming a queue outside the scope.
    let receive = post(
        &worker,
        "/ojs/v1/queues/reports/receive",
        json!({"consumer": "c"}),
    )
    .await
    .expect("receive");
    assert_eq!(receive.status(), 403);

    // gRPC: the same fetch, through the adapters' queue check.
    let channel = common::grpc::channel(&app.grpc_url).await;
    let fetch = "/ojs.v1.OJSService/Fetch";
    let (code, message) = grpc_code(
        &channel,
        fetch,
        Some(&worker),
        fetch_request(&["billing.a", "reports"]),
    )
    .await;
    assert_eq!(code, Code::PermissionDenied, "{message}");
    assert!(message.contains("reports"), "{message}");
    let (code, message) = grpc_code(
        &channel,
        fetch,
        Some(&worker),
        fetch_request(&["billing.a"]),
    )
    .await;
    assert_ne!(code, Code::PermissionDenied, "{message}");
    assert_ne!(code, Code::Unauthenticated, "{message}");
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_works_on_every_gateway_and_revocation_reaches_them_within_a_second() {
    let (database, url) = common::fresh_database().await;
    let first = common::spawn_app_on(&database, &url, |s| s.auth = true).await;
    let second = common::spawn_app_on(&database, &url, |s| s.auth = true).await;
    let token = create_token(&url, "reader-a", &["reader"], None);
    let client = reqwest::Client::new();
    let status = |base: String, token: String| {
        let client = client.clone();
        async move {
            client
                .get(format!("{base}/ojs/v1/queues"))
                .bearer_auth(token)
                .send()
                .await
                .expect("list queues")
                .status()
                .as_u16()
        }
    };
    for app in [&first, &second] {
        assert_eq!(status(app.http_url.clone(), token.clone()).await, 200);
    }
    let listed = cli(&url, &["list"]);
    assert!(
        listed.contains("\"reader-a\"") && !listed.contains(&token),
        "{listed}"
    );

    cli(&url, &["revoke", "reader-a"]);
    let revoked_at = Instant::now();
    for app in [&first, &second] {
        loop {
            let answer = status(app.http_url.clone(), token.clone()).await;
            if answer == 401 {
                break;
            }
            assert!(
                revoked_at.elapsed() < Duration::from_secs(1),
                "{} still answers {answer} a second after the revocation",
                app.http_url
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    // The refusal does not echo the token.
    let body = client
        .get(format!("{}/ojs/v1/queues", first.http_url))
        .bearer_auth(&token)
        .send()
        .await
        .expect("list")
        .text()
        .await
        .expect("body");
    assert!(!body.contains(&token[6..]), "{body}");
    // Health and manifest stay open; /metrics needs a reader.
    for path in ["/ojs/v1/health", "/ojs/manifest"] {
        let answer = client
            .get(format!("{}{path}", first.http_url))
            .send()
            .await
            .expect("open route");
        assert_eq!(answer.status(), 200, "{path}");
    }
    let metrics = client
        .get(format!("{}/metrics", first.http_url))
        .send()
        .await
        .expect("metrics");
    assert_eq!(metrics.status(), 401);
    second.stop().await;
    first.stop().await;
}

/// `getMetrics` declares `reader`; `--metrics-open` makes it, and only it, public.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_open_serves_only_metrics_without_a_token() {
    let declared = HTTP_OPERATIONS
        .iter()
        .find(|op| op.id == "getMetrics")
        .expect("getMetrics in the operation table");
    assert_eq!((declared.method, declared.path), ("GET", "/metrics"));
    assert_eq!(declared.role, Role::Reader);
    assert!(declared.read_only);

    let app = common::spawn_app_with(|s| {
        s.auth = true;
        s.metrics_open = true;
    })
    .await;
    let client = reqwest::Client::new();
    let metrics = client
        .get(format!("{}/metrics", app.http_url))
        .send()
        .await
        .expect("metrics");
    assert_eq!(metrics.status(), 200);
    let text = metrics.text().await.expect("metrics text");
    assert!(text.ends_with("# EOF\n"), "{text}");
    let queues = client
        .get(format!("{}/ojs/v1/queues", app.http_url))
        .send()
        .await
        .expect("list queues");
    assert_eq!(
        queues.status(),
        401,
        "other reader operations still need a token"
    );
    app.stop().await;
}

#[test]
fn the_readme_roles_table_matches_the_schemas() {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md"))
        .expect("README.md");
    let security = readme
        .split("## Security")
        .nth(1)
        .and_then(|rest| rest.split("\n## ").next())
        .expect("a Security section");
    let mut http_rows = std::collections::BTreeMap::new();
    let mut grpc_rows = std::collections::BTreeMap::new();
    for line in security.lines().filter(|l| l.starts_with("| `")) {
        let cells: Vec<&str> = line.trim_matches('|').split('|').map(str::trim).collect();
        assert_eq!(cells.len(), 3, "a roles row: {line}");
        let role = cells[0].trim_matches('`').to_string();
        let names = |cell: &str| -> Vec<String> {
            let mut names: Vec<String> = cell
                .split(',')
                .map(|n| n.trim().to_string())
                .filter(|n| !n.is_empty())
                .collect();
            names.sort();
            names
        };
        http_rows.insert(role.clone(), names(cells[1]));
        grpc_rows.insert(role, names(cells[2]));
    }
    let mut http_declared = std::collections::BTreeMap::<String, Vec<String>>::new();
    for op in HTTP_OPERATIONS {
        http_declared
            .entry(op.role.name().to_string())
            .or_default()
            .push(op.id.to_string());
    }
    let mut grpc_declared = std::collections::BTreeMap::<String, Vec<String>>::new();
    for op in GRPC_OPERATIONS {
        // "/ojs.v1.OJSService/GetJob" is written "OJSService/GetJob".
        let (service, method) = op
            .path
            .trim_start_matches('/')
            .split_once('/')
            .expect("path");
        let service = service.rsplit('.').next().expect("service");
        grpc_declared
            .entry(op.role.name().to_string())
            .or_default()
            .push(format!("{service}/{method}"));
    }
    for names in http_declared.values_mut().chain(grpc_declared.values_mut()) {
        names.sort();
    }
    assert_eq!(http_rows, http_declared, "README's HTTP column");
    assert_eq!(grpc_rows, grpc_declared, "README's gRPC column");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_are_managed_over_both_protocols() {
    use pgvs3::grpc::proto::pgvs3::v1 as pb;
    use pgvs3::grpc::proto::pgvs3::v1::admin_service_client::AdminServiceClient;

    let app = common::spawn_app_with(|s| s.auth = true).await;
    let admin = create_token(&app.database_url, "root", &["admin"], None);
    let client = reqwest::Client::new();

    // HTTP: create (the token is in this answer only), use, list.
    let created = client
        .post(format!("{}/ojs/v1/admin/tokens", app.http_url))
        .bearer_auth(&admin)
        .json(&json!({"name": "mail-producer", "roles": ["producer"], "queues": ["mail"]}))
        .send()
        .await
        .expect("create");
    assert_eq!(created.status(), 201);
    let created: Value = created.json().await.expect("json");
    let producer = created["token"].as_str().expect("token").to_string();
    assert_eq!(created["roles"], json!(["producer"]));
    let enqueued = client
        .post(format!("{}/ojs/v1/jobs", app.http_url))
        .bearer_auth(&producer)
        .json(&json!({"type": "mail.send", "args": [], "options": {"queue": "mail"}}))
        .send()
        .await
        .expect("enqueue");
    assert_eq!(enqueued.status(), 201);
    let duplicate = client
        .post(format!("{}/ojs/v1/admin/tokens", app.http_url))
        .bearer_auth(&admin)
        .json(&json!({"name": "mail-producer", "roles": ["producer"]}))
        .send()
        .await
        .expect("create again");
    assert_eq!(duplicate.status(), 409);
    let bad_role = client
        .post(format!("{}/ojs/v1/admin/tokens", app.http_url))
        .bearer_auth(&admin)
        .json(&json!({"roles": ["root"]}))
        .send()
        .await
        .expect("create with a bad role");
    assert_eq!(bad_role.status(), 422);
    // Only an admin manages tokens.
    let by_producer = client
        .get(format!("{}/ojs/v1/admin/tokens", app.http_url))
        .bearer_auth(&producer)
        .send()
        .await
        .expect("list as producer");
    assert_eq!(by_producer.status(), 403);

    // gRPC: list, revoke; then HTTP refuses the token.
    let channel = common::grpc::channel(&app.grpc_url).await;
    let mut grpc = AdminServiceClient::new(channel);
    fn with_token<T>(token: &str, message: T) -> tonic::Request<T> {
        let mut request = tonic::Request::new(message);
        request.metadata_mut().insert(
            "authorization",
            format!("Bearer {token}").parse().expect("metadata"),
        );
        request
    }
    let listed = grpc
        .list_tokens(with_token(&admin, pb::ListTokensRequest {}))
        .await
        .expect("list")
        .into_inner();
    let names: Vec<&str> = listed.tokens.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names, ["mail-producer", "root"]);
    let made = grpc
        .create_token(with_token(
            &admin,
            pb::CreateTokenRequest {
                name: String::new(),
                roles: vec!["reader".into()],
                queues: vec![],
            },
        ))
        .await
        .expect("create over gRPC")
        .into_inner();
    assert!(made.token.starts_with("pgvs3_"));
    assert!(made.info.is_some_and(|i| i.name.starts_with("token-")));
    grpc.revoke_token(with_token(
        &admin,
        pb::RevokeTokenRequest {
            name: "mail-producer".into(),
        },
    ))
    .await
    .expect("revoke");
    let missing = grpc
        .revoke_token(with_token(
            &admin,
            pb::RevokeTokenRequest {
                name: "mail-producer".into(),
            },
        ))
        .await
        .expect_err("already revoked");
    assert_eq!(missing.code(), Code::NotFound);
    let refused = client
        .post(format!("{}/ojs/v1/jobs", app.http_url))
        .bearer_auth(&producer)
        .json(&json!({"type": "mail.send", "args": [], "options": {"queue": "mail"}}))
        .send()
        .await
        .expect("enqueue");
    assert_eq!(refused.status(), 401);
    app.stop().await;
}
