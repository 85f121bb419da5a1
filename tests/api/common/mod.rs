//! Test harness: a real PostgreSQL (DATABASE_URL, or one private cluster for the test process), a
//! fresh database per test (`db`), and the real server on an ephemeral port.

pub mod certs;
pub mod codes;
pub mod db;
pub mod grpc;
pub mod ha;
pub mod http;
pub mod raw;
pub mod tokens;
pub mod wait;
pub mod webdriver;

use pgvs3::server::{self, RunningServer, ServerSettings};

pub use db::{empty_database, fresh_database};

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

/// A middleware stack for routers a test serves itself: writable, 16 requests in flight, no
/// per-queue limit, 1 MiB bodies, auth off.
pub fn bare_stack() -> std::sync::Arc<pgvs3::middleware::StackState> {
    pgvs3::middleware::StackState::new(
        false,
        16,
        0,
        1 << 20,
        None,
        pgvs3::http::OJS_MEDIA_TYPE,
        pgvs3::server::reject,
    )
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
    pub async fn grpc(&self) -> grpc::Ojs {
        grpc::ojs(&self.grpc_url).await
    }
}

impl Drop for TestApp {
    fn drop(&mut self) {
        // The server stops with its runtime; drop the database (best effort).
        drop(self.server.take());
        db::drop_database(std::mem::take(&mut self.database));
    }
}
