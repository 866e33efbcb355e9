//! The Python SDK's client (PyPI `mcp` 2.x, installed by `scripts/setup` into
//! `tests/interop/.venv`) against the real server: its `server/discover` probe is refused at
//! once and it falls back to `initialize`; it lists tools, starts a task, subscribes, reads the
//! status until completed, and gets a clear error for a bad call.

use std::path::{Path, PathBuf};

use durable_tests::Server;
use serde_json::Value;
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

#[tokio::test]
async fn the_python_sdk_client_lists_starts_follows_and_gets_errors() {
    let (interop, python) = interop_python();
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
    assert_eq!(report["tools"].as_array().unwrap().len(), 17);
    assert_eq!(report["final_status"], "completed");
    // The SDK read the result an uninterrupted run computes (the digest covers every item).
    let (_clean_dir, _clean_server, clean) = durable_tests::uninterrupted(
        "0.01",
        "start_batch_processing",
        &serde_json::json!({"batch_size": 2, "total_items": 6, "processing_delay": 1}),
    )
    .await;
    assert_eq!(Some(&report["result"]), clean.result_data.as_ref());
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
