//! gRPC calls whose client side does the work the HTTP clients do: requests encoded before the
//! clock starts (sending one, or sending it again after a 429, copies bytes, not a message tree),
//! and answers read into types holding only what the bench uses (prost skips the rest unread, as
//! serde skips what the HTTP answer types leave out). The bench's clients share the machine with
//! the server, so work they do that the other protocol's clients do not shows as server cost.

use std::marker::PhantomData;

use bytes::{BufMut, Bytes};
use tonic::Status;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::transport::Channel;

/// A request message encoded once.
pub fn encode(message: &impl prost::Message) -> Bytes {
    Bytes::from(message.encode_to_vec())
}

/// Calls the unary method at `path` with an encoded request and decodes its answer `R`.
pub async fn unary<R>(
    channel: &Channel,
    path: &'static str,
    body: Bytes,
) -> std::result::Result<tonic::Response<R>, Status>
where
    R: prost::Message + Default + Send + 'static,
{
    let mut grpc = tonic::client::Grpc::new(channel.clone());
    grpc.ready()
        .await
        .map_err(|e| Status::unavailable(format!("channel not ready: {e}")))?;
    grpc.unary(
        tonic::Request::new(body),
        http::uri::PathAndQuery::from_static(path),
        EncodedCodec::<R>(PhantomData),
    )
    .await
}

/// Writes an encoded request as it is; reads the answer with prost.
struct EncodedCodec<R>(PhantomData<R>);

impl<R: prost::Message + Default + Send + 'static> Codec for EncodedCodec<R> {
    type Encode = Bytes;
    type Decode = R;
    type Encoder = BytesEncoder;
    type Decoder = AnswerDecoder<R>;

    fn encoder(&mut self) -> Self::Encoder {
        BytesEncoder
    }

    fn decoder(&mut self) -> Self::Decoder {
        AnswerDecoder(PhantomData)
    }
}

struct BytesEncoder;

impl Encoder for BytesEncoder {
    type Item = Bytes;
    type Error = Status;

    fn encode(&mut self, item: Bytes, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        dst.put(item);
        Ok(())
    }
}

struct AnswerDecoder<R>(PhantomData<R>);

impl<R: prost::Message + Default> Decoder for AnswerDecoder<R> {
    type Item = R;
    type Error = Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<R>, Status> {
        R::decode(src)
            .map(Some)
            .map_err(|e| Status::internal(format!("undecodable answer: {e}")))
    }
}

/// A `ReceiveResponse` read as a consumer that counts its events reads it: the batch id and
/// count, the events skipped unread (as the HTTP consumer's JSON answer is scanned, not built).
#[derive(Clone, PartialEq, prost::Message)]
pub struct ReceiveCount {
    #[prost(message, optional, tag = "1")]
    pub batch: Option<BatchCount>,
}

/// The batch id and event count of a received `Batch`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct BatchCount {
    #[prost(string, tag = "1")]
    pub batch_id: String,
    #[prost(int64, tag = "8")]
    pub count: i64,
}

/// An `EnqueueBatchResponse` read for its `count` only, as the HTTP producer reads its answer.
#[derive(Clone, PartialEq, prost::Message)]
pub struct EnqueueCount {
    #[prost(int32, tag = "2")]
    pub count: i32,
}

/// An `AppendResponse` read for its `count` only, as the HTTP producer reads its answer.
#[derive(Clone, PartialEq, prost::Message)]
pub struct AppendCount {
    #[prost(int64, tag = "2")]
    pub count: i64,
}

/// A `FetchResponse` read for what a worker acks with: each job's id and lease token, as the
/// HTTP worker reads its answer.
#[derive(Clone, PartialEq, prost::Message)]
pub struct FetchClaims {
    #[prost(message, repeated, tag = "1")]
    pub jobs: Vec<ClaimedJob>,
}

/// The id (`Job` tag 1) and lease token (tag 1001) of a fetched job.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ClaimedJob {
    #[prost(string, tag = "1")]
    pub id: String,
    #[prost(string, tag = "1001")]
    pub lease_token: String,
}
