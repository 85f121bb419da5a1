//! Operations that lock rows in an order of their own, racing each other: PostgreSQL breaks a
//! deadlock by aborting one statement, and pgvs3 must run it again instead of answering 500.
//! Each race is repeated a few rounds, so a missing rerun or lock order shows at least once.

use crate::common;

use serde_json::{Value, json};
use uuid::Uuid;

const ROUNDS: usize = 8;

/// Two batches of the same unique jobs, one in the other's reverse order: each locks its first
/// unique keys, then waits for the other's. One wins; the other, run again, is refused as a
/// duplicate (409), never a server error.
#[tokio::test]
async fn unique_batches_in_opposite_orders_are_a_duplicate_never_a_server_error() {
    let app = common::spawn_app().await;
    let http = common::http::Http::new(&app);
    for round in 0..ROUNDS {
        let jobs: Vec<Value> = (0..60)
            .map(|i| {
                json!({"type": "unique.race", "args": [round, i], "options": {"queue": "uq",
                       "unique": {"keys": ["type", "queue", "args"], "on_conflict": "reject"}}})
            })
            .collect();
        let reversed: Vec<Value> = jobs.iter().rev().cloned().collect();
        let (a, b) = tokio::join!(
            http.post("/ojs/v1/jobs/batch", json!({ "jobs": jobs })),
            http.post("/ojs/v1/jobs/batch", json!({ "jobs": reversed })),
        );
        let mut statuses = [a.0.as_u16(), b.0.as_u16()];
        statuses.sort();
        assert!(
            statuses == [201, 409] || statuses == [200, 409],
            "round {round}: one batch stores, the other is a duplicate: {:?} {} / {:?} {}",
            a.0,
            a.1.get("error").unwrap_or(&a.1["count"]),
            b.0,
            b.1.get("error").unwrap_or(&b.1["count"]),
        );
    }
    let (_, stats) = http.get("/ojs/v1/queues/uq/stats").await;
    assert_eq!(
        stats.pointer("/stats/available").and_then(Value::as_i64),
        Some((ROUNDS * 60) as i64),
        "{stats}"
    );
    app.stop().await;
}

/// A worker's heartbeats for all its jobs racing its batch ack of them, with ids the client chose
/// and gave in reverse (so the jobs' order on disk is the reverse of their id order): both lock
/// the jobs in id order.
#[tokio::test]
async fn heartbeats_racing_batch_acks_of_the_same_jobs_never_fail() {
    let app = common::spawn_app().await;
    let http = common::http::Http::new(&app);
    for round in 0..ROUNDS {
        let ids: Vec<Uuid> = (0..100).map(|_| Uuid::now_v7()).collect();
        let jobs: Vec<Value> = ids
            .iter()
            .rev()
            .map(|id| {
                json!({"id": id.to_string(), "type": "hb.race", "args": [round],
                       "options": {"queue": "hb"}})
            })
            .collect();
        http.ok_post("/ojs/v1/jobs/batch", json!({ "jobs": jobs }))
            .await;
        let fetched = http
            .ok_post(
                "/ojs/v1/workers/fetch",
                json!({"queues": ["hb"], "count": 100, "worker_id": "w1"}),
            )
            .await;
        let claimed = fetched["jobs"].as_array().cloned().unwrap_or_default();
        assert_eq!(claimed.len(), 100, "{fetched}");
        let ids: Vec<Value> = claimed.iter().map(|j| j["id"].clone()).collect();
        let acks: Vec<Value> = claimed
            .iter()
            .map(|j| json!({"job_id": j["id"], "lease_token": j["lease_token"]}))
            .collect();
        // Staggered by a millisecond each, so some overlap the ack's statement whatever its speed.
        let (http, ids) = (&http, &ids);
        let beats = (0..4u64).map(|i| async move {
            tokio::time::sleep(std::time::Duration::from_millis(i)).await;
            http.post(
                "/ojs/v1/workers/heartbeat",
                json!({"worker_id": "w1", "active_jobs": ids}),
            )
            .await
        });
        let worker_beats = (0..4u64).map(|i| async move {
            tokio::time::sleep(std::time::Duration::from_millis(i)).await;
            http.post("/ojs/v1/workers/heartbeat", json!({"worker_id": "w1"}))
                .await
        });
        let (acked, beats, worker_beats) = tokio::join!(
            http.post("/ojs/v1/workers/ack/batch", json!({ "acks": acks })),
            futures_util::future::join_all(beats),
            futures_util::future::join_all(worker_beats),
        );
        assert_eq!(acked.0, 200, "round {round}: {}", acked.1);
        for (status, body) in beats.iter().chain(&worker_beats) {
            assert_eq!(*status, 200, "round {round}: heartbeat {body}");
        }
        assert_eq!(acked.1["acknowledged"], 100, "round {round}: {}", acked.1);
    }
    app.stop().await;
}

