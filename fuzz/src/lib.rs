//! The in-process server the HTTP fuzz targets send their requests to: the real router of
//! `durable_mcp_server::http::app` (every middleware, rmcp, the engine) on a SQLite file in a
//! temporary directory, built once per fuzzing process and shared by every iteration, with one
//! initialized session whose id and a stream's event id the targets can put in their requests.
//!
//! Any panic, on the fuzzing thread or on one of the runtime's workers, aborts the process
//! (libFuzzer's panic hook), and so does a request that takes longer than [`REQUEST_DEADLINE`]:
//! both are reported as crashes with the input that caused them.

use std::sync::OnceLock;
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, Request, StatusCode};
use durable_mcp_server::config::{Config, Limits};
use durable_mcp_server::engine::Engine;
use durable_mcp_server::store::Database;
use durable_shared::sse::{SseEvent, take_event};
use durable_shared::{EventId, TaskStatus};
use serde_json::{Value, json};
use tokio::runtime::Runtime;
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;

/// The protocol version the harness's session negotiated.
pub const PROTOCOL: &str = "2025-11-25";
/// The Accept header MCP clients send on `/mcp`.
pub const ACCEPT: &str = "application/json, text/event-stream";
/// Longer than any request to the in-process server should take: a hang is a bug too.
pub const REQUEST_DEADLINE: Duration = Duration::from_secs(10);
/// How long a response body is read: answers to requests end; a listening stream never does.
pub const BODY_DEADLINE: Duration = Duration::from_secs(2);

/// The shared server. Fields are read by the targets; the temporary directory lives as long as
/// the process.
pub struct Server {
    pub runtime: Runtime,
    pub router: Router,
    pub engine: Engine,
    /// An initialized session (`notifications/initialized` sent).
    pub session: String,
    /// An event id the session received (on its ping answer's stream).
    pub event_id: EventId,
    _dir: tempfile::TempDir,
    _shutdown: CancellationToken,
}

/// A response with its body read (within [`BODY_DEADLINE`]; `None` if it did not end).
pub struct Answer {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Option<Bytes>,
}

impl Answer {
    /// The JSON-RPC messages of the body: the body itself when it is JSON, else the data of
    /// each SSE event.
    pub fn messages(&self) -> Vec<Value> {
        let Some(body) = &self.body else {
            return Vec::new();
        };
        if let Ok(value) = serde_json::from_slice::<Value>(body) {
            return vec![value];
        }
        let mut buffer = body.to_vec();
        let mut messages = Vec::new();
        while let Some(event) = take_event(&mut buffer) {
            if let Some(event) = SseEvent::parse(&String::from_utf8_lossy(&event))
                && let Ok(value) = serde_json::from_str(&event.data)
            {
                messages.push(value);
            }
        }
        messages
    }
}

/// The server, built on first use.
pub fn server() -> &'static Server {
    static SERVER: OnceLock<Server> = OnceLock::new();
    SERVER.get_or_init(Server::start)
}

