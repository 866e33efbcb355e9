//! The command-line client (`durable-mcp task ...`, `durable-mcp stats`) against the real
//! server: each kind started and followed to completion, listing, steering, `--json` output and
//! exit codes.

use std::path::Path;
use std::process::{ExitStatus, Output, Stdio};
use std::time::{Duration, Instant};

use durable_tests::{
    IO_TIMEOUT, Server, exit_within, output_json as json, remaining_lines, send_signal,
    server_binary, stdout_lines, within,
};
use nix::sys::signal::Signal;
use serde_json::Value;
use tokio::io::AsyncReadExt;
use tokio::process::{Child, Command};
use tokio::sync::mpsc::UnboundedReceiver;

/// Runs the client with its state in `state` against `server`.
async fn cli(server: &Server, state: &Path, args: &[&str]) -> Output {
    durable_tests::output_within(
        Command::new(server_binary())
            .args(args)
            .args(["--server", &server.mcp_url(), "--state-file"])
            .arg(state),
        std::time::Duration::from_secs(120),
    )
    .await
}

async fn wait_status(server: &Server, state: &Path, task_id: &str, status: &str) -> Value {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let task = json(&cli(server, state, &["task", "show", task_id, "--json"]).await);
        if task["status"] == status {
            return task;
        }
        assert!(
            Instant::now() < deadline,
            "task {task_id} never became {status}: {task}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn each_kind_starts_lists_and_completes_from_the_command_line() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path(), &["--time-scale", "0.005"]).await;
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
        let started = json(&cli(&server, &state, args).await);
        assert_eq!(
            started["status_uri"],
            format!("task://status/{}", started["task_id"].as_str().unwrap())
        );
        ids.push(started["task_id"].as_str().unwrap().to_owned());
    }
    for id in &ids {
        let task = wait_status(&server, &state, id, "completed").await;
        assert_eq!(task["percent"], 100.0);
    }
    let mine = json(&cli(&server, &state, &["task", "list", "--mine", "--json"]).await);
    assert_eq!(mine["total"], 3);
    let owner = mine["tasks"][0]["owner"].as_str().unwrap().to_owned();
    assert!(owner.starts_with("cli-"), "{owner}");
    let completed = json(
        &cli(
            &server,
            &state,
            &["task", "list", "--status", "completed", "--json"],
        )
        .await,
    );
    assert_eq!(completed["total"], 3);
    let stats = json(&cli(&server, &state, &["stats", "--json"]).await);
    assert_eq!(stats["completed_tasks"], 3);

    // Text output for people.
    let listing = cli(&server, &state, &["task", "list"]).await;
    let text = String::from_utf8(listing.stdout).unwrap();
    assert!(text.starts_with("TASK"), "{text}");
    assert_eq!(text.lines().count(), 4, "{text}");

    // Another state file is another client: none of these tasks are its own.
    let other = json(
        &cli(
            &server,
            &dir.path().join("other.json"),
            &["task", "list", "--mine", "--json"],
        )
        .await,
    );
    assert_eq!(other["total"], 0);
}

#[tokio::test]
async fn steering_and_errors_have_messages_and_exit_codes() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path(), &["--time-scale", "0.01"]).await;
    let state = dir.path().join("client.json");
    let started = json(
        &cli(
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
        )
        .await,
    );
    let id = started["task_id"].as_str().unwrap();
    assert_eq!(
        json(&cli(&server, &state, &["task", "pause", id, "--json"]).await)["status"],
        "paused"
    );
    let again = cli(&server, &state, &["task", "pause", id]).await;
    assert_eq!(again.status.code(), Some(1));
    assert_eq!(
        String::from_utf8_lossy(&again.stderr).trim(),
        format!("error: cannot pause task {id}: it is paused")
    );
    assert_eq!(
        json(&cli(&server, &state, &["task", "resume", id, "--json"]).await)["status"],
        "pending"
    );
    let cancelled = cli(&server, &state, &["task", "cancel", id]).await;
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
    )
    .await;
    assert_eq!(bad.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&bad.stderr)
            .contains("batch_size must be between 1 and 1000000, got 0")
    );
    let unknown = cli(&server, &state, &["task", "show", "no-such-task"]).await;
    assert_eq!(unknown.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&unknown.stderr).contains("task no-such-task not found"));
    let status = cli(&server, &state, &["task", "list", "--status", "done"]).await;
    assert_eq!(status.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&status.stderr).contains("valid statuses are"));

    // A corrupt state file is replaced with a warning, never fatal.
    std::fs::write(&state, "{garbage").unwrap();
    let recovered = cli(&server, &state, &["stats", "--json"]).await;
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
    )
    .await;
    assert_eq!(unreachable.status.code(), Some(3));
    assert!(String::from_utf8_lossy(&unreachable.stderr).contains("is it running?"));
}

