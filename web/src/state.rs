//! The dashboard's state: tasks as the server last described them, the event timeline of each
//! task (persisted per tab, so a reload continues it), and the connection state.

use std::collections::{BTreeMap, HashMap};

use durable_shared::form::FormField;
use durable_shared::{TaskInfo, TaskStatus};
use leptos::prelude::*;
use serde::{Deserialize, Serialize};

use crate::mcp::tab_storage;

/// Timeline entries kept per task.
const TIMELINE_LIMIT: usize = 200;
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
    pub tasks: RwSignal<BTreeMap<String, TaskInfo>>,
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
        Dashboard {
            conn: RwSignal::new(Conn::Connecting),
            tasks: RwSignal::new(BTreeMap::new()),
            timelines: RwSignal::new(saved),
            selected: RwSignal::new(None),
            kinds: RwSignal::new(Vec::new()),
            notice: RwSignal::new(None),
            errors: RwSignal::new(Vec::new()),
            sign_in: RwSignal::new(None),
            signed_in: RwSignal::new(crate::mcp::token().is_some()),
        }
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
        self.tasks.update(|tasks| {
            tasks.clear();
            tasks.extend(list.into_iter().map(|t| (t.task_id.clone(), t)));
        });
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
            self.save_timelines();
        }
    }

    /// Takes a task snapshot unless a newer one is already shown.
    pub fn upsert(&self, task: TaskInfo) {
        self.tasks.update(|tasks| {
            let newer = tasks
                .get(&task.task_id)
                .is_some_and(|known| (known.updated_at, known.step) > (task.updated_at, task.step));
            if !newer {
                tasks.insert(task.task_id.clone(), task);
            }
        });
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
        let (progress, total) = self
            .tasks
            .with_untracked(|tasks| tasks.get(task_id).map_or((0, 0), |t| (t.progress, t.total)));
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
        self.save_timelines();
    }

    fn save_timelines(&self) {
        let json = self
            .timelines
            .with_untracked(|timelines| serde_json::to_string(timelines).unwrap_or_default());
        if let Some(storage) = tab_storage() {
            let _ = storage.set_item(TIMELINE_KEY, &json);
        }
    }

    /// Tasks per status.
    pub fn counts(&self) -> Vec<(TaskStatus, usize)> {
        self.tasks.with(|tasks| {
            TaskStatus::ALL
                .into_iter()
                .map(|status| {
                    (
                        status,
                        tasks.values().filter(|t| t.status == status).count(),
                    )
                })
                .collect()
        })
    }
}
