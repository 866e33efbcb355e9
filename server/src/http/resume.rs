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
//! - A session `DELETE` that rmcp answers with 202 is answered with 204.
//! - Sessions with requests or open streams are kept alive for the expiry sweep.
//!
//! Each decision is a plain function of what the request and the store say, tested below.

use std::time::Duration;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use bytes::{Bytes, BytesMut};
use durable_shared::MalformedEventId;
use durable_shared::sse::SseEvent;
use futures::StreamExt;
use serde_json::{Map, Value};

use super::reads::SessionRead;
use crate::mcp::error::ApiError;
use crate::streams::{CallId, EventId, OpenStream, StreamStore, negotiated, wants_priming};
use crate::streams::{NewEvent, StoreError};

const SESSION_HEADER: &str = "mcp-session-id";
const LAST_EVENT_ID_HEADER: &str = "last-event-id";

/// What the middleware needs.
#[derive(Clone)]
pub struct ResumeState {
    pub streams: StreamStore,
    /// SSE responses one session may have open at once.
    pub max_streams: usize,
    /// The `retry:` hint of priming events.
    pub sse_retry: Duration,
    /// Capabilities added to the initialize answers of sessions on 2025-11-25 or later: the MCP
    /// layer's that rmcp does not model (the Tasks utility's `tasks`).
    pub added_capabilities: std::sync::Arc<Map<String, Value>>,
}

fn header_str<'a>(request: &'a Request, name: &str) -> Option<&'a str> {
    request
        .headers()
        .get(name)
        .and_then(|value| value.to_str().ok())
}

