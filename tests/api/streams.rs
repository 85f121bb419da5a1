//! Streams over the HTTP binding, each case on its own server and database (real PostgreSQL):
//! one test per case of `spec/streams.md` "Cases the tests must cover", plus the jobs/streams
//! sharing, long-poll and bad-input cases. A direct SQL connection is used only where a case needs
//! real concurrent transactions, to run a maintenance pass on demand, or to read storage facts.

use crate::common;

use common::codes::error_code;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use sqlx::postgres::PgPoolOptions;
use sqlx::{Connection, PgConnection};
use uuid::Uuid;

// ---------------------------------------------------------------------------------------------
// Helpers

/// The shared HTTP client of one server (60 s timeout), with this module's calls.
#[derive(Clone)]
struct Api(common::http::Http);

impl std::ops::Deref for Api {
    type Target = common::http::Http;

    fn deref(&self) -> &common::http::Http {
        &self.0
    }
}

/// An event as delivered in a batch.
#[derive(Debug, Clone)]
struct Event {
    id: String,
    seq: i64,
    kind: String,
    payload: Value,
    retry_count: i64,
}

impl Api {
    fn new(app: &common::TestApp) -> Api {
        Api(common::http::Http::with_timeout(
            &app.http_url,
            Duration::from_secs(60),
        ))
    }

    /// Appends one message; returns its id and seq.
    async fn append(&self, queue: &str, kind: &str, payload: Value) -> (String, i64) {
        let answer = self
            .ok_post(
                &format!("/ojs/v1/queues/{queue}/messages"),
                json!({"type": kind, "payload": payload}),
            )
            .await;
        (
            answer["id"].as_str().expect("id").to_string(),
            answer["seq"].as_i64().expect("seq"),
        )
    }

    /// Appends messages atomically; returns their ids and seqs in order.
    async fn append_many(&self, queue: &str, messages: Vec<Value>) -> Vec<(String, i64)> {
        let answer = self
            .ok_post(
                &format!("/ojs/v1/queues/{queue}/messages/batch"),
                json!({ "messages": messages }),
            )
            .await;
        answer["messages"]
            .as_array()
            .expect("messages")
            .iter()
            .map(|m| {
                (
                    m["id"].as_str().expect("id").to_string(),
                    m["seq"].as_i64().expect("seq"),
                )
            })
            .collect()
    }

    /// Subscribes; returns the subscription object.
    async fn subscribe(
        &self,
        queue: &str,
        consumer: &str,
        from_tick: Option<i64>,
        cooperative: bool,
    ) -> Value {
        let mut body = json!({"consumer": consumer, "cooperative": cooperative});
        if let Some(tick) = from_tick {
            body["from_tick"] = json!(tick);
        }
        let answer = self
            .ok_post(&format!("/ojs/v1/queues/{queue}/consumers"), body)
            .await;
        answer["consumer"].clone()
    }

    async fn receive_raw(&self, queue: &str, body: Value) -> (StatusCode, Value) {
        self.post(&format!("/ojs/v1/queues/{queue}/receive"), body)
            .await
    }

    /// Receives (200 expected); the batch body, with no `batch_id` when there is nothing.
    async fn receive(&self, queue: &str, consumer: &str, max: i64) -> Value {
        let (status, answer) = self
            .receive_raw(queue, json!({"consumer": consumer, "max": max}))
            .await;
        assert_eq!(
            status,
            StatusCode::OK,
            "receive {queue}/{consumer}: {answer}"
        );
        answer
    }

    /// Receives as a cooperative member.
    async fn receive_member(&self, queue: &str, group: &str, member: &str, max: i64) -> Value {
        let (status, answer) = self
            .receive_raw(
                queue,
                json!({"consumer": group, "member": member, "max": max}),
            )
            .await;
        assert_eq!(
            status,
            StatusCode::OK,
            "receive {queue}/{group}/{member}: {answer}"
        );
        answer
    }

    async fn ack_raw(&self, body: Value) -> (StatusCode, Value) {
        self.post("/ojs/v1/streams/ack", body).await
    }

    /// Acknowledges a batch; returns the cursor tick.
    async fn ack(&self, queue: &str, batch_id: &str) -> i64 {
        let answer = self
            .ok_post(
                "/ojs/v1/streams/ack",
                json!({"queue": queue, "batch_id": batch_id}),
            )
            .await;
        answer["cursor_tick"].as_i64().expect("cursor_tick")
    }

    /// Nacks one message (200 expected); returns the answer.
    async fn nack(
        &self,
        queue: &str,
        batch_id: &str,
        message_id: &str,
        retry_after: &str,
        reason: &str,
    ) -> Value {
        self.ok_post(
            "/ojs/v1/streams/nack",
            json!({"queue": queue, "batch_id": batch_id, "message_id": message_id,
                   "retry_after": retry_after, "reason": reason}),
        )
        .await
    }

    async fn info(&self, queue: &str) -> Value {
        self.ok_get(&format!("/ojs/v1/queues/{queue}/info")).await
    }

    async fn consumers(&self, queue: &str) -> Vec<Value> {
        self.ok_get(&format!("/ojs/v1/queues/{queue}/consumers"))
            .await["consumers"]
            .as_array()
            .expect("consumers")
            .clone()
    }

    async fn consumer(&self, queue: &str, name: &str) -> Value {
        self.consumers(queue)
            .await
            .into_iter()
            .find(|c| c["consumer"] == name)
            .unwrap_or_else(|| panic!("consumer {name} not listed"))
    }

    async fn set_config(&self, queue: &str, body: Value) -> Value {
        self.ok_post(&format!("/ojs/v1/queues/{queue}/config"), body)
            .await
    }

    async fn dead_letters(&self, queue: &str) -> Vec<Value> {
        self.ok_get(&format!("/ojs/v1/queues/{queue}/dlq")).await["dead_letters"]
            .as_array()
            .expect("dead_letters")
            .clone()
    }

    /// Receives and acks until there is nothing; returns the batches.
    async fn drain(&self, queue: &str, consumer: &str, max: i64) -> Vec<Value> {
        let mut batches = Vec::new();
        for _ in 0..10_000 {
            let batch = self.receive(queue, consumer, max).await;
            let Some(id) = batch_id(&batch) else {
                return batches;
            };
            self.ack(queue, &id).await;
            batches.push(batch);
        }
        panic!("{queue}/{consumer} never drained");
    }
}

fn msg(kind: &str, payload: Value) -> Value {
    json!({"type": kind, "payload": payload})
}

fn batch_id(batch: &Value) -> Option<String> {
    batch["batch_id"].as_str().map(str::to_string)
}

fn events(batch: &Value) -> Vec<Event> {
    batch["events"]
        .as_array()
        .map(|events| {
            events
                .iter()
                .map(|e| Event {
                    id: e["id"].as_str().expect("event id").to_string(),
                    seq: e["seq"].as_i64().expect("event seq"),
                    kind: e["type"].as_str().expect("event type").to_string(),
                    payload: e["payload"].clone(),
                    retry_count: e["retry_count"].as_i64().expect("retry_count"),
                })
                .collect()
        })
        .unwrap_or_default()
}

fn ids(batch: &Value) -> Vec<String> {
    events(batch).into_iter().map(|e| e.id).collect()
}

fn all_ids(batches: &[Value]) -> Vec<String> {
    batches.iter().flat_map(ids).collect()
}

/// Every id once: no duplicates.
fn assert_once(seen: &[String], what: &str) -> HashSet<String> {
    let set: HashSet<String> = seen.iter().cloned().collect();
    assert_eq!(
        set.len(),
        seen.len(),
        "{what}: an event was delivered twice"
    );
    set
}

fn int(value: &Value, field: &str) -> i64 {
    value[field]
        .as_i64()
        .unwrap_or_else(|| panic!("{field} is not an integer in {value}"))
}

/// A server with no background maintenance: the test runs its passes itself.
async fn spawn_quiet() -> common::TestApp {
    common::spawn_app_with(|s| s.maintenance_interval = None).await
}

async fn db(app: &common::TestApp) -> PgConnection {
    PgConnection::connect(&app.database_url)
        .await
        .expect("connect to the test database")
}

/// One maintenance pass (what the background task runs).
async fn maintain(conn: &mut PgConnection) {
    let ran: bool = sqlx::query_scalar("SELECT ran FROM s3p.maintain(86400000, 1000)")
        .fetch_one(&mut *conn)
        .await
        .expect("maintenance pass");
    assert!(ran, "the maintenance pass did not run");
}

/// Appends one message through the SQL dispatcher (in whatever transaction `conn` is in).
async fn sql_append(conn: &mut PgConnection, queue: &str, kind: &str) -> (String, i64) {
    let id = Uuid::now_v7();
    let messages = json!([{"id": id, "type": kind, "payload": {"via": "sql"}}]);
    let (event_id, seq): (Uuid, i64) =
        sqlx::query_as("SELECT event_id, seq FROM s3p.stream_append($1, $2)")
            .bind(queue)
            .bind(messages)
            .fetch_one(&mut *conn)
            .await
            .expect("append through SQL");
    (event_id.to_string(), seq)
}

async fn exec(conn: &mut PgConnection, sql: &'static str) {
    sqlx::raw_sql(sql)
        .execute(&mut *conn)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
}

async fn queue_schema(conn: &mut PgConnection, queue: &str) -> String {
    sqlx::query_scalar("SELECT schema_name FROM s3p.queues WHERE name = $1")
        .bind(queue)
        .fetch_one(&mut *conn)
        .await
        .expect("queue schema")
}

/// Storage facts of the three event partitions after ANALYZE: (relname, n_dead_tup, n_tup_ins, bytes).
async fn partition_facts(conn: &mut PgConnection, queue: &str) -> Vec<(String, i64, i64, i64)> {
    let schema = queue_schema(conn, queue).await;
    for n in 0..3 {
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
            "ANALYZE \"{schema}\".stream_events_{n}"
        )))
        .execute(&mut *conn)
        .await
        .expect("analyze");
    }
    exec(conn, "SELECT pg_stat_force_next_flush()").await;
    sqlx::query_as(
        "SELECT relname::text, n_dead_tup, n_tup_ins, pg_relation_size(relid)
           FROM pg_stat_user_tables
          WHERE schemaname = $1 AND relname IN ('stream_events_0', 'stream_events_1', 'stream_events_2')
          ORDER BY relname",
    )
    .bind(&schema)
    .fetch_all(&mut *conn)
    .await
    .expect("pg_stat_user_tables")
}

// ---------------------------------------------------------------------------------------------
// Late commit

/// A transaction that appended before a tick but commits after it is delivered in a later batch,
/// although its seq is lower than delivered ones; also with 120 concurrent open writers, aborted
/// writers (never delivered) and subtransactions (ROLLBACK TO / RELEASE).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn late_commit_is_delivered_in_a_later_batch() {
    let app = spawn_quiet().await;
    let api = Api::new(&app);
    let q = "late";
    api.subscribe(q, "c", None, false).await;

    // One held writer.
    let mut held = db(&app).await;
    let mut tx = held.begin().await.expect("begin");
    let (late_id, late_seq) = sql_append(&mut tx, q, "late.one").await;
    let early = api
        .append_many(
            q,
            vec![
                msg("early.one", json!({"n": 1})),
                msg("early.two", json!({"n": 2})),
            ],
        )
        .await;
    assert!(early.iter().all(|(_, seq)| *seq > late_seq));
    let first = api.receive(q, "c", 100).await;
    let early_ids: Vec<String> = early.iter().map(|(id, _)| id.clone()).collect();
    assert_eq!(
        ids(&first),
        early_ids,
        "the open writer is not in the batch"
    );
    api.ack(q, &batch_id(&first).expect("batch")).await;
    let nothing = api.receive(q, "c", 100).await;
    assert_eq!(batch_id(&nothing), None, "nothing while the writer is open");
    tx.commit().await.expect("commit the late writer");
    let second = api.receive(q, "c", 100).await;
    let late_events = events(&second);
    assert_eq!(
        late_events.iter().map(|e| e.id.clone()).collect::<Vec<_>>(),
        vec![late_id.clone()],
        "the late commit arrives in the next batch"
    );
    assert!(late_events[0].seq < early.iter().map(|(_, s)| *s).max().expect("seq"));
    assert!(int(&second, "start_tick") >= int(&first, "end_tick"));
    api.ack(q, &batch_id(&second).expect("batch")).await;
    assert_eq!(batch_id(&api.receive(q, "c", 100).await), None);
    drop(held);

    // More than 100 concurrent open writers: plain commits, rollbacks and subtransactions.
    const WRITERS: usize = 120;
    let pool = PgPoolOptions::new()
        .max_connections(WRITERS as u32 + 2)
        .acquire_timeout(Duration::from_secs(60))
        .connect(&app.database_url)
        .await
        .expect("writer pool");
    let mut expected: HashSet<String> = HashSet::new();
    let mut never: HashSet<String> = HashSet::new();
    let mut delivered: Vec<Value> = Vec::new();
    // (transaction, commit?, ids delivered if committed, ids never delivered)
    type Open = (
        sqlx::Transaction<'static, sqlx::Postgres>,
        bool,
        Vec<String>,
        Vec<String>,
    );
    let mut open: Vec<Option<Open>> = Vec::with_capacity(WRITERS);
    for i in 0..WRITERS {
        let mut tx = pool.begin().await.expect("begin writer");
        let (commit, good, bad) = match i % 5 {
            0 => {
                let (a, _) = sql_append(&mut tx, q, "w.commit").await;
                (true, vec![a], vec![])
            }
            1 => {
                let (a, _) = sql_append(&mut tx, q, "w.abort").await;
                (false, vec![], vec![a])
            }
            2 => {
                exec(&mut tx, "SAVEPOINT s").await;
                let (a, _) = sql_append(&mut tx, q, "w.sub.rolled-back").await;
                exec(&mut tx, "ROLLBACK TO SAVEPOINT s").await;
                let (b, _) = sql_append(&mut tx, q, "w.after-sub").await;
                (true, vec![b], vec![a])
            }
            3 => {
                exec(&mut tx, "SAVEPOINT s").await;
                let (a, _) = sql_append(&mut tx, q, "w.sub.released").await;
                exec(&mut tx, "RELEASE SAVEPOINT s").await;
                (true, vec![a], vec![])
            }
            _ => {
                let (a, _) = sql_append(&mut tx, q, "w.abort-all").await;
                exec(&mut tx, "SAVEPOINT s").await;
                let (b, _) = sql_append(&mut tx, q, "w.abort-all").await;
                exec(&mut tx, "RELEASE SAVEPOINT s").await;
                (false, vec![], vec![a, b])
            }
        };
        open.push(Some((tx, commit, good, bad)));
        if i % 30 == 29 {
            // Appends, receives and acks while the writers stay open (ticks with them in flight).
            let (id, _) = api.append(q, "http.mid", json!({"i": i})).await;
            expected.insert(id);
            delivered.extend(api.drain(q, "c", 1000).await);
        }
    }
    let open_backends: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND state = 'idle in transaction'",
    )
    .fetch_one(&pool)
    .await
    .expect("pg_stat_activity");
    assert!(
        open_backends >= WRITERS as i64,
        "{open_backends} writers open"
    );
    // Finish them in a scrambled order, receiving in between.
    for k in 0..WRITERS {
        let index = (k * 37 + 11) % WRITERS;
        let (tx, commit, good, bad) = open[index].take().expect("still open");
        if commit {
            tx.commit().await.expect("commit writer");
            expected.extend(good);
        } else {
            tx.rollback().await.expect("roll back writer");
        }
        never.extend(bad);
        if k % 20 == 19 {
            let (id, _) = api.append(q, "http.mid", json!({"k": k})).await;
            expected.insert(id);
            delivered.extend(api.drain(q, "c", 1000).await);
        }
    }
    pool.close().await;
    delivered.extend(api.drain(q, "c", 1000).await);

    let seen = assert_once(&all_ids(&delivered), "fan-out consumer");
    let missing: Vec<_> = expected.difference(&seen).collect();
    assert!(
        missing.is_empty(),
        "committed but never delivered: {missing:?}"
    );
    let leaked: Vec<_> = seen.intersection(&never).collect();
    assert!(leaked.is_empty(), "aborted but delivered: {leaked:?}");
    assert_eq!(seen.len(), expected.len(), "only committed events");
    // The seq is not a cursor: some batch holds an event older (lower seq) than one delivered before.
    let mut highest = 0;
    let mut lower_later = false;
    for batch in &delivered {
        let batch_events = events(batch);
        if batch_events.iter().any(|e| e.seq < highest) {
            lower_later = true;
        }
        highest = highest.max(batch_events.iter().map(|e| e.seq).max().unwrap_or(0));
    }
    assert!(lower_later, "late commits came after higher sequences");
}

