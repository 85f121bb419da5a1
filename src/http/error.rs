//! Core errors as HTTP answers in the OJS error envelope.

use axum::response::{IntoResponse, Response};
use http::{HeaderValue, StatusCode};
use serde_json::json;

use super::api::types;
use crate::core::{CoreError, ErrorKind};

/// A core error on its way to an HTTP client.
#[derive(Debug)]
pub struct ApiError {
    /// The error.
    pub error: CoreError,
    /// The request it answers.
    pub request_id: Option<String>,
}

impl From<CoreError> for ApiError {
    fn from(error: CoreError) -> Self {
        ApiError {
            error,
            request_id: None,
        }
    }
}

impl ApiError {
    /// Stamps the request id into the envelope.
    pub fn with_request_id(mut self, request_id: &str) -> Self {
        self.request_id = Some(request_id.to_string());
        self
    }
}

/// The HTTP status of each error kind.
pub fn status_of(kind: ErrorKind) -> StatusCode {
    match kind {
        ErrorKind::InvalidRequest | ErrorKind::InvalidPayload => StatusCode::BAD_REQUEST,
        ErrorKind::ValidationError | ErrorKind::Unsupported => StatusCode::UNPROCESSABLE_ENTITY,
        ErrorKind::NotFound => StatusCode::NOT_FOUND,
        ErrorKind::Conflict | ErrorKind::Duplicate | ErrorKind::StaleLease => StatusCode::CONFLICT,
        ErrorKind::ReadOnly | ErrorKind::Forbidden => StatusCode::FORBIDDEN,
        ErrorKind::Unauthenticated => StatusCode::UNAUTHORIZED,
        ErrorKind::RateLimited | ErrorKind::QuotaExceeded => StatusCode::TOO_MANY_REQUESTS,
        ErrorKind::PayloadTooLarge | ErrorKind::BatchTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
        ErrorKind::BodyTimeout => StatusCode::REQUEST_TIMEOUT,
        ErrorKind::Backend => StatusCode::INTERNAL_SERVER_ERROR,
        ErrorKind::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
    }
}

fn hint_of(kind: ErrorKind) -> &'static str {
    match kind {
        ErrorKind::InvalidRequest => "Check the request fields against openapi/pgvs3.yaml.",
        ErrorKind::InvalidPayload => {
            "Send a JSON object with Content-Type application/openjobspec+json."
        }
        ErrorKind::ValidationError => "Correct the named field; the request was not applied.",
        ErrorKind::NotFound => {
            "Check the id or path; finished jobs are removed after their retention."
        }
        ErrorKind::Conflict => "Read the job's current state with GET /ojs/v1/jobs/{id}.",
        ErrorKind::Duplicate => "Read the stored job with GET /ojs/v1/jobs/{id} and compare it.",
        ErrorKind::StaleLease => {
            "Your lease ended and the job was claimed again; stop working on it."
        }
        ErrorKind::ReadOnly => "Send mutations to a writable gateway.",
        ErrorKind::Unauthenticated => {
            "Send a token: Authorization: Bearer <token> (gRPC: authorization metadata)."
        }
        ErrorKind::Forbidden => "Use a token with the named role and queue scope.",
        ErrorKind::RateLimited => "Retry after the Retry-After interval.",
        ErrorKind::QuotaExceeded => {
            "Free room (finish jobs, let events age out, drop queues) or raise the quota."
        }
        ErrorKind::PayloadTooLarge => "Send a smaller body, or split a batch.",
        ErrorKind::BodyTimeout => "Send the whole body at once, right after the headers.",
        ErrorKind::BatchTooLarge => {
            "Receive again with a larger max (or max_bytes); the cursor did not move."
        }
        ErrorKind::Unsupported => "Use OJS-Version 1.0.",
        ErrorKind::Backend | ErrorKind::Unavailable => "Retry later; the database is failing.",
    }
}

/// The OJS error object (`ErrorBody`) of a core error: the envelope's `error`, and the per-item
/// error of a batch answer.
pub fn error_body(error: &CoreError, request_id: Option<&str>) -> types::ErrorBody {
    let kind = error.kind;
    let error_type = match kind {
        ErrorKind::InvalidRequest | ErrorKind::InvalidPayload | ErrorKind::ValidationError => {
            "validation_error"
        }
        other => other.code(),
    };
    types::ErrorBody {
        code: kind.code().to_string(),
        message: error.message.clone(),
        retryable: kind.retryable(),
        r#type: Some(error_type.to_string()),
        hint: Some(hint_of(kind).to_string()),
        docs_url: Some(format!(
            "https://openjobspec.org/spec/errors#{}",
            kind.code()
        )),
        details: error.details.clone(),
        request_id: request_id.map(str::to_string),
    }
}

impl ApiError {
    /// The OJS error envelope (`{"error": ...}`) the HTTP answer of this error carries.
    pub fn envelope(&self) -> serde_json::Value {
        json!({ "error": error_body(&self.error, self.request_id.as_deref()) })
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let kind = self.error.kind;
        let body = types::ErrorEnvelope {
            error: error_body(&self.error, self.request_id.as_deref()),
        };
        let mut response = super::ojs_json(status_of(kind), &body);
        if let Some(secs) = kind.retry_after_secs() {
            response
                .headers_mut()
                .insert(http::header::RETRY_AFTER, HeaderValue::from(secs));
        }
        response
    }
}