/// Starts the client in the background with its stdout lines sent to a channel; dropping the
/// child kills it.
fn spawn_cli(server: &Server, state: &Path, args: &[&str]) -> (Child, UnboundedReceiver<String>) {
    let mut child = Command::new(server_binary())
        .args(args)
        .args(["--server", &server.mcp_url(), "--state-file"])
        .arg(state)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("running the client");
    let rx = stdout_lines(&mut child);
    (child, rx)
}

async fn wait_exit(child: &mut Child, limit: Duration) -> ExitStatus {
    exit_within(child, limit)
        .await
        .unwrap_or_else(|| panic!("the client did not exit within {limit:?}"))
}

/// JSON progress values printed by `process --json`, read until it has exited and closed its
/// output (so no line still in flight is missed).
async fn progress_lines(rx: &mut UnboundedReceiver<String>) -> Vec<f64> {
    remaining_lines(rx)
        .await
        .into_iter()
        .filter_map(|line| serde_json::from_str::<Value>(&line).ok())
        .filter_map(|line| line["progress"].as_f64())
        .collect()
}

#[tokio::test]
async fn an_interrupted_process_run_continues_from_its_checkpoint_when_run_again() {
    let dir = tempfile::tempdir().unwrap();
    // 0.2 s a batch, 40 batches: the client must still be running when the test, reading its
    // output under load, has seen 20% and sends Ctrl-C (with 20 batches it had once finished
    // by then, on a loaded PostgreSQL run).
    let server = Server::start(dir.path(), &["--time-scale", "0.2"]).await;
    let state = dir.path().join("client.json");
    let args = [
        "process",
        "--dataset-name",
        "cli",
        "--total-records",
        "400",
        "--batch-size",
        "10",
        "--json",
    ];
    let (mut first, mut rx) = spawn_cli(&server, &state, &args);
    let mut seen = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    while seen.last().is_none_or(|p| *p < 80.0) {
        assert!(Instant::now() < deadline, "no progress: {seen:?}");
        if let Ok(Some(line)) = tokio::time::timeout(Duration::from_secs(30), rx.recv()).await
            && let Some(p) = serde_json::from_str::<Value>(&line)
                .ok()
                .and_then(|v| v["progress"].as_f64())
        {
            seen.push(p);
        }
    }
    send_signal(&first, Signal::SIGINT);
    let status = wait_exit(&mut first, Duration::from_secs(20)).await;
    assert_eq!(status.code(), Some(130), "Ctrl-C exits with 130");
    let mut stderr = String::new();
    within(
        IO_TIMEOUT,
        "the client's stderr",
        first.stderr.take().unwrap().read_to_string(&mut stderr),
    )
    .await
    .unwrap();
    assert!(
        stderr.contains(
            "interrupted; the processing task keeps its checkpoint on the server. Run the same \
             command again to continue from it."
        ),
        "{stderr:?}"
    );
    seen.extend(progress_lines(&mut rx).await);
    let interrupted_at = *seen.last().unwrap();

    let second = cli(&server, &state, &args).await;
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
        resumed[0] >= interrupted_at,
        "progress went back: {interrupted_at} then {resumed:?}"
    );
    assert!(resumed.windows(2).all(|w| w[0] < w[1]), "{resumed:?}");
    let result = &lines.last().expect("output")["result"];

    // Exactly once: the same result as a run nobody interrupted (another client's own task).
    let clean = cli(&server, &dir.path().join("other-client.json"), &args).await;
    assert!(
        clean.status.success(),
        "{}",
        String::from_utf8_lossy(&clean.stderr)
    );
    let clean: Value = String::from_utf8(clean.stdout)
        .unwrap()
        .lines()
        .rev()
        .find_map(|l| serde_json::from_str::<Value>(l).ok())
        .expect("output");
    let clean = &clean["result"];
    assert_ne!(clean["task_id"], result["task_id"], "a task of its own");
    for field in ["total_processed", "value_sum", "records"] {
        assert_eq!(result[field], clean[field], "{field}");
    }
    // The processing state carries its own sums, so a repeated batch shows as an extra commit.
    let client = durable_tests::Client::connect(&server.mcp_url(), None).await;
    let steps = async |task: &Value| client.task(task.as_str().unwrap()).await.step;
    assert_eq!(
        steps(&result["task_id"]).await,
        steps(&clean["task_id"]).await
    );
    client.close().await;
}

