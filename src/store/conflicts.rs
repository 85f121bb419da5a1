//! Statements PostgreSQL aborted to break a deadlock or a serialization conflict, or that found
//! their queue dropped under them, run again. Every operation is one statement in its own
//! transaction, so an aborted one left nothing behind and a rerun is safe; the client never sees
//! the conflict.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Tries of one statement before its last error is returned as it is.
const TRIES: u64 = 5;

/// Reruns of conflicted statements, counted for `/metrics`.
#[derive(Default)]
pub(crate) struct Conflicts {
    reruns: AtomicU64,
}

impl Conflicts {
    /// Runs `run`, again (a few milliseconds later) when PostgreSQL aborted it with a deadlock
    /// (40P01) or a serialization failure (40001); and once more when it waited on a queue being
    /// dropped and found the queue's tables gone (`routes::is_stale`): run again, it sees the
    /// catalog as it is now (no such queue: 404; a stream append or subscribe: a new queue).
    pub(crate) async fn rerun<T, F, Fut>(&self, mut run: F) -> Result<T, sqlx::Error>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<T, sqlx::Error>>,
    {
        let mut tries = 1u64;
        let mut stale_rerun = false;
        loop {
            match run().await {
                Err(error) if !stale_rerun && super::routes::is_stale(&error) => {
                    stale_rerun = true;
                }
                Err(error) if tries < TRIES && is_conflict(&error) => {
                    tracing::warn!(%error, tries, "statement aborted by a lock conflict; running it again");
                    self.reruns.fetch_add(1, Ordering::Relaxed);
                    tokio::time::sleep(Duration::from_millis(tries * 3)).await;
                    tries += 1;
                }
                other => return other,
            }
        }
    }

    /// Statements run again since start.
    pub(crate) fn reruns(&self) -> u64 {
        self.reruns.load(Ordering::Relaxed)
    }
}

/// Whether PostgreSQL aborted the statement to break a deadlock or a serialization conflict.
fn is_conflict(error: &sqlx::Error) -> bool {
    matches!(error, sqlx::Error::Database(db) if matches!(db.code().as_deref(), Some("40P01" | "40001")))
}
