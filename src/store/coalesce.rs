//! Group commit across clients: requests of one kind that arrive while a statement of that kind
//! is in flight wait and then go together, as one statement in one transaction.
//!
//! No timer: a lone request starts at once; only requests that would otherwise queue behind the
//! running statements are merged. Each lane (a key, e.g. a queue) runs at most `max_running`
//! statements at a time, each in a task of its own, so a caller that goes away cannot strand the
//! others. Every caller gets its own outcomes, and only after the statement that produced them
//! committed.

use std::collections::HashMap;
use std::future::Future;
use std::hash::Hash;
use std::pin::Pin;
use std::sync::{Arc, Mutex};

use tokio::sync::oneshot;

use crate::model::error::{CoreError, ErrorKind};

/// The statement that runs a merged group: one outcome per item, in the items' order.
pub type Runner<K, I, O> =
    Arc<dyn Fn(K, Vec<I>) -> Pin<Box<dyn Future<Output = Vec<O>> + Send>> + Send + Sync>;

/// One caller's items and where its outcomes go.
struct Waiting<I, O> {
    items: Vec<I>,
    reply: oneshot::Sender<Vec<O>>,
}

/// The callers queued in one lane, and how many of its tasks are running.
struct Lane<I, O> {
    waiting: Vec<Waiting<I, O>>,
    running: usize,
}

/// Merges concurrent requests per key into one statement.
pub struct Coalescer<K, I, O> {
    lanes: Mutex<HashMap<K, Lane<I, O>>>,
    runner: Runner<K, I, O>,
    /// Most items one statement takes; callers beyond it go in the next one.
    max_items: usize,
    /// Most statements of one lane in flight at once.
    max_running: usize,
}

impl<K, I, O> Coalescer<K, I, O>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    I: Send + 'static,
    O: Send + 'static,
{
    /// A coalescer whose groups `runner` executes, at most `max_items` items per statement and
    /// `max_running` statements per lane at once (a request finding fewer in flight goes at once).
    pub fn new(max_items: usize, max_running: usize, runner: Runner<K, I, O>) -> Arc<Self> {
        Arc::new(Coalescer {
            lanes: Mutex::new(HashMap::new()),
            runner,
            max_items: max_items.max(1),
            max_running: max_running.max(1),
        })
    }

    /// Runs `items` in the lane of `key`, alone or with whatever else is waiting there; the
    /// outcomes come back in the order of `items`.
    pub async fn run(self: &Arc<Self>, key: K, items: Vec<I>) -> Result<Vec<O>, CoreError> {
        let (reply, outcome) = oneshot::channel();
        let start = {
            let mut lanes = self.lanes.lock().unwrap_or_else(|p| p.into_inner());
            let lane = lanes.entry(key.clone()).or_insert_with(|| Lane {
                waiting: Vec::new(),
                running: 0,
            });
            lane.waiting.push(Waiting { items, reply });
            let start = lane.running < self.max_running;
            if start {
                lane.running += 1;
            }
            start
        };
        if start {
            let this = Arc::clone(self);
            tokio::spawn(async move { this.drain(key).await });
        }
        outcome.await.map_err(|_| {
            CoreError::new(
                ErrorKind::Unavailable,
                "the server stopped before the operation finished",
            )
        })
    }

    /// Runs the lane's waiting callers, group after group, until none is left.
    async fn drain(self: Arc<Self>, key: K) {
        // Should the task end early (a panic), the lane is released and its callers answered.
        let _release = Release {
            coalescer: &self,
            key: &key,
        };
        loop {
            let group = {
                let mut lanes = self.lanes.lock().unwrap_or_else(|p| p.into_inner());
                let Some(lane) = lanes.get_mut(&key) else {
                    return;
                };
                if lane.waiting.is_empty() {
                    lane.running -= 1;
                    if lane.running == 0 {
                        lanes.remove(&key);
                    }
                    return;
                }
                // Whole callers only; the first always goes even when it alone is over the limit.
                let mut taken = 0;
                let mut count = 0;
                for waiting in &lane.waiting {
                    if count > 0 && count + waiting.items.len() > self.max_items {
                        break;
                    }
                    count += waiting.items.len();
                    taken += 1;
                }
                lane.waiting.drain(..taken).collect::<Vec<_>>()
            };
            let mut sizes = Vec::with_capacity(group.len());
            let mut replies = Vec::with_capacity(group.len());
            let mut items = Vec::new();
            for waiting in group {
                sizes.push(waiting.items.len());
                replies.push(waiting.reply);
                items.extend(waiting.items);
            }
            let mut outcomes = (self.runner)(key.clone(), items).await.into_iter();
            for (size, reply) in sizes.into_iter().zip(replies) {
                // A caller that went away no longer needs its outcomes.
                let _ = reply.send(outcomes.by_ref().take(size).collect());
            }
        }
    }
}

