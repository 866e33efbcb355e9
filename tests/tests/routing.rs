//! Notifications reach the sessions that follow a task, and no others; a session that falls
//! behind ends with the current state of every task it follows.
// resources/subscribe and logging are deprecated for 2026-07-28 but are how 2025-11-25 clients
// follow resources and milestones, which is what these tests check.
#![allow(deprecated)]

use std::collections::HashMap;
use std::time::Duration;

use durable_shared::{TASK_LIST_META_KEY, TaskInfo, TaskStatus};
use durable_tests::raw::RawSession;
use durable_tests::{Client, IO_TIMEOUT, Note, Server, eventually, states, within};
use serde_json::json;

const TASK_LIMIT: Duration = Duration::from_secs(60);

fn resyncs(client: &Client) -> usize {
    client
        .notes()
        .iter()
        .filter(|note| {
            matches!(note, Note::ResourceUpdated { meta: Some(meta), .. }
                if meta.get(TASK_LIST_META_KEY).is_some())
        })
        .count()
}

/// Starts a batch task on a raw session with `arguments`; its task id.
async fn start_batch(session: &RawSession, id: u64, arguments: serde_json::Value) -> String {
    let started = session
        .call(
            id,
            "tools/call",
            json!({"name": "start_batch_processing", "arguments": arguments}),
        )
        .await;
    started["structuredContent"]["task_id"]
        .as_str()
        .expect("a task id")
        .to_owned()
}

fn milestones(client: &Client) -> Vec<String> {
    client
        .notes()
        .iter()
        .filter_map(|note| match note {
            Note::Log(log) => log.data["message"].as_str().map(str::to_owned),
            _ => None,
        })
        .collect()
}

