//! The durable task engine: starts, advances, pauses, resumes and cancels tasks, and resumes
//! unfinished ones after a restart.
//!
//! The engine knows nothing of MCP or HTTP. It publishes a [`TaskEvent`] for every change it
//! commits; the MCP layer turns those into notifications. Every event is published only after
//! the change it describes is durable.

pub mod count;
mod finished;
mod kind;
mod runner;
mod slots;

use std::collections::HashMap;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use durable_shared::kinds::ParamError;
use durable_shared::{CheckpointStats, ServerStats, Steer, TaskInfo, TaskStatus};
use serde_json::Value;
use sha2::{Digest, Sha256};
use tokio::sync::{OwnedSemaphorePermit, broadcast};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

pub use kind::{Answer, Env, KindInfo, Plan, Step, StepError, TaskKind, blocking, path_error};
use kind::{Erased, ErasedKind};
use runner::{RunContext, Stored};

pub use crate::store::{Change, Claimant, StoreError, TaskHandle};
use crate::store::{NewTask, Refusal, Store, TaskRow, Transition};

/// How many events a slow subscriber may fall behind before it must resynchronise from the store.
const EVENT_BUFFER: usize = 1024;
/// How often a node of a fleet looks for work nobody holds (pending tasks another node has no
/// room for, tasks of a node whose lease lapsed), besides when it is told of some.
const POLL_INTERVAL: Duration = Duration::from_secs(1);

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error("{0}")]
    InvalidParams(#[from] ParamError),
    #[error("unknown task kind {0:?}")]
    UnknownKind(String),
    #[error("task {0} not found")]
    NotFound(String),
    #[error("cannot {action} task {task_id}: it is {status}")]
    InvalidState {
        action: &'static str,
        task_id: String,
        status: TaskStatus,
    },
    /// An answer to a question that is not open: answered already, superseded by a later
    /// question, or never asked.
    #[error("{0}")]
    QuestionNotOpen(String),
    /// The owner has as many unfinished tasks as it may.
    #[error(
        "you have {limit} unfinished tasks, the most one owner may have \
         (--max-tasks-per-owner); wait for some to finish or cancel some"
    )]
    TooManyTasks { limit: u64 },
    #[error(transparent)]
    Store(StoreError),
}

impl From<StoreError> for EngineError {
    fn from(error: StoreError) -> Self {
        match error {
            StoreError::Refused(Refusal::OwnerLimit { limit }) => {
                EngineError::TooManyTasks { limit }
            }
            other => EngineError::Store(other),
        }
    }
}

/// How loud a [`Milestone`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MilestoneLevel {
    Info,
    Error,
}

/// A lifecycle moment worth telling a person about (started, resumed, completed, failed...).
#[derive(Debug, Clone, PartialEq)]
pub struct Milestone {
    pub level: MilestoneLevel,
    pub text: String,
}

impl Milestone {
    pub fn info(text: String) -> Self {
        Milestone {
            level: MilestoneLevel::Info,
            text,
        }
    }

    pub fn error(text: String) -> Self {
        Milestone {
            level: MilestoneLevel::Error,
            text,
        }
    }
}

/// A committed change to a task: its state right after the change.
#[derive(Debug, Clone)]
pub struct TaskEvent {
    pub task: TaskInfo,
    pub milestone: Option<Milestone>,
}

impl TaskEvent {
    fn changed(task: TaskInfo) -> Self {
        TaskEvent {
            task,
            milestone: None,
        }
    }

    fn with(task: TaskInfo, milestone: Milestone) -> Self {
        TaskEvent {
            task,
            milestone: Some(milestone),
        }
    }
}

/// A validated task ready to store, with its kind and the parameter naming what it holds
/// exclusively (if anything).
struct Prepared {
    kind: Arc<dyn ErasedKind>,
    task: NewTask,
    exclusive_field: Option<&'static str>,
}

/// Engine settings.
#[derive(Debug, Clone)]
pub struct EngineConfig {
    pub env: Env,
    /// Tasks advanced at once; the others wait as `pending`. A task whose step waits (see
    /// [`Env::pace`]) does not count while it waits.
    pub max_running: usize,
    /// This node's id and lease length: a task it advances is leased to it, renewed every
    /// third of the lease while it runs.
    pub claimant: Claimant,
    /// Unfinished (pending, running, paused) tasks one owner may have; more are refused.
    pub max_tasks_per_owner: u64,
}

/// Collects the task kinds before the engine starts.
pub struct EngineBuilder {
    kinds: HashMap<&'static str, Arc<dyn ErasedKind>>,
}

impl EngineBuilder {
    pub fn register<K: TaskKind>(mut self, kind: K) -> Self {
        self.kinds.insert(K::NAME, Arc::new(Erased(kind)));
        self
    }

    /// Starts the engine: it runs the tasks started through it, but takes up the work a
    /// previous process or another node left only when [`LeftWork::resume`] is called, so that
    /// whoever follows such work (the relay of interrupted calls) can watch it first.
    pub async fn start(
        self,
        store: Store,
        config: EngineConfig,
        shutdown: CancellationToken,
    ) -> Result<(Engine, LeftWork), EngineError> {
        let secret = store.server_secret().await?;
        let (events, _) = broadcast::channel(EVENT_BUFFER);
        let mut kind_infos: Vec<KindInfo> = self.kinds.values().map(|kind| kind.info()).collect();
        kind_infos.sort_by_key(|kind| kind.name);
        let engine = Engine {
            inner: Arc::new(Inner {
                store,
                kinds: self.kinds,
                kind_infos,
                env: config.env,
                events,
                watchers: Mutex::default(),
                finished: finished::Finished::new(),
                workers: Mutex::new(HashMap::new()),
                next_generation: AtomicU64::new(0),
                queue: slots::Queue::new(config.max_running),
                tracker: TaskTracker::new(),
                shutdown,
                secret,
                claimant: config.claimant,
                max_tasks_per_owner: config.max_tasks_per_owner,
            }),
        };
        let admitter = engine.inner.clone();
        engine.inner.tracker.spawn(async move {
            let shutdown = admitter.shutdown.clone();
            admitter
                .queue
                .run_admitter(shutdown, |queued, slot| admitter.start_worker(queued, slot))
                .await;
        });
        // Heard from now on, though followed only once the left work is resumed: a change
        // another node commits meanwhile still reaches this node's watchers.
        let changes = engine.inner.store.changes();
        let left = LeftWork {
            inner: engine.inner.clone(),
            changes,
        };
        Ok((engine, left))
    }
}

