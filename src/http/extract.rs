//! Extractors whose rejections are OJS errors: bodies, paths, queries and the request context.

use axum::extract::{FromRequest, FromRequestParts, Request};
use http::request::Parts;
use http_body_util::LengthLimitError;
use serde::de::DeserializeOwned;

use super::ApiError;
use crate::core::job::TraceContext;
use crate::core::{CoreError, ErrorKind};
use crate::middleware::{
    AdmissionSlot, BodyLimit, BodyTooLarge, CarriedTrace, QueueAdmission, RequestId,
};

/// What every operation knows about its request.
#[derive(Debug, Clone)]
pub struct RequestContext {
    /// The request id, echoed in `X-Request-Id` and error envelopes.
    pub request_id: String,
    /// The request's admission slot, for operations that go idle.
    pub admission: AdmissionSlot,
    /// The W3C trace context the request carried.
    pub trace: Option<TraceContext>,
    /// The token scope and per-queue permits of the request.
    pub queues: QueueAdmission,
    /// The request's token (auth on), for long-lived streams to ask again whether it is live.
    pub token: Option<crate::store::tokens::TokenCheck>,
}

impl RequestContext {
    /// Admits the request on the queues it names, once decoded (see `middleware::QueueAdmission`).
    pub fn admit<Q: Into<String>>(
        &self,
        queues: impl IntoIterator<Item = Q>,
    ) -> Result<(), CoreError> {
        self.queues.admit(queues.into_iter().map(Into::into))
    }

    /// The queues the request's token may see.
    pub fn scope(&self) -> crate::core::Scope {
        self.queues.scope()
    }
}

fn request_id_of(extensions: &http::Extensions) -> String {
    extensions
        .get::<RequestId>()
        .map(|r| r.0.clone())
        .unwrap_or_else(RequestId::generate)
}

impl<S: Send + Sync> FromRequestParts<S> for RequestContext {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        Ok(RequestContext {
            request_id: request_id_of(&parts.extensions),
            admission: parts
                .extensions
                .get::<AdmissionSlot>()
                .cloned()
                .unwrap_or_default(),
            trace: parts
                .extensions
                .get::<CarriedTrace>()
                .map(|t| TraceContext {
                    parent: t.parent.clone(),
                    state: t.state.clone(),
                }),
            queues: QueueAdmission::of(&parts.extensions),
            token: parts
                .extensions
                .get::<crate::store::tokens::TokenCheck>()
                .cloned(),
        })
    }
}

/// The text of an optional header parameter; a value that is not visible ASCII is a bad request.
pub fn header_param(headers: &http::HeaderMap, name: &str) -> Result<Option<String>, ApiError> {
    match headers.get(name) {
        None => Ok(None),
        Some(value) => value.to_str().map(|v| Some(v.to_string())).map_err(|_| {
            ApiError::from(
                CoreError::invalid(format!("header {name} must be visible ASCII text"))
                    .with_detail("field", name.into()),
            )
        }),
    }
}

fn is_json(content_type: &str) -> bool {
    let essence = content_type
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    essence == "application/json" || essence == "application/openjobspec+json"
}

/// Reads a JSON body; `None` when the body is empty. Checks the size limit and content type.
async fn read_json(req: Request) -> Result<Option<axum::body::Bytes>, ApiError> {
    let request_id = request_id_of(req.extensions());
    let fail = |e: CoreError| ApiError::from(e).with_request_id(&request_id);
    // Every route's guard sets the limit; a request that somehow lacks it gets the default.
    let limit = req
        .extensions()
        .get::<BodyLimit>()
        .map_or(crate::contract::DEFAULT_MAX_BODY_BYTES, |l| l.0);
    let content_type = req
        .headers()
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let body = axum::body::to_bytes(req.into_body(), limit);
    let bytes = tokio::time::timeout(crate::contract::BODY_READ_TIMEOUT, body)
        .await
        .map_err(|_| {
            fail(CoreError::new(
                ErrorKind::BodyTimeout,
                format!(
                    "request body did not arrive within {} s",
                    crate::contract::BODY_READ_TIMEOUT.as_secs()
                ),
            ))
        })?
        .map_err(|e| {
            // The limit error arrives wrapped by axum and hyper: look through the chain.
            let inner = e.into_inner();
            let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(inner.as_ref());
            let mut too_large = false;
            while let Some(c) = cause {
                too_large |= c.is::<LengthLimitError>() || c.is::<BodyTooLarge>();
                cause = c.source();
            }
            fail(if too_large {
                crate::middleware::too_large(limit)
            } else {
                CoreError::invalid("request body could not be read")
            })
        })?;
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Ok(None);
    }
    match content_type.as_deref() {
        Some(ct) if is_json(ct) => Ok(Some(bytes)),
        Some(ct) => Err(fail(CoreError::invalid(format!(
            "unsupported Content-Type {ct:?}: send application/openjobspec+json or application/json"
        )))),
        None => Err(fail(CoreError::invalid(
            "Content-Type is missing: send application/openjobspec+json or application/json",
        ))),
    }
}

