//! Connections kept between statements, so that a busy gateway does not hand each one back to the
//! pool after every statement.
//!
//! sqlx pings a connection each time it returns to the pool (a Sync and a wait for ReadyForQuery:
//! a backend wake-up and a round trip per statement). On the fetch-10 work-off that cost about a
//! tenth of the throughput (docs/benchmarks.md, sixteenth session). A statement run through
//! [`HotPool`] takes the connection the last statement finished with, when that was a moment ago,
//! and leaves it here when it succeeds; one that sat longer goes back to the pool (pinged there,
//! and again on its next acquire, as `liveness` rules). A statement that fails or is dropped
//! midway returns its connection to the pool the usual way.

use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use futures_util::future::BoxFuture;
use futures_util::stream::{self, BoxStream, StreamExt, TryStreamExt};
use sqlx::pool::PoolConnection;
use sqlx::postgres::{PgPool, PgQueryResult, PgRow, PgStatement, PgTypeInfo};
use sqlx::{Either, Execute, Executor, Postgres, SqlStr};

use super::hosts::Follower;
use super::liveness::PING_WHEN_IDLE_FOR;

/// How long a connection may go from statement to statement without passing through the pool:
/// then it goes back, so the pool's own rules (lifetime, the host follower's) see it again.
const BACK_TO_POOL_AFTER: Duration = Duration::from_secs(10);

/// A connection left by a statement that succeeded.
struct Held {
    conn: PoolConnection<Postgres>,
    /// When its statement finished.
    left_at: Instant,
    /// When it last came out of the pool.
    from_pool_at: Instant,
}

impl Held {
    /// Whether it sat past the liveness threshold since its statement (then the pool checks it).
    fn idle_too_long(&self) -> bool {
        self.left_at.elapsed() >= PING_WHEN_IDLE_FOR
    }
}

/// The connections held, most recent last.
struct Stack {
    held: Mutex<Vec<Held>>,
    /// Most connections held at once.
    cap: usize,
}

impl Stack {
    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Held>> {
        self.held.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Hands back to the pool every connection that sat past the liveness threshold.
    fn sweep(&self) {
        let stale: Vec<Held> = {
            let mut held = self.lock();
            let keep = held
                .iter()
                .position(|h| !h.idle_too_long())
                .unwrap_or(held.len());
            held.drain(..keep).collect()
        };
        drop(stale);
    }
}

/// The pool, with the connections recent statements left (see the module).
#[derive(Clone)]
pub struct HotPool {
    pool: PgPool,
    stack: Arc<Stack>,
    follower: Option<Arc<Follower>>,
}

impl std::fmt::Debug for HotPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HotPool")
            .field("held", &self.stack.lock().len())
            .field("cap", &self.stack.cap)
            .finish()
    }
}

impl HotPool {
    /// Holds up to a quarter of `pool`'s connections between statements (none for a pool under
    /// four, which the listener and the maintenance pass need whole), and starts the sweeper
    /// that hands idle ones back.
    pub fn new(pool: PgPool, follower: Option<Arc<Follower>>) -> HotPool {
        let cap = pool.options().get_max_connections() as usize / 4;
        let stack = Arc::new(Stack {
            held: Mutex::new(Vec::new()),
            cap,
        });
        if cap > 0 {
            tokio::spawn(sweep_while_alive(Arc::downgrade(&stack)));
        }
        HotPool {
            pool,
            stack,
            follower,
        }
    }

    /// The connection the last statement left, if recent and still on the pool's host; else one
    /// from the pool.
    async fn take(&self) -> Result<(PoolConnection<Postgres>, Instant), sqlx::Error> {
        let mut stale = Vec::new();
        let reused = {
            let mut held = self.stack.lock();
            let mut found = None;
            while let Some(h) = held.pop() {
                let fresh = !h.idle_too_long()
                    && h.from_pool_at.elapsed() < BACK_TO_POOL_AFTER
                    && !self
                        .follower
                        .as_ref()
                        .is_some_and(|f| f.predates_move(h.from_pool_at.elapsed()));
                if fresh {
                    found = Some(h);
                    break;
                }
                stale.push(h);
            }
            found
        };
        // Back to the pool outside the lock.
        drop(stale);
        match reused {
            Some(h) => Ok((h.conn, h.from_pool_at)),
            None => Ok((self.pool.acquire().await?, Instant::now())),
        }
    }

    /// Keeps a connection whose statement succeeded, for the next one; past the cap the oldest
    /// held goes back to the pool.
    fn leave(&self, conn: PoolConnection<Postgres>, from_pool_at: Instant) {
        if self.stack.cap == 0 {
            return;
        }
        let mut held = self.stack.lock();
        held.push(Held {
            conn,
            left_at: Instant::now(),
            from_pool_at,
        });
        let over = held.len().saturating_sub(self.stack.cap);
        let oldest: Vec<Held> = held.drain(..over).collect();
        // Back to the pool outside the lock.
        drop(held);
        drop(oldest);
    }
}

/// Sweeps the stack every few tens of milliseconds, until its pool is gone.
async fn sweep_while_alive(stack: Weak<Stack>) {
    let mut every = tokio::time::interval(PING_WHEN_IDLE_FOR / 2);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        every.tick().await;
        let Some(stack) = stack.upgrade() else {
            return;
        };
        stack.sweep();
    }
}

impl<'p> Executor<'p> for &'_ HotPool {
    type Database = Postgres;

    fn fetch_many<'e, 'q: 'e, E>(
        self,
        query: E,
    ) -> BoxStream<'e, Result<Either<PgQueryResult, PgRow>, sqlx::Error>>
    where
        'p: 'e,
        E: 'q + Execute<'q, Postgres>,
    {
        let hot = self.clone();
        // The results are gathered before they are yielded, so the connection is left (or
        // dropped) when the statement has finished, never while a caller still reads.
        stream::once(async move {
            let (mut conn, from_pool_at) = hot.take().await?;
            let items: Vec<_> = conn.fetch_many(query).try_collect().await?;
            hot.leave(conn, from_pool_at);
            Ok::<_, sqlx::Error>(stream::iter(items.into_iter().map(Ok)))
        })
        .try_flatten()
        .boxed()
    }

    fn fetch_optional<'e, 'q: 'e, E>(
        self,
        query: E,
    ) -> BoxFuture<'e, Result<Option<PgRow>, sqlx::Error>>
    where
        'p: 'e,
        E: 'q + Execute<'q, Postgres>,
    {
        let hot = self.clone();
        Box::pin(async move {
            let (mut conn, from_pool_at) = hot.take().await?;
            let row = conn.fetch_optional(query).await?;
            hot.leave(conn, from_pool_at);
            Ok(row)
        })
    }

    fn prepare_with<'e>(
        self,
        sql: SqlStr,
        parameters: &'e [PgTypeInfo],
    ) -> BoxFuture<'e, Result<PgStatement, sqlx::Error>>
    where
        'p: 'e,
    {
        let pool = self.pool.clone();
        Box::pin(async move { pool.acquire().await?.prepare_with(sql, parameters).await })
    }

    fn describe<'e>(
        self,
        sql: SqlStr,
    ) -> BoxFuture<'e, Result<sqlx::Describe<Postgres>, sqlx::Error>>
    where
        'p: 'e,
    {
        let pool = self.pool.clone();
        Box::pin(async move { pool.acquire().await?.describe(sql).await })
    }
}
