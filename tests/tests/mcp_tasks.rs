//! MCP Tasks on the durable engine, in both shapes: the 2025-11-25 Tasks utility over raw HTTP
//! (`task` field, `tasks/get|result|list|cancel`, `notifications/tasks/status`) and the SEP-2663
//! extension through rmcp's client (`CallToolResponse::Task`, `get_task`, `cancel_task`); owner
//! binding, the task-support errors, and a task that continues across a SIGKILL.

use std::time::Duration;

use durable_tests::raw::{EventExt, RawSession, Sse};
use durable_tests::{IO_TIMEOUT, Server, within};
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CancelTaskParams, ClientCapabilities, ClientConfig,
    GetTaskParams, Implementation, TaskPayload, TaskStatus, UpdateTaskParams,
};
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::{ClientHandler, ServiceExt};
use serde_json::{Value, json};

const V: &str = "2025-11-25";
const POLL: Duration = Duration::from_millis(25);

async fn server(extra: &[&str]) -> (tempfile::TempDir, Server) {
    let dir = tempfile::tempdir().expect("temp dir");
    let server = Server::start(dir.path(), extra).await;
    (dir, server)
}

fn quick_batch() -> Value {
    json!({"total_items": 4, "batch_size": 2, "processing_delay": 0})
}

/// A batch that runs until cancelled (one-hour steps).
fn endless_batch() -> Value {
    json!({"total_items": 10, "batch_size": 1, "processing_delay": 3600})
}

async fn create(session: &RawSession, id: u64, tool: &str, args: Value, task: Value) -> Value {
    let created = session
        .call(
            id,
            "tools/call",
            json!({"name": tool, "arguments": args, "task": task}),
        )
        .await;
    created["task"].clone()
}

/// Polls `tasks/get` until the task is in a terminal status; returns the last answer.
async fn poll_to_end(session: &RawSession, task_id: &str, limit: Duration) -> Value {
    within(limit, "the task to end", async {
        let mut id = 10_000;
        loop {
            id += 1;
            let task = session
                .call(id, "tasks/get", json!({"taskId": task_id}))
                .await;
            if ["completed", "failed", "cancelled"].contains(&task["status"].as_str().unwrap()) {
                return task;
            }
            tokio::time::sleep(POLL).await;
        }
    })
    .await
}

fn without_task_id(mut result: Value) -> Value {
    result["structuredContent"]
        .as_object_mut()
        .expect("structured content")
        .remove("task_id");
    result["content"] = Value::Null;
    result
}

/// `YYYY-MM-DDTHH:MM:SS.mmmZ`, as the server writes it.
fn iso8601(text: &Value) -> bool {
    text.as_str().is_some_and(|text| {
        let shape: String = text
            .chars()
            .map(|c| if c.is_ascii_digit() { '9' } else { c })
            .collect();
        shape == "9999-99-99T99:99:99.999Z"
    })
}

#[tokio::test]
async fn capability_and_task_support_are_declared() {
    let (_dir, server) = server(&[]).await;
    let session = RawSession::open(&server.mcp_url(), V).await;
    assert_eq!(
        session.initialized["capabilities"]["tasks"],
        json!({"list": {}, "cancel": {}, "requests": {"tools": {"call": {}}}})
    );
    assert!(
        session.initialized["capabilities"]["extensions"]["io.modelcontextprotocol/tasks"]
            .is_object()
    );
    let tools = session.call(1, "tools/list", json!({})).await;
    let support = |name: &str| {
        tools["tools"]
            .as_array()
            .unwrap()
            .iter()
            .find(|tool| tool["name"] == name)
            .unwrap_or_else(|| panic!("{name} listed"))["execution"]["taskSupport"]
            .clone()
    };
    assert_eq!(support("resumable_data_processing"), "optional");
    for tool in [
        "run_data_migration",
        "run_batch_processing",
        "run_ml_training",
    ] {
        assert_eq!(support(tool), "required", "{tool}");
    }
    for tool in ["start_batch_processing", "cancel_task", "get_server_stats"] {
        assert_eq!(support(tool), "forbidden", "{tool}");
    }

    // A session on an older version gets no tasks capability.
    let old = RawSession::open(&server.mcp_url(), "2025-06-18").await;
    assert!(old.initialized["capabilities"].get("tasks").is_none());
}

