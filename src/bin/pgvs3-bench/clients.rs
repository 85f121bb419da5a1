//! Job and stream clients over either protocol, as a worker or producer would use them.

use pgvs3::grpc::proto::ojs::v1 as ojs;
use pgvs3::grpc::proto::pgvs3::v1 as streams;
use prost_types::value::Kind;
use serde::Deserialize;
use serde_json::{Value, json};
use tonic::transport::Channel;

use crate::backoff::{self, Backoff, grpc_retry};
use crate::encoded;
use crate::{BenchError, Protocol, Result};

/// The methods called with encoded requests (and read through the answer types of `encoded`).
const ENQUEUE_BATCH: &str = "/ojs.v1.OJSService/EnqueueBatch";
const FETCH: &str = "/ojs.v1.OJSService/Fetch";
const APPEND: &str = "/pgvs3.v1.StreamService/Append";
const RECEIVE: &str = "/pgvs3.v1.StreamService/Receive";

type OjsClient = ojs::ojs_service_client::OjsServiceClient<Channel>;
type StreamClient = streams::stream_service_client::StreamServiceClient<Channel>;
type WorkerClient = streams::worker_service_client::WorkerServiceClient<Channel>;

/// A claimed job.
#[derive(Debug, Clone)]
pub struct Claim {
    pub id: String,
    pub token: String,
}

/// A received stream batch.
#[derive(Debug, Clone)]
pub struct Received {
    pub batch_id: String,
    pub count: usize,
}

/// A request body prepared before the clock starts: JSON text, or an encoded protobuf message.
pub enum Prepared {
    Http(String),
    Grpc(bytes::Bytes),
}

/// One HTTP/1.1 connection pool and the server's base URL.
#[derive(Clone)]
pub struct Http {
    client: reqwest::Client,
    base: String,
}

impl Http {
    pub fn new(base: &str) -> Result<Http> {
        Ok(Http {
            client: reqwest::Client::builder()
                .pool_max_idle_per_host(64)
                .build()?,
            base: base.to_string(),
        })
    }

    /// POSTs a JSON body, backing off from 429 and sending it again; another non-2xx answer is
    /// an error carrying the body.
    async fn post(&self, path: &str, body: String) -> Result<bytes::Bytes> {
        // Bytes: a retry sends the same buffer again without copying it.
        let body = bytes::Bytes::from(body);
        let url = format!("{}{path}", self.base);
        let mut backoff = Backoff::default();
        loop {
            let response = self
                .client
                .post(&url)
                .header("content-type", "application/json")
                .body(body.clone())
                .send()
                .await?;
            let status = response.status();
            let retry_after = response
                .headers()
                .get(reqwest::header::RETRY_AFTER)
                .and_then(|v| v.to_str().ok())
                .and_then(backoff::parse_retry_after);
            // Read to the end either way, so the connection goes back to the pool.
            let bytes = response.bytes().await?;
            if status.is_success() {
                return Ok(bytes);
            }
            if status != reqwest::StatusCode::TOO_MANY_REQUESTS {
                return Err(
                    format!("POST {path}: {status}: {}", String::from_utf8_lossy(&bytes)).into(),
                );
            }
            backoff.wait(path, retry_after).await?;
        }
    }

    /// Creates a queue namespace (setup, not measured).
    pub async fn create_queue(&self, name: &str) -> Result<()> {
        self.post("/ojs/v1/queues", json!({ "name": name }).to_string())
            .await
            .map(drop)
    }
}

/// A gRPC failure as an error naming the call.
pub fn grpc_error(call: &str, status: tonic::Status) -> BenchError {
    format!("{call}: {:?}: {}", status.code(), status.message()).into()
}

async fn channel(base: &str) -> Result<Channel> {
    Ok(Channel::from_shared(base.to_string())?.connect().await?)
}

fn number(n: f64) -> prost_types::Value {
    prost_types::Value {
        kind: Some(Kind::NumberValue(n)),
    }
}

fn text(s: &str) -> prost_types::Value {
    prost_types::Value {
        kind: Some(Kind::StringValue(s.to_string())),
    }
}

/// The arguments of job `i`: a number and a short string, the same in SQL for the floor.
pub fn job_args(i: usize) -> Value {
    json!([i, "bench payload"])
}

fn grpc_job_args(i: usize) -> Vec<prost_types::Value> {
    vec![number(i as f64), text("bench payload")]
}

/// A job worker/producer over one protocol, on its own connection.
#[derive(Clone)]
pub enum Jobs {
    Http(Http),
    Grpc(Box<GrpcJobs>),
}

