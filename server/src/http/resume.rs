//! The HTTP middleware in front of rmcp's `/mcp` service that makes its streams resumable the
//! way this server promises:
//!
//! - A `GET` with `Last-Event-ID` is checked before rmcp sees it: a malformed id gets 400, an
//!   unknown one 400, one of another session's stream 403, one whose events have expired 410,
//!   each with a JSON-RPC error body saying what to do. (rmcp itself would answer 200 with an
//!   empty stream, which makes clients reconnect forever, and does not check the session.)
//! - The first event id of every `POST` stream tells which session received that stream, stored
//!   before the id reaches the client, so a later resume can be checked against it.
//! - Priming events (empty data) reach only sessions on 2025-11-25 or later; the standalone
//!   `GET` stream's priming event gets a stored id, so even a quiet stream can be resumed.
//! - The initialize answer of a 2025-11-25 session gets the capabilities the MCP layer adds
//!   (the Tasks utility's `tasks`, see `mcp::tasks`).
//! - Sessions with requests or open streams are kept alive for the expiry sweep.

use std::time::Duration;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use bytes::{Bytes, BytesMut};
use durable_shared::sse::SseEvent;
use futures::StreamExt;
use serde_json::json;

use super::origin;
use crate::store::NewEvent;
use crate::streams::{EventId, OpenStream, StreamStore, negotiated, wants_priming};

const SESSION_HEADER: &str = "mcp-session-id";
const LAST_EVENT_ID_HEADER: &str = "last-event-id";

/// What the middleware needs.
#[derive(Clone)]
pub struct ResumeState {
    pub streams: StreamStore,
    /// The `retry:` hint of priming events.
    pub sse_retry: Duration,
    /// The allowed browser origins (rmcp answers foreign ones with 403 itself).
    pub origins: std::sync::Arc<Vec<String>>,
    /// Capabilities added to the initialize answers of sessions on 2025-11-25 or later: the MCP
    /// layer's that rmcp does not model (the Tasks utility's `tasks`).
    pub added_capabilities: std::sync::Arc<serde_json::Map<String, serde_json::Value>>,
}

fn header_str<'a>(request: &'a Request, name: &str) -> Option<&'a str> {
    request
        .headers()
        .get(name)
        .and_then(|value| value.to_str().ok())
}

/// A 4xx with a JSON-RPC error body.
fn refuse(status: StatusCode, message: String) -> Response {
    let body = json!({
        "jsonrpc": "2.0",
        "id": null,
        "error": {"code": -32600, "message": message},
    });
    (status, axum::Json(body)).into_response()
}

