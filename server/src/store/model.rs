//! What the repositories store and return, the same for every backend.

use chrono::{DateTime, Utc};
use durable_shared::{Question, TaskInfo, TaskStatus};
use serde_json::Value;

use super::Claimant;

/// A task about to be stored, with its first checkpoint.
#[derive(Debug, Clone)]
pub struct NewTask {
    pub id: String,
    pub kind: String,
    pub owner: String,
    pub params: Value,
    pub total: u64,
    pub checkpoint: Value,
    /// What only one unfinished task may hold at a time (a destination file), if anything.
    pub exclusive: Option<String>,
    /// The task is refused when its owner already has this many unfinished tasks.
    pub owner_limit: u64,
    /// Stored `running`, claimed by this node under its first lease (attempt 1), as
    /// [`TaskRepo::claim_task`](super::TaskRepo::claim_task) would leave it: what a node that
    /// has a running slot free at once does, sparing the claim's own transaction. `None`:
    /// stored `pending`, for whichever node claims it.
    pub claim: Option<Claimant>,
}

/// The lease of a task stored already claimed ([`NewTask::claim`]): its first attempt.
pub const FIRST_LEASE: i64 = 1;
/// The lease of a task stored `pending`: no attempt yet.
pub const UNCLAIMED_LEASE: i64 = 0;

/// How a new task is stored as to its lease: both backends' inserts write these columns.
pub(super) struct InitialLease<'a> {
    pub status: TaskStatus,
    pub node: Option<&'a str>,
    pub lease: i64,
    /// How long from the insert the lease lasts; `None` (no expiry) for an unclaimed task.
    pub ttl_ms: Option<i64>,
}

impl NewTask {
    /// The lease the task is stored under: [`FIRST_LEASE`] or [`UNCLAIMED_LEASE`].
    pub fn lease(&self) -> i64 {
        self.initial_lease().lease
    }

    /// `running` under [`FIRST_LEASE`] of the claimant, as `claim_task` would leave it, or
    /// `pending` with no lease.
    pub(super) fn initial_lease(&self) -> InitialLease<'_> {
        match &self.claim {
            Some(claimant) => InitialLease {
                status: TaskStatus::Running,
                node: Some(&claimant.node),
                lease: FIRST_LEASE,
                ttl_ms: Some(claimant.ttl_ms()),
            },
            None => InitialLease {
                status: TaskStatus::Pending,
                node: None,
                lease: UNCLAIMED_LEASE,
                ttl_ms: None,
            },
        }
    }
}

/// Why a task was not stored: the insert's conditions, not a storage failure.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Refusal {
    #[error("its owner already has {limit} unfinished tasks")]
    OwnerLimit { limit: u64 },
    #[error("{key} is held by unfinished task {task_id}")]
    Held { key: String, task_id: String },
    /// An event for a stream that takes no more: its final response is stored, or (for an
    /// event that may not open its stream) it was deleted with its session.
    #[error("stream {stream_id} has ended or was deleted with its session")]
    StreamEnded { stream_id: String },
}

/// A task with what only the engine needs: its checkpoint and the lease of its worker.
#[derive(Debug, Clone)]
pub struct TaskRow {
    pub info: TaskInfo,
    pub checkpoint: Value,
    pub lease: i64,
}

/// One committed step: the new checkpoint with the progress and message it explains. With
/// `result`, the step is the last and the task becomes `completed` in the same transaction.
#[derive(Debug, Clone)]
pub struct StepCommit {
    /// The task as its worker knows it: as claimed, or as its previous step's commit answered.
    /// While the worker's lease holds, nothing else changes the row, so a store may answer the
    /// commit with this, the step applied ([`StepCommit::applied`]), instead of reading it back.
    pub task: TaskInfo,
    pub lease: i64,
    pub step: u64,
    /// The new checkpoint as JSON text: the worker serialises its state straight to what is
    /// stored.
    pub checkpoint: String,
    pub progress: u64,
    pub message: String,
    /// The kind's result: the step completes the task.
    pub result: Option<Value>,
    /// The step ends asking this (and never with a result): the task waits as
    /// `input_required`, without a worker, until the question is answered.
    pub question: Option<Question>,
}

