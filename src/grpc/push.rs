//! Push delivery as the gRPC adapters see it: the loops are `core::push` (re-exported here for
//! `StreamJobs`, `StreamEvents`, `ReceiveStream` and the health watch); this converts pushed
//! events to `ojs.v1.Event`.

use super::convert;
use super::proto::ojs::v1 as pb;
pub use crate::core::push::{EventStream, JobStream, Pushed, Shutdown, batches, events, jobs};

/// The event type of keepalives on `StreamEvents`.
pub const KEEPALIVE_TYPE: &str = "stream.keepalive";

/// A pushed event as an `ojs.v1.Event` (ids as over HTTP: `evt_<uuid>`).
pub(super) fn event_message(pushed: &Pushed) -> pb::Event {
    match pushed {
        Pushed::Logged { event, workflow_id } => pb::Event {
            id: format!("evt_{}", event.id),
            r#type: event.event_type.clone(),
            job_id: event.job_id.map(|j| j.to_string()).unwrap_or_default(),
            job_type: event.job_type.clone().unwrap_or_default(),
            queue: event.queue.clone().unwrap_or_default(),
            timestamp: Some(convert::created_at(&event.time)),
            data: event.data.as_object().map(convert::to_struct),
            workflow_id: workflow_id.clone().unwrap_or_default(),
        },
        Pushed::Keepalive => pb::Event {
            id: format!("evt_{}", uuid::Uuid::now_v7()),
            r#type: KEEPALIVE_TYPE.to_string(),
            timestamp: Some(convert::created_at(&chrono::Utc::now())),
            ..Default::default()
        },
    }
}
