//! Following the primary across a PostgreSQL failover. A database URL may name several hosts
//! (`postgres://user@a:5432,b:5432/db`, as libpq writes them): the pool connects to the one that
//! fits the gateway (writable for a read-write gateway, a standby preferred for a read-only
//! one), and a watcher checks that host twice a second and points the pool at another when the
//! HA manager promotes it. Promotion itself is the HA manager's (pg_auto_failover, Patroni): this
//! module only finds where the primary is now.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sqlx::Connection;
use sqlx::postgres::{PgConnectOptions, PgConnection, PgPool, PgPoolOptions};
use tokio::sync::Notify;
use tokio::task::JoinHandle;

/// How often the watcher checks the host the pool uses.
const CHECK_EVERY: Duration = Duration::from_millis(500);
/// How long one check (connect and query) may take before the host counts as unreachable.
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);
/// How long a starting gateway looks for a host that fits before giving up.
const START_WAIT: Duration = Duration::from_secs(30);

/// What the gateway needs of its host (libpq's `target_session_attrs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Want {
    /// A writable primary: not in recovery and not `transaction_read_only` (`read-write`).
    ReadWrite,
    /// A standby when one is up, else any reachable server (`prefer-standby`).
    PreferStandby,
}

/// The hosts of a database URL, each as a one-host connection.
#[derive(Debug, Clone)]
pub struct Hosts {
    /// `host:port` and the options reaching it (no session settings of ours).
    targets: Vec<(String, PgConnectOptions)>,
    /// Whether the URL named `target_session_attrs`.
    attrs_given: bool,
}

/// The values libpq accepts for `target_session_attrs`.
const TARGET_SESSION_ATTRS: [&str; 6] = [
    "any",
    "read-write",
    "read-only",
    "primary",
    "standby",
    "prefer-standby",
];

impl Hosts {
    /// Splits `scheme://[user[:password]@]host[:port][,host[:port]...][/db][?params]` into one
    /// URL per host; `target_session_attrs` is dropped from the parameters (the gateway's role
    /// decides what it wants).
    pub fn parse(url: &str) -> Result<Hosts, String> {
        let (scheme, rest) = url
            .split_once("://")
            .ok_or_else(|| "DATABASE_URL is not a valid URL: no scheme".to_string())?;
        let end = rest.find(['/', '?']).unwrap_or(rest.len());
        let (authority, tail) = rest.split_at(end);
        let (userinfo, host_list) = match authority.rsplit_once('@') {
            Some((user, hosts)) => (format!("{user}@"), hosts),
            None => (String::new(), authority),
        };
        let (path, query) = match tail.split_once('?') {
            Some((path, query)) => (path, Some(query)),
            None => (tail, None),
        };
        let mut attrs_given = false;
        let mut kept: Vec<&str> = Vec::new();
        for pair in query.into_iter().flat_map(|q| q.split('&')) {
            match pair.strip_prefix("target_session_attrs=") {
                // libpq's values; the gateway's role decides which server it wants, but a
                // misspelled value is refused as libpq refuses it.
                Some(value) if TARGET_SESSION_ATTRS.contains(&value) => attrs_given = true,
                Some(value) => {
                    return Err(format!(
                        "DATABASE_URL: target_session_attrs={value:?} is not one of {}",
                        TARGET_SESSION_ATTRS.join(", ")
                    ));
                }
                None if !pair.is_empty() => kept.push(pair),
                None => {}
            }
        }
        let query = if kept.is_empty() {
            String::new()
        } else {
            format!("?{}", kept.join("&"))
        };
        let mut targets = Vec::new();
        for host in host_list.split(',') {
            let one = format!("{scheme}://{userinfo}{host}{path}{query}");
            let options = one
                .parse::<PgConnectOptions>()
                .map_err(|e| format!("DATABASE_URL is not a valid URL ({host}): {e}"))?;
            let name = format!("{}:{}", options.get_host(), options.get_port());
            targets.push((name, options));
        }
        Ok(Hosts {
            targets,
            attrs_given,
        })
    }

    /// Whether the URL asks for host selection: several hosts, or `target_session_attrs`.
    pub fn selects(&self) -> bool {
        self.targets.len() > 1 || self.attrs_given
    }

    /// The single host's options (the first one).
    pub fn first(&self) -> Option<&PgConnectOptions> {
        self.targets.first().map(|(_, options)| options)
    }
}

/// What a check found a server to be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
    /// Accepts writes.
    Writable,
    /// In recovery, or refusing writes (a standby, or a promoted node the HA manager keeps
    /// read-only until the old primary is known to be down).
    ReadOnly { in_recovery: bool },
}

impl Role {
    fn fits(self, want: Want) -> bool {
        match want {
            Want::ReadWrite => self == Role::Writable,
            Want::PreferStandby => matches!(self, Role::ReadOnly { in_recovery: true }),
        }
    }
}

