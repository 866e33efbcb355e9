//! Asks people the questions their tasks wait on, by elicitation: to each session of the
//! task's owner whose client declared the elicitation capability (2025-11-25 and earlier
//! revisions), when the task asks, and again to each such session that starts (or is restored
//! after a restart) while the question is open. The first answer is applied, once, by the
//! engine; a later one (from another session, or one that arrives after the question was
//! answered some other way) is refused, and the session that sent it is told so.
//!
//! The question itself lives with the task in the store: a pending `elicitation/create` is
//! only one way of asking it, so nothing is lost when a session, the client or the server goes
//! away while a person thinks.
#![allow(
    deprecated,
    reason = "logging is deprecated by SEP-2577 but 2025-11-25 clients use it"
)]

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use durable_shared::{Question, TaskInfo, TaskStatus};
use rmcp::model::{
    ElicitRequestParams, ElicitationAction, LoggingLevel, LoggingMessageNotificationParam,
};
use rmcp::{Peer, RoleServer};
use serde_json::json;

use super::Shared;
use super::resources::LIST_LIMIT;
use crate::engine::{Answer, EngineError};

/// How often one session is asked a question again after it sent an answer the task could
/// not take (a field out of bounds), before it is left to answer another way.
const ATTEMPTS: usize = 3;

/// How long a session that just started is waited for to open its standalone stream, where
/// its questions go, before it is left to be asked another way.
const STANDALONE_WAIT: Duration = Duration::from_secs(60);

/// The questions a session is being asked now, so that it is never asked one twice at once.
pub(super) type Asking = Arc<Mutex<HashSet<(String, String)>>>;

/// Whether `peer`'s client can be asked: it declared elicitation and speaks a revision with
/// server-to-client requests.
pub(super) fn can_ask(peer: &Peer<RoleServer>) -> bool {
    peer.peer_info().is_some_and(|info| {
        info.capabilities.elicitation.is_some() && info.protocol_version.has_initialize()
    })
}

/// Asks `peer` every open question of `owner`'s tasks: what a session that just started must
/// be asked, since it heard none of them.
pub(super) async fn ask_open_questions(
    shared: Arc<Shared>,
    peer: Peer<RoleServer>,
    owner: String,
    asking: Asking,
    session_id: Option<String>,
) {
    let waiting = match shared
        .engine
        .list(
            Some(owner),
            Some(TaskStatus::InputRequired),
            None,
            LIST_LIMIT,
        )
        .await
    {
        Ok(tasks) => tasks,
        Err(e) => {
            tracing::warn!(error = %e, "cannot find the questions a new session should be asked");
            return;
        }
    };
    for task in waiting {
        ask(
            shared.clone(),
            peer.clone(),
            &task,
            asking.clone(),
            session_id.clone(),
        );
    }
}

/// Asks `peer`, the peer of session `session_id`, the open question of `task`, in a task of its
/// own (a person may take days), once the session's standalone stream is open.
pub(super) fn ask(
    shared: Arc<Shared>,
    peer: Peer<RoleServer>,
    task: &TaskInfo,
    asking: Asking,
    session_id: Option<String>,
) {
    let Some(question) = task.question.clone() else {
        return;
    };
    let key = (task.task_id.clone(), question.id.clone());
    if !asking.lock().expect("asking lock").insert(key.clone()) {
        return;
    }
    tokio::spawn(async move {
        let shutdown = shared.shutdown.clone();
        let asked = async {
            let listening = match &session_id {
                Some(session_id) => {
                    shared
                        .streams
                        .until_standalone(session_id, STANDALONE_WAIT)
                        .await
                }
                None => true,
            };
            if listening {
                ask_until_answered(&shared, &peer, &key.0, &question).await;
            } else {
                tracing::debug!(task_id = key.0, "a session opened no stream to be asked on");
            }
        };
        tokio::select! {
            _ = asked => {}
            // The question stays with the task: the next start asks it again.
            _ = shutdown.cancelled() => {}
        }
        asking.lock().expect("asking lock").remove(&key);
    });
}

async fn ask_until_answered(
    shared: &Shared,
    peer: &Peer<RoleServer>,
    task_id: &str,
    question: &Question,
) {
    let mut message = question.message.clone();
    for _ in 0..ATTEMPTS {
        let params = match serde_json::from_value::<ElicitRequestParams>(json!({
            "mode": "form",
            "message": message,
            "requestedSchema": question.schema,
        })) {
            Ok(params) => params,
            Err(e) => {
                tracing::error!(task_id, question = question.id, error = %e,
                    "a question's schema is not one elicitation can carry");
                return;
            }
        };
        let reply = match peer.create_elicitation(params).await {
            Ok(reply) => reply,
            // The session or its client went away: the question stays open for the next.
            Err(e) => {
                tracing::debug!(task_id, error = %e, "a question went unanswered by its session");
                return;
            }
        };
        let answer = match reply.action {
            ElicitationAction::Accept => Answer::Accept(reply.content.unwrap_or(json!({}))),
            ElicitationAction::Decline => Answer::Decline,
            // Dismissed without an answer (or an action this server does not know): asked
            // again by the owner's next session.
            _ => return,
        };
        match shared.engine.answer(task_id, &question.id, answer).await {
            Ok(_) => return,
            Err(EngineError::InvalidParams(e)) => {
                message = format!("{} ({}; please answer again)", question.message, e.message);
            }
            Err(e @ EngineError::QuestionNotOpen(_)) => {
                tell(
                    peer,
                    LoggingLevel::Warning,
                    task_id,
                    format!("{e}; your answer was not applied"),
                )
                .await;
                return;
            }
            Err(e) => {
                tracing::warn!(task_id, error = %e, "cannot apply an answer");
                tell(
                    peer,
                    LoggingLevel::Error,
                    task_id,
                    format!("your answer could not be applied: {e}; answer again with answer_task"),
                )
                .await;
                return;
            }
        }
    }
}

/// A log message to `peer` about `task_id`.
async fn tell(peer: &Peer<RoleServer>, level: LoggingLevel, task_id: &str, text: String) {
    let mut param =
        LoggingMessageNotificationParam::new(level, json!({"message": text, "task_id": task_id}));
    param.logger = Some("durable-mcp".into());
    let _ = peer.notify_logging_message(param).await;
}