#[tokio::test]
async fn a_task_is_created_polled_and_its_result_is_the_plain_calls() {
    let (_dir, server) = server(&["--time-scale", "0"]).await;
    let session = RawSession::open(&server.mcp_url(), V).await;
    let args = json!({"dataset_name": "ledger", "total_records": 50, "batch_size": 10});
    let task = create(
        &session,
        1,
        "resumable_data_processing",
        args.clone(),
        json!({"ttl": 60_000}),
    )
    .await;
    let task_id = task["taskId"].as_str().expect("taskId").to_owned();
    assert!(
        ["working", "completed"].contains(&task["status"].as_str().unwrap()),
        "{task}"
    );
    assert_eq!(task["ttl"], 60_000);
    assert!(
        task["pollInterval"].as_u64().is_some_and(|ms| ms > 0),
        "{task}"
    );
    assert!(
        iso8601(&task["createdAt"]) && iso8601(&task["lastUpdatedAt"]),
        "{task}"
    );

    let ended = poll_to_end(&session, &task_id, Duration::from_secs(60)).await;
    assert_eq!(ended["status"], "completed", "{ended}");
    assert_eq!(ended["taskId"], task_id);
    assert_eq!(ended["createdAt"], task["createdAt"]);

    let result = session
        .call(2, "tasks/result", json!({"taskId": task_id}))
        .await;
    assert_eq!(
        result["_meta"]["io.modelcontextprotocol/related-task"],
        json!({"taskId": task_id})
    );
    assert_eq!(result["structuredContent"]["task_id"], task_id);
    assert_eq!(
        result["structuredContent"]["total_processed"], 50,
        "{result}"
    );

    // The same call made plainly (by another client, so it is another task) answers the same.
    let plain = session
        .call(
            3,
            "tools/call",
            json!({"name": "resumable_data_processing",
                   "arguments": {"dataset_name": "ledger", "total_records": 50, "batch_size": 10,
                                 "client_id": "plain-caller"}}),
        )
        .await;
    let mut task_result = without_task_id(result);
    task_result.as_object_mut().unwrap().remove("_meta");
    assert_eq!(task_result, without_task_id(plain));

    // A finished task's status never changes: cancelling it is refused.
    let refused = session
        .call_error(4, "tasks/cancel", json!({"taskId": task_id}))
        .await;
    assert_eq!(refused["code"], -32602, "{refused}");
    assert!(
        refused["message"]
            .as_str()
            .unwrap()
            .contains("already completed"),
        "{refused}"
    );
    let again = session
        .call(5, "tasks/get", json!({"taskId": task_id}))
        .await;
    assert_eq!(again["status"], "completed");
}

#[tokio::test]
async fn tasks_result_waits_for_the_end_and_tells_status_changes() {
    let (_dir, server) = server(&["--time-scale", "0.01"]).await;
    let session = RawSession::open(&server.mcp_url(), V).await;
    let mut notifications = Sse::new(session.get(None).await);
    // Half a second per step, so the pause below lands before the end.
    let args = json!({"total_items": 6, "batch_size": 1, "processing_delay": 50});
    let task = create(&session, 1, "run_batch_processing", args, json!({})).await;
    let task_id = task["taskId"].as_str().unwrap().to_owned();
    // No ttl asked: the default is granted and reported.
    assert_eq!(task["ttl"], 24 * 60 * 60 * 1000);
    // A pause and a resume change the engine status; the MCP status stays `working`, with a
    // message saying so while paused.
    for (id, tool) in [(10, "pause_task"), (11, "resume_task")] {
        let steered = session
            .call(
                id,
                "tools/call",
                json!({"name": tool, "arguments": {"task_id": task_id}}),
            )
            .await;
        assert_eq!(steered["isError"], false, "{tool}: {steered}");
    }

    // Asked at once, answered only once the task has ended.
    let result = session
        .call(2, "tasks/result", json!({"taskId": task_id}))
        .await;
    let digest = &result["structuredContent"]["digest"];
    assert!(digest.is_string(), "{result}");
    let status = session
        .call(3, "tasks/get", json!({"taskId": task_id}))
        .await;
    assert_eq!(status["status"], "completed");

    let events = notifications
        .until(IO_TIMEOUT, |message| {
            message["method"] == "notifications/tasks/status"
                && message["params"]["status"] == "completed"
        })
        .await;
    let statuses: Vec<Value> = events
        .iter()
        .filter(|event| !event.is_priming())
        .map(|event| event.json())
        .filter(|message| message["method"] == "notifications/tasks/status")
        .inspect(|message| assert_eq!(message["params"]["taskId"], task_id))
        .map(|message| message["params"].clone())
        .collect();
    assert_eq!(
        statuses.last().unwrap()["status"],
        "completed",
        "{statuses:?}"
    );
    let paused = statuses
        .iter()
        .position(|params| {
            params["status"] == "working"
                && params["statusMessage"]
                    .as_str()
                    .is_some_and(|message| message.starts_with("paused at "))
        })
        .unwrap_or_else(|| panic!("the pause was told as working, paused: {statuses:#?}"));
    assert!(
        statuses[paused + 1..]
            .iter()
            .any(|params| params["status"] == "working"
                && !params["statusMessage"]
                    .as_str()
                    .unwrap()
                    .starts_with("paused")),
        "the resume was told: {statuses:#?}"
    );
}

