//! Waiting for what another task, gateway or server makes true.

use std::time::Duration;

use tokio::time::Instant;

/// Polls `check` every 100 ms until it holds; panics with `what` after `within`.
pub async fn eventually(within: Duration, what: &str, mut check: impl AsyncFnMut() -> bool) {
    let deadline = Instant::now() + within;
    loop {
        if check().await {
            return;
        }
        assert!(Instant::now() < deadline, "not within {within:?}: {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
