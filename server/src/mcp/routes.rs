//! Event routing by interest: which sessions care about which task, so that an engine event
//! costs only the sessions that listen to it and an idle session costs nothing per event.
//!
//! A session is interested in a task when it subscribed to one of the task's resources
//! (`task://status/{id}`, a `task://list` it is in or leaves), when its client owns the task
//! (milestones are logged to it), or when its client holds an MCP task handle on it (status
//! notifications). The index of all three is in memory: subscriptions and client ids as
//! sessions declare them, handles of unfinished tasks loaded from the store at start and added
//! as they are created. One router (`notify.rs`) reads the engine's events and hands each
//! interested session a [`Delivery`] in its own bounded queue; nothing is read from the store
//! per event.
//!
//! A session whose client opened no stream that notifications could go out on is deaf: rmcp
//! would drop whatever it were sent, so the router hands it nothing but a task's question
//! (asking is more than a notification).
//!
//! A session whose queue is full misses deliveries: it is marked as lagging, with the time of
//! the first change it missed, and its forwarder then resynchronises it from the store (the
//! current state of everything it follows, and the status of its handles changed since then).

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use durable_shared::{TaskInfo, TaskStatus};
use serde_json::Value;
use tokio::sync::mpsc::{self, error::TrySendError};

use super::resources;
use crate::engine::{TaskEvent, TaskHandle};

/// Names one registered session in the index.
pub(super) type SessionKey = u64;

/// An MCP task handle as routing needs it: whose it is, the rest of [`TaskHandle`] but the task.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct HandleRoute {
    pub(super) requester: String,
    pub(super) tool: String,
    pub(super) ttl_ms: u64,
}

impl HandleRoute {
    pub(super) fn of(handle: &TaskHandle) -> Self {
        HandleRoute {
            requester: handle.requester.clone(),
            tool: handle.tool.clone(),
            ttl_ms: handle.ttl_ms,
        }
    }

    /// The handle on `task` (its state at some moment).
    pub(super) fn with(&self, task: TaskInfo) -> TaskHandle {
        TaskHandle {
            task,
            requester: self.requester.clone(),
            tool: self.tool.clone(),
            ttl_ms: self.ttl_ms,
        }
    }

    fn live_at(&self, task: &TaskInfo, now_ms: i64) -> bool {
        task.created_at.timestamp_millis() + self.ttl_ms as i64 > now_ms
    }
}

/// One engine event, shared by every session it is delivered to.
pub(super) struct Routed {
    pub(super) event: Arc<TaskEvent>,
    /// The task as JSON, made once for all the subscribers that carry it in `_meta`.
    meta: OnceLock<Value>,
}

impl Routed {
    pub(super) fn task_json(&self) -> &Value {
        self.meta
            .get_or_init(|| serde_json::to_value(&self.event.task).unwrap_or_default())
    }
}

/// What one session is told of one event.
pub(super) struct Delivery {
    pub(super) routed: Arc<Routed>,
    /// The session's subscribed resources that the event changed.
    pub(super) uris: Vec<String>,
    /// The session's client owns the task: its milestones are logged to it.
    pub(super) owner: bool,
    /// The session's client holds this handle on the task, and the task's status changed.
    pub(super) handle: Option<HandleRoute>,
}

/// What a session's forwarder gets next.
pub(super) enum Next {
    Deliver(Delivery),
    /// Deliveries were dropped: resynchronise from the store everything changed at or after
    /// this time (ms since the epoch).
    Resync {
        since_ms: i64,
    },
}

/// The receiving end of a session's queue.
pub(super) struct Inbox {
    queue: mpsc::Receiver<Box<Delivery>>,
    lag: Arc<Lag>,
}

impl Inbox {
    /// The next delivery, or a resync once any was dropped; `None` when the session has been
    /// removed from the index.
    pub(super) async fn next(&mut self) -> Option<Next> {
        if let Some(next) = self.resync() {
            return Some(next);
        }
        let delivery = self.queue.recv().await?;
        Some(self.resync().unwrap_or(Next::Deliver(*delivery)))
    }

    fn resync(&mut self) -> Option<Next> {
        let since_ms = self.lag.take()?;
        // Whatever is still queued is older than the state the resync reads.
        while self.queue.try_recv().is_ok() {}
        Some(Next::Resync { since_ms })
    }
}

/// When a session started missing deliveries; `NONE` while it misses nothing.
struct Lag(AtomicI64);

