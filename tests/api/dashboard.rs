//! The dashboard at `/ui`: every page loads in a real headless Chromium (WebDriver), a reader
//! signs in and sees live counts, is refused an action, an admin pauses a queue and retries a
//! dead letter, and each result is checked through the API. Over plain HTTP: the API's roles and
//! scopes hold for pages and actions, a cross-site form post is refused, bad input is a 4xx.
//!
//! The browser test needs `chromium` and `chromedriver` (.ci/run installs them); without them it
//! says so and passes, unless `PGVS3_REQUIRE_BROWSER=1` (set by .ci/run) makes it fail.

use crate::common;

use std::time::Duration;

use common::tokens::create_token;
use common::webdriver::{self, Browser};
use serde_json::{Value, json};

/// The shared HTTP client holding a token (sent even when empty), with this module's calls.
struct Api(common::http::Http);

impl Api {
    fn new(app: &common::TestApp, token: &str) -> Api {
        Api(common::http::Http::with_client(&app.http_url, reqwest::Client::new()).bearer(token))
    }

    async fn post(&self, path: &str, body: Value) -> Value {
        let (status, answer) = self.0.post(path, body).await;
        let status = status.as_u16();
        assert!(
            (200..300).contains(&status),
            "POST {path}: {status} {answer}"
        );
        answer
    }

    async fn get(&self, path: &str) -> Value {
        let (status, answer) = self.0.get(path).await;
        assert_eq!(status.as_u16(), 200, "GET {path}: {answer}");
        answer
    }

    async fn enqueue(&self, queue: &str, job_type: &str) -> String {
        let answer = self
            .post(
                "/ojs/v1/jobs",
                json!({"type": job_type, "args": [1], "options": {"queue": queue}}),
            )
            .await;
        answer["job"]["id"].as_str().expect("job id").to_string()
    }

    /// A job that failed its only attempt into the dead letters, with its error.
    async fn dead_letter(&self, queue: &str) -> String {
        let answer = self
            .post(
                "/ojs/v1/jobs",
                json!({"type": "report.build", "args": [],
                       "options": {"queue": queue,
                                   "retry": {"max_attempts": 1, "on_exhaustion": "dead_letter"}}}),
            )
            .await;
        let id = answer["job"]["id"].as_str().expect("job id").to_string();
        let fetched = self
            .post(
                "/ojs/v1/workers/fetch",
                json!({"queues": [queue], "worker_id": "w1"}),
            )
            .await;
        assert_eq!(fetched["jobs"][0]["id"], id.as_str(), "{fetched}");
        self.post(
            "/ojs/v1/workers/nack",
            json!({"job_id": id, "worker_id": "w1",
                   "error": {"code": "boom", "message": "the printer is on fire", "retryable": true}}),
        )
        .await;
        id
    }

    async fn paused(&self, queue: &str) -> bool {
        let stats = self.get(&format!("/ojs/v1/queues/{queue}/stats")).await;
        stats["status"] == "paused"
    }
}

/// A server with auth on, an admin client, and tokens by role.
struct Fixture {
    app: common::TestApp,
    admin: Api,
    reader: String,
    admin_token: String,
}

async fn fixture() -> Fixture {
    let app = common::spawn_app_with(|s| s.auth = true).await;
    let admin_token = create_token(&app.database_url, "ops", &["admin"], None);
    let reader = create_token(&app.database_url, "viewer", &["reader"], None);
    let admin = Api::new(&app, &admin_token);
    Fixture {
        app,
        admin,
        reader,
        admin_token,
    }
}