/// The work a previous process or other nodes left unfinished, which a started engine takes up
/// only when told to (see [`EngineBuilder::start`]).
#[must_use = "the engine takes up no work left unfinished until `resume`"]
pub struct LeftWork {
    inner: Arc<Inner>,
    /// What other nodes sharing the database committed since the engine started (`None` on a
    /// database only this process writes).
    changes: Option<broadcast::Receiver<Change>>,
}

impl LeftWork {
    /// Resumes every task that was `pending` or `running` when the process last stopped and,
    /// on a database other processes write to, starts renewing leases, looking for work they
    /// leave behind and hearing of their changes.
    pub async fn resume(self) -> Result<(), EngineError> {
        let inner = &self.inner;
        inner.store.release_stale_leases().await?;
        // Everything nobody holds, and what this node held before a restart under its id.
        let claimable = inner
            .store
            .claimable_tasks(&inner.claimant, true, usize::MAX >> 1)
            .await?;
        if !claimable.is_empty() {
            tracing::info!(count = claimable.len(), "resuming unfinished tasks");
        }
        for (id, kind) in claimable {
            inner.spawn_worker(id, &kind);
        }
        if let Some(changes) = self.changes {
            inner.tracker.spawn(inner.clone().renew_leases());
            inner.tracker.spawn(inner.clone().follow_fleet(changes));
        }
        Ok(())
    }
}

/// A cheap-to-clone handle on the engine.
#[derive(Clone)]
pub struct Engine {
    inner: Arc<Inner>,
}

pub(crate) struct Inner {
    store: Store,
    kinds: HashMap<&'static str, Arc<dyn ErasedKind>>,
    /// What [`Engine::kinds`] answers, made once (schemas are not cheap to generate).
    kind_infos: Vec<KindInfo>,
    env: Env,
    /// Shared, not cloned, by each receiver: a task's JSON parameters ride in every event.
    events: broadcast::Sender<Arc<TaskEvent>>,
    /// The committed changes of each task someone waits on (see [`Engine::watch`]).
    watchers: Mutex<Watchers>,
    /// Finished tasks, answered without the store (see `finished`).
    finished: finished::Finished,
    /// The live worker of each task being advanced in this process. A std mutex: it is held for
    /// a map operation only, never across an await.
    workers: Mutex<HashMap<String, Worker>>,
    next_generation: AtomicU64,
    /// Workers waiting for a running slot, and the slots.
    queue: slots::Queue<Queued>,
    tracker: TaskTracker,
    shutdown: CancellationToken,
    secret: [u8; 32],
    claimant: Claimant,
    max_tasks_per_owner: u64,
}

struct Worker {
    stop: CancellationToken,
    generation: u64,
    /// The attempt this worker claimed the task under, once it has.
    lease: Option<i64>,
}

/// A worker that waits for a running slot: no tokio task yet, just what starts one.
pub(crate) struct Queued {
    kind: Arc<dyn ErasedKind>,
    ctx: RunContext,
}

#[derive(Default)]
struct Watchers {
    by_task: HashMap<String, broadcast::Sender<TaskInfo>>,
    /// Size at which watchers nobody holds any more are swept; grows with the live ones, so
    /// sweeping costs amortised O(1) per watch.
    sweep_at: usize,
}

/// How many changes of one task a watcher may fall behind before it skips to the oldest still
/// kept. A relayed call sends each change as a progress notification, so this is how many steps
/// may commit while it writes one notification before its client misses one.
const WATCH_BUFFER: usize = 16;

/// The committed changes of one task, from [`Engine::watch`].
pub struct TaskWatch(broadcast::Receiver<TaskInfo>);

impl TaskWatch {
    /// Waits for the task's next committed change and returns its state then: each change in
    /// order, unless the watcher fell more than [`WATCH_BUFFER`] behind (it then goes on from the
    /// oldest change kept). `None` once the task has ended (its final state was returned
    /// before) or the engine is gone: read it from the engine.
    pub async fn changed(&mut self) -> Option<TaskInfo> {
        loop {
            match self.0.recv().await {
                Ok(task) => return Some(task),
                Err(broadcast::error::RecvError::Lagged(_)) => continue,
                Err(broadcast::error::RecvError::Closed) => return None,
            }
        }
    }
}

impl Inner {
    fn publish(&self, event: TaskEvent) {
        let event = Arc::new(event);
        self.finished.keep(&event);
        {
            let mut watchers = self.watchers.lock().expect("watchers lock");
            let task = &event.task;
            if let Some(watcher) = watchers.by_task.get(&task.task_id) {
                // An error means nobody holds a watch any more.
                let unwatched = watcher.send(task.clone()).is_err();
                // Nothing follows a terminal state; a watcher nobody holds is not needed.
                if task.status.is_terminal() || unwatched {
                    watchers.by_task.remove(&task.task_id);
                }
            }
        }
        // No receiver is fine: nobody is watching.
        let _ = self.events.send(event);
    }

    fn start_worker(&self, queued: Queued, slot: OwnedSemaphorePermit) {
        // Paused, cancelled or superseded while it waited: dropping it frees its table entry.
        if !queued.ctx.stop.is_cancelled() {
            self.tracker.spawn(queued.kind.run(queued.ctx, slot));
        }
    }

    fn spawn_worker(self: &Arc<Self>, task_id: String, kind: &str) {
        self.spawn_worker_with(task_id, kind, None, None);
    }

