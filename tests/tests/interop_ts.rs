//! The TypeScript SDK's client (npm `@modelcontextprotocol/sdk`, installed by `scripts/setup`)
//! against the real server: the everyday flow (list, start, subscribe, follow, a bad call), and
//! a tool call resumed across a SIGKILL of the server, where its
//! `StreamableHTTPClientTransport` reconnects with the last resumption token (`Last-Event-ID`)
//! and receives the rest of the progress and the result of its original request; and its
//! experimental tasks client (protocol 2025-11-25 MCP tasks) end to end.

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use durable_tests::Server;
use serde_json::Value;
use tokio::process::Command;

fn interop_dir() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/interop"))
}

#[tokio::test]
async fn the_typescript_sdk_resumes_an_interrupted_call_across_a_kill() {
    assert!(
        interop_dir()
            .join("node_modules/@modelcontextprotocol/sdk")
            .is_dir(),
        "the TypeScript SDK is not installed; run scripts/setup"
    );
    let dir = tempfile::tempdir().unwrap();
    let mut server = Server::start(
        dir.path(),
        &["--time-scale", "0.05", "--sse-retry", "300ms"],
    )
    .await;
    let mut node = Command::new("node")
        .arg(interop_dir().join("resume.mjs"))
        .args([server.mcp_url().as_str(), "150"])
        .current_dir(interop_dir())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .expect("running node");
    let mut rx = durable_tests::stdout_lines(&mut node);
    let mut lines: Vec<Value> = Vec::new();
    let mut killed = false;
    let outcome = loop {
        // A panic drops (and so kills) node.
        let line = match tokio::time::timeout(Duration::from_secs(90), rx.recv()).await {
            Ok(Some(line)) => line,
            Ok(None) | Err(_) => {
                panic!("the TypeScript client went quiet; it printed {lines:#?}");
            }
        };
        let value: Value =
            serde_json::from_str(&line).unwrap_or_else(|_| panic!("not JSON: {line}"));
        if !killed && value["progress"].as_f64().is_some_and(|p| p >= 40.0) {
            server.kill9().await;
            server.restart().await;
            killed = true;
        }
        if value.get("result").is_some() || value.get("error").is_some() {
            break value;
        }
        lines.push(value);
    };
    let status = durable_tests::exit_within(&mut node, Duration::from_secs(30))
        .await
        .expect("the TypeScript client exits after its result");
    assert!(killed, "the server was never killed: {lines:#?}");
    assert!(
        status.success(),
        "client failed: {outcome} after {lines:#?}"
    );
    let result = &outcome["result"]["structuredContent"];
    // Exactly once: what a call nobody interrupted computes, as another client's task.
    let client = durable_tests::Client::connect(&server.mcp_url(), None).await;
    let clean = client
        .call_ok(
            "resumable_data_processing",
            serde_json::json!({"dataset_name": "ts", "total_records": 150, "batch_size": 10, "client_id": "clean"}),
        )
        .await;
    assert_ne!(clean["task_id"], result["task_id"], "a task of its own");
    for field in ["total_processed", "value_sum", "records"] {
        assert_eq!(result[field], clean[field], "{field}: {outcome}");
    }
    // The processing state carries its own sums, so a repeated batch shows as an extra commit.
    let steps = async |task: &Value| client.task(task.as_str().unwrap()).await.step;
    assert_eq!(
        steps(&result["task_id"]).await,
        steps(&clean["task_id"]).await
    );
    client.close().await;
    // Every batch's progress once, in order, across the kill: none repeated, none skipped.
    let progress: Vec<f64> = lines
        .iter()
        .filter_map(|line| line["progress"].as_f64())
        .collect();
    let every_batch: Vec<f64> = (0..=15).map(|batch| f64::from(batch * 10)).collect();
    assert_eq!(progress, every_batch);
    let tokens = lines
        .iter()
        .filter(|line| line.get("token").is_some())
        .count();
    assert!(
        tokens > progress.len(),
        "every event carried a resumption token"
    );
    assert_eq!(lines[0]["protocol"], "2025-11-25");
}

#[tokio::test]
async fn the_typescript_sdk_lists_starts_subscribes_follows_and_gets_errors() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path(), &["--time-scale", "0.01"]).await;
    let output = durable_tests::output_within(
        Command::new("node")
            .arg(interop_dir().join("ts_client.mjs"))
            .arg(server.mcp_url())
            .current_dir(interop_dir()),
        std::time::Duration::from_secs(120),
    )
    .await;
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let report: Value = serde_json::from_slice(&output.stdout).expect("a JSON report");
    assert_eq!(report["tools"].as_array().unwrap().len(), 17);
    assert_eq!(report["final_status"], "completed");
    assert_eq!(report["processed"], 5);
    assert!(
        report["updates"].as_u64().unwrap() > 0,
        "subscription notifications arrive: {report}"
    );
    assert_eq!(report["bad_is_error"], true);
    assert_eq!(
        report["bad_text"],
        "batch_size must be between 1 and 1000000, got 0"
    );
}

