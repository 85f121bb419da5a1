//! Admin queue listing, detail, purge and configuration. Counts are `queue_stats`' (the
//! dashboard's), configuration is the queue's own (`queue_config`): nothing computed twice.

use chrono::{DateTime, Utc};
use serde_json::{Map, Value, json};

use super::{PURGE_BATCH, PageNumber, invalid, parse_instant, require_confirm};
use crate::core::browse::JOB_STATES;
use crate::core::validate::{MAX_DURATION_MS, check_claim_rate, check_queue_name};
use crate::core::{CoreError, QueueConfig, QueueStats, Scope, Service};
use crate::model::admin::CountedPage;
use crate::model::time::{format_duration_ms, parse_duration_ms, parse_whole_seconds_ms};

/// A queue's detail: its counts, configuration and oldest ready job.
#[derive(Debug, Clone, PartialEq)]
pub struct QueueDetail {
    /// Counts by state, paused, created_at.
    pub stats: QueueStats,
    /// The queue's configuration.
    pub config: QueueConfig,
    /// Terminal jobs are kept this long (the queue's, else the server's default), ms.
    pub job_retention_ms: i64,
    /// When the oldest job a fetch could claim now became ready.
    pub oldest_available_at: Option<DateTime<Utc>>,
}

/// A purge as a client asked for it.
#[derive(Debug, Clone, Default)]
pub struct PurgeInput {
    /// States to purge (any but active).
    pub states: Vec<String>,
    /// Only jobs that ended (else were created) before this RFC 3339 time.
    pub older_than: Option<String>,
    /// Must be true.
    pub confirm: Option<bool>,
}

/// A configuration update in the spec's terms: `fields` is the body's JSON object.
#[derive(Debug, Clone, Default)]
pub struct ConfigInput {
    /// The body's fields, as sent.
    pub fields: Map<String, Value>,
}

/// The fields a configuration update may name.
const CONFIG_FIELDS: [&str; 2] = ["rate_limit", "retention"];

impl Service {
    /// The names of the queues in `scope`, in name order.
    pub(crate) async fn admin_queue_names(&self, scope: &Scope) -> Result<Vec<String>, CoreError> {
        Ok(self
            .store
            .list_queues(scope, false, None, None)
            .await?
            .into_iter()
            .map(|q| q.name)
            .collect())
    }

    /// A page of the queues in `scope` (name order) with their counts.
    pub async fn admin_queues(
        &self,
        scope: &Scope,
        page: Option<i64>,
        per_page: Option<i64>,
    ) -> Result<CountedPage<QueueStats>, CoreError> {
        let page = PageNumber::check(page, per_page)?;
        let names = self.admin_queue_names(scope).await?;
        let total = names.len() as i64;
        let wanted: Vec<String> = names
            .into_iter()
            .skip(page.skip() as usize)
            .take(page.per_page as usize)
            .collect();
        let items = self.queue_stats_of(&wanted).await?;
        Ok(CountedPage {
            items,
            total,
            total_exact: true,
            page: page.page,
            per_page: page.per_page,
        })
    }

    /// One queue's counts, configuration and oldest ready job (the adapter admitted the queue).
    pub async fn admin_queue(&self, queue: &str) -> Result<QueueDetail, CoreError> {
        let stats = self.queue_stats(queue).await?;
        let config = self.store.queue_config(queue, &json!({})).await?;
        let oldest_available_at = self.store.oldest_available_at(queue).await?;
        Ok(QueueDetail {
            job_retention_ms: config
                .job_retention_ms
                .unwrap_or(self.settings.job_retention_ms),
            stats,
            config,
            oldest_available_at,
        })
    }

    /// Pauses or resumes a queue that exists: through the Admin API an unknown queue is
    /// `not_found`, where the OJS queue routes create it.
    pub async fn admin_set_paused(&self, queue: &str, paused: bool) -> Result<bool, CoreError> {
        self.queue_stats(queue).await?;
        self.set_paused(queue, paused).await
    }

    /// Deletes a queue's jobs in `states` (never active ones: their workers hold leases; cancel
    /// them first), those that ended before `older_than` when given; needs `confirm: true`.
    /// Returns how many.
    pub async fn admin_purge_queue(
        &self,
        queue: &str,
        input: &PurgeInput,
    ) -> Result<i64, CoreError> {
        check_queue_name(queue)?;
        if input.states.is_empty() {
            return Err(invalid(
                "states",
                "states must name at least one state".into(),
            ));
        }
        for state in &input.states {
            if !JOB_STATES.iter().any(|s| s.as_str() == state) {
                return Err(invalid(
                    "states",
                    format!("state {state:?} is not a job state"),
                ));
            }
            if state == "active" {
                return Err(invalid(
                    "states",
                    "active jobs are not purged (their workers hold leases): cancel them first"
                        .into(),
                ));
            }
        }
        let older_than = input
            .older_than
            .as_deref()
            .map(|t| parse_instant("older_than", t))
            .transpose()?;
        require_confirm(input.confirm)?;
        self.store
            .purge_queue_jobs(queue, &input.states, older_than, PURGE_BATCH)
            .await
    }

