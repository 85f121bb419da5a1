//! OJS conformance runner: every case file under the selected `level-N-*` folders of the
//! conformance suite runs against its own freshly spawned pgvs3 server (fresh database), twice:
//! once plain, once secured (`--auth on` with an admin token the runner sends, and TLS with a
//! certificate made here, reached through a local forwarder that opens TLS to the server).
//!
//! Environment:
//! - `OJS_LEVELS`: comma list of levels to run (default all, `0,1,2,3,4`), e.g. `OJS_LEVELS=0,1`.
//! - `OJS_CASE`: only cases whose file path or test id contains this substring.
//! - `OJS_PARALLEL`: cases run at the same time (default 16: the cron cases wait over a minute, so they overlap the rest).
//! - `OJS_CONFORMANCE_DIR`: the suite directory. Unset: no case runs and the test passes, saying
//!   SKIPPED (the suite is an input from outside this repository); set to a directory that is
//!   missing or holds no cases: the test fails.
//!
//! Run: `OJS_CONFORMANCE_DIR=…/ojs-conformance OJS_LEVELS=0,1 cargo test --test api conformance:: -- --nocapture`.

use crate::common;

mod jsonpath;
mod matchers;
mod runner;
mod template;

use futures_util::FutureExt;
use futures_util::stream::{self, StreamExt};
use std::io::Write as _;
use std::net::SocketAddr;
use std::panic::AssertUnwindSafe;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, ServerName};

/// Cases that cannot pass on any server: skipped and reported as SKIP. Keyed by file path
/// (test ids repeat across files).
const DEFECTIVE: &[(&str, &str)] = &[
    // L1-RTR-014: expects error `type` values that no request in it ever sends.
    (
        "level-1-reliable/retry/retry-error-history-tracked.json",
        "L1-RTR-014 expects error type values no request in it sends",
    ),
];

/// Cases for features not built yet, with the issue that will deliver them. They still run: a
/// failure is reported as PENDING and does not fail the test; a pass fails the test ("remove from
/// PENDING"), so this list can never hide a working feature.
const PENDING: &[(&str, &str)] = &[];

/// A case that runs longer than this fails (the cron cases need a little over a minute).
const CASE_TIMEOUT: Duration = Duration::from_secs(300);
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Verdict {
    Pass,
    Fail,
    Skip,
    Pending,
}

struct Report {
    rel_path: String,
    verdict: Verdict,
    line: String,
}

/// The suite named by `OJS_CONFORMANCE_DIR`, or None when it is unset. No default path: the
/// suite lives outside the repository, and a guessed place could silently run another copy.
fn conformance_dir() -> Option<PathBuf> {
    std::env::var_os("OJS_CONFORMANCE_DIR").map(PathBuf::from)
}

fn levels() -> Vec<u32> {
    let raw = std::env::var("OJS_LEVELS").unwrap_or_else(|_| "0,1,2,3,4".to_string());
    raw.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| {
            s.parse()
                .unwrap_or_else(|_| panic!("OJS_LEVELS: {s:?} is not a level number (in {raw:?})"))
        })
        .collect()
}

fn parallelism() -> usize {
    match std::env::var("OJS_PARALLEL") {
        Ok(v) => v
            .trim()
            .parse::<usize>()
            .unwrap_or_else(|_| panic!("OJS_PARALLEL: {v:?} is not a number"))
            .max(1),
        Err(_) => 16,
    }
}

/// `level-N-*` folders for the wanted levels, walked for `*.json`; paths relative to `dir`, with
/// `/` separators, sorted.
fn discover(dir: &Path, levels: &[u32]) -> Result<Vec<String>, String> {
    let entries =
        std::fs::read_dir(dir).map_err(|e| format!("cannot read {}: {e}", dir.display()))?;
    let mut files = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| format!("cannot read {}: {e}", dir.display()))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        let level = name
            .strip_prefix("level-")
            .and_then(|rest| rest.split('-').next())
            .and_then(|n| n.parse::<u32>().ok());
        if level.is_some_and(|l| levels.contains(&l)) && entry.path().is_dir() {
            walk(&entry.path(), &name, &mut files)?;
        }
    }
    files.sort();
    Ok(files)
}

