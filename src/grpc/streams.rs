//! `pgvs3.v1.StreamService` implemented over the core service: conversion only, mirroring the
//! HTTP stream routes.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::Arc;

use futures_util::{Stream, StreamExt};
use serde_json::{Map, Value};
use tonic::{Request, Response, Status};

use super::convert::{created_at, raw_into_value, to_struct, value_into_raw};
use super::proto::pgvs3::v1 as pb;
use super::proto::pgvs3::v1::stream_service_server::StreamService;
use super::push;
use super::status_of;
use super::{admission_slot, admit_queues, answer, request_id, shutdown_signal};
use crate::core::Service;
use crate::core::job::TraceContext;
use crate::core::stream::{
    Appended, Batch, ConsumerInfo, NewMessage, Receive, StreamConfig, StreamDeadLetter, StreamEvent,
};
use crate::model::json_object;

/// The gRPC binding of the stream half of the service.
#[derive(Clone)]
pub struct StreamAdapter {
    service: Arc<Service>,
}

impl StreamAdapter {
    /// An adapter over `service`.
    pub fn new(service: Arc<Service>) -> Self {
        StreamAdapter { service }
    }
}

/// A message to append, in core terms; an empty id or header map means "not given".
fn message(m: pb::Message, trace: Option<TraceContext>) -> NewMessage {
    NewMessage {
        id: (!m.id.is_empty()).then_some(m.id),
        message_type: m.r#type,
        payload: m.payload.as_ref().map(value_into_raw).unwrap_or_default(),
        headers: (!m.headers.is_empty()).then(|| {
            m.headers
                .into_iter()
                .map(|(k, v)| (k, Value::String(v)))
                .collect::<Map<String, Value>>()
        }),
        trace_context: trace,
    }
}

/// Stored headers (a JSON object of strings) as a protobuf map.
fn headers(headers: Option<&Value>) -> HashMap<String, String> {
    headers
        .and_then(Value::as_object)
        .map(|h| {
            h.iter()
                .map(|(k, v)| {
                    let text = v.as_str().map_or_else(|| v.to_string(), str::to_string);
                    (k.clone(), text)
                })
                .collect()
        })
        .unwrap_or_default()
}

fn appended(a: &Appended) -> pb::Appended {
    pb::Appended {
        id: a.id.to_string(),
        seq: a.seq,
    }
}

/// An event on the wire; takes the event so its payload moves into the protobuf value.
fn event(e: StreamEvent) -> pb::Event {
    pb::Event {
        id: e.id.to_string(),
        seq: e.seq,
        r#type: e.message_type,
        payload: Some(raw_into_value(&e.payload)),
        headers: headers(e.headers.as_ref()),
        retry_count: e.retry_count,
        created_at: Some(created_at(&e.created_at)),
    }
}

fn batch(b: Batch) -> pb::Batch {
    pb::Batch {
        batch_id: b.id.to_string(),
        count: b.events.len() as i64,
        consumer: b.consumer,
        member: b.member.unwrap_or_default(),
        start_tick: b.start_tick,
        end_tick: b.end_tick,
        state: b.state,
        created_at: Some(created_at(&b.created_at)),
        events: b.events.into_iter().map(event).collect(),
    }
}

fn consumer(c: &ConsumerInfo) -> pb::Consumer {
    pb::Consumer {
        consumer: c.name.clone(),
        last_tick: c.last_tick,
        next_tick: c.next_tick,
        cooperative: c.cooperative,
        created_at: Some(created_at(&c.created_at)),
        ticks_behind: c.ticks_behind,
        active_batches: c
            .active_batches
            .iter()
            .map(|b| to_struct(&json_object(b)))
            .collect(),
    }
}

fn config(c: &StreamConfig) -> pb::StreamConfig {
    pb::StreamConfig {
        max_retries: c.max_retries,
        retention: format!("{}ms", c.retention_ms),
        retention_ms: c.retention_ms,
        tick_max_events: c.tick_max_events,
        tick_max_bytes: c.tick_max_bytes,
    }
}

fn dead_letter(d: &StreamDeadLetter) -> pb::DeadLetter {
    pb::DeadLetter {
        id: d.id.to_string(),
        message_id: d.event_id.to_string(),
        consumer: d.consumer.clone(),
        r#type: d.message_type.clone(),
        payload: Some(raw_into_value(&d.payload)),
        headers: headers(d.headers.as_ref()),
        retry_count: d.retry_count,
        reason: d.reason.clone(),
        failed_at: Some(created_at(&d.failed_at)),
    }
}

#[tonic::async_trait]
impl StreamService for StreamAdapter {
    async fn append(
        &self,
        request: Request<pb::AppendRequest>,
    ) -> Result<Response<pb::AppendResponse>, Status> {
        let id = request_id(&request);
        admit_queues(request.extensions(), &id, [request.get_ref().queue.clone()])?;
        // The producer's trace context rides in each message's headers, as over HTTP.
        let trace = super::service::carried_trace(&request);
        let r = request.into_inner();
        let messages: Vec<_> = r
            .messages
            .into_iter()
            .map(|m| message(m, trace.clone()))
            .collect();
        let result = self.service.append(&r.queue, &messages).await;
        answer(
            &id,
            result.map(|done| pb::AppendResponse {
                count: done.len() as i64,
                messages: done.iter().map(appended).collect(),
                queue: r.queue,
            }),
        )
    }

