//! Prints the engine's step-commit throughput and the latency of a `start_*` tool call, each
//! against a baseline measured in the same run (the machine is shared and noisy, so only the
//! ratios mean much):
//!
//! - step commits: the engine running no-op tasks, and its store committing steps directly,
//!   against a bare rusqlite loop doing one durable UPDATE per transaction with the same pragmas;
//! - requests: `tools/call start_batch_processing`, a task-augmented `run_batch_processing`,
//!   `tasks/get` and `tools/list` against `ping` on the same MCP session.
//!
//! Run with `cargo bench -p durable-mcp`.

use std::time::{Duration, Instant};

use durable_mcp_server::engine::count::{Count, CountTo};
use durable_mcp_server::store::{Claimant, StepCommit, Store};
use durable_shared::kinds::KindSpec;
use serde_json::{Value, json};
use support::{Session, serve};

mod support;

const STEPS_PER_TASK: u64 = 200;
const CONCURRENT_TASKS: u64 = 64;
const BARE_COMMITS: u64 = 2_000;
const CALLS: usize = 300;

fn bare_rusqlite(path: &std::path::Path) -> f64 {
    let conn = rusqlite::Connection::open(path).unwrap();
    conn.pragma_update(None, "journal_mode", "WAL").unwrap();
    conn.pragma_update(None, "synchronous", "FULL").unwrap();
    conn.execute_batch(
        "CREATE TABLE t (id TEXT PRIMARY KEY, step INTEGER, progress INTEGER, message TEXT, checkpoint TEXT);
         INSERT INTO t VALUES ('a', 0, 0, '', '{}');",
    )
    .unwrap();
    let started = Instant::now();
    for step in 1..=BARE_COMMITS {
        conn.execute(
            "UPDATE t SET step = ?1, progress = ?1, message = ?2, checkpoint = ?3 WHERE id = 'a'",
            rusqlite::params![step, format!("{step}"), format!("{{\"done\":{step}}}")],
        )
        .unwrap();
    }
    BARE_COMMITS as f64 / started.elapsed().as_secs_f64()
}

async fn store_commits(store: &Store, tasks: u64) -> f64 {
    let mut ids = Vec::new();
    for i in 0..tasks {
        let id = format!("store-{tasks}-{i}");
        store
            .insert_task(Count::task(&id, "bench", STEPS_PER_TASK))
            .await
            .unwrap();
        let claimed = store.claim_task(&id, &bench_node()).await.unwrap().unwrap();
        ids.push((claimed.info, claimed.lease));
    }
    let started = Instant::now();
    let workers = ids.into_iter().map(|(mut task, lease)| {
        let store = store.clone();
        tokio::spawn(async move {
            for step in 1..=STEPS_PER_TASK {
                let commit = StepCommit {
                    task,
                    lease,
                    step,
                    checkpoint: json!(step).to_string(),
                    progress: step,
                    message: format!("{step}/{STEPS_PER_TASK}"),
                    result: None,
                    question: None,
                };
                task = store.commit_step(commit).await.unwrap().unwrap();
            }
        })
    });
    futures::future::join_all(workers).await;
    (tasks * STEPS_PER_TASK) as f64 / started.elapsed().as_secs_f64()
}

/// The one node of every benchmark here.
fn bench_node() -> Claimant {
    Claimant {
        node: "bench".into(),
        ttl: Duration::from_secs(10),
    }
}

async fn engine_steps(dir: &std::path::Path) -> f64 {
    let store = Store::open(&dir.join("engine.db")).unwrap();
    let (engine, _) = Count::engine(store, dir, bench_node(), CONCURRENT_TASKS as usize)
        .await
        .unwrap();
    let mut events = engine.subscribe();
    let started = Instant::now();
    for _ in 0..CONCURRENT_TASKS {
        engine
            .start(
                Count::NAME,
                "bench",
                json!(CountTo {
                    steps: STEPS_PER_TASK
                }),
            )
            .await
            .unwrap();
    }
    let mut completed = 0;
    while completed < CONCURRENT_TASKS {
        match events.recv().await {
            Ok(event) if event.task.status == durable_shared::TaskStatus::Completed => {
                completed += 1
            }
            Ok(_) => {}
            Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
            Err(e) => panic!("{e}"),
        }
    }
    (CONCURRENT_TASKS * STEPS_PER_TASK) as f64 / started.elapsed().as_secs_f64()
}

/// Latencies of `CALLS` requests built by `body`, sorted.
async fn time(session: &Session, body: impl Fn(usize) -> Value) -> Vec<Duration> {
    let mut latencies = Vec::with_capacity(CALLS);
    for i in 0..CALLS {
        let started = Instant::now();
        let reply = session.post(body(i)).await;
        latencies.push(started.elapsed());
        assert!(reply.contains("\"result\""), "unexpected reply {reply}");
    }
    latencies.sort();
    latencies
}

