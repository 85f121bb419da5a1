//! The OJS Admin API's workers, statistics and system routes (spec/ojs-admin-api.md sections 9,
//! 10 and 12): the worker registry fed by fetches and heartbeats, quiet delivered through the
//! next heartbeat (HTTP and gRPC), deregistering a stale worker releasing its leases, the
//! throughput rollup behind stats and history, maintenance mode across two gateways, scopes and
//! roles on every route, and the gRPC AdminService twins.

use crate::common;

use std::time::Duration;

use common::codes::grpc_code;
use common::tokens::create_token;
use common::wait::eventually;
use pgvs3::grpc::proto::ojs::v1 as pb;
use pgvs3::grpc::proto::pgvs3::v1 as s3;
use reqwest::StatusCode;
use serde_json::{Value, json};
use sqlx::{Connection, PgConnection};

common::http::module_http!(
    /// The shared HTTP client, with this module's calls.
);

impl Http {
    fn new(app: &common::TestApp) -> Self {
        Http(common::http::Http::new(app))
    }

    fn with_token(app: &common::TestApp, token: &str) -> Self {
        Http(common::http::Http::new(app).bearer(token))
    }

    /// Enqueues `n` jobs of `kind` into `queue`; their ids.
    async fn enqueue(&self, queue: &str, kind: &str, n: usize) -> Vec<String> {
        let mut ids = Vec::new();
        for i in 0..n {
            let (status, answer) = self
                .post(
                    "/ojs/v1/jobs",
                    json!({"type": kind, "args": [i], "options": {"queue": queue}}),
                )
                .await;
            assert_eq!(status, StatusCode::CREATED, "enqueue: {answer}");
            ids.push(answer["job"]["id"].as_str().expect("id").to_string());
        }
        ids
    }

    /// Fetches up to `count` jobs of `queue` as `worker`.
    async fn fetch(&self, queue: &str, worker: &str, count: i64) -> Vec<Value> {
        let answer = self
            .ok_post(
                "/ojs/v1/workers/fetch",
                json!({"queues": [queue], "count": count, "worker_id": worker,
                       "visibility_timeout_ms": 3_600_000}),
            )
            .await;
        answer["jobs"].as_array().expect("jobs").clone()
    }

    /// A heartbeat naming only the worker; the state it is told.
    async fn heartbeat(&self, worker: &str) -> String {
        let answer = self
            .ok_post("/ojs/v1/workers/heartbeat", json!({"worker_id": worker}))
            .await;
        answer["state"].as_str().expect("state").to_string()
    }

    /// Waits until the registry lists `worker` (a gateway hands sightings over every 0.5 s).
    async fn registered(&self, worker: &str) -> Value {
        let path = format!("/ojs/v1/admin/workers/{worker}");
        let mut found = Value::Null;
        eventually(
            Duration::from_secs(10),
            "the worker is registered",
            async || {
                let (status, answer) = self.get(&path).await;
                found = answer;
                status == StatusCode::OK
            },
        )
        .await;
        found
    }
}

async fn sql(url: &str, statement: &str) {
    let mut db = PgConnection::connect(url).await.expect("connect");
    sqlx::raw_sql(sqlx::AssertSqlSafe(statement.to_string()))
        .execute(&mut db)
        .await
        .expect("sql");
}

/// Makes a worker look unseen for ten minutes (past the 90 s stale interval).
async fn age_worker(url: &str, worker: &str) {
    sql(
        url,
        &format!(
            "UPDATE s3p.workers SET last_seen_at = now() - interval '10 minutes' WHERE id = '{worker}'"
        ),
    )
    .await;
}

fn is_time(v: &Value) -> bool {
    v.as_str()
        .is_some_and(|t| chrono::DateTime::parse_from_rfc3339(t).is_ok())
}

