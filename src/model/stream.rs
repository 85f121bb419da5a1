//! Streams in the domain's own terms: messages, events, batches, consumers, dead letters.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use uuid::Uuid;

use super::time::{serialize_opt_time, serialize_time};

/// A message to append.
#[derive(Debug, Clone, Default)]
pub struct NewMessage {
    /// Caller id (not a deduplication key); a UUIDv7 is generated when absent.
    pub id: Option<String>,
    /// Message type.
    pub message_type: String,
    /// JSON payload, as the producer sent it (stored without being parsed into a value here).
    pub payload: super::raw_json::RawJson,
    /// String headers.
    pub headers: Option<Map<String, Value>>,
    /// The producer's W3C trace context, stored in the headers.
    pub trace_context: Option<super::job::TraceContext>,
}

/// A validated message as it is stored: the id it gets (given or minted), and the headers with
/// the producer's trace context.
#[derive(Debug, Clone)]
pub struct MessageRow<'a> {
    /// The event id.
    pub id: Uuid,
    /// Message type.
    pub message_type: &'a str,
    /// JSON payload.
    pub payload: &'a super::raw_json::RawJson,
    /// String headers with the producer's trace context; none when the message has none.
    pub headers: Option<Map<String, Value>>,
}

/// An appended message.
#[derive(Debug, Clone, PartialEq)]
pub struct Appended {
    /// Its id.
    pub id: Uuid,
    /// Its storage sequence number (orders storage only).
    pub seq: i64,
}

/// An event as delivered.
#[derive(Debug, Clone, PartialEq)]
pub struct StreamEvent {
    /// Message id.
    pub id: Uuid,
    /// Storage sequence.
    pub seq: i64,
    /// Message type.
    pub message_type: String,
    /// Payload, as PostgreSQL prints it (passed into answers unparsed).
    pub payload: super::raw_json::RawJson,
    /// Headers.
    pub headers: Option<Value>,
    /// Times it was retried.
    pub retry_count: i32,
    /// When it entered the log.
    pub created_at: DateTime<Utc>,
}

/// A batch of events for one consumer (or member).
#[derive(Debug, Clone, PartialEq)]
pub struct Batch {
    /// Batch id.
    pub id: Uuid,
    /// The consumer (group).
    pub consumer: String,
    /// The cooperative member, if any.
    pub member: Option<String>,
    /// Cursor tick it starts after.
    pub start_tick: i64,
    /// Tick it ends at.
    pub end_tick: i64,
    /// active, acked or taken_over.
    pub state: String,
    /// When it was allocated.
    pub created_at: DateTime<Utc>,
    /// Its events in log order.
    pub events: Vec<StreamEvent>,
}

/// A subscription's cursor and batches.
#[derive(Debug, Clone, PartialEq)]
pub struct ConsumerInfo {
    /// Name.
    pub name: String,
    /// Fan-out cursor tick.
    pub last_tick: i64,
    /// Cooperative allocation frontier.
    pub next_tick: i64,
    /// Whether members share it.
    pub cooperative: bool,
    /// When it subscribed.
    pub created_at: DateTime<Utc>,
    /// Ticks after its cursor.
    pub ticks_behind: i64,
    /// Its active batches, oldest first.
    pub active_batches: Vec<ActiveBatch>,
}

/// A batch delivered to a consumer and not yet acked. Its JSON form (`Serialize`) is the one both
/// protocols answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ActiveBatch {
    /// Batch id.
    pub batch_id: Uuid,
    /// The cooperative member holding it, if any.
    pub member: Option<String>,
    /// Cursor tick it starts after.
    pub start_tick: i64,
    /// Tick it ends at.
    pub end_tick: i64,
    /// When it was allocated.
    #[serde(serialize_with = "serialize_time")]
    pub created_at: DateTime<Utc>,
}

/// The result of a subscribe.
#[derive(Debug, Clone, PartialEq)]
pub struct Subscription {
    /// Consumer name.
    pub consumer: String,
    /// Starting cursor tick.
    pub last_tick: i64,
    /// Whether members share it.
    pub cooperative: bool,
    /// False when it already existed (unchanged).
    pub created: bool,
}

/// What a nack did.
#[derive(Debug, Clone, PartialEq)]
pub struct StreamNackOutcome {
    /// `retry` or `dead_letter`.
    pub outcome: String,
    /// The retry count carried forward.
    pub retry_count: i32,
    /// When the retry is due.
    pub due_at: Option<DateTime<Utc>>,
}