fn quantile(sorted: &[Duration], q: f64) -> Duration {
    sorted[((sorted.len() - 1) as f64 * q).round() as usize]
}

/// The task id in the SSE reply to a task-augmented `tools/call`.
fn created_task_id(reply: &str) -> String {
    let data = reply
        .lines()
        .find_map(|line| line.strip_prefix("data: {"))
        .expect("a reply event");
    let message: Value = serde_json::from_str(&format!("{{{data}")).unwrap();
    message["result"]["task"]["taskId"]
        .as_str()
        .expect("a task handle")
        .to_owned()
}

async fn tool_latency(dir: &std::path::Path) -> Vec<(&'static str, Vec<Duration>)> {
    let served = serve(support::config(&dir.join("http.db"), &dir.join("data"))).await;
    let session = Session::open(served.url.clone()).await;
    // Warm up connections and caches before measuring either side.
    time(
        &session,
        |i| json!({"jsonrpc": "2.0", "id": i + 1, "method": "ping"}),
    )
    .await;
    let ping = time(
        &session,
        |i| json!({"jsonrpc": "2.0", "id": i + 1_000, "method": "ping"}),
    )
    .await;
    let start = time(&session, |i| {
        json!({"jsonrpc": "2.0", "id": i + 2_000, "method": "tools/call", "params": {
                "name": "start_batch_processing",
                "arguments": {"batch_size": 10, "total_items": 10, "processing_delay": 0}}})
    })
    .await;
    let create = time(&session, |i| {
        json!({"jsonrpc": "2.0", "id": i + 3_000, "method": "tools/call", "params": {
                "name": "run_batch_processing", "task": {},
                "arguments": {"batch_size": 10, "total_items": 10, "processing_delay": 0}}})
    })
    .await;
    let reply = session
        .post(
            json!({"jsonrpc": "2.0", "id": 4_000, "method": "tools/call", "params": {
            "name": "run_batch_processing", "task": {},
            "arguments": {"batch_size": 10, "total_items": 10, "processing_delay": 0}}}),
        )
        .await;
    let task_id = created_task_id(&reply);
    let get = time(&session, |i| {
        json!({"jsonrpc": "2.0", "id": i + 5_000, "method": "tasks/get",
               "params": {"taskId": task_id}})
    })
    .await;
    let list_tools = time(
        &session,
        |i| json!({"jsonrpc": "2.0", "id": i + 6_000, "method": "tools/list"}),
    )
    .await;
    served.stop().await;
    vec![
        ("ping (baseline)", ping),
        ("start_batch_processing", start),
        ("run_batch_processing task", create),
        ("tasks/get", get),
        ("tools/list", list_tools),
    ]
}

fn main() {
    let dir = tempfile::tempdir().unwrap();
    let runtime = tokio::runtime::Runtime::new().unwrap();

    let bare = bare_rusqlite(&dir.path().join("bare.db"));
    let store = Store::open(&dir.path().join("store.db")).unwrap();
    let (store_one, store_many, engine) = runtime.block_on(async {
        (
            store_commits(&store, 1).await,
            store_commits(&store, CONCURRENT_TASKS).await,
            engine_steps(dir.path()).await,
        )
    });
    println!("step commits (durable: WAL, synchronous=FULL)");
    println!(
        "  bare rusqlite, 1 UPDATE per transaction   {bare:>9.0} commits/s   1.00x (baseline)"
    );
    println!(
        "  store.commit_step, 1 task                 {store_one:>9.0} commits/s   {:.2}x",
        store_one / bare
    );
    println!(
        "  store.commit_step, {CONCURRENT_TASKS} tasks at once      {store_many:>9.0} commits/s   {:.2}x",
        store_many / bare
    );
    println!(
        "  engine, {CONCURRENT_TASKS} no-op tasks x {STEPS_PER_TASK} steps      {engine:>9.0} steps/s     {:.2}x",
        engine / bare
    );

    let latencies = runtime.block_on(tool_latency(dir.path()));
    let ping = quantile(&latencies[0].1, 0.5).as_secs_f64();
    println!("MCP request latency over HTTP, {CALLS} sequential requests on one session");
    for (name, sorted) in &latencies {
        println!(
            "  {name:<26} p50 {:>8.2?}  p99 {:>8.2?}  p50 ratio {:.2}x",
            quantile(sorted, 0.5),
            quantile(sorted, 0.99),
            quantile(sorted, 0.5).as_secs_f64() / ping
        );
    }
}
