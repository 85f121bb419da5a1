//! The OJS Admin API's queues, jobs, bulk actions, dead letters and workflow list
//! (`/ojs/v1/admin/...`, spec ojs-admin-api.md sections 6-8 and 11; ADM-001..003, 007, R001,
//! R005, R006): each answer's shape as in the spec's examples, pagination and filters, the
//! `confirm` interlocks (a refusal changes nothing), bulk actions racing a worker (no job both
//! changed and acked), queue scopes on every admin route, the reader role refused every write,
//! and the gRPC `AdminService` answering as the HTTP routes do.

use crate::common;

use std::collections::HashSet;

use common::codes::{error_code, grpc_code};
use common::tokens::create_token;
use pgvs3::grpc::proto::pgvs3::v1 as ext;
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

common::http::module_http!();

impl Http {
    fn of(app: &common::TestApp) -> Http {
        Http(common::http::Http::new(app))
    }

    fn bearer(app: &common::TestApp, token: &str) -> Http {
        Http(common::http::Http::new(app).bearer(token))
    }

    async fn enqueue(&self, queue: &str, job_type: &str, extra: Value) -> String {
        let mut options = json!({"queue": queue});
        if let (Some(o), Some(e)) = (options.as_object_mut(), extra.as_object()) {
            o.extend(e.clone());
        }
        let answer = self
            .ok_post(
                "/ojs/v1/jobs",
                json!({"type": job_type, "args": [1], "options": options}),
            )
            .await;
        answer["job"]["id"].as_str().expect("job id").to_string()
    }

    /// Fetches up to `count` jobs of `queue` for worker `w`: (id, lease token).
    async fn fetch(&self, queue: &str, count: usize) -> Vec<(String, String)> {
        let answer = self
            .ok_post(
                "/ojs/v1/workers/fetch",
                json!({"queues": [queue], "count": count, "worker_id": "w"}),
            )
            .await;
        answer["jobs"]
            .as_array()
            .expect("jobs")
            .iter()
            .map(|j| {
                (
                    j["id"].as_str().expect("id").to_string(),
                    j["lease_token"].as_str().unwrap_or_default().to_string(),
                )
            })
            .collect()
    }

    /// A job of `queue` that failed its only attempt: discarded, with one error (its top
    /// priority makes it the one fetched).
    async fn discarded(&self, queue: &str, job_type: &str) -> String {
        let id = self
            .enqueue(
                queue,
                job_type,
                json!({"priority": 100, "retry": {"max_attempts": 1}}),
            )
            .await;
        let fetched = self.fetch(queue, 1).await;
        assert_eq!(fetched[0].0, id);
        self.ok_post(
            "/ojs/v1/workers/nack",
            json!({"job_id": id, "lease_token": fetched[0].1,
                   "error": {"type": "ConnectionError", "message": "SMTP connection refused"}}),
        )
        .await;
        id
    }

    async fn state(&self, id: &str) -> String {
        let job = self.get_200(&format!("/ojs/v1/jobs/{id}")).await;
        job["job"]["state"].as_str().expect("state").to_string()
    }

    async fn ids(&self, path: &str) -> Vec<String> {
        let answer = self.get_200(path).await;
        answer["items"]
            .as_array()
            .unwrap_or_else(|| panic!("{path}: {answer}"))
            .iter()
            .map(|j| j["id"].as_str().expect("id").to_string())
            .collect()
    }

    async fn send_json(&self, method: Method, path: &str, body: Value) -> (StatusCode, Value) {
        self.send(method, path, Some(body)).await
    }
}

/// A gRPC request carrying `token`.
fn authed<T>(token: &str, message: T) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    request.metadata_mut().insert(
        "authorization",
        format!("Bearer {token}").parse().expect("metadata"),
    );
    request
}

fn sorted(mut ids: Vec<String>) -> Vec<String> {
    ids.sort();
    ids
}

