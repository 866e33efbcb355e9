//! The Python SDK's client (PyPI `mcp` 2.x, installed by `scripts/setup` into
//! `tests/interop/.venv`) against the real server: its `server/discover` probe is refused at
//! once and it falls back to `initialize`; it lists tools, starts a task, subscribes, reads the
//! status until completed, and gets a clear error for a bad call.

use std::path::Path;

use durable_tests::Server;
use serde_json::Value;
use tokio::process::Command;

#[tokio::test]
async fn the_python_sdk_client_lists_starts_follows_and_gets_errors() {
    let interop = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/interop"));
    let python = interop.join(".venv/bin/python");
    assert!(
        python.is_file(),
        "the Python SDK is not installed; run scripts/setup"
    );
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path(), &["--time-scale", "0.01"]).await;
    let output = durable_tests::output_within(
        Command::new(python)
            .arg(interop.join("python_client.py"))
            .arg(server.mcp_url()),
        std::time::Duration::from_secs(120),
    )
    .await;
    assert!(
        output.status.success(),
        "python client failed:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let report: Value = serde_json::from_slice(&output.stdout).expect("a JSON report");
    assert!(
        report["connect_seconds"].as_f64().unwrap() < 5.0,
        "the discover probe must not wait for its timeout: {report}"
    );
    assert_eq!(report["tools"].as_array().unwrap().len(), 14);
    assert_eq!(report["final_status"], "completed");
    assert_eq!(report["result"]["processed"], 6);
    assert_eq!(report["bad_call_is_error"], true);
    assert_eq!(
        report["bad_call_text"],
        "batch_size must be between 1 and 1000000, got 0"
    );
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        !stderr.contains("Session termination failed"),
        "DELETE must succeed: {stderr}"
    );
}
