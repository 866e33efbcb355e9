//! Resumable streams over raw HTTP: event ids, `Last-Event-ID` replay then live, POST streams
//! resumed after a disconnect and after a SIGKILL, the documented errors, priming and session
//! expiry.

use std::time::Duration;

use durable_shared::TASK_META_KEY;
use durable_tests::proxy::Proxy;
use durable_tests::raw::{Event, EventExt, RawSession, Sse};
use durable_tests::{IO_TIMEOUT, Server, lock_database, within};
use serde_json::{Value, json};

const V_NEW: &str = "2025-11-25";
const V_OLD: &str = "2025-03-26";
/// Long enough for the server to have sent anything it was going to: used to observe that a
/// stream has nothing more (only after the awaited events arrived).
const IDLE: Duration = Duration::from_millis(700);

async fn server(extra: &[&str]) -> (tempfile::TempDir, Server) {
    let dir = tempfile::tempdir().expect("temp dir");
    let server = Server::start(dir.path(), extra).await;
    (dir, server)
}

fn seqs(events: &[Event]) -> Vec<u64> {
    events.iter().map(|event| event.seq().1).collect()
}

fn assert_contiguous(events: &[Event]) {
    let tokens: std::collections::BTreeSet<String> =
        events.iter().map(|event| event.seq().0).collect();
    assert_eq!(tokens.len(), 1, "one stream: {events:#?}");
    let seqs = seqs(events);
    let first = seqs[0];
    assert_eq!(
        seqs,
        (first..first + seqs.len() as u64).collect::<Vec<_>>(),
        "gap or duplicate"
    );
}

