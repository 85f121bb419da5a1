//! The stream calls: one `s3p.stream_*` function each (receive and ack straight to the queue's
//! own function when the gateway knows its schema).

use std::sync::Arc;

use chrono::{DateTime, Utc};
use serde_json::value::RawValue;
use serde_json::{Map, Value};
use sqlx::postgres::PgRow;
use sqlx::types::Json;
use sqlx::{AssertSqlSafe, Row};
use uuid::Uuid;

use super::routes::is_stale;
use super::{Store, map_db_error};
use crate::model::error::{CoreError, ErrorKind};
use crate::model::raw_json::RawJson;
use crate::model::stream::{
    ActiveBatch, Appended, Batch, ConsumerInfo, MessageRow, StreamConfig, StreamConfigChanges,
    StreamDeadLetter, StreamEvent, StreamInfo, StreamNackOutcome, Subscription,
};

/// A batch from its row (the template's `stream_batch_contents`): the batch's columns, then its
/// events' columns as arrays, unsorted (NULL when it has none), put in log order here. No row: no
/// batch.
fn batch(row: Option<&PgRow>) -> Result<Option<Batch>, sqlx::Error> {
    let Some(row) = row else {
        return Ok(None);
    };
    let member: String = row.try_get("member_name")?;
    let seqs: Vec<i64> = row.try_get::<Option<_>, _>("seqs")?.unwrap_or_default();
    let ids: Vec<Uuid> = row
        .try_get::<Option<_>, _>("event_ids")?
        .unwrap_or_default();
    let types: Vec<String> = row.try_get::<Option<_>, _>("types")?.unwrap_or_default();
    let payloads: Vec<Json<Box<RawValue>>> =
        row.try_get::<Option<_>, _>("payloads")?.unwrap_or_default();
    let headers: Vec<Option<Json<Value>>> =
        row.try_get::<Option<_>, _>("headers")?.unwrap_or_default();
    let retry_counts: Vec<i32> = row
        .try_get::<Option<_>, _>("retry_counts")?
        .unwrap_or_default();
    let created_ats: Vec<DateTime<Utc>> = row
        .try_get::<Option<_>, _>("created_ats")?
        .unwrap_or_default();
    let n = seqs.len();
    if [ids.len(), types.len(), payloads.len(), headers.len()] != [n; 4]
        || [retry_counts.len(), created_ats.len()] != [n; 2]
    {
        return Err(sqlx::Error::Protocol(format!(
            "stream batch arrays differ in length ({n} seqs)"
        )));
    }
    let mut events: Vec<StreamEvent> = seqs
        .into_iter()
        .zip(ids)
        .zip(types)
        .zip(payloads)
        .zip(headers)
        .zip(retry_counts)
        .zip(created_ats)
        .map(
            |((((((seq, id), message_type), Json(payload)), headers), retry_count), created_at)| {
                StreamEvent {
                    id,
                    seq,
                    message_type,
                    payload: payload.into(),
                    headers: headers.map(|Json(h)| h).filter(|h| !h.is_null()),
                    retry_count,
                    created_at,
                }
            },
        )
        .collect();
    if !events.is_sorted_by_key(|e| e.seq) {
        events.sort_unstable_by_key(|e| e.seq);
    }
    Ok(Some(Batch {
        id: row.try_get("batch_id")?,
        consumer: row.try_get("consumer_name")?,
        member: (!member.is_empty()).then_some(member),
        start_tick: row.try_get("start_tick")?,
        end_tick: row.try_get("end_tick")?,
        state: row.try_get("state")?,
        created_at: row.try_get("batch_created_at")?,
        events,
    }))
}

/// Receives on the queue's own schema before one cuts its tick itself (`stream_receive`).
const RECEIVE_ATTEMPTS: u32 = 3;