pub async fn resumable(State(state): State<ResumeState>, request: Request, next: Next) -> Response {
    let session = header_str(&request, SESSION_HEADER).map(str::to_owned);
    let method = request.method().clone();
    let last_event_id = header_str(&request, LAST_EVENT_ID_HEADER).map(str::to_owned);
    let origin_ok = header_str(&request, header::ORIGIN.as_str())
        .is_none_or(|origin| origin::allowed(&state.origins, origin));

    let mut version = None;
    if let Some(session) = &session {
        version = state.streams.session_version(session).await;
        if version.is_some() {
            state.streams.saw(session);
        }
    }
    if method == Method::GET
        && origin_ok
        && let Some(last_event_id) = &last_event_id
    {
        let Some(session) = &session else {
            return refuse(
                StatusCode::BAD_REQUEST,
                "resuming a stream needs the Mcp-Session-Id header of the session it belongs to"
                    .into(),
            );
        };
        // An unknown session is rmcp's to answer (404: initialize again).
        if version.is_some()
            && let Err(response) = check_resume(&state.streams, session, last_event_id).await
        {
            return response;
        }
    }

    let fresh_get = method == Method::GET && last_event_id.is_none();
    let mut response = next.run(request).await;
    if method == Method::DELETE && response.status() == StatusCode::ACCEPTED {
        // rmcp answers a session DELETE with 202; the session is gone at once, and clients
        // (the Python SDK among them) expect a plain success.
        *response.status_mut() = StatusCode::NO_CONTENT;
    }
    let is_sse = response
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|value| value.as_bytes().starts_with(b"text/event-stream"));
    if !is_sse || !response.status().is_success() {
        return response;
    }
    let priming = match version {
        Some(version) if wants_priming(version) => Priming::Keep,
        Some(_) => Priming::Drop,
        // No session yet: an initialize answer, whose result names the version.
        None => Priming::Decide,
    };
    let rewriter = Rewriter {
        streams: state.streams.clone(),
        buffer: BytesMut::new(),
        priming,
        held: None,
        bind_session: session
            .clone()
            .filter(|_| method == Method::POST && version.is_some()),
        stamp_priming: match (&session, fresh_get) {
            (Some(session), true) if priming == Priming::Keep => Some(session.clone()),
            _ => None,
        },
        sse_retry: state.sse_retry,
        added_capabilities: state.added_capabilities.clone(),
        _open: session
            .filter(|_| version.is_some())
            .map(|session| state.streams.open_stream(&session)),
    };
    let (parts, body) = response.into_parts();
    let frames = body.into_data_stream();
    let stream = futures::stream::unfold(
        (frames, rewriter),
        |(mut frames, mut rewriter)| async move {
            loop {
                let chunk = match frames.next().await? {
                    Ok(chunk) => chunk,
                    Err(e) => return Some((Err(e), (frames, rewriter))),
                };
                let out = rewriter.feed(&chunk).await;
                if !out.is_empty() {
                    return Some((Ok::<Bytes, axum::Error>(out), (frames, rewriter)));
                }
            }
        },
    );
    Response::from_parts(parts, Body::from_stream(stream))
}

