//! Storage: the only module that issues SQL.
//!
//! The rest of the server speaks to four repositories, one trait each: [`TaskRepo`] (tasks and
//! their checkpoints), [`StreamRepo`] (SSE streams, their events and the tool calls bound to
//! them), [`SessionRepo`] (MCP sessions and their subscriptions) and [`HandleRepo`] (MCP task
//! handles). [`Store`] is a cheap handle on one backend implementing all four:
//! - [`sqlite`], the embedded default for one machine: one writer thread with group commit.
//! - [`postgres`], for a fleet of nodes sharing one database.
//!
//! Every backend keeps the same promises, which the contract tests in `tests.rs` check on each:
//! a caller is answered only once its write is durable; a state change and what it reveals
//! commit together; the lifecycle's rules (a terminal status is never left, a paused task never
//! advanced, only the current lease commits a step) are enforced by the database, not by the
//! timing of callers.

mod model;
pub mod postgres;
pub mod sqlite;
#[cfg(test)]
mod tests;

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use durable_shared::{CheckpointStats, TaskInfo, TaskStatus};
use serde_json::Value;
use tokio::sync::broadcast;

pub use model::{
    CallBinding, FIRST_LEASE, NewEvent, NewTask, PRUNE_BATCH, Pruned, Refusal, StepCommit,
    StoredEvent, StreamInfo, TaskHandle, TaskRow, Transition, UNCLAIMED_LEASE, is_standalone,
};

pub(crate) fn now_ms() -> i64 {
    Utc::now().timestamp_millis()
}

