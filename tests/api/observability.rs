//! Observability over both protocols, each test on its own server and database (real PostgreSQL):
//! `GET /metrics` scraped and parsed as Prometheus text, and W3C trace context (`traceparent`,
//! `tracestate`) riding with jobs and stream messages.

use crate::common;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::Duration;

use pgvs3::grpc::proto::ojs::v1 as pb;
use prost_types::value::Kind;
use reqwest::StatusCode;
use serde_json::{Value, json};

// ---------------------------------------------------------------------------------------------
// HTTP helpers

/// The shared HTTP client, with this module's calls.
struct Api(common::http::Http);

impl std::ops::Deref for Api {
    type Target = common::http::Http;

    fn deref(&self) -> &common::http::Http {
        &self.0
    }
}

impl Api {
    fn new(app: &common::TestApp) -> Api {
        Api(common::http::Http::new(app))
    }

    /// Sends a request with extra headers; returns the status and the JSON (or text) body.
    async fn send(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<Value>,
        headers: &[(&str, &str)],
    ) -> (StatusCode, Value) {
        self.send_raw(method, path, body.map(|b| b.to_string()), headers)
            .await
    }

    async fn post(&self, path: &str, body: Value, headers: &[(&str, &str)]) -> Value {
        let (status, answer) = self
            .send(reqwest::Method::POST, path, Some(body), headers)
            .await;
        assert!(status.is_success(), "POST {path} -> {status}: {answer}");
        answer
    }

    /// Enqueues one job; returns its id.
    async fn enqueue(&self, body: Value, headers: &[(&str, &str)]) -> String {
        let (status, answer) = self
            .send(reqwest::Method::POST, "/ojs/v1/jobs", Some(body), headers)
            .await;
        assert_eq!(status, StatusCode::CREATED, "enqueue: {answer}");
        answer["job"]["id"].as_str().expect("job id").to_string()
    }

    /// Claims up to `count` jobs of `queue`.
    async fn fetch(&self, queue: &str, count: i64) -> Vec<Value> {
        let answer = self
            .post(
                "/ojs/v1/workers/fetch",
                json!({"queues": [queue], "count": count}),
                &[],
            )
            .await;
        answer["jobs"].as_array().expect("jobs").clone()
    }

    /// Enqueues one job (into `queue`) with the given request headers, fetches it and
    /// returns its `meta`.
    async fn meta_roundtrip(&self, queue: &str, body: Value, headers: &[(&str, &str)]) -> Value {
        let id = self.enqueue(body, headers).await;
        let jobs = self.fetch(queue, 10).await;
        assert_eq!(jobs.len(), 1, "one job fetched from {queue}: {jobs:?}");
        assert_eq!(jobs[0]["id"], id.as_str());
        jobs[0]["meta"].clone()
    }

    async fn scrape(&self) -> String {
        let response = self
            .client
            .get(format!("{}/metrics", self.base))
            .send()
            .await
            .expect("scrape /metrics");
        assert_eq!(response.status(), StatusCode::OK);
        let content_type = response
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_string();
        assert_eq!(
            content_type, "application/openmetrics-text; version=1.0.0; charset=utf-8",
            "the OpenMetrics content type"
        );
        response.text().await.expect("metrics body")
    }
}

/// A fresh W3C `traceparent` (version 00, sampled) with its trace id and parent id.
fn traceparent() -> (String, String, String) {
    let trace_id = uuid::Uuid::new_v4().simple().to_string();
    let span_id = uuid::Uuid::new_v4().simple().to_string()[..16].to_string();
    (format!("00-{trace_id}-{span_id}-01"), trace_id, span_id)
}

// ---------------------------------------------------------------------------------------------
// The exposition: values read by `prometheus-parse`, the OpenMetrics structure (which that
// lenient parser does not check) by `check_structure`.

#[derive(Debug, Clone)]
struct Sample {
    name: String,
    labels: BTreeMap<String, String>,
    value: f64,
}

#[derive(Debug, Default)]
struct Exposition {
    /// Family name → HELP text.
    help: HashMap<String, String>,
    /// Family name → TYPE.
    types: HashMap<String, String>,
    /// Family name → UNIT.
    units: HashMap<String, String>,
    /// Every sample; a histogram's buckets as `<family>_bucket` samples with their `le`.
    samples: Vec<Sample>,
}

fn is_metric_name(name: &str) -> bool {
    let mut chars = name.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_' || c == ':')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
}

fn parse_value(text: &str) -> Result<f64, String> {
    match text {
        "+Inf" | "Inf" => Ok(f64::INFINITY),
        "-Inf" => Ok(f64::NEG_INFINITY),
        "NaN" => Ok(f64::NAN),
        t => t.parse().map_err(|e| format!("bad value {t:?}: {e}")),
    }
}

/// The family a sample name belongs to, by the suffixes OpenMetrics gives each type.
fn family_of<'a>(name: &'a str, types: &HashMap<String, String>) -> Option<&'a str> {
    if types.contains_key(name) && !matches!(types[name].as_str(), "counter" | "histogram") {
        return Some(name);
    }
    for (kind, suffixes) in [
        ("counter", &["_total", "_created"][..]),
        ("histogram", &["_bucket", "_sum", "_count", "_created"][..]),
    ] {
        for suffix in suffixes {
            if let Some(base) = name.strip_suffix(suffix)
                && types.get(base).map(String::as_str) == Some(kind)
            {
                return Some(base);
            }
        }
    }
    None
}