    async fn subscribe(
        &self,
        request: Request<pb::SubscribeRequest>,
    ) -> Result<Response<pb::SubscribeResponse>, Status> {
        let id = request_id(&request);
        admit_queues(request.extensions(), &id, [request.get_ref().queue.clone()])?;
        let r = request.into_inner();
        let result = self
            .service
            .subscribe(&r.queue, &r.consumer, r.from_tick, r.cooperative)
            .await;
        answer(
            &id,
            result.map(|s| pb::SubscribeResponse {
                consumer: s.consumer,
                last_tick: s.last_tick,
                cooperative: s.cooperative,
                created: s.created,
            }),
        )
    }

    async fn unsubscribe(
        &self,
        request: Request<pb::UnsubscribeRequest>,
    ) -> Result<Response<pb::UnsubscribeResponse>, Status> {
        let id = request_id(&request);
        admit_queues(request.extensions(), &id, [request.get_ref().queue.clone()])?;
        let r = request.into_inner();
        let result = self.service.unsubscribe(&r.queue, &r.consumer).await;
        answer(
            &id,
            result.map(|()| pb::UnsubscribeResponse {
                deleted: true,
                consumer: r.consumer,
            }),
        )
    }

    async fn list_consumers(
        &self,
        request: Request<pb::ListConsumersRequest>,
    ) -> Result<Response<pb::ListConsumersResponse>, Status> {
        let id = request_id(&request);
        admit_queues(request.extensions(), &id, [request.get_ref().queue.clone()])?;
        let r = request.into_inner();
        let page = crate::core::page::PageRequest {
            limit: Some(i64::from(r.limit)),
            cursor: Some(r.cursor),
        };
        let result = self.service.consumers(&r.queue, &page).await;
        answer(
            &id,
            result.map(|page| pb::ListConsumersResponse {
                consumers: page.items.iter().map(consumer).collect(),
                next_cursor: page.next_cursor.unwrap_or_default(),
            }),
        )
    }

    async fn receive(
        &self,
        request: Request<pb::ReceiveRequest>,
    ) -> Result<Response<pb::ReceiveResponse>, Status> {
        let id = request_id(&request);
        admit_queues(request.extensions(), &id, [request.get_ref().queue.clone()])?;
        let slot = admission_slot(&request);
        let r = request.into_inner();
        let receive = Receive {
            consumer: r.consumer,
            member: r.member,
            max: r.max,
            max_bytes: r.max_bytes,
            wait_ms: r.wait_ms,
        };
        let result = self
            .service
            .receive(&r.queue, receive, || slot.release())
            .await;
        answer(
            &id,
            result.map(|b| pb::ReceiveResponse {
                batch: b.map(batch),
            }),
        )
    }

    type ReceiveStreamStream =
        Pin<Box<dyn Stream<Item = Result<pb::Batch, Status>> + Send + 'static>>;

    async fn receive_stream(
        &self,
        request: Request<pb::ReceiveStreamRequest>,
    ) -> Result<Response<Self::ReceiveStreamStream>, Status> {
        let id = request_id(&request);
        admit_queues(request.extensions(), &id, [request.get_ref().queue.clone()])?;
        let slot = admission_slot(&request);
        let shutdown = shutdown_signal(&request);
        let r = request.into_inner();
        let receive = Receive {
            consumer: r.consumer,
            member: r.member,
            max: r.max,
            max_bytes: r.max_bytes,
            wait_ms: None,
        };
        let batches = push::batches(self.service.clone(), r.queue, receive, shutdown)
            .await
            .map_err(|e| status_of(&e, &id))?;
        // A stream lasts as long as its consumer: it holds no admission slot.
        slot.release();
        let stream = batches.map(move |b| b.map(batch).map_err(|e| status_of(&e, &id)));
        Ok(Response::new(Box::pin(stream)))
    }

    async fn get_batch(
        &self,
        request: Request<pb::GetBatchRequest>,
    ) -> Result<Response<pb::GetBatchResponse>, Status> {
        let id = request_id(&request);
        admit_queues(request.extensions(), &id, [request.get_ref().queue.clone()])?;
        let r = request.into_inner();
        let result = self.service.batch(&r.queue, &r.batch_id).await;
        answer(
            &id,
            result.map(|b| pb::GetBatchResponse {
                batch: Some(batch(b)),
            }),
        )
    }

    async fn ack(
        &self,
        request: Request<pb::AckRequest>,
    ) -> Result<Response<pb::AckResponse>, Status> {
        let id = request_id(&request);
        admit_queues(request.extensions(), &id, [request.get_ref().queue.clone()])?;
        let r = request.into_inner();
        let result = self
            .service
            .stream_ack(&r.queue, &r.batch_id, r.consumer.as_deref())
            .await;
        answer(
            &id,
            result.map(|cursor| pb::AckResponse {
                acknowledged: true,
                batch_id: r.batch_id,
                cursor_tick: cursor,
            }),
        )
    }