/// Stream settings.
#[derive(Debug, Clone, PartialEq)]
pub struct StreamConfig {
    /// Nacks before a message is dead-lettered.
    pub max_retries: i32,
    /// Minimum retention.
    pub retention_ms: i64,
    /// Most events one tick adds (one transaction's events are never split); also the default
    /// `max` of a receive.
    pub tick_max_events: i32,
    /// Most bytes (payloads and headers as JSON) one tick adds, but for one transaction alone.
    pub tick_max_bytes: i64,
}

/// Changes to the stream settings, validated; `None` leaves a setting as it is.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StreamConfigChanges {
    /// Nacks before a message is dead-lettered.
    pub max_retries: Option<i32>,
    /// Minimum retention, ms.
    pub retention_ms: Option<i64>,
    /// Most events one tick adds.
    pub tick_max_events: Option<i32>,
    /// Most bytes one tick adds.
    pub tick_max_bytes: Option<i64>,
}

/// A stream dead letter.
#[derive(Debug, Clone, PartialEq)]
pub struct StreamDeadLetter {
    /// Dead-letter id.
    pub id: Uuid,
    /// The message id.
    pub event_id: Uuid,
    /// The consumer that gave up on it.
    pub consumer: String,
    /// Message type.
    pub message_type: String,
    /// Payload, as PostgreSQL prints it.
    pub payload: super::raw_json::RawJson,
    /// Headers.
    pub headers: Option<Value>,
    /// Retries it had.
    pub retry_count: i32,
    /// Why.
    pub reason: Option<String>,
    /// When.
    pub failed_at: DateTime<Utc>,
}

/// A page of stream dead letters.
#[derive(Debug, Clone, PartialEq)]
pub struct DeadLetterPage {
    /// The entries, oldest first.
    pub letters: Vec<StreamDeadLetter>,
    /// Where the next page starts when the byte budget cut this one short of its limit.
    pub next_offset: Option<i64>,
}

/// A receive request.
#[derive(Debug, Clone, Default)]
pub struct Receive {
    /// Consumer.
    pub consumer: String,
    /// Cooperative member.
    pub member: Option<String>,
    /// Ceiling on the batch size (default: the stream's `tick_max_events`, 1,000 unless
    /// configured, so a receive without `max` fits every tick but one transaction's alone).
    pub max: Option<i64>,
    /// Ceiling on the batch's bytes (default and most: `MAX_RESPONSE_BYTES`).
    pub max_bytes: Option<i64>,
    /// Long poll bound.
    pub wait_ms: Option<i64>,
}

/// A stream's counts, watermarks, segments and rotation facts (`s3p.stream_info`). Its JSON form
/// (`Serialize`) is the one both protocols answer; a watermark of an empty stream is null.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StreamInfo {
    /// Events retained.
    pub events: i64,
    /// Subscribed consumers.
    pub consumers: i64,
    /// Dead letters.
    pub dead_letters: i64,
    /// Events waiting for a retry.
    pub pending_retries: i64,
    /// Batches delivered and not yet acked.
    pub active_batches: i64,
    /// Lowest retained storage sequence.
    pub min_seq: Option<i64>,
    /// Highest retained storage sequence.
    pub max_seq: Option<i64>,
    /// Oldest retained tick.
    pub oldest_tick: Option<i64>,
    /// Latest tick.
    pub latest_tick: Option<i64>,
    /// Ticks retained.
    pub ticks: i64,
    /// The segment new events go to.
    pub current_segment: i32,
    /// When the current segment started.
    #[serde(serialize_with = "serialize_time")]
    pub segment_started_at: DateTime<Utc>,
    /// Segment rotations so far.
    pub rotations: i64,
    /// Minimum retention, ms.
    pub retention_ms: i64,
    /// How often segments rotate, ms.
    pub rotation_period_ms: i64,
    /// Nacks before a message is dead-lettered.
    pub max_retries: i32,
    /// Most events one tick adds (one transaction's events are never split).
    pub tick_max_events: i64,
    /// Most bytes one tick adds (payloads and headers as JSON).
    pub tick_max_bytes: i64,
    /// The segments in order.
    pub segments: Vec<StreamSegment>,
}

/// One of a stream's segments (partitions of its event log).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StreamSegment {
    /// Segment number.
    pub segment: i32,
    /// Events it holds.
    pub events: i64,
    /// When it last became current.
    #[serde(serialize_with = "serialize_opt_time")]
    pub switched_at: Option<DateTime<Utc>>,
    /// When it was sealed.
    #[serde(serialize_with = "serialize_opt_time")]
    pub sealed_at: Option<DateTime<Utc>>,
}
