//! The private cluster is its owner's alone: it opens no TCP port and listens on a Unix socket
//! only its owner may open; a cluster made by an older pgvs3 (trusting every connection on
//! 127.0.0.1) moves to the socket at its next start.

use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};
use std::process::Command;

use pgvs3::cluster::{ClusterOptions, PrivateCluster, find_binaries};
use sqlx::{Connection, PgConnection};

fn scratch_dir(name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!(
        "{name}-{}-{}",
        std::process::id(),
        &uuid::Uuid::now_v7().simple().to_string()[..12]
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

async fn setting(url: &str, name: &str) -> String {
    let mut conn = PgConnection::connect(url).await.expect("connect");
    let value: String = sqlx::query_scalar("SELECT current_setting($1)")
        .bind(name)
        .fetch_one(&mut conn)
        .await
        .expect("read a setting");
    let _ = conn.close().await;
    value
}

/// Asserts the cluster serves on an owner-only socket in `dir` and on no TCP address.
async fn serves_only_its_owner(cluster: &PrivateCluster, dir: &Path) {
    let url = cluster.database_url("postgres");
    assert_eq!(
        std::fs::read_to_string(dir.join("database_url"))
            .expect("database_url file")
            .trim(),
        url
    );
    assert_eq!(setting(&url, "listen_addresses").await, "");
    assert_eq!(setting(&url, "unix_socket_permissions").await, "0700");
    let socket = cluster
        .socket_dir()
        .expect("a socket")
        .join(format!(".s.PGSQL.{}", cluster.port()));
    let meta = std::fs::metadata(&socket).expect("the socket file");
    assert_eq!(
        meta.permissions().mode() & 0o777,
        0o700,
        "owner-only socket"
    );
    let tcp = format!("postgres://postgres@127.0.0.1:{}/postgres", cluster.port());
    assert!(
        PgConnection::connect(&tcp).await.is_err(),
        "no TCP connection"
    );

    // Another local user cannot open the socket (checkable only when we may switch users).
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        assert_ne!(meta.uid(), 65534, "the socket is not nobody's");
        let psql = find_binaries().expect("binaries").join("psql");
        let output = Command::new("runuser")
            .args(["-u", "nobody", "--"])
            .arg(psql)
            .args(["-XAtc", "SELECT 1"])
            .arg(&url)
            .output()
            .expect("run psql as nobody");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success(), "nobody connected");
        assert!(stderr.contains("Permission denied"), "{stderr}");
    }
}

#[tokio::test]
async fn the_cluster_listens_only_on_an_owner_only_socket() {
    let dir = scratch_dir("pc-new");
    let mut cluster = start(&dir);
    serves_only_its_owner(&cluster, &dir).await;
    cluster.stop().expect("stop");
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn a_cluster_listening_on_loopback_moves_to_the_socket_at_restart() {
    let dir = scratch_dir("pc-old");
    let mut cluster = start(&dir);
    cluster.stop().expect("stop");
    drop(cluster);
    // Make it what an older pgvs3 left: TCP on 127.0.0.1 trusting everyone, no socket.
    let pgdata = dir.join("pgdata");
    std::fs::remove_file(pgdata.join("pgvs3.conf")).expect("remove pgvs3.conf");
    let conf = pgdata.join("postgresql.conf");
    let text = std::fs::read_to_string(&conf).expect("read postgresql.conf");
    let old = text.replace(
        "include_if_exists = 'pgvs3.conf'",
        "listen_addresses = '127.0.0.1'\nunix_socket_directories = ''",
    );
    assert_ne!(old, text, "postgresql.conf includes pgvs3.conf");
    std::fs::write(&conf, old).expect("write postgresql.conf");

    let mut cluster = start(&dir);
    serves_only_its_owner(&cluster, &dir).await;
    cluster.stop().expect("stop");
    let _ = std::fs::remove_dir_all(&dir);
}