/// Eight clients enqueue the same unique jobs (on_conflict ignore), each batch in another order,
/// at once: the batches take their keys in one order, so every one is stored or answered with
/// the jobs already there, none fails.
#[tokio::test]
async fn unique_batches_of_many_clients_in_other_orders_all_succeed() {
    let app = common::spawn_app().await;
    let http = common::http::Http::new(&app);
    for round in 0..3 {
        let jobs: Vec<Value> = (0..20)
            .map(|k| {
                json!({"type": "u", "args": [round, k], "options": {"queue": "uq4",
                       "unique": {"keys": ["type", "args"], "on_conflict": "ignore"}}})
            })
            .collect();
        let orders: Vec<Vec<Value>> = (0..8)
            .map(|c| {
                let mut order = jobs.clone();
                order.rotate_left(c * 5 % 20);
                if c % 2 == 1 {
                    order.reverse();
                }
                order
            })
            .collect();
        let answers = futures_util::future::join_all(
            orders
                .into_iter()
                .map(|order| http.post("/ojs/v1/jobs/batch", json!({ "jobs": order }))),
        )
        .await;
        for (status, body) in answers {
            assert!(
                status.is_success(),
                "round {round}: {status} {}",
                body.get("error").unwrap_or(&body["count"])
            );
        }
    }
    let (_, stats) = http.get("/ojs/v1/queues/uq4/stats").await;
    assert_eq!(
        stats.pointer("/stats/available").and_then(Value::as_i64),
        Some(60),
        "{stats}"
    );
    app.stop().await;
}

/// Clients whose batches each create the same new queues, naming them in other orders: every
/// batch is stored (queue creation takes the creators' lock before a queue's own).
#[tokio::test]
async fn batches_creating_the_same_new_queues_in_other_orders_all_succeed() {
    let app = common::spawn_app().await;
    let http = common::http::Http::new(&app);
    for round in 0..3 {
        let queues: Vec<String> = (0..3).map(|q| format!("new{round}q{q}")).collect();
        let batches = (0..6).map(|c| {
            let mut names = queues.clone();
            names.rotate_left(c % 3);
            if c >= 3 {
                names.reverse();
            }
            let jobs: Vec<Value> = names
                .iter()
                .map(|q| json!({"type": "p", "args": [c], "options": {"queue": q}}))
                .collect();
            http.post("/ojs/v1/jobs/batch", json!({ "jobs": jobs }))
        });
        for (status, body) in futures_util::future::join_all(batches).await {
            assert!(
                status.is_success(),
                "round {round}: {status} {}",
                body.get("error").unwrap_or(&body["count"])
            );
        }
    }
    app.stop().await;
}

