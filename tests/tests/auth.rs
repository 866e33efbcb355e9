//! The OAuth-protected server: bearer tokens checked as a resource server must, and two
//! subjects on one server who can neither see nor steer each other's work, with an operator
//! who sees both.

use std::time::Duration;

use durable_tests::auth::{AUDIENCE, ISSUER, Issuer, OPERATOR, READ, WRITE};
use durable_tests::raw::{EventExt, RawSession, Sse, http_client};
use durable_tests::{IO_TIMEOUT, Server, output_within, server_binary, within};
use serde_json::{Value, json};

const VERSION: &str = "2025-11-25";
/// What every refusal of A's work to B must look like: the task is unknown to B.
const UNKNOWN: &str = "not found";

/// A server trusting a fresh test issuer, with `extra` flags.
async fn server(extra: &[&str]) -> (tempfile::TempDir, Issuer, Server) {
    let dir = tempfile::tempdir().expect("temp dir");
    let issuer = Issuer::new(dir.path());
    let server = issuer.start_server(dir.path(), extra).await;
    (dir, issuer, server)
}

fn initialize() -> Value {
    json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "protocolVersion": VERSION, "capabilities": {},
        "clientInfo": {"name": "auth-test", "version": "1"}}})
}

/// Posts an initialize with `token` (none: no Authorization header).
async fn post_initialize(server: &Server, token: Option<&str>) -> reqwest::Response {
    within(
        IO_TIMEOUT,
        "initialize",
        http_client(token)
            .post(server.mcp_url())
            .header("Accept", "application/json, text/event-stream")
            .json(&initialize())
            .send(),
    )
    .await
    .expect("initialize")
}

fn challenge(response: &reqwest::Response) -> String {
    response
        .headers()
        .get("www-authenticate")
        .map(|value| value.to_str().unwrap().to_owned())
        .unwrap_or_default()
}

