//! Every tool and resource of the server, driven over Streamable HTTP by rmcp's client against
//! the real binary: results, progress, subscriptions, logging and bad input.
// resources/subscribe and logging are deprecated for 2026-07-28 but are how 2025-11-25 clients
// follow resources and milestones, which is what these tests check.
#![allow(deprecated)]

use std::collections::BTreeSet;
use std::time::Duration;

use durable_shared::TaskStatus;
use durable_shared::results::{BatchResult, MigrationResult, ProcessingResult, TrainingResult};
use durable_tests::{Client, IO_TIMEOUT, Note, Server, text_of, within};
use rmcp::model::SubscribeRequestParams;
use serde_json::{Value, json};

const FAST: &[&str] = &["--time-scale", "0.001"];
const TASK_LIMIT: Duration = Duration::from_secs(60);

async fn server(extra: &[&str]) -> (tempfile::TempDir, Server) {
    let dir = tempfile::tempdir().expect("temp dir");
    let server = Server::start(dir.path(), extra).await;
    (dir, server)
}

fn task_id(started: &Value) -> String {
    started["task_id"].as_str().expect("task_id").to_owned()
}

#[tokio::test]
async fn every_tool_is_listed_with_a_described_bounded_schema() {
    let (_dir, server) = server(FAST).await;
    let client = Client::connect(&server.mcp_url(), None).await;
    let tools = within(IO_TIMEOUT, "tools/list", client.service.list_all_tools())
        .await
        .expect("tools/list");
    let names: BTreeSet<&str> = tools.iter().map(|tool| tool.name.as_ref()).collect();
    let expected: BTreeSet<&str> = [
        "start_data_migration",
        "start_batch_processing",
        "start_ml_training",
        "resumable_data_processing",
        "cancel_task",
        "pause_task",
        "resume_task",
        "get_server_stats",
        "list_session_tasks",
        "get_checkpoint_stats",
        "get_session_info",
        "run_data_migration",
        "run_batch_processing",
        "run_ml_training",
        "start_trip_planning",
        "run_trip_planning",
        "answer_task",
    ]
    .into();
    assert_eq!(names, expected);
    for tool in &tools {
        assert!(
            tool.description.as_deref().is_some_and(|d| d.len() > 20),
            "{} needs a description",
            tool.name
        );
    }
    let batch = tools
        .iter()
        .find(|tool| tool.name == "start_batch_processing")
        .unwrap();
    let schema = Value::Object((*batch.input_schema).clone());
    assert_eq!(schema["properties"]["batch_size"]["minimum"], json!(1));
    assert_eq!(
        schema["properties"]["processing_delay"]["default"],
        json!(10.0)
    );
    assert!(
        schema["properties"]["total_items"]["description"]
            .as_str()
            .is_some()
    );
    let required: BTreeSet<&str> = schema["required"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    assert_eq!(required, ["batch_size", "total_items"].into());

    let resources = within(
        IO_TIMEOUT,
        "resources/list",
        client.service.list_all_resources(),
    )
    .await
    .unwrap();
    assert_eq!(resources.len(), 1);
    assert_eq!(resources[0].uri, "task://list");
    let templates = within(
        IO_TIMEOUT,
        "templates/list",
        client.service.list_all_resource_templates(),
    )
    .await
    .unwrap();
    let templates: BTreeSet<&str> = templates.iter().map(|t| t.uri_template.as_str()).collect();
    assert_eq!(
        templates,
        ["task://list/{status}", "task://status/{task_id}"].into()
    );
    client.close().await;
}

#[tokio::test]
async fn each_background_kind_returns_its_link_at_once_and_completes() {
    let (_dir, server) = server(FAST).await;
    let client = Client::connect(&server.mcp_url(), Some("kind-runner")).await;

    let result = client
        .call(
            "start_data_migration",
            json!({"source_path": "sample:customers", "destination_path": "out/customers.jsonl", "record_count": 250}),
        )
        .await;
    let started = result.structured_content.clone().unwrap();
    let id = task_id(&started);
    let uri = format!("task://status/{id}");
    let link = result.content[0]
        .as_resource_link()
        .expect("resource_link first");
    assert_eq!(link.uri, uri);
    assert_eq!(text_of(&result), uri);
    assert_eq!(started["status_uri"], json!(uri));

    let task = client.wait_terminal(&id, TASK_LIMIT).await;
    assert_eq!(task.status, TaskStatus::Completed, "{task:?}");
    assert_eq!((task.progress, task.total, task.percent), (250, 250, 100.0));
    assert_eq!(task.owner, "kind-runner");
    assert_eq!(task.kind, "data_migration");
    assert_eq!(task.parameters["record_count"], json!(250));
    assert!(task.completed_at.is_some());
    let migration: MigrationResult = serde_json::from_value(task.result_data.unwrap()).unwrap();
    assert_eq!(migration.migrated_records, 250);
    let lines: Vec<Value> = std::fs::read_to_string(server.data_path("out/customers.jsonl"))
        .unwrap()
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    let ids: Vec<u64> = lines.iter().map(|r| r["id"].as_u64().unwrap()).collect();
    assert_eq!(ids, (1..=250).collect::<Vec<_>>());

    let started = client
        .call_ok(
            "start_batch_processing",
            json!({"batch_size": 7, "total_items": 50, "processing_delay": 1}),
        )
        .await;
    let task = client.wait_terminal(&task_id(&started), TASK_LIMIT).await;
    let batch: BatchResult = serde_json::from_value(task.result_data.unwrap()).unwrap();
    assert_eq!((batch.processed, batch.batches, batch.total), (50, 8, 50));
    assert_eq!(batch.digest.len(), 64);

    let started = client
        .call_ok(
            "start_ml_training",
            json!({"model_name": "churn", "dataset_size": 500, "epochs": 12}),
        )
        .await;
    let task = client.wait_terminal(&task_id(&started), TASK_LIMIT).await;
    assert_eq!(task.message.split(" - ").next(), Some("Epoch 12/12"));
    let training: TrainingResult = serde_json::from_value(task.result_data.unwrap()).unwrap();
    assert_eq!(training.history.len(), 12);
    assert_eq!(training.history[11].loss, training.final_loss);
    assert!(training.history[11].loss < training.history[0].loss);

    let stats = client.call_ok("get_server_stats", json!({})).await;
    assert_eq!(stats["completed_tasks"], json!(3));
    assert_eq!(stats["total_tasks"], json!(3));
    let checkpoints = client.call_ok("get_checkpoint_stats", json!({})).await;
    assert_eq!(checkpoints["total_checkpoints"], json!(3));
    assert_eq!(checkpoints["total_steps_committed"], json!(3 + 8 + 12));
    client.close().await;
}

#[tokio::test]
async fn resumable_processing_streams_progress_and_a_repeat_call_attaches() {
    let (_dir, server) = server(&["--time-scale", "0.02"]).await;
    let client = Client::connect(&server.mcp_url(), None).await;
    let args = json!({"dataset_name": "sales", "total_records": 50, "batch_size": 10, "client_id": "proc-client"});
    let result = client.call("resumable_data_processing", args.clone()).await;
    let output = result
        .structured_content
        .clone()
        .expect("structured result");
    let processed: ProcessingResult = serde_json::from_value(output.clone()).unwrap();
    assert_eq!(processed.total_processed, 50);
    assert_eq!(processed.records.len(), 5);
    assert_eq!(processed.records[0].record_id, "sales_000000");
    assert_eq!(processed.records[4].record_id, "sales_000004");
    assert_eq!(
        client.progress_reaching(50.0).await,
        vec![0.0, 10.0, 20.0, 30.0, 40.0, 50.0]
    );

    // The same arguments return the stored result of the same task, processing nothing again.
    let again = client.call("resumable_data_processing", args).await;
    assert_eq!(again.structured_content, Some(output.clone()));
    let task = client.task(output["task_id"].as_str().unwrap()).await;
    assert_eq!((task.step, task.owner.as_str()), (5, "proc-client"));

    // Other arguments are another task.
    let other = client
        .call_ok(
            "resumable_data_processing",
            json!({"dataset_name": "sales", "total_records": 20, "batch_size": 10, "client_id": "proc-client"}),
        )
        .await;
    assert_ne!(other["task_id"], output["task_id"]);
    assert_eq!(other["total_processed"], json!(20));
    client.close().await;
}

#[tokio::test]
async fn resources_show_tasks_and_subscribers_hear_of_every_change() {
    let (_dir, server) = server(&["--time-scale", "0.01"]).await;
    let client = Client::connect(&server.mcp_url(), Some("watcher")).await;
    // 0.2 s per step: every step comes after the subscriptions below, however slow they are.
    let started = client
        .call_ok(
            "start_batch_processing",
            json!({"batch_size": 1, "total_items": 6, "processing_delay": 20}),
        )
        .await;
    let id = task_id(&started);
    let uri = format!("task://status/{id}");
    for subscription in [uri.as_str(), "task://list", "task://list/completed"] {
        within(
            IO_TIMEOUT,
            "subscribe",
            client
                .service
                .subscribe(SubscribeRequestParams::new(subscription.to_owned())),
        )
        .await
        .unwrap();
    }
    let task = client.wait_terminal(&id, TASK_LIMIT).await;
    assert_eq!(task.status, TaskStatus::Completed);

    within(IO_TIMEOUT, "completion notifications", async {
        loop {
            let notes = client.notes();
            let updated = |target: &str| {
                notes
                    .iter()
                    .filter(|note| matches!(note, Note::ResourceUpdated { uri, .. } if uri == target))
                    .count()
            };
            let completed_log = notes.iter().any(|note| {
                matches!(note, Note::Log(log) if log.data["message"].as_str().is_some_and(|m| m.ends_with("completed")))
            });
            if updated(&uri) >= 6 && updated("task://list") >= 6 && updated("task://list/completed") >= 1 && completed_log {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;

    let all = client.read("task://list").await;
    assert_eq!(all["total"], json!(1));
    assert_eq!(all["tasks"][0]["task_id"], json!(id));
    let completed = client.read("task://list/completed").await;
    assert_eq!(completed["status_filter"], json!("completed"));
    assert_eq!(completed["total"], json!(1));
    let running = client.read("task://list/running").await;
    assert_eq!(running["total"], json!(0));
    let status = client.read(&uri).await;
    for field in [
        "task_id",
        "status",
        "progress",
        "total",
        "message",
        "result_data",
        "error",
        "created_at",
        "updated_at",
        "completed_at",
        "kind",
        "parameters",
        "owner",
    ] {
        assert!(
            status.get(field).is_some(),
            "status lacks {field}: {status}"
        );
    }
    client.close().await;
}

#[tokio::test]
async fn bad_input_gets_specific_errors_and_the_session_keeps_working() {
    let (dir, server) = server(FAST).await;
    let client = Client::connect(&server.mcp_url(), None).await;
    let cases = [
        (
            "start_batch_processing",
            json!({"batch_size": 10}),
            "missing field `total_items`",
        ),
        (
            "start_batch_processing",
            json!({"batch_size": "ten", "total_items": 5}),
            "invalid type: string \"ten\"",
        ),
        (
            "start_batch_processing",
            json!({"batch_size": 0, "total_items": 5}),
            "batch_size must be between 1 and 1000000, got 0",
        ),
        (
            "start_batch_processing",
            json!({"batch_size": -3, "total_items": 5}),
            "invalid value: integer `-3`",
        ),
        (
            "start_batch_processing",
            json!({"batch_size": 1, "total_items": 1_000_000_000_000u64}),
            "total_items must be between 1 and 100000000",
        ),
        (
            "start_batch_processing",
            json!({"batch_size": 1, "total_items": 5, "processing_delay": -1}),
            "processing_delay must be between 0 and 3600",
        ),
        (
            "start_ml_training",
            json!({"model_name": "m", "epochs": 0}),
            "epochs must be between 1 and 1000, got 0",
        ),
        (
            "start_ml_training",
            json!({"model_name": ""}),
            "model_name length must be between 1 and 100, got 0",
        ),
        (
            "start_data_migration",
            json!({"source_path": "../secrets.csv", "destination_path": "out.jsonl"}),
            "must not contain '..'",
        ),
        (
            "start_data_migration",
            json!({"source_path": "sample:customers", "destination_path": "/etc/out.jsonl"}),
            "must be relative to the data directory, not absolute",
        ),
        (
            "start_data_migration",
            json!({"source_path": "sample:unicorns", "destination_path": "out.jsonl"}),
            "not a known generator; use one of: sample:customers, sample:orders",
        ),
        (
            "start_data_migration",
            json!({"source_path": "missing.jsonl", "destination_path": "out.jsonl"}),
            "does not exist in the data directory",
        ),
        (
            "start_data_migration",
            json!({"source_path": "sample:orders", "destination_path": "out.jsonl", "record_count": 0}),
            "record_count must be between 1 and 10000000, got 0",
        ),
        (
            "resumable_data_processing",
            json!({"total_records": 10, "batch_size": 0}),
            "batch_size must be between 1 and 10000, got 0",
        ),
        (
            "cancel_task",
            json!({"task_id": "no-such-task"}),
            "task no-such-task not found",
        ),
        ("pause_task", json!({}), "missing field `task_id`"),
        (
            "list_session_tasks",
            json!({"status": "done"}),
            "unknown task status \"done\"; valid statuses are: pending, running, paused, input_required, completed, failed, cancelled",
        ),
    ];
    for (tool, args, expected) in cases {
        let error = client.call_err(tool, args.clone()).await;
        assert!(
            error.contains(expected),
            "{tool} {args}: {error:?} lacks {expected:?}"
        );
    }

    // Each error names the field it is about, for forms to show it in the right place.
    let field_cases = [
        (
            "start_batch_processing",
            json!({"batch_size": 10}),
            "total_items",
        ),
        (
            "start_batch_processing",
            json!({"batch_size": "ten", "total_items": 5}),
            "batch_size",
        ),
        ("start_ml_training", json!({"model_name": ""}), "model_name"),
        (
            "start_data_migration",
            json!({"source_path": "missing.jsonl", "destination_path": "out.jsonl"}),
            "source_path",
        ),
        (
            "resumable_data_processing",
            json!({"batch_size": 0}),
            "batch_size",
        ),
    ];
    for (tool, args, field) in field_cases {
        let result = client.call(tool, args.clone()).await;
        let error = result.structured_content.unwrap_or_default();
        assert_eq!(error["field"], field, "{tool} {args}: {error}");
    }

    std::fs::write(
        dir.path().join("data/short.jsonl"),
        "{\"a\":1}\n{\"a\":2}\n",
    )
    .unwrap();
    let error = client
        .call_err(
            "start_data_migration",
            json!({"source_path": "short.jsonl", "destination_path": "out.jsonl", "record_count": 3}),
        )
        .await;
    assert_eq!(
        error,
        "record_count is 3 but source_path \"short.jsonl\" holds only 2 records"
    );

    let started = client
        .call_ok(
            "start_batch_processing",
            json!({"batch_size": 5, "total_items": 5, "processing_delay": 0}),
        )
        .await;
    let id = task_id(&started);
    client.wait_terminal(&id, TASK_LIMIT).await;
    for action in ["pause", "resume", "cancel"] {
        let error = client
            .call_err(&format!("{action}_task"), json!({"task_id": id}))
            .await;
        assert_eq!(error, format!("cannot {action} task {id}: it is completed"));
    }

    let unknown = within(
        IO_TIMEOUT,
        "read unknown",
        client
            .service
            .read_resource(rmcp::model::ReadResourceRequestParams::new(
                "task://status/nope".to_owned(),
            )),
    )
    .await
    .unwrap_err();
    assert!(
        unknown.to_string().contains("task nope not found"),
        "{unknown}"
    );
    let bad_status = within(
        IO_TIMEOUT,
        "read bad status",
        client
            .service
            .read_resource(rmcp::model::ReadResourceRequestParams::new(
                "task://list/finished".to_owned(),
            )),
    )
    .await
    .unwrap_err();
    assert!(
        bad_status.to_string().contains("valid statuses are"),
        "{bad_status}"
    );

    // Every error above left the session usable.
    let stats = client.call_ok("get_server_stats", json!({})).await;
    assert_eq!(stats["completed_tasks"], json!(1));
    client.close().await;
}

#[tokio::test]
async fn client_ids_scope_session_task_lists() {
    let (_dir, server) = server(FAST).await;
    let alice = Client::connect(&server.mcp_url(), Some("alice")).await;
    let bob = Client::connect(&server.mcp_url(), Some("bob")).await;
    let anonymous = Client::connect(&server.mcp_url(), None).await;
    let args = json!({"batch_size": 1, "total_items": 2, "processing_delay": 0});
    let alice_task = task_id(&alice.call_ok("start_batch_processing", args.clone()).await);
    let bob_task = task_id(&bob.call_ok("start_batch_processing", args.clone()).await);
    let anonymous_task = task_id(&anonymous.call_ok("start_batch_processing", args).await);

    let mine = alice.call_ok("list_session_tasks", json!({})).await;
    assert_eq!(mine["persistent_id"], json!("alice"));
    assert_eq!(mine["total_tasks"], json!(1));
    assert_eq!(mine["tasks"][0]["task_id"], json!(alice_task));
    let theirs = alice
        .call_ok("list_session_tasks", json!({"client_id": "bob"}))
        .await;
    assert_eq!(theirs["tasks"][0]["task_id"], json!(bob_task));

    let info = anonymous.call_ok("get_session_info", json!({})).await;
    let session_id = info["session_id"].as_str().expect("session id").to_owned();
    assert_eq!(
        info["client_id"],
        json!(session_id),
        "without X-Client-Id the session id owns tasks"
    );
    assert_eq!(info["protocol_version"], json!("2025-11-25"));
    let own = anonymous.call_ok("list_session_tasks", json!({})).await;
    assert_eq!(own["tasks"][0]["task_id"], json!(anonymous_task));

    let info = alice.call_ok("get_session_info", json!({})).await;
    assert_eq!(info["client_id"], json!("alice"));
    assert!(info["request_id"].is_number());
    for client in [alice, bob, anonymous] {
        client.close().await;
    }
}

#[tokio::test]
async fn a_foreign_origin_is_refused_and_loopback_origins_pass() {
    let (_dir, server) = server(FAST).await;
    let http = reqwest::Client::new();
    let initialize = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "raw", "version": "1"}}});
    let send = |origin: &'static str| {
        http.post(server.mcp_url())
            .header("Origin", origin)
            .header("Accept", "application/json, text/event-stream")
            .json(&initialize)
            .send()
    };
    let foreign = within(IO_TIMEOUT, "foreign origin", send("http://evil.example"))
        .await
        .unwrap();
    assert_eq!(foreign.status(), 403);
    let local = within(IO_TIMEOUT, "loopback origin", send("http://localhost:8081"))
        .await
        .unwrap();
    assert_eq!(local.status(), 200);
    assert!(local.headers().contains_key("mcp-session-id"));
}