    /// Starts a worker for a task stored claimed by this node (see [`NewTask::claim`]), in the
    /// running slot taken for it, with the row the insert returned: the worker begins with it
    /// instead of claiming.
    fn spawn_claimed(self: &Arc<Self>, row: TaskRow, slot: OwnedSemaphorePermit) {
        let (task_id, kind) = (row.info.task_id.clone(), row.info.kind.clone());
        self.spawn_worker_with(task_id, &kind, Some(Stored::Claimed(row)), Some(slot));
    }

    /// Queues a worker for a task this process just stored `pending`, with the row the insert
    /// returned, which its claim need not read back.
    fn spawn_pending(self: &Arc<Self>, row: TaskRow) {
        let (task_id, kind) = (row.info.task_id.clone(), row.info.kind.clone());
        self.spawn_worker_with(task_id, &kind, Some(Stored::Pending(row)), None);
    }

    fn spawn_worker_with(
        self: &Arc<Self>,
        task_id: String,
        kind: &str,
        stored: Option<Stored>,
        slot: Option<OwnedSemaphorePermit>,
    ) {
        let Some(kind) = self.kinds.get(kind).cloned() else {
            tracing::error!(%task_id, kind, "no such task kind in this binary; task left as is");
            return;
        };
        let mut workers = self.workers.lock().expect("worker table lock");
        if workers
            .get(&task_id)
            .is_some_and(|worker| !worker.stop.is_cancelled())
        {
            return;
        }
        let stop = self.shutdown.child_token();
        let generation = self.next_generation.fetch_add(1, Ordering::Relaxed);
        workers.insert(
            task_id.clone(),
            Worker {
                stop: stop.clone(),
                generation,
                lease: None,
            },
        );
        drop(workers);
        let ctx = RunContext {
            engine: self.clone(),
            task_id,
            stop,
            generation,
            stored,
        };
        let queued = Queued { kind, ctx };
        match slot {
            Some(slot) => self.start_worker(queued, slot),
            None => {
                if let Some((queued, slot)) = self.queue.admit_or_queue(queued) {
                    self.start_worker(queued, slot);
                }
            }
        }
    }

    fn stop_worker(&self, task_id: &str) {
        if let Some(worker) = self.workers.lock().expect("worker table lock").get(task_id) {
            worker.stop.cancel();
        }
    }

    /// Records the lease a worker claimed its task under, for the heartbeat to renew.
    fn claimed(&self, task_id: &str, generation: u64, lease: i64) {
        let mut workers = self.workers.lock().expect("worker table lock");
        if let Some(worker) = workers.get_mut(task_id)
            && worker.generation == generation
        {
            worker.lease = Some(lease);
        }
    }

    /// Renews the leases of this node's workers every third of the lease, until shutdown. A
    /// worker whose lease is gone (another node claimed the task, or it was paused, cancelled
    /// or finished elsewhere) is stopped; so is every worker when renewing has failed for a
    /// whole lease (the database is unreachable): their leases have lapsed, and another node
    /// may be running their tasks.
    async fn renew_leases(self: Arc<Self>) {
        let every = self.claimant.ttl / 3;
        let mut last_renewed = tokio::time::Instant::now();
        loop {
            tokio::select! {
                _ = self.shutdown.cancelled() => return,
                _ = tokio::time::sleep(every) => {}
            }
            let held: Vec<(String, i64, u64)> = self
                .workers
                .lock()
                .expect("worker table lock")
                .iter()
                .filter_map(|(id, w)| Some((id.clone(), w.lease?, w.generation)))
                .collect();
            if held.is_empty() {
                last_renewed = tokio::time::Instant::now();
                continue;
            }
            let leases = held
                .iter()
                .map(|(id, lease, _)| (id.clone(), *lease))
                .collect();
            let lost: Vec<(String, u64)> = match self
                .store
                .renew_leases(&self.claimant, leases)
                .await
            {
                Ok(renewed) => {
                    last_renewed = tokio::time::Instant::now();
                    let renewed: std::collections::HashSet<String> = renewed.into_iter().collect();
                    held.into_iter()
                        .filter(|(id, _, _)| !renewed.contains(id))
                        .map(|(id, _, generation)| (id, generation))
                        .collect()
                }
                Err(e) if last_renewed.elapsed() >= self.claimant.ttl => {
                    tracing::error!(error = %e, "leases lapsed while the database was unreachable; stopping this node's workers");
                    held.into_iter()
                        .map(|(id, _, generation)| (id, generation))
                        .collect()
                }
                Err(e) => {
                    tracing::warn!(error = %e, "cannot renew leases; retrying");
                    continue;
                }
            };
            for (task_id, generation) in lost {
                tracing::info!(%task_id, "lease lost; worker stops");
                self.stop_generation(&task_id, generation);
            }
        }
    }