/// Checks a `Last-Event-ID` against the caller's session.
async fn check_resume(
    streams: &StreamStore,
    session: &str,
    last_event_id: &str,
) -> Result<(), Response> {
    let store = streams.store();
    let id: EventId = last_event_id
        .parse()
        .map_err(|e: durable_shared::MalformedEventId| {
            refuse(
                StatusCode::BAD_REQUEST,
                format!("{e}. Reconnect without Last-Event-ID and re-read the state you need."),
            )
        })?;
    let internal = |e: crate::store::StoreError| {
        tracing::error!(error = %e, "cannot check Last-Event-ID");
        refuse(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal storage error".into(),
        )
    };
    let unknown = || {
        refuse(
            StatusCode::BAD_REQUEST,
            format!(
                "Last-Event-ID {id} was never sent on this session's streams. Reconnect without \
                 Last-Event-ID and re-read the state you need."
            ),
        )
    };
    let stream = store
        .stream_info(&id.token)
        .await
        .map_err(internal)?
        .ok_or_else(unknown)?;
    match stream.session_id.as_deref() {
        Some(owner) if owner == session => {}
        Some(_) => {
            tracing::warn!(session, "Last-Event-ID of another session refused");
            return Err(refuse(
                StatusCode::FORBIDDEN,
                format!(
                    "Last-Event-ID {id} belongs to another session's stream. Resume only with ids \
                     this session received, or reconnect without Last-Event-ID."
                ),
            ));
        }
        None => return Err(unknown()),
    }
    if id.seq >= stream.next_seq {
        return Err(unknown());
    }
    if !store
        .event_exists(&id.token, id.seq)
        .await
        .map_err(internal)?
    {
        return Err(refuse(
            StatusCode::GONE,
            format!(
                "the events after Last-Event-ID {id} have expired. Reconnect without Last-Event-ID \
                 and re-read task://list (or the resources you follow) to catch up."
            ),
        ));
    }
    Ok(())
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Priming {
    Keep,
    Drop,
    /// Hold the first priming event until the initialize result shows the version.
    Decide,
}

/// Rewrites an SSE body event by event (a chunk may hold several events or part of one).
struct Rewriter {
    streams: StreamStore,
    buffer: BytesMut,
    priming: Priming,
    held: Option<Bytes>,
    /// Record the first event id's stream as this session's.
    bind_session: Option<String>,
    /// Give the standalone stream's first priming event a stored id on this session's stream.
    stamp_priming: Option<String>,
    sse_retry: Duration,
    added_capabilities: std::sync::Arc<serde_json::Map<String, serde_json::Value>>,
    _open: Option<OpenStream>,
}

/// The SSE event `text` with `data` as its data.
fn with_data(text: &str, data: &str) -> Bytes {
    let mut event = String::with_capacity(text.len() + data.len());
    for line in text.lines().filter(|line| !line.is_empty()) {
        if !line.starts_with("data:") {
            event.push_str(line);
            event.push('\n');
        }
    }
    event.push_str("data: ");
    event.push_str(data);
    event.push_str("\n\n");
    Bytes::from(event)
}

impl Rewriter {
    async fn feed(&mut self, chunk: &[u8]) -> Bytes {
        self.buffer.extend_from_slice(chunk);
        let mut out = BytesMut::new();
        while let Some(end) = self.buffer.windows(2).position(|w| w == b"\n\n") {
            let event = self.buffer.split_to(end + 2).freeze();
            if let Some(kept) = self.event(event).await {
                out.extend_from_slice(&kept);
            }
        }
        out.freeze()
    }

    async fn event(&mut self, event: Bytes) -> Option<Bytes> {
        let text = String::from_utf8_lossy(&event).into_owned();
        let Some(parsed) = SseEvent::parse(&text) else {
            // A comment (keep-alive).
            return Some(event);
        };
        if let (Some(session), Some(id)) = (self.bind_session.take(), parsed.id.as_deref())
            && let Ok(id) = id.parse::<EventId>()
            && let Err(e) = self
                .streams
                .store()
                .bind_stream_session(&id.token, &session)
                .await
        {
            tracing::error!(error = %e, "cannot record the session of a stream");
        }
        let is_priming = parsed.data.trim().is_empty();
        if !is_priming {
            if self.priming != Priming::Decide {
                return Some(event);
            }
            // The initialize answer: it names the version, and on 2025-11-25 or later it gets
            // the capabilities rmcp does not model.
            let mut answer = serde_json::from_str::<serde_json::Value>(&parsed.data).ok();
            let version = answer
                .as_ref()
                .and_then(|answer| answer["result"]["protocolVersion"].as_str())
                .map(negotiated);
            let event = match &mut answer {
                Some(answer)
                    if version.is_some_and(wants_priming)
                        && !self.added_capabilities.is_empty() =>
                {
                    if let Some(capabilities) = answer["result"]["capabilities"].as_object_mut() {
                        capabilities.extend(self.added_capabilities.as_ref().clone());
                    }
                    with_data(&text, &answer.to_string())
                }
                _ => event,
            };
            return Some(match self.held.take() {
                Some(held) if version.is_some_and(wants_priming) => [held, event].concat().into(),
                _ => event,
            });
        }
        match self.priming {
            Priming::Drop => None,
            Priming::Decide => {
                self.held = Some(event);
                None
            }
            Priming::Keep => match self.stamp_priming.take() {
                Some(session) if parsed.id.is_none() => {
                    Some(self.stamped(&session).await.unwrap_or(event))
                }
                _ => Some(event),
            },
        }
    }

    /// A priming event with an id stored on the session's standalone stream.
    async fn stamped(&self, session: &str) -> Option<Bytes> {
        let retry_ms = self.sse_retry.as_millis() as u64;
        let appended = self
            .streams
            .append(NewEvent {
                stream_id: format!("{session}:common"),
                session_id: Some(session.to_owned()),
                message: None,
                retry_ms: Some(retry_ms),
                finishes: false,
                binding: None,
            })
            .await;
        match appended {
            Ok(id) => Some(Bytes::from(format!(
                "data: \nid: {id}\nretry: {retry_ms}\n\n"
            ))),
            Err(e) => {
                tracing::error!(error = %e, "cannot store a priming event");
                None
            }
        }
    }
}
