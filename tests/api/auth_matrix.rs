//! The adversarial authorization matrix (issue #26 item 6), generated from the operation tables:
//! every operation of `HTTP_OPERATIONS` and `GRPC_OPERATIONS`, called by callers who may not use
//! it, in every spelling a client could choose, must never succeed, never reveal the planted
//! queue `vault`, and must leave the database exactly as it was.
//!
//! - Target: a queue `vault` holding an available, an active (leased by worker `w-vault`), a
//!   pending and a dead-lettered job, a workflow, a cron entry, a stream consumer with an open
//!   batch and a stream dead letter. Every path template is filled from its parameter names with
//!   vault's objects (`{q}` -> vault, `jobs/{id}` -> a job, `batches/{id}` -> the batch...), every
//!   request body and gRPC message aims at vault (`http_samples`, `grpc_samples`). An operation
//!   without a sample gets a generic one (`{}`, an empty message, unknown parameters filled with
//!   vault's name), so a new operation joins the matrix by itself, as do new methods, content
//!   types and spellings added to the lists below.
//! - Callers: no token; a token lacking the operation's role (skipped for public operations); a
//!   token holding every role scoped to `pub.*` ("outside the scope"); a revoked admin token.
//! - Variants: the operation's own method, HEAD and OPTIONS (GET too for gRPC paths; a method
//!   that is another operation's on the same path, as HEAD is a GET's, is left to it) × the seven
//!   content types of `CONTENT_TYPES` × the path spellings of `Spelling` × HTTP/1.1 and HTTP/2
//!   (h2c with prior knowledge). The full cross product is sent for the no-token caller (the
//!   header-only bypass of the issue), with each operation's first sample; to stay within a
//!   minute in a debug build, its other samples and the other callers get the path as written
//!   only, and the callers with a token one content type of each kind (`FEWER_CONTENT_TYPES`);
//!   HTTP operations go over HTTP/1.1 (the no-token caller's also over HTTP/2), gRPC paths over
//!   both (`plan`, `variants`).
//! - Verdicts: a caller without the role, token or with a revoked one never gets a 2xx (for gRPC,
//!   a 2xx whose `grpc-status` is missing or 0: a trailers-only OK is a success). The scoped
//!   caller may get a 2xx only for requests within its scope (`Reach`): naming nothing of vault
//!   (a heartbeat of worker `w-vault` counts as its own) and not minting or revoking a token
//!   wider than `pub.*`; or a batch answer refusing the items naming vault one by one
//!   (`not_found`/`forbidden`). Public operations may answer anyone. No successful answer may
//!   contain vault's name or ids beyond those the request itself carried. No request goes
//!   unanswered (each is time-boxed). Afterwards every table of `s3p` and of every queue schema
//!   is compared, row by row, with its state before the matrix: a lease extended by a heartbeat
//!   is a change too.
//! - Failures are collected and printed together (a count per class with examples, then every
//!   request; the whole report is also written to `auth_matrix_failures.txt` in the target's
//!   tmp directory).
//!
//! `samples_are_valid_requests_for_an_admin` is the harness's own control: the admin token's
//! sample of every operation does what it asks (a success, no item of it refused), so refusals
//! in the matrix are refusals of the caller, not of a malformed body or of a path naming
//! nothing.

use crate::common;

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::fmt::Write as _;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::http::Http;
use common::tokens::{cli, create_token};
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use pgvs3::core::Role;
use pgvs3::grpc::GRPC_OPERATIONS;
use pgvs3::grpc::proto::ojs::v1 as ojs;
use pgvs3::grpc::proto::pgvs3::v1 as pg;
use pgvs3::http::api::HTTP_OPERATIONS;
use prost::Message;
use serde_json::{Value, json};

/// The request content types every variant is sent with (`None`: no header).
const CONTENT_TYPES: &[Option<&str>] = &[
    Some("application/json"),
    Some("application/openjobspec+json"),
    Some("application/grpc"),
    Some("application/grpc+proto"),
    Some("application/grpc-web"),
    Some("text/plain"),
    None,
];

/// The content types the callers with a token send: one of each kind (JSON, gRPC, none).
const FEWER_CONTENT_TYPES: &[Option<&str>] =
    &[Some("application/json"), Some("application/grpc"), None];

/// Methods sent besides an operation's own.
const EXTRA_METHODS: &[&str] = &["HEAD", "OPTIONS"];
/// Methods sent to gRPC paths besides POST and `EXTRA_METHODS`.
const EXTRA_GRPC_METHODS: &[&str] = &["GET"];

/// The planted queue and the names of its objects.
const QUEUE: &str = "vault";
const WORKER: &str = "w-vault";
const CONSUMER: &str = "vault-reader";
const CRON: &str = "vault-nightly";
/// A token the samples try to revoke.
const TOKEN_TARGET: &str = "matrix-reader";

/// How long an answer's head may take; then how long its body is read.
const HEAD_WITHIN: Duration = Duration::from_secs(10);
const BODY_WITHIN: Duration = Duration::from_millis(400);
/// How much of a body is kept (searched for vault's names).
const BODY_KEPT: usize = 64 * 1024;
/// Requests in flight at once.
const WORKERS: usize = 16;

/// How a path is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Spelling {
    AsIs,
    TrailingSlash,
    DoubledSlash,
    PercentEncoded,
    ExtraQuery,
}

impl Spelling {
    const ALL: [Spelling; 5] = [
        Spelling::AsIs,
        Spelling::TrailingSlash,
        Spelling::DoubledSlash,
        Spelling::PercentEncoded,
        Spelling::ExtraQuery,
    ];

    /// `path` (filled, without query) and `query` spelled this way.
    fn spell(self, path: &str, literal: &[bool], query: &str) -> String {
        let path = match self {
            Spelling::AsIs | Spelling::ExtraQuery => path.to_string(),
            Spelling::TrailingSlash => format!("{path}/"),
            // The slash before the last segment, doubled.
            Spelling::DoubledSlash => match path.rfind('/') {
                Some(i) => format!("{}/{}", &path[..i], &path[i..]),
                None => format!("/{path}"),
            },
            // The last literal segment (the one a router matches as text), every byte escaped.
            Spelling::PercentEncoded => {
                let mut segments: Vec<String> = path.split('/').map(str::to_string).collect();
                if let Some(i) = (1..segments.len()).rev().find(|&i| literal[i]) {
                    segments[i] = segments[i].bytes().fold(String::new(), |mut s, b| {
                        let _ = write!(s, "%{b:02X}");
                        s
                    });
                }
                segments.join("/")
            }
        };
        let query = match (self, query.is_empty()) {
            (Spelling::ExtraQuery, true) => "matrix=1".to_string(),
            (Spelling::ExtraQuery, false) => format!("{query}&matrix=1"),
            _ => query.to_string(),
        };
        if query.is_empty() {
            path
        } else {
            format!("{path}?{query}")
        }
    }
}

/// The HTTP version a request goes over.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Wire {
    H1,
    H2,
}

/// Who calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum CallerKind {
    NoToken,
    LacksRole,
    Scoped,
    Revoked,
}

impl CallerKind {
    const ALL: [CallerKind; 4] = [
        CallerKind::NoToken,
        CallerKind::LacksRole,
        CallerKind::Scoped,
        CallerKind::Revoked,
    ];
}

/// The tokens of the matrix.
struct Tokens {
    admin: String,
    /// One unscoped token per grantable role but admin.
    single: Vec<(Role, String)>,
    scoped: String,
    revoked: String,
}