    /// Follows the fleet: publishes the changes other nodes commit (so that this node's
    /// subscribers and waiting calls hear of them), stops a worker whose task another node
    /// paused, cancelled or took over, and looks for work nobody holds every
    /// [`POLL_INTERVAL`] and whenever changes may have been missed.
    async fn follow_fleet(self: Arc<Self>, mut changes: tokio::sync::broadcast::Receiver<Change>) {
        let mut poll = tokio::time::interval(POLL_INTERVAL);
        poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let change = tokio::select! {
                _ = self.shutdown.cancelled() => return,
                _ = poll.tick() => None,
                change = changes.recv() => Some(change),
            };
            match change {
                None => self.claim_unheld().await,
                Some(Ok(Change::Task { id })) => self.heard_of(&id).await,
                Some(Ok(Change::Stream { .. } | Change::Handle { .. })) => {}
                Some(Ok(Change::Resync)) | Some(Err(_)) => {
                    tracing::info!("may have missed changes of other nodes; looking for work");
                    self.claim_unheld().await;
                }
            }
        }
    }

    /// Another node changed task `id`.
    async fn heard_of(&self, id: &str) {
        let info = match self.store.get_task(id).await {
            Ok(Some(info)) => info,
            Ok(None) => return,
            Err(e) => {
                tracing::warn!(task_id = id, error = %e, "cannot read a task another node changed");
                return;
            }
        };
        let ours = info.status == TaskStatus::Running
            && info.node.as_deref() == Some(self.claimant.node.as_str());
        if !ours {
            self.stop_worker(id);
        }
        self.publish(TaskEvent::changed(info));
    }

    /// Starts workers for tasks nobody holds, as many as this node has room for.
    async fn claim_unheld(self: &Arc<Self>) {
        let room = match self.queue.len() {
            0 => self.queue.slots().available_permits(),
            _ => 0,
        };
        if room == 0 {
            return;
        }
        match self
            .store
            .claimable_tasks(&self.claimant, false, room)
            .await
        {
            Ok(claimable) => {
                for (id, kind) in claimable {
                    self.spawn_worker(id, &kind);
                }
            }
            Err(e) => tracing::warn!(error = %e, "cannot look for unclaimed tasks"),
        }
    }

    fn stop_generation(&self, task_id: &str, generation: u64) {
        if let Some(worker) = self.workers.lock().expect("worker table lock").get(task_id)
            && worker.generation == generation
        {
            worker.stop.cancel();
        }
    }

    fn worker_finished(&self, task_id: &str, generation: u64) {
        let mut workers = self.workers.lock().expect("worker table lock");
        if workers
            .get(task_id)
            .is_some_and(|worker| worker.generation == generation)
        {
            workers.remove(task_id);
        }
    }
}

impl Engine {
    pub fn builder() -> EngineBuilder {
        EngineBuilder {
            kinds: HashMap::new(),
        }
    }

    /// Makes `task_id` an MCP task handle of `requester`'s (see [`TaskHandle`]), kept `ttl_ms`
    /// from the task's creation, or at least that long from now if it exists already.
    pub async fn attach_handle(
        &self,
        task_id: &str,
        requester: &str,
        tool: &str,
        ttl_ms: u64,
    ) -> Result<Option<TaskHandle>, EngineError> {
        Ok(self
            .inner
            .store
            .upsert_handle(task_id, requester, tool, ttl_ms)
            .await?)
    }

    /// `requester`'s live handle on `task_id`; another requester's is `None`.
    pub async fn handle(
        &self,
        task_id: &str,
        requester: &str,
    ) -> Result<Option<TaskHandle>, EngineError> {
        Ok(self.inner.store.handle(task_id, requester).await?)
    }

    /// A page of `requester`'s live handles in creation order, after `(created_at ms, id)`.
    pub async fn handles(
        &self,
        requester: &str,
        after: Option<(i64, String)>,
        limit: usize,
    ) -> Result<Vec<TaskHandle>, EngineError> {
        Ok(self
            .inner
            .store
            .list_handles(requester, after, limit)
            .await?)
    }

    /// Every live handle on a task that has not ended.
    pub async fn unfinished_handles(&self) -> Result<Vec<TaskHandle>, EngineError> {
        Ok(self.inner.store.unfinished_handles().await?)
    }

    /// The registered kinds, by name.
    pub fn kinds(&self) -> &[KindInfo] {
        &self.inner.kind_infos
    }

    /// What other nodes sharing the database commit from now on (`None` on a database only
    /// this process writes): for the listener that routes MCP task handles' notifications.
    pub fn fleet_changes(&self) -> Option<tokio::sync::broadcast::Receiver<Change>> {
        self.inner.store.changes()
    }

    /// Every committed change from now on, of every task: for one listener that routes them.
    pub fn subscribe(&self) -> broadcast::Receiver<Arc<TaskEvent>> {
        self.inner.events.subscribe()
    }

    /// Follows one task's committed changes. Take the watch before reading the task, so that
    /// no change after the read is missed.
    pub fn watch(&self, task_id: &str) -> TaskWatch {
        let mut watchers = self.inner.watchers.lock().expect("watchers lock");
        if watchers.by_task.len() >= watchers.sweep_at {
            watchers
                .by_task
                .retain(|_, watcher| watcher.receiver_count() > 0);
            watchers.sweep_at = (watchers.by_task.len() * 2).max(64);
        }
        let receiver = match watchers.by_task.get(task_id) {
            Some(watcher) => watcher.subscribe(),
            None => {
                let (watcher, receiver) = broadcast::channel(WATCH_BUFFER);
                watchers.by_task.insert(task_id.to_owned(), watcher);
                receiver
            }
        };
        TaskWatch(receiver)
    }

    /// Validates `params` for `kind` in `owner`'s environment: the task to store, refused if
    /// `owner` is at its limit or another unfinished task holds what it needs exclusively.
    async fn planned(
        &self,
        kind: &str,
        owner: &str,
        id: impl FnOnce(&Value) -> String,
        params: Value,
    ) -> Result<Prepared, EngineError> {
        let erased = self
            .inner
            .kinds
            .get(kind)
            .cloned()
            .ok_or_else(|| EngineError::UnknownKind(kind.to_owned()))?;
        let env = self.inner.env.for_owner(owner);
        // A kind whose planning reads files hands the runtime's other tasks to another thread
        // meanwhile (see `kind::blocking`); a panicking plan fails this call alone.
        let planned = std::panic::catch_unwind(AssertUnwindSafe(|| erased.plan(params, &env)))
            .map_err(|_| {
            tracing::error!("planning a task panicked");
            ParamError::general("the server failed while checking the parameters")
        })??;
        let (field, exclusive) = planned.exclusive.unzip();
        let task = NewTask {
            id: id(&planned.params),
            kind: erased.name().to_owned(),
            owner: owner.to_owned(),
            params: planned.params,
            total: planned.total,
            checkpoint: planned.checkpoint,
            exclusive,
            owner_limit: self.inner.max_tasks_per_owner,
            claim: None,
        };
        Ok(Prepared {
            kind: erased,
            task,
            exclusive_field: field,
        })
    }

