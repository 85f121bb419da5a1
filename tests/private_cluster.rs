//! The private cluster is its owner's alone: every connection must give the superuser's password
//! (kept owner-only in the data directory), and a cluster made by an older pgvs3, which trusted
//! every local connection, asks for a password from its next start on.

use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};

use pgvs3::cluster::{ClusterOptions, PrivateCluster};
use sqlx::{Connection, PgConnection};

fn scratch_dir(name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!(
        "{name}-{}-{}",
        std::process::id(),
        uuid::Uuid::now_v7().simple()
    ));
    std::fs::create_dir_all(&dir).expect("scratch dir");
    dir
}

fn start(dir: &Path) -> PrivateCluster {
    PrivateCluster::start(&ClusterOptions {
        data_dir: dir.to_path_buf(),
        fsync: false,
    })
    .expect("start the private cluster")
}

/// The cluster's URL with the password left out.
fn without_password(cluster: &PrivateCluster) -> String {
    format!("postgres://postgres@127.0.0.1:{}/postgres", cluster.port())
}

async fn refused(url: &str) -> String {
    match PgConnection::connect(url).await {
        Ok(_) => panic!("connected without the password: {url}"),
        Err(e) => e.to_string(),
    }
}

async fn accepted(url: &str) {
    let mut conn = PgConnection::connect(url)
        .await
        .expect("connect with the password");
    let one: i32 = sqlx::query_scalar("SELECT 1")
        .fetch_one(&mut conn)
        .await
        .expect("query");
    assert_eq!(one, 1);
    let _ = conn.close().await;
}

#[tokio::test]
async fn connections_without_the_password_are_refused() {
    let dir = scratch_dir("pc-new");
    let mut cluster = start(&dir);
    let file = dir.join("password");
    let mode = std::fs::metadata(&file)
        .expect("password file")
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600, "the password file is owner-only");
    assert_eq!(
        std::fs::read_to_string(&file).expect("read").trim(),
        cluster.password()
    );
    let error = refused(&without_password(&cluster)).await;
    assert!(error.contains("password"), "{error}");
    let wrong = format!(
        "postgres://postgres:not-it@127.0.0.1:{}/postgres",
        cluster.port()
    );
    let error = refused(&wrong).await;
    assert!(error.contains("password authentication failed"), "{error}");
    accepted(&cluster.database_url("postgres")).await;
    cluster.stop().expect("stop");
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn a_cluster_that_trusted_everyone_asks_for_a_password_after_restart() {
    let dir = scratch_dir("pc-old");
    let mut cluster = start(&dir);
    // Make it what an older pgvs3 left: trust for every connection, no password file.
    let hba = dir.join("pgdata").join("pg_hba.conf");
    std::fs::write(
        &hba,
        "local all all trust\nhost all all 127.0.0.1/32 trust\nhost replication all 127.0.0.1/32 trust\n",
    )
    .expect("write pg_hba.conf");
    cluster.stop().expect("stop");
    drop(cluster);
    std::fs::remove_file(dir.join("password")).expect("remove the password file");

    let mut cluster = start(&dir);
    assert!(dir.join("password").is_file(), "a new password file");
    let error = refused(&without_password(&cluster)).await;
    assert!(error.contains("password"), "{error}");
    accepted(&cluster.database_url("postgres")).await;
    cluster.stop().expect("stop");
    let _ = std::fs::remove_dir_all(&dir);
}
