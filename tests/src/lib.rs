//! Harness for the end-to-end suites: real `durable-mcp` processes on `127.0.0.1:0` and real MCP
//! clients (rmcp's Streamable HTTP client). Every wait has a deadline, so a bug fails a test
//! instead of hanging it.
// MCP logging is deprecated by SEP-2577, but it is what 2025-11-25 servers (this one) send.
#![allow(deprecated)]

pub mod auth;
pub mod browser;
pub mod dashboard;
pub mod fleet;
pub mod proxy;
pub mod raw;
pub mod trip;

use std::future::Future;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use durable_mcp_server::store::postgres::scratch::{ScratchDatabase, TEST_SERVER_VAR};
use durable_shared::{TASK_LIST_META_KEY, TASK_META_KEY, TaskInfo, TaskStatus};
use nix::sys::signal::Signal;
use nix::unistd::Pid;
use rmcp::model::{
    CallToolRequestParams, CallToolResult, LoggingMessageNotificationParam, NotificationMetaObject,
    ProgressNotificationParam, ProgressToken, ReadResourceRequestParams,
    ResourceUpdatedNotificationParam, SubscribeRequestParams,
};
use rmcp::service::{NotificationContext, RunningService};
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::{ClientHandler, RoleClient, ServiceExt};
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::mpsc::UnboundedReceiver;

/// Sends each line `child` prints on its (piped) stdout to the returned channel, which ends
/// when the child closes its stdout (when it exits). A task reads the pipe the whole time, even
/// when nobody receives, so a chatty child never blocks on a full pipe.
pub fn stdout_lines(child: &mut Child) -> UnboundedReceiver<String> {
    let stdout = child.stdout.take().expect("a piped stdout");
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        let mut lines = BufReader::new(stdout).lines();
        while let Ok(Some(line)) = lines.next_line().await {
            let _ = tx.send(line);
        }
    });
    rx
}

/// Every line still to come from a `stdout_lines` channel, once the child has closed its
/// stdout.
pub async fn remaining_lines(lines: &mut UnboundedReceiver<String>) -> Vec<String> {
    within(IO_TIMEOUT, "the end of a child's output", async {
        let mut rest = Vec::new();
        while let Some(line) = lines.recv().await {
            rest.push(line);
        }
        rest
    })
    .await
}

/// Sends `signal` to `child`, which must not have been reaped yet (so its pid is still its
/// own).
pub fn send_signal(child: &Child, signal: Signal) {
    let pid = child.id().expect("a child that has not been reaped");
    let pid = Pid::from_raw(i32::try_from(pid).expect("a pid fits in pid_t"));
    nix::sys::signal::kill(pid, signal)
        .unwrap_or_else(|e| panic!("sending {signal} to {pid}: {e}"));
}

/// Waits up to `limit` for `child` to exit; `None` (after killing it) if it did not.
pub async fn exit_within(child: &mut Child, limit: Duration) -> Option<ExitStatus> {
    match tokio::time::timeout(limit, child.wait()).await {
        Ok(status) => Some(status.expect("waiting for a child process")),
        Err(_) => {
            send_signal(child, Signal::SIGKILL);
            within(IO_TIMEOUT, "a killed child to exit", child.wait())
                .await
                .expect("reaping a killed child");
            None
        }
    }
}

/// Deadline for any single network operation.
pub const IO_TIMEOUT: Duration = Duration::from_secs(20);

/// Awaits `future`, failing the test if it takes longer than `limit`.
pub async fn within<T>(limit: Duration, what: &str, future: impl Future<Output = T>) -> T {
    match tokio::time::timeout(limit, future).await {
        Ok(value) => value,
        Err(_) => panic!("timed out after {limit:?} waiting for {what}"),
    }
}

