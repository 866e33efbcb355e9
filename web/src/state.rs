//! The dashboard's state: tasks as the server last described them, the event timeline of each
//! task (persisted per tab, so a reload continues it), and the connection state.
//!
//! Fine-grained, so that the cost of an event does not grow with the number of tasks: each task
//! lives in a signal of its own, which only its row (and the detail panel, while it is
//! selected) reads; the map of those signals changes only when a task appears or goes, and the
//! counts per status are kept as tasks change instead of being counted again.

use std::cell::Cell;
use std::collections::{BTreeMap, HashMap};

use durable_shared::form::FormField;
use durable_shared::{TaskInfo, TaskStatus};
use leptos::prelude::*;
use serde::{Deserialize, Serialize};

use crate::mcp::tab_storage;

/// Timeline entries kept per task.
const TIMELINE_LIMIT: usize = 200;
/// How long after a timeline change they are saved: a burst of events is written once, not
/// once per event (the page saves at once when it goes, too).
const SAVE_DELAY_MS: u64 = 500;
/// Where the timelines are kept: in `sessionStorage`, so each tab keeps its own (they follow
/// its own session's events) through reloads, and they go with the tab.
const TIMELINE_KEY: &str = "durable-mcp/timelines";

/// The current UTC time of day, formatted like task timestamps.
/// How times are shown in the timeline.
fn clock(time: chrono::DateTime<chrono::Utc>) -> String {
    time.format("%H:%M:%S%.3f").to_string()
}

/// How the standalone stream stands.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Conn {
    Connecting,
    Connected,
    /// Reconnecting after a drop; the attempt number.
    Reconnecting(u32),
    /// Reconnected, receiving the events missed meanwhile; how many so far.
    Replaying(u32),
    /// The browser reports no network.
    Offline,
}

impl Conn {
    pub fn label(self) -> String {
        match self {
            Conn::Connecting => "connecting".into(),
            Conn::Connected => "connected".into(),
            Conn::Reconnecting(attempt) => format!("reconnecting (attempt {attempt})"),
            Conn::Replaying(count) => format!("replaying {count} missed events"),
            Conn::Offline => "offline".into(),
        }
    }

    pub fn class(self) -> &'static str {
        match self {
            Conn::Connected => "conn ok",
            Conn::Replaying(_) | Conn::Connecting => "conn busy",
            Conn::Reconnecting(_) | Conn::Offline => "conn bad",
        }
    }
}

/// One event of a task's timeline, as received on the stream.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TimelineEntry {
    pub event_id: String,
    pub at: String,
    pub status: TaskStatus,
    pub progress: u64,
    pub total: u64,
    pub message: String,
}

/// A kind the server starts in the background: its `start_{kind}` tool and the tool's form.
#[derive(Debug, Clone, PartialEq)]
pub struct StartKind {
    pub tool: String,
    pub title: String,
    pub fields: Vec<FormField>,
}

/// An action's error, as shown until dismissed.
#[derive(Debug, Clone, PartialEq)]
pub struct ActionError {
    pub id: u64,
    pub text: String,
}

/// All reactive state, cheap to copy into closures.
#[derive(Clone, Copy)]
pub struct Dashboard {
    pub conn: RwSignal<Conn>,
    /// Every task shown, each in its own signal (see the module's comment).
    pub tasks: RwSignal<HashMap<String, RwSignal<TaskInfo>>>,
    /// How many tasks have each status.
    pub counts: RwSignal<BTreeMap<TaskStatus, usize>>,
    /// Changes whenever some task's status does: what filters by status follows it, rather than
    /// every task's signal.
    pub status_changes: RwSignal<u64>,
    pub timelines: RwSignal<HashMap<String, Vec<TimelineEntry>>>,
    pub selected: RwSignal<Option<String>>,
    /// The start forms, read from the server's `tools/list`.
    pub kinds: RwSignal<Vec<StartKind>>,
    /// The connection's trouble, for the banner (cleared when the stream is back).
    pub notice: RwSignal<Option<String>>,
    /// Errors of actions the user took, oldest first, each shown until dismissed.
    pub errors: RwSignal<Vec<ActionError>>,
    /// The server wants a bearer token (none was given, or it was refused): why. The sign-in
    /// form shows while it is set.
    pub sign_in: RwSignal<Option<String>>,
    /// Whether a token is in use (the header offers to sign out).
    pub signed_in: RwSignal<bool>,
}

