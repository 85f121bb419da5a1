//! Starting and stopping the server: migrations, the service, both protocols on one port (plus an
//! optional gRPC-only port), the middleware stack and graceful shutdown.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::serve::ListenerExt;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinSet;

use crate::core::{CoreError, Service, ServiceSettings};
use crate::middleware::{self, StackState};
use crate::store::Store;

/// Everything `start` needs.
#[derive(Debug, Clone)]
pub struct ServerSettings {
    /// Address for HTTP and gRPC together (`127.0.0.1:0` for an ephemeral port).
    pub listen: String,
    /// Optional gRPC-only address.
    pub grpc_listen: Option<String>,
    /// TLS on both addresses when set.
    pub tls: Option<crate::tls::TlsFiles>,
    /// PostgreSQL URL.
    pub database_url: String,
    /// Pool size.
    pub db_pool_size: u32,
    /// Server-wide queue quota (0 = unlimited).
    pub max_queues: i64,
    /// Global in-flight limit.
    pub max_in_flight: usize,
    /// Per-queue in-flight limit (0 = off).
    pub queue_max_in_flight: usize,
    /// Body and message size limit.
    pub max_body_bytes: usize,
    /// Bound on graceful shutdown.
    pub shutdown_timeout: Duration,
    /// Time between maintenance passes; `None` runs none (e.g. read-only gateways).
    pub maintenance_interval: Option<Duration>,
    /// Job operation settings (read-only included).
    pub service: ServiceSettings,
    /// Every operation but the public ones needs a token with its role.
    pub auth: bool,
    /// `/metrics` without a token when auth is on.
    pub metrics_open: bool,
    /// The Content-Type of JSON answers over HTTP.
    pub json_media_type: &'static str,
}

impl ServerSettings {
    /// Defaults for a database URL, listening on an ephemeral local port.
    pub fn for_database(database_url: &str) -> Self {
        ServerSettings {
            listen: "127.0.0.1:0".to_string(),
            grpc_listen: None,
            tls: None,
            database_url: database_url.to_string(),
            db_pool_size: 16,
            max_queues: 1000,
            max_in_flight: 1024,
            queue_max_in_flight: 256,
            max_body_bytes: crate::contract::DEFAULT_MAX_BODY_BYTES,
            shutdown_timeout: Duration::from_secs(10),
            maintenance_interval: Some(Duration::from_millis(500)),
            service: ServiceSettings::default(),
            auth: false,
            metrics_open: false,
            json_media_type: crate::http::OJS_MEDIA_TYPE,
        }
    }
}