impl Tokens {
    fn create(url: &str) -> Tokens {
        let admin = create_token(url, "matrix-admin", &["admin"], None);
        let single = [Role::Reader, Role::Producer, Role::Worker]
            .into_iter()
            .map(|role| {
                let name = format!("matrix-{}", role.name());
                (role, create_token(url, &name, &[role.name()], None))
            })
            .collect();
        let all: Vec<&str> = Role::GRANTABLE.iter().map(|r| r.name()).collect();
        let scoped = create_token(url, "matrix-scoped", &all, Some("pub.*"));
        let revoked = create_token(url, "matrix-revoked", &["admin"], None);
        cli(url, &["revoke", "matrix-revoked"]);
        Tokens {
            admin,
            single,
            scoped,
            revoked,
        }
    }

    /// The caller's label and token for an operation needing `role`; `None` when the kind does
    /// not apply (no token lacks the public role).
    fn caller(&self, kind: CallerKind, role: Role) -> Option<(String, Option<String>)> {
        match kind {
            CallerKind::NoToken => Some(("no token".into(), None)),
            CallerKind::Scoped => Some(("scoped to pub.*".into(), Some(self.scoped.clone()))),
            CallerKind::Revoked => Some(("revoked admin".into(), Some(self.revoked.clone()))),
            CallerKind::LacksRole if role == Role::Public => None,
            CallerKind::LacksRole => self
                .single
                .iter()
                .find(|(held, _)| *held != role)
                .map(|(held, token)| (format!("{} only", held.name()), Some(token.clone()))),
        }
    }
}

/// What was planted in vault.
struct Vault {
    available: String,
    active: String,
    lease: String,
    pending: String,
    dead: String,
    workflow: String,
    workflow_jobs: Vec<String>,
    batch: String,
    messages: Vec<String>,
    stream_dead_letter: String,
}

impl Vault {
    /// Text no answer to a caller outside vault may contain.
    fn secrets(&self) -> Vec<String> {
        let mut secrets = vec![
            QUEUE.to_string(),
            self.available.clone(),
            self.active.clone(),
            self.lease.clone(),
            self.pending.clone(),
            self.dead.clone(),
            self.workflow.clone(),
            self.batch.clone(),
            self.stream_dead_letter.clone(),
        ];
        secrets.extend(self.workflow_jobs.iter().cloned());
        secrets.extend(self.messages.iter().cloned());
        secrets.retain(|s| !s.is_empty());
        secrets
    }
}

fn text(value: &Value, pointer: &str) -> String {
    value
        .pointer(pointer)
        .and_then(Value::as_str)
        .unwrap_or_else(|| panic!("{pointer} in {value}"))
        .to_string()
}