impl Lag {
    // The largest value, so that `fetch_min` keeps the earliest time marked.
    const NONE: i64 = i64::MAX;

    fn mark(&self, since_ms: i64) {
        self.0.fetch_min(since_ms, Ordering::AcqRel);
    }

    fn take(&self) -> Option<i64> {
        let since = self.0.swap(Self::NONE, Ordering::AcqRel);
        (since != Self::NONE).then_some(since)
    }
}

impl Default for Lag {
    fn default() -> Self {
        Lag(AtomicI64::new(Self::NONE))
    }
}

/// A session's place in the index; dropping it removes the session.
pub(super) struct Registration {
    routes: Arc<Routes>,
    pub(super) key: SessionKey,
}

impl Drop for Registration {
    fn drop(&mut self) {
        self.routes.remove(self.key);
    }
}

/// The interest index. A std mutex: it is held for map operations only, never across an await.
pub(super) struct Routes {
    index: Mutex<Index>,
    /// Deliveries a session may have queued before it counts as lagging.
    buffer: usize,
}

#[derive(Default)]
struct Index {
    next_key: SessionKey,
    sessions: HashMap<SessionKey, Listener>,
    by_uri: HashMap<String, HashSet<SessionKey>>,
    by_client: HashMap<String, HashSet<SessionKey>>,
    /// The MCP task handles of unfinished tasks, by task id.
    handles: HashMap<String, Vec<HandleRoute>>,
    /// The status last routed for each unfinished task: which status list it left.
    last_status: HashMap<String, TaskStatus>,
}

struct Listener {
    /// Boxed deliveries: a channel allocates a block of slots up front, which every idle
    /// session would pay for at the size of a whole delivery.
    queue: mpsc::Sender<Box<Delivery>>,
    lag: Arc<Lag>,
    client: Option<String>,
    /// The MCP session's id, once initialized (a `subscriptions/listen` stream has none).
    session_id: Option<String>,
    /// Whether list resources show it every client's tasks, or only its client's (an
    /// authenticated subject without the operator scope).
    sees_all: bool,
    uris: HashSet<String>,
}

impl Listener {
    fn sees(&self, task: &TaskInfo) -> bool {
        self.sees_all || self.client.as_deref() == Some(task.owner.as_str())
    }
}

/// Adds `key` to the set under `name`.
fn link(map: &mut HashMap<String, HashSet<SessionKey>>, name: &str, key: SessionKey) {
    map.entry(name.to_owned()).or_default().insert(key);
}

/// Removes `key` from the set under `name`, and the set once empty.
fn unlink(map: &mut HashMap<String, HashSet<SessionKey>>, name: &str, key: SessionKey) {
    if let Some(keys) = map.get_mut(name) {
        keys.remove(&key);
        if keys.is_empty() {
            map.remove(name);
        }
    }
}

impl Routes {
    pub(super) fn new(buffer: usize) -> Arc<Self> {
        Arc::new(Routes {
            index: Mutex::default(),
            buffer: buffer.max(1),
        })
    }