/// The gRPC clients of a worker: the OJS service and the pgvs3 worker extensions.
#[derive(Clone)]
pub struct GrpcJobs {
    channel: Channel,
    ojs: OjsClient,
    workers: WorkerClient,
}

#[derive(Deserialize)]
struct BatchAnswer {
    count: usize,
}

#[derive(Deserialize)]
struct FetchAnswer {
    jobs: Vec<FetchedJob>,
}

#[derive(Deserialize)]
struct FetchedJob {
    id: String,
    #[serde(default)]
    lease_token: Option<String>,
}

impl Jobs {
    pub async fn connect(protocol: Protocol, base: &str) -> Result<Jobs> {
        Ok(match protocol {
            Protocol::Http => Jobs::Http(Http::new(base)?),
            Protocol::Grpc => {
                let channel = channel(base).await?;
                Jobs::Grpc(Box::new(GrpcJobs {
                    channel: channel.clone(),
                    ojs: OjsClient::new(channel.clone()),
                    workers: WorkerClient::new(channel),
                }))
            }
        })
    }

    /// Batch bodies for jobs `0..jobs` in batches of `batch`, built before timing.
    pub fn batches(protocol: Protocol, queue: &str, jobs: usize, batch: usize) -> Vec<Prepared> {
        (0..jobs)
            .step_by(batch.max(1))
            .map(|first| {
                let range = first..(first + batch).min(jobs);
                match protocol {
                    Protocol::Http => {
                        let jobs: Vec<Value> = range
                            .map(|i| {
                                json!({"type": "bench.job", "args": job_args(i),
                                       "options": {"queue": queue}})
                            })
                            .collect();
                        Prepared::Http(json!({ "jobs": jobs }).to_string())
                    }
                    Protocol::Grpc => Prepared::Grpc(encoded::encode(&ojs::EnqueueBatchRequest {
                        jobs: range
                            .map(|i| ojs::BatchJobEntry {
                                r#type: "bench.job".into(),
                                args: grpc_job_args(i),
                                options: None,
                            })
                            .collect(),
                        default_options: Some(ojs::EnqueueOptions {
                            queue: queue.into(),
                            ..Default::default()
                        }),
                    })),
                }
            })
            .collect()
    }

    /// Enqueues one prepared batch; returns how many jobs the server stored.
    pub async fn enqueue_batch(&mut self, body: Prepared) -> Result<usize> {
        match (self, body) {
            (Jobs::Http(http), Prepared::Http(body)) => {
                let answer: BatchAnswer =
                    serde_json::from_slice(&http.post("/ojs/v1/jobs/batch", body).await?)?;
                Ok(answer.count)
            }
            (Jobs::Grpc(grpc), Prepared::Grpc(request)) => {
                let answer: encoded::EnqueueCount = grpc_retry!(
                    "EnqueueBatch",
                    encoded::unary(&grpc.channel, ENQUEUE_BATCH, request.clone())
                )?;
                Ok(usize::try_from(answer.count)?)
            }
            _ => Err("a batch prepared for the other protocol".into()),
        }
    }

    /// Enqueues job `i` alone.
    pub async fn enqueue(&mut self, queue: &str, i: usize) -> Result<()> {
        match self {
            Jobs::Http(http) => {
                let body = json!({"type": "bench.job", "args": job_args(i),
                                  "options": {"queue": queue}});
                http.post("/ojs/v1/jobs", body.to_string()).await.map(drop)
            }
            Jobs::Grpc(grpc) => grpc_retry!(
                "Enqueue",
                grpc.ojs.enqueue(ojs::EnqueueRequest {
                    r#type: "bench.job".into(),
                    args: grpc_job_args(i),
                    options: Some(ojs::EnqueueOptions {
                        queue: queue.into(),
                        ..Default::default()
                    }),
                    ..Default::default()
                })
            )
            .map(drop),
        }
    }

    /// Claims up to `count` jobs, long-polling up to `wait_ms` when none is ready.
    pub async fn fetch(
        &mut self,
        queue: &str,
        count: usize,
        wait_ms: i64,
        worker: &str,
    ) -> Result<Vec<Claim>> {
        match self {
            Jobs::Http(http) => {
                let body = json!({"queues": [queue], "count": count, "worker_id": worker,
                                  "visibility_timeout_ms": 60_000, "wait_ms": wait_ms});
                let answer: FetchAnswer = serde_json::from_slice(
                    &http.post("/ojs/v1/workers/fetch", body.to_string()).await?,
                )?;
                Ok(answer
                    .jobs
                    .into_iter()
                    .map(|j| Claim {
                        id: j.id,
                        token: j.lease_token.unwrap_or_default(),
                    })
                    .collect())
            }
            Jobs::Grpc(grpc) => {
                let request = encoded::encode(&ojs::FetchRequest {
                    queues: vec![queue.into()],
                    count: i32::try_from(count)?,
                    worker_id: worker.into(),
                    visibility_timeout_ms: 60_000,
                    wait_ms,
                });
                let answer: encoded::FetchClaims = grpc_retry!(
                    "Fetch",
                    encoded::unary(&grpc.channel, FETCH, request.clone())
                )?;
                Ok(answer
                    .jobs
                    .into_iter()
                    .map(|j| Claim {
                        id: j.id,
                        token: j.lease_token,
                    })
                    .collect())
            }
        }
    }