impl Dashboard {
    /// A fresh dashboard with this tab's saved timelines.
    pub fn restore() -> Dashboard {
        let saved = tab_storage()
            .and_then(|s| s.get_item(TIMELINE_KEY).ok().flatten())
            .and_then(|json| serde_json::from_str(&json).ok())
            .unwrap_or_default();
        let dash = Dashboard {
            conn: RwSignal::new(Conn::Connecting),
            tasks: RwSignal::new(HashMap::new()),
            counts: RwSignal::new(BTreeMap::new()),
            status_changes: RwSignal::new(0),
            timelines: RwSignal::new(saved),
            selected: RwSignal::new(None),
            kinds: RwSignal::new(Vec::new()),
            notice: RwSignal::new(None),
            errors: RwSignal::new(Vec::new()),
            sign_in: RwSignal::new(None),
            signed_in: RwSignal::new(crate::mcp::token().is_some()),
        };
        // A save still waiting when the page goes (reload, navigation, closed tab) is made now.
        let save_now = wasm_bindgen::closure::Closure::<dyn Fn()>::new(move || {
            if SAVE_PENDING.get() {
                dash.save_timelines();
            }
        });
        let _ = window().add_event_listener_with_callback(
            "pagehide",
            wasm_bindgen::JsCast::unchecked_ref(save_now.as_ref()),
        );
        // Listens for the page's whole life.
        save_now.forget();
        dash
    }

    /// Shows the error of an action the user took, until they dismiss it.
    pub fn report(&self, text: String) {
        self.errors.update(|errors| {
            let id = errors.last().map_or(0, |last| last.id + 1);
            errors.push(ActionError { id, text });
        });
    }

    /// Removes error `id` from view.
    pub fn dismiss(&self, id: u64) {
        self.errors
            .update(|errors| errors.retain(|error| error.id != id));
    }

    /// Replaces every task with a fresh read of the whole list; timelines of tasks no longer
    /// there are dropped.
    pub fn replace_tasks(&self, list: Vec<TaskInfo>) {
        let mut fresh: HashMap<String, TaskInfo> =
            list.into_iter().map(|t| (t.task_id.clone(), t)).collect();
        let mut gone = Vec::new();
        self.tasks.update(|tasks| {
            tasks.retain(|id, signal| match fresh.remove(id) {
                Some(task) => {
                    if signal.with_untracked(|known| *known != task) {
                        signal.set(task);
                    }
                    true
                }
                None => {
                    gone.push(*signal);
                    false
                }
            });
            tasks.extend(
                fresh
                    .into_iter()
                    .map(|(id, task)| (id, RwSignal::new(task))),
            );
        });
        // Disposed once the rows that read them are gone: the views update after this turn.
        if !gone.is_empty() {
            set_timeout(
                move || gone.into_iter().for_each(|signal| signal.dispose()),
                std::time::Duration::ZERO,
            );
        }
        self.recount();
        let pruned = self.tasks.with_untracked(|tasks| {
            let mut pruned = false;
            self.timelines.update(|timelines| {
                let before = timelines.len();
                timelines.retain(|id, _| tasks.contains_key(id));
                pruned = timelines.len() != before;
            });
            pruned
        });
        if pruned {
            self.schedule_save();
        }
    }

    /// Counts the tasks per status again, from scratch.
    fn recount(&self) {
        let counts = self.tasks.with_untracked(|tasks| {
            let mut counts = BTreeMap::new();
            for task in tasks.values() {
                *counts.entry(task.with_untracked(|t| t.status)).or_default() += 1;
            }
            counts
        });
        self.counts.set(counts);
        self.status_changes.update(|n| *n += 1);
    }

