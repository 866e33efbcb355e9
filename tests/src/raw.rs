//! A raw Streamable HTTP client: plain POST/GET/DELETE with reqwest and an incremental SSE
//! reader, for tests of the wire rules that SDK clients hide (event ids, `Last-Event-ID`,
//! status codes, priming).

use std::time::Duration;

use futures::StreamExt;
use futures::stream::BoxStream;
use serde_json::{Value, json};

use durable_shared::sse::take_event;

use crate::{IO_TIMEOUT, within};

pub use durable_shared::sse::SseEvent as Event;

/// What the tests read from an event.
pub trait EventExt {
    /// The event's data as JSON.
    fn json(&self) -> Value;
    /// `(token, seq)` of its id.
    fn seq(&self) -> (String, u64);
}

impl EventExt for Event {
    fn json(&self) -> Value {
        serde_json::from_str(&self.data)
            .unwrap_or_else(|e| panic!("event data {:?}: {e}", self.data))
    }

    fn seq(&self) -> (String, u64) {
        let id = self.event_id().expect("an event id token.seq");
        (id.token, id.seq)
    }
}

/// Reads SSE events from a response body as they arrive.
pub struct Sse {
    body: BoxStream<'static, reqwest::Result<bytes::Bytes>>,
    buffer: Vec<u8>,
}

impl Sse {
    pub fn new(response: reqwest::Response) -> Sse {
        Sse {
            body: response.bytes_stream().boxed(),
            buffer: Vec::new(),
        }
    }

    /// The next event that is not a comment, or `None` when the server ends the stream. A
    /// connection cut mid-stream fails the test: only [`Sse::next_or_cut`] accepts one.
    pub async fn next(&mut self, limit: Duration) -> Option<Event> {
        match self.read(limit).await {
            Ok(event) => event,
            Err(cut) => panic!("the stream was cut, not ended by the server: {cut}"),
        }
    }

    /// The next event, or `None` when the stream ends, cleanly or not (a killed server).
    pub async fn next_or_cut(&mut self, limit: Duration) -> Option<Event> {
        self.read(limit).await.ok().flatten()
    }

    /// The next event, `Ok(None)` at a clean end, the transport error at a cut.
    async fn read(&mut self, limit: Duration) -> Result<Option<Event>, reqwest::Error> {
        within(limit, "an SSE event", async {
            loop {
                if let Some(raw) = take_event(&mut self.buffer) {
                    match Event::parse(&String::from_utf8_lossy(&raw)) {
                        Some(event) => return Ok(Some(event)),
                        None => continue,
                    }
                }
                match self.body.next().await {
                    Some(Ok(chunk)) => self.buffer.extend_from_slice(&chunk),
                    Some(Err(cut)) => return Err(cut),
                    None => return Ok(None),
                }
            }
        })
        .await
    }

    /// The next event, or `None` if none arrives within `idle` (the stream may still be open).
    pub async fn next_or_idle(&mut self, idle: Duration) -> Option<Event> {
        tokio::time::timeout(idle, self.next(IO_TIMEOUT))
            .await
            .ok()
            .flatten()
    }

    /// Reads events until one carries a JSON-RPC message for which `done` holds; returns all
    /// events read, that one included.
    pub async fn until(&mut self, limit: Duration, done: impl Fn(&Value) -> bool) -> Vec<Event> {
        let mut events = Vec::new();
        loop {
            let event = self.next(limit).await.unwrap_or_else(|| {
                panic!("stream ended before the expected message; got {events:#?}")
            });
            let finished = !event.is_priming() && done(&event.json());
            events.push(event);
            if finished {
                return events;
            }
        }
    }
}

/// A session driven by hand.
pub struct RawSession {
    pub http: reqwest::Client,
    pub url: String,
    pub session_id: String,
    pub version: String,
    /// The result of the `initialize` request.
    pub initialized: Value,
}

impl RawSession {
    /// Initializes a session on `version` and sends `notifications/initialized`.
    pub async fn open(url: &str, version: &str) -> RawSession {
        RawSession::open_as(url, version, None).await
    }

