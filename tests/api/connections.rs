//! Single statements keep their connection between them (`store/hot.rs`).

use crate::common;
use serde_json::json;
use sqlx::Connection;

/// Sequential enqueues run on the connection the last one left (two at most, should a pause
/// pass the 100 ms threshold), not on the pool's idle connections in turn, although the pool
/// holds several: each statement used to hand its connection back (sqlx pings it then) and take
/// the pool's oldest idle one.
#[tokio::test]
async fn sequential_statements_reuse_the_connection_the_last_one_left() {
    let (database, url) = common::fresh_database().await;
    let app = common::spawn_app_on(&database, &url, |s| s.maintenance_interval = None).await;
    let http = reqwest::Client::new();
    let enqueue = |queue: &'static str, n: usize| {
        let request = http
            .post(format!("{}/ojs/v1/jobs", app.http_url))
            .header("content-type", "application/json")
            .body(json!({"type": "t.reuse", "args": [n], "options": {"queue": queue}}).to_string());
        async move {
            let answer = request.send().await.expect("enqueue");
            assert_eq!(answer.status(), 201);
        }
    };
    // The pool opens several connections for concurrent requests; they go idle.
    enqueue("warm", 0).await;
    futures_util::future::join_all((0..12).map(|n| enqueue("warm", n))).await;
    tokio::time::sleep(std::time::Duration::from_millis(400)).await;
    for n in 0..30 {
        enqueue("reuse", n).await;
    }
    let mut db = sqlx::PgConnection::connect(&url).await.expect("connect");
    let open: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM pg_stat_activity
          WHERE datname = current_database() AND pid <> pg_backend_pid()",
    )
    .fetch_one(&mut db)
    .await
    .expect("activity");
    let backends: Vec<i32> = sqlx::query_scalar(
        "SELECT pid FROM pg_stat_activity
          WHERE datname = current_database() AND pid <> pg_backend_pid()
            AND query LIKE '%s3q_reuse.insert_jobs%'",
    )
    .fetch_all(&mut db)
    .await
    .expect("activity");
    assert!(
        !backends.is_empty() && backends.len() <= 2,
        "29 sequential inserts ran last on {} of {open} backends: {backends:?}",
        backends.len()
    );
    let stored: i64 = sqlx::query_scalar("SELECT count(*) FROM s3q_reuse.jobs")
        .fetch_one(&mut db)
        .await
        .expect("count");
    assert_eq!(stored, 30);
}