/// Why the server could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The database refused or failed.
    #[error("database: {0}")]
    Database(#[from] CoreError),
    /// A listen address could not be bound.
    #[error("cannot listen on {address}: {source}")]
    Listen {
        /// The address.
        address: String,
        /// The cause.
        source: std::io::Error,
    },
    /// The TLS certificate, key or client CA could not be used.
    #[error("TLS: {0}")]
    Tls(#[from] crate::tls::TlsError),
}

/// A running server.
pub struct RunningServer {
    /// Where HTTP and gRPC are served.
    pub addr: SocketAddr,
    /// Where gRPC alone is served, if configured.
    pub grpc_addr: Option<SocketAddr>,
    shutdown: watch::Sender<bool>,
    tasks: JoinSet<std::io::Result<()>>,
    store: Store,
    shutdown_timeout: Duration,
}

/// Disables Nagle's algorithm: small gRPC frames (trailers, stream items) must not wait for the
/// peer's delayed ACK, which adds ~40 ms per response.
fn no_delay(stream: &mut tokio::net::TcpStream) {
    if let Err(error) = stream.set_nodelay(true) {
        tracing::debug!(%error, "could not set TCP_NODELAY");
    }
}

async fn bind(address: &str) -> Result<TcpListener, StartError> {
    TcpListener::bind(address)
        .await
        .map_err(|source| StartError::Listen {
            address: address.to_string(),
            source,
        })
}

/// Serves `app` on `address` (over TLS with `tls`) until `stop` holds true; returns the address
/// bound.
async fn serve(
    tasks: &mut JoinSet<std::io::Result<()>>,
    address: &str,
    tls: Option<tokio_rustls::TlsAcceptor>,
    app: axum::Router,
    mut stop: watch::Receiver<bool>,
) -> Result<std::net::SocketAddr, StartError> {
    let listener = bind(address).await?;
    let listen_error = |source| StartError::Listen {
        address: address.to_string(),
        source,
    };
    let addr = listener.local_addr().map_err(listen_error)?;
    let stopped = async move {
        let _ = stop.wait_for(|s| *s).await;
    };
    // Routes become services once here: serving the router itself would clone every route for
    // each new connection (a connection per request costs a client without keep-alive that).
    let app = app.with_state(()).into_make_service();
    match tls {
        None => tasks.spawn(async move {
            axum::serve(listener.tap_io(no_delay), app)
                .with_graceful_shutdown(stopped)
                .await
        }),
        Some(acceptor) => {
            let listener =
                crate::tls::TlsListener::new(listener, acceptor).map_err(listen_error)?;
            tasks.spawn(async move {
                axum::serve(listener, app)
                    .with_graceful_shutdown(stopped)
                    .await
            })
        }
    };
    Ok(addr)
}

/// The middleware stack's rejections, rendered by the adapter of the request's protocol.
pub fn reject(
    protocol: middleware::Protocol,
    error: crate::core::CoreError,
    request_id: &str,
) -> axum::response::Response {
    use axum::response::IntoResponse;
    match protocol {
        middleware::Protocol::Http => crate::http::ApiError::from(error)
            .with_request_id(request_id)
            .into_response(),
        middleware::Protocol::Grpc => crate::grpc::status_of(&error, request_id)
            .into_http::<axum::body::Body>()
            .into_response(),
    }
}

/// Answers what no route serves: 404 for a path no operation has, 405 for a method its route
/// lacks (OPTIONS included), UNIMPLEMENTED for a gRPC call of a method no table declares. No
/// guard and no handler runs for them.
fn unrouted(router: axum::Router) -> axum::Router {
    async fn no_route(request: axum::extract::Request) -> axum::response::Response {
        let path = request.uri().path().to_string();
        if middleware::is_grpc(request.headers()) {
            return middleware::unserved(request, |id| {
                use axum::response::IntoResponse;
                let mut status = tonic::Status::unimplemented(format!("no method {path}"));
                if let Ok(value) = id.parse() {
                    status.metadata_mut().insert("x-ojs-request-id", value);
                }
                status.into_http::<axum::body::Body>().into_response()
            })
            .await;
        }
        middleware::unserved(request, |id| crate::http::unknown_route(id, &path)).await
    }
    async fn no_method(request: axum::extract::Request) -> axum::response::Response {
        let (method, path) = (request.method().clone(), request.uri().path().to_string());
        middleware::unserved(request, |id| {
            crate::http::method_not_allowed(id, &method, &path)
        })
        .await
    }
    router
        .fallback(no_route)
        .method_not_allowed_fallback(no_method)
}

/// Connects, migrates and starts serving.
pub async fn start(settings: ServerSettings) -> Result<RunningServer, StartError> {
    let mut settings = settings;
    let store = Store::connect(
        &settings.database_url,
        settings.db_pool_size,
        settings.max_queues,
        settings.service.read_only,
    )
    .await?;
    // A hot standby cannot be written: serve it read-only, and leave migrations to the primary.
    if store.in_recovery().await? {
        if !settings.service.read_only {
            tracing::warn!("the database is a hot standby: serving read-only");
        }
        settings.service.read_only = true;
    } else if !settings.service.read_only {
        // A read-only gateway's sessions cannot write: migrating is for the writable ones.
        store.migrate().await?;
    }
    // One limit: the middleware enforces it, the manifest reports it.
    settings.service.max_body_bytes = settings.max_body_bytes;
    let service = Arc::new(Service::new(store.clone(), settings.service.clone()));
    let auth = if settings.auth {
        Some(middleware::Auth {
            tokens: crate::store::tokens::TokenCache::start(&store).await,
            metrics_open: settings.metrics_open,
        })
    } else {
        None
    };
    let stack = StackState::new(
        settings.service.read_only,
        settings.max_in_flight,
        settings.queue_max_in_flight,
        settings.max_body_bytes,
        auth,
        settings.json_media_type,
        reject,
    );
    // Streaming RPCs end when shutdown begins, so graceful shutdown does not wait on them.
    let (shutdown, _) = watch::channel(false);
    let grpc = crate::grpc::router_until(
        service.clone(),
        &stack,
        settings.max_body_bytes,
        shutdown.subscribe(),
    );
    let metrics = crate::metrics::router(crate::metrics::MetricsState {
        service: service.clone(),
        stack: stack.clone(),
    });
    let ui = crate::ui::router(service.clone(), stack.clone(), shutdown.subscribe());
    let app = middleware::apply(
        unrouted(
            crate::http::router_until(service.clone(), &stack, shutdown.subscribe())
                .merge(grpc.clone())
                .merge(metrics)
                .merge(ui),
        ),
        stack.clone(),
    );

    let tls = settings
        .tls
        .as_ref()
        .map(crate::tls::acceptor)
        .transpose()?;
    let mut tasks = JoinSet::new();
    let addr = serve(
        &mut tasks,
        &settings.listen,
        tls.clone(),
        app,
        shutdown.subscribe(),
    )
    .await?;
    let mut grpc_addr = None;
    if let Some(address) = &settings.grpc_listen {
        let grpc_app = middleware::apply(unrouted(grpc), stack);
        grpc_addr = Some(serve(&mut tasks, address, tls, grpc_app, shutdown.subscribe()).await?);
    }
    if let Some(interval) = settings.maintenance_interval
        && !settings.service.read_only
    {
        let stop = shutdown.subscribe();
        let service = service.clone();
        tasks.spawn(async move {
            crate::maintenance::run(service, interval, stop).await;
            Ok(())
        });
    }
    // The Admin API's tick: hands over the workers seen, steps the throughput rollup, follows
    // maintenance mode and quiet workers (a read-only gateway claims nothing: it needs none).
    if !settings.service.read_only {
        let stop = shutdown.subscribe();
        let service = service.clone();
        tasks.spawn(async move {
            crate::core::admin_system::run(service, stop).await;
            Ok(())
        });
    }
    tracing::info!(%addr, ?grpc_addr, read_only = settings.service.read_only, auth = settings.auth, "pgvs3 serving HTTP and gRPC");
    Ok(RunningServer {
        addr,
        grpc_addr,
        shutdown,
        tasks,
        store,
        shutdown_timeout: settings.shutdown_timeout,
    })
}

impl RunningServer {
    /// Asks the listeners to stop accepting (in-flight requests finish).
    pub fn begin_shutdown(&self) {
        let _ = self.shutdown.send(true);
    }

    /// Stops accepting, waits for in-flight work up to the bound, then closes the pool.
    pub async fn shutdown(mut self) {
        self.begin_shutdown();
        let drained = tokio::time::timeout(self.shutdown_timeout, async {
            while let Some(result) = self.tasks.join_next().await {
                if let Ok(Err(error)) = result {
                    tracing::warn!(%error, "listener ended with an error");
                }
            }
        })
        .await;
        if drained.is_err() {
            tracing::warn!(
                "in-flight requests did not finish within the shutdown bound; aborting them"
            );
            self.tasks.abort_all();
        }
        self.store.close().await;
    }

    /// Serves until a listener fails or `signal` resolves, then shuts down gracefully.
    pub async fn run_until(mut self, signal: impl std::future::Future<Output = ()>) {
        tokio::select! {
            _ = signal => tracing::info!("shutting down"),
            Some(result) = self.tasks.join_next() => {
                tracing::error!(?result, "a listener stopped unexpectedly; shutting down");
            }
        }
        self.shutdown().await;
    }
}

impl Drop for RunningServer {
    fn drop(&mut self) {
        let _ = self.shutdown.send(true);
        // Without this the listener outlives the server, reconnecting forever (e.g. to a
        // database a test dropped).
        self.store.stop_listening();
    }
}