// ---------------------------------------------------------------------------------------------
// Same-transaction append and receive; rolled-back append

/// A batch lists its events in seq order even where the log's txid order differs: a transaction
/// that took its id first but appended last is read first from the txid index, and the receive
/// (and a later read of the batch) must still answer it after the earlier append, over both
/// protocols.
#[tokio::test]
async fn a_batch_is_in_seq_order_when_an_older_transaction_appends_last() {
    let app = spawn_quiet().await;
    let api = Api::new(&app);
    let q = "txorder";
    api.subscribe(q, "c", None, false).await;
    let mut older = db(&app).await;
    let mut newer = db(&app).await;

    let mut tx = older.begin().await.expect("begin");
    exec(&mut tx, "SELECT pg_current_xact_id()").await;
    let (first, first_seq) = sql_append(&mut newer, q, "order.first").await;
    let (second, second_seq) = sql_append(&mut tx, q, "order.second").await;
    tx.commit().await.expect("commit");
    assert!(first_seq < second_seq, "seqs {first_seq} then {second_seq}");

    let batch = api.receive(q, "c", 100).await;
    assert_eq!(ids(&batch), vec![first.clone(), second.clone()], "{batch}");
    let id = batch_id(&batch).expect("a batch");
    let again = api
        .ok_get(&format!("/ojs/v1/queues/{q}/batches/{id}"))
        .await;
    assert_eq!(ids(&again), vec![first.clone(), second.clone()], "{again}");

    // gRPC: the same active batch again by receive, and by GetBatch.
    use pgvs3::grpc::proto::pgvs3::v1 as pb;
    let mut grpc = common::grpc::streams(&app.grpc_url).await;
    let grpc_ids = |batch: Option<pb::Batch>| -> Vec<String> {
        batch
            .expect("a batch")
            .events
            .into_iter()
            .map(|e| e.id)
            .collect()
    };
    let received = grpc
        .receive(pb::ReceiveRequest {
            queue: q.into(),
            consumer: "c".into(),
            ..Default::default()
        })
        .await
        .expect("gRPC receive")
        .into_inner()
        .batch;
    assert_eq!(grpc_ids(received), vec![first.clone(), second.clone()]);
    let got = grpc
        .get_batch(pb::GetBatchRequest {
            queue: q.into(),
            batch_id: id,
        })
        .await
        .expect("gRPC GetBatch")
        .into_inner()
        .batch;
    assert_eq!(grpc_ids(got), vec![first, second]);
}

/// An append and a receive in the same SQL transaction see nothing (the receive must not take a
/// tick whose snapshot counts its own uncommitted transaction as visible); the event is delivered
/// once after commit; a rolled-back append is never delivered.
#[tokio::test]
async fn append_and_receive_in_one_transaction_see_nothing() {
    let app = spawn_quiet().await;
    let api = Api::new(&app);
    let q = "same";
    api.subscribe(q, "c", None, false).await;
    api.append("other", "other.warm", json!({})).await;
    let mut conn = db(&app).await;
    let receive_sql = "SELECT unnest(event_ids) FROM s3p.stream_receive('same', 'c', NULL, 100, gen_random_uuid())";

    // Quiet cluster.
    let mut tx = conn.begin().await.expect("begin");
    let (own_quiet, _) = sql_append(&mut tx, q, "same.quiet").await;
    let rows: Vec<Option<Uuid>> = sqlx::query_scalar(receive_sql)
        .fetch_all(&mut *tx)
        .await
        .expect("receive in the appending transaction");
    assert!(
        rows.is_empty(),
        "receive in the appending transaction saw {rows:?}"
    );
    tx.commit().await.expect("commit");
    let batches = api.drain(q, "c", 100).await;
    assert_eq!(
        all_ids(&batches),
        vec![own_quiet],
        "delivered once after commit"
    );

    // Another transaction (on another queue) commits between the append and the receive, so the
    // appending transaction's own xid is below the receive's snapshot xmax.
    let mut tx = conn.begin().await.expect("begin");
    let (own_busy, _) = sql_append(&mut tx, q, "same.busy").await;
    api.append("other", "other.one", json!({})).await;
    let rows: Vec<Option<Uuid>> = sqlx::query_scalar(receive_sql)
        .fetch_all(&mut *tx)
        .await
        .expect("receive in the appending transaction");
    assert!(
        rows.is_empty(),
        "receive in the appending transaction (after another commit) saw {rows:?}"
    );
    tx.commit().await.expect("commit");
    let batches = api.drain(q, "c", 100).await;
    assert_eq!(
        all_ids(&batches),
        vec![own_busy],
        "delivered once after commit"
    );

    // A rolled-back append is never delivered.
    let mut tx = conn.begin().await.expect("begin");
    let (rolled, _) = sql_append(&mut tx, q, "same.rolled").await;
    tx.rollback().await.expect("rollback");
    let (after, _) = api.append(q, "same.after", json!({})).await;
    maintain(&mut conn).await;
    let delivered = all_ids(&api.drain(q, "c", 100).await);
    assert_eq!(delivered, vec![after]);
    assert!(!delivered.contains(&rolled));
    // A later subscriber from the oldest tick does not see it either.
    api.subscribe(q, "replayer", Some(0), false).await;
    let replayed = all_ids(&api.drain(q, "replayer", 100).await);
    assert!(
        !replayed.contains(&rolled),
        "rolled-back append replayed: {replayed:?}"
    );
    assert_eq!(replayed.len(), 3, "three committed events: {replayed:?}");
}

// ---------------------------------------------------------------------------------------------
// Redelivery of the active batch

/// A receive and an ack that wait on a queue being dropped answer 404 once the drop commits, on a
/// gateway that knows the queue's schema (its statements go straight to the queue's functions and
/// then find the tables gone by OID), not a backend error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn receive_and_ack_waiting_on_a_dropping_queue_answer_404() {
    let app = spawn_quiet().await;
    let api = Api::new(&app);
    let q = "dropping";
    api.subscribe(q, "c", None, false).await;
    api.append(q, "drop.one", json!({})).await;
    let batch = api.receive(q, "c", 100).await;
    let id = batch_id(&batch).expect("batch");

    let commit = common::db::hold_drop(&app.database_url, q).await;
    let ((received, receive_body), (acked, ack_body), ()) = tokio::join!(
        api.receive_raw(q, json!({"consumer": "c", "max": 100})),
        api.ack_raw(json!({"queue": q, "batch_id": id, "consumer": "c"})),
        commit
    );
    assert_eq!(received, StatusCode::NOT_FOUND, "{receive_body}");
    assert_eq!(error_code(&receive_body), "not_found", "{receive_body}");
    assert_eq!(acked, StatusCode::NOT_FOUND, "{ack_body}");
    assert_eq!(error_code(&ack_body), "not_found", "{ack_body}");
}

/// The catalog's stream routes (info, consumers, a batch, dead letters, append, subscribe) waiting
/// on a queue being dropped answer as if they came after the drop: 404 for what needs the queue,
/// and an append or subscribe makes the queue anew; never a backend error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stream_routes_waiting_on_a_dropping_queue_answer_after_it() {
    let app = spawn_quiet().await;
    let api = Api::new(&app);
    let q = "dropping-catalog";
    api.subscribe(q, "c", None, false).await;
    api.append(q, "drop.one", json!({})).await;
    let batch = api.receive(q, "c", 100).await;
    let id = batch_id(&batch).expect("batch");

    let commit = common::db::hold_drop(&app.database_url, q).await;
    let paths = [
        format!("/ojs/v1/queues/{q}/info"),
        format!("/ojs/v1/queues/{q}/consumers"),
        format!("/ojs/v1/queues/{q}/batches/{id}"),
        format!("/ojs/v1/queues/{q}/dlq"),
        format!("/ojs/v1/queues/{q}/messages"),
    ];
    let (info, consumers, got_batch, dlq, appended, subscribed, ()) = tokio::join!(
        api.get(&paths[0]),
        api.get(&paths[1]),
        api.get(&paths[2]),
        api.get(&paths[3]),
        api.post(
            &paths[4],
            json!({"type": "drop.after", "payload": {"n": 1}})
        ),
        api.post(&paths[1], json!({"consumer": "d", "from_tick": 0})),
        commit
    );
    for (route, (status, body)) in [
        ("info", &info),
        ("consumers", &consumers),
        ("batch", &got_batch),
        ("dlq", &dlq),
    ] {
        assert_eq!(*status, StatusCode::NOT_FOUND, "{route}: {body}");
        assert_eq!(error_code(body), "not_found", "{route}: {body}");
    }
    assert!(appended.0.is_success(), "append: {}", appended.1);
    assert!(subscribed.0.is_success(), "subscribe: {}", subscribed.1);
    // Both went to the queue made anew: it holds the new consumer and the appended message only.
    let info = api.ok_get(&paths[0]).await;
    assert_eq!(info["events"], 1, "{info}");
    let listed = api.ok_get(&paths[1]).await;
    let names: Vec<&str> = listed["consumers"]
        .as_array()
        .expect("consumers")
        .iter()
        .filter_map(|c| c["consumer"].as_str())
        .collect();
    assert_eq!(names, vec!["d"], "{listed}");
}

/// Receive without ack returns the same batch (same id, same events); two concurrent receives of
/// one consumer get one batch, not two.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn receive_without_ack_returns_the_same_batch() {
    let app = spawn_quiet().await;
    let api = Api::new(&app);
    let q = "again";
    api.subscribe(q, "c", None, false).await;
    api.append_many(
        q,
        (0..5).map(|i| msg("again.one", json!({"i": i}))).collect(),
    )
    .await;
    let first = api.receive(q, "c", 100).await;
    let id = batch_id(&first).expect("batch");
    assert_eq!(int(&first, "count"), 5);
    // More events arrive; the active batch is still the same.
    api.append(q, "again.more", json!({})).await;
    for _ in 0..3 {
        let again = api.receive(q, "c", 100).await;
        assert_eq!(batch_id(&again).as_deref(), Some(id.as_str()));
        assert_eq!(ids(&again), ids(&first));
        assert_eq!(again["start_tick"], first["start_tick"]);
        assert_eq!(again["end_tick"], first["end_tick"]);
    }
    let inspected = api
        .ok_get(&format!("/ojs/v1/queues/{q}/batches/{id}"))
        .await;
    assert_eq!(ids(&inspected), ids(&first));
    assert_eq!(inspected["state"], "active");
    api.ack(q, &id).await;

    // Two concurrent receives by one consumer, repeatedly.
    for round in 0..10 {
        api.append(q, "again.race", json!({"round": round})).await;
        let (a, b) = tokio::join!(api.receive(q, "c", 100), api.receive(q, "c", 100));
        let (ida, idb) = (
            batch_id(&a).expect("batch a"),
            batch_id(&b).expect("batch b"),
        );
        assert_eq!(ida, idb, "round {round}: two batches for one consumer");
        assert_eq!(ids(&a), ids(&b));
        let listed = api.consumer(q, "c").await;
        assert_eq!(
            listed["active_batches"].as_array().expect("batches").len(),
            1
        );
        assert_eq!(int(&api.info(q).await, "active_batches"), 1);
        api.ack(q, &ida).await;
    }
    assert_eq!(batch_id(&api.receive(q, "c", 100).await), None);
}

// ---------------------------------------------------------------------------------------------
// batch_too_large

/// `max` smaller than the next tick answers 413 batch_too_large and changes nothing; afterwards no
/// event is lost or skipped.
#[tokio::test]
async fn max_smaller_than_the_next_tick_is_413_and_nothing_is_lost() {
    let app = spawn_quiet().await;
    let api = Api::new(&app);
    let q = "toolarge";
    api.subscribe(q, "ticker", None, false).await;
    let c = api.subscribe(q, "c", None, false).await;
    let start = int(&c, "last_tick");
    let mut appended: Vec<String> = Vec::new();
    // Tick 1: 10 events; tick 2: 3 events (the ticker's receives create the ticks).
    appended.extend(
        api.append_many(
            q,
            (0..10).map(|i| msg("big.one", json!({"i": i}))).collect(),
        )
        .await
        .into_iter()
        .map(|(id, _)| id),
    );
    assert_eq!(all_ids(&api.drain(q, "ticker", 100).await).len(), 10);
    for i in 0..3 {
        appended.push(api.append(q, "small.one", json!({"i": i})).await.0);
    }
    assert_eq!(all_ids(&api.drain(q, "ticker", 100).await).len(), 3);

    for max in [1, 5, 9] {
        let (status, answer) = api
            .receive_raw(q, json!({"consumer": "c", "max": max}))
            .await;
        assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE, "max {max}: {answer}");
        assert_eq!(error_code(&answer), "batch_too_large");
        // The answer names the ceilings a retry needs: the next tick's events and bytes.
        let details = &answer["error"]["details"];
        assert_eq!(details["next_tick_events"], 10, "{answer}");
        assert_eq!(details["next_tick_bytes"], 10 * 8, "{answer}");
        let listed = api.consumer(q, "c").await;
        assert_eq!(int(&listed, "last_tick"), start, "cursor unchanged");
        assert!(
            listed["active_batches"]
                .as_array()
                .expect("batches")
                .is_empty()
        );
    }
    // A ceiling that fits the first tick but not both: exactly the first tick.
    let first = api.receive(q, "c", 12).await;
    assert_eq!(ids(&first), appended[..10].to_vec());
    api.ack(q, &batch_id(&first).expect("batch")).await;
    let second = api.receive(q, "c", 5).await;
    assert_eq!(ids(&second), appended[10..].to_vec());
    api.ack(q, &batch_id(&second).expect("batch")).await;
    assert_eq!(batch_id(&api.receive(q, "c", 100).await), None);

    // An on-demand tick larger than max: 413, then a larger ceiling gets all of it.
    let more: Vec<String> = api
        .append_many(q, (0..7).map(|i| msg("big.two", json!({"i": i}))).collect())
        .await
        .into_iter()
        .map(|(id, _)| id)
        .collect();
    let (status, answer) = api.receive_raw(q, json!({"consumer": "c", "max": 3})).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE, "{answer}");
    let rest = all_ids(&api.drain(q, "c", 7).await);
    assert_eq!(rest, more);
}

// ---------------------------------------------------------------------------------------------
// Bounded ticks