async fn wait_completed(session: &RawSession, id: u64) {
    within(Duration::from_secs(60), "all tasks to complete", async {
        loop {
            let stats = session
                .call(
                    id,
                    "tools/call",
                    json!({"name": "get_server_stats", "arguments": {}}),
                )
                .await;
            let stats = &stats["structuredContent"];
            if stats["total_tasks"].as_u64() > Some(0)
                && stats["completed_tasks"] == stats["total_tasks"]
            {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
}

/// Reads events into `seen` until one tells of the task a start_* call answered with: proof
/// that the stream is live, not still replaying.
async fn until_task(stream: &mut Sse, seen: &mut Vec<Event>, started: &Value) {
    let task_id = started["structuredContent"]["task_id"].clone();
    assert!(task_id.is_string(), "{started}");
    let events = stream
        .until(IO_TIMEOUT, |message| {
            message["params"]["_meta"][TASK_META_KEY]["task_id"] == task_id
                || message["params"]["data"]["task_id"] == task_id
        })
        .await;
    seen.extend(events);
}

fn start_batch(total: u64) -> Value {
    json!({"name": "start_batch_processing", "arguments": {"batch_size": 1, "total_items": total, "processing_delay": 1}})
}

#[tokio::test]
async fn the_standalone_stream_resumes_exactly_after_the_last_id_and_then_goes_live() {
    let (_dir, server) = server(&["--time-scale", "0.01"]).await;
    let session = RawSession::open(&server.mcp_url(), V_NEW).await;
    let mut live = Sse::new(session.get(None).await);
    let priming = live.next(IO_TIMEOUT).await.expect("priming event");
    assert!(priming.is_priming() && priming.id.is_some(), "{priming:?}");
    assert_eq!(priming.retry_ms, Some(3000));

    session
        .call(1, "resources/subscribe", json!({"uri": "task://list"}))
        .await;
    session.call(2, "tools/call", start_batch(30)).await;
    let mut seen = vec![priming];
    for _ in 0..5 {
        seen.push(live.next(IO_TIMEOUT).await.expect("an update"));
    }
    drop(live);
    wait_completed(&session, 3).await;

    let resumed = session
        .get(Some(seen.last().unwrap().id.as_deref().unwrap()))
        .await;
    assert_eq!(resumed.status(), 200);
    let mut resumed = Sse::new(resumed);
    while let Some(event) = resumed.next_or_idle(IDLE).await {
        seen.push(event);
    }
    assert!(
        seen.len() > 30,
        "every missed update is replayed: {}",
        seen.len()
    );
    // Live after the replay: a change of a task started only now arrives on the same
    // connection, next in sequence.
    let fresh = session.call(4, "tools/call", start_batch(1)).await;
    until_task(&mut resumed, &mut seen, &fresh).await;
    assert_contiguous(&seen);
    for event in &seen[1..] {
        let method = event.json()["method"].clone();
        assert!(
            method == "notifications/resources/updated" || method == "notifications/message",
            "only subscribed updates and milestone logs: {method}"
        );
    }
}

/// A POST's answer sends its headers together with its priming event, whose id is usable only
/// once its stream is recorded: while another process holds the database's lock, not even the
/// headers come; once it lets go, the priming event is the first thing read, then the answer.
#[tokio::test]
async fn a_post_answers_headers_come_with_its_priming_event() {
    let (_dir, server) = server(&["--time-scale", "0"]).await;
    let Some(database) = server.sqlite_file() else {
        eprintln!("skipped: this server keeps its state in PostgreSQL");
        return;
    };
    let session = RawSession::open(&server.mcp_url(), V_NEW).await;
    let locker = lock_database(&database, 20).await;
    let request = session
        .request(reqwest::Method::POST)
        .json(&json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list"}));
    let mut answer = tokio::spawn(request.send());
    let early = tokio::time::timeout(Duration::from_millis(300), &mut answer).await;
    assert!(
        early.is_err(),
        "the headers came before the priming event's stream could be recorded"
    );
    drop(locker);
    let response = within(IO_TIMEOUT, "the answer's headers", answer)
        .await
        .expect("the request task")
        .expect("the answer");
    assert_eq!(response.status(), 200);
    let mut answer = Sse::new(response);
    let first = answer.next(IO_TIMEOUT).await.expect("the priming event");
    assert!(first.is_priming() && first.id.is_some(), "{first:?}");
    let tools = answer.next(IO_TIMEOUT).await.expect("the answer");
    assert_eq!(tools.json()["id"], 1, "{tools:?}");
    assert!(tools.json()["result"]["tools"].is_array(), "{tools:?}");
}

/// A 2025-03-26 client gets no priming event, so the first event of its standalone stream is
/// the first id it holds: that event is stored as every later one is, and a resumption from it
/// replays everything after it without a gap, then goes live.
#[tokio::test]
async fn an_old_clients_standalone_stream_resumes_from_its_first_event() {
    let (_dir, server) = server(&["--time-scale", "0.01"]).await;
    let session = RawSession::open(&server.mcp_url(), V_OLD).await;
    let mut live = Sse::new(session.get(None).await);
    session
        .call(1, "resources/subscribe", json!({"uri": "task://list"}))
        .await;
    session.call(2, "tools/call", start_batch(30)).await;
    let first = live.next(IO_TIMEOUT).await.expect("an update");
    assert!(!first.is_priming(), "{first:?}");
    drop(live);
    wait_completed(&session, 3).await;

    let resumed = session.get(Some(first.id.as_deref().unwrap())).await;
    assert_eq!(resumed.status(), 200, "a resumption from the first event");
    let mut resumed = Sse::new(resumed);
    let mut seen = vec![first];
    while let Some(event) = resumed.next_or_idle(IDLE).await {
        seen.push(event);
    }
    assert!(seen.len() > 30, "every missed update: {}", seen.len());
    let fresh = session.call(4, "tools/call", start_batch(1)).await;
    until_task(&mut resumed, &mut seen, &fresh).await;
    assert_contiguous(&seen);
}

/// After a restart, a client with several requests in flight sends them at once on its
/// session, which the new process has to restore first: every one is answered (none reaches
/// the session half-restored, which ended it with a 500 for all). A read before them, which
/// is answered without restoring the session, leaves the restoring to them.
#[tokio::test]
async fn concurrent_first_requests_of_a_restored_session_are_all_answered() {
    let (_dir, mut server) = server(&[]).await;
    let session = RawSession::open(&server.mcp_url(), V_NEW).await;
    for restart in 0..3 {
        server.kill9().await;
        server.restart().await;
        let session = session.reconnected();
        if restart > 0 {
            assert_eq!(session.call(100, "ping", json!({})).await, json!({}));
        }
        let answers = futures::future::join_all(
            (1..=16).map(|id| session.try_answer(id, "tools/list", json!({}))),
        )
        .await;
        let refused: Vec<u16> = answers.iter().filter_map(|a| a.clone().err()).collect();
        assert!(refused.is_empty(), "restart {restart}: refused {refused:?}");
    }
}

/// A session's reads are answered with one JSON body, without a stream: nothing is stored
/// for them (between two `tools/list` calls, the count of stored events grows by one call's
/// stream only), and what they say is what the session's own tool calls say. A read naming an
/// unknown session, or one that was closed, gets 404 like any other request.
#[tokio::test]
async fn a_sessions_reads_are_answered_without_a_stream() {
    let (_dir, server) = server(&["--time-scale", "0"]).await;
    let session = RawSession::open(&server.mcp_url(), V_NEW).await;
    // The task's last event, its completion's log line, is stored before it is sent here: no
    // event of the task is stored after it has arrived.
    let mut stream = Sse::new(session.get(None).await);
    let started = session.call(1, "tools/call", start_batch(3)).await;
    let task_id = &started["structuredContent"]["task_id"];
    let uri = started["structuredContent"]["status_uri"]
        .as_str()
        .expect("a status link")
        .to_owned();
    stream
        .until(IO_TIMEOUT, |message| {
            message["params"]["data"]["task_id"] == *task_id
                && message["params"]["data"]["status"] == "completed"
        })
        .await;
    drop(stream);
    let listed = session
        .call(
            3,
            "tools/call",
            json!({"name": "list_session_tasks", "arguments": {}}),
        )
        .await;

    // A request answered on its stream goes out once everything stored before it is durable
    // and counted, so the counter read after its answer is exact.
    let appended_after_a_list = |id: u64| {
        let (session, server) = (&session, &server);
        async move {
            session.call(id, "tools/list", json!({})).await;
            let appended = server.metrics().await.get("durable_events_appended_total");
            appended.expect("the stored events are counted")
        }
    };
    let before = appended_after_a_list(4).await;
    let before_reads = appended_after_a_list(5).await;
    let one_list = before_reads - before;
    assert!(one_list > 0.0, "a tools/list stores its stream");
    let reads = [
        ("ping", json!({})),
        ("resources/read", json!({"uri": uri})),
        ("resources/read", json!({"uri": "task://list"})),
        ("resources/list", json!({})),
        ("resources/templates/list", json!({})),
        ("prompts/list", json!({})),
    ];
    let mut answers = Vec::new();
    for (n, (method, params)) in reads.iter().enumerate() {
        let id = 10 + n as u64;
        let response = session
            .post(json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}))
            .await;
        assert_eq!(response.status(), 200, "{method}");
        assert_eq!(
            response.headers()["content-type"],
            "application/json",
            "{method}"
        );
        let answer: Value = response.json().await.expect("a JSON answer");
        assert_eq!(answer["id"], json!(id), "{answer}");
        assert!(answer["result"].is_object(), "{method}: {answer}");
        answers.push(answer["result"].clone());
    }
    assert_eq!(
        appended_after_a_list(30).await - before_reads,
        one_list,
        "a read stored events"
    );

    let status: Value =
        serde_json::from_str(answers[1]["contents"][0]["text"].as_str().unwrap()).unwrap();
    assert_eq!(&status["task_id"], task_id, "{status}");
    assert_eq!(status["status"], "completed", "{status}");
    let in_list = &listed["structuredContent"]["tasks"];
    assert!(
        in_list
            .as_array()
            .is_some_and(|tasks| tasks.iter().any(|t| &t["task_id"] == task_id)),
        "{listed}"
    );

    let unknown = RawSession {
        session_id: "0123456789abcdef0123456789abcdef".into(),
        ..session.reconnected()
    };
    let ping = json!({"jsonrpc": "2.0", "id": 20, "method": "ping"});
    assert_eq!(unknown.post(ping).await.status(), 404);
    let closed = within(
        IO_TIMEOUT,
        "DELETE",
        session.request(reqwest::Method::DELETE).send(),
    )
    .await
    .expect("DELETE");
    assert!(closed.status().is_success(), "{}", closed.status());
    let read =
        json!({"jsonrpc": "2.0", "id": 21, "method": "resources/read", "params": {"uri": uri}});
    assert_eq!(session.post(read).await.status(), 404);
}

/// Calls whose handler is still waiting on their task, on the SQLite default (None on another
/// database): the bindings a restarted server would relay.
fn open_bindings(dir: &std::path::Path) -> Option<u64> {
    let db = dir.join("tasks.db");
    if !db.is_file() {
        return None;
    }
    let connection =
        rusqlite::Connection::open_with_flags(db, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
            .unwrap();
    connection.busy_timeout(IO_TIMEOUT).unwrap();
    let open = connection
        .query_row(
            "SELECT count(*) FROM call_bindings WHERE done = 0",
            [],
            |row| row.get(0),
        )
        .unwrap();
    Some(open)
}

/// A call its client cancels closes its binding as the handler goes, so that no restart relays
/// an answer to it: the open bindings go from one back to none.
#[tokio::test]
async fn a_cancelled_call_leaves_no_binding_for_a_restart_to_answer() {
    // A second a batch, 40 batches: the task outlasts the wait below, so only the cancel can
    // close the binding in time, not the task's end.
    let (dir, server) = server(&["--time-scale", "1"]).await;
    let session = RawSession::open(&server.mcp_url(), V_NEW).await;
    let call = json!({"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {
        "name": "resumable_data_processing",
        "arguments": {"dataset_name": "cancelled", "total_records": 400, "batch_size": 10,
                      "client_id": "raw"},
        "_meta": {"progressToken": "cancelled-call"}}});
    let mut stream = Sse::new(session.post(call).await);
    stream
        .until(IO_TIMEOUT, |message| {
            message["method"] == "notifications/progress"
        })
        .await;
    // (The database file exists by now: a server announces its port before opening it.)
    let Some(bound) = open_bindings(dir.path()) else {
        return; // the rows are counted on SQLite; the code path is the same on PostgreSQL
    };
    assert_eq!(bound, 1, "the waiting call is bound");

    let cancel = session
        .post(
            json!({"jsonrpc": "2.0", "method": "notifications/cancelled",
                     "params": {"requestId": 7, "reason": "changed my mind"}}),
        )
        .await;
    assert_eq!(cancel.status(), 202);
    within(IO_TIMEOUT, "the cancelled call's binding to close", async {
        while open_bindings(dir.path()) != Some(0) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    let stats = session
        .call(
            2,
            "tools/call",
            json!({"name": "get_server_stats", "arguments": {}}),
        )
        .await;
    assert_eq!(
        stats["structuredContent"]["completed_tasks"], 0,
        "the task goes on: only the call was cancelled"
    );
}

#[tokio::test]
async fn a_lost_tool_call_stream_delivers_missed_progress_and_the_result_once() {
    let (_dir, server) = server(&["--time-scale", "0.05"]).await;
    let session = RawSession::open(&server.mcp_url(), V_NEW).await;
    let call = json!({"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {
        "name": "resumable_data_processing",
        "arguments": {"dataset_name": "lost", "total_records": 60, "batch_size": 10, "client_id": "raw"},
        "_meta": {"progressToken": "lost-call"}}});
    let response = session.post(call).await;
    let mut stream = Sse::new(response);
    let mut seen = stream
        .until(IO_TIMEOUT, |message| {
            message["params"]["progress"].as_f64() == Some(10.0)
        })
        .await;
    drop(stream);
    wait_completed(&session, 1).await;

    let resumed = session
        .get(Some(seen.last().unwrap().id.as_deref().unwrap()))
        .await;
    assert_eq!(resumed.status(), 200);
    let mut resumed = Sse::new(resumed);
    let missed = resumed
        .until(IO_TIMEOUT, |message| message.get("id") == Some(&json!(7)))
        .await;
    assert!(
        resumed.next(IO_TIMEOUT).await.is_none(),
        "the stream ends after its response"
    );
    let progress: Vec<f64> = missed[..missed.len() - 1]
        .iter()
        .filter_map(|event| event.json()["params"]["progress"].as_f64())
        .collect();
    assert_eq!(progress, [20.0, 30.0, 40.0, 50.0, 60.0]);
    let result = missed.last().unwrap().json();
    assert_eq!(
        result["result"]["structuredContent"]["total_processed"],
        json!(60)
    );
    seen.extend(missed);
    assert!(seen[0].is_priming());
    assert_contiguous(&seen);

    // Resuming from the final response replays nothing and ends at once.
    let after_end = session
        .get(Some(seen.last().unwrap().id.as_deref().unwrap()))
        .await;
    let mut after_end = Sse::new(after_end);
    assert!(after_end.next(IO_TIMEOUT).await.is_none());
}

async fn refused(response: reqwest::Response, status: u16, says: &str) {
    assert_eq!(response.status(), status);
    let body: Value = within(IO_TIMEOUT, "error body", response.json())
        .await
        .unwrap();
    let message = body["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains(says), "{message:?} lacks {says:?}");
}

#[tokio::test]
async fn bad_last_event_ids_and_sessions_get_the_documented_errors() {
    let (_dir, server) = server(&["--time-scale", "0.01"]).await;
    let alice = RawSession::open(&server.mcp_url(), V_NEW).await;
    let bob = RawSession::open(&server.mcp_url(), V_NEW).await;
    let mut bobs = Sse::new(bob.get(None).await);
    let bobs_priming = bobs.next(IO_TIMEOUT).await.unwrap().id.unwrap();
    let mut alices = Sse::new(alice.get(None).await);
    let alices_priming = alices.next(IO_TIMEOUT).await.unwrap().id.unwrap();
    drop(alices);

    refused(
        alice.get(Some("garbage")).await,
        400,
        "is not an event id of this server",
    )
    .await;
    refused(
        alice.get(Some("0123456789abcdef0123456789abcdef.1")).await,
        400,
        "was never sent on this session's streams",
    )
    .await;
    let (token, _) = alices_priming.split_once('.').unwrap();
    refused(
        alice.get(Some(&format!("{token}.99"))).await,
        400,
        "was never sent",
    )
    .await;
    refused(
        alice.get(Some(&bobs_priming)).await,
        403,
        "belongs to another session",
    )
    .await;
    assert_eq!(alice.get(Some(&alices_priming)).await.status(), 200);

    let anonymous = within(
        IO_TIMEOUT,
        "request",
        alice
            .http
            .get(&alice.url)
            .header("Accept", "text/event-stream")
            .header("Last-Event-ID", &alices_priming)
            .send(),
    )
    .await
    .unwrap();
    refused(anonymous, 400, "needs the Mcp-Session-Id header").await;
    let no_session = within(
        IO_TIMEOUT,
        "request",
        alice
            .http
            .post(&alice.url)
            .header("Accept", "application/json, text/event-stream")
            .json(&json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list"}))
            .send(),
    )
    .await
    .unwrap();
    assert_eq!(no_session.status(), 400);
    let unknown = within(
        IO_TIMEOUT,
        "request",
        alice
            .http
            .post(&alice.url)
            .header("Accept", "application/json, text/event-stream")
            .header("Mcp-Session-Id", "no-such-session")
            .json(&json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list"}))
            .send(),
    )
    .await
    .unwrap();
    assert_eq!(unknown.status(), 404);
    let foreign = within(
        IO_TIMEOUT,
        "request",
        alice
            .request(reqwest::Method::GET)
            .header("Origin", "https://evil.example")
            .header("Last-Event-ID", &alices_priming)
            .send(),
    )
    .await
    .unwrap();
    assert_eq!(foreign.status(), 403);

    let deleted = within(
        IO_TIMEOUT,
        "DELETE",
        alice.request(reqwest::Method::DELETE).send(),
    )
    .await
    .unwrap();
    assert!(deleted.status().is_success(), "{}", deleted.status());
    let after = alice
        .post(json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"}))
        .await;
    assert_eq!(after.status(), 404);
    assert_eq!(alice.get(Some(&alices_priming)).await.status(), 404);
    // Bob's session and stream are untouched.
    drop(bobs);
    assert_eq!(bob.get(Some(&bobs_priming)).await.status(), 200);
}

#[tokio::test]
async fn expired_events_get_410_and_idle_sessions_expire_to_404() {
    let (_dir, server) = server(&["--event-max-age", "300ms", "--session-ttl", "1500ms"]).await;
    let session = RawSession::open(&server.mcp_url(), V_NEW).await;
    let mut stream = Sse::new(session.get(None).await);
    let priming = stream.next(IO_TIMEOUT).await.unwrap().id.unwrap();
    drop(stream);
    within(
        Duration::from_secs(10),
        "the priming event to expire",
        async {
            loop {
                let response = session.get(Some(&priming)).await;
                if response.status() == 410 {
                    refused(response, 410, "have expired").await;
                    return;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        },
    )
    .await;

    // No request and no open stream for longer than the TTL: the session is gone.
    within(Duration::from_secs(10), "the session to expire", async {
        loop {
            tokio::time::sleep(Duration::from_millis(2_000)).await;
            let response = session
                .post(json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list"}))
                .await;
            if response.status() == 404 {
                return;
            }
        }
    })
    .await;
}

/// Waits until the server has put `count` dormant sessions to sleep.
async fn until_slept(server: &Server, count: f64) {
    within(
        Duration::from_secs(20),
        "dormant sessions to sleep",
        async {
            while server.metrics().await.get("durable_sessions_slept_total") < Some(count) {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        },
    )
    .await;
}

/// A session that does nothing for a while leaves memory and comes back on its next request
/// as if nothing had happened: the same session id, many requests at once all answered, its
/// standalone stream resumed from before and live again.
#[tokio::test]
async fn a_dormant_session_leaves_memory_and_its_next_requests_bring_it_back() {
    let (_dir, server) = server(&["--session-dormant-after", "1s", "--time-scale", "0"]).await;
    let session = RawSession::open(&server.mcp_url(), V_NEW).await;
    session.call(1, "tools/call", start_batch(2)).await;
    wait_completed(&session, 2).await;
    let mut stream = Sse::new(session.get(None).await);
    let priming = stream.next(IO_TIMEOUT).await.unwrap().id.unwrap();
    drop(stream);
    until_slept(&server, 1.0).await;

    let answers = futures::future::join_all(
        (10..26).map(|id| session.try_answer(id, "tools/list", json!({}))),
    )
    .await;
    let refused: Vec<u16> = answers.iter().filter_map(|a| a.clone().err()).collect();
    assert!(refused.is_empty(), "refused {refused:?}");
    let mut resumed = Sse::new(session.get(Some(&priming)).await);
    let started = session.call(30, "tools/call", start_batch(1)).await;
    let mut seen = Vec::new();
    until_task(&mut resumed, &mut seen, &started).await;
    assert_contiguous(&seen);
}

/// Only a session that neither follows nor awaits anything goes to sleep. One with a call in
/// progress (its stream lost, its task another client's), one subscribed to a resource and one
/// whose client's task runs all stay; the call's stream, resumed afterwards, carries its
/// progress and result.
#[tokio::test]
async fn a_session_that_follows_or_awaits_something_stays_awake() {
    let (_dir, server) = server(&["--session-dormant-after", "1s", "--time-scale", "0.5"]).await;
    let url = server.mcp_url();
    let _quiet = RawSession::open(&url, V_NEW).await;
    let subscriber = RawSession::open(&url, V_NEW).await;
    subscriber
        .call(1, "resources/subscribe", json!({"uri": "task://list"}))
        .await;
    let owner = RawSession::open(&url, V_NEW).await;
    // Running for the whole test: 40 steps of half a second.
    owner.call(1, "tools/call", start_batch(40)).await;
    // The caller's connections go through a proxy that can cut them, as a lost network does
    // (a client that merely stops reading leaves its connection open).
    let proxy = Proxy::start(server.addr).await;
    let caller = RawSession::open(&format!("http://{}/mcp", proxy.addr), V_NEW).await;
    let call = json!({"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {
        "name": "resumable_data_processing",
        "arguments": {"dataset_name": "awaited", "total_records": 200, "batch_size": 10,
                      "client_id": "someone-else"},
        "_meta": {"progressToken": "awaited"}}});
    let mut stream = Sse::new(caller.post(call).await);
    let mut seen = stream
        .until(IO_TIMEOUT, |message| {
            message["params"]["progress"].as_f64() == Some(10.0)
        })
        .await;
    proxy.cut();
    drop(stream);
    proxy.restore();
    let caller = caller.reconnected();
    // The caller's session now speaks for itself again, a client with no task.
    let info = caller
        .call(
            2,
            "tools/call",
            json!({"name": "get_session_info", "arguments": {}}),
        )
        .await;
    assert_ne!(
        info["structuredContent"]["client_id"],
        json!("someone-else")
    );
    // The server has seen the cut: the caller has nothing open, only its call in progress.
    within(IO_TIMEOUT, "the cut stream to close", async {
        while server.metrics().await.get("durable_open_streams") != Some(0.0) {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    // A session opened after the caller's last request: once it has slept, the caller has been
    // quiet long enough too, and was asked. One opened after that sleeps a dormancy period
    // later, when the sessions that stayed were asked again; still only quiet ones slept.
    let _quiet_later = RawSession::open(&url, V_NEW).await;
    until_slept(&server, 2.0).await;
    let _quiet_last = RawSession::open(&url, V_NEW).await;
    until_slept(&server, 3.0).await;
    assert_eq!(
        server.metrics().await.get("durable_sessions_slept_total"),
        Some(3.0),
        "only the quiet sessions slept"
    );
    let resumed = caller
        .get(Some(seen.last().unwrap().id.as_deref().unwrap()))
        .await;
    assert_eq!(resumed.status(), 200);
    let missed = Sse::new(resumed)
        .until(Duration::from_secs(30), |message| {
            message.get("id") == Some(&json!(7))
        })
        .await;
    let result = missed.last().unwrap().json();
    assert_eq!(
        result["result"]["structuredContent"]["total_processed"],
        json!(200),
        "{missed:#?}"
    );
    seen.extend(missed);
    assert_contiguous(&seen);
}

#[tokio::test]
async fn an_open_stream_keeps_its_session_alive() {
    let (_dir, server) = server(&["--session-ttl", "1s"]).await;
    let session = RawSession::open(&server.mcp_url(), V_NEW).await;
    let mut stream = Sse::new(session.get(None).await);
    stream.next(IO_TIMEOUT).await.expect("priming");
    // Three TTLs with no request, only the open stream.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let stats = session
        .call(
            1,
            "tools/call",
            json!({"name": "get_server_stats", "arguments": {}}),
        )
        .await;
    assert_eq!(stats["structuredContent"]["total_tasks"], json!(0));
}

#[tokio::test]
async fn priming_events_reach_only_2025_11_25_clients() {
    let (_dir, server) = server(&["--time-scale", "0.01"]).await;
    let new = RawSession::open(&server.mcp_url(), V_NEW).await;
    let response = new
        .post(json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list"}))
        .await;
    let events = Sse::new(response)
        .until(IO_TIMEOUT, |message| message.get("result").is_some())
        .await;
    assert!(events[0].is_priming() && events[0].id.is_some() && events[0].retry_ms == Some(3000));

    let old = RawSession::open(&server.mcp_url(), V_OLD).await;
    let response = old
        .post(json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list"}))
        .await;
    let events = Sse::new(response)
        .until(IO_TIMEOUT, |message| message.get("result").is_some())
        .await;
    assert!(
        events.iter().all(|event| !event.is_priming()),
        "{events:#?}"
    );
    let mut stream = Sse::new(old.get(None).await);
    old.call(2, "resources/subscribe", json!({"uri": "task://list"}))
        .await;
    old.call(3, "tools/call", start_batch(1)).await;
    let first = stream.next(IO_TIMEOUT).await.unwrap();
    assert!(!first.is_priming(), "{first:?}");
    assert_eq!(
        first.json()["method"],
        json!("notifications/resources/updated")
    );

    // The initialize answer itself carries priming only for new clients.
    let raw_init = |version: &'static str| {
        new.http
            .post(&new.url)
            .header("Accept", "application/json, text/event-stream")
            .json(
                &json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
                "protocolVersion": version, "capabilities": {},
                "clientInfo": {"name": "raw-test", "version": "1"}}}),
            )
            .send()
    };
    for (version, primed) in [(V_NEW, true), (V_OLD, false), ("2025-06-18", false)] {
        let response = within(IO_TIMEOUT, "initialize", raw_init(version))
            .await
            .unwrap();
        let events = Sse::new(response)
            .until(IO_TIMEOUT, |message| message.get("result").is_some())
            .await;
        assert_eq!(events[0].is_priming(), primed, "{version}: {events:#?}");
        assert_eq!(
            events.last().unwrap().json()["result"]["protocolVersion"],
            json!(version)
        );
    }
}

#[tokio::test]
async fn the_python_sdk_discover_probe_gets_a_quick_answer() {
    let (_dir, server) = server(&[]).await;
    let http = reqwest::Client::new();
    let response = within(
        Duration::from_secs(5),
        "server/discover",
        http.post(server.mcp_url())
            .header("Accept", "application/json, text/event-stream")
            .header("MCP-Protocol-Version", "2026-07-28")
            .json(&json!({"jsonrpc": "2.0", "id": 1, "method": "server/discover", "params": {}}))
            .send(),
    )
    .await
    .unwrap();
    let status = response.status();
    let body = within(Duration::from_secs(5), "discover body", response.text())
        .await
        .unwrap();
    assert!(
        status.is_client_error() || body.contains("\"error\""),
        "the probe must fail fast so the client falls back to initialize: {status} {body}"
    );
}

/// SIGKILL while a client holds a session, an open standalone stream and an open tool call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_kill_the_session_streams_and_the_interrupted_call_all_resume() {
    let dir = tempfile::tempdir().unwrap();
    let mut server = Server::start(dir.path(), &["--time-scale", "0.05"]).await;
    let session = RawSession::open(&server.mcp_url(), V_NEW).await;
    let mut standalone = Sse::new(session.get(None).await);
    let mut common = vec![standalone.next(IO_TIMEOUT).await.unwrap()];
    session
        .call(1, "resources/subscribe", json!({"uri": "task://list"}))
        .await;

    let call = json!({"jsonrpc": "2.0", "id": 9, "method": "tools/call", "params": {
        "name": "resumable_data_processing",
        "arguments": {"dataset_name": "crash", "total_records": 100, "batch_size": 10, "client_id": "raw"},
        "_meta": {"progressToken": 99}}});
    let mut post = Sse::new(session.post(call).await);
    let mut call_events = post
        .until(IO_TIMEOUT, |message| {
            message["params"]["progress"].as_f64() == Some(30.0)
        })
        .await;
    common.push(standalone.next(IO_TIMEOUT).await.unwrap());
    server.kill9().await;
    // Events already in flight still arrive; then the call's connection ends with the server
    // (the read's deadline fails the test if it does not).
    while let Some(event) = post.next_or_cut(IO_TIMEOUT).await {
        call_events.push(event);
    }
    drop((post, standalone));
    server.restart().await;

    // (a) The session still works, without initializing again.
    let stats = session
        .call(
            2,
            "tools/call",
            json!({"name": "get_server_stats", "arguments": {}}),
        )
        .await;
    assert_eq!(stats["structuredContent"]["total_tasks"], json!(1));

    // (c) The interrupted call's stream resumes with the rest of its progress and its result.
    let resumed = session
        .get(Some(call_events.last().unwrap().id.as_deref().unwrap()))
        .await;
    assert_eq!(resumed.status(), 200);
    let mut resumed = Sse::new(resumed);
    let rest = resumed
        .until(Duration::from_secs(60), |message| {
            message.get("id") == Some(&json!(9))
        })
        .await;
    call_events.extend(rest);
    assert_contiguous(&call_events);
    let progress: Vec<f64> = call_events
        .iter()
        .filter(|event| !event.is_priming())
        .filter_map(|event| event.json()["params"]["progress"].as_f64())
        .collect();
    assert!(
        progress.windows(2).all(|w| w[0] < w[1]),
        "strictly increasing: {progress:?}"
    );
    assert_eq!(progress.last(), Some(&100.0));
    let answer = call_events.last().unwrap().json();
    assert_eq!(
        answer["result"]["structuredContent"]["total_processed"],
        json!(100)
    );
    assert_eq!(answer["result"]["isError"], json!(false));

    // (b) The standalone stream resumes from the client's last id: everything stored since,
    // nothing twice, then live.
    let mut standalone = Sse::new(
        session
            .get(Some(common.last().unwrap().id.as_deref().unwrap()))
            .await,
    );
    while let Some(event) = standalone.next_or_idle(IDLE).await {
        common.push(event);
    }
    let fresh = session.call(3, "tools/call", start_batch(1)).await;
    until_task(&mut standalone, &mut common, &fresh).await;
    assert_contiguous(&common);
    // The task://list subscription made before the kill still delivers: the task started
    // after the restart is announced on it.
    let fresh_id = &fresh["structuredContent"]["task_id"];
    assert!(
        common
            .iter()
            .filter(|event| !event.is_priming())
            .any(|event| {
                let message = event.json();
                message["method"] == "notifications/resources/updated"
                    && message["params"]["uri"] == "task://list"
                    && message["params"]["_meta"][TASK_META_KEY]["task_id"] == *fresh_id
            }),
        "no task://list update for the task started after the restart: {common:#?}"
    );
}

/// What an independent raw client sends wrong gets JSON-RPC's answer for it, with HTTP 400:
/// a body that is not JSON a parse error (-32700), JSON that is no message an invalid request
/// (-32600); the session goes on.
#[tokio::test]
async fn a_body_that_is_no_message_gets_400_with_its_json_rpc_error() {
    let (_dir, server) = server(&[]).await;
    let session = RawSession::open(&server.mcp_url(), "2025-11-25").await;
    let send = |body: &'static str| {
        let request = session
            .request(reqwest::Method::POST)
            .header("Content-Type", "application/json")
            .body(body);
        async move { within(IO_TIMEOUT, "POST", request.send()).await.unwrap() }
    };
    for (body, code) in [
        (r#"{"jsonrpc": "2.0", "id": 1, "method": "#, -32700),
        ("not json at all", -32700),
        (r#"{"jsonrpc": "2.0", "id": 1}"#, -32600),
    ] {
        let response = send(body).await;
        assert_eq!(response.status(), 400, "{body}");
        let answer: Value = response.json().await.unwrap();
        assert_eq!(answer["error"]["code"], code, "{body}: {answer}");
    }
    let pong = session.call(2, "ping", json!({})).await;
    assert_eq!(pong, json!({}));
}

/// Protocol 2025-03-26 allows JSON-RPC batches: every request of one is answered on one SSE
/// stream that ends after the last answer, a notification needs none, `initialize` may not be
/// batched; a session on a later revision gets 400 for a batch and goes on.
#[tokio::test]
async fn a_2025_03_26_batch_is_answered_message_by_message() {
    let (_dir, server) = server(&["--time-scale", "0.01"]).await;
    let old = RawSession::open(&server.mcp_url(), V_OLD).await;
    // As a 2025-03-26 client sends it: without the MCP-Protocol-Version header.
    let send = |body: Value| {
        let request = old
            .http
            .post(&old.url)
            .header("Accept", "application/json, text/event-stream")
            .header("Mcp-Session-Id", &old.session_id)
            .json(&body);
        async move { within(IO_TIMEOUT, "POST", request.send()).await.unwrap() }
    };
    let response = send(json!([
        {"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
        {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 99}},
        {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": start_batch(3)},
        {"jsonrpc": "2.0", "id": 3, "method": "initialize", "params": {"protocolVersion": V_OLD,
            "capabilities": {}, "clientInfo": {"name": "raw-test", "version": "1"}}},
        {"jsonrpc": "2.0", "id": 4, "method": "no/such/method"},
        5,
    ]))
    .await;
    assert_eq!(response.status(), 200);
    let mut stream = Sse::new(response);
    let mut answers = std::collections::BTreeMap::new();
    let mut without_id = Vec::new();
    while let Some(event) = stream.next(IO_TIMEOUT).await {
        let message = event.json();
        match message["id"].as_u64() {
            Some(id) => assert!(
                answers.insert(id, message).is_none(),
                "answered twice: {id}"
            ),
            None => without_id.push(message),
        }
    }
    // The element that is no message gets an invalid request error with a null id.
    assert_eq!(without_id.len(), 1, "{without_id:?}");
    assert_eq!(without_id[0]["error"]["code"], -32600);
    assert_eq!(answers.keys().copied().collect::<Vec<_>>(), [1, 2, 3, 4]);
    assert!(answers[&1]["result"]["tools"].as_array().unwrap().len() > 5);
    let task_id = &answers[&2]["result"]["structuredContent"]["task_id"];
    assert!(task_id.is_string(), "{}", answers[&2]);
    assert_eq!(answers[&3]["error"]["code"], -32600);
    assert_eq!(answers[&4]["error"]["code"], -32601);

    let notifications = send(json!([
        {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 98}},
    ]))
    .await;
    assert_eq!(notifications.status(), 202);
    let empty = send(json!([])).await;
    assert_eq!(empty.status(), 400);

    let new = RawSession::open(&server.mcp_url(), V_NEW).await;
    let refused = new
        .post(json!([{"jsonrpc": "2.0", "id": 1, "method": "ping"}]))
        .await;
    assert_eq!(refused.status(), 400);
    let answer: Value = refused.json().await.unwrap();
    assert_eq!(answer["error"]["code"], -32600, "{answer}");
    assert!(
        answer["error"]["message"].as_str().unwrap().contains(V_OLD),
        "{answer}"
    );
    assert_eq!(new.call(2, "ping", json!({})).await, json!({}));
}

/// A call whose handler died with the server when only its priming event had gone out, and
/// that no relay can answer (it asked for no progress, so it left no call binding), is not
/// resumed into a wait for ever, as the soak found such calls: the resumption is refused with
/// 410 saying to send the request again, and the request sent again attaches to its task,
/// which ran on.
#[tokio::test]
async fn a_call_nothing_will_answer_after_a_kill_is_refused_instead_of_waited_on() {
    let dir = tempfile::tempdir().unwrap();
    let mut server = Server::start(dir.path(), &["--time-scale", "0.05"]).await;
    let session = RawSession::open(&server.mcp_url(), V_NEW).await;
    let arguments = json!({"dataset_name": "lost", "total_records": 100, "batch_size": 10,
                           "client_id": "raw"});
    let call = json!({"jsonrpc": "2.0", "id": 5, "method": "tools/call", "params": {
        "name": "resumable_data_processing", "arguments": arguments}});
    let mut post = Sse::new(session.post(call).await);
    let priming = post.next(IO_TIMEOUT).await.expect("the priming event");
    assert!(priming.is_priming(), "{priming:?}");
    server.kill9().await;
    drop(post);
    server.restart().await;

    let resumed = session.get(priming.id.as_deref()).await;
    refused(resumed, 410, "send the request again").await;
    let again = session
        .call(
            6,
            "tools/call",
            json!({"name": "resumable_data_processing", "arguments": arguments}),
        )
        .await;
    assert_eq!(again["structuredContent"]["total_processed"], json!(100));

    // A live call's stream, and the stream of a call a relay answers, still resume.
    let call = json!({"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {
        "name": "resumable_data_processing",
        "arguments": {"dataset_name": "relayed", "total_records": 100, "batch_size": 10,
                      "client_id": "raw"},
        "_meta": {"progressToken": 7}}});
    let mut post = Sse::new(session.post(call).await);
    let first = post
        .until(IO_TIMEOUT, |message| {
            message["method"] == "notifications/progress"
        })
        .await;
    let last_id = first.last().unwrap().id.clone().unwrap();
    assert_eq!(
        session.get(Some(&last_id)).await.status(),
        200,
        "a live call"
    );
    server.kill9().await;
    drop(post);
    server.restart().await;
    let mut resumed = Sse::new(session.get(Some(&last_id)).await);
    let rest = resumed
        .until(Duration::from_secs(60), |message| {
            message.get("id") == Some(&json!(7))
        })
        .await;
    let answer = rest.last().unwrap().json();
    assert_eq!(
        answer["result"]["structuredContent"]["total_processed"],
        json!(100)
    );
}