    /// Updates a queue's configuration from the spec's fields: `rate_limit` `{limit, period}`
    /// (the claim rate, limit/period per second; null clears it) and `retention`
    /// `{completed, discarded}` (one retention for every terminal job, so both must agree).
    /// Other fields (`concurrency`: workers set theirs) are refused, naming them.
    pub async fn admin_queue_config(
        &self,
        queue: &str,
        input: &ConfigInput,
    ) -> Result<QueueDetail, CoreError> {
        check_queue_name(queue)?;
        let unknown: Vec<&str> = input
            .fields
            .keys()
            .map(String::as_str)
            .filter(|k| !CONFIG_FIELDS.contains(k))
            .collect();
        if !unknown.is_empty() {
            return Err(invalid(
                &unknown.join(","),
                format!(
                    "pgvs3 does not support the queue settings {} (supported: {})",
                    unknown.join(", "),
                    CONFIG_FIELDS.join(", ")
                ),
            ));
        }
        let mut changes = Map::new();
        if let Some(limit) = input.fields.get("rate_limit") {
            let (per_second, period_ms) = rate_limit(limit)?;
            changes.insert("rate_limit_per_second".into(), per_second);
            changes.insert("rate_limit_period_ms".into(), period_ms);
        }
        if let Some(retention) = input.fields.get("retention") {
            let (ms, both_named) = retention_ms(retention)?;
            changes.insert("job_retention_ms".into(), json!(ms));
            if !both_named {
                // One retention serves both states: naming one alone may not change the other.
                // Checked by s3p.queue_config under the queue's row lock, against the retention
                // in force (this default when the queue has none of its own).
                changes.insert(
                    "job_retention_one_state_default_ms".into(),
                    json!(self.settings.job_retention_ms),
                );
            }
        }
        if changes.is_empty() {
            return Err(invalid(
                "rate_limit",
                "name rate_limit or retention to change".into(),
            ));
        }
        // The queue must exist: a configuration update never creates one.
        self.queue_stats(queue).await?;
        self.store
            .queue_config(queue, &Value::Object(changes))
            .await?;
        self.admin_queue(queue).await
    }
}

/// `{limit, period}` as claims per second and the period in ms, the period kept so the limit
/// reads back over it (JSON null: no limit, both cleared).
fn rate_limit(value: &Value) -> Result<(Value, Value), CoreError> {
    if value.is_null() {
        return Ok((Value::Null, Value::Null));
    }
    let bad = || {
        invalid(
            "rate_limit",
            "rate_limit must be {\"limit\": positive number, \"period\": ISO-8601 duration} or null"
                .into(),
        )
    };
    let object = value.as_object().ok_or_else(bad)?;
    if object.keys().any(|k| k != "limit" && k != "period") {
        return Err(bad());
    }
    // Its sign and size are the rate's bounds (check_claim_rate, below).
    let limit = object
        .get("limit")
        .and_then(Value::as_f64)
        .ok_or_else(bad)?;
    // Whole seconds, at least one: the claim's token bucket holds one second's worth, so a
    // shorter period would let a burst past its limit, and milliseconds rounded away would
    // change the rate that reads back.
    let period_ms = match object.get("period") {
        None => 1000,
        Some(p) => p
            .as_str()
            .and_then(parse_whole_seconds_ms)
            .filter(|ms| *ms >= 1000)
            .ok_or_else(|| {
                invalid(
                    "rate_limit",
                    "rate_limit.period must be an ISO-8601 duration of whole seconds, at least PT1S"
                        .into(),
                )
            })?,
    };
    let per_second = check_claim_rate("rate_limit", limit * (1000.0 / period_ms as f64))?;
    Ok((json!(per_second), json!(period_ms)))
}

/// `{completed, discarded}` as one retention in ms (pgvs3 keeps every terminal job alike), and
/// whether both were named.
fn retention_ms(value: &Value) -> Result<(i64, bool), CoreError> {
    let bad = |why: &str| invalid("retention", format!("retention: {why}"));
    let object = value
        .as_object()
        .ok_or_else(|| bad("must be {\"completed\": duration, \"discarded\": duration}"))?;
    let mut found: Option<i64> = None;
    for (key, text) in object {
        if key != "completed" && key != "discarded" {
            return Err(bad(&format!("{key} is not completed or discarded")));
        }
        // The bounds of `job_retention` on the queue config route, so whatever either route
        // stored reads back (`PT1.5S`) as a value this one takes.
        let ms = text
            .as_str()
            .and_then(parse_duration_ms)
            .filter(|ms| (1..=MAX_DURATION_MS).contains(ms))
            .ok_or_else(|| {
                bad(&format!(
                    "{key} must be an ISO-8601 duration of 1 ms to 10 years"
                ))
            })?;
        match found {
            Some(other) if other != ms => {
                return Err(bad(
                    "pgvs3 keeps completed and discarded jobs alike: give them one duration",
                ));
            }
            _ => found = Some(ms),
        }
    }
    let ms = found.ok_or_else(|| bad("name completed or discarded"))?;
    Ok((ms, object.len() == 2))
}

/// A retention in ms as the spec's ISO-8601 duration text.
pub fn retention_text(ms: i64) -> String {
    if ms % 86_400_000 == 0 && ms != 0 {
        format!("P{}D", ms / 86_400_000)
    } else {
        format_duration_ms(ms)
    }
}
