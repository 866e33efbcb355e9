//! The task resources: `task://status/{task_id}`, `task://list` and `task://list/{status}`.

use durable_shared::{LIST_AFTER_PARAM, TaskInfo, TaskList, TaskStatus, list_page_uri, list_uri};
use rmcp::ErrorData as McpError;
use rmcp::model::{ReadResourceResult, Resource, ResourceContents, ResourceTemplate};

use super::Caller;
use super::error::ApiError;
use crate::engine::{Engine, EngineError};

/// Tasks a list resource shows at most, newest first: one page; its `next_page` reads on.
pub const LIST_LIMIT: usize = 500;

const STATUS_PREFIX: &str = "task://status/";
const LIST_PREFIX: &str = "task://list/";

/// A parsed task resource URI.
#[derive(Debug, PartialEq)]
pub(super) enum TaskUri<'a> {
    Status(&'a str),
    /// A list of tasks, one status's or all, from its start or after a `(created_at ms, task
    /// id)` position (a later page).
    List(Option<TaskStatus>, Option<(i64, String)>),
}

pub(super) fn parse(uri: &str) -> Result<TaskUri<'_>, McpError> {
    if uri.starts_with("task://list")
        && let Some((list, query)) = uri.split_once('?')
    {
        let TaskUri::List(status, None) = parse(list)? else {
            unreachable!("a task://list URI without a query is a list");
        };
        return Ok(TaskUri::List(status, Some(page_position(query)?)));
    }
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
        return Ok(TaskUri::List(None, None));
    }
    if let Some(status) = uri.strip_prefix(LIST_PREFIX) {
        let status = status
            .parse::<TaskStatus>()
            .map_err(|e| McpError::invalid_params(e.to_string(), None))?;
        return Ok(TaskUri::List(Some(status), None));
    }
    Err(McpError::resource_not_found(
        format!(
            "unknown resource {uri:?}; this server serves task://status/{{task_id}}, task://list \
             and task://list/{{status}}"
        ),
        None,
    ))
}

/// The position a page URI's query (`after={created_at ms}.{task id}`, as a list's
/// `next_page` writes it) reads after.
fn page_position(query: &str) -> Result<(i64, String), McpError> {
    let bad = || {
        McpError::invalid_params(
            format!(
                "a task list's query must be {LIST_AFTER_PARAM}={{created_at ms}}.{{task id}}, as \
                 its next_page gives it; got {query:?}"
            ),
            Some(serde_json::json!({"field": LIST_AFTER_PARAM})),
        )
    };
    let position = query
        .strip_prefix(LIST_AFTER_PARAM)
        .and_then(|rest| rest.strip_prefix('='))
        .ok_or_else(bad)?;
    let (ms, id) = position.split_once('.').ok_or_else(bad)?;
    let ms = ms.parse::<i64>().map_err(|_| bad())?;
    if id.is_empty() {
        return Err(bad());
    }
    Ok((ms, id.to_owned()))
}

pub fn listed() -> Vec<Resource> {
    vec![
        Resource::new("task://list", "All tasks")
            .with_description(
                "Every task, newest first, with status, progress and result, in pages of 500: \
                 a full page's next_page is the URI of the next one",
            )
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
        TaskUri::List(status, after) => {
            // One more than a page: whether a next page exists is known without reading it.
            let mut tasks = engine
                .list(caller.filter(), status, after, LIST_LIMIT + 1)
                .await?;
            let next_page = (tasks.len() > LIST_LIMIT).then(|| {
                tasks.truncate(LIST_LIMIT);
                list_page_uri(status, tasks.last().expect("a full page"))
            });
            serde_json::to_string_pretty(&TaskList {
                total: tasks.len(),
                tasks,
                status_filter: status,
                next_page,
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
    match parse(uri)? {
        TaskUri::Status(id) => {
            visible(engine, caller, id).await?;
        }
        TaskUri::List(_, Some(_)) => {
            return Err(McpError::invalid_params(
                format!(
                    "{uri} is a page of a list, read page by page; subscribe to the list itself \
                     (without ?{LIST_AFTER_PARAM}=), whose updates cover every page"
                ),
                None,
            ));
        }
        TaskUri::List(_, None) => {}
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
        assert_eq!(parse("task://list").unwrap(), TaskUri::List(None, None));
        assert_eq!(
            parse("task://list/paused").unwrap(),
            TaskUri::List(Some(TaskStatus::Paused), None)
        );
        assert_eq!(
            parse("task://list/paused?after=1700000000000.abc.d").unwrap(),
            TaskUri::List(
                Some(TaskStatus::Paused),
                Some((1_700_000_000_000, "abc.d".into()))
            )
        );
        for bad in [
            "task://list?before=1.a",
            "task://list?after=1",
            "task://list?after=x.a",
            "task://list?after=1.",
        ] {
            let err = parse(bad).unwrap_err();
            assert!(
                err.message.contains("after={created_at ms}.{task id}"),
                "{bad}: {err:?}"
            );
            assert_eq!(
                err.data,
                Some(serde_json::json!({"field": "after"})),
                "{bad}"
            );
        }
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
