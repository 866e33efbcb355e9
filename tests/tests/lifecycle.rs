//! Pause, resume, cancel and shutdown: what a task does between its steps.

use std::time::Duration;

use durable_shared::TaskStatus;
use durable_tests::{Client, Server, lock_database, uninterrupted, wait_progress, within};
use serde_json::{Value, json};

const TASK_LIMIT: Duration = Duration::from_secs(60);

fn task_id(started: &Value) -> String {
    started["task_id"].as_str().expect("task_id").to_owned()
}

#[tokio::test]
async fn a_paused_task_runs_no_step_and_resumes_to_the_uninterrupted_result() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path(), &["--time-scale", "0.01"]).await;
    let client = Client::connect(&server.mcp_url(), None).await;
    let args = json!({"batch_size": 1, "total_items": 60, "processing_delay": 1});
    let paused_id = task_id(&client.call_ok("start_batch_processing", args.clone()).await);
    let baseline_id = task_id(&client.call_ok("start_batch_processing", args).await);

    wait_progress(&client, &paused_id, 5).await;
    let paused = client
        .call_ok("pause_task", json!({"task_id": paused_id}))
        .await;
    assert_eq!(paused["status"], json!("paused"));
    let before = client.task(&paused_id).await;
    // Absence of steps is observed against a clock: the baseline, running at the same pace,
    // takes ten more steps meanwhile.
    let clock = client.task(&baseline_id).await.progress;
    wait_progress(&client, &baseline_id, clock + 10).await;
    let after = client.task(&paused_id).await;
    assert_eq!(after.status, TaskStatus::Paused);
    assert_eq!(
        (after.step, after.progress),
        (before.step, before.progress),
        "a step ran while paused"
    );
    assert_eq!(after.updated_at, before.updated_at);
    let error = client
        .call_err("pause_task", json!({"task_id": paused_id}))
        .await;
    assert_eq!(
        error,
        format!("cannot pause task {paused_id}: it is paused")
    );

    let resumed = client
        .call_ok("resume_task", json!({"task_id": paused_id}))
        .await;
    assert!(resumed["status"] == json!("pending") || resumed["status"] == json!("running"));
    let done = client.wait_terminal(&paused_id, TASK_LIMIT).await;
    let baseline = client.wait_terminal(&baseline_id, TASK_LIMIT).await;
    assert_eq!(done.status, TaskStatus::Completed);
    assert_eq!(done.result_data, baseline.result_data);
    assert_eq!(done.step, 60);
    client.close().await;
}

#[tokio::test]
async fn cancel_stops_a_sleeping_step_at_once_and_is_final() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path(), &["--time-scale", "1"]).await;
    let client = Client::connect(&server.mcp_url(), None).await;
    // One step sleeps for an hour: only a prompt cancel can stop it.
    let id = task_id(
        &client
            .call_ok(
                "start_batch_processing",
                json!({"batch_size": 1, "total_items": 2, "processing_delay": 3600}),
            )
            .await,
    );
    client
        .wait_task(&id, TASK_LIMIT, |task| task.status == TaskStatus::Running)
        .await;
    let cancelled = client.call_ok("cancel_task", json!({"task_id": id})).await;
    assert_eq!(cancelled["status"], json!("cancelled"));
    assert!(cancelled["completed_at"].is_string());
    within(Duration::from_secs(10), "the worker to stop", async {
        loop {
            let stats = client.call_ok("get_server_stats", json!({})).await;
            if stats["active_background_tasks"] == json!(0) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    for action in ["resume", "pause", "cancel"] {
        let error = client
            .call_err(&format!("{action}_task"), json!({"task_id": id}))
            .await;
        assert_eq!(error, format!("cannot {action} task {id}: it is cancelled"));
    }
    let task = client.task(&id).await;
    assert_eq!(
        (task.status, task.step, task.progress),
        (TaskStatus::Cancelled, 0, 0)
    );
    client.close().await;
}

#[tokio::test]
async fn cancel_of_a_paused_task_is_final_and_nothing_runs_after() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path(), &["--time-scale", "0.01"]).await;
    let client = Client::connect(&server.mcp_url(), None).await;
    let id = task_id(
        &client
            .call_ok(
                "start_ml_training",
                json!({"model_name": "m", "dataset_size": 100, "epochs": 500}),
            )
            .await,
    );
    wait_progress(&client, &id, 3).await;
    client.call_ok("pause_task", json!({"task_id": id})).await;
    client.call_ok("cancel_task", json!({"task_id": id})).await;
    let before = client.task(&id).await;
    // Absence of steps is observed against a clock: a task with steps as long as an epoch
    // takes five of them meanwhile.
    let clock = task_id(
        &client
            .call_ok(
                "start_batch_processing",
                json!({"batch_size": 1, "total_items": 60, "processing_delay": 10}),
            )
            .await,
    );
    wait_progress(&client, &clock, 5).await;
    let after = client.task(&id).await;
    assert_eq!(after.status, TaskStatus::Cancelled);
    assert_eq!(after.step, before.step, "a step ran after cancel");
    client.close().await;
}