/// Fills vault with something of every kind, as an admin.
async fn plant(app: &common::TestApp, admin: &str) -> Vault {
    let http = Http::new(app).bearer(admin);
    let enqueue = |job_type: &str, options: Value| {
        let mut options = options;
        options["queue"] = json!(QUEUE);
        json!({"type": job_type, "args": [1], "options": options})
    };
    let claim = |visibility: u64| {
        json!({"queues": [QUEUE], "count": 1, "worker_id": WORKER,
               "visibility_timeout_ms": visibility})
    };

    // A dead letter: one attempt, failed.
    let dead = http
        .ok_post(
            "/ojs/v1/jobs",
            enqueue(
                "vault.doomed",
                json!({"retry": {"max_attempts": 1, "on_exhaustion": "dead_letter"}}),
            ),
        )
        .await;
    let dead = text(&dead, "/job/id");
    let claimed = http.ok_post("/ojs/v1/workers/fetch", claim(60_000)).await;
    assert_eq!(text(&claimed, "/jobs/0/id"), dead, "{claimed}");
    let nacked = http
        .ok_post(
            "/ojs/v1/workers/nack",
            json!({"job_id": dead, "lease_token": text(&claimed, "/jobs/0/lease_token"),
                   "worker_id": WORKER, "error": {"message": "vault is sealed", "retryable": false}}),
        )
        .await;
    assert_eq!(nacked["state"], "discarded", "{nacked}");

    // An active job whose lease outlasts the test.
    let active = http
        .ok_post("/ojs/v1/jobs", enqueue("vault.running", json!({})))
        .await;
    let active = text(&active, "/job/id");
    let claimed = http
        .ok_post("/ojs/v1/workers/fetch", claim(3_600_000))
        .await;
    assert_eq!(text(&claimed, "/jobs/0/id"), active, "{claimed}");
    let lease = text(&claimed, "/jobs/0/lease_token");

    let available = http
        .ok_post("/ojs/v1/jobs", enqueue("vault.waiting", json!({})))
        .await;
    let available = text(&available, "/job/id");
    let pending = http
        .ok_post(
            "/ojs/v1/jobs",
            enqueue("vault.pending", json!({"pending": true})),
        )
        .await;
    let pending = text(&pending, "/job/id");

    let workflow = http
        .ok_post(
            "/ojs/v1/workflows",
            json!({"name": "vault-flow", "steps": [
                {"id": "open", "type": "vault.open", "args": [], "options": {"queue": QUEUE}},
                {"id": "count", "type": "vault.count", "args": [], "options": {"queue": QUEUE},
                 "depends_on": ["open"]}]}),
        )
        .await;
    let workflow_jobs = workflow["workflow"]["steps"]
        .as_array()
        .map(|steps| {
            steps
                .iter()
                .filter_map(|s| s["job_id"].as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default();
    let workflow = text(&workflow, "/workflow/id");

    http.ok_post(
        "/ojs/v1/cron",
        json!({"name": CRON, "expression": "0 3 * * *",
               "job_template": {"type": "vault.nightly", "args": [], "options": {"queue": QUEUE}}}),
    )
    .await;

    // The stream: a consumer with an open batch, one of whose messages is a dead letter.
    http.ok_post(
        &format!("/ojs/v1/queues/{QUEUE}/config"),
        json!({"max_retries": 0}),
    )
    .await;
    http.ok_post(
        &format!("/ojs/v1/queues/{QUEUE}/consumers"),
        json!({"consumer": CONSUMER, "from_tick": 0}),
    )
    .await;
    let appended = http
        .ok_post(
            &format!("/ojs/v1/queues/{QUEUE}/messages/batch"),
            json!({"messages": [{"type": "vault.opened", "payload": 1},
                                {"type": "vault.counted", "payload": 2}]}),
        )
        .await;
    let messages: Vec<String> = (0..2)
        .map(|i| text(&appended, &format!("/messages/{i}/id")))
        .collect();
    let batch = http
        .ok_post(
            &format!("/ojs/v1/queues/{QUEUE}/receive"),
            json!({"consumer": CONSUMER}),
        )
        .await;
    let batch = text(&batch, "/batch_id");
    let nacked = http
        .ok_post(
            "/ojs/v1/streams/nack",
            json!({"queue": QUEUE, "batch_id": batch, "message_id": messages[0]}),
        )
        .await;
    assert_eq!(nacked["outcome"], "dead_letter", "{nacked}");
    let letters = http.ok_get(&format!("/ojs/v1/queues/{QUEUE}/dlq")).await;
    let stream_dead_letter = text(&letters, "/dead_letters/0/id");

    Vault {
        available,
        active,
        lease,
        pending,
        dead,
        workflow,
        workflow_jobs,
        batch,
        messages,
        stream_dead_letter,
    }
}

/// A server with auth on and no maintenance (nothing but requests changes the database), its
/// tokens and vault.
async fn fixture() -> (common::TestApp, Tokens, Vault) {
    let app = common::spawn_app_with(|s| {
        s.auth = true;
        s.maintenance_interval = None;
    })
    .await;
    let url = app.database_url.clone();
    let tokens = tokio::task::spawn_blocking(move || Tokens::create(&url))
        .await
        .expect("tokens");
    let vault = plant(&app, &tokens.admin).await;
    // The gateway hands the workers the planting saw to the registry on its next tick (0.5 s):
    // let that land before the matrix's snapshot.
    tokio::time::sleep(std::time::Duration::from_millis(1200)).await;
    (app, tokens, vault)
}

/// One way of calling an operation: query, body and `Accept`.
#[derive(Clone)]
struct Sample {
    query: String,
    body: Bytes,
    accept: Option<&'static str>,
    /// Made up for an operation the matrix has no sample for.
    generic: bool,
    /// Whether a token scoped outside vault may make this request.
    reach: Reach,
}

/// Whether a token scoped outside vault may make a sample's request.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Reach {
    /// Not when it names vault's queue or objects.
    ByName,
    /// Yes: it names vault only through the worker id, the caller's own; only the answer and the
    /// database say whether vault was touched.
    Own,
    /// No, though it names nothing of vault: it reaches beyond the caller's scope (minting an
    /// unscoped token, revoking a token wider than the caller's scope).
    Beyond,
}

impl Sample {
    fn new(query: &str, body: Option<Value>) -> Sample {
        Sample {
            query: query.to_string(),
            body: body.map_or_else(Bytes::new, |b| Bytes::from(b.to_string())),
            accept: None,
            generic: false,
            reach: Reach::ByName,
        }
    }

    /// The same sample with another `reach`.
    fn reach(self, reach: Reach) -> Sample {
        Sample { reach, ..self }
    }
}

/// The value of path parameter `name` following the segment `before`, for operation `op`.
fn parameter(op: &str, before: &str, name: &str, v: &Vault) -> String {
    match (op, before, name) {
        ("activateJob", _, _) => v.pending.clone(),
        (_, "jobs", _) => v.available.clone(),
        (_, "dead-letter", _) => v.dead.clone(),
        (_, "batches", _) => v.batch.clone(),
        (_, "dlq", _) => v.stream_dead_letter.clone(),
        (_, "workflows", _) => v.workflow.clone(),
        (_, "cron", _) => CRON.into(),
        (_, "tokens", _) => TOKEN_TARGET.into(),
        (_, "consumers", _) => CONSUMER.into(),
        (_, _, "id" | "job_id") => v.available.clone(),
        // `{q}`, `{queue}` and any parameter the matrix does not know yet.
        _ => QUEUE.into(),
    }
}

/// `template` filled with vault's objects; which segments are literal text.
fn fill(op: &str, template: &str, v: &Vault) -> (String, Vec<bool>) {
    let segments: Vec<&str> = template.split('/').collect();
    let mut filled = Vec::new();
    let mut literal = Vec::new();
    for (i, segment) in segments.iter().enumerate() {
        match segment.strip_prefix('{').and_then(|s| s.strip_suffix('}')) {
            Some(name) => {
                let before = if i > 0 { segments[i - 1] } else { "" };
                filled.push(parameter(op, before, name, v));
                literal.push(false);
            }
            None => {
                filled.push(segment.to_string());
                literal.push(!segment.is_empty());
            }
        }
    }
    (filled.join("/"), literal)
}

/// Requests of an HTTP operation aimed at vault.
fn http_samples(id: &str, method: &str, v: &Vault) -> Vec<Sample> {
    let job = |job_type: &str| json!({"type": job_type, "args": [], "options": {"queue": QUEUE}});
    let none = |query: &str| Sample::new(query, None);
    let with = |body: Value| Sample::new("", Some(body));
    match id {
        "getMetrics"
        | "getManifest"
        | "getHealth"
        | "listTokens"
        | "listCron"
        | "listQueues"
        | "unregisterCron"
        | "deleteDeadLetter"
        | "getJob"
        | "cancelJob"
        | "activateJob"
        | "dropQueue"
        | "getBatch"
        | "getQueueConfig"
        | "listConsumers"
        | "unsubscribe"
        | "listStreamDeadLetters"
        | "streamInfo"
        | "queueStats"
        | "getWorkflow"
        | "cancelWorkflow"
        | "retryDeadLetter"
        | "replayStreamDeadLetters"
        | "replayStreamDeadLetter"
        | "pauseQueue"
        | "resumeQueue" => vec![none("")],
        "listDeadLetter" => vec![none(""), none("queue=vault")],
        "listEvents" => vec![
            none(""),
            none("queues=vault"),
            Sample {
                accept: Some("text/event-stream"),
                ..none("queues=vault")
            },
        ],
        "purgeStreamDeadLetters" => vec![none("older_than=1ms")],
        "createToken" => {
            vec![with(json!({"name": "matrix-minted", "roles": ["admin"]})).reach(Reach::Beyond)]
        }
        "revokeToken" => vec![none("").reach(Reach::Beyond)],
        "registerCron" => vec![with(
            json!({"name": "vault-hourly", "expression": "0 * * * *",
                                           "job_template": job("vault.hourly")}),
        )],
        "enqueueJob" => vec![with(job("vault.intruder"))],
        "enqueueJobs" => vec![with(json!({"jobs": [job("vault.intruder")]}))],
        "createQueue" => vec![with(json!({"name": QUEUE}))],
        "setQueueConfig" => vec![with(json!({"max_retries": 3}))],
        "subscribe" => vec![with(json!({"consumer": "vault-intruder", "from_tick": 0}))],
        "appendMessage" => vec![with(json!({"type": "vault.forged", "payload": 0}))],
        "appendMessages" => vec![with(
            json!({"messages": [{"type": "vault.forged", "payload": 0}]}),
        )],
        "receive" => vec![with(json!({"consumer": CONSUMER, "wait_ms": 0}))],
        "streamAck" => vec![with(json!({"queue": QUEUE, "batch_id": v.batch}))],
        "streamNack" => vec![with(
            json!({"queue": QUEUE, "batch_id": v.batch, "message_id": v.messages[1]}),
        )],
        "ackJob" => vec![with(
            json!({"job_id": v.active, "lease_token": v.lease, "worker_id": WORKER}),
        )],
        "ackJobs" => vec![with(
            json!({"acks": [{"job_id": v.active, "lease_token": v.lease, "worker_id": WORKER}]}),
        )],
        "nackJob" => vec![with(json!({"job_id": v.active, "lease_token": v.lease,
                                      "worker_id": WORKER, "error": {"message": "intruder"}}))],
        "fetchJobs" => vec![with(
            json!({"queues": [QUEUE], "count": 1, "worker_id": "w-intruder", "wait_ms": 0}),
        )],
        // Naming no job extends every lease the worker holds.
        "heartbeat" => vec![
            with(json!({"worker_id": WORKER})).reach(Reach::Own),
            with(json!({"worker_id": WORKER, "job_id": v.active})).reach(Reach::Own),
        ],
        "createWorkflow" => vec![with(json!({"name": "vault-intrusion", "steps": [
            {"id": "a", "type": "vault.intruder", "args": [], "options": {"queue": QUEUE}}]}))],
        _ => vec![Sample {
            generic: true,
            ..Sample::new(
                "",
                matches!(method, "POST" | "PUT" | "PATCH").then(|| json!({})),
            )
        }],
    }
}

/// A gRPC message in its length-prefixed frame.
fn frame(message: &impl Message) -> Bytes {
    let encoded = message.encode_to_vec();
    let mut out = Vec::with_capacity(encoded.len() + 5);
    out.push(0);
    out.extend_from_slice(&u32::try_from(encoded.len()).expect("small").to_be_bytes());
    out.extend_from_slice(&encoded);
    Bytes::from(out)
}

/// Requests of a gRPC method aimed at vault, framed.
fn grpc_samples(path: &str, v: &Vault) -> Vec<Sample> {
    let q = || QUEUE.to_string();
    let options = || {
        Some(ojs::EnqueueOptions {
            queue: q(),
            ..Default::default()
        })
    };
    let ack = || ojs::AckRequest {
        job_id: v.active.clone(),
        lease_token: v.lease.clone(),
        worker_id: WORKER.into(),
        ..Default::default()
    };
    let frames: Vec<Bytes> = match path.trim_start_matches('/') {
        "ojs.v1.OJSService/Manifest" => vec![frame(&ojs::ManifestRequest {})],
        "ojs.v1.OJSService/Health" => vec![frame(&ojs::HealthRequest {})],
        "ojs.v1.OJSService/Enqueue" => vec![frame(&ojs::EnqueueRequest {
            r#type: "vault.intruder".into(),
            options: options(),
            ..Default::default()
        })],
        "ojs.v1.OJSService/EnqueueBatch" => vec![frame(&ojs::EnqueueBatchRequest {
            jobs: vec![ojs::BatchJobEntry {
                r#type: "vault.intruder".into(),
                args: vec![],
                options: options(),
            }],
            default_options: None,
        })],
        "ojs.v1.OJSService/GetJob" => vec![frame(&ojs::GetJobRequest {
            job_id: v.available.clone(),
        })],
        "ojs.v1.OJSService/CancelJob" => vec![frame(&ojs::CancelJobRequest {
            job_id: v.available.clone(),
            reason: "intruder".into(),
        })],
        "ojs.v1.OJSService/ActivateJob" => vec![frame(&ojs::ActivateJobRequest {
            job_id: v.pending.clone(),
        })],
        "ojs.v1.OJSService/Fetch" => vec![frame(&ojs::FetchRequest {
            queues: vec![q()],
            count: 1,
            worker_id: "w-intruder".into(),
            ..Default::default()
        })],
        "ojs.v1.OJSService/Ack" => vec![frame(&ack())],
        "ojs.v1.OJSService/Nack" => vec![frame(&ojs::NackRequest {
            job_id: v.active.clone(),
            error: Some(ojs::JobError {
                message: "intruder".into(),
                ..Default::default()
            }),
            lease_token: v.lease.clone(),
            worker_id: WORKER.into(),
            ..Default::default()
        })],
        "ojs.v1.OJSService/Heartbeat" => vec![
            frame(&ojs::HeartbeatRequest {
                worker_id: WORKER.into(),
                ..Default::default()
            }),
            frame(&ojs::HeartbeatRequest {
                id: v.active.clone(),
                worker_id: WORKER.into(),
                ..Default::default()
            }),
        ],
        "ojs.v1.OJSService/StreamJobs" => vec![frame(&ojs::StreamJobsRequest {
            queues: vec![q()],
            worker_id: "w-intruder".into(),
            ..Default::default()
        })],
        "ojs.v1.OJSService/StreamEvents" => vec![
            frame(&ojs::StreamEventsRequest {
                queues: vec![q()],
                ..Default::default()
            }),
            frame(&ojs::StreamEventsRequest::default()),
        ],
        "ojs.v1.OJSService/ListQueues" => vec![frame(&ojs::ListQueuesRequest::default())],
        "ojs.v1.OJSService/QueueStats" => vec![frame(&ojs::QueueStatsRequest { queue: q() })],
        "ojs.v1.OJSService/PauseQueue" => vec![frame(&ojs::PauseQueueRequest { queue: q() })],
        "ojs.v1.OJSService/ResumeQueue" => vec![frame(&ojs::ResumeQueueRequest { queue: q() })],
        "ojs.v1.OJSService/ListDeadLetter" => vec![
            frame(&ojs::ListDeadLetterRequest {
                queue: q(),
                ..Default::default()
            }),
            frame(&ojs::ListDeadLetterRequest::default()),
        ],
        "ojs.v1.OJSService/RetryDeadLetter" => vec![frame(&ojs::RetryDeadLetterRequest {
            job_id: v.dead.clone(),
        })],
        "ojs.v1.OJSService/DeleteDeadLetter" => vec![frame(&ojs::DeleteDeadLetterRequest {
            job_id: v.dead.clone(),
        })],
        "ojs.v1.OJSService/RegisterCron" => vec![frame(&ojs::RegisterCronRequest {
            name: "vault-hourly".into(),
            cron: "0 * * * *".into(),
            r#type: "vault.hourly".into(),
            options: options(),
            ..Default::default()
        })],
        "ojs.v1.OJSService/UnregisterCron" => {
            vec![frame(&ojs::UnregisterCronRequest { name: CRON.into() })]
        }
        "ojs.v1.OJSService/ListCron" => vec![frame(&ojs::ListCronRequest::default())],
        "ojs.v1.OJSService/CreateWorkflow" => vec![frame(&ojs::CreateWorkflowRequest {
            name: "vault-intrusion".into(),
            steps: vec![ojs::WorkflowStep {
                id: "a".into(),
                r#type: "vault.intruder".into(),
                options: options(),
                ..Default::default()
            }],
        })],
        "ojs.v1.OJSService/GetWorkflow" => vec![frame(&ojs::GetWorkflowRequest {
            workflow_id: v.workflow.clone(),
        })],
        "ojs.v1.OJSService/CancelWorkflow" => vec![frame(&ojs::CancelWorkflowRequest {
            workflow_id: v.workflow.clone(),
            reason: "intruder".into(),
        })],
        "pgvs3.v1.AdminService/CreateQueue" => {
            vec![frame(&pg::CreateQueueRequest { queue: q() })]
        }
        "pgvs3.v1.AdminService/DropQueue" => vec![frame(&pg::DropQueueRequest { queue: q() })],
        "pgvs3.v1.AdminService/AdoptQueue" => vec![frame(&pg::AdoptQueueRequest { queue: q() })],
        "pgvs3.v1.AdminService/GetQueueConfig" => {
            vec![frame(&pg::GetQueueConfigRequest { queue: q() })]
        }
        "pgvs3.v1.AdminService/SetQueueConfig" => vec![frame(&pg::SetQueueConfigRequest {
            queue: q(),
            max_retries: Some(3),
            ..Default::default()
        })],
        "pgvs3.v1.AdminService/CreateToken" => vec![frame(&pg::CreateTokenRequest {
            name: "matrix-minted".into(),
            roles: vec!["admin".into()],
            queues: vec![],
        })],
        "pgvs3.v1.AdminService/ListTokens" => vec![frame(&pg::ListTokensRequest {})],
        "pgvs3.v1.AdminService/RevokeToken" => vec![frame(&pg::RevokeTokenRequest {
            name: TOKEN_TARGET.into(),
        })],
        "pgvs3.v1.StreamService/Append" => vec![frame(&pg::AppendRequest {
            queue: q(),
            messages: vec![pg::Message {
                r#type: "vault.forged".into(),
                payload: Some(prost_types::Value {
                    kind: Some(prost_types::value::Kind::NumberValue(0.0)),
                }),
                ..Default::default()
            }],
        })],
        "pgvs3.v1.StreamService/Subscribe" => vec![frame(&pg::SubscribeRequest {
            queue: q(),
            consumer: "vault-intruder".into(),
            from_tick: Some(0),
            ..Default::default()
        })],
        "pgvs3.v1.StreamService/Unsubscribe" => vec![frame(&pg::UnsubscribeRequest {
            queue: q(),
            consumer: CONSUMER.into(),
        })],
        "pgvs3.v1.StreamService/ListConsumers" => vec![frame(&pg::ListConsumersRequest {
            queue: q(),
            ..Default::default()
        })],
        "pgvs3.v1.StreamService/Receive" => vec![frame(&pg::ReceiveRequest {
            queue: q(),
            consumer: CONSUMER.into(),
            wait_ms: Some(0),
            ..Default::default()
        })],
        "pgvs3.v1.StreamService/ReceiveStream" => vec![frame(&pg::ReceiveStreamRequest {
            queue: q(),
            consumer: CONSUMER.into(),
            ..Default::default()
        })],
        "pgvs3.v1.StreamService/GetBatch" => vec![frame(&pg::GetBatchRequest {
            queue: q(),
            batch_id: v.batch.clone(),
        })],
        "pgvs3.v1.StreamService/Ack" => vec![frame(&pg::AckRequest {
            queue: q(),
            batch_id: v.batch.clone(),
            consumer: None,
        })],
        "pgvs3.v1.StreamService/Nack" => vec![frame(&pg::NackRequest {
            queue: q(),
            batch_id: v.batch.clone(),
            message_id: v.messages[1].clone(),
            ..Default::default()
        })],
        "pgvs3.v1.StreamService/Info" => vec![frame(&pg::InfoRequest { queue: q() })],
        "pgvs3.v1.StreamService/GetConfig" => vec![frame(&pg::GetConfigRequest { queue: q() })],
        "pgvs3.v1.StreamService/SetConfig" => vec![frame(&pg::SetConfigRequest {
            queue: q(),
            max_retries: Some(3),
            ..Default::default()
        })],
        "pgvs3.v1.StreamService/ListDeadLetters" => vec![frame(&pg::ListDeadLettersRequest {
            queue: q(),
            ..Default::default()
        })],
        "pgvs3.v1.StreamService/ReplayDeadLetter" => {
            vec![frame(&pg::ReplayDeadLetterRequest {
                queue: q(),
                id: v.stream_dead_letter.clone(),
            })]
        }
        "pgvs3.v1.StreamService/ReplayDeadLetters" => {
            vec![frame(&pg::ReplayDeadLettersRequest { queue: q() })]
        }
        "pgvs3.v1.StreamService/PurgeDeadLetters" => {
            vec![frame(&pg::PurgeDeadLettersRequest {
                queue: q(),
                older_than: "1ms".into(),
            })]
        }
        "pgvs3.v1.WorkerService/AckBatch" => {
            vec![frame(&pg::AckBatchRequest { acks: vec![ack()] })]
        }
        _ => {
            return vec![Sample {
                query: String::new(),
                // An empty message.
                body: Bytes::from_static(&[0, 0, 0, 0, 0]),
                accept: None,
                generic: true,
                reach: Reach::ByName,
            }];
        }
    };
    // A heartbeat is the worker's own: what it may not do is extend or show vault's leases.
    let reach = match path.rsplit('/').next() {
        Some("Heartbeat") => Reach::Own,
        Some("CreateToken" | "RevokeToken") => Reach::Beyond,
        _ => Reach::ByName,
    };
    frames
        .into_iter()
        .map(|body| Sample {
            query: String::new(),
            body,
            accept: None,
            generic: false,
            reach,
        })
        .collect()
}

/// One operation of either table, as the matrix sees it.
#[derive(Clone)]
struct Operation {
    /// operationId or gRPC path.
    name: &'static str,
    method: &'static str,
    template: &'static str,
    role: Role,
    read_only: bool,
    grpc: bool,
}

fn operations() -> Vec<Operation> {
    let http = HTTP_OPERATIONS.iter().map(|op| Operation {
        name: op.id,
        method: op.method,
        template: op.path,
        role: op.role,
        read_only: op.read_only,
        grpc: false,
    });
    let grpc = GRPC_OPERATIONS.iter().map(|op| Operation {
        name: op.path,
        method: "POST",
        template: op.path,
        role: op.role,
        read_only: op.read_only,
        grpc: true,
    });
    http.chain(grpc).collect()
}

/// The order an operation is tried in: reads, writes, removals, dropping the queue (so a hole
/// that destroys vault shows up after the rest has been tried on it).
fn phase(op: &Operation) -> u8 {
    let removes = op.method == "DELETE"
        || ["Drop", "Delete", "Purge", "Cancel", "Unsubscribe", "Revoke"]
            .iter()
            .any(|verb| {
                op.grpc
                    && op
                        .name
                        .rsplit('/')
                        .next()
                        .is_some_and(|m| m.starts_with(verb))
            });
    let drops_queue = op.name.to_ascii_lowercase().contains("dropqueue");
    match (op.read_only, removes, drops_queue) {
        (true, _, _) => 0,
        (false, _, true) => 3,
        (false, false, _) => 1,
        (false, true, _) => 2,
    }
}

impl Operation {
    fn samples(&self, v: &Vault) -> Vec<Sample> {
        if self.grpc {
            grpc_samples(self.name, v)
        } else {
            http_samples(self.name, self.method, v)
        }
    }

    fn methods(&self) -> Vec<&'static str> {
        let mut methods = vec![self.method];
        methods.extend(EXTRA_METHODS);
        if self.grpc {
            methods.extend(EXTRA_GRPC_METHODS);
        }
        methods.dedup();
        methods
    }
}

/// One request of the matrix and what it stands for.
#[derive(Clone)]
struct Probe {
    op: &'static str,
    /// The role the request needs: the operation's, or that of the operation its method and
    /// path are served as (HEAD of a path is its GET).
    role: Role,
    phase: u8,
    caller: CallerKind,
    caller_label: String,
    token: Option<String>,
    method: &'static str,
    /// The operation's own method.
    own_method: &'static str,
    content_type: Option<&'static str>,
    spelling: Spelling,
    wire: Wire,
    path: String,
    body: Bytes,
    accept: Option<&'static str>,
    /// The request is outside a `pub.*` scope (see `Reach`).
    outside_scope: bool,
}

/// Every request of the matrix: the full product for the no-token caller's first sample of each
/// operation, the path as written for the rest (see the module doc).
fn plan(tokens: &Tokens, v: &Vault) -> Vec<Probe> {
    let secrets = v.secrets();
    let names = |text: &[u8]| secrets.iter().any(|s| contains(text, s.as_bytes()));
    let all = operations();
    let mut probes = Vec::new();
    for op in &all {
        let (filled, literal) = fill(op.name, op.template, v);
        for (index, sample) in op.samples(v).into_iter().enumerate() {
            for method in op.methods() {
                // A method that is another operation's on this path (HEAD of a path with a GET)
                // is sent as that operation's.
                let served = all.iter().find(|other| {
                    other.template == op.template
                        && (other.method == method || (method == "HEAD" && other.method == "GET"))
                });
                if served.is_some_and(|other| other.name != op.name) {
                    continue;
                }
                let role = op.role;
                let outside_scope = sample.reach == Reach::Beyond
                    || sample.reach == Reach::ByName
                        && (names(filled.as_bytes())
                            || names(sample.query.as_bytes())
                            || names(&sample.body));
                for caller in CallerKind::ALL {
                    let Some((label, token)) = tokens.caller(caller, role) else {
                        continue;
                    };
                    let full = caller == CallerKind::NoToken && index == 0;
                    let content_types = if caller == CallerKind::NoToken {
                        CONTENT_TYPES
                    } else {
                        FEWER_CONTENT_TYPES
                    };
                    for content_type in content_types {
                        for (spelling, wire) in variants(op, full, method) {
                            probes.push(Probe {
                                op: op.name,
                                role,
                                phase: phase(op),
                                caller,
                                caller_label: label.clone(),
                                token: token.clone(),
                                method,
                                own_method: op.method,
                                content_type: *content_type,
                                spelling,
                                wire,
                                path: spelling.spell(&filled, &literal, &sample.query),
                                body: sample.body.clone(),
                                accept: sample.accept,
                                outside_scope,
                            });
                        }
                    }
                }
            }
        }
    }
    probes
}

/// The spellings and wires a request is sent in: every spelling over HTTP/1.1, and over HTTP/2
/// for gRPC paths, when `full`; else the path as written, over HTTP/1.1 and, for gRPC paths,
/// over HTTP/2 (HTTP/1.1 with the method of the operation only).
fn variants(op: &Operation, full: bool, method: &str) -> Vec<(Spelling, Wire)> {
    let mut variants = Vec::new();
    let spellings: &[Spelling] = if full {
        &Spelling::ALL
    } else {
        &[Spelling::AsIs]
    };
    for spelling in spellings {
        if full || !op.grpc || method == op.method {
            variants.push((*spelling, Wire::H1));
        }
        if op.grpc {
            variants.push((*spelling, Wire::H2));
        }
    }
    // HTTP operations go over HTTP/2 too, as a gRPC client would send them.
    if full && !op.grpc {
        variants.push((Spelling::AsIs, Wire::H2));
    }
    variants
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    !needle.is_empty() && haystack.windows(needle.len()).any(|w| w == needle)
}

/// What came back.
#[derive(Debug, Clone)]
struct Answer {
    status: u16,
    /// From the headers, the trailers or a grpc-web trailer frame.
    grpc_status: Option<i32>,
    body: Vec<u8>,
}

impl Answer {
    /// A success: a 2xx that is not a gRPC error.
    fn succeeded(&self) -> bool {
        (200..300).contains(&self.status) && self.grpc_status.is_none_or(|s| s == 0)
    }
}

#[derive(Debug, Clone)]
enum Outcome {
    Answered(Answer),
    /// No answer's head within `HEAD_WITHIN`.
    Hung,
    /// The connection failed (twice).
    Failed(String),
}

type Sender1 = hyper::client::conn::http1::SendRequest<Full<Bytes>>;
type Sender2 = hyper::client::conn::http2::SendRequest<Full<Bytes>>;

/// One connection of each HTTP version to the server, used one request at a time.
struct Client {
    addr: String,
    h1: Option<Sender1>,
    h2: Option<Sender2>,
}

fn grpc_status_of(headers: &http::HeaderMap) -> Option<i32> {
    headers
        .get("grpc-status")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse().ok())
}