/// A new stream's token: 32 hex digits, the first 12 the time in milliseconds and the rest
/// random. Streams and their events are keyed by token, so tokens made one after another sort
/// together and their rows share the last pages of those indexes: wholly random tokens put
/// every new stream on a page of its own, and a burst of requests had each commit write a page
/// per stream.
pub(crate) fn new_stream_token() -> String {
    let ms = now_ms().clamp(0, 0xffff_ffff_ffff);
    format!("{ms:012x}{}", hex::encode(rand::random::<[u8; 10]>()))
}

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("sqlite: {0}")]
    Sqlite(#[from] rusqlite::Error),
    #[error("postgres: {0}")]
    Postgres(#[from] tokio_postgres::Error),
    #[error("cannot get a PostgreSQL connection: {0}")]
    Pool(#[from] deadpool_postgres::PoolError),
    #[error("stored JSON is invalid: {0}")]
    Json(#[from] serde_json::Error),
    #[error(
        "database schema version {found} is newer than this binary supports ({supported}); \
         upgrade durable-mcp or use another database"
    )]
    TooNew { found: i64, supported: i64 },
    #[error("the store has shut down")]
    Closed,
    /// The writer gave up on the write: it panicked while running it (the panic is logged).
    /// Nothing of the write was kept.
    #[error("the store's writer failed while running this write; see the server log")]
    Aborted,
    /// The writer's queue stayed full for as long as a caller waits: backpressure.
    #[error("the store is busy: {queued} writes are queued; retry shortly")]
    Busy { queued: usize },
    #[error("stored value is corrupt: {0}")]
    Corrupt(String),
    /// The batch's transaction could not begin or commit. Every write of the batch gets this,
    /// so the cause is shared.
    #[error("the write transaction failed")]
    Commit(#[source] Arc<StoreError>),
    /// Another write of the batch failed after it had changed the database, which nothing but
    /// the whole transaction could undo (see `sqlite::Undo::Statement`): nothing of the batch
    /// was kept.
    #[error("another write of the same transaction failed midway; the transaction was undone")]
    Undone,
    #[error("cannot start the store's writer thread")]
    WriterThread(#[source] std::io::Error),
    #[error("invalid database URL {0}")]
    Url(String),
    /// The write was refused by its own conditions (a limit, a held resource).
    #[error("refused: {0}")]
    Refused(#[from] Refusal),
}

/// A node claiming work: its id and how long its leases last unless renewed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claimant {
    pub node: String,
    pub ttl: Duration,
}

impl Claimant {
    fn ttl_ms(&self) -> i64 {
        i64::try_from(self.ttl.as_millis()).unwrap_or(i64::MAX)
    }
}

impl StoreError {
    /// The error with its causes, `: `-separated: a failed group commit carries its SQLite
    /// cause as a source.
    pub fn with_causes(&self) -> String {
        std::iter::successors(Some(self as &dyn std::error::Error), |e| e.source())
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(": ")
    }

    /// Why the store cannot take the request now, in words for a client, when the cause is
    /// passing (the database unreachable, busy or out of disk space) and the same request may
    /// succeed once it is gone; `None` for a failure that retrying would not cure.
    pub fn passing_cause(&self) -> Option<&'static str> {
        const UNREACHABLE: &str = "the database is unreachable right now; the server reconnects \
                                   by itself: retry shortly";
        const BUSY: &str = "the database is busy (its write queue is full, or another process \
                            holds its lock); nothing was changed: retry shortly";
        const DISK_FULL: &str = "the database's disk is full; nothing was changed: retry once \
                                 the server's operator has freed space";
        match self {
            StoreError::Pool(_) => Some(UNREACHABLE),
            StoreError::Busy { .. } => Some(BUSY),
            StoreError::Sqlite(e) => match e.sqlite_error_code() {
                Some(rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked) => {
                    Some(BUSY)
                }
                Some(rusqlite::ErrorCode::DiskFull) => Some(DISK_FULL),
                _ => None,
            },
            StoreError::Postgres(e)
                if e.code() == Some(&tokio_postgres::error::SqlState::DISK_FULL) =>
            {
                Some(DISK_FULL)
            }
            StoreError::Postgres(e)
                if e.is_closed()
                    || std::error::Error::source(e)
                        .is_some_and(|cause| cause.is::<std::io::Error>()) =>
            {
                Some(UNREACHABLE)
            }
            StoreError::Commit(cause) => cause.passing_cause(),
            _ => None,
        }
    }

    /// Whether the request may succeed if retried later (see [`StoreError::passing_cause`]).
    pub fn is_unavailable(&self) -> bool {
        self.passing_cause().is_some()
    }
}

/// Which database the server keeps its state in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Database {
    /// An SQLite file on this machine (created if missing).
    Sqlite(PathBuf),
    /// A PostgreSQL database, by `postgres://` URL; several nodes may share it.
    Postgres(String),
}

impl fmt::Display for Database {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Database::Sqlite(path) => write!(f, "SQLite database {}", path.display()),
            Database::Postgres(url) => write!(f, "PostgreSQL database {}", postgres::redact(url)),
        }
    }
}

/// Tasks and their checkpoints.
#[async_trait]
pub trait TaskRepo: Send + Sync {
    /// Stores a new task as `pending`, unless its owner has `owner_limit` unfinished tasks or
    /// another unfinished task holds its `exclusive` resource ([`StoreError::Refused`]). Under
    /// concurrent inserts of one owner, PostgreSQL may let the owner limit be passed by the
    /// inserts racing each other; a held resource is never shared.
    async fn insert_task(&self, task: NewTask) -> Result<TaskInfo, StoreError>;

    /// Stores `task` unless a task with its id exists; returns the stored task and whether it
    /// was created by this call. Used for tasks whose id is derived from their arguments. A new
    /// task is refused as [`TaskRepo::insert_task`] says.
    async fn insert_or_get_task(&self, task: NewTask) -> Result<(TaskInfo, bool), StoreError>;

    /// Makes `claimant` the task's worker under a fresh lease (the attempt number goes up, so
    /// every earlier worker is fenced out) and returns the task with its checkpoint. Only a
    /// task nobody else holds is claimed: `pending`, or `running` under a lapsed lease or a
    /// lease of `claimant`'s own node (a worker of this node superseded after a quick pause and
    /// resume). `None` otherwise. The lease lapses `claimant.ttl` from now by the database's
    /// clock unless renewed.
    async fn claim_task(
        &self,
        id: &str,
        claimant: &Claimant,
    ) -> Result<Option<TaskRow>, StoreError>;

