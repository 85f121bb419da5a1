//! Server-sent events: the `text/event-stream` answer of operations that offer one (chosen on the
//! client's `Accept`), built from the core's pushed events.

use std::convert::Infallible;

use axum::response::sse::{Event as Frame, Sse};
use axum::response::{IntoResponse, Response};
use futures_util::stream::BoxStream;
use futures_util::{Stream, StreamExt};
use http::HeaderMap;

use super::{ApiError, convert};
use crate::core::CoreError;
use crate::core::push::Pushed;

/// The event name of the last frame of a stream that ended on an error (shutdown included).
pub const ERROR_EVENT: &str = "stream.error";
/// The text of keepalive comments.
pub const KEEPALIVE_COMMENT: &str = "keepalive";

/// A `text/event-stream` answer.
#[derive(Debug)]
pub struct EventStream(Sse<BoxStream<'static, Result<Frame, Infallible>>>);

impl IntoResponse for EventStream {
    fn into_response(self) -> Response {
        self.0.into_response()
    }
}

/// Whether the client's `Accept` names `text/event-stream` (with a non-zero quality). Wildcards
/// do not count: the JSON answer stays the default.
pub fn accepts_event_stream(headers: &HeaderMap) -> bool {
    headers
        .get_all(http::header::ACCEPT)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(','))
        .any(|range| {
            let mut parts = range.split(';');
            let essence = parts.next().unwrap_or("").trim();
            essence.eq_ignore_ascii_case("text/event-stream")
                && !parts.any(|param| match param.split_once('=') {
                    Some((name, value)) => {
                        name.trim().eq_ignore_ascii_case("q")
                            && value.trim().parse::<f32>().is_ok_and(|q| q <= 0.0)
                    }
                    None => false,
                })
        })
}

/// Pushed events as frames: `id:` the event's cursor, `event:` its type, `data:` the event as
/// the JSON page shows it; keepalives as comments. An error ends the stream with one
/// `stream.error` frame carrying the OJS error envelope.
pub fn event_stream(
    pushed: impl Stream<Item = Result<Pushed, CoreError>> + Send + 'static,
    request_id: String,
) -> EventStream {
    let frames = pushed.map(move |item| Ok(frame(item, &request_id)));
    EventStream(Sse::new(frames.boxed()))
}

fn frame(item: Result<Pushed, CoreError>, request_id: &str) -> Frame {
    let event = match item {
        Ok(Pushed::Keepalive) => return Frame::default().comment(KEEPALIVE_COMMENT),
        Ok(Pushed::Logged { event, .. }) => event,
        Err(error) => return error_frame(error, request_id),
    };
    let mut frame = Frame::default().id(event.cursor().to_string());
    // A field value cannot hold a line break; the log's types never do, but a stored one that
    // did would otherwise panic the encoder. Such an event goes out under the default name.
    if !event.event_type.contains(['\r', '\n']) {
        frame = frame.event(&event.event_type);
    }
    match frame.json_data(convert::event(&event)) {
        Ok(frame) => frame,
        Err(e) => error_frame(
            CoreError::new(
                crate::core::ErrorKind::Backend,
                format!("event {} could not be encoded: {e}", event.seq),
            ),
            request_id,
        ),
    }
}

fn error_frame(error: CoreError, request_id: &str) -> Frame {
    let envelope = ApiError::from(error).with_request_id(request_id).envelope();
    Frame::default()
        .event(ERROR_EVENT)
        .data(envelope.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn accept(value: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(
            http::header::ACCEPT,
            http::HeaderValue::from_str(value).expect("header"),
        );
        headers
    }

    #[test]
    fn only_an_explicit_event_stream_media_range_chooses_the_stream() {
        for yes in [
            "text/event-stream",
            "Text/Event-Stream",
            "application/json, text/event-stream;q=0.5",
            "text/event-stream; charset=utf-8",
        ] {
            assert!(accepts_event_stream(&accept(yes)), "{yes}");
        }
        for no in [
            "*/*",
            "text/*",
            "application/json",
            "text/event-stream;q=0",
            "text/event-stream; q=0.000",
        ] {
            assert!(!accepts_event_stream(&accept(no)), "{no}");
        }
        assert!(!accepts_event_stream(&HeaderMap::new()));
    }
}
