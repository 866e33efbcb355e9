//! Keeps the dashboard in step with the server: initializes (or reuses) the session, subscribes
//! to the task list and reads it once, then follows the standalone stream for good,
//! reconnecting with backoff (honouring the server's `retry:`) and resuming from the last event
//! id.

use std::cell::Cell;
use std::rc::Rc;

use durable_shared::form::fields;
use durable_shared::kinds::kind_of_start_tool;
use durable_shared::{EventId, TaskStatus};
use durable_shared::{TASK_LIST_META_KEY, TASK_META_KEY, TaskInfo, TaskList, list_uri, status_uri};
use leptos::prelude::*;
use serde_json::{Value, json};
use wasm_bindgen_futures::JsFuture;

use crate::mcp::{Mcp, McpError, SseReader};
use crate::state::{Conn, Dashboard, StartKind};

/// How long without events ends "replaying" after a reconnect, if no live change ended it.
const REPLAY_QUIET_MS: i32 = 300;

pub async fn sleep(ms: i32) {
    let promise = js_sys::Promise::new(&mut |resolve, _| {
        let _ = window().set_timeout_with_callback_and_timeout_and_arguments_0(&resolve, ms);
    });
    let _ = JsFuture::from(promise).await;
}

fn online() -> bool {
    window().navigator().on_line()
}

/// Reads `task://status/{id}` and shows it.
pub async fn refresh_task(mcp: &Mcp, dash: Dashboard, task_id: &str) -> Result<(), McpError> {
    let result = mcp
        .request("resources/read", json!({"uri": status_uri(task_id)}))
        .await?;
    let text = result["contents"][0]["text"].as_str().unwrap_or_default();
    if let Ok(task) = serde_json::from_str::<TaskInfo>(text) {
        dash.upsert(task);
    }
    Ok(())
}

pub async fn subscribe(mcp: &Mcp, uri: &str) -> Result<(), McpError> {
    mcp.request("resources/subscribe", json!({"uri": uri}))
        .await
        .map(|_| ())
}

/// Reads the start forms from the tools the server lists: one per `start_{kind}` tool, its
/// fields from the tool's input schema.
async fn read_kinds(mcp: &Mcp, dash: Dashboard) -> Result<(), McpError> {
    let listed = mcp.request("tools/list", json!({})).await?;
    let kinds: Vec<StartKind> = listed["tools"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|tool| {
            let name = tool["name"].as_str()?;
            kind_of_start_tool(name)?;
            Some(StartKind {
                tool: name.to_owned(),
                title: tool["title"].as_str().unwrap_or(name).to_owned(),
                fields: fields(tool["inputSchema"].as_object()?, &[]),
            })
        })
        .collect();
    dash.kinds.set(kinds);
    Ok(())
}

/// Subscribes to the whole task list, then reads it, page by page. One subscription for every task: each of
/// its updates carries the task that changed (a new one from its creation on), so the server
/// keeps one entry for this page however many tasks there are. Subscribed before the read, so
/// a change in between is not lost.
async fn resync(mcp: &Mcp, dash: Dashboard) -> Result<(), McpError> {
    if dash.kinds.with_untracked(Vec::is_empty) {
        read_kinds(mcp, dash).await?;
    }
    subscribe(mcp, &list_uri(None)).await?;
    // Every page of the list: the table pages and searches all tasks, not the newest page's.
    let mut tasks = Vec::new();
    let mut next = Some(list_uri(None));
    while let Some(uri) = next {
        let result = mcp.request("resources/read", json!({"uri": uri})).await?;
        let text = result["contents"][0]["text"].as_str().unwrap_or_default();
        let page: TaskList = serde_json::from_str(text)
            .map_err(|e| McpError::Rpc(format!("unreadable task list: {e}")))?;
        tasks.extend(page.tasks);
        next = page.next_page;
    }
    dash.replace_tasks(tasks);
    Ok(())
}

