//! A private PostgreSQL cluster started from the installed server binaries.
//!
//! Used by `pgvs3 serve` when no DATABASE_URL is given, and by the test suite.
//! Layout under the data directory: `pgdata/` (the cluster), `postgres.log`,
//! `port` (the port number as text), `database_url` (how to reach it), `lock` (serialises
//! concurrent starts) and the server's Unix socket.
//!
//! The cluster listens on no TCP port: only on a Unix socket with owner-only permissions, so
//! other local users cannot reach it although it trusts whoever connects.

use std::fs::{self, OpenOptions};
use std::hash::{DefaultHasher, Hash as _, Hasher as _};
use std::io::Write as _;
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::os::unix::fs::{DirBuilderExt as _, PermissionsExt as _};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use tracing::{info, warn};

/// The server binaries the cluster needs, all from one directory.
const REQUIRED_BINARIES: [&str; 3] = ["initdb", "pg_ctl", "postgres"];
/// Where Debian/Ubuntu packages install versioned server binaries.
const DEBIAN_PG_ROOT: &str = "/usr/lib/postgresql";
/// How long to wait for the server to accept TCP connections after start.
const READY_TIMEOUT: Duration = Duration::from_secs(30);
/// How many times to retry a start that lost its port to another process.
const START_ATTEMPTS: usize = 3;
/// Lines of postgres.log included in start errors.
const LOG_TAIL_LINES: usize = 20;
/// The settings file pgvs3 rewrites at every start (included from postgresql.conf).
const SETTINGS_FILE: &str = "pgvs3.conf";
/// The longest socket path the kernel takes (sun_path is 108 bytes with its NUL).
const MAX_SOCKET_PATH: usize = 107;

/// Whether a server we waited for came up or went away.
enum Readiness {
    Ready,
    Gone,
}

/// Errors from finding, initialising, starting or stopping a private cluster.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    /// The PostgreSQL server binaries are not installed where we look.
    #[error(
        "PostgreSQL server binaries not found: pgvs3 needs initdb, pg_ctl and postgres \
         (from one directory) to run a private database, and looked for pg_ctl on PATH \
         (following symlinks to the real directory) and in /usr/lib/postgresql/<version>/bin \
         without finding all three. Install the PostgreSQL server (Debian/Ubuntu: \
         `apt-get install postgresql`), or set DATABASE_URL to an existing database."
    )]
    BinariesNotFound,
    /// A filesystem operation failed.
    #[error("{context}: {source}")]
    Io {
        /// What was being done, naming the path involved.
        context: String,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// An external command could not be run or exited unsuccessfully.
    #[error("`{command}` failed: {detail}")]
    Command {
        /// The command line, for humans.
        command: String,
        /// Exit status and captured output, or why it could not be spawned.
        detail: String,
    },
    /// The `postgres` user cannot reach the data directory through an ancestor.
    #[error(
        "the postgres user cannot traverse {path} (it lacks o+x), so a cluster below it \
         cannot be run while pgvs3 runs as root; choose a data directory elsewhere \
         (e.g. under /tmp) or run `chmod o+x {path}` yourself"
    )]
    NotTraversable {
        /// The ancestor directory lacking o+x.
        path: PathBuf,
    },
    /// The data directory holds a `pgdata` that is not a PostgreSQL cluster.
    #[error("{path} exists but is not a PostgreSQL data directory (no PG_VERSION); move it away")]
    NotACluster {
        /// The offending `pgdata` path.
        path: PathBuf,
    },
    /// `pg_ctl start` failed.
    #[error("starting PostgreSQL in {pgdata} failed: {detail}\nlast lines of {log}:\n{log_tail}")]
    StartFailed {
        /// The cluster directory.
        pgdata: PathBuf,
        /// The pg_ctl failure.
        detail: String,
        /// The server log path.
        log: PathBuf,
        /// The last lines of the server log.
        log_tail: String,
    },
    /// The server started but never accepted connections.
    #[error("PostgreSQL at {address} did not accept connections within {waited:?}; see {log}")]
    NotReady {
        /// The socket path or TCP address we waited on.
        address: String,
        /// How long we waited.
        waited: Duration,
        /// The server log path.
        log: PathBuf,
    },
    /// The running postmaster's pid file could not be understood.
    #[error("cannot read the port of the running postmaster from {path}: {detail}")]
    BadPidFile {
        /// The postmaster.pid path.
        path: PathBuf,
        /// What was wrong with it.
        detail: String,
    },
}

