//! What an SDK does when the server refuses a request for admission (HTTP 429, gRPC
//! RESOURCE_EXHAUSTED): wait and send it again. The bench never aborts on admission; it counts the
//! retries so each figure can say how many it took.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tonic_types::StatusExt;

use crate::{BenchError, Result};

/// The first back-off when the server names no interval.
const FIRST: Duration = Duration::from_millis(5);
/// The longest back-off when the server names no interval.
const LONGEST: Duration = Duration::from_millis(200);
/// A request refused this long without a break is an error: something other than load refuses it.
const GIVE_UP: Duration = Duration::from_secs(300);

/// Requests sent again after an admission refusal, over the whole run.
static RETRIES: AtomicU64 = AtomicU64::new(0);

/// Admission retries so far. Scenarios run one after another, so the difference across one
/// measurement belongs to it.
pub fn retries() -> u64 {
    RETRIES.load(Ordering::Relaxed)
}

/// `"; N admission retries"` for a figure's note: the retries since `since` (a [`retries`] value).
pub fn note_since(since: u64) -> String {
    format!("; {} admission retries", retries().saturating_sub(since))
}

/// The back-off state of one request.
#[derive(Debug, Default)]
pub struct Backoff {
    next: Option<Duration>,
    first_refusal: Option<Instant>,
}

impl Backoff {
    /// Waits before the next attempt of `call`: `retry_after` when the server gave one, else 5 ms
    /// doubling up to 200 ms. Counts the retry; an error once the request has been refused for
    /// [`GIVE_UP`].
    pub async fn wait(&mut self, call: &str, retry_after: Option<Duration>) -> Result<()> {
        let refused_since = *self.first_refusal.get_or_insert_with(Instant::now);
        if refused_since.elapsed() >= GIVE_UP {
            return Err(BenchError::from(format!(
                "{call}: still refused for admission after {} s of back-off",
                GIVE_UP.as_secs()
            )));
        }
        let own = self.next.unwrap_or(FIRST);
        self.next = Some((own * 2).min(LONGEST));
        RETRIES.fetch_add(1, Ordering::Relaxed);
        tokio::time::sleep(retry_after.unwrap_or(own)).await;
        Ok(())
    }
}

/// A `Retry-After` value in seconds (the delay form; an HTTP date is ignored).
pub fn parse_retry_after(value: &str) -> Option<Duration> {
    let secs: f64 = value.trim().parse().ok()?;
    (secs.is_finite() && secs >= 0.0).then(|| Duration::from_secs_f64(secs))
}

/// For an admission refusal (RESOURCE_EXHAUSTED not marked `retryable=false`, which a body past
/// the limit is): `Some` with the server's `retry-after`, if any. `None`: not one to retry.
pub fn grpc_admission(status: &tonic::Status) -> Option<Option<Duration>> {
    if status.code() != tonic::Code::ResourceExhausted {
        return None;
    }
    if status
        .get_details_error_info()
        .is_some_and(|info| info.metadata.get("retryable").map(String::as_str) == Some("false"))
    {
        return None;
    }
    Some(
        status
            .metadata()
            .get("retry-after")
            .and_then(|v| v.to_str().ok())
            .and_then(parse_retry_after),
    )
}

/// Sends a gRPC call, evaluating `$send` again for every attempt, and backs off from admission
/// refusals; `Ok` with the answer's message or `Err` with the call's error.
macro_rules! grpc_retry {
    ($call:literal, $send:expr) => {{
        let mut backoff = $crate::backoff::Backoff::default();
        loop {
            match $send.await {
                Ok(answer) => break Ok::<_, $crate::BenchError>(answer.into_inner()),
                Err(status) => match $crate::backoff::grpc_admission(&status) {
                    Some(retry_after) => {
                        if let Err(error) = backoff.wait($call, retry_after).await {
                            break Err(error);
                        }
                    }
                    None => break Err($crate::clients::grpc_error($call, status)),
                },
            }
        }
    }};
}

pub(crate) use grpc_retry;
