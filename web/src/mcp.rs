//! A small MCP client over gloo-net's `fetch`, written for the browser: rmcp's transports spawn
//! tokio tasks and need `Send`, and `EventSource` cannot send `Mcp-Session-Id` or
//! `Last-Event-ID`, so this one POSTs JSON-RPC with gloo-net and reads SSE from the response's
//! body stream (with the SSE parser of `durable-shared`, which the server's tests use too).
//!
//! It is resumable: the client id (shared by the tabs of a browser) lives in `localStorage`;
//! each tab's session id, negotiated protocol version and last event id of the standalone stream
//! live in the tab's `sessionStorage`, so a reload continues the same session and stream where
//! it stopped, and nothing of a closed tab stays behind.

use std::cell::{Cell, RefCell};

use durable_shared::sse::{SseEvent, take_event};
use gloo_net::http::{Request, RequestBuilder, Response};
use js_sys::Uint8Array;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use wasm_bindgen::closure::Closure;
use wasm_bindgen::{JsCast, JsValue};
use wasm_bindgen_futures::JsFuture;
use web_sys::{ReadableStreamDefaultReader, ReadableStreamReadResult};

const PROTOCOL_VERSION: &str = "2025-11-25";
const CLIENT_ID_KEY: &str = "durable-mcp/client-id";
/// The bearer token a signed-in user gave, for servers that require one (kept until sign-out).
const TOKEN_KEY: &str = "durable-mcp/token";
/// The tab's MCP session ([`SessionInfo`]), in the tab's own storage: every tab has its own
/// session and stream position, and they go when the tab closes.
const SESSION_KEY: &str = "durable-mcp/session";
/// In the tab's storage while a page of the tab is open (see [`tab_session`]).
const TAB_OPEN_KEY: &str = "durable-mcp/tab-open";
/// Where earlier versions kept each tab's session, in the browser-wide storage, never removed.
const LEGACY_TAB_PREFIX: &str = "durable-mcp/tab/";

/// Why a request failed.
#[derive(Debug, Clone, PartialEq)]
pub enum McpError {
    /// The server does not know the session (404): initialize again and re-read state.
    SessionLost,
    /// The stream position is no longer usable (400/403/410 on resume): re-read state.
    StaleEventId(String),
    /// A JSON-RPC error answer.
    Rpc(String),
    /// A tool error (`isError`), with the argument it is about when the server names one.
    Tool {
        message: String,
        field: Option<String>,
    },
    /// The server requires a bearer token (401), or refused the one given; the reason.
    Unauthorized(String),
    /// The network or the server is unreachable.
    Network(String),
}

impl std::fmt::Display for McpError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            McpError::SessionLost => f.write_str("session expired; reconnecting"),
            McpError::StaleEventId(why)
            | McpError::Rpc(why)
            | McpError::Network(why)
            | McpError::Unauthorized(why)
            | McpError::Tool { message: why, .. } => f.write_str(why),
        }
    }
}

fn net_error(error: gloo_net::Error) -> McpError {
    McpError::Network(error.to_string())
}

fn js_error(value: JsValue) -> McpError {
    McpError::Network(
        value
            .as_string()
            .or_else(|| js_sys::Error::from(value).message().as_string())
            .unwrap_or_else(|| "network error".into()),
    )
}

fn local_storage() -> Option<web_sys::Storage> {
    web_sys::window()?.local_storage().ok()?
}

/// This tab's storage: survives a reload, is not shared with other tabs, goes with the tab.
pub(crate) fn tab_storage() -> Option<web_sys::Storage> {
    web_sys::window()?.session_storage().ok()?
}

/// 128 random bits in hex, from `crypto.getRandomValues`: the client id owns tasks, so it must
/// not be guessable, which `Math.random`'s output is.
fn random_id() -> String {
    let mut bytes = [0u8; 16];
    web_sys::window()
        .and_then(|window| window.crypto().ok())
        .and_then(|crypto| crypto.get_random_values_with_u8_array(&mut bytes).ok())
        .expect("crypto.getRandomValues, which every browser the dashboard runs in has");
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
}

/// This browser's client id, created (and stored, if storage is available) the first time.
pub fn client_id() -> String {
    let storage = local_storage();
    if let Some(id) = storage
        .as_ref()
        .and_then(|s| s.get_item(CLIENT_ID_KEY).ok().flatten())
    {
        return id;
    }
    let id = format!("web-{}", random_id());
    if let Some(storage) = storage {
        let _ = storage.set_item(CLIENT_ID_KEY, &id);
    }
    id
}

