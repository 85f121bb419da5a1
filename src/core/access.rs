//! Who may do what: the role each operation declares (OpenAPI `x-role`, proto
//! `(pgvs3.v1.role)`) and the grant a token carries (roles, optional queue-name patterns).

use chrono::{DateTime, Utc};
use rand::RngCore as _;
use sha2::{Digest as _, Sha256};

use super::{CoreError, ErrorKind, Service};
pub use crate::model::access::{Grant, Role, Scope};
use crate::store::tokens::TokenRecord;

/// Every token starts with this, so leaked ones are easy to spot and scan for.
pub const TOKEN_PREFIX: &str = "pgvs3_";

/// `validation_error` unless `name` is 1-100 letters, digits, '-', '_' and '.'.
fn check_token_name(name: &str) -> Result<(), CoreError> {
    let ok = !name.is_empty()
        && name.len() <= 100
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b));
    if ok {
        Ok(())
    } else {
        Err(CoreError::validation(
            "name",
            "a token name is 1-100 characters of letters, digits, '-', '_' and '.'",
        ))
    }
}

/// Checks the roles and queue patterns of a token about to be created.
pub fn validate_grant(name: &str, roles: &[String], queues: &[String]) -> Result<Grant, CoreError> {
    check_token_name(name)?;
    if roles.is_empty() {
        return Err(CoreError::validation(
            "roles",
            "a token needs at least one role",
        ));
    }
    let mut parsed = Vec::new();
    for role in roles {
        let role = Role::grantable(role).ok_or_else(|| {
            CoreError::validation(
                "roles",
                format!("unknown role {role:?}: one of reader, producer, worker, admin"),
            )
        })?;
        if !parsed.contains(&role) {
            parsed.push(role);
        }
    }
    parsed.sort();
    for pattern in queues {
        let ok = !pattern.is_empty()
            && pattern.len() <= 200
            && pattern
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b".-*".contains(&b));
        if !ok {
            return Err(CoreError::validation(
                "queues",
                format!(
                    "queue pattern {pattern:?}: queue-name characters and '*' (any run of characters)"
                ),
            ));
        }
    }
    Ok(Grant {
        name: name.to_string(),
        roles: parsed,
        queues: queues.to_vec(),
    })
}

/// `forbidden` unless `caller` (none: auth off) may hand out `grant`: every role of it the
/// caller holds (admin holds all), and its queue scope within the caller's.
pub fn require_within(caller: Option<&Grant>, grant: &Grant) -> Result<(), CoreError> {
    let Some(caller) = caller else {
        return Ok(());
    };
    if let Some(role) = grant.roles.iter().find(|r| !caller.has_role(**r)) {
        return Err(CoreError::new(
            ErrorKind::Forbidden,
            format!(
                "token {} lacks role {}, so it cannot create a token holding it",
                caller.name,
                role.name()
            ),
        )
        .with_detail("required_role", role.name().into()));
    }
    if !Scope::of(Some(caller)).contains(&Scope::of(Some(grant))) {
        return Err(CoreError::new(
            ErrorKind::Forbidden,
            format!(
                "token {} may only create tokens scoped within its own queues ({})",
                caller.name,
                caller.queues.join(", ")
            ),
        ));
    }
    Ok(())
}

/// A new random token (256 bits).
pub fn mint_token() -> String {
    let mut bytes = [0u8; 32];
    rand::rng().fill_bytes(&mut bytes);
    let mut token = String::with_capacity(TOKEN_PREFIX.len() + 64);
    token.push_str(TOKEN_PREFIX);
    for byte in bytes {
        token.push_str(&format!("{byte:02x}"));
    }
    token
}

/// What is stored of a token: its SHA-256 (tokens are random, so a plain hash is enough).
pub fn token_hash(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}

/// A token just created: the only time the token itself is seen.
#[derive(Debug, Clone)]
pub struct CreatedToken {
    /// The token to hand to the client.
    pub token: String,
    /// Its name, roles and queue patterns.
    pub grant: Grant,
    /// When it was created.
    pub created_at: DateTime<Utc>,
}