/// `grpc-status` from a grpc-web trailer frame (flag 0x80) in a body.
fn grpc_web_status(body: &[u8]) -> Option<i32> {
    let at = body.windows(12).position(|w| w == b"grpc-status:")?;
    let digits: String = body[at + 12..]
        .iter()
        .map(|&b| b as char)
        .skip_while(|c| *c == ' ')
        .take_while(char::is_ascii_digit)
        .collect();
    digits.parse().ok()
}

impl Client {
    fn new(addr: &str) -> Client {
        Client {
            addr: addr.to_string(),
            h1: None,
            h2: None,
        }
    }

    async fn connect(&self) -> Result<tokio::net::TcpStream, String> {
        tokio::net::TcpStream::connect(&self.addr)
            .await
            .map_err(|e| format!("connect: {e}"))
    }

    async fn h1(&mut self) -> Result<&mut Sender1, String> {
        let usable = match &mut self.h1 {
            Some(sender) => sender.ready().await.is_ok(),
            None => false,
        };
        if !usable {
            let io = hyper_util::rt::TokioIo::new(self.connect().await?);
            let (sender, connection) = hyper::client::conn::http1::handshake(io)
                .await
                .map_err(|e| format!("h1 handshake: {e}"))?;
            tokio::spawn(connection);
            self.h1 = Some(sender);
        }
        self.h1.as_mut().ok_or_else(|| "no connection".into())
    }

