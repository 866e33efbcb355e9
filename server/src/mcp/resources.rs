//! The task resources: `task://status/{task_id}`, `task://list` and `task://list/{status}`.

use durable_shared::{TaskInfo, TaskList, TaskStatus, list_uri};
use rmcp::ErrorData as McpError;
use rmcp::model::{ReadResourceResult, Resource, ResourceContents, ResourceTemplate};

use super::Caller;
use super::error::ApiError;
use crate::engine::{Engine, EngineError};

/// Tasks a list resource shows at most, newest first.
pub const LIST_LIMIT: usize = 500;

const STATUS_PREFIX: &str = "task://status/";
const LIST_PREFIX: &str = "task://list/";

/// A parsed task resource URI.
#[derive(Debug, PartialEq)]
pub(super) enum TaskUri<'a> {
    Status(&'a str),
    List(Option<TaskStatus>),
}

pub(super) fn parse(uri: &str) -> Result<TaskUri<'_>, McpError> {
    if let Some(id) = uri.strip_prefix(STATUS_PREFIX) {
        if id.is_empty() {
            return Err(McpError::invalid_params(
                "task://status/{task_id} needs a task id",
                None,
            ));
        }
        return Ok(TaskUri::Status(id));
    }
    if uri == "task://list" {
        return Ok(TaskUri::List(None));
    }
    if let Some(status) = uri.strip_prefix(LIST_PREFIX) {
        let status = status
            .parse::<TaskStatus>()
            .map_err(|e| McpError::invalid_params(e.to_string(), None))?;
        return Ok(TaskUri::List(Some(status)));
    }
    Err(McpError::resource_not_found(
        format!(
            "unknown resource {uri:?}; this server serves task://status/{{task_id}}, task://list \
             and task://list/{{status}}"
        ),
        None,
    ))
}

pub fn listed() -> Vec<Resource> {
    vec![
        Resource::new("task://list", "All tasks")
            .with_description("Every task, newest first, with status, progress and result")
            .with_mime_type("application/json"),
    ]
}

pub fn templates() -> Vec<ResourceTemplate> {
    let statuses: Vec<&str> = TaskStatus::ALL.iter().map(|s| s.as_str()).collect();
    vec![
        ResourceTemplate::new("task://status/{task_id}", "Task status")
            .with_description(
                "One task: status, progress, message, parameters, owner, result or error",
            )
            .with_mime_type("application/json"),
        ResourceTemplate::new("task://list/{status}", "Tasks by status")
            .with_description(format!("Tasks with one status: {}", statuses.join(", ")))
            .with_mime_type("application/json"),
    ]
}

fn not_found(id: &str) -> ApiError {
    ApiError::ResourceNotFound(format!("task {id} not found"))
}

/// A task the caller may see; another owner's is as unknown as one that does not exist.
async fn visible(engine: &Engine, caller: &Caller, id: &str) -> Result<TaskInfo, ApiError> {
    match engine.get(id).await {
        Ok(task) if caller.may_see(&task.owner) => Ok(task),
        Ok(_) | Err(EngineError::NotFound(_)) => Err(not_found(id)),
        Err(other) => Err(other.into()),
    }
}

pub async fn read(
    engine: &Engine,
    caller: &Caller,
    uri: &str,
) -> Result<ReadResourceResult, McpError> {
    let body = match parse(uri)? {
        TaskUri::Status(id) => serde_json::to_string_pretty(&visible(engine, caller, id).await?),
        TaskUri::List(status) => {
            let tasks = engine.list(caller.filter(), status, LIST_LIMIT).await?;
            serde_json::to_string_pretty(&TaskList {
                total: tasks.len(),
                tasks,
                status_filter: status,
            })
        }
    }
    .map_err(|e| McpError::internal_error(e.to_string(), None))?;
    Ok(ReadResourceResult::new(vec![
        ResourceContents::text(body, uri).with_mime_type("application/json"),
    ]))
}

/// Refuses subscriptions to `task://` URIs that can never change: malformed ones, unknown
/// statuses and unknown tasks (another owner's among them). URIs of other schemes are accepted and simply never notified:
/// this server changes only `task://` resources, and generic clients (the conformance suite
/// among them) expect a subscription to any URI to succeed.
pub async fn check_subscribable(
    engine: &Engine,
    caller: &Caller,
    uri: &str,
) -> Result<(), McpError> {
    if !uri.starts_with("task://") {
        return Ok(());
    }
    if let TaskUri::Status(id) = parse(uri)? {
        visible(engine, caller, id).await?;
    }
    Ok(())
}

/// Whether `uri` is one of the list resources.
pub fn is_list(uri: &str) -> bool {
    uri == "task://list" || uri.starts_with(LIST_PREFIX)
}

/// The resources whose content changed when a task moved from `before` (if known) to `task`.
pub fn affected_by(task_id: &str, before: Option<TaskStatus>, now: TaskStatus) -> Vec<String> {
    let mut uris = vec![
        durable_shared::status_uri(task_id),
        list_uri(None),
        list_uri(Some(now)),
    ];
    match before {
        Some(before) if before != now => uris.push(list_uri(Some(before))),
        Some(_) => {}
        // Not seen before by this session: any status list may have held it.
        None => uris.extend(
            TaskStatus::ALL
                .into_iter()
                .filter(|status| *status != now)
                .map(|status| list_uri(Some(status))),
        ),
    }
    uris
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uris_parse_and_unknown_statuses_list_the_valid_ones() {
        assert_eq!(parse("task://status/abc").unwrap(), TaskUri::Status("abc"));
        assert_eq!(parse("task://list").unwrap(), TaskUri::List(None));
        assert_eq!(
            parse("task://list/paused").unwrap(),
            TaskUri::List(Some(TaskStatus::Paused))
        );
        let err = parse("task://list/done").unwrap_err();
        assert!(
            err.message.contains("valid statuses are: pending, running"),
            "{err:?}"
        );
        assert!(parse("file:///etc/passwd").is_err());
    }

    #[test]
    fn a_status_change_touches_both_status_lists() {
        let uris = affected_by("t", Some(TaskStatus::Running), TaskStatus::Paused);
        assert_eq!(
            uris,
            [
                "task://status/t",
                "task://list",
                "task://list/paused",
                "task://list/running"
            ]
        );
    }
}
