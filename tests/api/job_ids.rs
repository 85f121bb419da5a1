//! Job ids without a cross-queue index (#28, decision 2): an id the server mints carries its
//! queue's tag, so it needs no `s3p.job_index` row; ids clients give keep theirs. Either way every
//! lookup by id finds the job from any gateway, and an id is unique across queues.

use crate::common;

use reqwest::StatusCode;
use serde_json::{Value, json};
use sqlx::{Connection, PgConnection};

/// Two queue names whose tags (first three bytes of the SHA-256 of the name) are equal: 92cdc9.
const TWINS: [&str; 2] = ["tagged-6", "tagged-3321"];

async fn connect(app: &common::TestApp) -> PgConnection {
    PgConnection::connect(&app.database_url)
        .await
        .expect("connect")
}

async fn indexed(db: &mut PgConnection, id: &str) -> bool {
    sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM s3p.job_index WHERE id = $1::uuid)")
        .bind(id)
        .fetch_one(db)
        .await
        .expect("index probe")
}

fn id_of(job: &Value) -> String {
    job["job"]["id"]
        .as_str()
        .or(job["id"].as_str())
        .expect("id")
        .to_string()
}

#[tokio::test]
async fn a_minted_id_carries_its_queue_and_has_no_index_row() {
    let (database, url) = common::fresh_database().await;
    let app = common::spawn_app_on(&database, &url, |_| {}).await;
    let http = common::http::Http::new(&app);
    let mut db = connect(&app).await;
    let single = http
        .ok_post(
            "/ojs/v1/jobs",
            json!({"type": "ids.t", "args": [], "options": {"queue": "minted"}}),
        )
        .await;
    let batch = http
        .ok_post(
            "/ojs/v1/jobs/batch",
            json!({"jobs": [
                {"type": "ids.t", "args": [1], "options": {"queue": "minted"}},
                {"type": "ids.t", "args": [2], "options": {"queue": "other"}},
            ]}),
        )
        .await;
    let mut ids = vec![(id_of(&single), "minted")];
    for (job, queue) in batch["jobs"]
        .as_array()
        .expect("jobs")
        .iter()
        .zip(["minted", "other"])
    {
        ids.push((id_of(job), queue));
    }
    for (id, queue) in &ids {
        let uuid: uuid::Uuid = id.parse().expect("uuid");
        assert_eq!(uuid.get_version_num(), 7, "minted ids stay UUIDv7: {id}");
        // Rust's tag (in the id) and SQL's (from the name) agree.
        let tagged: bool = sqlx::query_scalar(
            "SELECT s3p.job_id_tag($1::uuid) = q.id_tag AND q.id_tag = s3p.queue_id_tag($2)
               FROM s3p.queues q WHERE q.name = $2",
        )
        .bind(id)
        .bind(queue)
        .fetch_one(&mut db)
        .await
        .expect("tag");
        assert!(tagged, "{id} carries the tag of {queue}");
        assert!(!indexed(&mut db, id).await, "{id} has no index row");
        let job = http.ok_get(&format!("/ojs/v1/jobs/{id}")).await;
        assert_eq!(job["job"]["queue"], *queue, "{job}");
    }
    // A cancel and a second gateway's lookup find it as well.
    let second = common::spawn_app_on(&database, &url, |_| {}).await;
    let other = common::http::Http::new(&second);
    let (status, body) = other.delete(&format!("/ojs/v1/jobs/{}", ids[0].0)).await;
    assert!(status.is_success(), "{status} {body}");
    let job = other.ok_get(&format!("/ojs/v1/jobs/{}", ids[0].0)).await;
    assert_eq!(job["job"]["state"], "cancelled", "{job}");
}

#[tokio::test]
async fn an_id_is_unique_across_queues_whether_minted_or_given() {
    let app = common::spawn_app().await;
    let http = common::http::Http::new(&app);
    let mut db = connect(&app).await;
    let minted = id_of(
        &http
            .ok_post(
                "/ojs/v1/jobs",
                json!({"type": "ids.t", "args": [], "options": {"queue": "first"}}),
            )
            .await,
    );
    // A client reusing a minted id: 409 in the same queue, in another, single or batched.
    for queue in ["first", "second"] {
        let (status, body) = http
            .post(
                "/ojs/v1/jobs",
                json!({"id": minted, "type": "ids.t", "args": [], "options": {"queue": queue}}),
            )
            .await;
        assert_eq!(status, StatusCode::CONFLICT, "{queue}: {body}");
        let (status, body) = http
            .post(
                "/ojs/v1/jobs/batch",
                json!({"jobs": [{"id": minted, "type": "ids.t", "args": [], "options": {"queue": queue}}]}),
            )
            .await;
        assert_eq!(status, StatusCode::CONFLICT, "{queue} batch: {body}");
    }
    // A given id is indexed, and taken for every queue after.
    let given = uuid::Uuid::now_v7().to_string();
    http.ok_post(
        "/ojs/v1/jobs",
        json!({"id": given, "type": "ids.t", "args": [], "options": {"queue": "first"}}),
    )
    .await;
    assert!(indexed(&mut db, &given).await, "a given id is indexed");
    let (status, body) = http
        .post(
            "/ojs/v1/jobs",
            json!({"id": given, "type": "ids.t", "args": [], "options": {"queue": "second"}}),
        )
        .await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    // Nothing was stored by the refusals.
    let stored: i64 =
        sqlx::query_scalar("SELECT count(*) FROM s3p.job_queues(ARRAY[$1::uuid, $2::uuid])")
            .bind(&minted)
            .bind(&given)
            .fetch_one(&mut db)
            .await
            .expect("count");
    assert_eq!(stored, 2);
    let second_jobs = http.ok_get("/ojs/v1/queues").await;
    let second = second_jobs["queues"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|q| q["name"] == "second");
    assert!(
        second.is_none_or(|q| q["counts"]["available"] == 0),
        "{second_jobs}"
    );
}