    /// [`TaskRepo::claim_task`] of a task this process stored `pending` (`known`, as its insert
    /// answered): while the row is still that (`pending` under the same lease), a backend may
    /// claim it without reading it back. A task waiting for a running slot is claimed once it
    /// gets one, and reading back what is known cost a third of the claim.
    async fn claim_known(
        &self,
        known: TaskRow,
        claimant: &Claimant,
    ) -> Result<Option<TaskRow>, StoreError> {
        self.claim_task(&known.info.task_id, claimant).await
    }

    /// Id and kind of up to `limit` tasks a worker of `claimant` could claim, oldest first:
    /// `pending` ones and `running` ones whose lease lapsed, and with `own`, also those running
    /// under a lease of `claimant`'s node (what a node restarted under its `--node-id` takes
    /// back at once).
    async fn claimable_tasks(
        &self,
        claimant: &Claimant,
        own: bool,
        limit: usize,
    ) -> Result<Vec<(String, String)>, StoreError>;

    /// Extends, to `claimant.ttl` from now, the leases in `held` (task id, attempt) that
    /// `claimant`'s node still holds; returns the ids of those it does. A task missing from
    /// the answer was paused, cancelled, finished or claimed by another node: its worker
    /// must stop.
    async fn renew_leases(
        &self,
        claimant: &Claimant,
        held: Vec<(String, i64)>,
    ) -> Result<Vec<String>, StoreError>;

    /// Gives `node`'s leases back, so that other nodes claim its running tasks at once (a node
    /// stopping gracefully). Returns how many.
    async fn release_leases(&self, node: &str) -> Result<u64, StoreError>;

    /// Called once at start, before claiming: releases the leases no live process can hold. On
    /// SQLite, every lease (one process owns the file, and it has just started); on
    /// PostgreSQL, none (another node's lease lapses by itself).
    async fn release_stale_leases(&self) -> Result<u64, StoreError>;

    /// Commits one step. Returns the updated task, or `None` if the worker lost its lease (the
    /// task was paused, cancelled or claimed by another worker): then nothing is written.
    async fn commit_step(&self, commit: StepCommit) -> Result<Option<TaskInfo>, StoreError>;

    /// The task with its checkpoint, as a claim returns it, without claiming it.
    async fn task_row(&self, id: &str) -> Result<Option<TaskRow>, StoreError>;

    /// Applies an answer to question `question_id` of task `id`, in one conditional update:
    /// if the task is `input_required` with that very question, stores `checkpoint` (the state
    /// the answer made), clears the question and makes the task `pending`. Refused otherwise
    /// (answered already, another question, or no longer waiting), so an answer is applied
    /// at most once however many arrive at once.
    async fn answer_question(
        &self,
        id: &str,
        question_id: &str,
        checkpoint: Value,
    ) -> Result<Transition, StoreError>;

    /// Marks the task `failed` if `lease` is still its worker's.
    async fn fail_task(
        &self,
        id: &str,
        lease: i64,
        error: String,
    ) -> Result<Option<TaskInfo>, StoreError>;

    /// Moves the task to `to` if its status is one of `from`.
    async fn transition(
        &self,
        id: &str,
        from: &'static [TaskStatus],
        to: TaskStatus,
    ) -> Result<Transition, StoreError>;

    async fn get_task(&self, id: &str) -> Result<Option<TaskInfo>, StoreError>;

    /// Tasks, newest first (ties by id), optionally only one owner's and only one status, and
    /// only those after the `(created_at ms, task id)` position `after` in that order: a list
    /// is read page by page.
    async fn list_tasks(
        &self,
        owner: Option<String>,
        status: Option<TaskStatus>,
        after: Option<(i64, String)>,
        limit: usize,
    ) -> Result<Vec<TaskInfo>, StoreError>;

    async fn status_counts(&self) -> Result<BTreeMap<TaskStatus, u64>, StoreError>;