/// With no flag the client speaks the stateless 2026-07-28 revision to this server (it makes
/// no session) and follows a task by `subscriptions/listen`, opened again after a server kill.
#[tokio::test]
async fn watch_needs_no_flag_to_speak_the_stateless_revision_and_survives_a_server_kill() {
    watch_survives_a_server_kill(&[], false).await;
}

/// `--protocol session` makes a 2025-11-25 session, which follows the task by
/// `resources/subscribe` on its resumed stream, as against a server before 2026-07-28.
#[tokio::test]
async fn watch_on_a_session_survives_a_server_kill() {
    watch_survives_a_server_kill(&["--protocol", "session"], true).await;
}

/// A watch (with `protocol` flags) prints each step of a task as it happens, outlives a
/// SIGKILL of the server and ends with the task's exit code; whether the client `makes_sessions`
/// on the server.
async fn watch_survives_a_server_kill(protocol: &[&str], makes_sessions: bool) {
    let dir = tempfile::tempdir().unwrap();
    let mut server = Server::start(dir.path(), &["--time-scale", "0.02"]).await;
    let state = dir.path().join("client.json");
    let cli = async |server: &Server, state: &Path, args: &[&str]| {
        cli(server, state, &[args, protocol].concat()).await
    };
    let spawn_cli = |server: &Server, state: &Path, args: &[&str]| {
        spawn_cli(server, state, &[args, protocol].concat())
    };
    let started = json(
        &cli(
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
        )
        .await,
    );
    let id = started["task_id"].as_str().unwrap().to_owned();
    let (mut watcher, mut rx) = spawn_cli(&server, &state, &["task", "watch", &id, "--json"]);
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut seen = Vec::new();
    while seen.last().is_none_or(|p| *p < 20) {
        let line = within(Duration::from_secs(30), "a line from watch", rx.recv())
            .await
            .unwrap();
        let line: Value = serde_json::from_str(&line).unwrap();
        seen.push(line["progress"].as_u64().unwrap());
        assert!(Instant::now() < deadline);
    }
    // Each step as it happened (10 a second), not only what a read every 2 s would show.
    assert!(
        seen.windows(2).all(|w| w[1] - w[0] <= 1),
        "steps the watch was not told of: {seen:?}"
    );
    let sessions = server
        .metrics()
        .await
        .get(durable_mcp_server::telemetry::SESSIONS)
        .expect("the sessions gauge");
    assert_eq!(sessions > 0.0, makes_sessions);
    server.kill9().await;
    server.restart().await;
    let status = wait_exit(&mut watcher, Duration::from_secs(90)).await;
    assert_eq!(
        status.code(),
        Some(0),
        "the watch recovered and saw the task complete"
    );
    let last: Value = remaining_lines(&mut rx)
        .await
        .iter()
        .rev()
        .find_map(|l| serde_json::from_str(l).ok())
        .unwrap();
    assert_eq!(last["status"], "completed");

    let long = json(
        &cli(
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
        )
        .await,
    );
    let long_id = long["task_id"].as_str().unwrap().to_owned();
    let (mut watcher, _rx) = spawn_cli(&server, &state, &["task", "watch", &long_id, "--json"]);
    assert!(
        cli(&server, &state, &["task", "cancel", &long_id])
            .await
            .status
            .success()
    );
    assert_eq!(
        wait_exit(&mut watcher, Duration::from_secs(30))
            .await
            .code(),
        Some(5),
        "cancelled exits with 5"
    );
}

