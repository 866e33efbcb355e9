//! MCP Tasks on the durable engine: a task-augmented `tools/call` answers at once with a task
//! handle whose id is the engine task's id, so the task survives everything the engine's tasks
//! survive, a `kill -9` of the server included.
//!
//! Two shapes of the protocol are served:
//!
//! - The Tasks utility of protocol 2025-11-25 (SEP-1686): the client asks for a task with a
//!   `task: {ttl}` field on `tools/call` and gets `{task}` back; `tasks/get`, `tasks/result`,
//!   `tasks/list` and `tasks/cancel`; `notifications/tasks/status`. rmcp 3.11 no longer models
//!   this shape: its parser drops the `task` field of `tools/call`, refuses `tasks/get` and
//!   `tasks/cancel` from clients without the extension, and its `Tool` has no `execution`. So
//!   the HTTP layer (`http::task_requests`) renames those requests (and `tools/list`) to
//!   server-private methods that [`DurableServer::private_request`] answers in this shape, and
//!   the initialize answer gets the `tasks` capability on its way out (see `http::resume`).
//! - The `io.modelcontextprotocol/tasks` extension (SEP-2663) for clients that declare it:
//!   the server decides to answer a task-capable tool with `CallToolResponse::Task`, and rmcp
//!   dispatches `tasks/get`, `tasks/update` and `tasks/cancel` to the `ServerHandler` methods.
//!
//! Engine statuses map onto MCP statuses as: pending and running are `working`; paused is
//! `working` too (MCP has no paused status; `input_required` would tell the client to send
//! input), with a status message saying it is paused and how to resume it; input_required,
//! completed, failed and cancelled map to themselves. A task waiting for input shows its
//! question in SEP-2663 `tasks/get` as `inputRequests` (an elicitation keyed by the question's
//! id), and `tasks/update` answers it.
//!
//! A handle belongs to the client whose call created it (its `X-Client-Id`, else its session):
//! another client's `tasks/get`, `tasks/result` or `tasks/cancel` is told the task does not exist.

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, SecondsFormat, Utc};
use durable_shared::kinds::{
    DATA_PROCESSING, PROCESSING_TOOL, ParamError, parse_params, task_tool,
};
use durable_shared::{Question, TaskInfo};
use rmcp::handler::server::tool::ToolCallContext;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, CreateTaskResult,
    DetailedTask, ErrorCode, InputRequest, InputRequests, InputRequiredResult, JsonObject,
    ProtocolVersion, ServerResult, Task as McpTask, TaskPayload, TaskStatus as McpStatus, Tool,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData as McpError, RoleServer, ServerHandler};
use serde_json::{Value, json};

use super::error::{ApiError, cannot_cancel};
use super::tools::{ProcessingToolParams, failure, final_outcome, to_params};
use super::{DurableServer, as_sent};
use crate::engine::{Answer, EngineError, KindInfo, TaskHandle};
use crate::streams::negotiated;

/// `_meta` key tying a message to its task (2025-11-25).
const RELATED_TASK_META_KEY: &str = "io.modelcontextprotocol/related-task";
/// Suggested pause between two `tasks/get` of one task: about one step of the task kinds here.
const POLL_INTERVAL_MS: u64 = 1_000;
/// Handles per `tasks/list` page.
const TASKS_PAGE_SIZE: usize = 20;
/// The shortest ttl granted, whatever is asked: a handle must outlive the answer creating it.
const MIN_TTL: Duration = Duration::from_secs(1);

/// How long task handles are kept: `default` when the client does not say, never more than
/// `max` (the engine's retention, so a handle never outlives its task).
#[derive(Debug, Clone, Copy)]
pub struct TaskTtl {
    pub default: Duration,
    pub max: Duration,
}

/// A tool's `execution.taskSupport`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TaskSupport {
    Forbidden,
    Optional,
    Required,
}

impl TaskSupport {
    fn as_str(self) -> &'static str {
        match self {
            TaskSupport::Forbidden => "forbidden",
            TaskSupport::Optional => "optional",
            TaskSupport::Required => "required",
        }
    }
}