impl Service {
    /// Creates a token with `roles` limited to `queues` (none: every queue), named `name` or a
    /// generated name; `caller` (the request's grant, none with auth off) must hold every role
    /// and cover every queue of it.
    pub async fn create_token(
        &self,
        caller: Option<&Grant>,
        name: Option<&str>,
        roles: &[String],
        queues: &[String],
    ) -> Result<CreatedToken, CoreError> {
        let generated;
        let name = match name {
            Some(name) => name,
            None => {
                generated = format!("token-{}", &uuid::Uuid::new_v4().simple().to_string()[..12]);
                &generated
            }
        };
        let grant = validate_grant(name, roles, queues)?;
        require_within(caller, &grant)?;
        let token = mint_token();
        let created_at = self.store.create_token(&grant, &token_hash(&token)).await?;
        Ok(CreatedToken {
            token,
            grant,
            created_at,
        })
    }

    /// Revokes the live token `name`; `not_found` when there is none, or when its scope is not
    /// within `scope` (the caller's).
    pub async fn revoke_token(&self, scope: &Scope, name: &str) -> Result<(), CoreError> {
        check_token_name(name)?;
        if !scope.is_all()
            && !self
                .list_tokens(scope)
                .await?
                .iter()
                .any(|t| t.grant.name == name)
        {
            return Err(CoreError::not_found("token", name));
        }
        if self.store.revoke_token(name).await? {
            Ok(())
        } else {
            Err(CoreError::not_found("token", name))
        }
    }

    /// Every token (live and revoked) whose scope lies within `scope` (the caller's), never the
    /// tokens themselves. Nesting is no SQL pattern match, and tokens are few: filtered here.
    pub async fn list_tokens(&self, scope: &Scope) -> Result<Vec<TokenRecord>, CoreError> {
        let mut tokens = self.store.list_tokens().await?;
        tokens.retain(|t| scope.contains(&Scope::of(Some(&t.grant))));
        Ok(tokens)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grants_are_validated() {
        let ok = validate_grant("w1", &["worker".into(), "reader".into()], &["a.*".into()]);
        assert_eq!(ok.expect("valid").roles, [Role::Reader, Role::Worker]);
        assert!(validate_grant("w", &[], &[]).is_err());
        assert!(validate_grant("w", &["public".into()], &[]).is_err());
        assert!(validate_grant("w", &["root".into()], &[]).is_err());
        assert!(validate_grant("", &["admin".into()], &[]).is_err());
        assert!(validate_grant("w", &["admin".into()], &["a b".into()]).is_err());
    }

    #[test]
    fn tokens_are_created_only_within_the_callers_roles_and_scope() {
        let grant = |roles: &[Role], queues: &[&str]| Grant {
            name: "t".into(),
            roles: roles.to_vec(),
            queues: queues.iter().map(|q| q.to_string()).collect(),
        };
        let billing_admin = grant(&[Role::Admin], &["billing.*"]);
        let within = |caller: &Grant, wanted: &Grant| require_within(Some(caller), wanted);
        assert!(within(&billing_admin, &grant(&[Role::Admin], &["billing.eu.*"])).is_ok());
        for wider in [&[][..], &["billing*"], &["*"], &["billing.eu.*", "mail"]] {
            let refused = within(&billing_admin, &grant(&[Role::Reader], wider)).unwrap_err();
            assert_eq!(refused.kind, ErrorKind::Forbidden, "{wider:?}");
        }
        let reader = grant(&[Role::Reader, Role::Worker], &[]);
        assert!(within(&reader, &grant(&[Role::Worker], &["a"])).is_ok());
        let refused = within(&reader, &grant(&[Role::Producer], &[])).unwrap_err();
        assert_eq!(refused.kind, ErrorKind::Forbidden);
        assert!(refused.message.contains("producer"));
        assert!(require_within(None, &grant(&[Role::Admin], &[])).is_ok());
    }
}