#[tokio::test]
async fn after_a_kill_paused_tasks_stay_paused_and_running_ones_resume() {
    let dir = tempfile::tempdir().unwrap();
    let mut server = Server::start(dir.path(), &["--time-scale", "0.01"]).await;
    let client = Client::connect(&server.mcp_url(), None).await;
    let args = json!({"batch_size": 1, "total_items": 40, "processing_delay": 1});
    let paused_id = task_id(&client.call_ok("start_batch_processing", args.clone()).await);
    let running_id = task_id(&client.call_ok("start_batch_processing", args).await);
    wait_progress(&client, &paused_id, 3).await;
    client
        .call_ok("pause_task", json!({"task_id": paused_id}))
        .await;
    let paused_step = client.task(&paused_id).await.step;
    wait_progress(&client, &running_id, 10).await;
    server.kill9().await;
    drop(client);
    server.restart().await;

    let client = Client::connect(&server.mcp_url(), None).await;
    let done = client.wait_terminal(&running_id, TASK_LIMIT).await;
    assert_eq!((done.status, done.step), (TaskStatus::Completed, 40));
    let paused = client.task(&paused_id).await;
    assert_eq!(
        (paused.status, paused.step),
        (TaskStatus::Paused, paused_step)
    );
    client
        .call_ok("resume_task", json!({"task_id": paused_id}))
        .await;
    let resumed = client.wait_terminal(&paused_id, TASK_LIMIT).await;
    assert_eq!(resumed.result_data, done.result_data);
    client.close().await;
}

#[tokio::test]
async fn sigterm_checkpoints_exits_and_the_task_resumes_at_next_start() {
    let dir = tempfile::tempdir().unwrap();
    let mut server = Server::start(
        dir.path(),
        &["--time-scale", "0.01", "--shutdown-grace", "3s"],
    )
    .await;
    let client = Client::connect(&server.mcp_url(), None).await;
    // Each step sleeps a second, so SIGTERM lands mid-step.
    let id = task_id(
        &client
            .call_ok(
                "start_batch_processing",
                json!({"batch_size": 10, "total_items": 30, "processing_delay": 100}),
            )
            .await,
    );
    wait_progress(&client, &id, 10).await;
    // A listening stream stays open: the server must cut it when the grace period ends.
    let listener = durable_tests::raw::RawSession::open(&server.mcp_url(), "2025-11-25").await;
    let _stream = listener.get(None).await;
    drop(client);
    // Within `--shutdown-grace` (3 s), as the README promises, with a second for the process
    // to exit; waiting for connections and for workers share that one grace period.
    let status = server.terminate(Duration::from_secs(4)).await;
    assert!(status.success(), "exit status {status:?}");
    assert!(
        server.log().contains("all tasks checkpointed"),
        "{}",
        server.log()
    );

    server.restart().await;
    let client = Client::connect(&server.mcp_url(), None).await;
    let task = client.wait_terminal(&id, TASK_LIMIT).await;
    assert_eq!(
        (task.status, task.step, task.progress),
        (TaskStatus::Completed, 3, 30)
    );
    client.close().await;
}

