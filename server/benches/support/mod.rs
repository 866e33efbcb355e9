//! What the benchmarks need: the real server on `127.0.0.1:0` in-process or in a process of
//! its own ([`child`]), and an MCP session driven with plain HTTP.

use std::path::Path;
use std::time::Duration;

use durable_mcp_server::config::Config;

use serde_json::{Value, json};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

// The benches' children serve as the `durable-mcp` binary does, with its allocator; so does
// the ceiling, which makes the comparison one of servers, not of allocators.
durable_mcp_server::jemalloc!();

// Compiled into every bench, as is this whole module; only some run a server process.
#[allow(dead_code)]
pub mod ceiling;
#[allow(dead_code)]
pub mod child;

/// A server running in this process.
pub struct Served {
    pub url: String,
    pub shutdown: CancellationToken,
    pub task: JoinHandle<anyhow::Result<()>>,
}

/// The server's settings for a benchmark: the binary's defaults, with the database at `db`, no
/// simulated delays and no dashboard.
pub fn config(db: &Path, data: &Path) -> Config {
    let hour = Duration::from_secs(3600);
    Config {
        database: durable_mcp_server::store::Database::Sqlite(db.to_owned()),
        node_id: "bench".to_owned(),
        lease_ttl: Duration::from_secs(10),
        data_dir: data.to_owned(),
        time_scale: 0.0,
        retention: 24 * 7 * hour,
        retention_interval: hour / 6,
        max_running_tasks: 32,
        notification_buffer: 1024,
        session_ttl: hour,
        session_dormant_after: Duration::from_secs(60),
        event_max_age: 24 * hour,
        sse_retry: Duration::from_secs(3),
        sse_keep_alive: Duration::from_secs(15),
        allowed_origins: Vec::new(),
        allowed_hosts: Vec::new(),
        max_body_bytes: 1024 * 1024,
        dashboard_dir: Some(data.join("no-dashboard")),
        shutdown_grace: Duration::from_secs(5),
        auth: None,
        limits: Default::default(),
    }
}

/// Serves `/mcp` with `config`.
pub async fn serve(config: Config) -> Served {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/mcp", listener.local_addr().unwrap());
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(durable_mcp_server::http::run(
        config,
        listener,
        shutdown.clone(),
    ));
    Served {
        url,
        shutdown,
        task,
    }
}

impl Served {
    pub async fn stop(self) {
        self.shutdown.cancel();
        let _ = self.task.await;
    }
}

#[derive(Clone)]
pub struct Session {
    pub http: reqwest::Client,
    pub url: String,
    pub session: String,
}

impl Session {
    /// Opens a session on a client of its own (its own connection pool).
    pub async fn open(url: String) -> Session {
        Session::open_with(reqwest::Client::new(), url).await
    }

    /// Opens a session on `http`, so that many sessions can share one connection pool.
    pub async fn open_with(http: reqwest::Client, url: String) -> Session {
        Session::try_open_with(http, url).await.unwrap()
    }

    /// Opens a session on `http`, or says why it could not.
    pub async fn try_open_with(http: reqwest::Client, url: String) -> Result<Session, String> {
        let response = http
            .post(&url)
            .header("Accept", "application/json, text/event-stream")
            .json(
                &json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
                "protocolVersion": "2025-11-25", "capabilities": {},
                "clientInfo": {"name": "bench", "version": "1"}}}),
            )
            .send()
            .await
            .map_err(|e| format!("initialize: {e}"))?;
        let session = response
            .headers()
            .get("mcp-session-id")
            .and_then(|id| id.to_str().ok())
            .ok_or_else(|| {
                format!(
                    "initialize answered {} without a session",
                    response.status()
                )
            })?
            .to_owned();
        response
            .text()
            .await
            .map_err(|e| format!("initialize: {e}"))?;
        let session = Session { http, url, session };
        session
            .http
            .post(&session.url)
            .header("Accept", "application/json, text/event-stream")
            .header("Mcp-Session-Id", &session.session)
            .header("MCP-Protocol-Version", "2025-11-25")
            .json(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}))
            .send()
            .await
            .and_then(|response| response.error_for_status())
            .map_err(|e| format!("notifications/initialized: {e}"))?;
        Ok(session)
    }

    pub async fn post(&self, body: Value) -> String {
        self.http
            .post(&self.url)
            .header("Accept", "application/json, text/event-stream")
            .header("Mcp-Session-Id", &self.session)
            .header("MCP-Protocol-Version", "2025-11-25")
            .json(&body)
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    }
}

/// The JSON-RPC result in a POST's reply (a JSON body, or the SSE event carrying it),
/// panicking on an error or a failed tool call: a figure measured on failing requests would be
/// meaningless.
// Compiled into every bench, as is this whole module; not every bench calls tools.
#[allow(dead_code)]
pub fn result(reply: &str) -> Value {
    let message = serde_json::from_str::<Value>(reply)
        .ok()
        .or_else(|| {
            reply
                .split("\n\n")
                .filter_map(durable_shared::sse::SseEvent::parse)
                .find(|event| !event.is_priming())
                .and_then(|event| serde_json::from_str::<Value>(&event.data).ok())
        })
        .unwrap_or_else(|| panic!("no JSON-RPC message in reply {reply:?}"));
    let result = &message["result"];
    assert!(
        result.is_object() && result["isError"] != true,
        "request failed: {message}"
    );
    result.clone()
}

/// Posts `body` on `session` and checks that it succeeded.
#[allow(dead_code)]
pub async fn call(session: &Session, body: Value) -> Value {
    result(&session.post(body).await)
}

impl Session {
    /// Resumes the session's standalone stream after `last_event_id` and reads it until `count`
    /// replayed messages have arrived (what a reconnecting client waits for).
    #[allow(dead_code)] // not every bench replays
    pub async fn receive_replay(&self, last_event_id: &str, count: usize) {
        use futures::StreamExt;
        let response = self
            .http
            .get(&self.url)
            .header("Accept", "text/event-stream")
            .header("Mcp-Session-Id", &self.session)
            .header("MCP-Protocol-Version", "2025-11-25")
            .header("Last-Event-ID", last_event_id)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200);
        let mut body = response.bytes_stream();
        let (mut received, mut pending) = (0, Vec::new());
        while received < count {
            pending.extend_from_slice(&body.next().await.expect("stream open").unwrap());
            while let Some(end) = pending.windows(2).position(|w| w == b"\n\n") {
                received += usize::from(pending[..end].starts_with(b"data: {"));
                pending.drain(..end + 2);
            }
        }
    }
}
