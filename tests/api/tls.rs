//! HTTPS and gRPC over TLS on one port (`--tls-cert` / `--tls-key`), and client certificates
//! required with `--tls-client-ca` (mTLS): certificates made here, the real server, an HTTPS
//! client and a tonic client over TLS; plaintext to a TLS port and clients without a trusted
//! certificate are refused.

use crate::common;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use pgvs3::grpc::proto::ojs::v1 as pb;
use pgvs3::grpc::proto::ojs::v1::ojs_service_client::OjsServiceClient;
use pgvs3::tls::TlsFiles;
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use serde_json::json;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Identity};

fn scratch_dir() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!(
        "https-{}-{}",
        std::process::id(),
        uuid::Uuid::now_v7().simple()
    ));
    std::fs::create_dir_all(&dir).expect("scratch dir");
    dir
}

/// A TLS client configuration trusting `ca`, presenting `identity` (certificate, key) when given.
fn client_config(ca: &Path, identity: Option<&common::certs::Certs>) -> rustls::ClientConfig {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(ca).expect("read the CA") {
        roots
            .add(cert.expect("CA certificate"))
            .expect("add the CA");
    }
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("protocol versions")
        .with_root_certificates(roots);
    match identity {
        None => builder.with_no_client_auth(),
        Some(certs) => builder
            .with_client_auth_cert(
                CertificateDer::pem_file_iter(&certs.cert)
                    .expect("read the certificate")
                    .collect::<Result<Vec<_>, _>>()
                    .expect("certificate"),
                PrivateKeyDer::from_pem_file(&certs.key).expect("key"),
            )
            .expect("client certificate"),
    }
}

/// One HTTP/1.1 request over TLS to localhost:`port`; the status and body, or why it failed.
async fn https(
    port: u16,
    config: rustls::ClientConfig,
    method: &str,
    path: &str,
    body: Option<serde_json::Value>,
) -> Result<(u16, String), String> {
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .map_err(|e| e.to_string())?;
    let name = rustls::pki_types::ServerName::try_from("localhost").map_err(|e| e.to_string())?;
    let tls = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(name, tcp)
        .await
        .map_err(|e| format!("handshake: {e}"))?;
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tls))
            .await
            .map_err(|e| e.to_string())?;
    tokio::spawn(connection);
    let request = hyper::Request::builder()
        .method(method)
        .uri(path)
        .header("host", format!("localhost:{port}"))
        .header("content-type", "application/json")
        .body(http_body_util::Full::new(hyper::body::Bytes::from(
            body.map(|b| b.to_string()).unwrap_or_default(),
        )))
        .map_err(|e| e.to_string())?;
    let response = sender
        .send_request(request)
        .await
        .map_err(|e| e.to_string())?;
    let status = response.status().as_u16();
    let bytes = http_body_util::BodyExt::collect(response.into_body())
        .await
        .map_err(|e| e.to_string())?
        .to_bytes();
    Ok((status, String::from_utf8_lossy(&bytes).into_owned()))
}

async fn grpc_client(
    port: u16,
    ca: &Path,
    identity: Option<&common::certs::Certs>,
) -> Result<OjsServiceClient<Channel>, tonic::transport::Error> {
    let mut tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(std::fs::read(ca).expect("CA")))
        .domain_name("localhost");
    if let Some(certs) = identity {
        tls = tls.identity(Identity::from_pem(
            std::fs::read(&certs.cert).expect("certificate"),
            std::fs::read(&certs.key).expect("key"),
        ));
    }
    let channel = Channel::from_shared(format!("https://localhost:{port}"))
        .expect("endpoint")
        .tls_config(tls)?
        .connect()
        .await?;
    Ok(OjsServiceClient::new(channel))
}

async fn start(files: TlsFiles) -> common::TestApp {
    let (database, url) = common::fresh_database().await;
    common::spawn_app_on(&database, &url, |s| s.tls = Some(files)).await
}

fn port(app: &common::TestApp) -> u16 {
    app.http_url
        .rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .expect("port")
}

