//! Authorization in front of `/mcp`, as the MCP authorization spec asks of a resource server,
//! and the limits that keep one client from starving the others.
//!
//! - [`authorize`] (outermost): requests over the concurrency limit get 429 with
//!   `Retry-After`. With `--auth-issuer`, a request without a valid bearer token gets 401 with
//!   `WWW-Authenticate: Bearer resource_metadata="…"` (and `error="invalid_token"` when one was
//!   sent), one whose token grants none of this server's scopes 403 `insufficient_scope`. A
//!   session belongs to the subject that initialized it: another subject naming it is told it
//!   does not exist, and a subject at its session limit gets 429. The [`Principal`] rides on
//!   the request to the MCP layer, which checks ownership.
//! - [`require_scopes`] (inside the body limit): a token without `tasks:write` cannot start or
//!   steer tasks, one without `tasks:operator` cannot read the server-wide statistics: 403
//!   `insufficient_scope` naming the scope, read from the JSON-RPC body.
//! - [`metadata`]: the RFC 9728 protected-resource metadata.

use std::sync::Arc;

use axum::Json;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use futures::StreamExt;
use serde_json::{Value, json};
use tokio::sync::Semaphore;

use crate::auth::{Principal, SCOPE_OPERATOR, SCOPE_READ, SCOPE_WRITE, SCOPES, Verifier};
use crate::config::Limits;
use crate::mcp::error::ApiError;
use crate::streams::StreamStore;

const SESSION_HEADER: &str = "mcp-session-id";
/// Where RFC 9728 puts the metadata of a resource (followed by the resource's path).
pub const METADATA_PATH: &str = "/.well-known/oauth-protected-resource";
/// Tools any authenticated caller may use on its own tasks.
const READ_TOOLS: [&str; 2] = ["list_session_tasks", "get_session_info"];
/// Tools that show every subject's tasks (as counts).
const OPERATOR_TOOLS: [&str; 2] = ["get_server_stats", "get_checkpoint_stats"];

/// What the middleware needs.
#[derive(Clone)]
pub struct AuthState {
    /// `None`: no authorization (a single-user local server).
    pub verifier: Option<Arc<Verifier>>,
    pub streams: StreamStore,
    pub limits: Limits,
    /// Permits for the requests being served (streams a client listens on excepted).
    pub in_flight: Arc<Semaphore>,
}

impl AuthState {
    pub fn new(verifier: Option<Arc<Verifier>>, streams: StreamStore, limits: Limits) -> Self {
        AuthState {
            verifier,
            streams,
            in_flight: Arc::new(Semaphore::new(limits.concurrent_requests)),
            limits,
        }
    }
}

pub async fn authorize(
    State(state): State<AuthState>,
    mut request: Request,
    next: Next,
) -> Response {
    // A GET stream is a client listening, bounded per session (see `resume`); every other
    // request holds a permit until its answer has been sent.
    let permit = match request.method() {
        &Method::GET => None,
        _ => match state.in_flight.clone().try_acquire_owned() {
            Ok(permit) => Some(permit),
            Err(_) => {
                let limit = state.limits.concurrent_requests;
                return too_many(
                    "max_concurrent_requests",
                    format!(
                        "the server is serving {limit} requests, as many as it takes at once \
                         (--max-concurrent-requests); retry in a moment"
                    ),
                    1,
                );
            }
        },
    };
    let response = match &state.verifier {
        None => next.run(request).await,
        Some(verifier) => match authenticate(&state, verifier, &mut request).await {
            Err(refusal) => return refusal,
            Ok(principal) => {
                let opens_session = !request.headers().contains_key(SESSION_HEADER);
                let response = next.run(request).await;
                match opens_session {
                    true => claim_new_session(&state, &principal, response).await,
                    false => response,
                }
            }
        },
    };
    let Some(permit) = permit else {
        return response;
    };
    let (parts, body) = response.into_parts();
    let body = body.into_data_stream().map(move |chunk| {
        let _held = &permit;
        chunk
    });
    Response::from_parts(parts, Body::from_stream(body))
}