/// The `run_{kind}` tool of a background kind: the same arguments as its `start_{kind}` tool,
/// run only as an MCP task whose result is the kind's final report.
pub(super) fn task_only_tool(kind: &KindInfo) -> Tool {
    let start = durable_shared::kinds::start_tool(kind.name);
    let description = format!(
        "Run {title} as an MCP task (task-augmented calls only; {start} is the plain-call form). \
         Same arguments as {start}; the task's result is {result}.",
        title = kind.title.to_lowercase(),
        result = kind.result,
    );
    Tool::new(
        task_tool(kind.name),
        description,
        Arc::new(kind.params_schema.clone()),
    )
    .with_title(format!("{} (task)", kind.title))
}

impl DurableServer {
    /// A tool's `execution.taskSupport`.
    pub fn task_support(&self, tool: &str) -> TaskSupport {
        if tool == PROCESSING_TOOL {
            TaskSupport::Optional
        } else if self.task_kind(tool).is_some() {
            TaskSupport::Required
        } else {
            TaskSupport::Forbidden
        }
    }

    /// The kind a task-only tool runs.
    fn task_kind(&self, tool: &str) -> Option<&'static str> {
        self.shared
            .task_tools
            .iter()
            .find(|(listed, _)| listed.name == tool)
            .map(|(_, kind)| *kind)
    }
}

/// The `capabilities.tasks` object of protocol 2025-11-25, added to initialize answers.
pub fn legacy_capability() -> Value {
    json!({"list": {}, "cancel": {}, "requests": {"tools": {"call": {}}}})
}

/// Whether a session on `requested_version` speaks the 2025-11-25 Tasks utility.
pub(super) fn speaks_legacy_tasks(requested_version: &str) -> bool {
    negotiated(requested_version) >= ProtocolVersion::V_2025_11_25.as_str()
}

/// Server-private methods the 2025-11-25 task requests are renamed to (by the HTTP layer's
/// `task_requests` middleware), answered by `DurableServer::private_request`.
pub const PRIVATE_CALL: &str = "durable-mcp/tasks/call";
pub const PRIVATE_GET: &str = "durable-mcp/tasks/get";
pub const PRIVATE_CANCEL: &str = "durable-mcp/tasks/cancel";
pub const PRIVATE_LIST_TOOLS: &str = "durable-mcp/tools/list";

fn declares_elicitation(ctx: &RequestContext<RoleServer>) -> bool {
    ctx.client_capabilities()
        .is_some_and(|capabilities| capabilities.elicitation.is_some())
}

fn declares_extension(ctx: &RequestContext<RoleServer>) -> bool {
    ctx.client_capabilities()
        .is_some_and(|capabilities| capabilities.supports_tasks())
}

fn iso(time: DateTime<Utc>) -> String {
    time.to_rfc3339_opts(SecondsFormat::Millis, true)
}

/// The MCP status of an engine task and the message shown with it.
fn mcp_status(task: &TaskInfo) -> (McpStatus, String) {
    use durable_shared::TaskStatus as Engine;
    let progress = format!("{}/{}", task.progress, task.total);
    match task.status {
        Engine::Pending | Engine::Running => (McpStatus::Working, task.message.clone()),
        Engine::Paused => (
            McpStatus::Working,
            format!("paused at {progress}; resume_task (or the dashboard) continues it"),
        ),
        Engine::InputRequired => (
            McpStatus::InputRequired,
            task.question
                .as_ref()
                .map_or_else(|| task.message.clone(), |q| q.message.clone()),
        ),
        Engine::Completed => (McpStatus::Completed, task.message.clone()),
        Engine::Failed => (
            McpStatus::Failed,
            task.error.clone().unwrap_or_else(|| task.message.clone()),
        ),
        Engine::Cancelled => (McpStatus::Cancelled, format!("cancelled at {progress}")),
    }
}

