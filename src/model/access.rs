//! Who may do what, as data: the role each operation declares and the grant a token carries
//! (roles, optional queue-name patterns).

use serde::{Deserialize, Serialize};

use super::error::{CoreError, ErrorKind};

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
        Scope::of(Some(self)).require_named(queues)
    }
}

/// The queues a request may see and act on: every queue, or those a token's patterns match.
/// Derived from the request's grant once; everything that learns a job's, workflow's or dead
/// letter's queue checks it here, and lists pass its SQL form to the store.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Scope {
    /// `None` is every queue (no token, or an unscoped one).
    patterns: Option<Vec<String>>,
}

impl Scope {
    /// Every queue.
    pub fn all() -> Self {
        Scope { patterns: None }
    }

    /// The scope of a request's grant (`None`: auth off or a public operation: every queue).
    pub fn of(grant: Option<&Grant>) -> Self {
        match grant {
            Some(grant) if !grant.queues.is_empty() => Scope {
                patterns: Some(grant.queues.clone()),
            },
            _ => Scope::all(),
        }
    }

    /// Whether every queue is in scope.
    pub fn is_all(&self) -> bool {
        self.patterns.is_none()
    }

    /// Whether `queue` is in scope.
    pub fn covers(&self, queue: &str) -> bool {
        match &self.patterns {
            None => true,
            Some(patterns) => patterns.iter().any(|p| pattern_matches(p, queue)),
        }
    }

    /// The token's own patterns (`None`: every queue).
    pub fn patterns(&self) -> Option<&[String]> {
        self.patterns.as_deref()
    }

    /// The scope as SQL `LIKE` patterns (`*` → `%`, `\`, `%` and `_` escaped), for
    /// `queue LIKE ANY($n)`; `None` is every queue (pass SQL NULL).
    pub fn like_patterns(&self) -> Option<Vec<String>> {
        self.patterns.as_ref().map(|patterns| {
            patterns
                .iter()
                .map(|p| {
                    let mut like = String::with_capacity(p.len() + 2);
                    for c in p.chars() {
                        match c {
                            '*' => like.push('%'),
                            '\\' | '%' | '_' => {
                                like.push('\\');
                                like.push(c);
                            }
                            c => like.push(c),
                        }
                    }
                    like
                })
                .collect()
        })
    }

    /// `not_found` for `what` `id` unless its `queue` is in scope: an id of another queue must
    /// not reveal that it exists.
    pub fn require_visible(&self, queue: &str, what: &str, id: &str) -> Result<(), CoreError> {
        if self.covers(queue) {
            Ok(())
        } else {
            Err(CoreError::not_found(what, id))
        }
    }

    /// `forbidden` naming the first of `queues` outside the scope: a filter that names queues
    /// (a list's `queue`, an event stream's `queues`) needs each in scope, as an operation
    /// naming them does.
    pub fn require_named<'a>(
        &self,
        queues: impl IntoIterator<Item = &'a str>,
    ) -> Result<(), CoreError> {
        match queues.into_iter().find(|q| !self.covers(q)) {
            None => Ok(()),
            Some(queue) => Err(CoreError::new(
                ErrorKind::Forbidden,
                format!("the token is not scoped to queue {queue}"),
            )
            .with_detail("queue", queue.into())),
        }
    }

    /// `forbidden` unless the scope covers every queue: `what` acts on all of them at once (a
    /// token scoped to some queues may not stop delivery of the others).
    pub fn require_all(&self, what: &str) -> Result<(), CoreError> {
        if self.is_all() {
            Ok(())
        } else {
            Err(CoreError::new(
                ErrorKind::Forbidden,
                format!("{what} acts on every queue: it needs a token scoped to all queues"),
            ))
        }
    }

    /// Whether a grant's scope lies within this one (every pattern of it matches only queues this
    /// scope covers): a token may only create tokens within its own scope.
    pub fn contains(&self, other: &Scope) -> bool {
        match (&self.patterns, &other.patterns) {
            (None, _) => true,
            (Some(_), None) => false,
            (Some(mine), Some(theirs)) => theirs
                .iter()
                .all(|t| mine.iter().any(|m| pattern_within(t, m))),
        }
    }
}

/// Whether every name `inner` matches is matched by `outer` (sound, not complete: `inner` is
/// taken as text where its `*` must meet a `*` of `outer`).
fn pattern_within(inner: &str, outer: &str) -> bool {
    // Treat inner's '*' as a character only outer's '*' may absorb: replace it by a byte no queue
    // name holds, then match; a literal in outer never equals it.
    let marked = inner.replace('*', "\u{1}");
    pattern_matches(outer, &marked)
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
    fn scopes_cover_their_patterns_and_nest() {
        let scoped = Scope::of(Some(&grant(&[Role::Admin], &["billing.*"])));
        assert!(scoped.covers("billing.a") && !scoped.covers("mail"));
        assert!(Scope::of(Some(&grant(&[Role::Admin], &[]))).is_all());
        assert!(Scope::of(None).is_all());
        assert_eq!(
            Scope::of(Some(&grant(&[Role::Reader], &["a_b*", "c%"]))).like_patterns(),
            Some(vec!["a\\_b%".to_string(), "c\\%".to_string()])
        );
        let within = |outer: &[&str], inner: &[&str]| {
            Scope::of(Some(&grant(&[Role::Admin], outer)))
                .contains(&Scope::of(Some(&grant(&[Role::Admin], inner))))
        };
        assert!(within(&["billing.*"], &["billing.eu.*", "billing.x"]));
        assert!(!within(&["billing.*"], &["billing*"]));
        assert!(!within(&["billing.*"], &["*"]));
        assert!(
            !within(&["billing.*"], &[]),
            "unscoped is wider than any scope"
        );
        assert!(Scope::all().contains(&Scope::of(Some(&grant(&[Role::Admin], &["x"])))));
        assert!(within(&["*"], &["anything.*"]));
        let err = scoped.require_visible("mail", "job", "j1").unwrap_err();
        assert_eq!(err.kind, ErrorKind::NotFound);
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
}
