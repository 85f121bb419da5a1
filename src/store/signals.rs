//! Wake-ups for long-polling fetches: one LISTEN connection fans NOTIFY payloads (queue names) out
//! to every waiting request.

use std::sync::Arc;
use std::time::Duration;

use sqlx::postgres::{PgListener, PgPool};
use tokio::sync::broadcast;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::map_db_error;
use crate::core::CoreError;

/// The channel `s3p.enqueue` notifies with the queue name.
pub const JOBS_CHANNEL: &str = "s3p_jobs";

/// The shared listener and its fan-out.
#[derive(Clone)]
pub struct JobSignals {
    sender: broadcast::Sender<String>,
    task: Arc<JoinHandle<()>>,
}

/// One waiter's subscription.
pub struct JobWakeups {
    receiver: broadcast::Receiver<String>,
}

impl JobSignals {
    /// Listens on the jobs channel with a connection of its own.
    pub async fn start(pool: &PgPool) -> Result<JobSignals, CoreError> {
        let mut listener = PgListener::connect_with(pool).await.map_err(map_db_error)?;
        listener.listen(JOBS_CHANNEL).await.map_err(map_db_error)?;
        let (sender, _) = broadcast::channel(1024);
        let fan_out = sender.clone();
        let task = tokio::spawn(async move {
            loop {
                match listener.recv().await {
                    Ok(notification) => {
                        // No receivers is fine: nobody is waiting.
                        let _ = fan_out.send(notification.payload().to_string());
                    }
                    Err(error) => {
                        // PgListener reconnects on the next recv; notifications may be missed meanwhile,
                        // so wake every waiter to re-check.
                        tracing::warn!(%error, "job listener lost its connection");
                        let _ = fan_out.send(String::new());
                        tokio::time::sleep(Duration::from_millis(500)).await;
                    }
                }
            }
        });
        Ok(JobSignals {
            sender,
            task: Arc::new(task),
        })
    }

    /// A new subscription; subscribe before checking for work so no signal is missed.
    pub fn subscribe(&self) -> JobWakeups {
        JobWakeups {
            receiver: self.sender.subscribe(),
        }
    }

    /// Stops the listener task.
    pub fn stop(&self) {
        self.task.abort();
    }
}

impl JobWakeups {
    /// Waits until one of `queues` is signalled (true) or the deadline passes (false).
    pub async fn wait_for(&mut self, queues: &[String], deadline: Instant) -> bool {
        loop {
            match tokio::time::timeout_at(deadline, self.receiver.recv()).await {
                Err(_) => return false,
                Ok(Ok(queue)) if queue.is_empty() || queues.contains(&queue) => return true,
                Ok(Ok(_)) => continue,
                Ok(Err(broadcast::error::RecvError::Lagged(_))) => return true,
                Ok(Err(broadcast::error::RecvError::Closed)) => {
                    tokio::time::sleep_until(deadline).await;
                    return false;
                }
            }
        }
    }
}
