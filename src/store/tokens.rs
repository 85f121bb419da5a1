//! API tokens in `s3p.tokens` (only their SHA-256 stored) and each gateway's cache of them,
//! invalidated whenever `s3p_tokens` is notified, so a revoked token is refused at once
//! everywhere, and its open streams end (`TokenCheck`).

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use sqlx::postgres::{PgListener, PgPool};
use tokio::sync::Semaphore;
use tokio::task::JoinHandle;

use super::{Store, map_db_error};
use crate::model::access::{Grant, Role};
use crate::model::error::{CoreError, ErrorKind};

/// The channel `s3p.token_create` and `s3p.token_revoke` notify.
const TOKENS_CHANNEL: &str = "s3p_tokens";
/// How long a cached answer lives while the listener is connected (a backstop only).
const CACHE_TTL: Duration = Duration::from_secs(60);
/// How long it lives without a listener (a standby, or while reconnecting).
const CACHE_TTL_UNLISTENED: Duration = Duration::from_millis(500);
/// Grants of live tokens kept; beyond it the least recently used one goes.
const GRANT_CAPACITY: usize = 10_000;
/// Hashes no live token has kept (so a client repeating a bad token costs no lookups); beyond
/// it the oldest goes.
const UNKNOWN_CAPACITY: usize = 4_096;

/// One stored token as listed (never the token itself).
#[derive(Debug, Clone, PartialEq)]
pub struct TokenRecord {
    /// Its name, roles and queue patterns.
    pub grant: Grant,
    /// When it was created.
    pub created_at: DateTime<Utc>,
    /// When it was revoked, if it was.
    pub revoked_at: Option<DateTime<Utc>>,
}

fn roles_of(names: Vec<String>) -> Vec<Role> {
    names.iter().filter_map(|n| Role::grantable(n)).collect()
}

impl Store {
    /// `s3p.token_create`: stores the hash of a new token; conflict when the name is live.
    pub async fn create_token(
        &self,
        grant: &Grant,
        hash: &[u8; 32],
    ) -> Result<DateTime<Utc>, CoreError> {
        let roles: Vec<&str> = grant.roles.iter().map(|r| r.name()).collect();
        sqlx::query_scalar("SELECT s3p.token_create($1, $2, $3, $4)")
            .bind(&grant.name)
            .bind(hash.as_slice())
            .bind(roles)
            .bind(&grant.queues)
            .fetch_one(self.hot())
            .await
            .map_err(map_db_error)
    }

    /// `s3p.token_revoke`: whether a live token of that name was revoked. This gateway's cache
    /// forgets it at once; the others when the NOTIFY reaches them.
    pub async fn revoke_token(&self, name: &str) -> Result<bool, CoreError> {
        let revoked = sqlx::query_scalar("SELECT s3p.token_revoke($1)")
            .bind(name)
            .fetch_one(self.hot())
            .await
            .map_err(map_db_error)?;
        if revoked && let Some(cache) = self.token_cache.get() {
            cache.state().forget(name);
        }
        Ok(revoked)
    }

    /// Every token, live and revoked, by name.
    pub async fn list_tokens(&self) -> Result<Vec<TokenRecord>, CoreError> {
        type Row = (
            String,
            Vec<String>,
            Vec<String>,
            DateTime<Utc>,
            Option<DateTime<Utc>>,
        );
        let rows: Vec<Row> = sqlx::query_as(
            "SELECT name, roles, queues, created_at, revoked_at FROM s3p.tokens ORDER BY name",
        )
        .fetch_all(self.hot())
        .await
        .map_err(map_db_error)?;
        Ok(rows
            .into_iter()
            .map(
                |(name, roles, queues, created_at, revoked_at)| TokenRecord {
                    grant: Grant {
                        name,
                        roles: roles_of(roles),
                        queues,
                    },
                    created_at,
                    revoked_at,
                },
            )
            .collect())
    }
}