    /// Completes a claimed job.
    pub async fn ack(&mut self, claim: &Claim, worker: &str) -> Result<()> {
        match self {
            Jobs::Http(http) => {
                let body = json!({"job_id": claim.id, "lease_token": claim.token,
                                  "worker_id": worker});
                http.post("/ojs/v1/workers/ack", body.to_string())
                    .await
                    .map(drop)
            }
            Jobs::Grpc(grpc) => grpc_retry!(
                "Ack",
                grpc.ojs.ack(ojs::AckRequest {
                    job_id: claim.id.clone(),
                    lease_token: claim.token.clone(),
                    worker_id: worker.into(),
                    ..Default::default()
                })
            )
            .map(drop),
        }
    }
}

impl Jobs {
    /// Completes claimed jobs with one batch-ack request (the pgvs3 extension).
    pub async fn ack_batch(&mut self, claims: &[Claim], worker: &str) -> Result<()> {
        let acknowledged = match self {
            Jobs::Http(http) => {
                let acks: Vec<Value> = claims
                    .iter()
                    .map(|c| json!({"job_id": c.id, "lease_token": c.token, "worker_id": worker}))
                    .collect();
                let answer: AckBatchAnswer = serde_json::from_slice(
                    &http
                        .post(
                            "/ojs/v1/workers/ack/batch",
                            json!({"acks": acks}).to_string(),
                        )
                        .await?,
                )?;
                answer.acknowledged
            }
            Jobs::Grpc(grpc) => {
                let answer = grpc_retry!(
                    "AckBatch",
                    grpc.workers.ack_batch(streams::AckBatchRequest {
                        acks: claims
                            .iter()
                            .map(|c| ojs::AckRequest {
                                job_id: c.id.clone(),
                                lease_token: c.token.clone(),
                                worker_id: worker.into(),
                                ..Default::default()
                            })
                            .collect(),
                    })
                )?;
                usize::try_from(answer.acknowledged)?
            }
        };
        if acknowledged != claims.len() {
            return Err(format!(
                "batch ack completed {acknowledged} of {} jobs",
                claims.len()
            )
            .into());
        }
        Ok(())
    }
}

#[derive(Deserialize)]
struct AckBatchAnswer {
    acknowledged: usize,
}

/// A stream producer/consumer over one protocol, on its own connection.
pub enum Streams {
    Http(Http),
    Grpc(StreamClient, Channel),
}

#[derive(Deserialize)]
struct AppendAnswer {
    count: usize,
}

#[derive(Deserialize)]
struct ReceiveAnswer {
    #[serde(default)]
    batch_id: Option<String>,
    count: usize,
}

impl Streams {
    pub async fn connect(protocol: Protocol, base: &str) -> Result<Streams> {
        Ok(match protocol {
            Protocol::Http => Streams::Http(Http::new(base)?),
            Protocol::Grpc => {
                let channel = channel(base).await?;
                Streams::Grpc(StreamClient::new(channel.clone()), channel)
            }
        })
    }

    /// Append bodies for messages `0..messages` in batches of `batch`, built before timing.
    pub fn batches(
        protocol: Protocol,
        queue: &str,
        messages: usize,
        batch: usize,
    ) -> Vec<Prepared> {
        (0..messages)
            .step_by(batch.max(1))
            .map(|first| {
                let range = first..(first + batch).min(messages);
                match protocol {
                    Protocol::Http => {
                        let messages: Vec<Value> = range
                            .map(|i| json!({"type": "bench.event", "payload": {"n": i, "body": "bench payload"}}))
                            .collect();
                        Prepared::Http(json!({ "messages": messages }).to_string())
                    }
                    Protocol::Grpc => Prepared::Grpc(encoded::encode(&streams::AppendRequest {
                        queue: queue.into(),
                        messages: range.map(grpc_message).collect(),
                    })),
                }
            })
            .collect()
    }

