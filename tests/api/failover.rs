//! Losing the primary's machine: pg_auto_failover (a monitor and two data nodes, `common::ha`)
//! under two gateways given both hosts. Producers enqueue jobs and append stream events through
//! both gateways, workers fetch and ack, two stream consumers receive and ack; mid-run the
//! primary's node is killed with SIGKILL (keeper, PostgreSQL and backends: nothing restarts it).
//! The HA manager promotes the standby; the gateways must follow it without a restart, and with
//! synchronous replication nothing a client was answered 2xx for may be lost: every enqueued job
//! exists, every acked job stays completed and completes once, every appended event reaches
//! every consumer, and no event of an acked batch comes again. The longest time with no
//! successful request (the outage clients saw) is printed. Then the last node dies too: with no
//! primary anywhere, mutations answer 503 with Retry-After (gRPC UNAVAILABLE), never 500, and
//! health says so.
//!
//! The asynchronous run (`--ignored`) measures what that mode loses instead of asserting it.
//! Without pg_auto_failover installed both skip with a message, unless `PGVS3_REQUIRE_HA=1`
//! (set by .ci/run, which installs it) makes that a failure.

use crate::common;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::ha::{self, HaCluster, Replication};
use pgvs3::grpc::proto::ojs::v1 as pb;
use pgvs3::server::{self, RunningServer, ServerSettings};
use reqwest::StatusCode;
use serde_json::{Value, json};
use tokio::time::Instant;

const JOBS: &str = "ha.jobs";
const EVENTS: &str = "ha.events";
const CONSUMERS: [&str; 2] = ["c1", "c2"];

/// What the clients saw, shared by every task.
#[derive(Default)]
struct Seen {
    /// Ids of jobs whose enqueue answered 2xx.
    enqueued: Mutex<Vec<String>>,
    /// Jobs whose ack answered 2xx, with how many times.
    acked: Mutex<HashMap<String, u32>>,
    /// Fetches that handed out a job already acked with 2xx.
    fetched_after_ack: AtomicU64,
    /// The ids of those jobs.
    refetched: Mutex<Vec<String>>,
    /// Ids of events whose append answered 2xx.
    appended: Mutex<Vec<String>>,
    /// Per consumer: events received, and events of batches whose ack answered 2xx.
    received: Mutex<HashMap<&'static str, HashSet<String>>>,
    acked_events: Mutex<HashMap<&'static str, HashSet<String>>>,
    /// Events received again after their batch's ack answered 2xx.
    again_after_ack: AtomicU64,
    /// When requests succeeded (any client).
    successes: Mutex<Vec<Instant>>,
    /// Successful enqueues per gateway after the kill.
    enqueues_after_kill: [AtomicU64; 2],
    /// Failed answers by status (0: no answer).
    failures: Mutex<BTreeMap<u16, u64>>,
    /// Answers 500 and above other than 503, with their bodies.
    server_errors: Mutex<Vec<String>>,
    killed_at: Mutex<Option<Instant>>,
    /// Health answers 503 seen while no primary was reachable.
    health_unavailable: AtomicU64,
    /// Per job, what the workers saw of it (fetches and ack answers), for a failure's message.
    history: Mutex<HashMap<String, Vec<String>>>,
    started: Mutex<Option<Instant>>,
}

impl Seen {
    fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
        mutex.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn killed(&self) -> bool {
        Seen::lock(&self.killed_at).is_some()
    }

    /// Notes what a worker saw of a job, with the time since the run began.
    fn note(&self, id: &str, what: String) {
        let at = Seen::lock(&self.started)
            .map(|s| s.elapsed().as_secs_f64())
            .unwrap_or_default();
        Seen::lock(&self.history)
            .entry(id.to_string())
            .or_default()
            .push(format!("{at:.3}s {what}"));
    }
}

