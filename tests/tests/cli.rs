//! The command-line client (`durable-mcp task ...`, `durable-mcp stats`) against the real
//! server: each kind started and followed to completion, listing, steering, `--json` output and
//! exit codes.

use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use durable_tests::{Server, exit_within, output_json as json, server_binary, stdout_lines};
use serde_json::Value;

/// Runs the client with its state in `state` against `server`.
fn cli(server: &Server, state: &Path, args: &[&str]) -> Output {
    durable_tests::output_within(
        Command::new(server_binary())
            .args(args)
            .args(["--server", &server.mcp_url(), "--state-file"])
            .arg(state),
        std::time::Duration::from_secs(120),
    )
}

fn wait_status(server: &Server, state: &Path, task_id: &str, status: &str) -> Value {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let task = json(&cli(server, state, &["task", "show", task_id, "--json"]));
        if task["status"] == status {
            return task;
        }
        assert!(
            Instant::now() < deadline,
            "task {task_id} never became {status}: {task}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn each_kind_starts_lists_and_completes_from_the_command_line() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path(), &["--time-scale", "0.005"]);
    let state = dir.path().join("client.json");
    let starts: [&[&str]; 3] = [
        &[
            "task",
            "start",
            "data-migration",
            "--record-count",
            "300",
            "--json",
        ],
        &[
            "task",
            "start",
            "batch-processing",
            "--batch-size",
            "5",
            "--total-items",
            "20",
            "--processing-delay",
            "1",
            "--json",
        ],
        &[
            "task",
            "start",
            "ml-training",
            "--model-name",
            "cli",
            "--dataset-size",
            "200",
            "--epochs",
            "10",
            "--json",
        ],
    ];
    let mut ids = Vec::new();
    for args in starts {
        let started = json(&cli(&server, &state, args));
        assert_eq!(
            started["status_uri"],
            format!("task://status/{}", started["task_id"].as_str().unwrap())
        );
        ids.push(started["task_id"].as_str().unwrap().to_owned());
    }
    for id in &ids {
        let task = wait_status(&server, &state, id, "completed");
        assert_eq!(task["percent"], 100.0);
    }
    let mine = json(&cli(&server, &state, &["task", "list", "--mine", "--json"]));
    assert_eq!(mine["total"], 3);
    let owner = mine["tasks"][0]["owner"].as_str().unwrap().to_owned();
    assert!(owner.starts_with("cli-"), "{owner}");
    let completed = json(&cli(
        &server,
        &state,
        &["task", "list", "--status", "completed", "--json"],
    ));
    assert_eq!(completed["total"], 3);
    let stats = json(&cli(&server, &state, &["stats", "--json"]));
    assert_eq!(stats["completed_tasks"], 3);

    // Text output for people.
    let listing = cli(&server, &state, &["task", "list"]);
    let text = String::from_utf8(listing.stdout).unwrap();
    assert!(text.starts_with("TASK"), "{text}");
    assert_eq!(text.lines().count(), 4, "{text}");

    // Another state file is another client: none of these tasks are its own.
    let other = json(&cli(
        &server,
        &dir.path().join("other.json"),
        &["task", "list", "--mine", "--json"],
    ));
    assert_eq!(other["total"], 0);
}

#[test]
fn steering_and_errors_have_messages_and_exit_codes() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path(), &["--time-scale", "0.01"]);
    let state = dir.path().join("client.json");
    let started = json(&cli(
        &server,
        &state,
        &[
            "task",
            "start",
            "ml-training",
            "--model-name",
            "long",
            "--dataset-size",
            "50",
            "--epochs",
            "1000",
            "--json",
        ],
    ));
    let id = started["task_id"].as_str().unwrap();
    assert_eq!(
        json(&cli(&server, &state, &["task", "pause", id, "--json"]))["status"],
        "paused"
    );
    let again = cli(&server, &state, &["task", "pause", id]);
    assert_eq!(again.status.code(), Some(1));
    assert_eq!(
        String::from_utf8_lossy(&again.stderr).trim(),
        format!("error: cannot pause task {id}: it is paused")
    );
    assert_eq!(
        json(&cli(&server, &state, &["task", "resume", id, "--json"]))["status"],
        "pending"
    );
    let cancelled = cli(&server, &state, &["task", "cancel", id]);
    assert!(cancelled.status.success());
    assert_eq!(
        String::from_utf8_lossy(&cancelled.stdout).trim(),
        format!("task {id} is now cancelled")
    );

    let bad = cli(
        &server,
        &state,
        &[
            "task",
            "start",
            "batch-processing",
            "--batch-size",
            "0",
            "--total-items",
            "5",
        ],
    );
    assert_eq!(bad.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&bad.stderr)
            .contains("batch_size must be between 1 and 1000000, got 0")
    );
    let unknown = cli(&server, &state, &["task", "show", "no-such-task"]);
    assert_eq!(unknown.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&unknown.stderr).contains("task no-such-task not found"));
    let status = cli(&server, &state, &["task", "list", "--status", "done"]);
    assert_eq!(status.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&status.stderr).contains("valid statuses are"));

    // A corrupt state file is replaced with a warning, never fatal.
    std::fs::write(&state, "{garbage").unwrap();
    let recovered = cli(&server, &state, &["stats", "--json"]);
    assert!(recovered.status.success());
    assert!(
        String::from_utf8_lossy(&recovered.stderr)
            .contains("is not a durable-mcp client state file")
    );

    let unreachable = durable_tests::output_within(
        Command::new(server_binary())
            .args([
                "stats",
                "--server",
                "http://127.0.0.1:9/mcp",
                "--state-file",
            ])
            .arg(&state),
        std::time::Duration::from_secs(120),
    );
    assert_eq!(unreachable.status.code(), Some(3));
    assert!(String::from_utf8_lossy(&unreachable.stderr).contains("is it running?"));
}