#[tokio::test]
async fn dashboard_in_a_headless_browser() {
    let required = std::env::var("PGVS3_REQUIRE_BROWSER").is_ok_and(|v| v == "1");
    let Some((browser_bin, driver_bin)) = webdriver::installed() else {
        assert!(
            !required,
            "PGVS3_REQUIRE_BROWSER=1 but chromium/chromedriver are not installed"
        );
        eprintln!("SKIPPED: the dashboard browser test needs chromium and chromedriver");
        return;
    };
    let f = fixture().await;
    let base = f.app.http_url.clone();
    f.admin.enqueue("billing", "invoice.send").await;
    let dead = f.admin.dead_letter("reports").await;
    f.admin
        .post(
            "/ojs/v1/cron",
            json!({"name": "nightly", "expression": "0 3 * * *",
                   "job_template": {"type": "report.nightly", "args": [], "options": {"queue": "reports"}}}),
        )
        .await;
    let workflow = f
        .admin
        .post(
            "/ojs/v1/workflows",
            json!({"name": "month-end", "steps": [
                {"id": "collect", "type": "ledger.collect", "args": []},
                {"id": "close", "type": "ledger.close", "args": [], "depends_on": ["collect"]}]}),
        )
        .await;
    let workflow_id = workflow["workflow"]["id"].as_str().expect("workflow id");
    f.admin
        .post(
            "/ojs/v1/queues/events/consumers",
            json!({"consumer": "audit"}),
        )
        .await;
    f.admin
        .post(
            "/ojs/v1/queues/events/messages",
            json!({"type": "order.placed", "payload": {"n": 1}}),
        )
        .await;

    let browser = Browser::start(&browser_bin, &driver_bin).await;

    // Without a token: the page says so and offers the login form.
    browser.goto(&format!("{base}/ui")).await;
    let heading = browser.text("h1").await;
    assert!(
        heading.starts_with("401"),
        "{heading:?}: {}",
        browser.text("body").await
    );
    browser.click("a[href='/ui/login']").await;
    browser.wait_for_url(&format!("{base}/ui/login")).await;
    browser.type_into("#token", &f.reader).await;
    browser.click("#sign-in").await;
    assert_eq!(
        browser.wait_for_url(&format!("{base}/ui")).await,
        format!("{base}/ui")
    );
    let available = "tr[data-queue='billing'] td[data-field='available']";
    assert_eq!(browser.text(available).await, "1");

    // Live counts: a job enqueued through the API shows up without a reload.
    f.admin.enqueue("billing", "invoice.send").await;
    let seen = browser
        .wait_for_text(available, Duration::from_secs(15), |t| t == "2")
        .await;
    assert_eq!(seen, "2", "the EventSource updated the count");
    assert_eq!(browser.text("#live").await, "live");

    // A reader may look but not pause.
    browser.goto(&format!("{base}/ui/queues/billing")).await;
    browser.click("#pause").await;
    let refused = browser
        .wait_for_text("h1", Duration::from_secs(10), |t| t.starts_with("403"))
        .await;
    assert!(refused.starts_with("403"), "{refused}");
    assert!(browser.text("#error-message").await.contains("admin"));
    assert!(
        !f.admin.paused("billing").await,
        "the reader paused nothing"
    );

    // An admin pauses the queue.
    browser.goto(&format!("{base}/ui")).await;
    browser.click("header form button").await;
    browser.wait_for_url(&format!("{base}/ui/login")).await;
    browser.type_into("#token", &f.admin_token).await;
    browser.click("#sign-in").await;
    browser.wait_for_url(&format!("{base}/ui")).await;
    browser.goto(&format!("{base}/ui/queues/billing")).await;
    browser.click("#pause").await;
    let status = browser
        .wait_for_text("#status", Duration::from_secs(10), |t| t == "paused")
        .await;
    assert_eq!(status, "paused");
    assert_eq!(browser.url().await, format!("{base}/ui/queues/billing"));
    assert!(
        f.admin.paused("billing").await,
        "paused through the dashboard"
    );
    let jobs = browser.text("#jobs").await;
    assert_eq!(jobs.matches("invoice.send").count(), 2, "{jobs}");
    browser
        .goto(&format!("{base}/ui/queues/billing?state=completed"))
        .await;
    assert!(browser.find("#no-jobs").await.is_some());

    // The dead letter's page shows its error and history; retry puts it back.
    browser.goto(&format!("{base}/ui/jobs/{dead}")).await;
    assert!(
        browser
            .text("#errors")
            .await
            .contains("the printer is on fire")
    );
    assert!(browser.text("#history").await.contains("job.enqueued"));
    browser.goto(&format!("{base}/ui/dead-letters")).await;
    browser
        .click(&format!("tr[data-job='{dead}'] button.retry"))
        .await;
    let shown = browser
        .wait_for_text("h1", Duration::from_secs(10), |t| t.contains("(0)"))
        .await;
    assert!(shown.contains("(0)"), "{shown}");
    assert_eq!(browser.url().await, format!("{base}/ui/dead-letters"));
    assert!(
        browser
            .find(&format!("tr[data-job='{dead}']"))
            .await
            .is_none()
    );
    let job = f.admin.get(&format!("/ojs/v1/jobs/{dead}")).await;
    assert_eq!(job["job"]["state"], "available", "{job}");
    let letters = f.admin.get("/ojs/v1/dead-letter").await;
    assert_eq!(letters["jobs"], json!([]), "{letters}");

    // Streams, cron and workflows.
    browser.goto(&format!("{base}/ui/streams")).await;
    assert!(
        browser
            .text("tr[data-queue='events']")
            .await
            .contains("events")
    );
    browser.goto(&format!("{base}/ui/streams/events")).await;
    assert!(browser.find("tr[data-consumer='audit']").await.is_some());
    browser.goto(&format!("{base}/ui/cron")).await;
    assert!(
        browser
            .text("tr[data-cron='nightly']")
            .await
            .contains("report.nightly")
    );
    browser.goto(&format!("{base}/ui/workflows")).await;
    browser
        .click(&format!("tr[data-workflow='{workflow_id}'] a"))
        .await;
    browser
        .wait_for_url(&format!("{base}/ui/workflows/{workflow_id}"))
        .await;
    assert_eq!(
        browser.text("tr[data-step='close'] td:nth-child(4)").await,
        "collect"
    );
    assert_eq!(
        browser
            .text("tr[data-step='collect'] td[data-field='state']")
            .await,
        "pending"
    );
    browser.quit().await;
    f.app.stop().await;
}