/// The principal of a request, put on it for the layers inside; or the refusal.
async fn authenticate(
    state: &AuthState,
    verifier: &Verifier,
    request: &mut Request,
) -> Result<Principal, Response> {
    let metadata_url = resource_metadata_url(verifier, request.headers());
    let challenge = |error: Option<(&str, String)>| unauthorized(&metadata_url, error);
    let Some(token) = bearer(request.headers()).map(str::to_owned) else {
        return Err(challenge(None));
    };
    let principal = match verifier.verify(&token).await {
        Ok(principal) => principal,
        Err(e) => return Err(challenge(Some(("invalid_token", e.0)))),
    };
    if !principal.scopes.may_read() {
        return Err(insufficient_scope(SCOPE_READ));
    }
    let session = request
        .headers()
        .get(SESSION_HEADER)
        .and_then(|value| value.to_str().ok())
        .map(str::to_owned);
    match session {
        Some(session) => match state.streams.session_subject(&session).await {
            Ok(Some(subject)) if subject == principal.subject => {}
            Ok(owner) => {
                if owner.is_some() {
                    tracing::warn!(
                        session,
                        subject = principal.subject,
                        "a session of another subject was named"
                    );
                }
                return Err(ApiError::Http {
                    status: StatusCode::NOT_FOUND,
                    message: format!("session {session} not found; initialize a new session"),
                }
                .into_response());
            }
            Err(e) => return Err(ApiError::Store(e).into_response()),
        },
        // A stateless (2026-07-28) request never opens a session.
        None if request.method() == Method::POST
            && !super::stateless::names_stateless_version(request.headers()) =>
        {
            let limit = state.limits.sessions_per_subject;
            match state.streams.sessions_of(&principal.subject).await {
                Ok(open) if open >= limit => {
                    return Err(too_many(
                        "max_sessions_per_subject",
                        format!(
                            "you have {limit} open sessions, the most one subject may have \
                             (--max-sessions-per-subject); close one (HTTP DELETE) or let one \
                             expire"
                        ),
                        60,
                    ));
                }
                Ok(_) => {}
                Err(e) => return Err(ApiError::Store(e).into_response()),
            }
        }
        None => {}
    }
    request.extensions_mut().insert(principal.clone());
    Ok(principal)
}

/// Records the subject of the session a response opened, before the client can learn its id.
async fn claim_new_session(
    state: &AuthState,
    principal: &Principal,
    response: Response,
) -> Response {
    let Some(session) = response
        .headers()
        .get(SESSION_HEADER)
        .and_then(|value| value.to_str().ok())
    else {
        return response;
    };
    match state
        .streams
        .claim_session(session, &principal.subject)
        .await
    {
        Ok(()) => response,
        // Unowned, the session would be refused to everyone: tell the client now.
        Err(e) => ApiError::Store(e).into_response(),
    }
}

/// The token of an `Authorization: Bearer` header (the scheme is case-insensitive).
fn bearer(headers: &HeaderMap) -> Option<&str> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

/// Refuses a body holding a request the principal's scopes do not cover.
pub async fn require_scopes(request: Request, next: Next) -> Response {
    let Some(principal) = request.extensions().get::<Principal>() else {
        return next.run(request).await;
    };
    let scopes = principal.scopes;
    if scopes.operator || request.method() != Method::POST {
        return next.run(request).await;
    }
    let (parts, body) = request.into_parts();
    // The body limit in front of this middleware caps the read (see `body_limit`).
    let Ok(bytes) = axum::body::to_bytes(body, usize::MAX).await else {
        return StatusCode::PAYLOAD_TOO_LARGE.into_response();
    };
    // Every request needing more than reading names a `tools/` or `tasks/` method.
    if super::task_requests::worth_parsing(&bytes)
        && let Ok(message) = serde_json::from_slice::<Value>(&bytes)
    {
        let messages = match &message {
            Value::Array(batch) => batch.iter().collect(),
            single => vec![single],
        };
        for message in messages {
            match required_scope(message) {
                Some(SCOPE_OPERATOR) => return insufficient_scope(SCOPE_OPERATOR),
                Some(SCOPE_WRITE) if !scopes.may_write() => return insufficient_scope(SCOPE_WRITE),
                _ => {}
            }
        }
    }
    next.run(Request::from_parts(parts, Body::from(bytes)))
        .await
}

/// The scope a JSON-RPC message needs beyond reading one's own tasks, if any.
fn required_scope(message: &Value) -> Option<&'static str> {
    match message["method"].as_str()? {
        "tools/call" => {
            let tool = message["params"]["name"].as_str().unwrap_or_default();
            if READ_TOOLS.contains(&tool) {
                None
            } else if OPERATOR_TOOLS.contains(&tool) {
                Some(SCOPE_OPERATOR)
            } else {
                Some(SCOPE_WRITE)
            }
        }
        "tasks/cancel" | "tasks/update" => Some(SCOPE_WRITE),
        _ => None,
    }
}