/// Starts the client in the background with its stdout lines sent to a channel.
fn spawn_cli(
    server: &Server,
    state: &Path,
    args: &[&str],
) -> (std::process::Child, std::sync::mpsc::Receiver<String>) {
    let mut child = Command::new(server_binary())
        .args(args)
        .args(["--server", &server.mcp_url(), "--state-file"])
        .arg(state)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("running the client");
    let rx = stdout_lines(&mut child);
    (child, rx)
}

fn wait_exit(child: &mut std::process::Child, limit: Duration) -> std::process::ExitStatus {
    exit_within(child, limit).unwrap_or_else(|| panic!("the client did not exit within {limit:?}"))
}

/// JSON progress values printed by `process --json`, read until it has exited and closed its
/// output (so no line still in flight is missed).
fn progress_lines(rx: &std::sync::mpsc::Receiver<String>) -> Vec<f64> {
    rx.iter()
        .filter_map(|line| serde_json::from_str::<Value>(&line).ok())
        .filter_map(|line| line["progress"].as_f64())
        .collect()
}

#[test]
fn an_interrupted_process_run_continues_from_its_checkpoint_when_run_again() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path(), &["--time-scale", "0.03"]);
    let state = dir.path().join("client.json");
    let args = [
        "process",
        "--dataset-name",
        "cli",
        "--total-records",
        "200",
        "--batch-size",
        "10",
        "--json",
    ];
    let (mut first, rx) = spawn_cli(&server, &state, &args);
    let mut seen = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    while seen.last().is_none_or(|p| *p < 80.0) {
        assert!(Instant::now() < deadline, "no progress: {seen:?}");
        if let Ok(line) = rx.recv_timeout(Duration::from_secs(30))
            && let Some(p) = serde_json::from_str::<Value>(&line)
                .ok()
                .and_then(|v| v["progress"].as_f64())
        {
            seen.push(p);
        }
    }
    Command::new("kill")
        .args(["-INT", &first.id().to_string()])
        .status()
        .unwrap();
    let status = wait_exit(&mut first, Duration::from_secs(20));
    assert_eq!(status.code(), Some(130), "Ctrl-C exits with 130");
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut first.stderr.take().unwrap(), &mut stderr).unwrap();
    assert!(
        stderr.contains(
            "interrupted; the processing task keeps its checkpoint on the server. Run the same \
             command again to continue from it."
        ),
        "{stderr:?}"
    );
    seen.extend(progress_lines(&rx));
    let interrupted_at = *seen.last().unwrap();

    let second = cli(&server, &state, &args);
    assert!(
        second.status.success(),
        "{}",
        String::from_utf8_lossy(&second.stderr)
    );
    let lines: Vec<Value> = String::from_utf8(second.stdout)
        .unwrap()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    let resumed: Vec<f64> = lines
        .iter()
        .filter_map(|l| l["progress"].as_f64())
        .collect();
    assert!(
        resumed[0] >= interrupted_at - 10.0,
        "progress went back more than one batch: {interrupted_at} then {resumed:?}"
    );
    assert!(resumed.windows(2).all(|w| w[0] < w[1]), "{resumed:?}");
    let result = &lines.last().expect("output")["result"];
    assert_eq!(result["total_processed"], 200);
}

#[test]
fn watch_reports_the_end_of_a_task_in_its_exit_code_and_survives_a_server_kill() {
    let dir = tempfile::tempdir().unwrap();
    let mut server = Server::start(dir.path(), &["--time-scale", "0.02"]);
    let state = dir.path().join("client.json");
    let started = json(&cli(
        &server,
        &state,
        &[
            "task",
            "start",
            "batch-processing",
            "--batch-size",
            "1",
            "--total-items",
            "100",
            "--processing-delay",
            "5",
            "--json",
        ],
    ));
    let id = started["task_id"].as_str().unwrap().to_owned();
    let (mut watcher, rx) = spawn_cli(&server, &state, &["task", "watch", &id, "--json"]);
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let line: Value =
            serde_json::from_str(&rx.recv_timeout(Duration::from_secs(30)).unwrap()).unwrap();
        if line["progress"].as_u64() >= Some(20) {
            break;
        }
        assert!(Instant::now() < deadline);
    }
    server.kill9();
    server.restart();
    let status = wait_exit(&mut watcher, Duration::from_secs(90));
    assert_eq!(
        status.code(),
        Some(0),
        "the watch recovered and saw the task complete"
    );
    let last: Value = rx
        .iter()
        .filter_map(|l| serde_json::from_str(&l).ok())
        .last()
        .unwrap();
    assert_eq!(last["status"], "completed");

    let long = json(&cli(
        &server,
        &state,
        &[
            "task",
            "start",
            "ml-training",
            "--model-name",
            "w",
            "--dataset-size",
            "50",
            "--epochs",
            "1000",
            "--json",
        ],
    ));
    let long_id = long["task_id"].as_str().unwrap().to_owned();
    let (mut watcher, _rx) = spawn_cli(&server, &state, &["task", "watch", &long_id, "--json"]);
    assert!(
        cli(&server, &state, &["task", "cancel", &long_id])
            .status
            .success()
    );
    assert_eq!(
        wait_exit(&mut watcher, Duration::from_secs(30)).code(),
        Some(5),
        "cancelled exits with 5"
    );
}
