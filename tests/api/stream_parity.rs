//! Event streams over both protocols: the same scenarios run through HTTP and through gRPC
//! (`pgvs3.v1.StreamService`), each on its own server and database, and the observable traces
//! (counts, states, codes, payloads; never ids or ticks) must be the same.

use crate::common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use pgvs3::grpc::proto::pgvs3::v1 as pb;
use pgvs3::grpc::proto::pgvs3::v1::stream_service_client::StreamServiceClient;
use prost_types::value::Kind;
use serde_json::{Map, Value, json};
use tonic::transport::Channel;

const QUEUE: &str = "parity";

/// An event as either protocol delivers it.
#[derive(Debug, Clone, PartialEq)]
struct Ev {
    id: String,
    kind: String,
    payload: Value,
    headers: BTreeMap<String, String>,
    retry_count: i64,
}

/// A batch as either protocol delivers it.
#[derive(Debug, Clone, PartialEq)]
struct Got {
    id: String,
    state: String,
    events: Vec<Ev>,
}

/// A dead letter as either protocol lists it.
#[derive(Debug, Clone, PartialEq)]
struct Dl {
    id: String,
    message_id: String,
    consumer: String,
    payload: Value,
    retry_count: i64,
    reason: Option<String>,
}

/// One protocol's view of the stream API; an error is the OJS code, after checking that the
/// transport status (HTTP status or gRPC code) is the one that code maps to.
#[derive(Clone)]
enum Client {
    Http(reqwest::Client, String),
    Grpc(StreamServiceClient<Channel>),
}

/// The HTTP status and gRPC code each error code used here must travel as.
fn transport_of(code: &str) -> (u16, tonic::Code) {
    match code {
        "invalid_request" => (400, tonic::Code::InvalidArgument),
        "not_found" => (404, tonic::Code::NotFound),
        "conflict" => (409, tonic::Code::FailedPrecondition),
        "batch_too_large" => (413, tonic::Code::OutOfRange),
        "read_only" => (403, tonic::Code::PermissionDenied),
        other => panic!("unexpected error code {other}"),
    }
}

fn grpc_error(status: tonic::Status) -> String {
    use tonic_types::StatusExt;
    let Some(info) = status.get_details_error_info() else {
        panic!("gRPC error without ErrorInfo: {status:?}");
    };
    assert_eq!(
        status.code(),
        transport_of(&info.reason).1,
        "gRPC code of {}",
        info.reason
    );
    assert!(
        info.metadata
            .get("request_id")
            .is_some_and(|id| !id.is_empty()),
        "ErrorInfo carries the request id"
    );
    info.reason
}

/// protobuf Value → JSON, integral numbers as integers (as the server stores them).
fn json_of(value: prost_types::Value) -> Value {
    match value.kind {
        None | Some(Kind::NullValue(_)) => Value::Null,
        Some(Kind::BoolValue(b)) => Value::Bool(b),
        Some(Kind::NumberValue(n)) if n.fract() == 0.0 => json!(n as i64),
        Some(Kind::NumberValue(n)) => json!(n),
        Some(Kind::StringValue(s)) => Value::String(s),
        Some(Kind::ListValue(l)) => Value::Array(l.values.into_iter().map(json_of).collect()),
        Some(Kind::StructValue(s)) => Value::Object(object_of(s)),
    }
}

fn object_of(s: prost_types::Struct) -> Map<String, Value> {
    s.fields.into_iter().map(|(k, v)| (k, json_of(v))).collect()
}

/// JSON → protobuf Value.
fn value_of(value: &Value) -> prost_types::Value {
    let kind = match value {
        Value::Null => Kind::NullValue(0),
        Value::Bool(b) => Kind::BoolValue(*b),
        Value::Number(n) => Kind::NumberValue(n.as_f64().unwrap_or_default()),
        Value::String(s) => Kind::StringValue(s.clone()),
        Value::Array(items) => Kind::ListValue(prost_types::ListValue {
            values: items.iter().map(value_of).collect(),
        }),
        Value::Object(map) => Kind::StructValue(prost_types::Struct {
            fields: map.iter().map(|(k, v)| (k.clone(), value_of(v))).collect(),
        }),
    };
    prost_types::Value { kind: Some(kind) }
}

fn text(v: &Value) -> String {
    v.as_str().unwrap_or_default().to_string()
}

fn http_batch(body: &Value) -> Option<Got> {
    let id = body["batch_id"].as_str()?;
    let events: Vec<Ev> = body["events"]
        .as_array()
        .map(|events| {
            events
                .iter()
                .map(|e| Ev {
                    id: text(&e["id"]),
                    kind: text(&e["type"]),
                    payload: e["payload"].clone(),
                    headers: e["headers"]
                        .as_object()
                        .map(|h| h.iter().map(|(k, v)| (k.clone(), text(v))).collect())
                        .unwrap_or_default(),
                    retry_count: e["retry_count"].as_i64().unwrap_or(-1),
                })
                .collect()
        })
        .unwrap_or_default();
    assert_eq!(body["count"].as_u64(), Some(events.len() as u64), "count");
    Some(Got {
        id: id.to_string(),
        state: text(&body["state"]),
        events,
    })
}

