//! Command line and environment: every setting, its flag, its variable and its default.

use std::path::PathBuf;

use clap::builder::TypedValueParser;
use clap::{Args, Parser, Subcommand, ValueEnum};

/// The longest `--job-retention-secs`: a queue's own retention has the same bound, and a job's end
/// plus it must stay a timestamp PostgreSQL can hold.
const MAX_RETENTION_SECS: i64 = crate::core::validate::MAX_DURATION_MS / 1000;

/// The bounds of `--db-pool-size`: the server's notification listener holds one connection for
/// good, so a pool of one left nothing for statements; sqlx allocates a slot per connection up
/// front (4,294,967,295 allocated gigabytes at start), and PostgreSQL's `max_connections` is far
/// below the top anyway.
const POOL_SIZE: std::ops::RangeInclusive<i64> = 2..=10_000;

/// The bounds of `--max-in-flight`: at 0 even health checks were refused, and tokio's semaphore
/// panics above `usize::MAX >> 3` permits.
const IN_FLIGHT: std::ops::RangeInclusive<u64> = 1..=1_000_000;

/// The bounds of `--maintenance-interval-ms`: passes closer than 10 ms would only contend for the
/// maintenance lock; more than an hour apart, lease expiry and TTLs would wait that long.
const MAINTENANCE_INTERVAL_MS: std::ops::RangeInclusive<u64> = 10..=3_600_000;

/// The bounds of `--max-body-bytes`: below 1 KiB no batch or workflow fits; PostgreSQL holds no
/// value over 1 GiB.
const BODY_BYTES: std::ops::RangeInclusive<u64> = 1024..=1 << 30;

/// pgvs3: a job queue (Open Job Spec) and event-stream server on PostgreSQL, over HTTP and gRPC.
#[derive(Debug, Parser)]
#[command(name = "pgvs3", version, about)]
pub struct Cli {
    /// Log format.
    #[arg(long, env = "PGVS3_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text, global = true)]
    pub log_format: LogFormat,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// Log line format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Serve HTTP and gRPC (private PostgreSQL unless DATABASE_URL is set).
    Serve(ServeArgs),
    /// Apply database migrations and exit.
    Migrate(DatabaseArgs),
    /// Run maintenance passes (lease expiry, TTL, retention, stream retries, ticks, rotation).
    Maintain(MaintainArgs),
    /// Create, list and revoke API tokens (stored in the database, shared by every gateway).
    Token(TokenArgs),
}

/// Settings of `pgvs3 token`.
#[derive(Debug, Clone, Args)]
pub struct TokenArgs {
    /// Database settings.
    #[command(flatten)]
    pub database: DatabaseArgs,
    /// What to do.
    #[command(subcommand)]
    pub action: TokenAction,
}

/// `pgvs3 token` actions.
#[derive(Debug, Clone, Subcommand)]
pub enum TokenAction {
    /// Create a token and print it once on stdout (only its hash is stored).
    Create {
        /// A role: reader, producer, worker or admin (repeat for several).
        #[arg(long = "role", required = true)]
        roles: Vec<String>,
        /// Queue-name patterns the token is limited to, comma-separated (`billing.*,mail`);
        /// none: every queue.
        #[arg(long, value_delimiter = ',')]
        queues: Vec<String>,
        /// The token's name (for listing and revoking); default: a generated one.
        #[arg(long)]
        name: Option<String>,
    },
    /// List tokens (names, roles, scopes, times; never the tokens).
    List,
    /// Revoke a token by name: every gateway refuses it from then on.
    Revoke {
        /// The token's name.
        name: String,
    },
}

/// The Content-Type of JSON answers over HTTP.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum HttpContentType {
    /// `application/openjobspec+json`, as the OJS HTTP binding says.
    Openjobspec,
    /// `application/json`, for clients that read no other (the official Python SDK).
    Json,
}

impl HttpContentType {
    /// The media type.
    pub fn media_type(self) -> &'static str {
        match self {
            HttpContentType::Openjobspec => crate::http::OJS_MEDIA_TYPE,
            HttpContentType::Json => "application/json",
        }
    }
}

/// Whether requests need a token.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum AuthMode {
    /// Every request but health and manifest needs a token with the operation's role.
    On,
    /// Anyone who reaches the port may do anything.
    Off,
}

