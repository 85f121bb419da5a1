//! The read-only gate: a read-only gateway serves reads and refuses every mutation.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::Response;

use super::{Operation, RequestId, StackState};
use crate::core::{CoreError, ErrorKind};

/// Refuses mutations while the gateway is read-only.
pub async fn gate(State(state): State<Arc<StackState>>, request: Request, next: Next) -> Response {
    if state.is_read_only()
        && let Some(op) = request.extensions().get::<Operation>()
        && !op.read_only
    {
        let id = request
            .extensions()
            .get::<RequestId>()
            .map(|r| r.0.clone())
            .unwrap_or_default();
        return state.reject(
            op.protocol,
            CoreError::new(
                ErrorKind::ReadOnly,
                format!(
                    "this gateway is read-only: {} is a mutation",
                    op.id.unwrap_or("the operation")
                ),
            ),
            &id,
        );
    }
    next.run(request).await
}