fn grpc_batch(b: pb::Batch) -> Got {
    assert_eq!(b.count, b.events.len() as i64, "count");
    Got {
        id: b.batch_id,
        state: b.state,
        events: b
            .events
            .into_iter()
            .map(|e| Ev {
                id: e.id,
                kind: e.r#type,
                payload: e.payload.map_or(Value::Null, json_of),
                headers: e.headers.into_iter().collect(),
                retry_count: i64::from(e.retry_count),
            })
            .collect(),
    }
}

impl Client {
    async fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<Value>,
    ) -> Result<(u16, Value), String> {
        let Client::Http(http, base) = self else {
            unreachable!()
        };
        let mut request = http.request(method, format!("{base}{path}"));
        if let Some(body) = body {
            request = request
                .header("content-type", "application/openjobspec+json")
                .body(body.to_string());
        }
        let response = request.send().await.map_err(|e| e.to_string())?;
        let status = response.status().as_u16();
        let body: Value = response.json().await.map_err(|e| e.to_string())?;
        if (200..300).contains(&status) {
            return Ok((status, body));
        }
        let code = text(&body["error"]["code"]);
        assert_eq!(status, transport_of(&code).0, "HTTP status of {code}");
        Err(code)
    }

    async fn append(&mut self, messages: &[Value]) -> Result<usize, String> {
        match self {
            Client::Http(..) => {
                let path = format!("/ojs/v1/queues/{QUEUE}/messages");
                if let [one] = messages {
                    let (status, body) = self
                        .call(reqwest::Method::POST, &path, Some(one.clone()))
                        .await?;
                    assert_eq!(status, 201);
                    Ok(usize::from(body["id"].is_string()))
                } else {
                    let body = json!({ "messages": messages });
                    let (status, body) = self
                        .call(reqwest::Method::POST, &format!("{path}/batch"), Some(body))
                        .await?;
                    assert_eq!(status, 201);
                    let count = body["count"].as_u64().unwrap_or_default() as usize;
                    assert_eq!(body["messages"].as_array().map(Vec::len), Some(count));
                    Ok(count)
                }
            }
            Client::Grpc(grpc) => {
                let messages = messages
                    .iter()
                    .map(|m| pb::Message {
                        id: String::new(),
                        r#type: text(&m["type"]),
                        payload: Some(value_of(&m["payload"])),
                        headers: m["headers"]
                            .as_object()
                            .map(|h| h.iter().map(|(k, v)| (k.clone(), text(v))).collect())
                            .unwrap_or_default(),
                    })
                    .collect();
                let answer = grpc
                    .append(pb::AppendRequest {
                        queue: QUEUE.into(),
                        messages,
                    })
                    .await
                    .map_err(grpc_error)?
                    .into_inner();
                assert_eq!(answer.messages.len() as i64, answer.count);
                assert_eq!(answer.queue, QUEUE);
                Ok(answer.count as usize)
            }
        }
    }

    /// Subscribes; returns (created, last_tick).
    async fn subscribe(
        &mut self,
        consumer: &str,
        from_tick: Option<i64>,
    ) -> Result<(bool, i64), String> {
        match self {
            Client::Http(..) => {
                let mut body = json!({ "consumer": consumer });
                if let Some(tick) = from_tick {
                    body["from_tick"] = json!(tick);
                }
                let (status, body) = self
                    .call(
                        reqwest::Method::POST,
                        &format!("/ojs/v1/queues/{QUEUE}/consumers"),
                        Some(body),
                    )
                    .await?;
                let created = body["consumer"]["created"].as_bool().unwrap_or_default();
                assert_eq!(status, if created { 201 } else { 200 });
                Ok((
                    created,
                    body["consumer"]["last_tick"].as_i64().unwrap_or(-1),
                ))
            }
            Client::Grpc(grpc) => {
                let s = grpc
                    .subscribe(pb::SubscribeRequest {
                        queue: QUEUE.into(),
                        consumer: consumer.into(),
                        from_tick,
                        cooperative: None,
                    })
                    .await
                    .map_err(grpc_error)?
                    .into_inner();
                Ok((s.created, s.last_tick))
            }
        }
    }

    async fn unsubscribe(&mut self, consumer: &str) -> Result<bool, String> {
        match self {
            Client::Http(..) => {
                let (_, body) = self
                    .call(
                        reqwest::Method::DELETE,
                        &format!("/ojs/v1/queues/{QUEUE}/consumers/{consumer}"),
                        None,
                    )
                    .await?;
                Ok(body["deleted"].as_bool().unwrap_or_default())
            }
            Client::Grpc(grpc) => grpc
                .unsubscribe(pb::UnsubscribeRequest {
                    queue: QUEUE.into(),
                    consumer: consumer.into(),
                })
                .await
                .map(|r| r.into_inner().deleted)
                .map_err(grpc_error),
        }
    }

    /// (consumer, active batch count) per consumer.
    async fn consumers(&mut self) -> Result<Vec<(String, usize)>, String> {
        match self {
            Client::Http(..) => {
                let (_, body) = self
                    .call(
                        reqwest::Method::GET,
                        &format!("/ojs/v1/queues/{QUEUE}/consumers"),
                        None,
                    )
                    .await?;
                Ok(body["consumers"]
                    .as_array()
                    .map(|list| {
                        list.iter()
                            .map(|c| {
                                (
                                    text(&c["consumer"]),
                                    c["active_batches"].as_array().map_or(0, Vec::len),
                                )
                            })
                            .collect()
                    })
                    .unwrap_or_default())
            }
            Client::Grpc(grpc) => Ok(grpc
                .list_consumers(pb::ListConsumersRequest {
                    queue: QUEUE.into(),
                    ..Default::default()
                })
                .await
                .map_err(grpc_error)?
                .into_inner()
                .consumers
                .into_iter()
                .map(|c| (c.consumer, c.active_batches.len()))
                .collect()),
        }
    }

    async fn receive_in(
        &mut self,
        queue: &str,
        consumer: &str,
        (max, max_bytes): (Option<i64>, Option<i64>),
        wait_ms: Option<i64>,
    ) -> Result<Option<Got>, String> {
        match self {
            Client::Http(..) => {
                let mut body = json!({ "consumer": consumer });
                if let Some(max) = max {
                    body["max"] = json!(max);
                }
                if let Some(max_bytes) = max_bytes {
                    body["max_bytes"] = json!(max_bytes);
                }
                if let Some(wait) = wait_ms {
                    body["wait_ms"] = json!(wait);
                }
                let (_, body) = self
                    .call(
                        reqwest::Method::POST,
                        &format!("/ojs/v1/queues/{queue}/receive"),
                        Some(body),
                    )
                    .await?;
                Ok(http_batch(&body))
            }
            Client::Grpc(grpc) => Ok(grpc
                .receive(pb::ReceiveRequest {
                    queue: queue.into(),
                    consumer: consumer.into(),
                    member: None,
                    max,
                    wait_ms,
                    max_bytes,
                })
                .await
                .map_err(grpc_error)?
                .into_inner()
                .batch
                .map(grpc_batch)),
        }
    }

    async fn receive(&mut self, consumer: &str, max: Option<i64>) -> Result<Option<Got>, String> {
        self.receive_in(QUEUE, consumer, (max, None), None).await
    }

    async fn batch(&mut self, id: &str) -> Result<Got, String> {
        match self {
            Client::Http(..) => {
                let (_, body) = self
                    .call(
                        reqwest::Method::GET,
                        &format!("/ojs/v1/queues/{QUEUE}/batches/{id}"),
                        None,
                    )
                    .await?;
                Ok(http_batch(&body).expect("a batch"))
            }
            Client::Grpc(grpc) => Ok(grpc_batch(
                grpc.get_batch(pb::GetBatchRequest {
                    queue: QUEUE.into(),
                    batch_id: id.into(),
                })
                .await
                .map_err(grpc_error)?
                .into_inner()
                .batch
                .expect("a batch"),
            )),
        }
    }

    /// Acknowledges; returns the cursor tick.
    async fn ack(&mut self, batch: &str, consumer: Option<&str>) -> Result<i64, String> {
        match self {
            Client::Http(..) => {
                let mut body = json!({ "queue": QUEUE, "batch_id": batch });
                if let Some(c) = consumer {
                    body["consumer"] = json!(c);
                }
                let (_, body) = self
                    .call(reqwest::Method::POST, "/ojs/v1/streams/ack", Some(body))
                    .await?;
                assert_eq!(body["acknowledged"], json!(true));
                assert_eq!(body["batch_id"], json!(batch));
                Ok(body["cursor_tick"].as_i64().unwrap_or(-1))
            }
            Client::Grpc(grpc) => {
                let a = grpc
                    .ack(pb::AckRequest {
                        queue: QUEUE.into(),
                        batch_id: batch.into(),
                        consumer: consumer.map(str::to_string),
                    })
                    .await
                    .map_err(grpc_error)?
                    .into_inner();
                assert!(a.acknowledged);
                assert_eq!(a.batch_id, batch);
                Ok(a.cursor_tick)
            }
        }
    }

    /// Nacks; returns (outcome, retry_count, whether a due time came back).
    async fn nack(
        &mut self,
        batch: &str,
        message: &str,
        reason: &str,
    ) -> Result<(String, i64, bool), String> {
        match self {
            Client::Http(..) => {
                let body = json!({ "queue": QUEUE, "batch_id": batch, "message_id": message,
                    "consumer": "c1", "retry_after": "0s", "reason": reason });
                let (_, body) = self
                    .call(reqwest::Method::POST, "/ojs/v1/streams/nack", Some(body))
                    .await?;
                Ok((
                    text(&body["outcome"]),
                    body["retry_count"].as_i64().unwrap_or(-1),
                    body["due_at"].is_string(),
                ))
            }
            Client::Grpc(grpc) => {
                let n = grpc
                    .nack(pb::NackRequest {
                        queue: QUEUE.into(),
                        batch_id: batch.into(),
                        message_id: message.into(),
                        consumer: Some("c1".into()),
                        retry_after: Some("0s".into()),
                        reason: Some(reason.into()),
                    })
                    .await
                    .map_err(grpc_error)?
                    .into_inner();
                Ok((n.outcome, i64::from(n.retry_count), n.due_at.is_some()))
            }
        }
    }

    /// Reads (both `None`) or updates the config; returns (max_retries, retention, retention_ms).
    async fn config(
        &mut self,
        max_retries: Option<i64>,
        retention: Option<&str>,
    ) -> Result<(i64, String, i64), String> {
        let read = max_retries.is_none() && retention.is_none();
        match self {
            Client::Http(..) => {
                let path = format!("/ojs/v1/queues/{QUEUE}/config");
                let (_, body) = if read {
                    self.call(reqwest::Method::GET, &path, None).await?
                } else {
                    let mut body = json!({});
                    if let Some(n) = max_retries {
                        body["max_retries"] = json!(n);
                    }
                    if let Some(r) = retention {
                        body["retention"] = json!(r);
                    }
                    self.call(reqwest::Method::POST, &path, Some(body)).await?
                };
                Ok((
                    body["max_retries"].as_i64().unwrap_or(-1),
                    text(&body["retention"]),
                    body["retention_ms"].as_i64().unwrap_or(-1),
                ))
            }
            Client::Grpc(grpc) => {
                let config = if read {
                    grpc.get_config(pb::GetConfigRequest {
                        queue: QUEUE.into(),
                    })
                    .await
                    .map_err(grpc_error)?
                    .into_inner()
                    .config
                } else {
                    grpc.set_config(pb::SetConfigRequest {
                        queue: QUEUE.into(),
                        max_retries,
                        retention: retention.map(str::to_string),
                        ..Default::default()
                    })
                    .await
                    .map_err(grpc_error)?
                    .into_inner()
                    .config
                };
                let c = config.expect("a config");
                Ok((i64::from(c.max_retries), c.retention, c.retention_ms))
            }
        }
    }

    async fn dead_letters(&mut self) -> Result<Vec<Dl>, String> {
        match self {
            Client::Http(..) => {
                let (_, body) = self
                    .call(
                        reqwest::Method::GET,
                        &format!("/ojs/v1/queues/{QUEUE}/dlq"),
                        None,
                    )
                    .await?;
                Ok(body["dead_letters"]
                    .as_array()
                    .map(|list| {
                        list.iter()
                            .map(|d| Dl {
                                id: text(&d["id"]),
                                message_id: text(&d["message_id"]),
                                consumer: text(&d["consumer"]),
                                payload: d["payload"].clone(),
                                retry_count: d["retry_count"].as_i64().unwrap_or(-1),
                                reason: d["reason"].as_str().map(str::to_string),
                            })
                            .collect()
                    })
                    .unwrap_or_default())
            }
            Client::Grpc(grpc) => Ok(grpc
                .list_dead_letters(pb::ListDeadLettersRequest {
                    queue: QUEUE.into(),
                    limit: None,
                    offset: None,
                })
                .await
                .map_err(grpc_error)?
                .into_inner()
                .dead_letters
                .into_iter()
                .map(|d| Dl {
                    id: d.id,
                    message_id: d.message_id,
                    consumer: d.consumer,
                    payload: d.payload.map_or(Value::Null, json_of),
                    retry_count: i64::from(d.retry_count),
                    reason: d.reason,
                })
                .collect()),
        }
    }

    /// Replays one dead letter, or all with `None`.
    async fn replay(&mut self, id: Option<&str>) -> Result<i64, String> {
        match self {
            Client::Http(..) => {
                let path = match id {
                    Some(id) => format!("/ojs/v1/queues/{QUEUE}/dlq/{id}/replay"),
                    None => format!("/ojs/v1/queues/{QUEUE}/dlq/replay"),
                };
                let (_, body) = self.call(reqwest::Method::POST, &path, None).await?;
                Ok(body["replayed"].as_i64().unwrap_or(-1))
            }
            Client::Grpc(grpc) => match id {
                Some(id) => grpc
                    .replay_dead_letter(pb::ReplayDeadLetterRequest {
                        queue: QUEUE.into(),
                        id: id.into(),
                    })
                    .await
                    .map(|r| i64::from(r.into_inner().replayed))
                    .map_err(grpc_error),
                None => grpc
                    .replay_dead_letters(pb::ReplayDeadLettersRequest {
                        queue: QUEUE.into(),
                    })
                    .await
                    .map(|r| i64::from(r.into_inner().replayed))
                    .map_err(grpc_error),
            },
        }
    }

    async fn purge(&mut self, older_than: &str) -> Result<i64, String> {
        match self {
            Client::Http(..) => {
                let (_, body) = self
                    .call(
                        reqwest::Method::DELETE,
                        &format!("/ojs/v1/queues/{QUEUE}/dlq?older_than={older_than}"),
                        None,
                    )
                    .await?;
                Ok(body["purged"].as_i64().unwrap_or(-1))
            }
            Client::Grpc(grpc) => grpc
                .purge_dead_letters(pb::PurgeDeadLettersRequest {
                    queue: QUEUE.into(),
                    older_than: older_than.into(),
                })
                .await
                .map(|r| i64::from(r.into_inner().purged))
                .map_err(grpc_error),
        }
    }

    /// The stream info without the volatile fields (times, ticks, seqs).
    async fn info(&mut self) -> Result<BTreeMap<String, Value>, String> {
        let (queue, fields) = match self {
            Client::Http(..) => {
                let (_, body) = self
                    .call(
                        reqwest::Method::GET,
                        &format!("/ojs/v1/queues/{QUEUE}/info"),
                        None,
                    )
                    .await?;
                let mut fields = body.as_object().cloned().unwrap_or_default();
                let queue = fields.remove("queue").map(|q| text(&q));
                (queue.unwrap_or_default(), fields)
            }
            Client::Grpc(grpc) => {
                let info = grpc
                    .info(pb::InfoRequest {
                        queue: QUEUE.into(),
                    })
                    .await
                    .map_err(grpc_error)?
                    .into_inner();
                (info.queue, info.info.map(object_of).unwrap_or_default())
            }
        };
        assert_eq!(queue, QUEUE);
        let keep = [
            "events",
            "consumers",
            "dead_letters",
            "pending_retries",
            "active_batches",
            "current_segment",
            "rotations",
            "retention_ms",
            "rotation_period_ms",
            "max_retries",
        ];
        Ok(fields
            .into_iter()
            .filter(|(k, _)| keep.contains(&k.as_str()))
            .collect())
    }
}