/// Receives without `max` (the stream's tick_max_events, 1,000) until `want` events came; every
/// answer is 200 with at most 1,000 events. Returns the ids in delivery order.
async fn receive_all_on_default_ceiling(
    api: &Api,
    q: &str,
    consumer: &str,
    want: usize,
) -> Vec<String> {
    let mut seen = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(120);
    while seen.len() < want {
        assert!(
            Instant::now() < deadline,
            "{consumer} got {} of {want}",
            seen.len()
        );
        let (status, batch) = api.receive_raw(q, json!({"consumer": consumer})).await;
        assert_eq!(status, StatusCode::OK, "{consumer}: {batch}");
        let Some(id) = batch_id(&batch) else {
            tokio::time::sleep(Duration::from_millis(5)).await;
            continue;
        };
        let got = ids(&batch);
        assert!(got.len() <= 1000, "{consumer}: a batch of {}", got.len());
        seen.extend(got);
        api.ack(q, &id).await;
    }
    seen
}

/// Appends that come faster than the consumers receive (four appenders, bursts of up to 1,000,
/// no receive in between, no maintenance pass, no manual tick) never stall a consumer on its
/// default ceiling: the receives cut ticks of at most 1,000 events, a consumer receiving during
/// the burst and one starting after it both get every event once, with no 413; a transaction
/// that appended before the burst and commits after it is delivered too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_appends_never_stalls_consumers_on_their_default_ceiling() {
    let app = spawn_quiet().await;
    let api = Api::new(&app);
    let q = "burst";
    api.subscribe(q, "during", None, false).await;
    api.subscribe(q, "after", None, false).await;

    let mut held = db(&app).await;
    let mut tx = held.begin().await.expect("begin");
    let (late_id, _) = sql_append(&mut tx, q, "burst.late").await;

    let sizes = [1000, 300, 300, 700, 1, 1000, 999, 2];
    let per_appender: usize = sizes.iter().sum();
    let mut appenders = Vec::new();
    for a in 0..4 {
        let api = api.clone();
        appenders.push(tokio::spawn(async move {
            let mut ids = Vec::new();
            for (n, size) in sizes.iter().enumerate() {
                let batch = (0..*size)
                    .map(|i| msg("burst.one", json!({"a": a, "n": n, "i": i})))
                    .collect();
                ids.extend(
                    api.append_many(q, batch)
                        .await
                        .into_iter()
                        .map(|(id, _)| id),
                );
            }
            ids
        }));
    }
    let total = 4 * per_appender + 1;
    let during = {
        let api = api.clone();
        tokio::spawn(async move { receive_all_on_default_ceiling(&api, q, "during", total).await })
    };
    let mut appended = HashSet::new();
    for appender in appenders {
        appended.extend(appender.await.expect("appender"));
    }
    assert_eq!(appended.len(), 4 * per_appender);
    tx.commit().await.expect("commit the late append");
    appended.insert(late_id.clone());

    let during = during.await.expect("consumer during the burst");
    let after = receive_all_on_default_ceiling(&api, q, "after", total).await;
    for (name, seen) in [("during", during), ("after", after)] {
        assert_eq!(assert_once(&seen, name), appended, "{name}");
    }
    // Nothing is left, and no tick the receives cut holds more than 1,000 events.
    for consumer in ["during", "after"] {
        assert_eq!(batch_id(&api.receive(q, consumer, 1).await), None);
    }
    let mut conn = db(&app).await;
    let schema = queue_schema(&mut conn, q).await;
    let largest: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT max(added) FROM \"{schema}\".stream_ticks"
    )))
    .fetch_one(&mut conn)
    .await
    .expect("largest tick");
    assert!(largest <= 1000, "a tick of {largest} events");
}

/// The tick bounds are per queue (`tick_max_events`, `tick_max_bytes` in the queue config; the
/// default receive ceiling follows): ticks hold whole transactions within them, one over them
/// stands alone (a default receive answers 413 naming it; a larger max gets it), and transactions
/// still open at a cut, or left out of it by the bound, come in a later tick: none is skipped or
/// delivered twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ticks_are_cut_to_the_configured_bounds_and_skip_no_late_commit() {
    let app = spawn_quiet().await;
    let api = Api::new(&app);
    let q = "bounded";
    api.subscribe(q, "c", None, false).await;
    let config = api
        .set_config(
            q,
            json!({"tick_max_events": 250, "tick_max_bytes": 1_000_000}),
        )
        .await;
    assert_eq!(int(&config, "tick_max_events"), 250, "{config}");
    assert_eq!(int(&config, "tick_max_bytes"), 1_000_000, "{config}");
    let hundred = |tag: &'static str| {
        (0..100)
            .map(move |i| msg("bounded.one", json!({"tag": tag, "i": i})))
            .collect::<Vec<_>>()
    };
    let append = |tag: &'static str| {
        let api = api.clone();
        async move {
            api.append_many(q, hundred(tag))
                .await
                .into_iter()
                .map(|(id, _)| id)
                .collect::<Vec<_>>()
        }
    };
    // A held writer open across the first cut.
    let mut held = db(&app).await;
    let mut t0 = held.begin().await.expect("begin");
    let mut t0_ids = Vec::new();
    for _ in 0..100 {
        t0_ids.push(sql_append(&mut t0, q, "bounded.held").await.0);
    }
    let a1 = append("a1").await;
    let a2 = append("a2").await;
    let a3 = append("a3").await;
    // The first cut: a1 + a2 (a3 would pass 250); t0 is still open.
    let first = api.receive_raw(q, json!({"consumer": "c"})).await.1;
    assert_eq!(ids(&first), [a1.clone(), a2.clone()].concat());
    api.ack(q, &batch_id(&first).expect("batch")).await;
    t0.commit().await.expect("commit t0");
    // Next: t0 (a late commit, lower txid) + a3; then nothing more.
    let second = api.receive_raw(q, json!({"consumer": "c"})).await.1;
    let mut got = ids(&second);
    got.sort();
    let mut want = [t0_ids.clone(), a3.clone()].concat();
    want.sort();
    assert_eq!(got, want);
    api.ack(q, &batch_id(&second).expect("batch")).await;

    // Two writers open across a cut, both committing 200 events: one tick can take one of them
    // only, the other comes in the tick after.
    let (mut w1, mut w2) = (db(&app).await, db(&app).await);
    let (mut t1, mut t2) = (
        w1.begin().await.expect("begin"),
        w2.begin().await.expect("begin"),
    );
    let mut open_ids = HashSet::new();
    for _ in 0..200 {
        open_ids.insert(sql_append(&mut t1, q, "bounded.t1").await.0);
        open_ids.insert(sql_append(&mut t2, q, "bounded.t2").await.0);
    }
    let a4 = append("a4").await;
    let third = api.receive_raw(q, json!({"consumer": "c"})).await.1;
    assert_eq!(ids(&third), a4);
    api.ack(q, &batch_id(&third).expect("batch")).await;
    t1.commit().await.expect("commit t1");
    t2.commit().await.expect("commit t2");
    let mut sizes = Vec::new();
    let mut seen = Vec::new();
    for batch in api.drain(q, "c", 250).await {
        sizes.push(ids(&batch).len());
        seen.extend(ids(&batch));
    }
    assert_eq!(sizes, [200, 200]);
    assert_eq!(assert_once(&seen, "t1 and t2"), open_ids);

    // A transaction over the bound stands alone: a default receive answers 413 naming its size,
    // a ceiling that fits gets exactly it, then the rest comes within the bound.
    let big: Vec<String> = api
        .append_many(
            q,
            (0..600)
                .map(|i| msg("bounded.big", json!({"i": i})))
                .collect(),
        )
        .await
        .into_iter()
        .map(|(id, _)| id)
        .collect();
    let a5 = append("a5").await;
    let (status, answer) = api.receive_raw(q, json!({"consumer": "c"})).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE, "{answer}");
    assert_eq!(
        answer["error"]["details"]["next_tick_events"], 600,
        "{answer}"
    );
    let whole = api.receive(q, "c", 600).await;
    assert_eq!(ids(&whole), big);
    api.ack(q, &batch_id(&whole).expect("batch")).await;
    let rest = api.receive_raw(q, json!({"consumer": "c"})).await.1;
    assert_eq!(ids(&rest), a5);
    api.ack(q, &batch_id(&rest).expect("batch")).await;

    // The byte bound: 100 events of 1,011 bytes each, appended one by one, in ticks of 9 (9,099
    // bytes; a 10th would pass 10,000).
    api.set_config(q, json!({"tick_max_bytes": 10_000})).await;
    let mut padded = Vec::new();
    for _ in 0..100 {
        padded.push(
            api.append(q, "bounded.pad", json!({"pad": "x".repeat(1000)}))
                .await
                .0,
        );
    }
    let mut sizes = Vec::new();
    let mut seen = Vec::new();
    for batch in api.drain(q, "c", 9).await {
        sizes.push(ids(&batch).len());
        seen.extend(ids(&batch));
    }
    assert_eq!(seen, padded);
    assert!(sizes.iter().all(|n| *n <= 9), "{sizes:?}");

    for bad in [
        json!({"tick_max_events": 0}),
        json!({"tick_max_events": 10_001}),
        json!({"tick_max_bytes": 0}),
        json!({"tick_max_bytes": 16 * 1024 * 1024 + 1}),
    ] {
        let (status, answer) = api
            .post(&format!("/ojs/v1/queues/{q}/config"), bad.clone())
            .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{bad}: {answer}");
    }
}

/// A message dead-lettered after max_retries says why, with or without a nack reason.
#[tokio::test]
async fn dead_letters_say_retries_were_exhausted() {
    let app = spawn_quiet().await;
    let api = Api::new(&app);
    let mut conn = db(&app).await;
    let q = "whydead";
    api.subscribe(q, "c", None, false).await;
    api.set_config(q, json!({"max_retries": 1})).await;
    let (silent, _) = api.append(q, "why.silent", json!({"n": 1})).await;
    let (told, _) = api.append(q, "why.told", json!({"n": 2})).await;
    for _ in 0..2 {
        let batch = api.receive(q, "c", 100).await;
        let id = batch_id(&batch).expect("batch");
        let (status, answer) = api
            .post(
                "/ojs/v1/streams/nack",
                json!({"queue": q, "batch_id": id, "message_id": silent, "retry_after": "0s"}),
            )
            .await;
        assert_eq!(status, StatusCode::OK, "{answer}");
        api.nack(q, &id, &told, "0s", "downstream said no").await;
        api.ack(q, &id).await;
        maintain(&mut conn).await;
    }
    let letters = api.dead_letters(q).await;
    let reason = |message: &str| {
        letters
            .iter()
            .find(|l| l["message_id"] == message)
            .map(|l| l["reason"].clone())
            .unwrap_or_else(|| panic!("{message} is not dead-lettered: {letters:?}"))
    };
    assert_eq!(
        reason(&silent),
        "retries exhausted after 1 retries (max_retries 1)"
    );
    assert_eq!(
        reason(&told),
        "retries exhausted after 1 retries (max_retries 1): downstream said no"
    );
}

/// `max_bytes` bounds a batch by its events' bytes (payload and headers as JSON text) the way
/// `max` bounds it by count: a next tick alone over it is 413 and changes nothing, merging stops
/// before it, and it must lie in 1..=16 MiB.
#[tokio::test]
async fn max_bytes_bounds_a_batch_and_nothing_is_lost() {
    let app = spawn_quiet().await;
    let api = Api::new(&app);
    let q = "toobig";
    api.subscribe(q, "ticker", None, false).await;
    let c = api.subscribe(q, "c", None, false).await;
    let start = int(&c, "last_tick");
    // Each payload is {"pad": "x..x"} with 1,000 x's: 1,011 bytes as JSON text.
    let padded = |_| msg("padded", json!({"pad": "x".repeat(1000)}));
    // Tick 1: 4 events (4,044 bytes); tick 2: 2 events (2,022 bytes).
    let mut appended: Vec<String> = api
        .append_many(q, (0..4).map(padded).collect())
        .await
        .into_iter()
        .map(|(id, _)| id)
        .collect();
    assert_eq!(all_ids(&api.drain(q, "ticker", 100).await).len(), 4);
    appended.extend(
        api.append_many(q, (0..2).map(padded).collect())
            .await
            .into_iter()
            .map(|(id, _)| id),
    );
    assert_eq!(all_ids(&api.drain(q, "ticker", 100).await).len(), 2);

    for max_bytes in [1, 1011, 4043] {
        let (status, answer) = api
            .receive_raw(
                q,
                json!({"consumer": "c", "max": 100, "max_bytes": max_bytes}),
            )
            .await;
        assert_eq!(
            status,
            StatusCode::PAYLOAD_TOO_LARGE,
            "max_bytes {max_bytes}: {answer}"
        );
        assert_eq!(error_code(&answer), "batch_too_large");
        assert!(
            answer["error"]["message"]
                .as_str()
                .is_some_and(|m| m.contains("max_bytes")),
            "{answer}"
        );
        assert_eq!(int(&api.consumer(q, "c").await, "last_tick"), start);
    }
    for max_bytes in [0, 16 * 1024 * 1024 + 1] {
        let (status, answer) = api
            .receive_raw(q, json!({"consumer": "c", "max_bytes": max_bytes}))
            .await;
        assert_eq!(
            status,
            StatusCode::BAD_REQUEST,
            "max_bytes {max_bytes}: {answer}"
        );
    }
    // A budget that fits the first tick but not both: exactly the first tick.
    let (status, first) = api
        .receive_raw(q, json!({"consumer": "c", "max": 100, "max_bytes": 6065}))
        .await;
    assert_eq!(status, StatusCode::OK, "{first}");
    assert_eq!(ids(&first), appended[..4].to_vec());
    api.ack(q, &batch_id(&first).expect("batch")).await;
    // Without max_bytes the 16 MiB default applies: the rest.
    let second = api.receive(q, "c", 100).await;
    assert_eq!(ids(&second), appended[4..].to_vec());
    api.ack(q, &batch_id(&second).expect("batch")).await;
    assert_eq!(batch_id(&api.receive(q, "c", 100).await), None);

    // Both ticks within one budget: merged into one batch.
    let d = api.subscribe(q, "d", Some(start), false).await;
    assert_eq!(int(&d, "last_tick"), start);
    let (status, both) = api
        .receive_raw(q, json!({"consumer": "d", "max": 100, "max_bytes": 6066}))
        .await;
    assert_eq!(status, StatusCode::OK, "{both}");
    assert_eq!(ids(&both), appended);
}

/// A page of stream dead letters stops before its entries pass 16 MiB (the first always comes)
/// and says where the next page starts; the last page says nothing more.
#[tokio::test]
async fn dead_letter_pages_stop_at_sixteen_mib() {
    let app = spawn_quiet().await;
    let api = Api::new(&app);
    let q = "bigdead";
    api.subscribe(q, "c", None, false).await;
    let mut conn = db(&app).await;
    let schema = queue_schema(&mut conn, q).await;
    // 20 dead letters of 1 MiB each, written directly: making them through 20 nacks of 1 MiB
    // messages would only slow the test down.
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "INSERT INTO {schema}.stream_dead_letters (id, event_id, consumer, type, payload, retry_count, reason, failed_at)
         SELECT gen_random_uuid(), gen_random_uuid(), 'c', 'big', jsonb_build_object('pad', repeat('x', 1048576)),
                1, 'test', now() + g * interval '1 ms'
           FROM generate_series(1, 20) g"
    )))
    .execute(&mut conn)
    .await
    .expect("dead letters");
    let (status, page) = api.get(&format!("/ojs/v1/queues/{q}/dlq?limit=100")).await;
    assert_eq!(status, StatusCode::OK);
    let first = page["dead_letters"].as_array().expect("entries").len();
    // 1 MiB + 11 bytes each: 15 fit in 16 MiB, the 16th would not.
    assert_eq!(first, 15, "entries in the first page");
    assert_eq!(page["next_offset"], json!(15));
    let (status, page) = api
        .get(&format!("/ojs/v1/queues/{q}/dlq?limit=100&offset=15"))
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(page["dead_letters"].as_array().expect("entries").len(), 5);
    assert!(page.get("next_offset").is_none_or(Value::is_null), "{page}");
}