    /// How many unfinished (pending, running, paused or input_required) tasks `owner` has.
    async fn unfinished_tasks_of(&self, owner: &str) -> Result<u64, StoreError>;

    async fn checkpoint_stats(&self) -> Result<CheckpointStats, StoreError>;

    /// Deletes terminal tasks that finished before `cutoff`, [`PRUNE_BATCH`] per transaction;
    /// returns how many.
    async fn purge_finished_before(&self, cutoff: DateTime<Utc>) -> Result<u64, StoreError>;

    /// A random secret created with the database, for deriving ids that must be stable for the
    /// same inputs yet unguessable to anyone without the database.
    async fn server_secret(&self) -> Result<[u8; 32], StoreError>;
}

/// Told whether a queued write became durable (see [`StreamRepo::queue_event`]).
/// It is given the event's stream token and seq once durable.
pub type Durable = Box<dyn FnOnce(Result<(String, u64), StoreError>) + Send>;

/// SSE streams, their events, and the tool calls that durable tasks report to.
///
/// Event ids are `{token}.{seq}`: `token` is 128 random bits naming one stream (and, through
/// the stream, its session), `seq` counts that stream's events from 1. A token is never
/// reused, so ids stay unique across restarts, clean-ups and even a wiped database, and nobody
/// can guess another stream's ids.
#[async_trait]
pub trait StreamRepo: Send + Sync {
    /// Appends an event to its stream (creating the stream on its first event) and returns the
    /// stream's token and the event's seq. The stream's call is the one
    /// [`StreamRepo::bind_stream_session`] recorded or, failing that, `event.binding`; a
    /// finishing event marks that call's binding answered in the same commit, so that a call
    /// is answered exactly when its response is stored.
    async fn append_event(&self, event: NewEvent) -> Result<(String, u64), StoreError>;

    /// Queues the append of an event of a request's stream (which only this process writes
    /// to) and returns the stream's token and the event's seq once it is queued, before it is
    /// durable; `durable` is told once it is, or that it failed. Nothing may show a client
    /// what the event says before [`StreamRepo::queued_durable`] returns. Not waiting here
    /// lets a session's events be committed together, not one fsync after another. A backend
    /// without a write queue appends before it returns (the default). A backend with one may
    /// leave the stream's first event unstored when it has no message (the priming event, which
    /// nothing replays): the stream's row is then made by the next write that names it, the
    /// record of its session ([`StreamRepo::queue_stream_session`]) or its next event, and
    /// `durable` is not called: there is nothing to wait for.
    async fn queue_event(
        &self,
        event: NewEvent,
        durable: Durable,
    ) -> Result<(String, u64), StoreError> {
        let appended = self.append_event(event).await?;
        durable(Ok(appended.clone()));
        Ok(appended)
    }

    /// [`StreamRepo::bind_stream_session`], queued: it is durable once
    /// [`StreamRepo::queued_durable`] returns. A stream another session holds stays that
    /// session's.
    async fn queue_stream_session(
        &self,
        token: &str,
        session_id: &str,
        call_id: &str,
        instance: &str,
    ) -> Result<(), StoreError> {
        self.bind_stream_session(token, session_id, call_id, instance)
            .await
            .map(drop)
    }

    /// Returns once every write queued before the call is durable or has failed.
    async fn queued_durable(&self) {}

    /// Records that `session_id` received the stream `token`, a POST's answer made by process
    /// `instance`, whose handler's call binding, if it makes one, has id `call_id`. Returns
    /// whether the stream is that session's: false if it belongs to another, or does not exist.
    async fn bind_stream_session(
        &self,
        token: &str,
        session_id: &str,
        call_id: &str,
        instance: &str,
    ) -> Result<bool, StoreError>;

    /// Whether stream `token` is a request's stream that waits for an answer nobody will
    /// send: unfinished, made by a process other than `instance` that is dead (on SQLite any
    /// other; on PostgreSQL one no longer announcing itself alive), and not the stream of an
    /// open call binding (whose relay answers it).
    async fn abandoned(&self, token: &str, instance: &str) -> Result<bool, StoreError>;

