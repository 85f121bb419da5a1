//! The tests' PostgreSQL: `DATABASE_URL` when set, else one private cluster for the whole test
//! process (started at first use, stopped at exit), and a database per test. A test database is a
//! clone of one template database, migrated once per process as a starting server migrates
//! (`pgvs3::store::migrate::run`): a server started on a clone finds every migration's checksum
//! recorded and the queue template current, so it applies nothing. `empty_database` is for the
//! tests of migrating from scratch.

use std::path::PathBuf;
use std::sync::{Mutex, OnceLock};

use pgvs3::cluster::{ClusterOptions, PrivateCluster};
use sqlx::Connection;
use sqlx::postgres::PgPoolOptions;
use tokio::sync::OnceCell;

/// The private cluster of this test process, stopped at process exit.
static CLUSTER: Mutex<Option<PrivateCluster>> = Mutex::new(None);
static ADMIN_URL: OnceLock<Result<String, String>> = OnceLock::new();
/// The migrated template database's name, made at first use.
static TEMPLATE: OnceCell<String> = OnceCell::const_new();

extern "C" fn at_exit() {
    if let Ok(mut guard) = CLUSTER.lock()
        && let Some(mut cluster) = guard.take()
    {
        // The template goes with the cluster's directory.
        let _ = cluster.stop();
        if let Some(dir) = cluster_dir() {
            let _ = std::fs::remove_dir_all(dir);
        }
        return;
    }
    // A server named by DATABASE_URL outlives the run: drop the template from it.
    if let Some(template) = TEMPLATE.get() {
        let template = template.clone();
        block_on_admin(move |mut conn| async move {
            let _ = sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
                "ALTER DATABASE {template} WITH IS_TEMPLATE false;
                 DROP DATABASE IF EXISTS {template}"
            )))
            .execute(&mut conn)
            .await;
        });
    }
}

fn cluster_dir() -> Option<PathBuf> {
    Some(PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("pg-{}", std::process::id())))
}

/// The URL of a database where test databases can be created.
pub fn admin_url() -> String {
    let url = ADMIN_URL.get_or_init(|| {
        let url = match std::env::var("DATABASE_URL") {
            Ok(url) if !url.is_empty() => url,
            _ => {
                let options = ClusterOptions {
                    data_dir: cluster_dir().ok_or("no target dir")?,
                    fsync: false,
                };
                let cluster = PrivateCluster::start(&options).map_err(|e| e.to_string())?;
                let url = cluster.database_url("postgres");
                if let Ok(mut guard) = CLUSTER.lock() {
                    *guard = Some(cluster);
                }
                url
            }
        };
        // SAFETY: registering a plain extern "C" function with no captured state, once.
        unsafe {
            libc::atexit(at_exit);
        }
        Ok(url)
    });
    match url {
        Ok(url) => url.clone(),
        Err(e) => panic!("no PostgreSQL for tests: {e}"),
    }
}

/// `url` with its database replaced by `database`.
pub fn with_database(url: &str, database: &str) -> String {
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

/// Creates a database named `<prefix>_<uuid>` with `clause` (e.g. `TEMPLATE x`); its name and URL.
async fn create_database(prefix: &str, clause: &str) -> (String, String) {
    let admin = admin_url();
    let name = format!("{prefix}_{}", uuid::Uuid::new_v4().simple());
    let mut conn = sqlx::PgConnection::connect(&admin)
        .await
        .expect("connect to the admin database");
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "CREATE DATABASE {name} {clause}"
    )))
    .execute(&mut conn)
    .await
    .expect("create the test database");
    let _ = conn.close().await;
    let url = with_database(&admin, &name);
    (name, url)
}

