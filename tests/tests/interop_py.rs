//! The Python SDK's client (PyPI `mcp` 2.x, installed by `scripts/setup` into
//! `tests/interop/.venv`) against the real server, in its default mode (the stateless
//! 2026-07-28 protocol, negotiated by `server/discover`) and pinned to a 2025-11-25 session: it
//! lists tools, starts a task, follows it to its end, and gets a clear error for a bad call; on
//! 2026-07-28 it also runs tasks of the SEP-2663 extension, one of which asks it questions.

use std::path::{Path, PathBuf};

use durable_tests::Server;
use serde_json::{Value, json};
use tokio::process::Command;

/// The interop directory and its virtualenv's Python, which `scripts/setup` installs.
fn interop_python() -> (&'static Path, PathBuf) {
    let interop = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/interop"));
    let python = interop.join(".venv/bin/python");
    assert!(
        python.is_file(),
        "the Python SDK is not installed; run scripts/setup"
    );
    (interop, python)
}

/// Runs `python_client.py` against `url` in the SDK's `mode` (`auto`, its default, or
/// `legacy`); returns its report and its stderr.
async fn run_client(url: &str, mode: &str) -> (Value, String) {
    let (interop, python) = interop_python();
    let output = durable_tests::output_within(
        Command::new(python)
            .arg(interop.join("python_client.py"))
            .arg(url)
            .env("MCP_MODE", mode)
            .env_remove("MCP_BEARER_TOKEN"),
        std::time::Duration::from_secs(180),
    )
    .await;
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert!(output.status.success(), "python client failed:\n{stderr}");
    let report = serde_json::from_slice(&output.stdout).expect("a JSON report");
    (report, stderr)
}

/// What the everyday flow must show in either protocol: every tool listed, the task followed
/// to the result an uninterrupted run computes, the bad call's error naming its field.
async fn assert_everyday_flow(report: &Value) {
    assert_eq!(report["tools"].as_array().unwrap().len(), 17, "{report}");
    assert_eq!(report["final_status"], "completed", "{report}");
    // The SDK read the result an uninterrupted run computes (the digest covers every item).
    let (_clean_dir, _clean_server, clean) = durable_tests::uninterrupted(
        "0.01",
        "start_batch_processing",
        &json!({"batch_size": 2, "total_items": 6, "processing_delay": 1}),
    )
    .await;
    assert_eq!(Some(&report["result"]), clean.result_data.as_ref());
    assert_eq!(report["bad_call_is_error"], true);
    assert_eq!(
        report["bad_call_text"],
        "batch_size must be between 1 and 1000000, got 0"
    );
}