// ---------------------------------------------------------------------------------------------
// Workers

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workers_seen_in_fetches_and_heartbeats_are_listed_in_the_specs_shape() {
    let app = common::spawn_app().await;
    let http = Http::new(&app);
    http.enqueue("aw-list", "w.job", 3).await;
    assert_eq!(http.fetch("aw-list", "w-fetcher", 2).await.len(), 2);
    assert_eq!(http.heartbeat("w-beater").await, "running");

    let detail = http.registered("w-fetcher").await;
    http.registered("w-beater").await;
    assert_eq!(detail["id"], "w-fetcher");
    assert_eq!(detail["state"], "running");
    assert_eq!(detail["queues"], json!(["aw-list"]));
    assert_eq!(detail["active_jobs"], 2);
    assert!(is_time(&detail["started_at"]), "{detail}");
    assert!(is_time(&detail["last_heartbeat_at"]), "{detail}");
    let jobs = detail["jobs"].as_array().expect("detail lists its jobs");
    assert_eq!(jobs.len(), 2, "{detail}");
    assert!(
        jobs.iter()
            .all(|j| j["queue"] == "aw-list" && j["type"] == "w.job")
    );

    let list = http.get_200("/ojs/v1/admin/workers").await;
    assert_eq!(
        list["summary"],
        json!({"total": 2, "running": 2, "quiet": 0, "stale": 0})
    );
    assert_eq!(
        list["pagination"],
        json!({"total": 2, "page": 1, "per_page": 20})
    );
    let items = list["items"].as_array().expect("items");
    let ids: Vec<&str> = items.iter().filter_map(|w| w["id"].as_str()).collect();
    assert_eq!(ids, ["w-beater", "w-fetcher"], "id order: {list}");
    assert_eq!(items[1]["active_jobs"], 2);
    assert_eq!(items[0]["active_jobs"], 0);
    assert!(
        items[0].get("jobs").is_none(),
        "lists carry no jobs: {list}"
    );

    // Pagination: page 2 of size 1 is the second worker.
    let second = http
        .get_200("/ojs/v1/admin/workers?page=2&per_page=1")
        .await;
    assert_eq!(second["items"][0]["id"], "w-fetcher");
    assert_eq!(
        second["pagination"],
        json!({"total": 2, "page": 2, "per_page": 1})
    );
    let past = http
        .get_200("/ojs/v1/admin/workers?page=3&per_page=1")
        .await;
    assert_eq!(past["items"], json!([]));
    for bad in ["page=0", "per_page=1001", "per_page=-1", "page=x"] {
        let (status, answer) = http.get(&format!("/ojs/v1/admin/workers?{bad}")).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{bad}: {answer}");
        assert!(answer["error"]["code"].is_string(), "{answer}");
    }
    let (status, answer) = http.get("/ojs/v1/admin/workers/nobody").await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{answer}");
    assert_eq!(answer["error"]["code"], "not_found");

    // The dashboard's workers page reads the same core calls.
    let page = reqwest::get(format!("{}/ui/workers", app.http_url))
        .await
        .expect("GET /ui/workers");
    assert_eq!(page.status(), StatusCode::OK);
    let html = page.text().await.expect("html");
    assert!(html.contains(r#"data-worker="w-fetcher""#), "{html}");
    assert!(html.contains("2 running, 0 quiet, 0 stale"), "{html}");

    // gRPC lists the same registry.
    let mut admin = common::grpc::admin(&app.grpc_url).await;
    let listed = admin
        .list_workers(s3::ListWorkersRequest::default())
        .await
        .expect("ListWorkers")
        .into_inner();
    assert_eq!(listed.total, 2);
    assert_eq!(listed.workers[1].id, "w-fetcher");
    assert_eq!(listed.workers[1].active_jobs, 2);
    let one = admin
        .get_worker(s3::GetWorkerRequest {
            id: "w-fetcher".into(),
        })
        .await
        .expect("GetWorker")
        .into_inner()
        .worker
        .expect("worker");
    assert_eq!(one.jobs.len(), 2);
    let missing = admin
        .get_worker(s3::GetWorkerRequest {
            id: "nobody".into(),
        })
        .await
        .expect_err("unknown worker");
    assert_eq!(missing.code(), tonic::Code::NotFound);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_registry_costs_one_write_per_worker_per_interval_not_one_per_fetch() {
    let app = common::spawn_app().await;
    let http = Http::new(&app);
    http.enqueue("aw-hot", "h.job", 1).await;
    // Count every row version written to the registry.
    sql(
        &app.database_url,
        "CREATE TABLE public.registry_writes (n int);
         CREATE FUNCTION public.count_registry_write() RETURNS trigger LANGUAGE plpgsql AS
             $$ BEGIN INSERT INTO public.registry_writes VALUES (1); RETURN NULL; END $$;
         CREATE TRIGGER count_writes AFTER INSERT OR UPDATE ON s3p.workers
             FOR EACH ROW EXECUTE FUNCTION public.count_registry_write();",
    )
    .await;
    let fetch = |worker: Option<&'static str>| {
        let body = match worker {
            Some(w) => json!({"queues": ["aw-hot-empty"], "worker_id": w}),
            None => json!({"queues": ["aw-hot-empty"]}),
        };
        let http = &http;
        async move { http.ok_post("/ojs/v1/workers/fetch", body).await }
    };
    // 300 fetches and heartbeats of one worker within about 2 s; timed against as many fetches
    // naming no worker (which the registry never sees), interleaved.
    let (mut named, mut anonymous) = (Duration::ZERO, Duration::ZERO);
    let started = tokio::time::Instant::now();
    for i in 0..150 {
        let t = tokio::time::Instant::now();
        fetch(Some("w-hot")).await;
        named += t.elapsed();
        let t = tokio::time::Instant::now();
        fetch(None).await;
        anonymous += t.elapsed();
        if i % 10 == 0 {
            http.heartbeat("w-hot").await;
        }
    }
    let spent = started.elapsed();
    eprintln!(
        "150 fetches naming a worker: {:?} each; naming none: {:?} each",
        named / 150,
        anonymous / 150
    );
    http.registered("w-hot").await;
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let mut db = PgConnection::connect(&app.database_url)
        .await
        .expect("connect");
    let writes: i64 = sqlx::query_scalar("SELECT count(*) FROM public.registry_writes")
        .fetch_one(&mut db)
        .await
        .expect("count");
    // One write per WRITE_EVERY (5 s) at most, plus the first.
    let bound = 1 + spent.as_secs() as i64 / 5 + 1;
    assert!(
        (1..=bound).contains(&writes),
        "{writes} registry writes for 315 sightings in {spent:?} (at most {bound})"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quiet_reaches_the_worker_through_its_next_heartbeat_over_http_and_grpc() {
    let app = common::spawn_app().await;
    let http = Http::new(&app);
    http.enqueue("aw-quiet", "q.job", 2).await;
    let claimed = http.fetch("aw-quiet", "w-quiet", 1).await;
    assert_eq!(claimed.len(), 1);
    assert_eq!(http.heartbeat("w-quiet").await, "running");
    http.registered("w-quiet").await;

    let quieted = http
        .ok_post("/ojs/v1/admin/workers/w-quiet/quiet", json!({}))
        .await;
    assert_eq!(quieted["state"], "quiet");
    assert_eq!(http.heartbeat("w-quiet").await, "quiet");
    // A heartbeat naming the job hears it too, and its lease is still extended.
    let answer = http
        .ok_post(
            "/ojs/v1/workers/heartbeat",
            json!({"worker_id": "w-quiet", "job_id": claimed[0]["id"]}),
        )
        .await;
    assert_eq!(answer["state"], "quiet", "{answer}");
    assert_eq!(answer["jobs_extended"], json!([claimed[0]["id"]]));

    let mut ojs = app.grpc().await;
    let beat = ojs
        .heartbeat(pb::HeartbeatRequest {
            worker_id: "w-quiet".into(),
            ..Default::default()
        })
        .await
        .expect("gRPC heartbeat")
        .into_inner();
    assert_eq!(beat.directed_state(), pb::WorkerState::Quiet);

    // Quiet over gRPC; the HTTP heartbeat of that worker hears it.
    assert_eq!(http.heartbeat("w-other").await, "running");
    http.registered("w-other").await;
    let mut admin = common::grpc::admin(&app.grpc_url).await;
    let quiet = admin
        .quiet_worker(s3::QuietWorkerRequest {
            id: "w-other".into(),
        })
        .await
        .expect("QuietWorker")
        .into_inner();
    assert_eq!(quiet.worker.expect("worker").state, "quiet");
    assert_eq!(http.heartbeat("w-other").await, "quiet");
    let list = http.get_200("/ojs/v1/admin/workers").await;
    assert_eq!(list["summary"]["quiet"], 2, "{list}");

    // Quieting an unknown worker is 404 over both protocols.
    let (status, _) = http
        .post("/ojs/v1/admin/workers/ghost/quiet", json!({}))
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let err = admin
        .quiet_worker(s3::QuietWorkerRequest { id: "ghost".into() })
        .await
        .expect_err("unknown");
    assert_eq!(err.code(), tonic::Code::NotFound);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deregistering_a_stale_worker_releases_its_leases_for_redelivery() {
    let app = common::spawn_app().await;
    let http = Http::new(&app);
    let ids = http.enqueue("aw-dereg", "d.job", 2).await;
    assert_eq!(http.fetch("aw-dereg", "w-gone", 2).await.len(), 2);
    http.registered("w-gone").await;

    // Still seen: refused, nothing changes.
    let (status, answer) = http.delete("/ojs/v1/admin/workers/w-gone").await;
    assert_eq!(status, StatusCode::CONFLICT, "{answer}");
    assert_eq!(answer["error"]["code"], "conflict");
    assert!(http.fetch("aw-dereg", "w-next", 2).await.is_empty());

    age_worker(&app.database_url, "w-gone").await;
    let stale = http.get_200("/ojs/v1/admin/workers/w-gone").await;
    assert_eq!(stale["state"], "stale");
    let list = http.get_200("/ojs/v1/admin/workers").await;
    assert_eq!(list["summary"]["stale"], 1, "{list}");

    let gone = http.delete("/ojs/v1/admin/workers/w-gone").await;
    assert_eq!(gone.0, StatusCode::OK, "{}", gone.1);
    assert_eq!(
        gone.1,
        json!({"id": "w-gone", "deregistered": true, "released_jobs": 2})
    );
    let (status, _) = http.get("/ojs/v1/admin/workers/w-gone").await;
    assert_eq!(status, StatusCode::NOT_FOUND);

    // Another worker gets both jobs again, as a new attempt.
    let again = http.fetch("aw-dereg", "w-next", 2).await;
    let mut got: Vec<String> = again
        .iter()
        .map(|j| j["id"].as_str().expect("id").to_string())
        .collect();
    got.sort();
    let mut want = ids.clone();
    want.sort();
    assert_eq!(got, want);
    assert!(again.iter().all(|j| j["attempt"] == 2), "{again:?}");

    // gRPC: unknown is NOT_FOUND, a running worker ABORTED-as-conflict unless forced.
    let mut admin = common::grpc::admin(&app.grpc_url).await;
    let err = admin
        .deregister_worker(s3::DeregisterWorkerRequest {
            id: "w-gone".into(),
            force: false,
        })
        .await
        .expect_err("deregistered already");
    assert_eq!(err.code(), tonic::Code::NotFound);
    http.registered("w-next").await;
    let err = admin
        .deregister_worker(s3::DeregisterWorkerRequest {
            id: "w-next".into(),
            force: false,
        })
        .await
        .expect_err("running");
    assert_eq!(grpc_code(&err), "conflict");
    let forced = admin
        .deregister_worker(s3::DeregisterWorkerRequest {
            id: "w-next".into(),
            force: true,
        })
        .await
        .expect("forced")
        .into_inner();
    assert_eq!(forced.released_jobs, 2);
}

// ---------------------------------------------------------------------------------------------
// Stats

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stats_and_history_count_the_work_done_from_the_rollup() {
    let app = common::spawn_app().await;
    let http = Http::new(&app);
    http.enqueue("aw-stats", "s.job", 3).await;
    http.enqueue("aw-stats-other", "s.job", 1).await;
    let claimed = http.fetch("aw-stats", "w-stats", 3).await;
    assert_eq!(claimed.len(), 3);
    for job in &claimed[..2] {
        http.ok_post(
            "/ojs/v1/workers/ack",
            json!({"job_id": job["id"], "lease_token": job["lease_token"]}),
        )
        .await;
    }
    http.ok_post(
        "/ojs/v1/workers/nack",
        json!({"job_id": claimed[2]["id"], "lease_token": claimed[2]["lease_token"],
               "error": {"code": "boom", "message": "failed"}}),
    )
    .await;

    let sum = |history: &Value, field: &str| -> i64 {
        history["data"]
            .as_array()
            .expect("data")
            .iter()
            .map(|p| p[field].as_i64().expect("count"))
            .sum()
    };
    let mut history = Value::Null;
    eventually(
        Duration::from_secs(15),
        "the rollup counts the work",
        async || {
            history = http
                .get_200("/ojs/v1/admin/stats/history?period=1m&queue=aw-stats")
                .await;
            sum(&history, "processed") == 2 && sum(&history, "failed") == 1
        },
    )
    .await;
    assert_eq!(history["period"], "1m");
    assert_eq!(sum(&history, "enqueued"), 3, "{history}");
    let points = history["data"].as_array().expect("data");
    assert!(points.len() >= 60, "an hour of minutes: {}", points.len());
    assert!(points.iter().all(|p| is_time(&p["timestamp"])));

    let all = http.get_200("/ojs/v1/admin/stats/history").await;
    assert_eq!(all["period"], "5m", "the default period");
    assert_eq!(sum(&all, "enqueued"), 4, "{all}");
    let other = http
        .get_200("/ojs/v1/admin/stats/history?period=1h&queue=aw-stats-other")
        .await;
    assert_eq!(sum(&other, "enqueued"), 1, "{other}");
    assert_eq!(sum(&other, "processed"), 0, "{other}");

    let stats = http.get_200("/ojs/v1/admin/stats").await;
    assert_eq!(stats["queues"], 2, "{stats}");
    assert_eq!(stats["jobs"]["completed"], 2, "{stats}");
    assert!(stats["jobs"]["available"].as_i64().expect("n") >= 1);
    for state in [
        "available",
        "active",
        "scheduled",
        "retryable",
        "completed",
        "discarded",
        "cancelled",
    ] {
        assert!(stats["jobs"][state].is_i64(), "{state}: {stats}");
    }
    assert!(
        stats["throughput"]["processed_per_minute"]
            .as_f64()
            .expect("f")
            > 0.0
    );
    assert!(
        stats["throughput"]["failed_per_minute"]
            .as_f64()
            .expect("f")
            > 0.0
    );
    assert_eq!(stats["workers"], 1, "{stats}");
    assert!(stats["uptime_seconds"].is_i64());

    for bad in [
        "period=2m",
        "since=yesterday",
        "since=2026-01-02T00:00:00Z&until=2026-01-01T00:00:00Z",
        "period=1m&since=2026-01-01T00:00:00Z&until=2026-01-03T00:00:00Z",
        "queue=Bad%20Name",
    ] {
        let (status, answer) = http
            .get(&format!("/ojs/v1/admin/stats/history?{bad}"))
            .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{bad}: {answer}");
        assert_eq!(
            answer["error"]["code"], "invalid_request",
            "{bad}: {answer}"
        );
    }

    // gRPC reads the same figures.
    let mut admin = common::grpc::admin(&app.grpc_url).await;
    let g = admin
        .get_stats(s3::GetStatsRequest {})
        .await
        .expect("GetStats")
        .into_inner();
    assert_eq!(g.queues, 2);
    assert_eq!(g.jobs.get("completed"), Some(&2));
    let h = admin
        .get_stats_history(s3::GetStatsHistoryRequest {
            period: "1m".into(),
            queue: "aw-stats".into(),
            ..Default::default()
        })
        .await
        .expect("GetStatsHistory")
        .into_inner();
    assert_eq!(h.data.iter().map(|p| p.processed).sum::<i64>(), 2);
    let err = admin
        .get_stats_history(s3::GetStatsHistoryRequest {
            period: "7m".into(),
            ..Default::default()
        })
        .await
        .expect_err("bad period");
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
}

// ---------------------------------------------------------------------------------------------
// System

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn maintenance_mode_holds_across_two_gateways() {
    let (database, url) = common::fresh_database().await;
    let a = common::spawn_app_on(&database, &url, |_| {}).await;
    let b = common::spawn_app_on(&database, &url, |_| {}).await;
    let (ha, hb) = (Http::new(&a), Http::new(&b));

    let off = ha.get_200("/ojs/v1/admin/system/maintenance").await;
    assert_eq!(off["maintenance"], false);
    assert_eq!(off["enabled"], false);
    hb.enqueue("aw-early", "m.early", 1).await;

    let on = ha
        .ok_post(
            "/ojs/v1/admin/system/maintenance",
            json!({"enabled": true, "reason": "database migration", "estimated_duration": "PT30M"}),
        )
        .await;
    assert_eq!(on["maintenance"], true, "{on}");
    // At once on the other gateway too (its claims read the mode in the database), not after
    // its next tick.
    assert!(hb.fetch("aw-early", "w-b", 5).await.is_empty());
    assert_eq!(on["enabled"], true);
    assert_eq!(on["reason"], "database migration");
    assert!(
        is_time(&on["enabled_at"]) && is_time(&on["estimated_end"]),
        "{on}"
    );
    assert_eq!(on["started_at"], on["enabled_at"]);
    let seen_by_b = hb.get_200("/ojs/v1/admin/system/maintenance").await;
    assert_eq!(seen_by_b["maintenance"], true);
    assert_eq!(seen_by_b["reason"], "database migration");

    // Within two ticks every gateway follows; enqueues are still accepted.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let ids = hb.enqueue("aw-maint", "m.job", 1).await;
    assert_eq!(ha.enqueue("aw-maint", "m.job", 1).await.len(), 1);
    assert!(ha.fetch("aw-maint", "w-a", 5).await.is_empty());
    assert!(hb.fetch("aw-maint", "w-b", 5).await.is_empty());
    // A long poll answers nothing after its wait, not at once.
    let started = tokio::time::Instant::now();
    let polled = hb
        .ok_post(
            "/ojs/v1/workers/fetch",
            json!({"queues": ["aw-maint"], "wait_ms": 300}),
        )
        .await;
    assert_eq!(polled["jobs"], json!([]));
    assert!(started.elapsed() >= Duration::from_millis(250));
    let mut ojs = b.grpc().await;
    let fetched = ojs
        .fetch(pb::FetchRequest {
            queues: vec!["aw-maint".into()],
            count: 5,
            ..Default::default()
        })
        .await
        .expect("gRPC fetch")
        .into_inner();
    assert!(fetched.jobs.is_empty());

    // Off through the other gateway (and over gRPC): both deliver again.
    let mut admin = common::grpc::admin(&b.grpc_url).await;
    let status = admin
        .set_maintenance(s3::SetMaintenanceRequest {
            enabled: false,
            ..Default::default()
        })
        .await
        .expect("SetMaintenance")
        .into_inner();
    assert!(!status.enabled);
    let mut got = Vec::new();
    eventually(
        Duration::from_secs(5),
        "gateway A delivers again",
        async || {
            got.extend(ha.fetch("aw-maint", "w-a", 5).await);
            got.len() == 2
        },
    )
    .await;
    assert!(got.iter().any(|j| j["id"] == ids[0].as_str()), "{got:?}");
    let off = admin
        .get_maintenance(s3::GetMaintenanceRequest {})
        .await
        .expect("GetMaintenance")
        .into_inner();
    assert!(!off.enabled && off.reason.is_empty());

    // Bad input is refused and changes nothing.
    for bad in [
        json!({"reason": "no enabled"}),
        json!({"enabled": "yes"}),
        json!({"enabled": true, "estimated_duration": "soon"}),
        json!({"enabled": true, "estimated_end": "tomorrow"}),
    ] {
        let (status, answer) = ha
            .post("/ojs/v1/admin/system/maintenance", bad.clone())
            .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{bad}: {answer}");
    }
    let still_off = hb.get_200("/ojs/v1/admin/system/maintenance").await;
    assert_eq!(still_off["maintenance"], false);

    let config = ha.get_200("/ojs/v1/admin/system/config").await;
    assert!(config["version"].is_string());
    assert!(config["max_fetch_count"].is_i64(), "{config}");
    let text = config.to_string();
    assert!(
        !text.contains("postgres://") && !text.contains(&url),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn manifest_declares_the_extension_and_cron_entries_carry_a_status() {
    let app = common::spawn_app().await;
    let http = Http::new(&app);
    let manifest = http.get_200("/ojs/manifest").await;
    assert!(
        manifest["extensions"]
            .as_array()
            .expect("extensions")
            .contains(&json!("urn:ojs:ext:admin-api")),
        "{manifest}"
    );
    let created = http
        .ok_post(
            "/ojs/v1/cron",
            json!({"name": "nightly", "expression": "0 3 * * *", "type": "c.job"}),
        )
        .await;
    assert_eq!(created["cron"]["status"], "active", "{created}");
    assert_eq!(created["cron"]["enabled"], true);
    let list = http.get_200("/ojs/v1/cron").await;
    assert_eq!(list["crons"][0]["status"], "active", "{list}");
    let mut ojs = app.grpc().await;
    let listed = ojs
        .list_cron(pb::ListCronRequest::default())
        .await
        .expect("ListCron")
        .into_inner();
    assert_eq!(listed.entries[0].status, "active");

    // The admin UI's cron routes: numbered pages, detail, pause and resume, delete.
    let page = http.get_200("/ojs/v1/crons?page=1&per_page=25").await;
    assert_eq!(
        page["pagination"],
        json!({"total": 1, "page": 1, "per_page": 25})
    );
    let entry = &page["items"][0];
    assert_eq!(
        (
            &entry["id"],
            &entry["schedule"],
            &entry["type"],
            &entry["queue"],
            &entry["status"]
        ),
        (
            &json!("nightly"),
            &json!("0 3 * * *"),
            &json!("c.job"),
            &json!("default"),
            &json!("active")
        ),
        "{page}"
    );
    let paused = http
        .send(
            reqwest::Method::PATCH,
            "/ojs/v1/crons/nightly",
            Some(json!({"enabled": false})),
        )
        .await;
    assert_eq!(paused.0, StatusCode::OK, "{}", paused.1);
    assert_eq!(
        (&paused.1["enabled"], &paused.1["status"]),
        (&json!(false), &json!("paused"))
    );
    assert_eq!(
        http.get_200("/ojs/v1/cron").await["crons"][0]["status"],
        "paused"
    );
    assert_eq!(
        http.get_200("/ojs/v1/crons/nightly").await["status"],
        "paused"
    );
    let resumed = http
        .send(
            reqwest::Method::PATCH,
            "/ojs/v1/crons/nightly",
            Some(json!({"enabled": true})),
        )
        .await;
    assert_eq!(resumed.1["status"], "active", "{}", resumed.1);
    assert!(is_time(&resumed.1["next_run_at"]), "{}", resumed.1);
    let (status, _) = http
        .send(
            reqwest::Method::PATCH,
            "/ojs/v1/crons/nightly",
            Some(json!({"enabled": "no"})),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let (status, _) = http.get("/ojs/v1/crons/missing").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, _) = http.get("/ojs/v1/crons?per_page=0&page=0").await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let (status, removed) = http.delete("/ojs/v1/crons/nightly").await;
    assert_eq!(
        (status, &removed["id"]),
        (StatusCode::OK, &json!("nightly"))
    );
    assert_eq!(http.get_200("/ojs/v1/crons").await["items"], json!([]));
}

// ---------------------------------------------------------------------------------------------
// Scopes and roles

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scopes_and_roles_apply_to_every_admin_route() {
    let app = common::spawn_app_with(|s| s.auth = true).await;
    let url = &app.database_url;
    let admin = Http::with_token(&app, &create_token(url, "ops", &["admin"], None));
    let reader = Http::with_token(&app, &create_token(url, "watch", &["reader"], None));
    let scoped = Http::with_token(
        &app,
        &create_token(url, "pub-reader", &["reader"], Some("pub.*")),
    );
    let scoped_admin = Http::with_token(
        &app,
        &create_token(url, "pub-admin", &["admin"], Some("pub.*")),
    );
    admin.enqueue("pub.mail", "p.job", 1).await;
    admin.enqueue("vault", "v.job", 2).await;
    assert_eq!(admin.fetch("pub.mail", "w-pub", 1).await.len(), 1);
    assert_eq!(admin.fetch("vault", "w-vault", 2).await.len(), 2);
    admin.registered("w-pub").await;
    admin.registered("w-vault").await;

    // Lists: the scoped reader sees only the worker of its queues.
    let all = reader.get_200("/ojs/v1/admin/workers").await;
    assert_eq!(all["summary"]["total"], 2, "{all}");
    let mine = scoped.get_200("/ojs/v1/admin/workers").await;
    assert_eq!(mine["summary"]["total"], 1, "{mine}");
    assert_eq!(mine["items"][0]["id"], "w-pub");
    let (status, _) = scoped.get("/ojs/v1/admin/workers/w-vault").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let stats = scoped.get_200("/ojs/v1/admin/stats").await;
    assert_eq!(stats["queues"], 1, "{stats}");
    assert_eq!(stats["jobs"]["active"], 1, "{stats}");
    let (status, answer) = scoped.get("/ojs/v1/admin/stats/history?queue=vault").await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{answer}");
    let mut history = Value::Null;
    eventually(Duration::from_secs(15), "the rollup counts", async || {
        history = reader
            .get_200("/ojs/v1/admin/stats/history?period=1m")
            .await;
        history["data"].as_array().is_some_and(|d| {
            d.iter()
                .map(|p| p["enqueued"].as_i64().unwrap_or(0))
                .sum::<i64>()
                == 3
        })
    })
    .await;
    let scoped_history = scoped
        .get_200("/ojs/v1/admin/stats/history?period=1m")
        .await;
    let enqueued: i64 = scoped_history["data"]
        .as_array()
        .expect("data")
        .iter()
        .map(|p| p["enqueued"].as_i64().unwrap_or(0))
        .sum();
    assert_eq!(enqueued, 1, "only pub.* counts: {scoped_history}");

    // Writes need admin; a scoped admin acts only on its workers.
    for (method, path) in [
        (reqwest::Method::POST, "/ojs/v1/admin/workers/w-pub/quiet"),
        (reqwest::Method::DELETE, "/ojs/v1/admin/workers/w-pub"),
        (reqwest::Method::POST, "/ojs/v1/admin/system/maintenance"),
    ] {
        let (status, answer) = reader
            .send(method.clone(), path, Some(json!({"enabled": true})))
            .await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{method} {path}: {answer}");
    }
    assert_eq!(
        reader.get_200("/ojs/v1/admin/system/maintenance").await["maintenance"],
        false
    );
    // Maintenance mode holds every queue: an admin scoped to some may not switch it.
    let (status, answer) = scoped_admin
        .post("/ojs/v1/admin/system/maintenance", json!({"enabled": true}))
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{answer}");
    assert_eq!(
        reader.get_200("/ojs/v1/admin/system/maintenance").await["maintenance"],
        false
    );
    let (status, _) = scoped_admin
        .post("/ojs/v1/admin/workers/w-vault/quiet", json!({}))
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let quieted = scoped_admin
        .ok_post("/ojs/v1/admin/workers/w-pub/quiet", json!({}))
        .await;
    assert_eq!(quieted["state"], "quiet");
    // A heartbeat through a token of other queues neither hears nor refreshes vault's worker.
    admin
        .ok_post("/ojs/v1/admin/workers/w-vault/quiet", json!({}))
        .await;
    assert_eq!(scoped_admin.heartbeat("w-vault").await, "running");
    assert_eq!(admin.heartbeat("w-vault").await, "quiet");
    let (status, _) = Http::new(&app).get("/ojs/v1/admin/workers").await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
}
