//! A real streaming replica: a primary started from the installed PostgreSQL binaries, a hot
//! standby made with `pg_basebackup -R -X stream`, a gateway on each. The standby's gateway finds
//! out by itself that it is read-only: it serves reads of what the primary's gateway writes (once
//! replication catches up) and refuses every write, while the primary's gateway keeps writing.
//! Both clusters are stopped at the end, also when the test fails.

use crate::common;

use common::codes::grpc_code;
use common::wait::eventually;
use std::net::{Ipv4Addr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use pgvs3::cluster::{ClusterOptions, PrivateCluster, find_binaries};
use pgvs3::grpc::proto::ojs::v1 as pb;
use pgvs3::grpc::proto::pgvs3::v1 as s3;
use pgvs3::server::{self, RunningServer, ServerSettings};
use reqwest::StatusCode;
use serde_json::{Value, json};
use sqlx::{Connection, PgConnection};

/// The primary, the standby and their directory; stopped and removed on drop, pass or fail.
struct Clusters {
    dir: PathBuf,
    bin_dir: PathBuf,
    as_root: bool,
    primary: Option<PrivateCluster>,
    standby: Option<PathBuf>,
}

impl Clusters {
    /// A server binary, run as `postgres` when we are root (initdb, pg_ctl and pg_basebackup
    /// refuse root, and the data files must belong to the server's user).
    fn pg(&self, binary: &str) -> Command {
        let path = self.bin_dir.join(binary);
        let mut command = if self.as_root {
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--"]).arg(path);
            c
        } else {
            Command::new(path)
        };
        // The caller's cwd may be unreadable to `postgres`.
        command.current_dir(&self.dir);
        command.stdin(Stdio::null());
        command
    }

    fn run(&self, command: &mut Command) {
        let output = command.output().expect("run a PostgreSQL binary");
        assert!(
            output.status.success(),
            "{command:?} failed: {}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
    }
}

impl Drop for Clusters {
    fn drop(&mut self) {
        if let Some(pgdata) = self.standby.take() {
            let _ = self
                .pg("pg_ctl")
                .arg("-D")
                .arg(&pgdata)
                .args(["-m", "immediate", "-w", "stop"])
                .output();
        }
        if let Some(mut primary) = self.primary.take() {
            let _ = primary.stop();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn free_port() -> u16 {
    TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

fn tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(20)..].join("\n")
}

async fn get(client: &reqwest::Client, base: &str, path: &str) -> (StatusCode, Value) {
    common::http::Http::with_client(base, client.clone())
        .get(path)
        .await
}

async fn post(
    client: &reqwest::Client,
    base: &str,
    path: &str,
    body: Value,
) -> (StatusCode, Value) {
    common::http::Http::with_client(base, client.clone())
        .post(path, body)
        .await
}

async fn gateway(url: &str) -> RunningServer {
    let mut settings = ServerSettings::for_database(url);
    settings.db_pool_size = 4;
    server::start(settings).await.expect("start a gateway")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standby_gateway_serves_reads_and_refuses_writes_while_the_primary_writes() {
    // SAFETY: geteuid has no preconditions.
    let as_root = unsafe { libc::geteuid() } == 0;
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!(
        "replica-{}-{}",
        std::process::id(),
        uuid::Uuid::now_v7().simple()
    ));
    let mut clusters = Clusters {
        dir: dir.clone(),
        bin_dir: find_binaries().expect("PostgreSQL server binaries"),
        as_root,
        primary: None,
        standby: None,
    };

    // The primary.
    let primary = PrivateCluster::start(&ClusterOptions {
        data_dir: dir.join("primary"),
        fsync: false,
    })
    .expect("start the primary");
    let primary_port = primary.port();
    let primary_socket_dir = primary
        .socket_dir()
        .expect("the private cluster listens on a socket")
        .to_path_buf();
    let primary_url = primary.database_url("postgres");
    clusters.primary = Some(primary);

    // The standby: a base backup streaming its WAL, with standby.signal and primary_conninfo (-R).
    let standby_dir = dir.join("standby");
    std::fs::create_dir_all(&standby_dir).expect("standby dir");
    if as_root {
        clusters.run(
            Command::new("chown")
                .args(["-R", "postgres:postgres"])
                .arg(&standby_dir),
        );
    }
    let pgdata = standby_dir.join("pgdata");
    let log = standby_dir.join("postgres.log");
    clusters.run(
        clusters
            .pg("pg_basebackup")
            .arg("-D")
            .arg(&pgdata)
            .args(["-R", "-X", "stream", "--no-sync", "-h"])
            .arg(&primary_socket_dir)
            .arg("-U")
            .arg("postgres")
            .arg("-p")
            .arg(primary_port.to_string()),
    );
    let standby_port = free_port();
    let started = clusters
        .pg("pg_ctl")
        .arg("-D")
        .arg(&pgdata)
        .arg("-l")
        .arg(&log)
        .arg("-o")
        // The copied settings name the primary's socket directory; the standby gets its own.
        .arg(format!(
            "-p {standby_port} -c unix_socket_directories='{}'",
            standby_dir.display()
        ))
        .args(["-w", "-t", "60", "start"])
        .output()
        .expect("run pg_ctl start");
    clusters.standby = Some(pgdata.clone());
    assert!(
        started.status.success(),
        "standby start failed: {}\n{}",
        String::from_utf8_lossy(&started.stderr),
        tail(&log)
    );
    let standby_url = format!(
        "postgres://postgres@localhost:{standby_port}/postgres?host={}",
        standby_dir.display()
    );
    eventually(
        Duration::from_secs(30),
        "the standby is in recovery",
        async || match PgConnection::connect(&standby_url).await {
            Ok(mut conn) => sqlx::query_scalar::<_, bool>("SELECT pg_is_in_recovery()")
                .fetch_one(&mut conn)
                .await
                .unwrap_or(false),
            Err(_) => false,
        },
    )
    .await;

    // The primary's gateway migrates; the standby's waits for the migrations to replay.
    let primary_gw = gateway(&primary_url).await;
    eventually(
        Duration::from_secs(30),
        "the migrations replay on the standby",
        async || match PgConnection::connect(&standby_url).await {
            Ok(mut conn) => {
                sqlx::query_scalar::<_, bool>("SELECT to_regclass('s3p.queues') IS NOT NULL")
                    .fetch_one(&mut conn)
                    .await
                    .unwrap_or(false)
            }
            Err(_) => false,
        },
    )
    .await;
    // No read-only setting: the gateway must see the hot standby itself.
    let standby_gw = gateway(&standby_url).await;
    let primary_base = format!("http://{}", primary_gw.addr);
    let standby_base = format!("http://{}", standby_gw.addr);
    let client = reqwest::Client::new();

    let (status, health) = get(&client, &standby_base, "/ojs/v1/health").await;
    assert_eq!(status, StatusCode::OK, "{health}");
    assert_eq!(health["read_only"], true, "standby detected: {health}");
    let (_, health) = get(&client, &primary_base, "/ojs/v1/health").await;
    assert_eq!(health["read_only"], false, "{health}");

    // A job and a stream event written on the primary become readable on the standby.
    let (status, enqueued) = post(
        &client,
        &primary_base,
        "/ojs/v1/jobs",
        json!({"type": "replica.job", "args": [1], "options": {"queue": "replicated"}}),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{enqueued}");
    let id = enqueued["job"]["id"].as_str().expect("id").to_string();
    let (status, _) = post(
        &client,
        &primary_base,
        "/ojs/v1/queues/replicated/messages",
        json!({"type": "replica.event", "payload": {"n": 1}}),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED);
    eventually(
        Duration::from_secs(30),
        "the job and the event replicate to the standby",
        async || {
            let (job, _) = get(&client, &standby_base, &format!("/ojs/v1/jobs/{id}")).await;
            let (_, stats) = get(&client, &standby_base, "/ojs/v1/queues/replicated/stats").await;
            job == StatusCode::OK && stats["queue"]["stream"]["events"] == 1
        },
    )
    .await;
    let (_, job) = get(&client, &standby_base, &format!("/ojs/v1/jobs/{id}")).await;
    assert_eq!(job["job"]["state"], "available", "{job}");
    let (status, queues) = get(&client, &standby_base, "/ojs/v1/queues").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(queues["queues"][0]["name"], "replicated", "{queues}");
    let (status, stats) = get(&client, &standby_base, "/ojs/v1/queues/replicated/stats").await;
    assert_eq!(status, StatusCode::OK, "{stats}");
    assert_eq!(stats["queue"]["available"], 1, "{stats}");
    assert_eq!(stats["queue"]["stream"]["events"], 1, "{stats}");
    let (status, info) = get(&client, &standby_base, "/ojs/v1/queues/replicated/info").await;
    assert_eq!(status, StatusCode::OK, "{info}");
    let (status, _) = get(&client, &standby_base, "/ojs/manifest").await;
    assert_eq!(status, StatusCode::OK);
    let channel = common::grpc::channel(&standby_base).await;
    let mut ojs = pb::ojs_service_client::OjsServiceClient::new(channel.clone());
    let seen = ojs
        .get_job(pb::GetJobRequest { job_id: id.clone() })
        .await
        .expect("GetJob on the standby")
        .into_inner()
        .job
        .expect("job");
    assert_eq!(seen.id, id);
    ojs.queue_stats(pb::QueueStatsRequest {
        queue: "replicated".into(),
    })
    .await
    .expect("QueueStats on the standby");
    s3::admin_service_client::AdminServiceClient::new(channel.clone())
        .get_queue_config(s3::GetQueueConfigRequest {
            queue: "replicated".into(),
        })
        .await
        .expect("GetQueueConfig on the standby");
    s3::stream_service_client::StreamServiceClient::new(channel.clone())
        .get_config(s3::GetConfigRequest {
            queue: "replicated".into(),
        })
        .await
        .expect("stream GetConfig on the standby");

    // Every read route of the generated table is served on the standby: none writes (the
    // configuration reads used to lock and update rows, which a standby refuses).
    for op in pgvs3::http::api::HTTP_OPERATIONS
        .iter()
        .filter(|op| op.read_only && op.method == "GET")
    {
        // A queue's segment (`{q}`, or `{name}` after `queues`) names the replicated queue.
        let segments: Vec<&str> = op.path.split('/').collect();
        let path = segments
            .iter()
            .enumerate()
            .map(|(i, segment)| match *segment {
                "{q}" => "replicated",
                "{name}" if i > 0 && segments[i - 1] == "queues" => "replicated",
                s if s.starts_with('{') => id.as_str(),
                s => s,
            })
            .collect::<Vec<_>>()
            .join("/");
        let (status, answer) = get(&client, &standby_base, &path).await;
        // The job id stands in for every id; a batch, workflow, worker or cron entry of that id
        // is not found.
        let expected = if path.contains("/batches/")
            || path.contains("/workflows/")
            || path.contains("/admin/workers/")
            || path.contains("/crons/")
        {
            StatusCode::NOT_FOUND
        } else {
            StatusCode::OK
        };
        assert_eq!(status, expected, "{} on the standby: {answer}", op.id);
    }

    // Writes on the standby are refused, over both protocols.
    for (path, body) in [
        (
            "/ojs/v1/jobs",
            json!({"type": "t", "args": [], "options": {"queue": "replicated"}}),
        ),
        ("/ojs/v1/workers/fetch", json!({"queues": ["replicated"]})),
        ("/ojs/v1/workers/ack", json!({"job_id": id})),
        (
            "/ojs/v1/queues/replicated/messages",
            json!({"type": "t", "payload": 1}),
        ),
        (
            "/ojs/v1/queues/replicated/consumers",
            json!({"consumer": "c"}),
        ),
        ("/ojs/v1/queues", json!({"name": "other"})),
    ] {
        let (status, answer) = post(&client, &standby_base, path, body).await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{path}: {answer}");
        assert_eq!(answer["error"]["code"], "read_only", "{path}: {answer}");
    }
    let refused = ojs
        .enqueue(pb::EnqueueRequest {
            r#type: "t".into(),
            options: Some(pb::EnqueueOptions {
                queue: "replicated".into(),
                ..Default::default()
            }),
            ..Default::default()
        })
        .await
        .expect_err("gRPC enqueue on the standby");
    assert_eq!(refused.code(), tonic::Code::PermissionDenied);
    assert_eq!(grpc_code(&refused), "read_only");
    let mut admin = s3::admin_service_client::AdminServiceClient::new(channel);
    let refused = admin
        .drop_queue(s3::DropQueueRequest {
            queue: "replicated".into(),
        })
        .await
        .expect_err("gRPC drop on the standby");
    assert_eq!(refused.code(), tonic::Code::PermissionDenied);

    // Meanwhile the primary's gateway keeps writing, and the standby follows.
    let (status, fetched) = post(
        &client,
        &primary_base,
        "/ojs/v1/workers/fetch",
        json!({"queues": ["replicated"]}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{fetched}");
    let (status, acked) = post(
        &client,
        &primary_base,
        "/ojs/v1/workers/ack",
        json!({"job_id": id, "lease_token": fetched["jobs"][0]["lease_token"]}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{acked}");
    let (status, second) = post(
        &client,
        &primary_base,
        "/ojs/v1/jobs",
        json!({"type": "replica.job", "args": [2], "options": {"queue": "replicated"}}),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{second}");
    let second = second["job"]["id"].as_str().expect("id").to_string();
    eventually(
        Duration::from_secs(30),
        "the ack and the second job replicate",
        async || {
            let (_, first) = get(&client, &standby_base, &format!("/ojs/v1/jobs/{id}")).await;
            let (status, _) = get(&client, &standby_base, &format!("/ojs/v1/jobs/{second}")).await;
            first["job"]["state"] == "completed" && status == StatusCode::OK
        },
    )
    .await;
    let (_, stats) = get(&client, &standby_base, "/ojs/v1/queues/replicated/stats").await;
    assert_eq!(stats["queue"]["completed"], 1, "{stats}");

    standby_gw.shutdown().await;
    primary_gw.shutdown().await;
    drop(clusters);
}
