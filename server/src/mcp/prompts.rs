//! Prompts: `task_report`, which hands a model the live state of one task with instructions to
//! explain it and suggest the next step.

use durable_shared::{TaskInfo, status_uri};
use rmcp::ErrorData as McpError;
use rmcp::model::{
    GetPromptRequestParams, GetPromptResult, Prompt, PromptArgument, PromptMessage, Resource, Role,
};

const TASK_REPORT: &str = "task_report";

pub fn listed() -> Vec<Prompt> {
    vec![Prompt::new(
        TASK_REPORT,
        Some("Explain where a durable task stands and what to do next"),
        Some(vec![
            PromptArgument::new("task_id")
                .with_description("The task's id (the last part of its task://status link)")
                .with_required(true),
        ]),
    )]
}

/// The task a `prompts/get` request names, once the prompt is known to be `task_report`.
pub fn task_id(request: &GetPromptRequestParams) -> Result<&str, McpError> {
    if request.name != TASK_REPORT {
        return Err(McpError::invalid_params(
            format!(
                "unknown prompt {:?}; this server offers {TASK_REPORT:?}",
                request.name
            ),
            None,
        ));
    }
    request
        .arguments
        .as_ref()
        .and_then(|arguments| arguments.get("task_id"))
        .and_then(|value| value.as_str())
        .ok_or_else(|| McpError::invalid_params("task_report needs the argument task_id", None))
}

/// The `task_report` prompt on `task`.
pub fn report(task: TaskInfo) -> GetPromptResult {
    let task_id = &task.task_id;
    let uri = status_uri(task_id);
    let state = serde_json::to_string_pretty(&task).unwrap_or_default();
    let text = format!(
        "Here is the current state of durable task {task_id} ({uri}):\n\n```json\n{state}\n```\n\n\
         Summarize its progress in a sentence or two. Say whether it needs attention (failed, \
         paused or cancelled) and which tool would continue or inspect it: resume_task, \
         pause_task, cancel_task, or reading {uri} again."
    );
    let link = Resource::new(uri.clone(), format!("{} task {task_id}", task.kind))
        .with_mime_type("application/json");
    GetPromptResult::new(vec![
        PromptMessage::new_text(Role::User, text),
        PromptMessage::new_resource_link(Role::User, link),
    ])
    .with_description(format!("Report on {} task {task_id}", task.kind))
}
