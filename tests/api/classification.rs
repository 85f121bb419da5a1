//! How a request is classified and bounded before any handler runs (`--auth on`): the operation a
//! request is authorized as is the one its route serves, whatever its content type says; HEAD is
//! the GET operation with its role, OPTIONS and unknown methods are 405, unknown gRPC methods
//! UNIMPLEMENTED; every body is bounded whatever its content type or framing, and an HTTP/1.1
//! client still sending reads the 413; token lookups wait for an admission slot; every 1.x
//! `OJS-Version` is spoken.

use crate::common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use common::TestApp;
use common::tokens::create_token;
use reqwest::{Method, StatusCode};

async fn secured(adjust: impl FnOnce(&mut pgvs3::server::ServerSettings)) -> (TestApp, String) {
    let app = common::spawn_app_with(|s| {
        s.auth = true;
        adjust(s);
    })
    .await;
    let admin = create_token(&app.database_url, "admin", &["admin"], None);
    (app, admin)
}

/// `(status, grpc-status header, body text)` of one plain request.
async fn call(
    app: &TestApp,
    method: Method,
    path: &str,
    headers: &[(&str, &str)],
    body: Option<&str>,
) -> (StatusCode, Option<String>, String) {
    let client = reqwest::Client::new();
    let mut request = client.request(method, format!("{}{path}", app.http_url));
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    if let Some(body) = body {
        request = request.body(body.to_string());
    }
    let response = tokio::time::timeout(Duration::from_secs(10), request.send())
        .await
        .expect("answered in time")
        .expect("send");
    let status = response.status();
    let grpc = response
        .headers()
        .get("grpc-status")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    (status, grpc, response.text().await.unwrap_or_default())
}

async fn queue_exists(app: &TestApp, admin: &str, queue: &str) -> bool {
    let (status, _, body) = call(
        app,
        Method::GET,
        "/ojs/v1/queues?limit=1000",
        &[("authorization", &format!("Bearer {admin}"))],
        None,
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    body.contains(&format!("\"{queue}\""))
}

#[tokio::test]
async fn a_grpc_content_type_does_not_turn_an_http_route_public() {
    let (app, admin) = secured(|_| {}).await;
    let auth = format!("Bearer {admin}");
    let (status, _, body) = call(
        &app,
        Method::POST,
        "/ojs/v1/jobs",
        &[
            ("authorization", &auth),
            ("content-type", "application/json"),
        ],
        Some(r#"{"type":"bill.send","args":[],"options":{"queue":"billing"}}"#),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    for content_type in [
        "application/grpc",
        "application/grpc+proto",
        "application/grpc-web",
        "application/grpc-web+proto",
    ] {
        let ct = [("content-type", content_type)];
        let (status, _, body) = call(&app, Method::GET, "/ojs/v1/admin/tokens", &ct, None).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{content_type}: {body}");
        assert!(!body.contains("\"admin\""), "no token is listed: {body}");
        let (status, _, body) =
            call(&app, Method::DELETE, "/ojs/v1/queues/billing", &ct, None).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{content_type}: {body}");
        // The refusal is the HTTP route's: the OJS envelope, not a gRPC status.
        assert!(body.contains("\"unauthenticated\""), "{body}");
    }
    assert!(
        queue_exists(&app, &admin, "billing").await,
        "billing is kept"
    );
    app.stop().await;
}

#[tokio::test]
async fn head_is_the_get_operation_and_options_is_refused() {
    let (app, admin) = secured(|_| {}).await;
    let reader = create_token(&app.database_url, "reader", &["reader"], None);
    let (status, _, _) = call(&app, Method::HEAD, "/metrics", &[], None).await;
    assert_eq!(
        status,
        StatusCode::UNAUTHORIZED,
        "HEAD /metrics needs getMetrics' role"
    );
    let (status, _, _) = call(&app, Method::HEAD, "/ojs/v1/admin/tokens", &[], None).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let as_reader = [("authorization", format!("Bearer {reader}"))];
    let as_reader: Vec<(&str, &str)> = as_reader.iter().map(|(n, v)| (*n, v.as_str())).collect();
    let (status, _, body) =
        call(&app, Method::HEAD, "/ojs/v1/admin/tokens", &as_reader, None).await;
    assert_eq!(
        status,
        StatusCode::FORBIDDEN,
        "listing tokens needs admin: {body}"
    );
    let (status, _, body) = call(&app, Method::HEAD, "/ojs/v1/queues", &as_reader, None).await;
    assert_eq!(
        status,
        StatusCode::OK,
        "HEAD of a read the token may do: {body}"
    );
    assert!(body.is_empty(), "HEAD answers no body");
    for path in [
        "/ojs/v1/queues",
        "/ojs/v1/admin/tokens",
        "/metrics",
        "/ojs/v1/jobs/x",
    ] {
        let (status, _, _) = call(&app, Method::OPTIONS, path, &[], None).await;
        assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED, "OPTIONS {path}");
    }
    // A method a route lacks is 405 before any guard, even for an admin.
    let as_admin = format!("Bearer {admin}");
    let (status, _, _) = call(
        &app,
        Method::PUT,
        "/ojs/v1/queues/billing",
        &[("authorization", &as_admin)],
        None,
    )
    .await;
    assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED);
    app.stop().await;
}