    async fn stream_info(&self, token: &str) -> Result<Option<StreamInfo>, StoreError>;

    async fn event_exists(&self, token: &str, seq: u64) -> Result<bool, StoreError>;

    /// At most `limit` events of stream `token` after `seq`, in order.
    async fn events_after(
        &self,
        token: &str,
        seq: u64,
        limit: usize,
    ) -> Result<Vec<StoredEvent>, StoreError>;

    /// Deletes, [`PRUNE_BATCH`] rows per transaction: the events stored before `cutoff_ms`, then
    /// the finished streams opened before it that have no event left, and the answered call
    /// bindings made before it. An unfinished stream stays however old: a quiet session's
    /// standalone stream and a long call's stream must still take their next event.
    async fn prune_before(&self, cutoff_ms: i64) -> Result<Pruned, StoreError>;

    /// Records a tool call that task `binding.task_id` reports to, made on this process
    /// (`instance`).
    async fn insert_binding(&self, binding: CallBinding, instance: &str) -> Result<(), StoreError>;

    /// Makes `instance` the handler of every open binding whose own handler died, and returns
    /// them: at most one process adopts each. On SQLite every other process is dead (one
    /// process owns the file); on PostgreSQL, one whose [`StreamRepo::keep_alive`] lapsed.
    async fn adopt_orphaned_bindings(&self, instance: &str)
    -> Result<Vec<CallBinding>, StoreError>;

    /// Announces that process `instance` (`{node}/{uuid}`) is alive for `ttl` more (see
    /// [`StreamRepo::adopt_orphaned_bindings`]), and that the earlier processes of its node
    /// are dead: a node id names one process at a time, so a node restarted under its id
    /// finishes its predecessor's calls at once instead of after their announcement lapses.
    async fn keep_alive(&self, instance: &str, ttl: Duration) -> Result<(), StoreError>;

    /// Marks the binding's call as answered.
    async fn finish_binding(&self, id: &str) -> Result<(), StoreError>;

    /// The newest message of stream `stream_id` containing `needle`.
    async fn last_event_containing(
        &self,
        stream_id: &str,
        needle: &str,
    ) -> Result<Option<String>, StoreError>;
}

/// MCP sessions (their initialize parameters survive restarts) and their resource
/// subscriptions.
#[async_trait]
pub trait SessionRepo: Send + Sync {
    /// Stores (or replaces) a session's state and negotiated protocol version.
    async fn save_session(
        &self,
        id: &str,
        state: String,
        protocol_version: String,
    ) -> Result<(), StoreError>;

    async fn load_session(&self, id: &str) -> Result<Option<String>, StoreError>;

    /// Deletes a session with its streams, events and call bindings; returns whether it existed.
    async fn delete_session(&self, id: &str) -> Result<bool, StoreError>;

    /// Marks the sessions as seen now.
    async fn touch_sessions(&self, ids: Vec<String>) -> Result<(), StoreError>;

    /// Sessions last seen before `cutoff_ms`.
    async fn idle_sessions(&self, cutoff_ms: i64) -> Result<Vec<String>, StoreError>;

    async fn set_subscription(
        &self,
        session_id: &str,
        uri: &str,
        subscribed: bool,
    ) -> Result<(), StoreError>;

    async fn subscriptions(&self, session_id: &str) -> Result<Vec<String>, StoreError>;

    /// Records that `session_id` belongs to the authenticated `subject` (once: a session never
    /// changes hands). Deleted with the session.
    async fn claim_session(&self, session_id: &str, subject: &str) -> Result<(), StoreError>;

    /// The subject a session belongs to; `None` for a session opened without authorization.
    async fn session_subject(&self, session_id: &str) -> Result<Option<String>, StoreError>;

    /// How many live sessions `subject` has.
    async fn sessions_of(&self, subject: &str) -> Result<u64, StoreError>;
}

