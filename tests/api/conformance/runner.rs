//! Runs one conformance case against a server: steps in order (groups linked by `parallel_with`
//! run concurrently), each step's response recorded for templates, assertions checked after the
//! step. The first failing assertion ends the case with an error naming the step.
//!
//! Unknown keys in a case, step or assertions object are errors (serde `deny_unknown_fields`), so a
//! feature this runner does not implement can never pass silently.

use super::jsonpath;
use super::matchers::{self, show};
use super::template::{render_matcher, render_text, render_value, resolve_whole};
use futures_util::future::join_all;
use serde::Deserialize;
use serde::de::IgnoredAny;
use serde_json::{Map, Value, json};
use std::collections::{BTreeMap, HashSet};
use std::time::{Duration, Instant};

const OJS_MEDIA_TYPE: &str = "application/openjobspec+json";

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Case {
    pub test_id: String,
    pub name: String,
    #[serde(rename = "level")]
    _level: IgnoredAny,
    #[serde(rename = "category")]
    _category: IgnoredAny,
    #[serde(rename = "description")]
    _description: IgnoredAny,
    #[serde(rename = "spec_ref")]
    _spec_ref: IgnoredAny,
    #[serde(rename = "tags")]
    _tags: IgnoredAny,
    #[serde(default)]
    setup: Option<Phase>,
    #[serde(default)]
    teardown: Option<Phase>,
    steps: Vec<Step>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Phase {
    steps: Vec<Step>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Step {
    id: String,
    action: String,
    #[serde(default, rename = "intent")]
    _intent: IgnoredAny,
    #[serde(default, rename = "description")]
    _description: IgnoredAny,
    path: Option<String>,
    #[serde(default)]
    headers: BTreeMap<String, String>,
    body: Option<Value>,
    raw_body: Option<String>,
    delay_ms: Option<u64>,
    duration_ms: Option<u64>,
    parallel_with: Option<String>,
    assertions: Option<Assertions>,
    /// `name -> JSONPath` into the response body; stored as `steps.<id>.captures.<name>`.
    #[serde(default)]
    captures: BTreeMap<String, String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Assertions {
    status: Option<Value>,
    status_in: Option<Vec<u16>>,
    body: Option<Map<String, Value>>,
    body_absent: Option<Vec<String>>,
    body_contains: Option<Vec<String>>,
    headers: Option<Map<String, Value>>,
    timing_ms: Option<Timing>,
    exclusive_claim: Option<ExclusiveClaim>,
    /// `JSONPath into {"steps": ...} -> expected value (usually a template)`, compared as data.
    equality: Option<Map<String, Value>>,
}

impl Assertions {
    fn has_response_checks(&self) -> bool {
        self.status.is_some()
            || self.status_in.is_some()
            || self.body.is_some()
            || self.body_absent.is_some()
            || self.body_contains.is_some()
            || self.headers.is_some()
            || self.timing_ms.is_some()
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Timing {
    less_than: Option<f64>,
    greater_than: Option<f64>,
    approximate: Option<f64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ExclusiveClaim {
    job_id: Value,
    fetches: Vec<Value>,
    #[serde(default)]
    exactly_one_has_job: bool,
    #[serde(default)]
    exactly_one_empty: bool,
}

/// What one HTTP step got back.
#[derive(Debug)]
struct Response {
    status: u16,
    /// Lower-case header name -> values joined with ", ".
    headers: BTreeMap<String, String>,
    /// Parsed JSON; the raw text as a JSON string if it is not JSON; None if the body is empty.
    body: Option<Value>,
    raw: String,
    elapsed_ms: u128,
}

impl Response {
    fn body_hint(&self) -> String {
        let raw: String = self.raw.chars().take(300).collect();
        let more = if self.raw.chars().count() > 300 {
            "..."
        } else {
            ""
        };
        format!(" (body: {raw}{more})")
    }
}

pub fn parse_case(text: &str) -> Result<Case, String> {
    serde_json::from_str(text).map_err(|e| format!("cannot parse case: {e}"))
}

pub async fn run_case(client: &reqwest::Client, base_url: &str, case: &Case) -> Result<(), String> {
    let all = case
        .setup
        .iter()
        .flat_map(|p| &p.steps)
        .chain(&case.steps)
        .chain(case.teardown.iter().flat_map(|p| &p.steps));
    let mut ids = HashSet::new();
    for step in all {
        if !ids.insert(step.id.as_str()) {
            return Err(format!("duplicate step id {:?}", step.id));
        }
    }
    let mut runner = Runner {
        client,
        base_url,
        ctx: json!({ "steps": {} }),
    };
    if let Some(setup) = &case.setup {
        runner
            .run_steps(&setup.steps)
            .await
            .map_err(|e| format!("setup: {e}"))?;
    }
    let result = runner.run_steps(&case.steps).await;
    if let Some(teardown) = &case.teardown {
        // Teardown is cleanup on a database that is thrown away anyway: its failures are ignored.
        let _ = runner.run_steps(&teardown.steps).await;
    }
    result
}

struct Runner<'a> {
    client: &'a reqwest::Client,
    base_url: &'a str,
    /// `{"steps": {"<id>": {"response": {"status", "headers", "body"}, "elapsed_ms", "captures"}}}`
    ctx: Value,
}

impl Runner<'_> {
    async fn run_steps(&mut self, steps: &[Step]) -> Result<(), String> {
        let mut done = vec![false; steps.len()];
        for i in 0..steps.len() {
            if done[i] {
                continue;
            }
            let group = parallel_group(steps, i)?;
            for &g in &group {
                done[g] = true;
            }
            let outcomes = {
                let ctx = &self.ctx;
                let (client, base_url) = (self.client, self.base_url);
                join_all(
                    group
                        .iter()
                        .map(|&g| execute(client, base_url, &steps[g], ctx)),
                )
                .await
            };
            for (&g, outcome) in group.iter().zip(&outcomes) {
                if let Ok(Some(response)) = outcome {
                    self.record(&steps[g], response);
                }
            }
            for (&g, outcome) in group.iter().zip(outcomes) {
                let step = &steps[g];
                let response = outcome.map_err(|e| format!("{}: {e}", step.id))?;
                self.check(step, response.as_ref())
                    .map_err(|e| format!("{}: {e}", step.id))?;
            }
        }
        Ok(())
    }

    fn record(&mut self, step: &Step, response: &Response) {
        let mut captures = Map::new();
        for (name, path) in &step.captures {
            if let Ok(Some(v)) = jsonpath::resolve(path, response.body.as_ref()) {
                captures.insert(name.clone(), v);
            }
        }
        let entry = json!({
            "response": {
                "status": response.status,
                "headers": response.headers,
                "body": response.body.clone().unwrap_or(Value::Null),
            },
            "elapsed_ms": u64::try_from(response.elapsed_ms).unwrap_or(u64::MAX),
            "captures": captures,
        });
        if let Some(steps) = self.ctx.get_mut("steps").and_then(Value::as_object_mut) {
            steps.insert(step.id.clone(), entry);
        }
    }

    fn check(&self, step: &Step, response: Option<&Response>) -> Result<(), String> {
        let Some(a) = &step.assertions else {
            return Ok(());
        };
        if a.has_response_checks() {
            let response = response
                .ok_or_else(|| format!("{} step cannot have response assertions", step.action))?;
            self.check_response(a, response)?;
        }
        if let Some(claim) = &a.exclusive_claim {
            self.check_exclusive_claim(claim)?;
        }
        if let Some(equality) = &a.equality {
            self.check_equality(equality)?;
        }
        Ok(())
    }

    fn check_response(&self, a: &Assertions, r: &Response) -> Result<(), String> {
        let ctx = &self.ctx;
        if let Some(status) = &a.status {
            matchers::check(&render_matcher(status, ctx), Some(&json!(r.status)))
                .map_err(|e| format!("status: {e}{}", r.body_hint()))?;
        }
        if let Some(list) = &a.status_in
            && !list.contains(&r.status)
        {
            return Err(format!(
                "status: expected one of {list:?}, got {}{}",
                r.status,
                r.body_hint()
            ));
        }
        if let Some(headers) = &a.headers {
            for (name, m) in headers {
                let actual = r
                    .headers
                    .get(&name.to_ascii_lowercase())
                    .cloned()
                    .map(Value::String);
                matchers::check(&render_matcher(m, ctx), actual.as_ref())
                    .map_err(|e| format!("header {name}: {e}"))?;
            }
        }
        if let Some(body) = &a.body {
            let rendered = render_matcher(&Value::Object(body.clone()), ctx);
            let map = rendered
                .as_object()
                .ok_or("body assertions must be an object")?;
            check_body_map(map, r.body.as_ref()).map_err(|e| format!("body {e}"))?;
        }
        for path in a.body_absent.iter().flatten() {
            let path = render_text(path, ctx);
            if let Some(v) = jsonpath::resolve(&path, r.body.as_ref())?
                && !v.is_null()
            {
                return Err(format!(
                    "body_absent {path}: expected absent, got {}",
                    show(Some(&v))
                ));
            }
        }
        for needle in a.body_contains.iter().flatten() {
            let needle = render_text(needle, ctx);
            if !r.raw.contains(&needle) {
                return Err(format!(
                    "body_contains: body does not contain {needle:?}{}",
                    r.body_hint()
                ));
            }
        }
        if let Some(t) = &a.timing_ms {
            let ms = r.elapsed_ms as f64;
            if let Some(n) = t.less_than
                && ms >= n
            {
                return Err(format!("timing_ms: expected < {n} ms, took {ms} ms"));
            }
            if let Some(n) = t.greater_than
                && ms <= n
            {
                return Err(format!("timing_ms: expected > {n} ms, took {ms} ms"));
            }
            if let Some(n) = t.approximate
                && !matchers::approx(n, ms)
            {
                return Err(format!("timing_ms: expected about {n} ms, took {ms} ms"));
            }
        }
        Ok(())
    }

    /// A value from an assertion: a whole template resolves to its typed value; other strings get
    /// text substitution.
    fn resolve_value(&self, v: &Value) -> Result<Value, String> {
        let value = match v {
            Value::String(s) => resolve_whole(s, &self.ctx)
                .unwrap_or_else(|| Value::String(render_text(s, &self.ctx))),
            other => render_value(other, &self.ctx),
        };
        match &value {
            Value::String(s) if s.contains("{{") => Err(format!("unresolved template {s:?}")),
            _ => Ok(value),
        }
    }

    fn check_exclusive_claim(&self, claim: &ExclusiveClaim) -> Result<(), String> {
        if !claim.exactly_one_has_job && !claim.exactly_one_empty {
            return Err(
                "exclusive_claim: neither exactly_one_has_job nor exactly_one_empty is set"
                    .to_string(),
            );
        }
        let job_id = self
            .resolve_value(&claim.job_id)
            .map_err(|e| format!("exclusive_claim job_id: {e}"))?;
        let job_id = job_id
            .as_str()
            .ok_or_else(|| format!("exclusive_claim: job_id is not a string: {job_id}"))?;
        let mut holding = 0;
        let mut empty = 0;
        let mut seen = Vec::new();
        for (i, fetch) in claim.fetches.iter().enumerate() {
            let value = self
                .resolve_value(fetch)
                .map_err(|e| format!("exclusive_claim fetches[{i}]: {e}"))?;
            let jobs = value.as_array().ok_or_else(|| {
                format!(
                    "exclusive_claim fetches[{i}]: expected a job list, got {}",
                    show(Some(&value))
                )
            })?;
            if jobs.is_empty() {
                empty += 1;
            }
            if jobs
                .iter()
                .any(|j| j.get("id").and_then(Value::as_str) == Some(job_id))
            {
                holding += 1;
            }
            seen.push(show(Some(&value)));
        }
        let n = claim.fetches.len();
        if claim.exactly_one_has_job && holding != 1 {
            return Err(format!(
                "exclusive_claim: expected exactly one of {n} fetches to hold job {job_id}, {holding} did: {}",
                seen.join(" | ")
            ));
        }
        if claim.exactly_one_empty && empty != 1 {
            return Err(format!(
                "exclusive_claim: expected exactly one of {n} fetches to be empty, {empty} were: {}",
                seen.join(" | ")
            ));
        }
        Ok(())
    }

    fn check_equality(&self, equality: &Map<String, Value>) -> Result<(), String> {
        for (path, expected) in equality {
            let path = render_text(path, &self.ctx);
            let expected = self
                .resolve_value(expected)
                .map_err(|e| format!("equality {path}: {e}"))?;
            let actual = jsonpath::resolve(&path, Some(&self.ctx))?;
            if !actual
                .as_ref()
                .is_some_and(|a| jsonpath::values_equal(a, &expected))
            {
                return Err(format!(
                    "equality {path}: expected {}, got {}",
                    show(Some(&expected)),
                    show(actual.as_ref())
                ));
            }
        }
        Ok(())
    }
}

/// Body assertions: JSONPath -> matcher, plus `$or` (list of alternative maps, any must pass)
/// and `$empty` (the whole body is empty or null).
fn check_body_map(map: &Map<String, Value>, root: Option<&Value>) -> Result<(), String> {
    for (key, m) in map {
        match key.as_str() {
            "$or" => {
                let alternatives = m.as_array().ok_or("$or needs an array of alternatives")?;
                let mut errors = Vec::new();
                let mut passed = false;
                for (i, alt) in alternatives.iter().enumerate() {
                    let alt = alt.as_object().ok_or("$or alternatives must be objects")?;
                    match check_body_map(alt, root) {
                        Ok(()) => {
                            passed = true;
                            break;
                        }
                        Err(e) => errors.push(format!("#{}: {e}", i + 1)),
                    }
                }
                if !passed {
                    return Err(format!(
                        "$or: no alternative matched [{}]",
                        errors.join("; ")
                    ));
                }
            }
            "$empty" => {
                matchers::check(&json!({ "$empty": m }), root)
                    .map_err(|e| format!("$empty: {e}"))?;
            }
            path if path == "$" || path.starts_with("$.") || path.starts_with("$[") => {
                let actual = jsonpath::resolve(path, root)?;
                matchers::check(m, actual.as_ref()).map_err(|e| format!("{path}: {e}"))?;
            }
            other => return Err(format!("unknown body assertion key {other:?}")),
        }
    }
    Ok(())
}

/// Step `i` plus every step linked to it through `parallel_with` (either direction), in file order.
fn parallel_group(steps: &[Step], i: usize) -> Result<Vec<usize>, String> {
    let mut group = vec![i];
    let mut k = 0;
    while k < group.len() {
        let step = &steps[group[k]];
        if let Some(partner) = &step.parallel_with {
            let j = steps.iter().position(|s| &s.id == partner).ok_or_else(|| {
                format!("{}: parallel_with names unknown step {partner:?}", step.id)
            })?;
            if !group.contains(&j) {
                group.push(j);
            }
        }
        for (j, other) in steps.iter().enumerate() {
            if other.parallel_with.as_deref() == Some(step.id.as_str()) && !group.contains(&j) {
                group.push(j);
            }
        }
        k += 1;
    }
    group.sort_unstable();
    if group[0] < i {
        return Err(format!(
            "{}: parallel_with links to an earlier, already run step",
            steps[i].id
        ));
    }
    Ok(group)
}

async fn execute(
    client: &reqwest::Client,
    base_url: &str,
    step: &Step,
    ctx: &Value,
) -> Result<Option<Response>, String> {
    if let Some(ms) = step.delay_ms {
        tokio::time::sleep(Duration::from_millis(ms)).await;
    }
    let action = step.action.to_ascii_uppercase();
    match action.as_str() {
        "WAIT" => {
            if step.assertions.is_some() {
                return Err("WAIT steps cannot have assertions".to_string());
            }
            tokio::time::sleep(Duration::from_millis(step.duration_ms.unwrap_or(0))).await;
            Ok(None)
        }
        "ASSERT" => Ok(None),
        "GET" | "POST" | "PUT" | "PATCH" | "DELETE" => {
            send(client, base_url, step, &action, ctx).await.map(Some)
        }
        other => Err(format!("unsupported action {other:?}")),
    }
}

async fn send(
    client: &reqwest::Client,
    base_url: &str,
    step: &Step,
    action: &str,
    ctx: &Value,
) -> Result<Response, String> {
    let path = step.path.as_deref().ok_or("HTTP step without a path")?;
    let url = format!("{base_url}{}", render_text(path, ctx));
    let method = reqwest::Method::from_bytes(action.as_bytes())
        .map_err(|e| format!("bad method {action}: {e}"))?;
    let mut request = client.request(method.clone(), &url);
    let mut has_content_type = false;
    for (name, value) in &step.headers {
        has_content_type |= name.eq_ignore_ascii_case("content-type");
        request = request.header(name.as_str(), render_text(value, ctx));
    }
    let body = match (&step.raw_body, &step.body) {
        (Some(_), Some(_)) => return Err("a step cannot have both body and raw_body".to_string()),
        (Some(raw), None) => Some(render_text(raw, ctx).into_bytes()),
        (None, Some(body)) => Some(
            serde_json::to_vec(&render_value(body, ctx))
                .map_err(|e| format!("cannot encode body: {e}"))?,
        ),
        (None, None) => None,
    };
    match body {
        Some(bytes) => {
            if !has_content_type {
                request = request.header("content-type", OJS_MEDIA_TYPE);
            }
            request = request.body(bytes);
        }
        // POST/DELETE without a body: an empty body, with the step's headers.
        None if method != reqwest::Method::GET => request = request.body(Vec::new()),
        None => {}
    }
    let start = Instant::now();
    let response = request
        .send()
        .await
        .map_err(|e| format!("{method} {url}: request failed: {e}"))?;
    let status = response.status().as_u16();
    let mut headers: BTreeMap<String, String> = BTreeMap::new();
    for (name, value) in response.headers() {
        let value = String::from_utf8_lossy(value.as_bytes()).into_owned();
        headers
            .entry(name.as_str().to_string())
            .and_modify(|v| {
                v.push_str(", ");
                v.push_str(&value);
            })
            .or_insert(value);
    }
    let bytes = response
        .bytes()
        .await
        .map_err(|e| format!("{method} {url}: reading the body failed: {e}"))?;
    let elapsed_ms = start.elapsed().as_millis();
    let raw = String::from_utf8_lossy(&bytes).into_owned();
    let body = if raw.trim().is_empty() {
        None
    } else {
        Some(serde_json::from_str(&raw).unwrap_or_else(|_| Value::String(raw.clone())))
    };
    Ok(Response {
        status,
        headers,
        body,
        raw,
        elapsed_ms,
    })
}

#[cfg(test)]
mod tests {
    use super::{check_body_map, parse_case, run_case};
    use axum::Router;
    use axum::body::Bytes;
    use axum::extract::State;
    use axum::http::{StatusCode, header};
    use axum::routing::{get, post};
    use serde_json::{Value, json};
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    struct Mock {
        job: Mutex<Option<Value>>,
        both_fetches: tokio::sync::Barrier,
    }

    const JOB_ID: &str = "01890a5d-ac96-774b-bcce-b302099a8057";
    const OJS: &str = "application/openjobspec+json";

    /// A tiny server: enqueue, two fetches that only answer when both are in flight (so they
    /// must be concurrent), a read-only GET, a 204, and an endpoint rejecting invalid JSON.
    async fn mock_server() -> String {
        let state = Arc::new(Mock {
            job: Mutex::new(None),
            both_fetches: tokio::sync::Barrier::new(2),
        });
        let app = Router::new()
            .route(
                "/jobs",
                post(|State(s): State<Arc<Mock>>, body: Bytes| async move {
                    let request: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
                    let job = json!({"id": JOB_ID, "state": "available", "args": request["args"], "attempt": 0});
                    *s.job.lock().expect("mock lock") = Some(job.clone());
                    (StatusCode::CREATED, [(header::CONTENT_TYPE, OJS)], json!({"job": job}).to_string())
                }),
            )
            .route(
                "/fetch",
                post(|State(s): State<Arc<Mock>>| async move {
                    if tokio::time::timeout(Duration::from_secs(1), s.both_fetches.wait()).await.is_err() {
                        return (StatusCode::INTERNAL_SERVER_ERROR, "fetches were not concurrent".to_string());
                    }
                    let jobs: Vec<Value> = s.job.lock().expect("mock lock").take().into_iter().collect();
                    (StatusCode::OK, json!({"jobs": jobs}).to_string())
                }),
            )
            .route(
                "/jobs/{id}",
                get(|axum::extract::Path(id): axum::extract::Path<String>| async move {
                    json!({"job": {"id": id, "state": "active", "n": 1.0}}).to_string()
                }),
            )
            .route("/empty", get(|| async { StatusCode::NO_CONTENT }))
            .route(
                "/raw",
                post(|body: Bytes| async move {
                    match serde_json::from_slice::<Value>(&body) {
                        Ok(_) => (StatusCode::OK, "ok".to_string()),
                        Err(_) => (
                            StatusCode::BAD_REQUEST,
                            json!({"error": {"code": "invalid_request", "message": "invalid JSON"}}).to_string(),
                        ),
                    }
                }),
            )
            .with_state(state);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind mock");
        let addr = listener.local_addr().expect("mock addr");
        tokio::spawn(async move { axum::serve(listener, app).await });
        format!("http://{addr}")
    }

    fn mock_case() -> Value {
        let h = json!({"Content-Type": OJS, "Accept": OJS});
        json!({"test_id": "T-1", "level": 0, "category": "c", "name": "mock", "description": "d",
            "spec_ref": "s", "tags": [], "steps": [
            {"id": "step-1", "action": "POST", "path": "/jobs", "headers": h,
             "body": {"type": "t", "args": [1, "x"]},
             "assertions": {"status": 201, "headers": {"content-type": OJS, "X-Missing": "absent"},
                "body": {"$.job.id": "string:uuidv7", "$.job.args": [1, "x"], "$.job.state": "available"}}},
            {"id": "step-2", "action": "POST", "path": "/fetch", "parallel_with": "step-3", "headers": h,
             "body": {"queues": ["q"]}, "assertions": {"status": 200}},
            {"id": "step-3", "action": "POST", "path": "/fetch", "parallel_with": "step-2", "headers": h,
             "body": {"queues": ["q"]}, "assertions": {"status": 200}},
            {"id": "step-4", "action": "ASSERT", "assertions": {"exclusive_claim": {
                "job_id": "{{steps.step-1.response.body.job.id}}",
                "fetches": ["{{steps.step-2.response.body.jobs}}", "{{steps.step-3.response.body.jobs}}"],
                "exactly_one_has_job": true, "exactly_one_empty": true}}},
            {"id": "step-5", "action": "GET", "path": "/jobs/{{steps.step-1.response.body.job.id}}",
             "assertions": {"status": "one_of:200,201", "body": {"$.job.id": "{{steps.step-1.response.body.job.id}}",
                "$.job.n": 1}}},
            {"id": "step-6", "action": "GET", "delay_ms": 5, "path": "/jobs/{{steps.step-1.response.body.job.id}}",
             "assertions": {"status": {"$in": [200]}, "timing_ms": {"less_than": 5000}}},
            {"id": "step-7", "action": "ASSERT", "assertions": {"equality": {
                "$.steps.step-5.response.body": "{{steps.step-6.response.body}}"}}},
            {"id": "step-8", "action": "GET", "path": "/empty", "assertions": {"status": {"$in": [200, 204]},
                "body": {"$or": [{"$.jobs": {"$size": 0}}, {"$empty": true}]}}},
            {"id": "step-9", "action": "WAIT", "duration_ms": 10},
            {"id": "step-10", "action": "POST", "path": "/raw", "headers": h, "raw_body": "{ invalid json }",
             "assertions": {"status": "number:range(400,422)", "status_in": [400],
                "body": {"$.error.code": {"$exists": true, "$type": "string"}},
                "body_absent": ["$.job"], "body_contains": ["invalid JSON"]}}
        ]})
    }

    async fn run(case: &Value) -> Result<(), String> {
        let base = mock_server().await;
        let client = reqwest::Client::builder()
            .no_proxy()
            .build()
            .expect("client");
        let case = parse_case(&case.to_string())?;
        run_case(&client, &base, &case).await
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn runner_end_to_end_against_mock() {
        if let Err(e) = run(&mock_case()).await {
            panic!("mock case should pass: {e}");
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn runner_reports_first_failing_step() {
        let mut case = mock_case();
        case["steps"][4]["assertions"]["body"]["$.job.n"] = json!(2);
        let err = run(&case).await.expect_err("step-5 must fail");
        assert!(
            err.starts_with("step-5: body $.job.n: expected 2, got 1.0"),
            "{err}"
        );

        // Without parallel_with the two fetches are sequential: the mock answers 500.
        let mut case = mock_case();
        for i in [1, 2] {
            if let Some(step) = case["steps"][i].as_object_mut() {
                step.remove("parallel_with");
            }
        }
        let err = run(&case).await.expect_err("sequential fetches must fail");
        assert!(
            err.starts_with("step-2: status: expected 200, got 500"),
            "{err}"
        );

        let mut case = mock_case();
        case["steps"][3]["assertions"]["exclusive_claim"]["fetches"][1] =
            json!("{{steps.step-2.response.body.jobs}}");
        let err = run(&case)
            .await
            .expect_err("both fetches holding the job must fail");
        assert!(
            err.contains("step-4: exclusive_claim: expected exactly one of 2 fetches to hold job"),
            "{err}"
        );

        let mut case = mock_case();
        case["steps"][6]["assertions"]["equality"] = json!({"$.steps.step-5.response.status": 201});
        let err = run(&case).await.expect_err("equality must fail");
        assert!(
            err.starts_with(
                "step-7: equality $.steps.step-5.response.status: expected 201, got 200"
            ),
            "{err}"
        );

        let mut case = mock_case();
        case["steps"][0]["assertions"]["headers"] = json!({"Content-Type": "application/json"});
        let err = run(&case).await.expect_err("header must fail");
        assert!(err.starts_with("step-1: header Content-Type"), "{err}");
    }

    fn body_ok(assertions: Value, body: Option<Value>) -> Result<(), String> {
        let map = assertions.as_object().cloned().unwrap_or_default();
        check_body_map(&map, body.as_ref())
    }

    #[test]
    fn matchers_body_or_and_empty() {
        let a = json!({"$or": [{"$.jobs": {"$size": 0}}, {"$empty": true}]});
        assert!(body_ok(a.clone(), Some(json!({"jobs": []}))).is_ok());
        assert!(body_ok(a.clone(), None).is_ok());
        assert!(body_ok(a, Some(json!({"jobs": [{"id": "x"}]}))).is_err());
        let b = json!({"$or": [
            {"$.job.state": {"$in": ["completed", "cancelled"]}},
            {"$.error.code": {"$in": ["invalid_request", "conflict"]}, "$.error.message": {"$exists": true}}
        ]});
        assert!(body_ok(b.clone(), Some(json!({"job": {"state": "cancelled"}}))).is_ok());
        assert!(
            body_ok(
                b.clone(),
                Some(json!({"error": {"code": "conflict", "message": "m"}}))
            )
            .is_ok()
        );
        assert!(body_ok(b.clone(), Some(json!({"error": {"code": "conflict"}}))).is_err());
        assert!(body_ok(b, Some(json!({"job": {"state": "active"}}))).is_err());
        assert!(body_ok(json!({"job.id": "x"}), Some(json!({"job": {"id": "x"}}))).is_err());
        assert!(body_ok(json!({"$.job.id": "x"}), None).is_err());
    }

    #[test]
    fn matchers_case_parsing_is_strict() {
        let minimal = json!({"test_id": "T", "level": 0, "category": "c", "name": "n", "description": "d",
            "spec_ref": "s", "tags": [], "steps": [{"id": "s1", "action": "GET", "path": "/x"}]});
        assert!(parse_case(&minimal.to_string()).is_ok());
        let mut unknown = minimal.clone();
        unknown["steps"][0]["assertions"] = json!({"body_raw": "x"});
        assert!(parse_case(&unknown.to_string()).is_err());
        let mut unknown_step_key = minimal;
        unknown_step_key["steps"][0]["retries"] = json!(3);
        assert!(parse_case(&unknown_step_key.to_string()).is_err());
    }
}
