//! Admission control: a global in-flight limit shared by every route of both protocols. Requests
//! beyond it are refused at once (429 + Retry-After, gRPC RESOURCE_EXHAUSTED), never queued.

use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use axum::body::Body;
use axum::response::Response;
use bytes::Bytes;
use tokio::sync::OwnedSemaphorePermit;

use super::StackState;
use super::queue_admission::QueuePermits;
use crate::core::{CoreError, ErrorKind};

/// The admission slot of one request (its global permit and its per-queue permits); an operation
/// that goes idle (a long poll) gives it back.
#[derive(Clone, Default, Debug)]
pub struct AdmissionSlot(Arc<Mutex<(Option<OwnedSemaphorePermit>, Option<QueuePermits>)>>);

impl AdmissionSlot {
    /// Gives the slot back before the request ends.
    pub fn release(&self) {
        let held = self.0.lock().map(|mut held| std::mem::take(&mut *held));
        // Dropped outside the slot's lock: the queue permits take the queue map's lock.
        drop(held);
    }

    /// Adds the request's per-queue permits, held and released with the global one.
    pub(super) fn hold_queues(&self, permits: QueuePermits) {
        if let Ok(mut held) = self.0.lock() {
            held.1 = Some(permits);
        }
    }
}

/// A response body that holds the admission slot until it has been sent.
struct PermitBody {
    inner: Body,
    slot: AdmissionSlot,
}

impl http_body::Body for PermitBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, axum::Error>>> {
        let frame = Pin::new(&mut self.inner).poll_frame(cx);
        // Released with the last frame, before it is written: a client that has read the whole
        // response never finds that request still counted against its next one.
        if matches!(frame, Poll::Ready(None)) || (frame.is_ready() && self.inner.is_end_stream()) {
            self.slot.release();
        }
        frame
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// A slot of the global in-flight limit, or `rate_limited` when none is free.
pub fn acquire(state: &StackState) -> Result<AdmissionSlot, CoreError> {
    let permit = state.admission.clone().try_acquire_owned().map_err(|_| {
        CoreError::new(
            ErrorKind::RateLimited,
            "the server is at its in-flight request limit",
        )
    })?;
    Ok(AdmissionSlot(Arc::new(Mutex::new((Some(permit), None)))))
}

/// `response`, holding `slot` until its body has been sent.
pub fn hold_until_sent(response: Response, slot: AdmissionSlot) -> Response {
    let (parts, body) = response.into_parts();
    Response::from_parts(parts, Body::new(PermitBody { inner: body, slot }))
}