pub async fn resumable(
    State(state): State<ResumeState>,
    mut request: Request,
    next: Next,
) -> Response {
    let session = header_str(&request, SESSION_HEADER).map(str::to_owned);
    let method = request.method().clone();
    // Not `header_str`: a Last-Event-ID that is not visible ASCII must be refused as malformed
    // (400), not taken for an absent one and left to rmcp.
    let last_event_id = request
        .headers()
        .get(LAST_EVENT_ID_HEADER)
        .map(|value| String::from_utf8_lossy(value.as_bytes()).into_owned());
    let mut version = None;
    if let Some(session) = &session {
        version = state.streams.session_version(session).await;
        if version.is_some() {
            state.streams.saw(session);
        }
    }
    if let (Some(session), Some(_)) = (&session, version)
        && method != Method::DELETE
        && state.streams.open_streams(session) >= state.max_streams
    {
        let limit = state.max_streams;
        return super::authorize::too_many(
            "max_streams_per_session",
            format!(
                "this session has {limit} streams open, the most one session may have \
                 (--max-streams-per-session); close one or wait for an answer to finish"
            ),
            1,
        );
    }
    // Whether a GET resumes the session's standalone stream (rather than a POST's).
    let mut resumes_standalone = false;
    // Every resumption is checked, whatever else the request carries (a protocol version
    // rmcp would serve without a session, an Origin rmcp matches differently): rmcp itself
    // replays any stream to anyone who names it.
    if method == Method::GET
        && let Some(last_event_id) = &last_event_id
    {
        let caller = match (&session, version) {
            (None, _) => Caller::Anonymous,
            (Some(_), None) => Caller::Unknown,
            (Some(session), Some(_)) => Caller::Known(session),
        };
        match check_resume(&state.streams, caller, last_event_id).await {
            Ok((Resume::Pass, standalone)) => resumes_standalone = standalone,
            Ok((Resume::Refuse(status, message), _)) => {
                return ApiError::Http { status, message }.into_response();
            }
            Err(e) => return ApiError::Store(e).into_response(),
        }
    }

    let fresh_get = method == Method::GET && last_event_id.is_none();
    // A POST on a session: its handler's call binding, if it makes one, takes this id, and
    // the stream of its answer records it (see [`CallId`]).
    let bind_session = match (session.clone(), version) {
        (Some(session), Some(_)) if method == Method::POST => {
            let call_id = CallId::random();
            request.extensions_mut().insert(call_id.clone());
            Some((session, call_id))
        }
        _ => None,
    };
    // A stored session's first request in this process runs alone (see
    // [`crate::streams::Serving`]). The session is in use while rmcp serves the request,
    // before any answer streams (see [`StreamStore::put_to_sleep`]); an SSE answer holds a
    // stream of its own from below.
    let mut first_request = None;
    let mut _in_flight = None;
    if let (Some(session), Some(_)) = (&session, version) {
        // Before rmcp opens the stream, so that its first event, whenever it comes, is stored.
        if fresh_get || resumes_standalone {
            state.streams.standalone_asked(session);
        }
        let serving = state.streams.serving(session);
        _in_flight = Some(serving.in_flight());
        let gate = serving.gate.clone().lock_owned().await;
        if !*gate {
            first_request = Some(gate);
        }
    }
    let mut response = next.run(request).await;
    // A read answered apart did not restore the session in rmcp (see `reads`).
    if let Some(mut served) = first_request {
        *served =
            response.status().is_success() && response.extensions().get::<SessionRead>().is_none();
    }
    *response.status_mut() = answered_status(&method, response.status());
    let is_sse = response
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|value| value.as_bytes().starts_with(b"text/event-stream"));
    if !is_sse || !response.status().is_success() {
        return response;
    }
    let priming = priming_for(version);
    let rewriter = Rewriter {
        streams: state.streams.clone(),
        buffer: BytesMut::new(),
        priming,
        held: None,
        bind_session,
        stamp_priming: match (&session, fresh_get) {
            (Some(session), true) if priming == Priming::Keep => Some(session.clone()),
            _ => None,
        },
        sse_retry: state.sse_retry,
        added_capabilities: state.added_capabilities.clone(),
        _open: session.filter(|_| version.is_some()).map(|session| {
            state
                .streams
                .open_stream(&session, fresh_get || resumes_standalone)
        }),
    };
    let (parts, body) = response.into_parts();
    // rmcp's SSE body yields each event as a frame of its own, which goes out as an HTTP chunk
    // of its own, which the client reads as a frame of its own, waking its task for each:
    // two futex calls an event on either side during a replay. The frames ready at once (a
    // replay has hundreds) go out as one chunk.
    let frames = body.into_data_stream().ready_chunks(READY_FRAMES);
    let stream = futures::stream::unfold(
        (frames, rewriter),
        |(mut frames, mut rewriter)| async move {
            loop {
                let chunk = match joined(frames.next().await?) {
                    Ok(chunk) => chunk,
                    Err(e) => return Some((Err(e), (frames, rewriter))),
                };
                let out = match rewriter.passes_through() {
                    true => rewriter.pass(chunk),
                    false => rewriter.feed(&chunk).await,
                };
                if !out.is_empty() {
                    // What the frames say was stored before rmcp sent them, but perhaps only
                    // queued (see `StreamStore::store_event`): they go out once it is durable.
                    rewriter.streams.durable().await;
                    return Some((Ok::<Bytes, axum::Error>(out), (frames, rewriter)));
                }
            }
        },
    );
    // Returned at once, the headers would go out in a write of their own while the priming
    // event waits for its stream's record to be durable, and the client would read and wake
    // for each: under load, a third of a `start_*` call's socket writes. A POST's stream on a
    // session that keeps priming events begins with one that rmcp sends as it opens the stream,
    // so the headers wait for it and go out in the same write, as they do from a server that
    // stores nothing.
    let body = match method == Method::POST && priming == Priming::Keep {
        true => with_first_frame(stream, FIRST_FRAME_WAIT).await,
        false => Body::from_stream(stream),
    };
    Response::from_parts(parts, body)
}

/// `frames` as a body whose first frame is there before the body is: awaited for at most
/// `wait`, after which the body is returned without it, as it would have been.
async fn with_first_frame<S>(frames: S, wait: Duration) -> Body
where
    S: futures::Stream<Item = Result<Bytes, axum::Error>> + Send + 'static,
{
    // Fused: the first frame may be the end, and the body polls on after it all the same.
    let mut frames = Box::pin(frames.fuse());
    match tokio::time::timeout(wait, frames.next()).await {
        Ok(first) => Body::from_stream(futures::stream::iter(first).chain(frames)),
        Err(_) => Body::from_stream(frames),
    }
}

/// How long a POST's answer holds its headers back for its stream's priming event.
const FIRST_FRAME_WAIT: Duration = Duration::from_secs(1);

/// Most frames of an SSE body sent as one chunk.
const READY_FRAMES: usize = 64;