/// MCP task handles: which engine tasks task-augmented `tools/call`s created, whose handle each
/// is (the client that made the call), the tool, and its time to live.
///
/// A handle lives `ttl_ms` from its task's creation. Reads treat an expired handle as gone at
/// once; [`HandleRepo::purge_expired_handles`] deletes the rows later. The task itself is the
/// engine's and follows the engine's retention.
#[async_trait]
pub trait HandleRepo: Send + Sync {
    /// Creates `requester`'s handle on the task, or extends an existing one to live at least
    /// `ttl_ms` from now (never shortening it). `None` if the handle is already expired.
    async fn upsert_handle(
        &self,
        task_id: &str,
        requester: &str,
        tool: &str,
        ttl_ms: u64,
    ) -> Result<Option<TaskHandle>, StoreError>;

    async fn handle(
        &self,
        task_id: &str,
        requester: &str,
    ) -> Result<Option<TaskHandle>, StoreError>;

    /// `requester`'s live handles in creation order, after the `(created_at ms, task id)`
    /// cursor.
    async fn list_handles(
        &self,
        requester: &str,
        after: Option<(i64, String)>,
        limit: usize,
    ) -> Result<Vec<TaskHandle>, StoreError>;

    /// The live handles on tasks not yet finished (what the router follows at start).
    async fn unfinished_handles(&self) -> Result<Vec<TaskHandle>, StoreError>;

    /// Deletes expired handles; returns how many.
    async fn purge_expired_handles(&self) -> Result<u64, StoreError>;
}

/// A change committed by another node of a fleet sharing the database.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// A task changed: read it for its state.
    Task { id: String },
    /// An event was appended to the stream `token`.
    Stream { token: String },
    /// `requester`'s MCP task handle on `task_id` was created or extended.
    Handle { task_id: String, requester: String },
    /// Changes may have been missed (the listening connection was down): re-read what you
    /// follow.
    Resync,
}

/// How a process hears of changes that other processes commit.
pub trait ChangeFeed: Send + Sync {
    /// Changes of other nodes from now on; `None` for a backend that only this process writes
    /// (SQLite), where every change is known in process.
    fn changes(&self) -> Option<broadcast::Receiver<Change>>;
}

/// Whether the store can serve: what readiness and health probes ask.
#[async_trait]
pub trait Health: Send + Sync {
    /// Goes the whole way a write and a read go (on SQLite: through the writer thread and a
    /// reader connection; on PostgreSQL: to the database) and back.
    async fn round_trip(&self) -> Result<(), StoreError>;
}

/// A backend: all four repositories on one database, its changes and its health.
pub trait Backend:
    TaskRepo + StreamRepo + SessionRepo + HandleRepo + ChangeFeed + Health + fmt::Debug
{
}

impl<T> Backend for T where
    T: TaskRepo + StreamRepo + SessionRepo + HandleRepo + ChangeFeed + Health + fmt::Debug
{
}

/// A cheap-to-clone handle on the backend the server was started with. Call the repositories'
/// methods on it (with their traits in scope).
#[derive(Clone, Debug)]
pub struct Store(Arc<dyn Backend>);

impl std::ops::Deref for Store {
    type Target = dyn Backend;

    fn deref(&self) -> &Self::Target {
        &*self.0
    }
}

impl Store {
    /// Opens (creating and migrating if needed) the embedded SQLite database at `path`.
    pub fn open(path: &Path) -> Result<Store, StoreError> {
        Ok(Store(Arc::new(sqlite::Sqlite::open(
            path,
            sqlite::WriteQueue::default(),
        )?)))
    }

    /// Connects to `database` as `node` (the id that names this process to other nodes),
    /// migrating its schema to this binary's version.
    pub async fn connect(database: &Database, node: &str) -> Result<Store, StoreError> {
        match database {
            Database::Sqlite(path) => {
                let path = path.clone();
                tokio::task::spawn_blocking(move || Store::open(&path))
                    .await
                    .map_err(|_| StoreError::Closed)?
            }
            Database::Postgres(url) => Ok(Store(Arc::new(
                postgres::Postgres::connect(url, node).await?,
            ))),
        }
    }
}
