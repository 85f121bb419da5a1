//! Who may do what: the role each operation declares (OpenAPI `x-role`, proto
//! `(pgvs3.v1.role)`) and the grant a token carries (roles, optional queue-name patterns).

use chrono::{DateTime, Utc};
use rand::RngCore as _;
use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};

use super::{CoreError, ErrorKind, Service};
use crate::store::tokens::TokenRecord;

/// Every token starts with this, so leaked ones are easy to spot and scan for.
pub const TOKEN_PREFIX: &str = "pgvs3_";

/// The role an operation needs; a token holds one or more of the grantable ones.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// No token needed (manifest, health).
    Public,
    /// Every read: jobs, stats, events, dead-letter lists, stream info and configuration.
    Reader,
    /// Enqueue, batch enqueue, append, workflows, cron registration, cancellation.
    Producer,
    /// Fetch, ack, nack, heartbeat, receive, subscribe, stream ack/nack, push streams.
    Worker,
    /// Everything.
    Admin,
}

impl Role {
    /// The roles a token may hold.
    pub const GRANTABLE: [Role; 4] = [Role::Reader, Role::Producer, Role::Worker, Role::Admin];

    /// The role's name as written in the schemas, the CLI and the API.
    pub fn name(self) -> &'static str {
        match self {
            Role::Public => "public",
            Role::Reader => "reader",
            Role::Producer => "producer",
            Role::Worker => "worker",
            Role::Admin => "admin",
        }
    }

    /// A grantable role by name.
    pub fn grantable(name: &str) -> Option<Role> {
        Role::GRANTABLE.into_iter().find(|r| r.name() == name)
    }
}

/// What one token may do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    /// The token's name (never the token itself).
    pub name: String,
    /// Its roles.
    pub roles: Vec<Role>,
    /// Queue-name patterns (`*` matches any run of characters); empty means every queue.
    pub queues: Vec<String>,
}

impl Grant {
    /// Whether the grant includes `role` (admin includes every role).
    pub fn has_role(&self, role: Role) -> bool {
        role == Role::Public || self.roles.contains(&Role::Admin) || self.roles.contains(&role)
    }

    /// Whether the grant's queue scope includes `queue`.
    pub fn covers(&self, queue: &str) -> bool {
        self.queues.is_empty() || self.queues.iter().any(|p| pattern_matches(p, queue))
    }

    /// `forbidden` unless the grant has `role`, naming the role and the operation.
    pub fn require_role(&self, role: Role, operation: &str) -> Result<(), CoreError> {
        if self.has_role(role) {
            return Ok(());
        }
        Err(CoreError::new(
            ErrorKind::Forbidden,
            format!(
                "token {} lacks role {} needed by {operation}",
                self.name,
                role.name()
            ),
        )
        .with_detail("required_role", role.name().into()))
    }

    /// `forbidden` naming the first of `queues` outside the grant's scope.
    pub fn require_queues<'a>(
        &self,
        queues: impl IntoIterator<Item = &'a str>,
    ) -> Result<(), CoreError> {
        match queues.into_iter().find(|q| !self.covers(q)) {
            None => Ok(()),
            Some(queue) => Err(CoreError::new(
                ErrorKind::Forbidden,
                format!("token {} is not scoped to queue {queue}", self.name),
            )
            .with_detail("queue", queue.into())),
        }
    }
}

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
    /// generated name.
    pub async fn create_token(
        &self,
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
        let token = mint_token();
        let created_at = self.store.create_token(&grant, &token_hash(&token)).await?;
        Ok(CreatedToken {
            token,
            grant,
            created_at,
        })
    }

    /// Revokes the live token `name`; `not_found` when there is none.
    pub async fn revoke_token(&self, name: &str) -> Result<(), CoreError> {
        check_token_name(name)?;
        if self.store.revoke_token(name).await? {
            Ok(())
        } else {
            Err(CoreError::not_found("token", name))
        }
    }

    /// Every token (live and revoked), never the tokens themselves.
    pub async fn list_tokens(&self) -> Result<Vec<TokenRecord>, CoreError> {
        self.store.list_tokens().await
    }
}

/// Whether `name` matches `pattern`, where `*` stands for any run of characters.
fn pattern_matches(pattern: &str, name: &str) -> bool {
    let mut parts = pattern.split('*');
    let first = parts.next().unwrap_or("");
    let Some(mut rest) = name.strip_prefix(first) else {
        return false;
    };
    let tail: Vec<&str> = parts.collect();
    let Some((last, middle)) = tail.split_last() else {
        return rest.is_empty();
    };
    for part in middle {
        match rest.find(part) {
            Some(at) => rest = &rest[at + part.len()..],
            None => return false,
        }
    }
    rest.len() >= last.len() && rest.ends_with(last)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grant(roles: &[Role], queues: &[&str]) -> Grant {
        Grant {
            name: "t".into(),
            roles: roles.to_vec(),
            queues: queues.iter().map(|q| q.to_string()).collect(),
        }
    }

    #[test]
    fn patterns_match_runs_of_characters() {
        assert!(pattern_matches("billing.*", "billing.invoices"));
        assert!(pattern_matches("billing.*", "billing."));
        assert!(!pattern_matches("billing.*", "billing"));
        assert!(!pattern_matches("billing.*", "xbilling.a"));
        assert!(pattern_matches("*", "anything"));
        assert!(pattern_matches("a*b*c", "a-b-b-c"));
        assert!(!pattern_matches("a*b*c", "a-c"));
        assert!(pattern_matches("mail", "mail"));
        assert!(!pattern_matches("mail", "mail2"));
        assert!(!pattern_matches("a*a", "a"));
    }

    #[test]
    fn admin_has_every_role_and_scope_limits_queues() {
        let admin = grant(&[Role::Admin], &[]);
        assert!(Role::GRANTABLE.iter().all(|r| admin.has_role(*r)));
        let worker = grant(&[Role::Worker], &["billing.*"]);
        assert!(worker.has_role(Role::Worker) && worker.has_role(Role::Public));
        assert!(!worker.has_role(Role::Reader));
        assert!(worker.require_queues(["billing.a", "billing.b"]).is_ok());
        let denied = worker.require_queues(["billing.a", "mail"]).unwrap_err();
        assert_eq!(denied.kind, ErrorKind::Forbidden);
        assert!(denied.message.contains("mail"));
        let role = worker.require_role(Role::Admin, "dropQueue").unwrap_err();
        assert!(role.message.contains("admin") && role.message.contains("dropQueue"));
    }

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
}
