//! A small JSON client of a test server's HTTP binding. The modules add the conveniences of their
//! own scenarios to it as extension traits.

use std::time::Duration;

use reqwest::{Method, StatusCode};
use serde_json::Value;

use super::TestApp;

/// The HTTP binding of one server.
#[derive(Clone)]
pub struct Http {
    /// The underlying client (for requests the helpers do not shape).
    pub client: reqwest::Client,
    /// The server's base URL, e.g. `http://127.0.0.1:41234`.
    pub base: String,
    /// Sent as `Authorization: Bearer <token>` when set.
    pub token: Option<String>,
    /// A bound on the wait for an answer's head (not its body), when set.
    pub answer_within: Option<Duration>,
}

impl Http {
    /// A client of `app` whose requests time out after 30 s.
    pub fn new(app: &TestApp) -> Http {
        Http::with_timeout(&app.http_url, Duration::from_secs(30))
    }

    /// A client of `base` whose requests time out after `timeout`.
    pub fn with_timeout(base: &str, timeout: Duration) -> Http {
        let client = reqwest::Client::builder()
            .timeout(timeout)
            .build()
            .expect("http client");
        Http::with_client(base, client)
    }

    /// A client of `base` over `client` (e.g. `reqwest::Client::new()`, without a timeout).
    pub fn with_client(base: &str, client: reqwest::Client) -> Http {
        Http {
            client,
            base: base.to_string(),
            token: None,
            answer_within: None,
        }
    }

    /// The same client sending `token` as a bearer token.
    pub fn bearer(mut self, token: &str) -> Http {
        self.token = Some(token.to_string());
        self
    }

    /// The same client failing when an answer's head takes longer than `within`.
    pub fn answering_within(mut self, within: Duration) -> Http {
        self.answer_within = Some(within);
        self
    }

    /// Sends `body` (as `application/json`) with `headers`; the status and the answer: its JSON,
    /// `Null` when empty, else its text as a JSON string.
    pub async fn send_raw(
        &self,
        method: Method,
        path: &str,
        body: Option<String>,
        headers: &[(&str, &str)],
    ) -> (StatusCode, Value) {
        let mut request = self.client.request(method, format!("{}{path}", self.base));
        if let Some(token) = &self.token {
            request = request.bearer_auth(token);
        }
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        if let Some(body) = body {
            request = request
                .header("content-type", "application/json")
                .body(body);
        }
        let response = match self.answer_within {
            Some(within) => tokio::time::timeout(within, request.send())
                .await
                .expect("answer in time"),
            None => request.send().await,
        }
        .expect("send request");
        let status = response.status();
        let text = response.text().await.expect("read body");
        let value = if text.is_empty() {
            Value::Null
        } else {
            serde_json::from_str(&text).unwrap_or(Value::String(text))
        };
        (status, value)
    }

    /// Sends a JSON body (if any); the status and the answer (see `send_raw`).
    pub async fn send(
        &self,
        method: Method,
        path: &str,
        body: Option<Value>,
    ) -> (StatusCode, Value) {
        self.send_raw(method, path, body.map(|b| b.to_string()), &[])
            .await
    }

    /// `POST`s JSON; the status and the answer.
    pub async fn post(&self, path: &str, body: Value) -> (StatusCode, Value) {
        self.send(Method::POST, path, Some(body)).await
    }

    /// `GET`; the status and the answer.
    pub async fn get(&self, path: &str) -> (StatusCode, Value) {
        self.send(Method::GET, path, None).await
    }

    /// `DELETE`; the status and the answer.
    pub async fn delete(&self, path: &str) -> (StatusCode, Value) {
        self.send(Method::DELETE, path, None).await
    }

    /// `POST`s JSON; the answer, which must be a success (2xx).
    pub async fn ok_post(&self, path: &str, body: Value) -> Value {
        let (status, answer) = self.post(path, body).await;
        assert!(status.is_success(), "POST {path} -> {status}: {answer}");
        answer
    }

    /// `GET`; the answer, which must be a success (2xx).
    pub async fn ok_get(&self, path: &str) -> Value {
        let (status, answer) = self.get(path).await;
        assert!(status.is_success(), "GET {path} -> {status}: {answer}");
        answer
    }

    /// `GET`; the answer, which must be 200.
    pub async fn get_200(&self, path: &str) -> Value {
        let (status, answer) = self.get(path).await;
        assert_eq!(status, StatusCode::OK, "GET {path}: {answer}");
        answer
    }
}

/// Declares a module's own `Http`: the shared client (through `Deref`) plus the calls the module
/// adds in its own `impl Http`.
macro_rules! module_http {
    ($(#[$meta:meta])*) => {
        $(#[$meta])*
        struct Http($crate::common::http::Http);

        impl std::ops::Deref for Http {
            type Target = $crate::common::http::Http;

            fn deref(&self) -> &$crate::common::http::Http {
                &self.0
            }
        }
    };
}
pub(crate) use module_http;

/// An HTTP/2 connection without TLS (prior knowledge) to `address` (`host:port`), driven in a task
/// of its own; requests go through the sender.
pub async fn h2c<B>(address: &str) -> hyper::client::conn::http2::SendRequest<B>
where
    B: http_body::Body + Unpin + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let tcp = tokio::net::TcpStream::connect(address)
        .await
        .expect("connect");
    let (sender, connection) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(tcp),
    )
    .await
    .expect("h2c handshake");
    tokio::spawn(connection);
    sender
}