    /// What storing a task refused because another holds its exclusive resource tells the
    /// caller: the field that names it, and the task that holds it.
    fn held(error: StoreError, field: Option<&'static str>, params: &Value) -> EngineError {
        match (error, field) {
            (StoreError::Refused(Refusal::Held { task_id, .. }), Some(field)) => {
                let value = params[field].as_str().unwrap_or_default();
                EngineError::InvalidParams(ParamError::new(
                    field,
                    format!(
                        "{field} {value:?} is in use by unfinished task {task_id}; wait for it \
                         to finish, cancel it, or choose another {field}"
                    ),
                ))
            }
            (error, _) => error.into(),
        }
    }

    /// Validates and stores a new task, then starts advancing it in the background.
    pub async fn start(
        &self,
        kind: &str,
        owner: &str,
        params: Value,
    ) -> Result<TaskInfo, EngineError> {
        let Prepared {
            mut task,
            exclusive_field: field,
            ..
        } = self.planned(kind, owner, |_| new_task_id(), params).await?;
        // With a running slot free now, the task is stored claimed and its worker starts in
        // that slot: one transaction fewer than storing it pending and claiming it after.
        let slot = self.inner.queue.try_admit();
        if slot.is_some() {
            task.claim = Some(self.inner.claimant.clone());
        }
        let (params, checkpoint, lease) =
            (task.params.clone(), task.checkpoint.clone(), task.lease());
        let info = self
            .inner
            .store
            .insert_task(task)
            .await
            .map_err(|e| Self::held(e, field, &params))?;
        tracing::info!(task_id = %info.task_id, kind, owner, "task created");
        self.inner.publish(TaskEvent::changed(info.clone()));
        let row = TaskRow {
            info: info.clone(),
            checkpoint,
            lease,
        };
        match slot {
            Some(slot) => self.inner.spawn_claimed(row, slot),
            None => self.inner.spawn_pending(row),
        }
        Ok(info)
    }

    /// The task of `kind` that `owner` started with exactly these parameters, created and started
    /// if there is none. Its id is derived from the three (keyed with the server's secret), so a
    /// repeated call attaches to the same task: a finished one is returned as it is, a paused
    /// one is resumed, an unfinished one keeps (or starts) running from its checkpoint.
    pub async fn start_or_attach(
        &self,
        kind: &str,
        owner: &str,
        params: Value,
    ) -> Result<TaskInfo, EngineError> {
        let Prepared {
            kind: erased,
            task,
            exclusive_field: field,
        } = self
            .planned(
                kind,
                owner,
                |params| self.derive_id(kind, owner, params),
                params,
            )
            .await?;
        let params = task.params.clone();
        let (info, created) = self
            .inner
            .store
            .insert_or_get_task(task)
            .await
            .map_err(|e| Self::held(e, field, &params))?;
        if created {
            tracing::info!(task_id = %info.task_id, kind, owner, "task created");
            self.inner.publish(TaskEvent::changed(info.clone()));
        }
        match info.status {
            TaskStatus::Paused => self.resume(&info.task_id).await,
            TaskStatus::Pending | TaskStatus::Running => {
                self.inner.spawn_worker(info.task_id.clone(), erased.name());
                Ok(info)
            }
            _ => Ok(info),
        }
    }

    fn derive_id(&self, kind: &str, owner: &str, params: &Value) -> String {
        let mut hasher = Sha256::new();
        hasher.update(self.inner.secret);
        // serde_json's map keeps keys sorted, so equal parameters hash equally.
        for part in [kind, owner, &params.to_string()] {
            hasher.update((part.len() as u64).to_le_bytes());
            hasher.update(part.as_bytes());
        }
        let digest = hasher.finalize();
        let mut bytes = [0u8; 16];
        bytes.copy_from_slice(&digest[..16]);
        uuid::Builder::from_random_bytes(bytes)
            .into_uuid()
            .to_string()
    }

    /// Stops the task at the next step boundary (dropping a step in progress), keeping its
    /// checkpoint.
    pub async fn pause(&self, task_id: &str) -> Result<TaskInfo, EngineError> {
        let info = self.transition(task_id, Steer::Pause).await?;
        self.inner.stop_worker(task_id);
        tracing::info!(task_id, step = info.step, "task paused");
        Ok(info)
    }

    /// Continues a paused task from its checkpoint.
    pub async fn resume(&self, task_id: &str) -> Result<TaskInfo, EngineError> {
        let info = self.transition(task_id, Steer::Resume).await?;
        tracing::info!(task_id, step = info.step, "task resumed");
        self.inner.spawn_worker(task_id.to_owned(), &info.kind);
        Ok(info)
    }

    /// Stops the task for good, at once, even in the middle of a step.
    pub async fn cancel(&self, task_id: &str) -> Result<TaskInfo, EngineError> {
        let info = self.transition(task_id, Steer::Cancel).await?;
        self.inner.stop_worker(task_id);
        tracing::info!(task_id, step = info.step, "task cancelled");
        Ok(info)
    }

    /// Applies `steer` if the task's status allows it (the table is [`Steer::from`]), in one
    /// conditional update.
    async fn transition(&self, task_id: &str, steer: Steer) -> Result<TaskInfo, EngineError> {
        match self
            .inner
            .store
            .transition(task_id, steer.from(), steer.to())
            .await?
        {
            Transition::Applied(info) => {
                let milestone = Milestone::info(format!("task {task_id} {}", info.status));
                self.inner.publish(TaskEvent::with(info.clone(), milestone));
                Ok(info)
            }
            Transition::Refused(info) => Err(EngineError::InvalidState {
                action: steer.as_str(),
                task_id: task_id.to_owned(),
                status: info.status,
            }),
            Transition::NotFound => Err(EngineError::NotFound(task_id.to_owned())),
        }
    }

