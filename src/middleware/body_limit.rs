//! The request body limit (1 MiB by default), for every route of both protocols whatever the
//! content type: a declared length over it is refused before the handler runs, and a body without
//! one (chunked, HTTP/2) is cut off while streaming. Past the limit the rest of the body is read
//! and dropped, up to a bound, before the 413 goes out: an HTTP/1.1 client still sending would
//! otherwise see the connection reset instead of the answer.

use std::pin::Pin;
use std::task::{Context, Poll, ready};

use axum::body::Body;
use bytes::Bytes;
use http_body::{Frame, SizeHint};
use http_body_util::BodyExt as _;

use crate::core::{CoreError, ErrorKind};

/// The body limit in force, for extractors that report it.
#[derive(Debug, Clone, Copy)]
pub struct BodyLimit(pub usize);

/// How much of an over-limit body is read and dropped so its sender can read the 413; beyond it
/// the connection is closed after the answer.
pub const DRAIN_BYTES: u64 = 8 * 1024 * 1024;

/// The error a `BoundedBody` ends with once its limit is passed.
#[derive(Debug, thiserror::Error)]
#[error("request body exceeds the limit of {0} bytes")]
pub struct BodyTooLarge(pub usize);

/// The refusal of a body over `max` bytes.
pub fn too_large(max: usize) -> CoreError {
    CoreError::new(
        ErrorKind::PayloadTooLarge,
        format!("request body exceeds the limit of {max} bytes"),
    )
}

/// The request's declared `Content-Length`, if it sent a readable one.
pub fn declared_length(headers: &http::HeaderMap) -> Option<u64> {
    headers
        .get(http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok())
}

/// A body that yields at most `max` bytes; past them it drains the rest (up to `DRAIN_BYTES`
/// more) and ends with `BodyTooLarge`.
pub struct BoundedBody {
    inner: Body,
    max: usize,
    seen: u64,
}

impl BoundedBody {
    /// `inner`, cut off past `max` bytes.
    pub fn new(inner: Body, max: usize) -> Self {
        BoundedBody {
            inner,
            max,
            seen: 0,
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
        loop {
            let frame = ready!(Pin::new(&mut self.inner).poll_frame(cx));
            match frame {
                None if self.over() => {
                    return Poll::Ready(Some(Err(BodyTooLarge(self.max).into())));
                }
                None => return Poll::Ready(None),
                Some(Err(error)) => return Poll::Ready(Some(Err(error.into()))),
                Some(Ok(frame)) => {
                    if let Some(data) = frame.data_ref() {
                        self.seen = self.seen.saturating_add(data.len() as u64);
                    }
                    if !self.over() {
                        return Poll::Ready(Some(Ok(frame)));
                    }
                    // Past the limit: drop what comes, until the end or the drain bound.
                    if self.seen > self.max as u64 + DRAIN_BYTES {
                        return Poll::Ready(Some(Err(BodyTooLarge(self.max).into())));
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

/// Reads and drops a body the server refuses, up to `DRAIN_BYTES`; whether it was read to its
/// end (else the connection should close after the answer).
pub async fn drain(mut body: Body) -> bool {
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
}
