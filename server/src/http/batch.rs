//! JSON-RPC batches, which protocol 2025-03-26 allows in a `POST` body (later revisions removed
//! them). rmcp reads one message per request, so a batch from a 2025-03-26 session is answered
//! here: each message goes down the rest of the middleware (resumable streams, limits, scopes,
//! the task-request adaptation) to rmcp as a request of its own, concurrently, and what they
//! answer comes back on one SSE stream, event by event, as it arrives. A batch of notifications
//! and responses alone gets 202.
//!
//! Each event keeps its id, so a client that lost the combined stream resumes with
//! `Last-Event-ID` the stream of one message: each request's stream is stored as its own.
//!
//! A batch from a session on a later revision, or without a session, gets 400 with JSON-RPC's
//! invalid request (-32600), as does an empty batch; `initialize` inside a batch gets that error
//! as its answer (the revision forbids batching it).

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use futures::stream::{self, BoxStream, StreamExt};
use serde_json::{Value, json};

use crate::mcp::error::ApiError;
use crate::streams::StreamStore;

/// The one revision that has batches.
const BATCH_REVISION: &str = "2025-03-26";

/// What the middleware needs: the sessions' negotiated versions and the body limit of `/mcp`.
#[derive(Clone)]
pub(super) struct BatchState {
    pub streams: StreamStore,
    pub max_body_bytes: usize,
}

/// Passes every body that is not a JSON array on untouched (having looked at its first byte);
/// answers a batch as the module comment says.
pub(super) async fn answer_batches(
    State(state): State<BatchState>,
    request: Request,
    next: Next,
) -> Response {
    if request.method() != Method::POST {
        return next.run(request).await;
    }
    let (parts, body) = request.into_parts();
    let mut body = body.into_data_stream();
    let mut head: Vec<Bytes> = Vec::new();
    let first_byte = loop {
        match body.next().await {
            Some(Ok(chunk)) => {
                let first = chunk.iter().copied().find(|b| !b.is_ascii_whitespace());
                head.push(chunk);
                if first.is_some() {
                    break first;
                }
            }
            // The rest of the chain reports a body that cannot be read.
            Some(Err(_)) | None => break None,
        }
    };
    if first_byte != Some(b'[') {
        let again = stream::iter(head.into_iter().map(Ok::<_, axum::Error>)).chain(body);
        return next
            .run(Request::from_parts(parts, Body::from_stream(again)))
            .await;
    }

    let mut bytes: Vec<u8> = head.concat();
    while let Some(chunk) = body.next().await {
        let Ok(chunk) = chunk else {
            return invalid("the request body could not be read").into_response();
        };
        bytes.extend_from_slice(&chunk);
        if bytes.len() > state.max_body_bytes {
            return ApiError::Http {
                status: StatusCode::PAYLOAD_TOO_LARGE,
                message: format!("request body exceeds {} bytes", state.max_body_bytes),
            }
            .into_response();
        }
    }
    let messages = match serde_json::from_slice::<Vec<Value>>(&bytes) {
        Ok(messages) => messages,
        Err(e) => {
            return ApiError::Parse(format!("parse error: the body is not JSON ({e})"))
                .into_response();
        }
    };
    if let Err(refusal) = check_revision(&state.streams, &parts).await {
        return refusal.into_response();
    }
    if messages.is_empty() {
        return invalid("invalid request: an empty batch").into_response();
    }

    let answers = messages.into_iter().map(|message| {
        let next = next.clone();
        let parts = parts.clone();
        async move {
            if !message.is_object() {
                let refusal = error_for(&message, "invalid request: not a JSON-RPC 2.0 message");
                return Some(event_stream(refusal));
            }
            if message["method"] == "initialize" {
                let refusal = error_for(&message, "initialize must not be part of a batch");
                return Some(event_stream(refusal));
            }
            let body = Body::from(message.to_string());
            let response = next.run(Request::from_parts(parts, body)).await;
            answer_of(&message, response).await
        }
    });
    let answers: Vec<_> = futures::future::join_all(answers)
        .await
        .into_iter()
        .flatten()
        .collect();
    if answers.is_empty() {
        return StatusCode::ACCEPTED.into_response();
    }
    let mut response = Body::from_stream(stream::select_all(answers)).into_response();
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    response
}

