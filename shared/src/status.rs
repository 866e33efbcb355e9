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
    Completed,
    Failed,
    Cancelled,
}

impl TaskStatus {
    pub const ALL: [TaskStatus; 6] = [
        TaskStatus::Pending,
        TaskStatus::Running,
        TaskStatus::Paused,
        TaskStatus::Completed,
        TaskStatus::Failed,
        TaskStatus::Cancelled,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            TaskStatus::Pending => "pending",
            TaskStatus::Running => "running",
            TaskStatus::Paused => "paused",
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
            "unknown task status \"done\"; valid statuses are: pending, running, paused, completed, failed, cancelled"
        );
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
