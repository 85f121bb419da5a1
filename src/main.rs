//! The `pgvs3` command.

use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use pgvs3::cluster::{ClusterOptions, PrivateCluster};
use pgvs3::config::{Cli, Command, DatabaseArgs, MaintainArgs, ServeArgs, TokenAction, TokenArgs};
use pgvs3::core::{Scope, ServiceSettings};
use pgvs3::server::{self, ServerSettings};
use pgvs3::store::Store;

/// glibc malloc spent more CPU per request than any one part of the server; mimalloc does not.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    pgvs3::memory::no_transparent_huge_pages();
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("pgvs3: cannot start the async runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async {
        let _telemetry = pgvs3::telemetry::init(cli.log_format);
        match cli.command {
            Command::Serve(args) => serve(args).await,
            Command::Migrate(args) => migrate(args).await,
            Command::Maintain(args) => maintain(args).await,
            Command::Token(args) => token(args).await,
        }
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("pgvs3: {message}");
            ExitCode::FAILURE
        }
    }
}

/// The database URL to use, starting the private cluster when none is given.
async fn database(args: &DatabaseArgs) -> Result<(String, Option<PrivateCluster>), String> {
    if let Some(url) = &args.database_url {
        return Ok((url.clone(), None));
    }
    let options = ClusterOptions {
        data_dir: args.data_dir.clone(),
        fsync: true,
    };
    let cluster = tokio::task::spawn_blocking(move || PrivateCluster::start(&options))
        .await
        .map_err(|e| format!("private cluster start panicked: {e}"))?
        .map_err(|e| e.to_string())?;
    Ok((cluster.database_url("postgres"), Some(cluster)))
}

async fn stop_cluster(cluster: Option<PrivateCluster>) {
    if let Some(mut cluster) = cluster {
        let _ = tokio::task::spawn_blocking(move || cluster.stop()).await;
    }
}

async fn migrate(args: DatabaseArgs) -> Result<(), String> {
    let (url, cluster) = database(&args).await?;
    let result = async {
        let store = Store::connect(&url, 2, 0, false)
            .await
            .map_err(|e| e.to_string())?;
        store.migrate().await.map_err(|e| e.to_string())?;
        store.close().await;
        Ok(())
    }
    .await;
    stop_cluster(cluster).await;
    if result.is_ok() {
        tracing::info!("migrations applied");
    }
    result
}

async fn maintain(args: MaintainArgs) -> Result<(), String> {
    let (url, cluster) = database(&args.database).await?;
    let result = async {
        let store = Store::connect(&url, 2, 0, false)
            .await
            .map_err(|e| e.to_string())?;
        store.migrate().await.map_err(|e| e.to_string())?;
        let settings = ServiceSettings {
            job_retention_ms: args.job_retention_secs.saturating_mul(1000),
            ..ServiceSettings::default()
        };
        let service = std::sync::Arc::new(pgvs3::core::Service::new(store.clone(), settings));
        if args.once {
            let report = service.maintain().await.map_err(|e| e.to_string())?;
            println!(
                "{}",
                serde_json::json!({
                    "ran": report.ran,
                    "released": report.released,
                    "expired": report.expired,
                    "removed": report.removed,
                    "retries_moved": report.retries_moved,
                    "rotations": report.rotations,
                    "vacuums": report.vacuums,
                    "queues_stepped": report.queues_stepped,
                    "failed_steps": report.failed_steps,
                })
            );
            if !report.failed_steps.is_empty() {
                store.close().await;
                return Err(format!(
                    "maintenance steps failed (see the log): {:?}",
                    report.failed_steps
                ));
            }
        } else {
            let (stop, watch) = tokio::sync::watch::channel(false);
            let interval = Duration::from_millis(args.maintenance_interval_ms);
            let passes = tokio::spawn(pgvs3::maintenance::run(service, interval, watch));
            shutdown_signal().await;
            let _ = stop.send(true);
            let _ = passes.await;
        }
        store.close().await;
        Ok(())
    }
    .await;
    stop_cluster(cluster).await;
    result
}