/// Holds the SQLite database at `path`'s write lock from another process for `seconds`;
/// returns once it is held.
pub async fn lock_database(path: &std::path::Path, seconds: u32) -> tokio::process::Child {
    let mut locker = tokio::process::Command::new("python3")
        .arg("-c")
        .arg(format!(
            "import sqlite3, sys, time\n\
             db = sqlite3.connect(sys.argv[1], isolation_level=None)\n\
             db.execute('BEGIN EXCLUSIVE')\n\
             print('locked', flush=True)\n\
             time.sleep({seconds})\n\
             db.execute('ROLLBACK')\n"
        ))
        .arg(path)
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("python3");
    let mut lines = stdout_lines(&mut locker);
    within(Duration::from_secs(10), "the lock", lines.recv()).await;
    locker
}

/// The `durable-mcp` binary of this build profile, built once per test process. Cargo only
/// builds a package's binaries for that package's own tests, so the suites ask for it here.
/// The build blocks (a `std` command) on purpose: it runs once, before any server or client of
/// the test process exists, so there is nothing for the runtime to do meanwhile, and other
/// tests' threads wait on the `OnceLock` for the same binary.
pub fn server_binary() -> &'static Path {
    static BINARY: OnceLock<PathBuf> = OnceLock::new();
    BINARY.get_or_init(|| {
        let (mut build, binary) = server_build(&[]);
        let status = build.status().expect("running cargo build for durable-mcp");
        assert!(status.success(), "cargo build of durable-mcp failed");
        binary
    })
}

/// The `cargo build` of the `durable-mcp` binary with `features`, in the profile and target
/// directory of this test process, and the path the binary lands at.
pub fn server_build(features: &[&str]) -> (std::process::Command, PathBuf) {
    let exe = std::env::current_exe().expect("test executable path");
    // target/<profile>/deps/<test> -> target/<profile>
    let profile_dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("test executable lives in target/<profile>/deps");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut build = std::process::Command::new(cargo);
    build.args([
        "build",
        "--quiet",
        "-p",
        "durable-mcp",
        "--bin",
        "durable-mcp",
    ]);
    if !features.is_empty() {
        build.arg("--features").arg(features.join(","));
    }
    if profile_dir
        .file_name()
        .is_some_and(|name| name == "release")
    {
        build.arg("--release");
    }
    (build, profile_dir.join("durable-mcp"))
}

/// The environment variable choosing the backend the suites run their servers on: `sqlite`
/// (the default) or `postgres` (a scratch database per server on the PostgreSQL server named
/// by `DURABLE_MCP_TEST_POSTGRES`).
pub const BACKEND_VAR: &str = "DURABLE_MCP_TEST_BACKEND";

/// Where a test server keeps its state.
enum TestDatabase {
    /// `tasks.db` in the server's directory.
    Sqlite,
    /// A database of its own, dropped with the server.
    Postgres(ScratchDatabase),
    /// A PostgreSQL database shared with other servers (a fleet's), dropped by its owner.
    Shared(String),
    /// An SQLite file where the test put it (on a filesystem it controls).
    SqliteAt(PathBuf),
}

impl TestDatabase {
    async fn for_this_run() -> TestDatabase {
        match std::env::var(BACKEND_VAR).as_deref() {
            Err(_) | Ok("sqlite") => TestDatabase::Sqlite,
            Ok("postgres") => {
                let scratch = ScratchDatabase::from_env().await.unwrap_or_else(|| {
                    panic!("{BACKEND_VAR}=postgres needs {TEST_SERVER_VAR} (see scripts/test)")
                });
                TestDatabase::Postgres(scratch.expect("creating a scratch PostgreSQL database"))
            }
            Ok(other) => panic!("{BACKEND_VAR} must be sqlite or postgres, not {other:?}"),
        }
    }
}

/// A node id unique on this machine: the test process's id and a count.
fn next_node_id() -> String {
    static SERVERS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = SERVERS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    format!("test-{}-{n}", std::process::id())
}

/// A running server process with its own database and data directory. Dropping it (a test's
/// end, or a panic) kills the process.
pub struct Server {
    child: Option<Child>,
    pub addr: SocketAddr,
    pub dir: PathBuf,
    args: Vec<String>,
    starts: u32,
    database: TestDatabase,
    data_dir: PathBuf,
    /// The same at every start, as a deployment would keep it: a restarted server takes its
    /// tasks back at once instead of after their leases lapse.
    pub node_id: String,
}

