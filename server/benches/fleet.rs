//! Prints what running on PostgreSQL, and as a fleet, costs and buys, each figure beside a
//! baseline measured in the same run (the machine is shared and noisy, so only the ratios mean
//! much; nothing here asserts on time):
//!
//! 1. `start_*` throughput (instant tasks, 16 sessions x 16 requests in flight) and step
//!    commits per second (32 tasks of zero-delay steps) on SQLite (the baseline), on
//!    PostgreSQL with one node, and with three nodes on one database (in-process servers, the
//!    sessions spread over them);
//! 2. fail-over: three `durable-mcp` processes on one database, the node advancing a task
//!    SIGKILLed, and the time until another node commits a step of it, against `--lease-ttl`;
//! 3. replaying 10,000 missed events to a client resuming with `Last-Event-ID`, on PostgreSQL
//!    against SQLite.
//!
//! Needs a PostgreSQL server for its scratch databases: `DURABLE_MCP_TEST_POSTGRES` (as
//! `scripts/test` sets it). Run with `cargo bench -p durable-mcp-server --bench fleet` (about a
//! minute on 2 cores, after building the `durable-mcp` binary).

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use durable_mcp_server::store::Database;
use durable_mcp_server::store::postgres::scratch::{ScratchDatabase, TEST_SERVER_VAR};
use durable_mcp_server::streams::{NewEvent, StreamStore};
use serde_json::{Value, json};
use support::{Served, Session, call, serve};
use tokio::io::AsyncBufReadExt;
use tokio_util::sync::CancellationToken;

mod support;

const SESSIONS: usize = 16;
const IN_FLIGHT: usize = 16;
const WARM_UP: Duration = Duration::from_millis(500);
const MEASURED: Duration = Duration::from_secs(3);
/// Tasks whose steps are counted, each with more zero-delay steps than the window can commit.
const STEPPING_TASKS: usize = 32;
const MISSED: u64 = 10_000;
/// The fail-over run's lease: short, so that the run is quick; the figure is read against it.
const LEASE_TTL: Duration = Duration::from_secs(2);
const PATIENCE: Duration = Duration::from_secs(60);

fn instant_start(id: u64) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {
           "name": "start_batch_processing",
           "arguments": {"batch_size": 1, "total_items": 1, "processing_delay": 0}}})
}

async fn task(session: &Session, id: &str) -> Value {
    let read = call(
        session,
        json!({"jsonrpc": "2.0", "id": 1, "method": "resources/read",
               "params": {"uri": format!("task://status/{id}")}}),
    )
    .await;
    serde_json::from_str(read["contents"][0]["text"].as_str().unwrap()).unwrap()
}

fn row(label: &str, value: String, ratio: f64, note: &str) {
    let line = format!("  {label:<40} {value:>13} {ratio:>8.2}x  {note}");
    println!("{}", line.trim_end());
}

/// Nodes serving one database in this process.
struct Nodes {
    served: Vec<Served>,
}

impl Nodes {
    async fn start(database: &Database, count: usize, dir: &Path) -> Nodes {
        let mut served = Vec::new();
        for n in 0..count {
            let mut config = support::config(&dir.join("unused.db"), &dir.join("data"));
            config.database = database.clone();
            config.node_id = format!("bench-{n}");
            served.push(serve(config).await);
        }
        Nodes { served }
    }

    /// `SESSIONS` sessions, spread over the nodes in turn.
    async fn sessions(&self) -> Vec<Session> {
        let mut sessions = Vec::with_capacity(SESSIONS);
        for n in 0..SESSIONS {
            let url = self.served[n % self.served.len()].url.clone();
            sessions.push(Session::open(url).await);
        }
        sessions
    }

    async fn stop(self) {
        for served in self.served {
            served.stop().await;
        }
    }
}

/// Instant tasks started per second: every session keeps `IN_FLIGHT` starts going.
async fn starts_per_second(sessions: &[Session]) -> f64 {
    // JSON-RPC ids must not repeat among a session's requests in flight.
    let ids = Arc::new(AtomicU64::new(1));
    let counted = Arc::new(AtomicU64::new(0));
    let counting_from = Instant::now() + WARM_UP;
    let deadline = counting_from + MEASURED;
    let workers: Vec<_> = sessions
        .iter()
        .flat_map(|session| std::iter::repeat_n(session, IN_FLIGHT))
        .map(|session| {
            let (session, ids, counted) = (session.clone(), ids.clone(), counted.clone());
            tokio::spawn(async move {
                while Instant::now() < deadline {
                    call(&session, instant_start(ids.fetch_add(1, Ordering::Relaxed))).await;
                    let now = Instant::now();
                    if now >= counting_from && now < deadline {
                        counted.fetch_add(1, Ordering::Relaxed);
                    }
                }
            })
        })
        .collect();
    for worker in workers {
        worker.await.expect("load worker");
    }
    counted.load(Ordering::Relaxed) as f64 / MEASURED.as_secs_f64()
}