/// Checks what the value parser does not: the text ends with `# EOF`; each family has one TYPE
/// (OpenMetrics types only), one HELP and at most one UNIT, all before its samples, and the UNIT
/// ends its name; every sample belongs to a declared family and its samples are together.
fn check_structure(text: &str) -> Result<Exposition, String> {
    let mut out = Exposition::default();
    let body = text
        .strip_suffix("# EOF\n")
        .ok_or("the exposition must end with \"# EOF\"")?;
    let mut finished = HashSet::new();
    let mut current: Option<String> = None;
    for (n, line) in body.lines().enumerate() {
        let at = |e: String| format!("line {}: {e}: {line:?}", n + 1);
        if let Some(comment) = line.strip_prefix("# ") {
            let mut words = comment.splitn(3, ' ');
            let (kind, name) = (
                words.next().unwrap_or_default(),
                words.next().unwrap_or_default(),
            );
            let rest = words.next().unwrap_or_default().to_string();
            if !is_metric_name(name) {
                return Err(at(format!("bad family name {name:?}")));
            }
            if current.as_deref() != Some(name) {
                if let Some(done) = current.take() {
                    finished.insert(done);
                }
                if finished.contains(name) {
                    return Err(at(format!("{name} declared again after other families")));
                }
                current = Some(name.to_string());
            }
            let seen = match kind {
                "HELP" => {
                    // OpenMetrics escapes `"`, `\` and newlines in HELP text.
                    let mut chars = rest.chars();
                    while let Some(c) = chars.next() {
                        let escaped = c == '\\' && matches!(chars.next(), Some('\\' | 'n' | '"'));
                        if c == '"' || (c == '\\' && !escaped) {
                            return Err(at("an unescaped character in HELP".into()));
                        }
                    }
                    out.help.insert(name.to_string(), rest)
                }
                "TYPE" => {
                    if !matches!(
                        rest.as_str(),
                        "counter"
                            | "gauge"
                            | "histogram"
                            | "gaugehistogram"
                            | "stateset"
                            | "info"
                            | "summary"
                            | "unknown"
                    ) {
                        return Err(at(format!("bad type {rest:?}")));
                    }
                    out.types.insert(name.to_string(), rest)
                }
                "UNIT" => {
                    if !name.ends_with(&format!("_{rest}")) {
                        return Err(at(format!("{name} does not end in its unit {rest}")));
                    }
                    out.units.insert(name.to_string(), rest)
                }
                _ => return Err(at("a comment that is not HELP, TYPE or UNIT".into())),
            };
            if seen.is_some() {
                return Err(at(format!("second {kind} for {name}")));
            }
            continue;
        }
        let name_end = line.find(['{', ' ']).ok_or_else(|| at("no value".into()))?;
        let name = &line[..name_end];
        let family = family_of(name, &out.types)
            .ok_or_else(|| at(format!("{name} belongs to no declared family")))?;
        if current.as_deref() != Some(family) {
            return Err(at(format!(
                "a sample of {family} outside its family's block"
            )));
        }
    }
    for family in out.types.keys() {
        if !out.help.contains_key(family) {
            return Err(format!("no HELP for {family}"));
        }
    }
    for family in out.help.keys().chain(out.units.keys()) {
        if !out.types.contains_key(family) {
            return Err(format!("no TYPE for {family}"));
        }
    }
    Ok(out)
}

/// The exposition's structure checked and its samples read by `prometheus-parse`.
fn parse_exposition(text: &str) -> Result<Exposition, String> {
    let mut out = check_structure(text)?;
    let scrape = prometheus_parse::Scrape::parse(text.lines().map(|l| Ok(l.to_string())))
        .map_err(|e| e.to_string())?;
    let sample_lines = text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .count();
    for sample in scrape.samples {
        let labels: BTreeMap<String, String> = sample
            .labels
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        match sample.value {
            prometheus_parse::Value::Histogram(buckets) => {
                for bucket in buckets {
                    let mut labels = labels.clone();
                    let le = if bucket.less_than.is_infinite() {
                        "+Inf".to_string()
                    } else {
                        bucket.less_than.to_string()
                    };
                    labels.insert("le".into(), le);
                    out.samples.push(Sample {
                        name: format!("{}_bucket", sample.metric),
                        labels,
                        value: bucket.count,
                    });
                }
            }
            prometheus_parse::Value::Counter(v)
            | prometheus_parse::Value::Gauge(v)
            | prometheus_parse::Value::Untyped(v) => out.samples.push(Sample {
                name: sample.metric,
                labels,
                value: v,
            }),
            prometheus_parse::Value::Summary(_) => return Err("no summaries expected".into()),
        }
    }
    // The parser skips lines it cannot read; every sample line must have been read, once.
    if out.samples.len() != sample_lines {
        return Err(format!(
            "{} sample lines, {} samples read",
            sample_lines,
            out.samples.len()
        ));
    }
    let series: HashSet<(&str, &BTreeMap<String, String>)> = out
        .samples
        .iter()
        .map(|s| (s.name.as_str(), &s.labels))
        .collect();
    if series.len() != out.samples.len() {
        return Err("a series is repeated".into());
    }
    Ok(out)
}

impl Exposition {
    /// Samples named `name` whose labels include every pair of `want`.
    fn find(&self, name: &str, want: &[(&str, &str)]) -> Vec<&Sample> {
        self.samples
            .iter()
            .filter(|s| {
                s.name == name
                    && want
                        .iter()
                        .all(|(k, v)| s.labels.get(*k).map(String::as_str) == Some(*v))
            })
            .collect()
    }

