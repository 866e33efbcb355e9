//! What a task looks like from outside the engine: the JSON of `task://status/{id}` and the
//! list and statistics views built from it.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::TaskStatus;

/// Key in the `_meta` of a `notifications/resources/updated` holding the task that changed, as
/// `task://status/{task_id}` shows it right after the change.
pub const TASK_META_KEY: &str = "durable-mcp/task";

/// Key in the `_meta` of a `notifications/resources/updated` for a `task://list` resource
/// holding the tasks the list shows now: sent to a subscriber that fell behind and missed
/// changes, instead of each of them.
pub const TASK_LIST_META_KEY: &str = "durable-mcp/tasks";

/// HTTP header naming a client's persistent identity (its tasks outlive its MCP sessions).
pub const CLIENT_ID_HEADER: &str = "x-client-id";

/// The URI of a task's status resource.
pub fn status_uri(task_id: &str) -> String {
    format!("task://status/{task_id}")
}

/// The URI of the task list resource, optionally filtered by status.
pub fn list_uri(status: Option<TaskStatus>) -> String {
    match status {
        Some(status) => format!("task://list/{status}"),
        None => "task://list".to_owned(),
    }
}

/// The query parameter of a list resource that reads the page after a task.
pub const LIST_AFTER_PARAM: &str = "after";

/// The URI of the page of list `status` that follows `last`, the last task of a page: the tasks
/// created before it (and those created in the same millisecond with a greater id).
pub fn list_page_uri(status: Option<TaskStatus>, last: &TaskInfo) -> String {
    format!(
        "{}?{LIST_AFTER_PARAM}={}.{}",
        list_uri(status),
        last.created_at.timestamp_millis(),
        last.task_id
    )
}

/// One task as clients see it. The field names up to `completed_at` are those of the reference
/// servers, so their clients can read it unchanged.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TaskInfo {
    pub task_id: String,
    pub status: TaskStatus,
    /// Units of work done (records, items or epochs, depending on the kind).
    pub progress: u64,
    /// Units of work in the whole task.
    pub total: u64,
    /// The message of the last committed step.
    pub message: String,
    /// The kind's result once `completed`.
    pub result_data: Option<Value>,
    /// Why the task failed, once `failed`.
    pub error: Option<String>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    /// When the task reached a terminal status.
    pub completed_at: Option<DateTime<Utc>>,
    pub kind: String,
    /// The validated parameters the task was started with.
    pub parameters: Value,
    /// The client id that started the task.
    pub owner: String,
    /// How many steps have been committed; a resumed task continues after this one.
    pub step: u64,
    /// `progress / total` in percent, rounded to one decimal.
    pub percent: f64,
    /// The server (`--node-id`) that holds, or last held, the task's lease: in a fleet, the
    /// node that advances it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// What the task asks, while it is `input_required`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub question: Option<Question>,
}

/// A question a task asks a person mid-run. The task waits as `input_required`, durably and
/// without a worker, until an answer to this question arrives.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Question {
    /// Names this question among the task's questions: an answer names it, so that one meant
    /// for an earlier question (a late or repeated answer) is refused instead of applied.
    pub id: String,
    /// What to ask, in a sentence or two.
    pub message: String,
    /// The JSON schema of an answer: an object of primitive fields (string, number, integer,
    /// boolean, string enums), as MCP elicitation's `requestedSchema` requires, so that any
    /// client can render it as a form.
    pub schema: Value,
}

impl TaskInfo {
    pub fn percent_of(progress: u64, total: u64) -> f64 {
        if total == 0 {
            return 100.0;
        }
        (progress as f64 * 1000.0 / total as f64).round() / 10.0
    }
}

/// The body of `task://list` and `task://list/{status}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TaskList {
    pub tasks: Vec<TaskInfo>,
    /// How many tasks this page holds (the reference servers' field).
    pub total: usize,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub status_filter: Option<TaskStatus>,
    /// The URI of the next page ([`list_page_uri`]), when more tasks follow this page's.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub next_page: Option<String>,
}

/// Counts of tasks per status, as returned by `get_server_stats`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ServerStats {
    pub total_tasks: u64,
    pub pending_tasks: u64,
    pub running_tasks: u64,
    pub paused_tasks: u64,
    pub completed_tasks: u64,
    pub failed_tasks: u64,
    pub cancelled_tasks: u64,
    /// Workers currently advancing a task in this process.
    pub active_background_tasks: u64,
}

impl ServerStats {
    pub fn from_counts(counts: &BTreeMap<TaskStatus, u64>, active_background_tasks: u64) -> Self {
        let count = |status| counts.get(&status).copied().unwrap_or(0);
        ServerStats {
            total_tasks: counts.values().sum(),
            pending_tasks: count(TaskStatus::Pending),
            running_tasks: count(TaskStatus::Running),
            paused_tasks: count(TaskStatus::Paused),
            completed_tasks: count(TaskStatus::Completed),
            failed_tasks: count(TaskStatus::Failed),
            cancelled_tasks: count(TaskStatus::Cancelled),
            active_background_tasks,
        }
    }
}

/// What the checkpoint store holds, as returned by `get_checkpoint_stats`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CheckpointStats {
    /// Tasks per status.
    pub checkpoint_stats: BTreeMap<TaskStatus, u64>,
    /// Tasks stored, whatever their status.
    pub total_checkpoints: u64,
    /// Steps committed across all stored tasks.
    pub total_steps_committed: u64,
    /// Size of the checkpoint state of all stored tasks, in bytes of JSON.
    pub checkpoint_bytes: u64,
    pub oldest_checkpoint_at: Option<DateTime<Utc>>,
    pub newest_checkpoint_at: Option<DateTime<Utc>>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percent_is_rounded_to_one_decimal_and_total_zero_is_done() {
        assert_eq!(TaskInfo::percent_of(1, 3), 33.3);
        assert_eq!(TaskInfo::percent_of(2, 3), 66.7);
        assert_eq!(TaskInfo::percent_of(50, 50), 100.0);
        assert_eq!(TaskInfo::percent_of(0, 0), 100.0);
    }

    #[test]
    fn list_uris_name_the_status() {
        assert_eq!(list_uri(None), "task://list");
        assert_eq!(list_uri(Some(TaskStatus::Paused)), "task://list/paused");
        assert_eq!(status_uri("abc"), "task://status/abc");
    }
}
