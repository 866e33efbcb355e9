//! The request side of MCP tasks' 2025-11-25 shape (see `mcp::tasks`): rmcp 3.11 drops the
//! `task` field of `tools/call`, refuses `tasks/get` and `tasks/cancel` from clients without the
//! `io.modelcontextprotocol/tasks` extension, and has no `execution` on its `Tool`. This
//! middleware renames those requests (and `tools/list`) to the server-private methods that
//! `DurableServer` answers in that shape. Which message is renamed to what is decided by plain
//! functions, tested below.

use std::borrow::Cow;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use rmcp::model::RequestMetaObject;
use serde::Deserialize;
use serde::de::{Deserializer, IgnoredAny};
use serde_json::{Value, json};

use super::stateless::Stateless;
use crate::mcp::error::ApiError;
use crate::mcp::{PRIVATE_CALL, PRIVATE_CANCEL, PRIVATE_GET, PRIVATE_LIST_TOOLS};
use crate::streams::StreamStore;

/// Renames the `POST /mcp` requests rmcp 3.11 would mishandle to server-private methods with
/// the same id and params (see the module comment): `tools/list`, a `tools/call` with a `task`
/// field, and `tasks/get` and `tasks/cancel` from clients that did not declare the extension.
/// Every other body is passed on byte for byte.
pub async fn adapt_task_requests(
    State(streams): State<StreamStore>,
    request: Request,
    next: Next,
) -> Response {
    // A stateless (2026-07-28) client speaks only the extension, and its `Mcp-Method` header
    // must keep matching the body's method.
    if request.method() != Method::POST || request.extensions().get::<Stateless>().is_some() {
        return next.run(request).await;
    }
    let (parts, body) = request.into_parts();
    // The body limit in front of this middleware is the only cap: past it, reading fails, and
    // `http::body_limit` turns this bare 413 into the JSON-RPC one naming the limit.
    let Ok(bytes) = axum::body::to_bytes(body, usize::MAX).await else {
        return StatusCode::PAYLOAD_TOO_LARGE.into_response();
    };
    let json_body = parts
        .headers
        .get(axum::http::header::CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .is_some_and(|value| {
            value
                .split(';')
                .next()
                .is_some_and(|essence| essence.trim().eq_ignore_ascii_case("application/json"))
        });
    let mut body = Body::from(bytes.clone());
    if worth_parsing(&bytes)
        && let Ok(message) = serde_json::from_slice::<Envelope>(&bytes)
    {
        let declared = message.extension_matters()
            && (declares_extension_per_request(&message)
                || session_declares_extension(&streams, &parts.headers).await);
        if let Some(private) = private_method(&message, declared)
            && let Ok(mut whole) = serde_json::from_slice::<Value>(&bytes)
        {
            whole["method"] = json!(private);
            body = Body::from(whole.to_string());
        }
    }
    let response = next.run(Request::from_parts(parts, body)).await;
    // rmcp answers every JSON body it cannot read as a message with 415, as if its type were
    // wrong; JSON-RPC says what each failure is.
    if json_body && response.status() == StatusCode::UNSUPPORTED_MEDIA_TYPE {
        return unreadable(&bytes).into_response();
    }
    response
}

/// What a JSON body rmcp could not read as one JSON-RPC message is: not JSON (parse error,
/// -32700) or JSON that is no message (invalid request, -32600); HTTP 400 each. (Batches are
/// answered, or refused, before: see `http::batch`.)
fn unreadable(body: &[u8]) -> ApiError {
    let invalid = |message: String| ApiError::Http {
        status: StatusCode::BAD_REQUEST,
        message,
    };
    match serde_json::from_slice::<Value>(body) {
        Err(e) => ApiError::Parse(format!("parse error: the body is not JSON ({e})")),
        Ok(_) => match serde_json::from_slice::<rmcp::model::ClientJsonRpcMessage>(body) {
            Err(e) => invalid(format!("invalid request: not a JSON-RPC 2.0 message ({e})")),
            Ok(_) => invalid("invalid request".into()),
        },
    }
}

/// Whether a body may hold a request to rename (or, in `authorize`, one needing a scope): each
/// such method has `tools/` or `tasks/` in its name, so the others skip the JSON parse.
pub(super) fn worth_parsing(body: &[u8]) -> bool {
    let mentions = |needle: &[u8]| body.windows(needle.len()).any(|window| window == needle);
    mentions(b"tools/") || mentions(b"tasks/")
}

/// What the renaming reads of a message: its method, borrowed from the body, and two fields of
/// its params. Every `tools/call` (each `start_*`) is read here, and a whole `Value`, arguments
/// and all, cost more than the fields looked at. A body that is not an object with a string
/// method (a response, a batch, a malformed request) fails to parse and is passed on as it is.
#[derive(Deserialize)]
struct Envelope<'a> {
    #[serde(borrow)]
    method: Cow<'a, str>,
    #[serde(default)]
    params: Option<EnvelopeParams>,
}