/// The bearer token the user signed in with, if any.
pub fn token() -> Option<String> {
    local_storage()?
        .get_item(TOKEN_KEY)
        .ok()
        .flatten()
        .filter(|token| !token.is_empty())
}

/// Keeps `token` for every request from now on (and after reloads), until [`sign_out`].
pub fn sign_in(token: &str) {
    if let Some(storage) = local_storage() {
        let _ = storage.set_item(TOKEN_KEY, token.trim());
    }
}

/// Forgets the token.
pub fn sign_out() {
    if let Some(storage) = local_storage() {
        let _ = storage.remove_item(TOKEN_KEY);
    }
}

/// Why a 401 or 403 answer refused a request: the server's challenge, else its message.
async fn refusal(response: &Response) -> String {
    let challenge = response
        .headers()
        .get("www-authenticate")
        .unwrap_or_default();
    let described = challenge
        .split("error_description=\"")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .map(str::to_owned);
    if let Some(described) = described {
        return described;
    }
    let text = response.text().await.unwrap_or_default();
    serde_json::from_str::<Value>(&text)
        .ok()
        .and_then(|v| v["error"]["message"].as_str().map(str::to_owned))
        .unwrap_or_else(|| format!("HTTP {}", response.status()))
}

/// This tab's session, if it has one: a reload keeps it, a new tab has none.
///
/// A tab made by "Duplicate tab" (or `window.open`) starts with a copy of its opener's storage,
/// the session with it, while the opener still runs. The open mark the opener keeps there tells
/// the copy what it is, and it drops the copy to start a session (and a stream position) of its
/// own. A reload finds no mark: the page that left removed it.
fn tab_session() -> Option<SessionInfo> {
    let storage = tab_storage()?;
    if storage.get_item(TAB_OPEN_KEY).ok().flatten().is_some() {
        let _ = storage.remove_item(SESSION_KEY);
    }
    keep_open_mark(&storage);
    let json = storage.get_item(SESSION_KEY).ok().flatten()?;
    serde_json::from_str(&json).ok()
}

/// Removes the per-tab sessions earlier versions left in the browser-wide storage.
fn remove_legacy_sessions() {
    let Some(storage) = local_storage() else {
        return;
    };
    let keys: Vec<String> = (0..storage.length().unwrap_or(0))
        .filter_map(|i| storage.key(i).ok().flatten())
        .filter(|key| key.starts_with(LEGACY_TAB_PREFIX))
        .collect();
    for key in keys {
        let _ = storage.remove_item(&key);
    }
}

/// Sets the open mark now and whenever the page is shown again (from the back-forward cache),
/// and removes it whenever the page goes (reload, navigation, closing the tab).
fn keep_open_mark(storage: &web_sys::Storage) {
    let _ = storage.set_item(TAB_OPEN_KEY, "1");
    let Some(window) = web_sys::window() else {
        return;
    };
    for (event, open) in [("pageshow", true), ("pagehide", false)] {
        let storage = storage.clone();
        let listener = Closure::<dyn Fn()>::new(move || {
            let _ = if open {
                storage.set_item(TAB_OPEN_KEY, "1")
            } else {
                storage.remove_item(TAB_OPEN_KEY)
            };
        });
        let _ = window.add_event_listener_with_callback(event, listener.as_ref().unchecked_ref());
        // Listens for the page's whole life.
        listener.forget();
    }
}

/// What a tab persists about its session.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SessionInfo {
    pub session_id: String,
    pub protocol_version: String,
    pub last_event_id: Option<String>,
}

/// Reads SSE events from a response body as they arrive. By hand, on the body's stream reader:
/// gloo-net hands out the stream, and what is read from it is bytes for the SSE parser.
pub struct SseReader {
    reader: ReadableStreamDefaultReader,
    buffer: Vec<u8>,
    /// When the server opened the stream, by its clock (its `Date` header, in ms since the
    /// epoch): a change made after this is live, not replayed.
    pub opened_at_ms: Option<i64>,
}

