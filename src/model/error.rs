//! The one error type of the core, with the OJS code each protocol reports.

use serde_json::{Map, Value};

/// What went wrong, in OJS terms; each adapter maps it to its own status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// Malformed request, missing or badly formatted field.
    InvalidRequest,
    /// Body that is not valid JSON.
    InvalidPayload,
    /// A field that parses but is out of its allowed range or combination.
    ValidationError,
    /// Unknown job, queue or route.
    NotFound,
    /// A state transition the job's state does not allow.
    Conflict,
    /// A caller id that names a stored job.
    Duplicate,
    /// A lease token that is not the job's current lease.
    StaleLease,
    /// A mutation sent to a read-only gateway.
    ReadOnly,
    /// No valid token (missing, unknown or revoked) where one is needed.
    Unauthenticated,
    /// A valid token without the role or queue scope the operation needs.
    Forbidden,
    /// An admission limit was reached.
    RateLimited,
    /// A namespace quota (queues, jobs, stream events) was reached; retry after freeing room.
    QuotaExceeded,
    /// The request body exceeds the configured limit.
    PayloadTooLarge,
    /// The request body did not arrive in time.
    BodyTimeout,
    /// The next stream batch holds more events than the receive's `max`.
    BatchTooLarge,
    /// An OJS version or feature this server does not support.
    Unsupported,
    /// The database or the server failed.
    Backend,
    /// The database cannot be reached.
    Unavailable,
}

impl ErrorKind {
    /// The lowercase OJS error code.
    pub fn code(self) -> &'static str {
        match self {
            ErrorKind::InvalidRequest | ErrorKind::PayloadTooLarge | ErrorKind::BodyTimeout => {
                "invalid_request"
            }
            ErrorKind::BatchTooLarge => "batch_too_large",
            ErrorKind::InvalidPayload => "invalid_payload",
            ErrorKind::ValidationError => "validation_error",
            ErrorKind::NotFound => "not_found",
            ErrorKind::Conflict => "conflict",
            ErrorKind::Duplicate => "duplicate",
            ErrorKind::StaleLease => "stale_lease",
            ErrorKind::ReadOnly => "read_only",
            ErrorKind::Unauthenticated => "unauthenticated",
            ErrorKind::Forbidden => "forbidden",
            ErrorKind::RateLimited => "rate_limited",
            ErrorKind::QuotaExceeded => "quota_exceeded",
            ErrorKind::Unsupported => "unsupported",
            ErrorKind::Backend => "backend_error",
            ErrorKind::Unavailable => "backend_unavailable",
        }
    }

    /// Whether the same request may succeed later.
    pub fn retryable(self) -> bool {
        matches!(
            self,
            ErrorKind::RateLimited
                | ErrorKind::QuotaExceeded
                | ErrorKind::Backend
                | ErrorKind::Unavailable
        )
    }

    /// How many seconds a client should wait before trying again, where the protocol says so
    /// (`Retry-After` over HTTP, `retry-after` metadata over gRPC).
    pub fn retry_after_secs(self) -> Option<u32> {
        // The database is away (a restart, a failover): a second is about when to look again.
        matches!(self, ErrorKind::RateLimited | ErrorKind::Unavailable).then_some(1)
    }
}

/// An error with its kind, a message for people and optional structured details.
#[derive(Debug, Clone, PartialEq)]
pub struct CoreError {
    /// The kind, which fixes the code and status.
    pub kind: ErrorKind,
    /// A sentence saying what is wrong.
    pub message: String,
    /// Structured details (e.g. `resource_type`, `resource_id`).
    pub details: Option<Map<String, Value>>,
}

impl CoreError {
    /// A new error without details.
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        CoreError {
            kind,
            message: message.into(),
            details: None,
        }
    }

    /// Malformed or missing request field.
    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::InvalidRequest, message)
    }

    /// A field out of its allowed range; `field` is named in the details.
    pub fn validation(field: &str, message: impl Into<String>) -> Self {
        Self::new(ErrorKind::ValidationError, message).with_detail("field", field.into())
    }

    /// An unknown resource.
    pub fn not_found(resource_type: &str, resource_id: &str) -> Self {
        Self::new(
            ErrorKind::NotFound,
            format!("{resource_type} {resource_id} not found"),
        )
        .with_detail("resource_type", resource_type.into())
        .with_detail("resource_id", resource_id.into())
    }

    /// Adds one detail.
    pub fn with_detail(mut self, key: &str, value: Value) -> Self {
        self.details
            .get_or_insert_with(Map::new)
            .insert(key.to_string(), value);
        self
    }
}

impl std::fmt::Display for CoreError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.kind.code(), self.message)
    }
}

impl std::error::Error for CoreError {}