#[tokio::test]
async fn a_running_task_is_cancelled_for_good() {
    let (_dir, server) = server(&[]).await;
    let session = RawSession::open(&server.mcp_url(), V).await;
    let task = create(
        &session,
        1,
        "run_batch_processing",
        endless_batch(),
        json!({"ttl": 5_000}),
    )
    .await;
    let task_id = task["taskId"].as_str().unwrap().to_owned();
    assert_eq!(task["status"], "working");
    assert_eq!(task["ttl"], 5_000);

    let cancelled = session
        .call(2, "tasks/cancel", json!({"taskId": task_id}))
        .await;
    assert_eq!(cancelled["status"], "cancelled", "{cancelled}");
    assert_eq!(cancelled["taskId"], task_id);
    let status = session
        .call(3, "tasks/get", json!({"taskId": task_id}))
        .await;
    assert_eq!(status["status"], "cancelled");
    let result = session
        .call(4, "tasks/result", json!({"taskId": task_id}))
        .await;
    assert_eq!(result["isError"], true);
    assert!(
        result["content"][0]["text"]
            .as_str()
            .unwrap()
            .contains("cancelled"),
        "{result}"
    );
    let refused = session
        .call_error(5, "tasks/cancel", json!({"taskId": task_id}))
        .await;
    assert_eq!(refused["code"], -32602);
}

#[tokio::test]
async fn tasks_list_pages_through_the_callers_tasks_only() {
    let (_dir, server) = server(&["--time-scale", "0"]).await;
    let session = RawSession::open(&server.mcp_url(), V).await;
    let mut created = Vec::new();
    for id in 0..23 {
        let task = create(
            &session,
            id,
            "run_batch_processing",
            quick_batch(),
            json!({}),
        )
        .await;
        created.push(task["taskId"].as_str().unwrap().to_owned());
    }
    let first = session.call(100, "tasks/list", json!({})).await;
    let page = first["tasks"].as_array().unwrap();
    assert_eq!(page.len(), 20);
    let cursor = first["nextCursor"]
        .as_str()
        .expect("a next cursor")
        .to_owned();
    let second = session
        .call(101, "tasks/list", json!({"cursor": cursor}))
        .await;
    assert!(second.get("nextCursor").is_none(), "{second}");
    let listed: Vec<String> = page
        .iter()
        .chain(second["tasks"].as_array().unwrap())
        .map(|task| task["taskId"].as_str().unwrap().to_owned())
        .collect();
    let mut expected = created.clone();
    expected.sort();
    let mut sorted = listed.clone();
    sorted.sort();
    assert_eq!(sorted, expected, "every task exactly once");

    let bad = session
        .call_error(102, "tasks/list", json!({"cursor": "not a cursor"}))
        .await;
    assert_eq!(bad["code"], -32602);

    // Another client sees none of them and can touch none of them.
    let other = RawSession::open(&server.mcp_url(), V).await;
    let theirs = other.call(1, "tasks/list", json!({})).await;
    assert_eq!(theirs["tasks"], json!([]));
    for method in ["tasks/get", "tasks/result", "tasks/cancel"] {
        let error = other
            .call_error(2, method, json!({"taskId": created[0]}))
            .await;
        assert_eq!(error["code"], -32602, "{method}: {error}");
        assert!(
            error["message"].as_str().unwrap().contains("unknown task"),
            "{error}"
        );
    }
    let mine = session
        .call(103, "tasks/get", json!({"taskId": created[0]}))
        .await;
    assert_eq!(mine["taskId"], created[0]);
}