/// Frames of an SSE body as one chunk. rmcp's SSE bodies cannot fail; were one to, its error
/// would end the response.
fn joined(frames: Vec<Result<Bytes, axum::Error>>) -> Result<Bytes, axum::Error> {
    if frames.len() == 1 {
        return frames.into_iter().next().expect("one frame");
    }
    let mut chunk = BytesMut::new();
    for frame in frames {
        chunk.extend_from_slice(&frame?);
    }
    Ok(chunk.freeze())
}

/// The verdict on the resumption after `last_event_id`, from what the store holds of its
/// stream, and whether that stream is a standalone one.
async fn check_resume(
    streams: &StreamStore,
    caller: Caller<'_>,
    last_event_id: &str,
) -> Result<(Resume, bool), StoreError> {
    let id = last_event_id.parse::<EventId>();
    let stream = match (caller, &id) {
        (Caller::Known(_), Ok(id)) => stored_stream(streams, id).await?,
        _ => None,
    };
    let verdict = resume_verdict(caller, id.as_ref(), stream.as_ref());
    if let (Resume::Refuse(StatusCode::FORBIDDEN, _), Caller::Known(session)) = (&verdict, caller) {
        tracing::warn!(session, "Last-Event-ID of another session refused");
    }
    Ok((verdict, stream.is_some_and(|stream| stream.standalone)))
}

async fn stored_stream(
    streams: &StreamStore,
    id: &EventId,
) -> Result<Option<StoredStream>, StoreError> {
    let Some(info) = streams.stream_info(&id.token).await? else {
        return Ok(None);
    };
    // A request stream's first event, its priming one, may never have been stored (see
    // `StreamRepo::queue_event`): what follows it counts. Events expire oldest first, so
    // that is all kept while the event after it is, or while there is none yet.
    let event_kept = if id.seq == 1 && !info.standalone {
        info.next_seq == 2 || streams.event_exists(&id.token, 2).await?
    } else {
        streams.event_exists(&id.token, id.seq).await?
    };
    Ok(Some(StoredStream {
        owner: info.session_id,
        standalone: info.standalone,
        next_seq: info.next_seq,
        event_kept,
        // Asked only of an unfinished stream: a finished one replays to its end.
        abandoned: !info.finished && streams.abandoned(&id.token).await?,
    }))
}

/// The session a resuming request names.
#[derive(Debug, Clone, Copy)]
enum Caller<'a> {
    /// No `Mcp-Session-Id` header.
    Anonymous,
    /// A session this server does not know (never initialized here, or expired).
    Unknown,
    Known(&'a str),
}

/// What the store holds of the stream a `Last-Event-ID` names.
#[derive(Debug)]
struct StoredStream {
    /// The session that received the stream; `None` until that is known.
    owner: Option<String>,
    /// It is the session's standalone stream.
    standalone: bool,
    /// The seq the stream's next event will get.
    next_seq: u64,
    /// Whether the event the id names is still stored (events expire); for a request stream's
    /// priming event, which may never have been, whether all that followed it is.
    event_kept: bool,
    /// The stream waits for an answer no process will send: its handler died with its process
    /// before the answer was stored, and no relay finishes it.
    abandoned: bool,
}

#[derive(Debug, PartialEq)]
enum Resume {
    /// rmcp serves the request.
    Pass,
    /// Answered here, with a JSON-RPC error saying what to do.
    Refuse(StatusCode, String),
}

