//! What both benchmarks need: the real server on `127.0.0.1:0` in-process, and an MCP session
//! driven with plain HTTP.

use std::path::Path;

use serde_json::{Value, json};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// A server running in this process.
pub struct Served {
    pub url: String,
    shutdown: CancellationToken,
    task: JoinHandle<anyhow::Result<()>>,
}

/// Serves `/mcp` with its database at `db` and `extra` flags.
pub async fn serve(db: &Path, data: &Path, extra: &[&str]) -> Served {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/mcp", listener.local_addr().unwrap());
    let mut argv = vec![
        "durable-mcp",
        "--db",
        db.to_str().unwrap(),
        "--data-dir",
        data.to_str().unwrap(),
    ];
    argv.extend_from_slice(extra);
    let args = <durable_mcp::config::Cli as clap::Parser>::parse_from(argv).serve;
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(durable_mcp::http::run(args, listener, shutdown.clone()));
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

pub struct Session {
    pub http: reqwest::Client,
    pub url: String,
    pub session: String,
}

impl Session {
    pub async fn open(url: String) -> Session {
        let http = reqwest::Client::new();
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
            .unwrap();
        let session = response.headers()["mcp-session-id"]
            .to_str()
            .unwrap()
            .to_owned();
        response.text().await.unwrap();
        let session = Session { http, url, session };
        session
            .post(json!({"jsonrpc": "2.0", "method": "notifications/initialized"}))
            .await;
        session
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