    /// Applies a person's `answer` to question `question_id` of a task waiting for input, at
    /// most once: the kind folds it into the checkpoint, which is committed with the task's
    /// return to `pending` in one conditional update, and the task runs on from there. A second
    /// answer, or one to a question the task no longer asks, is refused and changes nothing.
    pub async fn answer(
        &self,
        task_id: &str,
        question_id: &str,
        answer: Answer,
    ) -> Result<TaskInfo, EngineError> {
        let row = self
            .inner
            .store
            .task_row(task_id)
            .await?
            .ok_or_else(|| EngineError::NotFound(task_id.to_owned()))?;
        let not_open = |info: &TaskInfo| {
            let now = match (&info.question, info.status) {
                (Some(open), TaskStatus::InputRequired) => {
                    format!("it asks {:?} now", open.id)
                }
                (_, status) => format!("it is {status} and asks nothing"),
            };
            EngineError::QuestionNotOpen(format!(
                "question {question_id:?} of task {task_id} is not open (answered already, or \
                 never asked): {now}"
            ))
        };
        match &row.info.question {
            Some(open)
                if row.info.status == TaskStatus::InputRequired && open.id == question_id => {}
            _ => return Err(not_open(&row.info)),
        }
        let kind = self
            .inner
            .kinds
            .get(row.info.kind.as_str())
            .cloned()
            .ok_or_else(|| EngineError::UnknownKind(row.info.kind.clone()))?;
        let checkpoint = kind.answer(row.info.parameters.clone(), row.checkpoint, answer)?;
        match self
            .inner
            .store
            .answer_question(task_id, question_id, checkpoint)
            .await?
        {
            Transition::Applied(info) => {
                tracing::info!(task_id, question_id, "question answered");
                let milestone =
                    Milestone::info(format!("task {task_id} was answered ({question_id})"));
                self.inner.publish(TaskEvent::with(info.clone(), milestone));
                self.inner.spawn_worker(task_id.to_owned(), kind.name());
                Ok(info)
            }
            // Another answer came first.
            Transition::Refused(info) => Err(not_open(&info)),
            Transition::NotFound => Err(EngineError::NotFound(task_id.to_owned())),
        }
    }

    /// How many of `owner`'s tasks are unfinished (pending, running, paused, waiting for input).
    pub async fn unfinished_tasks_of(&self, owner: &str) -> Result<u64, EngineError> {
        Ok(self.inner.store.unfinished_tasks_of(owner).await?)
    }

    pub async fn get(&self, task_id: &str) -> Result<TaskInfo, EngineError> {
        if let Some(task) = self.inner.finished.get(task_id) {
            return Ok(task);
        }
        let task = self
            .inner
            .store
            .get_task(task_id)
            .await?
            .ok_or_else(|| EngineError::NotFound(task_id.to_owned()))?;
        if task.status.is_terminal() {
            let read = Arc::new(TaskEvent::changed(task.clone()));
            self.inner.finished.keep(&read);
        }
        Ok(task)
    }

    /// Tasks newest first; see [`TaskRepo::list_tasks`](crate::store::TaskRepo::list_tasks).
    pub async fn list(
        &self,
        owner: Option<String>,
        status: Option<TaskStatus>,
        after: Option<(i64, String)>,
        limit: usize,
    ) -> Result<Vec<TaskInfo>, EngineError> {
        Ok(self
            .inner
            .store
            .list_tasks(owner, status, after, limit)
            .await?)
    }

    /// Workers currently advancing a task in this process (not those waiting for a slot).
    pub fn active_workers(&self) -> usize {
        let workers = self.inner.workers.lock().expect("worker table lock").len();
        workers.saturating_sub(self.inner.queue.len())
    }

    pub async fn stats(&self) -> Result<ServerStats, EngineError> {
        let counts = self.inner.store.status_counts().await?;
        Ok(ServerStats::from_counts(
            &counts,
            self.active_workers() as u64,
        ))
    }

    pub async fn checkpoint_stats(&self) -> Result<CheckpointStats, EngineError> {
        Ok(self.inner.store.checkpoint_stats().await?)
    }

    /// Deletes tasks that reached a terminal status more than `retention` before `now`.
    pub async fn purge_finished(
        &self,
        now: DateTime<Utc>,
        retention: Duration,
    ) -> Result<u64, EngineError> {
        let cutoff = retention_cutoff(now, retention);
        let purged = self.inner.store.purge_finished_before(cutoff).await?;
        self.inner.finished.forget_before(cutoff);
        if purged > 0 {
            tracing::info!(purged, %cutoff, "removed finished tasks past retention");
        }
        Ok(purged)
    }

    /// Runs [`Engine::purge_finished`], and deletes expired MCP task handles, every `every`
    /// until shutdown.
    pub fn spawn_retention(&self, retention: Duration, every: Duration) {
        self.inner.finished.set_retention(retention);
        let engine = self.clone();
        let shutdown = self.inner.shutdown.clone();
        self.inner.tracker.spawn(async move {
            let mut ticks = tokio::time::interval(every);
            loop {
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    _ = ticks.tick() => {}
                }
                if let Err(e) = engine.purge_finished(Utc::now(), retention).await {
                    tracing::error!(error = %e, "retention sweep failed");
                }
                match engine.inner.store.purge_expired_handles().await {
                    Ok(0) => {}
                    Ok(purged) => tracing::info!(purged, "removed MCP task handles past their ttl"),
                    Err(e) => tracing::error!(error = %e, "task handle sweep failed"),
                }
            }
        });
    }

    /// Waits (up to `deadline`) for every worker to stop after the shutdown token fired. Tasks
    /// interrupted this way keep their last checkpoint and resume at the next start.
    pub async fn wait_stopped(&self, deadline: Duration) -> bool {
        self.inner.tracker.close();
        let stopped = tokio::time::timeout(deadline, self.inner.tracker.wait())
            .await
            .is_ok();
        // Other nodes take this node's tasks at once instead of after its leases lapse.
        match self
            .inner
            .store
            .release_leases(&self.inner.claimant.node)
            .await
        {
            Ok(0) => {}
            Ok(released) => tracing::info!(released, "handed leases back"),
            Err(e) => {
                tracing::warn!(error = %e, "cannot hand leases back; they lapse by themselves")
            }
        }
        stopped
    }
}