#[tokio::test]
async fn wrong_task_use_gets_the_specified_errors() {
    let (_dir, server) = server(&["--max-body-bytes", "65536"]).await;
    let session = RawSession::open(&server.mcp_url(), V).await;
    let forbidden = session
        .call_error(
            1,
            "tools/call",
            json!({"name": "start_batch_processing",
            "arguments": quick_batch(), "task": {}}),
        )
        .await;
    assert_eq!(forbidden["code"], -32601, "{forbidden}");
    assert!(
        forbidden["message"].as_str().unwrap().contains("forbidden"),
        "{forbidden}"
    );
    let required = session
        .call_error(
            2,
            "tools/call",
            json!({"name": "run_batch_processing",
            "arguments": quick_batch()}),
        )
        .await;
    assert_eq!(required["code"], -32601, "{required}");
    assert!(
        required["message"]
            .as_str()
            .unwrap()
            .contains("only as a task"),
        "{required}"
    );
    let bad_ttl = session
        .call_error(
            3,
            "tools/call",
            json!({"name": "run_batch_processing",
            "arguments": quick_batch(), "task": {"ttl": "soon"}}),
        )
        .await;
    assert_eq!(bad_ttl["code"], -32602, "{bad_ttl}");
    let bad_args = session
        .call_error(
            4,
            "tools/call",
            json!({"name": "run_batch_processing",
            "arguments": {"total_items": "many"}, "task": {}}),
        )
        .await;
    assert_eq!(bad_args["code"], -32602, "{bad_args}");
    assert_eq!(bad_args["data"]["field"], "total_items", "{bad_args}");
    assert!(
        bad_args["message"]
            .as_str()
            .unwrap()
            .contains("batch_processing: total_items: invalid type"),
        "{bad_args}"
    );
    for method in ["tasks/get", "tasks/result", "tasks/cancel"] {
        let unknown = session
            .call_error(
                5,
                method,
                json!({"taskId": "00000000-0000-4000-8000-000000000000"}),
            )
            .await;
        assert_eq!(unknown["code"], -32602, "{method}: {unknown}");
        let missing = session.call_error(6, method, json!({})).await;
        assert_eq!(missing["code"], -32602, "{method}: {missing}");
    }
    let oversized = session
        .post(json!({"jsonrpc": "2.0", "id": 7, "method": "tools/call",
            "params": {"name": "run_batch_processing", "arguments": {"pad": "x".repeat(70_000)},
                       "task": {}}}))
        .await;
    assert_eq!(oversized.status(), 413);
    let body: Value = within(IO_TIMEOUT, "error body", oversized.json())
        .await
        .expect("a JSON-RPC error body");
    assert!(
        body["error"]["message"].as_str().unwrap().contains("65536"),
        "{body}"
    );
    // The server keeps serving.
    session.call(8, "ping", json!({})).await;
}

