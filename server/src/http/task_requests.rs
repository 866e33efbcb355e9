//! The request side of MCP tasks' 2025-11-25 shape (see `mcp::tasks`): rmcp 3.11 drops the
//! `task` field of `tools/call`, refuses `tasks/get` and `tasks/cancel` from clients without the
//! `io.modelcontextprotocol/tasks` extension, and has no `execution` on its `Tool`. This
//! middleware renames those requests (and `tools/list`) to the server-private methods that
//! `DurableServer` answers in that shape.

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use rmcp::model::RequestMetaObject;
use serde_json::{Value, json};

use crate::mcp::{PRIVATE_CALL, PRIVATE_CANCEL, PRIVATE_GET, PRIVATE_LIST_TOOLS};
use crate::streams::StreamStore;

/// What [`adapt_task_requests`] needs.
#[derive(Clone)]
pub struct AdaptState {
    pub streams: StreamStore,
    pub max_body_bytes: usize,
}

/// Renames the `POST /mcp` requests rmcp 3.11 would mishandle to server-private methods with
/// the same id and params (see the module comment): `tools/list`, a `tools/call` with a `task`
/// field, and `tasks/get` and `tasks/cancel` from clients that did not declare the extension.
/// Every other body is passed on byte for byte.
pub async fn adapt_task_requests(
    State(state): State<AdaptState>,
    request: Request,
    next: Next,
) -> Response {
    if request.method() != Method::POST {
        return next.run(request).await;
    }
    let (parts, body) = request.into_parts();
    let limit = state.max_body_bytes;
    let Ok(bytes) = axum::body::to_bytes(body, limit).await else {
        let body = json!({
            "jsonrpc": "2.0",
            "id": null,
            "error": {"code": -32600, "message": format!("request body exceeds {limit} bytes")},
        });
        return (StatusCode::PAYLOAD_TOO_LARGE, axum::Json(body)).into_response();
    };
    let mentions = |needle: &[u8]| bytes.windows(needle.len()).any(|window| window == needle);
    let mut body = Body::from(bytes.clone());
    if (mentions(b"tools/") || mentions(b"tasks/"))
        && let Ok(mut message) = serde_json::from_slice::<Value>(&bytes)
    {
        let session = parts
            .headers
            .get("mcp-session-id")
            .and_then(|value| value.to_str().ok());
        let declared = match session {
            Some(session) => state
                .streams
                .session_profile(session)
                .await
                .is_some_and(|profile| profile.tasks_extension),
            None => false,
        } || declares_extension_per_request(&message);
        if let Some(private) = private_method(&message, declared) {
            message["method"] = json!(private);
            body = Body::from(message.to_string());
        }
    }
    next.run(Request::from_parts(parts, body)).await
}

fn private_method(message: &Value, tasks_extension: bool) -> Option<&'static str> {
    match message["method"].as_str()? {
        "tools/list" => Some(PRIVATE_LIST_TOOLS),
        "tools/call" if message["params"].get("task").is_some() => Some(PRIVATE_CALL),
        "tasks/get" if !tasks_extension => Some(PRIVATE_GET),
        "tasks/cancel" if !tasks_extension => Some(PRIVATE_CANCEL),
        _ => None,
    }
}

/// Whether a request declares the extension in its own `_meta` client capabilities, as rmcp
/// reads them.
fn declares_extension_per_request(message: &Value) -> bool {
    serde_json::from_value::<RequestMetaObject>(message["params"]["_meta"].clone())
        .ok()
        .and_then(|meta| meta.client_capabilities())
        .is_some_and(|capabilities| capabilities.supports_tasks())
}