/// The URL of this resource's metadata: beside the audience when that is the resource's URL
/// (as RFC 8707 recommends), else on the host the client reached.
fn resource_metadata_url(verifier: &Verifier, headers: &HeaderMap) -> String {
    if let Some((origin, path)) = audience_url(&verifier.config().audience) {
        return format!("{origin}{METADATA_PATH}{}", path.trim_end_matches('/'));
    }
    let host = headers
        .get(header::HOST)
        .and_then(|value| value.to_str().ok())
        .unwrap_or("127.0.0.1");
    format!("http://{host}{METADATA_PATH}/mcp")
}

/// The origin and path of an http(s) audience.
fn audience_url(audience: &str) -> Option<(String, String)> {
    let uri: axum::http::Uri = audience.parse().ok()?;
    let scheme = uri
        .scheme_str()
        .filter(|scheme| matches!(*scheme, "http" | "https"))?;
    let origin = format!("{scheme}://{}", uri.authority()?);
    Some((origin, uri.path().to_owned()))
}

/// RFC 9728 protected-resource metadata, served at [`METADATA_PATH`] and `…/mcp`.
pub async fn metadata(State(verifier): State<Arc<Verifier>>) -> Json<Value> {
    let config = verifier.config();
    Json(json!({
        "resource": config.audience,
        "authorization_servers": [config.issuer],
        "scopes_supported": SCOPES,
        "bearer_methods_supported": ["header"],
        "resource_name": "durable-mcp",
    }))
}

fn unauthorized(metadata_url: &str, error: Option<(&str, String)>) -> Response {
    let mut challenge = format!(
        "Bearer resource_metadata=\"{metadata_url}\", scope=\"{SCOPE_READ} {SCOPE_WRITE}\""
    );
    let message = match &error {
        Some((code, description)) => {
            challenge.push_str(&format!(
                ", error=\"{code}\", error_description=\"{}\"",
                quoted(description)
            ));
            format!("unauthorized: {description}")
        }
        None => "unauthorized: send an OAuth bearer token (Authorization: Bearer …) issued for \
                 this server"
            .into(),
    };
    with_challenge(StatusCode::UNAUTHORIZED, message, challenge)
}

fn insufficient_scope(scope: &str) -> Response {
    let challenge = format!(
        "Bearer error=\"insufficient_scope\", scope=\"{scope}\", error_description=\"this \
         request needs the {scope} scope\""
    );
    with_challenge(
        StatusCode::FORBIDDEN,
        format!("insufficient_scope: this request needs the {scope} scope"),
        challenge,
    )
}

fn with_challenge(status: StatusCode, message: String, challenge: String) -> Response {
    let mut response = ApiError::Http { status, message }.into_response();
    if let Ok(value) = HeaderValue::from_str(&challenge) {
        response
            .headers_mut()
            .insert(header::WWW_AUTHENTICATE, value);
    }
    response
}

/// HTTP 429 naming `limit`, with `Retry-After`.
pub fn too_many(limit: &'static str, message: String, retry_after_secs: u64) -> Response {
    let mut response = ApiError::Limit { limit, message }.into_response();
    response
        .headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from(retry_after_secs));
    response
}

/// `text` made safe inside a quoted-string of a header (RFC 9110 §5.6.4).
fn quoted(text: &str) -> String {
    text.chars()
        .filter(|c| c.is_ascii() && !c.is_ascii_control())
        .map(|c| if c == '"' { '\'' } else { c })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(tool: &str) -> Value {
        json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": tool}})
    }

    #[test]
    fn each_request_needs_the_scope_of_what_it_does() {
        assert_eq!(required_scope(&call("list_session_tasks")), None);
        assert_eq!(
            required_scope(&call("start_batch_processing")),
            Some(SCOPE_WRITE)
        );
        assert_eq!(required_scope(&call("cancel_task")), Some(SCOPE_WRITE));
        assert_eq!(
            required_scope(&call("get_server_stats")),
            Some(SCOPE_OPERATOR)
        );
        let cancel = json!({"method": "tasks/cancel", "params": {"taskId": "t"}});
        assert_eq!(required_scope(&cancel), Some(SCOPE_WRITE));
        let read = json!({"method": "resources/read", "params": {"uri": "task://list"}});
        assert_eq!(required_scope(&read), None);
    }

    #[test]
    fn bearer_tokens_are_read_whatever_the_scheme_case() {
        let mut headers = HeaderMap::new();
        headers.insert(
            header::AUTHORIZATION,
            HeaderValue::from_static("bearer abc"),
        );
        assert_eq!(bearer(&headers), Some("abc"));
        headers.insert(header::AUTHORIZATION, HeaderValue::from_static("Basic abc"));
        assert_eq!(bearer(&headers), None);
        headers.insert(header::AUTHORIZATION, HeaderValue::from_static("Bearer "));
        assert_eq!(bearer(&headers), None);
    }
}
