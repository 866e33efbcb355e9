//! The lifecycle of a task.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// Where a task is in its life. `completed`, `failed` and `cancelled` are terminal: once a task
/// reaches one of them its status never changes again.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TaskStatus {
    /// Accepted and checkpointed, waiting for a worker slot (or for the server to start).
    Pending,
    /// A worker is advancing it step by step.
    Running,
    /// Stopped at a step boundary on request; its checkpoint is kept for `resume`.
    Paused,
    /// Waiting for a person's answer to its question (`TaskInfo::question`), without a worker,
    /// for as long as it takes; the answer makes it `pending` again.
    #[serde(rename = "input_required")]
    InputRequired,
    Completed,
    Failed,
    Cancelled,
}

impl TaskStatus {
    pub const ALL: [TaskStatus; 7] = [
        TaskStatus::Pending,
        TaskStatus::Running,
        TaskStatus::Paused,
        TaskStatus::InputRequired,
        TaskStatus::Completed,
        TaskStatus::Failed,
        TaskStatus::Cancelled,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            TaskStatus::Pending => "pending",
            TaskStatus::Running => "running",
            TaskStatus::Paused => "paused",
            TaskStatus::InputRequired => "input_required",
            TaskStatus::Completed => "completed",
            TaskStatus::Failed => "failed",
            TaskStatus::Cancelled => "cancelled",
        }
    }

    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            TaskStatus::Completed | TaskStatus::Failed | TaskStatus::Cancelled
        )
    }
}

impl fmt::Display for TaskStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What a client may ask of a task (the `pause_task`, `resume_task` and `cancel_task` tools),
/// each allowed only from some statuses: the one table of these rules, which the engine applies
/// as conditional updates and the tests check the store against.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Steer {
    /// Stop at a step boundary, keeping the checkpoint.
    Pause,
    /// Continue a paused task from its checkpoint (it waits for a worker as `pending`).
    Resume,
    /// Stop for good.
    Cancel,
}

impl Steer {
    pub const ALL: [Steer; 3] = [Steer::Pause, Steer::Resume, Steer::Cancel];

    /// The verb, as error messages say it ("cannot pause task …").
    pub fn as_str(self) -> &'static str {
        match self {
            Steer::Pause => "pause",
            Steer::Resume => "resume",
            Steer::Cancel => "cancel",
        }
    }

    /// The statuses it is allowed from; from any other it is refused and changes nothing.
    /// No terminal status is among them: a finished task is never steered.
    pub fn from(self) -> &'static [TaskStatus] {
        match self {
            Steer::Pause => &[TaskStatus::Pending, TaskStatus::Running],
            Steer::Resume => &[TaskStatus::Paused],
            Steer::Cancel => &[
                TaskStatus::Pending,
                TaskStatus::Running,
                TaskStatus::Paused,
                TaskStatus::InputRequired,
            ],
        }
    }

    /// The status it leaves the task in.
    pub fn to(self) -> TaskStatus {
        match self {
            Steer::Pause => TaskStatus::Paused,
            Steer::Resume => TaskStatus::Pending,
            Steer::Cancel => TaskStatus::Cancelled,
        }
    }

    pub fn allowed_from(self, status: TaskStatus) -> bool {
        self.from().contains(&status)
    }
}

/// A status name that is not one of [`TaskStatus::ALL`]; its message lists the valid ones.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownStatus(pub String);

impl fmt::Display for UnknownStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let valid: Vec<&str> = TaskStatus::ALL.iter().map(|s| s.as_str()).collect();
        write!(
            f,
            "unknown task status {:?}; valid statuses are: {}",
            self.0,
            valid.join(", ")
        )
    }
}

impl std::error::Error for UnknownStatus {}

impl FromStr for TaskStatus {
    type Err = UnknownStatus;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        TaskStatus::ALL
            .into_iter()
            .find(|status| status.as_str().eq_ignore_ascii_case(s.trim()))
            .ok_or_else(|| UnknownStatus(s.to_owned()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_through_serde_and_from_str() {
        for status in TaskStatus::ALL {
            let json = serde_json::to_string(&status).unwrap();
            assert_eq!(json, format!("\"{}\"", status.as_str()));
            assert_eq!(status.as_str().parse::<TaskStatus>().unwrap(), status);
        }
    }

    #[test]
    fn unknown_status_lists_the_valid_ones() {
        let err = "done".parse::<TaskStatus>().unwrap_err();
        assert_eq!(
            err.to_string(),
            "unknown task status \"done\"; valid statuses are: pending, running, paused, input_required, completed, failed, cancelled"
        );
    }

    /// The steering rules, spelled out pair by pair: `X` where the request is applied.
    #[test]
    fn steering_table() {
        use TaskStatus::*;
        let table = [
            // pending running paused input_required completed failed cancelled
            (
                Steer::Pause,
                [true, true, false, false, false, false, false],
                Paused,
            ),
            (
                Steer::Resume,
                [false, false, true, false, false, false, false],
                Pending,
            ),
            (
                Steer::Cancel,
                [true, true, true, true, false, false, false],
                Cancelled,
            ),
        ];
        for (steer, allowed, to) in table {
            for (status, allowed) in TaskStatus::ALL.into_iter().zip(allowed) {
                assert_eq!(
                    steer.allowed_from(status),
                    allowed,
                    "{} from {status}",
                    steer.as_str()
                );
                assert!(
                    !(allowed && status.is_terminal()),
                    "a terminal status is left"
                );
            }
            assert_eq!(steer.to(), to);
        }
        assert_eq!(Steer::ALL.map(Steer::as_str), ["pause", "resume", "cancel"]);
    }

    #[test]
    fn only_completed_failed_and_cancelled_are_terminal() {
        let terminal: Vec<_> = TaskStatus::ALL
            .into_iter()
            .filter(|s| s.is_terminal())
            .collect();
        assert_eq!(
            terminal,
            [
                TaskStatus::Completed,
                TaskStatus::Failed,
                TaskStatus::Cancelled
            ]
        );
    }
}
