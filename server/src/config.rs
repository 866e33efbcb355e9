//! The server's settings: one plain struct, filled and validated by the `durable-mcp` binary's
//! command line (or by a test or benchmark directly), and passed to [`crate::http::run`].

use std::path::PathBuf;
use std::time::Duration;

use crate::auth::AuthConfig;
use crate::store::Database;

/// Everything [`crate::http::run`] needs to know (the listener is bound by its caller). The binary's `--help` documents each setting
/// with its default.
#[derive(Debug, Clone)]
pub struct Config {
    /// Where tasks, checkpoints, sessions and events are kept.
    pub database: Database,
    /// This server's id among the nodes sharing the database; the tasks it advances are
    /// leased to it.
    pub node_id: String,
    /// How long a node's lease on a task lasts unless renewed: a node that dies is replaced
    /// within this (plus a step).
    pub lease_ttl: Duration,
    /// Directory that data-migration source and destination paths are resolved in (created if
    /// missing); nothing outside it is read or written.
    pub data_dir: PathBuf,
    /// Factor applied to every simulated delay: 0.01 makes a 10 s epoch take 0.1 s.
    pub time_scale: f64,
    /// Completed, failed and cancelled tasks are deleted this long after they finished
    /// (e.g. 7d, 12h, 30m).
    pub retention: Duration,
    /// How often expired tasks are looked for.
    pub retention_interval: Duration,
    /// Tasks doing work at the same time; further ones wait as `pending`. A task whose step
    /// waits (I/O, a simulated delay) lends its slot to another while it waits.
    pub max_running_tasks: usize,
    /// Notifications a session may fall behind before it is resynchronised from the store
    /// (sent the current state of what it follows instead of each change).
    pub notification_buffer: usize,
    /// An MCP session with no request and no open stream for this long is deleted with its
    /// stored events; its client gets 404 and initializes again.
    pub session_ttl: Duration,
    /// An MCP session with no request, no open stream, no call in progress and nothing it
    /// follows (subscriptions, its client's unfinished tasks) for this long leaves memory; it
    /// stays stored, and its next request restores it as a restart would.
    pub session_dormant_after: Duration,
    /// Stored SSE events older than this are deleted even while their session lives; resuming
    /// from before then gets 410.
    pub event_max_age: Duration,
    /// Reconnect delay suggested to clients in SSE priming events (`retry:`).
    pub sse_retry: Duration,
    /// Interval of keep-alive comments on open SSE streams.
    pub sse_keep_alive: Duration,
    /// Browser origins allowed besides loopback ones (comma-separated, e.g.
    /// https://ops.example.com). Requests from any other Origin get 403.
    pub allowed_origins: Vec<String>,
    /// Host names accepted in the Host header besides loopback ones (comma-separated); needed
    /// when clients reach the server under a public name.
    pub allowed_hosts: Vec<String>,
    /// Largest accepted request body in bytes; larger ones get 413.
    pub max_body_bytes: usize,
    /// Directory of the built dashboard (Trunk's dist) served at /; `None`: `web/dist` if it
    /// holds a build, else the one built into the binary (see `http::dashboard`).
    pub dashboard_dir: Option<PathBuf>,
    /// On SIGTERM or Ctrl-C, how long to wait for tasks to checkpoint and connections to close.
    pub shutdown_grace: Duration,
    /// OAuth bearer tokens required on `/mcp` (a multi-tenant server); `None`: a single-user
    /// local tool where every client sees every task.
    pub auth: Option<AuthConfig>,
    pub limits: Limits,
}

/// What one client may hold at once; each refusal names its limit. The defaults are far above
/// what one person's use reaches.
#[derive(Debug, Clone, PartialEq)]
pub struct Limits {
    /// Unfinished (pending, running, paused) tasks per owner.
    pub tasks_per_owner: u64,
    /// Live MCP sessions per authenticated subject.
    pub sessions_per_subject: u64,
    /// Open SSE streams (GET streams and streamed POST answers) per session.
    pub streams_per_session: usize,
    /// Resource subscriptions per session.
    pub subscriptions_per_session: usize,
    /// Requests to `/mcp` being served at once, over all clients.
    pub concurrent_requests: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            tasks_per_owner: 10_000,
            sessions_per_subject: 1_000,
            streams_per_session: 64,
            subscriptions_per_session: 10_000,
            concurrent_requests: 4_096,
        }
    }
}

/// A node id for a server started without `--node-id`: unique per start.
pub fn random_node_id() -> String {
    format!("node-{}", &uuid::Uuid::new_v4().simple().to_string()[..12])
}