    /// Moves one task from status `from` (none: a new task) to status `to` in the counts.
    fn count_move(&self, from: Option<TaskStatus>, to: TaskStatus) {
        if from == Some(to) {
            return;
        }
        self.counts.update(|counts| {
            if let Some(from) = from
                && let Some(count) = counts.get_mut(&from)
            {
                *count = count.saturating_sub(1);
            }
            *counts.entry(to).or_default() += 1;
        });
        self.status_changes.update(|n| *n += 1);
    }

    /// The task `id`'s signal, if it is shown (not tracked: a row follows its own signal).
    pub fn task(&self, id: &str) -> Option<RwSignal<TaskInfo>> {
        self.tasks.with_untracked(|tasks| tasks.get(id).copied())
    }

    /// Takes a task snapshot unless a newer one is already shown. Only the task's own signal
    /// changes, unless the task is new.
    pub fn upsert(&self, task: TaskInfo) {
        match self.task(&task.task_id) {
            Some(signal) => {
                let known = signal.with_untracked(|known| {
                    ((known.updated_at, known.step) <= (task.updated_at, task.step)
                        && *known != task)
                        .then_some(known.status)
                });
                if let Some(was) = known {
                    let status = task.status;
                    signal.set(task);
                    self.count_move(Some(was), status);
                }
            }
            None => {
                self.count_move(None, task.status);
                self.tasks.update(|tasks| {
                    tasks.insert(task.task_id.clone(), RwSignal::new(task));
                });
            }
        }
    }

    /// Forgets every task (signing out: the tasks were the signed-in subject's).
    pub fn clear_tasks(&self) {
        self.replace_tasks(Vec::new());
    }

    /// Applies a change received as event `event_id`: updates the task and appends it to the
    /// task's timeline once (a replayed event id is recognised and not added twice).
    pub fn apply_event(&self, event_id: &str, task: TaskInfo) {
        let entry = TimelineEntry {
            event_id: event_id.to_owned(),
            at: clock(task.updated_at),
            status: task.status,
            progress: task.progress,
            total: task.total,
            message: task.message.clone(),
        };
        let id = task.task_id.clone();
        self.upsert(task);
        self.record(id, entry);
    }

    /// Adds a milestone (a log line about a task) received as event `event_id` to its timeline.
    pub fn apply_milestone(&self, event_id: &str, task_id: &str, status: TaskStatus, text: &str) {
        let (progress, total) = self.task(task_id).map_or((0, 0), |task| {
            task.with_untracked(|t| (t.progress, t.total))
        });
        let entry = TimelineEntry {
            event_id: event_id.to_owned(),
            at: clock(
                chrono::DateTime::from_timestamp_millis(js_sys::Date::now() as i64)
                    .unwrap_or_default(),
            ),
            status,
            progress,
            total,
            message: text.to_owned(),
        };
        self.record(task_id.to_owned(), entry);
    }

    fn record(&self, id: String, entry: TimelineEntry) {
        self.timelines.update(|timelines| {
            let timeline = timelines.entry(id).or_default();
            if timeline
                .iter()
                .any(|known| known.event_id == entry.event_id)
            {
                return;
            }
            timeline.push(entry);
            if timeline.len() > TIMELINE_LIMIT {
                timeline.remove(0);
            }
        });
        self.schedule_save();
    }

    /// Saves the timelines soon, once for all the changes made until then.
    fn schedule_save(&self) {
        if SAVE_PENDING.replace(true) {
            return;
        }
        let dash = *self;
        set_timeout(
            move || dash.save_timelines(),
            std::time::Duration::from_millis(SAVE_DELAY_MS),
        );
    }

    fn save_timelines(&self) {
        SAVE_PENDING.set(false);
        let json = self
            .timelines
            .with_untracked(|timelines| serde_json::to_string(timelines).unwrap_or_default());
        if let Some(storage) = tab_storage() {
            let _ = storage.set_item(TIMELINE_KEY, &json);
        }
    }

    /// How many tasks have `status`.
    pub fn count(&self, status: TaskStatus) -> usize {
        self.counts
            .with(|counts| counts.get(&status).copied().unwrap_or(0))
    }
}

thread_local! {
    /// Whether a save of the timelines is scheduled (the page has one dashboard).
    static SAVE_PENDING: Cell<bool> = const { Cell::new(false) };
}
