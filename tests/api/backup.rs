//! The backup boundary: one queue is one schema, so `pg_dump -n s3q_<name>` of a filled queue,
//! restored into a fresh migrated database and adopted (`AdoptQueue` / `s3p.adopt_queue`), brings
//! back its jobs (ids, states, payloads) and its stream (events, consumers and their cursors).

use crate::common;

use std::path::Path;
use std::process::{Command, Stdio};

use pgvs3::grpc::proto::pgvs3::v1 as s3;
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use sqlx::{Connection, PgConnection};

common::http::module_http!(
    /// The shared HTTP client, with this module's calls.
);

impl Http {
    fn new(app: &common::TestApp) -> Self {
        Http(common::http::Http::new(app))
    }

    /// Sends; the answer, which must be a success.
    async fn ok(&self, method: Method, path: &str, body: Option<Value>) -> Value {
        let (status, answer) = self.send(method.clone(), path, body).await;
        assert!(status.is_success(), "{method} {path} -> {status}: {answer}");
        answer
    }

    /// `POST`s JSON; the answer, which must be a success.
    async fn post(&self, path: &str, body: Value) -> Value {
        self.0.ok_post(path, body).await
    }

    /// `GET`; the answer, which must be a success.
    async fn get(&self, path: &str) -> Value {
        self.0.ok_get(path).await
    }

    async fn enqueue(&self, kind: &str, options: Value) -> String {
        let mut options = options;
        options["queue"] = json!(QUEUE);
        let answer = self
            .post(
                "/ojs/v1/jobs",
                json!({"type": kind, "args": [kind, 7], "options": options}),
            )
            .await;
        answer["job"]["id"].as_str().expect("id").to_string()
    }

    async fn job(&self, id: &str) -> Value {
        self.get(&format!("/ojs/v1/jobs/{id}")).await["job"].clone()
    }

    async fn receive(&self, consumer: &str) -> Value {
        self.post(
            &format!("/ojs/v1/queues/{QUEUE}/receive"),
            json!({"consumer": consumer}),
        )
        .await
    }
}

const QUEUE: &str = "archive";