/// ADM-001, ADM-002, 6.2, 6.6: the queue list and detail as in the spec's examples, paged;
/// pause and resume; the configuration update maps rate limit and retention and names what it
/// refuses.
#[tokio::test]
async fn queues_list_detail_pause_and_config_have_the_specs_shape() {
    let app = common::spawn_app().await;
    let http = Http::of(&app);
    for _ in 0..3 {
        http.enqueue("email", "email.send", json!({})).await;
    }
    http.enqueue("billing", "invoice.generate", json!({})).await;

    let list = http.get_200("/ojs/v1/admin/queues").await;
    assert_eq!(
        list["pagination"],
        json!({"total": 2, "page": 1, "per_page": 20, "total_exact": true})
    );
    let email = &list["items"][1];
    assert_eq!(email["name"], "email");
    assert_eq!(email["state"], "active");
    assert_eq!(email["paused"], false);
    assert!(
        email["created_at"]
            .as_str()
            .is_some_and(|t| t.ends_with('Z'))
    );
    for state in [
        "available",
        "active",
        "scheduled",
        "retryable",
        "completed",
        "discarded",
        "cancelled",
    ] {
        assert!(email["counts"][state].is_i64(), "counts.{state}: {email}");
    }
    assert_eq!(email["counts"]["available"], 3);
    assert!(email["throughput"]["processed_per_minute"].is_number());

    let second = http.get_200("/ojs/v1/admin/queues?page=2&per_page=1").await;
    assert_eq!(second["items"].as_array().map(Vec::len), Some(1));
    assert_eq!(second["items"][0]["name"], "email");
    assert_eq!(second["pagination"]["page"], 2);
    let (status, body) = http.get("/ojs/v1/admin/queues?per_page=101").await;
    assert_eq!(
        (status, error_code(&body)),
        (StatusCode::BAD_REQUEST, "invalid_request")
    );

    let paused = http
        .ok_post("/ojs/v1/admin/queues/email/pause", json!({}))
        .await;
    assert_eq!(paused, json!({"name": "email", "paused": true}));
    let fetched = http.fetch("email", 1).await;
    assert!(fetched.is_empty(), "a paused queue delivers nothing");
    let detail = http.get_200("/ojs/v1/admin/queues/email").await;
    assert_eq!(
        (detail["state"].clone(), detail["paused"].clone()),
        (json!("paused"), json!(true))
    );
    assert_eq!(detail["counts"]["available"], 3);
    assert_eq!(
        detail["configuration"]["retention"],
        json!({"completed": "P1D", "discarded": "P1D"})
    );
    assert!(
        detail["oldest_available_at"]
            .as_str()
            .is_some_and(|t| t.ends_with('Z'))
    );
    let resumed = http
        .ok_post("/ojs/v1/admin/queues/email/resume", json!({}))
        .await;
    assert_eq!(resumed["paused"], false);
    assert_eq!(http.fetch("email", 1).await.len(), 1);

    let (status, body) = http.get("/ojs/v1/admin/queues/nowhere").await;
    assert_eq!(
        (status, error_code(&body)),
        (StatusCode::NOT_FOUND, "not_found")
    );

    let put_config =
        |body: Value| http.send_json(Method::PUT, "/ojs/v1/admin/queues/email/config", body);
    let (status, body) = put_config(json!({"rate_limit": {"limit": 7200, "period": "PT1H"}, "retention": {"completed": "P7D", "discarded": "P7D"}})).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    // The limit reads back as it was given, not as the claims per second it is stored as.
    assert_eq!(
        body["configuration"]["rate_limit"],
        json!({"limit": 7200.0, "period": "PT1H"})
    );
    assert_eq!(body["configuration"]["retention"]["completed"], "P7D");
    for (given, read) in [
        (
            json!({"limit": 10, "period": "PT1M"}),
            json!({"limit": 10.0, "period": "PT1M"}),
        ),
        // Stored as a rate, multiplied back: 13.000000000000002 unless rounded.
        (
            json!({"limit": 13, "period": "P1D"}),
            json!({"limit": 13.0, "period": "PT24H"}),
        ),
        (json!({"limit": 3}), json!({"limit": 3.0, "period": "PT1S"})),
        (Value::Null, Value::Null),
    ] {
        let (status, body) = put_config(json!({ "rate_limit": given })).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        let detail = http.get_200("/ojs/v1/admin/queues/email").await;
        assert_eq!(detail["configuration"]["rate_limit"], read, "{given}");
    }
    // Periods of whole seconds, at least one (a shorter one let a burst past its limit, and a
    // fraction rounded away changed the rate), written as ISO 8601 allows; rates any API sets
    // stay between one a day and 1e9 a second (a job's 3e9 made every fetch of its queue a 500).
    for bad in [
        json!({"limit": 1, "period": "PT0.1S"}),
        json!({"limit": 3, "period": "PT1.0004S"}),
        json!({"limit": 5, "period": "P1DT"}),
        json!({"limit": 5, "period": "PT1H1H"}),
        json!({"limit": 2e9}),
    ] {
        let (status, body) = put_config(json!({ "rate_limit": bad })).await;
        assert_eq!(
            (status, error_code(&body)),
            (StatusCode::BAD_REQUEST, "invalid_request"),
            "{bad}: {body}"
        );
    }
    let (status, body) = http
        .send_json(
            Method::POST,
            "/ojs/v1/jobs",
            json!({"type": "t", "args": [], "options": {"queue": "email", "rate_limit": {"max_per_second": 3e9}}}),
        )
        .await;
    assert_eq!(
        (status, error_code(&body)),
        (StatusCode::BAD_REQUEST, "invalid_request"),
        "{body}"
    );
    // Unsupported fields are named, and nothing changes.
    let (status, body) =
        put_config(json!({"concurrency": 30, "retention": {"completed": "P1D"}})).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(
        body["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("concurrency")),
        "{body}"
    );
    let (status, body) =
        put_config(json!({"retention": {"completed": "P14D", "discarded": "P90D"}})).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    let detail = http.get_200("/ojs/v1/admin/queues/email").await;
    assert_eq!(detail["configuration"]["retention"]["completed"], "P7D");
    // One retention serves both states: naming one alone may not change the other.
    let (status, body) = put_config(json!({"retention": {"completed": "P2D"}})).await;
    assert_eq!(
        (status, error_code(&body)),
        (StatusCode::BAD_REQUEST, "invalid_request"),
        "{body}"
    );
    let detail = http.get_200("/ojs/v1/admin/queues/email").await;
    assert_eq!(
        detail["configuration"]["retention"],
        json!({"completed": "P7D", "discarded": "P7D"})
    );
    let (status, body) = put_config(json!({"retention": {"discarded": "P7D"}})).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    // What the queue config route stores reads back as a retention this route takes again.
    let (status, body) = http
        .send_json(
            Method::POST,
            "/ojs/v1/queues/email/config",
            json!({"job_retention": "1500ms"}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let detail = http.get_200("/ojs/v1/admin/queues/email").await;
    let retention = detail["configuration"]["retention"].clone();
    assert_eq!(retention["completed"], "PT1.5S", "{detail}");
    let (status, body) = put_config(json!({ "retention": retention })).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let (status, _) = http
        .send_json(
            Method::PUT,
            "/ojs/v1/admin/queues/nowhere/config",
            json!({"rate_limit": null}),
        )
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    app.stop().await;
}

/// ADM-003, 7.1: filters (queue, state, exact and prefix type, since/until), sorts, orders and
/// pages, with the total; bad parameters are 400s.
#[tokio::test]
async fn jobs_list_filters_sorts_and_pages() {
    let app = common::spawn_app().await;
    let http = Http::of(&app);
    let send = http
        .enqueue("mail", "email.send", json!({"priority": 1}))
        .await;
    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    let digest = http
        .enqueue("mail", "email.digest", json!({"priority": 5}))
        .await;
    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    let cut = http.get_200(&format!("/ojs/v1/jobs/{digest}")).await["job"]["created_at"]
        .as_str()
        .expect("created_at")
        .to_string();
    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    let sms = http
        .enqueue("sms", "sms.send", json!({"priority": 3}))
        .await;
    let later = http
        .enqueue(
            "mail",
            "email.later",
            json!({"scheduled_at": "2099-01-01T00:00:00Z"}),
        )
        .await;

    let all = http.get_200("/ojs/v1/admin/jobs").await;
    assert_eq!(
        all["pagination"],
        json!({"total": 4, "page": 1, "per_page": 20, "total_exact": true})
    );
    // Newest first by default.
    let ids: Vec<&str> = all["items"]
        .as_array()
        .expect("items")
        .iter()
        .map(|j| j["id"].as_str().expect("id"))
        .collect();
    assert_eq!(
        ids,
        [later.as_str(), sms.as_str(), digest.as_str(), send.as_str()]
    );
    let item = &all["items"][1];
    for field in [
        "id",
        "type",
        "queue",
        "state",
        "priority",
        "attempt",
        "created_at",
    ] {
        assert!(!item[field].is_null(), "{field}: {item}");
    }

    assert_eq!(
        sorted(http.ids("/ojs/v1/admin/jobs?type=email.*").await),
        sorted(vec![send.clone(), digest.clone(), later.clone()])
    );
    assert_eq!(
        http.ids("/ojs/v1/admin/jobs?type=email.send").await,
        vec![send.clone()]
    );
    assert_eq!(
        http.ids("/ojs/v1/admin/jobs?type=email").await,
        Vec::<String>::new()
    );
    assert_eq!(
        http.ids("/ojs/v1/admin/jobs?queue=sms").await,
        vec![sms.clone()]
    );
    assert_eq!(
        http.ids("/ojs/v1/admin/jobs?state=scheduled").await,
        vec![later.clone()]
    );
    assert_eq!(
        sorted(
            http.ids("/ojs/v1/admin/jobs?state=available&queue=mail")
                .await
        ),
        sorted(vec![send.clone(), digest.clone()])
    );
    let since = format!("/ojs/v1/admin/jobs?since={}", cut.replace('+', "%2B"));
    assert_eq!(
        sorted(http.ids(&since).await),
        sorted(vec![digest.clone(), sms.clone(), later.clone()])
    );
    let until = format!("/ojs/v1/admin/jobs?until={}", cut.replace('+', "%2B"));
    assert_eq!(http.ids(&until).await, vec![send.clone()]);

    assert_eq!(
        http.ids("/ojs/v1/admin/jobs?sort=priority&order=asc&queue=mail&state=available")
            .await,
        [send.clone(), digest.clone()]
    );
    assert_eq!(
        http.ids("/ojs/v1/admin/jobs?sort=created_at&order=asc&per_page=1&page=2")
            .await,
        vec![digest.clone()]
    );
    let scheduled_first = http.ids("/ojs/v1/admin/jobs?sort=scheduled_at").await;
    assert_eq!(scheduled_first[0], later);
    let page = http.get_200("/ojs/v1/admin/jobs?per_page=3&page=2").await;
    assert_eq!(
        page["pagination"],
        json!({"total": 4, "page": 2, "per_page": 3, "total_exact": true})
    );
    assert_eq!(page["items"].as_array().map(Vec::len), Some(1));

    for bad in [
        "per_page=101",
        "per_page=0",
        "page=0",
        "page=101&per_page=100",
        "sort=name",
        "order=up",
        "state=sleeping",
        "type=a*b",
        "since=yesterday",
        "until=2026-01-01T00:00:00",
        "queue=Not_A_Queue",
    ] {
        let (status, body) = http.get(&format!("/ojs/v1/admin/jobs?{bad}")).await;
        assert_eq!(
            (status, error_code(&body)),
            (StatusCode::BAD_REQUEST, "invalid_request"),
            "{bad}: {body}"
        );
    }
    app.stop().await;
}

/// ADM-004, 7.2-7.4: the detail carries errors and the spec's timestamps; retry only from
/// discarded or cancelled (409 otherwise), cancel only what is not terminal.
#[tokio::test]
async fn job_detail_cancel_and_retry() {
    let app = common::spawn_app().await;
    let http = Http::of(&app);
    let id = http.discarded("email", "email.send").await;
    let detail = http.get_200(&format!("/ojs/v1/admin/jobs/{id}")).await;
    assert_eq!(detail["id"], id.as_str());
    assert_eq!(detail["specversion"], "1.0");
    assert_eq!(detail["state"], "discarded");
    assert_eq!(detail["max_attempts"], 1);
    assert_eq!(detail["args"], json!([1]));
    let errors = detail["errors"].as_array().expect("errors");
    assert_eq!(errors.len(), 1, "{detail}");
    assert_eq!(errors[0]["message"], "SMTP connection refused");
    assert_eq!(errors[0]["attempt"], 1);
    assert!(!errors[0]["occurred_at"].is_null());
    let metadata = &detail["metadata"];
    for field in ["created_at", "enqueued_at", "started_at", "discarded_at"] {
        assert!(
            metadata[field].as_str().is_some_and(|t| t.ends_with('Z')),
            "{field}: {metadata}"
        );
    }
    for field in ["completed_at", "cancelled_at", "scheduled_at"] {
        assert!(metadata[field].is_null(), "{field}: {metadata}");
    }
    assert!(detail["retry_policy"]["max_attempts"].is_i64(), "{detail}");

    let retried = http
        .ok_post(&format!("/ojs/v1/admin/jobs/{id}/retry"), json!({}))
        .await;
    assert_eq!(
        (retried["state"].clone(), retried["attempt"].clone()),
        (json!("available"), json!(0))
    );
    let (status, body) = http
        .post(&format!("/ojs/v1/admin/jobs/{id}/retry"), json!({}))
        .await;
    assert_eq!(
        (status, error_code(&body)),
        (StatusCode::CONFLICT, "conflict"),
        "{body}"
    );

    let cancelled = http
        .ok_post(&format!("/ojs/v1/admin/jobs/{id}/cancel"), json!({}))
        .await;
    assert_eq!(cancelled["state"], "cancelled");
    assert!(cancelled["metadata"]["cancelled_at"].is_string());
    let (status, _) = http
        .post(&format!("/ojs/v1/admin/jobs/{id}/cancel"), json!({}))
        .await;
    assert_eq!(status, StatusCode::CONFLICT);
    let retried = http
        .ok_post(&format!("/ojs/v1/admin/jobs/{id}/retry"), json!({}))
        .await;
    assert_eq!(retried["state"], "available");

    let unknown = "019503e1-7b2a-7000-8000-000000000001";
    for path in [format!("/ojs/v1/admin/jobs/{unknown}")] {
        let (status, _) = http.get(&path).await;
        assert_eq!(status, StatusCode::NOT_FOUND);
    }
    let (status, _) = http
        .post(&format!("/ojs/v1/admin/jobs/{unknown}/retry"), json!({}))
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, _) = http.get("/ojs/v1/admin/jobs/not-a-uuid").await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    app.stop().await;
}

/// Principle 4, 6.5, 8, 11.3: every bulk action, purge and dead-letter purge without
/// `confirm: true` is a 400 that changes nothing; a purge never takes active jobs.
#[tokio::test]
async fn confirm_interlocks_refuse_and_change_nothing() {
    let app = common::spawn_app().await;
    let http = Http::of(&app);
    let waiting = http.enqueue("email", "email.send", json!({})).await;
    let dead = http.discarded("email", "email.send").await;
    let filter = json!({"queue": "email"});
    for action in ["retry", "cancel", "delete"] {
        for body in [
            json!({"filter": filter}),
            json!({"filter": filter, "confirm": false}),
        ] {
            let (status, answer) = http
                .post(&format!("/ojs/v1/admin/jobs/bulk/{action}"), body)
                .await;
            assert_eq!(
                (status, error_code(&answer)),
                (StatusCode::BAD_REQUEST, "invalid_request"),
                "{action}: {answer}"
            );
            assert_eq!(answer["error"]["details"]["field"], "confirm", "{answer}");
        }
    }
    let (status, _) = http
        .post("/ojs/v1/admin/dead-letter/retry", json!({"filter": {}}))
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    for body in [
        json!({"states": ["available", "discarded"]}),
        json!({"states": ["available", "discarded"], "confirm": false}),
        json!({"states": ["active"], "confirm": true}),
        json!({"states": [], "confirm": true}),
        json!({"states": ["bogus"], "confirm": true}),
        json!({"states": ["discarded"], "older_than": "last week", "confirm": true}),
    ] {
        let (status, answer) = http
            .send_json(
                Method::DELETE,
                "/ojs/v1/admin/queues/email/jobs",
                body.clone(),
            )
            .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}: {answer}");
    }
    for body in [json!({}), json!({"confirm": false})] {
        let (status, _) = http
            .send_json(Method::DELETE, "/ojs/v1/admin/dead-letter", body)
            .await;
        assert_eq!(status, StatusCode::BAD_REQUEST);
    }
    assert_eq!(http.state(&waiting).await, "available");
    assert_eq!(http.state(&dead).await, "discarded");

    // With confirm: older_than in the past purges nothing, then everything asked for goes.
    let (status, answer) = http
        .send_json(
            Method::DELETE,
            "/ojs/v1/admin/queues/email/jobs",
            json!({"states": ["discarded"], "older_than": "2020-01-01T00:00:00Z", "confirm": true}),
        )
        .await;
    assert_eq!(
        (status, answer["purged_count"].clone()),
        (StatusCode::OK, json!(0))
    );
    let (status, answer) = http
        .send_json(
            Method::DELETE,
            "/ojs/v1/admin/queues/email/jobs",
            json!({"states": ["discarded", "available"], "confirm": true}),
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        answer,
        json!({"purged_count": 2, "states": ["discarded", "available"]})
    );
    let (status, _) = http.get(&format!("/ojs/v1/jobs/{waiting}")).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    app.stop().await;
}

/// ADM-007, R005: bulk retry, cancel and delete answer action / matched / succeeded / failed /
/// errors; a call takes at most 1,000 jobs and says when more matched.
#[tokio::test]
async fn bulk_actions_answer_counts_and_are_bounded() {
    let app = common::spawn_app().await;
    let http = Http::of(&app);
    let mut ids = Vec::new();
    for _ in 0..3 {
        ids.push(http.enqueue("billing", "invoice.generate", json!({})).await);
    }
    http.enqueue("billing", "invoice.other", json!({})).await;
    let filter = json!({"queue": "billing", "type": "invoice.generate"});
    let cancel = http
        .ok_post(
            "/ojs/v1/admin/jobs/bulk/cancel",
            json!({"filter": filter, "confirm": true}),
        )
        .await;
    assert_eq!(
        cancel,
        json!({"action": "cancel", "matched": 3, "succeeded": 3, "failed": 0, "errors": [], "has_more": false})
    );
    let retry = http
        .ok_post(
            "/ojs/v1/admin/jobs/bulk/retry",
            json!({"filter": {"queue": "billing", "state": "cancelled"}, "confirm": true}),
        )
        .await;
    assert_eq!(
        (retry["matched"].clone(), retry["succeeded"].clone()),
        (json!(3), json!(3))
    );
    for id in &ids {
        assert_eq!(http.state(id).await, "available");
    }
    let (status, body) = http
        .post(
            "/ojs/v1/admin/jobs/bulk/delete",
            json!({"filter": {"state": "available"}, "confirm": true}),
        )
        .await;
    assert_eq!(
        status,
        StatusCode::BAD_REQUEST,
        "delete applies to terminal jobs only: {body}"
    );
    http.ok_post(
        "/ojs/v1/admin/jobs/bulk/cancel",
        json!({"filter": filter, "confirm": true}),
    )
    .await;
    let delete = http
        .ok_post(
            "/ojs/v1/admin/jobs/bulk/delete",
            json!({"filter": filter, "confirm": true}),
        )
        .await;
    assert_eq!(
        (delete["action"].clone(), delete["succeeded"].clone()),
        (json!("delete"), json!(3))
    );
    let (status, _) = http.get(&format!("/ojs/v1/jobs/{}", ids[0])).await;
    assert_eq!(status, StatusCode::NOT_FOUND);

    // 1,001 matching jobs: the first call takes 1,000 and says more matched.
    for _ in 0..2 {
        let jobs: Vec<Value> = (0..500)
            .map(|_| json!({"type": "bulk.job", "args": [], "options": {"queue": "many"}}))
            .collect();
        http.ok_post("/ojs/v1/jobs/batch", json!({"jobs": jobs}))
            .await;
    }
    http.enqueue("many", "bulk.job", json!({})).await;
    let list = http
        .get_200("/ojs/v1/admin/jobs?queue=many&per_page=1")
        .await;
    assert_eq!(list["pagination"]["total"], 1001);
    let first = http
        .ok_post(
            "/ojs/v1/admin/jobs/bulk/cancel",
            json!({"filter": {"queue": "many"}, "confirm": true}),
        )
        .await;
    assert_eq!(
        (
            first["matched"].clone(),
            first["succeeded"].clone(),
            first["has_more"].clone()
        ),
        (json!(1000), json!(1000), json!(true))
    );
    let second = http
        .ok_post(
            "/ojs/v1/admin/jobs/bulk/cancel",
            json!({"filter": {"queue": "many"}, "confirm": true}),
        )
        .await;
    assert_eq!(
        (second["matched"].clone(), second["has_more"].clone()),
        (json!(1), json!(false))
    );
    app.stop().await;
}

/// 8: bulk cancel and bulk retry race a worker acking the same jobs: every job is either acked
/// (and completed) or changed by the bulk action, never both, and the counts add up.
#[tokio::test]
async fn bulk_actions_racing_a_worker_never_both_change_and_ack_a_job() {
    let app = common::spawn_app().await;
    let http = Http::of(&app);
    const N: usize = 60;
    let jobs: Vec<Value> = (0..N)
        .map(|_| json!({"type": "race.job", "args": [], "options": {"queue": "race"}}))
        .collect();
    http.ok_post("/ojs/v1/jobs/batch", json!({"jobs": jobs}))
        .await;
    let leased = http.fetch("race", N).await;
    assert_eq!(leased.len(), N);

    let worker = Http::of(&app);
    let acks = tokio::spawn(async move {
        let mut acked = Vec::new();
        for (id, token) in leased {
            let (status, _) = worker
                .post(
                    "/ojs/v1/workers/ack",
                    json!({"job_id": id, "lease_token": token}),
                )
                .await;
            if status == StatusCode::OK {
                acked.push(id);
            }
        }
        acked
    });
    tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    let mut cancelled = 0;
    let mut retried = 0;
    for _ in 0..3 {
        let c = http
            .ok_post(
                "/ojs/v1/admin/jobs/bulk/cancel",
                json!({"filter": {"queue": "race"}, "confirm": true}),
            )
            .await;
        cancelled += c["succeeded"].as_i64().expect("succeeded");
        assert_eq!(
            c["matched"].as_i64(),
            Some(c["succeeded"].as_i64().unwrap_or(0) + c["failed"].as_i64().unwrap_or(0))
        );
        let r = http
            .ok_post(
                "/ojs/v1/admin/jobs/bulk/retry",
                json!({"filter": {"queue": "race"}, "confirm": true}),
            )
            .await;
        retried += r["succeeded"].as_i64().expect("succeeded");
    }
    let acked: HashSet<String> = acks.await.expect("worker").into_iter().collect();
    let completed: HashSet<String> = http
        .ids("/ojs/v1/admin/jobs?queue=race&state=completed&per_page=100")
        .await
        .into_iter()
        .collect();
    assert_eq!(acked, completed, "exactly the acked jobs are completed");
    let others = http
        .get_200("/ojs/v1/admin/jobs?queue=race&state=available&per_page=100")
        .await;
    let available = others["pagination"]["total"].as_i64().expect("total");
    assert_eq!(
        acked.len() as i64 + available,
        N as i64,
        "every job not acked was cancelled, then retried"
    );
    assert!(
        cancelled >= available && retried == cancelled,
        "cancelled {cancelled}, retried {retried}"
    );
    app.stop().await;
}

/// 11: dead letters are the discarded jobs, listed and filtered as jobs, counted per queue,
/// retried (attempts reset) and deleted one at a time or in bulk; other states are 409s.
#[tokio::test]
async fn dead_letters_list_stats_retry_delete_and_purge() {
    let app = common::spawn_app().await;
    let http = Http::of(&app);
    let first = http.discarded("email", "email.send").await;
    let second = http.discarded("email", "email.digest").await;
    let third = http.discarded("sms", "sms.send").await;
    let alive = http.enqueue("email", "email.send", json!({})).await;

    let list = http.get_200("/ojs/v1/admin/dead-letter?per_page=2").await;
    assert_eq!(
        list["pagination"],
        json!({"total": 3, "page": 1, "per_page": 2, "total_exact": true})
    );
    assert_eq!(list["items"][0]["state"], "discarded");
    assert_eq!(
        http.ids("/ojs/v1/admin/dead-letter?queue=email&type=email.d*")
            .await,
        vec![second.clone()]
    );
    let (status, _) = http.get("/ojs/v1/admin/dead-letter?state=completed").await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let stats = http.get_200("/ojs/v1/admin/dead-letter/stats").await;
    assert_eq!(
        stats,
        json!({"total": 3, "by_queue": {"email": 2, "sms": 1}})
    );

    let retried = http
        .ok_post(
            &format!("/ojs/v1/admin/dead-letter/{first}/retry"),
            json!({}),
        )
        .await;
    assert_eq!(
        (retried["state"].clone(), retried["attempt"].clone()),
        (json!("available"), json!(0))
    );
    let (status, _) = http
        .post(
            &format!("/ojs/v1/admin/dead-letter/{alive}/retry"),
            json!({}),
        )
        .await;
    assert_eq!(status, StatusCode::CONFLICT);
    let (status, _) = http
        .delete(&format!("/ojs/v1/admin/dead-letter/{alive}"))
        .await;
    assert_eq!(status, StatusCode::CONFLICT);
    assert_eq!(http.state(&alive).await, "available");
    let deleted = http
        .delete(&format!("/ojs/v1/admin/dead-letter/{second}"))
        .await;
    assert_eq!(
        deleted,
        (StatusCode::OK, json!({"deleted": true, "job_id": second}))
    );

    let bulk = http
        .ok_post(
            "/ojs/v1/admin/dead-letter/retry",
            json!({"filter": {"queue": "sms"}, "confirm": true}),
        )
        .await;
    assert_eq!(
        (bulk["action"].clone(), bulk["succeeded"].clone()),
        (json!("retry"), json!(1))
    );
    assert_eq!(http.state(&third).await, "available");
    http.discarded("push", "push.send").await;
    let (status, purged) = http
        .send_json(
            Method::DELETE,
            "/ojs/v1/admin/dead-letter",
            json!({"confirm": true}),
        )
        .await;
    assert_eq!(
        (status, purged["purged_count"].clone()),
        (StatusCode::OK, json!(1))
    );
    assert_eq!(
        http.get_200("/ojs/v1/admin/dead-letter/stats").await["total"],
        0
    );
    app.stop().await;
}

/// `GET /ojs/v1/workflows`: paged, newest first, with the dashboard's step counts.
#[tokio::test]
async fn workflows_are_listed_a_page_at_a_time() {
    let app = common::spawn_app().await;
    let http = Http::of(&app);
    let mut ids = Vec::new();
    for n in 0..3 {
        let created = http
            .ok_post(
                "/ojs/v1/workflows",
                json!({"type": "chain", "name": format!("wf-{n}"), "steps": [
                    {"type": "a.step", "args": []}, {"type": "b.step", "args": []}]}),
            )
            .await;
        ids.push(created["workflow"]["id"].as_str().expect("id").to_string());
    }
    let page = http.get_200("/ojs/v1/workflows?per_page=2").await;
    assert_eq!(
        page["pagination"],
        json!({"total": 3, "page": 1, "per_page": 2, "total_exact": true})
    );
    let item = &page["items"][0];
    assert_eq!(item["id"], ids[2].as_str());
    assert_eq!(
        (item["steps_total"].clone(), item["steps_completed"].clone()),
        (json!(2), json!(0))
    );
    assert_eq!(item["state"], "running");
    assert!(
        item["created_at"]
            .as_str()
            .is_some_and(|t| t.ends_with('Z'))
    );
    assert_eq!(
        http.ids("/ojs/v1/workflows?per_page=2&page=2").await,
        [ids[0].clone()]
    );
    assert_eq!(http.ids("/ojs/v1/workflows?state=active").await.len(), 3);
    assert_eq!(http.ids("/ojs/v1/workflows?state=completed").await.len(), 0);
    let (status, _) = http.get("/ojs/v1/workflows?state=sleeping").await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    app.stop().await;
}

/// 13: a token scoped to queue `qa` (admin role) never sees or acts on queue `qb`'s jobs through
/// any admin route; a reader token reads and is refused every write.
#[tokio::test]
async fn scopes_hold_on_every_admin_route_and_readers_cannot_write() {
    let app = common::spawn_app_with(|s| s.auth = true).await;
    let root = create_token(&app.database_url, "root", &["admin"], None);
    let scoped = create_token(&app.database_url, "qa-admin", &["admin"], Some("qa"));
    let reader = create_token(&app.database_url, "reader", &["reader"], None);
    let (scoped_token, reader_token) = (scoped.clone(), reader.clone());
    let root = Http::bearer(&app, &root);
    let a = Http::bearer(&app, &scoped);
    let reader = Http::bearer(&app, &reader);

    let a_job = root.enqueue("qa", "t.a", json!({})).await;
    let b_job = root.enqueue("qb", "t.b", json!({})).await;
    let a_dead = root.discarded("qa", "t.a").await;
    let b_dead = root.discarded("qb", "t.b").await;
    root.ok_post("/ojs/v1/workflows", json!({"type": "chain", "name": "wb", "steps": [{"type": "t.b", "args": [], "options": {"queue": "qb"}}]})).await;
    root.ok_post("/ojs/v1/workflows", json!({"type": "chain", "name": "wa", "steps": [{"type": "t.a", "args": [], "options": {"queue": "qa"}}]})).await;

    let queues = a.get_200("/ojs/v1/admin/queues").await;
    assert_eq!(
        queues["items"]
            .as_array()
            .map(|q| q.iter().map(|q| q["name"].clone()).collect::<Vec<_>>()),
        Some(vec![json!("qa")])
    );
    assert_eq!(queues["pagination"]["total"], 1);
    let jobs = a.ids("/ojs/v1/admin/jobs?per_page=100").await;
    assert!(
        jobs.contains(&a_job) && !jobs.contains(&b_job) && !jobs.contains(&b_dead),
        "{jobs:?}"
    );
    assert_eq!(
        a.ids("/ojs/v1/admin/dead-letter").await,
        vec![a_dead.clone()]
    );
    assert_eq!(
        a.get_200("/ojs/v1/admin/dead-letter/stats").await,
        json!({"total": 1, "by_queue": {"qa": 1}})
    );
    let workflows = a.get_200("/ojs/v1/workflows").await;
    assert_eq!(workflows["pagination"]["total"], 1);
    assert_eq!(workflows["items"][0]["name"], "wa");

    // Naming qb: 403; qb's ids: 404 (they do not exist for this token).
    for path in [
        "/ojs/v1/admin/jobs?queue=qb",
        "/ojs/v1/admin/dead-letter?queue=qb",
        "/ojs/v1/admin/queues/qb",
    ] {
        let (status, body) = a.get(path).await;
        assert_eq!(
            (status, error_code(&body)),
            (StatusCode::FORBIDDEN, "forbidden"),
            "{path}"
        );
    }
    for (method, path) in [
        (Method::POST, "/ojs/v1/admin/queues/qb/pause".to_string()),
        (Method::POST, "/ojs/v1/admin/queues/qb/resume".to_string()),
    ] {
        let (status, _) = a.send(method, &path, Some(json!({}))).await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{path}");
    }
    let (status, _) = a
        .send_json(
            Method::DELETE,
            "/ojs/v1/admin/queues/qb/jobs",
            json!({"states": ["discarded"], "confirm": true}),
        )
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    let (status, _) = a
        .send_json(
            Method::PUT,
            "/ojs/v1/admin/queues/qb/config",
            json!({"rate_limit": null}),
        )
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    let (status, _) = a
        .send_json(
            Method::DELETE,
            "/ojs/v1/admin/dead-letter",
            json!({"queue": "qb", "confirm": true}),
        )
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    for action in ["retry", "cancel", "delete"] {
        let (status, _) = a
            .post(
                &format!("/ojs/v1/admin/jobs/bulk/{action}"),
                json!({"filter": {"queue": "qb"}, "confirm": true}),
            )
            .await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{action}");
    }
    for (method, path) in [
        (Method::GET, format!("/ojs/v1/admin/jobs/{b_job}")),
        (Method::POST, format!("/ojs/v1/admin/jobs/{b_job}/cancel")),
        (Method::POST, format!("/ojs/v1/admin/jobs/{b_dead}/retry")),
        (
            Method::POST,
            format!("/ojs/v1/admin/dead-letter/{b_dead}/retry"),
        ),
        (
            Method::DELETE,
            format!("/ojs/v1/admin/dead-letter/{b_dead}"),
        ),
    ] {
        let (status, body) = a.send(method.clone(), &path, None).await;
        assert_eq!(
            (status, error_code(&body)),
            (StatusCode::NOT_FOUND, "not_found"),
            "{method} {path}"
        );
    }
    // Unfiltered bulk actions and purges reach only qa.
    // a_job and workflow wa's first step.
    let cancel = a
        .ok_post(
            "/ojs/v1/admin/jobs/bulk/cancel",
            json!({"filter": {}, "confirm": true}),
        )
        .await;
    assert_eq!(cancel["succeeded"], 2);
    let retry = a
        .ok_post(
            "/ojs/v1/admin/dead-letter/retry",
            json!({"filter": {}, "confirm": true}),
        )
        .await;
    assert_eq!(retry["succeeded"], 1);
    let (_, purged) = a
        .send_json(
            Method::DELETE,
            "/ojs/v1/admin/dead-letter",
            json!({"confirm": true}),
        )
        .await;
    assert_eq!(purged["purged_count"], 0);
    assert_eq!(root.state(&b_job).await, "available");
    assert_eq!(root.state(&b_dead).await, "discarded");
    assert_eq!(root.state(&a_job).await, "cancelled");

    // A reader reads everything and writes nothing.
    assert_eq!(
        reader.get_200("/ojs/v1/admin/queues").await["pagination"]["total"],
        2
    );
    reader.get_200(&format!("/ojs/v1/admin/jobs/{b_job}")).await;
    let writes = [
        (
            Method::POST,
            "/ojs/v1/admin/queues/qb/pause".to_string(),
            json!({}),
        ),
        (
            Method::POST,
            format!("/ojs/v1/admin/jobs/{b_job}/cancel"),
            json!({}),
        ),
        (
            Method::POST,
            format!("/ojs/v1/admin/jobs/{b_dead}/retry"),
            json!({}),
        ),
        (
            Method::POST,
            "/ojs/v1/admin/jobs/bulk/cancel".to_string(),
            json!({"filter": {}, "confirm": true}),
        ),
        (
            Method::POST,
            "/ojs/v1/admin/dead-letter/retry".to_string(),
            json!({"filter": {}, "confirm": true}),
        ),
        (
            Method::DELETE,
            "/ojs/v1/admin/queues/qb/jobs".to_string(),
            json!({"states": ["discarded"], "confirm": true}),
        ),
        (
            Method::PUT,
            "/ojs/v1/admin/queues/qb/config".to_string(),
            json!({"rate_limit": null}),
        ),
        (
            Method::DELETE,
            "/ojs/v1/admin/dead-letter".to_string(),
            json!({"confirm": true}),
        ),
    ];
    for (method, path, body) in writes {
        let (status, answer) = reader.send_json(method.clone(), &path, body).await;
        assert_eq!(
            (status, error_code(&answer)),
            (StatusCode::FORBIDDEN, "forbidden"),
            "{method} {path}"
        );
    }
    let (status, _) = reader
        .delete(&format!("/ojs/v1/admin/dead-letter/{b_dead}"))
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    assert_eq!(root.state(&b_job).await, "available");
    assert_eq!(root.state(&b_dead).await, "discarded");

    // The same over gRPC.
    let mut grpc = common::grpc::admin(&app.grpc_url).await;
    let queues = grpc
        .list_admin_queues(authed(
            &scoped_token,
            ext::ListAdminQueuesRequest { page: None },
        ))
        .await
        .expect("queues")
        .into_inner();
    assert_eq!(
        queues
            .queues
            .iter()
            .map(|q| q.name.as_str())
            .collect::<Vec<_>>(),
        ["qa"]
    );
    let listed = grpc
        .list_admin_jobs(authed(
            &scoped_token,
            ext::ListAdminJobsRequest {
                filter: None,
                sort: String::new(),
                order: String::new(),
                page: None,
            },
        ))
        .await
        .expect("jobs")
        .into_inner();
    assert!(listed.jobs.iter().all(|j| j.queue == "qa") && !listed.jobs.is_empty());
    let hidden = grpc
        .get_admin_job(authed(
            &scoped_token,
            ext::GetAdminJobRequest { id: b_job.clone() },
        ))
        .await
        .expect_err("qb's job");
    assert_eq!(hidden.code(), tonic::Code::NotFound);
    let named = ext::AdminJobFilter {
        queue: "qb".into(),
        ..Default::default()
    };
    let refused = grpc
        .bulk_jobs(authed(
            &scoped_token,
            ext::BulkJobsRequest {
                action: "cancel".into(),
                filter: Some(named),
                confirm: true,
            },
        ))
        .await
        .expect_err("qb named");
    assert_eq!(refused.code(), tonic::Code::PermissionDenied);
    let refused = grpc
        .get_admin_queue(authed(
            &scoped_token,
            ext::GetAdminQueueRequest { queue: "qb".into() },
        ))
        .await
        .expect_err("qb named");
    assert_eq!(refused.code(), tonic::Code::PermissionDenied);
    let refused = grpc
        .bulk_jobs(authed(
            &reader_token,
            ext::BulkJobsRequest {
                action: "cancel".into(),
                filter: None,
                confirm: true,
            },
        ))
        .await
        .expect_err("a reader");
    assert_eq!(refused.code(), tonic::Code::PermissionDenied);
    assert_eq!(root.state(&b_job).await, "available");
    app.stop().await;
}

/// The gRPC AdminService answers the Admin API's reads and actions as the HTTP routes do.
#[tokio::test]
async fn grpc_admin_service_matches_the_http_routes() {
    let app = common::spawn_app().await;
    let http = Http::of(&app);
    let mut grpc = common::grpc::admin(&app.grpc_url).await;
    http.enqueue("email", "email.send", json!({})).await;
    http.enqueue("email", "email.digest", json!({})).await;
    let dead = http.discarded("email", "email.send").await;
    http.enqueue("sms", "sms.send", json!({})).await;

    let queues = grpc
        .list_admin_queues(ext::ListAdminQueuesRequest { page: None })
        .await
        .expect("list queues")
        .into_inner();
    let over_http = http.get_200("/ojs/v1/admin/queues").await;
    assert_eq!(queues.queues.len(), 2);
    let email = &queues.queues[0];
    let counts = email.counts.expect("counts");
    assert_eq!(
        (email.name.as_str(), counts.available, counts.discarded),
        ("email", 2, 1)
    );
    assert_eq!(
        counts.available,
        over_http["items"][0]["counts"]["available"]
            .as_i64()
            .unwrap_or(-1)
    );
    let detail = grpc
        .get_admin_queue(ext::GetAdminQueueRequest {
            queue: "email".into(),
        })
        .await
        .expect("queue")
        .into_inner()
        .queue
        .expect("queue");
    assert!(detail.oldest_available_at.is_some());
    assert_eq!(detail.job_retention_ms, 86_400_000);

    let filter = ext::AdminJobFilter {
        queue: "email".into(),
        r#type: "email.*".into(),
        ..Default::default()
    };
    let listed = grpc
        .list_admin_jobs(ext::ListAdminJobsRequest {
            filter: Some(filter.clone()),
            sort: String::new(),
            order: "asc".into(),
            page: None,
        })
        .await
        .expect("jobs")
        .into_inner();
    let grpc_ids: Vec<String> = listed.jobs.iter().map(|j| j.id.clone()).collect();
    assert_eq!(
        grpc_ids,
        http.ids("/ojs/v1/admin/jobs?queue=email&type=email.*&order=asc")
            .await
    );
    assert_eq!(listed.pagination.map(|p| p.total), Some(3));
    let dead_letters = grpc
        .list_admin_dead_letters(ext::ListAdminJobsRequest {
            filter: None,
            sort: String::new(),
            order: String::new(),
            page: None,
        })
        .await
        .expect("dead letters")
        .into_inner();
    assert_eq!(
        dead_letters
            .jobs
            .iter()
            .map(|j| j.id.clone())
            .collect::<Vec<_>>(),
        vec![dead.clone()]
    );
    let job = grpc
        .get_admin_job(ext::GetAdminJobRequest { id: dead.clone() })
        .await
        .expect("job")
        .into_inner()
        .job
        .expect("job");
    assert_eq!(job.id, dead);
    let status = grpc
        .list_admin_jobs(ext::ListAdminJobsRequest {
            filter: None,
            sort: "name".into(),
            order: String::new(),
            page: None,
        })
        .await
        .expect_err("bad sort");
    assert_eq!(grpc_code(&status), "invalid_request");

    // Bulk: no confirm is INVALID_ARGUMENT and changes nothing; then it acts.
    let refused = grpc
        .bulk_jobs(ext::BulkJobsRequest {
            action: "cancel".into(),
            filter: Some(filter.clone()),
            confirm: false,
        })
        .await
        .expect_err("no confirm");
    assert_eq!(refused.code(), tonic::Code::InvalidArgument);
    assert_eq!(http.state(&dead).await, "discarded");
    let retried = grpc
        .retry_admin_job(ext::RetryAdminJobRequest { id: dead.clone() })
        .await
        .expect("retry")
        .into_inner()
        .job
        .expect("job");
    assert_eq!(retried.attempt, 0);
    let failed = grpc
        .retry_admin_job(ext::RetryAdminJobRequest { id: dead.clone() })
        .await
        .expect_err("not discarded");
    assert_eq!(failed.code(), tonic::Code::FailedPrecondition);
    let cancelled = grpc
        .bulk_jobs(ext::BulkJobsRequest {
            action: "cancel".into(),
            filter: Some(filter),
            confirm: true,
        })
        .await
        .expect("bulk")
        .into_inner();
    assert_eq!(
        (
            cancelled.action.as_str(),
            cancelled.matched,
            cancelled.succeeded,
            cancelled.has_more
        ),
        ("cancel", 3, 3, false)
    );
    let bad = grpc
        .bulk_jobs(ext::BulkJobsRequest {
            action: "explode".into(),
            filter: None,
            confirm: true,
        })
        .await
        .expect_err("bad action");
    assert_eq!(bad.code(), tonic::Code::InvalidArgument);
    let purged = grpc
        .purge_queue_jobs(ext::PurgeQueueJobsRequest {
            queue: "email".into(),
            states: vec!["cancelled".into()],
            older_than: String::new(),
            confirm: true,
        })
        .await
        .expect("purge")
        .into_inner();
    assert_eq!(purged.purged_count, 3);
    let refused = grpc
        .purge_queue_jobs(ext::PurgeQueueJobsRequest {
            queue: "sms".into(),
            states: vec!["available".into()],
            older_than: String::new(),
            confirm: false,
        })
        .await
        .expect_err("no confirm");
    assert_eq!(refused.code(), tonic::Code::InvalidArgument);
    app.stop().await;
}

/// Malformed admin requests are 400s in the OJS envelope (never a 500), and change nothing.
#[tokio::test]
async fn malformed_admin_requests_are_400s() {
    let app = common::spawn_app().await;
    let http = Http::of(&app);
    let job = http.enqueue("email", "email.send", json!({})).await;
    let cases = [
        (
            Method::POST,
            "/ojs/v1/admin/jobs/bulk/cancel",
            json!({"confirm": true}),
        ),
        (
            Method::POST,
            "/ojs/v1/admin/jobs/bulk/cancel",
            json!({"filter": {"queue": "email"}, "confirm": "yes"}),
        ),
        (
            Method::POST,
            "/ojs/v1/admin/jobs/bulk/cancel",
            json!({"filter": {"queue": 7}, "confirm": true}),
        ),
        (
            Method::POST,
            "/ojs/v1/admin/jobs/bulk/cancel",
            json!({"filter": {"since": "+20000-01-01T00:00:00Z"}, "confirm": true}),
        ),
        (
            Method::POST,
            "/ojs/v1/admin/jobs/bulk/cancel",
            json!({"filter": {"type": "a\u{0}b"}, "confirm": true}),
        ),
        (Method::POST, "/ojs/v1/admin/jobs/bulk/cancel", json!([])),
        (
            Method::DELETE,
            "/ojs/v1/admin/queues/email/jobs",
            json!({"confirm": true}),
        ),
        (
            Method::DELETE,
            "/ojs/v1/admin/queues/email/jobs",
            json!({"states": "available", "confirm": true}),
        ),
        (Method::PUT, "/ojs/v1/admin/queues/email/config", json!([])),
        (Method::PUT, "/ojs/v1/admin/queues/email/config", json!({})),
        (
            Method::PUT,
            "/ojs/v1/admin/queues/email/config",
            json!({"rate_limit": {"limit": -1, "period": "PT1S"}}),
        ),
        (
            Method::PUT,
            "/ojs/v1/admin/queues/email/config",
            json!({"rate_limit": {"limit": 5, "period": "P1M"}}),
        ),
        (
            Method::PUT,
            "/ojs/v1/admin/queues/email/config",
            json!({"retention": {"completed": "forever"}}),
        ),
        (
            Method::DELETE,
            "/ojs/v1/admin/dead-letter",
            json!({"older_than": 5, "confirm": true}),
        ),
    ];
    for (method, path, body) in cases {
        let (status, answer) = http.send_json(method.clone(), path, body.clone()).await;
        assert_eq!(
            status,
            StatusCode::BAD_REQUEST,
            "{method} {path} {body}: {answer}"
        );
        assert!(
            !error_code(&answer).is_empty() && error_code(&answer) != "?",
            "{answer}"
        );
    }
    let (status, body) = http
        .get("/ojs/v1/admin/jobs?since=%2B20000-01-01T00:00:00Z")
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    let (status, _) = http.get("/ojs/v1/admin/jobs?page=x").await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(http.state(&job).await, "available");
    let detail = http.get_200("/ojs/v1/admin/queues/email").await;
    assert!(detail["configuration"]["rate_limit"].is_null(), "{detail}");
    app.stop().await;
}

#[tokio::test]
async fn a_field_the_admin_api_does_not_know_is_refused_not_dropped() {
    let app = common::spawn_app().await;
    let http = Http::of(&app);
    let keep = http.enqueue("typo", "keep.me", json!({})).await;
    let drop = http.enqueue("typo", "drop.me", json!({})).await;
    // Misspelled or unsupported keys would have widened the match to every job of the queue.
    let cases = [
        (
            Method::POST,
            "/ojs/v1/admin/jobs/bulk/cancel",
            json!({"filter": {"queue": "typo", "job_type": "drop.me"}, "confirm": true}),
        ),
        (
            Method::POST,
            "/ojs/v1/admin/jobs/bulk/delete",
            json!({"filter": {"queue": "typo", "types": ["drop.me"]}, "confirm": true}),
        ),
        (
            Method::POST,
            "/ojs/v1/admin/jobs/bulk/retry",
            json!({"filter": {"queue": "typo"}, "confirm": true, "limit": 1}),
        ),
        (
            Method::DELETE,
            "/ojs/v1/admin/queues/typo/jobs",
            json!({"states": ["available"], "type": "drop.me", "confirm": true}),
        ),
        (
            Method::DELETE,
            "/ojs/v1/admin/dead-letter",
            json!({"queue": "typo", "type": "drop.me", "confirm": true}),
        ),
    ];
    for (method, path, body) in cases {
        let (status, answer) = http.send_json(method.clone(), path, body.clone()).await;
        assert_eq!(
            status,
            StatusCode::BAD_REQUEST,
            "{method} {path} {body}: {answer}"
        );
    }
    assert_eq!(http.state(&keep).await, "available");
    assert_eq!(http.state(&drop).await, "available");

    // Pausing a queue that does not exist through the Admin API does not create it.
    let (status, answer) = http
        .send_json(
            Method::POST,
            "/ojs/v1/admin/queues/never-made/pause",
            json!({}),
        )
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{answer}");
    let (status, _) = http.get("/ojs/v1/admin/queues/never-made").await;
    assert_eq!(status, StatusCode::NOT_FOUND);

    // A rate that would freeze the queue is refused (pause it instead).
    let (status, answer) = http
        .send_json(
            Method::PUT,
            "/ojs/v1/admin/queues/typo/config",
            json!({"rate_limit": {"limit": 1e-300, "period": "PT1S"}}),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{answer}");
    app.stop().await;
}
