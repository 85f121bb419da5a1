//! Test harness: a real PostgreSQL (DATABASE_URL, or a private cluster per test process), a fresh
//! database per test, and the real server on an ephemeral port.
#![allow(dead_code)]

pub mod certs;
pub mod codes;
pub mod raw;
pub mod tokens;
pub mod wait;
pub mod webdriver;

use std::path::PathBuf;
use std::sync::{Mutex, OnceLock};

use pgvs3::cluster::{ClusterOptions, PrivateCluster};
use pgvs3::server::{self, RunningServer, ServerSettings};
use sqlx::Connection;

/// A running pgvs3 on its own database.
pub struct TestApp {
    /// Base URL of the HTTP binding, e.g. `http://127.0.0.1:41234`.
    pub http_url: String,
    /// URL for a tonic client (same port: both protocols share it).
    pub grpc_url: String,
    /// The test's own database.
    pub database_url: String,
    server: Option<RunningServer>,
    database: String,
}

/// The private cluster of this test process, stopped at process exit.
static CLUSTER: Mutex<Option<PrivateCluster>> = Mutex::new(None);
static ADMIN_URL: OnceLock<Result<String, String>> = OnceLock::new();

extern "C" fn stop_private_cluster() {
    if let Ok(mut guard) = CLUSTER.lock()
        && let Some(mut cluster) = guard.take()
    {
        let _ = cluster.stop();
        if let Some(dir) = cluster_dir() {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

fn cluster_dir() -> Option<PathBuf> {
    Some(PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("pg-{}", std::process::id())))
}

/// The URL of a database where test databases can be created.
fn admin_url() -> String {
    let url = ADMIN_URL.get_or_init(|| {
        if let Ok(url) = std::env::var("DATABASE_URL")
            && !url.is_empty()
        {
            return Ok(url);
        }
        let options = ClusterOptions {
            data_dir: cluster_dir().ok_or("no target dir")?,
            fsync: false,
        };
        let cluster = PrivateCluster::start(&options).map_err(|e| e.to_string())?;
        let url = cluster.database_url("postgres");
        if let Ok(mut guard) = CLUSTER.lock() {
            *guard = Some(cluster);
        }
        // SAFETY: registering a plain extern "C" function with no captured state.
        unsafe {
            libc::atexit(stop_private_cluster);
        }
        Ok(url)
    });
    match url {
        Ok(url) => url.clone(),
        Err(e) => panic!("no PostgreSQL for tests: {e}"),
    }
}

fn with_database(url: &str, database: &str) -> String {
    let (base, query) = match url.split_once('?') {
        Some((b, q)) => (b, format!("?{q}")),
        None => (url, String::new()),
    };
    let prefix = match base.rfind('/') {
        Some(i) if i > base.find("//").map_or(0, |j| j + 1) => &base[..i],
        _ => base,
    };
    format!("{prefix}/{database}{query}")
}

/// A fresh, empty database; returns its name and URL.
pub async fn fresh_database() -> (String, String) {
    let admin = admin_url();
    let name = format!("pgvs3_test_{}", uuid::Uuid::new_v4().simple());
    let mut conn = sqlx::PgConnection::connect(&admin)
        .await
        .expect("connect to the admin database");
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}")))
        .execute(&mut conn)
        .await
        .expect("create the test database");
    let _ = conn.close().await;
    let url = with_database(&admin, &name);
    (name, url)
}

/// Starts pgvs3 on a fresh database with default settings.
pub async fn spawn_app() -> TestApp {
    spawn_app_with(|_| {}).await
}

/// Starts pgvs3 on a fresh database, letting the test adjust the settings.
pub async fn spawn_app_with(adjust: impl FnOnce(&mut ServerSettings)) -> TestApp {
    let (database, url) = fresh_database().await;
    spawn_app_on(&database, &url, adjust).await
}

/// Starts pgvs3 on an existing test database (e.g. a second gateway).
pub async fn spawn_app_on(
    database: &str,
    url: &str,
    adjust: impl FnOnce(&mut ServerSettings),
) -> TestApp {
    let mut settings = ServerSettings::for_database(url);
    settings.db_pool_size = 8;
    adjust(&mut settings);
    let server = server::start(settings).await.expect("start pgvs3");
    let base = format!("http://{}", server.addr);
    TestApp {
        http_url: base.clone(),
        grpc_url: base,
        database_url: url.to_string(),
        server: Some(server),
        database: database.to_string(),
    }
}

impl TestApp {
    /// Stops the server gracefully.
    pub async fn stop(mut self) {
        if let Some(server) = self.server.take() {
            server.shutdown().await;
        }
    }

    /// A gRPC client of `ojs.v1.OJSService`.
    pub async fn grpc(
        &self,
    ) -> pgvs3::grpc::proto::ojs::v1::ojs_service_client::OjsServiceClient<tonic::transport::Channel>
    {
        pgvs3::grpc::proto::ojs::v1::ojs_service_client::OjsServiceClient::connect(
            self.grpc_url.clone(),
        )
        .await
        .expect("connect gRPC")
    }
}

impl Drop for TestApp {
    fn drop(&mut self) {
        // The server stops with its runtime; drop the database (best effort) on a thread of its own.
        drop(self.server.take());
        let admin = match ADMIN_URL.get() {
            Some(Ok(url)) => url.clone(),
            _ => return,
        };
        let name = std::mem::take(&mut self.database);
        let _ = std::thread::spawn(move || {
            let Ok(runtime) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            else {
                return;
            };
            runtime.block_on(async {
                if let Ok(mut conn) = sqlx::PgConnection::connect(&admin).await {
                    let _ = sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
                        "DROP DATABASE IF EXISTS {name} WITH (FORCE)"
                    )))
                    .execute(&mut conn)
                    .await;
                }
            });
        })
        .join();
    }
}