    async fn nack(
        &self,
        request: Request<pb::NackRequest>,
    ) -> Result<Response<pb::NackResponse>, Status> {
        let id = request_id(&request);
        admit_queues(request.extensions(), &id, [request.get_ref().queue.clone()])?;
        let r = request.into_inner();
        let result = self
            .service
            .stream_nack(
                &r.queue,
                &r.batch_id,
                &r.message_id,
                r.consumer.as_deref(),
                r.retry_after.as_deref(),
                r.reason.as_deref(),
            )
            .await;
        answer(
            &id,
            result.map(|o| pb::NackResponse {
                outcome: o.outcome,
                retry_count: o.retry_count,
                due_at: o.due_at.as_ref().map(created_at),
            }),
        )
    }

    async fn info(
        &self,
        request: Request<pb::InfoRequest>,
    ) -> Result<Response<pb::InfoResponse>, Status> {
        let id = request_id(&request);
        admit_queues(request.extensions(), &id, [request.get_ref().queue.clone()])?;
        let queue = request.into_inner().queue;
        let result = self.service.stream_info(&queue).await;
        answer(
            &id,
            result.map(|info| pb::InfoResponse {
                queue,
                info: Some(to_struct(&json_object(&info))),
            }),
        )
    }

    async fn get_config(
        &self,
        request: Request<pb::GetConfigRequest>,
    ) -> Result<Response<pb::GetConfigResponse>, Status> {
        let id = request_id(&request);
        admit_queues(request.extensions(), &id, [request.get_ref().queue.clone()])?;
        let queue = request.into_inner().queue;
        let result = self
            .service
            .stream_config(&queue, None, None, None, None)
            .await;
        answer(
            &id,
            result.map(|c| pb::GetConfigResponse {
                config: Some(config(&c)),
            }),
        )
    }

    async fn set_config(
        &self,
        request: Request<pb::SetConfigRequest>,
    ) -> Result<Response<pb::SetConfigResponse>, Status> {
        let id = request_id(&request);
        admit_queues(request.extensions(), &id, [request.get_ref().queue.clone()])?;
        let r = request.into_inner();
        let result = self
            .service
            .stream_config(
                &r.queue,
                r.max_retries,
                r.retention.as_deref(),
                r.tick_max_events,
                r.tick_max_bytes,
            )
            .await;
        answer(
            &id,
            result.map(|c| pb::SetConfigResponse {
                config: Some(config(&c)),
            }),
        )
    }

    async fn list_dead_letters(
        &self,
        request: Request<pb::ListDeadLettersRequest>,
    ) -> Result<Response<pb::ListDeadLettersResponse>, Status> {
        let id = request_id(&request);
        admit_queues(request.extensions(), &id, [request.get_ref().queue.clone()])?;
        let r = request.into_inner();
        let result = self
            .service
            .stream_dead_letters(&r.queue, r.limit, r.offset)
            .await;
        answer(
            &id,
            result.map(|page| pb::ListDeadLettersResponse {
                dead_letters: page.letters.iter().map(dead_letter).collect(),
                next_offset: page.next_offset,
            }),
        )
    }

    async fn replay_dead_letter(
        &self,
        request: Request<pb::ReplayDeadLetterRequest>,
    ) -> Result<Response<pb::ReplayDeadLetterResponse>, Status> {
        let id = request_id(&request);
        admit_queues(request.extensions(), &id, [request.get_ref().queue.clone()])?;
        let r = request.into_inner();
        let result = self.service.stream_replay(&r.queue, Some(&r.id)).await;
        answer(
            &id,
            result.map(|replayed| pb::ReplayDeadLetterResponse { replayed }),
        )
    }

    async fn replay_dead_letters(
        &self,
        request: Request<pb::ReplayDeadLettersRequest>,
    ) -> Result<Response<pb::ReplayDeadLettersResponse>, Status> {
        let id = request_id(&request);
        admit_queues(request.extensions(), &id, [request.get_ref().queue.clone()])?;
        let queue = request.into_inner().queue;
        let result = self.service.stream_replay(&queue, None).await;
        answer(
            &id,
            result.map(|replayed| pb::ReplayDeadLettersResponse { replayed }),
        )
    }

    async fn purge_dead_letters(
        &self,
        request: Request<pb::PurgeDeadLettersRequest>,
    ) -> Result<Response<pb::PurgeDeadLettersResponse>, Status> {
        let id = request_id(&request);
        admit_queues(request.extensions(), &id, [request.get_ref().queue.clone()])?;
        let r = request.into_inner();
        let result = self.service.stream_purge(&r.queue, &r.older_than).await;
        answer(
            &id,
            result.map(|purged| pb::PurgeDeadLettersResponse { purged }),
        )
    }
}
