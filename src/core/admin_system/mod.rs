//! The OJS Admin API's workers, statistics and system operations (the other admin reads live
//! beside them). This module keeps what a gateway must know between requests: the workers its
//! fetches and heartbeats saw (handed to the database once per tick, a worker at most every
//! `WRITE_EVERY`), and what every gateway follows (maintenance mode, quiet workers), read back on
//! each tick, so a change made through any gateway reaches all within one tick.

pub mod crons;
pub mod stats;
pub mod system;
pub mod workers;

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::{Mutex, RwLock};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};

use crate::model::admin_system::MaintenanceState;
use crate::store::admin_system::{SharedAdminState, Sighting};

/// Time between two ticks of a gateway (`server.rs` runs them).
pub const TICK: Duration = Duration::from_millis(500);
/// A worker seen again sooner than this after its last write is not written again (unless it
/// names a new queue): the registry costs one row write per worker per interval, not per fetch.
pub const WRITE_EVERY: Duration = Duration::from_secs(5);
/// Workers one gateway tracks in memory; ids beyond it are not registered until room is made
/// (a worker id is the client's choice, so their number is bounded here).
pub const MAX_TRACKED: usize = 100_000;
/// Sightings handed over per tick; the rest wait for the next.
const MAX_PER_TICK: usize = 1_000;
/// Event log rows the rollup reads per maintenance pass.
pub const ROLLUP_BATCH: i32 = 10_000;
/// A tracked worker not seen for this long is forgotten by the gateway (not the registry).
const FORGET_AFTER: Duration = Duration::from_secs(120);

/// What this gateway saw of one worker.
struct Seen {
    queues: BTreeSet<String>,
    at: DateTime<Utc>,
    heartbeat: bool,
    written: Option<Instant>,
    dirty: bool,
    last: Instant,
}

/// A gateway's view of the worker registry and of the shared admin state.
#[derive(Default)]
pub struct AdminState {
    seen: Mutex<HashMap<String, Seen>>,
    maintenance: RwLock<MaintenanceState>,
    quiet: RwLock<HashSet<String>>,
}

impl AdminState {
    /// Notes a worker seen by a fetch (its queues) or a heartbeat: a map update, no I/O.
    pub fn note(&self, worker: &str, queues: &[String], heartbeat: bool) {
        let Ok(mut seen) = self.seen.lock() else {
            return;
        };
        let now = Instant::now();
        if !seen.contains_key(worker) && seen.len() >= MAX_TRACKED {
            return;
        }
        let entry = seen.entry(worker.to_string()).or_insert_with(|| Seen {
            queues: BTreeSet::new(),
            at: Utc::now(),
            heartbeat: false,
            written: None,
            dirty: true,
            last: now,
        });
        for queue in queues {
            if entry.queues.len() < 64 && entry.queues.insert(queue.clone()) {
                entry.dirty = true;
            }
        }
        entry.at = Utc::now();
        entry.last = now;
        entry.heartbeat |= heartbeat;
        if entry
            .written
            .is_none_or(|w| now.duration_since(w) >= WRITE_EVERY)
        {
            entry.dirty = true;
        }
    }

    /// The sightings to hand over now (marked written), and forgets long-unseen workers.
    pub fn take_sightings(&self) -> Vec<Sighting> {
        let Ok(mut seen) = self.seen.lock() else {
            return Vec::new();
        };
        let now = Instant::now();
        seen.retain(|_, s| s.dirty || now.duration_since(s.last) < FORGET_AFTER);
        seen.iter_mut()
            .filter(|(_, s)| s.dirty)
            .take(MAX_PER_TICK)
            .map(|(id, s)| {
                s.dirty = false;
                s.written = Some(now);
                let heartbeat = std::mem::take(&mut s.heartbeat);
                Sighting {
                    id: id.clone(),
                    queues: s.queues.iter().cloned().collect(),
                    at: s.at,
                    heartbeat,
                }
            })
            .collect()
    }

    /// Puts back sightings a failed tick did not hand over.
    pub fn restore(&self, sightings: Vec<Sighting>) {
        let Ok(mut seen) = self.seen.lock() else {
            return;
        };
        for s in sightings {
            if let Some(entry) = seen.get_mut(&s.id) {
                entry.dirty = true;
                entry.heartbeat |= s.heartbeat;
            }
        }
    }

    /// Takes what the database says every gateway follows.
    pub fn apply(&self, shared: SharedAdminState) {
        if let Ok(mut m) = self.maintenance.write() {
            *m = shared.maintenance;
        }
        if let Ok(mut q) = self.quiet.write() {
            *q = shared.quiet.into_iter().collect();
        }
    }

    /// Whether maintenance mode is on (as of this gateway's last tick or own change).
    pub fn in_maintenance(&self) -> bool {
        self.maintenance.read().map(|m| m.enabled).unwrap_or(false)
    }

    /// Maintenance mode as this gateway knows it.
    pub fn maintenance(&self) -> MaintenanceState {
        self.maintenance
            .read()
            .map(|m| m.clone())
            .unwrap_or_default()
    }

    /// Records this gateway's own change at once (others learn it on their next tick).
    pub fn set_maintenance(&self, state: MaintenanceState) {
        if let Ok(mut m) = self.maintenance.write() {
            *m = state;
        }
    }

    /// Whether a worker was asked to be quiet.
    pub fn is_quiet(&self, worker: &str) -> bool {
        self.quiet
            .read()
            .map(|q| q.contains(worker))
            .unwrap_or(false)
    }

    /// Records a quiet request made through this gateway at once.
    pub fn mark_quiet(&self, worker: &str) {
        if let Ok(mut q) = self.quiet.write() {
            q.insert(worker.to_string());
        }
    }

    /// Forgets a deregistered worker.
    pub fn forget(&self, worker: &str) {
        if let Ok(mut q) = self.quiet.write() {
            q.remove(worker);
        }
        if let Ok(mut seen) = self.seen.lock() {
            seen.remove(worker);
        }
    }
}

impl super::Service {
    /// One tick of this gateway: hands over the workers it saw and takes maintenance mode and
    /// the quiet workers from the database.
    pub async fn admin_tick(&self) -> Result<(), super::CoreError> {
        let sightings = if self.settings.read_only {
            Vec::new()
        } else {
            self.admin.take_sightings()
        };
        match self.store.admin_tick(&sightings, 0).await {
            Ok(shared) => {
                self.admin.apply(shared);
                Ok(())
            }
            Err(e) => {
                self.admin.restore(sightings);
                Err(e)
            }
        }
    }

    /// Steps the throughput rollup of the event log (part of every maintenance pass: `server.rs`'s
    /// loop and `pgvs3 maintain`); a gateway finding another at it leaves.
    pub async fn stats_rollup(&self) -> Result<i64, super::CoreError> {
        self.store.stats_rollup(ROLLUP_BATCH).await
    }

    /// The gateway's admin state (for fetch, heartbeat and cron firing).
    pub fn admin_state(&self) -> &AdminState {
        &self.admin
    }
}

/// Runs `service.admin_tick()` every `TICK` until `stop` turns true.
pub async fn run(
    service: std::sync::Arc<super::Service>,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    let mut ticker = tokio::time::interval(TICK);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = ticker.tick() => {}
            _ = stop.wait_for(|s| *s) => return,
        }
        if let Err(error) = service.admin_tick().await {
            tracing::warn!(%error, "admin tick failed");
        }
    }
}