/// The template database: migrated once, then closed to connections (PostgreSQL clones a
/// database only while nobody is connected to it; with connections refused, clones may run at
/// the same time).
async fn template() -> &'static str {
    TEMPLATE
        .get_or_init(|| async {
            let (name, url) = create_database("pgvs3_template", "").await;
            let pool = PgPoolOptions::new()
                .max_connections(1)
                .connect(&url)
                .await
                .expect("connect to the template database");
            pgvs3::store::migrate::run(&pool)
                .await
                .expect("migrate the template database");
            pool.close().await;
            let mut conn = sqlx::PgConnection::connect(&admin_url())
                .await
                .expect("connect to the admin database");
            sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
                "ALTER DATABASE {name} WITH IS_TEMPLATE true ALLOW_CONNECTIONS false"
            )))
            .execute(&mut conn)
            .await
            .expect("make the template database a template");
            let _ = conn.close().await;
            name
        })
        .await
}

/// A fresh database with pgvs3's schema current (a clone of the migrated template); its name and
/// URL.
pub async fn fresh_database() -> (String, String) {
    let template = template().await;
    create_database("pgvs3_test", &format!("TEMPLATE {template}")).await
}

/// A fresh, empty database (nothing migrated); its name and URL.
pub async fn empty_database() -> (String, String) {
    create_database("pgvs3_test", "").await
}

/// Runs `work` on a connection to the admin database, on a thread and runtime of its own (for
/// `Drop` and exit handlers, which cannot await).
fn block_on_admin<F, Fut>(work: F)
where
    F: FnOnce(sqlx::PgConnection) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()>,
{
    let admin = match ADMIN_URL.get() {
        Some(Ok(url)) => url.clone(),
        _ => return,
    };
    let _ = std::thread::spawn(move || {
        let Ok(runtime) = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        else {
            return;
        };
        runtime.block_on(async {
            if let Ok(conn) = sqlx::PgConnection::connect(&admin).await {
                work(conn).await;
            }
        });
    })
    .join();
}

/// Drops a test database (best effort; a no-op in a process that made none).
pub fn drop_database(name: String) {
    if name.is_empty() {
        return;
    }
    block_on_admin(move |mut conn| async move {
        let _ = sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
            "DROP DATABASE IF EXISTS {name} WITH (FORCE)"
        )))
        .execute(&mut conn)
        .await;
    });
}

/// Conformance runs many servers at once, each committing in a database of its own on the shared
/// cluster. The OJS event log (`s3p.events_horizon`) holds a read back at a transaction of another
/// database that was open at the read's snapshot and ends during the read (it cannot tell whether
/// that transaction wrote events the snapshot misses), so under that load an event can be missing
/// for an instant right after its commit. The tests that read the log right after a commit and
/// assert what it holds take the shared side of this lock, conformance the exclusive side: they
/// never overlap. A test takes it once, at its start (the lock is fair: a test taking its shared
/// side twice could wait behind conformance waiting for it).
static MANY_DATABASES_BUSY: tokio::sync::RwLock<()> = tokio::sync::RwLock::const_new(());

/// Held by a test that reads the event log right after a commit (see `MANY_DATABASES_BUSY`).
pub async fn reading_the_event_log_at_once() -> tokio::sync::RwLockReadGuard<'static, ()> {
    MANY_DATABASES_BUSY.read().await
}

/// Held by conformance while its servers run (see `MANY_DATABASES_BUSY`).
pub async fn many_databases_busy() -> tokio::sync::RwLockWriteGuard<'static, ()> {
    MANY_DATABASES_BUSY.write().await
}

/// Drops `queue` in a transaction left open on a connection of its own, and answers the future
/// that commits it 700 ms later: requests sent meanwhile are then waiting on the drop's locks.
pub async fn hold_drop(database_url: &str, queue: &str) -> impl std::future::Future<Output = ()> {
    let mut conn = sqlx::PgConnection::connect(database_url)
        .await
        .expect("connect to the test database");
    sqlx::raw_sql("BEGIN")
        .execute(&mut conn)
        .await
        .expect("begin");
    let dropped: bool = sqlx::query_scalar("SELECT s3p.drop_queue($1)")
        .bind(queue)
        .fetch_one(&mut conn)
        .await
        .expect("drop the queue");
    assert!(dropped, "queue {queue} to drop");
    async move {
        tokio::time::sleep(std::time::Duration::from_millis(700)).await;
        sqlx::raw_sql("COMMIT")
            .execute(&mut conn)
            .await
            .expect("commit the drop");
    }
}
