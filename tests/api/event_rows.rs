//! The event log stores a claim, an ack or an enqueue of many jobs as one row per statement (#28),
//! and still reads as one event per job: the same events, in the same order, with distinct ids,
//! whatever the page size and wherever a page boundary falls inside a row.

use crate::common;

use serde_json::{Value, json};
use sqlx::Connection;

/// Every event of `queue` from the start, `limit` per page, with the cursor after each page.
async fn read_all(http: &common::http::Http, queue: &str, limit: usize) -> Vec<Value> {
    let mut after = String::from("0-0");
    let mut events = Vec::new();
    loop {
        let page = http
            .ok_get(&format!(
                "/ojs/v1/events?queues={queue}&limit={limit}&after={after}"
            ))
            .await;
        let got = page["events"].as_array().cloned().unwrap_or_default();
        assert!(
            got.len() <= limit,
            "a page holds at most limit events: {page}"
        );
        if got.is_empty() {
            return events;
        }
        events.extend(got);
        after = page["cursor"].as_str().expect("cursor").to_string();
    }
}

#[tokio::test]
async fn a_statement_of_many_jobs_is_one_log_row_and_reads_as_one_event_per_job() {
    let app = common::spawn_app().await;
    let http = common::http::Http::new(&app);
    // 30 jobs, two of them scheduled: the enqueue row holds events of two types.
    let jobs: Vec<Value> = (0..30)
        .map(|i| {
            let mut options = json!({"queue": "rows"});
            if i == 5 || i == 17 {
                options["scheduled_at"] = json!("2099-01-01T00:00:00Z");
            }
            json!({"type": format!("row.t{}", i % 3), "args": [i], "options": options})
        })
        .collect();
    let stored = http
        .ok_post("/ojs/v1/jobs/batch", json!({ "jobs": jobs }))
        .await;
    let ids: Vec<Value> = stored["jobs"]
        .as_array()
        .expect("jobs")
        .iter()
        .map(|j| j["id"].clone())
        .collect();
    let fetched = http
        .ok_post(
            "/ojs/v1/workers/fetch",
            json!({"queues": ["rows"], "count": 100, "worker_id": "w-rows"}),
        )
        .await;
    let claimed = fetched["jobs"].as_array().cloned().unwrap_or_default();
    assert_eq!(claimed.len(), 28, "{fetched}");
    let acks: Vec<Value> = claimed
        .iter()
        .map(|j| json!({"job_id": j["id"], "lease_token": j["lease_token"]}))
        .collect();
    let acked = http
        .ok_post("/ojs/v1/workers/ack/batch", json!({ "acks": acks }))
        .await;
    assert_eq!(acked["acknowledged"], 28, "{acked}");

    // Storage: one row for the enqueue, one for the claim, one for the ack.
    let mut db = sqlx::PgConnection::connect(&app.database_url)
        .await
        .expect("connect");
    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM s3p.events WHERE queue = 'rows'")
        .fetch_one(&mut db)
        .await
        .expect("count");
    assert_eq!(rows, 3, "one log row per statement");
    // The claim's jobs differ in type, so the row keeps their types; they share worker and
    // attempt, so it holds those once.
    let (types_kept, extra_folded, attempt): (bool, Option<String>, Option<i32>) = sqlx::query_as(
        "SELECT job_types IS NOT NULL AND extras IS NULL AND attempts IS NULL, extra->>'worker_id', attempt
           FROM s3p.events WHERE queue = 'rows' AND type = 'job.started'",
    )
    .fetch_one(&mut db)
    .await
    .expect("claim row");
    assert!(types_kept, "types kept, worker and attempt folded");
    assert_eq!(extra_folded.as_deref(), Some("w-rows"));
    assert_eq!(attempt, Some(1));

    // Reading: one event per job and transition, in statement order, then the order given.
    let events = read_all(&http, "rows", 1000).await;
    let kinds: Vec<(String, Value)> = events
        .iter()
        .map(|e| {
            (
                e["type"].as_str().unwrap_or_default().to_string(),
                e["data"]["job_id"].clone(),
            )
        })
        .collect();
    let mut expected: Vec<(String, Value)> = ids
        .iter()
        .enumerate()
        .map(|(i, id)| {
            let kind = if i == 5 || i == 17 {
                "job.scheduled"
            } else {
                "job.enqueued"
            };
            (kind.to_string(), id.clone())
        })
        .collect();
    expected.extend(
        claimed
            .iter()
            .map(|j| ("job.started".to_string(), j["id"].clone())),
    );
    expected.extend(
        claimed
            .iter()
            .map(|j| ("job.completed".to_string(), j["id"].clone())),
    );
    assert_eq!(kinds, expected);
    for (event, job) in events[30..58].iter().zip(&claimed) {
        assert_eq!(event["data"]["worker_id"], "w-rows", "{event}");
        assert_eq!(event["data"]["attempt"], job["attempt"], "{event}");
        assert_eq!(event["data"]["state"], "active", "{event}");
    }
    for event in &events[58..] {
        assert_eq!(event["data"]["state"], "completed", "{event}");
        assert!(event["data"]["duration_ms"].is_number(), "{event}");
    }
    assert_eq!(events[5]["data"]["state"], "scheduled", "{}", events[5]);
    assert_eq!(events[6]["data"]["state"], "available", "{}", events[6]);
    assert_eq!(events[1]["data"]["job_type"], "row.t1", "{}", events[1]);

    // Distinct ids, and the same events whatever the page size (boundaries inside rows).
    let mut event_ids: Vec<&str> = events.iter().filter_map(|e| e["id"].as_str()).collect();
    event_ids.sort();
    event_ids.dedup();
    assert_eq!(event_ids.len(), events.len(), "every event has its own id");
    for limit in [1, 7, 29] {
        assert_eq!(
            read_all(&http, "rows", limit).await,
            events,
            "limit {limit}"
        );
    }
    app.stop().await;
}