/// The live token with this hash.
async fn grant_of(pool: &PgPool, hash: &[u8; 32]) -> Result<Option<Grant>, CoreError> {
    let row: Option<(String, Vec<String>, Vec<String>)> = sqlx::query_as(
        "SELECT name, roles, queues FROM s3p.tokens WHERE token_hash = $1 AND revoked_at IS NULL",
    )
    .bind(hash.as_slice())
    .fetch_optional(pool)
    .await
    .map_err(map_db_error)?;
    Ok(row.map(|(name, roles, queues)| Grant {
        name,
        roles: roles_of(roles),
        queues,
    }))
}

/// One live token's cached grant.
struct CachedGrant {
    grant: Grant,
    at: Instant,
    /// The cache's clock at its last use, for least-recently-used eviction.
    used: u64,
}

/// The cached answers: grants of live tokens and, apart from them, hashes no live token has, so
/// a flood of made-up tokens can only push out other made-up tokens.
struct CacheState {
    /// Bumped at every invalidation, so a lookup that raced one is not cached.
    generation: u64,
    /// Whether the listener is connected (else answers live briefly).
    listening: bool,
    grant_capacity: usize,
    unknown_capacity: usize,
    grants: HashMap<[u8; 32], CachedGrant>,
    /// When each unknown hash was looked up.
    unknown: HashMap<[u8; 32], Instant>,
    /// Unknown hashes in lookup order, oldest first (with stale records of refreshed ones).
    unknown_order: VecDeque<([u8; 32], Instant)>,
    /// Hashes this gateway found a live token for, kept through invalidations (up to the grant
    /// capacity) until a lookup finds the token gone: their lookups wait for a permit instead of
    /// being refused, so a flood of made-up tokens cannot turn away a client whose grant has
    /// just expired or been forgotten.
    granted_before: HashSet<[u8; 32]>,
    /// Ticks at every use.
    clock: u64,
}

impl CacheState {
    fn new(grant_capacity: usize, unknown_capacity: usize) -> CacheState {
        CacheState {
            generation: 0,
            listening: false,
            grant_capacity: grant_capacity.max(1),
            unknown_capacity: unknown_capacity.max(1),
            grants: HashMap::new(),
            unknown: HashMap::new(),
            unknown_order: VecDeque::new(),
            granted_before: HashSet::new(),
            clock: 0,
        }
    }

    fn ttl(&self) -> Duration {
        if self.listening {
            CACHE_TTL
        } else {
            CACHE_TTL_UNLISTENED
        }
    }

    /// The cached answer for `hash` while it is fresh: `Some(None)` for a hash no live token has.
    fn get(&mut self, hash: &[u8; 32]) -> Option<Option<Grant>> {
        let ttl = self.ttl();
        self.clock += 1;
        if let Some(entry) = self.grants.get_mut(hash)
            && entry.at.elapsed() < ttl
        {
            entry.used = self.clock;
            return Some(Some(entry.grant.clone()));
        }
        match self.unknown.get(hash) {
            Some(at) if at.elapsed() < ttl => Some(None),
            _ => None,
        }
    }

    /// Caches a looked-up answer, evicting within its own kind only.
    fn put(&mut self, hash: [u8; 32], answer: Option<Grant>) {
        let now = Instant::now();
        self.clock += 1;
        match answer {
            Some(grant) => {
                self.unknown.remove(&hash);
                if self.granted_before.len() < self.grant_capacity {
                    self.granted_before.insert(hash);
                }
                if !self.grants.contains_key(&hash) && self.grants.len() >= self.grant_capacity {
                    // Only live tokens get here, so this scan is rare.
                    let least_used = self
                        .grants
                        .iter()
                        .min_by_key(|(_, entry)| entry.used)
                        .map(|(hash, _)| *hash);
                    if let Some(least_used) = least_used {
                        self.grants.remove(&least_used);
                    }
                }
                let used = self.clock;
                self.grants.insert(
                    hash,
                    CachedGrant {
                        grant,
                        at: now,
                        used,
                    },
                );
            }
            None => {
                self.grants.remove(&hash);
                self.granted_before.remove(&hash);
                self.unknown.insert(hash, now);
                self.unknown_order.push_back((hash, now));
                while self.unknown.len() > self.unknown_capacity
                    || self.unknown_order.len() > 2 * self.unknown_capacity
                {
                    let Some((oldest, at)) = self.unknown_order.pop_front() else {
                        break;
                    };
                    // A stale record (the hash was looked up again since) removes nothing.
                    if self.unknown.get(&oldest) == Some(&at) {
                        self.unknown.remove(&oldest);
                    }
                }
            }
        }
    }