    /// The value of the one sample named `name` with exactly these labels.
    fn value(&self, name: &str, want: &[(&str, &str)]) -> f64 {
        let found: Vec<&Sample> = self
            .find(name, want)
            .into_iter()
            .filter(|s| s.labels.len() == want.len())
            .collect();
        assert_eq!(
            found.len(),
            1,
            "exactly one {name}{want:?}; found {found:?}"
        );
        found[0].value
    }
}

// ---------------------------------------------------------------------------------------------
// gRPC helpers

fn pb_string(value: &prost_types::Value) -> Option<&str> {
    match &value.kind {
        Some(Kind::StringValue(s)) => Some(s),
        _ => None,
    }
}

fn with_trace<T>(message: T, parent: &str, state: Option<&str>) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    request
        .metadata_mut()
        .insert("traceparent", parent.parse().expect("ascii metadata"));
    if let Some(state) = state {
        request
            .metadata_mut()
            .insert("tracestate", state.parse().expect("ascii metadata"));
    }
    request
}

// ---------------------------------------------------------------------------------------------
// Metrics

#[test]
fn the_exposition_check_reads_openmetrics_and_refuses_malformed_input() {
    let good = "# HELP a A counter.\n# TYPE a counter\na_total{x=\"1\",y=\"q\"} 3\n\
                # HELP h_seconds A histogram.\n# TYPE h_seconds histogram\n# UNIT h_seconds seconds\n\
                h_seconds_bucket{le=\"0.5\"} 1\nh_seconds_bucket{le=\"+Inf\"} 2\n\
                h_seconds_sum 0.7\nh_seconds_count 2\n# EOF\n";
    let parsed = parse_exposition(good).expect("valid text");
    assert_eq!(parsed.value("a_total", &[("x", "1"), ("y", "q")]), 3.0);
    assert_eq!(parsed.value("h_seconds_bucket", &[("le", "+Inf")]), 2.0);
    assert_eq!(parsed.value("h_seconds_bucket", &[("le", "0.5")]), 1.0);
    assert_eq!(parsed.value("h_seconds_count", &[]), 2.0);
    assert_eq!(parsed.units["h_seconds"], "seconds");
    for bad in [
        "# HELP a A.\n# TYPE a gauge\na 1\n",             // no EOF
        "# HELP a A.\n# TYPE a gauge\na 1\n# EOF\nb 1\n", // text after EOF
        "a 1\n# EOF\n",                                   // no TYPE
        "# TYPE a gauge\na 1\n# EOF\n",                   // no HELP
        "# HELP a A.\n# TYPE a counter\na 1\n# EOF\n",    // counter without _total
        "# HELP a A.\n# TYPE a gauge\n# TYPE a gauge\na 1\n# EOF\n", // second TYPE
        "# HELP a A.\n# TYPE a gauge\n# UNIT a seconds\na 1\n# EOF\n", // unit not in the name
        "# HELP a A.\n# TYPE a gauge\na{x=\"1\"} one\n# EOF\n", // bad value
        "# HELP a A.\n# TYPE a gauge\na 1\na 2\n# EOF\n", // repeated series
        "# HELP a A.\n# TYPE a gauge\n# HELP b B.\n# TYPE b gauge\na 1\n# EOF\n", // not together
        "# HELP a A \"q\".\n# TYPE a gauge\na 1\n# EOF\n", // unescaped quote in HELP
    ] {
        assert!(parse_exposition(bad).is_err(), "accepted {bad:?}");
    }
}