impl Server {
    /// Starts a server in `dir` (database `dir/tasks.db` or a scratch PostgreSQL database, see
    /// [`BACKEND_VAR`]; data `dir/data`) on a free port.
    pub async fn start(dir: &Path, extra_args: &[&str]) -> Server {
        let database = TestDatabase::for_this_run().await;
        Server::launch(dir, database, dir.join("data"), next_node_id(), extra_args).await
    }

    /// Starts a server on the SQLite file `db`, whatever the run's backend (its logs and data
    /// in `dir`).
    pub async fn start_on_sqlite(dir: &Path, db: &Path, extra_args: &[&str]) -> Server {
        let database = TestDatabase::SqliteAt(db.to_owned());
        Server::launch(dir, database, dir.join("data"), next_node_id(), extra_args).await
    }

    /// Starts node `node_id` of a fleet: its logs in `dir`, its state in the PostgreSQL
    /// database at `database_url` and its files in `data_dir`, both shared with the other
    /// nodes.
    pub async fn start_node(
        dir: &Path,
        database_url: &str,
        data_dir: &Path,
        node_id: &str,
        extra_args: &[&str],
    ) -> Server {
        let database = TestDatabase::Shared(database_url.to_owned());
        Server::launch(
            dir,
            database,
            data_dir.to_owned(),
            node_id.to_owned(),
            extra_args,
        )
        .await
    }

    async fn launch(
        dir: &Path,
        database: TestDatabase,
        data_dir: PathBuf,
        node_id: String,
        extra_args: &[&str],
    ) -> Server {
        let mut server = Server {
            child: None,
            addr: "127.0.0.1:0".parse().expect("address"),
            dir: dir.to_owned(),
            args: extra_args.iter().map(|arg| arg.to_string()).collect(),
            starts: 0,
            database,
            data_dir,
            node_id,
        };
        server.spawn().await;
        server
    }

    async fn spawn(&mut self) {
        self.starts += 1;
        let log = std::fs::File::create(self.dir.join(format!("server-{}.log", self.starts)))
            .expect("server log file");
        let mut command = Command::new(server_binary());
        command
            .args([
                "--host",
                "127.0.0.1",
                "--port",
                &self.addr.port().to_string(),
            ])
            .arg("--data-dir")
            .arg(&self.data_dir)
            .args(["--node-id", &self.node_id]);
        match &self.database {
            TestDatabase::Sqlite | TestDatabase::SqliteAt(_) => {
                let file = self.sqlite_file().expect("a SQLite database has a file");
                command.arg("--db").arg(file)
            }
            TestDatabase::Postgres(scratch) => command.args(["--database-url", scratch.url()]),
            TestDatabase::Shared(url) => command.args(["--database-url", url]),
        };
        if !self.args.iter().any(|arg| arg == "--dashboard-dir") {
            command.args(["--dashboard-dir", "/nonexistent"]);
        }
        let mut child = command
            .args(&self.args)
            .env("RUST_LOG", "info,durable_mcp=debug")
            .stdout(Stdio::piped())
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .expect("starting durable-mcp");
        let mut lines = stdout_lines(&mut child);
        let line = tokio::time::timeout(Duration::from_secs(60), lines.recv())
            .await
            .ok()
            .flatten()
            .unwrap_or_else(|| panic!("server did not start; log:\n{}", self.log()));
        let url = line
            .strip_prefix("durable-mcp listening on http://")
            .and_then(|rest| rest.strip_suffix("/mcp"))
            .unwrap_or_else(|| panic!("unexpected first line {line:?}"));
        self.addr = url.parse().expect("listening address");
        self.child = Some(child);
    }

    pub fn mcp_url(&self) -> String {
        format!("http://{}/mcp", self.addr)
    }

