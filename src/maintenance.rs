//! The maintenance loop: one pass every interval; the database lets one gateway run it at a time.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use crate::core::Service;

/// Runs `service.maintain()` every `interval` until `stop` turns true.
pub async fn run(service: Arc<Service>, interval: Duration, mut stop: watch::Receiver<bool>) {
    // Marks a gateway that died held in memory are gone: every queue gets one step now.
    if let Err(error) = service.mark_every_queue_due().await {
        tracing::warn!(%error, "marking every queue due at start failed");
    }
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = ticker.tick() => {}
            _ = stop.wait_for(|s| *s) => return,
        }
        match service.maintain().await {
            Ok(report)
                if report.released
                    + report.expired
                    + report.removed
                    + report.retries_moved
                    + report.rotations
                    + report.vacuums
                    + report.failed_steps.len() as i64
                    > 0 =>
            {
                tracing::info!(?report, "maintenance pass");
            }
            Ok(_) => {}
            Err(error) => tracing::warn!(%error, "maintenance pass failed"),
        }
        match service.fire_due_crons().await {
            Ok(0) => {}
            Ok(fired) => tracing::info!(fired, "cron jobs fired"),
            Err(error) => tracing::warn!(%error, "cron firing failed"),
        }
    }
}
