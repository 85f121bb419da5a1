//! The database side of the bench: the PostgreSQL to use, fresh databases, the server on one, and
//! the table statistics churn is read from.

use std::path::Path;
use std::time::{Duration, Instant};

use pgvs3::cluster::{ClusterOptions, PrivateCluster};
use pgvs3::server::{self, RunningServer, ServerSettings};
use sqlx::{AssertSqlSafe, Connection, PgConnection, Row};

use crate::{Args, BenchError, Result, SyncCommit};

/// The PostgreSQL server every scenario runs on.
pub struct Postgres {
    admin_url: String,
    sync_commit: SyncCommit,
    /// Kept to stop the private cluster at the end (dropping it stops it).
    cluster: Option<PrivateCluster>,
}

/// One fresh database.
pub struct Database {
    /// Its name.
    pub name: String,
    /// Its URL.
    pub url: String,
}

/// Facts about the database server, for the report.
pub struct ServerFacts {
    pub version: String,
    pub fsync: String,
    pub synchronous_commit: String,
    pub wal_sync_method: String,
    pub shared_buffers: String,
    pub private: bool,
}

/// One table's counters from `pg_stat_user_tables`.
#[derive(Debug, Clone)]
pub struct TableStats {
    pub table: String,
    pub dead: i64,
    pub updated_or_deleted: i64,
    pub hot_updated: i64,
    pub inserted: i64,
}

/// The sum over tables, with the tables that made dead row versions named.
pub struct Churn {
    /// `n_dead_tup` left (autovacuum and page pruning may have lowered it).
    pub dead: i64,
    /// Dead row versions made: every UPDATE (HOT or not) and DELETE leaves one.
    pub updated_or_deleted: i64,
    pub detail: String,
}

impl Postgres {
    /// Uses `database_url` when given, else starts (initialising on first use) a private cluster
    /// with durable commits in `data_dir`.
    pub fn start(
        database_url: Option<&str>,
        data_dir: &Path,
        sync_commit: SyncCommit,
    ) -> Result<Postgres> {
        if let Some(url) = database_url.filter(|u| !u.is_empty()) {
            return Ok(Postgres {
                admin_url: url.to_string(),
                sync_commit,
                cluster: None,
            });
        }
        let cluster = PrivateCluster::start(&ClusterOptions {
            data_dir: data_dir.to_path_buf(),
            fsync: true,
        })?;
        Ok(Postgres {
            admin_url: cluster.database_url("postgres"),
            sync_commit,
            cluster: Some(cluster),
        })
    }

    /// Stops the private cluster, if this process started one.
    pub fn stop(&mut self) {
        if let Some(mut cluster) = self.cluster.take()
            && let Err(error) = cluster.stop()
        {
            crate::progress(format_args!("stopping the private cluster failed: {error}"));
        }
    }

    /// Creates an empty database with this run's `synchronous_commit`.
    pub async fn fresh(&self, label: &str) -> Result<Database> {
        let name = format!(
            "pgvs3_bench_{label}_{}",
            &uuid::Uuid::new_v4().simple().to_string()[..8]
        );
        let mut conn = PgConnection::connect(&self.admin_url).await?;
        sqlx::raw_sql(AssertSqlSafe(format!("CREATE DATABASE {name}")))
            .execute(&mut conn)
            .await?;
        sqlx::raw_sql(AssertSqlSafe(format!(
            "ALTER DATABASE {name} SET synchronous_commit = {}",
            self.sync_commit.as_str()
        )))
        .execute(&mut conn)
        .await?;
        conn.close().await?;
        Ok(Database {
            url: with_database(&self.admin_url, &name),
            name,
        })
    }

    /// Drops a bench database (best effort: a failure is reported, not fatal).
    pub async fn drop_database(&self, database: Database) {
        let result = async {
            let mut conn = PgConnection::connect(&self.admin_url).await?;
            sqlx::raw_sql(AssertSqlSafe(format!(
                "DROP DATABASE IF EXISTS {} WITH (FORCE)",
                database.name
            )))
            .execute(&mut conn)
            .await?;
            conn.close().await?;
            Ok::<(), BenchError>(())
        }
        .await;
        if let Err(error) = result {
            crate::progress(format_args!("dropping {} failed: {error}", database.name));
        }
    }

