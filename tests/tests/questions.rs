//! Tasks that wait for a person: a trip's questions stay open across SIGKILLs, are answered
//! once (with `answer_task`, or by elicitation to a session of the task's owner), and the task
//! then ends exactly as a run that was never interrupted.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use durable_shared::TaskStatus;
use durable_tests::trip::{answer, answered, asked, hotels, trip};
use durable_tests::{Client, IO_TIMEOUT, Server, serve_with, within};
use rmcp::model::{
    ClientCapabilities, ClientConfig, ElicitRequestParams, ElicitResult, ElicitationAction,
};
use rmcp::service::RequestContext;
use rmcp::{ClientHandler, ErrorData as McpError, RoleClient};
use serde_json::{Value, json};

const TASK_LIMIT: Duration = Duration::from_secs(60);

fn task_id(started: &Value) -> String {
    started["task_id"].as_str().expect("task_id").to_owned()
}

/// The question and its form survive two SIGKILLs; a wrong, late or second answer is refused
/// with what is wrong, and the first right one is applied exactly once.
#[tokio::test]
async fn a_question_outlives_kills_and_its_answer_is_applied_once() {
    let dir = tempfile::tempdir().unwrap();
    let mut server = Server::start(dir.path(), &["--time-scale", "0.01"]).await;
    let client = Client::connect(&server.mcp_url(), Some("traveller")).await;
    let id = task_id(&client.call_ok("start_trip_planning", trip()).await);
    let question = asked(&client, &id, "choose_hotel").await;
    let offered = hotels(&question);
    assert_eq!(offered.len(), 3, "{question:?}");
    client.close().await;

    server.kill9().await;
    server.restart().await;
    let client = Client::connect(&server.mcp_url(), Some("traveller")).await;
    let after = client.task(&id).await;
    assert_eq!(after.status, TaskStatus::InputRequired);
    assert_eq!(
        after.question.as_ref(),
        Some(&question),
        "the same question, kept"
    );

    let early = client
        .call_err(
            "answer_task",
            answer(&id, "confirm_booking", json!({"book": true})),
        )
        .await;
    assert_eq!(
        early,
        format!(
            "question \"confirm_booking\" of task {id} is not open (answered already, or never \
             asked): it asks \"choose_hotel\" now"
        )
    );
    let wrong = client
        .call(
            "answer_task",
            answer(&id, "choose_hotel", json!({"hotel": "Nowhere"})),
        )
        .await;
    assert_eq!(wrong.is_error, Some(true));
    assert_eq!(
        wrong
            .structured_content
            .as_ref()
            .map(|s| s["field"].clone()),
        Some(json!("hotel")),
        "{wrong:?}"
    );
    let missing = client
        .call_err(
            "answer_task",
            json!({"task_id": id, "question_id": "choose_hotel"}),
        )
        .await;
    assert!(
        missing.starts_with("answer is required to accept"),
        "{missing}"
    );
    assert_eq!(client.task(&id).await.question.as_ref(), Some(&question));

    let chosen = &offered[1];
    client
        .call_ok(
            "answer_task",
            answer(&id, "choose_hotel", json!({"hotel": chosen})),
        )
        .await;
    let second = client
        .call_err(
            "answer_task",
            answer(&id, "choose_hotel", json!({"hotel": offered[0]})),
        )
        .await;
    assert!(
        second.starts_with(&format!(
            "question \"choose_hotel\" of task {id} is not open"
        )),
        "{second}"
    );

    let confirm = asked(&client, &id, "confirm_booking").await;
    assert!(confirm.message.contains(chosen.as_str()), "{confirm:?}");
    client.close().await;
    server.kill9().await;
    server.restart().await;
    let client = Client::connect(&server.mcp_url(), Some("traveller")).await;
    assert_eq!(client.task(&id).await.question, Some(confirm));
    client
        .call_ok(
            "answer_task",
            answer(&id, "confirm_booking", json!({"book": true})),
        )
        .await;
    let done = client.wait_terminal(&id, TASK_LIMIT).await;
    assert_eq!(done.status, TaskStatus::Completed, "{done:?}");

    let baseline = answered(&client, chosen).await;
    assert_eq!(done.result_data, baseline.result_data);
    let result = done.result_data.expect("a result");
    assert_eq!(result["hotel"], json!(chosen));
    assert_eq!(result["booked"], json!(true));
    assert_eq!(
        result["answers_applied"],
        json!(2),
        "each answer applied once"
    );
    client.close().await;
}