/// An ack that waits on its job's row lock (a long transaction holds it) does not hold up the
/// queue's other acks: they complete while the lock is still held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ack_waiting_on_a_locked_job_does_not_hold_up_other_acks() {
    use sqlx::{Connection, PgConnection};
    use std::time::Duration;

    let app = common::spawn_app().await;
    let http = common::http::Http::new(&app);
    let q = "held";
    for i in 0..3 {
        let (status, body) = http
            .post(
                "/ojs/v1/jobs",
                json!({"type": "held.job", "args": [i], "options": {"queue": q}}),
            )
            .await;
        assert!(status.is_success(), "{body}");
    }
    let (status, fetched) = http
        .post(
            "/ojs/v1/workers/fetch",
            json!({"queues": [q], "count": 3, "worker_id": "w"}),
        )
        .await;
    assert!(status.is_success(), "{fetched}");
    let leases: Vec<(String, String)> = fetched["jobs"]
        .as_array()
        .expect("jobs")
        .iter()
        .map(|j| {
            (
                j["id"].as_str().expect("id").to_string(),
                j["lease_token"].as_str().expect("lease").to_string(),
            )
        })
        .collect();
    assert_eq!(leases.len(), 3, "{fetched}");

    let mut held = PgConnection::connect(&app.database_url)
        .await
        .expect("connect");
    let mut tx = held.begin().await.expect("begin");
    sqlx::query("SELECT 1 FROM s3q_held.jobs WHERE id = $1::uuid FOR UPDATE")
        .bind(&leases[0].0)
        .execute(&mut *tx)
        .await
        .expect("lock the first job");
    let ack = |(id, lease): &(String, String)| {
        http.post(
            "/ojs/v1/workers/ack",
            json!({"job_id": id, "lease_token": lease}),
        )
    };
    let blocked = ack(&leases[0]);
    let others = async {
        // The first ack is waiting on the lock by then.
        tokio::time::sleep(Duration::from_millis(300)).await;
        for lease in &leases[1..] {
            let (status, body) = tokio::time::timeout(Duration::from_secs(3), ack(lease))
                .await
                .expect("an ack of another job answers while the lock is held");
            assert!(status.is_success(), "{body}");
        }
        tx.commit().await.expect("release the lock");
    };
    let ((status, body), ()) = tokio::join!(blocked, others);
    assert!(
        status.is_success(),
        "the locked job's ack, once released: {body}"
    );
}

/// A batch ack takes its jobs' row locks in id order, as a workflow cancel and a heartbeat do,
/// whatever the jobs' order on disk: while the higher id is locked elsewhere, the waiting ack
/// already holds the lower one. (Taken in the plan's order, a sequential scan's on a small table,
/// it raced a workflow cancel into a deadlock.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_ack_locks_its_jobs_in_id_order_whatever_their_order_on_disk() {
    let app = common::spawn_app().await;
    let http = common::http::Http::new(&app);
    let q = "ordered";
    let (low, high) = (Uuid::now_v7(), Uuid::now_v7());
    assert!(low < high);
    // The higher id is stored first, so a scan of the table meets it first.
    let jobs: Vec<Value> = [high, low]
        .iter()
        .map(|id| json!({"id": id.to_string(), "type": "ordered.job", "args": [], "options": {"queue": q}}))
        .collect();
    http.ok_post("/ojs/v1/jobs/batch", json!({ "jobs": jobs }))
        .await;
    let fetched = http
        .ok_post(
            "/ojs/v1/workers/fetch",
            json!({"queues": [q], "count": 2, "worker_id": "w"}),
        )
        .await;
    let acks: Vec<Value> = fetched["jobs"]
        .as_array()
        .expect("jobs")
        .iter()
        .map(|j| json!({"job_id": j["id"], "lease_token": j["lease_token"]}))
        .collect();
    assert_eq!(acks.len(), 2, "{fetched}");

    let ((status, body), lower_locked) = probe_while_held(
        &app.database_url,
        (
            "SELECT 1 FROM s3q_ordered.jobs WHERE id = $1 FOR UPDATE",
            high,
        ),
        "ack_many",
        (
            "SELECT 1 FROM s3q_ordered.jobs WHERE id = $1 FOR UPDATE NOWAIT",
            low,
        ),
        http.post("/ojs/v1/workers/ack/batch", json!({ "acks": acks })),
    )
    .await;
    assert!(lower_locked, "the waiting ack holds the lower id already");
    assert_eq!(status.as_u16(), 200, "{body}");
    assert_eq!(body["acknowledged"], 2, "{body}");
    app.stop().await;
}

