//! The finished tasks read or finished lately, kept in memory.
//!
//! A task in a terminal status never changes again: no steer leaves one (the terminal rule of
//! `Steer`), no step commits to one (commits need `running`), and no other write touches its
//! row until retention deletes it. So its stored state can be answered without the store, which
//! is what a client polling a finished task's status, a dashboard re-reading a result, or
//! `tasks/result` ask most. Unfinished tasks are never kept: their state lives in the store,
//! where every node of a fleet commits it.
//!
//! Retention is the one way a finished task goes away. A kept task is served only while its
//! completion is within this node's retention, the same rule the sweep deletes by, so the cache
//! never answers for a task this node's sweep would have deleted; a purge also forgets what it
//! deleted at once. (A fleet node given a shorter `--retention` than this one deletes sooner;
//! this node then answers for such a task until its own retention passes, as it would from a
//! row its own sweep had not yet reached.)

use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use durable_shared::TaskInfo;
use hashlink::LruCache;

use super::{TaskEvent, retention_cutoff};

/// Finished tasks kept at most, the least recently used dropped first. A task's JSON is a few
/// hundred bytes to a few KiB (its parameters and result), so this is a few MiB at most.
const CAPACITY: usize = 4096;

pub(super) struct Finished {
    /// A std mutex: held for one map operation, never across an await.
    tasks: Mutex<Kept>,
}

struct Kept {
    /// The event that announced each task's end, shared with its broadcast: keeping it costs a
    /// reference count, not a copy of the task (its parameters and result with it).
    tasks: LruCache<String, Arc<TaskEvent>>,
    /// The retention the sweep deletes by, once it runs (`None`: nothing is ever deleted).
    retention: Option<Duration>,
}

impl Finished {
    pub(super) fn new() -> Self {
        Finished {
            tasks: Mutex::new(Kept {
                tasks: LruCache::new(CAPACITY),
                retention: None,
            }),
        }
    }

    /// The kept state of finished task `id`, unless retention may have deleted it.
    pub(super) fn get(&self, id: &str) -> Option<TaskInfo> {
        let mut kept = self.tasks.lock().expect("finished tasks lock");
        let cutoff = kept
            .retention
            .map(|retention| retention_cutoff(Utc::now(), retention));
        let task = &kept.tasks.get(id)?.task;
        match (cutoff, task.completed_at) {
            (Some(cutoff), Some(completed)) if completed < cutoff => {
                kept.tasks.remove(id);
                None
            }
            _ => Some(task.clone()),
        }
    }

    /// Keeps the task of `event` if it is finished; anything else is left to the store.
    pub(super) fn keep(&self, event: &Arc<TaskEvent>) {
        if event.task.status.is_terminal() {
            let mut kept = self.tasks.lock().expect("finished tasks lock");
            kept.tasks.insert(event.task.task_id.clone(), event.clone());
        }
    }

    /// The sweep deletes by `retention` from now on.
    pub(super) fn set_retention(&self, retention: Duration) {
        self.tasks.lock().expect("finished tasks lock").retention = Some(retention);
    }

    /// Forgets every task that finished before `cutoff`: a purge deleted them.
    pub(super) fn forget_before(&self, cutoff: DateTime<Utc>) {
        let mut kept = self.tasks.lock().expect("finished tasks lock");
        kept.tasks.retain(|_, ended| {
            ended
                .task
                .completed_at
                .is_none_or(|completed| completed >= cutoff)
        });
    }
}

#[cfg(test)]
mod tests {
    use durable_shared::TaskStatus;
    use serde_json::json;

    use super::*;

    fn task(id: &str, status: TaskStatus, completed_at: Option<DateTime<Utc>>) -> TaskInfo {
        let now = Utc::now();
        TaskInfo {
            task_id: id.to_owned(),
            status,
            progress: 1,
            total: 1,
            message: String::new(),
            result_data: None,
            error: None,
            created_at: now,
            updated_at: now,
            completed_at,
            kind: "batch_processing".to_owned(),
            parameters: json!({}),
            owner: "o".to_owned(),
            step: 1,
            percent: 100.0,
            node: None,
            question: None,
        }
    }

    fn ended(task: TaskInfo) -> Arc<TaskEvent> {
        Arc::new(TaskEvent::changed(task))
    }

    #[test]
    fn only_finished_tasks_are_kept() {
        let finished = Finished::new();
        let now = Some(Utc::now());
        finished.keep(&ended(task("running", TaskStatus::Running, None)));
        finished.keep(&ended(task("paused", TaskStatus::Paused, None)));
        finished.keep(&ended(task("done", TaskStatus::Completed, now)));
        finished.keep(&ended(task("failed", TaskStatus::Failed, now)));
        assert!(finished.get("running").is_none());
        assert!(finished.get("paused").is_none());
        assert_eq!(finished.get("done").unwrap().status, TaskStatus::Completed);
        assert_eq!(finished.get("failed").unwrap().status, TaskStatus::Failed);
    }

    #[test]
    fn a_task_past_retention_or_purged_is_not_served() {
        let finished = Finished::new();
        let hour_ago = Utc::now() - chrono::TimeDelta::hours(1);
        finished.keep(&ended(task("old", TaskStatus::Completed, Some(hour_ago))));
        finished.keep(&ended(task("new", TaskStatus::Completed, Some(Utc::now()))));
        assert!(finished.get("old").is_some(), "no retention yet: kept");
        finished.set_retention(Duration::from_secs(60));
        assert!(finished.get("old").is_none(), "past retention");
        assert!(finished.get("new").is_some());
        finished.forget_before(Utc::now() + chrono::TimeDelta::seconds(1));
        assert!(finished.get("new").is_none(), "purged");
    }

    #[test]
    fn the_least_recently_used_goes_first() {
        let finished = Finished::new();
        let now = Some(Utc::now());
        for n in 0..=CAPACITY {
            finished.keep(&ended(task(&n.to_string(), TaskStatus::Completed, now)));
            if n == 0 {
                continue;
            }
            // Task 0 is read each time, so it stays; task 1 is the oldest unread one.
            assert!(finished.get("0").is_some());
        }
        assert!(finished.get("1").is_none());
        assert!(finished.get(&CAPACITY.to_string()).is_some());
    }
}