/// A new task's id, time-ordered (UUIDv7): tasks are keyed by id, and ids made one after
/// another share the last pages of that index, where random ones would put each new task on a
/// page of its own, written at every commit. Its 74 random bits keep an id unguessable, and
/// knowing one grants nothing: every use of a task checks its owner.
///
/// The bits come from the thread's generator (rand's, a CSPRNG the OS seeds), not from
/// `Uuid::now_v7`, which asks the OS for them at every id (a system call) and holds a
/// process-wide lock meanwhile, for a counter that orders the ids of one millisecond, which
/// nothing here needs: two threads starting tasks waited on each other.
fn new_task_id() -> String {
    let millis = Utc::now().timestamp_millis().max(0) as u64;
    uuid::Builder::from_unix_timestamp_millis(millis, &rand::random())
        .into_uuid()
        .to_string()
}

/// The instant before which finished tasks are removed: `now` minus `retention`, in exact
/// elapsed time, so month and year boundaries need no special cases.
pub fn retention_cutoff(now: DateTime<Utc>, retention: Duration) -> DateTime<Utc> {
    let retention = chrono::TimeDelta::from_std(retention).unwrap_or(chrono::TimeDelta::MAX);
    now.checked_sub_signed(retention)
        .unwrap_or(DateTime::<Utc>::MIN_UTC)
}

#[cfg(test)]
mod tests {
    use chrono::TimeZone;
    use durable_shared::kinds::KindSpec;

    use super::count::Count;
    use super::*;

    const STEPS: u64 = 10;

    /// A pending `Count` task to `STEPS`, as a previous process or another node leaves one.
    fn left_task(id: &str) -> NewTask {
        Count::task(id, "test", STEPS)
    }

    /// An engine of `Count` tasks on `store`, as node `node`, with its left work to resume.
    async fn count_engine(store: Store, dir: &std::path::Path, node: &str) -> (Engine, LeftWork) {
        Count::engine(store, dir, claimant(node), 4).await.unwrap()
    }

    fn claimant(node: &str) -> Claimant {
        Claimant {
            node: node.into(),
            ttl: Duration::from_secs(10),
        }
    }