/// Where and how to run a private cluster.
#[derive(Debug, Clone)]
pub struct ClusterOptions {
    /// Directory holding the cluster, its log and its port file (created if missing).
    pub data_dir: PathBuf,
    /// Whether the server syncs to disk; off is faster and fine for throwaway data.
    pub fsync: bool,
}

/// A private PostgreSQL cluster run from the installed server binaries.
#[derive(Debug)]
pub struct PrivateCluster {
    bin_dir: PathBuf,
    data_dir: PathBuf,
    pgdata: PathBuf,
    port: u16,
    /// The directory of the server's Unix socket; `None` for a cluster an older pgvs3 started,
    /// which listens on 127.0.0.1 only.
    socket_dir: Option<PathBuf>,
    as_root: bool,
    /// Only a cluster this value started is stopped by it.
    owned: bool,
    stopped: bool,
}

impl PrivateCluster {
    /// Starts (initialising on first use) a cluster whose files live under `options.data_dir`; reuses an existing one.
    pub fn start(options: &ClusterOptions) -> Result<PrivateCluster, ClusterError> {
        let bin_dir = find_binaries()?;
        fs::create_dir_all(&options.data_dir)
            .map_err(|e| io_err(format!("creating {}", options.data_dir.display()), e))?;
        let data_dir = options
            .data_dir
            .canonicalize()
            .map_err(|e| io_err(format!("resolving {}", options.data_dir.display()), e))?;
        let pgdata = data_dir.join("pgdata");
        let log = data_dir.join("postgres.log");

        // Serialise initdb/start between processes sharing a data directory;
        // released when `lock_file` drops at the end of this function.
        let lock_path = data_dir.join("lock");
        let lock_file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .map_err(|e| io_err(format!("opening {}", lock_path.display()), e))?;
        lock_file
            .lock()
            .map_err(|e| io_err(format!("locking {}", lock_path.display()), e))?;

        let as_root = running_as_root();
        if as_root {
            // initdb and pg_ctl refuse to run as root, so they run as `postgres`,
            // which must own the directory and be able to reach it.
            run_checked(Command::new("id").args(["-u", "postgres"]))?;
            ensure_traversable(&data_dir)?;
            run_checked(
                Command::new("chown")
                    .args(["-R", "postgres:postgres"])
                    .arg(&data_dir),
            )?;
        }

        let socket_dir = socket_dir_for(&data_dir, as_root)?;
        let mut cluster = PrivateCluster {
            bin_dir,
            data_dir,
            pgdata,
            port: 0,
            socket_dir: Some(socket_dir),
            as_root,
            owned: false,
            stopped: false,
        };

        if !cluster.pgdata.join("PG_VERSION").is_file() {
            cluster.initdb(options.fsync)?;
        }

        if cluster.is_running() {
            let pid_file = cluster.pgdata.join("postmaster.pid");
            cluster.port = read_postmaster_port(&pid_file)?;
            cluster.socket_dir = read_postmaster_socket_dir(&pid_file);
            if cluster.socket_dir.is_none() {
                warn!(
                    data_dir = %cluster.data_dir.display(),
                    "the running cluster was started by an older pgvs3 and listens on 127.0.0.1, \
                     where any local user can reach it; stop it so the next start serves it on \
                     an owner-only Unix socket"
                );
            }
            match cluster.wait_ready(&log)? {
                Readiness::Ready => {
                    cluster.write_database_url()?;
                    info!(
                        data_dir = %cluster.data_dir.display(),
                        port = cluster.port,
                        "reusing PostgreSQL cluster already running (it will not be stopped by pgvs3)"
                    );
                    return Ok(cluster);
                }
                // It was shutting down (or a just-killed postmaster not yet reaped): start our own.
                Readiness::Gone => {
                    cluster.socket_dir = Some(socket_dir_for(&cluster.data_dir, as_root)?);
                    warn!(data_dir = %cluster.data_dir.display(), "running cluster went away; starting it again");
                }
            }
        }

        cluster.start_server(options.fsync, &log)?;
        cluster.owned = true;
        info!(
            data_dir = %cluster.data_dir.display(),
            port = cluster.port,
            "started private PostgreSQL cluster"
        );
        let ready = cluster.wait_ready(&log);
        if !matches!(ready, Ok(Readiness::Ready)) {
            // Don't leave a half-working server of ours behind.
            let _ = cluster.stop();
            return Err(ready.err().unwrap_or_else(|| ClusterError::StartFailed {
                pgdata: cluster.pgdata.clone(),
                detail: "the server exited right after starting".to_owned(),
                log: log.clone(),
                log_tail: tail_lines(&log, LOG_TAIL_LINES),
            }));
        }
        cluster.write_database_url()?;
        Ok(cluster)
    }