/// A handle in the 2025-11-25 `Task` shape.
pub(super) fn legacy_task(handle: &TaskHandle) -> Value {
    let (status, message) = mcp_status(&handle.task);
    json!({
        "taskId": handle.task.task_id,
        "status": status,
        "statusMessage": message,
        "createdAt": iso(handle.task.created_at),
        "lastUpdatedAt": iso(handle.task.updated_at),
        "ttl": handle.ttl_ms,
        "pollInterval": POLL_INTERVAL_MS,
    })
}

/// A handle in the SEP-2663 `Task` shape.
fn extension_task(handle: &TaskHandle) -> McpTask {
    let (status, message) = mcp_status(&handle.task);
    McpTask::new(
        handle.task.task_id.clone(),
        status,
        iso(handle.task.created_at),
        iso(handle.task.updated_at),
    )
    .with_status_message(message)
    .with_ttl_ms(handle.ttl_ms)
    .with_poll_interval_ms(POLL_INTERVAL_MS)
}

/// A handle in the SEP-2663 `DetailedTask` shape: a completed task carries the tool's result,
/// a failed one the error.
pub(super) fn detailed_task(handle: &TaskHandle) -> DetailedTask {
    use durable_shared::TaskStatus as Engine;
    let task = &handle.task;
    let payload = match task.status {
        Engine::Completed => TaskPayload::Completed {
            result: outcome_object(task),
        },
        Engine::Failed => {
            let mut error = JsonObject::new();
            error.insert("code".into(), json!(ErrorCode::INTERNAL_ERROR.0));
            error.insert("message".into(), json!(failure(task)));
            TaskPayload::Failed { error }
        }
        Engine::Cancelled => TaskPayload::Cancelled,
        Engine::InputRequired => match task.question.as_ref().and_then(input_requests) {
            Some(input_requests) => TaskPayload::InputRequired { input_requests },
            None => TaskPayload::Working,
        },
        Engine::Pending | Engine::Running | Engine::Paused => TaskPayload::Working,
    };
    DetailedTask::new(extension_task(handle), payload)
}

/// A task's open question as SEP-2663's `inputRequests`: one form elicitation, keyed by the
/// question's id (unique over the task's life, as the extension requires of keys). `None` if
/// the question's schema is not one an elicitation can carry.
pub(super) fn input_requests(question: &Question) -> Option<InputRequests> {
    let request = json!({
        "method": "elicitation/create",
        "params": {"mode": "form", "message": question.message, "requestedSchema": question.schema},
    });
    match serde_json::from_value::<InputRequest>(request) {
        Ok(request) => Some([(question.id.clone(), request)].into()),
        Err(e) => {
            tracing::error!(question = question.id, error = %e, "a question is no elicitation");
            None
        }
    }
}

/// What a person answered, from an elicitation result (`action`, `content`): `None` when they
/// dismissed the question without answering (`cancel`), which leaves it open.
pub(super) fn elicited_answer(result: &Value) -> Result<Option<Answer>, ApiError> {
    match result["action"].as_str() {
        Some("accept") => match &result["content"] {
            Value::Object(content) => Ok(Some(Answer::Accept(Value::Object(content.clone())))),
            _ => Err(ApiError::InvalidParams(ParamError::new(
                "content",
                "an accepted answer needs its content: an object with the fields the \
                 question's requestedSchema asks for",
            ))),
        },
        Some("decline") => Ok(Some(Answer::Decline)),
        Some("cancel") => Ok(None),
        _ => Err(ApiError::InvalidParams(ParamError::new(
            "action",
            format!(
                "action must be \"accept\", \"decline\" or \"cancel\", got {}",
                result["action"]
            ),
        ))),
    }
}

/// What the task's tool call returns once it has ended: exactly what the plain call answers.
fn outcome_object(task: &TaskInfo) -> JsonObject {
    final_outcome(task)
        .map(|result| as_sent(ServerResult::CallToolResult(result)))
        .unwrap_or_default()
}

fn unknown_task(task_id: &str) -> ApiError {
    ApiError::NotFound(format!(
        "unknown task {task_id}: no task handle with this id belongs to you (handles are kept \
         for their ttl, counted from the task's creation)"
    ))
}