/// A receive statement bound to its first five arguments, in the order both the queue's
/// function and the catalog's wrapper take them: consumer, member, max, a fresh batch id and
/// max_bytes.
fn receive_query<'q>(
    sql: impl sqlx::SqlSafeStr,
    (consumer, member, max, max_bytes): (&'q str, Option<&'q str>, Option<i32>, i64),
) -> sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments> {
    sqlx::query(sql)
        .bind(consumer)
        .bind(member)
        .bind(max)
        .bind(Uuid::now_v7())
        .bind(max_bytes)
}

/// The cursor tick of a receive that answered `tick_needed` (it cut no tick; the caller does).
fn tick_needed(rows: &[PgRow]) -> Result<Option<i64>, sqlx::Error> {
    let [row] = rows else {
        return Ok(None);
    };
    let state: Option<String> = row.try_get("state")?;
    if state.as_deref() != Some("tick_needed") {
        return Ok(None);
    }
    row.try_get("start_tick")
}

/// An append's error: a payload the core passed that jsonb still cannot hold (a number past
/// numeric's exponent range, nesting past PostgreSQL's stack) is the caller's 400, not a 500.
fn append_error(error: sqlx::Error) -> CoreError {
    let refused = error
        .as_database_error()
        .and_then(|db| db.code())
        .is_some_and(|code| code.starts_with("22") || code == "54001");
    if refused {
        let reason = error
            .as_database_error()
            .map(|db| db.message().to_string())
            .unwrap_or_default();
        return CoreError::invalid(format!("payload cannot be stored as jsonb: {reason}"))
            .with_detail("field", "payload".into());
    }
    map_db_error(error)
}

/// A receive's error: a 413 carries the next tick's events and bytes (the DETAIL of PV413) as
/// `next_tick_events` and `next_tick_bytes`, the ceilings a retry needs.
fn receive_error(error: sqlx::Error) -> CoreError {
    let detail = error
        .as_database_error()
        .and_then(|db| db.try_downcast_ref::<sqlx::postgres::PgDatabaseError>())
        .filter(|db| db.code() == "PV413")
        .and_then(|db| db.detail())
        .and_then(|d| serde_json::from_str::<Value>(d).ok());
    let mut mapped = map_db_error(error);
    if let Some(detail) = detail {
        for (key, field) in [("events", "next_tick_events"), ("bytes", "next_tick_bytes")] {
            if let Some(n) = detail.get(key).and_then(Value::as_i64) {
                mapped = mapped.with_detail(field, n.into());
            }
        }
    }
    mapped
}

#[derive(sqlx::FromRow)]
struct ConsumerRow {
    consumer: String,
    last_tick: i64,
    next_tick: i64,
    cooperative: bool,
    created_at: DateTime<Utc>,
    ticks_behind: i64,
    active_batches: Json<Vec<ActiveBatch>>,
}

#[derive(sqlx::FromRow)]
struct DeadLetterRow {
    id: Uuid,
    event_id: Uuid,
    consumer: String,
    #[sqlx(rename = "type")]
    message_type: String,
    payload: Json<Box<RawValue>>,
    headers: Option<Value>,
    retry_count: i32,
    reason: Option<String>,
    failed_at: DateTime<Utc>,
    cut: bool,
}