    /// URL of `database` on this cluster, e.g.
    /// `postgres://postgres@localhost:PORT/database?host=/path/to/data-dir` (libpq and sqlx
    /// read the `host` parameter as the socket's directory).
    pub fn database_url(&self, database: &str) -> String {
        match &self.socket_dir {
            Some(dir) => format!(
                "postgres://postgres@localhost:{}/{}?host={}",
                self.port,
                database,
                url_encode(&dir.to_string_lossy())
            ),
            None => format!("postgres://postgres@127.0.0.1:{}/{}", self.port, database),
        }
    }

    /// The port number, which names the socket file (`.s.PGSQL.<port>`).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The directory holding the server's Unix socket (`None`: a legacy cluster on 127.0.0.1).
    pub fn socket_dir(&self) -> Option<&Path> {
        self.socket_dir.as_deref()
    }

    /// Writes the URL of the `postgres` database to `<data-dir>/database_url` for tools and guides.
    fn write_database_url(&self) -> Result<(), ClusterError> {
        let path = self.data_dir.join("database_url");
        fs::write(&path, format!("{}\n", self.database_url("postgres")))
            .map_err(|e| io_err(format!("writing {}", path.display()), e))
    }

    /// Writes the listening settings and makes sure postgresql.conf includes them last, so
    /// clusters made by older versions (listening on 127.0.0.1) move to the socket too.
    fn write_settings(&self) -> Result<(), ClusterError> {
        let Some(dir) = &self.socket_dir else {
            return Ok(());
        };
        let quoted = dir.to_string_lossy().replace('\'', "''");
        let settings = format!(
            "# Written by pgvs3 at every start: no TCP, one Unix socket only its owner may open.\n\
             listen_addresses = ''\n\
             unix_socket_directories = '{quoted}'\n\
             unix_socket_permissions = 0700\n"
        );
        let path = self.pgdata.join(SETTINGS_FILE);
        fs::write(&path, settings).map_err(|e| io_err(format!("writing {}", path.display()), e))?;
        let conf_path = self.pgdata.join("postgresql.conf");
        let conf = fs::read_to_string(&conf_path)
            .map_err(|e| io_err(format!("reading {}", conf_path.display()), e))?;
        let include = format!("include_if_exists = '{SETTINGS_FILE}'");
        if conf.lines().last().map(str::trim) != Some(include.as_str()) {
            let mut file = OpenOptions::new()
                .append(true)
                .open(&conf_path)
                .map_err(|e| io_err(format!("opening {}", conf_path.display()), e))?;
            file.write_all(format!("\n{include}\n").as_bytes())
                .map_err(|e| io_err(format!("writing {}", conf_path.display()), e))?;
        }
        Ok(())
    }

    /// Stops the cluster (pg_ctl stop -m fast), waiting for it; idempotent.
    pub fn stop(&mut self) -> Result<(), ClusterError> {
        if !self.owned || self.stopped {
            return Ok(());
        }
        let result = run_checked(
            self.pg_command("pg_ctl")
                .arg("-D")
                .arg(&self.pgdata)
                .args(["-m", "fast", "-w", "stop"]),
        );
        match result {
            Ok(_) => {
                self.stopped = true;
                info!(data_dir = %self.data_dir.display(), "stopped private PostgreSQL cluster");
                Ok(())
            }
            // Already gone (e.g. stopped by hand) counts as stopped.
            Err(_) if !self.is_running() => {
                self.stopped = true;
                Ok(())
            }
            Err(e) => Err(e),
        }
    }

