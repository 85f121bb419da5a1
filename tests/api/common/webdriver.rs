//! A headless Chromium driven through WebDriver (W3C, JSON over HTTP to `chromedriver`): just the
//! commands the dashboard test needs.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

/// The W3C key of an element reference.
const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";

/// The first of `names` found on PATH or in /usr/bin.
fn find(names: &[&str]) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    names.iter().find_map(|name| {
        std::env::split_paths(&path)
            .chain([
                PathBuf::from("/usr/bin"),
                PathBuf::from("/usr/lib/chromium"),
            ])
            .map(|dir| dir.join(name))
            .find(|p| p.is_file())
    })
}

/// The browser and its driver, when both are installed.
pub fn installed() -> Option<(PathBuf, PathBuf)> {
    let driver = find(&["chromedriver"])?;
    let browser = find(&["chromium", "chromium-browser", "google-chrome"])?;
    Some((browser, driver))
}

/// A running chromedriver with one browser session.
pub struct Browser {
    driver: Child,
    base: String,
    http: reqwest::Client,
}

impl Browser {
    /// Starts chromedriver and a headless browser session.
    pub async fn start(browser: &Path, driver: &Path) -> Browser {
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let child = Command::new(driver)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start chromedriver");
        let http = reqwest::Client::new();
        let root = format!("http://127.0.0.1:{port}");
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let ready = http
                .get(format!("{root}/status"))
                .send()
                .await
                .ok()
                .map(|r| r.json::<Value>());
            if let Some(body) = ready
                && let Ok(body) = body.await
                && body["value"]["ready"] == true
            {
                break;
            }
            assert!(Instant::now() < deadline, "chromedriver did not start");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let mut browser_session = Browser {
            driver: child,
            base: root.clone(),
            http,
        };
        let created = browser_session
            .command(
                reqwest::Method::POST,
                "/session",
                json!({"capabilities": {"alwaysMatch": {
                    "browserName": "chrome",
                    "goog:chromeOptions": {
                        "binary": browser.to_string_lossy(),
                        "args": ["--headless=new", "--no-sandbox", "--disable-gpu",
                                 "--disable-dev-shm-usage", "--window-size=1280,900"],
                    },
                }}}),
            )
            .await;
        let id = created["sessionId"].as_str().expect("session id");
        browser_session.base = format!("{root}/session/{id}");
        browser_session
    }

    /// Sends a command; its `value`, or a panic naming the WebDriver error.
    async fn command(&self, method: reqwest::Method, path: &str, body: Value) -> Value {
        let mut request = self.http.request(method, format!("{}{path}", self.base));
        if !body.is_null() {
            request = request.json(&body);
        }
        let response = request.send().await.expect("reach chromedriver");
        let status = response.status();
        let value: Value = response.json().await.expect("WebDriver JSON");
        assert!(status.is_success(), "WebDriver {path}: {status} {value}");
        value["value"].clone()
    }

    /// Loads a page.
    pub async fn goto(&self, url: &str) {
        self.command(reqwest::Method::POST, "/url", json!({ "url": url }))
            .await;
    }

    /// The address the browser shows.
    pub async fn url(&self) -> String {
        let value = self
            .command(reqwest::Method::GET, "/url", Value::Null)
            .await;
        value.as_str().unwrap_or_default().to_string()
    }

    /// The first element matching a CSS selector, if any.
    pub async fn find(&self, css: &str) -> Option<String> {
        let response = self
            .http
            .post(format!("{}/element", self.base))
            .json(&json!({"using": "css selector", "value": css}))
            .send()
            .await
            .expect("reach chromedriver");
        let found = response.status().is_success();
        let value: Value = response.json().await.expect("WebDriver JSON");
        found
            .then(|| value["value"][ELEMENT].as_str().map(str::to_string))
            .flatten()
    }

    /// The element matching a CSS selector; panics when the page has none.
    pub async fn element(&self, css: &str) -> String {
        match self.find(css).await {
            Some(id) => id,
            None => panic!(
                "no element {css} on {}: {}",
                self.url().await,
                self.command(reqwest::Method::GET, "/source", Value::Null)
                    .await
            ),
        }
    }

    /// Runs a command on the element matching a CSS selector; its value. An element found just
    /// before the page was replaced is stale, or missing while the next page loads: it is looked
    /// up again on the page now shown.
    async fn on_element(
        &self,
        css: &str,
        method: reqwest::Method,
        action: &str,
        body: Value,
    ) -> Value {
        for _ in 0..20 {
            let Some(id) = self.find(css).await else {
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            };
            let mut request = self.http.request(
                method.clone(),
                format!("{}/element/{id}/{action}", self.base),
            );
            if !body.is_null() {
                request = request.json(&body);
            }
            let response = request.send().await.expect("reach chromedriver");
            let status = response.status();
            let value: Value = response.json().await.expect("WebDriver JSON");
            if status.is_success() {
                return value["value"].clone();
            }
            assert!(
                is_stale(&value["value"]),
                "WebDriver {action} on {css}: {status} {value}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        // Missing for good: `element` panics with the page's address and source.
        self.element(css).await;
        panic!("{css} stayed stale");
    }

    /// The rendered text of the first element matching a CSS selector ("" when none).
    pub async fn text(&self, css: &str) -> String {
        if self.find(css).await.is_none() {
            return String::new();
        }
        let value = self
            .on_element(css, reqwest::Method::GET, "text", Value::Null)
            .await;
        value.as_str().unwrap_or_default().to_string()
    }

    /// Clicks the element matching a CSS selector.
    pub async fn click(&self, css: &str) {
        self.on_element(css, reqwest::Method::POST, "click", json!({}))
            .await;
    }

    /// Types into the element matching a CSS selector.
    pub async fn type_into(&self, css: &str, text: &str) {
        self.on_element(css, reqwest::Method::POST, "value", json!({ "text": text }))
            .await;
    }

    /// Waits until the text of `css` satisfies `ok` (up to `within`); the last text seen.
    pub async fn wait_for_text(
        &self,
        css: &str,
        within: Duration,
        ok: impl Fn(&str) -> bool,
    ) -> String {
        let deadline = Instant::now() + within;
        loop {
            let text = self.text(css).await;
            if ok(&text) || Instant::now() >= deadline {
                return text;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Waits until the browser shows `url` (a click that submits a form may return before the
    /// next page has loaded); the last address seen.
    pub async fn wait_for_url(&self, url: &str) -> String {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let now = self.url().await;
            if now == url || Instant::now() >= deadline {
                return now;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Ends the session and the driver.
    pub async fn quit(mut self) {
        let _ = self.http.delete(&self.base).send().await;
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        // A failed test still stops its driver (and the browser it started).
        let _ = self.driver.kill();
    }
}

/// Whether a WebDriver error says the element left the page (the page re-rendered it). Newer
/// chromedrivers report some of these as an "unknown error" from the inspector instead.
fn is_stale(error: &Value) -> bool {
    error["error"] == "stale element reference"
        || (error["error"] == "unknown error"
            && error["message"]
                .as_str()
                .is_some_and(|m| m.contains("does not belong to the document")))
}