/// What a `GET` with `Last-Event-ID` gets, given the caller's session, the parsed id and what
/// the store holds of its stream (`None`: no such stream).
fn resume_verdict(
    caller: Caller<'_>,
    id: Result<&EventId, &MalformedEventId>,
    stream: Option<&StoredStream>,
) -> Resume {
    let session = match caller {
        Caller::Anonymous => {
            return Resume::Refuse(
                StatusCode::BAD_REQUEST,
                "resuming a stream needs the Mcp-Session-Id header of the session it belongs to"
                    .into(),
            );
        }
        // As rmcp answers an unknown session: the client initializes again. (rmcp would replay
        // the stream of a request that names a 2026-07-28 protocol, session or not.)
        Caller::Unknown => {
            return Resume::Refuse(
                StatusCode::NOT_FOUND,
                "session not found; initialize a new session".into(),
            );
        }
        Caller::Known(session) => session,
    };
    let id = match id {
        Ok(id) => id,
        Err(e) => {
            return Resume::Refuse(
                StatusCode::BAD_REQUEST,
                format!("{e}. Reconnect without Last-Event-ID and re-read the state you need."),
            );
        }
    };
    let unknown = || {
        Resume::Refuse(
            StatusCode::BAD_REQUEST,
            format!(
                "Last-Event-ID {id} was never sent on this session's streams. Reconnect without \
                 Last-Event-ID and re-read the state you need."
            ),
        )
    };
    let Some(stream) = stream else {
        return unknown();
    };
    match stream.owner.as_deref() {
        Some(owner) if owner == session => {}
        Some(_) => {
            return Resume::Refuse(
                StatusCode::FORBIDDEN,
                format!(
                    "Last-Event-ID {id} belongs to another session's stream. Resume only with ids \
                     this session received, or reconnect without Last-Event-ID."
                ),
            );
        }
        None => return unknown(),
    }
    if id.seq >= stream.next_seq {
        return unknown();
    }
    if !stream.event_kept {
        return Resume::Refuse(
            StatusCode::GONE,
            format!(
                "the events after Last-Event-ID {id} have expired. Reconnect without Last-Event-ID \
                 and re-read task://list (or the resources you follow) to catch up."
            ),
        );
    }
    // A resumed stream that waits for ever makes a client wait for ever, or reconnect for ever.
    if stream.abandoned {
        return Resume::Refuse(
            StatusCode::GONE,
            format!(
                "the request whose stream Last-Event-ID {id} is on was cut off by a server \
                 restart before its answer was stored, and nothing will answer it now: send the \
                 request again (resumable_data_processing, called with the same arguments, \
                 attaches to its task)"
            ),
        );
    }
    Resume::Pass
}

