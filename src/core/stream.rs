//! Streams in the domain's own terms, and the stream half of the service: validation and limits;
//! the SQL functions hold the snapshots, cursors and locks.

use serde_json::{Map, Value};
use tokio::time::Instant;
use uuid::Uuid;

use super::validate::{check_job_type, check_queue_name};
use super::{CoreError, ErrorKind, Service};
pub use crate::model::stream::*;
use crate::model::time::parse_flexible_duration_ms;

/// Most messages one batch append may carry.
pub const MAX_APPEND_BATCH: usize = 1000;
/// Most events one receive may ask for.
pub const MAX_RECEIVE: i64 = 10_000;
/// Largest batch one receive answers, counted as its events' payloads and headers in JSON
/// (`s3p.stream_event_bytes`); also the default of a receive's `max_bytes`.
pub const MAX_RESPONSE_BYTES: i64 = 16 * 1024 * 1024;
/// Most transactions one replay of all dead letters runs (each at most one tick's worth), so that
/// dead letters arriving as fast as it replays cannot keep it going.
pub const MAX_REPLAY_TRANSACTIONS: usize = 1_000;
/// Longest receive long poll.
pub const MAX_RECEIVE_WAIT_MS: i64 = 5_000;
/// Shortest retention.
pub const MIN_RETENTION_MS: i64 = 1_000;

/// Checks a stream's tick bounds: events within 1..=`MAX_RECEIVE` (so some `max` always fits a
/// tick) and bytes within 1..=`MAX_RESPONSE_BYTES` (so some `max_bytes` does).
pub fn check_tick_bounds(events: Option<i64>, bytes: Option<i64>) -> Result<(), CoreError> {
    for (field, value, most) in [
        ("tick_max_events", events, MAX_RECEIVE),
        ("tick_max_bytes", bytes, MAX_RESPONSE_BYTES),
    ] {
        if let Some(n) = value
            && !(1..=most).contains(&n)
        {
            return Err(CoreError::invalid(format!(
                "{field} must be between 1 and {most}, not {n}"
            ))
            .with_detail("field", field.into()));
        }
    }
    Ok(())
}

fn check_name(field: &str, name: &str) -> Result<(), CoreError> {
    let ok = !name.is_empty()
        && name.len() <= 128
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_' | ':'));
    if ok {
        Ok(())
    } else {
        Err(CoreError::invalid(format!(
            "{field} {name:?} is invalid: use 1-128 letters, digits, '.', '-', '_' or ':'"
        ))
        .with_detail("field", field.into()))
    }
}

fn parse_uuid(field: &str, text: &str) -> Result<Uuid, CoreError> {
    Uuid::try_parse(text).map_err(|_| {
        CoreError::invalid(format!("{field} {text:?} is not a UUID"))
            .with_detail("field", field.into())
    })
}

fn duration(field: &str, text: &str) -> Result<i64, CoreError> {
    let ms = parse_flexible_duration_ms(text).ok_or_else(|| {
        CoreError::invalid(format!(
            "{field} {text:?} is not a duration (500ms, 2s, 720h or ISO-8601 like PT2S)"
        ))
        .with_detail("field", field.into())
    })?;
    super::validate::bounded_duration(field, ms)
}

/// A message as it is stored, validated.
fn message_row(message: &NewMessage) -> Result<MessageRow<'_>, CoreError> {
    check_job_type(&message.message_type).map_err(|_| {
        CoreError::invalid(format!(
            "message type {:?} is invalid: it must match ^[a-z][a-z0-9_-]*(\\.[a-z][a-z0-9_-]*)*$",
            message.message_type
        ))
        .with_detail("field", "type".into())
    })?;
    if let Some(headers) = &message.headers
        && headers.values().any(|v| !v.is_string())
    {
        return Err(CoreError::invalid("headers must be an object of strings")
            .with_detail("field", "headers".into()));
    }
    let id = match &message.id {
        Some(id) => parse_uuid("id", id)?,
        None => Uuid::now_v7(),
    };
    super::json_text::check_json_text("payload", message.payload.get())?;
    let mut headers = message.headers.clone();
    if let Some(trace) = &message.trace_context {
        let target = headers.get_or_insert_with(Map::new);
        target
            .entry("traceparent")
            .or_insert_with(|| trace.parent.clone().into());
        if let Some(state) = &trace.state {
            target
                .entry("tracestate")
                .or_insert_with(|| state.clone().into());
        }
    }
    if let Some(headers) = &message.headers {
        super::validate::check_no_nul("headers", &Value::Object(headers.clone()))?;
    }
    Ok(MessageRow {
        id,
        message_type: &message.message_type,
        payload: &message.payload,
        headers,
    })
}