fn walk(path: &Path, rel: &str, out: &mut Vec<String>) -> Result<(), String> {
    let entries =
        std::fs::read_dir(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    for entry in entries {
        let entry = entry.map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        let child_rel = format!("{rel}/{name}");
        let child = entry.path();
        if child.is_dir() {
            walk(&child, &child_rel, out)?;
        } else if name.ends_with(".json") {
            out.push(child_rel);
        }
    }
    Ok(())
}

fn listed(list: &[(&str, &'static str)], rel_path: &str) -> Option<&'static str> {
    list.iter()
        .find(|(path, _)| *path == rel_path)
        .map(|(_, reason)| *reason)
}

fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "non-string panic payload".to_string())
}

/// What the secured pass needs: the server's certificate, the client's TLS settings and the
/// admin token stored in every case's database.
struct Secured {
    certs: common::certs::Certs,
    client_tls: Arc<rustls::ClientConfig>,
    token: String,
}

impl Secured {
    fn new() -> Secured {
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
            .join(format!("conformance-tls-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("certificate dir");
        let certs = common::certs::make(&dir, "conformance");
        let mut roots = rustls::RootCertStore::empty();
        for cert in CertificateDer::pem_file_iter(&certs.ca).expect("read the CA") {
            roots
                .add(cert.expect("CA certificate"))
                .expect("add the CA");
        }
        let mut client_tls = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .expect("protocol versions")
        .with_root_certificates(roots)
        .with_no_client_auth();
        client_tls.alpn_protocols = vec![b"http/1.1".to_vec()];
        Secured {
            certs,
            client_tls: Arc::new(client_tls),
            token: pgvs3::core::access::mint_token(),
        }
    }

    /// A server with auth on and TLS, its database holding the runner's admin token.
    async fn spawn_app(&self) -> common::TestApp {
        let app = common::spawn_app_with(|settings| {
            settings.auth = true;
            settings.tls = Some(pgvs3::tls::TlsFiles {
                cert: self.certs.cert.clone(),
                key: self.certs.key.clone(),
                client_ca: None,
            });
        })
        .await;
        let mut conn = <sqlx::PgConnection as sqlx::Connection>::connect(&app.database_url)
            .await
            .expect("connect to the case's database");
        sqlx::query("SELECT s3p.token_create('conformance', $1, ARRAY['admin'], '{}')")
            .bind(pgvs3::core::access::token_hash(&self.token).as_slice())
            .execute(&mut conn)
            .await
            .expect("store the admin token");
        app
    }
}

/// Accepts plain HTTP on a local port and carries each connection over TLS to `target`; the
/// URL to send to and the task to abort afterwards.
async fn tls_forwarder(
    target: SocketAddr,
    config: Arc<rustls::ClientConfig>,
) -> (String, tokio::task::JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind the forwarder");
    let url = format!(
        "http://{}",
        listener.local_addr().expect("forwarder address")
    );
    let task = tokio::spawn(async move {
        while let Ok((mut inbound, _)) = listener.accept().await {
            let connector = tokio_rustls::TlsConnector::from(config.clone());
            tokio::spawn(async move {
                let Ok(tcp) = tokio::net::TcpStream::connect(target).await else {
                    return;
                };
                let name = ServerName::try_from("localhost").expect("server name");
                let Ok(mut tls) = connector.connect(name, tcp).await else {
                    return;
                };
                let _ = tokio::io::copy_bidirectional(&mut inbound, &mut tls).await;
            });
        }
    });
    (url, task)
}

async fn run_one(
    dir: &Path,
    rel_path: String,
    client: &reqwest::Client,
    secured: Option<&Secured>,
) -> Report {
    let file = dir.join(&rel_path);
    let parsed = std::fs::read_to_string(&file)
        .map_err(|e| format!("cannot read {}: {e}", file.display()))
        .and_then(|text| runner::parse_case(&text));
    let pending = listed(PENDING, &rel_path);
    let report = |verdict: Verdict, label: &str, detail: String| Report {
        line: format!("{label} {detail}"),
        rel_path: rel_path.clone(),
        verdict,
    };
    let case = match parsed {
        Ok(case) => case,
        Err(e) => {
            return match pending {
                Some(reason) => report(
                    Verdict::Pending,
                    "PENDING",
                    format!("? ? ({rel_path}): {reason}: {e}"),
                ),
                None => report(Verdict::Fail, "FAIL", format!("? ? ({rel_path}): {e}")),
            };
        }
    };
    let title = format!("{} {} ({rel_path})", case.test_id, case.name);
    if let Some(reason) = listed(DEFECTIVE, &rel_path) {
        return report(
            Verdict::Skip,
            "SKIP",
            format!("{title}: DEFECTIVE: {reason}"),
        );
    }
    let outcome = AssertUnwindSafe(async {
        let (app, base, forwarder) = match secured {
            None => {
                let app = common::spawn_app().await;
                let base = app.http_url.clone();
                (app, base, None)
            }
            Some(secured) => {
                let app = secured.spawn_app().await;
                let target: SocketAddr = app
                    .http_url
                    .trim_start_matches("http://")
                    .parse()
                    .expect("server address");
                let (base, task) = tls_forwarder(target, secured.client_tls.clone()).await;
                (app, base, Some(task))
            }
        };
        let result =
            tokio::time::timeout(CASE_TIMEOUT, runner::run_case(client, &base, &case)).await;
        if let Some(task) = forwarder {
            task.abort();
        }
        drop(app);
        result.unwrap_or_else(|_| Err(format!("case timed out after {} s", CASE_TIMEOUT.as_secs())))
    })
    .catch_unwind()
    .await
    .unwrap_or_else(|payload| Err(format!("panicked: {}", panic_message(payload.as_ref()))));
    match (outcome, pending) {
        (Ok(()), None) => report(Verdict::Pass, "PASS", title),
        (Err(e), None) => report(Verdict::Fail, "FAIL", format!("{title}: {e}")),
        (Err(e), Some(reason)) => report(
            Verdict::Pending,
            "PENDING",
            format!("{title}: {reason}: {e}"),
        ),
        (Ok(()), Some(reason)) => report(
            Verdict::Fail,
            "FAIL",
            format!("{title}: passes but is listed in PENDING ({reason}): remove from PENDING"),
        ),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn conformance() {
    let Some(dir) = conformance_dir() else {
        // Straight to stderr: libtest captures eprintln! of a passing test, and this must be seen.
        let _ = writeln!(
            std::io::stderr(),
            "\nSKIPPED: OJS conformance cases not run: set OJS_CONFORMANCE_DIR to the suite (…/ojs-conformance)"
        );
        return;
    };
    assert!(
        dir.is_dir(),
        "OJS_CONFORMANCE_DIR is set to {:?}, which is not a directory",
        dir.as_os_str()
    );
    let levels = levels();
    let filter = std::env::var("OJS_CASE")
        .ok()
        .filter(|s| !s.trim().is_empty());

    let mut problems = Vec::new();
    for (list_name, list) in [("DEFECTIVE", DEFECTIVE), ("PENDING", PENDING)] {
        for (path, _) in list {
            if !dir.join(path).is_file() {
                problems.push(format!(
                    "FAIL {list_name} entry {path} is not a case file: remove it"
                ));
            }
        }
    }
    for (path, _) in DEFECTIVE {
        if listed(PENDING, path).is_some() {
            problems.push(format!("FAIL {path} is in both DEFECTIVE and PENDING"));
        }
    }

    let files = match discover(&dir, &levels) {
        Ok(files) => files,
        Err(e) => panic!("conformance suite: {e}"),
    };
    assert!(
        !files.is_empty(),
        "OJS_CONFORMANCE_DIR {} holds no case files (level-N-*/**/*.json) for levels {levels:?}",
        dir.display()
    );
    let selected: Vec<String> = files
        .into_iter()
        .filter(|rel| match &filter {
            None => true,
            Some(f) => {
                rel.contains(f.as_str())
                    || std::fs::read_to_string(dir.join(rel))
                        .ok()
                        .and_then(|t| runner::parse_case(&t).ok())
                        .is_some_and(|c| c.test_id.contains(f.as_str()))
            }
        })
        .collect();
    assert!(
        !selected.is_empty(),
        "no conformance cases selected (levels {levels:?}, OJS_CASE {filter:?}) in {}",
        dir.display()
    );

    let parallel = parallelism();
    let secured = Secured::new();
    // Many servers committing at once: the tests reading the event log right after a commit wait
    // (common::db::MANY_DATABASES_BUSY).
    let _busy = common::db::many_databases_busy().await;
    let mut reports = Vec::new();
    // The plain pass, then the secured one (one after the other: the timing cases need the CPU).
    for pass in [None, Some(&secured)] {
        let label = if pass.is_some() { "secured" } else { "plain" };
        let mut client = reqwest::Client::builder()
            .timeout(REQUEST_TIMEOUT)
            .no_proxy();
        if let Some(secured) = pass {
            let mut headers = reqwest::header::HeaderMap::new();
            headers.insert(
                reqwest::header::AUTHORIZATION,
                format!("Bearer {}", secured.token)
                    .parse()
                    .expect("header value"),
            );
            client = client.default_headers(headers);
        }
        let client = client.build().expect("building the HTTP client");
        println!(
            "conformance ({label}): {} case(s), levels {levels:?}, {parallel} at a time, from {}",
            selected.len(),
            dir.display()
        );
        let mut running = stream::iter(selected.clone())
            .map(|rel| run_one(&dir, rel, &client, pass))
            .buffer_unordered(parallel);
        while let Some(mut report) = running.next().await {
            report.line = format!("[{label}] {}", report.line);
            println!("{}", report.line);
            reports.push(report);
        }
    }
    reports.sort_by(|a, b| a.rel_path.cmp(&b.rel_path));

    let count = |v: Verdict| reports.iter().filter(|r| r.verdict == v).count();
    let failed_lines: Vec<&str> = reports
        .iter()
        .filter(|r| r.verdict == Verdict::Fail)
        .map(|r| r.line.as_str())
        .chain(problems.iter().map(String::as_str))
        .collect();
    let summary = format!(
        "{} passed, {} failed, {} skipped, {} pending",
        count(Verdict::Pass),
        failed_lines.len(),
        count(Verdict::Skip),
        count(Verdict::Pending)
    );
    println!("\nall results:");
    for report in &reports {
        println!("{}", report.line);
    }
    for problem in &problems {
        println!("{problem}");
    }
    println!("{summary}");
    if !failed_lines.is_empty() {
        panic!("{summary}\n{}", failed_lines.join("\n"));
    }
}