    /// Forgets what a notified change made wrong: a created token can only be among the unknown
    /// hashes (grants stay: a flood must not push a live token back to the database); a revoked
    /// token's grant goes. A payload of another form forgets by its whole text.
    fn notified(&mut self, payload: &str) {
        match payload.split_once(':') {
            Some(("created", _)) => {
                self.generation += 1;
                self.unknown.clear();
                self.unknown_order.clear();
            }
            Some(("revoked", name)) => self.forget(name),
            _ => self.forget(payload),
        }
    }

    /// Forgets what a change of the token `name` may have made wrong: its grant and every
    /// unknown hash (a new token's). An empty name forgets everything.
    fn forget(&mut self, name: &str) {
        self.generation += 1;
        if name.is_empty() {
            self.grants.clear();
        } else {
            self.grants.retain(|_, entry| entry.grant.name != name);
        }
        self.unknown.clear();
        self.unknown_order.clear();
    }
}

/// What a gateway's cache and its token checks share.
pub(super) struct Shared {
    pool: PgPool,
    state: Mutex<CacheState>,
    /// Database lookups at once: beyond it a request is refused instead of queuing for the
    /// pool, so made-up tokens cannot take the connections.
    lookups: Semaphore,
    /// Lookups made, for the tests of the eviction policy.
    lookups_made: AtomicU64,
}

impl Shared {
    fn new(pool: PgPool, lookups: usize) -> Arc<Shared> {
        Arc::new(Shared {
            pool,
            state: Mutex::new(CacheState::new(GRANT_CAPACITY, UNKNOWN_CAPACITY)),
            lookups: Semaphore::new(lookups.max(1)),
            lookups_made: AtomicU64::new(0),
        })
    }

    fn state(&self) -> std::sync::MutexGuard<'_, CacheState> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The grant of the live token with this hash, from the cache or the database. When all
    /// lookup permits are taken, `queue` and a token granted before wait for one; else the
    /// answer is `rate_limited`.
    async fn answer(&self, hash: &[u8; 32], queue: bool) -> Result<Option<Grant>, CoreError> {
        let queue = {
            let mut state = self.state();
            if let Some(answer) = state.get(hash) {
                return Ok(answer);
            }
            queue || state.granted_before.contains(hash)
        };
        let _permit = if queue {
            self.lookups
                .acquire()
                .await
                .map_err(|_| too_many_lookups())?
        } else {
            self.lookups.try_acquire().map_err(|_| too_many_lookups())?
        };
        // Another caller may have looked the same token up meanwhile.
        let generation = {
            let mut state = self.state();
            if let Some(answer) = state.get(hash) {
                return Ok(answer);
            }
            state.generation
        };
        self.lookups_made.fetch_add(1, Ordering::Relaxed);
        let answer = grant_of(&self.pool, hash).await?;
        let mut state = self.state();
        if state.generation == generation {
            state.put(*hash, answer.clone());
        }
        Ok(answer)
    }
}

fn too_many_lookups() -> CoreError {
    CoreError::new(
        ErrorKind::RateLimited,
        "too many token checks at once; retry shortly",
    )
}

/// A gateway's token cache, with the listener that invalidates it.
pub struct TokenCache {
    shared: Arc<Shared>,
    listener: JoinHandle<()>,
}