#[tokio::test]
async fn a_task_is_heard_of_by_its_subscribers_and_its_owner_only() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path(), &["--time-scale", "0.01"]).await;
    let url = server.mcp_url();
    let subscriber = Client::connect(&url, Some("alice")).await;
    let owner_elsewhere = Client::connect(&url, Some("alice")).await;
    let stranger = Client::connect(&url, Some("bob")).await;
    subscriber.subscribe("task://list").await;

    let started = subscriber
        .call_ok(
            "start_batch_processing",
            json!({"batch_size": 1, "total_items": 5, "processing_delay": 5}),
        )
        .await;
    let id = started["task_id"].as_str().unwrap().to_owned();
    let task = subscriber.wait_terminal(&id, TASK_LIMIT).await;
    assert_eq!(task.status, TaskStatus::Completed);

    // Every committed change, in order: created and claimed at step 0, then each step.
    let seen = eventually(&subscriber, "the completed notification", || {
        let seen = states(&subscriber, "task://list");
        seen.last()
            .is_some_and(|t| t.status == TaskStatus::Completed)
            .then_some(seen)
    })
    .await;
    let steps: Vec<u64> = seen.iter().map(|t| t.step).filter(|s| *s > 0).collect();
    assert_eq!(steps, [1, 2, 3, 4, 5], "{seen:?}");
    assert_eq!(resyncs(&subscriber), 0, "nothing fell behind");

    // The owner's other session hears the milestones of its client's task, and no changes.
    within(IO_TIMEOUT, "the owner's milestones", async {
        while !milestones(&owner_elsewhere)
            .iter()
            .any(|m| m.ends_with("completed"))
        {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    assert!(
        owner_elsewhere
            .notes()
            .iter()
            .all(|note| matches!(note, Note::Log(_))),
        "{:?}",
        owner_elsewhere.notes()
    );
    // Another client with no subscription hears nothing at all.
    let probe = stranger.read(&format!("task://status/{id}")).await;
    assert_eq!(probe["status"], json!("completed"));
    assert!(stranger.notes().is_empty(), "{:?}", stranger.notes());
    for client in [subscriber, owner_elsewhere, stranger] {
        client.close().await;
    }
}

#[tokio::test]
async fn a_session_that_falls_behind_ends_with_the_current_state_of_every_task() {
    const TASKS: usize = 24;
    const STEPS: u64 = 15;
    let dir = tempfile::tempdir().unwrap();
    // A queue of one notification: the session falls behind as soon as two changes come
    // faster than one notification is stored and sent.
    let server = Server::start(
        dir.path(),
        &["--time-scale", "0", "--notification-buffer", "1"],
    )
    .await;
    let client = Client::connect(&server.mcp_url(), Some("flood")).await;
    client.subscribe("task://list").await;
    let mut ids = Vec::new();
    for _ in 0..TASKS {
        let started = client
            .call_ok(
                "start_batch_processing",
                json!({"batch_size": 1, "total_items": STEPS}),
            )
            .await;
        ids.push(started["task_id"].as_str().unwrap().to_owned());
    }
    for id in &ids {
        client.wait_terminal(id, TASK_LIMIT).await;
    }

    let latest = eventually(&client, "every task's final state", || {
        let mut latest: HashMap<String, TaskInfo> = HashMap::new();
        for task in states(&client, "task://list") {
            latest.insert(task.task_id.clone(), task);
        }
        ids.iter()
            .all(|id| {
                latest
                    .get(id)
                    .is_some_and(|t| t.status == TaskStatus::Completed)
            })
            .then_some(latest)
    })
    .await;
    for id in &ids {
        let task = &latest[id];
        assert_eq!((task.progress, task.step), (STEPS, STEPS), "{task:?}");
    }
    assert!(
        resyncs(&client) > 0,
        "the flood should have made the session fall behind: {} notifications",
        client.notes().len()
    );
    client.close().await;
}

/// A session restored after a restart first hears the current state of what it follows: the
/// task it subscribed to finished while no process served the session, which no stored event
/// tells, so its resumed stream carries the finished state.
#[tokio::test]
async fn a_restored_session_hears_what_its_tasks_did_while_nothing_served_it() {
    use durable_shared::{TASK_META_KEY, status_uri};
    use durable_tests::raw::Sse;

    let dir = tempfile::tempdir().unwrap();
    let mut server = Server::start(dir.path(), &["--time-scale", "0.02"]).await;
    let session = RawSession::open(&server.mcp_url(), "2025-11-25").await;
    let mut stream = Sse::new(session.get(None).await);
    stream.next(IO_TIMEOUT).await.expect("priming event");
    // 0.1 s a step, 30 steps: running at the kill, done before the session comes back.
    let task_id = start_batch(
        &session,
        1,
        json!({"batch_size": 1, "total_items": 30, "processing_delay": 5}),
    )
    .await;
    session
        .call(
            2,
            "resources/subscribe",
            json!({"uri": status_uri(&task_id)}),
        )
        .await;
    let update = |message: &serde_json::Value| {
        message["method"] == "notifications/resources/updated"
            && message["params"]["uri"] == status_uri(&task_id)
    };
    let heard = stream.until(IO_TIMEOUT, update).await;
    let last_id = heard.last().and_then(|e| e.id.clone()).unwrap();
    server.kill9().await;
    server.restart().await;
    let client = Client::connect(&server.mcp_url(), None).await;
    let done = client.wait_terminal(&task_id, TASK_LIMIT).await;
    assert_eq!(done.status, TaskStatus::Completed);
    client.close().await;

    // Without the catching up this waits in vain: no stored event says the task completed.
    let mut resumed = Sse::new(session.get(Some(&last_id)).await);
    resumed
        .until(IO_TIMEOUT, |message| {
            update(message) && message["params"]["_meta"][TASK_META_KEY]["status"] == "completed"
        })
        .await;
}

/// A restored session's list catches up beyond the list's newest page: the oldest of more than
/// a page of tasks was cancelled while nothing served the session, and its resumed stream must
/// carry that, not only the newest page's tasks.
#[tokio::test]
async fn a_restored_list_subscriber_hears_of_changes_beyond_the_newest_page() {
    use durable_shared::TaskList;
    use durable_tests::dashboard::finished_tasks;
    use durable_tests::raw::{EventExt, Sse};

    const PAGE: usize = 500;
    let dir = tempfile::tempdir().unwrap();
    let mut server = Server::start(dir.path(), &[]).await;
    let session = RawSession::open(&server.mcp_url(), "2025-11-25").await;
    let mut stream = Sse::new(session.get(None).await);
    let priming = stream.next(IO_TIMEOUT).await.expect("priming event");
    // Its first step waits an hour: it is running at the kill and changes only when cancelled.
    let oldest = start_batch(
        &session,
        1,
        json!({"batch_size": 1, "total_items": 2, "processing_delay": 3600}),
    )
    .await;
    session
        .call(2, "resources/subscribe", json!({"uri": "task://list"}))
        .await;
    let client = Client::connect(&server.mcp_url(), None).await;
    // A full page of newer tasks, so the oldest is on the list's second page.
    finished_tasks(&client, PAGE).await;
    let first_page: TaskList = serde_json::from_value(client.read("task://list").await).unwrap();
    assert!(
        first_page.next_page.is_some() && first_page.tasks.iter().all(|t| t.task_id != oldest),
        "the oldest task must be beyond the first page for this test to mean anything"
    );
    client.close().await;
    drop(stream);
    server.kill9().await;
    server.restart().await;
    let client = Client::connect(&server.mcp_url(), None).await;
    client
        .call_ok("cancel_task", json!({"task_id": oldest}))
        .await;
    let cancelled = client.wait_terminal(&oldest, TASK_LIMIT).await;
    assert_eq!(cancelled.status, TaskStatus::Cancelled);
    client.close().await;

    // The stored events are replayed first, then the session catches up on what no event says.
    let mut resumed = Sse::new(session.get(priming.id.as_deref()).await);
    let mut last_heard = None;
    // Under the event wait's own limit, so that a stream gone quiet ends the loop.
    while let Some(event) = resumed.next_or_idle(IO_TIMEOUT / 2).await {
        if event.is_priming() {
            continue;
        }
        let message = event.json();
        if message["method"] != "notifications/resources/updated" {
            continue;
        }
        let tasks: Vec<TaskInfo> =
            serde_json::from_value(message["params"]["_meta"][TASK_LIST_META_KEY].clone())
                .unwrap_or_default();
        if let Some(task) = tasks.into_iter().find(|task| task.task_id == oldest) {
            last_heard = Some(task.status);
            if task.status == TaskStatus::Cancelled {
                break;
            }
        }
    }
    assert_eq!(
        last_heard,
        Some(TaskStatus::Cancelled),
        "the resumed stream never told of the cancel"
    );
}