/// Declining a question ends the trip without a booking.
#[tokio::test]
async fn a_declined_question_ends_the_trip_unbooked() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path(), &["--time-scale", "0.01"]).await;
    let client = Client::connect(&server.mcp_url(), None).await;
    let id = task_id(&client.call_ok("start_trip_planning", trip()).await);
    asked(&client, &id, "choose_hotel").await;
    client
        .call_ok(
            "answer_task",
            json!({"task_id": id, "question_id": "choose_hotel", "action": "decline"}),
        )
        .await;
    let done = client.wait_terminal(&id, TASK_LIMIT).await;
    assert_eq!(done.status, TaskStatus::Completed);
    let result = done.result_data.expect("a result");
    assert_eq!(
        (
            &result["booked"],
            &result["hotel"],
            &result["answers_applied"]
        ),
        (&json!(false), &Value::Null, &json!(1))
    );
    client.close().await;
}

/// A client that declares elicitation and answers every question it is asked: the first
/// hotel, then yes.
#[derive(Clone, Default)]
struct Person {
    asked: Arc<Mutex<Vec<String>>>,
}

impl ClientHandler for Person {
    fn get_info(&self) -> ClientConfig {
        let mut info = ClientConfig::default();
        info.capabilities =
            serde_json::from_value::<ClientCapabilities>(json!({"elicitation": {"form": {}}}))
                .expect("capabilities");
        info
    }

    async fn create_elicitation(
        &self,
        request: ElicitRequestParams,
        _context: RequestContext<RoleClient>,
    ) -> Result<ElicitResult, McpError> {
        let ElicitRequestParams::FormElicitationParams {
            message,
            requested_schema,
            ..
        } = request
        else {
            return Ok(ElicitResult::new(ElicitationAction::Decline));
        };
        self.asked.lock().unwrap().push(message);
        let schema = serde_json::to_value(&requested_schema).expect("schema JSON");
        let content = match schema["properties"]["hotel"]["enum"][0].as_str() {
            Some(hotel) => json!({"hotel": hotel}),
            None => json!({"book": true}),
        };
        Ok(ElicitResult::new(ElicitationAction::Accept).with_content(content))
    }
}

/// A question asked while no session could be asked (the task was started by a client without
/// elicitation, then the server was SIGKILLed) is asked of the owner's next session that can
/// answer; the owner's answers finish the trip as an uninterrupted run, and a session of
/// another client is never asked.
#[tokio::test]
async fn the_owners_next_session_is_asked_by_elicitation_after_a_kill() {
    let dir = tempfile::tempdir().unwrap();
    let mut server = Server::start(dir.path(), &["--time-scale", "0.01"]).await;
    let client = Client::connect(&server.mcp_url(), Some("owner")).await;
    let id = task_id(&client.call_ok("start_trip_planning", trip()).await);
    let question = asked(&client, &id, "choose_hotel").await;
    client.close().await;
    server.kill9().await;
    server.restart().await;

    let stranger = Person::default();
    let stranger_session = serve_with(&server.mcp_url(), Some("stranger"), None, stranger.clone())
        .await
        .expect("the stranger connects");
    let owner = Person::default();
    let owner_session = serve_with(&server.mcp_url(), Some("owner"), None, owner.clone())
        .await
        .expect("the owner connects");
    let observer = Client::connect(&server.mcp_url(), Some("observer")).await;
    let done = observer.wait_terminal(&id, TASK_LIMIT).await;
    assert_eq!(done.status, TaskStatus::Completed, "{done:?}");
    let asked = owner.asked.lock().unwrap().clone();
    assert_eq!(asked.len(), 2, "each question asked once: {asked:?}");
    assert_eq!(asked[0], question.message);
    assert!(
        stranger.asked.lock().unwrap().is_empty(),
        "another client's session was asked"
    );

    let baseline = answered(&observer, &hotels(&question)[0]).await;
    assert_eq!(done.result_data, baseline.result_data);
    assert_eq!(done.result_data.unwrap()["answers_applied"], json!(2));
    for session in [owner_session, stranger_session] {
        let _ = within(IO_TIMEOUT, "client close", session.cancel()).await;
    }
    observer.close().await;
}