    /// Runs initdb into a scratch directory and renames it into place, so a
    /// crash mid-way never leaves a half-configured `pgdata`.
    fn initdb(&self, fsync: bool) -> Result<(), ClusterError> {
        if self.pgdata.exists() {
            return Err(ClusterError::NotACluster {
                path: self.pgdata.clone(),
            });
        }
        let scratch = self.data_dir.join("pgdata.init");
        if scratch.exists() {
            fs::remove_dir_all(&scratch)
                .map_err(|e| io_err(format!("removing leftover {}", scratch.display()), e))?;
        }
        info!(pgdata = %self.pgdata.display(), "initialising private PostgreSQL cluster");
        let mut initdb = self.pg_command("initdb");
        initdb.arg("-D").arg(&scratch).args([
            "-U",
            "postgres",
            "--auth=trust",
            "-E",
            "UTF8",
            "--no-locale",
        ]);
        if !fsync {
            // Skip initdb's final fsync of the new files; the data is throwaway.
            initdb.arg("--no-sync");
        }
        run_checked(&mut initdb)?;

        let conf_path = scratch.join("postgresql.conf");
        let mut conf = OpenOptions::new()
            .append(true)
            .open(&conf_path)
            .map_err(|e| io_err(format!("opening {}", conf_path.display()), e))?;
        let mut settings = String::from(
            "\n# Added by pgvs3 for its private cluster (listening: see pgvs3.conf).\n\
             max_connections = 200\n\
             shared_buffers = 128MB\n",
        );
        if !fsync {
            settings.push_str("fsync = off\nsynchronous_commit = off\nfull_page_writes = off\n");
        }
        conf.write_all(settings.as_bytes())
            .and_then(|()| conf.sync_all())
            .map_err(|e| io_err(format!("writing {}", conf_path.display()), e))?;
        drop(conf);

        fs::rename(&scratch, &self.pgdata).map_err(|e| {
            io_err(
                format!(
                    "renaming {} to {}",
                    scratch.display(),
                    self.pgdata.display()
                ),
                e,
            )
        })
    }

    /// Whether a postmaster is running for `pgdata` (per `pg_ctl status`).
    fn is_running(&self) -> bool {
        self.pg_command("pg_ctl")
            .arg("status")
            .arg("-D")
            .arg(&self.pgdata)
            .stdin(Stdio::null())
            .output()
            .map(|o| o.status.success())
            .unwrap_or(false)
    }

    /// Starts the postmaster on a free port, retrying if the port is taken
    /// between picking it and the server binding it.
    fn start_server(&mut self, fsync: bool, log: &Path) -> Result<(), ClusterError> {
        let port_file = self.data_dir.join("port");
        self.write_settings()?;
        let mut last_err = None;
        for attempt in 0..START_ATTEMPTS {
            // A previous port is only worth reusing on the first try.
            let port = match read_port_file(&port_file) {
                Some(p) if attempt == 0 && port_is_free(p) => p,
                _ => pick_free_port()?,
            };
            fs::write(&port_file, format!("{port}\n"))
                .map_err(|e| io_err(format!("writing {}", port_file.display()), e))?;

            // Passed on the command line too so `fsync` holds for reused data dirs.
            let onoff = if fsync { "on" } else { "off" };
            let server_opts = format!(
                "-p {port} -c fsync={onoff} -c synchronous_commit={onoff} -c full_page_writes={onoff}"
            );
            let result = run_checked(
                self.pg_command("pg_ctl")
                    .arg("-D")
                    .arg(&self.pgdata)
                    .arg("-l")
                    .arg(log)
                    .arg("-o")
                    .arg(&server_opts)
                    .args(["-w", "-t", "60", "start"]),
            );
            match result {
                Ok(_) => {
                    self.port = port;
                    return Ok(());
                }
                Err(e) => {
                    let log_tail = tail_lines(log, LOG_TAIL_LINES);
                    let port_clash = log_tail.contains("could not bind")
                        || log_tail.contains("Address already in use");
                    let err = ClusterError::StartFailed {
                        pgdata: self.pgdata.clone(),
                        detail: e.to_string(),
                        log: log.to_path_buf(),
                        log_tail,
                    };
                    if !port_clash {
                        return Err(err);
                    }
                    warn!(
                        port,
                        "PostgreSQL could not bind its port; retrying with another"
                    );
                    last_err = Some(err);
                }
            }
        }
        Err(last_err.unwrap_or(ClusterError::StartFailed {
            pgdata: self.pgdata.clone(),
            detail: "no start attempted".to_owned(),
            log: log.to_path_buf(),
            log_tail: String::new(),
        }))
    }

