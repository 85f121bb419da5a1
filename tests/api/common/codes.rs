//! The OJS error code of an answer, as each protocol carries it.

use serde_json::Value;

/// The OJS code of an HTTP error body (`?` when it has none).
pub fn error_code(body: &Value) -> &str {
    body["error"]["code"].as_str().unwrap_or("?")
}

/// The OJS code of a gRPC error (the ErrorInfo reason).
pub fn grpc_code(status: &tonic::Status) -> String {
    use tonic_types::StatusExt;
    status
        .get_details_error_info()
        .map(|info| info.reason)
        .unwrap_or_else(|| format!("grpc:{:?}", status.code()))
}