    /// Subscribes a fan-out consumer at the latest tick (creates the queue on first use).
    pub async fn subscribe(&mut self, queue: &str, consumer: &str) -> Result<()> {
        match self {
            Streams::Http(http) => http
                .post(
                    &format!("/ojs/v1/queues/{queue}/consumers"),
                    json!({ "consumer": consumer }).to_string(),
                )
                .await
                .map(drop),
            Streams::Grpc(grpc, _) => grpc_retry!(
                "Subscribe",
                grpc.subscribe(streams::SubscribeRequest {
                    queue: queue.into(),
                    consumer: consumer.into(),
                    from_tick: None,
                    cooperative: None,
                })
            )
            .map(drop),
        }
    }

    /// Appends one prepared batch; returns how many messages the server stored.
    pub async fn append(&mut self, queue: &str, body: Prepared) -> Result<usize> {
        match (self, body) {
            (Streams::Http(http), Prepared::Http(body)) => {
                let answer: AppendAnswer = serde_json::from_slice(
                    &http
                        .post(&format!("/ojs/v1/queues/{queue}/messages/batch"), body)
                        .await?,
                )?;
                Ok(answer.count)
            }
            (Streams::Grpc(_, channel), Prepared::Grpc(request)) => {
                let answer: encoded::AppendCount =
                    grpc_retry!("Append", encoded::unary(channel, APPEND, request.clone()))?;
                Ok(usize::try_from(answer.count)?)
            }
            _ => Err("a batch prepared for the other protocol".into()),
        }
    }

    /// Appends message `i` alone.
    pub async fn append_one(&mut self, queue: &str, i: usize) -> Result<()> {
        let body = match self {
            Streams::Http(_) => Prepared::Http(
                json!({"messages": [{"type": "bench.event", "payload": {"n": i, "body": "bench payload"}}]})
                    .to_string(),
            ),
            Streams::Grpc(..) => Prepared::Grpc(encoded::encode(&streams::AppendRequest {
                queue: queue.into(),
                messages: vec![grpc_message(i)],
            })),
        };
        self.append(queue, body).await.map(drop)
    }

    /// Receives the consumer's next batch (at most `max` events), long-polling up to `wait_ms`.
    pub async fn receive(
        &mut self,
        queue: &str,
        consumer: &str,
        max: usize,
        wait_ms: i64,
    ) -> Result<Option<Received>> {
        match self {
            Streams::Http(http) => {
                let body = json!({"consumer": consumer, "max": max, "wait_ms": wait_ms});
                let answer: ReceiveAnswer = serde_json::from_slice(
                    &http
                        .post(&format!("/ojs/v1/queues/{queue}/receive"), body.to_string())
                        .await?,
                )?;
                Ok(answer.batch_id.map(|batch_id| Received {
                    batch_id,
                    count: answer.count,
                }))
            }
            Streams::Grpc(_, channel) => {
                let request = encoded::encode(&streams::ReceiveRequest {
                    queue: queue.into(),
                    consumer: consumer.into(),
                    member: None,
                    max: Some(i64::try_from(max)?),
                    wait_ms: Some(wait_ms),
                    max_bytes: None,
                });
                let answer: encoded::ReceiveCount =
                    grpc_retry!("Receive", encoded::unary(channel, RECEIVE, request.clone()))?;
                answer
                    .batch
                    .filter(|b| !b.batch_id.is_empty())
                    .map(|b| {
                        Ok(Received {
                            batch_id: b.batch_id,
                            count: usize::try_from(b.count)?,
                        })
                    })
                    .transpose()
            }
        }
    }

    /// Acknowledges a batch.
    pub async fn ack(&mut self, queue: &str, consumer: &str, batch_id: &str) -> Result<()> {
        match self {
            Streams::Http(http) => http
                .post(
                    "/ojs/v1/streams/ack",
                    json!({"queue": queue, "batch_id": batch_id, "consumer": consumer}).to_string(),
                )
                .await
                .map(drop),
            Streams::Grpc(grpc, _) => grpc_retry!(
                "Ack",
                grpc.ack(streams::AckRequest {
                    queue: queue.into(),
                    batch_id: batch_id.into(),
                    consumer: Some(consumer.into()),
                })
            )
            .map(drop),
        }
    }
}

fn grpc_message(i: usize) -> streams::Message {
    let fields = [
        ("n".to_string(), number(i as f64)),
        ("body".to_string(), text("bench payload")),
    ];
    streams::Message {
        id: String::new(),
        r#type: "bench.event".into(),
        payload: Some(prost_types::Value {
            kind: Some(Kind::StructValue(prost_types::Struct {
                fields: fields.into_iter().collect(),
            })),
        }),
        headers: Default::default(),
    }
}