    fn index(&self) -> std::sync::MutexGuard<'_, Index> {
        self.index.lock().expect("routing index lock")
    }

    /// Adds a session with no interests yet.
    pub(super) fn register(self: &Arc<Self>) -> (Registration, Inbox) {
        let (sender, queue) = mpsc::channel(self.buffer);
        let lag = Arc::new(Lag::default());
        let mut index = self.index();
        let key = index.next_key;
        index.next_key += 1;
        index.sessions.insert(
            key,
            Listener {
                queue: sender,
                lag: lag.clone(),
                client: None,
                session_id: None,
                sees_all: true,
                uris: HashSet::new(),
            },
        );
        let registration = Registration {
            routes: self.clone(),
            key,
        };
        (registration, Inbox { queue, lag })
    }

    fn remove(&self, key: SessionKey) {
        let mut index = self.index();
        let Some(listener) = index.sessions.remove(&key) else {
            return;
        };
        for uri in &listener.uris {
            unlink(&mut index.by_uri, uri, key);
        }
        if let Some(client) = &listener.client {
            unlink(&mut index.by_client, client, key);
        }
    }

    /// Records the client a session speaks for (the last one its requests named).
    pub(super) fn set_client(&self, key: SessionKey, client: &str) {
        let mut index = self.index();
        let Some(listener) = index.sessions.get_mut(&key) else {
            return;
        };
        if listener.client.as_deref() == Some(client) {
            return;
        }
        let previous = listener.client.replace(client.to_owned());
        if let Some(previous) = previous {
            unlink(&mut index.by_client, &previous, key);
        }
        link(&mut index.by_client, client, key);
    }

    /// Records the MCP session a registered session is.
    pub(super) fn set_session(&self, key: SessionKey, session_id: &str) {
        if let Some(listener) = self.index().sessions.get_mut(&key) {
            listener.session_id = Some(session_id.to_owned());
        }
    }

    /// Records the authenticated subject a session belongs to, and whether it sees every
    /// subject's tasks in lists.
    pub(super) fn set_viewer(&self, key: SessionKey, subject: &str, sees_all: bool) {
        self.set_client(key, subject);
        if let Some(listener) = self.index().sessions.get_mut(&key) {
            listener.sees_all = sees_all;
        }
    }

    /// The client a session speaks for, if it said.
    pub(super) fn client(&self, key: SessionKey) -> Option<String> {
        self.index().sessions.get(&key)?.client.clone()
    }

    /// The owner a session's lists are restricted to; `None`: it sees every task.
    pub(super) fn list_filter(&self, key: SessionKey) -> Option<String> {
        let index = self.index();
        let listener = index.sessions.get(&key)?;
        (!listener.sees_all).then(|| listener.client.clone().unwrap_or_default())
    }

    /// Whether `client` holds a handle on an unfinished task (its status changes are sent to it).
    pub(super) fn holds_handles(&self, client: &str) -> bool {
        self.index()
            .handles
            .values()
            .flatten()
            .any(|handle| handle.requester == client)
    }

    pub(super) fn subscription_count(&self, key: SessionKey) -> usize {
        self.index()
            .sessions
            .get(&key)
            .map_or(0, |listener| listener.uris.len())
    }

    pub(super) fn subscribe(&self, key: SessionKey, uri: &str) {
        let mut index = self.index();
        let Some(listener) = index.sessions.get_mut(&key) else {
            return;
        };
        if listener.uris.insert(uri.to_owned()) {
            link(&mut index.by_uri, uri, key);
        }
    }

    pub(super) fn unsubscribe(&self, key: SessionKey, uri: &str) {
        let mut index = self.index();
        let Some(listener) = index.sessions.get_mut(&key) else {
            return;
        };
        if listener.uris.remove(uri) {
            unlink(&mut index.by_uri, uri, key);
        }
    }

    /// A session's subscriptions.
    pub(super) fn subscriptions(&self, key: SessionKey) -> Vec<String> {
        self.index()
            .sessions
            .get(&key)
            .map(|listener| listener.uris.iter().cloned().collect())
            .unwrap_or_default()
    }

    /// Routes the status changes of `handle`'s task to its requester's sessions from now on.
    pub(super) fn add_handle(&self, handle: &TaskHandle) {
        if handle.task.status.is_terminal() {
            return;
        }
        let route = HandleRoute::of(handle);
        let mut index = self.index();
        let handles = index
            .handles
            .entry(handle.task.task_id.clone())
            .or_default();
        handles.retain(|known| known.requester != route.requester);
        handles.push(route);
    }

    /// Marks session `key` lagging: it missed whatever changed at or after `since_ms`.
    pub(super) fn lagging(&self, key: SessionKey, since_ms: i64) {
        if let Some(listener) = self.index().sessions.get(&key) {
            listener.lag.mark(since_ms);
        }
    }

    /// Marks every session lagging: the router itself missed events after `since_ms`, and
    /// which tasks they were about is unknown.
    pub(super) fn all_lagging(&self, since_ms: i64) {
        let mut index = self.index();
        index.last_status.clear();
        for listener in index.sessions.values() {
            listener.lag.mark(since_ms);
        }
    }

    /// Hands `event` to each session interested in it, but to none that is `deaf` (given its
    /// MCP session id): one whose notifications its transport would drop, since its client
    /// opened no stream they could go out on. A task's question is handed over all the same:
    /// asking it is more than a notification (see `notify::Forwarder::deliver`).
    pub(super) fn route(&self, event: Arc<TaskEvent>, deaf: impl Fn(&str) -> bool) {
        let mut index = self.index();
        let index = &mut *index;
        let task = &event.task;
        let before = if task.status.is_terminal() {
            index.last_status.remove(&task.task_id)
        } else {
            index.last_status.insert(task.task_id.clone(), task.status)
        };
        let mut targets: HashMap<SessionKey, (Vec<String>, bool, Option<HandleRoute>)> =
            HashMap::new();
        if !index.by_uri.is_empty() {
            for uri in resources::affected_by(&task.task_id, before, task.status) {
                if let Some(keys) = index.by_uri.get(&uri) {
                    // A list shows a session only the tasks it may see (its status
                    // subscriptions were checked when made).
                    let visible = |key: &SessionKey| {
                        !resources::is_list(&uri)
                            || index.sessions.get(key).is_some_and(|l| l.sees(task))
                    };
                    for key in keys.iter().filter(|key| visible(key)) {
                        targets.entry(*key).or_default().0.push(uri.clone());
                    }
                }
            }
        }
        if event.milestone.is_some()
            && let Some(keys) = index.by_client.get(&task.owner)
        {
            for key in keys {
                targets.entry(*key).or_default().1 = true;
            }
        }
        if before != Some(task.status)
            && let Some(handles) = index.handles.get(&task.task_id)
        {
            let now = chrono::Utc::now().timestamp_millis();
            for handle in handles.iter().filter(|handle| handle.live_at(task, now)) {
                for key in index.by_client.get(&handle.requester).into_iter().flatten() {
                    targets.entry(*key).or_default().2 = Some(handle.clone());
                }
            }
        }
        // Nothing follows a terminal status: its handles need no more routing.
        if task.status.is_terminal() {
            index.handles.remove(&task.task_id);
        }
        if targets.is_empty() {
            return;
        }
        let changed_ms = task.updated_at.timestamp_millis();
        let asks = task.status == TaskStatus::InputRequired;
        let routed = Arc::new(Routed {
            event,
            meta: OnceLock::new(),
        });
        for (key, (uris, owner, handle)) in targets {
            let Some(listener) = index.sessions.get(&key) else {
                continue;
            };
            if !(owner && asks) && listener.session_id.as_deref().is_some_and(&deaf) {
                continue;
            }
            let delivery = Box::new(Delivery {
                routed: routed.clone(),
                uris,
                owner,
                handle,
            });
            match listener.queue.try_send(delivery) {
                Ok(()) => {}
                Err(TrySendError::Full(_)) => listener.lag.mark(changed_ms),
                // Its forwarder has ended with its transport; the session leaves the index
                // when rmcp drops it.
                Err(TrySendError::Closed(_)) => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use chrono::Utc;

    use super::*;
    use crate::engine::Milestone;

    fn task(id: &str, owner: &str, status: TaskStatus, step: u64) -> TaskInfo {
        let now = Utc::now();
        TaskInfo {
            task_id: id.into(),
            status,
            progress: step,
            total: 10,
            message: String::new(),
            result_data: None,
            error: None,
            created_at: now,
            updated_at: now,
            completed_at: None,
            kind: "batch_processing".into(),
            parameters: Value::Null,
            owner: owner.into(),
            step,
            percent: 0.0,
            node: None,
            question: None,
        }
    }

    fn changed(task: TaskInfo) -> TaskEvent {
        TaskEvent {
            task,
            milestone: None,
        }
    }

    impl Routes {
        /// Routes `event` as to sessions that all have a stream open.
        fn route_to_all(&self, event: TaskEvent) {
            self.route(Arc::new(event), |_| false);
        }
    }

    fn delivered(inbox: &mut Inbox) -> Vec<Delivery> {
        let mut out = Vec::new();
        while let Ok(delivery) = inbox.queue.try_recv() {
            out.push(*delivery);
        }
        out
    }

    #[test]
    fn an_event_reaches_only_the_sessions_interested_in_its_task() {
        let routes = Routes::new(16);
        let (subscriber, mut subscriber_inbox) = routes.register();
        let (owner, mut owner_inbox) = routes.register();
        let (idle, mut idle_inbox) = routes.register();
        routes.subscribe(subscriber.key, "task://status/a");
        routes.set_client(owner.key, "alice");
        routes.set_client(idle.key, "bob");

        routes.route_to_all(changed(task("a", "alice", TaskStatus::Running, 1)));
        routes.route_to_all(TaskEvent {
            task: task("a", "alice", TaskStatus::Running, 2),
            milestone: Some(Milestone::info("resumed".into())),
        });
        routes.route_to_all(changed(task("b", "alice", TaskStatus::Running, 1)));

        let to_subscriber = delivered(&mut subscriber_inbox);
        assert_eq!(to_subscriber.len(), 2, "both changes of task a");
        assert!(
            to_subscriber
                .iter()
                .all(|d| d.uris == ["task://status/a"] && !d.owner)
        );
        let to_owner = delivered(&mut owner_inbox);
        assert_eq!(to_owner.len(), 1, "only the milestone of its own task");
        assert!(to_owner[0].owner && to_owner[0].uris.is_empty());
        assert!(delivered(&mut idle_inbox).is_empty());
    }

    /// A session whose client opened no stream for notifications is handed none (its
    /// transport would drop them), but a question its task asks still reaches it.
    #[test]
    fn a_deaf_session_is_handed_only_questions() {
        let routes = Routes::new(16);
        let (deaf, mut deaf_inbox) = routes.register();
        let (hearing, mut hearing_inbox) = routes.register();
        for (session, id) in [(&deaf, "s-deaf"), (&hearing, "s-hearing")] {
            routes.set_session(session.key, id);
            routes.set_client(session.key, "erin");
            routes.subscribe(session.key, "task://status/q");
        }
        let is_deaf = |session_id: &str| session_id == "s-deaf";
        routes.route(
            Arc::new(TaskEvent {
                task: task("q", "erin", TaskStatus::Running, 1),
                milestone: Some(Milestone::info("started".into())),
            }),
            is_deaf,
        );
        routes.route(
            Arc::new(TaskEvent {
                task: task("q", "erin", TaskStatus::InputRequired, 2),
                milestone: Some(Milestone::info("asks".into())),
            }),
            is_deaf,
        );
        let statuses = |inbox: &mut Inbox| -> Vec<TaskStatus> {
            delivered(inbox)
                .iter()
                .map(|d| d.routed.event.task.status)
                .collect()
        };
        assert_eq!(statuses(&mut deaf_inbox), [TaskStatus::InputRequired]);
        assert_eq!(
            statuses(&mut hearing_inbox),
            [TaskStatus::Running, TaskStatus::InputRequired]
        );
    }

    #[test]
    fn handle_holders_hear_of_status_changes_only() {
        let routes = Routes::new(16);
        let (session, mut inbox) = routes.register();
        routes.set_client(session.key, "carol");
        let running = task("t", "carol", TaskStatus::Running, 0);
        routes.add_handle(&TaskHandle {
            task: running.clone(),
            requester: "carol".into(),
            tool: "run_batch_processing".into(),
            ttl_ms: 60_000,
        });
        routes.route_to_all(changed(running));
        routes.route_to_all(changed(task("t", "carol", TaskStatus::Running, 1)));
        routes.route_to_all(changed(task("t", "carol", TaskStatus::Completed, 2)));
        let statuses: Vec<TaskStatus> = delivered(&mut inbox)
            .iter()
            .map(|d| {
                assert_eq!(d.handle.as_ref().unwrap().requester, "carol");
                d.routed.event.task.status
            })
            .collect();
        assert_eq!(statuses, [TaskStatus::Running, TaskStatus::Completed]);
        assert!(
            routes.index().handles.is_empty() && routes.index().last_status.is_empty(),
            "a finished task leaves the index"
        );
    }

    #[test]
    fn a_full_queue_marks_the_session_lagging_from_the_first_missed_change() {
        let routes = Routes::new(1);
        let (session, mut inbox) = routes.register();
        routes.subscribe(session.key, "task://list");
        let first = task("a", "x", TaskStatus::Running, 1);
        let mut missed = task("a", "x", TaskStatus::Running, 2);
        missed.updated_at = first.updated_at + chrono::TimeDelta::milliseconds(5);
        let mut later = task("a", "x", TaskStatus::Running, 3);
        later.updated_at = missed.updated_at + chrono::TimeDelta::milliseconds(5);
        routes.route_to_all(changed(first));
        routes.route_to_all(changed(missed.clone()));
        routes.route_to_all(changed(later));
        match inbox.resync() {
            Some(Next::Resync { since_ms }) => {
                assert_eq!(since_ms, missed.updated_at.timestamp_millis());
            }
            _ => panic!("the session lags"),
        }
        assert!(delivered(&mut inbox).is_empty(), "stale deliveries dropped");
        assert!(inbox.resync().is_none(), "a resync is due once");
    }

    #[test]
    fn a_dropped_registration_leaves_nothing_behind() {
        let routes = Routes::new(4);
        let (session, _inbox) = routes.register();
        routes.subscribe(session.key, "task://list");
        routes.set_client(session.key, "dave");
        drop(session);
        let index = routes.index();
        assert!(index.sessions.is_empty() && index.by_uri.is_empty() && index.by_client.is_empty());
    }
}