/// One request; a 2xx answer's body, else `None` (failures counted, 5xx but 503 kept).
async fn call(
    seen: &Seen,
    client: &reqwest::Client,
    base: &str,
    path: &str,
    body: Value,
) -> Option<Value> {
    let answer = client
        .post(format!("{base}{path}"))
        .header("content-type", "application/json")
        .body(body.to_string())
        .send()
        .await;
    let response = match answer {
        Ok(response) => response,
        Err(_) => {
            *Seen::lock(&seen.failures).entry(0).or_default() += 1;
            return None;
        }
    };
    let status = response.status();
    let retry_after = response.headers().contains_key("retry-after");
    let text = response.text().await.unwrap_or_default();
    if status.is_success() {
        Seen::lock(&seen.successes).push(Instant::now());
        return serde_json::from_str(&text).ok();
    }
    *Seen::lock(&seen.failures)
        .entry(status.as_u16())
        .or_default() += 1;
    let unexpected =
        status.is_server_error() && (status != StatusCode::SERVICE_UNAVAILABLE || !retry_after);
    if unexpected {
        Seen::lock(&seen.server_errors).push(format!("{path}: {status} {text}"));
    }
    None
}

fn pause() -> tokio::time::Sleep {
    tokio::time::sleep(Duration::from_millis(5))
}