/// A stored log row: type, whether its per-job arrays are all NULL, and the values held once.
type FoldedRow = (String, bool, Option<String>, Option<i32>, Option<String>);

#[tokio::test]
async fn a_row_of_jobs_sharing_type_worker_and_attempt_holds_them_once_and_reads_them_per_job() {
    let app = common::spawn_app().await;
    let http = common::http::Http::new(&app);
    let jobs: Vec<Value> = (0..12)
        .map(|i| json!({"type": "fold.same", "args": [i], "options": {"queue": "fold"}}))
        .collect();
    http.ok_post("/ojs/v1/jobs/batch", json!({ "jobs": jobs }))
        .await;
    let fetched = http
        .ok_post(
            "/ojs/v1/workers/fetch",
            json!({"queues": ["fold"], "count": 12, "worker_id": "w-fold"}),
        )
        .await;
    let claimed = fetched["jobs"].as_array().cloned().unwrap_or_default();
    assert_eq!(claimed.len(), 12, "{fetched}");

    let mut db = sqlx::PgConnection::connect(&app.database_url)
        .await
        .expect("connect");
    let folded: Vec<FoldedRow> = sqlx::query_as(
        "SELECT type, job_types IS NULL AND attempts IS NULL AND extras IS NULL, job_type, attempt,
                extra->>'worker_id'
           FROM s3p.events WHERE queue = 'fold' ORDER BY seq",
    )
    .fetch_all(&mut db)
    .await
    .expect("rows");
    assert_eq!(folded.len(), 2, "{folded:?}");
    for (kind, arrays_null, job_type, attempt, _) in &folded {
        assert!(arrays_null, "{kind}: every shared field held once");
        assert_eq!(job_type.as_deref(), Some("fold.same"), "{kind}");
        assert_eq!(
            *attempt,
            Some(if kind == "job.started" { 1 } else { 0 }),
            "{kind}"
        );
    }
    assert_eq!(folded[1].4.as_deref(), Some("w-fold"));

    // Read back, every event carries the fields its row holds once.
    let events = read_all(&http, "fold", 5).await;
    assert_eq!(events.len(), 24);
    for (event, job) in events[12..].iter().zip(&claimed) {
        assert_eq!(event["type"], "job.started", "{event}");
        assert_eq!(event["data"]["job_id"], job["id"], "{event}");
        assert_eq!(event["data"]["job_type"], "fold.same", "{event}");
        assert_eq!(event["data"]["attempt"], 1, "{event}");
        assert_eq!(event["data"]["worker_id"], "w-fold", "{event}");
    }
    for event in &events[..12] {
        assert_eq!(event["data"]["job_type"], "fold.same", "{event}");
        assert_eq!(event["data"]["attempt"], 0, "{event}");
        assert!(event["data"].get("worker_id").is_none(), "{event}");
    }
    app.stop().await;
}

#[tokio::test]
async fn more_events_than_a_row_holds_go_in_rows_of_the_span_and_read_in_order() {
    let app = common::spawn_app().await;
    let http = common::http::Http::new(&app);
    let mut db = sqlx::PgConnection::connect(&app.database_url)
        .await
        .expect("connect");
    // No API statement moves more than a thousand jobs, so the split is asked of the catalog's
    // recorder directly: 1,500 events, every other one of another job type.
    let ids: Vec<uuid::Uuid> = (0..1500).map(|_| uuid::Uuid::now_v7()).collect();
    let types: Vec<String> = (0..1500).map(|i| format!("span.t{}", i % 2)).collect();
    let recorded: i32 = sqlx::query_scalar(
        "SELECT s3p.record_events('spans', 'job.enqueued', 'available', $1, $2, ARRAY[0], ARRAY['{}'::jsonb])",
    )
    .bind(&ids)
    .bind(&types)
    .fetch_one(&mut db)
    .await
    .expect("record");
    assert_eq!(recorded, 1500);
    let rows: Vec<(i32, bool, Option<i32>)> = sqlx::query_as(
        "SELECT cardinality(job_ids), job_types IS NOT NULL AND job_type IS NULL, attempt
           FROM s3p.events WHERE queue = 'spans' ORDER BY seq",
    )
    .fetch_all(&mut db)
    .await
    .expect("rows");
    assert_eq!(
        rows,
        vec![(1024, true, Some(0)), (476, true, Some(0))],
        "a row of s3p.event_span() events, then the rest; types kept, the attempt held once"
    );

    let events = read_all(&http, "spans", 1000).await;
    let read: Vec<(String, String)> = events
        .iter()
        .map(|e| {
            (
                e["data"]["job_id"].as_str().unwrap_or_default().to_string(),
                e["data"]["job_type"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
            )
        })
        .collect();
    let expected: Vec<(String, String)> = ids
        .iter()
        .zip(&types)
        .map(|(id, t)| (id.to_string(), t.clone()))
        .collect();
    assert_eq!(read, expected, "every event, in the order given");
    let mut event_ids: Vec<&str> = events.iter().filter_map(|e| e["id"].as_str()).collect();
    event_ids.sort();
    event_ids.dedup();
    assert_eq!(event_ids.len(), 1500, "every event has its own id");
    app.stop().await;
}