/// Refuses an append whose events could take more than one receive answers: its transaction is
/// never split across ticks, so no consumer could ever receive it. Counted as PostgreSQL prints
/// the stored jsonb (`s3p.stream_event_bytes`), which can be far longer than what was sent.
fn check_receivable(rows: &[MessageRow<'_>]) -> Result<(), CoreError> {
    let bound: u64 = rows
        .iter()
        .map(|row| {
            let headers = row.headers.as_ref().map_or(0, |h| {
                serde_json::to_string(h).map_or(0, |text| super::json_text::jsonb_text_bound(&text))
            });
            super::json_text::jsonb_text_bound(row.payload.get()) + headers
        })
        .sum();
    if bound > MAX_RESPONSE_BYTES as u64 {
        return Err(CoreError::new(
            ErrorKind::PayloadTooLarge,
            format!(
                "the messages could take up to {bound} bytes once stored (PostgreSQL prints a \
                 number written with an exponent in all its digits), more than one receive \
                 answers ({MAX_RESPONSE_BYTES}): send fewer messages, or numbers without exponents"
            ),
        )
        .with_detail("field", "messages".into()));
    }
    Ok(())
}

impl Service {
    /// Appends messages to a queue's stream; the queue is created on first use.
    pub async fn append(
        &self,
        queue: &str,
        messages: &[NewMessage],
    ) -> Result<Vec<Appended>, CoreError> {
        check_queue_name(queue)?;
        if messages.is_empty() || messages.len() > MAX_APPEND_BATCH {
            return Err(CoreError::invalid(format!(
                "messages must hold between 1 and {MAX_APPEND_BATCH} messages"
            ))
            .with_detail("field", "messages".into()));
        }
        let rows = messages
            .iter()
            .map(message_row)
            .collect::<Result<Vec<_>, _>>()?;
        check_receivable(&rows)?;
        self.store.stream_append(queue, &rows).await
    }

    /// Subscribes a consumer at the latest tick, the oldest retained (0) or a given tick.
    pub async fn subscribe(
        &self,
        queue: &str,
        consumer: &str,
        from_tick: Option<i64>,
        cooperative: Option<bool>,
    ) -> Result<Subscription, CoreError> {
        check_queue_name(queue)?;
        check_name("consumer", consumer)?;
        if from_tick.is_some_and(|t| t < 0) {
            return Err(CoreError::invalid("from_tick must be 0 or a positive tick")
                .with_detail("field", "from_tick".into()));
        }
        self.store
            .stream_subscribe(queue, consumer, from_tick, cooperative)
            .await
    }

    /// Removes a consumer.
    pub async fn unsubscribe(&self, queue: &str, consumer: &str) -> Result<(), CoreError> {
        check_queue_name(queue)?;
        check_name("consumer", consumer)?;
        self.store.stream_unsubscribe(queue, consumer).await
    }

    /// A page of consumers with cursors and active batches, in name order (read a page at a time
    /// from the database, with one more entry to know whether more follow).
    pub async fn consumers(
        &self,
        queue: &str,
        page: &super::page::PageRequest,
    ) -> Result<super::page::Page<ConsumerInfo>, CoreError> {
        check_queue_name(queue)?;
        let spec = page.check()?;
        let mut items = self
            .store
            .stream_consumers(queue, spec.after.as_deref(), spec.limit + 1)
            .await?;
        let total = self.store.stream_consumer_count(queue).await?;
        Ok(spec.finish(&mut items, total, |c| c.name.as_str()))
    }

    /// The next batch (or the active one again); `None` when nothing is there, after waiting up to
    /// `wait_ms` for an append. `before_wait` runs once before waiting.
    pub async fn receive(
        &self,
        queue: &str,
        request: Receive,
        before_wait: impl FnOnce() + Send,
    ) -> Result<Option<Batch>, CoreError> {
        check_queue_name(queue)?;
        check_name("consumer", &request.consumer)?;
        if let Some(member) = &request.member {
            check_name("member", member)?;
        }
        // No max: the stream's tick_max_events, which every tick but one transaction's fits.
        if let Some(max) = request.max
            && !(1..=MAX_RECEIVE).contains(&max)
        {
            return Err(CoreError::invalid(format!(
                "max must be between 1 and {MAX_RECEIVE}, not {max}"
            ))
            .with_detail("field", "max".into()));
        }
        let max = request.max.map(|m| m as i32);
        let max_bytes = request.max_bytes.unwrap_or(MAX_RESPONSE_BYTES);
        if !(1..=MAX_RESPONSE_BYTES).contains(&max_bytes) {
            return Err(CoreError::invalid(format!(
                "max_bytes must be between 1 and {MAX_RESPONSE_BYTES}, not {max_bytes}"
            ))
            .with_detail("field", "max_bytes".into()));
        }
        let wait_ms = request.wait_ms.unwrap_or(0);
        if !(0..=MAX_RECEIVE_WAIT_MS).contains(&wait_ms) {
            return Err(CoreError::invalid(format!(
                "wait_ms must be between 0 and {MAX_RECEIVE_WAIT_MS}, not {wait_ms}"
            ))
            .with_detail("field", "wait_ms".into()));
        }
        let deadline = Instant::now() + std::time::Duration::from_millis(wait_ms as u64);
        let mut wakeups = self.store.signals().subscribe();
        let mut before_wait = Some(before_wait);
        let queues = [queue.to_string()];
        loop {
            let batch = self
                .store
                .stream_receive(
                    queue,
                    &request.consumer,
                    request.member.as_deref(),
                    max,
                    max_bytes,
                )
                .await?;
            if batch.is_some() || wait_ms == 0 {
                return Ok(batch);
            }
            if let Some(release) = before_wait.take() {
                release();
            }
            if !wakeups.wait_for_stream(&queues, deadline).await {
                return Ok(None);
            }
        }
    }

    /// One batch by id.
    pub async fn batch(&self, queue: &str, batch_id: &str) -> Result<Batch, CoreError> {
        check_queue_name(queue)?;
        let id = parse_uuid("batch_id", batch_id)?;
        self.store.stream_batch(queue, id).await
    }

    /// Whether a batch is still active (`false` when it is acked, taken over or gone).
    pub async fn batch_is_active(&self, queue: &str, id: uuid::Uuid) -> Result<bool, CoreError> {
        check_queue_name(queue)?;
        let state = self.store.stream_batch_state(queue, id).await?;
        Ok(state.as_deref() == Some("active"))
    }

    /// Acknowledges a batch; returns the consumer's cursor tick.
    pub async fn stream_ack(
        &self,
        queue: &str,
        batch_id: &str,
        consumer: Option<&str>,
    ) -> Result<i64, CoreError> {
        check_queue_name(queue)?;
        let id = parse_uuid("batch_id", batch_id)?;
        if let Some(c) = consumer {
            check_name("consumer", c)?;
        }
        self.store.stream_ack(queue, id, consumer).await
    }

    /// Nacks one message of a batch: retried after `retry_after` or dead-lettered.
    pub async fn stream_nack(
        &self,
        queue: &str,
        batch_id: &str,
        message_id: &str,
        consumer: Option<&str>,
        retry_after: Option<&str>,
        reason: Option<&str>,
    ) -> Result<StreamNackOutcome, CoreError> {
        check_queue_name(queue)?;
        let id = parse_uuid("batch_id", batch_id)?;
        let message = parse_uuid("message_id", message_id)?;
        if let Some(c) = consumer {
            check_name("consumer", c)?;
        }
        let delay = retry_after
            .map(|t| duration("retry_after", t))
            .transpose()?;
        if let Some(reason) = reason {
            super::validate::check_text("reason", reason)?;
        }
        self.store
            .stream_nack(queue, id, consumer, message, delay, reason)
            .await
    }

    /// Counts, watermarks, segment and rotation facts.
    pub async fn stream_info(&self, queue: &str) -> Result<StreamInfo, CoreError> {
        check_queue_name(queue)?;
        self.store.stream_info(queue).await
    }

    /// Reads (no changes) or updates the stream settings.
    pub async fn stream_config(
        &self,
        queue: &str,
        max_retries: Option<i64>,
        retention: Option<&str>,
        tick_max_events: Option<i64>,
        tick_max_bytes: Option<i64>,
    ) -> Result<StreamConfig, CoreError> {
        check_queue_name(queue)?;
        if let Some(n) = max_retries
            && !(0..=1000).contains(&n)
        {
            return Err(CoreError::invalid(format!(
                "max_retries must be between 0 and 1000, not {n}"
            ))
            .with_detail("field", "max_retries".into()));
        }
        let retention_ms = retention.map(|t| duration("retention", t)).transpose()?;
        if let Some(ms) = retention_ms
            && ms < MIN_RETENTION_MS
        {
            return Err(CoreError::invalid(format!(
                "retention must be at least {MIN_RETENTION_MS}ms"
            ))
            .with_detail("field", "retention".into()));
        }
        check_tick_bounds(tick_max_events, tick_max_bytes)?;
        let changes = StreamConfigChanges {
            max_retries: max_retries.map(|n| n as i32),
            retention_ms,
            tick_max_events: tick_max_events.map(|n| n as i32),
            tick_max_bytes,
        };
        self.store.stream_configure(queue, &changes).await
    }

    /// A page of dead letters, oldest first: up to `limit` entries and `MAX_RESPONSE_BYTES`.
    pub async fn stream_dead_letters(
        &self,
        queue: &str,
        limit: Option<i64>,
        offset: Option<i64>,
    ) -> Result<DeadLetterPage, CoreError> {
        check_queue_name(queue)?;
        let limit = limit.unwrap_or(100);
        if !(1..=1000).contains(&limit) {
            return Err(CoreError::invalid(format!(
                "limit must be between 1 and 1000, not {limit}"
            )));
        }
        let offset = super::validate::check_offset(offset.unwrap_or(0))?;
        let (letters, cut) = self
            .store
            .stream_dead_letters(queue, limit as i32, offset as i32, MAX_RESPONSE_BYTES)
            .await?;
        let next_offset = cut.then(|| offset + letters.len() as i64);
        Ok(DeadLetterPage {
            letters,
            next_offset,
        })
    }

    /// Replays one dead letter (or all when `id` is `None`) to its consumer.
    ///
    /// Replaying all goes in transactions of at most one tick's worth each (the queue's
    /// `stream_replay`), oldest first, until none is left: a larger transaction could never be
    /// received. A quota refusal after some of them stops it, and the answer is what was
    /// replayed; only a refusal of the first is the caller's 429.
    pub async fn stream_replay(&self, queue: &str, id: Option<&str>) -> Result<i32, CoreError> {
        check_queue_name(queue)?;
        let id = id.map(|i| parse_uuid("id", i)).transpose()?;
        let mut total: i32 = 0;
        for _ in 0..MAX_REPLAY_TRANSACTIONS {
            let replayed = match self.store.stream_replay(queue, id).await {
                Ok(replayed) => replayed,
                Err(e) if total > 0 && e.kind == ErrorKind::QuotaExceeded => break,
                Err(e) => return Err(e),
            };
            total = total.saturating_add(replayed);
            if id.is_some() || replayed == 0 {
                break;
            }
        }
        Ok(total)
    }

    /// Purges dead letters older than `older_than`.
    pub async fn stream_purge(&self, queue: &str, older_than: &str) -> Result<i32, CoreError> {
        check_queue_name(queue)?;
        let ms = duration("older_than", older_than)?;
        self.store.stream_purge(queue, ms).await
    }
}
