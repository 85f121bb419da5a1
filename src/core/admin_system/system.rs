//! Maintenance mode and the non-sensitive configuration.

use chrono::{DateTime, Utc};
use serde_json::{Map, Value, json};

use crate::core::{CoreError, Service, validate};
use crate::model::access::Scope;
use crate::model::admin_system::MaintenanceState;
use crate::model::time::{parse_flexible_duration_ms, parse_time};

/// The longest reason kept.
const MAX_REASON: usize = 1000;
/// The longest expected duration accepted (ten years, as every client duration).
const MAX_DURATION_MS: i64 = 315_360_000_000;

/// A maintenance change as a client sends it.
#[derive(Debug, Clone, Default)]
pub struct MaintenanceChange {
    /// On or off.
    pub enabled: bool,
    /// Why.
    pub reason: Option<String>,
    /// How long it should last (`PT30M`, `30m`).
    pub estimated_duration: Option<String>,
    /// Or when it should end.
    pub estimated_end: Option<String>,
}

fn expected_end(change: &MaintenanceChange) -> Result<Option<DateTime<Utc>>, CoreError> {
    if let Some(text) = change.estimated_end.as_deref().filter(|t| !t.is_empty()) {
        return parse_time(text).map(Some).ok_or_else(|| {
            CoreError::invalid("estimated_end must be an RFC 3339 time with a zone")
                .with_detail("field", "estimated_end".into())
        });
    }
    let Some(text) = change
        .estimated_duration
        .as_deref()
        .filter(|t| !t.is_empty())
    else {
        return Ok(None);
    };
    let ms = parse_flexible_duration_ms(text)
        .filter(|ms| (1..=MAX_DURATION_MS).contains(ms))
        .ok_or_else(|| {
            CoreError::invalid(format!(
                "estimated_duration must be a positive duration of at most ten years (PT30M, 30m), not {text:?}"
            ))
            .with_detail("field", "estimated_duration".into())
        })?;
    Ok(Utc::now().checked_add_signed(chrono::Duration::milliseconds(ms)))
}

impl Service {
    /// Maintenance mode as stored (read from the database, not this gateway's cache).
    pub async fn maintenance(&self) -> Result<MaintenanceState, CoreError> {
        let shared = self.store.admin_tick(&[], 0).await?;
        Ok(shared.maintenance)
    }

    /// Turns maintenance mode on or off for every gateway: fetches answer no jobs, cron firing
    /// waits (scheduled jobs are promoted by fetches, so they wait too); enqueues go on.
    pub async fn set_maintenance(
        &self,
        scope: &Scope,
        change: MaintenanceChange,
    ) -> Result<MaintenanceState, CoreError> {
        scope.require_all("maintenance mode")?;
        if let Some(reason) = &change.reason {
            validate::check_text("reason", reason)?;
            if reason.len() > MAX_REASON {
                return Err(
                    CoreError::invalid(format!("reason is at most {MAX_REASON} bytes"))
                        .with_detail("field", "reason".into()),
                );
            }
        }
        let end = expected_end(&change)?;
        let state = self
            .store
            .set_maintenance(change.enabled, change.reason.as_deref(), end)
            .await?;
        self.admin.set_maintenance(state.clone());
        Ok(state)
    }

    /// The configuration a client may see: limits and defaults, never the database URL or
    /// tokens.
    pub fn public_config(&self) -> Map<String, Value> {
        let s = &self.settings;
        let value = json!({
            "version": env!("CARGO_PKG_VERSION"),
            "backend": "postgres",
            "read_only": s.read_only,
            "default_visibility_timeout_ms": s.default_visibility_timeout_ms,
            "require_lease_token": s.require_lease_token,
            "max_fetch_queues": s.max_fetch_queues,
            "max_fetch_count": s.max_fetch_count,
            "max_fetch_wait_ms": s.max_fetch_wait_ms,
            "job_retention_ms": s.job_retention_ms,
            "maintenance_batch": s.maintenance_batch,
            "max_batch_jobs": s.max_batch_jobs,
            "max_streams": s.max_streams,
            "max_body_bytes": s.max_body_bytes,
            "admin": {
                "tick_ms": super::TICK.as_millis() as u64,
                "worker_write_every_ms": super::WRITE_EVERY.as_millis() as u64,
                "worker_stale_ms_default": 90_000,
                "stats_minute_retention": "24h",
                "stats_hour_retention": "30d",
            },
        });
        match value {
            Value::Object(map) => map,
            _ => Map::new(),
        }
    }
}
