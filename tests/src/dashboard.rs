//! What the dashboard's browser tests and its benchmark share: the built dashboard, a server
//! that serves it, many finished tasks, and a record of what changes in the task table's DOM.

use std::path::PathBuf;
use std::time::Duration;

use futures::StreamExt;
use serde_json::json;

use crate::browser::Browser;
use crate::{Client, Server, TASK_LIMIT, within};

/// The built dashboard (`web/dist`).
pub fn dist() -> String {
    let dist = PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../web/dist"));
    assert!(
        dist.join("index.html").is_file(),
        "the dashboard is not built; run scripts/build-dashboard (scripts/test does)"
    );
    dist.display().to_string()
}

/// A server serving the dashboard, started with `extra` flags.
pub async fn server(extra: &[&str]) -> (tempfile::TempDir, Server) {
    let dir = tempfile::tempdir().unwrap();
    let dist = dist();
    let mut args = vec!["--dashboard-dir", dist.as_str()];
    args.extend_from_slice(extra);
    let server = Server::start(dir.path(), &args).await;
    (dir, server)
}

/// Starts `count` one-item batch tasks (16 calls at a time) and waits until all of them have
/// completed, so that none of them changes any more.
pub async fn finished_tasks(client: &Client, count: usize) {
    let instant = json!({"batch_size": 1, "total_items": 1, "processing_delay": 0});
    futures::stream::iter(0..count)
        .map(|_| client.call_ok("start_batch_processing", instant.clone()))
        .buffer_unordered(16)
        .collect::<Vec<_>>()
        .await;
    within(TASK_LIMIT, "the tasks to finish", async {
        loop {
            let stats = client.call_ok("get_server_stats", json!({})).await;
            let unfinished: u64 = ["pending_tasks", "running_tasks"]
                .iter()
                .map(|field| stats[field].as_u64().unwrap_or(0))
                .sum();
            if unfinished == 0 {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await
}

/// Starts recording which rows of the task table change from now on: `window.touched` counts
/// the DOM changes (text, attributes, children) inside each row by task id, and
/// `window.outside` those of the table body itself (rows drawn, removed or moved).
pub async fn watch_rows(browser: &Browser) {
    browser
        .js("window.touched = {}; window.outside = 0; \
             const body = document.querySelector('tbody'); \
             new MutationObserver(records => { for (const record of records) { \
               const node = record.target.nodeType === 1 ? record.target : record.target.parentElement; \
               const row = record.target === body ? null : node.closest('tr[data-test=task-row]'); \
               if (row) { const id = row.dataset.taskId; window.touched[id] = (window.touched[id] || 0) + 1; } \
               else { window.outside += 1; } } }) \
               .observe(body, {subtree: true, childList: true, attributes: true, characterData: true}); \
             return null;")
        .await;
}

/// Records, in `window.reached`, the page's clock (ms since the epoch) at each change of task
/// `task_id`'s row status, with the status it changed to.
pub async fn time_status_changes(browser: &Browser, task_id: &str) {
    browser
        .js(&format!(
            "window.reached = []; \
             const row = document.querySelector(\"tr[data-task-id='{task_id}']\"); \
             new MutationObserver(() => window.reached.push([Date.now(), row.dataset.status])) \
               .observe(row, {{attributes: true, attributeFilter: ['data-status']}}); \
             return null;"
        ))
        .await;
}