    async fn h2(&mut self) -> Result<&mut Sender2, String> {
        let usable = match &mut self.h2 {
            Some(sender) => sender.ready().await.is_ok(),
            None => false,
        };
        if !usable {
            let io = hyper_util::rt::TokioIo::new(self.connect().await?);
            let (sender, connection) =
                hyper::client::conn::http2::handshake(hyper_util::rt::TokioExecutor::new(), io)
                    .await
                    .map_err(|e| format!("h2 handshake: {e}"))?;
            tokio::spawn(connection);
            self.h2 = Some(sender);
        }
        self.h2.as_mut().ok_or_else(|| "no connection".into())
    }

    fn request(&self, probe: &Probe) -> Result<hyper::Request<Full<Bytes>>, String> {
        let uri = match probe.wire {
            // Origin form, exactly as spelled.
            Wire::H1 => http::Uri::from_parts({
                let mut parts = http::uri::Parts::default();
                parts.path_and_query = Some(
                    http::uri::PathAndQuery::try_from(probe.path.as_str())
                        .map_err(|e| format!("path {}: {e}", probe.path))?,
                );
                parts
            })
            .map_err(|e| format!("uri: {e}"))?,
            Wire::H2 => format!("http://{}{}", self.addr, probe.path)
                .parse()
                .map_err(|e| format!("uri {}: {e}", probe.path))?,
        };
        let mut builder = hyper::Request::builder()
            .method(probe.method)
            .uri(uri)
            .header("te", "trailers");
        if probe.wire == Wire::H1 {
            builder = builder.header("host", self.addr.as_str());
        }
        if let Some(content_type) = probe.content_type {
            builder = builder.header("content-type", content_type);
        }
        if let Some(accept) = probe.accept {
            builder = builder.header("accept", accept);
        }
        if let Some(token) = &probe.token {
            builder = builder.header("authorization", format!("Bearer {token}"));
        }
        builder
            .body(Full::new(probe.body.clone()))
            .map_err(|e| format!("request: {e}"))
    }

