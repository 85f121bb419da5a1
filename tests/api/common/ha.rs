//! A PostgreSQL HA setup for the failover tests: pg_auto_failover's monitor and two data nodes on
//! this machine (ports picked free, data under the target's tmp directory), with the monitor's
//! failure detection shortened from tens of seconds to about one. Each `pg_autoctl` runs in a
//! process group of its own; "the machine dies" stops, then kills, that group, the postmaster and
//! the postmaster's children (each in a session of its own). Everything is killed and removed on
//! drop, pass or fail.

use std::net::{Ipv4Addr, TcpListener};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use sqlx::{Connection, PgConnection};
use tokio::time::Instant;

/// How the standby confirms commits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Replication {
    /// The primary waits for the standby (pg_auto_failover's default with one standby).
    Synchronous,
    /// The standby is out of the write quorum (`replication-quorum false`): commits do not wait.
    Asynchronous,
}

/// Why there is no HA setup here.
pub fn missing() -> Option<String> {
    if !Path::new("/usr/bin/pg_autoctl").exists() && which("pg_autoctl").is_none() {
        return Some(
            "pg_autoctl is not installed (apt-get install postgresql-15-auto-failover \
             pg-auto-failover-cli)"
                .to_string(),
        );
    }
    if bin_dir().is_none() {
        return Some(
            "no PostgreSQL version has the pgautofailover extension \
             (apt-get install postgresql-15-auto-failover)"
                .to_string(),
        );
    }
    None
}

fn which(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")?
        .to_str()?
        .split(':')
        .map(|dir| Path::new(dir).join(name))
        .find(|path| path.exists())
}

/// The server binaries of the newest PostgreSQL that has the pgautofailover extension.
fn bin_dir() -> Option<PathBuf> {
    let mut versions: Vec<u32> = std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse().ok())
        .collect();
    versions.sort_unstable_by(|a, b| b.cmp(a));
    versions.into_iter().find_map(|version| {
        let root = PathBuf::from(format!("/usr/lib/postgresql/{version}"));
        let has_extension = root.join("lib/pgautofailover.so").exists();
        let bin = root.join("bin");
        (has_extension && bin.join("pg_ctl").exists()).then_some(bin)
    })
}

