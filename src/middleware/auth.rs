//! Authentication and roles for both protocols: the bearer token (HTTP `Authorization: Bearer`,
//! gRPC `authorization` metadata, the same HTTP/2 header) must name a live token holding the
//! role the route's operation declares (`x-role`, `(pgvs3.v1.role)`). The token's queue scope is
//! checked where the request's queues are known (`QueueAdmission`, `Scope`). The token itself is
//! never logged or echoed.

use super::Operation;
use crate::core::access::token_hash;
use crate::core::{CoreError, ErrorKind, Grant, Role};
use crate::store::tokens::{TokenCache, TokenCheck};

/// Token checking of one server.
pub struct Auth {
    /// Live tokens, cached per gateway.
    pub tokens: TokenCache,
    /// `getMetrics` (`/metrics`) without a token (else it needs its declared `reader`).
    pub metrics_open: bool,
}

/// The operationId of `GET /metrics`.
const METRICS_OPERATION: &str = "getMetrics";

/// The bearer token of a request's headers, if it sent exactly one `Authorization` header (two
/// are ambiguous: neither counts).
pub fn bearer(headers: &http::HeaderMap) -> Option<&str> {
    let mut values = headers.get_all(http::header::AUTHORIZATION).iter();
    let value = values.next()?.to_str().ok()?;
    if values.next().is_some() {
        return None;
    }
    let (scheme, token) = value.trim().split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| token.trim())
        .filter(|t| !t.is_empty())
}

impl Auth {
    /// The grant of a request for `op`: `None` for a public operation, else the live token's
    /// grant holding the operation's role, with the check long-lived streams repeat so that a
    /// revocation ends them too; or the refusal.
    pub async fn authenticate(
        &self,
        op: Operation,
        headers: &http::HeaderMap,
    ) -> Result<Option<(Grant, TokenCheck)>, CoreError> {
        // `--metrics-open` lets scrapers in without a token.
        let role = if op.id == METRICS_OPERATION && self.metrics_open {
            Role::Public
        } else {
            op.role
        };
        if role == Role::Public {
            return Ok(None);
        }
        let Some(token) = bearer(headers) else {
            return Err(CoreError::new(
                ErrorKind::Unauthenticated,
                format!("{} needs a token with role {}", op.id, role.name()),
            ));
        };
        let hash = token_hash(token);
        match self.tokens.grant(&hash).await? {
            None => Err(CoreError::new(
                ErrorKind::Unauthenticated,
                "the token is unknown or revoked",
            )),
            Some(grant) => grant
                .require_role(role, op.id)
                .map(|()| Some((grant, self.tokens.check(&hash)))),
        }
    }
}