    /// Sends `probe`; a connection that fails before an answer is made again, once.
    async fn send(&mut self, probe: &Probe) -> Outcome {
        let mut last = String::new();
        for _ in 0..2 {
            match self.try_send(probe).await {
                Err(error) => last = error,
                Ok(outcome) => return outcome,
            }
            // Start over on fresh connections.
            self.h1 = None;
            self.h2 = None;
        }
        Outcome::Failed(last)
    }

    async fn try_send(&mut self, probe: &Probe) -> Result<Outcome, String> {
        let request = self.request(probe)?;
        let answer = match probe.wire {
            Wire::H1 => {
                let sender = self.h1().await?;
                tokio::time::timeout(HEAD_WITHIN, sender.send_request(request)).await
            }
            Wire::H2 => {
                let sender = self.h2().await?;
                tokio::time::timeout(HEAD_WITHIN, sender.send_request(request)).await
            }
        };
        let response = match answer {
            Err(_) => {
                // The connection is stuck on this request.
                self.h1 = None;
                self.h2 = None;
                return Ok(Outcome::Hung);
            }
            Ok(Err(error)) => return Err(format!("send: {error}")),
            Ok(Ok(response)) => response,
        };
        let status = response.status().as_u16();
        let mut grpc_status = grpc_status_of(response.headers());
        let grpc_web = response
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .is_some_and(|ct| ct.starts_with("application/grpc-web"));
        let mut body = response.into_body();
        let mut kept = Vec::new();
        let deadline = tokio::time::Instant::now() + BODY_WITHIN;
        let complete = loop {
            match tokio::time::timeout_at(deadline, body.frame()).await {
                Err(_) | Ok(Some(Err(_))) => break false,
                Ok(None) => break true,
                Ok(Some(Ok(frame))) => {
                    if let Some(trailers) = frame.trailers_ref() {
                        grpc_status = grpc_status.or_else(|| grpc_status_of(trailers));
                    } else if let Some(data) = frame.data_ref() {
                        let room = BODY_KEPT.saturating_sub(kept.len());
                        kept.extend_from_slice(&data[..data.len().min(room)]);
                        if kept.len() >= BODY_KEPT {
                            break false;
                        }
                    }
                }
            }
        };
        if !complete && probe.wire == Wire::H1 {
            // The rest of the body is still on the connection.
            self.h1 = None;
        }
        if grpc_web {
            grpc_status = grpc_status.or_else(|| grpc_web_status(&kept));
        }
        Ok(Outcome::Answered(Answer {
            status,
            grpc_status,
            body: kept,
        }))
    }
}

