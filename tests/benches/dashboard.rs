//! Prints what the dashboard costs as its task list grows, each figure beside a baseline
//! measured in the same run (the machine is shared and noisy, so only the ratio means much;
//! nothing here asserts on time):
//!
//! 1. event-to-DOM latency: from the moment a client asks the server to pause (or resume) a
//!    task to the moment that task's row in headless Chromium shows the new status (the page's
//!    clock, in a `MutationObserver`), with 10 tasks listed (the baseline), 2,000 and 10,000;
//! 2. the time from opening the page to its table counting every task (all pages of
//!    `task://list` read), at the same sizes;
//! 3. the size of the built dashboard (`web/dist`): its wasm and JavaScript, raw and gzipped.
//!
//! Run with `cargo bench -p durable-tests --bench dashboard` after `scripts/build-dashboard`
//! (about 2 minutes on 2 cores).

use std::process::{Command, Stdio};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use durable_tests::browser::Browser;
use durable_tests::dashboard::{dist, finished_tasks, server, time_status_changes};
use durable_tests::{Client, within};
use serde_json::json;

/// Task list sizes; the first is the baseline.
const SIZES: [usize; 3] = [10, 2_000, 10_000];
/// Pauses and resumes timed at each size.
const ROUNDS: usize = 20;

fn now_ms() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("the clock is after 1970")
        .as_secs_f64()
        * 1000.0
}

/// Median and 90th percentile.
fn summary(mut values: Vec<f64>) -> (f64, f64) {
    values.sort_by(f64::total_cmp);
    let at = |q: f64| values[((values.len() - 1) as f64 * q).round() as usize];
    (at(0.5), at(0.9))
}

/// What one run at a size measured.
struct Run {
    /// From opening the page to its table counting every task, ms.
    load: f64,
    /// Event-to-DOM latencies, ms.
    latencies: Vec<f64>,
}

/// The run with `tasks` tasks listed.
async fn run(tasks: usize) -> Run {
    // The bench's client owns every task: above the default limit of 10,000 per owner.
    let (_dir, server) = server(&["--max-tasks-per-owner", "20000"]).await;
    let client = Client::connect(&server.mcp_url(), Some("bench")).await;
    finished_tasks(&client, tasks - 1).await;
    let watched = client
        .call_ok(
            "start_batch_processing",
            json!({"batch_size": 1, "total_items": 100_000, "processing_delay": 1}),
        )
        .await["task_id"]
        .as_str()
        .expect("task_id")
        .to_owned();
    let browser = Browser::start().await;
    let opened = now_ms();
    browser.goto(&format!("http://{}/", server.addr)).await;
    browser
        .wait_text("[data-test=page-info]", |t| {
            t.ends_with(&format!(" of {tasks}"))
        })
        .await;
    let load = now_ms() - opened;
    browser
        .wait_text(
            &format!("tr[data-task-id='{watched}'] [data-test=status]"),
            |t| t == "running",
        )
        .await;
    time_status_changes(&browser, &watched).await;
    let mut latencies = Vec::new();
    for round in 0..ROUNDS {
        let (tool, status) = if round % 2 == 0 {
            ("pause_task", "paused")
        } else {
            ("resume_task", "running")
        };
        let asked = now_ms();
        client.call_ok(tool, json!({"task_id": watched})).await;
        let shown =
            browser
                .wait_for(&format!("the row to show {status}"), || async {
                    let reached = browser.js("return window.reached;").await;
                    reached.as_array()?.iter().rev().find_map(|change| {
                        (change[1] == status).then(|| change[0].as_f64()).flatten()
                    })
                })
                .await;
        browser.js("window.reached = []; return null;").await;
        latencies.push(shown - asked);
    }
    client.close().await;
    browser.close().await;
    Run { load, latencies }
}

/// Bytes of `path`, gzipped at the default level as a server would send it.
fn gzipped(path: &std::path::Path) -> u64 {
    let output = Command::new("gzip")
        .args(["-c", "-6"])
        .arg(path)
        .stderr(Stdio::inherit())
        .output()
        .expect("gzip");
    assert!(output.status.success(), "gzip {}", path.display());
    output.stdout.len() as u64
}

fn bundle() {
    let (mut raw, mut zipped) = (0, 0);
    for entry in std::fs::read_dir(dist()).expect("web/dist") {
        let path = entry.expect("a dist entry").path();
        let shipped = path
            .extension()
            .is_some_and(|ext| ext == "wasm" || ext == "js");
        if shipped {
            raw += std::fs::metadata(&path).expect("size").len();
            zipped += gzipped(&path);
        }
    }
    println!(
        "bundle (wasm + js): {:.1} KB raw, {:.1} KB gzipped (target <= 300 KB)",
        raw as f64 / 1024.0,
        zipped as f64 / 1024.0
    );
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    println!("event-to-DOM latency ({ROUNDS} pauses and resumes each) and page load:");
    let mut baseline = None;
    for tasks in SIZES {
        let measured = within(Duration::from_secs(900), "a run", run(tasks)).await;
        let (p50, p90) = summary(measured.latencies);
        let (base_p50, base_load) = *baseline.get_or_insert((p50, measured.load));
        println!(
            "  {tasks:>6} tasks: latency p50 {p50:.1} ms ({:.2}x, target <= 2x), p90 {p90:.1} ms; \
             every task listed {:.0} ms after opening ({:.1}x)",
            p50 / base_p50,
            measured.load,
            measured.load / base_load
        );
    }
    bundle();
}