/// Decodes a JSON object body into `T` straight from its bytes (no `Value` in between). Bad
/// JSON is `invalid_payload`; JSON of the wrong shape is `invalid_request` naming the path.
fn decode<T: DeserializeOwned>(bytes: &[u8], request_id: &str) -> Result<T, ApiError> {
    let fail = |kind: ErrorKind, message: String| {
        ApiError::from(CoreError::new(kind, message)).with_request_id(request_id)
    };
    let not_json = |e: &serde_json::Error| {
        fail(
            ErrorKind::InvalidPayload,
            format!("request body is not valid JSON: {e}"),
        )
    };
    if bytes.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
        // Not an object: say whether it is JSON at all.
        return Err(
            match serde_json::from_slice::<serde::de::IgnoredAny>(bytes) {
                Err(e) => not_json(&e),
                Ok(_) => fail(
                    ErrorKind::InvalidPayload,
                    "request body must be a JSON object".into(),
                ),
            },
        );
    }
    // Most bodies are good: decode without tracking the path (a tracked key is an allocation
    // each), and only a failed decode runs again with it, to name where it failed.
    if let Ok(value) = serde_json::from_slice::<T>(bytes) {
        return Ok(value);
    }
    let mut reader = serde_json::Deserializer::from_slice(bytes);
    let decoded = serde_path_to_error::deserialize(&mut reader);
    if decoded.is_ok() {
        // Anything after the object is not JSON either.
        reader.end().map_err(|e| not_json(&e))?;
    }
    decoded.map_err(|e| {
        let inner = e.inner();
        // Whether the text is JSON at all decides the code, whichever error came first.
        if let Err(syntax) = serde_json::from_slice::<serde::de::IgnoredAny>(bytes) {
            return not_json(&syntax);
        }
        // Where the shape is wrong says the path; the position in the text adds nothing.
        let text = inner.to_string();
        let position = format!(" at line {} column {}", inner.line(), inner.column());
        let text = text.strip_suffix(&position).unwrap_or(&text);
        let path = e.path().to_string();
        let message = if path == "." {
            text.to_string()
        } else {
            format!("{path}: {text}")
        };
        fail(ErrorKind::InvalidRequest, message)
    })
}

/// A required JSON body.
pub struct OjsJson<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for OjsJson<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, _: &S) -> Result<Self, Self::Rejection> {
        let request_id = request_id_of(req.extensions());
        match read_json(req).await? {
            Some(bytes) => decode(&bytes, &request_id).map(OjsJson),
            None => Err(ApiError::from(CoreError::new(
                ErrorKind::InvalidPayload,
                "request body is empty: a JSON object is required",
            ))
            .with_request_id(&request_id)),
        }
    }
}

/// An optional JSON body (empty means none).
pub struct OptionalOjsJson<T>(pub Option<T>);

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for OptionalOjsJson<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, _: &S) -> Result<Self, Self::Rejection> {
        let request_id = request_id_of(req.extensions());
        match read_json(req).await? {
            Some(bytes) => decode(&bytes, &request_id).map(|v| OptionalOjsJson(Some(v))),
            None => Ok(OptionalOjsJson(None)),
        }
    }
}

/// Path parameters.
pub struct OjsPath<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned + Send> FromRequestParts<S> for OjsPath<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        axum::extract::Path::<T>::from_request_parts(parts, state)
            .await
            .map(|p| OjsPath(p.0))
            .map_err(|e| {
                ApiError::from(CoreError::invalid(format!("invalid path: {e}")))
                    .with_request_id(&request_id_of(&parts.extensions))
            })
    }
}

/// Query parameters.
pub struct OjsQuery<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequestParts<S> for OjsQuery<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        axum::extract::Query::<T>::from_request_parts(parts, state)
            .await
            .map(|q| OjsQuery(q.0))
            .map_err(|e| {
                ApiError::from(CoreError::invalid(format!("invalid query: {e}")))
                    .with_request_id(&request_id_of(&parts.extensions))
            })
    }
}