fn free_port() -> u16 {
    TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// One data node: its port, directory and the `pg_autoctl` process group running it.
pub struct Node {
    /// PostgreSQL's port.
    pub port: u16,
    /// The node's name at the monitor.
    pub name: String,
    pgdata: PathBuf,
    keeper: Option<Child>,
}

/// The monitor and the data nodes.
pub struct HaCluster {
    dir: PathBuf,
    bin: PathBuf,
    as_root: bool,
    monitor_port: u16,
    monitor: Option<Child>,
    /// The data nodes, the first one the initial primary.
    pub nodes: Vec<Node>,
}

/// The database every node serves to pgvs3.
pub const DATABASE: &str = "pgvs3";

impl HaCluster {
    /// Starts the monitor, then node 1 (primary), then node 2 (standby), and waits until the
    /// monitor reports them primary and secondary with `replication` in force.
    pub async fn start(replication: Replication) -> HaCluster {
        // SAFETY: geteuid has no preconditions.
        let as_root = unsafe { libc::geteuid() } == 0;
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!(
            "ha-{}-{}",
            std::process::id(),
            uuid::Uuid::now_v7().simple()
        ));
        std::fs::create_dir_all(&dir).expect("HA directory");
        let mut cluster = HaCluster {
            dir: dir.clone(),
            bin: bin_dir().expect("PostgreSQL binaries with pgautofailover"),
            as_root,
            monitor_port: free_port(),
            monitor: None,
            nodes: Vec::new(),
        };
        if as_root {
            traversable(&dir);
            cluster.run(
                Command::new("chown")
                    .args(["-R", "postgres:postgres"])
                    .arg(&dir),
            );
        }

        // The monitor, its failure detection shortened (defaults: a node is unhealthy after 20 s,
        // a primary that does not answer is given 30 s to demote itself).
        let monitor_data = dir.join("monitor");
        let create = cluster
            .autoctl()
            .args(["create", "monitor", "--pgdata"])
            .arg(&monitor_data)
            .args(["--pgport", &cluster.monitor_port.to_string()])
            .args(["--hostname", "127.0.0.1", "--auth", "trust", "--no-ssl"])
            .output()
            .expect("run pg_autoctl create monitor");
        assert!(
            create.status.success(),
            "pg_autoctl create monitor: {}",
            String::from_utf8_lossy(&create.stderr)
        );
        cluster.monitor = Some(
            cluster.spawn_logged(
                cluster
                    .autoctl()
                    .args(["run", "--pgdata"])
                    .arg(&monitor_data),
                "monitor.log",
            ),
        );
        let monitor_url = format!(
            "postgres://autoctl_node@127.0.0.1:{}/pg_auto_failover?sslmode=disable",
            cluster.monitor_port
        );
        // Our own session as the superuser: ALTER SYSTEM and reading the node table.
        let admin_url = format!(
            "postgres://postgres@127.0.0.1:{}/pg_auto_failover?sslmode=disable",
            cluster.monitor_port
        );
        let mut monitor = connect_within(&admin_url, Duration::from_secs(60)).await;
        for (setting, value) in [
            ("health_check_period", "500"),
            ("health_check_timeout", "1000"),
            ("health_check_max_retries", "1"),
            ("health_check_retry_delay", "500"),
            ("node_considered_unhealthy_timeout", "2000"),
            ("primary_demote_timeout", "2000"),
            ("startup_grace_period", "2000"),
        ] {
            sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
                "ALTER SYSTEM SET pgautofailover.{setting} = {value}"
            )))
            .execute(&mut monitor)
            .await
            .expect("shorten the monitor's timeouts");
        }
        sqlx::query("SELECT pg_reload_conf()")
            .execute(&mut monitor)
            .await
            .expect("reload the monitor");

        for number in 1..=2 {
            let port = free_port();
            let name = format!("node{number}");
            let pgdata = dir.join(&name);
            let keeper = cluster.spawn_logged(
                cluster
                    .autoctl()
                    .args(["create", "postgres", "--pgdata"])
                    .arg(&pgdata)
                    .arg("--pgctl")
                    .arg(cluster.bin.join("pg_ctl"))
                    .args(["--pgport", &port.to_string(), "--hostname", "127.0.0.1"])
                    .args(["--name", &name, "--monitor", &monitor_url])
                    .args(["--auth", "trust", "--no-ssl", "--dbname", DATABASE, "--run"]),
                &format!("{name}.log"),
            );
            cluster.nodes.push(Node {
                port,
                name: name.clone(),
                pgdata,
                keeper: Some(keeper),
            });
            if number == 1 {
                cluster
                    .wait_state(&mut monitor, &[("node1", "single")])
                    .await;
                // pg_basebackup waits for a spread checkpoint (minutes at the defaults): make it
                // quick. The copy of these settings goes to the standby too.
                let mut node = connect_within(&cluster.node_url(0), Duration::from_secs(60)).await;
                // One statement each: ALTER SYSTEM refuses to run in a transaction block.
                for statement in [
                    "ALTER SYSTEM SET checkpoint_completion_target = 0",
                    "ALTER SYSTEM SET fsync = off",
                    "SELECT pg_reload_conf()",
                ] {
                    sqlx::raw_sql(sqlx::AssertSqlSafe(statement))
                        .execute(&mut node)
                        .await
                        .expect("settings of node 1");
                }
            }
        }
        cluster
            .wait_state(
                &mut monitor,
                &[("node1", "primary"), ("node2", "secondary")],
            )
            .await;
        if replication == Replication::Asynchronous {
            let set = cluster
                .autoctl()
                .args(["set", "node", "replication-quorum", "false", "--pgdata"])
                .arg(&cluster.nodes[1].pgdata)
                .output()
                .expect("run pg_autoctl set node");
            assert!(
                set.status.success(),
                "pg_autoctl set node replication-quorum: {}",
                String::from_utf8_lossy(&set.stderr)
            );
        }
        // The primary's synchronous_standby_names says which replication is in force.
        let expect_sync = replication == Replication::Synchronous;
        let url = cluster.node_url(0);
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let names: String = match PgConnection::connect(&url).await {
                Ok(mut conn) => sqlx::query_scalar("SHOW synchronous_standby_names")
                    .fetch_one(&mut conn)
                    .await
                    .unwrap_or_default(),
                Err(_) => String::new(),
            };
            if names.is_empty() != expect_sync {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "synchronous_standby_names is {names:?}, not what {replication:?} sets: {}",
                cluster.logs()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        cluster
    }

    /// A `pg_autoctl` command, as `postgres` when we are root, its files under our directory.
    fn autoctl(&self) -> Command {
        let mut command = if self.as_root {
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--", "pg_autoctl"]);
            c
        } else {
            Command::new("pg_autoctl")
        };
        command
            .env("XDG_CONFIG_HOME", self.dir.join("config"))
            .env("XDG_DATA_HOME", self.dir.join("data"))
            .env("PG_CONFIG", self.bin.join("pg_config"))
            .env(
                "PATH",
                format!(
                    "{}:{}",
                    self.bin.display(),
                    std::env::var("PATH").unwrap_or_default()
                ),
            )
            .current_dir(&self.dir)
            .stdin(Stdio::null());
        command
    }

    fn run(&self, command: &mut Command) {
        let output = command.output().expect("run a command");
        assert!(
            output.status.success(),
            "{command:?}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }

    /// Spawns `command` in a process group of its own, its output in `log`.
    fn spawn_logged(&self, command: &mut Command, log: &str) -> Child {
        let out = std::fs::File::create(self.dir.join(log)).expect("log file");
        let err = out.try_clone().expect("log file");
        command
            .stdout(out)
            .stderr(err)
            .process_group(0)
            .spawn()
            .expect("spawn pg_autoctl")
    }

    /// The URL of one node's database.
    pub fn node_url(&self, node: usize) -> String {
        format!(
            "postgres://postgres@127.0.0.1:{}/{DATABASE}?sslmode=disable",
            self.nodes[node].port
        )
    }

    /// The URL naming every node, as a gateway is given it.
    pub fn url(&self) -> String {
        let hosts: Vec<String> = self
            .nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        format!(
            "postgres://postgres@{}/{DATABASE}?sslmode=disable&target_session_attrs=read-write",
            hosts.join(",")
        )
    }

    /// Waits until the monitor reports each named node in its state (and assigned it).
    async fn wait_state(&self, monitor: &mut PgConnection, wanted: &[(&str, &str)]) {
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            let rows: Vec<(String, String, String)> = sqlx::query_as(
                "SELECT nodename::text, reportedstate::text, goalstate::text
                   FROM pgautofailover.node",
            )
            .fetch_all(&mut *monitor)
            .await
            .unwrap_or_default();
            let reached = wanted.iter().all(|(name, state)| {
                rows.iter()
                    .any(|(n, reported, goal)| n == name && reported == state && goal == state)
            });
            if reached {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "nodes not in {wanted:?} within 120 s: {rows:?}\n{}",
                self.logs()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// The index of the node that is a writable primary now, if any.
    pub async fn writable(&self) -> Option<usize> {
        for index in 0..self.nodes.len() {
            let Ok(Ok(mut conn)) = tokio::time::timeout(
                Duration::from_secs(2),
                PgConnection::connect(&self.node_url(index)),
            )
            .await
            else {
                continue;
            };
            let writable: Option<bool> = sqlx::query_scalar(
                "SELECT NOT pg_is_in_recovery()
                        AND current_setting('transaction_read_only') = 'off'",
            )
            .fetch_one(&mut conn)
            .await
            .ok();
            if writable == Some(true) {
                return Some(index);
            }
        }
        None
    }

    /// The machine of `node` dies: its keeper's process group, its postmaster and every process
    /// the postmaster started are stopped (SIGSTOP, so none acts while the others die), then
    /// killed. The backends are not in the keeper's group (PostgreSQL puts each child in a
    /// session of its own), so killing the group alone leaves them running. It stays dead.
    pub fn kill(&mut self, node: usize) {
        let node = &mut self.nodes[node];
        // Killed already: its pids may belong to others by now.
        let Some(mut keeper) = node.keeper.take() else {
            return;
        };
        kill_machine(
            Some(keeper.id() as libc::pid_t),
            postmaster_pid(&node.pgdata),
        );
        let _ = keeper.wait();
    }

    /// Makes sure a kill of `primary` now loses nothing acknowledged: synchronous replication in
    /// force and the standby holding all WAL written so far. With one standby pg_auto_failover
    /// turns synchronous replication off while the standby looks unhealthy (the primary goes to
    /// `wait_primary`; on a loaded machine a keeper that misses its reports for 2 s is enough)
    /// and back on once it has caught up; the standby is a failover candidate again before the
    /// primary waits for it, so commits answered in between may be missing there. The primary's
    /// keeper is frozen (SIGSTOP) for the check, so it cannot turn synchronous replication off
    /// between the check and the kill; it stays frozen (the kill ends it). Returns how many
    /// checks found synchronous replication off.
    pub async fn hold_synchronous(&self, primary: usize) -> u32 {
        let keeper = self.nodes[primary]
            .keeper
            .as_ref()
            .expect("a running keeper")
            .id() as libc::pid_t;
        let url = self.node_url(primary);
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut off = 0;
        loop {
            assert!(
                Instant::now() < deadline,
                "synchronous replication not in force on {} within 60 s: {}",
                self.nodes[primary].name,
                self.logs()
            );
            signal_keeper(keeper, libc::SIGSTOP);
            if self.all_on_standby(&url).await == Some(true) {
                return off;
            }
            off += 1;
            signal_keeper(keeper, libc::SIGCONT);
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// With the keeper frozen: whether `synchronous_standby_names` is set and a standby has
    /// flushed the WAL written until now (`None`: the primary did not answer).
    async fn all_on_standby(&self, url: &str) -> Option<bool> {
        let mut conn = PgConnection::connect(url).await.ok()?;
        let names: String = sqlx::query_scalar("SHOW synchronous_standby_names")
            .fetch_one(&mut conn)
            .await
            .ok()?;
        if names.is_empty() {
            return Some(false);
        }
        // A change of the setting reaches the commit path through a reload (the checkpointer
        // publishes it): give a fresh one time to arrive before trusting it.
        tokio::time::sleep(Duration::from_millis(300)).await;
        // Whatever committed before (synchronously or not) is on the standby once it has flushed
        // up to here; whatever commits after waits for it.
        let deadline = Instant::now() + Duration::from_secs(2);
        let lsn: String = sqlx::query_scalar("SELECT pg_current_wal_lsn()::text")
            .fetch_one(&mut conn)
            .await
            .ok()?;
        while Instant::now() < deadline {
            let flushed: Option<bool> = sqlx::query_scalar(
                "SELECT bool_or(flush_lsn >= $1::pg_lsn) FROM pg_stat_replication",
            )
            .bind(&lsn)
            .fetch_one(&mut conn)
            .await
            .ok()?;
            if flushed == Some(true) {
                return Some(true);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Some(false)
    }

    /// How often the monitor took the standby out of synchronous replication (secondary to
    /// catchingup, the primary to wait_primary) after the setup was ready.
    pub async fn standby_dropouts(&self) -> i64 {
        let url = format!(
            "postgres://postgres@127.0.0.1:{}/pg_auto_failover?sslmode=disable",
            self.monitor_port
        );
        let Ok(mut monitor) = PgConnection::connect(&url).await else {
            return -1;
        };
        sqlx::query_scalar(
            "SELECT count(*) FROM pgautofailover.event
              WHERE description LIKE '%to catchingup after it became unhealthy%'",
        )
        .fetch_one(&mut monitor)
        .await
        .unwrap_or(-1)
    }

    /// Stops the WAL sender on `primary` (SIGSTOP): from now on the standby receives nothing,
    /// as a standby lagging behind. (Stopping the standby's receiver instead would not do: the
    /// WAL already sent waits in its socket buffer and is read after the primary is gone.) The
    /// sender dies with the primary (see `kill`).
    pub async fn stop_replication(&self, primary: usize) {
        let mut conn = connect_within(&self.node_url(primary), Duration::from_secs(10)).await;
        let pids: Vec<i32> = sqlx::query_scalar("SELECT pid FROM pg_stat_replication")
            .fetch_all(&mut conn)
            .await
            .expect("the primary's WAL senders");
        assert!(!pids.is_empty(), "the primary has no WAL sender");
        for pid in pids {
            // SAFETY: a pid PostgreSQL just named; SIGSTOP only pauses it.
            unsafe {
                libc::kill(pid, libc::SIGSTOP);
            }
        }
    }

    /// The monitor's event log (every state change of every node), one line each.
    pub async fn monitor_events(&self) -> String {
        let url = format!(
            "postgres://postgres@127.0.0.1:{}/pg_auto_failover?sslmode=disable",
            self.monitor_port
        );
        let Ok(mut monitor) = PgConnection::connect(&url).await else {
            return "the monitor does not answer".to_string();
        };
        let rows: Vec<(String, String, String, String, String)> = sqlx::query_as(
            "SELECT to_char(eventtime, 'HH24:MI:SS.MS'), nodename::text, reportedstate::text,
                    goalstate::text, description
               FROM pgautofailover.event ORDER BY eventid",
        )
        .fetch_all(&mut monitor)
        .await
        .unwrap_or_default();
        rows.iter()
            .map(|(at, node, reported, goal, why)| {
                format!("{at} {node} {reported} -> {goal}: {why}")
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// The last lines of every log, for failure messages.
    pub fn logs(&self) -> String {
        let mut text = String::new();
        for log in ["monitor.log", "node1.log", "node2.log"] {
            let content = std::fs::read_to_string(self.dir.join(log)).unwrap_or_default();
            let lines: Vec<&str> = content.lines().collect();
            text.push_str(&format!("--- {log}\n"));
            text.push_str(&lines[lines.len().saturating_sub(15)..].join("\n"));
            text.push('\n');
        }
        text
    }
}

impl Drop for HaCluster {
    fn drop(&mut self) {
        for index in 0..self.nodes.len() {
            self.kill(index);
        }
        // The monitor's background workers outlive a killed postmaster: killed with it.
        let monitor = self.monitor.take();
        let group = monitor.as_ref().map(|m| m.id() as libc::pid_t);
        kill_machine(group, postmaster_pid(&self.dir.join("monitor")));
        if let Some(mut monitor) = monitor {
            let _ = monitor.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The processes of one machine: those of `group`, the postmaster and the postmaster's children
/// (each PostgreSQL child has a session of its own). Read from /proc: (pid, parent, group, name).
fn machine_pids(group: Option<libc::pid_t>, postmaster: Option<libc::pid_t>) -> Vec<libc::pid_t> {
    let processes = processes();
    processes
        .iter()
        .filter(|(pid, ppid, pgrp, _)| {
            Some(*pgrp) == group || Some(*pid) == postmaster || Some(*ppid) == postmaster
        })
        .map(|(pid, ..)| *pid)
        .collect()
}

/// Stops, then kills, every process of one machine (see `machine_pids`).
fn kill_machine(group: Option<libc::pid_t>, postmaster: Option<libc::pid_t>) {
    let pids = machine_pids(group, postmaster);
    for signal in [libc::SIGSTOP, libc::SIGKILL] {
        for pid in &pids {
            // SAFETY: processes of a machine this harness started; gone ones are harmless.
            unsafe {
                libc::kill(*pid, signal);
            }
        }
    }
    if let Some(group) = group {
        // SAFETY: our own child's group; anything started since the listing goes too.
        unsafe {
            libc::kill(-group, libc::SIGKILL);
        }
    }
}

/// Every process: (pid, parent pid, process group, name), from /proc/*/stat.
fn processes() -> Vec<(i32, i32, i32, String)> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut all = Vec::new();
    for entry in entries.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<i32>().ok())
        else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        // "pid (comm) state ppid pgrp ...": comm may hold spaces, so split at its last ')'.
        let (Some(open), Some(close)) = (stat.find('('), stat.rfind(')')) else {
            continue;
        };
        let fields: Vec<i32> = stat[close + 1..]
            .split_whitespace()
            .skip(1)
            .take(2)
            .filter_map(|f| f.parse().ok())
            .collect();
        if let [ppid, pgrp] = fields[..] {
            all.push((pid, ppid, pgrp, stat[open + 1..close].to_string()));
        }
    }
    all
}

/// Sends `signal` to the `pg_autoctl` processes of the keeper's process group (not to its
/// PostgreSQL: the database keeps serving).
fn signal_keeper(group: libc::pid_t, signal: libc::c_int) {
    for (pid, _, pgrp, name) in processes() {
        if pgrp == group && (name == "pg_autoctl" || name == "runuser") {
            // SAFETY: a process of our own keeper's group; stop/continue only.
            unsafe {
                libc::kill(pid, signal);
            }
        }
    }
}

/// The postmaster's pid from `pgdata/postmaster.pid`, if it is there.
fn postmaster_pid(pgdata: &Path) -> Option<libc::pid_t> {
    std::fs::read_to_string(pgdata.join("postmaster.pid"))
        .ok()?
        .lines()
        .next()?
        .trim()
        .parse()
        .ok()
}

/// Gives every ancestor of `dir` o+x, so `postgres` can reach it.
fn traversable(dir: &Path) {
    use std::os::unix::fs::PermissionsExt;
    for ancestor in dir.ancestors() {
        if let Ok(meta) = std::fs::metadata(ancestor) {
            let mode = meta.permissions().mode();
            if mode & 0o001 == 0 {
                let _ = std::fs::set_permissions(
                    ancestor,
                    std::fs::Permissions::from_mode(mode | 0o001),
                );
            }
        }
    }
}

/// A connection to `url`, retried until `within` passes.
async fn connect_within(url: &str, within: Duration) -> PgConnection {
    let deadline = Instant::now() + within;
    loop {
        match PgConnection::connect(url).await {
            Ok(conn) => return conn,
            Err(error) => {
                assert!(
                    Instant::now() < deadline,
                    "cannot connect to {url}: {error}"
                );
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
}