    /// The SQLite file the server keeps its state in; `None` on PostgreSQL. Tests that reach
    /// into the file (to lock it, say) skip themselves without one.
    pub fn sqlite_file(&self) -> Option<PathBuf> {
        match &self.database {
            TestDatabase::Sqlite => Some(self.dir.join("tasks.db")),
            TestDatabase::SqliteAt(path) => Some(path.clone()),
            TestDatabase::Postgres(_) | TestDatabase::Shared(_) => None,
        }
    }

    /// A scrape of the server's `/metrics`.
    pub async fn metrics(&self) -> Metrics {
        let url = format!("http://{}/metrics", self.addr);
        let response = within(IO_TIMEOUT, "/metrics", reqwest::get(url))
            .await
            .expect("/metrics");
        assert_eq!(response.status(), 200);
        Metrics(
            within(IO_TIMEOUT, "/metrics body", response.text())
                .await
                .expect("/metrics body"),
        )
    }

    /// Kills the process with SIGKILL: no shutdown code runs.
    pub async fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            send_signal(&child, Signal::SIGKILL);
            within(IO_TIMEOUT, "the killed server to exit", child.wait())
                .await
                .expect("reaping the server");
        }
    }

    /// Starts the server again on the same port, database and data directory.
    pub async fn restart(&mut self) {
        assert!(self.child.is_none(), "restart needs a stopped server");
        self.spawn().await;
    }

    /// [`Server::restart`] with `extra_args` in place of those it started with.
    pub async fn restart_with(&mut self, extra_args: &[&str]) {
        self.args = extra_args.iter().map(|arg| arg.to_string()).collect();
        self.restart().await;
    }

    /// Sends SIGTERM and waits (up to `limit`) for the process to exit.
    pub async fn terminate(&mut self, limit: Duration) -> ExitStatus {
        let mut child = self.child.take().expect("a running server");
        send_signal(&child, Signal::SIGTERM);
        exit_within(&mut child, limit).await.unwrap_or_else(|| {
            panic!(
                "server did not exit within {limit:?} of SIGTERM; log:\n{}",
                self.log()
            )
        })
    }

    /// The logs of every start of this server, in order.
    pub fn log(&self) -> String {
        (1..=self.starts)
            .map(|n| {
                std::fs::read_to_string(self.dir.join(format!("server-{n}.log")))
                    .unwrap_or_default()
            })
            .collect::<Vec<_>>()
            .join("\n--- restart ---\n")
    }

    pub fn data_path(&self, relative: &str) -> PathBuf {
        self.data_dir.join(relative)
    }

    /// Whether the process is running (not killed or stopped by the test).
    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }
}

/// What one scrape of `/metrics` said.
pub struct Metrics(String);

impl Metrics {
    /// The value of `series` (its name with any labels or suffix, as printed), if present.
    pub fn get(&self, series: &str) -> Option<f64> {
        self.0
            .lines()
            .filter(|line| !line.starts_with('#'))
            .find_map(|line| {
                let (name, value) = line.rsplit_once(' ')?;
                (name == series).then(|| value.parse().expect("a metric's value"))
            })
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        // Nothing can be awaited here: dropping the child SIGKILLs it (`kill_on_drop`), and
        // tokio reaps it in the background.
        drop(self.child.take());
        if std::thread::panicking() {
            eprintln!("server log:\n{}", self.log());
        }
    }
}

/// A notification the test client received.
#[derive(Debug, Clone)]
pub enum Note {
    Progress(ProgressNotificationParam),
    /// A resource changed; `meta` is the notification's `_meta` (the changed task, or a
    /// list's tasks after a resynchronisation).
    ResourceUpdated {
        uri: String,
        meta: Option<Value>,
    },
    Log(LoggingMessageNotificationParam),
}

/// A client handler that records every notification.
#[derive(Clone, Default)]
pub struct Recorder {
    notes: Arc<Mutex<Vec<Note>>>,
}

impl Recorder {
    fn push(&self, note: Note) {
        self.notes.lock().expect("notes lock").push(note);
    }
}

impl ClientHandler for Recorder {
    async fn on_progress(
        &self,
        params: ProgressNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        self.push(Note::Progress(params));
    }