#[tokio::test]
async fn the_task_report_prompt_carries_the_task_state() {
    let (_dir, server) = server(FAST).await;
    let client = Client::connect(&server.mcp_url(), None).await;
    let prompts = within(
        IO_TIMEOUT,
        "prompts/list",
        client.service.list_all_prompts(),
    )
    .await
    .unwrap();
    assert_eq!(prompts.len(), 1);
    assert_eq!(prompts[0].name, "task_report");
    let started = client
        .call_ok(
            "start_batch_processing",
            json!({"batch_size": 1, "total_items": 2, "processing_delay": 0}),
        )
        .await;
    let id = task_id(&started);
    let mut arguments = serde_json::Map::new();
    arguments.insert("task_id".into(), json!(id));
    let prompt = within(
        IO_TIMEOUT,
        "prompts/get",
        client.service.get_prompt(
            rmcp::model::GetPromptRequestParams::new("task_report").with_arguments(arguments),
        ),
    )
    .await
    .unwrap();
    let text = serde_json::to_string(&prompt.messages[0]).unwrap();
    assert!(
        text.contains(&id) && text.contains("batch_processing"),
        "{text}"
    );
    let unknown = within(
        IO_TIMEOUT,
        "prompts/get unknown",
        client
            .service
            .get_prompt(rmcp::model::GetPromptRequestParams::new("nope")),
    )
    .await
    .unwrap_err();
    assert!(unknown.to_string().contains("unknown prompt"), "{unknown}");
    client.close().await;
}
