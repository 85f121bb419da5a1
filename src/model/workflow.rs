//! Cron registrations as stored.

use chrono::{DateTime, Utc};
use serde_json::Value;
use uuid::Uuid;

/// A stored cron registration.
#[derive(Debug, Clone, PartialEq)]
pub struct CronEntry {
    /// Name.
    pub name: String,
    /// Expression.
    pub expression: String,
    /// Time zone.
    pub timezone: String,
    /// Overlap policy.
    pub overlap_policy: String,
    /// Job template (type, args, meta, options).
    pub job_template: Value,
    /// Whether it fires.
    pub enabled: bool,
    /// Next firing.
    pub next_run_at: Option<DateTime<Utc>>,
    /// Last firing.
    pub last_run_at: Option<DateTime<Utc>>,
    /// Job of the last firing.
    pub last_job_id: Option<Uuid>,
    /// When registered.
    pub created_at: DateTime<Utc>,
}

impl CronEntry {
    /// `active` or `paused` (from `enabled`), the status field the OJS SDKs read.
    pub fn status(&self) -> &'static str {
        if self.enabled { "active" } else { "paused" }
    }

    /// The job template with the options that were set (stored templates hold every option,
    /// null when unset).
    pub fn template(&self) -> serde_json::Map<String, Value> {
        let mut template = self.job_template.as_object().cloned().unwrap_or_default();
        if let Some(Value::Object(options)) = template.get_mut("options") {
            options.retain(|_, v| !v.is_null());
        }
        template.retain(|_, v| !v.is_null());
        template
    }
}
