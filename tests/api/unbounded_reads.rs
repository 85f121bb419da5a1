//! Lists that grow with use are read a page at a time in SQL, and a `/metrics` scrape reads and
//! exports a bounded amount per queue (#27 item 8). A page looks the same however it was made, so
//! these tests watch its cost: PostgreSQL's cumulative statistics of the tables behind the request
//! (the test's database is its own, and its server runs no maintenance, so nothing else reads
//! them; the setup's few requests may hand over their statistics late, hence some slack). An exact total still counts the list once; what must not grow with the list is the work
//! per entry (lag counted over the ticks, active batches, templates read and sent).

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::json;
use sqlx::{Connection, PgConnection};

use crate::common;

/// Running totals of one table in PostgreSQL's cumulative statistics.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Counters {
    /// Rows read: by sequential scans, and fetched by index scans.
    rows: i64,
    /// Scans started, sequential and index.
    scans: i64,
    /// Blocks of its TOAST table read or found in the buffer cache (values stored out of line).
    toast_blocks: i64,
}

async fn counters(conn: &mut PgConnection, schema: &str, table: &str) -> Counters {
    let (rows, scans, toast_blocks): (i64, i64, i64) = sqlx::query_as(
        "SELECT t.seq_tup_read + coalesce(t.idx_tup_fetch, 0),
                t.seq_scan + coalesce(t.idx_scan, 0),
                coalesce(io.toast_blks_read, 0) + coalesce(io.toast_blks_hit, 0)
           FROM pg_stat_user_tables t JOIN pg_statio_user_tables io USING (relid)
          WHERE t.schemaname = $1 AND t.relname = $2",
    )
    .bind(schema)
    .bind(table)
    .fetch_one(&mut *conn)
    .await
    .unwrap_or_else(|e| panic!("statistics of {schema}.{table}: {e}"));
    Counters {
        rows,
        scans,
        toast_blocks,
    }
}

/// The counters of `tables` once this connection's own work is in them (a backend hands its
/// statistics over when idle, this one at once when asked).
async fn baseline(conn: &mut PgConnection, schema: &str, tables: &[&str]) -> Vec<Counters> {
    sqlx::query("SELECT pg_stat_force_next_flush()")
        .execute(&mut *conn)
        .await
        .expect("flush statistics");
    let mut out = Vec::new();
    for table in tables {
        out.push(counters(conn, schema, table).await);
    }
    out
}

/// The counters of `tables` after the server's backends handed over a request that read at least
/// `rows` rows of `tables[0]` (idle backends do within about 10 s).
async fn after_reading(
    conn: &mut PgConnection,
    schema: &str,
    tables: &[&str],
    before: &[Counters],
    rows: i64,
) -> Vec<Counters> {
    let wanted = before[0].rows + rows;
    common::wait::eventually(
        Duration::from_secs(30),
        &format!("statistics show {rows} rows of {schema}.{} read", tables[0]),
        async || counters(conn, schema, tables[0]).await.rows >= wanted,
    )
    .await;
    let mut out = Vec::new();
    for table in tables {
        out.push(counters(conn, schema, table).await);
    }
    out
}

async fn connect(app: &common::TestApp) -> PgConnection {
    PgConnection::connect(&app.database_url)
        .await
        .expect("connect to the test database")
}