/// Runs for the life of the page.
pub async fn run(mcp: Rc<Mcp>, dash: Dashboard) {
    let mut need_resync = true;
    let mut attempt: u32 = 0;
    let mut retry_ms: i32 = 1000;
    loop {
        if attempt > 0 {
            dash.conn.set(if online() {
                Conn::Reconnecting(attempt)
            } else {
                Conn::Offline
            });
            // Exponential backoff from the server's retry hint, capped at 15 s.
            let factor = 1i32 << attempt.min(4);
            sleep((retry_ms * factor / 2).min(15_000)).await;
        }
        if mcp.session().is_none() {
            if let Err(e) = mcp.initialize().await {
                if let McpError::Unauthorized(why) = e {
                    wait_for_sign_in(dash, why).await;
                    attempt = 0;
                    continue;
                }
                dash.notice
                    .set(Some(format!("cannot reach the server: {e}")));
                attempt += 1;
                continue;
            }
            need_resync = true;
        }
        if need_resync {
            match resync(&mcp, dash).await {
                Ok(()) => need_resync = false,
                Err(McpError::Unauthorized(why)) => {
                    mcp.forget_session();
                    wait_for_sign_in(dash, why).await;
                    continue;
                }
                Err(McpError::SessionLost) => {
                    mcp.forget_session();
                    // Backs off like any failure: a session lost again at once must not spin.
                    attempt += 1;
                    continue;
                }
                Err(e) => {
                    dash.notice.set(Some(format!("cannot read tasks: {e}")));
                    attempt += 1;
                    continue;
                }
            }
        }
        let resuming = mcp.session().and_then(|s| s.last_event_id).is_some();
        match mcp.open_stream().await {
            Ok(reader) => {
                attempt = 0;
                dash.notice.set(None);
                dash.conn.set(if resuming {
                    Conn::Replaying(0)
                } else {
                    Conn::Connected
                });
                if let Err(e) = follow(&mcp, dash, reader, &mut retry_ms).await {
                    dash.notice.set(Some(format!("stream interrupted: {e}")));
                }
            }
            Err(McpError::SessionLost) => {
                mcp.forget_session();
                continue;
            }
            Err(McpError::Unauthorized(why)) => {
                mcp.forget_session();
                wait_for_sign_in(dash, why).await;
                continue;
            }
            Err(McpError::StaleEventId(why)) => {
                dash.notice.set(Some(format!("re-reading state: {why}")));
                mcp.set_last_event_id(None);
                need_resync = true;
                continue;
            }
            Err(e) => dash
                .notice
                .set(Some(format!("cannot open the stream: {e}"))),
        }
        attempt += 1;
    }
}

/// Shows the sign-in form with `why` and waits until the user has given a token (the form
/// clears `sign_in`); the session starts again with it.
async fn wait_for_sign_in(dash: Dashboard, why: String) {
    dash.notice.set(None);
    dash.sign_in.set(Some(why));
    while dash.sign_in.get_untracked().is_some() {
        sleep(200).await;
    }
}

/// Applies the events of one stream connection until it ends.
async fn follow(
    mcp: &Rc<Mcp>,
    dash: Dashboard,
    mut reader: SseReader,
    retry_ms: &mut i32,
) -> Result<(), McpError> {
    let received = Rc::new(Cell::new(0u64));
    settle_replay(dash, received.clone());
    while let Some(event) = reader.next().await? {
        if let Some(ms) = event.retry_ms {
            *retry_ms = ms.clamp(100, 60_000) as i32;
        }
        let Some(id) = event.id.clone() else {
            continue;
        };
        // Never apply an event twice: ids increase within a stream.
        let last = mcp.session().and_then(|s| s.last_event_id);
        if let (Some(last), Some(this)) = (
            last.as_deref()
                .and_then(|last| last.parse::<EventId>().ok()),
            event.event_id(),
        ) && last.token == this.token
            && this.seq <= last.seq
        {
            continue;
        }
        mcp.set_last_event_id(Some(id.clone()));
        received.set(received.get() + 1);
        if let Conn::Replaying(count) = dash.conn.get_untracked() {
            dash.conn.set(Conn::Replaying(count + 1));
            settle_replay(dash, received.clone());
        }
        if event.data.is_empty() {
            continue;
        }
        let Ok(message) = serde_json::from_str::<Value>(&event.data) else {
            continue;
        };
        if message["method"] == "notifications/message" {
            // Milestones of this client's tasks (started, resumed from step N, completed...).
            let data = &message["params"]["data"];
            if let (Some(task_id), Some(text), Ok(status)) = (
                data["task_id"].as_str(),
                data["message"].as_str(),
                serde_json::from_value::<TaskStatus>(data["status"].clone()),
            ) {
                dash.apply_milestone(&id, task_id, status, text);
            }
            continue;
        }
        if message["method"] != "notifications/resources/updated" {
            continue;
        }
        let meta = &message["params"]["_meta"];
        // One changed task, or, after this session fell behind, a list's current tasks.
        let changed: Vec<TaskInfo> = match serde_json::from_value(meta[TASK_META_KEY].clone()) {
            Ok(task) => vec![task],
            Err(_) => serde_json::from_value(meta[TASK_LIST_META_KEY].clone()).unwrap_or_default(),
        };
        // The `Date` header has whole seconds: a change within the second before the stream
        // opened counts as live too.
        let live = |task: &TaskInfo| {
            reader
                .opened_at_ms
                .is_some_and(|opened| task.updated_at.timestamp_millis() >= opened - 1_000)
        };
        if changed.iter().any(live) && matches!(dash.conn.get_untracked(), Conn::Replaying(_)) {
            dash.conn.set(Conn::Connected);
        }
        for task in changed {
            dash.apply_event(&id, task);
        }
    }
    Ok(())
}

/// Switches "replaying" to "connected" once no event came for a moment.
fn settle_replay(dash: Dashboard, received: Rc<Cell<u64>>) {
    let seen = received.get();
    set_timeout(
        move || {
            if received.get() == seen && matches!(dash.conn.get_untracked(), Conn::Replaying(_)) {
                dash.conn.set(Conn::Connected);
            }
        },
        std::time::Duration::from_millis(REPLAY_QUIET_MS as u64),
    );
}