/// Settings of `pgvs3 maintain`.
#[derive(Debug, Clone, Args)]
pub struct MaintainArgs {
    /// Database settings.
    #[command(flatten)]
    pub database: DatabaseArgs,
    /// Run one pass, print its report as JSON and exit.
    #[arg(long)]
    pub once: bool,
    /// Time between passes when not `--once`, ms: 10 to 3,600,000 (an hour).
    #[arg(long, env = "PGVS3_MAINTENANCE_INTERVAL_MS", default_value_t = 500,
          value_parser = clap::value_parser!(u64).range(MAINTENANCE_INTERVAL_MS))]
    pub maintenance_interval_ms: u64,
    /// How long terminal jobs are kept (per-queue settings may override), seconds: 1 to
    /// 315,360,000 (10 years, the bound of every duration a client sends).
    #[arg(long, env = "PGVS3_JOB_RETENTION_SECS", default_value_t = 86_400,
          value_parser = clap::value_parser!(i64).range(1..=MAX_RETENTION_SECS))]
    pub job_retention_secs: i64,
}

/// Where the data lives.
#[derive(Debug, Clone, Args)]
pub struct DatabaseArgs {
    /// PostgreSQL URL; without it a private cluster is started under --data-dir.
    #[arg(long, env = "DATABASE_URL", global = true)]
    pub database_url: Option<String>,
    /// Directory of the private cluster used when no database URL is given.
    #[arg(long, env = "PGVS3_DATA_DIR", default_value = ".pgvs3", global = true)]
    pub data_dir: PathBuf,
    /// Database connections in the pool: 2 to 10,000 (the server's notification listener holds
    /// one).
    #[arg(long, env = "PGVS3_DB_POOL_SIZE", default_value_t = 32, global = true,
          value_parser = clap::value_parser!(u32).range(POOL_SIZE))]
    pub db_pool_size: u32,
}

/// A `usize` flag's parser refusing values outside `range` (clap ranges only `u64` and `i64`).
fn usize_in(range: std::ops::RangeInclusive<u64>) -> impl TypedValueParser<Value = usize> {
    clap::value_parser!(u64)
        .range(range)
        .try_map(|n| usize::try_from(n).map_err(|e| e.to_string()))
}

impl ServeArgs {
    /// Whether auth is on: as asked, else on unless every listen address is loopback.
    pub fn auth_on(&self) -> bool {
        match self.auth {
            Some(mode) => mode == AuthMode::On,
            None => self.listens_beyond_loopback(),
        }
    }

    /// Whether a listen address reaches beyond the loopback interface.
    pub fn listens_beyond_loopback(&self) -> bool {
        !std::iter::once(&self.listen)
            .chain(&self.grpc_listen)
            .all(|address| is_loopback(address))
    }
}