/// 3,001 consumers on ticks with gaps: a page of 10 counts lag over the ticks once and reads the
/// active batches of its 10 consumers, not a count and a batch lookup per consumer of the stream;
/// the pages still walk the whole list in name order with the lag of each consumer right.
#[tokio::test]
async fn a_page_of_consumers_does_per_consumer_work_for_its_page_only() {
    const MORE: i64 = 3000;
    let app = common::spawn_app_with(|s| s.maintenance_interval = None).await;
    let http = common::http::Http::new(&app);
    http.ok_post(
        "/ojs/v1/queues/wide/consumers",
        json!({"consumer": "c00000"}),
    )
    .await;
    let mut conn = connect(&app).await;
    // Ticks 2..=21, two events, a last tick; the new consumers' cursors on the even ticks, and the
    // odd ticks no cursor holds dropped (as retention drops them), so tick ids have gaps.
    sqlx::raw_sql(
        "SELECT s3q_wide.stream_tick(true) FROM generate_series(1, 20);
         SELECT s3p.stream_append('wide', '[{\"type\": \"t\", \"payload\": 1}, {\"type\": \"t\", \"payload\": 2}]');
         SELECT s3q_wide.stream_tick(true);
         INSERT INTO s3q_wide.stream_subscriptions (consumer, last_tick, next_tick)
         SELECT 'c' || lpad(i::text, 5, '0'), t.tick_id, t.tick_id
           FROM generate_series(1, 3000) i
           JOIN (SELECT tick_id, row_number() OVER (ORDER BY tick_id) - 1 AS k, count(*) OVER () AS n
                   FROM s3q_wide.stream_ticks WHERE tick_id % 2 = 0) t ON t.k = i % t.n;
         DELETE FROM s3q_wide.stream_ticks t
          WHERE t.tick_id % 2 = 1 AND t.tick_id < (SELECT max(tick_id) FROM s3q_wide.stream_ticks)
            AND NOT EXISTS (SELECT 1 FROM s3q_wide.stream_subscriptions s WHERE s.last_tick = t.tick_id)",
    )
    .execute(&mut conn)
    .await
    .expect("consumers and ticks");
    let total = MORE + 1;

    let tables = ["stream_subscriptions", "stream_ticks", "stream_batches"];
    let before = baseline(&mut conn, "s3q_wide", &tables).await;
    let page = http.ok_get("/ojs/v1/queues/wide/consumers?limit=10").await;
    let names: Vec<&str> = page["consumers"]
        .as_array()
        .expect("consumers")
        .iter()
        .filter_map(|c| c["consumer"].as_str())
        .collect();
    let first: Vec<String> = (0..10).map(|i| format!("c{i:05}")).collect();
    assert_eq!(names, first, "{page}");
    assert_eq!(page["pagination"]["total"], total, "{page}");
    assert_eq!(page["pagination"]["has_more"], true, "{page}");
    assert_eq!(page["pagination"]["next_cursor"], "c00009", "{page}");
    // The total counts the subscriptions once: wait for that read to show.
    let after = after_reading(&mut conn, "s3q_wide", &tables, &before, total).await;
    let subscription_rows = after[0].rows - before[0].rows;
    let tick_scans = after[1].scans - before[1].scans;
    let batch_scans = after[2].scans - before[2].scans;
    assert!(
        subscription_rows <= total + 100,
        "the subscriptions are read once for the total, then the page: {subscription_rows} rows"
    );
    assert!(
        tick_scans <= 20,
        "the lag of a page is counted over the ticks once, not per consumer: {tick_scans} scans"
    );
    assert!(
        batch_scans <= 40,
        "active batches are looked up for the page only: {batch_scans} scans"
    );

    // The whole list, a page at a time: every consumer once, in name order, each lag right.
    let expected: BTreeMap<String, i64> = sqlx::query_as::<_, (String, i64)>(
        "SELECT s.consumer, (SELECT count(*) FROM s3q_wide.stream_ticks t WHERE t.tick_id > s.last_tick)
           FROM s3q_wide.stream_subscriptions s",
    )
    .fetch_all(&mut conn)
    .await
    .expect("lag by SQL")
    .into_iter()
    .collect();
    let mut seen: Vec<(String, i64)> = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let path = match &cursor {
            Some(c) => format!("/ojs/v1/queues/wide/consumers?limit=1000&cursor={c}"),
            None => "/ojs/v1/queues/wide/consumers?limit=1000".to_string(),
        };
        let page = http.ok_get(&path).await;
        assert_eq!(page["pagination"]["total"], total);
        for c in page["consumers"].as_array().expect("consumers") {
            let name = c["consumer"].as_str().expect("consumer").to_string();
            seen.push((name, c["ticks_behind"].as_i64().expect("ticks_behind")));
        }
        match page["pagination"]["next_cursor"].as_str() {
            Some(next) => cursor = Some(next.to_string()),
            None => break,
        }
    }
    let listed: Vec<(String, i64)> = expected.into_iter().collect();
    assert_eq!(seen.len(), listed.len());
    assert_eq!(
        seen, listed,
        "every consumer once, in name order, its lag right"
    );
    assert!(
        listed.iter().map(|(_, lag)| *lag).max() > listed.iter().map(|(_, lag)| *lag).min(),
        "cursors at different ticks"
    );
    app.stop().await;
}