/// Waits until a backend running `statement` waits for a lock.
async fn until_waiting(probe: &mut sqlx::PgConnection, statement: &str) {
    let pattern = format!("%{statement}%");
    for _ in 0..500 {
        let waiting: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE $1",
        )
        .bind(&pattern)
        .fetch_one(&mut *probe)
        .await
        .expect("activity");
        if waiting > 0 {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    panic!("{statement} never waited for a lock");
}

/// Whether `sql` (a `FOR UPDATE NOWAIT` of one row) finds the row locked; releases it at once.
async fn row_is_locked(probe: &mut sqlx::PgConnection, sql: &'static str, id: Uuid) -> bool {
    use sqlx::Connection;
    let mut tx = probe.begin().await.expect("begin");
    let outcome = sqlx::query(sql).bind(id).execute(&mut *tx).await;
    tx.rollback().await.expect("rollback");
    match outcome {
        Ok(_) => false,
        Err(e) if e.as_database_error().and_then(|d| d.code()).as_deref() == Some("55P03") => true,
        Err(e) => panic!("{sql}: {e}"),
    }
}

/// Runs `request` while another transaction holds the row `hold` locks (`FOR UPDATE` of one id);
/// once the request's `statement` waits for a lock, asks whether the row `probe` (`FOR UPDATE
/// NOWAIT` of one id) is locked, then releases the held row. Returns the request's answer and
/// whether the probed row was locked: what the waiting statement took before the held row.
async fn probe_while_held<T>(
    database_url: &str,
    hold: (&'static str, Uuid),
    statement: &str,
    probe: (&'static str, Uuid),
    request: impl std::future::Future<Output = T>,
) -> (T, bool) {
    use sqlx::{Connection, PgConnection};
    let mut holder = PgConnection::connect(database_url).await.expect("connect");
    let mut held = holder.begin().await.expect("begin");
    sqlx::query(hold.0)
        .bind(hold.1)
        .execute(&mut *held)
        .await
        .expect("hold the row");
    let mut prober = PgConnection::connect(database_url).await.expect("connect");
    let check = async {
        until_waiting(&mut prober, statement).await;
        let locked = row_is_locked(&mut prober, probe.0, probe.1).await;
        held.commit().await.expect("release the held row");
        locked
    };
    tokio::join!(request, check)
}

/// A workflow cancel locks its steps' jobs by queue name, then id, as heartbeats, bulk actions
/// and acks of several queues take them (it took them by id alone, and deadlocked with a
/// heartbeat of the same jobs): with its step in queue `zq` held elsewhere, the waiting cancel
/// already holds its step in `aq`, though that one's id is higher.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_workflow_cancel_locks_its_jobs_by_queue_then_id() {
    let app = common::spawn_app().await;
    let http = common::http::Http::new(&app);
    let created = http
        .ok_post(
            "/ojs/v1/workflows",
            json!({"type": "group", "name": "two-queues", "steps": [
                {"type": "t.z", "args": [], "options": {"queue": "zq"}},
                {"type": "t.a", "args": [], "options": {"queue": "aq"}}]}),
        )
        .await;
    let workflow = created["workflow"]["id"].as_str().expect("id").to_string();
    let step = |queue: &str| -> Uuid {
        created["workflow"]["steps"]
            .as_array()
            .expect("steps")
            .iter()
            .zip(["zq", "aq"])
            .find(|(_, q)| *q == queue)
            .and_then(|(s, _)| s["job_id"].as_str())
            .and_then(|id| id.parse().ok())
            .expect("step job id")
    };
    let (z, a) = (step("zq"), step("aq"));
    assert!(z < a, "the steps' ids follow their order: {created}");

    let path = format!("/ojs/v1/workflows/{workflow}");
    let ((status, body), aq_locked) = probe_while_held(
        &app.database_url,
        ("SELECT 1 FROM s3q_zq.jobs WHERE id = $1 FOR UPDATE", z),
        "cancel_workflow",
        (
            "SELECT 1 FROM s3q_aq.jobs WHERE id = $1 FOR UPDATE NOWAIT",
            a,
        ),
        http.delete(&path),
    )
    .await;
    assert!(
        aq_locked,
        "the cancel waiting on zq holds aq's step already"
    );
    assert_eq!(status.as_u16(), 200, "{body}");
    assert_eq!(body["workflow"]["state"], "cancelled", "{body}");
    app.stop().await;
}

/// A batch ack tells its jobs' workflows in workflow id order, after every job row (it told them
/// in the jobs' order, and two acks naming the same two workflows deadlocked): while the first
/// workflow's row is held elsewhere, the waiting ack has not locked the second, though its job
/// came first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_ack_locks_its_workflows_in_id_order() {
    let app = common::spawn_app().await;
    let http = common::http::Http::new(&app);
    let q = "wf-order";
    let step = |t: &str| json!({"type": t, "args": [], "options": {"queue": q}});
    let first = http
        .ok_post(
            "/ojs/v1/workflows",
            json!({"type": "chain", "name": "first", "steps": [step("t.a"), step("t.b")]}),
        )
        .await;
    let second = http
        .ok_post(
            "/ojs/v1/workflows",
            json!({"type": "group", "name": "second", "steps": [step("t.c")]}),
        )
        .await;
    let id = |w: &Value| -> Uuid {
        w["workflow"]["id"]
            .as_str()
            .and_then(|id| id.parse().ok())
            .expect("workflow id")
    };
    let (w1, w2) = (id(&first), id(&second));
    assert!(w1 < w2, "workflow ids follow their creation");
    // Complete the first's step a: its step b is stored after the second's c.
    let fetched = http
        .ok_post(
            "/ojs/v1/workers/fetch",
            json!({"queues": [q], "count": 1, "worker_id": "w"}),
        )
        .await;
    let a = &fetched["jobs"][0];
    assert_eq!(a["type"], "t.a", "{fetched}");
    http.ok_post(
        "/ojs/v1/workers/ack",
        json!({"job_id": a["id"], "lease_token": a["lease_token"]}),
    )
    .await;
    let fetched = http
        .ok_post(
            "/ojs/v1/workers/fetch",
            json!({"queues": [q], "count": 2, "worker_id": "w"}),
        )
        .await;
    let jobs = fetched["jobs"].as_array().expect("jobs");
    let types: Vec<&str> = jobs.iter().filter_map(|j| j["type"].as_str()).collect();
    assert_eq!(types, ["t.c", "t.b"], "{fetched}");
    let acks: Vec<Value> = jobs
        .iter()
        .map(|j| json!({"job_id": j["id"], "lease_token": j["lease_token"]}))
        .collect();

    let ((status, body), second_locked) = probe_while_held(
        &app.database_url,
        ("SELECT 1 FROM s3p.workflows WHERE id = $1 FOR UPDATE", w1),
        "ack_many",
        (
            "SELECT 1 FROM s3p.workflows WHERE id = $1 FOR UPDATE NOWAIT",
            w2,
        ),
        http.post("/ojs/v1/workers/ack/batch", json!({ "acks": acks })),
    )
    .await;
    assert!(
        !second_locked,
        "the ack waiting on the first workflow has not locked the second"
    );
    assert_eq!(status.as_u16(), 200, "{body}");
    assert_eq!(body["acknowledged"], 2, "{body}");
    app.stop().await;
}

/// A bulk cancel tells the cancelled steps' workflows after every queue's jobs, in workflow id
/// order (it told each queue's right after cancelling them, queue by queue, and deadlocked with
/// a batch ack of the same workflows): with the first workflow's row held elsewhere, the waiting
/// bulk cancel has not locked the second, though the second's step is in the queue it takes first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bulk_cancel_locks_the_workflows_in_id_order_after_every_queue() {
    let app = common::spawn_app().await;
    let http = common::http::Http::new(&app);
    let workflow = |name: &str, queue: &str| {
        json!({"type": "group", "name": name, "steps": [
            {"type": "bulk.step", "args": [], "options": {"queue": queue}}]})
    };
    let first = http
        .ok_post("/ojs/v1/workflows", workflow("first", "zq"))
        .await;
    let second = http
        .ok_post("/ojs/v1/workflows", workflow("second", "aq"))
        .await;
    let id = |w: &Value| -> Uuid {
        w["workflow"]["id"]
            .as_str()
            .and_then(|id| id.parse().ok())
            .expect("workflow id")
    };
    let (w1, w2) = (id(&first), id(&second));
    assert!(w1 < w2, "workflow ids follow their creation");

    let ((status, body), second_locked) = probe_while_held(
        &app.database_url,
        ("SELECT 1 FROM s3p.workflows WHERE id = $1 FOR UPDATE", w1),
        "admin_bulk",
        (
            "SELECT 1 FROM s3p.workflows WHERE id = $1 FOR UPDATE NOWAIT",
            w2,
        ),
        http.post(
            "/ojs/v1/admin/jobs/bulk/cancel",
            json!({"filter": {"type": "bulk.step"}, "confirm": true}),
        ),
    )
    .await;
    assert!(
        !second_locked,
        "the bulk cancel waiting on the first workflow has not locked the second"
    );
    assert_eq!(status.as_u16(), 200, "{body}");
    assert_eq!(body["succeeded"], 2, "{body}");
    for w in [&first, &second] {
        let id = w["workflow"]["id"].as_str().expect("id");
        let (_, view) = http.get(&format!("/ojs/v1/workflows/{id}")).await;
        assert_ne!(view["workflow"]["state"], "running", "{view}");
    }
    app.stop().await;
}