    /// Waits until the server accepts connections on its socket, giving up
    /// early if its postmaster stops running.
    fn wait_ready(&self, log: &Path) -> Result<Readiness, ClusterError> {
        let socket = self
            .socket_dir
            .as_ref()
            .map(|dir| dir.join(format!(".s.PGSQL.{}", self.port)));
        let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, self.port));
        let started = Instant::now();
        let mut next_liveness_check = started + Duration::from_secs(1);
        loop {
            let accepted = match &socket {
                Some(path) => UnixStream::connect(path).is_ok(),
                None => TcpStream::connect_timeout(&addr, Duration::from_secs(1)).is_ok(),
            };
            if accepted {
                return Ok(Readiness::Ready);
            }
            if Instant::now() >= next_liveness_check {
                if !self.is_running() {
                    return Ok(Readiness::Gone);
                }
                next_liveness_check = Instant::now() + Duration::from_secs(1);
            }
            if started.elapsed() >= READY_TIMEOUT {
                return Err(ClusterError::NotReady {
                    address: match &socket {
                        Some(path) => path.display().to_string(),
                        None => addr.to_string(),
                    },
                    waited: READY_TIMEOUT,
                    log: log.to_path_buf(),
                });
            }
            thread::sleep(Duration::from_millis(100));
        }
    }

    /// A command for one of the server binaries, run as `postgres` when we are root.
    fn pg_command(&self, binary: &str) -> Command {
        let path = self.bin_dir.join(binary);
        let mut cmd = if self.as_root {
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--"]).arg(path);
            c
        } else {
            Command::new(path)
        };
        // The caller's cwd (e.g. /root) may be unreadable to `postgres`.
        cmd.current_dir(&self.data_dir);
        cmd
    }
}

impl Drop for PrivateCluster {
    fn drop(&mut self) {
        if let Err(e) = self.stop() {
            warn!(error = %e, "failed to stop private PostgreSQL cluster");
        }
    }
}

/// Finds the directory holding initdb, pg_ctl and postgres.
pub fn find_binaries() -> Result<PathBuf, ClusterError> {
    if let Some(path) = std::env::var_os("PATH") {
        for dir in std::env::split_paths(&path) {
            let pg_ctl = dir.join("pg_ctl");
            if !is_executable(&pg_ctl) {
                continue;
            }
            // pg_ctl finds postgres next to its real path, so prefer that directory.
            if let Some(real_dir) = pg_ctl
                .canonicalize()
                .ok()
                .and_then(|p| p.parent().map(Path::to_path_buf))
                && has_all_binaries(&real_dir)
            {
                return Ok(real_dir);
            }
            if has_all_binaries(&dir) {
                return Ok(dir);
            }
        }
    }

    let names: Vec<String> = fs::read_dir(DEBIAN_PG_ROOT)
        .map(|entries| {
            entries
                .filter_map(Result::ok)
                .filter_map(|e| e.file_name().into_string().ok())
                .collect()
        })
        .unwrap_or_default();
    sort_versions_desc(names)
        .into_iter()
        .map(|v| Path::new(DEBIAN_PG_ROOT).join(v).join("bin"))
        .find(|dir| has_all_binaries(dir))
        .ok_or(ClusterError::BinariesNotFound)
}

/// Keeps the names that are numeric versions ("15", "9.6") and sorts them highest first.
fn sort_versions_desc(names: Vec<String>) -> Vec<String> {
    let mut versions: Vec<(Vec<u64>, String)> = names
        .into_iter()
        .filter_map(|name| {
            let parts: Option<Vec<u64>> = name.split('.').map(|p| p.parse().ok()).collect();
            parts.map(|p| (p, name))
        })
        .collect();
    versions.sort_by(|a, b| b.0.cmp(&a.0));
    versions.into_iter().map(|(_, name)| name).collect()
}

fn has_all_binaries(dir: &Path) -> bool {
    REQUIRED_BINARIES
        .iter()
        .all(|b| is_executable(&dir.join(b)))
}

fn is_executable(path: &Path) -> bool {
    fs::metadata(path)
        .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        .unwrap_or(false)
}