fn call_arguments(call: &CallToolRequestParams) -> Value {
    Value::Object(call.arguments.clone().unwrap_or_default())
}

/// The ttl a 2025-11-25 `task` field asks for, in ms.
fn requested_ttl(field: &Value) -> Result<Option<u64>, ApiError> {
    let invalid = || {
        ApiError::InvalidParams(ParamError::new(
            "task.ttl",
            "task must be an object whose optional ttl is a whole number of milliseconds",
        ))
    };
    let Value::Object(field) = field else {
        return Err(invalid());
    };
    match field.get("ttl") {
        None | Some(Value::Null) => Ok(None),
        Some(ttl) => ttl.as_u64().map(Some).ok_or_else(invalid),
    }
}

impl DurableServer {
    fn granted_ttl(&self, requested_ms: Option<u64>) -> u64 {
        let requested = requested_ms.map_or(self.shared.task_ttl.default, Duration::from_millis);
        requested
            .clamp(MIN_TTL, self.shared.task_ttl.max.max(MIN_TTL))
            .as_millis() as u64
    }

    /// Starts (or, for the processing tool, attaches to) the engine task of a task-augmented
    /// call and gives the caller a handle on it.
    async fn create_task(
        &self,
        call: &CallToolRequestParams,
        ttl_ms: u64,
        ctx: &RequestContext<RoleServer>,
    ) -> Result<TaskHandle, ApiError> {
        let tool = call.name.as_ref();
        let task = if tool == PROCESSING_TOOL {
            let params: ProcessingToolParams = parse_params(PROCESSING_TOOL, call_arguments(call))?;
            let owner = self.caller_named(params.client_id.clone(), ctx)?.owner;
            self.shared
                .engine
                .start_or_attach(DATA_PROCESSING, &owner, to_params(&params.job))
                .await?
        } else {
            let kind = self
                .task_kind(tool)
                .ok_or_else(|| ApiError::invalid(format!("tool {tool} cannot run as a task")))?;
            let owner = self.caller(ctx).owner;
            self.shared
                .engine
                .start(kind, &owner, call_arguments(call))
                .await?
        };
        // Last, so the session remembers the caller's own identity for status notifications.
        let requester = self.caller(ctx).owner;
        let handle = self
            .shared
            .engine
            .attach_handle(&task.task_id, &requester, tool, ttl_ms)
            .await?
            .ok_or_else(|| ApiError::Unavailable("the new task handle expired at once".into()))?;
        self.shared.routes.add_handle(&handle);
        Ok(handle)
    }

    /// The caller's handle on `task_id`; another client's is an unknown task.
    pub(super) async fn owned_handle(
        &self,
        task_id: &str,
        ctx: &RequestContext<RoleServer>,
    ) -> Result<TaskHandle, ApiError> {
        let requester = self.caller(ctx).owner;
        self.shared
            .engine
            .handle(task_id.trim(), &requester)
            .await?
            .ok_or_else(|| unknown_task(task_id))
    }

