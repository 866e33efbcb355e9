//! The answer to a request body over the limit of `/mcp`. tower-http's
//! `RequestBodyLimitLayer` enforces the limit in two ways: a `Content-Length` over it gets a
//! plain-text 413 at once, before any of the body is read; a body without a length fails to
//! read once it outgrows the limit, and the task-request adaptation, which reads every `POST`
//! body, answers a bare 413. [`too_large`] turns both into one JSON-RPC error naming the limit.
//!
//! The client may still be writing its body when the 413 is ready, and HTTP/1.1 clients such as
//! reqwest read the answer only once they have sent everything: a connection closed on unread
//! data is reset, and the client sees a broken pipe instead of the 413. So the rest of a refused
//! body is read and discarded first, within bounds.

use std::pin::Pin;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use axum::body::{Body, BodyDataStream, Bytes};
use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use futures::{Stream, StreamExt};
use tokio::sync::oneshot;

use crate::mcp::error::ApiError;

/// At most this much of a refused body is read and discarded, within [`DRAIN_TIME`]; a client
/// sending more gets its connection reset.
const DRAIN_BYTES: usize = 16 << 20;
const DRAIN_TIME: Duration = Duration::from_secs(5);

/// Middleware around the body limit (state: the limit in bytes): every 413 from inside becomes
/// a JSON-RPC error, sent once the refused body has been read.
pub(super) async fn too_large(
    State(limit): State<usize>,
    request: Request,
    next: Next,
) -> Response {
    let (parts, body) = request.into_parts();
    let (back, mut returned) = oneshot::channel();
    let lent = Body::from_stream(Lent {
        rest: Some(body.into_data_stream()),
        back: Some(back),
    });
    let response = next.run(Request::from_parts(parts, lent)).await;
    if response.status() != StatusCode::PAYLOAD_TOO_LARGE {
        return response;
    }
    if let Ok(rest) = returned.try_recv() {
        drain(rest).await;
    }
    ApiError::Http {
        status: StatusCode::PAYLOAD_TOO_LARGE,
        message: format!("request body exceeds {limit} bytes"),
    }
    .into_response()
}

/// Reads what the client still sends of a refused body, within bounds.
async fn drain(mut rest: BodyDataStream) {
    let read_to_end = tokio::time::timeout(DRAIN_TIME, async {
        let mut read = 0;
        while let Some(Ok(chunk)) = rest.next().await {
            read += chunk.len();
            if read > DRAIN_BYTES {
                return false;
            }
        }
        true
    })
    .await;
    if read_to_end != Ok(true) {
        tracing::debug!("a refused request body was not read to its end; its connection resets");
    }
}

/// A request body lent to the layers inside: dropped before its end, it hands the rest back.
struct Lent {
    rest: Option<BodyDataStream>,
    back: Option<oneshot::Sender<BodyDataStream>>,
}

impl Stream for Lent {
    type Item = Result<Bytes, axum::Error>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let Some(rest) = self.rest.as_mut() else {
            return Poll::Ready(None);
        };
        let next = ready!(rest.poll_next_unpin(cx));
        if next.is_none() {
            self.rest = None;
        }
        Poll::Ready(next)
    }
}

impl Drop for Lent {
    fn drop(&mut self) {
        if let (Some(rest), Some(back)) = (self.rest.take(), self.back.take()) {
            // Nobody takes it back unless the answer is a 413.
            let _ = back.send(rest);
        }
    }
}