/// A form post as a browser would send it, from `origin`.
async fn form_post(base: &str, path: &str, token: &str, origin: &str) -> (u16, String) {
    let response = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .expect("client")
        .post(format!("{base}{path}"))
        .header("cookie", format!("pgvs3_token={token}"))
        .header("origin", origin)
        .send()
        .await
        .expect("post");
    let status = response.status().as_u16();
    (status, response.text().await.unwrap_or_default())
}

#[tokio::test]
async fn pages_and_actions_keep_the_api_roles_scopes_and_origin() {
    let f = fixture().await;
    let base = f.app.http_url.clone();
    let url = &f.app.database_url;
    let scoped = create_token(url, "billing-reader", &["reader"], Some("billing"));
    f.admin.enqueue("billing", "invoice.send").await;
    f.admin.enqueue("payroll", "salary.pay").await;
    let http = reqwest::Client::new();
    let page = |path: &str, token: Option<&str>| {
        let mut request = http.get(format!("{base}{path}"));
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        request.send()
    };

    let anonymous = page("/ui", None).await.expect("page");
    assert_eq!(anonymous.status(), 401);
    let overview = page("/ui", Some(&scoped)).await.expect("page");
    assert_eq!(overview.status(), 200);
    assert!(
        overview.headers()["content-type"]
            .to_str()
            .expect("type")
            .starts_with("text/html")
    );
    let html = overview.text().await.expect("html");
    assert!(html.contains("data-queue=\"billing\""), "{html}");
    assert!(
        !html.contains("payroll"),
        "a scoped token sees its queues only"
    );
    let other = page("/ui/queues/payroll", Some(&scoped))
        .await
        .expect("page");
    assert_eq!(other.status(), 403);

    // Escaping: arguments with markup are shown as text.
    let marked = f
        .admin
        .post(
            "/ojs/v1/jobs",
            json!({"type": "invoice.send", "args": ["<script>alert(1)</script>"],
                   "options": {"queue": "billing"}}),
        )
        .await;
    let marked = marked["job"]["id"].as_str().expect("id");
    let html = page(&format!("/ui/jobs/{marked}"), Some(&f.reader))
        .await
        .expect("page")
        .text()
        .await
        .expect("html");
    assert!(html.contains("&lt;script&gt;alert(1)"), "{html}");
    assert!(!html.contains("<script>alert(1)"));

    // Bad input is a 4xx page, never a 500.
    for (path, status) in [
        ("/ui/jobs/not-a-uuid", 400),
        ("/ui/jobs/0190a1b2-0000-7000-8000-000000000000", 404),
        ("/ui/queues/billing?state=nonsense", 400),
        ("/ui/queues/Bad%20Name", 400),
        ("/ui/dead-letters?offset=x", 400),
        ("/ui/workflows/nope", 400),
        ("/ui/streams/nowhere", 404),
    ] {
        let answer = page(path, Some(&f.admin_token)).await.expect("page");
        assert_eq!(answer.status().as_u16(), status, "{path}");
    }

    // Actions: the API's role, from this site only.
    let (status, _) = form_post(&base, "/ui/queues/billing/pause", &f.reader, &base).await;
    assert_eq!(status, 403, "a reader may not pause");
    let (status, _) = form_post(
        &base,
        "/ui/queues/billing/pause",
        &f.admin_token,
        "http://evil.example",
    )
    .await;
    assert_eq!(status, 403, "a cross-site post is refused");
    assert!(!f.admin.paused("billing").await);
    let (status, _) = form_post(&base, "/ui/queues/billing/pause", &f.admin_token, &base).await;
    assert_eq!(status, 303);
    assert!(f.admin.paused("billing").await);
    let (status, _) = form_post(&base, "/ui/queues/billing/resume", &f.admin_token, &base).await;
    assert_eq!(status, 303);
    assert!(!f.admin.paused("billing").await);

    // The login form keeps only a live token, in an HttpOnly cookie.
    let client = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .expect("client");
    let refused = client
        .post(format!("{base}/ui/login"))
        .header("content-type", "application/x-www-form-urlencoded")
        .body("token=pgvs3_unknown")
        .send()
        .await
        .expect("login");
    assert_eq!(refused.status(), 401);
    assert!(refused.headers().get("set-cookie").is_none());
    let signed_in = client
        .post(format!("{base}/ui/login"))
        .header("content-type", "application/x-www-form-urlencoded")
        .body(format!("token={}", f.reader))
        .send()
        .await
        .expect("login");
    assert_eq!(signed_in.status(), 303);
    let cookie = signed_in.headers()["set-cookie"].to_str().expect("cookie");
    assert!(
        cookie.contains("HttpOnly") && cookie.contains("SameSite=Strict"),
        "{cookie}"
    );
    f.app.stop().await;
}