/// Sends every probe, `WORKERS` at a time, phase after phase; each probe with its outcome.
async fn run(addr: &str, probes: Vec<Probe>) -> Vec<(Probe, Outcome)> {
    let mut results = Vec::with_capacity(probes.len());
    let phases: BTreeSet<u8> = probes.iter().map(|p| p.phase).collect();
    for phase in phases {
        let queue: VecDeque<Probe> = probes
            .iter()
            .filter(|p| p.phase == phase)
            .cloned()
            .collect();
        let queue = Arc::new(Mutex::new(queue));
        let mut workers = tokio::task::JoinSet::new();
        for _ in 0..WORKERS {
            let queue = queue.clone();
            let addr = addr.to_string();
            workers.spawn(async move {
                let mut client = Client::new(&addr);
                let mut done = Vec::new();
                loop {
                    let next = queue.lock().ok().and_then(|mut q| q.pop_front());
                    let Some(probe) = next else { break };
                    let outcome = client.send(&probe).await;
                    done.push((probe, outcome));
                }
                done
            });
        }
        while let Some(done) = workers.join_next().await {
            results.extend(done.expect("a matrix worker"));
        }
    }
    results
}

/// What is wrong with an outcome, if anything.
fn verdict(probe: &Probe, outcome: &Outcome, secrets: &[String]) -> Option<&'static str> {
    let answer = match outcome {
        Outcome::Hung => return Some("no answer in time"),
        Outcome::Failed(_) => return Some("connection failed"),
        Outcome::Answered(answer) => answer,
    };
    if !answer.succeeded() {
        return None;
    }
    // Secrets the request did not carry itself.
    let reveals = secrets.iter().any(|s| {
        contains(&answer.body, s.as_bytes())
            && !probe.path.contains(s.as_str())
            && !contains(&probe.body, s.as_bytes())
    });
    // A batch answer refusing its items one by one (as a single request would be refused).
    let refuses_items = [&b"not_found"[..], b"forbidden"]
        .iter()
        .any(|code| contains(&answer.body, code));
    let allowed = match probe.caller {
        _ if probe.role == Role::Public => true,
        CallerKind::Scoped => !probe.outside_scope || refuses_items,
        _ => false,
    };
    if !allowed {
        Some(match probe.caller {
            CallerKind::Scoped => "2xx for a token scoped to pub.*, outside its scope",
            _ => "2xx without authorization",
        })
    } else if reveals {
        Some("2xx revealing vault")
    } else {
        None
    }
}

fn describe(probe: &Probe, outcome: &Outcome, why: &str) -> String {
    let (status, body) = match outcome {
        Outcome::Answered(a) => (
            match a.grpc_status {
                Some(g) => format!("{} grpc-status {g}", a.status),
                None => a.status.to_string(),
            },
            String::from_utf8_lossy(&a.body[..a.body.len().min(200)]).replace('\n', "\\n"),
        ),
        Outcome::Hung => ("-".into(), String::new()),
        Outcome::Failed(e) => ("-".into(), e.clone()),
    };
    format!(
        "{why}: {} ({}) as {}: {:?} {} {} ct={} {:?} -> {status} {body}",
        probe.op,
        probe.role.name(),
        probe.caller_label,
        probe.wire,
        probe.method,
        probe.path,
        probe.content_type.unwrap_or("none"),
        probe.spelling,
    )
}

/// Every table of the catalog and of every queue schema: its rows as text, in order.
async fn dump(url: &str) -> BTreeMap<String, Vec<String>> {
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(1)
        .connect(url)
        .await
        .expect("connect for the dump");
    let tables: Vec<String> = sqlx::query_scalar(
        "SELECT format('%I.%I', n.nspname, c.relname) FROM pg_class c
           JOIN pg_namespace n ON n.oid = c.relnamespace
          WHERE c.relkind = 'r' AND (n.nspname = 's3p' OR n.nspname LIKE 's3q\\_%')
          ORDER BY 1",
    )
    .fetch_all(&pool)
    .await
    .expect("list tables");
    let mut rows = BTreeMap::new();
    for table in tables {
        let text: Vec<String> = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
            "SELECT t::text FROM {table} t ORDER BY 1"
        )))
        .fetch_all(&pool)
        .await
        .expect("read a table");
        rows.insert(table, text);
    }
    pool.close().await;
    rows
}

/// The tables whose rows differ, each with a few rows gone and rows new.
fn changed_tables(
    before: &BTreeMap<String, Vec<String>>,
    after: &BTreeMap<String, Vec<String>>,
) -> Vec<String> {
    let names: BTreeSet<&String> = before.keys().chain(after.keys()).collect();
    let mut changed = Vec::new();
    for name in names {
        let (old, new) = (before.get(name), after.get(name));
        if old == new {
            continue;
        }
        let count = |rows: Option<&Vec<String>>| {
            rows.map_or("absent".into(), |r| format!("{} rows", r.len()))
        };
        let mut line = format!("{name}: {} -> {}", count(old), count(new));
        let (old, new) = (
            old.cloned().unwrap_or_default(),
            new.cloned().unwrap_or_default(),
        );
        let gone = old.iter().filter(|r| !new.contains(r));
        let came = new.iter().filter(|r| !old.contains(r));
        for (sign, row) in gone
            .take(3)
            .map(|r| ("-", r))
            .chain(came.take(3).map(|r| ("+", r)))
        {
            let shown: String = row.chars().take(160).collect();
            let _ = write!(line, "\n    {sign} {shown}");
        }
        changed.push(line);
    }
    changed
}