impl SseReader {
    pub fn new(response: &Response) -> Option<SseReader> {
        let reader = response.body()?.get_reader().dyn_into().ok()?;
        let opened_at_ms = response
            .headers()
            .get("date")
            .map(|date| js_sys::Date::parse(&date))
            .filter(|ms| ms.is_finite())
            .map(|ms| ms as i64);
        Some(SseReader {
            reader,
            buffer: Vec::new(),
            opened_at_ms,
        })
    }

    /// The next event, or `None` at the end of the stream.
    pub async fn next(&mut self) -> Result<Option<SseEvent>, McpError> {
        loop {
            if let Some(raw) = take_event(&mut self.buffer) {
                if let Some(event) = SseEvent::parse(&String::from_utf8_lossy(&raw)) {
                    return Ok(Some(event));
                }
                continue;
            }
            let chunk: ReadableStreamReadResult = JsFuture::from(self.reader.read())
                .await
                .map_err(js_error)?
                .unchecked_into();
            if chunk.get_done().unwrap_or(true) {
                return Ok(None);
            }
            self.buffer
                .extend(Uint8Array::new(&chunk.get_value()).to_vec());
        }
    }
}

impl Drop for SseReader {
    fn drop(&mut self) {
        let _ = self.reader.cancel();
    }
}

/// The dashboard's MCP connection.
pub struct Mcp {
    endpoint: String,
    client_id: String,
    session: RefCell<Option<SessionInfo>>,
    next_id: Cell<u64>,
}

impl Mcp {
    pub fn new(endpoint: &str) -> Mcp {
        remove_legacy_sessions();
        Mcp {
            endpoint: endpoint.to_owned(),
            client_id: client_id(),
            session: RefCell::new(tab_session()),
            next_id: Cell::new(1),
        }
    }

    pub fn client_id(&self) -> &str {
        &self.client_id
    }

    pub fn session(&self) -> Option<SessionInfo> {
        self.session.borrow().clone()
    }

    fn save(&self) {
        let Some(storage) = tab_storage() else {
            return;
        };
        match &*self.session.borrow() {
            Some(info) => {
                let _ = storage.set_item(
                    SESSION_KEY,
                    &serde_json::to_string(info).unwrap_or_default(),
                );
            }
            None => {
                let _ = storage.remove_item(SESSION_KEY);
            }
        }
    }

    /// Forgets the session (after a 404) so the next call initializes a new one.
    pub fn forget_session(&self) {
        *self.session.borrow_mut() = None;
        self.save();
    }

    /// Records the last event id of the standalone stream, persisted for the next reload.
    pub fn set_last_event_id(&self, id: Option<String>) {
        if let Some(info) = self.session.borrow_mut().as_mut() {
            info.last_event_id = id;
        }
        self.save();
    }

    async fn send(
        &self,
        request: RequestBuilder,
        body: Option<&Value>,
        last_event_id: Option<&str>,
    ) -> Result<Response, McpError> {
        let mut request = request
            .header("accept", "application/json, text/event-stream")
            .header(durable_shared::CLIENT_ID_HEADER, &self.client_id);
        if let Some(token) = token() {
            request = request.header("authorization", &format!("Bearer {token}"));
        }
        if let Some(info) = &*self.session.borrow() {
            request = request
                .header("mcp-session-id", &info.session_id)
                .header("mcp-protocol-version", &info.protocol_version);
        }
        if let Some(id) = last_event_id {
            request = request.header("last-event-id", id);
        }
        let request = match body {
            Some(body) => request
                .header("content-type", "application/json")
                .body(body.to_string()),
            None => request.build(),
        }
        .map_err(net_error)?;
        request.send().await.map_err(net_error)
    }

    async fn post(&self, body: &Value) -> Result<Response, McpError> {
        self.send(Request::post(&self.endpoint), Some(body), None)
            .await
    }