#[tokio::test]
async fn a_read_only_gateway_shows_pages_and_refuses_actions() {
    let (database, url) = common::fresh_database().await;
    let app = common::spawn_app_on(&database, &url, |_| {}).await;
    let writer = Api::new(&app, "");
    writer.enqueue("billing", "invoice.send").await;
    let replica = common::spawn_app_on(&database, &url, |s| s.service.read_only = true).await;
    let html = reqwest::get(format!("{}/ui", replica.http_url))
        .await
        .expect("page")
        .text()
        .await
        .expect("html");
    assert!(html.contains("id=\"read-only\""), "{html}");
    let (status, body) = form_post(
        &replica.http_url,
        "/ui/queues/billing/pause",
        "",
        &replica.http_url,
    )
    .await;
    assert_eq!(status, 403, "{body}");
    assert!(body.contains("read-only"));
    assert!(!writer.paused("billing").await);
    replica.stop().await;
    app.stop().await;
}

#[tokio::test]
async fn a_form_post_over_http2_passes_the_origin_check() {
    // HTTP/2 names the host in `:authority`, not in a Host header (browsers over HTTPS use h2).
    let app = common::spawn_app().await;
    let api = Api::new(&app, "");
    api.enqueue("billing", "invoice.send").await;
    let address = app.http_url.trim_start_matches("http://").to_string();
    let mut sender = common::http::h2c(&address).await;
    let post = |origin: String| {
        hyper::Request::builder()
            .method("POST")
            .uri(format!("http://{address}/ui/queues/billing/pause"))
            .header("origin", origin)
            .body(http_body_util::Empty::<hyper::body::Bytes>::new())
            .expect("request")
    };
    let refused = sender
        .send_request(post("http://evil.example".into()))
        .await
        .expect("post");
    assert_eq!(refused.status(), 403);
    assert!(!api.paused("billing").await);
    let done = sender
        .send_request(post(app.http_url.clone()))
        .await
        .expect("post");
    assert_eq!(done.status(), 303);
    assert!(api.paused("billing").await, "paused over HTTP/2");
    app.stop().await;
}
