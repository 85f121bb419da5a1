//! pgvs3 reaches PostgreSQL over TLS when its URL asks for it: a private cluster serving a
//! certificate generated here (signed by a CA made here), pgvs3 connecting with
//! `sslmode=verify-full` and that CA as `sslrootcert`; every backend serving it is encrypted, and a
//! URL whose CA does not match is refused.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::Command;

use pgvs3::cluster::{ClusterOptions, PrivateCluster};
use pgvs3::server::{self, ServerSettings};
use sqlx::{Connection, PgConnection};

fn scratch_dir() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!(
        "tls-{}-{}",
        std::process::id(),
        uuid::Uuid::now_v7().simple()
    ));
    std::fs::create_dir_all(&dir).expect("scratch dir");
    dir
}

/// The cluster serves `certs` (copied into its data directory) with ssl on.
fn enable_ssl(cluster_dir: &Path, certs: &common::certs::Certs) {
    let pgdata = cluster_dir.join("pgdata");
    for (from, to) in [(&certs.cert, "server.crt"), (&certs.key, "server.key")] {
        std::fs::copy(from, pgdata.join(to)).expect("copy the certificate");
    }
    // SAFETY: geteuid has no preconditions and cannot fail.
    let as_root = unsafe { libc::geteuid() } == 0;
    if as_root {
        let status = Command::new("chown")
            .args(["postgres:postgres"])
            .arg(pgdata.join("server.crt"))
            .arg(pgdata.join("server.key"))
            .status()
            .expect("chown");
        assert!(status.success());
    }
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(
        pgdata.join("server.key"),
        std::fs::Permissions::from_mode(0o600),
    )
    .expect("key mode");
    let conf = pgdata.join("postgresql.conf");
    let mut text = std::fs::read_to_string(&conf).expect("read postgresql.conf");
    text.push_str("\nssl = on\n");
    std::fs::write(&conf, text).expect("write postgresql.conf");
    // TLS needs TCP (the private cluster normally has its socket only); read after the rest.
    let auto = pgdata.join("postgresql.auto.conf");
    let mut text = std::fs::read_to_string(&auto).unwrap_or_default();
    text.push_str("\nlisten_addresses = '127.0.0.1'\n");
    std::fs::write(&auto, text).expect("write postgresql.auto.conf");
}

/// The cluster's `postgres` database over TCP, with TLS verified against `root`.
fn with_tls(cluster: &PrivateCluster, root: &Path) -> String {
    format!(
        "postgres://postgres@localhost:{}/postgres?sslmode=verify-full&sslrootcert={}",
        cluster.port(),
        root.display()
    )
}

#[tokio::test]
async fn pgvs3_reaches_postgres_over_verified_tls() {
    let dir = scratch_dir();
    let certs = common::certs::make(&dir, "a");
    let other = common::certs::make(&dir, "b");
    let cluster_dir = dir.join("cluster");
    let options = ClusterOptions {
        data_dir: cluster_dir.clone(),
        fsync: false,
    };
    let mut cluster = PrivateCluster::start(&options).expect("start the cluster");
    cluster.stop().expect("stop");
    drop(cluster);
    enable_ssl(&cluster_dir, &certs);
    let mut cluster = PrivateCluster::start(&options).expect("start the cluster with ssl");
    let url = with_tls(&cluster, &certs.ca);

    // Another CA's root does not verify the server: refused before any query.
    let wrong = with_tls(&cluster, &other.ca);
    assert!(
        PgConnection::connect(&wrong).await.is_err(),
        "a server certificate from another CA was accepted"
    );

    let server = server::start(ServerSettings::for_database(&url))
        .await
        .expect("pgvs3 starts over TLS");
    let base = format!("http://{}", server.addr);
    let answer = reqwest::Client::new()
        .post(format!("{base}/ojs/v1/jobs"))
        .json(&serde_json::json!({"type": "tls.job", "args": [1]}))
        .send()
        .await
        .expect("enqueue");
    assert_eq!(answer.status(), reqwest::StatusCode::CREATED);

    let mut conn = PgConnection::connect(&url).await.expect("connect over TLS");
    let (plain, encrypted): (i64, i64) = sqlx::query_as(
        "SELECT count(*) FILTER (WHERE NOT s.ssl), count(*) FILTER (WHERE s.ssl)
           FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid)
          WHERE a.backend_type = 'client backend'",
    )
    .fetch_one(&mut conn)
    .await
    .expect("pg_stat_ssl");
    assert_eq!(plain, 0, "every client backend is encrypted");
    assert!(
        encrypted >= 2,
        "pgvs3's connections and this one: {encrypted}"
    );
    let stored: i64 = sqlx::query_scalar("SELECT count(*) FROM s3q_default.jobs")
        .fetch_one(&mut conn)
        .await
        .expect("jobs");
    assert_eq!(stored, 1);
    let _ = conn.close().await;
    server.shutdown().await;
    cluster.stop().expect("stop");
    let _ = std::fs::remove_dir_all(&dir);
}