/// Whether this process's effective uid is 0.
fn running_as_root() -> bool {
    if let Ok(status) = fs::read_to_string("/proc/self/status")
        && let Some(line) = status.lines().find(|l| l.starts_with("Uid:"))
    {
        // "Uid:\treal\teffective\tsaved\tfs"
        return line.split_whitespace().nth(2) == Some("0");
    }
    Command::new("id")
        .arg("-u")
        .output()
        .map(|o| o.status.success() && String::from_utf8_lossy(&o.stdout).trim() == "0")
        .unwrap_or(false)
}

/// Makes sure the `postgres` user can traverse every ancestor of `dir`,
/// fixing only directories we may reasonably touch (under cwd or /tmp).
fn ensure_traversable(dir: &Path) -> Result<(), ClusterError> {
    let cwd = std::env::current_dir()
        .ok()
        .and_then(|d| d.canonicalize().ok());
    for ancestor in dir.ancestors().skip(1) {
        let meta = fs::metadata(ancestor)
            .map_err(|e| io_err(format!("inspecting {}", ancestor.display()), e))?;
        let mode = meta.permissions().mode();
        if mode & 0o001 != 0 {
            continue;
        }
        let ours =
            ancestor.starts_with("/tmp") || cwd.as_deref().is_some_and(|c| ancestor.starts_with(c));
        if !ours {
            return Err(ClusterError::NotTraversable {
                path: ancestor.to_path_buf(),
            });
        }
        warn!(path = %ancestor.display(), "adding o+x so the postgres user can reach the cluster");
        fs::set_permissions(ancestor, fs::Permissions::from_mode(mode | 0o001))
            .map_err(|e| io_err(format!("chmod o+x {}", ancestor.display()), e))?;
    }
    Ok(())
}

/// The port in a `postmaster.pid` file (its fourth line).
fn read_postmaster_port(path: &Path) -> Result<u16, ClusterError> {
    let text =
        fs::read_to_string(path).map_err(|e| io_err(format!("reading {}", path.display()), e))?;
    let line = text.lines().nth(3).unwrap_or("").trim();
    line.parse().map_err(|_| ClusterError::BadPidFile {
        path: path.to_path_buf(),
        detail: format!("line 4 is {line:?}, not a port number"),
    })
}

/// The first socket directory in a `postmaster.pid` file (its fifth line), if it has one.
fn read_postmaster_socket_dir(path: &Path) -> Option<PathBuf> {
    let text = fs::read_to_string(path).ok()?;
    let line = text.lines().nth(4)?.trim();
    (!line.is_empty()).then(|| PathBuf::from(line))
}

/// The socket's directory: the data directory, or (when that path is too long for a socket
/// address) a directory under the temp dir named after it, made owner-only.
fn socket_dir_for(data_dir: &Path, as_root: bool) -> Result<PathBuf, ClusterError> {
    let longest_socket = data_dir.join(".s.PGSQL.65535");
    if longest_socket.as_os_str().len() <= MAX_SOCKET_PATH {
        return Ok(data_dir.to_path_buf());
    }
    let mut hasher = DefaultHasher::new();
    data_dir.hash(&mut hasher);
    let dir = std::env::temp_dir().join(format!("pgvs3-socket-{:016x}", hasher.finish()));
    match fs::DirBuilder::new().mode(0o700).create(&dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(io_err(format!("creating {}", dir.display()), e)),
    }
    fs::set_permissions(&dir, fs::Permissions::from_mode(0o700))
        .map_err(|e| io_err(format!("chmod 700 {}", dir.display()), e))?;
    if as_root {
        run_checked(Command::new("chown").arg("postgres:postgres").arg(&dir))?;
    }
    Ok(dir)
}