    /// Cancels the caller's task; a task that has ended is refused (its status never changes).
    pub(super) async fn cancel_owned(
        &self,
        task_id: &str,
        ctx: &RequestContext<RoleServer>,
    ) -> Result<TaskHandle, ApiError> {
        let handle = self.owned_handle(task_id, ctx).await?;
        if handle.task.status.is_terminal() {
            return Err(cannot_cancel(&handle.task.task_id, handle.task.status));
        }
        match self.shared.engine.cancel(&handle.task.task_id).await {
            Ok(task) => Ok(TaskHandle { task, ..handle }),
            Err(EngineError::InvalidState { status, .. }) => {
                Err(cannot_cancel(&handle.task.task_id, status))
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Waits until the caller's task is as `done` says (or the request is cancelled).
    async fn until(
        &self,
        task_id: &str,
        ctx: &RequestContext<RoleServer>,
        done: impl Fn(&TaskInfo) -> bool,
    ) -> Result<TaskHandle, McpError> {
        // Watch before reading, so a change right after the read is not missed.
        let mut watch = self.shared.engine.watch(task_id);
        loop {
            let handle = self.owned_handle(task_id, ctx).await?;
            if done(&handle.task) {
                return Ok(handle);
            }
            loop {
                let changed = tokio::select! {
                    _ = ctx.ct.cancelled() => {
                        return Err(ApiError::Cancelled("request cancelled; the task continues".into()).into());
                    }
                    _ = self.shared.shutdown.cancelled() => {
                        return Err(ApiError::Unavailable("server is shutting down; ask again after it restarts".into()).into());
                    }
                    changed = watch.changed() => changed,
                };
                match changed {
                    Some(task) if !done(&task) => {}
                    Some(_) => break,
                    None => {
                        // The watch ended with the task, so the next read sees its end; a new
                        // watch makes sure this never spins, whatever ended it.
                        watch = self.shared.engine.watch(task_id);
                        break;
                    }
                }
            }
        }
    }

    /// `tools/call` with the task policy: a client that declared the extension gets a task for
    /// a task-capable tool; a task-only tool called without any task is refused.
    pub(super) async fn call_tool_with_tasks(
        &self,
        call: CallToolRequestParams,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        match (self.task_support(&call.name), declares_extension(&ctx)) {
            (TaskSupport::Forbidden, _) | (TaskSupport::Optional, false) => {
                let call = ToolCallContext::new(self, call, ctx);
                self.shared.tool_router.call(call).await
            }
            (TaskSupport::Required, false)
                if super::stateless(&ctx) && declares_elicitation(&ctx) =>
            {
                self.call_asking_inline(call, ctx).await
            }
            (TaskSupport::Required, false) => Err(ApiError::MethodNotFound(format!(
                "tool {} runs only as a task (its execution.taskSupport is \"required\"): call \
                 it with a task field (MCP 2025-11-25) or declare the {} extension (or, on \
                 2026-07-28, the elicitation capability, to be asked its questions inline)",
                call.name,
                rmcp::model::TASKS_EXTENSION_ID
            ))
            .into()),
            (_, true) => {
                let handle = self
                    .create_task(&call, self.granted_ttl(None), &ctx)
                    .await?;
                Ok(CallToolResponse::Task(CreateTaskResult::new(
                    extension_task(&handle),
                )))
            }
        }
    }

    /// A task-only tool called plainly on 2026-07-28 by a client that can be asked: the call
    /// runs the kind's task and answers its result, and each question the task asks on the way
    /// is an `input_required` result (2026-07-28, "Multi Round-Trip Requests") whose
    /// `requestState` is the task's id. The client's retry, with the person's answer in
    /// `inputResponses` under the question's id, answers the question (once: a repeated retry
    /// finds it answered and waits on) and waits for the next question or the end. The task is
    /// durable between rounds, however long the person takes or whatever restarts meanwhile;
    /// a closed stream ends the round, never the task.
    async fn call_asking_inline(
        &self,
        call: CallToolRequestParams,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        // The requestState is a handle on the task, kept as long as a task is: a person may
        // take days.
        let task = match &call.request_state {
            Some(task_id) => {
                let handle = self
                    .owned_handle(task_id, &ctx)
                    .await
                    .map_err(|e| match e {
                        ApiError::NotFound(_) => ApiError::InvalidParams(ParamError::new(
                            "requestState",
                            "requestState names no task of yours: send it back exactly as the \
                             input_required result gave it, or call again without it",
                        )),
                        e => e,
                    })?;
                if handle.tool != call.name {
                    return Err(ApiError::InvalidParams(ParamError::new(
                        "requestState",
                        format!(
                            "requestState names a task of {}, not of {}",
                            handle.tool, call.name
                        ),
                    ))
                    .into());
                }
                handle.task
            }
            None => {
                let ttl = self.shared.task_ttl.max.as_millis() as u64;
                self.create_task(&call, self.granted_ttl(Some(ttl)), &ctx)
                    .await?
                    .task
            }
        };
        let task_id = task.task_id.clone();
        // What the person was told was wrong with their answer, asked again with the question.
        let mut refused = None;
        if let (Some(question), Some(responses)) = (&task.question, &call.input_responses)
            && let Some(response) = responses.get(&question.id)
        {
            let Some(answer) = elicited_answer(response)? else {
                return Ok(CallToolResponse::Complete(CallToolResult::error(vec![
                    ContentBlock::text(format!(
                        "the question {} was dismissed; task {task_id} still waits for it: call \
                         again with the same requestState to be asked again, or answer it with \
                         answer_task",
                        question.id
                    )),
                ])));
            };
            match self
                .shared
                .engine
                .answer(&task_id, &question.id, answer)
                .await
            {
                // A retry sent again after its answer was applied: the task has moved on.
                Ok(_) | Err(EngineError::QuestionNotOpen(_)) => {}
                Err(EngineError::InvalidParams(e)) => refused = Some(e.message),
                Err(e) => return Err(ApiError::from(e).into()),
            }
        }
        let settled = self
            .until(&task_id, &ctx, |task| {
                use durable_shared::TaskStatus;
                task.status.is_terminal()
                    || task.status == TaskStatus::Paused
                    || (task.status == TaskStatus::InputRequired && task.question.is_some())
            })
            .await
            .map(|handle| handle.task);
        // The revision's cancellation by a closed stream: before any requestState was handed
        // out, the task is this call's alone, and nobody could come back to it.
        if settled.is_err()
            && call.request_state.is_none()
            && ctx.ct.is_cancelled()
            && let Err(e) = self.shared.engine.cancel(&task_id).await
        {
            tracing::debug!(%task_id, error = %e, "a cancelled call's task was not cancelled");
        }
        let task = settled?;
        if let Some(result) = final_outcome(&task) {
            return Ok(CallToolResponse::Complete(result));
        }
        if task.status == durable_shared::TaskStatus::Paused {
            return Ok(CallToolResponse::Complete(CallToolResult::error(vec![
                ContentBlock::text(format!(
                    "task {task_id} is paused; resume_task continues it, then call again with \
                     the same requestState"
                )),
            ])));
        }
        let question = task.question.clone().map(|mut question| {
            if let Some(reason) = refused {
                question.message = format!("{} ({reason}; please answer again)", question.message);
            }
            question
        });
        let requests = question.as_ref().and_then(input_requests).ok_or_else(|| {
            ApiError::Unavailable(format!("task {task_id} waits for input it cannot ask for"))
        })?;
        Ok(CallToolResponse::InputRequired(InputRequiredResult::new(
            Some(requests),
            Some(task_id),
        )))
    }

    /// A 2025-11-25 task-augmented `tools/call`.
    async fn call_tool_legacy(
        &self,
        params: Option<Value>,
        ctx: &RequestContext<RoleServer>,
    ) -> Result<Value, McpError> {
        let params = params.unwrap_or_default();
        let call: CallToolRequestParams =
            parse_params("tools/call", params.clone()).map_err(ApiError::from)?;
        if self.task_support(&call.name) == TaskSupport::Forbidden {
            if !self.shared.tool_router.has_route(&call.name) {
                return Err(ApiError::NotFound(format!("unknown tool {}", call.name)).into());
            }
            return Err(ApiError::MethodNotFound(format!(
                "tool {} does not run as a task (its execution.taskSupport is \"forbidden\"); \
                 call it without the task field",
                call.name
            ))
            .into());
        }
        let ttl = self.granted_ttl(requested_ttl(&params["task"])?);
        let handle = self.create_task(&call, ttl, ctx).await?;
        Ok(json!({"task": legacy_task(&handle)}))
    }

    /// 2025-11-25 `tasks/list`: the caller's handles in creation order, a page at a time.
    async fn list_tasks_legacy(
        &self,
        params: Option<Value>,
        ctx: &RequestContext<RoleServer>,
    ) -> Result<Value, McpError> {
        let cursor = params
            .as_ref()
            .and_then(|params| params.get("cursor"))
            .filter(|cursor| !cursor.is_null());
        let after = match cursor {
            None => None,
            Some(cursor) => Some(parse_cursor(cursor).ok_or_else(|| {
                ApiError::InvalidParams(ParamError::new(
                    "cursor",
                    "invalid cursor: pass the nextCursor of the previous tasks/list answer",
                ))
            })?),
        };
        let requester = self.caller(ctx).owner;
        let mut page = self
            .shared
            .engine
            .handles(&requester, after, TASKS_PAGE_SIZE + 1)
            .await?;
        let next = (page.len() > TASKS_PAGE_SIZE).then(|| {
            page.truncate(TASKS_PAGE_SIZE);
            let last = &page[TASKS_PAGE_SIZE - 1].task;
            format!("{}:{}", last.created_at.timestamp_millis(), last.task_id)
        });
        let tasks: Vec<Value> = page.iter().map(legacy_task).collect();
        let mut result = json!({ "tasks": tasks });
        if let Some(next) = next {
            result["nextCursor"] = json!(next);
        }
        Ok(result)
    }

    /// 2025-11-25 `tasks/result`: waits for the end, then answers exactly what the tool call
    /// answers, tied to the task in `_meta`.
    async fn task_result_legacy(
        &self,
        params: Option<Value>,
        ctx: &RequestContext<RoleServer>,
    ) -> Result<Value, McpError> {
        let task_id = task_id_param(params.as_ref())?;
        let handle = self
            .until(&task_id, ctx, |task| task.status.is_terminal())
            .await?;
        let mut result = Value::Object(outcome_object(&handle.task));
        result["_meta"][RELATED_TASK_META_KEY] = json!({"taskId": handle.task.task_id});
        Ok(result)
    }

    /// Answers the methods rmcp does not know: the 2025-11-25 `tasks/list` and `tasks/result`,
    /// and the private methods the HTTP layer renamed requests to.
    pub(super) async fn private_request(
        &self,
        method: &str,
        params: Option<Value>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<Value, McpError> {
        match method {
            "tasks/list" => self.list_tasks_legacy(params, &ctx).await,
            "tasks/result" => self.task_result_legacy(params, &ctx).await,
            PRIVATE_CALL => self.call_tool_legacy(params, &ctx).await,
            PRIVATE_GET => {
                let task_id = task_id_param(params.as_ref())?;
                Ok(legacy_task(&self.owned_handle(&task_id, &ctx).await?))
            }
            PRIVATE_CANCEL => {
                let task_id = task_id_param(params.as_ref())?;
                Ok(legacy_task(&self.cancel_owned(&task_id, &ctx).await?))
            }
            PRIVATE_LIST_TOOLS => self.list_tools_with_task_support(ctx).await,
            _ => Err(ApiError::MethodNotFound(format!("method not found: {method}")).into()),
        }
    }

    /// `tools/list` with each tool's `execution.taskSupport` (rmcp 3.11's `Tool` has no
    /// `execution` field).
    async fn list_tools_with_task_support(
        &self,
        ctx: RequestContext<RoleServer>,
    ) -> Result<Value, McpError> {
        let list = ServerHandler::list_tools(self, None, ctx).await?;
        let mut value = Value::Object(as_sent(ServerResult::ListToolsResult(list)));
        if let Some(tools) = value.get_mut("tools").and_then(Value::as_array_mut) {
            for tool in tools {
                let support = self.task_support(tool["name"].as_str().unwrap_or_default());
                tool["execution"] = json!({"taskSupport": support.as_str()});
            }
        }
        Ok(value)
    }
}

fn task_id_param(params: Option<&Value>) -> Result<String, ApiError> {
    params
        .and_then(|params| params.get("taskId"))
        .and_then(Value::as_str)
        .map(str::to_owned)
        .ok_or_else(|| {
            ApiError::InvalidParams(ParamError::new("taskId", "taskId (a string) is required"))
        })
}

fn parse_cursor(cursor: &Value) -> Option<(i64, String)> {
    let (ms, id) = cursor.as_str()?.split_once(':')?;
    Some((ms.parse().ok()?, id.to_owned()))
}