/// The SDK's default mode negotiates the stateless 2026-07-28 protocol: the everyday flow with
/// `subscriptions/listen`, a task-only tool run as an SEP-2663 task polled to its inline result,
/// and the travel flow, whose two questions reach the SDK as the task's `inputRequests` and
/// are answered with `tasks/update`, each applied once; then the same trip as a plain call,
/// whose questions are `input_required` results answered by the SDK's elicitation callback.
#[tokio::test]
async fn the_python_sdk_client_speaks_2026_07_28_by_default() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path(), &["--time-scale", "0.01"]).await;
    let (report, _) = run_client(&server.mcp_url(), "auto").await;
    assert_eq!(report["protocol_version"], "2026-07-28", "{report}");
    assert_eq!(report["tasks_extension_advertised"], true, "{report}");
    assert_everyday_flow(&report).await;
    assert!(
        report["notified"].as_u64().unwrap() >= 1,
        "the listen stream carried no update of the task: {report}"
    );

    let handles = report["task_handles"].as_array().unwrap();
    assert_eq!(handles.len(), 2, "{report}");
    assert!(
        handles
            .iter()
            .all(|handle| handle["ttl_ms"].as_u64() > Some(0))
    );
    let (_clean_dir, _clean_server, clean) = durable_tests::uninterrupted(
        "0.01",
        "start_batch_processing",
        &json!({"batch_size": 2, "total_items": 6, "processing_delay": 1}),
    )
    .await;
    // The task's inline result is the plain call's: the kind's result with its task id.
    let mut task_result = report["task_result"].clone();
    let task_id = task_result
        .as_object_mut()
        .and_then(|fields| fields.remove("task_id"));
    assert!(task_id.is_some(), "{report}");
    assert_eq!(Some(task_result), clean.result_data, "{report}");

    let questions: Vec<&str> = report["questions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|question| question["id"].as_str().unwrap())
        .collect();
    assert_eq!(questions, ["choose_hotel", "confirm_booking"], "{report}");
    assert_eq!(report["trip_is_error"], false, "{report}");
    let trip = &report["trip_result"];
    assert_eq!(trip["answers_applied"], 2, "{report}");
    assert_eq!(trip["booked"], true, "{report}");

    // The same trip as a plain call: its two questions as input_required results, answered by
    // the SDK's elicitation callback; the same booking.
    let inline = report["inline_questions"].as_array().unwrap();
    assert_eq!(inline.len(), 2, "{report}");
    assert!(
        inline[0]
            .as_str()
            .unwrap()
            .starts_with("Which hotel in Lisbon")
    );
    assert_eq!(report["inline_trip_is_error"], false, "{report}");
    let mut inline_trip = report["inline_trip_result"].clone();
    let mut tasked_trip = trip.clone();
    for result in [&mut inline_trip, &mut tasked_trip] {
        result.as_object_mut().unwrap().remove("task_id");
    }
    assert_eq!(inline_trip, tasked_trip, "{report}");
}

/// Pinned to the session protocol, the same SDK initializes 2025-11-25, subscribes with
/// `resources/subscribe` and ends its session with a DELETE.
#[tokio::test]
async fn the_python_sdk_client_in_legacy_mode_uses_a_session() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path(), &["--time-scale", "0.01"]).await;
    let (report, stderr) = run_client(&server.mcp_url(), "legacy").await;
    assert_eq!(report["protocol_version"], "2025-11-25", "{report}");
    assert_everyday_flow(&report).await;
    assert!(
        !stderr.contains("Session termination failed"),
        "DELETE must succeed: {stderr}"
    );
}

/// The same flow against a server that requires tokens, the token given to the SDK's HTTP
/// client: refused without it; with it, the task is the token subject's.
#[tokio::test]
async fn the_python_sdk_client_connects_with_a_bearer_token() {
    let (interop, python) = interop_python();
    let dir = tempfile::tempdir().unwrap();
    let issuer = durable_tests::auth::Issuer::new(dir.path());
    let server = issuer
        .start_server(dir.path(), &["--time-scale", "0.01"])
        .await;
    let run = |token: Option<String>| {
        let mut command = Command::new(&python);
        command
            .arg(interop.join("python_client.py"))
            .arg(server.mcp_url())
            .env_remove("MCP_BEARER_TOKEN");
        if let Some(token) = token {
            command.env("MCP_BEARER_TOKEN", token);
        }
        command
    };
    let limit = std::time::Duration::from_secs(120);
    let refused = durable_tests::output_within(&mut run(None), limit).await;
    assert!(!refused.status.success(), "connected without a token");
    let token = issuer.token("py-user", durable_tests::auth::WRITE);
    let output = durable_tests::output_within(&mut run(Some(token)), limit).await;
    assert!(
        output.status.success(),
        "python client failed:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let report: Value = serde_json::from_slice(&output.stdout).expect("a JSON report");
    assert_eq!(report["final_status"], "completed", "{report}");
    assert_eq!(report["result"]["processed"], 6);
    let listed = issuer.operator(&server).await.read("task://list").await;
    assert_eq!(listed["tasks"][0]["owner"], "py-user", "{listed}");
}