/// The task once it asks question `question_id`.
async fn wait_question(server: &Server, state: &Path, task_id: &str, question_id: &str) -> Value {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let task = json(&cli(server, state, &["task", "show", task_id, "--json"]).await);
        if task["question"]["id"] == question_id {
            return task;
        }
        assert!(
            Instant::now() < deadline,
            "never asked {question_id}: {task}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Runs the client like [`cli`], with `input` on its standard input (a person typing answers).
async fn cli_typing(server: &Server, state: &Path, args: &[&str], input: &str) -> Output {
    use tokio::io::AsyncWriteExt;
    let mut child = Command::new(server_binary())
        .args(args)
        .args(["--server", &server.mcp_url(), "--state-file"])
        .arg(state)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("the client starts");
    let mut stdin = child.stdin.take().expect("stdin");
    stdin.write_all(input.as_bytes()).await.unwrap();
    drop(stdin);
    within(IO_TIMEOUT, "the client to answer", child.wait_with_output())
        .await
        .expect("the client's output")
}

/// `task answer` asks the question's fields on the terminal (a choice, then yes/no), the task's
/// question survives a SIGKILL between the two, and answering a task that asks nothing is
/// refused with exit code 1.
#[tokio::test]
async fn a_question_is_answered_from_the_terminal_across_a_server_kill() {
    let dir = tempfile::tempdir().unwrap();
    let mut server = Server::start(dir.path(), &["--time-scale", "0.005"]).await;
    let state = dir.path().join("client.json");
    let started = json(
        &cli(
            &server,
            &state,
            &[
                "task",
                "start",
                "trip-planning",
                "--destination",
                "Lisbon",
                "--start-date",
                "2027-05-14",
                "--budget",
                "900",
                "--json",
            ],
        )
        .await,
    );
    let id = started["task_id"].as_str().unwrap().to_owned();
    let waiting = wait_question(&server, &state, &id, "choose_hotel").await;
    let hotel = waiting["question"]["schema"]["properties"]["hotel"]["enum"][0]
        .as_str()
        .unwrap()
        .to_owned();

    let answered = cli_typing(
        &server,
        &state,
        &["task", "answer", &id],
        &format!("{hotel}\n"),
    )
    .await;
    assert!(answered.status.success(), "{answered:?}");
    let prompt = String::from_utf8_lossy(&answered.stderr);
    assert!(prompt.contains("Which hotel in Lisbon"), "{prompt}");
    assert!(
        prompt.contains(&format!("Hotel [one of: {hotel}")),
        "{prompt}"
    );

    let confirm = wait_question(&server, &state, &id, "confirm_booking").await;
    server.kill9().await;
    server.restart().await;
    let kept = json(&cli(&server, &state, &["task", "show", &id, "--json"]).await);
    assert_eq!(
        kept["question"], confirm["question"],
        "the question outlives the kill"
    );
    let answered = cli_typing(&server, &state, &["task", "answer", &id], "yes\n").await;
    assert!(answered.status.success(), "{answered:?}");
    let done = wait_status(&server, &state, &id, "completed").await;
    assert_eq!(done["result_data"]["hotel"], Value::String(hotel));
    assert_eq!(done["result_data"]["booked"], Value::Bool(true));
    assert_eq!(done["result_data"]["answers_applied"], 2);

    let again = cli(&server, &state, &["task", "answer", &id, "--decline"]).await;
    assert_eq!(again.status.code(), Some(1), "{again:?}");
    assert_eq!(
        String::from_utf8_lossy(&again.stderr).trim(),
        format!("error: task {id} asks nothing: it is completed")
    );
}