    /// The answer to request `id` from a POST response (JSON or SSE).
    async fn answer(response: Response, id: u64) -> Result<Value, McpError> {
        let is_sse = response
            .headers()
            .get("content-type")
            .is_some_and(|t| t.starts_with("text/event-stream"));
        let message: Value = if is_sse {
            let mut reader = SseReader::new(&response)
                .ok_or_else(|| McpError::Network("response without a body".into()))?;
            loop {
                let event = reader
                    .next()
                    .await?
                    .ok_or_else(|| McpError::Network("the response stream ended early".into()))?;
                if event.data.is_empty() {
                    continue;
                }
                let message: Value = serde_json::from_str(&event.data)
                    .map_err(|e| McpError::Rpc(format!("invalid JSON from the server: {e}")))?;
                if message["id"] == json!(id) {
                    break message;
                }
            }
        } else {
            let text = response.text().await.map_err(net_error)?;
            serde_json::from_str(&text)
                .map_err(|e| McpError::Rpc(format!("invalid JSON from the server: {e}")))?
        };
        if let Some(error) = message.get("error") {
            return Err(McpError::Rpc(
                error["message"]
                    .as_str()
                    .unwrap_or("request failed")
                    .to_owned(),
            ));
        }
        Ok(message["result"].clone())
    }

    /// Starts a new session.
    pub async fn initialize(&self) -> Result<(), McpError> {
        self.forget_session();
        let id = self.next_id.replace(self.next_id.get() + 1);
        let request = json!({"jsonrpc": "2.0", "id": id, "method": "initialize", "params": {
            "protocolVersion": PROTOCOL_VERSION,
            "capabilities": {},
            "clientInfo": {"name": "durable-mcp-dashboard", "version": env!("CARGO_PKG_VERSION")},
        }});
        let response = self.post(&request).await?;
        if response.status() == 401 {
            return Err(McpError::Unauthorized(refusal(&response).await));
        }
        if !response.ok() {
            return Err(McpError::Network(format!(
                "initialize failed with HTTP {}",
                response.status()
            )));
        }
        let session_id = response
            .headers()
            .get("mcp-session-id")
            .ok_or_else(|| McpError::Rpc("the server sent no Mcp-Session-Id".into()))?;
        let result = Self::answer(response, id).await?;
        *self.session.borrow_mut() = Some(SessionInfo {
            session_id,
            protocol_version: result["protocolVersion"]
                .as_str()
                .unwrap_or(PROTOCOL_VERSION)
                .to_owned(),
            last_event_id: None,
        });
        self.save();
        let initialized = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
        self.post(&initialized).await?;
        Ok(())
    }

    /// Sends a request and returns its result.
    pub async fn request(&self, method: &str, params: Value) -> Result<Value, McpError> {
        let id = self.next_id.replace(self.next_id.get() + 1);
        let body = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        let response = self.post(&body).await?;
        match response.status() {
            404 => Err(McpError::SessionLost),
            401 => Err(McpError::Unauthorized(refusal(&response).await)),
            403 => Err(McpError::Rpc(refusal(&response).await)),
            status if !(200..300).contains(&status) => Err(McpError::Network(format!(
                "{method} failed with HTTP {status}"
            ))),
            _ => Self::answer(response, id).await,
        }
    }

    /// Calls a tool; a tool error (`isError`) comes back as `Err(Tool {..})`.
    pub async fn call_tool(&self, name: &str, arguments: Value) -> Result<Value, McpError> {
        let result = self
            .request("tools/call", json!({"name": name, "arguments": arguments}))
            .await?;
        if result["isError"] == json!(true) {
            let text = result["content"][0]["text"]
                .as_str()
                .unwrap_or("tool failed");
            return Err(McpError::Tool {
                message: text.to_owned(),
                field: result["structuredContent"]["field"]
                    .as_str()
                    .map(str::to_owned),
            });
        }
        Ok(result)
    }

    /// Opens the standalone stream, resuming after the saved last event id.
    pub async fn open_stream(&self) -> Result<SseReader, McpError> {
        let last = self.session().and_then(|info| info.last_event_id);
        let response = self
            .send(Request::get(&self.endpoint), None, last.as_deref())
            .await?;
        match response.status() {
            200 => {
                SseReader::new(&response).ok_or_else(|| McpError::Network("no stream body".into()))
            }
            404 => Err(McpError::SessionLost),
            401 => Err(McpError::Unauthorized(refusal(&response).await)),
            400 | 403 | 410 => {
                let text = response.text().await.unwrap_or_default();
                let why = serde_json::from_str::<Value>(&text)
                    .ok()
                    .and_then(|v| v["error"]["message"].as_str().map(str::to_owned))
                    .unwrap_or(text);
                Err(McpError::StaleEventId(why))
            }
            status => Err(McpError::Network(format!(
                "stream failed with HTTP {status}"
            ))),
        }
    }
}
