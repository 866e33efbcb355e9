//! The stateless protocol 2026-07-28 over raw HTTP, beside the session versions: `server/discover`,
//! `Mcp-Method`/`Mcp-Name` checked against the body, tools and resources without a session,
//! `subscriptions/listen`, SEP-2663 task handles committed before the answer (a SIGKILL right
//! after it loses nothing) and expiring by their ttl, a closed response stream cancelling its
//! plain call, and a plain call's questions as `input_required` rounds (multi round-trip
//! requests) that survive a SIGKILL between them.

use std::time::Duration;

use durable_tests::raw::{EventExt, STATELESS_VERSION, Sse, Stateless, answer_of};
use durable_tests::trip::{answered, trip};
use durable_tests::{IO_TIMEOUT, Server, within};
use serde_json::{Value, json};

async fn server(extra: &[&str]) -> (tempfile::TempDir, Server) {
    let dir = tempfile::tempdir().expect("temp dir");
    let server = Server::start(dir.path(), extra).await;
    (dir, server)
}

/// A batch that runs until cancelled (one-hour steps).
fn endless_batch() -> Value {
    json!({"total_items": 10, "batch_size": 1, "processing_delay": 3600})
}

/// `run_batch_processing` of an endless batch, called as an SEP-2663 task by `client` (which
/// declares the extension); the `resultType: "task"` answer.
async fn run_endless(client: &Stateless) -> Value {
    client
        .call(
            1,
            "tools/call",
            tool_call("run_batch_processing", endless_batch()),
        )
        .await
}

fn tool_call(name: &str, arguments: Value) -> Value {
    json!({"name": name, "arguments": arguments})
}

fn status_of(read: &Value) -> Value {
    let text = read["contents"][0]["text"].as_str().expect("resource text");
    serde_json::from_str(text).expect("status JSON")
}