/// A drop waits for a workflow being made on its queue, then refuses (409): the workflow holds
/// the queue's catalog row until it commits. Without that hold the drop went through while the
/// workflow was uncommitted, and its jobs went with the queue.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drop_waits_for_a_workflow_being_made_on_its_queue_then_refuses() {
    use sqlx::{Connection, PgConnection};
    let app = common::spawn_app().await;
    let http = common::http::Http::new(&app);
    let q = "wf-making";
    http.ok_post("/ojs/v1/queues", json!({ "name": q })).await;
    // The steps as the core prepares them for s3p.create_workflow.
    let steps = json!([{"key": "only", "depends_on": [], "job": {
        "id": Uuid::now_v7(), "type": "making.step", "queue": q, "args": [], "state": "available",
        "priority": 0, "max_attempts": 3, "attempt": 0}}]);
    let mut maker = PgConnection::connect(&app.database_url)
        .await
        .expect("connect");
    let mut making = maker.begin().await.expect("begin");
    sqlx::query("SELECT s3p.create_workflow($1, 'making', 'chain', $2, '{}')")
        .bind(Uuid::now_v7())
        .bind(&steps)
        .execute(&mut *making)
        .await
        .expect("workflow made, not committed");

    let drop = tokio::spawn({
        let http = common::http::Http::new(&app);
        async move { http.delete(&format!("/ojs/v1/queues/{q}")).await }
    });
    let mut probe = PgConnection::connect(&app.database_url)
        .await
        .expect("connect");
    until_waiting(&mut probe, "drop_queue").await;
    making.commit().await.expect("commit");
    let (status, body) = drop.await.expect("drop");
    assert_eq!(status.as_u16(), 409, "{body}");
    assert_eq!(body["error"]["code"], "conflict", "{body}");
    let (_, queues) = http.get("/ojs/v1/queues").await;
    assert!(
        queues["queues"]
            .as_array()
            .is_some_and(|qs| qs.iter().any(|e| e["name"] == q)),
        "{queues}"
    );
    app.stop().await;
}