/// An append whose events could print past what one receive answers (16 MiB, as PostgreSQL
/// prints the stored jsonb) is refused whole: a transaction is never split across ticks, so no
/// consumer could ever receive it. Numbers written with an exponent are what grow: `1e300` prints
/// in 301 digits. Over HTTP and gRPC; nothing refused is stored, and the bound the check uses is
/// at least what PostgreSQL prints for each of a set of awkward payloads.
#[tokio::test]
async fn appends_that_no_receive_could_answer_are_refused() {
    use pgvs3::grpc::proto::pgvs3::v1 as s3;
    let app = spawn_quiet().await;
    let api = Api::new(&app);
    let q = "inflating";
    api.subscribe(q, "c", None, false).await;
    let raw_append = |body: String| {
        api.client
            .post(format!("{}/ojs/v1/queues/{q}/messages", api.base))
            .header("content-type", "application/json")
            .body(body)
            .send()
    };
    // Under 1 MiB as sent, about 51 MB as printed.
    let huge = vec!["1e300"; 170_000].join(",");
    let answer = raw_append(format!(r#"{{"type": "big", "payload": [{huge}]}}"#))
        .await
        .expect("send");
    assert_eq!(answer.status(), StatusCode::PAYLOAD_TOO_LARGE);
    let body: Value = answer.json().await.expect("JSON");
    assert_eq!(body["error"]["details"]["field"], "messages", "{body}");
    // Tiny exponents grow as much: 1e-16000 prints in 16,002 characters.
    let tiny = vec!["1e-16000"; 1_100].join(",");
    let answer = raw_append(format!(r#"{{"type": "tiny", "payload": [{tiny}]}}"#))
        .await
        .expect("send");
    assert_eq!(answer.status(), StatusCode::PAYLOAD_TOO_LARGE);
    let mut streams = common::grpc::streams(&app.grpc_url).await;
    let number = |n: f64| prost_types::Value {
        kind: Some(prost_types::value::Kind::NumberValue(n)),
    };
    let status = streams
        .append(s3::AppendRequest {
            queue: q.into(),
            messages: vec![s3::Message {
                r#type: "big".into(),
                payload: Some(prost_types::Value {
                    kind: Some(prost_types::value::Kind::ListValue(
                        prost_types::ListValue {
                            values: vec![number(1e300); 90_000],
                        },
                    )),
                }),
                ..Default::default()
            }],
        })
        .await
        .expect_err("a payload printing past 16 MiB is refused");
    assert_eq!(status.code(), tonic::Code::ResourceExhausted, "{status:?}");

    let awkward = [
        "[1e300, -1.5e-300, 0.1e5, 12E+3, 1.0, -0, 123456789012345678901234567890]",
        r#"{"a":[1,2,{"b":null}],"c":"x\"y","d":true,"e":false}"#,
        r#"["\u00e9\/\n", "é", "", {}, [], 5e-7, 2.5E2]"#,
        "1e-400",
    ];
    let mut conn = db(&app).await;
    let schema = queue_schema(&mut conn, q).await;
    for text in awkward {
        let answer = raw_append(format!(r#"{{"type": "odd", "payload": {text}}}"#))
            .await
            .expect("send");
        assert_eq!(answer.status(), StatusCode::CREATED, "{text}");
        let appended: Value = answer.json().await.expect("JSON");
        let id = appended["id"].as_str().expect("id").to_string();
        let printed: i32 = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
            "SELECT octet_length(payload::text) FROM {schema}.stream_events WHERE event_id = $1::uuid"
        )))
        .bind(&id)
        .fetch_one(&mut conn)
        .await
        .expect("stored");
        let bound = pgvs3::core::json_text::jsonb_text_bound(text);
        assert!(
            u64::try_from(printed).expect("length") <= bound,
            "{text}: {printed} > {bound}"
        );
    }
    let stored: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT count(*) FROM {schema}.stream_events"
    )))
    .fetch_one(&mut conn)
    .await
    .expect("count");
    assert_eq!(stored, i64::try_from(awkward.len()).expect("count"));
}

/// Replaying all dead letters goes in transactions of at most one tick's worth, oldest first: a
/// transaction's events are never split across ticks, so one larger replay could never be
/// received. 25 dead letters with ticks of at most 10 events come back in batches of at most 10.
#[tokio::test]
async fn replaying_all_dead_letters_stays_receivable() {
    let app = spawn_quiet().await;
    let api = Api::new(&app);
    let q = "replaychunks";
    api.subscribe(q, "c", None, false).await;
    api.set_config(q, json!({"tick_max_events": 10})).await;
    let mut conn = db(&app).await;
    let schema = queue_schema(&mut conn, q).await;
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "INSERT INTO {schema}.stream_dead_letters (id, event_id, consumer, type, payload, retry_count, reason, failed_at)
         SELECT gen_random_uuid(), gen_random_uuid(), 'c', 'dead', jsonb_build_object('n', g),
                1, 'test', now() - interval '1 hour' + g * interval '1 ms'
           FROM generate_series(1, 25) g"
    )))
    .execute(&mut conn)
    .await
    .expect("dead letters");
    let replayed = api
        .ok_post(&format!("/ojs/v1/queues/{q}/dlq/replay"), json!({}))
        .await;
    assert_eq!(replayed["replayed"], 25, "{replayed}");
    let mut order = Vec::new();
    while order.len() < 25 {
        let batch = api.receive(q, "c", 10).await;
        let got = events(&batch);
        assert!(!got.is_empty() && got.len() <= 10, "{batch}");
        order.extend(got.iter().map(|e| e.payload["n"].as_i64().expect("n")));
        api.ack(q, &batch_id(&batch).expect("batch")).await;
    }
    assert_eq!(order, (1..=25).collect::<Vec<i64>>());
}

/// Due retries move back into the log at most one tick's worth per maintenance step, as replays
/// do: 25 retries due at once, with ticks of at most 10 events, come back in batches of at most 10
/// (one transaction of 25 would be a tick no receive with max 10 could take).
#[tokio::test]
async fn due_retries_come_back_receivable() {
    let app = spawn_quiet().await;
    let api = Api::new(&app);
    let q = "retrychunks";
    api.subscribe(q, "c", None, false).await;
    api.set_config(q, json!({"tick_max_events": 10})).await;
    let mut conn = db(&app).await;
    let schema = queue_schema(&mut conn, q).await;
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "INSERT INTO {schema}.stream_retry_events (event_id, consumer, type, payload, retry_count, reason, due_at)
         SELECT gen_random_uuid(), 'c', 'again', jsonb_build_object('n', g), 1, 'test',
                now() - interval '1 hour' + g * interval '1 ms'
           FROM generate_series(1, 25) g"
    )))
    .execute(&mut conn)
    .await
    .expect("retries");
    let mut order = Vec::new();
    for _ in 0..10 {
        maintain(&mut conn).await;
        loop {
            let batch = api.receive(q, "c", 10).await;
            let Some(id) = batch_id(&batch) else { break };
            let got = events(&batch);
            assert!(got.len() <= 10, "{batch}");
            order.extend(got.iter().map(|e| e.payload["n"].as_i64().expect("n")));
            api.ack(q, &id).await;
        }
        if order.len() == 25 {
            break;
        }
    }
    assert_eq!(order, (1..=25).collect::<Vec<i64>>());
}

/// A dead letter's payload is answered as stored, like a received one: an integer past 2^53 keeps
/// every digit, and a number past a double's range (written by SQL; the API refuses it) does not
/// turn the page into a 500.
#[tokio::test]
async fn dead_letter_payloads_are_answered_as_stored() {
    let app = spawn_quiet().await;
    let api = Api::new(&app);
    let q = "exactdead";
    api.subscribe(q, "c", None, false).await;
    let mut conn = db(&app).await;
    let schema = queue_schema(&mut conn, q).await;
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "INSERT INTO {schema}.stream_dead_letters (id, event_id, consumer, type, payload, retry_count, reason, failed_at)
         VALUES (gen_random_uuid(), gen_random_uuid(), 'c', 'exact', '{{\"n\": 123456789012345678901234567890}}', 1, 'test', now()),
                (gen_random_uuid(), gen_random_uuid(), 'c', 'huge', '{{\"n\": 1e400}}', 1, 'test', now() + interval '1 ms')"
    )))
    .execute(&mut conn)
    .await
    .expect("dead letters");
    let answer = api
        .client
        .get(format!("{}/ojs/v1/queues/{q}/dlq", api.base))
        .send()
        .await
        .expect("dlq");
    assert_eq!(answer.status(), StatusCode::OK);
    // Read as text: a double-based parser would round the first and refuse the second.
    let text = answer.text().await.expect("body");
    assert!(
        text.contains(r#""n": 123456789012345678901234567890}"#),
        "{text}"
    );
    assert!(
        text.contains(r#""n": 1"#) && text.contains(r#""type":"huge""#),
        "{text}"
    );
}

// ---------------------------------------------------------------------------------------------
// Mixed batch: nack one, ack the rest

/// Nack one message (retry_after 0s) and ack the batch: after a maintenance pass only the nacked
/// message comes back, only to that consumer, with retry_count 1; with max_retries 2 it is
/// dead-lettered on the third nack, with its reason and payload.
#[tokio::test]
async fn mixed_batch_nack_one_ack_the_rest() {
    let app = spawn_quiet().await;
    let api = Api::new(&app);
    let mut conn = db(&app).await;
    let q = "mixed";
    api.subscribe(q, "a", None, false).await;
    api.subscribe(q, "b", None, false).await;
    let config = api.set_config(q, json!({"max_retries": 2})).await;
    assert_eq!(int(&config, "max_retries"), 2);
    let appended = api
        .append_many(
            q,
            vec![
                msg("mix.one", json!({"n": 1})),
                msg("mix.two", json!({"n": 2, "keep": "me"})),
                msg("mix.three", json!({"n": 3})),
            ],
        )
        .await;
    let nacked = appended[1].0.clone();
    let batch_a = api.receive(q, "a", 100).await;
    let batch_b = api.receive(q, "b", 100).await;
    assert_eq!(ids(&batch_a).len(), 3);
    assert_eq!(ids(&batch_b).len(), 3);
    let ida = batch_id(&batch_a).expect("batch a");
    let answer = api.nack(q, &ida, &nacked, "0s", "boom 1").await;
    assert_eq!(answer["outcome"], "retry");
    assert_eq!(int(&answer, "retry_count"), 1);
    // The batch stays active for the rest.
    let inspected = api
        .ok_get(&format!("/ojs/v1/queues/{q}/batches/{ida}"))
        .await;
    assert_eq!(inspected["state"], "active");
    // Nacking the same message twice in a batch is a conflict.
    let (status, _) = api
        .post(
            "/ojs/v1/streams/nack",
            json!({"queue": q, "batch_id": ida, "message_id": nacked}),
        )
        .await;
    assert_eq!(status, StatusCode::CONFLICT);
    api.ack(q, &ida).await;
    api.ack(q, &batch_id(&batch_b).expect("batch b")).await;
    assert_eq!(int(&api.info(q).await, "pending_retries"), 1);
    maintain(&mut conn).await;
    assert_eq!(int(&api.info(q).await, "pending_retries"), 0);

    assert_eq!(
        batch_id(&api.receive(q, "b", 100).await),
        None,
        "the consumer that acked never sees the retry"
    );
    for attempt in 1..=2 {
        let retry = api.receive(q, "a", 100).await;
        let retry_events = events(&retry);
        assert_eq!(retry_events.len(), 1, "only the nacked message: {retry}");
        assert_eq!(retry_events[0].id, nacked);
        assert_eq!(retry_events[0].kind, "mix.two");
        assert_eq!(retry_events[0].payload, json!({"n": 2, "keep": "me"}));
        assert_eq!(retry_events[0].retry_count, attempt);
        let id = batch_id(&retry).expect("retry batch");
        let answer = api
            .nack(q, &id, &nacked, "0s", &format!("boom {}", attempt + 1))
            .await;
        if attempt < 2 {
            assert_eq!(answer["outcome"], "retry");
            assert_eq!(int(&answer, "retry_count"), attempt + 1);
        } else {
            assert_eq!(answer["outcome"], "dead_letter", "third nack: {answer}");
        }
        api.ack(q, &id).await;
        maintain(&mut conn).await;
        assert_eq!(batch_id(&api.receive(q, "b", 100).await), None);
    }
    assert_eq!(batch_id(&api.receive(q, "a", 100).await), None);
    let letters = api.dead_letters(q).await;
    assert_eq!(letters.len(), 1, "{letters:?}");
    let letter = &letters[0];
    assert_eq!(letter["message_id"], nacked.as_str());
    assert_eq!(letter["consumer"], "a");
    assert_eq!(letter["type"], "mix.two");
    assert_eq!(
        letter["reason"],
        "retries exhausted after 2 retries (max_retries 2): boom 3"
    );
    assert_eq!(letter["payload"], json!({"n": 2, "keep": "me"}));
    assert_eq!(int(letter, "retry_count"), 2);
    assert_eq!(int(&api.info(q).await, "dead_letters"), 1);
}

// ---------------------------------------------------------------------------------------------
// DLQ

/// Dead letters: inspect, replay one, replay all (to the consumer that gave up only), purge by age.
#[tokio::test]
async fn dead_letters_inspect_replay_and_purge() {
    let app = spawn_quiet().await;
    let api = Api::new(&app);
    let q = "dlq";
    api.subscribe(q, "a", None, false).await;
    api.subscribe(q, "b", None, false).await;
    api.set_config(q, json!({"max_retries": 0})).await;
    let appended: Vec<String> = api
        .append_many(
            q,
            (1..=3).map(|n| msg("dead.one", json!({"n": n}))).collect(),
        )
        .await
        .into_iter()
        .map(|(id, _)| id)
        .collect();
    let batch = api.receive(q, "a", 100).await;
    let id = batch_id(&batch).expect("batch");
    for (n, message) in appended.iter().enumerate() {
        let answer = api
            .nack(q, &id, message, "0s", &format!("reason {}", n + 1))
            .await;
        assert_eq!(answer["outcome"], "dead_letter");
    }
    api.ack(q, &id).await;
    assert_eq!(all_ids(&api.drain(q, "b", 100).await), appended);

    // Inspect.
    let letters = api.dead_letters(q).await;
    assert_eq!(letters.len(), 3);
    for (n, letter) in letters.iter().enumerate() {
        assert_eq!(letter["message_id"], appended[n].as_str());
        assert_eq!(letter["consumer"], "a");
        assert_eq!(letter["type"], "dead.one");
        assert_eq!(letter["payload"], json!({"n": n + 1}));
        assert_eq!(
            letter["reason"],
            format!(
                "retries exhausted after 0 retries (max_retries 0): reason {}",
                n + 1
            )
        );
        assert_eq!(int(letter, "retry_count"), 0);
    }
    let page = api
        .ok_get(&format!("/ojs/v1/queues/{q}/dlq?limit=1&offset=1"))
        .await;
    assert_eq!(page["dead_letters"][0]["message_id"], appended[1].as_str());
    assert_eq!(page["dead_letters"].as_array().expect("page").len(), 1);

    // Replay one.
    let first = letters[0]["id"].as_str().expect("dead letter id");
    let answer = api
        .ok_post(&format!("/ojs/v1/queues/{q}/dlq/{first}/replay"), json!({}))
        .await;
    assert_eq!(int(&answer, "replayed"), 1);
    assert_eq!(api.dead_letters(q).await.len(), 2);
    let replayed = api.receive(q, "a", 100).await;
    let replayed_events = events(&replayed);
    assert_eq!(
        replayed_events.iter().map(|e| &e.id).collect::<Vec<_>>(),
        vec![&appended[0]]
    );
    assert_eq!(replayed_events[0].payload, json!({"n": 1}));
    api.ack(q, &batch_id(&replayed).expect("batch")).await;
    assert_eq!(
        batch_id(&api.receive(q, "b", 100).await),
        None,
        "a replay goes to the consumer that gave up only"
    );
    let (status, _) = api
        .post(
            &format!("/ojs/v1/queues/{q}/dlq/{}/replay", Uuid::new_v4()),
            json!({}),
        )
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    // The same dead letter cannot be replayed twice.
    let (status, _) = api
        .post(&format!("/ojs/v1/queues/{q}/dlq/{first}/replay"), json!({}))
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);

    // Replay all.
    let answer = api
        .ok_post(&format!("/ojs/v1/queues/{q}/dlq/replay"), json!({}))
        .await;
    assert_eq!(int(&answer, "replayed"), 2);
    assert!(api.dead_letters(q).await.is_empty());
    let again = api.receive(q, "a", 100).await;
    let mut again_ids = ids(&again);
    again_ids.sort();
    let mut want = appended[1..].to_vec();
    want.sort();
    assert_eq!(again_ids, want);
    assert_eq!(batch_id(&api.receive(q, "b", 100).await), None);

    // Purge by age: one old dead letter, one new.
    let again_id = batch_id(&again).expect("batch");
    api.nack(q, &again_id, &appended[1], "0s", "old").await;
    api.ack(q, &again_id).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let (fresh, _) = api.append(q, "dead.two", json!({"n": 4})).await;
    let batch = api.receive(q, "a", 100).await;
    let id = batch_id(&batch).expect("batch");
    api.nack(q, &id, &fresh, "0s", "new").await;
    api.ack(q, &id).await;
    assert_eq!(api.dead_letters(q).await.len(), 2);
    let (status, answer) = api
        .delete(&format!("/ojs/v1/queues/{q}/dlq?older_than=720h"))
        .await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    assert_eq!(int(&answer, "purged"), 0);
    let (status, answer) = api
        .delete(&format!("/ojs/v1/queues/{q}/dlq?older_than=1s"))
        .await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    assert_eq!(int(&answer, "purged"), 1);
    let left = api.dead_letters(q).await;
    assert_eq!(left.len(), 1);
    assert_eq!(left[0]["message_id"], fresh.as_str());
    let (status, _) = api
        .delete(&format!("/ojs/v1/queues/{q}/dlq?older_than=banana"))
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
}