/// Requests over both protocols, jobs by state, stream size and consumer lag, pool use; the
/// exposition parses and follows the naming conventions; histograms are cumulative.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_scrape_parses_and_counts() {
    let app = common::spawn_app().await;
    let api = Api::new(&app);

    // Jobs over HTTP: 3 enqueued into m1, 1 fetched; one 404.
    let mut ids = Vec::new();
    for n in 0..3 {
        ids.push(
            api.enqueue(
                json!({"type": "metrics.job", "args": [n], "options": {"queue": "m1"}}),
                &[],
            )
            .await,
        );
    }
    assert_eq!(api.fetch("m1", 1).await.len(), 1);
    let missing = uuid::Uuid::now_v7();
    let (status, _) = api
        .send(
            reqwest::Method::GET,
            &format!("/ojs/v1/jobs/{missing}"),
            None,
            &[],
        )
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);

    // One gRPC GetJob (OK).
    let job = app
        .grpc()
        .await
        .get_job(pb::GetJobRequest {
            job_id: ids[0].clone(),
        })
        .await
        .expect("gRPC GetJob")
        .into_inner()
        .job
        .expect("a job");
    assert_eq!(job.id, ids[0]);

    // A stream: 5 messages in s1, consumer c1 from tick 0 receives them without acking.
    api.post(
        "/ojs/v1/queues/s1/messages/batch",
        json!({"messages": (0..5).map(|n| json!({"type": "metrics.msg", "payload": {"n": n}}))
            .collect::<Vec<_>>()}),
        &[],
    )
    .await;
    api.post(
        "/ojs/v1/queues/s1/consumers",
        json!({"consumer": "c1", "from_tick": 0}),
        &[],
    )
    .await;
    let batch = api
        .post(
            "/ojs/v1/queues/s1/receive",
            json!({"consumer": "c1", "max": 100}),
            &[],
        )
        .await;
    assert_eq!(
        batch["events"].as_array().map(Vec::len),
        Some(5),
        "c1 receives the five messages: {batch}"
    );

    let text = api.scrape().await;
    let metrics = parse_exposition(&text).unwrap_or_else(|e| panic!("{e}\n---\n{text}"));

    // Requests by operation, protocol and status.
    assert_eq!(
        metrics.value(
            "pgvs3_requests_total",
            &[
                ("operation", "enqueueJob"),
                ("protocol", "http"),
                ("status", "201")
            ]
        ),
        3.0,
        "{text}"
    );
    assert_eq!(
        metrics.value(
            "pgvs3_requests_total",
            &[
                ("operation", "fetchJobs"),
                ("protocol", "http"),
                ("status", "200")
            ]
        ),
        1.0
    );
    let not_found = metrics.find("pgvs3_requests_total", &[("status", "404")]);
    assert!(!not_found.is_empty(), "a 404 series: {text}");
    assert!(
        not_found.iter().any(
            |s| s.labels.get("operation").map(String::as_str) == Some("getJob")
                && s.labels.get("protocol").map(String::as_str) == Some("http")
        ),
        "the 404 is counted under getJob/http: {not_found:?}"
    );
    assert_eq!(
        metrics.value(
            "pgvs3_requests_total",
            &[
                ("operation", "/ojs.v1.OJSService/GetJob"),
                ("protocol", "grpc"),
                ("status", "0")
            ]
        ),
        1.0,
        "{text}"
    );
    for s in metrics.find("pgvs3_requests_total", &[]) {
        for label in ["operation", "protocol", "status"] {
            assert!(s.labels.contains_key(label), "{label} on {s:?}");
        }
        assert!(
            matches!(s.labels["protocol"].as_str(), "http" | "grpc"),
            "{s:?}"
        );
    }

    // Latency histograms: per series, buckets cumulative in ascending `le`, +Inf == _count, and
    // the count equals the request counter of the same series.
    let counts = metrics.find("pgvs3_request_duration_seconds_count", &[]);
    assert!(!counts.is_empty(), "latency histograms exist: {text}");
    for count in &counts {
        let labels: Vec<(&str, &str)> = count
            .labels
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        let mut buckets: Vec<(f64, f64)> = metrics
            .find("pgvs3_request_duration_seconds_bucket", &labels)
            .into_iter()
            .filter(|b| b.labels.len() == labels.len() + 1)
            .map(|b| {
                let le = parse_value(&b.labels["le"]).expect("le is a number");
                (le, b.value)
            })
            .collect();
        assert!(buckets.len() >= 2, "buckets of {labels:?}");
        buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
        assert!(
            buckets.windows(2).all(|w| w[0].1 <= w[1].1),
            "cumulative buckets of {labels:?}: {buckets:?}"
        );
        let (last_le, last) = *buckets.last().expect("a bucket");
        assert!(last_le.is_infinite(), "a +Inf bucket for {labels:?}");
        assert_eq!(last, count.value, "+Inf == _count for {labels:?}");
        let sum = metrics.value("pgvs3_request_duration_seconds_sum", &labels);
        assert!(sum >= 0.0 && sum.is_finite(), "sum of {labels:?}: {sum}");
        assert_eq!(
            metrics.value("pgvs3_requests_total", &labels),
            count.value,
            "histogram count == request counter for {labels:?}"
        );
    }
    assert_eq!(
        metrics.value(
            "pgvs3_request_duration_seconds_count",
            &[
                ("operation", "enqueueJob"),
                ("protocol", "http"),
                ("status", "201")
            ]
        ),
        3.0
    );

    // Jobs by queue and state.
    assert_eq!(
        metrics.value("pgvs3_jobs", &[("queue", "m1"), ("state", "available")]),
        2.0,
        "{text}"
    );
    assert_eq!(
        metrics.value("pgvs3_jobs", &[("queue", "m1"), ("state", "active")]),
        1.0
    );

    // Streams: size and consumer lag (received, not acked: the cursor has not moved).
    assert_eq!(
        metrics.value("pgvs3_stream_events", &[("queue", "s1")]),
        5.0,
        "{text}"
    );
    let lag: Vec<&Sample> = metrics
        .samples
        .iter()
        .filter(|s| {
            s.name.starts_with("pgvs3_stream_consumer_lag_")
                && s.labels.get("queue").map(String::as_str) == Some("s1")
                && s.labels.get("consumer").map(String::as_str) == Some("c1")
        })
        .collect();
    assert!(!lag.is_empty(), "a consumer lag series for s1/c1: {text}");
    assert_eq!(
        metrics.value(
            "pgvs3_stream_consumer_lag_events",
            &[("queue", "s1"), ("consumer", "c1")]
        ),
        5.0,
        "c1 has not acked: five events behind"
    );
    assert!(
        metrics.value(
            "pgvs3_stream_consumer_lag_ticks",
            &[("queue", "s1"), ("consumer", "c1")]
        ) >= 1.0,
        "c1 has not acked: at least one tick behind"
    );
    assert!(
        !metrics
            .find("pgvs3_stream_dead_letters", &[("queue", "s1")])
            .is_empty()
    );

    // Database pool.
    let idle = metrics.value("pgvs3_db_pool_connections", &[("state", "idle")]);
    let in_use = metrics.value("pgvs3_db_pool_connections", &[("state", "in_use")]);
    assert!(idle >= 0.0 && in_use >= 0.0, "idle {idle}, in_use {in_use}");
    assert!(idle + in_use >= 1.0, "the pool has a connection");
    assert!(idle + in_use <= 8.0, "no more than the pool size (8)");
    assert_eq!(metrics.value("pgvs3_up", &[]), 1.0);
    for name in [
        "pgvs3_lease_expiries_total",
        "pgvs3_maintenance_passes_total",
        "pgvs3_stream_rotations_total",
    ] {
        assert_eq!(metrics.find(name, &[]).len(), 1, "{name}: {text}");
    }

    // Naming conventions.
    let name_ok = |name: &str| {
        name.strip_prefix("pgvs3_").is_some_and(|rest| {
            !rest.is_empty()
                && rest
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
        })
    };
    for s in &metrics.samples {
        assert!(name_ok(&s.name), "sample name {:?}", s.name);
        for label in s.labels.keys() {
            assert!(
                !label.starts_with("__")
                    && label
                        .chars()
                        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_'),
                "label name {label:?} on {}",
                s.name
            );
        }
    }
    for (family, kind) in &metrics.types {
        assert!(name_ok(family), "family name {family:?}");
        assert!(metrics.help.contains_key(family), "HELP for {family}");
        // OpenMetrics names a counter family without `_total`; its samples carry it.
        assert!(
            !family.ends_with("_total"),
            "{kind} family {family} must not end in _total"
        );
        if family.contains("duration") || family.contains("latency") || family.contains("_time") {
            assert!(family.ends_with("_seconds"), "{family} is in seconds");
        }
        for unit in ["seconds", "bytes"] {
            if family.ends_with(&format!("_{unit}")) {
                assert_eq!(
                    metrics.units.get(family).map(String::as_str),
                    Some(unit),
                    "{family} declares its unit"
                );
            }
        }
        for reserved in ["_bucket", "_count", "_sum", "_created"] {
            assert!(!family.ends_with(reserved), "{family} ends in {reserved}");
        }
    }
    for s in &metrics.samples {
        let family = family_of(&s.name, &metrics.types).expect("checked by parse_exposition");
        if metrics.types[family] == "counter" {
            assert!(s.name.ends_with("_total"), "counter sample {}", s.name);
            assert!(s.value >= 0.0, "counter {} is negative", s.name);
        }
    }
    for family in ["pgvs3_request_duration_seconds", "pgvs3_job_wait_seconds"] {
        assert_eq!(
            metrics.types.get(family).map(String::as_str),
            Some("histogram"),
            "{family}"
        );
    }
}