/// The role of the server behind `conn`.
async fn role_of(conn: &mut PgConnection) -> Result<Role, sqlx::Error> {
    let (in_recovery, read_only): (bool, String) =
        sqlx::query_as("SELECT pg_is_in_recovery(), current_setting('transaction_read_only')")
            .fetch_one(&mut *conn)
            .await?;
    Ok(if !in_recovery && read_only == "off" {
        Role::Writable
    } else {
        Role::ReadOnly { in_recovery }
    })
}

/// A fresh connection's check of `options`' server; `None` when it cannot be reached in time.
async fn probe(options: &PgConnectOptions) -> Option<(PgConnection, Role)> {
    tokio::time::timeout(PROBE_TIMEOUT, async {
        let mut conn = PgConnection::connect_with(options).await.ok()?;
        let role = role_of(&mut conn).await.ok()?;
        Some((conn, role))
    })
    .await
    .ok()
    .flatten()
}

/// Where the pool points now.
struct Current {
    /// Index into the hosts.
    host: usize,
    /// Whether that host fits (false while no host does: mutations then answer 503).
    fits: bool,
    /// When the pool last moved: connections older than this belong to the old host.
    moved_at: Instant,
}

/// The pool's host, its watcher and the signal that wakes the watcher early.
pub struct Follower {
    hosts: Hosts,
    /// Each host's options with the gateway's session settings, for the pool.
    pool_options: Vec<PgConnectOptions>,
    want: Want,
    current: Mutex<Current>,
    wake: Notify,
    watcher: Mutex<Option<JoinHandle<()>>>,
}

impl Follower {
    /// A follower over `hosts`; `session` adds the gateway's settings to each host's options.
    pub fn new(
        hosts: Hosts,
        want: Want,
        session: impl Fn(PgConnectOptions) -> PgConnectOptions,
    ) -> Arc<Follower> {
        let pool_options = hosts
            .targets
            .iter()
            .map(|(_, options)| session(options.clone()))
            .collect();
        Arc::new(Follower {
            hosts,
            pool_options,
            want,
            current: Mutex::new(Current {
                host: 0,
                fits: false,
                moved_at: Instant::now(),
            }),
            wake: Notify::new(),
            watcher: Mutex::new(None),
        })
    }

    fn current(&self) -> std::sync::MutexGuard<'_, Current> {
        self.current.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether a connection `age` old was opened before the pool last moved, so reaches the old
    /// host.
    pub fn predates_move(&self, age: Duration) -> bool {
        age > self.current().moved_at.elapsed()
    }

    /// The host the pool uses, as `host:port`.
    pub fn host(&self) -> String {
        let host = self.current().host;
        self.hosts.targets[host].0.clone()
    }

    /// Whether the pool's host fits the gateway (else no primary is reachable just now).
    pub fn fits(&self) -> bool {
        self.current().fits
    }