    /// [`RawSession::open`], every request of the session carrying `Authorization: Bearer
    /// token` when one is given.
    pub async fn open_as(url: &str, version: &str, token: Option<&str>) -> RawSession {
        let http = http_client(token);
        let response = within(
            IO_TIMEOUT,
            "initialize",
            http.post(url)
                .header("Accept", "application/json, text/event-stream")
                .json(
                    &json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
                    "protocolVersion": version, "capabilities": {},
                    "clientInfo": {"name": "raw-test", "version": "1"}}}),
                )
                .send(),
        )
        .await
        .expect("initialize");
        assert_eq!(response.status(), 200);
        let session_id = response.headers()["mcp-session-id"]
            .to_str()
            .unwrap()
            .to_owned();
        let mut sse = Sse::new(response);
        let events = sse
            .until(IO_TIMEOUT, |message| message.get("result").is_some())
            .await;
        let session = RawSession {
            http,
            url: url.to_owned(),
            session_id,
            version: version.to_owned(),
            initialized: events.last().expect("initialize answer").json()["result"].clone(),
        };
        let accepted = session
            .post(json!({"jsonrpc": "2.0", "method": "notifications/initialized"}))
            .await;
        assert_eq!(accepted.status(), 202);
        session
    }

    /// The same session over new connections: pooled ones die with a killed server.
    pub fn reconnected(&self) -> RawSession {
        self.with_token(None)
    }

    /// The same session id sent by a client holding `token` (or none).
    pub fn with_token(&self, token: Option<&str>) -> RawSession {
        RawSession {
            http: http_client(token),
            url: self.url.clone(),
            session_id: self.session_id.clone(),
            version: self.version.clone(),
            initialized: self.initialized.clone(),
        }
    }

    pub fn request(&self, method: reqwest::Method) -> reqwest::RequestBuilder {
        self.http
            .request(method, &self.url)
            .header("Accept", "application/json, text/event-stream")
            .header("Mcp-Session-Id", &self.session_id)
            .header("MCP-Protocol-Version", &self.version)
    }

    pub async fn post(&self, body: Value) -> reqwest::Response {
        within(
            IO_TIMEOUT,
            "POST",
            self.request(reqwest::Method::POST).json(&body).send(),
        )
        .await
        .expect("POST")
    }

    /// The JSON-RPC answer to a request, or the HTTP status it was refused with.
    pub async fn try_answer(&self, id: u64, method: &str, params: Value) -> Result<Value, u16> {
        let response = self
            .post(json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}))
            .await;
        if response.status() != 200 {
            return Err(response.status().as_u16());
        }
        let mut sse = Sse::new(response);
        let events = sse
            .until(IO_TIMEOUT, |message| message.get("id") == Some(&json!(id)))
            .await;
        Ok(events.last().expect("an answer").json())
    }

    /// A request that must answer with a result; returns it.
    pub async fn call(&self, id: u64, method: &str, params: Value) -> Value {
        let answer = self.answer(id, method, params).await;
        answer
            .get("result")
            .cloned()
            .unwrap_or_else(|| panic!("{method} failed: {answer}"))
    }

    /// A request that must answer with a JSON-RPC error; returns the error object.
    pub async fn call_error(&self, id: u64, method: &str, params: Value) -> Value {
        let answer = self.answer(id, method, params).await;
        answer
            .get("error")
            .cloned()
            .unwrap_or_else(|| panic!("{method} did not fail: {answer}"))
    }

    /// The JSON-RPC answer to a request.
    async fn answer(&self, id: u64, method: &str, params: Value) -> Value {
        let response = self
            .post(json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}))
            .await;
        assert_eq!(response.status(), 200, "{method}");
        let mut sse = Sse::new(response);
        let events = sse
            .until(IO_TIMEOUT, |message| message.get("id") == Some(&json!(id)))
            .await;
        events.last().expect("an answer").json()
    }

    /// Opens the standalone GET stream, optionally resuming after `last_event_id`.
    pub async fn get(&self, last_event_id: Option<&str>) -> reqwest::Response {
        let mut request = self.request(reqwest::Method::GET);
        if let Some(id) = last_event_id {
            request = request.header("Last-Event-ID", id);
        }
        within(IO_TIMEOUT, "GET", request.send())
            .await
            .expect("GET")
    }
}

/// A client for raw sessions, sending `token` as a bearer token with every request.
pub fn http_client(token: Option<&str>) -> reqwest::Client {
    let mut headers = reqwest::header::HeaderMap::new();
    if let Some(token) = token {
        headers.insert(
            reqwest::header::AUTHORIZATION,
            format!("Bearer {token}")
                .parse()
                .expect("token header value"),
        );
    }
    reqwest::Client::builder()
        .timeout(Duration::from_secs(120))
        .default_headers(headers)
        .build()
        .expect("http client")
}