    async fn on_resource_updated(
        &self,
        params: ResourceUpdatedNotificationParam,
        context: NotificationContext<RoleClient>,
    ) {
        // rmcp 3.11 moves a notification's `_meta` out of its params into the notification's
        // extensions, and hands those over before it reads `context.meta` from them.
        let meta = params
            .meta
            .or_else(|| context.extensions.get::<NotificationMetaObject>().cloned())
            .unwrap_or(context.meta)
            .0
            .0;
        let meta = (!meta.is_empty()).then_some(Value::Object(meta));
        self.push(Note::ResourceUpdated {
            uri: params.uri,
            meta,
        });
    }

    async fn on_logging_message(
        &self,
        params: LoggingMessageNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        self.push(Note::Log(params));
    }
}

/// Connects `handler` to `url` as an MCP client (sending `X-Client-Id: client_id` and the bearer
/// `token` when given); `None` when initialize fails or times out.
pub async fn serve_with<H: ClientHandler>(
    url: &str,
    client_id: Option<&str>,
    token: Option<&str>,
    handler: H,
) -> Option<RunningService<RoleClient, H>> {
    let mut config = StreamableHttpClientTransportConfig::with_uri(url.to_owned());
    if let Some(token) = token {
        config = config.auth_header(token);
    }
    if let Some(id) = client_id {
        let mut headers = std::collections::HashMap::new();
        headers.insert(
            http::HeaderName::from_static("x-client-id"),
            id.parse().expect("client id header value"),
        );
        config = config.custom_headers(headers);
    }
    let transport = StreamableHttpClientTransport::from_config(config);
    tokio::time::timeout(IO_TIMEOUT, handler.serve(transport))
        .await
        .ok()?
        .ok()
}

/// A connected MCP client.
pub struct Client {
    pub service: RunningService<RoleClient, Recorder>,
    recorder: Recorder,
}

impl Client {
    /// Connects to `url`, sending `X-Client-Id: client_id` when given.
    pub async fn connect(url: &str, client_id: Option<&str>) -> Client {
        Client::try_connect(url, client_id)
            .await
            .expect("MCP initialize")
    }

    /// Connects like [`Client::connect`], or `None` when initialize fails or times out (a
    /// server being killed under it).
    pub async fn try_connect(url: &str, client_id: Option<&str>) -> Option<Client> {
        Client::try_connect_as(url, client_id, None).await
    }

    /// Connects with `Authorization: Bearer token` on every request.
    pub async fn connect_with_token(url: &str, token: &str) -> Client {
        Client::try_connect_as(url, None, Some(token))
            .await
            .expect("MCP initialize with a token")
    }

    async fn try_connect_as(
        url: &str,
        client_id: Option<&str>,
        token: Option<&str>,
    ) -> Option<Client> {
        let recorder = Recorder::default();
        let service = serve_with(url, client_id, token, recorder.clone()).await?;
        Some(Client { service, recorder })
    }

    /// Every notification received so far.
    pub fn notes(&self) -> Vec<Note> {
        self.recorder.notes.lock().expect("notes lock").clone()
    }

    pub async fn call(&self, tool: &str, args: Value) -> CallToolResult {
        let Value::Object(args) = args else {
            panic!("tool arguments must be an object")
        };
        let params = CallToolRequestParams::new(tool.to_owned()).with_arguments(args);
        within(IO_TIMEOUT, tool, self.service.call_tool(params))
            .await
            .unwrap_or_else(|e| panic!("{tool} failed at the protocol level: {e}"))
    }

    /// Progress values received so far, grouped by progress token in order of first arrival.
    /// (rmcp's client gives every request a progress token of its own.)
    pub fn progress_by_token(&self) -> Vec<Vec<f64>> {
        let mut groups: Vec<(ProgressToken, Vec<f64>)> = Vec::new();
        for note in self.notes() {
            if let Note::Progress(p) = note {
                match groups
                    .iter_mut()
                    .find(|(token, _)| *token == p.progress_token)
                {
                    Some((_, values)) => values.push(p.progress),
                    None => groups.push((p.progress_token, vec![p.progress])),
                }
            }
        }
        groups.into_iter().map(|(_, values)| values).collect()
    }

