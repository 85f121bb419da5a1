//! API tokens in `s3p.tokens` (only their SHA-256 stored) and each gateway's cache of them,
//! emptied whenever `s3p_tokens` is notified, so a revoked token is refused at once everywhere.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use sqlx::postgres::{PgListener, PgPool};
use tokio::task::JoinHandle;

use super::{Store, map_db_error};
use crate::model::access::{Grant, Role};
use crate::model::error::CoreError;

/// The channel `s3p.token_create` and `s3p.token_revoke` notify.
const TOKENS_CHANNEL: &str = "s3p_tokens";
/// How long a cached answer lives while the listener is connected (a backstop only).
const CACHE_TTL: Duration = Duration::from_secs(60);
/// How long it lives without a listener (a standby, or while reconnecting).
const CACHE_TTL_UNLISTENED: Duration = Duration::from_millis(500);

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
            .fetch_one(self.pool())
            .await
            .map_err(map_db_error)
    }

    /// `s3p.token_revoke`: whether a live token of that name was revoked.
    pub async fn revoke_token(&self, name: &str) -> Result<bool, CoreError> {
        sqlx::query_scalar("SELECT s3p.token_revoke($1)")
            .bind(name)
            .fetch_one(self.pool())
            .await
            .map_err(map_db_error)
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
        .fetch_all(self.pool())
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

#[derive(Default)]
struct CacheState {
    /// Bumped at every invalidation, so a lookup that raced one is not cached.
    generation: u64,
    /// Whether the listener is connected (else answers live briefly).
    listening: bool,
    entries: HashMap<[u8; 32], (Option<Grant>, Instant)>,
}

/// A gateway's token cache, with the listener that empties it.
pub struct TokenCache {
    pool: PgPool,
    state: Arc<Mutex<CacheState>>,
    listener: JoinHandle<()>,
}

impl TokenCache {
    /// A cache over `pool`, listening for token changes when the database allows LISTEN.
    pub async fn start(pool: PgPool) -> TokenCache {
        let state = Arc::new(Mutex::new(CacheState::default()));
        let task_state = state.clone();
        let task_pool = pool.clone();
        let listener = tokio::spawn(async move {
            let mut backoff = Duration::from_millis(200);
            loop {
                let listening = match PgListener::connect_with(&task_pool).await {
                    Ok(mut listener) => listener.listen(TOKENS_CHANNEL).await.map(|()| listener),
                    Err(error) => Err(error),
                };
                match listening {
                    Ok(mut listener) => {
                        backoff = Duration::from_millis(200);
                        invalidate(&task_state, true);
                        // try_recv answers None when the connection is lost: then reconnect here.
                        while listener.try_recv().await.ok().flatten().is_some() {
                            invalidate(&task_state, true);
                        }
                        invalidate(&task_state, false);
                    }
                    Err(_) => invalidate(&task_state, false),
                }
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(10));
            }
        });
        TokenCache {
            pool,
            state,
            listener,
        }
    }

    /// The grant of a live token with this hash, from the cache or the database.
    pub async fn grant(&self, hash: &[u8; 32]) -> Result<Option<Grant>, CoreError> {
        let generation = {
            let state = lock(&self.state);
            let ttl = if state.listening {
                CACHE_TTL
            } else {
                CACHE_TTL_UNLISTENED
            };
            if let Some((grant, at)) = state.entries.get(hash)
                && at.elapsed() < ttl
            {
                return Ok(grant.clone());
            }
            state.generation
        };
        let grant = grant_of(&self.pool, hash).await?;
        let mut state = lock(&self.state);
        if state.generation == generation {
            // Bounded: unknown tokens are cached too, so drop everything when it grows large.
            if state.entries.len() >= 10_000 {
                state.entries.clear();
            }
            state.entries.insert(*hash, (grant.clone(), Instant::now()));
        }
        Ok(grant)
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

fn lock(state: &Mutex<CacheState>) -> std::sync::MutexGuard<'_, CacheState> {
    state
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn invalidate(state: &Mutex<CacheState>, listening: bool) {
    let mut state = lock(state);
    state.generation += 1;
    state.listening = listening;
    state.entries.clear();
}
