//! The request body limit (1 MiB by default), for every route of both protocols whatever the
//! content type: a declared length over it is refused before the handler runs, and a body without
//! one (chunked, HTTP/2) is cut off while streaming. Past the limit the rest of the body is read
//! and dropped, up to a bound, before the 413 goes out: an HTTP/1.1 client still sending would
//! otherwise see the connection reset instead of the answer.

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body;
use bytes::Bytes;
use http_body::{Frame, SizeHint};
use http_body_util::BodyExt as _;
use std::future::Future as _;

use crate::core::{CoreError, ErrorKind};

/// The body limit in force, for extractors that report it.
#[derive(Debug, Clone, Copy)]
pub struct BodyLimit(pub usize);

/// How much of an over-limit body is read and dropped so its sender can read the 413; beyond it
/// the connection is closed after the answer.
pub const DRAIN_BYTES: u64 = 8 * 1024 * 1024;

/// How long an over-limit body is read and dropped at most: a slow sender gets its answer then,
/// and the connection closes after it.
pub const DRAIN_TIME: Duration = Duration::from_secs(2);

/// How every refusal of a body past the limit begins (gRPC finds its own in tonic's UNKNOWN).
pub const TOO_LARGE: &str = "request body exceeds the limit";

/// The error a `BoundedBody` ends with once its limit is passed.
#[derive(Debug, thiserror::Error)]
#[error("{TOO_LARGE} of {0} bytes")]
pub struct BodyTooLarge(pub usize);

/// The refusal of a body over `max` bytes.
pub fn too_large(max: usize) -> CoreError {
    CoreError::new(ErrorKind::PayloadTooLarge, BodyTooLarge(max).to_string())
}

/// The request's declared `Content-Length`, if it sent a readable one.
pub fn declared_length(headers: &http::HeaderMap) -> Option<u64> {
    headers
        .get(http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok())
}

/// A body that yields at most `max` bytes; past them it drains the rest (up to `DRAIN_BYTES`
/// more, for up to `DRAIN_TIME`) and ends with `BodyTooLarge`.
pub struct BoundedBody {
    inner: Body,
    max: usize,
    seen: u64,
    /// Set once past the limit: when draining stops.
    drain_until: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl BoundedBody {
    /// `inner`, cut off past `max` bytes.
    pub fn new(inner: Body, max: usize) -> Self {
        BoundedBody {
            inner,
            max,
            seen: 0,
            drain_until: None,
        }
    }

    fn over(&self) -> bool {
        self.seen > self.max as u64
    }
}

impl http_body::Body for BoundedBody {
    type Data = Bytes;
    type Error = axum::BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let too_large = |max| Poll::Ready(Some(Err(BodyTooLarge(max).into())));
        loop {
            let frame = match Pin::new(&mut self.inner).poll_frame(cx) {
                Poll::Ready(frame) => frame,
                Poll::Pending => {
                    // Draining a slow sender ends at the deadline.
                    if let Some(deadline) = self.drain_until.as_mut()
                        && deadline.as_mut().poll(cx).is_ready()
                    {
                        return too_large(self.max);
                    }
                    return Poll::Pending;
                }
            };
            match frame {
                None if self.over() => return too_large(self.max),
                None => return Poll::Ready(None),
                Some(Err(error)) => return Poll::Ready(Some(Err(error.into()))),
                Some(Ok(frame)) => {
                    if let Some(data) = frame.data_ref() {
                        self.seen = self.seen.saturating_add(data.len() as u64);
                    }
                    if !self.over() {
                        return Poll::Ready(Some(Ok(frame)));
                    }
                    // Past the limit: drop what comes, until the end or the drain bounds.
                    if self.seen > self.max as u64 + DRAIN_BYTES {
                        return too_large(self.max);
                    }
                    if self.drain_until.is_none() {
                        self.drain_until = Some(Box::pin(tokio::time::sleep(DRAIN_TIME)));
                    }
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// Reads and drops a body the server refuses, up to `DRAIN_BYTES` and `DRAIN_TIME`; whether it
/// was read to its end (else the connection should close after the answer). A body declared
/// longer than the bound is not read at all.
pub async fn drain(headers: &http::HeaderMap, mut body: Body) -> bool {
    if declared_length(headers).is_some_and(|len| len > DRAIN_BYTES) {
        return false;
    }
    let read_all = async {
        let mut read: u64 = 0;
        while let Some(frame) = body.frame().await {
            let Ok(frame) = frame else { return false };
            if let Some(data) = frame.data_ref() {
                read = read.saturating_add(data.len() as u64);
            }
            if read > DRAIN_BYTES {
                return false;
            }
        }
        true
    };
    tokio::time::timeout(DRAIN_TIME, read_all)
        .await
        .unwrap_or(false)
}