    /// A task left `pending` by a previous process is taken up by `LeftWork::resume`, not by
    /// `start`, and a watch taken between the two hears each of its changes in order, though
    /// it is read only after the task has ended (the relay of an interrupted call sends each
    /// change as a progress notification, and is slower than an unpaced task).
    #[tokio::test]
    async fn left_work_waits_for_resume_and_a_watch_hears_every_change() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("t.db")).unwrap();
        store.insert_task(left_task("left")).await.unwrap();
        let (engine, left_work) = count_engine(store, dir.path(), "test").await;
        // An engine that took the task up at start has its worker in the table by now.
        assert!(
            !engine.inner.workers.lock().unwrap().contains_key("left"),
            "start took up left work"
        );
        let mut watch = engine.watch("left");
        let left = engine.get("left").await.unwrap();
        assert_eq!(
            (left.status, left.step),
            (TaskStatus::Pending, 0),
            "start took up left work"
        );
        let mut events = engine.subscribe();
        left_work.resume().await.unwrap();
        tokio::time::timeout(Duration::from_secs(30), async {
            while !events.recv().await.unwrap().task.status.is_terminal() {}
        })
        .await
        .expect("the resumed task ends");
        let mut progress = Vec::new();
        while let Some(task) = tokio::time::timeout(Duration::from_secs(5), watch.changed())
            .await
            .expect("the watch ends with the task")
        {
            progress.push(task.progress);
        }
        assert_eq!(progress, (0..=STEPS).collect::<Vec<_>>());
    }

    /// On a shared database, what another node commits after this engine started and before it
    /// resumed the left work still reaches a watch taken meanwhile (a relay of an interrupted
    /// call watches then, and waits on the task's end, which another node may commit).
    #[tokio::test]
    async fn another_nodes_change_before_resume_reaches_a_watch() {
        use crate::store::postgres::scratch::{ScratchDatabase, TEST_SERVER_VAR};
        use crate::store::{Database, StepCommit};

        let Some(scratch) = ScratchDatabase::from_env().await else {
            eprintln!("skipped: {TEST_SERVER_VAR} names no PostgreSQL server");
            return;
        };
        let scratch = scratch.unwrap();
        let database = Database::Postgres(scratch.url().to_owned());
        let other = Store::connect(&database, "other").await.unwrap();
        // Stored and claimed before this node listens: it hears of the step below alone.
        other.insert_task(left_task("elsewhere")).await.unwrap();
        let claimed = other
            .claim_task("elsewhere", &claimant("other"))
            .await
            .unwrap()
            .expect("the other node claims the task");
        let dir = tempfile::tempdir().unwrap();
        let this = Store::connect(&database, "this").await.unwrap();
        let (engine, left_work) = count_engine(this, dir.path(), "this").await;
        let mut watch = engine.watch("elsewhere");
        let mut heard = engine.fleet_changes().expect("a shared database");
        // This node listens from a connection it sets up in the background, and PostgreSQL
        // tells it only of what is committed after: the other node stores tasks until this
        // one hears of one.
        tokio::time::timeout(Duration::from_secs(10), async {
            for probe in 0.. {
                other
                    .insert_task(left_task(&format!("probe-{probe}")))
                    .await
                    .unwrap();
                let wait = tokio::time::timeout(Duration::from_millis(100), heard.recv());
                if wait.await.is_ok() {
                    return;
                }
            }
        })
        .await
        .expect("this node hears the other's changes");
        other
            .commit_step(StepCommit {
                task: claimed.info,
                lease: claimed.lease,
                step: 1,
                checkpoint: "1".into(),
                progress: 1,
                message: "1/10".into(),
                result: None,
                question: None,
            })
            .await
            .unwrap()
            .expect("the other node commits its step");
        tokio::time::timeout(Duration::from_secs(10), async {
            while !matches!(heard.recv().await, Ok(Change::Task { id }) if id == "elsewhere") {}
        })
        .await
        .expect("this node hears of the step");
        left_work.resume().await.unwrap();
        let stepped = tokio::time::timeout(Duration::from_secs(10), async {
            loop {
                let task = watch.changed().await.expect("the task goes on");
                if task.progress == 1 {
                    return task;
                }
            }
        })
        .await
        .expect("the other node's step reaches the watch");
        assert_eq!(stepped.node.as_deref(), Some("other"));
    }

    /// A kind of one step, which waits inside it until the test lets it finish.
    #[derive(Clone, Default)]
    struct Gate {
        stepping: Arc<tokio::sync::Notify>,
        finish: Arc<tokio::sync::Notify>,
    }

    impl KindSpec for Gate {
        const NAME: &'static str = "gate";
        const TITLE: &'static str = "Gate";
        const DESCRIPTION: &'static str = "Steps once, when the test lets it.";
        const RESULT: &'static str = "nothing";
        type Params = count::CountTo;
        type Output = u64;
    }

    impl TaskKind for Gate {
        type State = u64;

        fn plan(&self, _: &count::CountTo, _: &Env) -> Result<Plan<u64>, ParamError> {
            Ok(Plan { state: 0, total: 1 })
        }

        async fn step(
            &self,
            _: &count::CountTo,
            _: &u64,
            _: &Env,
        ) -> Result<Step<u64, u64>, StepError> {
            self.stepping.notify_one();
            self.finish.notified().await;
            Ok(Step::Done {
                state: 1,
                progress: 1,
                message: "done".into(),
                output: 1,
            })
        }
    }

    /// A task's last commit holds no running slot: with one slot, while a finishing task's
    /// commit waits (another connection holds the database's write lock), the slot is free for
    /// the next task, and the task still running.
    #[tokio::test]
    async fn a_last_commit_waits_without_a_running_slot() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.db");
        let gate = Gate::default();
        let (engine, left_work) = Engine::builder()
            .register(gate.clone())
            .start(
                Store::open(&path).unwrap(),
                Count::config(dir.path(), claimant("test"), 1),
                CancellationToken::new(),
            )
            .await
            .unwrap();
        left_work.resume().await.unwrap();
        let slots = engine.inner.queue.slots().clone();
        let task = engine
            .start(Gate::NAME, "test", serde_json::json!({"steps": 1}))
            .await
            .unwrap();
        tokio::time::timeout(Duration::from_secs(10), gate.stepping.notified())
            .await
            .expect("the task steps");
        assert_eq!(slots.available_permits(), 0, "the step holds the only slot");
        let locker = rusqlite::Connection::open(&path).unwrap();
        locker.execute_batch("BEGIN IMMEDIATE").unwrap();
        gate.finish.notify_one();
        // Well within the writer's wait for the lock: after it, the commit fails and the
        // worker, waiting to claim the task again, lends its slot all the same.
        let free = tokio::time::timeout(Duration::from_secs(2), slots.acquire())
            .await
            .expect("the slot is free while the last commit waits");
        drop(free);
        let waiting = engine.get(&task.task_id).await.unwrap();
        assert_eq!(
            waiting.status,
            TaskStatus::Running,
            "not completed while the lock is held"
        );
        let mut events = engine.subscribe();
        locker.execute_batch("ROLLBACK").unwrap();
        tokio::time::timeout(Duration::from_secs(10), async {
            while !events.recv().await.unwrap().task.status.is_terminal() {}
        })
        .await
        .expect("the task completes once the lock is gone");
        let done = engine.get(&task.task_id).await.unwrap();
        assert_eq!((done.status, done.step), (TaskStatus::Completed, 1));
    }

    /// Task ids are UUIDv7 of the current millisecond, with random bits that differ every time.
    #[test]
    fn task_ids_are_time_ordered_and_random() {
        let before = Utc::now().timestamp_millis() as u64;
        let ids: Vec<uuid::Uuid> = (0..64)
            .map(|_| new_task_id().parse().expect("a UUID"))
            .collect();
        let after = Utc::now().timestamp_millis() as u64;
        for id in &ids {
            assert_eq!(id.get_version_num(), 7, "{id}");
            let (seconds, nanos) = id.get_timestamp().expect("a v7 timestamp").to_unix();
            let millis = seconds * 1000 + u64::from(nanos) / 1_000_000;
            assert!((before..=after).contains(&millis), "{id}: {millis}");
        }
        let random: std::collections::HashSet<_> =
            ids.iter().map(|id| id.as_bytes()[6..].to_vec()).collect();
        assert_eq!(random.len(), ids.len(), "the random bits repeat");
    }

    /// The first reference server subtracted days from the day of the month, which breaks at
    /// the start of every month; the cutoff is exact elapsed time instead.
    #[test]
    fn retention_cutoffs_cross_month_and_leap_day_boundaries() {
        let at = |y, m, d, h| Utc.with_ymd_and_hms(y, m, d, h, 0, 0).unwrap();
        let day = Duration::from_secs(86_400);
        assert_eq!(retention_cutoff(at(2026, 3, 1, 0), day), at(2026, 2, 28, 0));
        assert_eq!(retention_cutoff(at(2028, 3, 1, 6), day), at(2028, 2, 29, 6));
        assert_eq!(
            retention_cutoff(at(2026, 1, 1, 6), day * 2),
            at(2025, 12, 30, 6)
        );
        assert_eq!(
            retention_cutoff(at(2026, 3, 31, 6), day * 31),
            at(2026, 2, 28, 6)
        );
    }
}