/// Step commits per second of `STEPPING_TASKS` tasks of zero-delay steps, from the steps the
/// tasks report before and after the window.
async fn steps_per_second(sessions: &[Session]) -> f64 {
    let mut ids = Vec::new();
    for n in 0..STEPPING_TASKS {
        let started = call(
            &sessions[n % sessions.len()],
            json!({"jsonrpc": "2.0", "id": n, "method": "tools/call", "params": {
                   "name": "start_batch_processing",
                   "arguments": {"batch_size": 1, "total_items": 1_000_000, "processing_delay": 0}}}),
        )
        .await;
        ids.push(
            started["structuredContent"]["task_id"]
                .as_str()
                .unwrap()
                .to_owned(),
        );
    }
    let steps = |ids: Vec<String>| async move {
        let mut total = 0;
        for id in &ids {
            total += task(&sessions[0], id).await["step"].as_u64().unwrap();
        }
        total
    };
    tokio::time::sleep(WARM_UP).await;
    let before = steps(ids.clone()).await;
    let started = Instant::now();
    tokio::time::sleep(MEASURED).await;
    let after = steps(ids.clone()).await;
    let rate = (after - before) as f64 / started.elapsed().as_secs_f64();
    for id in &ids {
        call(
            &sessions[0],
            json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                   "params": {"name": "cancel_task", "arguments": {"task_id": id}}}),
        )
        .await;
    }
    rate
}

async fn throughput(dir: &Path, admin_url: &str) {
    println!(
        "start_* and step commits ({SESSIONS} sessions x {IN_FLIGHT} in flight; \
         {STEPPING_TASKS} stepping tasks)"
    );
    let mut baseline = None;
    for (label, nodes) in [
        ("SQLite, 1 node", 1),
        ("PostgreSQL, 1 node", 1),
        ("PostgreSQL, 3 nodes", 3),
    ] {
        let scratch;
        let database = if label.starts_with("SQLite") {
            Database::Sqlite(dir.join("throughput.db"))
        } else {
            scratch = ScratchDatabase::create(admin_url).await.unwrap();
            Database::Postgres(scratch.url().to_owned())
        };
        let nodes = Nodes::start(&database, nodes, dir).await;
        let sessions = nodes.sessions().await;
        let starts = starts_per_second(&sessions).await;
        let steps = steps_per_second(&sessions).await;
        nodes.stop().await;
        let (base_starts, base_steps) = *baseline.get_or_insert((starts, steps));
        let note = if baseline == Some((starts, steps)) {
            "baseline"
        } else {
            ""
        };
        row(
            &format!("start_* / s, {label}"),
            format!("{starts:.0}"),
            starts / base_starts,
            note,
        );
        row(
            &format!("step commits / s, {label}"),
            format!("{steps:.0}"),
            steps / base_steps,
            note,
        );
    }
}

/// The `durable-mcp` binary of this profile, built first.
fn server_binary() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let profile_dir = exe.parent().and_then(Path::parent).unwrap().to_owned();
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
    if profile_dir
        .file_name()
        .is_some_and(|name| name == "release")
    {
        build.arg("--release");
    }
    assert!(build.status().unwrap().success(), "building durable-mcp");
    profile_dir.join("durable-mcp")
}

/// A `durable-mcp` process of the fail-over run.
struct Process {
    child: tokio::process::Child,
    url: String,
}

async fn spawn_node(binary: &Path, url: &str, node: &str, data: &Path) -> Process {
    let ttl = format!("{}s", LEASE_TTL.as_secs());
    let mut child = tokio::process::Command::new(binary)
        .args([
            "--host",
            "127.0.0.1",
            "--port",
            "0",
            "--dashboard-dir",
            "/nonexistent",
        ])
        .args([
            "--database-url",
            url,
            "--node-id",
            node,
            "--lease-ttl",
            &ttl,
        ])
        .arg("--data-dir")
        .arg(data)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let line = tokio::time::timeout(PATIENCE, async {
        tokio::io::BufReader::new(stdout).lines().next_line().await
    })
    .await
    .expect("the node starts")
    .unwrap()
    .unwrap();
    let url = line
        .strip_prefix("durable-mcp listening on ")
        .unwrap()
        .to_owned();
    Process { child, url }
}