/// Reads `task://status/{id}` until `done` holds of it; returns that status.
async fn read_until(client: &Stateless, task_id: &str, done: impl Fn(&Value) -> bool) -> Value {
    within(Duration::from_secs(60), "the awaited status", async {
        let mut id = 50_000;
        loop {
            id += 1;
            let read = client
                .call(
                    id,
                    "resources/read",
                    json!({"uri": format!("task://status/{task_id}")}),
                )
                .await;
            let status = status_of(&read);
            if done(&status) {
                return status;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    })
    .await
}

#[tokio::test]
async fn discover_lists_every_version_and_the_tasks_extension_without_a_session() {
    let (_dir, server) = server(&[]).await;
    let client = Stateless::new(&server.mcp_url(), None);
    let response = client
        .post_with(&client.body(1, "server/discover", json!({})), &[])
        .await;
    assert_eq!(response.status(), 200);
    assert!(
        response.headers().get("mcp-session-id").is_none(),
        "a stateless answer opened a session"
    );
    let discovered = answer_of(response, 1).await["result"].clone();
    assert_eq!(
        discovered["supportedVersions"],
        json!(["2026-07-28", "2025-11-25", "2025-06-18", "2025-03-26"]),
        "{discovered}"
    );
    assert!(
        discovered["capabilities"]["extensions"]["io.modelcontextprotocol/tasks"].is_object(),
        "{discovered}"
    );
    assert_eq!(
        discovered["_meta"]["io.modelcontextprotocol/serverInfo"]["name"],
        "durable-mcp"
    );
    assert_eq!(discovered["resultType"], "complete");

    // `initialize` naming 2026-07-28 still opens a session, on the newest version that has one.
    let response = client
        .http
        .post(server.mcp_url())
        .header("Accept", "application/json, text/event-stream")
        .json(
            &json!({"jsonrpc": "2.0", "id": 2, "method": "initialize", "params": {
            "protocolVersion": STATELESS_VERSION, "capabilities": {},
            "clientInfo": {"name": "raw-test", "version": "1"}}}),
        )
        .send();
    let response = within(IO_TIMEOUT, "initialize", response).await.unwrap();
    assert!(response.headers().get("mcp-session-id").is_some());
    let initialized = answer_of(response, 2).await;
    assert_eq!(initialized["result"]["protocolVersion"], "2025-11-25");
}

#[tokio::test]
async fn headers_that_disagree_with_the_body_are_refused_and_the_server_keeps_serving() {
    let (_dir, server) = server(&[]).await;
    let client = Stateless::new(&server.mcp_url(), None);
    let list = client.body(1, "tools/list", json!({}));
    let call = client.body(
        2,
        "tools/call",
        tool_call("start_batch_processing", json!({})),
    );
    let read = client.body(3, "resources/read", json!({"uri": "task://list"}));
    let cases = [
        (&list, "Mcp-Method", "tools/call"),
        (&call, "Mcp-Name", "cancel_task"),
        (&read, "Mcp-Name", "task://status/other"),
    ];
    for (body, header, value) in cases {
        let response = client.post_with(body, &[(header, value)]).await;
        assert_eq!(response.status(), 400, "{header}: {value} on {body}");
        let answer = answer_of(response, 0).await;
        assert!(
            answer["error"]["message"]
                .as_str()
                .is_some_and(|message| message.contains(header)),
            "the error names the header: {answer}"
        );
    }
    let tools = client.call(4, "tools/list", json!({})).await;
    assert_eq!(tools["tools"].as_array().map(Vec::len), Some(17), "{tools}");
    assert_eq!(tools["resultType"], "complete");
}

#[tokio::test]
async fn tools_and_resources_work_without_a_session_under_the_client_id() {
    let (_dir, server) = server(&["--time-scale", "0.01"]).await;
    let alice = Stateless::new(&server.mcp_url(), Some("alice"));
    let started = alice
        .call(
            1,
            "tools/call",
            tool_call(
                "start_batch_processing",
                json!({"total_items": 4, "batch_size": 2, "processing_delay": 1}),
            ),
        )
        .await;
    let task_id = started["structuredContent"]["task_id"]
        .as_str()
        .expect("a task id")
        .to_owned();
    let done = read_until(&alice, &task_id, |status| status["status"] == "completed").await;
    assert_eq!(
        done["owner"], "alice",
        "the X-Client-Id owns the task: {done}"
    );
    assert_eq!(done["result_data"]["processed"], 4, "{done}");

    let listed = alice
        .call(2, "resources/read", json!({"uri": "task://list"}))
        .await;
    assert_eq!(status_of(&listed)["tasks"][0]["task_id"], json!(task_id));
    let templates = alice.call(3, "resources/templates/list", json!({})).await;
    assert!(
        !templates["resourceTemplates"]
            .as_array()
            .unwrap()
            .is_empty()
    );
    let prompt = alice
        .call(
            4,
            "prompts/get",
            json!({"name": "task_report", "arguments": {"task_id": task_id}}),
        )
        .await;
    assert!(prompt["messages"].is_array(), "{prompt}");

    let (status, bad) = alice
        .send(
            5,
            "tools/call",
            tool_call("start_batch_processing", json!({"batch_size": 0})),
        )
        .await;
    assert_eq!(status, 200);
    assert_eq!(bad["result"]["isError"], true, "{bad}");
}

#[tokio::test]
async fn listen_delivers_the_status_changes_of_the_task_it_follows() {
    let (_dir, server) = server(&[]).await;
    let client = Stateless::new(&server.mcp_url(), Some("listener"));
    let started = client
        .call(
            1,
            "tools/call",
            tool_call("start_batch_processing", endless_batch()),
        )
        .await;
    let task_id = started["structuredContent"]["task_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let uri = format!("task://status/{task_id}");
    let listen = client.body(
        2,
        "subscriptions/listen",
        json!({"notifications": {"resourceSubscriptions": [uri, "https://example.com/not-a-task"]}}),
    );
    let response = client.post_with(&listen, &[]).await;
    assert_eq!(response.status(), 200);
    let mut stream = Sse::new(response);
    let ack = stream
        .next(IO_TIMEOUT)
        .await
        .expect("the acknowledgment")
        .json();
    assert_eq!(ack["method"], "notifications/subscriptions/acknowledged");
    assert_eq!(
        ack["params"]["notifications"]["resourceSubscriptions"],
        json!([uri]),
        "only task resources are followed: {ack}"
    );
    let updated = |event: &Value| {
        event["method"] == "notifications/resources/updated" && event["params"]["uri"] == json!(uri)
    };
    // The current state first, then each change.
    let first = stream
        .until(IO_TIMEOUT, updated)
        .await
        .pop()
        .unwrap()
        .json();
    assert_eq!(
        first["params"]["_meta"]["io.modelcontextprotocol/subscriptionId"],
        2
    );
    client
        .call(
            3,
            "tools/call",
            tool_call("cancel_task", json!({"task_id": task_id})),
        )
        .await;
    let cancelled = within(IO_TIMEOUT, "the cancellation's update", async {
        loop {
            let event = stream
                .until(IO_TIMEOUT, updated)
                .await
                .pop()
                .unwrap()
                .json();
            let state = &event["params"]["_meta"]["durable-mcp/task"];
            if state["status"] == "cancelled" {
                return event;
            }
        }
    })
    .await;
    assert_eq!(
        cancelled["params"]["_meta"]["durable-mcp/task"]["task_id"],
        json!(task_id)
    );

    // Another client's task cannot be followed once the server checks ownership.
    let (status, unknown) = client
        .send(
            4,
            "subscriptions/listen",
            json!({"notifications": {"resourceSubscriptions": ["task://status/no-such-task"]}}),
        )
        .await;
    assert_eq!(status, 200);
    assert!(
        unknown["error"]["message"]
            .as_str()
            .is_some_and(|message| message.contains("no-such-task")),
        "{unknown}"
    );
}

#[tokio::test]
async fn a_task_handle_is_committed_before_the_answer_and_survives_a_kill() {
    let (_dir, mut server) = server(&[]).await;
    let owner = Stateless::new(&server.mcp_url(), Some("owner")).with_tasks();
    let created = run_endless(&owner).await;
    assert_eq!(created["resultType"], "task", "{created}");
    let task_id = created["taskId"].as_str().expect("taskId").to_owned();
    assert!(created["ttlMs"].as_u64() > Some(0), "{created}");
    assert!(created["pollIntervalMs"].as_u64() > Some(0), "{created}");
    server.kill9().await;
    server.restart().await;

    let owner = Stateless::new(&server.mcp_url(), Some("owner")).with_tasks();
    let got = owner.call(2, "tasks/get", json!({"taskId": task_id})).await;
    assert_eq!(got["taskId"], json!(task_id));
    assert_eq!(got["status"], "working", "{got}");
    assert_eq!(got["resultType"], "complete");

    let stranger = Stateless::new(&server.mcp_url(), Some("stranger")).with_tasks();
    let (_, foreign) = stranger
        .send(3, "tasks/get", json!({"taskId": task_id}))
        .await;
    assert_eq!(foreign["error"]["code"], -32602, "{foreign}");

    owner
        .call(4, "tasks/cancel", json!({"taskId": task_id}))
        .await;
    let got = owner.call(5, "tasks/get", json!({"taskId": task_id})).await;
    assert_eq!(got["status"], "cancelled", "{got}");
}

#[tokio::test]
async fn a_handle_expires_by_its_ttl_while_its_task_runs_on() {
    // Handles live at most the retention, here two seconds from the task's creation.
    let (_dir, server) = server(&["--retention", "2s", "--retention-interval", "200ms"]).await;
    let owner = Stateless::new(&server.mcp_url(), Some("owner")).with_tasks();
    let created = run_endless(&owner).await;
    let task_id = created["taskId"].as_str().unwrap().to_owned();
    assert_eq!(created["ttlMs"], 2000, "{created}");
    let live = owner.call(2, "tasks/get", json!({"taskId": task_id})).await;
    assert_eq!(live["status"], "working");
    let expired = within(IO_TIMEOUT, "the handle to expire", async {
        loop {
            let (_, got) = owner.send(3, "tasks/get", json!({"taskId": task_id})).await;
            if got.get("error").is_some() {
                return got;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await;
    assert_eq!(expired["error"]["code"], -32602, "{expired}");
    let status = read_until(&owner, &task_id, |_| true).await;
    assert_eq!(
        status["status"], "running",
        "the task outlives its handle: {status}"
    );
}

#[tokio::test]
async fn closing_the_stream_of_a_plain_call_cancels_it() {
    let (_dir, server) = server(&["--time-scale", "0.05"]).await;
    let client = Stateless::new(&server.mcp_url(), Some("closer"));
    let mut call = client.body(
        1,
        "tools/call",
        tool_call(
            "resumable_data_processing",
            json!({"dataset_name": "closed", "total_records": 100000, "batch_size": 10}),
        ),
    );
    call["params"]["_meta"]["progressToken"] = json!("p1");
    let response = client.post_with(&call, &[]).await;
    assert_eq!(response.status(), 200);
    let mut stream = Sse::new(response);
    let progress = |event: &Value| event["method"] == "notifications/progress";
    stream.until(IO_TIMEOUT, progress).await;
    let listed = client
        .call(2, "resources/read", json!({"uri": "task://list"}))
        .await;
    let task_id = status_of(&listed)["tasks"][0]["task_id"]
        .as_str()
        .expect("the job's task")
        .to_owned();
    drop(stream);

    // The first progress ("queued") can come before the worker starts: wait past pending too.
    let paused = read_until(&client, &task_id, |status| {
        !matches!(status["status"].as_str(), Some("pending" | "running"))
    })
    .await;
    assert_eq!(paused["status"], "paused", "{paused}");
    // The same call again resumes the job from its checkpoint.
    let response = client.post_with(&call, &[]).await;
    let mut stream = Sse::new(response);
    stream.until(IO_TIMEOUT, progress).await;
    let resumed = read_until(&client, &task_id, |status| status["status"] == "running").await;
    assert!(resumed["progress"].as_u64() >= paused["progress"].as_u64());
}

/// A plain call of a task-only tool by a client that can be asked: each question is an
/// `input_required` result whose `requestState` names the task. The question outlives a
/// SIGKILL between the rounds; the retry answers it; the same retry sent again finds it
/// answered and does not apply it twice; the call ends with the trip an `answer_task` run gives.
#[tokio::test]
async fn a_plain_calls_questions_are_input_required_rounds_that_survive_a_kill() {
    let (_dir, mut server) = server(&["--time-scale", "0.01"]).await;
    let mut asker = Stateless::new(&server.mcp_url(), Some("asker"));
    asker.capabilities = json!({"elicitation": {"form": {}}});
    let first = asker
        .call(1, "tools/call", tool_call("run_trip_planning", trip()))
        .await;
    assert_eq!(first["resultType"], "input_required", "{first}");
    let state = first["requestState"]
        .as_str()
        .expect("requestState")
        .to_owned();
    let asked = &first["inputRequests"]["choose_hotel"];
    assert_eq!(asked["method"], "elicitation/create", "{first}");
    let hotel = asked["params"]["requestedSchema"]["properties"]["hotel"]["enum"][2].clone();

    server.kill9().await;
    server.restart().await;
    asker.url = server.mcp_url();
    asker.http = durable_tests::raw::http_client(None);
    let retry = json!({
        "name": "run_trip_planning", "arguments": trip(), "requestState": state,
        "inputResponses": {"choose_hotel": {"action": "accept", "content": {"hotel": hotel}}},
    });
    let second = asker.call(2, "tools/call", retry.clone()).await;
    assert_eq!(second["resultType"], "input_required", "{second}");
    assert!(
        second["inputRequests"]["confirm_booking"].is_object(),
        "{second}"
    );
    // The same retry again: its answer was applied, so it is not applied twice.
    let again = asker.call(3, "tools/call", retry).await;
    assert_eq!(again["inputRequests"], second["inputRequests"], "{again}");

    let confirm = json!({
        "name": "run_trip_planning", "arguments": trip(), "requestState": state,
        "inputResponses": {"confirm_booking": {"action": "accept", "content": {"book": true}}},
    });
    let done = asker.call(4, "tools/call", confirm).await;
    assert_eq!(done["isError"], false, "{done}");
    let trip_result = &done["structuredContent"];
    assert_eq!(trip_result["answers_applied"], 2, "{done}");
    assert_eq!(trip_result["hotel"], hotel);

    let (_, unknown) = asker
        .send(
            5,
            "tools/call",
            json!({"name": "run_trip_planning", "arguments": trip(), "requestState": "made-up"}),
        )
        .await;
    assert_eq!(unknown["error"]["code"], -32602, "{unknown}");
    assert_eq!(
        unknown["error"]["data"]["field"], "requestState",
        "{unknown}"
    );

    // The same answers through answer_task give the same trip.
    let baseline = durable_tests::Client::connect(&server.mcp_url(), Some("baseline")).await;
    let ended = answered(&baseline, hotel.as_str().expect("a hotel")).await;
    baseline.close().await;
    let mut inline = trip_result.clone();
    inline.as_object_mut().unwrap().remove("task_id");
    assert_eq!(ended.result_data, Some(inline));
}

/// With authorization on, a stateless request is its token's subject: another subject neither
/// reaches its task handle nor continues its plain call by `requestState`, and a subject at its
/// session limit is still served statelessly (such a request opens no session).
#[tokio::test]
async fn stateless_requests_belong_to_their_subject_and_open_no_session() {
    let dir = tempfile::tempdir().unwrap();
    let issuer = durable_tests::auth::Issuer::new(dir.path());
    let server = issuer
        .start_server(
            dir.path(),
            &["--time-scale", "0.01", "--max-sessions-per-subject", "1"],
        )
        .await;
    let as_subject = |subject: &str| {
        let token = issuer.token(subject, durable_tests::auth::WRITE);
        let mut client = Stateless::new(&server.mcp_url(), None);
        client.http = durable_tests::raw::http_client(Some(&token));
        (client, token)
    };
    let (alice, alice_token) = as_subject("alice");
    let alice = alice.with_tasks();
    let (mut bob, _) = as_subject("bob");

    // Alice uses her one session; her stateless requests are served all the same.
    let _session = durable_tests::raw::RawSession::open_as(
        &server.mcp_url(),
        "2025-11-25",
        Some(&alice_token),
    )
    .await;
    let created = run_endless(&alice).await;
    let task_id = created["taskId"]
        .as_str()
        .expect("a task handle")
        .to_owned();
    let got = alice.call(2, "tasks/get", json!({"taskId": task_id})).await;
    assert_eq!(got["status"], "working", "{got}");

    bob = bob.with_tasks();
    let (_, foreign) = bob.send(3, "tasks/get", json!({"taskId": task_id})).await;
    assert_eq!(foreign["error"]["code"], -32602, "{foreign}");
    let (_, foreign) = bob
        .send(
            4,
            "resources/read",
            json!({"uri": format!("task://status/{task_id}")}),
        )
        .await;
    assert!(foreign.get("error").is_some(), "{foreign}");

    let (mut alice_asks, _) = as_subject("alice");
    alice_asks.capabilities = json!({"elicitation": {"form": {}}});
    let first = alice_asks
        .call(5, "tools/call", tool_call("run_trip_planning", trip()))
        .await;
    let state = first["requestState"].as_str().unwrap().to_owned();
    bob.capabilities = json!({"elicitation": {"form": {}}});
    let (_, stolen) = bob
        .send(
            6,
            "tools/call",
            json!({"name": "run_trip_planning", "arguments": trip(), "requestState": state,
                   "inputResponses": {"choose_hotel": {"action": "decline"}}}),
        )
        .await;
    assert_eq!(stolen["error"]["data"]["field"], "requestState", "{stolen}");
    let again = alice_asks
        .call(
            7,
            "tools/call",
            json!({"name": "run_trip_planning", "arguments": trip(), "requestState": state}),
        )
        .await;
    assert!(
        again["inputRequests"]["choose_hotel"].is_object(),
        "bob's decline was not applied: {again}"
    );
}

/// The rounds of a plain call when the person does not simply answer: an answer the task
/// cannot take is asked again with the reason, a dismissed question is a tool error saying the
/// task still waits, and a call whose stream closes before it handed out a `requestState`
/// cancels the task it started, which nobody could come back to.
#[tokio::test]
async fn a_plain_calls_rounds_handle_bad_answers_dismissals_and_a_closed_stream() {
    let (_dir, server) = server(&["--time-scale", "0.01"]).await;
    let mut asker = Stateless::new(&server.mcp_url(), Some("asker"));
    asker.capabilities = json!({"elicitation": {"form": {}}});
    let first = asker
        .call(1, "tools/call", tool_call("run_trip_planning", trip()))
        .await;
    let state = first["requestState"].as_str().unwrap().to_owned();
    let retry = |response: Value| {
        json!({"name": "run_trip_planning", "arguments": trip(), "requestState": state,
               "inputResponses": {"choose_hotel": response}})
    };
    let bad = asker
        .call(
            2,
            "tools/call",
            retry(json!({"action": "accept", "content": {"hotel": "Nowhere Inn"}})),
        )
        .await;
    let message = bad["inputRequests"]["choose_hotel"]["params"]["message"]
        .as_str()
        .unwrap_or_default();
    assert!(
        message.contains("hotel must be one of") && message.contains("please answer again"),
        "{bad}"
    );
    let dismissed = asker
        .call(3, "tools/call", retry(json!({"action": "cancel"})))
        .await;
    assert_eq!(dismissed["isError"], true, "{dismissed}");
    assert!(
        dismissed["content"][0]["text"]
            .as_str()
            .is_some_and(|text| text.contains("still waits")),
        "{dismissed}"
    );
    let status = read_until(&asker, &state, |_| true).await;
    assert_eq!(status["status"], "input_required", "{status}");

    // The call sends nothing before its answer, so its response has not even begun when the
    // connection is dropped.
    let call = asker.body(
        4,
        "tools/call",
        tool_call("run_batch_processing", endless_batch()),
    );
    let pending = tokio::spawn(
        asker
            .http
            .post(&asker.url)
            .header("Accept", "application/json, text/event-stream")
            .header("MCP-Protocol-Version", STATELESS_VERSION)
            .header("Mcp-Method", "tools/call")
            .header("Mcp-Name", "run_batch_processing")
            .header("X-Client-Id", "asker")
            .json(&call)
            .send(),
    );
    let batch = within(IO_TIMEOUT, "the call's task", async {
        loop {
            let listed = asker
                .call(5, "resources/read", json!({"uri": "task://list"}))
                .await;
            let found = status_of(&listed)["tasks"]
                .as_array()
                .unwrap()
                .iter()
                .find(|task| task["kind"] == "batch_processing")
                .map(|task| task["task_id"].as_str().unwrap().to_owned());
            if let Some(found) = found {
                return found;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    })
    .await;
    pending.abort();
    let ended = read_until(&asker, &batch, |status| {
        ["completed", "failed", "cancelled"].contains(&status["status"].as_str().unwrap_or(""))
    })
    .await;
    assert_eq!(ended["status"], "cancelled", "{ended}");
}