// ---------------------------------------------------------------------------------------------
// Fan-out

/// Two consumers each receive every event once; one acking does not move the other.
#[tokio::test]
async fn fan_out_consumers_each_receive_every_event_once() {
    let app = spawn_quiet().await;
    let api = Api::new(&app);
    let q = "fanout";
    let a0 = api.subscribe(q, "a", None, false).await;
    let b0 = api.subscribe(q, "b", None, false).await;
    let b_start = int(&b0, "last_tick");
    assert_eq!(int(&a0, "last_tick"), b_start);
    let mut appended = Vec::new();
    let mut a_seen = Vec::new();
    for round in 0..3 {
        appended.extend(
            api.append_many(
                q,
                (0..10)
                    .map(|i| msg("fan.one", json!({"round": round, "i": i})))
                    .collect(),
            )
            .await
            .into_iter()
            .map(|(id, _)| id),
        );
        a_seen.extend(all_ids(&api.drain(q, "a", 100).await));
        let b = api.consumer(q, "b").await;
        assert_eq!(int(&b, "last_tick"), b_start, "a's acks do not move b");
        assert!(b["active_batches"].as_array().expect("batches").is_empty());
    }
    assert_once(&a_seen, "a");
    assert_eq!(a_seen, appended);
    let a = api.consumer(q, "a").await;
    assert!(int(&a, "last_tick") > b_start);
    assert_eq!(int(&api.consumer(q, "b").await, "ticks_behind"), 3);

    // b catches up tick by tick (max 10), then a has nothing new.
    let b_batches = api.drain(q, "b", 10).await;
    assert_eq!(b_batches.len(), 3);
    let b_seen = all_ids(&b_batches);
    assert_once(&b_seen, "b");
    assert_eq!(b_seen, appended);
    assert_eq!(batch_id(&api.receive(q, "a", 100).await), None);
    assert_eq!(
        int(&api.consumer(q, "a").await, "last_tick"),
        int(&api.consumer(q, "b").await, "last_tick")
    );
}

// ---------------------------------------------------------------------------------------------
// Subscription start