/// The status the client gets for rmcp's `status`: rmcp answers a session DELETE with 202, but
/// the session is gone at once, and clients (the Python SDK among them) expect a plain success.
fn answered_status(method: &Method, status: StatusCode) -> StatusCode {
    if method == Method::DELETE && status == StatusCode::ACCEPTED {
        StatusCode::NO_CONTENT
    } else {
        status
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Priming {
    Keep,
    Drop,
    /// Hold the first priming event until the initialize result shows the version.
    Decide,
}

/// What becomes of the priming events of a session on `version` (`None`: no session yet, so
/// the stream carries the initialize answer, whose result names the version).
fn priming_for(version: Option<&str>) -> Priming {
    match version {
        Some(version) if wants_priming(version) => Priming::Keep,
        Some(_) => Priming::Drop,
        None => Priming::Decide,
    }
}

/// What an initialize answer decides.
#[derive(Debug, PartialEq)]
struct InitializeAnswer {
    /// The negotiated version gets priming events: the held one goes out before the answer.
    priming: bool,
    /// The answer with the added capabilities, when it gets them (2025-11-25 or later).
    rewritten: Option<String>,
}

/// Reads the initialize answer `data`: its version decides priming, and on 2025-11-25 or later
/// its capabilities get `added` (those rmcp does not model).
fn initialize_answer(data: &str, added: &Map<String, Value>) -> InitializeAnswer {
    let Ok(mut answer) = serde_json::from_str::<Value>(data) else {
        return InitializeAnswer {
            priming: false,
            rewritten: None,
        };
    };
    let priming = answer
        .pointer("/result/protocolVersion")
        .and_then(Value::as_str)
        .map(negotiated)
        .is_some_and(wants_priming);
    let mut rewritten = None;
    if priming
        && !added.is_empty()
        && let Some(capabilities) = answer
            .pointer_mut("/result/capabilities")
            .and_then(Value::as_object_mut)
    {
        capabilities.extend(added.clone());
        rewritten = Some(answer.to_string());
    }
    InitializeAnswer { priming, rewritten }
}

/// Takes the first complete SSE event (through its blank line) off `buffer`.
fn take_event(buffer: &mut BytesMut) -> Option<Bytes> {
    let end = buffer.windows(2).position(|w| w == b"\n\n")?;
    Some(buffer.split_to(end + 2).freeze())
}

/// Rewrites an SSE body event by event (a chunk may hold several events or part of one).
struct Rewriter {
    streams: StreamStore,
    buffer: BytesMut,
    priming: Priming,
    held: Option<Bytes>,
    /// Record the first event id's stream as this session's, answering the call with this id.
    bind_session: Option<(String, CallId)>,
    /// Give the standalone stream's first priming event a stored id on this session's stream.
    stamp_priming: Option<String>,
    sse_retry: Duration,
    added_capabilities: std::sync::Arc<Map<String, Value>>,
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
    /// Whether no event can need a change any more: on a session that keeps priming events,
    /// once the stream's session is recorded and the standalone stream's priming event stamped
    /// (at once on a resumed stream). Chunks then pass as they are: parsing every event of a
    /// replay was a sixth of its instructions.
    fn passes_through(&self) -> bool {
        self.priming == Priming::Keep && self.bind_session.is_none() && self.stamp_priming.is_none()
    }

    /// `chunk` after whatever is buffered, unparsed.
    fn pass(&mut self, chunk: Bytes) -> Bytes {
        if self.buffer.is_empty() {
            return chunk;
        }
        self.buffer.extend_from_slice(&chunk);
        self.buffer.split().freeze()
    }

    async fn feed(&mut self, chunk: &[u8]) -> Bytes {
        self.buffer.extend_from_slice(chunk);
        let mut out = BytesMut::new();
        while let Some(event) = take_event(&mut self.buffer) {
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
        if let (Some((session, call_id)), Some(id)) =
            (self.bind_session.take(), parsed.id.as_deref())
            && let Ok(id) = id.parse::<EventId>()
            && let Err(e) = self
                .streams
                .bind_stream_session(&id.token, &session, &call_id)
                .await
        {
            tracing::error!(error = %e, "cannot record the session of a stream");
        }
        let is_priming = parsed.data.trim().is_empty();
        if !is_priming {
            if self.priming != Priming::Decide {
                return Some(event);
            }
            let answer = initialize_answer(&parsed.data, &self.added_capabilities);
            let event = match answer.rewritten {
                Some(data) => with_data(&text, &data),
                None => event,
            };
            return Some(match self.held.take() {
                Some(held) if answer.priming => [held, event].concat().into(),
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
                opens: true,
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

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    const TOKEN: &str = "0123456789abcdef0123456789abcdef";

    /// The frames of `body`, in order, until it ends.
    async fn frames_of(body: Body) -> Vec<Bytes> {
        let frames = body.into_data_stream().map(|frame| frame.expect("a frame"));
        tokio::time::timeout(Duration::from_secs(5), frames.collect())
            .await
            .expect("the body ends")
    }

    /// An SSE body as rmcp's frames come through the rewriter: an `unfold`, which panics when
    /// polled again after it ended.
    fn frames(list: &[&'static str]) -> impl futures::Stream<Item = Result<Bytes, axum::Error>> {
        let frames: Vec<Bytes> = list.iter().map(|frame| Bytes::from(*frame)).collect();
        futures::stream::unfold(frames.into_iter(), |mut frames| async move {
            let next = frames.next()?;
            Some((Ok(next), frames))
        })
    }

    #[tokio::test]
    async fn a_body_with_its_first_frame_keeps_every_frame_in_order() {
        let body = with_first_frame(frames(&["a", "b", "c"]), Duration::from_secs(5)).await;
        assert_eq!(frames_of(body).await, ["a", "b", "c"]);
    }

    /// A body that ends before any frame is an empty body, not a stream polled after its end.
    #[tokio::test]
    async fn a_body_that_ends_at_once_is_empty() {
        let body = with_first_frame(frames(&[]), Duration::from_secs(5)).await;
        assert!(frames_of(body).await.is_empty());
    }

    /// A first frame that does not come in time is not waited for beyond the wait, and is
    /// not lost: the body sends it when it comes.
    #[tokio::test]
    async fn a_first_frame_that_does_not_come_in_time_follows_the_headers() {
        let (send, frame) = tokio::sync::oneshot::channel::<&'static str>();
        let late =
            futures::stream::once(async move { Ok(Bytes::from(frame.await.expect("the frame"))) });
        let body = tokio::time::timeout(
            Duration::from_secs(5),
            with_first_frame(late, Duration::from_millis(10)),
        )
        .await
        .expect("the body before its first frame");
        send.send("late").unwrap();
        assert_eq!(frames_of(body).await, ["late"]);
    }

    fn stream(owner: Option<&str>, next_seq: u64, event_kept: bool) -> StoredStream {
        StoredStream {
            owner: owner.map(str::to_owned),
            standalone: false,
            next_seq,
            event_kept,
            abandoned: false,
        }
    }

    fn status_of(verdict: &Resume) -> Option<StatusCode> {
        match verdict {
            Resume::Pass => None,
            Resume::Refuse(status, _) => Some(*status),
        }
    }

    #[test]
    fn resume_verdicts() {
        let id: EventId = format!("{TOKEN}.3").parse().unwrap();
        let malformed = "3".parse::<EventId>().unwrap_err();
        let mine = Caller::Known("s1");
        let cases = [
            (
                "no session header",
                Caller::Anonymous,
                Ok(&id),
                None,
                Some(StatusCode::BAD_REQUEST),
            ),
            (
                "unknown session: 404, as rmcp answers it",
                Caller::Unknown,
                Ok(&id),
                None,
                Some(StatusCode::NOT_FOUND),
            ),
            (
                "malformed id",
                mine,
                Err(&malformed),
                None,
                Some(StatusCode::BAD_REQUEST),
            ),
            (
                "no such stream",
                mine,
                Ok(&id),
                None,
                Some(StatusCode::BAD_REQUEST),
            ),
            (
                "another session's stream",
                mine,
                Ok(&id),
                Some(stream(Some("s2"), 9, true)),
                Some(StatusCode::FORBIDDEN),
            ),
            (
                "stream of no known session",
                mine,
                Ok(&id),
                Some(stream(None, 9, true)),
                Some(StatusCode::BAD_REQUEST),
            ),
            (
                "id never sent",
                mine,
                Ok(&id),
                Some(stream(Some("s1"), 3, false)),
                Some(StatusCode::BAD_REQUEST),
            ),
            (
                "expired events",
                mine,
                Ok(&id),
                Some(stream(Some("s1"), 9, false)),
                Some(StatusCode::GONE),
            ),
            (
                "the last id sent",
                mine,
                Ok(&id),
                Some(stream(Some("s1"), 4, true)),
                None,
            ),
            (
                "an earlier id",
                mine,
                Ok(&id),
                Some(stream(Some("s1"), 9, true)),
                None,
            ),
            (
                "a stream nothing will answer",
                mine,
                Ok(&id),
                Some(StoredStream {
                    abandoned: true,
                    ..stream(Some("s1"), 9, true)
                }),
                Some(StatusCode::GONE),
            ),
        ];
        for (case, caller, id, stream, expected) in cases {
            let verdict = resume_verdict(caller, id, stream.as_ref());
            assert_eq!(status_of(&verdict), expected, "{case}: {verdict:?}");
        }
    }

    #[test]
    fn refusals_say_what_to_do() {
        let id: EventId = format!("{TOKEN}.3").parse().unwrap();
        let Resume::Refuse(_, gone) = resume_verdict(
            Caller::Known("s1"),
            Ok(&id),
            Some(&stream(Some("s1"), 9, false)),
        ) else {
            panic!("expired events passed");
        };
        assert!(
            gone.contains(&id.to_string()) && gone.contains("task://list"),
            "{gone}"
        );
        let malformed = "x.1".parse::<EventId>().unwrap_err();
        let Resume::Refuse(_, bad) = resume_verdict(Caller::Known("s1"), Err(&malformed), None)
        else {
            panic!("a malformed id passed");
        };
        assert!(bad.contains("Reconnect without Last-Event-ID"), "{bad}");
        let abandoned = StoredStream {
            abandoned: true,
            ..stream(Some("s1"), 9, true)
        };
        let Resume::Refuse(_, lost) =
            resume_verdict(Caller::Known("s1"), Ok(&id), Some(&abandoned))
        else {
            panic!("an abandoned stream passed");
        };
        assert!(lost.contains("send the request again"), "{lost}");
    }

    #[test]
    fn only_a_session_delete_answered_202_becomes_204() {
        let cases = [
            (Method::DELETE, StatusCode::ACCEPTED, StatusCode::NO_CONTENT),
            (Method::DELETE, StatusCode::NOT_FOUND, StatusCode::NOT_FOUND),
            (Method::POST, StatusCode::ACCEPTED, StatusCode::ACCEPTED),
            (Method::GET, StatusCode::OK, StatusCode::OK),
        ];
        for (method, rmcp, expected) in cases {
            assert_eq!(answered_status(&method, rmcp), expected, "{method} {rmcp}");
        }
    }

    #[test]
    fn priming_follows_the_session_version() {
        assert_eq!(priming_for(Some("2025-11-25")), Priming::Keep);
        assert_eq!(priming_for(Some("2025-06-18")), Priming::Drop);
        assert_eq!(priming_for(Some("2025-03-26")), Priming::Drop);
        assert_eq!(priming_for(None), Priming::Decide);
    }

    fn added() -> Map<String, Value> {
        [("tasks".to_owned(), json!({"list": {}}))]
            .into_iter()
            .collect()
    }

    fn answer(version: &str) -> String {
        json!({"jsonrpc": "2.0", "id": 0, "result": {
            "protocolVersion": version,
            "capabilities": {"tools": {}},
            "serverInfo": {"name": "durable-mcp", "version": "0"},
        }})
        .to_string()
    }

    #[test]
    fn a_2025_11_25_initialize_answer_keeps_priming_and_gets_the_added_capabilities() {
        let decided = initialize_answer(&answer("2025-11-25"), &added());
        assert!(decided.priming);
        let rewritten: Value = serde_json::from_str(&decided.rewritten.unwrap()).unwrap();
        assert_eq!(
            rewritten["result"]["capabilities"],
            json!({"tools": {}, "tasks": {"list": {}}})
        );
        assert_eq!(rewritten["result"]["serverInfo"]["name"], "durable-mcp");
        assert_eq!(rewritten["id"], 0);
    }

    #[test]
    fn other_initialize_answers_are_left_alone() {
        let unchanged = |priming| InitializeAnswer {
            priming,
            rewritten: None,
        };
        let cases = [
            (
                "older version",
                answer("2025-06-18"),
                added(),
                unchanged(false),
            ),
            (
                "nothing to add",
                answer("2025-11-25"),
                Map::new(),
                unchanged(true),
            ),
            (
                "an error",
                json!({"jsonrpc": "2.0", "id": 0, "error": {"code": -32602, "message": "no"}})
                    .to_string(),
                added(),
                unchanged(false),
            ),
            (
                "no capabilities",
                json!({"jsonrpc": "2.0", "id": 0, "result": {"protocolVersion": "2025-11-25"}})
                    .to_string(),
                added(),
                unchanged(true),
            ),
            ("not JSON", "{".to_owned(), added(), unchanged(false)),
            ("not an object", "[1]".to_owned(), added(), unchanged(false)),
        ];
        for (case, data, added, expected) in cases {
            assert_eq!(initialize_answer(&data, &added), expected, "{case}");
        }
    }

    #[test]
    fn events_are_taken_whole_across_chunks() {
        let mut buffer = BytesMut::from("id: a.1\ndata: {\"x\"");
        assert_eq!(take_event(&mut buffer), None);
        buffer.extend_from_slice(b":1}\n\n: keep-alive\n\nid: a.2\n");
        assert_eq!(
            take_event(&mut buffer).as_deref(),
            Some(&b"id: a.1\ndata: {\"x\":1}\n\n"[..])
        );
        assert_eq!(
            take_event(&mut buffer).as_deref(),
            Some(&b": keep-alive\n\n"[..])
        );
        assert_eq!(take_event(&mut buffer), None);
        assert_eq!(&buffer[..], b"id: a.2\n");
    }

    #[test]
    fn frames_ready_together_go_out_as_one_chunk() {
        let event = Bytes::from_static(b"data: 1\nid: a.1\n\n");
        assert_eq!(joined(vec![Ok(event.clone())]).unwrap(), event);
        let both = joined(vec![Ok(event), Ok(Bytes::from_static(b": keep-alive\n\n"))]).unwrap();
        assert_eq!(&both[..], b"data: 1\nid: a.1\n\n: keep-alive\n\n");
    }

    /// Once no event can need a change, chunks pass unparsed and in order, after whatever an
    /// earlier chunk left half-read.
    #[tokio::test]
    async fn once_the_session_is_recorded_chunks_pass_unparsed() {
        let dir = tempfile::tempdir().unwrap();
        let store = crate::store::Store::open(&dir.path().join("t.db")).unwrap();
        let mut rewriter = Rewriter {
            streams: StreamStore::new(
                store,
                "test-node",
                tokio_util::sync::CancellationToken::new(),
            ),
            buffer: BytesMut::new(),
            priming: Priming::Keep,
            held: None,
            bind_session: Some(("s1".into(), CallId::random())),
            stamp_priming: None,
            sse_retry: Duration::from_secs(3),
            added_capabilities: Default::default(),
            _open: None,
        };
        assert!(!rewriter.passes_through());
        let priming = format!("data: \nid: {TOKEN}.1\nretry: 3000\n\n");
        let out = rewriter
            .feed(format!("{priming}data: {{\"id\"").as_bytes())
            .await;
        assert_eq!(&out[..], priming.as_bytes());
        assert!(rewriter.passes_through());
        let rest = Bytes::from_static(b":1}\nid: a.2\n\n: keep-alive");
        assert_eq!(
            &rewriter.pass(rest.clone())[..],
            b"data: {\"id\":1}\nid: a.2\n\n: keep-alive"
        );
        assert_eq!(rewriter.pass(rest.clone()), rest);
    }

    /// Regression (found by the `http_headers` fuzz target): a `Last-Event-ID` that is not
    /// visible ASCII was taken for no header at all and passed on to rmcp, and one whose seq
    /// is above `i64::MAX` reached the store and got 500. Both are malformed ids: 400.
    #[tokio::test]
    async fn a_non_ascii_or_unstorable_last_event_id_is_a_400() {
        use axum::http::HeaderValue;
        use rmcp::transport::streamable_http_server::session::{SessionState, SessionStore};
        use tower::ServiceExt;

        let dir = tempfile::tempdir().unwrap();
        let store = crate::store::Store::open(&dir.path().join("t.db")).unwrap();
        let streams = StreamStore::new(
            store,
            "test-node",
            tokio_util::sync::CancellationToken::new(),
        );
        let initialize: rmcp::model::InitializeRequestParams = serde_json::from_value(json!({
            "protocolVersion": "2025-11-25", "capabilities": {},
            "clientInfo": {"name": "test", "version": "1"}}))
        .unwrap();
        streams
            .store("s1", &SessionState::new(initialize))
            .await
            .unwrap();
        let state = ResumeState {
            streams,
            max_streams: 8,
            sse_retry: Duration::from_secs(3),
            added_capabilities: Default::default(),
        };
        let app = axum::Router::new()
            .route("/mcp", axum::routing::get(|| async { "passed" }))
            .layer(axum::middleware::from_fn_with_state(state, resumable));
        for id in [
            HeaderValue::from_bytes(b"\xff\xfe.1").unwrap(),
            HeaderValue::from_bytes(format!("{TOKEN}.\u{e9}1").as_bytes()).unwrap(),
            HeaderValue::from_str(&format!("{TOKEN}.9223372036854775808")).unwrap(),
            HeaderValue::from_str(&format!("{TOKEN}.18446744073709551615")).unwrap(),
        ] {
            let request = Request::get("/mcp")
                .header(SESSION_HEADER, "s1")
                .header(LAST_EVENT_ID_HEADER, id.clone())
                .body(axum::body::Body::empty())
                .unwrap();
            let response =
                tokio::time::timeout(Duration::from_secs(10), app.clone().oneshot(request))
                    .await
                    .unwrap()
                    .unwrap();
            assert_eq!(response.status(), StatusCode::BAD_REQUEST, "{id:?}");
            let body = axum::body::to_bytes(response.into_body(), usize::MAX)
                .await
                .unwrap();
            let body: Value = serde_json::from_slice(&body).unwrap();
            let message = body["error"]["message"].as_str().unwrap();
            assert!(
                message.contains("is not an event id of this server"),
                "{message}"
            );
        }
    }

    #[test]
    fn with_data_replaces_only_the_data() {
        let event = with_data(
            "id: a.1\nretry: 500\ndata: old\ndata: more\n\n",
            "{\"new\":1}",
        );
        assert_eq!(&event[..], b"id: a.1\nretry: 500\ndata: {\"new\":1}\n\n");
    }
}