    /// Drops bench databases an interrupted earlier run left in the private cluster (a
    /// `DATABASE_URL` server is left alone: another run may be using it).
    pub async fn drop_leftovers(&self) -> Result<()> {
        if self.cluster.is_none() {
            return Ok(());
        }
        let mut conn = PgConnection::connect(&self.admin_url).await?;
        let names: Vec<String> = sqlx::query_scalar(
            "SELECT datname FROM pg_database WHERE datname LIKE 'pgvs3\\_bench\\_%'",
        )
        .fetch_all(&mut conn)
        .await?;
        conn.close().await?;
        for name in names {
            crate::progress(format_args!("dropping {name}, left by an earlier run"));
            self.drop_database(Database {
                url: with_database(&self.admin_url, &name),
                name,
            })
            .await;
        }
        Ok(())
    }

    /// Version and durability settings as a fresh database sees them.
    pub async fn facts(&self) -> Result<ServerFacts> {
        let database = self.fresh("facts").await?;
        let mut conn = PgConnection::connect(&database.url).await?;
        let mut show = async |setting: &'static str| -> Result<String> {
            let row = sqlx::query(AssertSqlSafe(format!("SHOW {setting}")))
                .fetch_one(&mut conn)
                .await?;
            Ok(row.try_get::<String, _>(0)?)
        };
        let facts = ServerFacts {
            version: show("server_version").await?,
            fsync: show("fsync").await?,
            synchronous_commit: show("synchronous_commit").await?,
            wal_sync_method: show("wal_sync_method").await?,
            shared_buffers: show("shared_buffers").await?,
            private: self.cluster.is_some(),
        };
        conn.close().await?;
        self.drop_database(database).await;
        Ok(facts)
    }
}

/// `url` with its database name replaced.
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

/// Starts pgvs3 in-process on an ephemeral port over `url`, with a maintenance loop.
pub async fn start_server(url: &str, args: &Args) -> Result<RunningServer> {
    let mut settings = ServerSettings::for_database(url);
    settings.db_pool_size = args.db_pool_size;
    settings.maintenance_interval = Some(Duration::from_millis(args.maintenance_interval_ms));
    Ok(server::start(settings).await?)
}

/// The schema of a queue (`s3q_<name>`), from the catalog.
pub async fn queue_schema(url: &str, queue: &str) -> Result<String> {
    let mut conn = PgConnection::connect(url).await?;
    let schema: Option<String> = sqlx::query_scalar("SELECT s3p.queue_schema($1)")
        .bind(queue)
        .fetch_one(&mut conn)
        .await?;
    conn.close().await?;
    schema.ok_or_else(|| BenchError::from(format!("queue {queue} has no schema")))
}

/// Waits until no other session is connected to the database (so every backend that did work has
/// exited and flushed its statistics), then reads `pg_stat_user_tables`.
pub async fn settled_stats(database: &Database) -> Result<Vec<TableStats>> {
    let mut conn = PgConnection::connect(&database.url).await?;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let others: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()",
        )
        .fetch_one(&mut conn)
        .await?;
        if others == 0 {
            break;
        }
        if Instant::now() >= deadline {
            crate::progress(format_args!(
                "{others} sessions still connected to {}; their statistics may be unflushed",
                database.name
            ));
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    sqlx::query("SELECT pg_stat_force_next_flush()")
        .execute(&mut conn)
        .await?;
    tokio::time::sleep(Duration::from_millis(100)).await;
    let rows = sqlx::query(
        "SELECT format('%s.%s', schemaname, relname) AS t, n_dead_tup, n_tup_upd + n_tup_del AS ud,
                n_tup_hot_upd, n_tup_ins
           FROM pg_stat_user_tables ORDER BY 1",
    )
    .fetch_all(&mut conn)
    .await?;
    conn.close().await?;
    rows.iter()
        .map(|r| {
            Ok(TableStats {
                table: r.try_get("t")?,
                dead: r.try_get("n_dead_tup")?,
                updated_or_deleted: r.try_get("ud")?,
                hot_updated: r.try_get("n_tup_hot_upd")?,
                inserted: r.try_get("n_tup_ins")?,
            })
        })
        .collect()
}