async fn failover(dir: &Path, admin_url: &str) {
    let binary = server_binary();
    let scratch = ScratchDatabase::create(admin_url).await.unwrap();
    let data = dir.join("failover-data");
    let mut nodes = Vec::new();
    for n in 0..3 {
        nodes.push(spawn_node(&binary, scratch.url(), &format!("node-{n}"), &data).await);
    }
    let first = Session::open(nodes[0].url.clone()).await;
    // Steps of 50 ms: the task commits often, so its next step on another node shows at once.
    let started = call(
        &first,
        json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {
               "name": "start_batch_processing",
               "arguments": {"batch_size": 1, "total_items": 1_000_000, "processing_delay": 0.05}}}),
    )
    .await;
    let id = started["structuredContent"]["task_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let mut samples = Vec::new();
    for round in 0..3 {
        // Every node is up at the start of a round (the one killed last was restarted on a new
        // port), so any of them can be asked.
        let observer = Session::open(nodes[round % 3].url.clone()).await;
        let before = loop {
            let info = task(&observer, &id).await;
            if info["status"] == "running" && info["step"].as_u64().unwrap() > 0 {
                break info;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        let holder = before["node"].as_str().unwrap().to_owned();
        let index: usize = holder.strip_prefix("node-").unwrap().parse().unwrap();
        // Observe through a node that stays up.
        let watch = Session::open(nodes[(index + 1) % 3].url.clone()).await;
        nodes[index].child.start_kill().unwrap();
        let killed = Instant::now();
        let _ = nodes[index].child.wait().await;
        let step = before["step"].as_u64().unwrap();
        let took = tokio::time::timeout(PATIENCE, async {
            loop {
                let info = task(&watch, &id).await;
                if info["node"] != holder && info["step"].as_u64().unwrap() > step {
                    return killed.elapsed();
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await
        .expect("another node takes the task over");
        samples.push(took);
        nodes[index] = spawn_node(&binary, scratch.url(), &holder, &data).await;
        if round == 0 {
            println!(
                "fail-over: SIGKILL of the node advancing a task until another commits its next step"
            );
        }
    }
    samples.sort();
    let median = samples[samples.len() / 2];
    row(
        "--lease-ttl",
        format!("{:.0} ms", LEASE_TTL.as_secs_f64() * 1e3),
        1.0,
        "baseline",
    );
    row(
        "fail-over, median of 3",
        format!("{:.0} ms", median.as_secs_f64() * 1e3),
        median.as_secs_f64() / LEASE_TTL.as_secs_f64(),
        &format!("each: {samples:?}"),
    );
}

fn event(stream_id: &str, session: &str, n: u64) -> NewEvent {
    NewEvent {
        stream_id: stream_id.to_owned(),
        session_id: Some(session.to_owned()),
        message: Some(
            json!({"jsonrpc": "2.0", "method": "notifications/message",
                   "params": {"level": "info", "data": format!("event {n}")}})
            .to_string(),
        ),
        retry_ms: None,
        finishes: false,
        binding: None,
        opens: true,
    }
}

/// Stores `MISSED` events on a session's standalone stream after the id a client holds, and
/// times the client's GET with `Last-Event-ID` until the last one arrives.
async fn replay(database: Database, dir: &Path) -> f64 {
    let mut config = support::config(&dir.join("unused.db"), &dir.join("data"));
    config.database = database.clone();
    let served = serve(config).await;
    let session = Session::open(served.url.clone()).await;
    let writer = StreamStore::new(
        durable_mcp_server::store::Store::connect(&database, "bench-writer")
            .await
            .unwrap(),
        "bench-writer",
        CancellationToken::new(),
    );
    let stream_id = format!("{}:common", session.session);
    let first = writer
        .append(event(&stream_id, &session.session, 0))
        .await
        .unwrap();
    let appends = (1..=MISSED).map(|n| writer.append(event(&stream_id, &session.session, n)));
    // In order: a stream's seqs follow its appends.
    for append in appends {
        append.await.unwrap();
    }
    let started = Instant::now();
    session
        .receive_replay(&first.to_string(), MISSED as usize)
        .await;
    let elapsed = started.elapsed().as_secs_f64();
    served.stop().await;
    elapsed
}

async fn replays(dir: &Path, admin_url: &str) {
    println!("replaying {MISSED} missed events to a client resuming with Last-Event-ID");
    let sqlite = replay(Database::Sqlite(dir.join("replay.db")), dir).await;
    let scratch = ScratchDatabase::create(admin_url).await.unwrap();
    let postgres = replay(Database::Postgres(scratch.url().to_owned()), dir).await;
    row("SQLite", format!("{:.1} ms", sqlite * 1e3), 1.0, "baseline");
    row(
        "PostgreSQL",
        format!("{:.1} ms", postgres * 1e3),
        postgres / sqlite,
        "",
    );
}

fn main() {
    let Ok(admin_url) = std::env::var(TEST_SERVER_VAR) else {
        // `cargo bench` runs every bench; without a server this one has nothing to measure.
        println!(
            "fleet: skipped; set {TEST_SERVER_VAR} to a PostgreSQL server whose role may create \
             databases (scripts/test's default: \
             postgres://durable_test:durable_test@127.0.0.1:5432/postgres)"
        );
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        throughput(dir.path(), &admin_url).await;
        failover(dir.path(), &admin_url).await;
        replays(dir.path(), &admin_url).await;
    });
}
