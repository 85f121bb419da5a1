//! `/ui/live`: the overview's counts pushed as server-sent events (`counts`, a JSON object by
//! queue name) for the page's `EventSource`, until the page closes, the server shuts down or
//! the token is revoked (re-checked as the API's streams re-check theirs, `core::push`).

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use http::HeaderMap;
use serde_json::{Map, Value};

use super::access::token;
use super::pages::overview;
use super::{UiError, UiState};
use crate::core::ErrorKind;
use crate::core::access::token_hash;
use crate::core::push::Shutdown;

/// How often the counts are read again. Each read counts every listed queue's jobs, so it is
/// not much more often than a person looks.
const LIVE_INTERVAL: Duration = Duration::from_secs(2);

/// The counts of the overview page the query names (`?cursor=`), every `LIVE_INTERVAL`.
pub async fn counts(
    State(ui): State<Arc<UiState>>,
    headers: HeaderMap,
    query: Result<Query<HashMap<String, String>>, QueryRejection>,
) -> Response {
    let cursor = query.ok().and_then(|Query(mut q)| q.remove("cursor"));
    if let Err(error) = ui.allow(&headers, "listQueues", None).await {
        return ui.render(Err(error));
    }
    let slot = match ui.service.stream_slot() {
        Ok(slot) => slot,
        Err(error) => return ui.render(Err(UiError::Core(error))),
    };
    let check = (ui.stack.auth.as_ref())
        .zip(token(&headers))
        .map(|(auth, token)| auth.tokens.check(&token_hash(&token)));
    let ends = Shutdown::new(ui.shutdown.clone()).with_token(check);
    let state = (ui, headers, cursor, slot, ends, true);
    // The state is `None` after an error frame, which ends the stream.
    let frames = futures_util::stream::unfold(Some(state), |state| async move {
        let (ui, headers, cursor, slot, mut ends, first) = state?;
        if !first {
            tokio::select! {
                _ = tokio::time::sleep(LIVE_INTERVAL) => {}
                error = ends.ended() => {
                    // A shutdown just ends the stream; a revoked token is told why.
                    if error.kind == ErrorKind::Unavailable {
                        return None;
                    }
                    let frame = Event::default().event("error").data(error.message);
                    return Some((Ok(frame), None));
                }
            }
        }
        if ends.is_requested() {
            return None;
        }
        // The grant (its role too) is checked on every read as well.
        let read = match ui.allow(&headers, "listQueues", None).await {
            Ok(grant) => overview(&ui, &grant, cursor.clone())
                .await
                .map_err(|e| e.message),
            Err(UiError::Login(message)) => Err(message),
            Err(UiError::Core(error)) => Err(error.message),
        };
        let (frame, go_on) = match read {
            Ok((rows, _)) => {
                let by_queue: Map<String, Value> = rows
                    .into_iter()
                    .filter_map(|row| {
                        let name = row.get("name")?.as_str()?.to_string();
                        Some((name, row))
                    })
                    .collect();
                let frame = Event::default()
                    .event("counts")
                    .json_data(by_queue)
                    .unwrap_or_else(|_| Event::default().comment("unencodable"));
                (frame, true)
            }
            Err(message) => (Event::default().event("error").data(message), false),
        };
        let next = go_on.then_some((ui, headers, cursor, slot, ends, false));
        Some((Ok::<_, Infallible>(frame), next))
    });
    Sse::new(frames)
        .keep_alive(KeepAlive::default())
        .into_response()
}