/// Sums the counters and names the tables that made dead row versions (most first).
pub fn churn(stats: &[TableStats], per: f64) -> Churn {
    let mut makers: Vec<&TableStats> = stats.iter().filter(|s| s.updated_or_deleted > 0).collect();
    makers.sort_by_key(|s| std::cmp::Reverse(s.updated_or_deleted));
    let detail = makers
        .iter()
        .take(4)
        .map(|s| {
            let hot = if s.hot_updated > 0 {
                format!(" ({:.2} HOT)", s.hot_updated as f64 / per)
            } else {
                String::new()
            };
            format!(
                "{} {:.2}{hot}",
                s.table.rsplit('.').next().unwrap_or(&s.table),
                s.updated_or_deleted as f64 / per
            )
        })
        .collect::<Vec<_>>()
        .join(", ");
    let inserted: i64 = stats.iter().map(|s| s.inserted).sum();
    Churn {
        dead: stats.iter().map(|s| s.dead).sum(),
        updated_or_deleted: stats.iter().map(|s| s.updated_or_deleted).sum(),
        detail: format!(
            "{}; {:.2} rows inserted",
            if detail.is_empty() {
                "none".to_string()
            } else {
                detail
            },
            inserted as f64 / per
        ),
    }
}

/// A position in the cluster's WAL (`pg_current_wal_lsn()`), with the redo point of the latest
/// checkpoint when the role may read it (`pg_control_checkpoint()`).
pub struct WalMark {
    lsn: String,
    redo: Option<String>,
}

/// WAL written between a mark and now.
pub struct WalWritten {
    /// Bytes, over the whole cluster.
    pub bytes: f64,
    /// Whether a checkpoint began in between, so the bytes include full-page images of the
    /// first change of each page after it (`None`: the role cannot read the control data).
    pub checkpoint: Option<bool>,
}

impl WalMark {
    /// Marks the current WAL position, read through `url`.
    pub async fn now(url: &str) -> Result<WalMark> {
        let mut conn = PgConnection::connect(url).await?;
        let lsn: String = sqlx::query_scalar("SELECT pg_current_wal_lsn()::text")
            .fetch_one(&mut conn)
            .await?;
        let redo = checkpoint_redo(&mut conn).await;
        conn.close().await?;
        Ok(WalMark { lsn, redo })
    }

    /// The WAL written since the mark (`pg_wal_lsn_diff`), read through `url`.
    pub async fn written(&self, url: &str) -> Result<WalWritten> {
        let mut conn = PgConnection::connect(url).await?;
        let bytes: f64 =
            sqlx::query_scalar("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), $1::pg_lsn)::float8")
                .bind(&self.lsn)
                .fetch_one(&mut conn)
                .await?;
        let redo = checkpoint_redo(&mut conn).await;
        conn.close().await?;
        Ok(WalWritten {
            bytes,
            checkpoint: self.redo.as_ref().zip(redo).map(|(a, b)| *a != b),
        })
    }
}

impl WalWritten {
    /// Words for a figure's note about the checkpoint.
    pub fn checkpoint_note(&self) -> &'static str {
        match self.checkpoint {
            Some(true) => "a checkpoint began in the window (full-page images included)",
            Some(false) => "no checkpoint in the window",
            None => "checkpoints not readable",
        }
    }
}

/// The redo LSN of the latest checkpoint; `None` when the role may not read the control data.
async fn checkpoint_redo(conn: &mut PgConnection) -> Option<String> {
    sqlx::query_scalar("SELECT redo_lsn::text FROM pg_control_checkpoint()")
        .fetch_one(conn)
        .await
        .ok()
}
