//! Core errors as gRPC statuses with a `google.rpc.ErrorInfo` detail (domain `openjobspec.org`).

use std::collections::HashMap;

use tonic::{Code, Status};
use tonic_types::{ErrorDetails, StatusExt};

use crate::core::{CoreError, ErrorKind};

/// The gRPC code of each error kind.
pub fn code_of(kind: ErrorKind) -> Code {
    match kind {
        ErrorKind::InvalidRequest | ErrorKind::InvalidPayload | ErrorKind::ValidationError => {
            Code::InvalidArgument
        }
        ErrorKind::NotFound => Code::NotFound,
        ErrorKind::Duplicate => Code::AlreadyExists,
        ErrorKind::Conflict | ErrorKind::StaleLease | ErrorKind::Unsupported => {
            Code::FailedPrecondition
        }
        ErrorKind::ReadOnly | ErrorKind::Forbidden => Code::PermissionDenied,
        ErrorKind::Unauthenticated => Code::Unauthenticated,
        ErrorKind::RateLimited | ErrorKind::QuotaExceeded | ErrorKind::PayloadTooLarge => {
            Code::ResourceExhausted
        }
        ErrorKind::BatchTooLarge => Code::OutOfRange,
        ErrorKind::BodyTimeout => Code::DeadlineExceeded,
        ErrorKind::Backend => Code::Internal,
        ErrorKind::Unavailable => Code::Unavailable,
    }
}

/// A status carrying the OJS code as the ErrorInfo reason, with `retryable` and `request_id`.
pub fn status_of(error: &CoreError, request_id: &str) -> Status {
    let mut metadata = HashMap::new();
    metadata.insert("retryable".to_string(), error.kind.retryable().to_string());
    metadata.insert("request_id".to_string(), request_id.to_string());
    if let Some(details) = &error.details {
        for (k, v) in details {
            let text = v.as_str().map_or_else(|| v.to_string(), str::to_string);
            metadata.insert(k.clone(), text);
        }
    }
    let mut status = Status::with_error_details(
        code_of(error.kind),
        error.message.clone(),
        ErrorDetails::with_error_info(error.kind.code(), "openjobspec.org", metadata),
    );
    if let Ok(value) = request_id.parse() {
        status.metadata_mut().insert("x-ojs-request-id", value);
    }
    if let Some(secs) = error.kind.retry_after_secs() {
        status
            .metadata_mut()
            .insert("retry-after", tonic::metadata::MetadataValue::from(secs));
    }
    status
}
