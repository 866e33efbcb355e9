//! A session's reads, answered without a stream of their own.
//!
//! A read on a session (`ping`, `resources/read`, `prompts/get`, the fixed lists) changes
//! nothing and reports only what is already stored, so nothing in its answer needs storing
//! first. It goes to the service without an event store (the one 2026-07-28 requests use, see
//! `stateless`), which answers with one `application/json` body, as Streamable HTTP allows for
//! any request (a client must accept both). That skips rmcp's session worker and the store
//! writes of a stream (its row with its session, the response). The answer cannot be
//! resumed; a client that lost it asks again, which a read allows.
//!
//! A read needs nothing the session holds in memory, only who asks, which the handler takes
//! from the request's headers and token as it does on a session (`mcp::DurableServer::caller`),
//! so a dormant session is not woken for one. `stateless::mark` marks a read only on a session
//! the resume middleware found: a request naming an unknown or ended session goes to rmcp,
//! which answers 404.

use std::borrow::Cow;

use serde::Deserialize;
use serde::de::IgnoredAny;

/// The marker of a session's read, on the request for the choice of service, and on its answer
/// for the resume middleware (that answer did not restore the session in rmcp).
#[derive(Debug, Clone, Copy)]
pub struct SessionRead;

/// The methods answered apart. `tools/list` is not one: `task_requests` renames it for the
/// session's handler, whose answer depends on the negotiated shape of tasks.
const READS: [&str; 6] = [
    "ping",
    "resources/read",
    "resources/list",
    "resources/templates/list",
    "prompts/list",
    "prompts/get",
];

/// The two members of a JSON-RPC message that make it a read; the others are skipped unread.
#[derive(Deserialize)]
struct Envelope<'a> {
    #[serde(borrow)]
    method: Option<Cow<'a, str>>,
    id: Option<IgnoredAny>,
}

/// Whether `body` is one request (not a notification, not a batch) of a read method.
pub(super) fn is_read(body: &[u8]) -> bool {
    serde_json::from_slice::<Envelope>(body).is_ok_and(|message| {
        message.id.is_some()
            && message
                .method
                .is_some_and(|method| READS.contains(&method.as_ref()))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_single_requests_of_read_methods_are_reads() {
        let cases = [
            (r#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#, true),
            (
                r#"{"jsonrpc":"2.0","id":"a","method":"resources/read","params":{"uri":"task://status/x"}}"#,
                true,
            ),
            (
                r#"{"params":{"name":"report","arguments":{"task_id":"t"}},"method":"prompts/get","id":2,"jsonrpc":"2.0"}"#,
                true,
            ),
            (
                r#"{"jsonrpc":"2.0","id":1,"method":"resources/list"}"#,
                true,
            ),
            // Changes something, or is answered in the session's shape.
            (
                r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"add"}}"#,
                false,
            ),
            (r#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#, false),
            (
                r#"{"jsonrpc":"2.0","id":1,"method":"resources/subscribe"}"#,
                false,
            ),
            (
                r#"{"jsonrpc":"2.0","id":1,"method":"logging/setLevel"}"#,
                false,
            ),
            // A notification waits for no answer; a batch is split before `stateless::mark`.
            (r#"{"jsonrpc":"2.0","method":"ping"}"#, false),
            (r#"[{"jsonrpc":"2.0","id":1,"method":"ping"}]"#, false),
            (r#"{"jsonrpc":"2.0","id":1,"result":{}}"#, false),
            (r#"{"jsonrpc":"2.0","id":1,"method":"ping""#, false),
            (r#"not json"#, false),
        ];
        for (body, expected) in cases {
            assert_eq!(is_read(body.as_bytes()), expected, "{body}");
        }
    }
}