#[tokio::test]
async fn a_task_continues_across_a_sigkill_with_the_same_id_and_result() {
    let (_dir, mut server) = server(&["--time-scale", "0.02"]).await;
    let args = json!({"model_name": "crash", "dataset_size": 200, "epochs": 12});
    let session = RawSession::open(&server.mcp_url(), V).await;
    let task = create(&session, 2, "run_ml_training", args.clone(), json!({})).await;
    let task_id = task["taskId"].as_str().unwrap().to_owned();

    // Let it get part of the way, then kill the server without warning.
    within(Duration::from_secs(60), "some epochs", async {
        loop {
            let status = session
                .call(4, "tasks/get", json!({"taskId": task_id}))
                .await;
            let message = status["statusMessage"]
                .as_str()
                .unwrap_or_default()
                .to_owned();
            if status["status"] == "completed" {
                panic!("the task ended before the kill: {status}");
            }
            if message.starts_with("Epoch 3/") || message.starts_with("Epoch 4/") {
                return;
            }
            tokio::time::sleep(POLL).await;
        }
    })
    .await;
    server.kill9().await;
    server.restart().await;

    // The same session (restored from the store) polls the same task id to its end.
    let session = session.reconnected();
    let ended = poll_to_end(&session, &task_id, Duration::from_secs(120)).await;
    assert_eq!(ended["status"], "completed", "{ended}");
    let result = session
        .call(5, "tasks/result", json!({"taskId": task_id}))
        .await;

    // The same training, never interrupted.
    let baseline = create(&session, 6, "run_ml_training", args, json!({})).await;
    let baseline_result = session
        .call(7, "tasks/result", json!({"taskId": baseline["taskId"]}))
        .await;
    assert_eq!(
        without_task_id(result)["structuredContent"],
        without_task_id(baseline_result)["structuredContent"],
        "bit-identical to the uninterrupted run"
    );
}

/// An rmcp client that declares the SEP-2663 tasks extension.
#[derive(Clone, Default)]
struct TasksClient;

impl ClientHandler for TasksClient {
    fn get_info(&self) -> ClientConfig {
        let capabilities: ClientCapabilities =
            serde_json::from_value(json!({"extensions": {rmcp::model::TASKS_EXTENSION_ID: {}}}))
                .expect("capabilities");
        ClientConfig::new(capabilities, Implementation::new("tasks-test", "1"))
    }
}

#[tokio::test]
async fn the_extension_shape_through_rmcps_client() {
    // Not 0: at time scale 0 the "endless" batch has no delay and may finish before it is
    // cancelled (the quick one has no delay at any scale).
    let (_dir, server) = server(&["--time-scale", "0.01"]).await;
    let transport = StreamableHttpClientTransport::from_uri(server.mcp_url());
    let client = within(IO_TIMEOUT, "initialize", TasksClient.serve(transport))
        .await
        .expect("initialize");
    // Every request under the harness's deadline.
    let call = |tool: &str, args: Value| {
        let Value::Object(args) = args else {
            unreachable!()
        };
        let params = CallToolRequestParams::new(tool.to_owned()).with_arguments(args);
        within(IO_TIMEOUT, "tools/call", client.call_tool_once(params))
    };
    let get = |task_id: &str| {
        within(
            IO_TIMEOUT,
            "tasks/get",
            client.get_task(GetTaskParams::new(task_id)),
        )
    };
    let cancel = |task_id: &str| {
        within(
            IO_TIMEOUT,
            "tasks/cancel",
            client.cancel_task(CancelTaskParams::new(task_id)),
        )
    };

    // A task-capable tool answers with a task for a client that declared the extension.
    let response = call("run_batch_processing", quick_batch())
        .await
        .expect("tools/call");
    let CallToolResponse::Task(created) = response else {
        panic!("expected a task, got {response:?}")
    };
    let task_id = created.task.task_id.clone();
    assert_eq!(created.task.ttl_ms, Some(24 * 60 * 60 * 1000));
    let completed = within(Duration::from_secs(60), "completion", async {
        loop {
            let task = get(&task_id).await.expect("tasks/get").task;
            if task.status().is_terminal() {
                return task;
            }
            tokio::time::sleep(POLL).await;
        }
    })
    .await;
    let TaskPayload::Completed { result } = &completed.payload else {
        panic!("expected completed, got {completed:?}")
    };
    assert_eq!(result["structuredContent"]["task_id"], task_id.as_str());
    assert!(
        result["structuredContent"]["digest"].is_string(),
        "{result:?}"
    );
    let refused = cancel(&task_id)
        .await
        .expect_err("cancelling a completed task");
    assert!(
        refused.to_string().contains("already completed"),
        "{refused}"
    );

    // Cancelling a running one.
    let response = call("run_batch_processing", endless_batch())
        .await
        .expect("tools/call");
    let CallToolResponse::Task(running) = response else {
        panic!("{response:?}")
    };
    cancel(&running.task.task_id).await.expect("tasks/cancel");
    let cancelled = get(&running.task.task_id).await.expect("tasks/get").task;
    assert_eq!(cancelled.status(), TaskStatus::Cancelled);

    // Tools that forbid tasks answer plainly; unknown ids are errors.
    let plain = call("get_server_stats", json!({}))
        .await
        .expect("plain call");
    assert!(matches!(plain, CallToolResponse::Complete(_)), "{plain:?}");
    let unknown = get("00000000-0000-4000-8000-000000000000")
        .await
        .expect_err("unknown task");
    assert!(unknown.to_string().contains("unknown task"), "{unknown}");
    within(IO_TIMEOUT, "close", client.cancel())
        .await
        .expect("close");
}