/// 1,001 cron entries with job templates stored out of line (TOAST): a page of 10 reads 10 or so
/// templates, not every entry's, and the pages walk the whole list.
#[tokio::test]
async fn a_page_of_cron_entries_reads_the_templates_of_its_page_only() {
    let app = common::spawn_app_with(|s| s.maintenance_interval = None).await;
    let http = common::http::Http::new(&app);
    http.ok_post(
        "/ojs/v1/cron",
        json!({"name": "cron-00000", "expression": "0 3 * * *",
               "job_template": {"type": "bulk.t", "args": [], "options": {"queue": "bulk"}}}),
    )
    .await;
    let mut conn = connect(&app).await;
    // Autovacuum would read every TOAST block of the 1,000 inserted templates in the middle of
    // the measurement (the table's statistics count its reads too): not for this test's table.
    sqlx::raw_sql(
        "ALTER TABLE s3p.cron_jobs SET (autovacuum_enabled = false, toast.autovacuum_enabled = false)",
    )
    .execute(&mut conn)
    .await
    .expect("autovacuum off");
    // 6.4 kB of hex per template: too random to compress, so stored out of line.
    sqlx::raw_sql(
        "INSERT INTO s3p.cron_jobs (name, expression, job_template)
         SELECT 'cron-' || lpad(i::text, 5, '0'), '0 3 * * *',
                jsonb_build_object('type', 'bulk.t', 'options', jsonb_build_object('queue', 'bulk'),
                                   'args', jsonb_build_array((SELECT string_agg(md5(random()::text || i || k), '')
                                                                FROM generate_series(1, 200) k)))
           FROM generate_series(1, 1000) i",
    )
    .execute(&mut conn)
    .await
    .expect("cron entries");
    let total = 1001;

    let tables = ["cron_jobs"];
    let before = baseline(&mut conn, "s3p", &tables).await;
    let page = http.ok_get("/ojs/v1/cron?limit=10").await;
    let names: Vec<&str> = page["crons"]
        .as_array()
        .expect("crons")
        .iter()
        .filter_map(|c| c["name"].as_str())
        .collect();
    let first: Vec<String> = (0..10).map(|i| format!("cron-{i:05}")).collect();
    assert_eq!(names, first, "{}", page["pagination"]);
    assert_eq!(page["pagination"]["total"], total);
    assert_eq!(page["pagination"]["has_more"], true);
    assert_eq!(page["pagination"]["next_cursor"], "cron-00009");
    let after = after_reading(&mut conn, "s3p", &tables, &before, total).await;
    let toast_blocks = after[0].toast_blocks - before[0].toast_blocks;
    assert!(
        toast_blocks <= 100,
        "the templates of the page are read, not all {total}: {toast_blocks} TOAST blocks"
    );

    let mut seen = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let path = match &cursor {
            Some(c) => format!("/ojs/v1/cron?limit=400&cursor={c}"),
            None => "/ojs/v1/cron?limit=400".to_string(),
        };
        let page = http.ok_get(&path).await;
        assert_eq!(page["pagination"]["total"], total);
        for c in page["crons"].as_array().expect("crons") {
            seen.push(c["name"].as_str().expect("name").to_string());
        }
        match page["pagination"]["next_cursor"].as_str() {
            Some(next) => cursor = Some(next.to_string()),
            None => break,
        }
    }
    let all: Vec<String> = (0..total).map(|i| format!("cron-{i:05}")).collect();
    assert_eq!(seen, all, "every entry once, in name order");
    app.stop().await;
}

/// One sample of the exposition: name, labels, value.
fn samples(text: &str) -> Vec<(String, BTreeMap<String, String>, f64)> {
    text.lines()
        .filter(|line| !line.starts_with('#'))
        .filter_map(|line| {
            let (series, value) = line.rsplit_once(' ')?;
            let (name, labels) = match series.split_once('{') {
                Some((name, rest)) => (name, rest.strip_suffix('}')?),
                None => (series, ""),
            };
            let labels = labels
                .split("\",")
                .filter(|pair| !pair.is_empty())
                .filter_map(|pair| {
                    let (key, value) = pair.split_once("=\"")?;
                    Some((key.to_string(), value.trim_end_matches('"').to_string()))
                })
                .collect();
            Some((name.to_string(), labels, value.parse().ok()?))
        })
        .collect()
}

