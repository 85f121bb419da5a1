//! Migrations on a database that already holds data: every migration file is idempotent, and one
//! whose SQL changed since it was applied runs again at the next start (that is how edited
//! function bodies reach existing databases). That the SQL really ran again is shown by a function
//! of every file, renamed away before the restart and back in place after it.

use crate::common;

use serde_json::{Value, json};
use sqlx::Connection;

async fn checksums(url: &str) -> Vec<(i32, Option<String>)> {
    let mut conn = sqlx::PgConnection::connect(url).await.expect("connect");
    let rows = sqlx::query_as("SELECT version, checksum FROM s3p.migrations ORDER BY version")
        .fetch_all(&mut conn)
        .await
        .expect("read migrations");
    let _ = conn.close().await;
    rows
}

/// The last `s3p` function each migration file creates, in version order.
fn last_functions() -> Vec<String> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("sql");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .expect("sql dir")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.as_bytes()[0].is_ascii_digit())
        })
        .collect();
    files.sort();
    files
        .iter()
        .map(|file| {
            let sql = std::fs::read_to_string(file).expect("read migration");
            let marker = "CREATE OR REPLACE FUNCTION s3p.";
            let at = sql
                .rfind(marker)
                .unwrap_or_else(|| panic!("{file:?} makes no function"));
            sql[at + marker.len()..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect()
        })
        .collect()
}

#[tokio::test]
async fn changed_migrations_run_again_over_existing_data() {
    // From scratch: not a clone of the migrated template.
    let (database, url) = common::empty_database().await;
    let first = common::spawn_app_on(&database, &url, |_| {}).await;
    let client = reqwest::Client::new();
    let enqueued: Value = client
        .post(format!("{}/ojs/v1/jobs", first.http_url))
        .json(&json!({"type": "kept.job", "args": [1], "options": {"queue": "kept"}}))
        .send()
        .await
        .expect("enqueue")
        .json()
        .await
        .expect("enqueue answer");
    let id = enqueued["job"]["id"].as_str().expect("job id").to_string();
    // An operator's fillfactor on another queue, which upgrades must keep.
    client
        .post(format!("{}/ojs/v1/jobs", first.http_url))
        .json(&json!({"type": "t", "args": [], "options": {"queue": "tuned"}}))
        .send()
        .await
        .expect("make the queue");
    let tuned = client
        .post(format!("{}/ojs/v1/queues/tuned/config", first.http_url))
        .json(&json!({"autovacuum": {"fillfactor": 85}}))
        .send()
        .await
        .expect("config");
    assert!(tuned.status().is_success(), "{}", tuned.status());
    let recorded = checksums(&url).await;
    assert!(!recorded.is_empty());
    assert!(
        recorded
            .iter()
            .all(|(_, c)| c.as_ref().is_some_and(|c| c.len() == 64))
    );

    // As if every file had been edited since, and the queue schema made from an older template:
    // the next start applies them all again and upgrades the queue.
    let mut conn = sqlx::PgConnection::connect(&url).await.expect("connect");
    let markers = last_functions();
    assert_eq!(
        markers.len(),
        recorded.len(),
        "one function per migration file"
    );
    for name in &markers {
        let signature: String = sqlx::query_scalar(
            "SELECT p.oid::regprocedure::text FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
              WHERE n.nspname = 's3p' AND p.proname = $1 LIMIT 1",
        )
        .bind(name)
        .fetch_one(&mut conn)
        .await
        .expect("the migration made its function");
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
            "ALTER FUNCTION {signature} RENAME TO {name}_before_rerun"
        )))
        .execute(&mut conn)
        .await
        .expect("rename the function away");
    }
    sqlx::query("UPDATE s3p.migrations SET checksum = 'stale'")
        .execute(&mut conn)
        .await
        .expect("mark stale");
    sqlx::query("UPDATE s3p.queues SET template_version = template_version - 1")
        .execute(&mut conn)
        .await
        .expect("mark the queue schema old");
    // As templates before 22 made it: no fillfactor, a B-tree on creation time.
    sqlx::raw_sql(
        "ALTER TABLE s3q_kept.jobs RESET (fillfactor);
         DROP INDEX s3q_kept.jobs_created_brin;
         CREATE INDEX jobs_created ON s3q_kept.jobs (created_at);",
    )
    .execute(&mut conn)
    .await
    .expect("make the queue schema as an older template did");
    let _ = conn.close().await;
    let second = common::spawn_app_on(&database, &url, |_| {}).await;
    assert_eq!(
        checksums(&url).await,
        recorded,
        "checksums are current again"
    );
    let mut conn = sqlx::PgConnection::connect(&url).await.expect("connect");
    let behind: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM s3p.queues
          WHERE template_version < (SELECT max(version) FROM s3p.queue_templates)",
    )
    .fetch_one(&mut conn)
    .await
    .expect("template versions");
    assert_eq!(behind, 0, "the queue schema was upgraded at start");
    let storage: Vec<(String, Option<Vec<String>>, Vec<String>)> = sqlx::query_as(
        "SELECT n.nspname::text, c.reloptions::text[],
                ARRAY(SELECT i.relname::text FROM pg_index x JOIN pg_class i ON i.oid = x.indexrelid
                       WHERE x.indrelid = c.oid ORDER BY 1)
           FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
          WHERE c.relname = 'jobs' AND n.nspname IN ('s3q_kept', 's3q_tuned') ORDER BY 1",
    )
    .fetch_all(&mut conn)
    .await
    .expect("storage of the jobs tables");
    assert_eq!(storage.len(), 2, "{storage:?}");
    assert_eq!(
        storage[0].1,
        Some(vec!["fillfactor=60".to_string()]),
        "{storage:?}"
    );
    assert!(
        storage[0].2.contains(&"jobs_created_brin".to_string())
            && !storage[0].2.contains(&"jobs_created".to_string()),
        "the upgrade swaps the creation-time B-tree for BRIN: {storage:?}"
    );
    assert_eq!(
        storage[1].1,
        Some(vec!["fillfactor=85".to_string()]),
        "an operator's fillfactor is kept: {storage:?}"
    );
    let _ = conn.close().await;
    let mut conn = sqlx::PgConnection::connect(&url).await.expect("connect");
    for name in &markers {
        let present: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
              WHERE n.nspname = 's3p' AND p.proname = $1",
        )
        .bind(name)
        .fetch_one(&mut conn)
        .await
        .expect("look the function up");
        assert!(
            present > 0,
            "s3p.{name} was made again: its migration re-ran"
        );
    }
    let _ = conn.close().await;

    let job: Value = client
        .get(format!("{}/ojs/v1/jobs/{id}", second.http_url))
        .send()
        .await
        .expect("get")
        .json()
        .await
        .expect("job answer");
    assert_eq!(
        job["job"]["state"], "available",
        "the stored job survived: {job}"
    );
    let fetched: Value = client
        .post(format!("{}/ojs/v1/workers/fetch", second.http_url))
        .json(&json!({"queues": ["kept"]}))
        .send()
        .await
        .expect("fetch")
        .json()
        .await
        .expect("fetch answer");
    assert_eq!(fetched["jobs"][0]["id"], id.as_str());
    second.stop().await;
    first.stop().await;
}