/// Removes a lane whose task ends, so the next caller starts a new one.
struct Release<'a, K: Hash + Eq, I, O> {
    coalescer: &'a Coalescer<K, I, O>,
    key: &'a K,
}

impl<K: Hash + Eq, I, O> Drop for Release<'_, K, I, O> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let mut lanes = self
                .coalescer
                .lanes
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            // Dropping the waiting callers' senders answers them with an error.
            lanes.remove(self.key);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex as StdMutex;

    use tokio::sync::Semaphore;

    use super::*;

    /// A runner that doubles each item, records each group's size, and waits for a permit per
    /// group so the test decides when a statement "commits".
    fn doubling(
        groups: Arc<StdMutex<Vec<usize>>>,
        gate: Arc<Semaphore>,
    ) -> Runner<&'static str, u32, u32> {
        Arc::new(move |_key, items: Vec<u32>| {
            let (groups, gate) = (Arc::clone(&groups), Arc::clone(&gate));
            Box::pin(async move {
                groups.lock().unwrap().push(items.len());
                gate.acquire().await.unwrap().forget();
                items.into_iter().map(|i| i * 2).collect()
            })
        })
    }

    #[tokio::test]
    async fn a_lone_request_goes_at_once_and_later_ones_join_the_next_group() {
        let groups = Arc::new(StdMutex::new(Vec::new()));
        let gate = Arc::new(Semaphore::new(0));
        let coalescer = Coalescer::new(100, 1, doubling(Arc::clone(&groups), Arc::clone(&gate)));

        let first = tokio::spawn({
            let c = Arc::clone(&coalescer);
            async move { c.run("q", vec![1]).await }
        });
        // The first group starts without waiting for company.
        while groups.lock().unwrap().is_empty() {
            tokio::task::yield_now().await;
        }
        let mut later = Vec::new();
        for n in 0..5u32 {
            let c = Arc::clone(&coalescer);
            later.push(tokio::spawn(async move {
                c.run("q", vec![10 * n, 10 * n + 1]).await
            }));
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        assert_eq!(
            *groups.lock().unwrap(),
            vec![1],
            "the others wait for the first commit"
        );

        gate.add_permits(2);
        assert_eq!(first.await.unwrap().unwrap(), vec![2]);
        for (n, caller) in later.into_iter().enumerate() {
            let n = n as u32;
            assert_eq!(caller.await.unwrap().unwrap(), vec![20 * n, 20 * n + 2]);
        }
        assert_eq!(
            *groups.lock().unwrap(),
            vec![1, 10],
            "five callers, one group"
        );
    }

    #[tokio::test]
    async fn lanes_run_apart_and_a_group_never_passes_the_limit() {
        let groups = Arc::new(StdMutex::new(Vec::new()));
        let gate = Arc::new(Semaphore::new(100));
        let coalescer = Coalescer::new(3, 1, doubling(Arc::clone(&groups), gate));
        let calls: Vec<_> = (0..6u32)
            .map(|n| {
                let c = Arc::clone(&coalescer);
                let key = if n % 2 == 0 { "a" } else { "b" };
                tokio::spawn(async move { c.run(key, vec![n, n]).await })
            })
            .collect();
        for (n, call) in calls.into_iter().enumerate() {
            let n = n as u32;
            assert_eq!(call.await.unwrap().unwrap(), vec![2 * n, 2 * n]);
        }
        // Two items per caller and at most three per group: one caller per group.
        assert!(groups.lock().unwrap().iter().all(|&size| size == 2));
    }
}