#[tokio::test]
async fn every_bad_token_is_refused_with_the_challenge_and_the_metadata_is_served() {
    let (_dir, issuer, server) = server(&[]).await;
    let metadata_url = "https://mcp.test/.well-known/oauth-protected-resource/mcp";
    let claims = |overrides: Value| {
        let mut claims = Issuer::claims("alice", WRITE);
        for (key, value) in overrides.as_object().unwrap() {
            claims[key] = value.clone();
        }
        claims
    };
    let now = jsonwebtoken::get_current_timestamp();
    let none = {
        use base64::Engine;
        let encode = |text: &str| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(text);
        format!(
            "{}.{}.",
            encode(r#"{"alg":"none","typ":"JWT"}"#),
            encode(&claims(json!({})).to_string())
        )
    };
    let cases: Vec<(&str, Option<String>)> = vec![
        ("missing", None),
        (
            "expired",
            Some(issuer.sign_ec("ec", &claims(json!({"exp": now - 300})))),
        ),
        (
            "not yet valid",
            Some(issuer.sign_ec("ec", &claims(json!({"nbf": now + 300})))),
        ),
        (
            "wrong audience",
            Some(issuer.sign_ec("ec", &claims(json!({"aud": "https://other.test/mcp"})))),
        ),
        (
            "wrong issuer",
            Some(issuer.sign_ec("ec", &claims(json!({"iss": "https://evil.test"})))),
        ),
        (
            "wrong signature",
            Some(issuer.sign_stranger("ec", &claims(json!({})))),
        ),
        ("alg none", Some(none)),
        (
            "unknown kid",
            Some(issuer.sign_stranger("stranger", &claims(json!({})))),
        ),
        ("garbage", Some("not-a-jwt".into())),
    ];
    for (case, token) in cases {
        let response = post_initialize(&server, token.as_deref()).await;
        assert_eq!(response.status(), 401, "{case}");
        let challenge = challenge(&response);
        assert!(
            challenge.starts_with("Bearer ")
                && challenge.contains(&format!("resource_metadata=\"{metadata_url}\"")),
            "{case}: {challenge}"
        );
        assert_eq!(
            challenge.contains("error=\"invalid_token\""),
            token.is_some(),
            "{case}: {challenge}"
        );
        let body: Value = response.json().await.unwrap();
        assert!(
            body["error"]["message"]
                .as_str()
                .unwrap()
                .starts_with("unauthorized"),
            "{case}: {body}"
        );
    }
    // Both key types of the JWKS verify.
    for token in [
        issuer.token("alice", WRITE),
        issuer.sign_rsa(&claims(json!({}))),
    ] {
        assert_eq!(post_initialize(&server, Some(&token)).await.status(), 200);
    }
    // A valid token granting none of the server's scopes.
    let response = post_initialize(&server, Some(&issuer.token("alice", "profile email"))).await;
    assert_eq!(response.status(), 403);
    assert!(challenge(&response).contains("error=\"insufficient_scope\""));

    let base = format!("http://{}", server.addr);
    for path in [
        "/.well-known/oauth-protected-resource",
        "/.well-known/oauth-protected-resource/mcp",
    ] {
        let document: Value = reqwest::get(format!("{base}{path}"))
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(document["resource"], AUDIENCE, "{path}");
        assert_eq!(document["authorization_servers"], json!([ISSUER]), "{path}");
        assert_eq!(
            document["scopes_supported"],
            json!(["tasks:read", "tasks:write", "tasks:operator"])
        );
    }
}

#[tokio::test]
async fn a_token_can_do_only_what_its_scopes_grant() {
    let (_dir, issuer, server) = server(&["--time-scale", "0"]).await;
    let reader = RawSession::open_as(
        &server.mcp_url(),
        VERSION,
        Some(&issuer.token("rita", READ)),
    )
    .await;
    let start = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
        "params": {"name": "start_batch_processing", "arguments": {"total_items": 2, "batch_size": 1}}});
    let refused = reader.post(start.clone()).await;
    assert_eq!(refused.status(), 403);
    assert!(
        challenge(&refused).contains("scope=\"tasks:write\""),
        "{}",
        challenge(&refused)
    );
    let stats = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
        "params": {"name": "get_server_stats", "arguments": {}}});
    let refused = reader.post(stats.clone()).await;
    assert_eq!(refused.status(), 403);
    assert!(challenge(&refused).contains("scope=\"tasks:operator\""));
    let listed = reader
        .call(
            3,
            "tools/call",
            json!({"name": "list_session_tasks", "arguments": {}}),
        )
        .await;
    assert_eq!(listed["structuredContent"]["total_tasks"], 0);

    let writer = RawSession::open_as(
        &server.mcp_url(),
        VERSION,
        Some(&issuer.token("rita", WRITE)),
    )
    .await;
    let started = writer.call(1, "tools/call", start["params"].clone()).await;
    assert_eq!(started["isError"], json!(false), "{started}");
    let operator = RawSession::open_as(
        &server.mcp_url(),
        VERSION,
        Some(&issuer.token("olga", OPERATOR)),
    )
    .await;
    let stats = operator
        .call(2, "tools/call", stats["params"].clone())
        .await;
    assert_eq!(stats["isError"], json!(false), "{stats}");
}

/// The text of a tool call's answer, tool error or not.
fn text(answer: &Value) -> String {
    answer["result"]["content"][0]["text"]
        .as_str()
        .map(str::to_owned)
        .or_else(|| answer["error"]["message"].as_str().map(str::to_owned))
        .unwrap_or_else(|| answer.to_string())
}

async fn tool(session: &RawSession, id: u64, name: &str, arguments: Value) -> Value {
    session
        .try_answer(
            id,
            "tools/call",
            json!({"name": name, "arguments": arguments}),
        )
        .await
        .unwrap_or_else(|status| panic!("{name}: HTTP {status}"))
}