    /// Waits until some request's progress reached `total`, and returns that request's values,
    /// sorted, once no more arrive. Notifications are handled concurrently with responses, so
    /// they may trail the result.
    pub async fn progress_reaching(&self, total: f64) -> Vec<f64> {
        /// rmcp hands each notification to a tokio task of its own, which records it whenever
        /// the runtime gets to it: `total` may be recorded before values that came earlier on
        /// the stream, so the values are taken once none has been added for this long.
        const QUIET: Duration = Duration::from_millis(500);
        let reaching = || {
            self.progress_by_token()
                .into_iter()
                .find(|values| values.contains(&total))
        };
        within(IO_TIMEOUT, "progress notifications", async {
            let mut seen = loop {
                if let Some(values) = reaching() {
                    break values;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            };
            loop {
                tokio::time::sleep(QUIET).await;
                let mut now = reaching().expect("recorded values stay");
                if now.len() == seen.len() {
                    // Sorted, the values strictly increase exactly when none was delivered
                    // twice.
                    now.sort_by(f64::total_cmp);
                    return now;
                }
                seen = now;
            }
        })
        .await
    }

    /// Calls a tool that must succeed and returns its structured content.
    pub async fn call_ok(&self, tool: &str, args: Value) -> Value {
        let result = self.call(tool, args).await;
        assert_ne!(
            result.is_error,
            Some(true),
            "{tool} returned an error: {result:?}"
        );
        result.structured_content.expect("structured content")
    }

    /// Calls a tool that must fail with a tool error and returns its message.
    pub async fn call_err(&self, tool: &str, args: Value) -> String {
        let result = self.call(tool, args).await;
        assert_eq!(
            result.is_error,
            Some(true),
            "{tool} should have failed: {result:?}"
        );
        text_of(&result)
    }

    /// Reads a resource and parses its JSON text.
    pub async fn read(&self, uri: &str) -> Value {
        let result = within(
            IO_TIMEOUT,
            uri,
            self.service
                .read_resource(ReadResourceRequestParams::new(uri.to_owned())),
        )
        .await
        .unwrap_or_else(|e| panic!("reading {uri}: {e}"));
        let text = match &result.contents[0] {
            rmcp::model::ResourceContents::TextResourceContents { text, .. } => text.clone(),
            other => panic!("{uri} is not text: {other:?}"),
        };
        serde_json::from_str(&text).expect("resource JSON")
    }

    pub async fn task(&self, task_id: &str) -> TaskInfo {
        serde_json::from_value(self.read(&format!("task://status/{task_id}")).await)
            .expect("task JSON")
    }

    /// Polls the task until `done` holds for it.
    pub async fn wait_task(
        &self,
        task_id: &str,
        limit: Duration,
        done: impl Fn(&TaskInfo) -> bool,
    ) -> TaskInfo {
        within(limit, &format!("task {task_id}"), async {
            loop {
                let task = self.task(task_id).await;
                if done(&task) {
                    return task;
                }
                tokio::time::sleep(Duration::from_millis(25)).await;
            }
        })
        .await
    }

    /// Polls the task until it reaches a terminal status.
    pub async fn wait_terminal(&self, task_id: &str, limit: Duration) -> TaskInfo {
        self.wait_task(task_id, limit, |task| task.status.is_terminal())
            .await
    }

    /// The id of the first task `task://list` shows, once there is one (a task started by a
    /// call still in flight).
    pub async fn first_listed_task(&self) -> String {
        within(Duration::from_secs(30), "a task to appear", async {
            loop {
                let list = self.read("task://list").await;
                if let Some(id) = list["tasks"][0]["task_id"].as_str() {
                    return id.to_owned();
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await
    }

    /// Subscribes to `uri` (`resources/subscribe`).
    pub async fn subscribe(&self, uri: &str) {
        #[allow(deprecated)] // deprecated for 2026-07-28; how 2025-11-25 clients follow a task
        let params = SubscribeRequestParams::new(uri.to_owned());
        within(IO_TIMEOUT, "subscribe", self.service.subscribe(params))
            .await
            .unwrap_or_else(|e| panic!("subscribing to {uri}: {e}"));
    }

    pub async fn close(self) {
        let _ = within(IO_TIMEOUT, "client close", self.service.cancel()).await;
    }
}

/// The text content of a tool result, joined.
pub fn text_of(result: &CallToolResult) -> String {
    result
        .content
        .iter()
        .filter_map(|block| block.as_text().map(|text| text.text.clone()))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Runs `command` to completion and returns its output, killing it and failing the test if it
/// takes longer than `limit`.
pub async fn output_within(command: &mut Command, limit: Duration) -> std::process::Output {
    let child = command
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("starting a client");
    // On a timeout the future, and with it the child, is dropped, which kills the child.
    within(limit, "a client to finish", child.wait_with_output())
        .await
        .expect("waiting for a client")
}

/// The stdout of a successful command as JSON; a failure shows the command's stderr.
pub fn output_json(output: &std::process::Output) -> Value {
    assert!(
        output.status.success(),
        "failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).unwrap_or_else(|e| {
        panic!(
            "not JSON ({e}): {}",
            String::from_utf8_lossy(&output.stdout)
        )
    })
}

/// Polls until the server has committed at least `progress` units of the task, straight from
/// a fresh connection: used just before killing a server at a chosen point.
pub async fn wait_progress(client: &Client, task_id: &str, progress: u64) -> TaskInfo {
    client
        .wait_task(task_id, Duration::from_secs(60), |task| {
            task.progress >= progress || task.status == TaskStatus::Completed
        })
        .await
}

/// The task states carried by a client's `resources/updated` notifications for `uri`, in the
/// order received (a resynchronisation contributes a list's tasks at once).
pub fn states(client: &Client, uri: &str) -> Vec<TaskInfo> {
    let mut states = Vec::new();
    for note in client.notes() {
        let Note::ResourceUpdated {
            uri: updated,
            meta: Some(meta),
        } = note
        else {
            continue;
        };
        if updated != uri {
            continue;
        }
        if let Ok(task) = serde_json::from_value::<TaskInfo>(meta[TASK_META_KEY].clone()) {
            states.push(task);
        } else if let Ok(tasks) =
            serde_json::from_value::<Vec<TaskInfo>>(meta[TASK_LIST_META_KEY].clone())
        {
            states.extend(tasks);
        }
    }
    states
}

/// Polls `done` until it gives a value; on timeout, fails showing what `client` received.
pub async fn eventually<T>(client: &Client, what: &str, done: impl Fn() -> Option<T>) -> T {
    let deadline = tokio::time::Instant::now() + IO_TIMEOUT;
    loop {
        if let Some(value) = done() {
            return value;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}; notifications received: {:#?}",
            client.notes()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// How long a task of the crash and fleet suites may take to finish.
pub const TASK_LIMIT: Duration = Duration::from_secs(120);

/// Runs `tool(args)` on a fresh server without interruption and returns the finished task,
/// with the server (its data directory holds the task's files) and what keeps it alive: what
/// an interrupted run's outcome is compared with.
pub async fn uninterrupted(
    scale: &str,
    tool: &str,
    args: &Value,
) -> (tempfile::TempDir, Server, TaskInfo) {
    let dir = tempfile::tempdir().expect("temporary directory");
    let server = Server::start(dir.path(), &["--time-scale", scale]).await;
    let client = Client::connect(&server.mcp_url(), Some("baseline")).await;
    let started = client.call_ok(tool, args.clone()).await;
    let task = client
        .wait_terminal(started["task_id"].as_str().expect("a task id"), TASK_LIMIT)
        .await;
    client.close().await;
    assert_eq!(task.status, TaskStatus::Completed, "{task:?}");
    (dir, server, task)
}