async fn shutdown_signal() {
    let interrupt = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut terminate) => {
                tokio::select! {
                    _ = interrupt => {},
                    _ = terminate.recv() => {},
                }
            }
            Err(_) => {
                let _ = interrupt.await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = interrupt.await;
    }
}

async fn token(args: TokenArgs) -> Result<(), String> {
    let (url, cluster) = database(&args.database).await?;
    let result = async {
        let store = Store::connect(&url, 2, 0, false)
            .await
            .map_err(|e| e.to_string())?;
        store.migrate().await.map_err(|e| e.to_string())?;
        let service = pgvs3::core::Service::new(store.clone(), ServiceSettings::default());
        let done = match args.action {
            TokenAction::Create {
                roles,
                queues,
                name,
            } => {
                service
                    .create_token(None, name.as_deref(), &roles, &queues)
                    .await
                    .map(|created| {
                        // The token goes to stdout alone, so `$(pgvs3 token create ...)` captures it.
                        println!("{}", created.token);
                        eprintln!(
                            "pgvs3: token {} created (roles {}; queues {})",
                            created.grant.name,
                            roles_text(&created.grant),
                            queues_text(&created.grant)
                        );
                    })
            }
            TokenAction::List => service.list_tokens(&Scope::all()).await.map(|tokens| {
                for record in tokens {
                    println!(
                        "{}",
                        serde_json::json!({
                            "name": record.grant.name,
                            "roles": record.grant.roles,
                            "queues": record.grant.queues,
                            "created_at": record.created_at,
                            "revoked_at": record.revoked_at,
                        })
                    );
                }
            }),
            TokenAction::Revoke { name } => service
                .revoke_token(&Scope::all(), &name)
                .await
                .map(|()| eprintln!("pgvs3: token {name} revoked")),
        };
        store.close().await;
        done.map_err(|e| e.message)
    }
    .await;
    stop_cluster(cluster).await;
    result
}

fn roles_text(grant: &pgvs3::core::Grant) -> String {
    let names: Vec<&str> = grant.roles.iter().map(|r| r.name()).collect();
    names.join(",")
}

fn queues_text(grant: &pgvs3::core::Grant) -> String {
    if grant.queues.is_empty() {
        "all".to_string()
    } else {
        grant.queues.join(",")
    }
}

async fn serve(args: ServeArgs) -> Result<(), String> {
    let auth = args.auth_on();
    if !auth && args.listens_beyond_loopback() {
        tracing::warn!(
            "--auth off: anyone who reaches {} may do anything; keep it on loopback or behind an \
             authenticating proxy",
            args.listen
        );
    }
    let (url, cluster) = database(&args.database).await?;
    let settings = ServerSettings {
        listen: args.listen.clone(),
        grpc_listen: args.grpc_listen.clone(),
        tls: match (&args.tls_cert, &args.tls_key) {
            (Some(cert), Some(key)) => Some(pgvs3::tls::TlsFiles {
                cert: cert.clone(),
                key: key.clone(),
                client_ca: args.tls_client_ca.clone(),
            }),
            _ => None,
        },
        database_url: url,
        db_pool_size: args.database.db_pool_size,
        max_queues: args.max_queues,
        max_in_flight: args.max_in_flight,
        queue_max_in_flight: args.queue_max_in_flight,
        max_body_bytes: args.max_body_bytes,
        shutdown_timeout: Duration::from_secs(args.shutdown_timeout_secs),
        maintenance_interval: Some(Duration::from_millis(args.maintenance_interval_ms)),
        service: ServiceSettings {
            job_retention_ms: args.job_retention_secs.saturating_mul(1000),
            default_visibility_timeout_ms: args.visibility_timeout_ms,
            require_lease_token: args.require_lease_token,
            read_only: args.read_only,
            max_streams: args.max_streams,
            ..ServiceSettings::default()
        },
        auth,
        metrics_open: args.metrics_open,
        json_media_type: args.http_content_type.media_type(),
    };
    let result = match server::start(settings).await {
        Ok(running) => {
            running.run_until(shutdown_signal()).await;
            Ok(())
        }
        Err(error) => Err(error.to_string()),
    };
    stop_cluster(cluster).await;
    result
}