#[derive(Deserialize)]
struct EnvelopeParams {
    /// Whether the params have a `task` field, whatever it holds.
    #[serde(default, deserialize_with = "present")]
    task: bool,
    /// Rarely there on a session's request: only a request declaring the extension by itself
    /// needs it.
    #[serde(rename = "_meta", default)]
    meta: Option<Value>,
}

/// Deserializes any value (a field that is present) as `true`.
fn present<'de, D: Deserializer<'de>>(deserializer: D) -> Result<bool, D::Error> {
    IgnoredAny::deserialize(deserializer).map(|_| true)
}

impl Envelope<'_> {
    /// Whether [`private_method`] depends on the client's declaring the tasks extension, which
    /// costs a look at the session to learn.
    fn extension_matters(&self) -> bool {
        matches!(&*self.method, "tasks/get" | "tasks/cancel")
    }
}

/// The private method `message` is renamed to, given whether its client declared the tasks
/// extension (then rmcp serves its `tasks/get` and `tasks/cancel` itself).
fn private_method(message: &Envelope<'_>, tasks_extension: bool) -> Option<&'static str> {
    match &*message.method {
        "tools/list" => Some(PRIVATE_LIST_TOOLS),
        "tools/call" if message.params.as_ref().is_some_and(|params| params.task) => {
            Some(PRIVATE_CALL)
        }
        "tasks/get" if !tasks_extension => Some(PRIVATE_GET),
        "tasks/cancel" if !tasks_extension => Some(PRIVATE_CANCEL),
        _ => None,
    }
}

/// Whether the request's session declared the extension when it initialized.
async fn session_declares_extension(streams: &StreamStore, headers: &HeaderMap) -> bool {
    let Some(session) = headers
        .get("mcp-session-id")
        .and_then(|value| value.to_str().ok())
    else {
        return false;
    };
    streams
        .session_profile(session)
        .await
        .is_some_and(|profile| profile.tasks_extension)
}

/// Whether a request declares the extension in its own `_meta` client capabilities, as rmcp
/// reads them.
fn declares_extension_per_request(message: &Envelope<'_>) -> bool {
    message
        .params
        .as_ref()
        .and_then(|params| params.meta.as_ref())
        .and_then(|meta| RequestMetaObject::deserialize(meta).ok())
        .and_then(|meta| meta.client_capabilities())
        .is_some_and(|capabilities| capabilities.supports_tasks())
}

#[cfg(test)]
mod tests {
    use rmcp::model::TASKS_EXTENSION_ID;

    use super::*;

    fn request(method: &str, params: Value) -> Value {
        json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params})
    }

    #[test]
    fn unreadable_bodies_get_the_json_rpc_error_of_what_they_are() {
        let code = |body: &str| {
            let error = rmcp::ErrorData::from(unreadable(body.as_bytes()));
            (error.code.0, error.message.to_string())
        };
        let (parse, message) = code(r#"{"jsonrpc": "2.0", "id": 1, "method": "#);
        assert_eq!(parse, -32700, "{message}");
        assert_eq!(
            code(r#"[{"jsonrpc": "2.0", "id": 1, "method": "ping"}]"#).0,
            -32600
        );
        let (invalid, message) = code(r#"{"jsonrpc": "1.0", "hello": true}"#);
        assert_eq!(invalid, -32600);
        assert!(message.contains("not a JSON-RPC 2.0 message"), "{message}");
        assert_eq!(unreadable(b"{").http_status(), StatusCode::BAD_REQUEST);
    }

    #[test]
    fn only_bodies_naming_tools_or_tasks_methods_are_parsed() {
        assert!(worth_parsing(br#"{"method":"tools/list"}"#));
        assert!(worth_parsing(br#"{"method":"tasks/get"}"#));
        assert!(worth_parsing(
            br#"{"method":"x","params":{"uri":"tools/x"}}"#
        ));
        assert!(!worth_parsing(br#"{"method":"ping"}"#));
        assert!(!worth_parsing(br#"{"method":"tools"}"#));
        assert!(!worth_parsing(b""));
    }

    #[test]
    fn renames_by_method_task_field_and_extension() {
        let call = json!({"name": "run_batch_processing", "arguments": {}});
        let task_call = json!({"name": "run_batch_processing", "arguments": {}, "task": {}});
        let id = json!({"taskId": "t"});
        let cases = [
            (
                request("tools/list", json!({})),
                false,
                Some(PRIVATE_LIST_TOOLS),
            ),
            (
                request("tools/list", json!({})),
                true,
                Some(PRIVATE_LIST_TOOLS),
            ),
            (
                request("tools/call", task_call.clone()),
                false,
                Some(PRIVATE_CALL),
            ),
            (request("tools/call", task_call), true, Some(PRIVATE_CALL)),
            (request("tools/call", call.clone()), false, None),
            (request("tools/call", call), true, None),
            (request("tasks/get", id.clone()), false, Some(PRIVATE_GET)),
            (request("tasks/get", id.clone()), true, None),
            (
                request("tasks/cancel", id.clone()),
                false,
                Some(PRIVATE_CANCEL),
            ),
            (request("tasks/cancel", id.clone()), true, None),
            (request("tasks/result", id.clone()), false, None),
            (request("tasks/list", json!({})), false, None),
            (request("ping", json!({})), false, None),
            (
                json!({"jsonrpc": "2.0", "id": 1, "result": {}}),
                false,
                None,
            ),
            (json!({"jsonrpc": "2.0", "id": 1, "method": 7}), false, None),
            // A `task` field marks a task-augmented call whatever it holds.
            (
                request("tools/call", json!({"name": "x", "task": null})),
                false,
                Some(PRIVATE_CALL),
            ),
            (json!([request("tools/list", json!({}))]), false, None),
        ];
        for (message, extension, expected) in cases {
            let body = message.to_string();
            let renamed = serde_json::from_str::<Envelope>(&body)
                .ok()
                .and_then(|envelope| private_method(&envelope, extension));
            assert_eq!(
                renamed, expected,
                "{message} (extension declared: {extension})"
            );
        }
    }

    #[test]
    fn a_method_spelled_with_escapes_is_read_as_its_name() {
        let body = r#"{"jsonrpc": "2.0", "id": 1, "method": "tools\/list"}"#;
        let envelope = serde_json::from_str::<Envelope>(body).unwrap();
        assert_eq!(private_method(&envelope, false), Some(PRIVATE_LIST_TOOLS));
    }

    #[test]
    fn the_extension_counts_when_declared_in_the_request_meta() {
        let declares = |message: Value| {
            let body = message.to_string();
            let envelope = serde_json::from_str::<Envelope>(&body).unwrap();
            assert!(envelope.extension_matters(), "{message}");
            declares_extension_per_request(&envelope)
        };
        let declaring = |extensions: Value| {
            request(
                "tasks/get",
                json!({"taskId": "t", "_meta": {
                    "io.modelcontextprotocol/clientCapabilities": {"extensions": extensions},
                }}),
            )
        };
        assert!(declares(declaring(json!({TASKS_EXTENSION_ID: {}}))));
        assert!(!declares(declaring(json!({"example/other": {}}))));
        assert!(!declares(request(
            "tasks/get",
            json!({"taskId": "t", "_meta": {"progressToken": 1}})
        )));
        assert!(!declares(request("tasks/get", json!({"taskId": "t"}))));
    }
}