/// The same everyday flow against a server that requires tokens: the SDK's transport sends
/// one, and the task it starts is the token subject's.
#[tokio::test]
async fn the_typescript_sdk_connects_with_a_bearer_token() {
    let dir = tempfile::tempdir().unwrap();
    let issuer = durable_tests::auth::Issuer::new(dir.path());
    let server = issuer
        .start_server(dir.path(), &["--time-scale", "0.01"])
        .await;
    let run = |token: Option<String>| {
        let mut command = Command::new("node");
        command
            .arg(interop_dir().join("ts_client.mjs"))
            .arg(server.mcp_url())
            .current_dir(interop_dir())
            .env_remove("MCP_BEARER_TOKEN");
        if let Some(token) = token {
            command.env("MCP_BEARER_TOKEN", token);
        }
        command
    };
    let refused = durable_tests::output_within(&mut run(None), Duration::from_secs(120)).await;
    assert!(!refused.status.success(), "connected without a token");
    let token = issuer.token("ts-user", durable_tests::auth::WRITE);
    let output =
        durable_tests::output_within(&mut run(Some(token)), Duration::from_secs(120)).await;
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let report: Value = serde_json::from_slice(&output.stdout).expect("a JSON report");
    assert_eq!(report["final_status"], "completed", "{report}");
    assert_eq!(report["processed"], 5);
    let listed = issuer.operator(&server).await.read("task://list").await;
    assert_eq!(listed["tasks"][0]["owner"], "ts-user", "{listed}");
}

#[tokio::test]
async fn the_typescript_sdks_tasks_client_runs_polls_lists_and_cancels_tasks() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path(), &["--time-scale", "0.01"]).await;
    let output = durable_tests::output_within(
        Command::new("node")
            .arg(interop_dir().join("ts_tasks.mjs"))
            .arg(server.mcp_url())
            .current_dir(interop_dir()),
        Duration::from_secs(120),
    )
    .await;
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let report: Value = serde_json::from_slice(&output.stdout).expect("a JSON report");
    assert!(
        report["capability"]["requests"]["tools"]["call"].is_object(),
        "{report}"
    );
    assert_eq!(report["task_support"]["run_batch_processing"], "required");
    assert_eq!(
        report["task_support"]["resumable_data_processing"],
        "optional"
    );
    assert_eq!(
        report["task_support"]["start_batch_processing"],
        "forbidden"
    );

    let stream = report["stream"].as_array().unwrap();
    assert_eq!(stream.first().unwrap(), "taskCreated", "{report}");
    assert_eq!(stream.last().unwrap(), "result", "{report}");
    let task_id = report["created"]["taskId"].as_str().unwrap();
    assert_eq!(report["created"]["ttl"], 60000);
    assert_eq!(report["result"]["structuredContent"]["processed"], 6);
    assert_eq!(report["get"]["taskId"], task_id);
    assert_eq!(report["get"]["status"], "completed");
    assert_eq!(
        report["task_result"]["structuredContent"],
        report["result"]["structuredContent"]
    );
    let listed: Vec<&str> = report["list"]["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|task| task["taskId"].as_str().unwrap())
        .collect();
    assert!(listed.contains(&task_id), "{report}");
    assert_eq!(report["cancelled"]["status"], "cancelled", "{report}");
    assert!(
        report["second_cancel"]
            .as_str()
            .unwrap()
            .contains("already cancelled"),
        "{report}"
    );
}

/// A task that asks a person, through the TypeScript SDK on a 2025-11-25 session that declares
/// elicitation: each of the trip's questions reaches the SDK's elicitation handler once, its
/// answers are applied, and the trip ends as a run answered with `answer_task` does.
#[tokio::test]
async fn the_typescript_sdk_answers_a_tasks_questions_by_elicitation() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path(), &["--time-scale", "0.01"]).await;
    let output = durable_tests::output_within(
        Command::new("node")
            .arg(interop_dir().join("ts_questions.mjs"))
            .arg(server.mcp_url())
            .arg("ts-traveller")
            .current_dir(interop_dir()),
        std::time::Duration::from_secs(120),
    )
    .await;
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let report: Value = serde_json::from_slice(&output.stdout).expect("a JSON report");
    let asked = report["asked"].as_array().unwrap();
    assert_eq!(asked.len(), 2, "each question asked once: {report}");
    assert!(
        asked[0]
            .as_str()
            .unwrap()
            .starts_with("Which hotel in Lisbon")
    );
    assert!(asked[1].as_str().unwrap().starts_with("Book "));
    let status = &report["status"];
    assert_eq!(status["status"], "completed", "{report}");
    assert_eq!(status["owner"], "ts-traveller");

    // The same trip answered the same way through answer_task, by another client.
    let client = durable_tests::Client::connect(&server.mcp_url(), Some("baseline")).await;
    let hotel = report["answers"][0]["hotel"]
        .as_str()
        .expect("the hotel chosen");
    let baseline = durable_tests::trip::answered(&client, hotel).await;
    assert_eq!(Some(&status["result_data"]), baseline.result_data.as_ref());
    assert_eq!(status["result_data"]["answers_applied"], 2);
    client.close().await;
}
