//! Authentication and roles for both protocols: the bearer token (HTTP `Authorization: Bearer`,
//! gRPC `authorization` metadata, the same HTTP/2 header) must name a live token holding the
//! role the operation declares (`x-role`, `(pgvs3.v1.role)`). The token's queue scope is
//! checked where the request's queues are known: `queue_admission` for HTTP, `admit_queues` in
//! the gRPC adapters. The token itself is never logged or echoed.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::Response;

use super::{Operation, RequestId, StackState};
use crate::core::access::token_hash;
use crate::core::{CoreError, ErrorKind, Role};
use crate::store::tokens::TokenCache;

/// Token checking of one server.
pub struct Auth {
    /// Live tokens, cached per gateway.
    pub tokens: TokenCache,
    /// `getMetrics` (`/metrics`) without a token (else it needs its declared `reader`).
    pub metrics_open: bool,
}

/// The operationId of `GET /metrics`.
const METRICS_OPERATION: &str = "getMetrics";

/// The bearer token of a request's headers, if it sent one.
pub fn bearer(headers: &http::HeaderMap) -> Option<&str> {
    let value = headers.get(http::header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.trim().split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| token.trim())
        .filter(|t| !t.is_empty())
}

/// Refuses requests without a live token holding the operation's role; stores the grant for
/// the queue-scope checks after it.
pub async fn authorize(
    State(state): State<Arc<StackState>>,
    mut request: Request,
    next: Next,
) -> Response {
    let Some(auth) = &state.auth else {
        return next.run(request).await;
    };
    let Some(op) = request.extensions().get::<Operation>().copied() else {
        return next.run(request).await;
    };
    // `--metrics-open` lets scrapers in without a token.
    let role = if op.id == Some(METRICS_OPERATION) && auth.metrics_open {
        Role::Public
    } else {
        op.role
    };
    if role == Role::Public {
        return next.run(request).await;
    }
    let operation = op.id.unwrap_or("the operation");
    let checked = match bearer(request.headers()) {
        None => Err(CoreError::new(
            ErrorKind::Unauthenticated,
            format!("{operation} needs a token with role {}", role.name()),
        )),
        Some(token) => match auth.tokens.grant(&token_hash(token)).await {
            Err(error) => Err(error),
            Ok(None) => Err(CoreError::new(
                ErrorKind::Unauthenticated,
                "the token is unknown or revoked",
            )),
            Ok(Some(grant)) => grant.require_role(role, operation).map(|()| grant),
        },
    };
    match checked {
        Ok(grant) => {
            request.extensions_mut().insert(grant);
            // Long-lived streams ask again with it, so a revocation ends them too.
            let check = bearer(request.headers()).map(|t| auth.tokens.check(&token_hash(t)));
            if let Some(check) = check {
                request.extensions_mut().insert(check);
            }
            next.run(request).await
        }
        Err(error) => {
            let id = request
                .extensions()
                .get::<RequestId>()
                .map(|r| r.0.clone())
                .unwrap_or_default();
            state.reject(op.protocol, error, &id)
        }
    }
}