impl TokenCache {
    /// A cache over `pool`, listening for token changes when the database allows LISTEN; at
    /// most a quarter of the pool (at least 2) looks tokens up at once.
    pub async fn start(store: &Store) -> TokenCache {
        let pool = store.pool().clone();
        let lookups = (pool.options().get_max_connections() as usize / 4).max(2);
        let shared = Shared::new(pool, lookups);
        // The store's own revocations forget at once (the first cache started, one per server).
        let _ = store.token_cache.set(shared.clone());
        let task_shared = shared.clone();
        let listener = tokio::spawn(async move {
            let mut backoff = Duration::from_millis(200);
            loop {
                let listening = match PgListener::connect_with(&task_shared.pool).await {
                    Ok(mut listener) => listener.listen(TOKENS_CHANNEL).await.map(|()| listener),
                    Err(error) => Err(error),
                };
                match listening {
                    Ok(mut listener) => {
                        backoff = Duration::from_millis(200);
                        invalidate(&task_shared, true);
                        // try_recv answers None when the connection is lost: then reconnect here.
                        while let Some(notice) = listener.try_recv().await.ok().flatten() {
                            task_shared.state().notified(notice.payload());
                        }
                        invalidate(&task_shared, false);
                    }
                    Err(_) => invalidate(&task_shared, false),
                }
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(10));
            }
        });
        TokenCache { shared, listener }
    }

    /// The grant of a live token with this hash, from the cache or the database; `rate_limited`
    /// when the cache does not know it and the lookups at once are at their limit.
    pub async fn grant(&self, hash: &[u8; 32]) -> Result<Option<Grant>, CoreError> {
        self.shared.answer(hash, false).await
    }

    /// A handle asking later whether the token with this hash is still live.
    pub fn check(&self, hash: &[u8; 32]) -> TokenCheck {
        TokenCheck {
            shared: self.shared.clone(),
            hash: *hash,
        }
    }

    /// Stops the listener.
    pub fn stop(&self) {
        self.listener.abort();
    }
}

impl Drop for TokenCache {
    fn drop(&mut self) {
        self.listener.abort();
    }
}

/// The token a request was admitted with, to ask again while a long-lived stream of it is
/// open: a revoked token's streams end as its new requests are refused.
#[derive(Clone)]
pub struct TokenCheck {
    shared: Arc<Shared>,
    hash: [u8; 32],
}

impl TokenCheck {
    /// Whether the token is still live: from the cache (which revocations invalidate at once),
    /// else the database. A failed lookup counts as live: the stream's own reads fail then.
    pub async fn is_live(&self) -> bool {
        !matches!(self.shared.answer(&self.hash, true).await, Ok(None))
    }
}

impl std::fmt::Debug for TokenCheck {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Not even the hash: it identifies the token.
        f.write_str("TokenCheck")
    }
}

fn invalidate(shared: &Shared, listening: bool) {
    let mut state = shared.state();
    state.forget("");
    state.listening = listening;
}

#[cfg(test)]
mod tests {
    use super::*;
    use sqlx::postgres::PgPoolOptions;

    fn grant(name: &str) -> Grant {
        Grant {
            name: name.to_string(),
            roles: vec![Role::Reader],
            queues: Vec::new(),
        }
    }

    fn hash(n: u64) -> [u8; 32] {
        let mut hash = [0u8; 32];
        hash[..8].copy_from_slice(&n.to_be_bytes());
        hash
    }

    /// A cache whose database cannot be reached: any lookup fails (and is counted).
    fn unreachable() -> Arc<Shared> {
        let pool = PgPoolOptions::new()
            .acquire_timeout(Duration::from_millis(200))
            .connect_lazy("postgres://nobody@127.0.0.1:1/none")
            .expect("a lazy pool");
        Shared::new(pool, 2)
    }

    #[tokio::test]
    async fn a_flood_of_unknown_tokens_leaves_a_live_grant_cached() {
        let shared = unreachable();
        {
            let mut state = shared.state();
            state.listening = true;
            state.put(hash(0), Some(grant("live")));
            for n in 1..=20_000 {
                state.put(hash(n), None);
            }
            assert!(state.unknown.len() <= UNKNOWN_CAPACITY);
            assert!(state.unknown_order.len() <= 2 * UNKNOWN_CAPACITY);
        }
        let answer = shared.answer(&hash(0), false).await.expect("cached");
        assert_eq!(answer, Some(grant("live")));
        // The last unknown hashes are still answered from the cache too.
        assert_eq!(
            shared.answer(&hash(20_000), false).await.expect("cached"),
            None
        );
        assert_eq!(shared.lookups_made.load(Ordering::Relaxed), 0);
        // A hash the cache does not hold is looked up (and here fails).
        assert!(shared.answer(&hash(1), false).await.is_err());
        assert_eq!(shared.lookups_made.load(Ordering::Relaxed), 1);
    }

