//! The dashboard at `/ui`: server-rendered pages over the same service as both APIs. Every page
//! and action names the API operation it stands for and needs that operation's role (the
//! `x-role` of `openapi/pgvs3.yaml`), so the dashboard grants nothing the API would refuse.

mod access;
mod live;
mod pages;
mod views;

use std::sync::Arc;

use axum::response::{Html, IntoResponse, Response};
use axum::routing::{get, post};
use minijinja::Environment;
use serde_json::Value;

use crate::core::{CoreError, Service};
use crate::middleware::StackState;
pub use access::TOKEN_COOKIE;

/// What the dashboard's handlers share.
pub struct UiState {
    /// The one service both APIs call.
    pub service: Arc<Service>,
    /// The middleware stack's state: token checking and the read-only flag.
    pub stack: Arc<StackState>,
    /// Turns true when the server shuts down: live streams end.
    pub shutdown: tokio::sync::watch::Receiver<bool>,
    templates: Environment<'static>,
}

/// The templates, compiled into the binary.
const TEMPLATES: [(&str, &str); 13] = [
    ("layout.html", include_str!("templates/layout.html")),
    ("error.html", include_str!("templates/error.html")),
    ("login.html", include_str!("templates/login.html")),
    ("queues.html", include_str!("templates/queues.html")),
    ("queue.html", include_str!("templates/queue.html")),
    ("job.html", include_str!("templates/job.html")),
    (
        "dead_letters.html",
        include_str!("templates/dead_letters.html"),
    ),
    ("streams.html", include_str!("templates/streams.html")),
    ("stream.html", include_str!("templates/stream.html")),
    ("cron.html", include_str!("templates/cron.html")),
    ("workflows.html", include_str!("templates/workflows.html")),
    ("workflow.html", include_str!("templates/workflow.html")),
    ("workers.html", include_str!("templates/workers.html")),
];

/// Why a page could not be shown.
#[derive(Debug)]
pub enum UiError {
    /// No token, or one that is unknown or revoked: the login page.
    Login(String),
    /// What the service said.
    Core(CoreError),
}

impl From<CoreError> for UiError {
    fn from(error: CoreError) -> Self {
        UiError::Core(error)
    }
}

/// A page to render: its template and what it shows.
pub type Page = (&'static str, Value);

impl UiState {
    /// The dashboard's state, with its templates loaded.
    pub fn new(
        service: Arc<Service>,
        stack: Arc<StackState>,
        shutdown: tokio::sync::watch::Receiver<bool>,
    ) -> Arc<Self> {
        let mut templates = Environment::new();
        for (name, source) in TEMPLATES {
            // The templates are part of the binary: one that does not parse is a build defect
            // the dashboard test catches, so it is logged rather than stopping the server.
            if let Err(error) = templates.add_template(name, source) {
                tracing::error!(%error, name, "dashboard template does not parse");
            }
        }
        Arc::new(UiState {
            service,
            stack,
            shutdown,
            templates,
        })
    }

    /// Renders a page, or the error page for what went wrong.
    pub fn render(&self, page: Result<Page, UiError>) -> Response {
        match page {
            Ok((template, context)) => match self.html(template, &context) {
                Ok(html) => Html(html).into_response(),
                Err(error) => self.error_page(UiError::Core(error)),
            },
            Err(error) => self.error_page(error),
        }
    }

    fn html(&self, template: &str, context: &Value) -> Result<String, CoreError> {
        let auth = self.stack.auth.is_some();
        let read_only = self.stack.is_read_only();
        self.templates
            .get_template(template)
            .and_then(|t| {
                t.render(minijinja::context! { auth => auth, read_only => read_only, ..minijinja::Value::from_serialize(context) })
            })
            .map_err(|e| {
                CoreError::new(
                    crate::core::ErrorKind::Backend,
                    format!("the dashboard page {template} could not be rendered: {e}"),
                )
            })
    }

    fn error_page(&self, error: UiError) -> Response {
        let (status, message) = match error {
            UiError::Login(message) => (http::StatusCode::UNAUTHORIZED, message),
            UiError::Core(error) => (crate::http::status_of(error.kind), error.message),
        };
        let context = serde_json::json!({
            "status": status.as_u16(),
            "reason": status.canonical_reason().unwrap_or(""),
            "message": message,
            "login": status == http::StatusCode::UNAUTHORIZED,
        });
        let body = self.html("error.html", &context).unwrap_or_else(|_| {
            // The error template itself failed: plain text says as much without markup.
            format!(
                "{} {}",
                status.as_u16(),
                status.canonical_reason().unwrap_or("")
            )
        });
        (status, Html(body)).into_response()
    }
}

/// The `/ui` routes.
pub fn router(
    service: Arc<Service>,
    stack: Arc<StackState>,
    shutdown: tokio::sync::watch::Receiver<bool>,
) -> axum::Router {
    let guard = stack.guard(crate::middleware::Operation::http(
        &crate::contract::DASHBOARD_OPERATION,
    ));
    let state = UiState::new(service, stack, shutdown);
    axum::Router::new()
        .route("/ui", get(pages::queues))
        .route("/ui/", get(pages::queues))
        .route("/ui/live", get(live::counts))
        .route("/ui/login", get(pages::login_form).post(access::login))
        .route("/ui/logout", post(access::logout))
        .route("/ui/queues/{q}", get(pages::queue))
        .route("/ui/queues/{q}/pause", post(pages::pause))
        .route("/ui/queues/{q}/resume", post(pages::resume))
        .route("/ui/jobs/{id}", get(pages::job))
        .route("/ui/jobs/{id}/cancel", post(pages::cancel_job))
        .route("/ui/dead-letters", get(pages::dead_letters))
        .route(
            "/ui/dead-letters/{id}/retry",
            post(pages::retry_dead_letter),
        )
        .route(
            "/ui/dead-letters/{id}/delete",
            post(pages::delete_dead_letter),
        )
        .route("/ui/streams", get(pages::streams))
        .route("/ui/streams/{q}", get(pages::stream))
        .route(
            "/ui/streams/{q}/dlq/{id}/replay",
            post(pages::replay_stream_dead_letter),
        )
        .route("/ui/cron", get(pages::cron))
        .route("/ui/workers", get(pages::workers))
        .route("/ui/workflows", get(pages::workflows))
        .route("/ui/workflows/{id}", get(pages::workflow))
        .route_layer(guard)
        .layer(axum::middleware::from_fn(access::host_from_authority))
        .with_state(state)
}