fn event_types(batch: &Value) -> Vec<String> {
    batch["events"]
        .as_array()
        .map(|events| {
            events
                .iter()
                .filter_map(|e| e["type"].as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

/// A PostgreSQL client program from the installed server's directory.
fn client_program(name: &str) -> Command {
    let dir = pgvs3::cluster::find_binaries().expect("PostgreSQL binaries");
    let mut command = Command::new(dir.join(name));
    command.stdin(Stdio::null());
    command
}

fn run(command: &mut Command) {
    let output = command.output().expect("run a PostgreSQL client program");
    assert!(
        output.status.success(),
        "{command:?} failed: {}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dumped_queue_schema_restores_into_a_fresh_database() {
    // No background maintenance: nothing moves while the states are compared.
    let source = common::spawn_app_with(|s| s.maintenance_interval = None).await;
    let http = Http::new(&source);

    // Jobs in several states; priorities decide which three the fetch claims.
    let completed = http.enqueue("b.completed", json!({"priority": 50})).await;
    let active = http.enqueue("b.active", json!({"priority": 40})).await;
    let dead = http
        .enqueue(
            "b.dead",
            json!({"priority": 30, "retry": {"max_attempts": 1, "on_exhaustion": "dead_letter"}}),
        )
        .await;
    let available = http.enqueue("b.available", json!({})).await;
    let later = (chrono::Utc::now() + chrono::Duration::hours(1)).to_rfc3339();
    let scheduled = http
        .enqueue("b.scheduled", json!({"scheduled_at": later}))
        .await;
    let pending = http.enqueue("b.pending", json!({"pending": true})).await;
    let cancelled = http.enqueue("b.cancelled", json!({})).await;
    // One id a client gave: the only kind adoption indexes (minted ids carry their queue's tag).
    let given = uuid::Uuid::now_v7().to_string();
    http.ok(
        Method::POST,
        "/ojs/v1/jobs",
        Some(json!({"id": given, "type": "b.given", "args": [], "options": {"queue": QUEUE}})),
    )
    .await;
    let claimed = http
        .post(
            "/ojs/v1/workers/fetch",
            json!({"queues": [QUEUE], "count": 3}),
        )
        .await;
    let lease = |id: &str| {
        claimed["jobs"]
            .as_array()
            .and_then(|jobs| jobs.iter().find(|j| j["id"] == id))
            .map(|j| j["lease_token"].clone())
            .unwrap_or_else(|| panic!("{id} not claimed: {claimed}"))
    };
    http.post(
        "/ojs/v1/workers/ack",
        json!({"job_id": completed, "lease_token": lease(&completed), "result": {"ok": 1}}),
    )
    .await;
    http.post(
        "/ojs/v1/workers/nack",
        json!({"job_id": dead, "lease_token": lease(&dead),
               "error": {"code": "fatal", "message": "gone"}}),
    )
    .await;
    let _ = lease(&active);
    http.ok(Method::DELETE, &format!("/ojs/v1/jobs/{cancelled}"), None)
        .await;
    let ids = [
        &completed, &active, &dead, &available, &scheduled, &pending, &cancelled,
    ];
    let mut before = Vec::new();
    for id in ids {
        before.push(http.job(id).await);
    }
    let states: Vec<&str> = before.iter().filter_map(|j| j["state"].as_str()).collect();
    assert_eq!(
        states,
        [
            "completed",
            "active",
            "discarded",
            "available",
            "scheduled",
            "pending",
            "cancelled"
        ]
    );

    // A stream: its settings, a consumer that already read and acked everything, three events.
    http.post(
        &format!("/ojs/v1/queues/{QUEUE}/config"),
        json!({"max_retries": 7, "retention": "48h"}),
    )
    .await;
    http.post(
        &format!("/ojs/v1/queues/{QUEUE}/consumers"),
        json!({"consumer": "c1", "from_tick": 0}),
    )
    .await;
    http.post(
        &format!("/ojs/v1/queues/{QUEUE}/messages/batch"),
        json!({"messages": [
            {"type": "ev.one", "payload": {"n": 1}},
            {"type": "ev.two", "payload": {"n": 2}, "headers": {"h": "v"}},
            {"type": "ev.three", "payload": [3]}
        ]}),
    )
    .await;
    let read = http.receive("c1").await;
    assert_eq!(event_types(&read), ["ev.one", "ev.two", "ev.three"]);
    http.post(
        "/ojs/v1/streams/ack",
        json!({"queue": QUEUE, "batch_id": read["batch_id"]}),
    )
    .await;
    let stats_before = http.get(&format!("/ojs/v1/queues/{QUEUE}/stats")).await["queue"].clone();

    // Dump the queue's schema alone.
    let dump = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!(
        "backup-{}-{}.sql",
        std::process::id(),
        uuid::Uuid::now_v7().simple()
    ));
    run(client_program("pg_dump")
        .args(["--format=plain", "--no-owner", "-n"])
        .arg(format!("s3q_{QUEUE}"))
        .arg("-f")
        .arg(&dump)
        .arg("-d")
        .arg(&source.database_url));
    let text = std::fs::read_to_string(&dump).expect("read the dump");
    assert!(
        text.contains(&format!("CREATE SCHEMA s3q_{QUEUE}")),
        "the dump holds the queue schema"
    );
    assert!(
        !text.contains("CREATE SCHEMA s3p"),
        "the dump holds nothing but the queue"
    );

    // Restore into a fresh database that a gateway has migrated, and adopt.
    let target = common::spawn_app_with(|s| s.maintenance_interval = None).await;
    run(client_program("psql")
        .args(["-X", "-q", "-v", "ON_ERROR_STOP=1", "-f"])
        .arg(&dump)
        .arg("-d")
        .arg(&target.database_url));
    let _ = std::fs::remove_file(&dump);
    let restored = Http::new(&target);
    let (status, _) = restored
        .send(Method::GET, &format!("/ojs/v1/jobs/{available}"), None)
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND, "not served before adoption");
    let mut admin = common::grpc::admin(&target.grpc_url).await;
    let adopted = admin
        .adopt_queue(s3::AdoptQueueRequest {
            queue: QUEUE.into(),
        })
        .await
        .expect("AdoptQueue")
        .into_inner();
    assert_eq!(adopted.queue, QUEUE);
    assert_eq!(adopted.jobs_indexed, 1, "the given id");
    // Adopting again (here through SQL) changes nothing.
    let mut conn = PgConnection::connect(&target.database_url)
        .await
        .expect("connect");
    let again: i64 = sqlx::query_scalar("SELECT s3p.adopt_queue($1)")
        .bind(QUEUE)
        .fetch_one(&mut conn)
        .await
        .expect("adopt again");
    assert_eq!(again, 0);

    assert_eq!(restored.job(&given).await["state"], "available");
    // The jobs: same ids, states, types, args and results.
    for (id, old) in ids.iter().zip(&before) {
        let job = restored.job(id).await;
        for field in ["id", "type", "state", "args", "queue", "result", "attempt"] {
            assert_eq!(job[field], old[field], "{field} of {id}: {job} vs {old}");
        }
    }
    let listed = restored.get("/ojs/v1/queues").await;
    assert_eq!(listed["queues"][0]["name"], QUEUE, "{listed}");
    let stats = restored.get(&format!("/ojs/v1/queues/{QUEUE}/stats")).await["queue"].clone();
    for key in [
        "available",
        "scheduled",
        "pending",
        "active",
        "completed",
        "cancelled",
        "discarded",
        "dead_letters",
    ] {
        assert_eq!(
            stats[key], stats_before[key],
            "{key}: {stats} vs {stats_before}"
        );
    }
    assert_eq!(stats["stream"]["events"], 3, "{stats}");
    let dead_letters = restored
        .get(&format!("/ojs/v1/dead-letter?queue={QUEUE}"))
        .await;
    assert_eq!(
        dead_letters["jobs"][0]["id"],
        dead.as_str(),
        "{dead_letters}"
    );

    // The stream: its settings (kept in the schema) and the old consumer's cursor came back (nothing new for it), and a new consumer
    // from the oldest tick receives every event.
    let consumers = restored
        .get(&format!("/ojs/v1/queues/{QUEUE}/consumers"))
        .await;
    assert_eq!(consumers["consumers"][0]["consumer"], "c1", "{consumers}");
    assert!(restored.receive("c1").await["batch_id"].is_null());
    let config = restored
        .get(&format!("/ojs/v1/queues/{QUEUE}/config"))
        .await;
    assert_eq!(config["max_retries"], 7, "{config}");
    assert_eq!(config["retention_ms"], 172_800_000, "{config}");
    restored
        .post(
            &format!("/ojs/v1/queues/{QUEUE}/consumers"),
            json!({"consumer": "after-restore", "from_tick": 0}),
        )
        .await;
    let batch = restored.receive("after-restore").await;
    assert_eq!(
        event_types(&batch),
        ["ev.one", "ev.two", "ev.three"],
        "{batch}"
    );
    assert_eq!(batch["events"][1]["payload"], json!({"n": 2}));
    assert_eq!(batch["events"][1]["headers"], json!({"h": "v"}));

    // The restored queue works: the available job is claimed and completed, new jobs are taken.
    let claimed = restored
        .post(
            "/ojs/v1/workers/fetch",
            json!({"queues": [QUEUE], "count": 5}),
        )
        .await;
    assert_eq!(claimed["jobs"][0]["id"], available.as_str(), "{claimed}");
    restored
        .post(
            "/ojs/v1/workers/ack",
            json!({"job_id": available, "lease_token": claimed["jobs"][0]["lease_token"]}),
        )
        .await;
    assert_eq!(restored.job(&available).await["state"], "completed");
    let (status, answer) = restored
        .send(
            Method::POST,
            "/ojs/v1/jobs",
            Some(json!({"type": "b.new", "args": [], "options": {"queue": QUEUE}})),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{answer}");
}