fn invalid(message: &str) -> ApiError {
    ApiError::Http {
        status: StatusCode::BAD_REQUEST,
        message: message.to_owned(),
    }
}

/// Batches are the 2025-03-26 revision's: the header names the revision where a client sends
/// it, else the session's negotiated one does.
async fn check_revision(
    streams: &StreamStore,
    parts: &axum::http::request::Parts,
) -> Result<(), ApiError> {
    let header = |name: &str| parts.headers.get(name).and_then(|v| v.to_str().ok());
    let Some(session) = header("mcp-session-id") else {
        return Err(invalid(
            "invalid request: a batch needs a session; initialize first, in a request of its own",
        ));
    };
    let version = match header("mcp-protocol-version") {
        Some(version) => Some(version.to_owned()),
        None => streams.session_version(session).await.map(str::to_owned),
    };
    match version.as_deref() {
        None => Err(ApiError::Http {
            status: StatusCode::NOT_FOUND,
            message: "session not found; initialize a new session".into(),
        }),
        Some(BATCH_REVISION) => Ok(()),
        Some(other) => Err(invalid(&format!(
            "invalid request: JSON-RPC batches exist only in protocol {BATCH_REVISION}, and this \
             session speaks {other}: send one message per request"
        ))),
    }
}

/// The events answering `message`, from rmcp's response: its SSE stream as whole events, a
/// JSON body as one event, nothing for an accepted notification or response.
async fn answer_of(
    message: &Value,
    response: Response,
) -> Option<BoxStream<'static, Result<Bytes, axum::Error>>> {
    let status = response.status();
    if status == StatusCode::ACCEPTED {
        return None;
    }
    let is_sse = response
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream"));
    if status.is_success() && is_sse {
        return Some(whole_events(response.into_body()));
    }
    // A JSON answer: a result, or an error the HTTP layer gave (without the request's id).
    let body = axum::body::to_bytes(response.into_body(), 1 << 20)
        .await
        .unwrap_or_default();
    let answer = match serde_json::from_slice::<Value>(&body) {
        Ok(mut answer) if answer.get("error").is_some() => {
            answer["id"] = message.get("id").cloned().unwrap_or(Value::Null);
            answer
        }
        Ok(answer) => answer,
        Err(_) => error_for(message, &format!("the server answered HTTP {status}")),
    };
    // A notification's refusal has nobody to answer.
    message.get("id")?;
    Some(event_stream(answer))
}

/// A JSON-RPC error answering `message`.
fn error_for(message: &Value, text: &str) -> Value {
    json!({"jsonrpc": "2.0", "id": message.get("id").cloned().unwrap_or(Value::Null),
           "error": {"code": -32600, "message": text}})
}

/// One SSE event carrying `answer`, without an id: it was never stored, as rmcp's own answers
/// from the HTTP layer are not.
fn event_stream(answer: Value) -> BoxStream<'static, Result<Bytes, axum::Error>> {
    let event = Bytes::from(format!("data: {answer}\n\n"));
    stream::once(async move { Ok(event) }).boxed()
}

/// The SSE stream of `body` cut at event boundaries, so that the streams merged into one
/// response interleave whole events, never parts of two.
fn whole_events(body: Body) -> BoxStream<'static, Result<Bytes, axum::Error>> {
    let state = (body.into_data_stream(), Vec::new(), false);
    stream::unfold(state, |(mut body, mut buffer, mut ended)| async move {
        loop {
            if let Some(event) = durable_shared::sse::take_event(&mut buffer) {
                return Some((Ok(Bytes::from(event)), (body, buffer, ended)));
            }
            if ended {
                return None;
            }
            match body.next().await {
                Some(Ok(chunk)) => buffer.extend_from_slice(&chunk),
                Some(Err(e)) => return Some((Err(e), (body, buffer, true))),
                None => ended = true,
            }
        }
    })
    .boxed()
}