impl Server {
    fn start() -> Server {
        // Two workers: steps use `block_in_place`, which needs a multi-thread runtime.
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("tokio runtime");
        let dir = tempfile::tempdir().expect("temporary directory");
        let shutdown = CancellationToken::new();
        let config = config(dir.path());
        let app = runtime
            .block_on(durable_mcp_server::http::app(&config, &shutdown))
            .expect("building the server");
        let mut server = Server {
            runtime,
            router: app.router,
            engine: app.engine,
            session: String::new(),
            event_id: EventId {
                token: String::new(),
                seq: 1,
            },
            _dir: dir,
            _shutdown: shutdown,
        };
        let initialize = json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
            "protocolVersion": PROTOCOL, "capabilities": {},
            "clientInfo": {"name": "fuzz", "version": "1"}}});
        let answer = server.send(post(&initialize.to_string(), None), true);
        assert_eq!(answer.status, StatusCode::OK, "initialize");
        server.session = answer.headers["mcp-session-id"]
            .to_str()
            .expect("session id")
            .to_owned();
        let initialized = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
        let answer = server.send(post(&initialized.to_string(), Some(&server.session)), true);
        assert_eq!(
            answer.status,
            StatusCode::ACCEPTED,
            "notifications/initialized"
        );
        // The answer to a request in the session comes on a stored stream (the initialize
        // answer's is not: the session does not exist yet; nor are a read's, answered as JSON).
        let list = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list"});
        let answer = server.send(post(&list.to_string(), Some(&server.session)), true);
        let body = answer.body.expect("the tools/list answer ends");
        let mut buffer = body.to_vec();
        server.event_id = std::iter::from_fn(|| take_event(&mut buffer))
            .filter_map(|event| SseEvent::parse(&String::from_utf8_lossy(&event)))
            .find_map(|event| event.event_id())
            .unwrap_or_else(|| panic!("the tools/list answer {body:?} has no event id"));
        server
    }

    /// Sends `request` through the router and, with `read`, reads its answer's body (a
    /// listening GET stream never ends: its body is dropped unread).
    pub fn send(&self, request: Request<Body>, read: bool) -> Answer {
        self.runtime.block_on(async {
            let response =
                tokio::time::timeout(REQUEST_DEADLINE, self.router.clone().oneshot(request))
                    .await
                    .expect("the server answers within the deadline")
                    .expect("the router is infallible");
            let (parts, body) = response.into_parts();
            if !read {
                return Answer {
                    status: parts.status,
                    headers: parts.headers,
                    body: None,
                };
            }
            let body = tokio::time::timeout(BODY_DEADLINE, axum::body::to_bytes(body, usize::MAX))
                .await
                .ok()
                .map(|read| read.expect("the body reads"));
            Answer {
                status: parts.status,
                headers: parts.headers,
                body,
            }
        })
    }

    /// Deletes the session an answer created (an input's `initialize`), so that sessions do
    /// not pile up over millions of inputs.
    pub fn forget_new_session(&self, answer: &Answer) {
        let Some(session) = answer.headers.get("mcp-session-id") else {
            return;
        };
        if *session == self.session {
            return;
        }
        let request = Request::delete("/mcp")
            .header("host", "127.0.0.1")
            .header("mcp-session-id", session.clone())
            .body(Body::empty())
            .expect("a valid request");
        self.send(request, true);
    }

    /// Cancels every unfinished task, so that the tasks one input started neither use the
    /// machine nor count against the owner limit for the next inputs.
    pub fn cancel_unfinished(&self) {
        self.runtime.block_on(async {
            // By status: the finished tasks of earlier inputs pile up, and are not read.
            for status in [TaskStatus::Pending, TaskStatus::Running, TaskStatus::Paused] {
                let tasks = self
                    .engine
                    .list(None, Some(status), None, 100)
                    .await
                    .expect("listing tasks");
                for task in tasks {
                    // Refused if it finished meanwhile: nothing to do then.
                    let _ = self.engine.cancel(&task.task_id).await;
                }
            }
        });
    }
}

/// A well-formed MCP POST of `body`, in the session when one is given.
pub fn post(body: &str, session: Option<&str>) -> Request<Body> {
    let mut request = Request::post("/mcp")
        .header("host", "127.0.0.1")
        .header("accept", ACCEPT)
        .header("content-type", "application/json");
    if let Some(session) = session {
        request = request
            .header("mcp-session-id", session)
            .header("mcp-protocol-version", PROTOCOL);
    }
    request
        .body(Body::from(body.to_owned()))
        .expect("a valid request")
}

/// The server's settings for fuzzing: no simulated delays, few tasks at once, no dashboard.
fn config(dir: &std::path::Path) -> Config {
    let hour = Duration::from_secs(3600);
    Config {
        database: Database::Sqlite(dir.join("fuzz.db")),
        node_id: "fuzz".to_owned(),
        lease_ttl: Duration::from_secs(30),
        data_dir: dir.join("data"),
        time_scale: 0.0,
        retention: hour,
        retention_interval: hour,
        max_running_tasks: 2,
        notification_buffer: 64,
        session_ttl: hour,
        session_dormant_after: Duration::from_secs(60),
        event_max_age: hour,
        sse_retry: Duration::from_secs(3),
        sse_keep_alive: Duration::from_secs(15),
        allowed_origins: Vec::new(),
        allowed_hosts: Vec::new(),
        max_body_bytes: 64 * 1024,
        dashboard_dir: Some(dir.join("no-dashboard")),
        shutdown_grace: Duration::from_secs(1),
        auth: None,
        limits: Limits {
            tasks_per_owner: 8,
            ..Limits::default()
        },
    }
}