/// from_tick 0 replays everything retained; a positive tick replays from there; the default
/// starts at the latest tick.
#[tokio::test]
async fn subscription_start_from_tick() {
    let app = spawn_quiet().await;
    let api = Api::new(&app);
    let mut conn = db(&app).await;
    let q = "replay";
    let ticker = api.subscribe(q, "ticker", None, false).await;
    let floor = int(&ticker, "last_tick");
    let id = |v: Vec<(String, i64)>| v.into_iter().map(|(id, _)| id).collect::<Vec<_>>();
    let e1 = id(api
        .append_many(
            q,
            (1..=3).map(|n| msg("rep.one", json!({"n": n}))).collect(),
        )
        .await);
    let b1 = api.drain(q, "ticker", 100).await;
    let t1 = int(&b1[0], "end_tick");
    assert_eq!(int(&b1[0], "start_tick"), floor);
    let e2 = id(api
        .append_many(
            q,
            (4..=5).map(|n| msg("rep.one", json!({"n": n}))).collect(),
        )
        .await);
    let b2 = api.drain(q, "ticker", 100).await;
    let t2 = int(&b2[0], "end_tick");
    assert_eq!(int(&b2[0], "start_tick"), t1);
    let (e6, _) = api.append(q, "rep.one", json!({"n": 6})).await;
    let info = api.info(q).await;
    assert_eq!(int(&info, "latest_tick"), t2);
    assert_eq!(int(&info, "oldest_tick"), floor);
    assert_eq!(int(&api.consumer(q, "ticker").await, "last_tick"), t2);

    let dflt = api.subscribe(q, "dflt", None, false).await;
    assert_eq!(int(&dflt, "last_tick"), t2, "default: the latest tick");
    let zero = api.subscribe(q, "zero", Some(0), false).await;
    assert_eq!(
        int(&zero, "last_tick"),
        floor,
        "0: the oldest retained tick"
    );
    let pos = api.subscribe(q, "pos", Some(t1), false).await;
    assert_eq!(int(&pos, "last_tick"), t1);
    // Subscribing again leaves the subscription unchanged (200).
    let (status, again) = api
        .post(
            &format!("/ojs/v1/queues/{q}/consumers"),
            json!({"consumer": "pos", "from_tick": 0}),
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(int(&again["consumer"], "last_tick"), t1);
    assert_eq!(again["consumer"]["created"], false);

    assert_eq!(
        all_ids(&api.drain(q, "dflt", 100).await),
        vec![e6.clone()],
        "events before the latest tick are not delivered to a new default subscriber"
    );
    let all: Vec<String> = e1
        .iter()
        .chain(e2.iter())
        .cloned()
        .chain([e6.clone()])
        .collect();
    assert_eq!(all_ids(&api.drain(q, "zero", 100).await), all);
    let from_t1: Vec<String> = e2.iter().cloned().chain([e6.clone()]).collect();
    assert_eq!(all_ids(&api.drain(q, "pos", 100).await), from_t1);

    // A maintenance pass ticks un-ticked events; a default subscriber after it starts there.
    let (e7, _) = api.append(q, "rep.one", json!({"n": 7})).await;
    let before = int(&api.info(q).await, "latest_tick");
    maintain(&mut conn).await;
    let after = int(&api.info(q).await, "latest_tick");
    assert!(after > before, "the pass created a tick");
    let late = api.subscribe(q, "late", None, false).await;
    assert_eq!(int(&late, "last_tick"), after);
    assert_eq!(batch_id(&api.receive(q, "late", 100).await), None);
    let (e8, _) = api.append(q, "rep.one", json!({"n": 8})).await;
    assert_eq!(all_ids(&api.drain(q, "late", 100).await), vec![e8.clone()]);
    assert_eq!(
        all_ids(&api.drain(q, "zero", 100).await),
        vec![e7.clone(), e8.clone()]
    );
    // A tick that is not retained.
    let (status, answer) = api
        .post(
            &format!("/ojs/v1/queues/{q}/consumers"),
            json!({"consumer": "nowhere", "from_tick": after + 1000}),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{answer}");

    // from_tick 0 also replays the events of the append that created the queue, even when another
    // transaction commits while that append runs (its xid below the floor snapshot's xmax).
    let mut other = db(&app).await;
    let mut tx = conn.begin().await.expect("begin");
    exec(&mut tx, "SELECT pg_current_xact_id()").await;
    exec(&mut other, "SELECT pg_current_xact_id()").await;
    let (born, _) = sql_append(&mut tx, "born", "born.first").await;
    tx.commit().await.expect("commit");
    let (second, _) = api.append("born", "born.second", json!({})).await;
    api.subscribe("born", "zero", Some(0), false).await;
    assert_eq!(
        all_ids(&api.drain("born", "zero", 100).await),
        vec![born, second],
        "from_tick 0 replays the queue's first append"
    );
}

// ---------------------------------------------------------------------------------------------
// Rotation

/// Retention 2s: with no consumers events live between retention and about 1.5x it; a slow
/// consumer pins its segment and later receives every event across at least three rotations;
/// TRUNCATE leaves no dead tuples in the event partitions.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rotation_retention_pinning_and_truncate() {
    let app = spawn_quiet().await;
    let api = Api::new(&app);
    let mut conn = db(&app).await;
    let pass_every = Duration::from_millis(100);

    // No consumers: measure how long events live.
    let idle = "ret-idle";
    api.append(idle, "warm.one", json!({})).await;
    let config = api.set_config(idle, json!({"retention": "2s"})).await;
    assert_eq!(int(&config, "retention_ms"), 2000);
    assert_eq!(int(&api.info(idle).await, "rotation_period_ms"), 1000);
    let deadline = Instant::now() + Duration::from_secs(10);
    while int(&api.info(idle).await, "rotations") < 1 {
        assert!(Instant::now() < deadline, "no first rotation");
        maintain(&mut conn).await;
        tokio::time::sleep(pass_every).await;
    }
    let appended_at = Instant::now();
    let probes = api
        .append_many(
            idle,
            (0..20).map(|i| msg("probe.one", json!({"i": i}))).collect(),
        )
        .await;
    let lifetime = loop {
        maintain(&mut conn).await;
        let info = api.info(idle).await;
        let probes_left = info["min_seq"]
            .as_i64()
            .is_some_and(|min| min <= probes[probes.len() - 1].1);
        if !probes_left {
            break appended_at.elapsed();
        }
        assert!(
            appended_at.elapsed() < Duration::from_secs(10),
            "events outlived 5x retention: {info}"
        );
        tokio::time::sleep(pass_every).await;
    };
    assert!(
        lifetime >= Duration::from_millis(1950),
        "events lived {lifetime:?}, less than the 2s retention"
    );
    assert!(
        lifetime <= Duration::from_millis(3800),
        "events lived {lifetime:?}, more than ~1.5x the 2s retention"
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    while int(&api.info(idle).await, "events") > 0 {
        assert!(Instant::now() < deadline, "events never went");
        maintain(&mut conn).await;
        tokio::time::sleep(pass_every).await;
    }

    // A slow consumer.
    let q = "ret-slow";
    api.subscribe(q, "fast", None, false).await;
    api.subscribe(q, "slow", None, false).await;
    api.set_config(q, json!({"retention": "2s"})).await;
    let mut appended: Vec<String> = Vec::new();
    let mut fast_seen: Vec<String> = Vec::new();
    let mut slow_seen: Vec<String> = Vec::new();
    let first_seq = {
        let batch = api
            .append_many(
                q,
                (0..5).map(|i| msg("slow.one", json!({"i": i}))).collect(),
            )
            .await;
        appended.extend(batch.iter().map(|(id, _)| id.clone()));
        batch[0].1
    };
    // Phase 1: the slow consumer does nothing for more than 2x the retention.
    let phase1 = Instant::now();
    while phase1.elapsed() < Duration::from_millis(4500) {
        appended.extend(
            api.append_many(
                q,
                (0..5).map(|i| msg("slow.one", json!({"i": i}))).collect(),
            )
            .await
            .into_iter()
            .map(|(id, _)| id),
        );
        fast_seen.extend(all_ids(&api.drain(q, "fast", 10_000).await));
        maintain(&mut conn).await;
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
    let info = api.info(q).await;
    let pinned_rotations = int(&info, "rotations");
    assert!(
        pinned_rotations <= 2,
        "rotation truncated the slow consumer's segment: {info}"
    );
    assert_eq!(
        int(&info, "min_seq"),
        first_seq,
        "the slow consumer's first events are retained past 2x retention: {info}"
    );
    // Phase 2: the slow consumer takes a batch, holds it ~1s, acks, repeats; it keeps lagging.
    let mut held: Option<(String, Instant)> = None;
    let mut lagging_rotations = 0;
    let mut last_rotations = pinned_rotations;
    let phase2 = Instant::now();
    while lagging_rotations < 3 {
        assert!(
            phase2.elapsed() < Duration::from_secs(40),
            "only {lagging_rotations} rotations while the slow consumer lagged: {}",
            api.info(q).await
        );
        appended.extend(
            api.append_many(
                q,
                (0..5).map(|i| msg("slow.one", json!({"i": i}))).collect(),
            )
            .await
            .into_iter()
            .map(|(id, _)| id),
        );
        fast_seen.extend(all_ids(&api.drain(q, "fast", 10_000).await));
        match &held {
            None => {
                let batch = api.receive(q, "slow", 10_000).await;
                if let Some(id) = batch_id(&batch) {
                    slow_seen.extend(ids(&batch));
                    held = Some((id, Instant::now()));
                }
            }
            Some((id, since)) if since.elapsed() >= Duration::from_millis(1000) => {
                api.ack(q, id).await;
                held = None;
            }
            Some(_) => {}
        }
        maintain(&mut conn).await;
        let info = api.info(q).await;
        let rotations = int(&info, "rotations");
        if rotations > last_rotations {
            let slow = api.consumer(q, "slow").await;
            let behind = int(&slow, "last_tick") < int(&info, "latest_tick") || held.is_some();
            if behind {
                lagging_rotations += rotations - last_rotations;
            }
            last_rotations = rotations;
        }
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
    if let Some((id, _)) = held.take() {
        api.ack(q, &id).await;
    }
    slow_seen.extend(all_ids(&api.drain(q, "slow", 10_000).await));
    fast_seen.extend(all_ids(&api.drain(q, "fast", 10_000).await));
    let want: HashSet<String> = appended.iter().cloned().collect();
    assert_eq!(
        assert_once(&slow_seen, "slow"),
        want,
        "the slow consumer lost events"
    );
    assert_eq!(assert_once(&fast_seen, "fast"), want);
    assert!(int(&api.info(q).await, "rotations") >= pinned_rotations + 3);

    // TRUNCATE: no dead tuples in any event partition, though many rows passed through.
    tokio::time::sleep(Duration::from_millis(1200)).await;
    for queue in [idle, q] {
        let facts = partition_facts(&mut conn, queue).await;
        assert_eq!(facts.len(), 3, "{facts:?}");
        for (relname, dead, _, _) in &facts {
            assert_eq!(*dead, 0, "{queue}.{relname} has dead tuples: {facts:?}");
        }
        assert!(facts.iter().map(|f| f.2).sum::<i64>() > 0, "{facts:?}");
    }
    let idle_facts = partition_facts(&mut conn, idle).await;
    assert!(
        idle_facts.iter().all(|f| f.3 == 0),
        "truncated partitions are empty files: {idle_facts:?}"
    );
}

// ---------------------------------------------------------------------------------------------
// Cooperative members

/// Concurrent member receives get distinct batches; out-of-order acks advance the group cursor
/// only over the contiguous prefix; a crashed member's batch pins retention until acked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cooperative_members() {
    let app = spawn_quiet().await;
    let api = Api::new(&app);
    let mut conn = db(&app).await;
    let q = "coop";
    let group = api.subscribe(q, "g", None, true).await;
    assert_eq!(group["cooperative"], true);
    let start = int(&group, "last_tick");
    // Four ticks of five events each (a maintenance pass ticks them).
    let mut appended = Vec::new();
    for round in 0..4 {
        appended.extend(
            api.append_many(
                q,
                (0..5)
                    .map(|i| msg("coop.one", json!({"round": round, "i": i})))
                    .collect(),
            )
            .await
            .into_iter()
            .map(|(id, _)| id),
        );
        maintain(&mut conn).await;
    }
    // A member receive on a non-cooperative consumer is a bad request.
    api.subscribe(q, "plain", None, false).await;
    let (status, _) = api
        .receive_raw(q, json!({"consumer": "plain", "member": "m1"}))
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    // It would pin retention below; the group is the only consumer from here on.
    let (status, _) = api
        .delete(&format!("/ojs/v1/queues/{q}/consumers/plain"))
        .await;
    assert_eq!(status, StatusCode::OK);

    let (b1, b2, b3, b4) = tokio::join!(
        api.receive_member(q, "g", "m1", 5),
        api.receive_member(q, "g", "m2", 5),
        api.receive_member(q, "g", "m3", 5),
        api.receive_member(q, "g", "m4", 5),
    );
    let mut batches = vec![b1, b2, b3, b4];
    let batch_ids: HashSet<String> = batches
        .iter()
        .map(|b| batch_id(b).expect("each member gets a batch"))
        .collect();
    assert_eq!(batch_ids.len(), 4, "distinct batches");
    let seen = assert_once(&all_ids(&batches), "members");
    assert_eq!(seen, appended.iter().cloned().collect::<HashSet<_>>());
    assert!(batches.iter().all(|b| ids(b).len() == 5));
    // A member asking again gets its own batch again; a fifth member gets nothing.
    let again = api
        .receive_member(q, "g", batches[0]["member"].as_str().expect("member"), 5)
        .await;
    assert_eq!(batch_id(&again), batch_id(&batches[0]));
    assert_eq!(batch_id(&api.receive_member(q, "g", "m5", 5).await), None);

    // Out-of-order acks.
    batches.sort_by_key(|b| int(b, "start_tick"));
    assert_eq!(int(&batches[0], "start_tick"), start);
    for pair in batches.windows(2) {
        assert_eq!(int(&pair[0], "end_tick"), int(&pair[1], "start_tick"));
    }
    let bid = |i: usize| batch_id(&batches[i]).expect("batch");
    let cursor = |v: Value| int(&v, "last_tick");
    api.ack(q, &bid(2)).await;
    assert_eq!(cursor(api.consumer(q, "g").await), start, "gap before 3rd");
    api.ack(q, &bid(0)).await;
    assert_eq!(
        cursor(api.consumer(q, "g").await),
        int(&batches[0], "end_tick"),
        "prefix: the 1st batch"
    );
    api.ack(q, &bid(3)).await;
    assert_eq!(
        cursor(api.consumer(q, "g").await),
        int(&batches[0], "end_tick"),
        "still a gap at the 2nd"
    );
    let moved = api.ack(q, &bid(1)).await;
    assert_eq!(moved, int(&batches[3], "end_tick"), "the whole prefix");
    assert_eq!(cursor(api.consumer(q, "g").await), moved);
    let (status, _) = api.ack_raw(json!({"queue": q, "batch_id": bid(1)})).await;
    assert_eq!(status, StatusCode::CONFLICT, "acked twice");

    // A crashed member pins retention until its batch is acked.
    api.set_config(q, json!({"retention": "2s"})).await;
    let crashed: Vec<String> = api
        .append_many(
            q,
            (0..5).map(|i| msg("coop.crash", json!({"i": i}))).collect(),
        )
        .await
        .into_iter()
        .map(|(id, _)| id)
        .collect();
    let crash = api.receive_member(q, "g", "crash", 100).await;
    assert_eq!(ids(&crash), crashed);
    let crash_id = batch_id(&crash).expect("crash batch");
    let crash_max_seq = events(&crash).iter().map(|e| e.seq).max().expect("seq");
    let rotations_at_crash = int(&api.info(q).await, "rotations");
    let mut worker_seen = Vec::new();
    let mut worker_appended = Vec::new();
    let pinned_since = Instant::now();
    while pinned_since.elapsed() < Duration::from_millis(4500) {
        worker_appended.extend(
            api.append_many(
                q,
                (0..3).map(|i| msg("coop.work", json!({"i": i}))).collect(),
            )
            .await
            .into_iter()
            .map(|(id, _)| id),
        );
        loop {
            let batch = api.receive_member(q, "g", "worker", 10_000).await;
            let Some(id) = batch_id(&batch) else { break };
            worker_seen.extend(ids(&batch));
            api.ack(q, &id).await;
        }
        maintain(&mut conn).await;
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
    assert_eq!(worker_seen, worker_appended, "the worker got the rest");
    let info = api.info(q).await;
    assert!(
        int(&info, "rotations") - rotations_at_crash <= 2,
        "rotated past the crashed member's segment: {info}"
    );
    assert!(
        int(&info, "min_seq") <= crash_max_seq,
        "the crashed batch's events were truncated: {info}"
    );
    let inspected = api
        .ok_get(&format!("/ojs/v1/queues/{q}/batches/{crash_id}"))
        .await;
    assert_eq!(ids(&inspected), crashed, "the crashed batch is intact");
    assert!(cursor(api.consumer(q, "g").await) <= int(&crash, "start_tick"));
    // Once acked, the cursor moves over everything and rotation resumes.
    let moved = api.ack(q, &crash_id).await;
    assert_eq!(moved, int(&api.consumer(q, "g").await, "next_tick"));
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        api.append(q, "coop.work", json!({})).await;
        loop {
            let batch = api.receive_member(q, "g", "worker", 10_000).await;
            let Some(id) = batch_id(&batch) else { break };
            api.ack(q, &id).await;
        }
        maintain(&mut conn).await;
        let info = api.info(q).await;
        if int(&info, "min_seq") > crash_max_seq {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the acked crash batch's segment never rotated: {info}"
        );
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
}

// ---------------------------------------------------------------------------------------------
// Concurrency

/// Several producers (HTTP, and SQL transactions that commit or roll back) and consumers
/// (fan-out and a cooperative group) with rotations forced during the run: every consumer sees
/// every committed event at least once and never a rolled-back one; afterwards the event
/// partitions hold no dead tuples.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_producers_and_consumers_with_rotations() {
    let app = spawn_quiet().await;
    let api = Api::new(&app);
    let q = "storm";
    let fan_out = ["c1", "c2", "c3"];
    for c in fan_out {
        api.subscribe(q, c, None, false).await;
    }
    api.subscribe(q, "grp", None, true).await;
    api.set_config(q, json!({"retention": "1s"})).await;
    let rotations_before = int(&api.info(q).await, "rotations");

    let stop = Arc::new(AtomicBool::new(false));
    let producing = Arc::new(AtomicUsize::new(6));
    let maintainer = {
        let stop = stop.clone();
        let mut conn = db(&app).await;
        tokio::spawn(async move {
            let mut passes = 0;
            while !stop.load(Ordering::SeqCst) {
                maintain(&mut conn).await;
                passes += 1;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            passes
        })
    };

    let mut producers = Vec::new();
    for p in 0..4 {
        let api = api.clone();
        let producing = producing.clone();
        producers.push(tokio::spawn(async move {
            let mut committed = Vec::new();
            for round in 0..40 {
                let batch = api
                    .append_many(
                        q,
                        (0..12)
                            .map(|i| msg("storm.http", json!({"p": p, "round": round, "i": i})))
                            .collect(),
                    )
                    .await;
                committed.extend(batch.into_iter().map(|(id, _)| id));
                tokio::time::sleep(Duration::from_millis(40)).await;
            }
            producing.fetch_sub(1, Ordering::SeqCst);
            (committed, Vec::new())
        }));
    }
    for p in 0..2 {
        let producing = producing.clone();
        let mut conn = db(&app).await;
        producers.push(tokio::spawn(async move {
            let mut committed = Vec::new();
            let mut rolled_back = Vec::new();
            for round in 0..60 {
                let mut tx = conn.begin().await.expect("begin");
                let mut mine = Vec::new();
                let mut lost = Vec::new();
                for _ in 0..4 {
                    mine.push(sql_append(&mut tx, q, "storm.sql").await.0);
                }
                if round % 4 == 1 {
                    exec(&mut tx, "SAVEPOINT s").await;
                    lost.push(sql_append(&mut tx, q, "storm.sub").await.0);
                    exec(&mut tx, "ROLLBACK TO SAVEPOINT s").await;
                }
                tokio::time::sleep(Duration::from_millis(15)).await;
                if (round + p) % 3 == 0 {
                    tx.rollback().await.expect("rollback");
                    rolled_back.extend(mine);
                } else {
                    tx.commit().await.expect("commit");
                    committed.extend(mine);
                }
                rolled_back.extend(lost);
            }
            producing.fetch_sub(1, Ordering::SeqCst);
            (committed, rolled_back)
        }));
    }

    let mut consumers = Vec::new();
    let readers: Vec<(&str, Option<&str>)> = fan_out
        .iter()
        .map(|c| (*c, None))
        .chain([("grp", Some("m1")), ("grp", Some("m2"))])
        .collect();
    for (consumer, member) in readers {
        let api = api.clone();
        let producing = producing.clone();
        consumers.push(tokio::spawn(async move {
            let mut seen = Vec::new();
            loop {
                let done = producing.load(Ordering::SeqCst) == 0;
                let mut body = json!({"consumer": consumer, "max": 10_000});
                if let Some(member) = member {
                    body["member"] = json!(member);
                }
                let (status, batch) = api.receive_raw(q, body).await;
                assert_eq!(status, StatusCode::OK, "{consumer}/{member:?}: {batch}");
                match batch_id(&batch) {
                    Some(id) => {
                        seen.extend(ids(&batch));
                        api.ack(q, &id).await;
                    }
                    None if done => break,
                    None => tokio::time::sleep(Duration::from_millis(10)).await,
                }
            }
            (consumer.to_string(), seen)
        }));
    }

    let mut committed: HashSet<String> = HashSet::new();
    let mut rolled_back: HashSet<String> = HashSet::new();
    for producer in producers {
        let (good, bad) = producer.await.expect("producer");
        committed.extend(good);
        rolled_back.extend(bad);
    }
    let mut seen_by: HashMap<String, HashSet<String>> = HashMap::new();
    for consumer in consumers {
        let (name, seen) = consumer.await.expect("consumer");
        seen_by.entry(name).or_default().extend(seen);
    }
    stop.store(true, Ordering::SeqCst);
    let passes = maintainer.await.expect("maintainer");
    assert!(committed.len() >= 2000, "{} committed", committed.len());
    assert!(!rolled_back.is_empty());
    for (name, seen) in &seen_by {
        let missing = committed.difference(seen).count();
        assert_eq!(missing, 0, "{name} missed {missing} committed events");
        let leaked: Vec<_> = seen.intersection(&rolled_back).collect();
        assert!(
            leaked.is_empty(),
            "{name} saw rolled-back events {leaked:?}"
        );
        let unknown = seen.difference(&committed).count();
        assert_eq!(unknown, 0, "{name} saw {unknown} unknown events");
    }
    assert_eq!(seen_by.len(), 4);
    let info = api.info(q).await;
    let rotations_during = int(&info, "rotations") - rotations_before;
    assert!(
        rotations_during >= 2,
        "only {rotations_during} rotations in {passes} passes during the run: {info}"
    );

    // Afterwards: the rolled-back rows are dead tuples until their segments are truncated.
    let mut conn = db(&app).await;
    let facts = partition_facts(&mut conn, q).await;
    assert!(
        facts.iter().map(|f| f.1).sum::<i64>() > 0,
        "rolled-back appends left dead tuples before rotation: {facts:?}"
    );
    // With the consumers gone, rotation empties every partition: no dead tuples anywhere.
    for name in seen_by.keys() {
        let (status, _) = api
            .delete(&format!("/ojs/v1/queues/{q}/consumers/{name}"))
            .await;
        assert_eq!(status, StatusCode::OK);
    }
    let target = int(&api.info(q).await, "rotations") + 3;
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        maintain(&mut conn).await;
        let info = api.info(q).await;
        if int(&info, "rotations") >= target && int(&info, "events") == 0 {
            break;
        }
        assert!(Instant::now() < deadline, "rotation stalled: {info}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let facts = partition_facts(&mut conn, q).await;
    for (relname, dead, _, bytes) in &facts {
        assert_eq!(*dead, 0, "{relname} has dead tuples: {facts:?}");
        assert_eq!(*bytes, 0, "{relname} is not empty: {facts:?}");
    }
}

// ---------------------------------------------------------------------------------------------
// Jobs and streams share a queue

/// In the spirit of TestIntegrationJobAndStreamShareQueue: one queue serves job workers and
/// stream consumers at once; neither view sees the other's data; the queue is listed once.
#[tokio::test]
async fn jobs_and_streams_share_a_queue() {
    let app = spawn_quiet().await;
    let api = Api::new(&app);
    let mut conn = db(&app).await;
    let q = "shared";
    // The job view creates the queue; the stream view uses it.
    let mut job_ids = Vec::new();
    for i in 0..3 {
        let answer = api
            .ok_post(
                "/ojs/v1/jobs",
                json!({"type": "shared.job", "args": [i], "options": {"queue": q}}),
            )
            .await;
        job_ids.push(answer["job"]["id"].as_str().expect("job id").to_string());
    }
    api.subscribe(q, "c", None, false).await;
    let message_ids: Vec<String> = api
        .append_many(
            q,
            (0..3)
                .map(|i| msg("shared.event", json!({"i": i})))
                .collect(),
        )
        .await
        .into_iter()
        .map(|(id, _)| id)
        .collect();
    maintain(&mut conn).await;

    // Work both.
    let fetched = api
        .ok_post("/ojs/v1/workers/fetch", json!({"queues": [q], "count": 10}))
        .await;
    let jobs = fetched["jobs"].as_array().expect("jobs").clone();
    let mut fetched_ids: Vec<String> = jobs
        .iter()
        .map(|j| j["id"].as_str().expect("id").to_string())
        .collect();
    fetched_ids.sort();
    let mut want_jobs = job_ids.clone();
    want_jobs.sort();
    assert_eq!(fetched_ids, want_jobs, "the job view holds only the jobs");
    assert!(jobs.iter().all(|j| j["type"] == "shared.job"));
    let batch = api.receive(q, "c", 100).await;
    assert_eq!(
        ids(&batch),
        message_ids,
        "the stream holds only the messages"
    );
    assert!(events(&batch).iter().all(|e| e.kind == "shared.event"));
    for job in &jobs {
        let answer = api
            .ok_post(
                "/ojs/v1/workers/ack",
                json!({"job_id": job["id"], "lease_token": job["lease_token"], "result": {"ok": true}}),
            )
            .await;
        assert_eq!(answer["state"], "completed", "{answer}");
    }
    api.ack(q, &batch_id(&batch).expect("batch")).await;
    maintain(&mut conn).await;

    // Neither view sees the other's data afterwards.
    for id in &message_ids {
        let (status, _) = api.get(&format!("/ojs/v1/jobs/{id}")).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "a message is not a job");
    }
    for id in &job_ids {
        let (status, answer) = api.get(&format!("/ojs/v1/jobs/{id}")).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(answer["job"]["state"], "completed");
    }
    let fetched = api
        .ok_post("/ojs/v1/workers/fetch", json!({"queues": [q], "count": 10}))
        .await;
    assert!(fetched["jobs"].as_array().expect("jobs").is_empty());
    assert_eq!(batch_id(&api.receive(q, "c", 100).await), None);
    let info = api.info(q).await;
    assert_eq!(
        int(&info, "events"),
        3,
        "jobs are not stream events: {info}"
    );
    assert_eq!(int(&info, "consumers"), 1);
    // A new job after stream traffic is still only a job.
    api.ok_post(
        "/ojs/v1/jobs",
        json!({"type": "shared.job", "args": [9], "options": {"queue": q}}),
    )
    .await;
    assert_eq!(batch_id(&api.receive(q, "c", 100).await), None);
    assert_eq!(int(&api.info(q).await, "events"), 3);

    let (status, queues) = api.get("/ojs/v1/queues").await;
    assert_eq!(status, StatusCode::OK);
    let listed = queues["queues"]
        .as_array()
        .expect("queues")
        .iter()
        .filter(|entry| entry["name"] == q)
        .count();
    assert_eq!(listed, 1, "the queue is listed once: {queues}");
}

// ---------------------------------------------------------------------------------------------
// Long poll

/// wait_ms wakes soon after an append; an idle poll returns empty after about its wait_ms and
/// creates no tick.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_poll_wakes_on_append_and_idles_without_a_tick() {
    let app = spawn_quiet().await;
    let api = Api::new(&app);
    let q = "poll";
    api.subscribe(q, "c", None, false).await;
    let poller = {
        let api = api.clone();
        tokio::spawn(async move {
            let started = Instant::now();
            let (status, batch) = api
                .receive_raw(q, json!({"consumer": "c", "wait_ms": 3000}))
                .await;
            (status, batch, Instant::now(), started)
        })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    let appended_at = Instant::now();
    let (id, _) = api.append(q, "poll.one", json!({})).await;
    let (status, batch, answered_at, started) = poller.await.expect("poller");
    assert_eq!(status, StatusCode::OK, "{batch}");
    assert_eq!(ids(&batch), vec![id]);
    let woke = answered_at.duration_since(appended_at);
    assert!(
        woke < Duration::from_millis(1500),
        "woke {woke:?} after the append"
    );
    assert!(answered_at.duration_since(started) >= Duration::from_millis(400));
    api.ack(q, &batch_id(&batch).expect("batch")).await;

    // Idle poll.
    let before = api.info(q).await;
    let started = Instant::now();
    let (status, batch) = api
        .receive_raw(q, json!({"consumer": "c", "wait_ms": 1500}))
        .await;
    let waited = started.elapsed();
    assert_eq!(status, StatusCode::OK);
    assert_eq!(batch_id(&batch), None);
    assert_eq!(int(&batch, "count"), 0);
    assert!(
        waited >= Duration::from_millis(1400),
        "returned after {waited:?}"
    );
    assert!(
        waited < Duration::from_millis(3500),
        "returned after {waited:?}"
    );
    let after = api.info(q).await;
    assert_eq!(after["latest_tick"], before["latest_tick"], "no idle tick");
    assert_eq!(after["ticks"], before["ticks"]);
}

// ---------------------------------------------------------------------------------------------
// Bad input

/// Unknown queue/consumer/batch: 404; answers for a batch that is no longer active or someone
/// else's: 409; malformed input: 400; never a 500.
#[tokio::test]
async fn bad_input_is_rejected_with_the_right_status() {
    let app = spawn_quiet().await;
    let api = Api::new(&app);
    let q = "bad";
    api.subscribe(q, "a", None, false).await;
    api.subscribe(q, "b", None, false).await;
    let (message, _) = api.append(q, "bad.one", json!({})).await;
    let batch = api.receive(q, "a", 100).await;
    let id = batch_id(&batch).expect("batch");
    let other = Uuid::new_v4().to_string();

    let check = |what: &str, status: StatusCode, answer: &Value, want: StatusCode| {
        assert_eq!(status, want, "{what}: {answer}");
        assert!(
            answer["error"]["code"].is_string(),
            "{what}: no error envelope: {answer}"
        );
    };
    // 404s.
    let (s, a) = api.receive_raw("nope", json!({"consumer": "a"})).await;
    check("receive on an unknown queue", s, &a, StatusCode::NOT_FOUND);
    let (s, a) = api.get("/ojs/v1/queues/nope/info").await;
    check("info of an unknown queue", s, &a, StatusCode::NOT_FOUND);
    let (s, a) = api.get("/ojs/v1/queues/nope/consumers").await;
    check(
        "consumers of an unknown queue",
        s,
        &a,
        StatusCode::NOT_FOUND,
    );
    let (s, a) = api.get("/ojs/v1/queues/nope/dlq").await;
    check("dlq of an unknown queue", s, &a, StatusCode::NOT_FOUND);
    let (s, a) = api.ack_raw(json!({"queue": "nope", "batch_id": id})).await;
    check("ack on an unknown queue", s, &a, StatusCode::NOT_FOUND);
    let (s, a) = api.receive_raw(q, json!({"consumer": "ghost"})).await;
    check(
        "receive of an unknown consumer",
        s,
        &a,
        StatusCode::NOT_FOUND,
    );
    let (s, a) = api
        .delete(&format!("/ojs/v1/queues/{q}/consumers/ghost"))
        .await;
    check(
        "unsubscribe an unknown consumer",
        s,
        &a,
        StatusCode::NOT_FOUND,
    );
    let (s, a) = api
        .get(&format!("/ojs/v1/queues/{q}/batches/{other}"))
        .await;
    check("an unknown batch", s, &a, StatusCode::NOT_FOUND);
    let (s, a) = api.ack_raw(json!({"queue": q, "batch_id": other})).await;
    check("ack of an unknown batch", s, &a, StatusCode::NOT_FOUND);
    let (s, a) = api
        .post(
            "/ojs/v1/streams/nack",
            json!({"queue": q, "batch_id": other, "message_id": message}),
        )
        .await;
    check("nack of an unknown batch", s, &a, StatusCode::NOT_FOUND);
    let (s, a) = api
        .post(
            "/ojs/v1/streams/nack",
            json!({"queue": q, "batch_id": id, "message_id": other}),
        )
        .await;
    check(
        "nack of a message not in the batch",
        s,
        &a,
        StatusCode::NOT_FOUND,
    );

    // 409s.
    let (s, a) = api
        .ack_raw(json!({"queue": q, "batch_id": id, "consumer": "b"}))
        .await;
    check(
        "ack of another consumer's batch",
        s,
        &a,
        StatusCode::CONFLICT,
    );
    let (s, a) = api
        .post(
            "/ojs/v1/streams/nack",
            json!({"queue": q, "batch_id": id, "message_id": message, "consumer": "b"}),
        )
        .await;
    check(
        "nack of another consumer's batch",
        s,
        &a,
        StatusCode::CONFLICT,
    );
    let (s, a) = api
        .ack_raw(json!({"queue": q, "batch_id": id, "consumer": "a"}))
        .await;
    assert_eq!(s, StatusCode::OK, "{a}");
    let (s, a) = api.ack_raw(json!({"queue": q, "batch_id": id})).await;
    check("ack of an acked batch", s, &a, StatusCode::CONFLICT);
    let (s, a) = api
        .post(
            "/ojs/v1/streams/nack",
            json!({"queue": q, "batch_id": id, "message_id": message}),
        )
        .await;
    check("nack of an acked batch", s, &a, StatusCode::CONFLICT);

    // 400s.
    let messages = format!("/ojs/v1/queues/{q}/messages");
    let (s, a) = api.post(&messages, json!({"type": "bad.one"})).await;
    check("payload missing", s, &a, StatusCode::BAD_REQUEST);
    let (s, a) = api
        .send_raw(Method::POST, &messages, Some("{not json".to_string()), &[])
        .await;
    check("body not JSON", s, &a, StatusCode::BAD_REQUEST);
    let (s, a) = api
        .post(
            &messages,
            json!({"type": "bad.one", "payload": {}, "headers": {"n": 1}}),
        )
        .await;
    check(
        "a header that is not a string",
        s,
        &a,
        StatusCode::BAD_REQUEST,
    );
    let (s, a) = api
        .post(
            &messages,
            json!({"type": "bad.one", "payload": {}, "headers": "x"}),
        )
        .await;
    check("headers not an object", s, &a, StatusCode::BAD_REQUEST);
    let (s, a) = api
        .post(
            &messages,
            json!({"type": "bad.one", "payload": {}, "id": "not-a-uuid"}),
        )
        .await;
    check("id not a UUID", s, &a, StatusCode::BAD_REQUEST);
    for max in [0, 10_001] {
        let (s, a) = api
            .receive_raw(q, json!({"consumer": "a", "max": max}))
            .await;
        check(&format!("max {max}"), s, &a, StatusCode::BAD_REQUEST);
    }
    let (s, a) = api
        .receive_raw(q, json!({"consumer": "a", "wait_ms": 5001}))
        .await;
    check("wait_ms 5001", s, &a, StatusCode::BAD_REQUEST);
    let (s, a) = api
        .receive_raw(q, json!({"consumer": "a", "wait_ms": -1}))
        .await;
    check("wait_ms -1", s, &a, StatusCode::BAD_REQUEST);
    let too_many: Vec<Value> = (0..1001).map(|i| msg("bad.many", json!(i))).collect();
    let (s, a) = api
        .post(
            &format!("/ojs/v1/queues/{q}/messages/batch"),
            json!({ "messages": too_many }),
        )
        .await;
    check("1001 messages", s, &a, StatusCode::BAD_REQUEST);
    let (s, a) = api
        .post(
            &format!("/ojs/v1/queues/{q}/messages/batch"),
            json!({"messages": []}),
        )
        .await;
    check("no messages", s, &a, StatusCode::BAD_REQUEST);
    let exactly: Vec<Value> = (0..1000).map(|i| msg("bad.many", json!(i))).collect();
    assert_eq!(api.append_many(q, exactly).await.len(), 1000);
    for retention in ["0.5s", "banana", "999ms"] {
        let (s, a) = api
            .post(
                &format!("/ojs/v1/queues/{q}/config"),
                json!({ "retention": retention }),
            )
            .await;
        check(
            &format!("retention {retention}"),
            s,
            &a,
            StatusCode::BAD_REQUEST,
        );
    }
    let (s, a) = api
        .post(
            "/ojs/v1/streams/nack",
            json!({"queue": q, "batch_id": "not-a-uuid", "message_id": message}),
        )
        .await;
    check("batch id not a UUID", s, &a, StatusCode::BAD_REQUEST);
    let (s, a) = api
        .post(
            &format!("/ojs/v1/queues/{q}/consumers"),
            json!({"consumer": "bad name!"}),
        )
        .await;
    check("consumer name", s, &a, StatusCode::BAD_REQUEST);
    let config = api.ok_get(&format!("/ojs/v1/queues/{q}/config")).await;
    assert_eq!(int(&config, "retention_ms"), 604_800_000, "unchanged");
}

// ---------------------------------------------------------------------------------------------
// Read-only gateway

/// A read-only gateway serves stream metadata reads (info, config, consumers, DLQ, batch) and
/// rejects append, subscribe, receive, ack, nack and DLQ mutations.
#[tokio::test]
async fn read_only_gateway_reads_but_rejects_stream_mutations() {
    let app = spawn_quiet().await;
    let api = Api::new(&app);
    let q = "ro";
    api.subscribe(q, "a", None, false).await;
    api.set_config(q, json!({"max_retries": 0})).await;
    let (message, _) = api.append(q, "ro.one", json!({})).await;
    let (kept, _) = api.append(q, "ro.two", json!({})).await;
    let batch = api.receive(q, "a", 100).await;
    let id = batch_id(&batch).expect("batch");
    api.nack(q, &id, &message, "0s", "dead").await;
    let letter = api.dead_letters(q).await[0]["id"]
        .as_str()
        .expect("dead letter")
        .to_string();

    let name = app
        .database_url
        .rsplit('/')
        .next()
        .and_then(|tail| tail.split('?').next())
        .expect("database name")
        .to_string();
    let gateway = common::spawn_app_on(&name, &app.database_url, |s| {
        s.maintenance_interval = None;
        s.service.read_only = true;
    })
    .await;
    let ro = Api::new(&gateway);
    for path in [
        format!("/ojs/v1/queues/{q}/info"),
        format!("/ojs/v1/queues/{q}/config"),
        format!("/ojs/v1/queues/{q}/consumers"),
        format!("/ojs/v1/queues/{q}/dlq"),
        format!("/ojs/v1/queues/{q}/batches/{id}"),
    ] {
        let (status, answer) = ro.get(&path).await;
        assert_eq!(status, StatusCode::OK, "GET {path}: {answer}");
    }
    let inspected = ro.ok_get(&format!("/ojs/v1/queues/{q}/batches/{id}")).await;
    assert_eq!(ids(&inspected), vec![message.clone(), kept.clone()]);
    let posts = [
        (
            format!("/ojs/v1/queues/{q}/messages"),
            msg("ro.x", json!({})),
        ),
        (
            format!("/ojs/v1/queues/{q}/messages/batch"),
            json!({"messages": [msg("ro.x", json!({}))]}),
        ),
        (
            format!("/ojs/v1/queues/{q}/consumers"),
            json!({"consumer": "new"}),
        ),
        (
            format!("/ojs/v1/queues/{q}/receive"),
            json!({"consumer": "a"}),
        ),
        (
            "/ojs/v1/streams/ack".to_string(),
            json!({"queue": q, "batch_id": id}),
        ),
        (
            "/ojs/v1/streams/nack".to_string(),
            json!({"queue": q, "batch_id": id, "message_id": kept}),
        ),
        (
            format!("/ojs/v1/queues/{q}/config"),
            json!({"max_retries": 3}),
        ),
        (format!("/ojs/v1/queues/{q}/dlq/{letter}/replay"), json!({})),
        (format!("/ojs/v1/queues/{q}/dlq/replay"), json!({})),
    ];
    for (path, body) in posts {
        let (status, answer) = ro.post(&path, body).await;
        assert_eq!(status, StatusCode::FORBIDDEN, "POST {path}: {answer}");
        assert_eq!(error_code(&answer), "read_only", "POST {path}");
    }
    for path in [
        format!("/ojs/v1/queues/{q}/dlq?older_than=0s"),
        format!("/ojs/v1/queues/{q}/consumers/a"),
    ] {
        let (status, answer) = ro.delete(&path).await;
        assert_eq!(status, StatusCode::FORBIDDEN, "DELETE {path}: {answer}");
    }
    // Nothing changed.
    let info = api.info(q).await;
    assert_eq!(int(&info, "events"), 2);
    assert_eq!(int(&info, "consumers"), 1);
    assert_eq!(int(&info, "dead_letters"), 1);
    assert_eq!(int(&info, "active_batches"), 1);
    assert_eq!(
        int(
            &api.ok_get(&format!("/ojs/v1/queues/{q}/config")).await,
            "max_retries"
        ),
        0
    );
    gateway.stop().await;
}

/// A cooperative member's unacked batch stays its own for the queue's takeover interval; after it,
/// another member's receive takes the same events over as a new batch and the old batch can no
/// longer be acked. The interval is part of the queue configuration.
#[tokio::test]
async fn cooperative_takeover_after_the_configured_interval() {
    let app = spawn_quiet().await;
    let api = Api::new(&app);
    let mut conn = db(&app).await;
    let q = "takeover";
    api.subscribe(q, "g", None, true).await;
    let config = api.set_config(q, json!({"takeover": "600ms"})).await;
    assert_eq!(config["takeover_ms"], 600, "{config}");
    let (status, refused) = api
        .post(
            &format!("/ojs/v1/queues/{q}/config"),
            json!({"takeover": "soon"}),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{refused}");
    assert_eq!(
        api.set_config(q, json!({})).await["takeover_ms"],
        600,
        "unchanged"
    );

    let sent: Vec<String> = api
        .append_many(
            q,
            (0..3)
                .map(|i| msg("takeover.one", json!({"i": i})))
                .collect(),
        )
        .await
        .into_iter()
        .map(|(id, _)| id)
        .collect();
    maintain(&mut conn).await;
    let first = api.receive_member(q, "g", "m1", 10).await;
    assert_eq!(ids(&first), sent);
    // Within the interval the batch is m1's: m2 finds nothing to take.
    assert_eq!(batch_id(&api.receive_member(q, "g", "m2", 10).await), None);
    tokio::time::sleep(Duration::from_millis(700)).await;
    let taken = api.receive_member(q, "g", "m2", 10).await;
    assert_eq!(ids(&taken), sent, "m2 gets m1's events");
    assert_ne!(batch_id(&taken), batch_id(&first), "as a new batch");
    assert_eq!(taken["member"], "m2");
    let (status, _) = api
        .ack_raw(json!({"queue": q, "batch_id": batch_id(&first)}))
        .await;
    assert_eq!(
        status,
        StatusCode::CONFLICT,
        "the taken-over batch is no longer m1's"
    );
    api.ack(q, &batch_id(&taken).expect("batch")).await;
    assert_eq!(batch_id(&api.receive_member(q, "g", "m1", 10).await), None);
    app.stop().await;
}

// ---------------------------------------------------------------------------------------------
// Maintenance and lock order

/// The `pgvs3_lock_conflict_retries_total` counter of a server's /metrics.
async fn conflict_retries(api: &Api) -> u64 {
    let text = api
        .client
        .get(format!("{}/metrics", api.base))
        .send()
        .await
        .expect("scrape /metrics")
        .text()
        .await
        .expect("metrics text");
    text.lines()
        .find_map(|line| line.strip_prefix("pgvs3_lock_conflict_retries_total "))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("no pgvs3_lock_conflict_retries_total in {text}"))
}

/// While an application holds an uncommitted append in its own transaction, maintenance passes
/// keep running (one of them with a rotation due) and never take the exclusive stream lock, so
/// another client's append, receive and ack each answer within a second; the held event is
/// delivered after its commit, and the due rotation happens on a pass after that.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writers_never_wait_on_maintenance() {
    let app = spawn_quiet().await;
    let api = Api::new(&app);
    let q = "no-wait";
    api.subscribe(q, "c", None, false).await;
    // A segment lasts retention / 2: a rotation falls due a second after the queue began.
    api.set_config(q, json!({"retention": "2s"})).await;
    let (before, _) = api.append(q, "before.one", json!({})).await;

    let mut held = db(&app).await;
    let mut tx = held.begin().await.expect("begin");
    let (held_id, _) = sql_append(&mut tx, q, "held.one").await;

    let url = app.database_url.clone();
    let passes = tokio::spawn(async move {
        let mut conn = PgConnection::connect(&url).await.expect("connect");
        let until = Instant::now() + Duration::from_millis(2500);
        let mut n = 0;
        while Instant::now() < until {
            maintain(&mut conn).await;
            n += 1;
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        n
    });
    // By now the rotation is due and several passes found the stream lock held.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let quick = Duration::from_secs(1);
    let (other, _) = tokio::time::timeout(quick, api.append(q, "other.one", json!({})))
        .await
        .expect("an append waited behind maintenance");
    // Maintenance may have ticked `before` alone: receive and ack until `other` came.
    let mut delivered = Vec::new();
    while !delivered.contains(&other) {
        assert!(delivered.len() < 2, "delivered {delivered:?}");
        let batch = tokio::time::timeout(quick, api.receive(q, "c", 100))
            .await
            .expect("a receive waited behind maintenance");
        delivered.extend(ids(&batch));
        tokio::time::timeout(quick, api.ack(q, &batch_id(&batch).expect("batch")))
            .await
            .expect("an ack waited behind maintenance");
    }
    assert_eq!(
        delivered,
        vec![before, other],
        "the open writer is not delivered"
    );
    let passes_run = tokio::time::timeout(Duration::from_secs(5), passes)
        .await
        .expect("maintenance passes waited on the open writer")
        .expect("pass task");
    assert!(passes_run >= 10, "only {passes_run} passes ran");
    assert_eq!(
        int(&api.info(q).await, "rotations"),
        0,
        "no rotation while a writer holds the stream lock"
    );

    tx.commit().await.expect("commit the held writer");
    let late = api.receive(q, "c", 100).await;
    assert_eq!(ids(&late), vec![held_id], "the held event, once committed");
    api.ack(q, &batch_id(&late).expect("batch")).await;
    let mut conn = db(&app).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    while int(&api.info(q).await, "rotations") < 1 {
        assert!(Instant::now() < deadline, "the due rotation never happened");
        maintain(&mut conn).await;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(batch_id(&api.receive(q, "c", 100).await), None);
    app.stop().await;
}

/// Cooperative members taking each other's batches over (receive: subscription, then batch) while
/// they ack and nack them, and a consumer unsubscribed while its batch is acked, all take the rows
/// in one order: no answer is a server error and no statement needed a rerun for a deadlock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn receive_ack_nack_and_unsubscribe_take_locks_in_one_order() {
    let app = spawn_quiet().await;
    let api = Api::new(&app);
    let q = "lock-order";
    api.subscribe(q, "g", None, true).await;
    api.set_config(q, json!({"takeover": "1ms"})).await;
    let stop = Arc::new(AtomicBool::new(false));
    let appender = {
        let (api, stop) = (api.clone(), stop.clone());
        tokio::spawn(async move {
            // Slow enough that no tick outgrows a receive's max.
            while !stop.load(Ordering::Relaxed) {
                api.append_many(
                    q,
                    (0..5).map(|i| msg("lock.one", json!({"i": i}))).collect(),
                )
                .await;
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
    };
    let outcomes = Arc::new(std::sync::Mutex::new(HashMap::<u16, usize>::new()));
    let mut members = Vec::new();
    for m in 0..4 {
        let (api, stop, outcomes) = (api.clone(), stop.clone(), outcomes.clone());
        members.push(tokio::spawn(async move {
            let member = format!("m{m}");
            let mut round = 0usize;
            while !stop.load(Ordering::Relaxed) {
                round += 1;
                let (status, batch) = api
                    .receive_raw(q, json!({"consumer": "g", "member": member, "max": 1000}))
                    .await;
                let mut seen = vec![status.as_u16()];
                if let Some(id) = batch_id(&batch) {
                    if round.is_multiple_of(3)
                        && let Some(first) = events(&batch).first()
                    {
                        let (status, _) = api
                            .post(
                                "/ojs/v1/streams/nack",
                                json!({"queue": q, "consumer": "g", "batch_id": id,
                                       "message_id": first.id, "retry_after": "1s"}),
                            )
                            .await;
                        seen.push(status.as_u16());
                    }
                    let (status, _) = api
                        .ack_raw(json!({"queue": q, "consumer": "g", "batch_id": id}))
                        .await;
                    seen.push(status.as_u16());
                }
                let mut outcomes = outcomes.lock().expect("outcomes");
                for status in seen {
                    *outcomes.entry(status).or_default() += 1;
                }
            }
        }));
    }
    tokio::time::sleep(Duration::from_secs(4)).await;
    stop.store(true, Ordering::Relaxed);
    appender.await.expect("appender");
    for member in members {
        member.await.expect("member");
    }
    let outcomes = outcomes.lock().expect("outcomes").clone();
    assert!(
        outcomes.keys().all(|status| *status < 500),
        "server errors among {outcomes:?}"
    );
    assert!(
        outcomes.get(&200).copied().unwrap_or(0) > 50,
        "{outcomes:?}"
    );

    // Unsubscribe against ack, consumer by consumer.
    let q = "lock-order-gone";
    for n in 0..30 {
        let consumer = format!("gone-{n}");
        api.subscribe(q, &consumer, None, false).await;
        api.append(q, "lock.two", json!({})).await;
        let batch = api.receive(q, &consumer, 1000).await;
        let id = batch_id(&batch).expect("a batch");
        let ack = api.ack_raw(json!({"queue": q, "consumer": consumer, "batch_id": id}));
        let path = format!("/ojs/v1/queues/{q}/consumers/{consumer}");
        let unsubscribe = api.delete(&path);
        let ((ack_status, ack_answer), (gone_status, gone_answer)) = tokio::join!(ack, unsubscribe);
        assert!(ack_status.as_u16() < 500, "ack: {ack_status} {ack_answer}");
        assert!(
            gone_status.is_success(),
            "unsubscribe: {gone_status} {gone_answer}"
        );
    }
    assert_eq!(
        conflict_retries(&api).await,
        0,
        "a statement hit a deadlock"
    );
    app.stop().await;
}

/// A SQL caller that leaves a message's id out gets a UUIDv7 filled in: version 7, and its time
/// prefix is the append's.
#[tokio::test]
async fn sql_appends_without_an_id_get_a_uuid_v7() {
    let app = spawn_quiet().await;
    let mut conn = db(&app).await;
    let before = chrono::Utc::now().timestamp_millis();
    let (id,): (Uuid,) = sqlx::query_as(
        "SELECT event_id FROM s3p.stream_append('v7', '[{\"type\": \"no.id\", \"payload\": {}}]')",
    )
    .fetch_one(&mut conn)
    .await
    .expect("append without an id");
    let after = chrono::Utc::now().timestamp_millis();
    assert_eq!(id.get_version_num(), 7, "{id}");
    let bytes = id.as_bytes();
    let millis = bytes[..6]
        .iter()
        .fold(0i64, |acc, b| (acc << 8) | i64::from(*b));
    assert!(
        (before - 5..=after + 5).contains(&millis),
        "{id}: {millis} not in {before}..{after}"
    );
    assert_eq!(bytes[8] >> 6, 0b10, "RFC 9562 variant: {id}");
    app.stop().await;
}

/// Maintenance cuts a backlog a few ticks per transaction (four), so a receive that needs a tick
/// waits behind at most those, never behind the whole backlog's cut: of twelve one-event
/// transactions (one event per tick), a queue's step alone (`s3p.maintain`, SQL) cuts four, and
/// the gateway's pass (`pgvs3 maintain --once`) cuts the rest four per transaction; all are
/// delivered once.
#[tokio::test]
async fn maintenance_cuts_a_backlog_a_few_ticks_per_transaction() {
    let app = spawn_quiet().await;
    let api = Api::new(&app);
    let q = "backlog";
    api.subscribe(q, "c", None, false).await;
    let config = api.set_config(q, json!({"tick_max_events": 1})).await;
    assert_eq!(int(&config, "tick_max_events"), 1, "{config}");
    for i in 0..12 {
        api.append(q, "backlog.one", json!({"i": i})).await;
    }
    let mut conn = db(&app).await;
    let schema = queue_schema(&mut conn, q).await;
    let cut = format!(
        "SELECT coalesce(sum(n), 0)::bigint, count(*), coalesce(max(n), 0)::bigint
           FROM (SELECT xmin::text, count(*) AS n FROM \"{schema}\".stream_ticks
                  WHERE added > 0 GROUP BY 1) cut"
    );
    let ran: bool = sqlx::query_scalar("SELECT ran FROM s3p.maintain(86400000, 1000)")
        .fetch_one(&mut conn)
        .await
        .expect("a pass in SQL");
    assert!(ran, "the SQL pass ran");
    let (ticks, transactions, _): (i64, i64, i64) =
        sqlx::query_as(sqlx::AssertSqlSafe(cut.clone()))
            .fetch_one(&mut conn)
            .await
            .expect("ticks by cutting transaction");
    assert_eq!((ticks, transactions), (4, 1), "a step cuts four ticks");

    let output = std::process::Command::new(env!("CARGO_BIN_EXE_pgvs3"))
        .args(["maintain", "--once", "--database-url", &app.database_url])
        .env("NO_COLOR", "1")
        .output()
        .expect("run pgvs3 maintain");
    assert!(
        output.status.success(),
        "pgvs3 maintain --once: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let (ticks, transactions, largest): (i64, i64, i64) = sqlx::query_as(sqlx::AssertSqlSafe(cut))
        .fetch_one(&mut conn)
        .await
        .expect("ticks by cutting transaction");
    assert_eq!(ticks, 12, "every event has its tick");
    assert!(largest <= 4, "one transaction cut {largest} ticks");
    assert!(transactions >= 3, "cut in {transactions} transactions");
    let drained = api.drain(q, "c", 100).await;
    assert_eq!(all_ids(&drained).len(), 12, "all delivered once");
}

/// On a stream with other subscriptions, a receive past the newest tick has that tick cut in a
/// transaction of its own before its own (the spec's "own short transaction"), so the other
/// consumers of the tick wait for the cut only, not for this receive's read and commit: the tick
/// and the batch delivered from it were written by different transactions. A stream's only
/// consumer cuts its tick in its receive (nobody waits on it; two more statements would only
/// slow it).
#[tokio::test]
async fn a_receive_cuts_its_tick_in_a_transaction_of_its_own() {
    let app = spawn_quiet().await;
    let api = Api::new(&app);
    let writers = |q: &'static str, batch: String| {
        let app = &app;
        async move {
            let mut conn = db(app).await;
            let schema = queue_schema(&mut conn, q).await;
            let (tick, batch): (String, String) = sqlx::query_as(sqlx::AssertSqlSafe(format!(
                "SELECT t.xmin::text, b.xmin::text
                   FROM \"{schema}\".stream_batches b
                   JOIN \"{schema}\".stream_ticks t ON t.tick_id = b.end_tick
                  WHERE b.batch_id = $1::uuid"
            )))
            .bind(&batch)
            .fetch_one(&mut conn)
            .await
            .expect("the batch and its end tick");
            (tick, batch)
        }
    };
    let mut grpc = common::grpc::streams(&app.grpc_url).await;
    for (q, others, over_grpc) in [
        ("own-tick", true, false),
        ("only-consumer", false, false),
        ("own-tick-grpc", true, true),
        ("only-consumer-grpc", false, true),
    ] {
        api.subscribe(q, "c", None, false).await;
        if others {
            api.subscribe(q, "other", None, false).await;
        }
        let (id, _) = api.append(q, "own.one", json!({"n": 1})).await;
        let delivered = if over_grpc {
            let batch = grpc
                .receive(pgvs3::grpc::proto::pgvs3::v1::ReceiveRequest {
                    queue: q.into(),
                    consumer: "c".into(),
                    max: Some(10),
                    ..Default::default()
                })
                .await
                .expect("receive over gRPC")
                .into_inner()
                .batch
                .expect("a batch");
            let ids: Vec<String> = batch.events.iter().map(|e| e.id.clone()).collect();
            assert_eq!(ids, vec![id], "over gRPC");
            batch.batch_id
        } else {
            let batch = api.receive(q, "c", 10).await;
            assert_eq!(all_ids(std::slice::from_ref(&batch)), vec![id], "{batch}");
            batch_id(&batch).expect("a batch")
        };
        let (tick, batch) = writers(q, delivered).await;
        if others {
            assert_ne!(
                tick, batch,
                "{q}: the tick was cut by the receive's own transaction"
            );
        } else {
            assert_eq!(
                tick, batch,
                "{q}: the only consumer cut its tick in its receive"
            );
        }
    }
}
