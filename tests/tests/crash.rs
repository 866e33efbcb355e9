//! Crash tests: the server is killed with SIGKILL at several points of each task kind and
//! restarted; every task must finish with exactly the result of an uninterrupted run (no step
//! repeated, none skipped).

use std::time::Duration;

use durable_shared::{TaskInfo, TaskStatus};
use durable_tests::{Client, Server, TASK_LIMIT, uninterrupted, wait_progress, within};
use rmcp::model::CallToolRequestParams;
use serde_json::{Value, json};

/// Runs `tool(args)` and SIGKILLs the server once the task's progress reaches each of
/// `kill_at`, restarting it each time; returns the finished task.
async fn interrupted(
    scale: &str,
    tool: &str,
    args: &Value,
    kill_at: &[u64],
) -> (tempfile::TempDir, Server, TaskInfo) {
    let dir = tempfile::tempdir().unwrap();
    let mut server = Server::start(dir.path(), &["--time-scale", scale]).await;
    let client = Client::connect(&server.mcp_url(), Some("crash-test")).await;
    let started = client.call_ok(tool, args.clone()).await;
    let id = started["task_id"].as_str().unwrap().to_owned();
    let mut client = Some(client);
    for &point in kill_at {
        let watcher = client.take().unwrap();
        let task = wait_progress(&watcher, &id, point).await;
        assert_ne!(
            task.status,
            TaskStatus::Completed,
            "task finished before the kill at {point}"
        );
        server.kill9().await;
        drop(watcher);
        server.restart().await;
        client = Some(Client::connect(&server.mcp_url(), Some("crash-test")).await);
    }
    let client = client.unwrap();
    let task = client.wait_terminal(&id, TASK_LIMIT).await;
    client.close().await;
    assert_eq!(
        worker_runs(&server, &id),
        kill_at.len() + 1,
        "one worker per start:\n{}",
        server.log()
    );
    (dir, server, task)
}

/// How many times a worker ran task `id`, over all of the server's starts: one more than the
/// kills exactly when every kill found the task unfinished (and no start ran it twice).
fn worker_runs(server: &Server, id: &str) -> usize {
    worker_lines(&server.log(), id).count()
}

/// The "worker running" lines of task `id` in `log`, one per run of a worker.
fn worker_lines<'a>(log: &'a str, id: &'a str) -> impl DoubleEndedIterator<Item = &'a str> {
    log.lines()
        .filter(move |line| line.contains("worker running") && line.contains(id))
}

/// The step the latest worker of task `id` began from, from its "worker running" log line.
fn last_worker_began_at(server: &Server, id: &str) -> u64 {
    let log = server.log();
    let line = worker_lines(&log, id)
        .next_back()
        .expect("a worker ran the task");
    // The event's own fields come last, after those of any span it is in.
    line.split_whitespace()
        .rev()
        .find_map(|word| word.strip_prefix("step="))
        .and_then(|step| step.parse().ok())
        .unwrap_or_else(|| panic!("no step in {line:?}"))
}

