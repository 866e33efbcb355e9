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
        RawSession::open_with(http_client(token), url, version, json!({})).await
    }

    /// [`RawSession::open`] over `http` (its default headers on every request), declaring
    /// `capabilities`.
    pub async fn open_with(
        http: reqwest::Client,
        url: &str,
        version: &str,
        capabilities: Value,
    ) -> RawSession {
        let response = within(
            IO_TIMEOUT,
            "initialize",
            http.post(url)
                .header("Accept", "application/json, text/event-stream")
                .json(
                    &json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
                    "protocolVersion": version, "capabilities": capabilities,
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
        Ok(answer_of(response, id).await)
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
        answer_of(response, id).await
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

/// A client of the stateless protocol 2026-07-28 driven by hand: no session; each request
/// carries the version and the client's capabilities in `_meta`, and the `Mcp-Method` and
/// `Mcp-Name` headers the revision asks for.
pub struct Stateless {
    pub http: reqwest::Client,
    pub url: String,
    /// Sent as `X-Client-Id` when set.
    pub client_id: Option<String>,
    /// The `io.modelcontextprotocol/clientCapabilities` of each request.
    pub capabilities: Value,
}

/// The stateless revision.
pub const STATELESS_VERSION: &str = "2026-07-28";

impl Stateless {
    pub fn new(url: &str, client_id: Option<&str>) -> Stateless {
        Stateless {
            http: http_client(None),
            url: url.to_owned(),
            client_id: client_id.map(str::to_owned),
            capabilities: json!({}),
        }
    }

    /// The same client declaring the tasks extension (SEP-2663).
    pub fn with_tasks(mut self) -> Stateless {
        self.capabilities = json!({"extensions": {"io.modelcontextprotocol/tasks": {}}});
        self
    }

    /// A request's body, its `_meta` filled in.
    pub fn body(&self, id: u64, method: &str, params: Value) -> Value {
        let mut params = match params {
            Value::Object(params) => params,
            _ => serde_json::Map::new(),
        };
        let meta = params
            .entry("_meta")
            .or_insert_with(|| json!({}))
            .as_object_mut()
            .expect("_meta is an object");
        meta.insert(
            "io.modelcontextprotocol/protocolVersion".into(),
            json!(STATELESS_VERSION),
        );
        meta.insert(
            "io.modelcontextprotocol/clientCapabilities".into(),
            self.capabilities.clone(),
        );
        meta.insert(
            "io.modelcontextprotocol/clientInfo".into(),
            json!({"name": "raw-stateless-test", "version": "1"}),
        );
        json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params})
    }

    /// The `Mcp-Name` a request must carry: the tool, prompt, resource or task it names.
    pub fn name_of(body: &Value) -> Option<String> {
        let params = &body["params"];
        let name = match body["method"].as_str()? {
            "tools/call" | "prompts/get" => &params["name"],
            "resources/read" => &params["uri"],
            method if method.starts_with("tasks/") => &params["taskId"],
            _ => return None,
        };
        name.as_str().map(str::to_owned)
    }

    /// POSTs `body` with the headers it should have, then `headers` over them.
    pub async fn post_with(&self, body: &Value, headers: &[(&str, &str)]) -> reqwest::Response {
        let mut request = self
            .http
            .post(&self.url)
            .header("Accept", "application/json, text/event-stream")
            .header("MCP-Protocol-Version", STATELESS_VERSION);
        if let Some(method) = body["method"].as_str() {
            request = request.header("Mcp-Method", method);
        }
        if let Some(name) = Self::name_of(body) {
            request = request.header("Mcp-Name", name);
        }
        if let Some(client_id) = &self.client_id {
            request = request.header("X-Client-Id", client_id);
        }
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        within(IO_TIMEOUT, "POST", request.json(body).send())
            .await
            .expect("POST")
    }

    /// The HTTP status and JSON-RPC answer of a request, read from a JSON body or from the SSE
    /// stream up to the answer.
    pub async fn send(&self, id: u64, method: &str, params: Value) -> (u16, Value) {
        let body = self.body(id, method, params);
        let response = self.post_with(&body, &[]).await;
        let status = response.status().as_u16();
        (status, answer_of(response, id).await)
    }

    /// A request that must answer with a result; returns it.
    pub async fn call(&self, id: u64, method: &str, params: Value) -> Value {
        let (status, answer) = self.send(id, method, params).await;
        assert_eq!(status, 200, "{method}: {answer}");
        answer
            .get("result")
            .cloned()
            .unwrap_or_else(|| panic!("{method} failed: {answer}"))
    }
}

/// The JSON-RPC message answering request `id`: the body itself when it is JSON, else the SSE
/// event carrying it.
pub async fn answer_of(response: reqwest::Response, id: u64) -> Value {
    let is_sse = response
        .headers()
        .get("content-type")
        .and_then(|value| value.to_str().ok())
        .is_some_and(|value| value.starts_with("text/event-stream"));
    if !is_sse {
        let text = within(IO_TIMEOUT, "a JSON answer", response.text())
            .await
            .expect("a body");
        return serde_json::from_str(&text).unwrap_or_else(|_| json!({"body": text}));
    }
    let mut sse = Sse::new(response);
    let events = sse
        .until(IO_TIMEOUT, |message| message.get("id") == Some(&json!(id)))
        .await;
    events.last().expect("an answer").json()
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