/// A retention naming one state alone is checked against the retention in force under the
/// queue's row lock: a change committed while it waits is seen, so it is refused (400) rather
/// than setting both states to its duration (it answered 200 and set both when the check ran
/// before the lock).
#[tokio::test]
async fn a_one_state_retention_is_checked_under_the_queues_row_lock() {
    use sqlx::{Connection, PgConnection};
    let app = common::spawn_app().await;
    let http = common::http::Http::new(&app);
    let q = "retention-race";
    http.ok_post("/ojs/v1/queues", json!({ "name": q })).await;
    let config = format!("/ojs/v1/admin/queues/{q}/config");
    let (status, body) = http
        .send(
            reqwest::Method::PUT,
            &config,
            Some(json!({"retention": {"completed": "PT1H", "discarded": "PT1H"}})),
        )
        .await;
    assert_eq!(status.as_u16(), 200, "{body}");

    // Another writer holds the queue's row and moves the retention to five hours.
    let mut writer = PgConnection::connect(&app.database_url)
        .await
        .expect("connect");
    let mut writing = writer.begin().await.expect("begin");
    sqlx::query(
        "UPDATE s3p.queues SET settings = settings || '{\"job_retention_ms\": 18000000}' \
         WHERE name = $1",
    )
    .bind(q)
    .execute(&mut *writing)
    .await
    .expect("retention moved, not committed");

    let one_state = tokio::spawn({
        let http = common::http::Http::new(&app);
        let config = config.clone();
        async move {
            http.send(
                reqwest::Method::PUT,
                &config,
                Some(json!({"retention": {"completed": "PT1H"}})),
            )
            .await
        }
    });
    let mut probe = PgConnection::connect(&app.database_url)
        .await
        .expect("connect");
    until_waiting(&mut probe, "queue_config").await;
    writing.commit().await.expect("commit");
    let (status, body) = one_state.await.expect("put");
    assert_eq!(status.as_u16(), 400, "{body}");
    assert_eq!(body["error"]["code"], "invalid_request", "{body}");
    let detail = http.get_200(&format!("/ojs/v1/admin/queues/{q}")).await;
    assert_eq!(
        detail["configuration"]["retention"],
        json!({"completed": "PT5H", "discarded": "PT5H"}),
        "{detail}"
    );
    app.stop().await;
}
