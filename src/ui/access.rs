//! Who may see and do what in the dashboard: the API's roles and queue scopes, with the token
//! from `Authorization: Bearer` or from the session cookie the login form sets; and the
//! same-origin check that keeps other sites from submitting the dashboard's forms.

use std::sync::Arc;

use axum::extract::{Form, State};
use axum::response::{IntoResponse, Redirect, Response};
use http::HeaderMap;
use serde::Deserialize;

use super::{UiError, UiState};
use crate::core::access::token_hash;
use crate::core::{CoreError, ErrorKind, Grant};

/// The cookie holding a dashboard session's token (HttpOnly, SameSite=Strict, path `/ui`).
pub const TOKEN_COOKIE: &str = "pgvs3_token";

/// The request's token: the bearer header first, then the session cookie.
pub(super) fn token(headers: &HeaderMap) -> Option<String> {
    crate::middleware::bearer(headers)
        .map(str::to_string)
        .or_else(|| {
            headers
                .get_all(http::header::COOKIE)
                .iter()
                .filter_map(|v| v.to_str().ok())
                .flat_map(|v| v.split(';'))
                .filter_map(|pair| pair.trim().split_once('='))
                .find(|(name, _)| *name == TOKEN_COOKIE)
                .map(|(_, value)| value.trim().to_string())
                .filter(|t| !t.is_empty())
        })
}

impl UiState {
    /// Checks that the request may do what `operation` does (on `queue`, when it names one).
    /// `None` when auth is off: everyone may; else the grant, for filtering lists by scope.
    pub async fn allow(
        &self,
        headers: &HeaderMap,
        operation: &'static str,
        queue: Option<&str>,
    ) -> Result<Option<Grant>, UiError> {
        let Some(auth) = &self.stack.auth else {
            return Ok(None);
        };
        let role = crate::contract::http_operation(operation).role;
        let Some(token) = token(headers) else {
            return Err(UiError::Login(format!(
                "sign in with a token holding role {} to see this page",
                role.name()
            )));
        };
        let Some(grant) = auth.tokens.grant(&token_hash(&token)).await? else {
            return Err(UiError::Login("the token is unknown or revoked".into()));
        };
        grant.require_role(role, operation)?;
        if let Some(queue) = queue {
            grant.require_queues([queue])?;
        }
        Ok(Some(grant))
    }

    /// Checks an action (a form post): same origin, a writable gateway, and the operation's
    /// role on the queue; the grant as `allow` gives it.
    pub async fn allow_action(
        &self,
        headers: &HeaderMap,
        operation: &'static str,
        queue: Option<&str>,
    ) -> Result<Option<Grant>, UiError> {
        same_origin(headers)?;
        if self.stack.is_read_only() {
            return Err(CoreError::new(
                ErrorKind::ReadOnly,
                format!("this gateway is read-only: {operation} is a mutation"),
            )
            .into());
        }
        self.allow(headers, operation, queue).await
    }
}

/// Refuses a form post another site made the browser send. Browsers send `Origin` on every
/// POST (and `Sec-Fetch-Site`); it must name the host the request went to. A post without
/// either comes from a non-browser client, which needs a token anyway when auth is on.
fn same_origin(headers: &HeaderMap) -> Result<(), UiError> {
    let refuse = |why: String| Err(UiError::Core(CoreError::new(ErrorKind::Forbidden, why)));
    if let Some(site) = headers.get("sec-fetch-site").and_then(|v| v.to_str().ok())
        && !matches!(site, "same-origin" | "none")
    {
        return refuse(format!("a {site} form post is refused"));
    }
    let Some(origin) = headers.get(http::header::ORIGIN) else {
        return Ok(());
    };
    let host = headers
        .get(http::header::HOST)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    let origin_host = origin
        .to_str()
        .ok()
        .and_then(|o| o.split_once("://"))
        .map(|(_, rest)| rest.trim_end_matches('/'));
    if origin_host == Some(host) && !host.is_empty() {
        Ok(())
    } else {
        refuse(format!(
            "a form post from origin {:?} is refused (this is {host:?})",
            origin.to_str().unwrap_or("?")
        ))
    }
}

/// Gives an HTTP/2 request, which names its host in the URI's authority rather than a `Host`
/// header, the header the origin check reads.
pub async fn host_from_authority(
    mut request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    if !request.headers().contains_key(http::header::HOST)
        && let Some(host) = request
            .uri()
            .authority()
            .and_then(|a| http::HeaderValue::from_str(a.as_str()).ok())
    {
        request.headers_mut().insert(http::header::HOST, host);
    }
    next.run(request).await
}

/// The login form's fields.
#[derive(Deserialize)]
pub struct Login {
    token: String,
}

/// Checks the token and keeps it in the session cookie.
pub async fn login(
    State(ui): State<Arc<UiState>>,
    headers: HeaderMap,
    form: Result<Form<Login>, axum::extract::rejection::FormRejection>,
) -> Response {
    let result = async {
        same_origin(&headers)?;
        let Form(login) = form.map_err(|e| CoreError::invalid(e.body_text()))?;
        let token = login.token.trim().to_string();
        let mut with_token = HeaderMap::new();
        let bearer = format!("Bearer {token}");
        with_token.insert(
            http::header::AUTHORIZATION,
            bearer
                .parse()
                .map_err(|_| CoreError::invalid("the token holds characters no token has"))?,
        );
        ui.allow(&with_token, "listQueues", None).await?;
        Ok::<_, UiError>(token)
    }
    .await;
    match result {
        Ok(token) => {
            let cookie = format!(
                "{TOKEN_COOKIE}={token}; Path=/ui; HttpOnly; SameSite=Strict; Max-Age=43200"
            );
            let mut response = Redirect::to("/ui").into_response();
            if let Ok(value) = cookie.parse() {
                response
                    .headers_mut()
                    .insert(http::header::SET_COOKIE, value);
            }
            response
        }
        Err(error) => ui.render(Err(error)),
    }
}

/// Forgets the session cookie.
pub async fn logout() -> Response {
    let mut response = Redirect::to("/ui/login").into_response();
    response.headers_mut().insert(
        http::header::SET_COOKIE,
        http::HeaderValue::from_static(
            "pgvs3_token=; Path=/ui; HttpOnly; SameSite=Strict; Max-Age=0",
        ),
    );
    response
}