fn address(app: &common::TestApp) -> String {
    app.http_url.trim_start_matches("http://").to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn no_caller_without_the_right_gets_past_any_spelling_of_any_operation() {
    let (app, tokens, vault) = fixture().await;
    let secrets = vault.secrets();
    let probes = plan(&tokens, &vault);
    let sent = probes.len();
    let ops: BTreeSet<&str> = probes.iter().map(|p| p.op).collect();
    assert_eq!(
        ops.len(),
        HTTP_OPERATIONS.len() + GRPC_OPERATIONS.len(),
        "every operation of both tables is in the matrix"
    );

    let before = dump(&app.database_url).await;
    let started = Instant::now();
    let results = run(&address(&app), probes).await;
    let took = started.elapsed();
    let after = dump(&app.database_url).await;
    app.stop().await;

    // A class: what went wrong, for whom, with which kind of method and content type.
    let mut classes: BTreeMap<String, (usize, Vec<String>)> = BTreeMap::new();
    let mut failures = Vec::new();
    for (probe, outcome) in &results {
        let Some(why) = verdict(probe, outcome, &secrets) else {
            continue;
        };
        let line = describe(probe, outcome, why);
        let caller = match probe.caller {
            CallerKind::LacksRole => "token lacking the role",
            _ => probe.caller_label.as_str(),
        };
        let method = if probe.method == probe.own_method {
            "its own method"
        } else {
            probe.method
        };
        let content = match probe.content_type {
            Some(ct) if ct.starts_with("application/grpc") => "a gRPC content type",
            _ => "a non-gRPC content type",
        };
        let kind = if probe.op.starts_with('/') {
            "gRPC"
        } else {
            "HTTP"
        };
        let class = format!("{why}: {caller}, {kind} operation, {method}, {content}");
        let entry = classes.entry(class).or_default();
        entry.0 += 1;
        if entry.1.len() < 3 {
            entry.1.push(line.clone());
        }
        failures.push(line);
    }
    let changed = changed_tables(&before, &after);
    eprintln!(
        "auth matrix: {sent} requests in {:.1} s, {} failures, {} tables changed",
        took.as_secs_f64(),
        failures.len(),
        changed.len()
    );
    if failures.is_empty() && changed.is_empty() {
        return;
    }
    let mut report = String::new();
    let _ = writeln!(
        report,
        "{} of {sent} requests got through, and {} tables changed",
        failures.len(),
        changed.len()
    );
    for table in &changed {
        let _ = writeln!(report, "changed: {table}");
    }
    let _ = writeln!(report, "\nfailure classes, with examples:");
    for (class, (count, examples)) in &classes {
        let _ = writeln!(report, "{count:6} {class}");
        for example in examples {
            let _ = writeln!(report, "         {example}");
        }
    }
    let _ = writeln!(report, "\nevery failure:");
    for line in &failures {
        let _ = writeln!(report, "{line}");
    }
    let file = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("auth_matrix_failures.txt");
    let _ = std::fs::write(&file, &report);
    let shown: Vec<&str> = report.lines().take(400).collect();
    panic!(
        "{}\n(the whole report, {} lines: {})",
        shown.join("\n"),
        report.lines().count(),
        file.display()
    );
}

/// An admin's call of `op` with `sample` (its own method, a JSON or gRPC content type).
async fn admin_call(
    client: &mut Client,
    admin: &str,
    op: &Operation,
    sample: &Sample,
    v: &Vault,
) -> (Outcome, String) {
    let (filled, literal) = fill(op.name, op.template, v);
    let probe = Probe {
        op: op.name,
        role: op.role,
        phase: phase(op),
        caller: CallerKind::NoToken,
        caller_label: "admin".into(),
        token: Some(admin.to_string()),
        method: op.method,
        own_method: op.method,
        content_type: Some(if op.grpc {
            "application/grpc"
        } else {
            "application/json"
        }),
        spelling: Spelling::AsIs,
        wire: if op.grpc { Wire::H2 } else { Wire::H1 },
        path: Spelling::AsIs.spell(&filled, &literal, &sample.query),
        body: sample.body.clone(),
        accept: sample.accept,
        outside_scope: true,
    };
    let outcome = client.send(&probe).await;
    let line = describe(&probe, &outcome, "sample");
    (outcome, line)
}

/// Whether an admin's call of `op` did what it asks: a success (an open stream counts) and, for
/// a write, no item of it refused.
fn done(op: &Operation, outcome: &Outcome) -> bool {
    match outcome {
        Outcome::Answered(a) => {
            a.succeeded()
                && (op.read_only
                    || ![&b"stale_lease"[..], b"not_found", b"conflict"]
                        .iter()
                        .any(|code| contains(&a.body, code)))
        }
        _ => false,
    }
}

/// The matrix's samples are requests an admin may make, each doing what it asks: refusals in
/// the matrix are about the caller, not a malformed body or a path that names nothing. The
/// samples run in the matrix's order on one vault; those that find their target used up by an
/// earlier one (a dead letter retried before it is deleted, a lease acked before the nack) run
/// again on a fresh vault, round after round.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn samples_are_valid_requests_for_an_admin() {
    let mut ops = operations();
    ops.sort_by_key(phase);
    let mut pending: Option<Vec<(Operation, usize, Vec<String>)>> = None;
    let mut generic = Vec::new();
    for round in 0..8 {
        let (app, tokens, vault) = fixture().await;
        // The first round tries every sample.
        let tries = pending.take().unwrap_or_else(|| {
            ops.iter()
                .flat_map(|op| {
                    let count = op.samples(&vault).len();
                    (0..count).map(|index| (op.clone(), index, Vec::new()))
                })
                .collect()
        });
        // A queue a running workflow needs is not dropped (409): in the first round the
        // workflow's cancel (a removal) goes before the drops; a drop tried again on a fresh
        // vault is given the same precondition.
        if round > 0 && tries.iter().any(|(op, _, _)| phase(op) == 3) {
            let (status, answer) = Http::new(&app)
                .bearer(&tokens.admin)
                .delete(&format!("/ojs/v1/workflows/{}", vault.workflow))
                .await;
            assert!(status.is_success(), "cancel vault's workflow: {answer}");
        }
        let mut client = Client::new(&address(&app));
        let mut left = Vec::new();
        for (op, index, mut lines) in tries {
            let samples = op.samples(&vault);
            let (outcome, line) =
                admin_call(&mut client, &tokens.admin, &op, &samples[index], &vault).await;
            if samples[index].generic {
                generic.push(line);
            } else if !done(&op, &outcome) {
                lines.push(line);
                left.push((op, index, lines));
            }
        }
        app.stop().await;
        if !left.is_empty() {
            let names: Vec<&str> = left.iter().map(|(op, _, _)| op.name).collect();
            eprintln!("samples to try again on a fresh vault after round {round}: {names:?}");
        }
        let finished = left.is_empty();
        pending = Some(left);
        if finished {
            break;
        }
    }
    if !generic.is_empty() {
        eprintln!(
            "operations without a sample of their own (a generic request stands in):\n{}",
            generic.join("\n")
        );
    }
    let refused: Vec<String> = pending
        .unwrap_or_default()
        .into_iter()
        .flat_map(|(_, _, lines)| lines)
        .collect();
    assert!(
        refused.is_empty(),
        "samples an admin cannot make (each try):\n{}",
        refused.join("\n")
    );
}