/// Tasks that mostly wait lend their running slot while they wait: with two slots, ten such
/// tasks all run and advance together, where a slot held for a task's whole run would keep
/// eight of them pending until the first two finished.
#[tokio::test]
async fn waiting_tasks_lend_their_slots_so_all_of_them_advance() {
    const TASKS: usize = 10;
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(
        dir.path(),
        &["--time-scale", "0.01", "--max-running-tasks", "2"],
    )
    .await;
    let client = Client::connect(&server.mcp_url(), None).await;
    // 0.1 s of waiting per step, 200 steps: 20 s for a task alone.
    let args = json!({"batch_size": 1, "total_items": 200, "processing_delay": 10});
    let mut ids = Vec::new();
    for _ in 0..TASKS {
        ids.push(task_id(
            &client.call_ok("start_batch_processing", args.clone()).await,
        ));
    }
    within(TASK_LIMIT, "every task advancing at once", async {
        loop {
            let mut advancing = 0;
            for id in &ids {
                let task = client.task(id).await;
                assert_ne!(task.status, TaskStatus::Completed, "{id} finished first");
                if task.status == TaskStatus::Running && task.progress > 0 {
                    advancing += 1;
                }
            }
            if advancing == TASKS {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    for id in &ids {
        client.call_ok("cancel_task", json!({"task_id": id})).await;
    }
    client.close().await;
}

/// `/healthz` and `/readyz` go through the store: while another process holds the SQLite
/// database's write lock they answer 503 with the cause; once it lets go, 200, and tasks run as
/// before.
#[tokio::test]
async fn the_probes_fail_while_the_database_is_locked_and_recover() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path(), &["--time-scale", "0"]).await;
    let base = format!("http://{}", server.addr);
    let probe = |path: &'static str| {
        let url = format!("{base}{path}");
        async move {
            let response = within(Duration::from_secs(10), path, reqwest::get(url))
                .await
                .expect("a probe answer");
            let status = response.status().as_u16();
            (status, response.json::<Value>().await.unwrap_or_default())
        }
    };
    for path in ["/healthz", "/readyz"] {
        assert_eq!(probe(path).await, (200, json!({"status": "ok"})), "{path}");
    }
    let Some(database) = server.sqlite_file() else {
        // On PostgreSQL the same is shown by cutting the database off (`fleet.rs`).
        eprintln!("skipped: this server keeps its state in PostgreSQL");
        return;
    };
    // Another process takes the write lock for four seconds.
    let _locker = lock_database(&database, 4).await;
    let (status, body) = probe("/readyz").await;
    assert_eq!(status, 503, "{body}");
    assert!(
        body["cause"].as_str().unwrap().contains("did not answer"),
        "{body}"
    );
    within(Duration::from_secs(30), "the probes to recover", async {
        while probe("/healthz").await.0 != 200 || probe("/readyz").await.0 != 200 {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    })
    .await;
    let client = Client::connect(&server.mcp_url(), None).await;
    let task = client
        .call_ok(
            "start_batch_processing",
            json!({"total_items": 3, "batch_size": 1}),
        )
        .await;
    let done = client
        .wait_terminal(task["task_id"].as_str().unwrap(), Duration::from_secs(30))
        .await;
    assert_eq!(done.status, TaskStatus::Completed);
}

/// A task whose step commits fail because another process holds the database's write lock
/// longer than SQLite waits (5 s) is not left without a worker: it is claimed again once the
/// lock is gone and ends exactly as an uninterrupted run does.
#[tokio::test]
async fn a_task_outlives_a_database_locked_longer_than_sqlite_waits() {
    let args = json!({"total_items": 60, "batch_size": 2, "processing_delay": 4});
    let scale = "0.05";
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path(), &["--time-scale", scale]).await;
    let client = Client::connect(&server.mcp_url(), None).await;
    let started = client.call_ok("start_batch_processing", args.clone()).await;
    let task_id = started["task_id"].as_str().unwrap().to_owned();
    wait_progress(&client, &task_id, 4).await;
    let Some(database) = server.sqlite_file() else {
        eprintln!("skipped: this server keeps its state in PostgreSQL (see fleet.rs for cuts)");
        return;
    };
    let mut locker = lock_database(&database, 8).await;
    within(Duration::from_secs(30), "the lock to end", locker.wait())
        .await
        .unwrap();
    let done = client.wait_terminal(&task_id, TASK_LIMIT).await;
    assert!(
        server
            .log()
            .contains("store error; the task is claimed again"),
        "the lock never made a commit fail; hold it longer"
    );
    let (_baseline_dir, _baseline, baseline) =
        uninterrupted(scale, "start_batch_processing", &args).await;
    assert_eq!(done.status, TaskStatus::Completed, "{done:?}");
    assert_eq!(done.result_data, baseline.result_data);
}

/// `/metrics` counts what happened: the tasks by status, one commit (and one latency sample)
/// per step, the events stored and replayed, the sessions; nothing failed.
#[tokio::test]
async fn metrics_count_steps_tasks_events_and_sessions() {
    use durable_mcp_server::telemetry;
    use durable_tests::raw::{RawSession, Sse};

    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path(), &["--time-scale", "0"]).await;
    let session = RawSession::open(&server.mcp_url(), "2025-11-25").await;
    let mut stream = Sse::new(session.get(None).await);
    let priming = stream.next(durable_tests::IO_TIMEOUT).await.unwrap();
    session
        .call(1, "resources/subscribe", json!({"uri": "task://list"}))
        .await;
    let client = Client::connect(&server.mcp_url(), None).await;
    for total_items in [4, 6] {
        let task = client
            .call_ok(
                "start_batch_processing",
                json!({"total_items": total_items, "batch_size": 2}),
            )
            .await;
        client
            .wait_terminal(task["task_id"].as_str().unwrap(), Duration::from_secs(30))
            .await;
    }

    let scraped = server.metrics().await;
    let metric = |series: &str| scraped.get(series);
    let series = |name: &str, labels: &str| format!("{name}{labels}");
    assert_eq!(
        metric(&series(telemetry::TASKS, "{status=\"completed\"}")),
        Some(2.0)
    );
    assert_eq!(
        metric(&series(telemetry::TASKS, "{status=\"running\"}")),
        Some(0.0)
    );
    // 2 + 3 steps.
    assert_eq!(metric(telemetry::STEPS_COMMITTED), Some(5.0));
    assert_eq!(
        metric(&series(telemetry::STEP_COMMIT_SECONDS, "_count")),
        Some(5.0)
    );
    assert_eq!(metric(telemetry::SESSIONS), Some(2.0));
    // Each session's standalone stream: the raw one's and the SDK client's.
    assert_eq!(metric(telemetry::OPEN_STREAMS), Some(2.0));
    let appended = metric(telemetry::EVENTS_APPENDED).expect("events appended");
    assert!(appended >= 5.0, "{appended}");
    if server.sqlite_file().is_some() {
        // The SQLite writer's transactions (PostgreSQL has no writer thread).
        assert!(metric(&series(telemetry::STORE_BATCH_WRITES, "_count")).unwrap() >= 1.0);
    }
    assert!(metric(telemetry::PROCESS_RESIDENT_BYTES).unwrap() > 1e6);
    assert_eq!(metric(telemetry::STORE_WRITER_PANICS).unwrap_or(0.0), 0.0);
    assert_eq!(metric(telemetry::EVENTS_REPLAYED).unwrap_or(0.0), 0.0);

    // A resume replays what the standalone stream carried since its priming event.
    drop(stream);
    let mut resumed = Sse::new(session.get(priming.id.as_deref()).await);
    let first = resumed.next(durable_tests::IO_TIMEOUT).await.unwrap();
    assert!(!first.is_priming(), "{first:?}");
    let replayed = server
        .metrics()
        .await
        .get(telemetry::EVENTS_REPLAYED)
        .expect("events replayed");
    assert!(replayed >= 1.0, "{replayed}");
    client.close().await;
}