/// A batch as a trace line: state, payload `n`s, retry counts (ids and ticks left out).
fn show(batch: &Result<Option<Got>, String>) -> String {
    match batch {
        Err(code) => format!("Err({code})"),
        Ok(None) => "empty".to_string(),
        Ok(Some(b)) => {
            let ns: Vec<Value> = b.events.iter().map(|e| e.payload["n"].clone()).collect();
            let retries: Vec<i64> = b.events.iter().map(|e| e.retry_count).collect();
            format!(
                "{} {} events n={} retries={retries:?}",
                b.state,
                b.events.len(),
                Value::Array(ns)
            )
        }
    }
}

fn msg(n: i64) -> Value {
    json!({ "type": "order.created", "payload": { "n": n } })
}

fn take(batch: Result<Option<Got>, String>) -> Got {
    batch.expect("receive").expect("a batch")
}

/// The stream scenarios; each returns the trace of what it observed.
async fn run_scenarios(client: &mut Client) -> Vec<(String, Vec<String>)> {
    let mut traces = Vec::new();

    // Subscribe from the oldest tick; again is unchanged.
    let (created, start_tick) = client.subscribe("c1", Some(0)).await.expect("subscribe");
    let mut trace = vec![format!("subscribe created={created}")];
    let again = client
        .subscribe("c1", None)
        .await
        .map(|(c, t)| (c, t == start_tick));
    trace.push(format!("again {again:?}"));
    traces.push(("subscribe".to_string(), trace));

    // Append two (one call, with headers on the first); a max below the tick is refused.
    let mut first = msg(1);
    first["headers"] = json!({ "source": "parity" });
    let mut trace = vec![format!(
        "append {:?}",
        client.append(&[first, msg(2)]).await
    )];
    trace.push(format!(
        "max 1 {}",
        show(&client.receive("c1", Some(1)).await)
    ));
    trace.push(format!(
        "max_bytes 10 {}",
        show(
            &client
                .receive_in(QUEUE, "c1", (Some(100), Some(10)), None)
                .await
        )
    ));
    trace.push(format!(
        "max_bytes 0 {}",
        show(
            &client
                .receive_in(QUEUE, "c1", (Some(100), Some(0)), None)
                .await
        )
    ));
    let received = client.receive("c1", Some(100)).await;
    trace.push(format!("max 100 {}", show(&received)));
    let batch = take(received);
    trace.push(format!(
        "types {:?} headers {:?}",
        batch
            .events
            .iter()
            .map(|e| e.kind.clone())
            .collect::<Vec<_>>(),
        batch
            .events
            .iter()
            .map(|e| e.headers.clone())
            .collect::<Vec<_>>()
    ));
    let again = take(client.receive("c1", None).await);
    trace.push(format!(
        "again same batch {} same events {}",
        again.id == batch.id,
        again.events == batch.events
    ));
    let inspected = client.batch(&batch.id).await;
    trace.push(format!("get batch {}", show(&inspected.map(Some))));
    traces.push(("append and receive".to_string(), trace));

    // Ack moves the cursor; the batch is done; nothing is left.
    let cursor = client.ack(&batch.id, Some("c1")).await;
    let mut trace = vec![format!(
        "ack cursor moved {:?}",
        cursor.map(|c| c > start_tick)
    )];
    trace.push(format!(
        "ack again {:?}",
        client.ack(&batch.id, None).await.map(|_| ())
    ));
    trace.push(format!(
        "get batch {}",
        show(&client.batch(&batch.id).await.map(Some))
    ));
    trace.push(format!(
        "receive {}",
        show(&client.receive("c1", None).await)
    ));
    traces.push(("ack".to_string(), trace));

    // Nack one of a new batch, ack the rest; a maintenance pass brings only that one back.
    let mut trace = vec![
        format!("append {:?}", client.append(&[msg(3)]).await),
        format!("append {:?}", client.append(&[msg(4)]).await),
    ];
    let received = client.receive("c1", None).await;
    trace.push(format!("receive {}", show(&received)));
    let batch = take(received);
    let third = batch.events[0].id.clone();
    trace.push(format!(
        "nack {:?}",
        client.nack(&batch.id, &third, "boom").await
    ));
    trace.push(format!(
        "nack again {:?}",
        client.nack(&batch.id, &third, "boom").await
    ));
    trace.push(format!(
        "ack {:?}",
        client.ack(&batch.id, None).await.map(|_| ())
    ));
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let received = client.receive("c1", None).await;
    trace.push(format!("after maintenance {}", show(&received)));
    let retried = take(received);
    trace.push(format!("same message id {}", retried.events[0].id == third));
    traces.push(("nack and retry".to_string(), trace));

    // max_retries 0: the next nack dead-letters; the DLQ shows it; replay brings it back.
    let mut trace = vec![format!("config {:?}", client.config(Some(0), None).await)];
    trace.push(format!(
        "nack {:?}",
        client.nack(&retried.id, &third, "gave up").await
    ));
    trace.push(format!(
        "ack {:?}",
        client.ack(&retried.id, None).await.map(|_| ())
    ));
    let letters = client.dead_letters().await.expect("dead letters");
    trace.push(format!(
        "dlq {:?}",
        letters
            .iter()
            .map(|d| (
                d.message_id == third,
                d.consumer.clone(),
                d.payload.clone(),
                d.retry_count,
                d.reason.clone()
            ))
            .collect::<Vec<_>>()
    ));
    trace.push(format!(
        "receive {}",
        show(&client.receive("c1", None).await)
    ));
    let letter = letters[0].id.clone();
    trace.push(format!("replay {:?}", client.replay(Some(&letter)).await));
    trace.push(format!(
        "replay again {:?}",
        client.replay(Some(&letter)).await
    ));
    let received = client.receive("c1", None).await;
    trace.push(format!("receive {}", show(&received)));
    let replayed = take(received);
    trace.push(format!(
        "same message id {}",
        replayed.events[0].id == third
    ));
    trace.push(format!(
        "ack {:?}",
        client.ack(&replayed.id, None).await.map(|_| ())
    ));
    trace.push(format!("purge 1ms {:?}", client.purge("1ms").await));
    trace.push(format!("replay all {:?}", client.replay(None).await));
    trace.push(format!(
        "dlq {:?}",
        client.dead_letters().await.map(|d| d.len())
    ));
    traces.push(("dead letter and replay".to_string(), trace));

    // A long poll wakes on an append.
    let mut waiter = client.clone();
    let started = Instant::now();
    let waiting = tokio::spawn(async move {
        let got = waiter
            .receive_in(QUEUE, "c1", (None, None), Some(3000))
            .await;
        (got, started.elapsed())
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut trace = vec![format!("append {:?}", client.append(&[msg(5)]).await)];
    let (got, waited) = waiting.await.expect("join");
    trace.push(format!(
        "woken {} early {}",
        show(&got),
        waited < Duration::from_millis(2500)
    ));
    if let Ok(Some(b)) = &got {
        trace.push(format!(
            "ack {:?}",
            client.ack(&b.id, None).await.map(|_| ())
        ));
    }
    let started = Instant::now();
    let idle = client
        .receive_in(QUEUE, "c1", (None, None), Some(300))
        .await;
    trace.push(format!(
        "idle {} waited {}",
        show(&idle),
        started.elapsed() >= Duration::from_millis(290)
    ));
    traces.push(("long poll".to_string(), trace));

    // Errors: unknown consumer, queue, batch; invalid arguments.
    let unknown = uuid::Uuid::now_v7().to_string();
    let trace = vec![
        format!(
            "receive ghost {}",
            show(&client.receive("ghost", None).await)
        ),
        format!("unsubscribe ghost {:?}", client.unsubscribe("ghost").await),
        format!(
            "receive nowhere {}",
            show(&client.receive_in("nowhere", "c1", (None, None), None).await)
        ),
        format!(
            "receive max 0 {}",
            show(&client.receive("c1", Some(0)).await)
        ),
        format!(
            "receive wait 9999 {}",
            show(
                &client
                    .receive_in(QUEUE, "c1", (None, None), Some(9999))
                    .await
            )
        ),
        format!(
            "get unknown batch {}",
            show(&client.batch(&unknown).await.map(Some))
        ),
        format!(
            "get bad batch id {}",
            show(&client.batch("not-a-uuid").await.map(Some))
        ),
        format!("ack unknown batch {:?}", client.ack(&unknown, None).await),
        format!("append none {:?}", client.append(&[]).await),
        format!(
            "append bad type {:?}",
            client
                .append(&[json!({"type": "Bad Type", "payload": 1})])
                .await
        ),
        format!(
            "retention 500ms {:?}",
            client.config(None, Some("500ms")).await
        ),
        format!(
            "max_retries 1001 {:?}",
            client.config(Some(1001), None).await
        ),
        format!("purge soon {:?}", client.purge("soon").await),
        format!("replay bad id {:?}", client.replay(Some("nope")).await),
        format!("replay unknown {:?}", client.replay(Some(&unknown)).await),
    ];
    traces.push(("errors".to_string(), trace));

    // Fan-out: a second consumer from the oldest tick gets what the first acked (not the
    // retried or replayed copies, which belong to c1).
    let mut trace = vec![format!(
        "subscribe c2 {:?}",
        client.subscribe("c2", Some(0)).await.map(|(c, _)| c)
    )];
    let received = client.receive("c2", None).await;
    trace.push(format!("c2 receive {}", show(&received)));
    trace.push(format!("consumers {:?}", client.consumers().await));
    let b = take(received);
    trace.push(format!(
        "c2 ack as c1 {:?}",
        client.ack(&b.id, Some("c1")).await.map(|_| ())
    ));
    trace.push(format!(
        "c2 ack {:?}",
        client.ack(&b.id, Some("c2")).await.map(|_| ())
    ));
    trace.push(format!(
        "c2 receive {}",
        show(&client.receive("c2", None).await)
    ));
    trace.push(format!(
        "c1 receive {}",
        show(&client.receive("c1", None).await)
    ));
    trace.push(format!("info {:?}", client.info().await));
    trace.push(format!(
        "unsubscribe c2 {:?}",
        client.unsubscribe("c2").await
    ));
    trace.push(format!(
        "unsubscribe c2 again {:?}",
        client.unsubscribe("c2").await
    ));
    trace.push(format!("consumers {:?}", client.consumers().await));
    trace.push(format!("config {:?}", client.config(None, None).await));
    traces.push(("fan-out".to_string(), trace));

    traces
}

#[tokio::test]
async fn streams_are_the_same_over_http_and_grpc() {
    let app = common::spawn_app().await;
    let mut http = Client::Http(reqwest::Client::new(), app.http_url.clone());
    let over_http = run_scenarios(&mut http).await;

    let app2 = common::spawn_app().await;
    let grpc = common::grpc::streams(&app2.grpc_url).await;
    let mut grpc = Client::Grpc(grpc);
    let over_grpc = run_scenarios(&mut grpc).await;

    let info = r#"info Ok({"active_batches": Number(0), "consumers": Number(2), "current_segment": Number(0), "dead_letters": Number(0), "events": Number(7), "max_retries": Number(0), "pending_retries": Number(0), "retention_ms": Number(604800000), "rotation_period_ms": Number(302400000), "rotations": Number(0)})"#;
    let expected: Vec<(&str, Vec<&str>)> = vec![
        (
            "subscribe",
            vec!["subscribe created=true", "again Ok((false, true))"],
        ),
        (
            "append and receive",
            vec![
                "append Ok(2)",
                "max 1 Err(batch_too_large)",
                "max_bytes 10 Err(batch_too_large)",
                "max_bytes 0 Err(invalid_request)",
                "max 100 active 2 events n=[1,2] retries=[0, 0]",
                r#"types ["order.created", "order.created"] headers [{"source": "parity"}, {}]"#,
                "again same batch true same events true",
                "get batch active 2 events n=[1,2] retries=[0, 0]",
            ],
        ),
        (
            "ack",
            vec![
                "ack cursor moved Ok(true)",
                r#"ack again Err("conflict")"#,
                "get batch acked 0 events n=[] retries=[]",
                "receive empty",
            ],
        ),
        (
            "nack and retry",
            vec![
                "append Ok(1)",
                "append Ok(1)",
                "receive active 2 events n=[3,4] retries=[0, 0]",
                r#"nack Ok(("retry", 1, true))"#,
                r#"nack again Err("conflict")"#,
                "ack Ok(())",
                "after maintenance active 1 events n=[3] retries=[1]",
                "same message id true",
            ],
        ),
        (
            "dead letter and replay",
            vec![
                r#"config Ok((0, "604800000ms", 604800000))"#,
                r#"nack Ok(("dead_letter", 1, false))"#,
                "ack Ok(())",
                r#"dlq [(true, "c1", Object {"n": Number(3)}, 1, Some("retries exhausted after 1 retries (max_retries 0): gave up"))]"#,
                "receive empty",
                "replay Ok(1)",
                r#"replay again Err("not_found")"#,
                "receive active 1 events n=[3] retries=[1]",
                "same message id true",
                "ack Ok(())",
                "purge 1ms Ok(0)",
                "replay all Ok(0)",
                "dlq Ok(0)",
            ],
        ),
        (
            "long poll",
            vec![
                "append Ok(1)",
                "woken active 1 events n=[5] retries=[0] early true",
                "ack Ok(())",
                "idle empty waited true",
            ],
        ),
        (
            "errors",
            vec![
                "receive ghost Err(not_found)",
                r#"unsubscribe ghost Err("not_found")"#,
                "receive nowhere Err(not_found)",
                "receive max 0 Err(invalid_request)",
                "receive wait 9999 Err(invalid_request)",
                "get unknown batch Err(not_found)",
                "get bad batch id Err(invalid_request)",
                r#"ack unknown batch Err("not_found")"#,
                r#"append none Err("invalid_request")"#,
                r#"append bad type Err("invalid_request")"#,
                r#"retention 500ms Err("invalid_request")"#,
                r#"max_retries 1001 Err("invalid_request")"#,
                r#"purge soon Err("invalid_request")"#,
                r#"replay bad id Err("invalid_request")"#,
                r#"replay unknown Err("not_found")"#,
            ],
        ),
        (
            "fan-out",
            vec![
                "subscribe c2 Ok(true)",
                "c2 receive active 5 events n=[1,2,3,4,5] retries=[0, 0, 0, 0, 0]",
                r#"consumers Ok([("c1", 0), ("c2", 1)])"#,
                r#"c2 ack as c1 Err("conflict")"#,
                "c2 ack Ok(())",
                "c2 receive empty",
                "c1 receive empty",
                info,
                "unsubscribe c2 Ok(true)",
                r#"unsubscribe c2 again Err("not_found")"#,
                r#"consumers Ok([("c1", 0)])"#,
                r#"config Ok((0, "604800000ms", 604800000))"#,
            ],
        ),
    ];
    let expected: Vec<(String, Vec<String>)> = expected
        .into_iter()
        .map(|(n, t)| (n.to_string(), t.into_iter().map(str::to_string).collect()))
        .collect();
    for ((name, seen), (_, want)) in over_http.iter().zip(&expected) {
        assert_eq!(seen, want, "HTTP trace of {name}");
    }
    assert_eq!(over_http, expected, "HTTP streams");
    for ((name, seen), (_, want)) in over_grpc.iter().zip(&over_http) {
        assert_eq!(seen, want, "gRPC trace of {name} must match HTTP");
    }
    assert_eq!(over_grpc, over_http, "gRPC must match HTTP");
}

/// A read-only gateway serves the NO_SIDE_EFFECTS RPCs and refuses the others, like the HTTP
/// routes (`x-read-only`).
#[tokio::test]
async fn read_only_gateway_serves_stream_reads_only() {
    let writer = common::spawn_app().await;
    let mut http = Client::Http(reqwest::Client::new(), writer.http_url.clone());
    http.append(&[msg(1)]).await.expect("append");
    http.subscribe("c1", Some(0)).await.expect("subscribe");
    let database = writer.database_url.clone();
    // A second gateway on the same database; the writer owns (and drops) the database.
    let reader = common::spawn_app_on("", &database, |s| s.service.read_only = true).await;

    let mut traces = Vec::new();
    let over_http = Client::Http(reqwest::Client::new(), reader.http_url.clone());
    let grpc = common::grpc::streams(&reader.grpc_url).await;
    for mut client in [over_http, Client::Grpc(grpc)] {
        let trace = vec![
            format!(
                "info events {:?}",
                client.info().await.map(|i| i["events"].clone())
            ),
            format!("consumers {:?}", client.consumers().await),
            format!("config {:?}", client.config(None, None).await.map(|c| c.0)),
            format!("dlq {:?}", client.dead_letters().await.map(|d| d.len())),
            format!("append {:?}", client.append(&[msg(2)]).await),
            format!("receive {}", show(&client.receive("c1", None).await)),
            format!("set config {:?}", client.config(Some(1), None).await),
            format!("purge {:?}", client.purge("1h").await),
        ];
        traces.push(trace);
    }
    let expected = vec![
        "info events Ok(Number(1))",
        r#"consumers Ok([("c1", 0)])"#,
        "config Ok(5)",
        "dlq Ok(0)",
        r#"append Err("read_only")"#,
        "receive Err(read_only)",
        r#"set config Err("read_only")"#,
        r#"purge Err("read_only")"#,
    ];
    assert_eq!(traces[0], expected, "HTTP on a read-only gateway");
    assert_eq!(traces[1], traces[0], "gRPC must match HTTP");
    drop(reader);
}