    #[test]
    fn grants_evict_the_least_recently_used_and_unknowns_the_oldest() {
        let mut state = CacheState::new(2, 2);
        state.listening = true;
        state.put(hash(1), Some(grant("a")));
        state.put(hash(2), Some(grant("b")));
        assert!(state.get(&hash(1)).is_some());
        state.put(hash(3), Some(grant("c")));
        assert_eq!(state.get(&hash(1)), Some(Some(grant("a"))));
        assert_eq!(state.get(&hash(2)), None, "b was used least recently");
        assert_eq!(state.get(&hash(3)), Some(Some(grant("c"))));

        state.put(hash(10), None);
        state.put(hash(11), None);
        state.put(hash(10), None);
        state.put(hash(12), None);
        assert_eq!(state.get(&hash(11)), None, "the oldest unknown went");
        assert_eq!(state.get(&hash(10)), Some(None), "refreshed, so younger");
        assert_eq!(state.get(&hash(12)), Some(None));
        assert_eq!(state.grants.len(), 2, "unknowns never push grants out");
    }

    #[test]
    fn a_change_forgets_only_that_tokens_grant_and_the_unknowns() {
        let mut state = CacheState::new(10, 10);
        state.listening = true;
        state.put(hash(1), Some(grant("a")));
        state.put(hash(2), Some(grant("b")));
        state.put(hash(3), None);
        let before = state.generation;
        state.forget("a");
        assert!(state.generation > before);
        assert_eq!(state.get(&hash(1)), None);
        assert_eq!(state.get(&hash(2)), Some(Some(grant("b"))));
        assert_eq!(state.get(&hash(3)), None);
        state.forget("");
        assert_eq!(state.get(&hash(2)), None);
    }

    /// A token granted before whose grant was forgotten (here by the listener's reconnect, as
    /// when a gateway's listener connects after the token's first use) waits for a lookup
    /// instead of being refused with the flood; a token found gone loses that.
    #[tokio::test]
    async fn a_token_granted_before_waits_for_a_lookup_when_the_flood_holds_every_permit() {
        let shared = unreachable();
        shared.state().put(hash(7), Some(grant("known")));
        invalidate(&shared, true);
        assert_eq!(shared.state().get(&hash(7)), None, "the grant is forgotten");
        let held = shared.lookups.acquire_many(2).await.expect("permits");
        let refused = shared.answer(&hash(8), false).await.expect_err("no permit");
        assert_eq!(refused.kind, ErrorKind::RateLimited, "a made-up token");
        let known = hash(7);
        let waiting = shared.answer(&known, false);
        tokio::pin!(waiting);
        assert!(
            tokio::time::timeout(Duration::from_millis(50), &mut waiting)
                .await
                .is_err(),
            "the known token waits for a permit"
        );
        drop(held);
        assert!(waiting.await.is_err(), "looked up, and unreachable");
        assert_eq!(shared.lookups_made.load(Ordering::Relaxed), 1);

        shared.state().put(hash(7), None);
        let held = shared.lookups.acquire_many(2).await.expect("permits");
        invalidate(&shared, true);
        let refused = shared.answer(&hash(7), false).await.expect_err("no permit");
        assert_eq!(
            refused.kind,
            ErrorKind::RateLimited,
            "found gone, so refused"
        );
        drop(held);
    }

    #[tokio::test]
    async fn lookups_beyond_the_limit_are_refused_or_queued() {
        let shared = unreachable();
        let held = shared.lookups.acquire_many(2).await.expect("permits");
        let refused = shared.answer(&hash(1), false).await.expect_err("no permit");
        assert_eq!(refused.kind, ErrorKind::RateLimited);
        assert_eq!(shared.lookups_made.load(Ordering::Relaxed), 0);
        // A stream's check waits for a permit instead.
        let wanted = hash(1);
        let queued = shared.answer(&wanted, true);
        tokio::pin!(queued);
        assert!(
            tokio::time::timeout(Duration::from_millis(50), &mut queued)
                .await
                .is_err()
        );
        drop(held);
        assert!(queued.await.is_err(), "looked up, and unreachable");
        assert_eq!(shared.lookups_made.load(Ordering::Relaxed), 1);
    }
}