fn task_ids(list: &Value) -> Vec<String> {
    list["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|task| task["task_id"].as_str().unwrap().to_owned())
        .collect()
}

async fn read(session: &RawSession, id: u64, uri: &str) -> Value {
    session
        .try_answer(id, "resources/read", json!({"uri": uri}))
        .await
        .unwrap()
}

fn contents(answer: &Value) -> Value {
    let text = answer["result"]["contents"][0]["text"]
        .as_str()
        .unwrap_or_else(|| panic!("{answer}"));
    serde_json::from_str(text).unwrap()
}

/// Every way for B to see, steer, subscribe to, attach to, resume or read the files of A's
/// work, one by one; A's task is untouched and still A's to steer; an operator sees and steers
/// both.
#[tokio::test]
async fn another_subject_can_neither_see_nor_steer_nor_resume() {
    let (_dir, issuer, server) = server(&["--time-scale", "0.05"]).await;
    let url = server.mcp_url();
    let (alice_token, bob_token) = (issuer.token("alice", WRITE), issuer.token("bob", WRITE));
    let alice = RawSession::open_as(&url, VERSION, Some(&alice_token)).await;
    let bob = RawSession::open_as(&url, VERSION, Some(&bob_token)).await;

    // Alice's work: a long batch, a migration that leaves a file, a task handle.
    let long = tool(
        &alice,
        1,
        "start_batch_processing",
        json!({"total_items": 1000, "batch_size": 1, "processing_delay": 1}),
    )
    .await;
    let task_id = long["result"]["structuredContent"]["task_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let migration = tool(&alice, 2, "start_data_migration",
        json!({"source_path": "sample:orders", "destination_path": "alice.jsonl", "record_count": 100})).await;
    let migration_id = migration["result"]["structuredContent"]["task_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let handle = alice
        .call(
            3,
            "tools/call",
            json!({"name": "run_batch_processing",
        "arguments": {"total_items": 1000, "batch_size": 1, "processing_delay": 1}, "task": {}}),
        )
        .await;
    let handle_id = handle["task"]["taskId"].as_str().unwrap().to_owned();
    let status = format!("task://status/{task_id}");

    // Tools.
    for (id, steer) in [(10, "pause_task"), (11, "resume_task"), (12, "cancel_task")] {
        let answer = tool(&bob, id, steer, json!({"task_id": task_id})).await;
        assert!(text(&answer).contains(UNKNOWN), "{steer}: {answer}");
    }
    let listed = tool(&bob, 13, "list_session_tasks", json!({})).await;
    assert_eq!(
        listed["result"]["structuredContent"]["total_tasks"], 0,
        "{listed}"
    );
    let named = tool(
        &bob,
        14,
        "list_session_tasks",
        json!({"client_id": "alice"}),
    )
    .await;
    assert!(text(&named).contains("not yours"), "{named}");
    let attach = tool(
        &bob,
        15,
        "resumable_data_processing",
        json!({"record_count": 10, "client_id": "alice"}),
    )
    .await;
    assert!(text(&attach).contains("not yours"), "{attach}");
    // The X-Client-Id header names nobody when a token does.
    let spoofed = bob
        .http
        .post(&url)
        .header("Accept", "application/json, text/event-stream")
        .header("Mcp-Session-Id", &bob.session_id)
        .header("MCP-Protocol-Version", VERSION)
        .header("X-Client-Id", "alice")
        .json(&json!({"jsonrpc": "2.0", "id": 16, "method": "tools/call",
            "params": {"name": "list_session_tasks", "arguments": {}}}))
        .send()
        .await
        .unwrap();
    let answer = Sse::new(spoofed)
        .until(IO_TIMEOUT, |m| m.get("id") == Some(&json!(16)))
        .await;
    assert_eq!(
        answer.last().unwrap().json()["result"]["structuredContent"]["total_tasks"],
        0
    );

    // Resources, templates, subscriptions, prompts.
    let answer = read(&bob, 20, &status).await;
    assert!(
        answer["error"]["message"]
            .as_str()
            .unwrap()
            .contains(UNKNOWN),
        "{answer}"
    );
    for (id, uri) in [(21, "task://list"), (22, "task://list/running")] {
        let list = contents(&read(&bob, id, uri).await);
        assert!(task_ids(&list).is_empty(), "{uri}: {list}");
    }
    let subscribed = bob
        .try_answer(23, "resources/subscribe", json!({"uri": status}))
        .await
        .unwrap();
    assert!(
        subscribed["error"]["message"]
            .as_str()
            .unwrap()
            .contains(UNKNOWN),
        "{subscribed}"
    );
    let prompt = bob
        .try_answer(
            24,
            "prompts/get",
            json!({"name": "task_report", "arguments": {"task_id": task_id}}),
        )
        .await
        .unwrap();
    assert!(
        prompt["error"]["message"]
            .as_str()
            .unwrap()
            .contains(UNKNOWN),
        "{prompt}"
    );
    // B's list subscription hears nothing of A's changes.
    bob.call(25, "resources/subscribe", json!({"uri": "task://list"}))
        .await;
    let mut bob_stream = Sse::new(bob.get(None).await);

    // tasks/*.
    for (id, method) in [
        (30, "tasks/get"),
        (31, "tasks/cancel"),
        (32, "tasks/result"),
    ] {
        let answer = bob
            .try_answer(id, method, json!({"taskId": handle_id}))
            .await
            .unwrap();
        assert!(answer.get("error").is_some(), "{method}: {answer}");
    }
    let handles = bob.call(33, "tasks/list", json!({})).await;
    assert_eq!(handles["tasks"], json!([]), "{handles}");

    // A's session with B's token, and A's event ids on B's session.
    let hijacked = alice.with_token(Some(&bob_token));
    let answer = hijacked
        .post(json!({"jsonrpc": "2.0", "id": 40, "method": "tools/call",
        "params": {"name": "list_session_tasks", "arguments": {}}}))
        .await;
    assert_eq!(answer.status(), 404);
    assert_eq!(hijacked.get(None).await.status(), 404);
    let posted = alice
        .post(json!({"jsonrpc": "2.0", "id": 41, "method": "tools/list"}))
        .await;
    let events = Sse::new(posted)
        .until(IO_TIMEOUT, |m| m.get("id") == Some(&json!(41)))
        .await;
    let alice_event = events
        .iter()
        .find_map(|event| event.id.clone())
        .expect("an event id");
    assert_eq!(hijacked.get(Some(&alice_event)).await.status(), 404);
    assert_eq!(bob.get(Some(&alice_event)).await.status(), 403);
    // Not even as a stateless request of the newest revision, which rmcp would replay.
    let stateless = bob
        .http
        .get(&url)
        .header("Accept", "text/event-stream")
        .header("MCP-Protocol-Version", "2026-07-28")
        .header("Mcp-Session-Id", "made-up")
        .header("Last-Event-ID", &alice_event)
        .send()
        .await
        .unwrap();
    assert_eq!(stateless.status(), 404);

    // Files: B's directory is B's own.
    let done = within(Duration::from_secs(60), "alice's migration", async {
        loop {
            let task = contents(&read(&alice, 50, &format!("task://status/{migration_id}")).await);
            if task["status"] == "completed" {
                return task;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await;
    assert_eq!(done["status"], "completed");
    assert!(server.data_path("subjects/alice/alice.jsonl").exists());
    for (id, source) in [(51, "alice.jsonl"), (52, "../alice/alice.jsonl")] {
        let answer = tool(
            &bob,
            id,
            "start_data_migration",
            json!({"source_path": source, "destination_path": "stolen.jsonl", "record_count": 1}),
        )
        .await;
        assert_eq!(
            answer["result"]["isError"],
            json!(true),
            "{source}: {answer}"
        );
        assert_eq!(
            answer["result"]["structuredContent"]["field"], "source_path",
            "{answer}"
        );
    }

    // A's task was never touched, and is still A's to steer.
    let task = contents(&read(&alice, 60, &status).await);
    assert_eq!(task["status"], "running", "{task}");
    let paused = tool(&alice, 61, "pause_task", json!({"task_id": task_id})).await;
    assert_eq!(
        paused["result"]["structuredContent"]["status"], "paused",
        "{paused}"
    );
    // A's task advanced and was paused while B listened to its list: B heard nothing of it.
    while let Some(event) = bob_stream.next_or_idle(Duration::from_millis(500)).await {
        assert!(
            !event.data.contains(&task_id),
            "B heard of A's task: {event:?}"
        );
    }

    // An operator sees both subjects' tasks and steers A's.
    let operator = RawSession::open_as(&url, VERSION, Some(&issuer.token("olga", OPERATOR))).await;
    tool(
        &bob,
        70,
        "start_batch_processing",
        json!({"total_items": 1, "batch_size": 1}),
    )
    .await;
    let all = contents(&read(&operator, 71, "task://list").await);
    let owners: std::collections::BTreeSet<&str> = all["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|task| task["owner"].as_str().unwrap())
        .collect();
    assert_eq!(owners, ["alice", "bob"].into_iter().collect(), "{all}");
    let resumed = tool(&operator, 72, "resume_task", json!({"task_id": task_id})).await;
    assert_eq!(
        resumed["result"]["structuredContent"]["status"], "pending",
        "{resumed}"
    );
    let listed = tool(
        &operator,
        73,
        "list_session_tasks",
        json!({"client_id": "alice"}),
    )
    .await;
    assert_eq!(
        listed["result"]["structuredContent"]["total_tasks"], 3,
        "{listed}"
    );
}

/// Each limit, hit, names itself; the server keeps serving everyone else.
#[tokio::test]
async fn each_limit_is_named_when_hit_and_others_are_still_served() {
    let (_dir, issuer, server) = server(&[
        "--max-tasks-per-owner",
        "1",
        "--max-sessions-per-subject",
        "2",
        "--max-subscriptions-per-session",
        "1",
        "--max-streams-per-session",
        "1",
        "--time-scale",
        "1",
    ])
    .await;
    let url = server.mcp_url();
    let token = issuer.token("carol", WRITE);
    let carol = RawSession::open_as(&url, VERSION, Some(&token)).await;
    let endless = json!({"total_items": 10, "batch_size": 1, "processing_delay": 3600});
    tool(&carol, 1, "start_batch_processing", endless.clone()).await;
    let refused = tool(&carol, 2, "start_batch_processing", endless.clone()).await;
    assert_eq!(
        refused["error"]["data"]["limit"], "max_tasks_per_owner",
        "{refused}"
    );

    carol
        .call(3, "resources/subscribe", json!({"uri": "task://list"}))
        .await;
    let refused = carol
        .try_answer(
            4,
            "resources/subscribe",
            json!({"uri": "task://list/running"}),
        )
        .await
        .unwrap();
    assert_eq!(
        refused["error"]["data"]["limit"], "max_subscriptions_per_session",
        "{refused}"
    );

    // One stream open (the listening GET): a second is refused.
    let _listening = carol.get(None).await;
    let refused = carol
        .post(json!({"jsonrpc": "2.0", "id": 5, "method": "ping"}))
        .await;
    assert_eq!(refused.status(), 429);
    assert!(refused.headers().contains_key("retry-after"));
    let body: Value = refused.json().await.unwrap();
    assert_eq!(
        body["error"]["data"]["limit"], "max_streams_per_session",
        "{body}"
    );

    let second = RawSession::open_as(&url, VERSION, Some(&token)).await;
    let refused = post_initialize(&server, Some(&token)).await;
    assert_eq!(refused.status(), 429);
    let body: Value = refused.json().await.unwrap();
    assert_eq!(
        body["error"]["data"]["limit"], "max_sessions_per_subject",
        "{body}"
    );
    // A session closed gives its place back at once.
    let closed = second
        .request(reqwest::Method::DELETE)
        .send()
        .await
        .unwrap();
    assert_eq!(closed.status(), 204);
    assert_eq!(post_initialize(&server, Some(&token)).await.status(), 200);

    // Someone else is served as ever.
    let dave = RawSession::open_as(&url, VERSION, Some(&issuer.token("dave", WRITE))).await;
    let started = tool(&dave, 1, "start_batch_processing", endless).await;
    assert_eq!(started["result"]["isError"], json!(false), "{started}");
}

#[tokio::test]
async fn over_the_request_limit_a_client_is_told_to_retry() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(
        dir.path(),
        &["--max-concurrent-requests", "1", "--time-scale", "1"],
    )
    .await;
    let session = RawSession::open(&server.mcp_url(), VERSION).await;
    // A call that stays open: it holds the one permit while it streams progress.
    let holding = session
        .post(json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
        "params": {"name": "resumable_data_processing", "arguments": {"record_count": 100000},
                   "_meta": {"progressToken": 1}}}))
        .await;
    assert_eq!(holding.status(), 200);
    let refused = session
        .post(json!({"jsonrpc": "2.0", "id": 2, "method": "ping"}))
        .await;
    assert_eq!(refused.status(), 429);
    assert_eq!(refused.headers()["retry-after"], "1");
    let body: Value = refused.json().await.unwrap();
    assert_eq!(
        body["error"]["data"]["limit"], "max_concurrent_requests",
        "{body}"
    );
    drop(holding);
    within(IO_TIMEOUT, "the permit to come back", async {
        loop {
            let answer = session
                .post(json!({"jsonrpc": "2.0", "id": 3, "method": "ping"}))
                .await;
            if answer.status() == 200 {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
}

#[tokio::test]
async fn a_public_address_without_authorization_is_refused_unless_said_to_be_on_purpose() {
    let dir = tempfile::tempdir().unwrap();
    let mut refused = tokio::process::Command::new(server_binary());
    refused
        .args(["--host", "0.0.0.0", "--port", "0", "--db"])
        .arg(dir.path().join("t.db"));
    let output = output_within(&mut refused, IO_TIMEOUT).await;
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("without authorization") && stderr.contains("--unsafe-no-auth"),
        "{stderr}"
    );
}

#[tokio::test]
async fn the_cli_sends_its_token_and_says_when_one_is_needed() {
    let (dir, issuer, server) = server(&["--time-scale", "0"]).await;
    let cli = |token: Option<String>| {
        let mut command = tokio::process::Command::new(server_binary());
        command
            .args([
                "task",
                "start",
                "batch-processing",
                "--total-items",
                "3",
                "--batch-size",
                "1",
                "--json",
            ])
            .args(["--server", &server.mcp_url()])
            .arg("--state-file")
            .arg(dir.path().join("client.json"))
            .env_remove("DURABLE_MCP_TOKEN");
        if let Some(token) = token {
            command.env("DURABLE_MCP_TOKEN", token);
        }
        command
    };
    let output = output_within(&mut cli(None), IO_TIMEOUT).await;
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("--token"), "{stderr}");
    let output = output_within(&mut cli(Some(issuer.token("erin", WRITE))), IO_TIMEOUT).await;
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let operator = RawSession::open_as(
        &server.mcp_url(),
        VERSION,
        Some(&issuer.token("olga", OPERATOR)),
    )
    .await;
    let all = contents(&read(&operator, 1, "task://list").await);
    assert_eq!(all["tasks"][0]["owner"], "erin", "{all}");
}

/// A destination file an unfinished task writes cannot be named by another task; once the
/// first has finished, it can.
#[tokio::test]
async fn a_destination_in_use_is_refused_to_a_second_task_until_the_first_ends() {
    let (_dir, issuer, server) = server(&["--time-scale", "1"]).await;
    let session = RawSession::open_as(
        &server.mcp_url(),
        VERSION,
        Some(&issuer.token("fay", WRITE)),
    )
    .await;
    let migration = json!({"source_path": "sample:orders", "destination_path": "./out/o.jsonl",
                           "record_count": 1000});
    let first = tool(&session, 1, "start_data_migration", migration.clone()).await;
    let first_id = first["result"]["structuredContent"]["task_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let same = json!({"source_path": "sample:customers", "destination_path": "out/o.jsonl",
                      "record_count": 10});
    let refused = tool(&session, 2, "start_data_migration", same.clone()).await;
    assert_eq!(refused["result"]["isError"], json!(true), "{refused}");
    assert_eq!(
        refused["result"]["structuredContent"]["field"],
        "destination_path"
    );
    assert!(text(&refused).contains(&first_id), "{refused}");
    tool(&session, 3, "cancel_task", json!({"task_id": first_id})).await;
    let accepted = tool(&session, 4, "start_data_migration", same).await;
    assert_eq!(accepted["result"]["isError"], json!(false), "{accepted}");
}
