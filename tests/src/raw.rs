//! A raw Streamable HTTP client: plain POST/GET/DELETE with reqwest and an incremental SSE
//! reader, for tests of the wire rules that SDK clients hide (event ids, `Last-Event-ID`,
//! status codes, priming).

use std::time::Duration;

use futures::StreamExt;
use futures::stream::BoxStream;
use serde_json::{Value, json};

use crate::{IO_TIMEOUT, within};

/// One SSE event.
#[derive(Debug, Clone, PartialEq)]
pub struct Event {
    pub id: Option<String>,
    pub data: String,
    pub retry: Option<u64>,
}

impl Event {
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.data)
            .unwrap_or_else(|e| panic!("event data {:?}: {e}", self.data))
    }

    pub fn is_priming(&self) -> bool {
        self.data.is_empty()
    }

    /// `(token, seq)` of an id of this server.
    pub fn seq(&self) -> (String, u64) {
        let id = self.id.as_deref().expect("event id");
        let (token, seq) = id.split_once('.').expect("token.seq");
        (token.to_owned(), seq.parse().expect("seq"))
    }
}

/// Reads SSE events from a response body as they arrive.
pub struct Sse {
    body: BoxStream<'static, reqwest::Result<bytes::Bytes>>,
    buffer: String,
}

impl Sse {
    pub fn new(response: reqwest::Response) -> Sse {
        Sse {
            body: response.bytes_stream().boxed(),
            buffer: String::new(),
        }
    }

    /// The next event that is not a comment, or `None` when the stream ends.
    pub async fn next(&mut self, limit: Duration) -> Option<Event> {
        within(limit, "an SSE event", async {
            loop {
                if let Some(end) = self.buffer.find("\n\n") {
                    let raw: String = self.buffer.drain(..end + 2).collect();
                    let mut event = Event {
                        id: None,
                        data: String::new(),
                        retry: None,
                    };
                    let mut fields = 0;
                    for line in raw
                        .lines()
                        .filter(|line| !line.is_empty() && !line.starts_with(':'))
                    {
                        fields += 1;
                        let (name, value) = line.split_once(':').unwrap_or((line, ""));
                        let value = value.strip_prefix(' ').unwrap_or(value);
                        match name {
                            "id" => event.id = Some(value.to_owned()),
                            "data" => event.data.push_str(value),
                            "retry" => event.retry = value.parse().ok(),
                            _ => {}
                        }
                    }
                    if fields > 0 {
                        return Some(event);
                    }
                    continue;
                }
                match self.body.next().await {
                    Some(Ok(chunk)) => self.buffer.push_str(&String::from_utf8_lossy(&chunk)),
                    Some(Err(_)) | None => return None,
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
}

impl RawSession {
    /// Initializes a session on `version` and sends `notifications/initialized`.
    pub async fn open(url: &str, version: &str) -> RawSession {
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(120))
            .build()
            .expect("http client");
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
        sse.until(IO_TIMEOUT, |message| message.get("result").is_some())
            .await;
        let session = RawSession {
            http,
            url: url.to_owned(),
            session_id,
            version: version.to_owned(),
        };
        let accepted = session
            .post(json!({"jsonrpc": "2.0", "method": "notifications/initialized"}))
            .await;
        assert_eq!(accepted.status(), 202);
        session
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

    /// A request that must answer with a result; returns it.
    pub async fn call(&self, id: u64, method: &str, params: Value) -> Value {
        let response = self
            .post(json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}))
            .await;
        assert_eq!(response.status(), 200, "{method}");
        let mut sse = Sse::new(response);
        let events = sse
            .until(IO_TIMEOUT, |message| message.get("id") == Some(&json!(id)))
            .await;
        let last = events.last().unwrap().json();
        last.get("result")
            .cloned()
            .unwrap_or_else(|| panic!("{method} failed: {last}"))
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