/// A queue with 150 consumers: one scrape exports the lag of the 100 furthest behind (exactly
/// theirs), and per queue the number of consumers and the largest lag, so nothing is hidden; it
/// counts the ticks once, not per consumer. A queue with 2 consumers exports both.
#[tokio::test]
async fn a_scrape_exports_the_lag_of_at_most_100_consumers_per_queue_and_the_aggregates() {
    let app = common::spawn_app_with(|s| s.maintenance_interval = None).await;
    let http = common::http::Http::new(&app);
    for (queue, consumer) in [("crowd", "c000"), ("few", "a"), ("few", "b")] {
        http.ok_post(
            &format!("/ojs/v1/queues/{queue}/consumers"),
            json!({"consumer": consumer}),
        )
        .await;
    }
    for n in [1, 2] {
        http.ok_post(
            "/ojs/v1/queues/crowd/messages",
            json!({"type": "t", "payload": n}),
        )
        .await;
    }
    let mut conn = connect(&app).await;
    // Ticks, with events appended between them, and 149 more consumers spread over the ticks.
    sqlx::raw_sql(
        "SELECT s3q_crowd.stream_tick(true) FROM generate_series(1, 5);
         SELECT s3p.stream_append('crowd', '[{\"type\": \"t\", \"payload\": 3}]');
         SELECT s3q_crowd.stream_tick(true) FROM generate_series(1, 5);
         INSERT INTO s3q_crowd.stream_subscriptions (consumer, last_tick, next_tick)
         SELECT 'c' || lpad(i::text, 3, '0'), t.tick_id, t.tick_id
           FROM generate_series(1, 149) i
           JOIN (SELECT tick_id, row_number() OVER (ORDER BY tick_id) - 1 AS k, count(*) OVER () AS n
                   FROM s3q_crowd.stream_ticks) t ON t.k = i % t.n",
    )
    .execute(&mut conn)
    .await
    .expect("ticks and consumers");
    // The lag of each, as the old per-consumer queries counted it, furthest behind first.
    let lag: Vec<(String, i64, i64)> = sqlx::query_as(
        "SELECT s.consumer,
                (SELECT count(*) FROM s3q_crowd.stream_ticks t WHERE t.tick_id > s.last_tick),
                greatest(0, coalesce((SELECT max(seq) FROM s3q_crowd.stream_events), 0)
                            - coalesce((SELECT t.max_seq FROM s3q_crowd.stream_ticks t WHERE t.tick_id = s.last_tick), 0))
           FROM s3q_crowd.stream_subscriptions s ORDER BY s.last_tick, s.consumer",
    )
    .fetch_all(&mut conn)
    .await
    .expect("lag by SQL");
    assert_eq!(lag.len(), 150);

    let tables = ["stream_subscriptions", "stream_ticks"];
    let before = baseline(&mut conn, "s3q_crowd", &tables).await;
    let response = reqwest::get(format!("{}/metrics", app.http_url))
        .await
        .expect("scrape");
    assert!(response.status().is_success());
    let text = response.text().await.expect("exposition");
    let after = after_reading(&mut conn, "s3q_crowd", &tables, &before, 150).await;
    let tick_scans = after[1].scans - before[1].scans;
    assert!(
        tick_scans <= 20,
        "lag is counted over the ticks once, not per consumer: {tick_scans} scans"
    );

    let samples = samples(&text);
    let of = |name: &str, queue: &str| -> Vec<(Option<String>, f64)> {
        samples
            .iter()
            .filter(|(n, labels, _)| {
                n == name && labels.get("queue").map(String::as_str) == Some(queue)
            })
            .map(|(_, labels, value)| (labels.get("consumer").cloned(), *value))
            .collect()
    };
    let expected_ticks: BTreeMap<Option<String>, f64> = lag[..100]
        .iter()
        .map(|(c, ticks, _)| (Some(c.clone()), *ticks as f64))
        .collect();
    let expected_events: BTreeMap<Option<String>, f64> = lag[..100]
        .iter()
        .map(|(c, _, events)| (Some(c.clone()), *events as f64))
        .collect();
    let ticks: BTreeMap<_, _> = of("pgvs3_stream_consumer_lag_ticks", "crowd")
        .into_iter()
        .collect();
    let events: BTreeMap<_, _> = of("pgvs3_stream_consumer_lag_events", "crowd")
        .into_iter()
        .collect();
    assert_eq!(ticks.len(), 100, "{text}");
    assert_eq!(ticks, expected_ticks, "the 100 furthest behind, their lag");
    assert_eq!(
        events, expected_events,
        "the 100 furthest behind, their lag"
    );
    let furthest = &lag[0];
    assert!(furthest.1 > lag[149].1, "consumers at different ticks");
    assert_eq!(of("pgvs3_stream_consumers", "crowd"), [(None, 150.0)]);
    assert_eq!(
        of("pgvs3_stream_consumer_max_lag_ticks", "crowd"),
        [(None, furthest.1 as f64)]
    );
    assert_eq!(
        of("pgvs3_stream_consumer_max_lag_events", "crowd"),
        [(None, furthest.2 as f64)]
    );
    assert!(furthest.2 >= 3, "{furthest:?}");
    assert_eq!(of("pgvs3_stream_consumers", "few"), [(None, 2.0)]);
    assert_eq!(
        of("pgvs3_stream_consumer_lag_ticks", "few").len(),
        2,
        "{text}"
    );
    assert_eq!(
        of("pgvs3_stream_consumer_lag_events", "few").len(),
        2,
        "{text}"
    );
    app.stop().await;
}