/// Percent-encodes a URL query value (paths keep their slashes).
fn url_encode(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for byte in value.bytes() {
        if byte.is_ascii_alphanumeric() || b"/-._~".contains(&byte) {
            out.push(char::from(byte));
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

fn read_port_file(path: &Path) -> Option<u16> {
    fs::read_to_string(path).ok()?.trim().parse().ok()
}

fn port_is_free(port: u16) -> bool {
    port != 0 && TcpListener::bind((Ipv4Addr::LOCALHOST, port)).is_ok()
}

/// A port the OS considers free right now (it may be taken before we use it).
fn pick_free_port() -> Result<u16, ClusterError> {
    TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| io_err("finding a free port on 127.0.0.1".to_owned(), e))
}

/// The last `n` lines of a text file, or a note saying why there are none.
fn tail_lines(path: &Path, n: usize) -> String {
    match fs::read(path) {
        Ok(bytes) => {
            let text = String::from_utf8_lossy(&bytes);
            let lines: Vec<&str> = text.lines().collect();
            lines[lines.len().saturating_sub(n)..].join("\n")
        }
        Err(e) => format!("(cannot read log: {e})"),
    }
}

/// Runs a command with captured output; non-zero exit becomes an error with its stderr.
fn run_checked(cmd: &mut Command) -> Result<Output, ClusterError> {
    let command = describe(cmd);
    let output = cmd
        .stdin(Stdio::null())
        .output()
        .map_err(|e| ClusterError::Command {
            command: command.clone(),
            detail: format!("could not run it: {e}"),
        })?;
    if output.status.success() {
        return Ok(output);
    }
    let stderr = String::from_utf8_lossy(&output.stderr);
    let stdout = String::from_utf8_lossy(&output.stdout);
    let text = if stderr.trim().is_empty() {
        stdout
    } else {
        stderr
    };
    Err(ClusterError::Command {
        command,
        detail: format!("{}: {}", output.status, text.trim()),
    })
}

fn describe(cmd: &Command) -> String {
    std::iter::once(cmd.get_program())
        .chain(cmd.get_args())
        .map(|a| a.to_string_lossy().into_owned())
        .collect::<Vec<_>>()
        .join(" ")
}

fn io_err(context: String, source: std::io::Error) -> ClusterError {
    ClusterError::Io { context, source }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_sort_numerically_highest_first() {
        let names = ["9.6", "15", "10", "16beta", "common", "13", "9.10"]
            .map(String::from)
            .to_vec();
        assert_eq!(sort_versions_desc(names), ["15", "13", "10", "9.10", "9.6"]);
    }

    #[test]
    fn binaries_not_found_explains_the_fix() {
        let msg = ClusterError::BinariesNotFound.to_string();
        for needle in [
            "initdb",
            "pg_ctl",
            "postgres",
            "PATH",
            "/usr/lib/postgresql/<version>/bin",
            "apt-get install postgresql",
            "DATABASE_URL",
        ] {
            assert!(msg.contains(needle), "message lacks {needle:?}: {msg}");
        }
        assert!(
            !msg.contains('\n'),
            "message should be one paragraph: {msg}"
        );
    }

    #[test]
    fn postmaster_pid_port_is_line_four() {
        let dir = std::env::temp_dir().join(format!("pgvs3-cluster-test-{}", std::process::id()));
        fs::create_dir_all(&dir).expect("create temp dir");
        let pid = dir.join("postmaster.pid");
        fs::write(&pid, "1234\n/data/pgdata\n1700000000\n54321\n\n127.0.0.1\n").expect("write");
        assert_eq!(read_postmaster_port(&pid).expect("port"), 54321);
        fs::write(&pid, "1234\n").expect("write");
        assert!(matches!(
            read_postmaster_port(&pid),
            Err(ClusterError::BadPidFile { .. })
        ));
        let _ = fs::remove_dir_all(&dir);
    }

    #[test]
    fn database_url_names_socket_port_and_database() {
        let mut cluster = PrivateCluster {
            bin_dir: PathBuf::new(),
            data_dir: PathBuf::new(),
            pgdata: PathBuf::new(),
            port: 5999,
            socket_dir: Some(PathBuf::from("/srv/pg data")),
            as_root: false,
            owned: false,
            stopped: false,
        };
        assert_eq!(
            cluster.database_url("jobs"),
            "postgres://postgres@localhost:5999/jobs?host=/srv/pg%20data"
        );
        cluster.socket_dir = None;
        assert_eq!(
            cluster.database_url("jobs"),
            "postgres://postgres@127.0.0.1:5999/jobs"
        );
    }

    #[test]
    fn a_long_data_dir_gets_a_short_private_socket_dir() {
        let short = Path::new("/tmp/pgvs3-short");
        assert_eq!(socket_dir_for(short, false).expect("short"), short);
        let long = std::env::temp_dir().join("d".repeat(120));
        let dir = socket_dir_for(&long, false).expect("long");
        assert!(dir.join(".s.PGSQL.65535").as_os_str().len() <= MAX_SOCKET_PATH);
        let mode = fs::metadata(&dir).expect("made").permissions().mode();
        assert_eq!(mode & 0o777, 0o700);
        let _ = fs::remove_dir(&dir);
    }
}