#[tokio::test]
async fn queues_sharing_a_tag_keep_their_jobs_apart() {
    let (database, url) = common::fresh_database().await;
    let app = common::spawn_app_on(&database, &url, |_| {}).await;
    let http = common::http::Http::new(&app);
    let mut db = connect(&app).await;
    let mut ids = Vec::new();
    for queue in TWINS {
        let job = http
            .ok_post(
                "/ojs/v1/jobs",
                json!({"type": "ids.twin", "args": [queue], "options": {"queue": queue}}),
            )
            .await;
        ids.push(id_of(&job));
    }
    let same: bool = sqlx::query_scalar(
        "SELECT count(DISTINCT id_tag) = 1 FROM s3p.queues WHERE name = ANY ($1)",
    )
    .bind(TWINS.to_vec())
    .fetch_one(&mut db)
    .await
    .expect("tags");
    assert!(same, "the two queues share a tag");
    for (id, queue) in ids.iter().zip(TWINS) {
        let job = http.ok_get(&format!("/ojs/v1/jobs/{id}")).await;
        assert_eq!(job["job"]["queue"], queue, "{job}");
    }
    // Claimed on one gateway, acked (batch) and heartbeaten on another, which knows neither job:
    // the catalog paths (s3p.ack_many, s3p.heartbeat) find each in its own queue.
    let second = common::spawn_app_on(&database, &url, |_| {}).await;
    let other = common::http::Http::new(&second);
    let fetched = http
        .ok_post(
            "/ojs/v1/workers/fetch",
            json!({"queues": TWINS, "count": 2, "worker_id": "w-twins"}),
        )
        .await;
    let claimed = fetched["jobs"].as_array().cloned().unwrap_or_default();
    assert_eq!(claimed.len(), 2, "{fetched}");
    let beat = other
        .ok_post(
            "/ojs/v1/workers/heartbeat",
            json!({"worker_id": "w-twins", "active_jobs": ids}),
        )
        .await;
    let extended = beat["jobs_extended"].as_array().map(Vec::len).unwrap_or(0);
    assert_eq!(extended, 2, "{beat}");
    let acks: Vec<Value> = claimed
        .iter()
        .map(|j| json!({"job_id": j["id"], "lease_token": j["lease_token"]}))
        .collect();
    let acked = other
        .ok_post("/ojs/v1/workers/ack/batch", json!({ "acks": acks }))
        .await;
    assert_eq!(acked["acknowledged"], 2, "{acked}");
    for (id, queue) in ids.iter().zip(TWINS) {
        let job = other.ok_get(&format!("/ojs/v1/jobs/{id}")).await;
        assert_eq!(job["job"]["state"], "completed", "{job}");
        assert_eq!(job["job"]["queue"], queue, "{job}");
    }
}

#[tokio::test]
async fn retention_counts_the_jobs_it_removes_without_index_rows() {
    let app = common::spawn_app().await;
    let http = common::http::Http::new(&app);
    let mut db = connect(&app).await;
    let given = uuid::Uuid::now_v7().to_string();
    http.ok_post(
        "/ojs/v1/jobs/batch",
        json!({"jobs": [
            {"type": "ids.old", "args": [], "options": {"queue": "kept"}},
            {"id": given, "type": "ids.old", "args": [], "options": {"queue": "kept"}},
        ]}),
    )
    .await;
    sqlx::query(
        "UPDATE s3q_kept.jobs SET state = 'completed', completed_at = now() - interval '2 days'",
    )
    .execute(&mut db)
    .await
    .expect("age");
    let removed: i32 = sqlx::query_scalar("SELECT removed FROM s3q_kept.maintain(3600000, 100)")
        .fetch_one(&mut db)
        .await
        .expect("maintain");
    assert_eq!(removed, 2, "both jobs removed and counted");
    assert!(
        !indexed(&mut db, &given).await,
        "the given id's index row went with it"
    );
}
