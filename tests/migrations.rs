//! Migrations on a database that already holds data: every migration file is idempotent, and one
//! whose SQL changed since it was applied runs again at the next start (that is how edited
//! function bodies reach existing databases).

mod common;

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

#[tokio::test]
async fn changed_migrations_run_again_over_existing_data() {
    let (database, url) = common::fresh_database().await;
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
    sqlx::query("UPDATE s3p.migrations SET checksum = 'stale'")
        .execute(&mut conn)
        .await
        .expect("mark stale");
    sqlx::query("UPDATE s3p.queues SET template_version = template_version - 1")
        .execute(&mut conn)
        .await
        .expect("mark the queue schema old");
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
    let _ = conn.close().await;
    assert_eq!(behind, 0, "the queue schema was upgraded at start");

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