fn assert_same_outcome(crashed: &TaskInfo, clean: &TaskInfo, steps: u64) {
    assert_eq!(crashed.status, TaskStatus::Completed, "{crashed:?}");
    assert_eq!(crashed.result_data, clean.result_data);
    assert_eq!(
        (crashed.progress, crashed.total),
        (clean.progress, clean.total)
    );
    // One commit per step: a repeated step would show up as an extra one.
    assert_eq!((crashed.step, clean.step), (steps, steps));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migration_writes_each_record_exactly_once_across_kills() {
    let args = json!({"source_path": "sample:customers", "destination_path": "out/customers.jsonl", "record_count": 2000});
    let (clean, crashed) = tokio::join!(
        uninterrupted("0.02", "start_data_migration", &args),
        interrupted("0.02", "start_data_migration", &args, &[300, 900, 1500]),
    );
    assert_same_outcome(&crashed.2, &clean.2, 20);
    let written = std::fs::read(crashed.1.data_path("out/customers.jsonl")).unwrap();
    let expected = std::fs::read(clean.1.data_path("out/customers.jsonl")).unwrap();
    assert!(
        written == expected,
        "destination differs from an uninterrupted run"
    );
    let ids: Vec<u64> = String::from_utf8(written)
        .unwrap()
        .lines()
        .map(|line| {
            serde_json::from_str::<Value>(line).unwrap()["id"]
                .as_u64()
                .unwrap()
        })
        .collect();
    assert_eq!(ids, (1..=2000).collect::<Vec<_>>());
}

/// With no simulated delay the kills land anywhere, including between a batch's write and its
/// checkpoint commit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migration_without_delays_survives_kills_mid_write() {
    let dir = tempfile::tempdir().unwrap();
    let source: String = (0..30_000)
        .map(|i| format!("{{\"n\":{i},\"pad\":\"{}\"}}\n", "x".repeat(i % 40)))
        .collect();
    std::fs::create_dir_all(dir.path().join("data")).unwrap();
    std::fs::write(dir.path().join("data/in.jsonl"), &source).unwrap();
    let mut server = Server::start(dir.path(), &["--time-scale", "0"]).await;
    let client = Client::connect(&server.mcp_url(), None).await;
    let started = client
        .call_ok(
            "start_data_migration",
            json!({"source_path": "in.jsonl", "destination_path": "out.jsonl", "record_count": 25_000}),
        )
        .await;
    let id = started["task_id"].as_str().unwrap().to_owned();
    let mut client = Some(client);
    let kill_at = [2_000, 9_000, 17_000];
    for point in kill_at {
        let watcher = client.take().unwrap();
        let task = wait_progress(&watcher, &id, point).await;
        assert_ne!(
            task.status,
            TaskStatus::Completed,
            "finished before the kill at {point}"
        );
        server.kill9().await;
        server.restart().await;
        client = Some(Client::connect(&server.mcp_url(), None).await);
    }
    let client = client.unwrap();
    let task = client.wait_terminal(&id, TASK_LIMIT).await;
    assert_eq!(task.status, TaskStatus::Completed, "{task:?}");
    assert_eq!(
        worker_runs(&server, &id),
        kill_at.len() + 1,
        "unfinished at every kill"
    );
    assert_eq!(task.step, 250);
    let written = std::fs::read_to_string(server.data_path("out.jsonl")).unwrap();
    let numbers: Vec<u64> = written
        .lines()
        .map(|line| {
            serde_json::from_str::<Value>(line).unwrap()["n"]
                .as_u64()
                .unwrap()
        })
        .collect();
    assert_eq!(numbers, (0..25_000).collect::<Vec<_>>());
    client.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batch_processing_digest_is_unchanged_by_kills() {
    let args = json!({"batch_size": 100, "total_items": 5000, "processing_delay": 1});
    let (clean, crashed) = tokio::join!(
        uninterrupted("0.02", "start_batch_processing", &args),
        interrupted("0.02", "start_batch_processing", &args, &[1000, 2500, 4000]),
    );
    assert_same_outcome(&crashed.2, &clean.2, 50);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn training_metrics_are_unchanged_by_kills() {
    let args = json!({"model_name": "crash-model", "dataset_size": 2000, "epochs": 40});
    let (clean, crashed) = tokio::join!(
        uninterrupted("0.002", "start_ml_training", &args),
        interrupted("0.002", "start_ml_training", &args, &[10, 20, 30]),
    );
    assert_same_outcome(&crashed.2, &clean.2, 40);
    assert_eq!(
        crashed.2.result_data.unwrap()["history"]
            .as_array()
            .unwrap()
            .len(),
        40
    );
}

/// The in-request job: its caller's connection dies with the server; the task resumes by itself
/// after the restart, the caller's call is answered through its resumed stream, and calling
/// again with the same arguments returns the same result.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resumable_processing_continues_after_a_kill_and_repeat_call_attaches() {
    let dir = tempfile::tempdir().unwrap();
    let mut server = Server::start(dir.path(), &["--time-scale", "0.02"]).await;
    let args = json!({"dataset_name": "ledger", "total_records": 200, "batch_size": 10, "client_id": "cli-1"});
    let baseline_args = json!({"dataset_name": "ledger", "total_records": 200, "batch_size": 10, "client_id": "baseline"});

    let caller = Client::connect(&server.mcp_url(), None).await;
    let call = tokio::spawn({
        let Value::Object(args) = args.clone() else {
            unreachable!("arguments are an object")
        };
        let params = CallToolRequestParams::new("resumable_data_processing").with_arguments(args);
        // Straight on the service: the harness's own deadline would turn a hang into an error.
        async move {
            let answer = caller.service.call_tool(params).await;
            (caller, answer)
        }
    });
    let watcher = Client::connect(&server.mcp_url(), None).await;
    let id = watcher.first_listed_task().await;
    wait_progress(&watcher, &id, 60).await;
    server.kill9().await;
    drop(watcher);
    // Unpaced, the resumed task commits its remaining batches (14 at most) faster than the
    // relay writes their notifications: the relay must be watching before the task resumes,
    // and hear of every batch, not only of the latest.
    server.restart_with(&["--time-scale", "0"]).await;
    // The caller's own call, cut by the kill, resumes its stream with Last-Event-ID and gets the
    // answer the restarted server's relay finished it with.
    let (caller, original) = within(Duration::from_secs(60), "the interrupted call", call)
        .await
        .expect("the call's task");
    let original = original.expect("the interrupted call is answered after the restart");
    let original = original.structured_content.expect("structured content");
    assert_eq!(original["task_id"], json!(id));
    assert_eq!(original["total_processed"], json!(200));
    // The call's own progress, across the kill, each value once: the resumed stream replays what
    // the killed server stored (in order, so a prefix of the batches), and the restarted
    // server's relay sends the task's state when it restarted and every batch after it. Between
    // the two, batches may be missing that the killed server committed while its handler's
    // notifications of them were still on their way to the store: no process can send those.
    let progress = caller.progress_reaching(200.0).await;
    let resumed = (last_worker_began_at(&server, &id) * 10) as f64;
    let batches = |from: f64, to: f64| -> Vec<f64> {
        (0..=20)
            .map(|batch| f64::from(batch * 10))
            .filter(|value| (from..=to).contains(value))
            .collect()
    };
    let (stored, relayed): (Vec<f64>, Vec<f64>) =
        progress.iter().partition(|&&value| value < resumed);
    assert_eq!(
        relayed,
        batches(resumed, 200.0),
        "every batch from the restart on ({progress:?})"
    );
    let last_stored = stored.last().copied().unwrap_or(-1.0);
    assert_eq!(
        stored,
        batches(0.0, last_stored),
        "every batch up to the last the killed server stored ({progress:?})"
    );
    caller.close().await;

    let client = Client::connect(&server.mcp_url(), None).await;
    let resumed = client.call_ok("resumable_data_processing", args).await;
    assert_eq!(resumed["task_id"], json!(id));
    assert_eq!(resumed["total_processed"], json!(200));
    let baseline = client
        .call_ok("resumable_data_processing", baseline_args)
        .await;
    assert_ne!(baseline["task_id"], resumed["task_id"]);
    assert_eq!(baseline["value_sum"], resumed["value_sum"]);
    assert_eq!(baseline["records"], resumed["records"]);
    let task = client.task(&id).await;
    assert_eq!(task.step, 20, "every batch committed once");
    client.close().await;
}
