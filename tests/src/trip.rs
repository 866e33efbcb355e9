//! The trip the tests plan (the `trip_planning` kind, whose run asks two questions), and the
//! same trip answered through `answer_task` without interruption: what every other way of
//! answering it must end with.

use durable_shared::{Question, TaskInfo, TaskStatus};
use serde_json::{Value, json};

use crate::{Client, TASK_LIMIT};

/// The trip's parameters.
pub fn trip() -> Value {
    json!({"destination": "Lisbon", "start_date": "2027-05-14", "nights": 3, "budget": 900})
}

/// Waits until the task asks question `id`, and returns the question.
pub async fn asked(client: &Client, task_id: &str, id: &str) -> Question {
    let task = client
        .wait_task(task_id, TASK_LIMIT, |task| {
            task.status.is_terminal() || task.question.as_ref().is_some_and(|q| q.id == id)
        })
        .await;
    assert_eq!(task.status, TaskStatus::InputRequired, "{task:?}");
    // The wait ended on the question (a terminal status fails above).
    task.question.expect("an open question")
}

/// The hotels a question offers.
pub fn hotels(question: &Question) -> Vec<String> {
    serde_json::from_value(question.schema["properties"]["hotel"]["enum"].clone())
        .expect("the hotels as an enum")
}

/// `answer_task`'s arguments.
pub fn answer(task_id: &str, question_id: &str, answer: Value) -> Value {
    json!({"task_id": task_id, "question_id": question_id, "answer": answer})
}

/// The trip started and answered (`hotel`, then yes to booking) through `answer_task`, to its
/// end.
pub async fn answered(client: &Client, hotel: &str) -> TaskInfo {
    let started = client.call_ok("start_trip_planning", trip()).await;
    let id = started["task_id"].as_str().expect("task_id").to_owned();
    asked(client, &id, "choose_hotel").await;
    client
        .call_ok(
            "answer_task",
            answer(&id, "choose_hotel", json!({"hotel": hotel})),
        )
        .await;
    asked(client, &id, "confirm_booking").await;
    client
        .call_ok(
            "answer_task",
            answer(&id, "confirm_booking", json!({"book": true})),
        )
        .await;
    client.wait_terminal(&id, TASK_LIMIT).await
}