#[tokio::test]
async fn grpc_methods_are_routed_one_by_one() {
    let (app, _admin) = secured(|_| {}).await;
    // A method no table declares: UNIMPLEMENTED, whatever service it names.
    for path in [
        "/ojs.v1.OJSService/Nope",
        "/pgvs3.v1.AdminService/ListTokens2",
    ] {
        let (status, grpc, _) = call(
            &app,
            Method::POST,
            path,
            &[("content-type", "application/grpc")],
            Some(""),
        )
        .await;
        assert_eq!(
            (status, grpc.as_deref()),
            (StatusCode::OK, Some("12")),
            "{path}"
        );
    }
    // A declared method sent with another content type is still that method, with its role.
    let (_, grpc, _) = call(
        &app,
        Method::POST,
        "/pgvs3.v1.AdminService/ListTokens",
        &[("content-type", "application/json")],
        Some("{}"),
    )
    .await;
    assert_eq!(grpc.as_deref(), Some("16"), "UNAUTHENTICATED");
    // Only POST reaches a gRPC method.
    let (status, _, _) = call(
        &app,
        Method::GET,
        "/pgvs3.v1.AdminService/ListTokens",
        &[],
        None,
    )
    .await;
    assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED);
    app.stop().await;
}

#[tokio::test]
async fn every_1x_ojs_version_is_spoken() {
    let app = common::spawn_app().await;
    for version in ["1", "1.0", "1.0.0", "1.0.0-rc.1", "1.1"] {
        let (status, _, body) = call(
            &app,
            Method::GET,
            "/ojs/v1/health",
            &[("ojs-version", version)],
            None,
        )
        .await;
        assert_eq!(status, StatusCode::OK, "{version}: {body}");
    }
    let (status, _, body) = call(
        &app,
        Method::GET,
        "/ojs/v1/health",
        &[("ojs-version", "2.0")],
        None,
    )
    .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    // Two versions: the server cannot know which one the client speaks.
    let (status, _, body) = call(
        &app,
        Method::GET,
        "/ojs/v1/health",
        &[("ojs-version", "1.0"), ("ojs-version", "2.0")],
        None,
    )
    .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    app.stop().await;
}

/// Sends a whole request over one HTTP/1.1 connection before reading anything (as Python's
/// `http.client` does); the answer's status line and body, or the I/O error that ended it.
fn send_then_read(addr: &str, head: &str, body: &[u8]) -> std::io::Result<String> {
    let mut stream = TcpStream::connect(addr)?;
    stream.set_read_timeout(Some(Duration::from_secs(20)))?;
    stream.write_all(head.as_bytes())?;
    for chunk in body.chunks(64 * 1024) {
        stream.write_all(chunk)?;
    }
    stream.flush()?;
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer)?;
    Ok(String::from_utf8_lossy(&answer).into_owned())
}

fn chunked(body: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    for chunk in body.chunks(32 * 1024) {
        out.extend_from_slice(format!("{:x}\r\n", chunk.len()).as_bytes());
        out.extend_from_slice(chunk);
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"0\r\n\r\n");
    out
}

