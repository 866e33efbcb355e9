//! A fleet: three nodes on one PostgreSQL database and one shared data directory, behind
//! HAProxy. A node that dies mid-task is replaced by another, which finishes the task with
//! exactly the result of an uninterrupted run; a subscriber on any node hears of every change
//! of a task running on another; a node cut off from the database, and a kill loop over the
//! whole fleet, lose and repeat nothing.

use std::time::Duration;

use durable_mcp_server::store::postgres::scratch::ScratchDatabase;
use durable_shared::{TaskInfo, TaskStatus};
use durable_tests::fleet::{Fleet, LEASE_TTL, database_addr, through};
use durable_tests::proxy::Proxy;
use durable_tests::raw::{EventExt, RawSession, Sse};
use durable_tests::{
    Client, IO_TIMEOUT, Server, TASK_LIMIT, eventually, states, uninterrupted, wait_progress,
    within,
};
use rmcp::model::{CallToolRequestParams, ReadResourceRequestParams};
use serde_json::{Value, json};

/// Waits until the task is advanced by a node other than `dead` and returns it.
async fn taken_over(client: &Client, task_id: &str, dead: &str, fleet: &Fleet) -> TaskInfo {
    // A lease lapses within its ttl; the other nodes look for such work every second.
    let limit = LEASE_TTL * 3 + Duration::from_secs(10);
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        let task = client.task(task_id).await;
        if task.node.as_deref().is_some_and(|node| node != dead) {
            return task;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "task {task_id} not taken over from {dead} within {limit:?}: {task:?}\n{}",
            fleet.logs()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Starts `tool(args)` through the balancer, SIGKILLs the node advancing it once its
/// progress reaches `kill_at`, and returns the finished task, the node killed and the one
/// that took over.
async fn killed_mid_task(
    fleet: &mut Fleet,
    client: &Client,
    tool: &str,
    args: &Value,
    kill_at: u64,
) -> (TaskInfo, String, String) {
    let started = client.call_ok(tool, args.clone()).await;
    let id = started["task_id"].as_str().unwrap().to_owned();
    let task = wait_progress(client, &id, kill_at).await;
    assert_ne!(
        task.status,
        TaskStatus::Completed,
        "finished before the kill: {task:?}"
    );
    let holder = task.node.clone().expect("a running task names its node");
    let index = fleet.index_of(&holder);
    fleet.nodes[index].kill9().await;
    let successor = taken_over(client, &id, &holder, fleet).await;
    let successor = successor.node.unwrap();
    // Back, under its id: it must not take the task back from its successor.
    fleet.nodes[index].restart().await;
    let task = client.wait_terminal(&id, TASK_LIMIT).await;
    (task, holder, successor)
}

fn assert_same_outcome(fleet: &Fleet, moved: &TaskInfo, clean: &TaskInfo) {
    assert_eq!(
        moved.status,
        TaskStatus::Completed,
        "{moved:?}\n{}",
        fleet.logs()
    );
    assert_eq!(moved.result_data, clean.result_data);
    assert_eq!((moved.progress, moved.total), (clean.progress, clean.total));
    // One commit per step: a step applied twice would show up as an extra one.
    assert_eq!(moved.step, clean.step);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_kind_finishes_on_another_node_when_its_node_is_killed() {
    let migration = json!({"source_path": "sample:customers", "destination_path": "out/customers.jsonl", "record_count": 3000});
    let batch = json!({"batch_size": 100, "total_items": 6000, "processing_delay": 1});
    let training = json!({"model_name": "fleet-model", "dataset_size": 2000, "epochs": 60});
    let scales = ["0.05", "0.05", "0.005"];
    let baselines = async {
        tokio::join!(
            uninterrupted(scales[0], "start_data_migration", &migration),
            uninterrupted(scales[1], "start_batch_processing", &batch),
            uninterrupted(scales[2], "start_ml_training", &training),
        )
    };
    let fleet_run = async {
        let dir = tempfile::tempdir().unwrap();
        let mut outcomes = Vec::new();
        // One fleet per kind: each kind's scale differs, and one node's death must not be
        // another kind's.
        for (tool, args, scale, kill_at) in [
            ("start_data_migration", &migration, scales[0], 900),
            ("start_batch_processing", &batch, scales[1], 2000),
            ("start_ml_training", &training, scales[2], 20),
        ] {
            let fleet_dir = dir.path().join(tool);
            std::fs::create_dir_all(&fleet_dir).unwrap();
            let mut fleet = Fleet::start(&fleet_dir, 3, &["--time-scale", scale]).await;
            let client = Client::connect(&fleet.mcp_url(), Some("fleet-test")).await;
            let (task, dead, successor) =
                killed_mid_task(&mut fleet, &client, tool, args, kill_at).await;
            assert_ne!(dead, successor);
            client.close().await;
            outcomes.push((fleet, task));
        }
        (dir, outcomes)
    };
    let ((migration_clean, batch_clean, training_clean), (_dir, outcomes)) =
        tokio::join!(baselines, fleet_run);
    for ((fleet, task), clean) in
        outcomes
            .iter()
            .zip([&migration_clean, &batch_clean, &training_clean])
    {
        assert_same_outcome(fleet, task, &clean.2);
    }
    let written = std::fs::read(outcomes[0].0.data_path("out/customers.jsonl")).unwrap();
    let expected = std::fs::read(migration_clean.1.data_path("out/customers.jsonl")).unwrap();
    assert!(
        written == expected,
        "the migrated file differs from an uninterrupted run's"
    );
}

/// The statuses `client` heard of for `uri`, consecutive repeats folded.
fn statuses(client: &Client, uri: &str) -> Vec<TaskStatus> {
    let mut heard: Vec<TaskStatus> = states(client, uri).iter().map(|t| t.status).collect();
    heard.dedup();
    heard
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscriber_on_one_node_hears_every_change_of_a_task_on_another() {
    let dir = tempfile::tempdir().unwrap();
    let fleet = Fleet::start(dir.path(), 3, &["--time-scale", "0.05"]).await;
    let on = |n: usize| format!("http://{}/mcp", fleet.nodes[n].addr);
    let starter = Client::connect(&on(0), Some("owner")).await;
    let steerer = Client::connect(&on(1), Some("owner")).await;
    let listener = Client::connect(&on(2), Some("owner")).await;

    let started = starter
        .call_ok(
            "start_batch_processing",
            json!({"batch_size": 100, "total_items": 3000, "processing_delay": 1}),
        )
        .await;
    let id = started["task_id"].as_str().unwrap().to_owned();
    let uri = format!("task://status/{id}");
    listener.subscribe(&uri).await;

    let progressed = |min: u64| {
        let (listener, uri) = (&listener, uri.clone());
        move || {
            states(listener, &uri)
                .into_iter()
                .find(|t| t.status == TaskStatus::Running && t.progress >= min)
        }
    };
    let running = eventually(&listener, "progress heard on node-2", progressed(300)).await;
    assert_eq!(running.node.as_deref(), Some("node-0"));

    steerer.call_ok("pause_task", json!({"task_id": id})).await;
    eventually(&listener, "the pause heard on node-2", || {
        statuses(&listener, &uri)
            .last()
            .copied()
            .filter(|s| *s == TaskStatus::Paused)
    })
    .await;
    let paused_at = listener.task(&id).await.progress;

    steerer.call_ok("resume_task", json!({"task_id": id})).await;
    eventually(
        &listener,
        "progress after the resume",
        progressed(paused_at + 200),
    )
    .await;
    let done = eventually(&listener, "the completion heard on node-2", || {
        states(&listener, &uri)
            .into_iter()
            .find(|t| t.status == TaskStatus::Completed)
    })
    .await;
    assert_eq!((done.progress, done.total), (3000, 3000));
    assert!(done.result_data.is_some());
    let heard = statuses(&listener, &uri);
    let paused = heard.iter().position(|s| *s == TaskStatus::Paused).unwrap();
    assert_eq!(heard[..paused], [TaskStatus::Running], "{heard:?}");
    assert_eq!(heard.last(), Some(&TaskStatus::Completed), "{heard:?}");
    assert!(
        heard[paused + 1..].contains(&TaskStatus::Running),
        "the resumed run is heard of: {heard:?}"
    );
    for client in [starter, steerer, listener] {
        client.close().await;
    }
}

/// The in-request job through the balancer: every request of the client's session may land on
/// another node. The node running the call is killed; the client resumes the call's stream
/// with `Last-Event-ID` through the balancer, and another node finishes the task and the call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_whose_node_dies_is_finished_by_another_through_the_balancer() {
    let dir = tempfile::tempdir().unwrap();
    let mut fleet = Fleet::start(dir.path(), 3, &["--time-scale", "0.05"]).await;
    let args = json!({"dataset_name": "ledger", "total_records": 300, "batch_size": 10, "client_id": "hopper"});
    let caller = Client::connect(&fleet.mcp_url(), None).await;
    let call = tokio::spawn({
        let Value::Object(args) = args.clone() else {
            unreachable!("arguments are an object")
        };
        let params = CallToolRequestParams::new("resumable_data_processing").with_arguments(args);
        // Straight on the service: the harness's own deadline would turn a hang into an error.
        let service = caller.service.peer().clone();
        async move { service.call_tool(params).await }
    });
    let watcher = Client::connect(&fleet.mcp_url(), None).await;
    let id = watcher.first_listed_task().await;
    let task = wait_progress(&watcher, &id, 100).await;
    let holder = task.node.expect("a running task names its node");
    let index = fleet.index_of(&holder);
    fleet.nodes[index].kill9().await;

    let answer = within(TASK_LIMIT, "the interrupted call", call)
        .await
        .expect("the call's task")
        .unwrap_or_else(|e| {
            panic!(
                "the call is answered by another node: {e}\n{}",
                fleet.logs()
            )
        });
    let answer = answer.structured_content.expect("structured content");
    assert_eq!(answer["task_id"], json!(id));
    assert_eq!(answer["total_processed"], json!(300));
    let task = watcher.task(&id).await;
    assert_ne!(
        task.node.as_deref(),
        Some(holder.as_str()),
        "another node finished it"
    );
    assert_eq!(task.step, 30, "every batch committed once");

    // Every progress notification the call received, none twice.
    let progress = caller.progress_reaching(300.0).await;
    assert!(
        progress.windows(2).all(|w| w[0] < w[1]),
        "no progress value twice: {progress:?}\n{}",
        fleet.logs()
    );
    fleet.nodes[index].restart().await;
    let baseline = watcher
        .call_ok(
            "resumable_data_processing",
            json!({"dataset_name": "ledger", "total_records": 300, "batch_size": 10, "client_id": "baseline"}),
        )
        .await;
    assert_eq!(baseline["value_sum"], answer["value_sum"]);
    assert_eq!(baseline["records"], answer["records"]);
    watcher.close().await;
}

/// One node on a scratch database reached through a TCP proxy the test can cut.
async fn proxied_node(
    dir: &std::path::Path,
    node_id: &str,
    extra: &[&str],
) -> (ScratchDatabase, Proxy, Server) {
    let database = ScratchDatabase::from_env()
        .await
        .expect("fleet tests need DURABLE_MCP_TEST_POSTGRES")
        .unwrap();
    let proxy = Proxy::start(database_addr(database.url())).await;
    let node = Server::start_node(
        dir,
        &through(database.url(), proxy.addr),
        &dir.join("data"),
        node_id,
        extra,
    )
    .await;
    (database, proxy, node)
}

/// A node whose connection to PostgreSQL is cut again and again while it runs tasks (a TCP
/// proxy in front of the database drops every connection every few seconds): it answers while
/// cut off, reconnects by itself, applies no step twice, and every task ends with exactly the
/// result of an uninterrupted run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_cut_off_from_its_database_again_and_again_loses_nothing() {
    let migration = json!({"source_path": "sample:customers", "destination_path": "out/customers.jsonl", "record_count": 2000});
    let batch = json!({"batch_size": 100, "total_items": 4000, "processing_delay": 1});
    let scale = "0.1";
    let baselines = async {
        tokio::join!(
            uninterrupted(scale, "start_data_migration", &migration),
            uninterrupted(scale, "start_batch_processing", &batch),
        )
    };
    let cut_run = async {
        let dir = tempfile::tempdir().unwrap();
        let ttl = format!("{}s", LEASE_TTL.as_secs());
        let (database, proxy, node) = proxied_node(
            dir.path(),
            "cut-node",
            &["--time-scale", scale, "--lease-ttl", &ttl],
        )
        .await;
        let client = Client::connect(&node.mcp_url(), Some("cut-test")).await;
        let mut ids = Vec::new();
        for (tool, args) in [
            ("start_data_migration", &migration),
            ("start_batch_processing", &batch),
        ] {
            ids.push(
                client.call_ok(tool, args.clone()).await["task_id"]
                    .as_str()
                    .unwrap()
                    .to_owned(),
            );
        }
        let mut cuts = 0;
        let mut refused_while_cut = 0;
        let finished = within(TASK_LIMIT, "the tasks to finish across cuts", async {
            loop {
                tokio::time::sleep(Duration::from_millis(1500)).await;
                proxy.cut();
                cuts += 1;
                // Cut off, the node still answers, with an error, not a hang.
                let read = tokio::time::timeout(
                    IO_TIMEOUT,
                    client
                        .service
                        .read_resource(ReadResourceRequestParams::new(format!(
                            "task://status/{}",
                            ids[0]
                        ))),
                )
                .await
                .expect("a node cut off from its database answers");
                if read.is_err() {
                    refused_while_cut += 1;
                }
                tokio::time::sleep(Duration::from_millis(700)).await;
                proxy.restore();
                let mut done = Vec::new();
                for id in &ids {
                    // Reconnecting may take a moment: an error here is retried next round.
                    if let Ok(Ok(read)) = tokio::time::timeout(
                        IO_TIMEOUT,
                        client
                            .service
                            .read_resource(ReadResourceRequestParams::new(format!(
                                "task://status/{id}"
                            ))),
                    )
                    .await
                    {
                        let rmcp::model::ResourceContents::TextResourceContents { text, .. } =
                            &read.contents[0]
                        else {
                            panic!("task status is text");
                        };
                        let task: TaskInfo = serde_json::from_str(text).unwrap();
                        if task.status.is_terminal() {
                            done.push(task);
                        }
                    }
                }
                if done.len() == ids.len() {
                    return done;
                }
            }
        })
        .await;
        assert!(
            cuts >= 3,
            "the run outlasted only {cuts} cuts; make the tasks longer"
        );
        assert!(refused_while_cut > 0, "no request ever met the cut");
        let written = std::fs::read(dir.path().join("data/out/customers.jsonl")).unwrap();
        client.close().await;
        (finished, written, node, dir, database)
    };
    let ((migration_clean, batch_clean), (finished, written, node, _dir, _database)) =
        tokio::join!(baselines, cut_run);
    for (task, clean) in finished.iter().zip([&migration_clean.2, &batch_clean.2]) {
        assert_eq!(
            task.status,
            TaskStatus::Completed,
            "{task:?}\n{}",
            node.log()
        );
        assert_eq!(task.result_data, clean.result_data);
        assert_eq!(task.step, clean.step, "one commit per step");
    }
    let expected = std::fs::read(migration_clean.1.data_path("out/customers.jsonl")).unwrap();
    assert!(
        written == expected,
        "the migrated file differs from an uninterrupted run's"
    );
}

/// The state of task `id` through `url`, or `None` when the request failed (its node died
/// under it): the caller asks again.
async fn task_state(url: &str, id: &str) -> Option<TaskInfo> {
    let attempt = async {
        let client = Client::try_connect(url, Some("kill-loop")).await?;
        let read = client
            .service
            .read_resource(ReadResourceRequestParams::new(format!(
                "task://status/{id}"
            )))
            .await
            .ok();
        client.close().await;
        let rmcp::model::ResourceContents::TextResourceContents { text, .. } = &read?.contents[0]
        else {
            return None;
        };
        serde_json::from_str(text).ok()
    };
    tokio::time::timeout(IO_TIMEOUT, attempt)
        .await
        .ok()
        .flatten()
}

/// A small deterministic generator, so that a failing run's kill order can be replayed.
fn next(seed: &mut u64) -> u64 {
    *seed = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    *seed >> 33
}

/// Twenty times, a random node of the fleet is SIGKILLed and restarted (never all down) while
/// tasks of every background kind run: no task is lost or duplicated, and each ends with
/// exactly the result of a single-node run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kill_loop_over_the_fleet_loses_and_repeats_nothing() {
    let scale = "0.1";
    let jobs: Vec<(&str, Value)> = vec![
        (
            "start_data_migration",
            json!({"source_path": "sample:customers", "destination_path": "out/a.jsonl", "record_count": 2000}),
        ),
        (
            "start_data_migration",
            json!({"source_path": "sample:customers", "destination_path": "out/b.jsonl", "record_count": 1500}),
        ),
        (
            "start_batch_processing",
            json!({"batch_size": 100, "total_items": 3000, "processing_delay": 5}),
        ),
        (
            "start_batch_processing",
            json!({"batch_size": 50, "total_items": 2000, "processing_delay": 4}),
        ),
        (
            "start_ml_training",
            json!({"model_name": "loop-a", "dataset_size": 1000, "epochs": 30}),
        ),
        (
            "start_ml_training",
            json!({"model_name": "loop-b", "dataset_size": 800, "epochs": 25}),
        ),
    ];
    let baselines = futures::future::join_all(
        jobs.iter()
            .map(|(tool, args)| uninterrupted("0.01", tool, args)),
    );
    let fleet_run = async {
        let dir = tempfile::tempdir().unwrap();
        let mut fleet = Fleet::start(dir.path(), 3, &["--time-scale", scale]).await;
        let starter = Client::connect(&fleet.mcp_url(), Some("kill-loop")).await;
        let mut ids = Vec::new();
        for (tool, args) in &jobs {
            ids.push(
                starter.call_ok(tool, args.clone()).await["task_id"]
                    .as_str()
                    .unwrap()
                    .to_owned(),
            );
        }
        starter.close().await;
        let mut seed = 0x5eed_u64;
        for _ in 0..20 {
            let victim = (next(&mut seed) % 3) as usize;
            fleet.nodes[victim].kill9().await;
            tokio::time::sleep(Duration::from_millis(200 + next(&mut seed) % 400)).await;
            fleet.nodes[victim].restart().await;
            tokio::time::sleep(Duration::from_millis(300 + next(&mut seed) % 700)).await;
        }
        let url = fleet.mcp_url();
        let finished = within(
            TASK_LIMIT,
            "every task to finish after the kill loop",
            async {
                let mut finished = vec![None; ids.len()];
                while finished.iter().any(Option::is_none) {
                    for (slot, id) in finished.iter_mut().zip(&ids) {
                        if slot.is_none()
                            && let Some(task) = task_state(&url, id).await
                            && task.status.is_terminal()
                        {
                            *slot = Some(task);
                        }
                    }
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                finished.into_iter().map(Option::unwrap).collect::<Vec<_>>()
            },
        )
        .await;
        let lister = Client::connect(&url, Some("kill-loop")).await;
        let listed = lister.read("task://list").await;
        lister.close().await;
        (dir, fleet, finished, listed)
    };
    let (clean, (_dir, fleet, finished, listed)) = tokio::join!(baselines, fleet_run);
    let listed = listed["tasks"].as_array().unwrap().len();
    assert_eq!(listed, jobs.len(), "no task lost, none duplicated");
    let logs = fleet.logs();
    let runs = logs
        .lines()
        .filter(|line| line.contains("worker running"))
        .count();
    assert!(
        runs > jobs.len(),
        "the kills interrupted no task ({runs} worker starts); make the tasks longer"
    );
    for (task, (_, _, clean)) in finished.iter().zip(&clean) {
        assert_eq!(
            task.status,
            TaskStatus::Completed,
            "{task:?}\n{}",
            fleet.logs()
        );
        assert_eq!(task.result_data, clean.result_data, "{}", task.kind);
        assert_eq!(task.step, clean.step, "one commit per step: {}", task.kind);
    }
    for (file, (_, server, _)) in ["out/a.jsonl", "out/b.jsonl"].iter().zip(&clean) {
        let written = std::fs::read(fleet.data_path(file)).unwrap();
        let expected = std::fs::read(server.data_path(file)).unwrap();
        assert!(
            written == expected,
            "{file} differs from a single-node run's"
        );
    }
}

/// An MCP task handle made through one node: the same session, following its stream on
/// another node, hears the task's status changes there, and `tasks/get` answers anywhere.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_handle_made_on_one_node_is_announced_on_another() {
    let dir = tempfile::tempdir().unwrap();
    let fleet = Fleet::start(dir.path(), 3, &["--time-scale", "0.01"]).await;
    let on = |n: usize| format!("http://{}/mcp", fleet.nodes[n].addr);
    let session = RawSession::open(&on(0), "2025-11-25").await;
    let mut elsewhere = session.reconnected();
    elsewhere.url = on(1);
    let mut notifications = Sse::new(elsewhere.get(None).await);
    // A quarter of a second per step: the stream on node-1 is open long before the end.
    let args = json!({"total_items": 8, "batch_size": 1, "processing_delay": 25});
    let created = session
        .call(
            1,
            "tools/call",
            json!({"name": "run_batch_processing", "arguments": args, "task": {}}),
        )
        .await;
    let task_id = created["task"]["taskId"].as_str().unwrap().to_owned();
    let events = notifications
        .until(IO_TIMEOUT, |message| {
            message["method"] == "notifications/tasks/status"
                && message["params"]["status"] == "completed"
        })
        .await;
    let heard: Vec<Value> = events
        .iter()
        .filter(|event| !event.is_priming())
        .map(|event| event.json())
        .filter(|message| message["method"] == "notifications/tasks/status")
        .collect();
    assert!(
        heard.last().is_some_and(
            |m| m["params"]["status"] == "completed" && m["params"]["taskId"] == json!(task_id)
        ),
        "node-1 announced the task's end: {heard:?}\n{}",
        fleet.logs()
    );
    let mut third = session.reconnected();
    third.url = on(2);
    let status = third.call(2, "tasks/get", json!({"taskId": task_id})).await;
    assert_eq!(status["status"], "completed");
}

/// A node stopped gracefully (SIGTERM) hands its leases back: another node continues its task
/// at once, long before the lease (a minute here) would have lapsed, and the result is an
/// uninterrupted run's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_stopping_gracefully_hands_its_task_over_at_once() {
    let args = json!({"batch_size": 100, "total_items": 4000, "processing_delay": 5});
    let (clean, (_dir, fleet, task)) = tokio::join!(
        uninterrupted("0.05", "start_batch_processing", &args),
        async {
            let dir = tempfile::tempdir().unwrap();
            let lease = Duration::from_secs(60);
            let mut fleet =
                Fleet::start_with_lease(dir.path(), 3, lease, &["--time-scale", "0.05"]).await;
            let client =
                Client::connect(&format!("http://{}/mcp", fleet.nodes[1].addr), None).await;
            let on_zero =
                Client::connect(&format!("http://{}/mcp", fleet.nodes[0].addr), None).await;
            let started = on_zero
                .call_ok("start_batch_processing", args.clone())
                .await;
            let id = started["task_id"].as_str().unwrap().to_owned();
            let running = wait_progress(&client, &id, 800).await;
            assert_eq!(running.node.as_deref(), Some("node-0"));
            on_zero.close().await;
            fleet.nodes[0].terminate(Duration::from_secs(10)).await;
            // The lease would hold the task for a minute; a handed-back one is taken within the
            // other nodes' one-second look for unheld work.
            let handed = within(
                Duration::from_secs(15),
                "the task to be taken over",
                async {
                    loop {
                        let task = client.task(&id).await;
                        if task.node.as_deref().is_some_and(|node| node != "node-0") {
                            return task;
                        }
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                },
            )
            .await;
            assert_eq!(handed.status, TaskStatus::Running, "{handed:?}");
            let task = client.wait_terminal(&id, TASK_LIMIT).await;
            client.close().await;
            (dir, fleet, task)
        }
    );
    assert_same_outcome(&fleet, &task, &clean.2);
}

/// A node cut off from PostgreSQL is not ready (503 naming the cause) and is again once the
/// database is back, without a restart.
#[tokio::test]
async fn a_node_cut_off_from_its_database_is_not_ready_until_it_is_back() {
    let dir = tempfile::tempdir().unwrap();
    let (_database, proxy, node) = proxied_node(dir.path(), "probe-node", &[]).await;
    let readyz = format!("http://{}/readyz", node.addr);
    let status = || {
        let readyz = readyz.clone();
        async move {
            let response = within(Duration::from_secs(20), "/readyz", reqwest::get(readyz))
                .await
                .expect("a probe answer");
            let status = response.status().as_u16();
            (status, response.text().await.unwrap_or_default())
        }
    };
    let until = |wanted: u16| async move {
        within(Duration::from_secs(60), "the probe to change", async {
            loop {
                let (got, body) = status().await;
                if got == wanted {
                    return body;
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        })
        .await
    };
    until(200).await;
    proxy.cut();
    let body = until(503).await;
    assert!(body.contains("the store"), "{body}");
    proxy.restore();
    until(200).await;
}