/// Reads the health of one gateway every 100 ms, counting 503 answers.
async fn watch_health(seen: Arc<Seen>, stop: Arc<AtomicBool>, base: String) {
    let client = client();
    while !stop.load(Ordering::Relaxed) {
        if let Ok(response) = client.get(format!("{base}/ojs/v1/health")).send().await
            && response.status() == StatusCode::SERVICE_UNAVAILABLE
        {
            seen.health_unavailable.fetch_add(1, Ordering::Relaxed);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Enqueues a job and appends an event, again and again, through one gateway.
async fn produce(seen: Arc<Seen>, stop: Arc<AtomicBool>, base: String, gateway: usize) {
    let client = client();
    let mut n = 0u64;
    while !stop.load(Ordering::Relaxed) {
        n += 1;
        let job = json!({"type": "ha.job", "args": [gateway, n], "options": {"queue": JOBS}});
        if let Some(answer) = call(&seen, &client, &base, "/ojs/v1/jobs", job).await
            && let Some(id) = answer["job"]["id"].as_str()
        {
            Seen::lock(&seen.enqueued).push(id.to_string());
            if seen.killed() {
                seen.enqueues_after_kill[gateway].fetch_add(1, Ordering::Relaxed);
            }
        }
        let event = json!({"type": "ha.event", "payload": {"gateway": gateway, "n": n}});
        let path = format!("/ojs/v1/queues/{EVENTS}/messages");
        if let Some(answer) = call(&seen, &client, &base, &path, event).await
            && let Some(id) = answer["id"].as_str()
        {
            Seen::lock(&seen.appended).push(id.to_string());
        }
        pause().await;
    }
}

/// Fetches and acks jobs through one gateway.
async fn work(seen: Arc<Seen>, stop: Arc<AtomicBool>, base: String, worker: String) {
    let client = client();
    while !stop.load(Ordering::Relaxed) {
        let fetch = json!({"queues": [JOBS], "count": 10, "wait_ms": 500,
                           "worker_id": worker, "visibility_timeout_ms": 5000});
        let Some(answer) = call(&seen, &client, &base, "/ojs/v1/workers/fetch", fetch).await else {
            pause().await;
            continue;
        };
        for job in answer["jobs"].as_array().into_iter().flatten() {
            let id = job["id"].as_str().unwrap_or_default().to_string();
            seen.note(
                &id,
                format!("{worker} fetched, lease {}", job["lease_token"]),
            );
            if Seen::lock(&seen.acked).contains_key(&id) {
                seen.fetched_after_ack.fetch_add(1, Ordering::Relaxed);
                Seen::lock(&seen.refetched).push(id.clone());
            }
            let ack = json!({"job_id": id, "lease_token": job["lease_token"],
                             "result": {"ok": true}});
            let acked = call(&seen, &client, &base, "/ojs/v1/workers/ack", ack)
                .await
                .is_some();
            seen.note(&id, format!("{worker} ack answered 2xx: {acked}"));
            if acked {
                *Seen::lock(&seen.acked).entry(id).or_default() += 1;
            }
        }
    }
}

/// Receives and acks the stream as one consumer through one gateway.
async fn consume(seen: Arc<Seen>, stop: Arc<AtomicBool>, base: String, consumer: &'static str) {
    let client = client();
    let receive_path = format!("/ojs/v1/queues/{EVENTS}/receive");
    while !stop.load(Ordering::Relaxed) {
        let receive = json!({"consumer": consumer, "max": 100, "wait_ms": 500});
        let Some(batch) = call(&seen, &client, &base, &receive_path, receive).await else {
            pause().await;
            continue;
        };
        let Some(batch_id) = batch["batch_id"].as_str() else {
            continue;
        };
        let ids: Vec<String> = batch["events"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|e| e["id"].as_str().map(str::to_string))
            .collect();
        {
            let acked = Seen::lock(&seen.acked_events);
            let again = ids
                .iter()
                .filter(|id| acked.get(consumer).is_some_and(|set| set.contains(*id)))
                .count();
            seen.again_after_ack
                .fetch_add(again as u64, Ordering::Relaxed);
        }
        Seen::lock(&seen.received)
            .entry(consumer)
            .or_default()
            .extend(ids.iter().cloned());
        let ack = json!({"queue": EVENTS, "batch_id": batch_id});
        if call(&seen, &client, &base, "/ojs/v1/streams/ack", ack)
            .await
            .is_some()
        {
            Seen::lock(&seen.acked_events)
                .entry(consumer)
                .or_default()
                .extend(ids);
        }
    }
}

fn client() -> reqwest::Client {
    // Longer than the pool's 10 s wait for a connection: an answer always comes back.
    reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .expect("http client")
}

async fn gateway(url: &str) -> RunningServer {
    let mut settings = ServerSettings::for_database(url);
    settings.db_pool_size = 8;
    server::start(settings).await.expect("start a gateway")
}

/// Polls `check` every 100 ms until it holds or `within` passes; whether it held.
async fn within(within: Duration, mut check: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        if check() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    check()
}

/// What a run measured.
#[derive(Debug)]
struct Figures {
    enqueued: usize,
    enqueued_lost: usize,
    acked: usize,
    acks_lost: usize,
    double_completions: usize,
    appended: usize,
    appends_lost: usize,
    again_after_ack: u64,
    outage: Duration,
    health_unavailable: u64,
    /// Whether every job was completed and every event received before the drain's bound.
    drained: bool,
    failures: BTreeMap<u16, u64>,
    server_errors: Vec<String>,
}

/// Prints what is known of jobs completed twice: what the workers saw, the job now, its events,
/// and the HA manager's state changes.
async fn explain_doubles(
    seen: &Seen,
    reader: &common::http::Http,
    cluster: &HaCluster,
    doubled: &[String],
) {
    let killed_at = Seen::lock(&seen.killed_at).unwrap_or_else(Instant::now);
    let started = Seen::lock(&seen.started).unwrap_or_else(Instant::now);
    eprintln!(
        "failover: DOUBLE COMPLETIONS {doubled:?}; killed at {:.3}s",
        (killed_at - started).as_secs_f64()
    );
    let mut events = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let cursor = after
            .as_ref()
            .map(|a| format!("&after={a}"))
            .unwrap_or_default();
        let (_, page) = reader
            .get(&format!("/ojs/v1/events?queues={JOBS}&limit=1000{cursor}"))
            .await;
        let list: Vec<Value> = page["events"].as_array().cloned().unwrap_or_default();
        if list.is_empty() {
            break;
        }
        after = page["next_cursor"]
            .as_str()
            .or_else(|| list.last().and_then(|e| e["id"].as_str()))
            .map(str::to_string);
        events.extend(list);
        if after.is_none() || events.len() > 20_000 {
            break;
        }
    }
    for id in doubled {
        eprintln!("--- job {id}");
        for line in Seen::lock(&seen.history).get(id).into_iter().flatten() {
            eprintln!("  seen: {line}");
        }
        let (_, job) = reader.get(&format!("/ojs/v1/jobs/{id}")).await;
        eprintln!("  now: {job}");
        for event in events
            .iter()
            .filter(|e| e.to_string().contains(id.as_str()))
        {
            eprintln!("  event: {event}");
        }
    }
    eprintln!("--- monitor events\n{}", cluster.monitor_events().await);
}

/// The whole scenario on a fresh HA setup; `None` where pg_auto_failover is not installed.
async fn run(replication: Replication) -> Option<(Figures, HaCluster, [RunningServer; 2])> {
    if let Some(why) = ha::missing() {
        // .ci/run installs the packages and sets PGVS3_REQUIRE_HA=1: there a skip is a failure.
        let required = std::env::var("PGVS3_REQUIRE_HA").is_ok_and(|v| v == "1");
        assert!(!required, "PGVS3_REQUIRE_HA=1 but {why}");
        eprintln!("SKIPPED: the failover test needs pg_auto_failover: {why}");
        return None;
    }
    let started = Instant::now();
    let mut cluster = HaCluster::start(replication).await;
    eprintln!(
        "failover: HA setup ({replication:?}) ready in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    let url = cluster.url();
    let gateways = [gateway(&url).await, gateway(&url).await];
    // A read-only gateway given the same hosts: it prefers the standby, and keeps serving reads
    // through the failover.
    let mut settings = ServerSettings::for_database(&url);
    settings.db_pool_size = 4;
    settings.service.read_only = true;
    let reader_gateway = server::start(settings)
        .await
        .expect("start a read-only gateway");
    let reader_base = format!("http://{}", reader_gateway.addr);
    let bases: Vec<String> = gateways
        .iter()
        .map(|g| format!("http://{}", g.addr))
        .collect();
    let seen = Arc::new(Seen::default());
    *Seen::lock(&seen.started) = Some(Instant::now());
    let client = client();
    for (consumer, base) in CONSUMERS.iter().zip(&bases) {
        let path = format!("/ojs/v1/queues/{EVENTS}/consumers");
        let answer = call(&seen, &client, base, &path, json!({"consumer": consumer})).await;
        assert!(answer.is_some(), "subscribe {consumer}");
    }

    let producing = Arc::new(AtomicBool::new(false));
    let draining = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for (index, base) in bases.iter().enumerate() {
        let (seen, base) = (seen.clone(), base.clone());
        tasks.push(tokio::spawn(produce(seen, producing.clone(), base, index)));
    }
    tasks.push(tokio::spawn(watch_health(
        seen.clone(),
        producing.clone(),
        bases[0].clone(),
    )));
    let mut consumers = Vec::new();
    for (index, base) in bases.iter().enumerate() {
        let worker = format!("w{index}");
        let (s, b, d) = (seen.clone(), base.clone(), draining.clone());
        consumers.push(tokio::spawn(work(s, d, b, worker)));
        let (s, b, d) = (seen.clone(), base.clone(), draining.clone());
        consumers.push(tokio::spawn(consume(s, d, b, CONSUMERS[index])));
    }

    // Work flows everywhere before the kill.
    let flowing = within(Duration::from_secs(60), || {
        let received = Seen::lock(&seen.received);
        Seen::lock(&seen.acked).len() >= 50
            && CONSUMERS
                .iter()
                .all(|c| received.get(c).is_some_and(|s| s.len() >= 50))
    })
    .await;
    assert!(flowing, "work does not flow before the kill");
    let primary = cluster.writable().await.expect("a primary before the kill");
    // Asynchronously, what is lost is what the standby had not received: hold the primary's WAL
    // sender while 40 more enqueues are answered (a lag of that much work), then kill it.
    if replication == Replication::Asynchronous {
        let counts = || {
            (
                Seen::lock(&seen.enqueued).len(),
                Seen::lock(&seen.acked).len(),
                Seen::lock(&seen.appended).len(),
            )
        };
        let before = counts();
        let held_at = Instant::now();
        cluster.stop_replication(primary).await;
        within(Duration::from_secs(60), || counts().0 >= before.0 + 40).await;
        let after = counts();
        let window = (after.0 - before.0, after.1 - before.1, after.2 - before.2);
        eprintln!(
            "failover: standby held {:.2} s: {} enqueues, {} acks, {} appends answered 2xx meanwhile",
            held_at.elapsed().as_secs_f64(),
            window.0,
            window.1,
            window.2
        );
    }
    // Synchronously, the claim is about pgvs3: the kill must come while the primary waits for
    // its standby (pg_auto_failover turns that off while the standby looks unhealthy).
    if replication == Replication::Synchronous {
        let off = cluster.hold_synchronous(primary).await;
        eprintln!(
            "failover: the monitor took the standby out of synchronous replication {} times \
             before the kill; synchronous replication found off {off} times by the last check",
            cluster.standby_dropouts().await
        );
    }
    *Seen::lock(&seen.killed_at) = Some(Instant::now());
    let killed_at = Instant::now();
    cluster.kill(primary);
    let wall = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    let (secs, millis) = (wall.as_secs() % 86_400, wall.subsec_millis());
    eprintln!(
        "failover: killed node {} (SIGKILL) at {:02}:{:02}:{:02}.{millis:03} UTC",
        cluster.nodes[primary].name,
        secs / 3600,
        secs / 60 % 60,
        secs % 60
    );

    // Both gateways enqueue again (no restart), then a little more traffic.
    let back = within(Duration::from_secs(90), || {
        seen.enqueues_after_kill
            .iter()
            .all(|n| n.load(Ordering::Relaxed) >= 20)
    })
    .await;
    eprintln!(
        "failover: both gateways enqueue again {:.1} s after the kill",
        killed_at.elapsed().as_secs_f64()
    );
    assert!(
        back,
        "the gateways did not enqueue again after the kill: {:?}\n{}",
        Seen::lock(&seen.failures),
        cluster.logs()
    );
    producing.store(true, Ordering::Relaxed);
    for task in tasks {
        task.await.expect("producer");
    }

    // Drain: workers and consumers until everything answered 2xx was handled (a lossy run
    // never gets there: bounded).
    let enqueued: Vec<String> = Seen::lock(&seen.enqueued).clone();
    let appended: Vec<String> = Seen::lock(&seen.appended).clone();
    let drain_for = match replication {
        Replication::Synchronous => Duration::from_secs(60),
        Replication::Asynchronous => Duration::from_secs(20),
    };
    // A job whose ack committed but whose answer was lost is completed without a 2xx ack:
    // those are looked up, once few are left.
    let reader = common::http::Http::with_client(&bases[0], client.clone());
    let mut completed_unseen = HashSet::new();
    let drain_deadline = Instant::now() + drain_for;
    while Instant::now() < drain_deadline {
        let missing: Vec<String> = {
            let acked = Seen::lock(&seen.acked);
            enqueued
                .iter()
                .filter(|id| !acked.contains_key(*id) && !completed_unseen.contains(*id))
                .cloned()
                .collect()
        };
        if missing.len() <= 10 {
            for id in &missing {
                let (_, job) = reader.get(&format!("/ojs/v1/jobs/{id}")).await;
                if job["job"]["state"] == "completed" {
                    completed_unseen.insert(id.clone());
                }
            }
        }
        let all_acked = missing.iter().all(|id| completed_unseen.contains(id));
        let all_received = {
            let received = Seen::lock(&seen.received);
            CONSUMERS.iter().all(|c| {
                received
                    .get(c)
                    .is_some_and(|set| appended.iter().all(|id| set.contains(id)))
            })
        };
        if all_acked && all_received {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let drained = Instant::now() < drain_deadline;
    eprintln!(
        "failover: drained {:.1} s after the kill",
        killed_at.elapsed().as_secs_f64()
    );
    draining.store(true, Ordering::Relaxed);
    for task in consumers {
        task.await.expect("worker or consumer");
    }

    // The read-only gateway serves a job enqueued after the failover, and refuses writes.
    let last = enqueued.last().cloned().unwrap_or_default();
    let read_only = common::http::Http::with_client(&reader_base, client.clone());
    let served = {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let (status, _) = read_only.get(&format!("/ojs/v1/jobs/{last}")).await;
            if status == StatusCode::OK || Instant::now() >= deadline {
                break status;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    assert_eq!(served, StatusCode::OK, "the read-only gateway reads {last}");
    let (status, body) = read_only
        .post(
            "/ojs/v1/jobs",
            json!({"type": "ha.job", "args": [], "options": {"queue": JOBS}}),
        )
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    reader_gateway.shutdown().await;

    // Long polls are woken through the new primary's LISTEN: a fetch waiting on one gateway gets
    // a job enqueued through the other at once, not at the end of its 2 s wait.
    let fetch_url = format!("{}/ojs/v1/workers/fetch", bases[1]);
    let waiting = {
        let client = client.clone();
        tokio::spawn(async move {
            let answer = client
                .post(fetch_url)
                .header("content-type", "application/json")
                .body(json!({"queues": [JOBS], "wait_ms": 2000}).to_string())
                .send()
                .await
                .expect("a long poll");
            let body: Value = answer.json().await.expect("fetch answer");
            (Instant::now(), body)
        })
    };
    // Time for the fetch to start waiting (enqueued earlier, it would just find the job).
    tokio::time::sleep(Duration::from_millis(300)).await;
    let enqueued_at = Instant::now();
    // The jobs queue: it exists (a fetch from a queue that does not answers at once), and the
    // workers have stopped.
    let wake = json!({"type": "ha.wake", "args": [], "options": {"queue": JOBS}});
    assert!(
        call(&seen, &client, &bases[0], "/ojs/v1/jobs", wake)
            .await
            .is_some()
    );
    let (answered_at, body) = waiting.await.expect("the long poll");
    assert!(
        body["jobs"].as_array().is_some_and(|jobs| !jobs.is_empty()),
        "{body}"
    );
    let woken_after = answered_at - enqueued_at;
    assert!(
        woken_after < Duration::from_millis(1200),
        "the waiting fetch answered {woken_after:?} after the enqueue: not woken by NOTIFY"
    );

    // The outage: the longest time without a successful request, from the kill on.
    let mut times: Vec<Instant> = Seen::lock(&seen.successes)
        .iter()
        .copied()
        .filter(|t| *t >= killed_at)
        .collect();
    times.sort();
    let outage = std::iter::once(killed_at)
        .chain(times.iter().copied())
        .zip(times.iter().copied())
        .map(|(a, b)| b - a)
        .max()
        .unwrap_or_default();

    // What the database holds now, read through a gateway.
    let mut enqueued_lost = 0;
    for id in &enqueued {
        let (status, _) = reader.get(&format!("/ojs/v1/jobs/{id}")).await;
        if status == StatusCode::NOT_FOUND {
            enqueued_lost += 1;
        } else {
            assert_eq!(status, StatusCode::OK, "read job {id}");
        }
    }
    let acked = Seen::lock(&seen.acked).clone();
    let mut acks_lost = 0;
    for id in acked.keys() {
        let (status, job) = reader.get(&format!("/ojs/v1/jobs/{id}")).await;
        if status != StatusCode::OK || job["job"]["state"] != "completed" {
            acks_lost += 1;
        }
    }
    let double_completions = acked.values().filter(|n| **n > 1).count()
        + seen.fetched_after_ack.load(Ordering::Relaxed) as usize;
    if double_completions > 0 {
        let mut doubled: Vec<String> = acked
            .iter()
            .filter(|(_, n)| **n > 1)
            .map(|(id, _)| id.clone())
            .collect();
        doubled.extend(Seen::lock(&seen.refetched).iter().cloned());
        doubled.sort();
        doubled.dedup();
        explain_doubles(&seen, &reader, &cluster, &doubled).await;
    }
    // An event the consumers received from the old primary may be gone from the new one: a
    // consumer subscribed now from the oldest tick reads what the stream holds.
    let path = format!("/ojs/v1/queues/{EVENTS}/consumers");
    let audit = json!({"consumer": "audit", "from_tick": 0});
    assert!(
        call(&seen, &client, &bases[0], &path, audit)
            .await
            .is_some()
    );
    let mut stored = HashSet::new();
    let receive_path = format!("/ojs/v1/queues/{EVENTS}/receive");
    loop {
        let receive = json!({"consumer": "audit", "max": 500});
        let batch = call(&seen, &client, &bases[0], &receive_path, receive)
            .await
            .expect("the audit consumer receives");
        let Some(batch_id) = batch["batch_id"].as_str() else {
            break;
        };
        stored.extend(
            batch["events"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|e| e["id"].as_str().map(str::to_string)),
        );
        let ack = json!({"queue": EVENTS, "batch_id": batch_id});
        assert!(
            call(&seen, &client, &bases[0], "/ojs/v1/streams/ack", ack)
                .await
                .is_some()
        );
    }
    let received = Seen::lock(&seen.received).clone();
    let appends_lost = appended
        .iter()
        .filter(|id| {
            !stored.contains(*id)
                || CONSUMERS
                    .iter()
                    .any(|c| !received.get(c).is_some_and(|set| set.contains(*id)))
        })
        .count();
    let figures = Figures {
        enqueued: enqueued.len(),
        enqueued_lost,
        acked: acked.len(),
        acks_lost,
        double_completions,
        appended: appended.len(),
        appends_lost,
        again_after_ack: seen.again_after_ack.load(Ordering::Relaxed),
        outage,
        drained,
        health_unavailable: seen.health_unavailable.load(Ordering::Relaxed),
        failures: Seen::lock(&seen.failures).clone(),
        server_errors: Seen::lock(&seen.server_errors).clone(),
    };
    eprintln!(
        "failover ({replication:?}): outage seen by clients {:.2} s; {} enqueued ({} lost), \
         {} acked ({} lost), {} double completions, {} appended ({} lost: not stored, or not \
         received by every consumer), {} events again after an acked batch; health 503 {} times; failed answers \
         by status {:?}",
        figures.outage.as_secs_f64(),
        figures.enqueued,
        figures.enqueued_lost,
        figures.acked,
        figures.acks_lost,
        figures.double_completions,
        figures.appended,
        figures.appends_lost,
        figures.again_after_ack,
        figures.health_unavailable,
        figures.failures
    );
    Some((figures, cluster, gateways))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn gateways_follow_a_failover_and_lose_nothing_acknowledged() {
    let Some((figures, mut cluster, gateways)) = run(Replication::Synchronous).await else {
        return;
    };
    assert!(
        figures.server_errors.is_empty(),
        "{:?}",
        figures.server_errors
    );
    assert_eq!(figures.enqueued_lost, 0, "{figures:?}");
    assert_eq!(figures.acks_lost, 0, "{figures:?}");
    assert_eq!(figures.double_completions, 0, "{figures:?}");
    assert_eq!(figures.appends_lost, 0, "{figures:?}");
    assert_eq!(figures.again_after_ack, 0, "{figures:?}");
    // The gateways work on: every job done, every event received, no restart.
    assert!(figures.drained, "{figures:?}");
    // While no primary was writable, health said so.
    assert!(figures.health_unavailable > 0, "{figures:?}");

    // The last node dies too: no primary anywhere.
    let survivor = cluster.writable().await.expect("the promoted node");
    cluster.kill(survivor);
    let base = format!("http://{}", gateways[0].addr);
    let http = common::http::Http::with_client(&base, client());
    let deadline = Instant::now() + Duration::from_secs(30);
    let health = loop {
        let (status, health) = http.get("/ojs/v1/health").await;
        // The first answers may carry the lost connection's error; then the follower's.
        let error = health["backend"]["error"].as_str().unwrap_or_default();
        if status == StatusCode::SERVICE_UNAVAILABLE && error.contains("failover") {
            break health;
        }
        assert!(Instant::now() < deadline, "health stays {status}: {health}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(health["backend"]["status"], "unhealthy", "{health}");

    let response = http
        .client
        .post(format!("{base}/ojs/v1/jobs"))
        .header("content-type", "application/json")
        .body(json!({"type": "ha.job", "args": [], "options": {"queue": JOBS}}).to_string())
        .send()
        .await
        .expect("an answer with no primary");
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(
        response
            .headers()
            .get("retry-after")
            .and_then(|v| v.to_str().ok()),
        Some("1")
    );
    let body: Value = response.json().await.expect("an error envelope");
    assert_eq!(
        common::codes::error_code(&body),
        "backend_unavailable",
        "{body}"
    );

    let mut grpc = common::grpc::ojs(&base).await;
    let refused = grpc
        .enqueue(pb::EnqueueRequest {
            r#type: "ha.job".into(),
            options: Some(pb::EnqueueOptions {
                queue: JOBS.into(),
                ..Default::default()
            }),
            ..Default::default()
        })
        .await
        .expect_err("no primary: no enqueue");
    assert_eq!(refused.code(), tonic::Code::Unavailable, "{refused:?}");
    for gateway in gateways {
        gateway.shutdown().await;
    }
}

/// Asynchronous replication: what a failover loses, measured (run with `--ignored`; the
/// figures are in docs/operations.md).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "a measurement: cargo test --test api failover:: -- --ignored"]
async fn asynchronous_replication_loses_what_the_standby_had_not_received() {
    let Some((figures, _cluster, gateways)) = run(Replication::Asynchronous).await else {
        return;
    };
    assert!(
        figures.server_errors.is_empty(),
        "{:?}",
        figures.server_errors
    );
    for gateway in gateways {
        gateway.shutdown().await;
    }
}