impl Store {
    /// The queue's `stream_insert` (see `routed`), the messages as column arrays (no JSON
    /// document to parse).
    #[tracing::instrument(name = "db", skip_all, fields(op = "stream_append"))]
    pub async fn stream_append(
        &self,
        queue: &str,
        messages: &[MessageRow<'_>],
    ) -> Result<Vec<Appended>, CoreError> {
        let ids: Vec<Uuid> = messages.iter().map(|m| m.id).collect();
        let types: Vec<&str> = messages.iter().map(|m| m.message_type).collect();
        let payloads: Vec<Json<&RawJson>> = messages.iter().map(|m| Json(m.payload)).collect();
        // Headers are rare: a NULL array when no message has any (unnest pads it).
        let headers: Vec<Option<Json<&Map<String, Value>>>> = messages
            .iter()
            .map(|m| m.headers.as_ref().map(Json))
            .collect();
        let headers = headers.iter().any(Option::is_some).then_some(headers);
        let (ids, types, payloads, headers) = (&ids, &types, &payloads, &headers);
        // One row of arrays, not a row per event: decoding a thousand rows cost more than the
        // rest of the answer.
        let rows: Result<(Vec<Uuid>, Vec<i64>), sqlx::Error> = self
            .routed(queue, |schema| {
                let sql = match &schema {
                    Some(schema) => format!(
                        "SELECT event_ids, seqs FROM {schema}.stream_insert($1, $2, $3, $4, $5)"
                    ),
                    None => "SELECT coalesce(array_agg(event_id ORDER BY seq), '{}'),
                                    coalesce(array_agg(seq ORDER BY seq), '{}')
                               FROM s3p.stream_append_columns($1, $2, $3, $4, $5)"
                        .into(),
                };
                self.retry_conflicts(move || {
                    sqlx::query_as(AssertSqlSafe(sql.clone()))
                        .bind(queue)
                        .bind(ids)
                        .bind(types)
                        .bind(payloads)
                        .bind(headers)
                        .fetch_one(self.hot())
                })
            })
            .await?;
        let (event_ids, seqs) = rows.map_err(append_error)?;
        if event_ids.len() != messages.len() || seqs.len() != messages.len() {
            return Err(CoreError::new(
                ErrorKind::Backend,
                format!(
                    "stream_insert answered {} ids and {} seqs for {} messages",
                    event_ids.len(),
                    seqs.len(),
                    messages.len()
                ),
            ));
        }
        // New events wait for a tick (and a rotation, later).
        self.mark_due(queue, chrono::Utc::now());
        Ok(event_ids
            .into_iter()
            .zip(seqs)
            .map(|(id, seq)| Appended { id, seq })
            .collect())
    }

    /// `s3p.stream_subscribe`.
    #[tracing::instrument(name = "db", skip_all, fields(op = "stream_subscribe"))]
    pub async fn stream_subscribe(
        &self,
        queue: &str,
        consumer: &str,
        from_tick: Option<i64>,
        cooperative: Option<bool>,
    ) -> Result<Subscription, CoreError> {
        let row: Option<(String, i64, bool, bool)> = self
            .retry_conflicts(|| {
                sqlx::query_as("SELECT * FROM s3p.stream_subscribe($1, $2, $3, $4)")
                    .bind(queue)
                    .bind(consumer)
                    .bind(from_tick)
                    .bind(cooperative)
                    .fetch_optional(self.hot())
            })
            .await
            .map_err(map_db_error)?;
        let (consumer, last_tick, cooperative, created) = row.ok_or_else(|| {
            CoreError::new(
                ErrorKind::Conflict,
                "a concurrent subscribe of this consumer won; retry",
            )
        })?;
        Ok(Subscription {
            consumer,
            last_tick,
            cooperative,
            created,
        })
    }

    /// `s3p.stream_unsubscribe`.
    #[tracing::instrument(name = "db", skip_all, fields(op = "stream_unsubscribe"))]
    pub async fn stream_unsubscribe(&self, queue: &str, consumer: &str) -> Result<(), CoreError> {
        self.retry_conflicts(|| {
            sqlx::query("SELECT s3p.stream_unsubscribe($1, $2)")
                .bind(queue)
                .bind(consumer)
                .execute(self.hot())
        })
        .await
        .map(|_| ())
        .map_err(map_db_error)
    }

    /// `s3p.stream_consumers`: up to `page_size` consumers named after `after`, in name order.
    #[tracing::instrument(name = "db", skip_all, fields(op = "stream_consumers"))]
    pub async fn stream_consumers(
        &self,
        queue: &str,
        after: Option<&str>,
        page_size: i64,
    ) -> Result<Vec<ConsumerInfo>, CoreError> {
        let rows: Vec<ConsumerRow> = self
            .retry_conflicts(|| {
                sqlx::query_as("SELECT * FROM s3p.stream_consumers($1, $2, $3)")
                    .bind(queue)
                    .bind(after)
                    .bind(i32::try_from(page_size).unwrap_or(i32::MAX))
                    .fetch_all(self.hot())
            })
            .await
            .map_err(map_db_error)?;
        Ok(rows
            .into_iter()
            .map(|r| ConsumerInfo {
                name: r.consumer,
                last_tick: r.last_tick,
                next_tick: r.next_tick,
                cooperative: r.cooperative,
                created_at: r.created_at,
                ticks_behind: r.ticks_behind,
                active_batches: r.active_batches.0,
            })
            .collect())
    }

    /// `s3p.stream_consumer_count`: how many consumers the stream has.
    #[tracing::instrument(name = "db", skip_all, fields(op = "stream_consumer_count"))]
    pub async fn stream_consumer_count(&self, queue: &str) -> Result<i64, CoreError> {
        self.retry_conflicts(|| {
            sqlx::query_scalar("SELECT s3p.stream_consumer_count($1)")
                .bind(queue)
                .fetch_one(self.hot())
        })
        .await
        .map_err(map_db_error)
    }

    /// The queue's `stream_receive` with a fresh batch id (see `routed`). On the queue's own
    /// schema a tick it needs is cut first in a transaction of its own (`stream_tick_for`), so
    /// other consumers of that tick wait for the cut only, not for this receive's read and commit:
    /// the receive answers `tick_needed` instead of cutting, the tick is cut, the receive runs
    /// again (and, should it still find none, a third time cutting itself).
    #[tracing::instrument(name = "db", skip_all, fields(op = "stream_receive"))]
    pub async fn stream_receive(
        &self,
        queue: &str,
        consumer: &str,
        member: Option<&str>,
        max: Option<i32>,
        max_bytes: i64,
    ) -> Result<Option<Batch>, CoreError> {
        let rows: Result<Vec<PgRow>, sqlx::Error> = self
            .routed(queue, |schema| async move {
                let Some(schema) = schema else {
                    // The queue goes last, where only the catalog's wrapper reads it.
                    return self
                        .retry_conflicts(|| {
                            receive_query(
                                "SELECT * FROM s3p.stream_receive($6, $1, $2, $3, $4, $5)",
                                (consumer, member, max, max_bytes),
                            )
                            .bind(queue)
                            .fetch_all(self.hot())
                        })
                        .await;
                };
                let receive = format!(
                    "SELECT batch_id, consumer AS consumer_name, member AS member_name,
                            start_tick, end_tick, state, batch_created_at, seqs, event_ids, types,
                            payloads, headers, retry_counts, created_ats
                       FROM {schema}.stream_receive($1, $2, $3, $4, $5, $6)"
                );
                let tick = format!("SELECT {schema}.stream_tick_for($1, $2, $3)");
                let mut attempt = 0;
                loop {
                    attempt += 1;
                    let cut_ticks = attempt == RECEIVE_ATTEMPTS;
                    let rows = self
                        .retry_conflicts(|| {
                            receive_query(
                                AssertSqlSafe(receive.clone()),
                                (consumer, member, max, max_bytes),
                            )
                            .bind(cut_ticks)
                            .fetch_all(self.hot())
                        })
                        .await?;
                    let Some(after) = tick_needed(&rows)?.filter(|_| !cut_ticks) else {
                        return Ok(rows);
                    };
                    self.retry_conflicts(|| {
                        sqlx::query(AssertSqlSafe(tick.clone()))
                            .bind(after)
                            .bind(max)
                            .bind(max_bytes)
                            .execute(self.hot())
                    })
                    .await?;
                }
            })
            .await?;
        batch(rows.map_err(receive_error)?.first()).map_err(map_db_error)
    }

    /// `s3p.stream_batch`.
    #[tracing::instrument(name = "db", skip_all, fields(op = "stream_batch"))]
    pub async fn stream_batch(&self, queue: &str, id: Uuid) -> Result<Batch, CoreError> {
        let row: Option<PgRow> = self
            .retry_conflicts(|| {
                sqlx::query("SELECT * FROM s3p.stream_batch($1, $2)")
                    .bind(queue)
                    .bind(id)
                    .fetch_optional(self.hot())
            })
            .await
            .map_err(map_db_error)?;
        batch(row.as_ref())
            .map_err(map_db_error)?
            .ok_or_else(|| CoreError::not_found("batch", &id.to_string()))
    }

    /// `s3p.stream_batch_state`: a batch's state without its events (`None`: no such batch).
    #[tracing::instrument(name = "db", skip_all, fields(op = "stream_batch_state"))]
    pub async fn stream_batch_state(
        &self,
        queue: &str,
        id: Uuid,
    ) -> Result<Option<String>, CoreError> {
        self.retry_conflicts(|| {
            sqlx::query_scalar("SELECT s3p.stream_batch_state($1, $2)")
                .bind(queue)
                .bind(id)
                .fetch_one(self.hot())
        })
        .await
        .map_err(map_db_error)
    }

    /// The queue's `stream_ack` (see `routed`): the consumer's cursor tick afterwards.
    #[tracing::instrument(name = "db", skip_all, fields(op = "stream_ack"))]
    pub async fn stream_ack(
        &self,
        queue: &str,
        id: Uuid,
        consumer: Option<&str>,
    ) -> Result<i64, CoreError> {
        let answer: Result<(String, i64), sqlx::Error> = self
            .routed(queue, |schema| {
                let sql = match &schema {
                    Some(schema) => format!("SELECT * FROM {schema}.stream_ack($1, $2)"),
                    None => "SELECT * FROM s3p.stream_ack($3, $1, $2)".into(),
                };
                self.retry_conflicts(move || {
                    let query = sqlx::query_as(AssertSqlSafe(sql.clone()))
                        .bind(id)
                        .bind(consumer);
                    let query = if schema.is_none() {
                        query.bind(queue)
                    } else {
                        query
                    };
                    query.fetch_one(self.hot())
                })
            })
            .await?;
        answer.map(|(_, cursor)| cursor).map_err(map_db_error)
    }

    /// Runs `statement` on the queue's own schema when this gateway knows it (`Some`), else on
    /// the catalog's `s3p` wrapper (`None`), which also answers an unknown queue. A route found
    /// stale (the queue dropped or rebuilt) is forgotten and the statement runs on the wrapper.
    /// The wrappers' dynamic SQL and their second copy of the rows cost about as much as a
    /// receive itself.
    async fn routed<T, F, Fut>(
        &self,
        queue: &str,
        mut statement: F,
    ) -> Result<Result<T, sqlx::Error>, CoreError>
    where
        F: FnMut(Option<Arc<str>>) -> Fut,
        Fut: std::future::Future<Output = Result<T, sqlx::Error>>,
    {
        let routes = self.grouped.routes();
        if let Some(schema) = routes.schema(self.hot(), queue).await? {
            match statement(Some(schema)).await {
                Err(error) if is_stale(&error) => routes.forget(queue),
                answer => return Ok(answer),
            }
        }
        Ok(statement(None).await)
    }

    /// `s3p.stream_nack`.
    #[tracing::instrument(name = "db", skip_all, fields(op = "stream_nack"))]
    pub async fn stream_nack(
        &self,
        queue: &str,
        id: Uuid,
        consumer: Option<&str>,
        message: Uuid,
        retry_after_ms: Option<i64>,
        reason: Option<&str>,
    ) -> Result<StreamNackOutcome, CoreError> {
        let (outcome, retry_count, due_at): (String, i32, Option<DateTime<Utc>>) = self
            .retry_conflicts(|| {
                sqlx::query_as("SELECT * FROM s3p.stream_nack($1, $2, $3, $4, $5, $6)")
                    .bind(queue)
                    .bind(id)
                    .bind(consumer)
                    .bind(message)
                    .bind(retry_after_ms)
                    .bind(reason)
                    .fetch_one(self.hot())
            })
            .await
            .map_err(map_db_error)?;
        self.mark_due(queue, due_at.unwrap_or_else(chrono::Utc::now));
        Ok(StreamNackOutcome {
            outcome,
            retry_count,
            due_at,
        })
    }

    /// `s3p.stream_info`.
    #[tracing::instrument(name = "db", skip_all, fields(op = "stream_info"))]
    pub async fn stream_info(&self, queue: &str) -> Result<StreamInfo, CoreError> {
        self.retry_conflicts(|| {
            sqlx::query_scalar("SELECT s3p.stream_info($1)")
                .bind(queue)
                .fetch_one(self.hot())
        })
        .await
        .map(|Json(info)| info)
        .map_err(map_db_error)
    }

    /// `s3p.stream_configure` (`None` leaves a setting as it is).
    #[tracing::instrument(name = "db", skip_all, fields(op = "stream_configure"))]
    pub async fn stream_configure(
        &self,
        queue: &str,
        changes: &StreamConfigChanges,
    ) -> Result<StreamConfig, CoreError> {
        let (max_retries, retention_ms, tick_max_events, tick_max_bytes): (i32, i64, i32, i64) =
            self.retry_conflicts(|| {
                sqlx::query_as("SELECT * FROM s3p.stream_configure($1, $2, $3, $4, $5)")
                    .bind(queue)
                    .bind(changes.max_retries)
                    .bind(changes.retention_ms)
                    .bind(changes.tick_max_events)
                    .bind(changes.tick_max_bytes)
                    .fetch_one(self.hot())
            })
            .await
            .map_err(map_db_error)?;
        Ok(StreamConfig {
            max_retries,
            retention_ms,
            tick_max_events,
            tick_max_bytes,
        })
    }

    /// `s3p.stream_dead_letters`: the page, and whether `max_bytes` cut it short.
    #[tracing::instrument(name = "db", skip_all, fields(op = "stream_dead_letters"))]
    pub async fn stream_dead_letters(
        &self,
        queue: &str,
        limit: i32,
        offset: i32,
        max_bytes: i64,
    ) -> Result<(Vec<StreamDeadLetter>, bool), CoreError> {
        let rows: Vec<DeadLetterRow> = self
            .retry_conflicts(|| {
                sqlx::query_as("SELECT * FROM s3p.stream_dead_letters($1, $2, $3, $4)")
                    .bind(queue)
                    .bind(limit)
                    .bind(offset)
                    .bind(max_bytes)
                    .fetch_all(self.hot())
            })
            .await
            .map_err(map_db_error)?;
        let cut = rows.first().is_some_and(|r| r.cut);
        let letters = rows
            .into_iter()
            .map(|r| StreamDeadLetter {
                id: r.id,
                event_id: r.event_id,
                consumer: r.consumer,
                message_type: r.message_type,
                payload: r.payload.0.into(),
                headers: r.headers.filter(|h| !h.is_null()),
                retry_count: r.retry_count,
                reason: r.reason,
                failed_at: r.failed_at,
            })
            .collect();
        Ok((letters, cut))
    }

    /// `s3p.stream_replay`: how many were replayed.
    #[tracing::instrument(name = "db", skip_all, fields(op = "stream_replay"))]
    pub async fn stream_replay(&self, queue: &str, id: Option<Uuid>) -> Result<i32, CoreError> {
        self.retry_conflicts(|| {
            sqlx::query_scalar("SELECT s3p.stream_replay($1, $2)")
                .bind(queue)
                .bind(id)
                .fetch_one(self.hot())
        })
        .await
        .map_err(map_db_error)
    }

    /// `s3p.stream_purge_dead_letters`: how many were purged.
    #[tracing::instrument(name = "db", skip_all, fields(op = "stream_purge"))]
    pub async fn stream_purge(&self, queue: &str, older_than_ms: i64) -> Result<i32, CoreError> {
        self.retry_conflicts(|| {
            sqlx::query_scalar("SELECT s3p.stream_purge_dead_letters($1, $2)")
                .bind(queue)
                .bind(older_than_ms)
                .fetch_one(self.hot())
        })
        .await
        .map_err(map_db_error)
    }
}