/// A task-augmented trip through SEP-2663: `tasks/get` shows each question as `inputRequests`
/// (a form elicitation under the question's id), `tasks/update` answers it (a response under any
/// other key is ignored, as the extension says), and the task completes with both answers
/// applied once.
#[tokio::test]
async fn the_extension_shows_questions_as_input_requests_and_takes_answers_by_update() {
    let (_dir, server) = server(&["--time-scale", "0.01"]).await;
    let transport = StreamableHttpClientTransport::from_uri(server.mcp_url());
    let client = within(IO_TIMEOUT, "initialize", TasksClient.serve(transport))
        .await
        .expect("initialize");
    let Value::Object(args) =
        json!({"destination": "Lisbon", "start_date": "2027-05-14", "budget": 900})
    else {
        unreachable!()
    };
    let params = CallToolRequestParams::new("run_trip_planning").with_arguments(args);
    let response = within(IO_TIMEOUT, "tools/call", client.call_tool_once(params))
        .await
        .expect("tools/call");
    let CallToolResponse::Task(created) = response else {
        panic!("expected a task, got {response:?}")
    };
    let task_id = created.task.task_id.clone();
    let asking = |key: &'static str| {
        let client = &client;
        let task_id = task_id.clone();
        within(Duration::from_secs(60), key, async move {
            loop {
                let task = client
                    .get_task(GetTaskParams::new(task_id.clone()))
                    .await
                    .expect("tasks/get")
                    .task;
                if let TaskPayload::InputRequired { input_requests } = &task.payload
                    && input_requests.contains_key(key)
                {
                    return serde_json::to_value(&input_requests[key]).expect("request JSON");
                }
                assert!(!task.status().is_terminal(), "{task:?}");
                tokio::time::sleep(POLL).await;
            }
        })
    };
    let update = |responses: Value| {
        let responses = serde_json::from_value(responses).expect("input responses");
        within(
            IO_TIMEOUT,
            "tasks/update",
            client.update_task(UpdateTaskParams::new(task_id.clone(), responses)),
        )
    };

    let request = asking("choose_hotel").await;
    assert_eq!(request["method"], "elicitation/create");
    assert!(
        request["params"]["message"]
            .as_str()
            .is_some_and(|m| m.starts_with("Which hotel in Lisbon")),
        "{request}"
    );
    let hotel = request["params"]["requestedSchema"]["properties"]["hotel"]["enum"][1].clone();
    update(json!({"not_asked": {"action": "accept", "content": {"hotel": "x"}}}))
        .await
        .expect("an unknown key is ignored");
    update(json!({"choose_hotel": {"action": "accept", "content": {"hotel": hotel}}}))
        .await
        .expect("tasks/update");
    asking("confirm_booking").await;
    update(json!({"confirm_booking": {"action": "accept", "content": {"book": true}}}))
        .await
        .expect("tasks/update");
    let done = within(Duration::from_secs(60), "completion", async {
        loop {
            let task = client
                .get_task(GetTaskParams::new(task_id.clone()))
                .await
                .expect("tasks/get")
                .task;
            if task.status().is_terminal() {
                return task;
            }
            tokio::time::sleep(POLL).await;
        }
    })
    .await;
    let TaskPayload::Completed { result } = &done.payload else {
        panic!("expected completed, got {done:?}")
    };
    let trip = &result["structuredContent"];
    assert_eq!((&trip["hotel"], &trip["booked"]), (&hotel, &json!(true)));
    assert_eq!(trip["answers_applied"], 2, "each answer applied once");
    within(IO_TIMEOUT, "close", client.cancel())
        .await
        .expect("close");
}