/// rmcp sends a session's server-to-client requests on its standalone (GET) stream, and a
/// fresh stream replays nothing: a question asked before the client opened it would be lost
/// for the whole session. A session that opens its stream a while after `initialized` is still
/// asked, on that stream.
#[tokio::test]
async fn a_session_that_opens_its_stream_late_is_still_asked() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path(), &["--time-scale", "0.01"]).await;
    let client = Client::connect(&server.mcp_url(), Some("late")).await;
    let id = task_id(&client.call_ok("start_trip_planning", trip()).await);
    let question = asked(&client, &id, "choose_hotel").await;

    let mut headers = reqwest::header::HeaderMap::new();
    headers.insert("x-client-id", "late".parse().unwrap());
    let http = reqwest::Client::builder()
        .default_headers(headers)
        .build()
        .unwrap();
    let session = durable_tests::raw::RawSession::open_with(
        http,
        &server.mcp_url(),
        "2025-11-25",
        json!({"elicitation": {"form": {}}}),
    )
    .await;
    // The session's open questions are looked up at `initialized`; the stream opens later.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut stream = durable_tests::raw::Sse::new(session.get(None).await);
    let events = stream
        .until(IO_TIMEOUT, |message| {
            message["method"] == "elicitation/create"
        })
        .await;
    let request = durable_tests::raw::EventExt::json(events.last().unwrap());
    assert_eq!(request["params"]["message"], json!(question.message));
    client.close().await;
}

/// A session whose notifications fell behind is resynchronised from the store, and that
/// includes the questions its client's tasks raised meanwhile: the "asks" milestones it missed
/// were the only other moment it would have been asked. With a queue of one notification and a
/// flood of changes in the owner's list, every trip is still asked, and answered, by
/// elicitation.
#[tokio::test]
async fn questions_raised_while_the_owners_session_lagged_are_still_asked() {
    const TRIPS: usize = 4;
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(
        dir.path(),
        &["--time-scale", "0", "--notification-buffer", "1"],
    )
    .await;
    let owner = Person::default();
    let owner_session = serve_with(&server.mcp_url(), Some("owner"), None, owner.clone())
        .await
        .expect("the owner connects");
    // Deprecated for 2026-07-28; how 2025-11-25 clients follow a list.
    #[allow(deprecated)]
    let subscribed = within(
        IO_TIMEOUT,
        "subscribing",
        owner_session.subscribe(rmcp::model::SubscribeRequestParams::new("task://list")),
    )
    .await;
    subscribed.expect("subscribe");
    let starter = Client::connect(&server.mcp_url(), Some("owner")).await;
    let mut trips = Vec::new();
    for round in 0..TRIPS * 6 {
        starter
            .call_ok(
                "start_batch_processing",
                json!({"batch_size": 1, "total_items": 15}),
            )
            .await;
        if round % 6 == 3 {
            trips.push(task_id(
                &starter.call_ok("start_trip_planning", trip()).await,
            ));
        }
    }
    for id in &trips {
        let done = starter.wait_terminal(id, TASK_LIMIT).await;
        assert_eq!(done.status, TaskStatus::Completed, "{done:?}");
        assert_eq!(done.result_data.unwrap()["answers_applied"], json!(2));
    }
    assert!(
        server
            .metrics()
            .await
            .get("durable_forwarder_resyncs_total")
            .is_some_and(|resyncs| resyncs > 0.0),
        "the flood should have made the owner's session fall behind"
    );
    let _ = within(IO_TIMEOUT, "client close", owner_session.cancel()).await;
    starter.close().await;
}