#[tokio::test]
async fn every_body_is_bounded_and_its_sender_reads_the_413() {
    let app = common::spawn_app().await;
    let addr = app.http_url.trim_start_matches("http://").to_string();
    let big = format!(r#"{{"payload":"{}"}}"#, "a".repeat(1_100 * 1024));
    let cases = [
        // (what, path, content type, chunked)
        (
            "declared length",
            "/ojs/v1/queues/q/messages",
            "application/json",
            false,
        ),
        (
            "chunked",
            "/ojs/v1/queues/q/messages",
            "application/json",
            true,
        ),
        (
            "chunked, gRPC content type",
            "/ojs/v1/jobs",
            "application/grpc",
            true,
        ),
        ("chunked, no content type", "/ojs/v1/jobs", "", true),
        ("chunked, text", "/ojs/v1/workers/fetch", "text/plain", true),
    ];
    for (what, path, content_type, is_chunked) in cases {
        let framing = if is_chunked {
            "transfer-encoding: chunked\r\n".to_string()
        } else {
            format!("content-length: {}\r\n", big.len())
        };
        let ct = if content_type.is_empty() {
            String::new()
        } else {
            format!("content-type: {content_type}\r\n")
        };
        let head = format!(
            "POST {path} HTTP/1.1\r\nhost: {addr}\r\nconnection: close\r\n{ct}{framing}\r\n"
        );
        let body = if is_chunked {
            chunked(big.as_bytes())
        } else {
            big.clone().into_bytes()
        };
        let addr = addr.clone();
        let answer = tokio::task::spawn_blocking(move || send_then_read(&addr, &head, &body))
            .await
            .expect("join");
        let answer = answer.unwrap_or_else(|e| panic!("{what}: the connection failed: {e}"));
        assert!(
            answer.starts_with("HTTP/1.1 413"),
            "{what}: {}",
            &answer[..answer.len().min(300)]
        );
        assert!(
            answer.contains("exceeds the limit"),
            "{what}: the OJS envelope"
        );
    }
    // Nothing was stored.
    let http = common::http::Http::new(&app);
    let (_, info) = http.get("/ojs/v1/queues?limit=1000").await;
    assert!(!info.to_string().contains("\"q\""), "{info}");
    app.stop().await;
}

#[tokio::test]
async fn token_lookups_wait_for_an_admission_slot() {
    let (app, admin) = secured(|s| s.max_in_flight = 1).await;
    let addr = app.http_url.trim_start_matches("http://").to_string();
    // One request holds the only slot: admitted, its handler waits for a body never sent.
    let mut held = TcpStream::connect(&addr).expect("connect");
    let head = format!(
        "POST /ojs/v1/jobs HTTP/1.1\r\nhost: {addr}\r\nauthorization: Bearer {admin}\r\n\
         content-type: application/json\r\ncontent-length: 100\r\n\r\n{{"
    );
    held.write_all(head.as_bytes()).expect("write");
    tokio::time::sleep(Duration::from_millis(300)).await;
    // An unknown token is not looked up while no slot is free: 429, not 401.
    let (status, _, body) = call(
        &app,
        Method::GET,
        "/ojs/v1/queues",
        &[("authorization", "Bearer pgvs3_unknown")],
        None,
    )
    .await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{body}");
    drop(held);
    let http = common::http::Http::new(&app).bearer(&admin);
    let mut answered = StatusCode::TOO_MANY_REQUESTS;
    for _ in 0..50 {
        answered = http.get("/ojs/v1/queues").await.0;
        if answered == StatusCode::OK {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(answered, StatusCode::OK, "the slot comes back");
    app.stop().await;
}

#[tokio::test]
async fn a_grpc_message_that_does_not_decode_is_the_clients_error() {
    let app = common::spawn_app().await;
    let address = app.http_url.trim_start_matches("http://").to_string();
    let mut sender = common::http::h2c(&address).await;
    // `{}` as a gRPC body: its first byte is no compression flag. Then a frame of bytes that are
    // no HealthRequest (field 1 with wire type 7, which does not exist).
    let not_a_frame = b"{}".to_vec();
    let not_a_message = vec![0, 0, 0, 0, 2, 0x0f, 0x01];
    // And no message at all, which tonic reports as INTERNAL "Missing request message".
    let no_message = Vec::new();
    for body in [not_a_frame, not_a_message, no_message] {
        let request = hyper::Request::builder()
            .method("POST")
            .uri(format!("http://{address}/ojs.v1.OJSService/Health"))
            .header("content-type", "application/grpc")
            .header("te", "trailers")
            .body(http_body_util::Full::new(hyper::body::Bytes::from(
                body.clone(),
            )))
            .expect("request");
        let response = sender.send_request(request).await.expect("send");
        let headers = response.headers().clone();
        let grpc_status = headers
            .get("grpc-status")
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        assert_eq!(
            grpc_status.as_deref(),
            Some("3"),
            "INVALID_ARGUMENT for {body:?}: {headers:?}"
        );
        assert!(
            headers.contains_key("grpc-status-details-bin"),
            "with ErrorInfo: {headers:?}"
        );
    }
    app.stop().await;
}

/// Reads whatever answer comes within `within` on a connection whose request is not finished.
fn answer_while_sending(addr: &str, head: &str, first: &[u8], within: Duration) -> String {
    let mut stream = TcpStream::connect(addr).expect("connect");
    stream.set_read_timeout(Some(within)).expect("timeout");
    stream.write_all(head.as_bytes()).expect("head");
    stream.write_all(first).expect("first bytes");
    let mut answer = vec![0u8; 4096];
    let n = stream.read(&mut answer).unwrap_or(0);
    String::from_utf8_lossy(&answer[..n]).into_owned()
}

#[tokio::test]
async fn a_slow_sender_over_the_limit_gets_its_413_in_bounded_time() {
    let app = common::spawn_app().await;
    let addr = app.http_url.trim_start_matches("http://").to_string();
    // A declared length far past anything the server drains: answered at once.
    let head = format!(
        "POST /ojs/v1/jobs HTTP/1.1\r\nhost: {addr}\r\ncontent-type: application/json\r\n\
         content-length: 1000000000000\r\n\r\n"
    );
    let started = std::time::Instant::now();
    let a = addr.clone();
    let answer = tokio::task::spawn_blocking(move || {
        answer_while_sending(&a, &head, b"{\"type\"", Duration::from_secs(10))
    })
    .await
    .expect("join");
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    // A chunked body past the limit whose sender then stalls: answered once draining gives up.
    let head = format!(
        "POST /ojs/v1/jobs HTTP/1.1\r\nhost: {addr}\r\ncontent-type: application/json\r\n\
         transfer-encoding: chunked\r\n\r\n"
    );
    let mut first = Vec::new();
    for _ in 0..18 {
        first.extend_from_slice(b"10000\r\n");
        first.extend_from_slice(&[b'a'; 0x10000]);
        first.extend_from_slice(b"\r\n");
    }
    let started = std::time::Instant::now();
    let answer = tokio::task::spawn_blocking(move || {
        answer_while_sending(&addr, &head, &first, Duration::from_secs(15))
    })
    .await
    .expect("join");
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
    app.stop().await;
}

#[tokio::test]
async fn two_authorization_headers_are_no_token() {
    let (app, admin) = secured(|_| {}).await;
    let client = reqwest::Client::new();
    let response = client
        .get(format!("{}/ojs/v1/queues", app.http_url))
        .header("authorization", format!("Bearer {admin}"))
        .header("authorization", "Bearer pgvs3_other")
        .send()
        .await
        .expect("send");
    assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
    app.stop().await;
}

#[tokio::test]
async fn a_grpc_body_of_many_messages_past_the_limit_is_resource_exhausted() {
    let app = common::spawn_app().await;
    let address = app.http_url.trim_start_matches("http://").to_string();
    let mut sender = common::http::h2c(&address).await;
    // 1,100 frames of a 1 KiB message each, as a stream with no declared length.
    let mut frame = vec![0u8, 0, 0, 4, 0];
    frame.extend_from_slice(&[0x0a, 0xfd, 0x07]); // job_id, 1,021 bytes
    frame.resize(5 + 1024, b'a');
    let frames: Vec<Result<http_body::Frame<hyper::body::Bytes>, std::convert::Infallible>> = (0
        ..1100)
        .map(|_| {
            Ok(http_body::Frame::data(hyper::body::Bytes::from(
                frame.clone(),
            )))
        })
        .collect();
    let body = http_body_util::StreamBody::new(futures_util::stream::iter(frames));
    let request = hyper::Request::builder()
        .method("POST")
        .uri(format!("http://{address}/ojs.v1.OJSService/GetJob"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(body)
        .expect("request");
    let response = sender.send_request(request).await.expect("send");
    let (parts, body) = response.into_parts();
    let trailers = http_body_util::BodyExt::collect(body)
        .await
        .ok()
        .and_then(|c| c.trailers().cloned());
    let status = parts
        .headers
        .get("grpc-status")
        .or_else(|| trailers.as_ref().and_then(|t| t.get("grpc-status")))
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    assert_eq!(
        status.as_deref(),
        Some("8"),
        "RESOURCE_EXHAUSTED: {parts:?} {trailers:?}"
    );
    app.stop().await;
}