impl StepCommit {
    pub fn id(&self) -> &str {
        &self.task.task_id
    }

    /// The task as this commit leaves it, written at `now`: with the step's progress and
    /// message, and `completed` with the result or `input_required` with the question.
    pub fn applied(self, now: DateTime<Utc>) -> TaskInfo {
        let mut task = self.task;
        (task.step, task.progress, task.message) = (self.step, self.progress, self.message);
        task.percent = TaskInfo::percent_of(task.progress, task.total);
        task.updated_at = now;
        if let Some(result) = self.result {
            (task.status, task.completed_at) = (TaskStatus::Completed, Some(now));
            task.result_data = Some(result);
        } else if let Some(question) = self.question {
            (task.status, task.question) = (TaskStatus::InputRequired, Some(question));
        }
        task
    }
}

/// What a requested status change did.
#[derive(Debug, Clone)]
pub enum Transition {
    Applied(TaskInfo),
    /// The task exists but its status does not allow the change; here is how it stands.
    Refused(TaskInfo),
    NotFound,
}

/// One stored SSE event.
#[derive(Debug, Clone, PartialEq)]
pub struct StoredEvent {
    pub seq: u64,
    /// The JSON-RPC message, or `None` for a priming event.
    pub message: Option<String>,
    pub retry_ms: Option<u64>,
}

/// What an event id's stream looks like.
#[derive(Debug, Clone, PartialEq)]
pub struct StreamInfo {
    /// `None` until the session that received the stream is known.
    pub session_id: Option<String>,
    /// The seq the next event will get.
    pub next_seq: u64,
    /// The stream's final response has been stored: nothing follows it.
    pub finished: bool,
    /// It is a session's standalone (GET) stream, where rmcp sends server-to-client requests.
    pub standalone: bool,
}

/// Whether rmcp's stream id names a session's standalone stream (`{session_id}:common`).
pub fn is_standalone(stream_id: &str) -> bool {
    stream_id.ends_with(":common")
}

/// An event about to be appended.
#[derive(Debug, Clone)]
pub struct NewEvent {
    /// rmcp's id of the stream.
    pub stream_id: String,
    /// The stream's session, when known at the time (the standalone GET stream).
    pub session_id: Option<String>,
    pub message: Option<String>,
    pub retry_ms: Option<u64>,
    /// The event is the stream's final response.
    pub finishes: bool,
    /// The event reveals the stream of this tool-call binding.
    pub binding: Option<String>,
    /// The event may open its stream (rmcp's first event of a response or of the standalone
    /// stream). The relay's events only continue a stream that exists: one that was deleted
    /// with its session stays deleted.
    pub opens: bool,
}

/// A tool call that a durable task reports to.
#[derive(Debug, Clone, PartialEq)]
pub struct CallBinding {
    pub id: String,
    pub task_id: String,
    pub session_id: String,
    /// The JSON-RPC request id, as JSON.
    pub request_id: String,
    /// The request's progress token, as JSON.
    pub progress_token: String,
    /// rmcp's id of the call's stream, once its first progress notification was stored.
    pub stream_id: Option<String>,
}

/// An engine task seen through its MCP task handle.
#[derive(Debug, Clone)]
pub struct TaskHandle {
    pub task: TaskInfo,
    /// The client whose call created the handle; only it can see the task as an MCP task.
    pub requester: String,
    /// The tool whose call created the handle.
    pub tool: String,
    pub ttl_ms: u64,
}

/// What pruning deleted, and in how many transactions.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Pruned {
    pub events: u64,
    pub streams: u64,
    pub bindings: u64,
    /// Transactions the deletes took: each deletes at most [`PRUNE_BATCH`] rows, so that the
    /// writes of running tasks go between them instead of waiting for one long delete.
    pub batches: u64,
}

/// Most rows one pruning or purging transaction deletes.
pub const PRUNE_BATCH: usize = 500;