/// Job wait (due → fetched) and run (fetched → acked) time histograms by queue: exact counts,
/// sums at least the delays waited, nothing below the delay in the bucket under it; jobs not
/// acked add no run time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn job_wait_and_run_times_are_histograms_by_queue() {
    const WAIT: Duration = Duration::from_millis(300);
    const RUN: Duration = Duration::from_millis(400);
    let app = common::spawn_app().await;
    let api = Api::new(&app);
    for n in 0..2 {
        api.enqueue(
            json!({"type": "metrics.timed", "args": [n], "options": {"queue": "timed"}}),
            &[],
        )
        .await;
    }
    api.enqueue(
        json!({"type": "metrics.timed", "args": [], "options": {"queue": "held"}}),
        &[],
    )
    .await;
    tokio::time::sleep(WAIT).await;
    let jobs = api.fetch("timed", 2).await;
    assert_eq!(jobs.len(), 2, "{jobs:?}");
    assert_eq!(api.fetch("held", 1).await.len(), 1);
    tokio::time::sleep(RUN).await;
    // One single ack, one batch ack: both paths count.
    api.post("/ojs/v1/workers/ack", json!({"job_id": jobs[0]["id"]}), &[])
        .await;
    let batch = api
        .post(
            "/ojs/v1/workers/ack/batch",
            json!({"acks": [{"job_id": jobs[1]["id"]}]}),
            &[],
        )
        .await;
    assert_eq!(batch["acknowledged"], 1, "{batch}");

    let text = api.scrape().await;
    let metrics = parse_exposition(&text).unwrap_or_else(|e| panic!("{e}\n---\n{text}"));
    for (family, queue, count, at_least) in [
        ("pgvs3_job_wait_seconds", "timed", 2.0, WAIT),
        ("pgvs3_job_wait_seconds", "held", 1.0, WAIT),
        ("pgvs3_job_run_seconds", "timed", 2.0, RUN),
    ] {
        let labels = [("queue", queue)];
        assert_eq!(
            metrics.value(&format!("{family}_count"), &labels),
            count,
            "{family} {queue}: {text}"
        );
        let sum = metrics.value(&format!("{family}_sum"), &labels);
        let least = count * at_least.as_secs_f64();
        assert!(
            sum >= least && sum < least + count * 10.0,
            "{family} {queue}: sum {sum}, each at least {at_least:?}"
        );
        assert_eq!(
            metrics.value(
                &format!("{family}_bucket"),
                &[("queue", queue), ("le", "+Inf")]
            ),
            count
        );
        assert_eq!(
            metrics.value(
                &format!("{family}_bucket"),
                &[("queue", queue), ("le", "0.25")]
            ),
            0.0,
            "{family} {queue}: none under the delay"
        );
        assert_eq!(
            metrics.units.get(family).map(String::as_str),
            Some("seconds")
        );
    }
    assert!(
        metrics
            .find("pgvs3_job_run_seconds_count", &[("queue", "held")])
            .is_empty(),
        "a job not acked has no run time: {text}"
    );
    app.stop().await;
}