#[tokio::test]
async fn https_and_grpc_share_one_tls_port() {
    let dir = scratch_dir();
    let server = common::certs::make(&dir, "server");
    let app = start(TlsFiles {
        cert: server.cert.clone(),
        key: server.key.clone(),
        client_ca: None,
    })
    .await;
    let port = port(&app);
    let trusting = || client_config(&server.ca, None);
    let (status, _) = https(port, trusting(), "GET", "/ojs/v1/health", None)
        .await
        .expect("HTTPS health");
    assert_eq!(status, 200);
    let (status, answer) = https(
        port,
        trusting(),
        "POST",
        "/ojs/v1/jobs",
        Some(json!({"type": "tls.job", "args": [1], "options": {"queue": "tls"}})),
    )
    .await
    .expect("HTTPS enqueue");
    assert_eq!(status, 201, "{answer}");
    let answer: serde_json::Value = serde_json::from_str(&answer).expect("JSON answer");
    let id = answer["job"]["id"].as_str().expect("job id").to_string();

    // gRPC on the same port, over TLS (ALPN h2).
    let mut grpc = grpc_client(port, &server.ca, None)
        .await
        .expect("gRPC over TLS");
    let job = grpc
        .get_job(pb::GetJobRequest { job_id: id.clone() })
        .await
        .expect("GetJob over TLS")
        .into_inner()
        .job
        .expect("job");
    assert_eq!(job.id, id);

    // Plaintext to the TLS port gets no HTTP answer.
    let plain = reqwest::Client::new()
        .get(format!("http://127.0.0.1:{port}/ojs/v1/health"))
        .timeout(std::time::Duration::from_secs(10))
        .send()
        .await;
    assert!(plain.is_err(), "plaintext was answered: {plain:?}");
    // A client that does not trust the server's CA refuses it.
    let stranger = common::certs::make(&dir, "stranger");
    let untrusted = https(
        port,
        client_config(&stranger.ca, None),
        "GET",
        "/ojs/v1/health",
        None,
    )
    .await;
    assert!(
        untrusted.is_err(),
        "a server certificate from an untrusted CA was accepted: {untrusted:?}"
    );
    app.stop().await;
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn client_certificates_are_required_with_a_client_ca() {
    let dir = scratch_dir();
    let server = common::certs::make(&dir, "server");
    let client_certs = common::certs::make(&dir, "client");
    let stranger = common::certs::make(&dir, "stranger");
    let app = start(TlsFiles {
        cert: server.cert.clone(),
        key: server.key.clone(),
        client_ca: Some(client_certs.ca.clone()),
    })
    .await;
    let port = port(&app);
    let (status, _) = https(
        port,
        client_config(&server.ca, Some(&client_certs)),
        "GET",
        "/ojs/v1/health",
        None,
    )
    .await
    .expect("HTTPS with a client certificate");
    assert_eq!(status, 200);
    for (who, config) in [
        ("without a certificate", client_config(&server.ca, None)),
        (
            "whose certificate another CA signed",
            client_config(&server.ca, Some(&stranger)),
        ),
    ] {
        let answer = https(port, config, "GET", "/ojs/v1/health", None).await;
        assert!(answer.is_err(), "answered a client {who}: {answer:?}");
    }

    let mut grpc = grpc_client(port, &server.ca, Some(&client_certs))
        .await
        .expect("gRPC with a client certificate");
    grpc.get_job(pb::GetJobRequest {
        job_id: uuid::Uuid::now_v7().to_string(),
    })
    .await
    .expect_err("no such job");
    let refused = match grpc_client(port, &server.ca, None).await {
        Err(_) => true,
        Ok(mut client) => client
            .get_job(pb::GetJobRequest {
                job_id: uuid::Uuid::now_v7().to_string(),
            })
            .await
            // Served, it would say NotFound; refused, the transport fails.
            .is_err_and(|s| s.code() != tonic::Code::NotFound),
    };
    assert!(refused, "gRPC without a client certificate was served");
    app.stop().await;
    let _ = std::fs::remove_dir_all(&dir);
}