    /// What the gateway waits for, in words, for errors and health.
    pub fn wanted(&self) -> &'static str {
        match self.want {
            Want::ReadWrite => "a writable primary",
            Want::PreferStandby => "a reachable server",
        }
    }

    /// The host to use now: for a primary the first writable one; for a read-only gateway the
    /// first standby, else the first reachable server. `None`: nothing fits.
    async fn locate(&self) -> Option<usize> {
        let mut reachable = None;
        for (index, (_, options)) in self.hosts.targets.iter().enumerate() {
            if let Some((conn, role)) = probe(options).await {
                let _ = conn.close().await;
                if role.fits(self.want) {
                    return Some(index);
                }
                reachable.get_or_insert(index);
            }
        }
        match self.want {
            Want::ReadWrite => None,
            Want::PreferStandby => reachable,
        }
    }

    /// Waits (up to 30 s) for a host that fits, for a starting gateway.
    async fn locate_at_start(&self) -> Result<usize, String> {
        let deadline = Instant::now() + START_WAIT;
        loop {
            if let Some(host) = self.locate().await {
                let mut current = self.current();
                current.host = host;
                current.fits = true;
                return Ok(host);
            }
            if Instant::now() >= deadline {
                let names: Vec<&str> = self.hosts.targets.iter().map(|(n, _)| n.as_str()).collect();
                return Err(format!(
                    "none of the database hosts {} is {} after {} s",
                    names.join(", "),
                    self.wanted(),
                    START_WAIT.as_secs()
                ));
            }
            tokio::time::sleep(CHECK_EVERY).await;
        }
    }

    /// Connects the pool to the host that fits and starts the watcher that moves it.
    pub async fn connect(self: &Arc<Follower>, pool: PgPoolOptions) -> Result<PgPool, sqlx::Error> {
        let host = self
            .locate_at_start()
            .await
            .map_err(|e| sqlx::Error::Io(std::io::Error::other(e)))?;
        let stale = self.clone();
        let checked = self.clone();
        let pool = pool
            // A connection opened before the last move reaches the old host: close it.
            // It replaces the pool's liveness check, so it runs that one too.
            .before_acquire(move |conn, meta| {
                let old = stale.predates_move(meta.age);
                Box::pin(async move { Ok(!old && super::liveness::check(conn, meta).await?) })
            })
            // A read-write gateway never writes to a server that refuses writes: a connection
            // that lands on one is refused (the pool tries again) and the watcher looks around.
            .after_connect(move |conn, _| {
                let follower = checked.clone();
                Box::pin(async move {
                    if follower.want == Want::PreferStandby {
                        return Ok(());
                    }
                    if role_of(conn).await? == Role::Writable {
                        return Ok(());
                    }
                    follower.wake.notify_one();
                    Err(sqlx::Error::Io(std::io::Error::other(
                        "the database host refuses writes (a failover is under way)",
                    )))
                })
            })
            .connect_with(self.pool_options[host].clone())
            .await?;
        let watcher = tokio::spawn(self.clone().watch(pool.clone()));
        *self.watcher.lock().unwrap_or_else(|e| e.into_inner()) = Some(watcher);
        Ok(pool)
    }

    /// Stops the watcher.
    pub fn stop(&self) {
        if let Some(watcher) = self
            .watcher
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
        {
            watcher.abort();
        }
    }

    /// Checks the pool's host every `CHECK_EVERY` (at once when a connection found it unfit)
    /// and moves the pool when another host fits better.
    async fn watch(self: Arc<Follower>, pool: PgPool) {
        // One connection kept open for the checks of the current host.
        let mut held: Option<(usize, PgConnection)> = None;
        while !pool.is_closed() {
            tokio::select! {
                _ = tokio::time::sleep(CHECK_EVERY) => {}
                _ = self.wake.notified() => {}
            }
            let host = self.current().host;
            let role = match held.take() {
                Some((at, mut conn)) if at == host => {
                    match tokio::time::timeout(PROBE_TIMEOUT, role_of(&mut conn)).await {
                        Ok(Ok(role)) => {
                            held = Some((at, conn));
                            Some(role)
                        }
                        _ => None,
                    }
                }
                _ => match probe(&self.hosts.targets[host].1).await {
                    Some((conn, role)) => {
                        held = Some((host, conn));
                        Some(role)
                    }
                    None => None,
                },
            };
            match (self.want, role) {
                (_, Some(role)) if role.fits(self.want) => self.mark(host, true),
                // A read-only gateway on a primary stays unless a standby is up, and says it fits
                // (it may have been marked unfit while its host was down).
                (Want::PreferStandby, Some(_)) => match self.locate().await {
                    Some(other) if other != host => self.move_to(&pool, other),
                    _ => self.mark(host, true),
                },
                _ => match self.locate().await {
                    Some(other) if other != host => self.move_to(&pool, other),
                    Some(_) => self.mark(host, true),
                    None => self.mark(host, false),
                },
            }
        }
    }

    /// Records whether the current host fits, logging a change.
    fn mark(&self, host: usize, fits: bool) {
        let mut current = self.current();
        if current.fits != fits {
            let name = &self.hosts.targets[host].0;
            if fits {
                tracing::warn!(host = %name, "the database host is back");
            } else {
                tracing::warn!(host = %name, wanted = self.wanted(), "no database host fits: waiting for the HA manager");
            }
        }
        current.host = host;
        current.fits = fits;
    }

    /// Points the pool at `host`: new connections go there, older ones are closed on their
    /// next acquire (the LISTEN connections reconnect through the pool and follow).
    fn move_to(&self, pool: &PgPool, host: usize) {
        pool.set_connect_options(self.pool_options[host].clone());
        let mut current = self.current();
        let from = &self.hosts.targets[current.host].0;
        tracing::warn!(from = %from, to = %self.hosts.targets[host].0, "following the database to another host");
        current.host = host;
        current.fits = true;
        current.moved_at = Instant::now();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_host_list_becomes_one_url_per_host() {
        let hosts = Hosts::parse(
            "postgres://app:secret@10.0.0.1:5433,db2,[::1]:6000/jobs?sslmode=disable&target_session_attrs=read-write",
        )
        .expect("parses");
        assert!(hosts.selects());
        let names: Vec<&str> = hosts.targets.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["10.0.0.1:5433", "db2:5432", "[::1]:6000"]);
        for (_, options) in &hosts.targets {
            assert_eq!(options.get_username(), "app");
            assert_eq!(options.get_database(), Some("jobs"));
        }
    }

    #[test]
    fn an_unknown_target_session_attrs_is_refused() {
        let refused = Hosts::parse("postgres://u@a,b/db?target_session_attrs=bogus")
            .err()
            .unwrap_or_default();
        assert!(refused.contains("bogus"), "{refused}");
        assert!(Hosts::parse("postgres://u@a,b/db?target_session_attrs=prefer-standby").is_ok());
    }

    #[test]
    fn one_host_without_attributes_selects_nothing() {
        let hosts = Hosts::parse("postgres://u@localhost:5432/db").expect("parses");
        assert!(!hosts.selects());
        assert!(
            Hosts::parse("postgres://u@localhost/db?target_session_attrs=any")
                .expect("parses")
                .selects()
        );
        assert!(Hosts::parse("not a url").is_err());
        assert!(Hosts::parse("postgres://u@a:notaport,b/db").is_err());
    }
}