/// Whether a listen address names only the loopback interface.
fn is_loopback(address: &str) -> bool {
    let host = match address.rsplit_once(':') {
        Some((host, _port)) => host,
        None => address,
    };
    let host = host.trim_start_matches('[').trim_end_matches(']');
    host == "localhost"
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// Settings of `pgvs3 serve`.
#[derive(Debug, Clone, Args)]
pub struct ServeArgs {
    /// Database settings.
    #[command(flatten)]
    pub database: DatabaseArgs,
    /// Address serving HTTP/1.1 JSON and gRPC (h2c) together.
    #[arg(long, env = "PGVS3_LISTEN", default_value = "127.0.0.1:8080")]
    pub listen: String,
    /// Optional separate address serving gRPC only.
    #[arg(long, env = "PGVS3_GRPC_LISTEN")]
    pub grpc_listen: Option<String>,
    /// PEM certificate chain: serve HTTPS and gRPC over TLS on every address (with --tls-key).
    #[arg(long, env = "PGVS3_TLS_CERT", requires = "tls_key")]
    pub tls_cert: Option<std::path::PathBuf>,
    /// PEM private key of --tls-cert.
    #[arg(long, env = "PGVS3_TLS_KEY", requires = "tls_cert")]
    pub tls_key: Option<std::path::PathBuf>,
    /// PEM CA certificates: require every client to present a certificate they signed (mTLS).
    #[arg(long, env = "PGVS3_TLS_CLIENT_CA", requires = "tls_cert")]
    pub tls_client_ca: Option<std::path::PathBuf>,
    /// Token authentication: default on, unless every listen address is loopback.
    #[arg(long, env = "PGVS3_AUTH", value_enum)]
    pub auth: Option<AuthMode>,
    /// Content-Type of JSON answers: openjobspec (`application/openjobspec+json`) or json
    /// (`application/json`, for clients that ignore other types).
    #[arg(long, env = "PGVS3_HTTP_CONTENT_TYPE", value_enum, default_value_t = HttpContentType::Openjobspec)]
    pub http_content_type: HttpContentType,
    /// Serve /metrics without a token (else it needs the reader role when auth is on).
    #[arg(long, env = "PGVS3_METRICS_OPEN")]
    pub metrics_open: bool,
    /// Serve reads only; every mutation is rejected (403 read_only / PERMISSION_DENIED).
    #[arg(long, env = "PGVS3_READ_ONLY")]
    pub read_only: bool,
    /// Requests in flight at once, across both protocols; beyond it, 429 / RESOURCE_EXHAUSTED: 1
    /// to 1,000,000.
    #[arg(long, env = "PGVS3_MAX_IN_FLIGHT", default_value_t = 1024,
          value_parser = usize_in(IN_FLIGHT))]
    pub max_in_flight: usize,
    /// Requests in flight at once per queue (HTTP requests naming a queue; 0 = no per-queue limit).
    #[arg(long, env = "PGVS3_QUEUE_MAX_IN_FLIGHT", default_value_t = 256)]
    pub queue_max_in_flight: usize,
    /// Most queue namespaces this database may hold (0 = unlimited); beyond it, 429 quota_exceeded.
    /// Enqueues create queues implicitly (as OJS expects), so the default bounds what a client can
    /// make the database and every maintenance pass carry.
    #[arg(long, env = "PGVS3_MAX_QUEUES", default_value_t = 1000,
          value_parser = clap::value_parser!(i64).range(0..))]
    pub max_queues: i64,
    /// Most long-lived streams (server-sent events, gRPC server streams) open at once; beyond it,
    /// 429 / RESOURCE_EXHAUSTED (0 refuses every stream).
    #[arg(long, env = "PGVS3_MAX_STREAMS", default_value_t = 1000)]
    pub max_streams: usize,
    /// Largest request body or gRPC message accepted, bytes: 1,024 to 1,073,741,824 (1 GiB).
    #[arg(long, env = "PGVS3_MAX_BODY_BYTES", default_value_t = crate::contract::DEFAULT_MAX_BODY_BYTES,
          value_parser = usize_in(BODY_BYTES))]
    pub max_body_bytes: usize,
    /// Lease length when neither the fetch nor the job sets one, ms: 1 to 604,800,000 (7 days,
    /// the longest lease a client may ask for).
    #[arg(long, env = "PGVS3_VISIBILITY_TIMEOUT_MS", default_value_t = 1_800_000,
          value_parser = clap::value_parser!(i64).range(1..=crate::core::validate::MAX_LEASE_MS))]
    pub visibility_timeout_ms: i64,
    /// Refuse ack/nack that carry no lease token.
    #[arg(long, env = "PGVS3_REQUIRE_LEASE_TOKEN")]
    pub require_lease_token: bool,
    /// How long terminal jobs are kept (per-queue settings may override), seconds: 1 to
    /// 315,360,000 (10 years, the bound of every duration a client sends).
    #[arg(long, env = "PGVS3_JOB_RETENTION_SECS", default_value_t = 86_400,
          value_parser = clap::value_parser!(i64).range(1..=MAX_RETENTION_SECS))]
    pub job_retention_secs: i64,
    /// Time between maintenance passes (lease expiry, TTL, retention), ms: 10 to 3,600,000 (an
    /// hour).
    #[arg(long, env = "PGVS3_MAINTENANCE_INTERVAL_MS", default_value_t = 500,
          value_parser = clap::value_parser!(u64).range(MAINTENANCE_INTERVAL_MS))]
    pub maintenance_interval_ms: u64,
    /// How long shutdown waits for in-flight requests, seconds.
    #[arg(long, env = "PGVS3_SHUTDOWN_TIMEOUT_SECS", default_value_t = 10)]
    pub shutdown_timeout_secs: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn serve(args: &[&str]) -> ServeArgs {
        let cli = Cli::parse_from([&["pgvs3", "serve"], args].concat());
        match cli.command {
            Command::Serve(args) => args,
            _ => unreachable!("serve parses as serve"),
        }
    }

    #[test]
    fn job_retention_is_bounded_like_a_queue_retention() {
        assert_eq!(serve(&[]).job_retention_secs, 86_400);
        assert_eq!(
            serve(&["--job-retention-secs", "315360000"]).job_retention_secs,
            MAX_RETENTION_SECS
        );
        for refused in ["0", "-5", "315360001", "10000000000000"] {
            let parsed = Cli::try_parse_from(["pgvs3", "serve", "--job-retention-secs", refused]);
            assert!(parsed.is_err(), "--job-retention-secs {refused} is refused");
        }
    }

    #[test]
    fn the_default_lease_is_bounded_like_a_clients() {
        assert_eq!(serve(&[]).visibility_timeout_ms, 1_800_000);
        assert_eq!(
            serve(&["--visibility-timeout-ms", "604800000"]).visibility_timeout_ms,
            crate::core::validate::MAX_LEASE_MS
        );
        for refused in ["0", "-1", "604800001", "9223372036854775807"] {
            let parsed =
                Cli::try_parse_from(["pgvs3", "serve", "--visibility-timeout-ms", refused]);
            assert!(
                parsed.is_err(),
                "--visibility-timeout-ms {refused} is refused"
            );
        }
    }

    #[test]
    fn sizes_and_intervals_are_bounded() {
        let accepted = [
            ("--db-pool-size", "2"),
            ("--db-pool-size", "10000"),
            ("--max-in-flight", "1"),
            ("--max-in-flight", "1000000"),
            ("--max-queues", "0"),
            ("--max-body-bytes", "1024"),
            ("--max-body-bytes", "1073741824"),
            ("--maintenance-interval-ms", "10"),
            ("--maintenance-interval-ms", "3600000"),
        ];
        for (flag, value) in accepted {
            let parsed = Cli::try_parse_from(["pgvs3", "serve", flag, value]);
            assert!(parsed.is_ok(), "{flag} {value} is accepted");
        }
        let refused = [
            ("--db-pool-size", "0"),
            ("--db-pool-size", "1"),
            ("--db-pool-size", "10001"),
            ("--db-pool-size", "4294967295"),
            ("--max-in-flight", "0"),
            ("--max-in-flight", "1000001"),
            ("--max-in-flight", "18446744073709551615"),
            ("--max-queues", "-5"),
            ("--max-body-bytes", "0"),
            ("--max-body-bytes", "1023"),
            ("--max-body-bytes", "1073741825"),
            ("--maintenance-interval-ms", "0"),
            ("--maintenance-interval-ms", "9"),
            ("--maintenance-interval-ms", "3600001"),
        ];
        for (flag, value) in refused {
            let parsed = Cli::try_parse_from(["pgvs3", "serve", &format!("{flag}={value}")]);
            assert!(parsed.is_err(), "{flag} {value} is refused");
        }
        for refused in ["0", "3600001"] {
            let parsed =
                Cli::try_parse_from(["pgvs3", "maintain", "--maintenance-interval-ms", refused]);
            assert!(
                parsed.is_err(),
                "maintain --maintenance-interval-ms {refused} is refused"
            );
        }
    }

    #[test]
    fn auth_defaults_to_on_off_loopback() {
        assert!(!serve(&[]).auth_on());
        assert!(!serve(&["--listen", "[::1]:8080"]).auth_on());
        assert!(!serve(&["--listen", "localhost:8080"]).auth_on());
        assert!(serve(&["--listen", "0.0.0.0:8080"]).auth_on());
        assert!(serve(&["--grpc-listen", "10.0.0.5:9090"]).auth_on());
        assert!(!serve(&["--listen", "0.0.0.0:8080", "--auth", "off"]).auth_on());
        assert!(serve(&["--auth", "on"]).auth_on());
    }
}