// ---------------------------------------------------------------------------------------------
// Trace context

/// A job enqueued over HTTP with `traceparent`/`tracestate` carries them in its meta when fetched,
/// unless the caller put its own `meta.traceparent` there.
/// The per-queue figures are read a page of queues per statement (so no transaction locks every
/// queue's tables); a scrape still covers every queue, across page boundaries, once each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_cover_every_queue_across_pages() {
    let app = common::spawn_app().await;
    let api = Api::new(&app);
    // More queues than two pages of 25; queue pq-NN holds NN mod 3 + 1 available jobs.
    const QUEUES: usize = 53;
    for n in 0..QUEUES {
        for _ in 0..n % 3 + 1 {
            api.enqueue(
                json!({"type": "metrics.page", "args": [n], "options": {"queue": format!("pq-{n:02}")}}),
                &[],
            )
            .await;
        }
    }
    let text = api.scrape().await;
    let metrics = parse_exposition(&text).unwrap_or_else(|e| panic!("{e}\n---\n{text}"));
    for n in 0..QUEUES {
        let queue = format!("pq-{n:02}");
        assert_eq!(
            metrics.value("pgvs3_jobs", &[("queue", &queue), ("state", "available")]),
            (n % 3 + 1) as f64,
            "{queue}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_trace_context_rides_with_the_job() {
    let app = common::spawn_app().await;
    let api = Api::new(&app);
    let (parent, _, _) = traceparent();

    let meta = api
        .meta_roundtrip(
            "t1",
            json!({"type": "traced.job", "args": [], "options": {"queue": "t1"}}),
            &[("traceparent", &parent), ("tracestate", "k=v")],
        )
        .await;
    assert_eq!(meta["traceparent"], parent.as_str(), "meta: {meta}");
    assert_eq!(meta["tracestate"], "k=v", "meta: {meta}");

    // Also on GET of the job.
    let id = api
        .enqueue(
            json!({"type": "traced.job", "args": [], "options": {"queue": "t1g"}}),
            &[("traceparent", &parent)],
        )
        .await;
    let (status, answer) = api
        .send(
            reqwest::Method::GET,
            &format!("/ojs/v1/jobs/{id}"),
            None,
            &[],
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(answer["job"]["meta"]["traceparent"], parent.as_str());
    assert!(
        answer["job"]["meta"].get("tracestate").is_none(),
        "no tracestate sent, none stored: {answer}"
    );

    // The caller's own meta wins; other meta is kept.
    let (own, _, _) = traceparent();
    let meta = api
        .meta_roundtrip(
            "t2",
            json!({"type": "traced.job", "args": [], "options": {"queue": "t2"},
                   "meta": {"traceparent": own, "tracestate": "mine=1", "tenant": "a"}}),
            &[("traceparent", &parent), ("tracestate", "k=v")],
        )
        .await;
    assert_eq!(meta["traceparent"], own.as_str(), "not overwritten: {meta}");
    assert_eq!(meta["tracestate"], "mine=1", "not overwritten: {meta}");
    assert_eq!(meta["tenant"], "a");

    // Caller meta without trace context gets the header's added next to it.
    let meta = api
        .meta_roundtrip(
            "t3",
            json!({"type": "traced.job", "args": [], "options": {"queue": "t3"},
                   "meta": {"tenant": "b"}}),
            &[("traceparent", &parent)],
        )
        .await;
    assert_eq!(meta["traceparent"], parent.as_str(), "meta: {meta}");
    assert_eq!(meta["tenant"], "b");

    // A batch carries it on every job.
    let answer = api
        .post(
            "/ojs/v1/jobs/batch",
            json!({"jobs": [
                {"type": "traced.job", "args": [1], "options": {"queue": "t4"}},
                {"type": "traced.job", "args": [2], "options": {"queue": "t4"}}
            ]}),
            &[("traceparent", &parent)],
        )
        .await;
    assert_eq!(answer["jobs"].as_array().map(Vec::len), Some(2), "{answer}");
    let jobs = api.fetch("t4", 10).await;
    assert_eq!(jobs.len(), 2);
    for job in &jobs {
        assert_eq!(
            job["meta"]["traceparent"],
            parent.as_str(),
            "batch job: {job}"
        );
    }

    // No trace context sent: none stored.
    let meta = api
        .meta_roundtrip(
            "t5",
            json!({"type": "plain.job", "args": [], "options": {"queue": "t5"}}),
            &[],
        )
        .await;
    assert!(
        meta.get("traceparent").is_none(),
        "no traceparent invented: {meta}"
    );
}

/// The same over gRPC: `traceparent`/`tracestate` metadata on Enqueue shows in the fetched Job's
/// meta Struct; caller meta is not overwritten.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_trace_context_rides_with_the_job() {
    let app = common::spawn_app().await;
    let mut grpc = app.grpc().await;
    let (parent, _, _) = traceparent();

    let enqueue = |queue: &str, meta: Option<prost_types::Struct>| pb::EnqueueRequest {
        r#type: "traced.job".into(),
        options: Some(pb::EnqueueOptions {
            queue: queue.into(),
            ..Default::default()
        }),
        meta,
        ..Default::default()
    };
    let fetch = |queue: &str| pb::FetchRequest {
        queues: vec![queue.into()],
        count: 10,
        visibility_timeout_ms: 30_000,
        ..Default::default()
    };

    let enqueued = grpc
        .enqueue(with_trace(enqueue("g1", None), &parent, Some("k=v")))
        .await
        .expect("enqueue")
        .into_inner()
        .job
        .expect("a job");
    let jobs = grpc
        .fetch(fetch("g1"))
        .await
        .expect("fetch")
        .into_inner()
        .jobs;
    assert_eq!(jobs.len(), 1);
    assert_eq!(jobs[0].id, enqueued.id);
    let meta = jobs[0].meta.clone().unwrap_or_default().fields;
    assert_eq!(
        meta.get("traceparent").and_then(pb_string),
        Some(parent.as_str()),
        "meta: {meta:?}"
    );
    assert_eq!(
        meta.get("tracestate").and_then(pb_string),
        Some("k=v"),
        "meta: {meta:?}"
    );

    // Caller meta wins.
    let (own, _, _) = traceparent();
    let mine = prost_types::Struct {
        fields: [(
            "traceparent".to_string(),
            prost_types::Value {
                kind: Some(Kind::StringValue(own.clone())),
            },
        )]
        .into(),
    };
    grpc.enqueue(with_trace(enqueue("g2", Some(mine)), &parent, None))
        .await
        .expect("enqueue");
    let jobs = grpc
        .fetch(fetch("g2"))
        .await
        .expect("fetch")
        .into_inner()
        .jobs;
    assert_eq!(jobs.len(), 1);
    let meta = jobs[0].meta.clone().unwrap_or_default().fields;
    assert_eq!(
        meta.get("traceparent").and_then(pb_string),
        Some(own.as_str()),
        "not overwritten: {meta:?}"
    );

    // The HTTP view of a gRPC-enqueued job agrees.
    let api = Api::new(&app);
    let (status, answer) = api
        .send(
            reqwest::Method::GET,
            &format!("/ojs/v1/jobs/{}", enqueued.id),
            None,
            &[],
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(answer["job"]["meta"]["traceparent"], parent.as_str());
}

/// A stream message appended over gRPC with `traceparent` / `tracestate` metadata is received
/// with them in its headers, as over HTTP; a caller's own `traceparent` header wins.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_stream_messages_carry_trace_context() {
    use pgvs3::grpc::proto::pgvs3::v1 as spb;
    let app = common::spawn_app().await;
    let api = Api::new(&app);
    let (parent, _, _) = traceparent();
    let (own, _, _) = traceparent();
    api.post(
        "/ojs/v1/queues/gst/consumers",
        json!({"consumer": "reader", "from_tick": 0}),
        &[],
    )
    .await;
    let message = |n: f64, headers: &[(&str, &str)]| spb::Message {
        id: String::new(),
        r#type: "traced.msg".into(),
        payload: Some(prost_types::Value {
            kind: Some(Kind::NumberValue(n)),
        }),
        headers: headers
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    };
    let mut streams = common::grpc::streams(&app.grpc_url).await;
    streams
        .append(with_trace(
            spb::AppendRequest {
                queue: "gst".into(),
                messages: vec![
                    message(1.0, &[("h", "x")]),
                    message(2.0, &[("traceparent", &own)]),
                ],
            },
            &parent,
            Some("k=v"),
        ))
        .await
        .expect("append over gRPC");

    let mut events = Vec::new();
    for _ in 0..20 {
        let batch = api
            .post(
                "/ojs/v1/queues/gst/receive",
                json!({"consumer": "reader", "max": 100}),
                &[],
            )
            .await;
        events.extend(batch["events"].as_array().cloned().unwrap_or_default());
        if events.len() >= 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(events.len(), 2, "{events:?}");
    assert_eq!(
        events[0]["headers"]["traceparent"],
        parent.as_str(),
        "{}",
        events[0]
    );
    assert_eq!(events[0]["headers"]["tracestate"], "k=v", "{}", events[0]);
    assert_eq!(events[0]["headers"]["h"], "x", "caller headers kept");
    assert_eq!(
        events[1]["headers"]["traceparent"],
        own.as_str(),
        "the caller's own wins"
    );
}

/// A stream message appended with `traceparent` is received with `headers.traceparent`; caller
/// headers are kept and win.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stream_messages_carry_trace_context() {
    let app = common::spawn_app().await;
    let api = Api::new(&app);
    let (parent, _, _) = traceparent();
    let (own, _, _) = traceparent();

    api.post(
        "/ojs/v1/queues/st/consumers",
        json!({"consumer": "reader", "from_tick": 0}),
        &[],
    )
    .await;
    api.post(
        "/ojs/v1/queues/st/messages",
        json!({"type": "traced.msg", "payload": {"n": 1}, "headers": {"h": "x"}}),
        &[("traceparent", &parent), ("tracestate", "k=v")],
    )
    .await;
    api.post(
        "/ojs/v1/queues/st/messages",
        json!({"type": "traced.msg", "payload": {"n": 2}, "headers": {"traceparent": own}}),
        &[("traceparent", &parent)],
    )
    .await;
    api.post(
        "/ojs/v1/queues/st/messages/batch",
        json!({"messages": [{"type": "traced.msg", "payload": {"n": 3}}]}),
        &[("traceparent", &parent)],
    )
    .await;
    api.post(
        "/ojs/v1/queues/st/messages",
        json!({"type": "plain.msg", "payload": {"n": 4}}),
        &[],
    )
    .await;

    let mut events = Vec::new();
    for _ in 0..20 {
        let batch = api
            .post(
                "/ojs/v1/queues/st/receive",
                json!({"consumer": "reader", "max": 100}),
                &[],
            )
            .await;
        let Some(batch_id) = batch["batch_id"].as_str() else {
            break;
        };
        events.extend(batch["events"].as_array().cloned().unwrap_or_default());
        api.post(
            "/ojs/v1/streams/ack",
            json!({"queue": "st", "batch_id": batch_id}),
            &[],
        )
        .await;
    }
    let by_n: HashMap<i64, &Value> = events
        .iter()
        .map(|e| (e["payload"]["n"].as_i64().expect("n"), e))
        .collect();
    assert_eq!(by_n.len(), 4, "four messages received: {events:?}");
    assert_eq!(
        by_n[&1]["headers"]["traceparent"],
        parent.as_str(),
        "{}",
        by_n[&1]
    );
    assert_eq!(by_n[&1]["headers"]["tracestate"], "k=v", "{}", by_n[&1]);
    assert_eq!(by_n[&1]["headers"]["h"], "x", "caller headers kept");
    assert_eq!(
        by_n[&2]["headers"]["traceparent"],
        own.as_str(),
        "caller header wins: {}",
        by_n[&2]
    );
    assert_eq!(
        by_n[&3]["headers"]["traceparent"],
        parent.as_str(),
        "batch: {}",
        by_n[&3]
    );
    assert!(
        by_n[&4]["headers"].get("traceparent").is_none(),
        "no traceparent invented: {}",
        by_n[&4]
    );
}

/// A `traceparent` whose fields have the wrong lengths is not W3C trace context: nothing is
/// stored with the job or message (and the request still succeeds).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_traceparent_is_not_stored() {
    let app = common::spawn_app().await;
    let api = Api::new(&app);
    let trace_id = uuid::Uuid::new_v4().simple().to_string();
    let span_id = &uuid::Uuid::new_v4().simple().to_string()[..16];
    let cases = [
        format!("00-{}-{span_id}-01", &trace_id[..31]),
        format!("00-{trace_id}0-{span_id}-01"),
        format!("00-{trace_id}-{}-01", &span_id[..15]),
        format!("00-{trace_id}-{span_id}0-01"),
        format!("000-{trace_id}-{span_id}-01"),
        format!("0-{trace_id}-{span_id}-01"),
        format!("00-{trace_id}-{span_id}-1"),
        format!("00-{trace_id}-{span_id}-011"),
        format!("00-{trace_id}-{span_id}"),
        format!("00-{trace_id}{span_id}-01"),
        "garbage".to_string(),
    ];
    let mut stored = Vec::new();
    for (n, bad) in cases.iter().enumerate() {
        let queue = format!("bad{n}");
        let meta = api
            .meta_roundtrip(
                &queue,
                json!({"type": "traced.job", "args": [], "options": {"queue": queue}}),
                &[("traceparent", bad), ("tracestate", "k=v")],
            )
            .await;
        if meta.get("traceparent").is_some() || meta.get("tracestate").is_some() {
            stored.push(format!("job meta {meta} for {bad:?}"));
        }
    }
    // A stream message with a malformed traceparent.
    api.post(
        "/ojs/v1/queues/badst/consumers",
        json!({"consumer": "reader", "from_tick": 0}),
        &[],
    )
    .await;
    api.post(
        "/ojs/v1/queues/badst/messages",
        json!({"type": "traced.msg", "payload": {}}),
        &[("traceparent", &cases[0])],
    )
    .await;
    let batch = api
        .post(
            "/ojs/v1/queues/badst/receive",
            json!({"consumer": "reader", "max": 10}),
            &[],
        )
        .await;
    let event = &batch["events"][0];
    assert_eq!(event["type"], "traced.msg", "{batch}");
    if event["headers"].get("traceparent").is_some() {
        stored.push(format!(
            "message headers {} for {:?}",
            event["headers"], cases[0]
        ));
    }
    assert!(
        stored.is_empty(),
        "malformed traceparents were stored:\n{}",
        stored.join("\n")
    );
}

