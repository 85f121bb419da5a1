//! Per-queue admission (the seed's queue-concurrency): at most `--queue-max-in-flight` requests
//! in flight per queue, counted in one map shared by every route and listener, so one hot queue
//! cannot take every global slot. A request beyond it is refused at once (429 `rate_limited` +
//! `Retry-After`), never queued.
//!
//! Both protocols take their queues' permits the same way, after decoding: the adapter turns the
//! request into core terms, the core names its queues (a job's queue, `default` when it names
//! none; a fetch's queues; a path's queue), and the adapter calls `admit_queues` with them before
//! the core runs the operation. A request naming several queues takes all their permits or none.
//! Requests naming no queue (job ids, manifest, health, queue list) count against the global limit
//! alone.
//!
//! Like the global permit, the queue permits live in the request's `AdmissionSlot`: held until
//! the response's last frame is produced, and given back when an operation goes idle (a long poll).
//!
//! The same queue list is where a token's queue scope is checked (`forbidden` naming the first
//! queue outside it), before any permit is taken, with limits on or off.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};

use super::AdmissionSlot;
use crate::core::{CoreError, ErrorKind, Grant, Scope};

/// In-flight request counts per queue: one counting semaphore per queue, kept in one map so a
/// fetch can take all of its queues' permits atomically.
#[derive(Debug)]
pub struct QueueLimits {
    max_in_flight: usize,
    in_flight: Mutex<HashMap<String, usize>>,
}

/// Permits held on some queues; dropping them gives them back.
#[derive(Debug)]
pub struct QueuePermits {
    limits: Arc<QueueLimits>,
    queues: Vec<String>,
}

impl QueueLimits {
    /// Limits of `max_in_flight` requests per queue; 0 turns them off.
    pub fn new(max_in_flight: usize) -> Arc<Self> {
        Arc::new(QueueLimits {
            max_in_flight,
            in_flight: Mutex::new(HashMap::new()),
        })
    }

    /// Whether per-queue limits apply.
    pub fn enabled(&self) -> bool {
        self.max_in_flight > 0
    }

    /// The limit per queue.
    pub fn max_in_flight(&self) -> usize {
        self.max_in_flight
    }

    fn counts(&self) -> MutexGuard<'_, HashMap<String, usize>> {
        // The map stays consistent across a panic elsewhere: every update is one statement.
        self.in_flight
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Takes one permit on each of `queues` (distinct names), or none; `Err` names a full queue.
    pub fn try_admit(self: &Arc<Self>, queues: Vec<String>) -> Result<QueuePermits, String> {
        let mut counts = self.counts();
        if let Some(full) = queues
            .iter()
            .find(|q| counts.get(*q).copied().unwrap_or(0) >= self.max_in_flight)
        {
            return Err(full.clone());
        }
        for queue in &queues {
            *counts.entry(queue.clone()).or_insert(0) += 1;
        }
        Ok(QueuePermits {
            limits: self.clone(),
            queues,
        })
    }

    /// Requests in flight on `queue`.
    pub fn in_flight(&self, queue: &str) -> usize {
        self.counts().get(queue).copied().unwrap_or(0)
    }
}

impl Drop for QueuePermits {
    fn drop(&mut self) {
        let mut counts = self.limits.counts();
        for queue in &self.queues {
            if let Some(n) = counts.get_mut(queue) {
                *n = n.saturating_sub(1);
                // Idle queues leave the map, so it only ever holds queues with requests in flight.
                if *n == 0 {
                    counts.remove(queue);
                }
            }
        }
    }
}

/// The per-queue limits, handed to the adapters through the request's extensions: they name their
/// queues once the request is decoded (`admit_queues`).
#[derive(Debug, Clone)]
pub struct QueueGate(Arc<QueueLimits>);

/// What admitting a request's queues needs from its extensions: the token's grant (scope), the
/// per-queue gate and the request's admission slot (which holds the permits).
#[derive(Debug, Clone, Default)]
pub struct QueueAdmission {
    grant: Option<Grant>,
    gate: Option<QueueGate>,
    slot: Option<AdmissionSlot>,
}

impl QueueAdmission {
    /// The admission of the request whose extensions these are.
    pub fn of(extensions: &http::Extensions) -> Self {
        QueueAdmission {
            grant: extensions.get::<Grant>().cloned(),
            gate: extensions.get::<QueueGate>().cloned(),
            slot: extensions.get::<AdmissionSlot>().cloned(),
        }
    }

    /// The queues the request's token may see (every queue without a scoped token).
    pub fn scope(&self) -> Scope {
        Scope::of(self.grant.as_ref())
    }

    /// The request's grant, if a token was checked.
    pub fn grant(&self) -> Option<&Grant> {
        self.grant.as_ref()
    }

    /// Checks `queues` against the token's scope (`forbidden`), then takes a permit on each,
    /// held with the request's admission slot; `rate_limited` when one of them is full. Without
    /// a gate (limits off, or no stack) every queue in scope is admitted.
    pub fn admit(&self, queues: impl IntoIterator<Item = String>) -> Result<(), CoreError> {
        let queues: Vec<String> = queues
            .into_iter()
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect();
        if let Some(grant) = &self.grant {
            grant.require_queues(queues.iter().map(String::as_str))?;
        }
        let Some(QueueGate(limits)) = &self.gate else {
            return Ok(());
        };
        if queues.is_empty() {
            return Ok(());
        }
        let permits = limits
            .try_admit(queues)
            .map_err(|full| full_queue(limits, full))?;
        if let Some(slot) = &self.slot {
            slot.hold_queues(permits);
        }
        Ok(())
    }
}

/// `QueueAdmission::of(extensions).admit(queues)`.
pub fn admit_queues(
    extensions: &http::Extensions,
    queues: impl IntoIterator<Item = String>,
) -> Result<(), CoreError> {
    QueueAdmission::of(extensions).admit(queues)
}

fn full_queue(limits: &QueueLimits, full: String) -> CoreError {
    CoreError::new(
        ErrorKind::RateLimited,
        format!(
            "queue {full} is at its in-flight request limit ({})",
            limits.max_in_flight()
        ),
    )
    .with_detail("queue", full.into())
}

impl QueueGate {
    /// The gate of `limits`, when per-queue limits are on.
    pub fn of(limits: &Arc<QueueLimits>) -> Option<Self> {
        limits.enabled().then(|| QueueGate(limits.clone()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fetch_takes_all_its_permits_or_none() {
        let limits = QueueLimits::new(1);
        let hot = limits.try_admit(vec!["hot".into()]).expect("first");
        let refused = limits.try_admit(vec!["cold".into(), "hot".into()]);
        assert_eq!(refused.err().as_deref(), Some("hot"));
        assert_eq!(limits.in_flight("cold"), 0, "nothing taken on refusal");
        let cold = limits.try_admit(vec!["cold".into()]).expect("cold is free");
        drop(hot);
        assert_eq!(limits.in_flight("hot"), 0);
        assert!(limits.try_admit(vec!["hot".into()]).is_ok());
        drop(cold);
        assert!(limits.counts().is_empty(), "idle queues leave the map");
    }
}
