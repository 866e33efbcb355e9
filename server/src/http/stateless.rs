//! Which requests speak the stateless protocol 2026-07-28: no `initialize`, no session, the
//! protocol version in each request (its `MCP-Protocol-Version` header and `_meta`).
//!
//! Those requests go to a second rmcp service, one without an event store (see `http::router`):
//! the revision removed resumption, and a closed response stream MUST be taken as the
//! cancellation of its request (2026-07-28, transports: "SSE resumability"). rmcp cancels an
//! unstored stateless request when its stream is dropped, and keeps a stored one running for a
//! resumption that can no longer come; storing its events would only cost writes. What such a
//! request starts durably, a task, lives in the engine, not in the stream.
//!
//! The decision mirrors rmcp's own (`is_legacy_request` in its tower service) for what either
//! service would accept: a version of 2026-07-28 or later in the header or `_meta`, or the
//! complete per-request `_meta` of the inline lifecycle, or `server/discover`; never
//! `initialize`. A request on a session that names no such version stays on its session
//! without its body being read, unless it is a read (`reads`), which goes to the same service
//! without a stream: the same body read decides both.

use axum::body::Body;
use axum::extract::Request;
use axum::http::{HeaderMap, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use rmcp::model::{ProtocolVersion, RequestMetaObject};
use serde_json::Value;

use super::reads;
use crate::streams::{CallId, is_stateless};

/// The marker a stateless request carries in its extensions, for the layers after this one and
/// for the choice of service.
#[derive(Debug, Clone, Copy)]
pub struct Stateless;

const PROTOCOL_VERSION_HEADER: &str = "mcp-protocol-version";
const SESSION_HEADER: &str = "mcp-session-id";

/// Marks stateless requests (see the module comment), and a known session's reads (see
/// `reads`); reads a body only when the headers do not decide, or on a known session.
pub async fn mark(mut request: Request, next: Next) -> Response {
    let by_headers = by_headers(request.headers());
    // The resume middleware gives every POST of a session it knows a call id.
    let on_known_session = request.extensions().get::<CallId>().is_some();
    let reads_body = request.method() == Method::POST
        && match by_headers {
            None => true,
            Some(stateless) => !stateless && on_known_session,
        };
    if !reads_body {
        if by_headers == Some(true) {
            request.extensions_mut().insert(Stateless);
        }
        return next.run(request).await;
    }
    let (parts, body) = request.into_parts();
    // The body limit in front of this layer is the cap (see `http::body_limit`).
    let Ok(bytes) = axum::body::to_bytes(body, usize::MAX).await else {
        return StatusCode::PAYLOAD_TOO_LARGE.into_response();
    };
    let session_read = on_known_session && reads::is_read(&bytes);
    let stateless = by_headers.is_none()
        && serde_json::from_slice::<Value>(&bytes).is_ok_and(|message| by_body(&message));
    request = Request::from_parts(parts, Body::from(bytes));
    if session_read {
        request.extensions_mut().insert(reads::SessionRead);
    }
    if stateless {
        request.extensions_mut().insert(Stateless);
    }
    next.run(request).await
}

/// Whether the request's `MCP-Protocol-Version` header names the stateless revision (or a
/// later one), which every 2026-07-28 request carries.
pub fn names_stateless_version(headers: &HeaderMap) -> bool {
    headers
        .get(PROTOCOL_VERSION_HEADER)
        .and_then(|value| value.to_str().ok())
        .is_some_and(is_stateless)
}

/// The decision when the headers make it: a 2026-07-28 version header is stateless, a session
/// without one is not; `None` when only the body can tell.
fn by_headers(headers: &HeaderMap) -> Option<bool> {
    if names_stateless_version(headers) {
        return Some(true);
    }
    if headers.contains_key(SESSION_HEADER) {
        return Some(false);
    }
    None
}

/// The decision from a message without a session or a 2026-07-28 header.
fn by_body(message: &Value) -> bool {
    let Some(method) = message["method"].as_str() else {
        return false;
    };
    match method {
        "initialize" => false,
        "server/discover" => true,
        _ => {
            let Ok(meta) =
                serde_json::from_value::<RequestMetaObject>(message["params"]["_meta"].clone())
            else {
                return false;
            };
            let inline = meta
                .missing_required_keys(&ProtocolVersion::V_2026_07_28)
                .is_empty();
            inline
                || meta
                    .protocol_version()
                    .is_some_and(|version| is_stateless(version.as_str()))
        }
    }
}

#[cfg(test)]
mod tests {
    use axum::http::HeaderValue;
    use serde_json::json;

    use super::*;

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut headers = HeaderMap::new();
        for (name, value) in pairs {
            headers.insert(*name, HeaderValue::from_static(value));
        }
        headers
    }

    #[test]
    fn the_version_header_decides_before_the_session() {
        let cases = [
            (vec![(PROTOCOL_VERSION_HEADER, "2026-07-28")], Some(true)),
            (
                vec![
                    (PROTOCOL_VERSION_HEADER, "2026-07-28"),
                    (SESSION_HEADER, "s"),
                ],
                Some(true),
            ),
            (
                vec![
                    (PROTOCOL_VERSION_HEADER, "2025-11-25"),
                    (SESSION_HEADER, "s"),
                ],
                Some(false),
            ),
            (vec![(SESSION_HEADER, "s")], Some(false)),
            (vec![(PROTOCOL_VERSION_HEADER, "2025-11-25")], None),
            (vec![], None),
        ];
        for (pairs, expected) in cases {
            assert_eq!(by_headers(&headers(&pairs)), expected, "{pairs:?}");
        }
    }

    #[test]
    fn a_body_is_stateless_by_discover_or_its_meta_never_by_initialize() {
        let request = |method: &str, meta: Value| json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": {"_meta": meta}});
        let inline = json!({
            "io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientCapabilities": {},
        });
        let cases = [
            (request("server/discover", json!({})), true),
            (request("tools/list", inline.clone()), true),
            (
                request(
                    "tools/list",
                    json!({"io.modelcontextprotocol/protocolVersion": "2026-07-28"}),
                ),
                true,
            ),
            (
                request(
                    "tools/list",
                    json!({"io.modelcontextprotocol/protocolVersion": "2025-11-25"}),
                ),
                false,
            ),
            (request("initialize", inline), false),
            (request("tools/list", json!({"progressToken": 1})), false),
            (json!({"jsonrpc": "2.0", "id": 1, "result": {}}), false),
            (json!([request("server/discover", json!({}))]), false),
        ];
        for (message, expected) in cases {
            assert_eq!(by_body(&message), expected, "{message}");
        }
    }
}