/// Well-formed lengths but not valid W3C trace context (version ff, all-zero ids, upper-case
/// hex): not stored either, as the W3C rules (and OpenTelemetry's propagator, which already
/// refuses to parent the request span on them) say such a header is to be ignored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_w3c_traceparent_is_not_stored() {
    let app = common::spawn_app().await;
    let api = Api::new(&app);
    let trace_id = uuid::Uuid::new_v4().simple().to_string();
    let span_id = &uuid::Uuid::new_v4().simple().to_string()[..16];
    let cases = [
        format!("ff-{trace_id}-{span_id}-01"),
        format!("00-{}-{span_id}-01", "0".repeat(32)),
        format!("00-{trace_id}-{}-01", "0".repeat(16)),
        format!("00-{}-{span_id}-01", trace_id.to_uppercase()),
    ];
    let mut stored = Vec::new();
    for (n, bad) in cases.iter().enumerate() {
        let queue = format!("inv{n}");
        let meta = api
            .meta_roundtrip(
                &queue,
                json!({"type": "traced.job", "args": [], "options": {"queue": queue}}),
                &[("traceparent", bad)],
            )
            .await;
        if meta.get("traceparent").is_some() {
            stored.push(format!("{bad:?} stored as {}", meta["traceparent"]));
        }
    }
    assert!(
        stored.is_empty(),
        "invalid W3C traceparents were stored:\n{}",
        stored.join("\n")
    );
}
