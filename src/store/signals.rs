//! Wake-ups for long polls: one LISTEN connection fans NOTIFY payloads (queue names) on the jobs
//! and streams channels out to every waiting request.

use std::sync::Arc;
use std::time::Duration;

use sqlx::postgres::{PgListener, PgPool};
use tokio::sync::broadcast;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::map_db_error;
use crate::model::error::CoreError;

/// The channel `s3p.enqueue` notifies with the queue name.
pub const JOBS_CHANNEL: &str = "s3p_jobs";
/// The channel stream appends, retries and replays notify with the queue name.
pub const STREAMS_CHANNEL: &str = "s3p_streams";

/// Something became ready in a queue.
#[derive(Debug, Clone)]
struct Signal {
    /// A stream event (else a job).
    stream: bool,
    /// The queue; empty means "anything" (sent after the listener reconnects).
    queue: String,
}

/// The shared listener and its fan-out.
#[derive(Clone)]
pub struct Signals {
    sender: broadcast::Sender<Signal>,
    task: Arc<JoinHandle<()>>,
}

/// One waiter's subscription.
pub struct Wakeups {
    receiver: broadcast::Receiver<Signal>,
}

impl Signals {
    /// Listens on both channels with a connection of its own.
    pub async fn start(pool: &PgPool) -> Result<Signals, CoreError> {
        // A hot standby refuses LISTEN; a read-only gateway never long-polls (polls are mutations).
        let standby: bool = sqlx::query_scalar("SELECT pg_is_in_recovery()")
            .fetch_one(pool)
            .await
            .map_err(map_db_error)?;
        if standby {
            let (sender, _) = broadcast::channel(1);
            return Ok(Signals {
                sender,
                task: Arc::new(tokio::spawn(async {})),
            });
        }
        let mut listener = PgListener::connect_with(pool).await.map_err(map_db_error)?;
        listener
            .listen_all([JOBS_CHANNEL, STREAMS_CHANNEL])
            .await
            .map_err(map_db_error)?;
        let (sender, _) = broadcast::channel(1024);
        let fan_out = sender.clone();
        let task = tokio::spawn(async move {
            loop {
                match listener.recv().await {
                    Ok(notification) => {
                        // No receivers is fine: nobody is waiting.
                        let _ = fan_out.send(Signal {
                            stream: notification.channel() == STREAMS_CHANNEL,
                            queue: notification.payload().to_string(),
                        });
                    }
                    Err(error) => {
                        // PgListener reconnects on the next recv; notifications may be missed
                        // meanwhile, so wake every waiter to check again.
                        tracing::warn!(%error, "listener lost its connection");
                        for stream in [false, true] {
                            let _ = fan_out.send(Signal {
                                stream,
                                queue: String::new(),
                            });
                        }
                        tokio::time::sleep(Duration::from_millis(500)).await;
                    }
                }
            }
        });
        Ok(Signals {
            sender,
            task: Arc::new(task),
        })
    }

    /// A new subscription; subscribe before checking for work so no signal is missed.
    pub fn subscribe(&self) -> Wakeups {
        Wakeups {
            receiver: self.sender.subscribe(),
        }
    }

    /// Stops the listener task.
    pub fn stop(&self) {
        self.task.abort();
    }
}

impl Wakeups {
    /// Waits until jobs arrive in one of `queues` (true) or the deadline passes (false).
    pub async fn wait_for(&mut self, queues: &[String], deadline: Instant) -> bool {
        self.wait(false, queues, deadline).await
    }

    /// Waits until stream events arrive in one of `queues` (true) or the deadline passes (false).
    pub async fn wait_for_stream(&mut self, queues: &[String], deadline: Instant) -> bool {
        self.wait(true, queues, deadline).await
    }

    async fn wait(&mut self, stream: bool, queues: &[String], deadline: Instant) -> bool {
        loop {
            match tokio::time::timeout_at(deadline, self.receiver.recv()).await {
                Err(_) => return false,
                Ok(Ok(signal)) => {
                    if signal.stream == stream
                        && (signal.queue.is_empty() || queues.contains(&signal.queue))
                    {
                        return true;
                    }
                }
                Ok(Err(broadcast::error::RecvError::Lagged(_))) => return true,
                Ok(Err(broadcast::error::RecvError::Closed)) => {
                    tokio::time::sleep_until(deadline).await;
                    return false;
                }
            }
        }
    }
}
