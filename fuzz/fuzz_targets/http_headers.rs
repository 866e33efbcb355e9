//! Arbitrary headers (`Mcp-Session-Id`, `Last-Event-ID`, `MCP-Protocol-Version`, `Accept`,
//! `Content-Type`, `Origin`, `Host`, ... with arbitrary bytes, a real session id or a real
//! stream's event id) on GET, POST and DELETE to `/mcp` of the real router: every answer is a
//! 4xx or a success, never a 5xx, and a `Last-Event-ID` that is not an event id of this server
//! is refused with 400 whatever its bytes.
#![no_main]

use axum::body::Body;
use axum::http::{HeaderName, HeaderValue, Method, Request, StatusCode};
use durable_mcp_fuzz::{ACCEPT, PROTOCOL, server};
use durable_shared::EventId;
use libfuzzer_sys::arbitrary::{self, Arbitrary};
use libfuzzer_sys::fuzz_target;

#[derive(Debug, Arbitrary)]
struct Input {
    method: Verb,
    headers: Vec<(Header, Text)>,
    body: Payload,
    /// Without it the request names no Host unless a header gives one.
    default_host: bool,
}

#[derive(Debug, Arbitrary)]
enum Verb {
    Get,
    Post,
    Delete,
}

#[derive(Debug, Arbitrary)]
enum Header {
    SessionId,
    LastEventId,
    ProtocolVersion,
    Accept,
    ContentType,
    Origin,
    Host,
    ClientId,
    Authorization,
    McpMethod,
    McpName,
    Other(String),
}

#[derive(Debug, Arbitrary)]
enum Text {
    Bytes(Vec<u8>),
    /// The harness's live session.
    Session,
    /// The harness's stream token with this text as the seq (`{token}.{seq}`).
    EventIdWithSeq(String),
    /// The harness's stream token with this number as the seq.
    EventIdWithNumber(u64),
    Protocol(u8),
    AcceptBoth,
}

#[derive(Debug, Arbitrary)]
enum Payload {
    Empty,
    Ping,
    Initialize,
    Initialized,
    ToolsList,
    Text(String),
}

const PROTOCOLS: [&str; 5] = [
    "2025-11-25",
    "2025-06-18",
    "2025-03-26",
    "2024-11-05",
    "2026-07-28",
];

fn name(name: &Header) -> Option<HeaderName> {
    Some(match name {
        Header::SessionId => HeaderName::from_static("mcp-session-id"),
        Header::LastEventId => HeaderName::from_static("last-event-id"),
        Header::ProtocolVersion => HeaderName::from_static("mcp-protocol-version"),
        Header::Accept => HeaderName::from_static("accept"),
        Header::ContentType => HeaderName::from_static("content-type"),
        Header::Origin => HeaderName::from_static("origin"),
        Header::Host => HeaderName::from_static("host"),
        Header::ClientId => HeaderName::from_static(durable_shared::CLIENT_ID_HEADER),
        Header::Authorization => HeaderName::from_static("authorization"),
        Header::McpMethod => HeaderName::from_static("mcp-method"),
        Header::McpName => HeaderName::from_static("mcp-name"),
        Header::Other(name) => HeaderName::from_bytes(name.as_bytes()).ok()?,
    })
}

fn value(text: &Text) -> Option<HeaderValue> {
    let server = server();
    let token = &server.event_id.token;
    match text {
        Text::Bytes(bytes) => HeaderValue::from_bytes(bytes).ok(),
        Text::Session => HeaderValue::from_str(&server.session).ok(),
        Text::EventIdWithSeq(seq) => {
            HeaderValue::from_bytes(format!("{token}.{seq}").as_bytes()).ok()
        }
        Text::EventIdWithNumber(seq) => HeaderValue::from_str(&format!("{token}.{seq}")).ok(),
        Text::Protocol(i) => Some(HeaderValue::from_static(
            PROTOCOLS[*i as usize % PROTOCOLS.len()],
        )),
        Text::AcceptBoth => Some(HeaderValue::from_static(ACCEPT)),
    }
}

fn body(payload: &Payload) -> String {
    let request = |method: &str| format!(r#"{{"jsonrpc":"2.0","id":7,"method":"{method}"}}"#);
    match payload {
        Payload::Empty => String::new(),
        Payload::Ping => request("ping"),
        Payload::Initialize => format!(
            r#"{{"jsonrpc":"2.0","id":1,"method":"initialize","params":{{"protocolVersion":"{PROTOCOL}","capabilities":{{}},"clientInfo":{{"name":"fuzz","version":"1"}}}}}}"#
        ),
        Payload::Initialized => r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#.into(),
        Payload::ToolsList => request("tools/list"),
        Payload::Text(text) => text.clone(),
    }
}

fuzz_target!(|input: Input| {
    let server = server();
    let method = match input.method {
        Verb::Get => Method::GET,
        Verb::Post => Method::POST,
        Verb::Delete => Method::DELETE,
    };
    let mut request = Request::builder().method(method.clone()).uri("/mcp");
    if input.default_host {
        request = request.header("host", "127.0.0.1");
    }
    let mut last_event_ids = Vec::new();
    for (header, text) in &input.headers {
        let (Some(header), Some(value)) = (name(header), value(text)) else {
            continue;
        };
        // Deleting the harness's session would leave every later input without one.
        if method == Method::DELETE && header == "mcp-session-id" && value == server.session {
            continue;
        }
        if header == "last-event-id" {
            last_event_ids.push(value.clone());
        }
        request = request.header(header, value);
    }
    let request = request
        .body(Body::from(body(&input.body)))
        .expect("a valid request");
    let answer = server.send(request, method != Method::GET);
    assert!(
        !answer.status.is_server_error(),
        "{input:?} got {}: {:?}",
        answer.status,
        answer.body
    );
    server.forget_new_session(&answer);

    // Each Last-Event-ID alone, on an otherwise valid resumption of the live session: one that
    // is not an id of this server is a 400, whatever its bytes.
    for id in last_event_ids {
        let request = Request::get("/mcp")
            .header("host", "127.0.0.1")
            .header("accept", "text/event-stream")
            .header("mcp-session-id", &server.session)
            .header("mcp-protocol-version", PROTOCOL)
            .header("last-event-id", id.clone())
            .body(Body::empty())
            .expect("a valid request");
        let answer = server.send(request, false);
        assert!(
            !answer.status.is_server_error(),
            "Last-Event-ID {id:?} got {}",
            answer.status
        );
        let parses = id
            .to_str()
            .is_ok_and(|text| text.parse::<EventId>().is_ok());
        if !parses {
            assert_eq!(
                answer.status,
                StatusCode::BAD_REQUEST,
                "Last-Event-ID {id:?} is no event id"
            );
        }
    }
});
