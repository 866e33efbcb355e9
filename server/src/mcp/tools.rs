//! The MCP tools. Arguments are typed (their JSON schemas, with descriptions and bounds, come
//! from the parameter types); the engine validates what a schema cannot say.

use std::sync::Arc;

use durable_shared::kinds::{DATA_PROCESSING, ParamError, ProcessingParams, start_tool};
use durable_shared::{TaskInfo, TaskStatus, status_uri};
use rmcp::handler::server::router::tool::ToolRoute;
use rmcp::handler::server::tool::ToolCallContext;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{
    CallToolResponse, CallToolResult, ContentBlock, MetaObject, NotificationMetaObject,
    ProgressNotificationParam, ProgressToken, Resource, Tool,
};
use rmcp::schemars::{self, JsonSchema};
use rmcp::service::RequestContext;
use rmcp::{ErrorData as McpError, RoleServer, tool, tool_router};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use super::DurableServer;
use super::error::ApiError;
use crate::counts::Counts;
use crate::engine::{Answer, EngineError, KindInfo};
use crate::streams::{BINDING_META_KEY, CallBinding, CallId, StreamStore};

/// Tasks `list_session_tasks` returns at most, newest first.
const SESSION_TASK_LIMIT: usize = 200;

#[derive(Debug, Deserialize, JsonSchema)]
pub struct TaskIdParams {
    /// The task's id, as returned by the start_* tools (the last part of its task://status link).
    pub task_id: String,
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct AnswerParams {
    /// The task's id.
    pub task_id: String,
    /// The id of the question answered, as task://status/{task_id} shows it under
    /// `question.id`: an answer to a question the task no longer asks is refused.
    pub question_id: String,
    /// "accept" to answer with `answer`, "decline" to refuse to answer.
    #[serde(default)]
    pub action: AnswerAction,
    /// The answer: an object with the fields the question's schema asks for.
    #[serde(default)]
    pub answer: Option<serde_json::Map<String, Value>>,
}

#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum AnswerAction {
    #[default]
    Accept,
    Decline,
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct ProcessingToolParams {
    #[serde(flatten)]
    pub job: ProcessingParams,
    /// Your persistent client id. Calling again with the same client id and arguments attaches
    /// to the same task. Defaults to the X-Client-Id header, then the MCP session id.
    #[serde(default)]
    pub client_id: Option<String>,
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct SessionTasksParams {
    /// Whose tasks to list. Defaults to the X-Client-Id header, then the MCP session id.
    #[serde(default)]
    pub client_id: Option<String>,
    /// Only tasks with this status: pending, running, paused, input_required, completed, failed
    /// or cancelled.
    #[serde(default)]
    pub status: Option<String>,
}

#[derive(Debug, Serialize)]
struct SessionTask<'a> {
    task_id: &'a str,
    task_name: &'a str,
    status: TaskStatus,
    progress: String,
    progress_percent: f64,
    message: &'a str,
    created_at: String,
    updated_at: String,
}

pub(crate) fn json_result(value: Value) -> CallToolResult {
    let text = serde_json::to_string_pretty(&value).unwrap_or_else(|_| value.to_string());
    let mut result = CallToolResult::success(vec![ContentBlock::text(text)]);
    result.structured_content = Some(value);
    result
}

/// The answer of a start_* tool: the status link as a resource link and as text, and the task
/// as structured content.
pub fn started(task: &TaskInfo) -> CallToolResult {
    let uri = status_uri(&task.task_id);
    let link = Resource::new(uri.clone(), format!("{} task {}", task.kind, task.task_id))
        .with_description("Live status of the task; read it or subscribe to it")
        .with_mime_type("application/json");
    let mut result = CallToolResult::success(vec![
        ContentBlock::resource_link(link),
        ContentBlock::text(uri.clone()),
    ]);
    result.structured_content = Some(json!({
        "task_id": task.task_id,
        "status_uri": uri,
        "kind": task.kind,
        "status": task.status,
        "total": task.total,
    }));
    result
}

/// Engine errors a caller can fix are tool errors (the model reads them); storage failures stay
/// protocol errors.
fn tool_outcome(outcome: Result<CallToolResult, EngineError>) -> Result<CallToolResult, McpError> {
    outcome.or_else(|e| ApiError::from(e).into_tool_result())
}

pub(super) fn to_params<T: Serialize>(params: &T) -> Value {
    serde_json::to_value(params).expect("tool parameters serialize")
}

#[tool_router(vis = "pub(super)")]
impl DurableServer {
    #[tool(description = <durable_shared::kinds::DataProcessing as durable_shared::kinds::KindSpec>::DESCRIPTION)]
    async fn resumable_data_processing(
        &self,
        Parameters(params): Parameters<ProcessingToolParams>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, McpError> {
        let owner = match self.caller_named(params.client_id.clone(), &ctx) {
            Ok(caller) => caller.owner,
            Err(e) => return e.into_tool_result(),
        };
        let task = match self
            .shared
            .engine
            .start_or_attach(DATA_PROCESSING, &owner, to_params(&params.job))
            .await
        {
            Ok(task) => task,
            Err(e) => return tool_outcome(Err(e)),
        };
        let task_id = task.task_id.clone();
        let mut waiting = Waiting::new(&self.shared.waiters, &task_id);
        // Watch, then read again, so no change after the attach can be missed.
        let mut watch = self.shared.engine.watch(&task_id);
        let mut task = self.shared.engine.get(&task_id).await?;
        // Paused between the attach and the count above, by a call whose stream closed: this
        // call wants it running, as any call of a paused job does.
        if task.status == TaskStatus::Paused {
            task = self.shared.engine.resume(&task_id).await.unwrap_or(task);
        }
        let progress_token = ctx.meta.get_progress_token();
        let binding = match (&progress_token, session_id(&ctx)) {
            (Some(token), Some(session_id)) => {
                Some(self.bind_call(&task_id, session_id, &ctx, token).await?)
            }
            _ => None,
        };
        let meta = binding.as_ref().map(|binding| {
            let mut meta = serde_json::Map::new();
            meta.insert(BINDING_META_KEY.into(), Value::String(binding.id.clone()));
            NotificationMetaObject(MetaObject(meta))
        });
        let mut reported = None;
        let mut current = task;
        loop {
            // The first notification goes out at once, even at zero: it tells the event store
            // which stream this call answers on, before any step can be lost to a crash.
            if let Some(token) = &progress_token
                && reported.is_none_or(|reported| current.progress > reported)
            {
                reported = Some(current.progress);
                let mut param =
                    ProgressNotificationParam::new(token.clone(), current.progress as f64)
                        .with_total(current.total as f64)
                        .with_message(current.message.clone());
                param.meta = meta.clone();
                // A client that went away is not a cancellation: the task goes on regardless.
                let _ = ctx.peer.notify_progress(param).await;
            }
            if let Some(outcome) = processing_outcome(&current) {
                if let Some(binding) = binding {
                    binding.answered();
                }
                return Ok(outcome);
            }
            current = tokio::select! {
                _ = ctx.ct.cancelled() => {
                    if !super::stateless(&ctx) {
                        return Err(McpError::invalid_request("request cancelled; the task continues", None));
                    }
                    // 2026-07-28 has no resumption: a closed stream cancels the request
                    // (transports, "SSE resumability"), so the work done for it stops, at a
                    // step boundary with its checkpoint kept, unless another call still waits
                    // for it. The same call again resumes it (see `Engine::start_or_attach`).
                    if waiting.leave() {
                        match self.shared.engine.pause(&task_id).await {
                            Ok(_) => tracing::info!(%task_id, "stream closed; job paused"),
                            Err(e) => tracing::debug!(%task_id, error = %e, "stream closed; job not paused"),
                        }
                    }
                    return Err(McpError::invalid_request("request cancelled; its job pauses at its checkpoint unless another call waits for it, and the same call resumes it", None));
                }
                _ = self.shared.shutdown.cancelled() => {
                    return Err(ApiError::Unavailable("server is shutting down; call again after it restarts".into()).into());
                }
                changed = watch.changed() => match changed {
                    Some(task) => task,
                    // Ended while unwatched: the stored state is the final one.
                    None => self.shared.engine.get(&task_id).await?,
                },
            };
        }
    }

    #[tool(
        description = "Cancel a task for good; it stops at once, even mid-step, and stays cancelled."
    )]
    async fn cancel_task(
        &self,
        Parameters(params): Parameters<TaskIdParams>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, McpError> {
        let task_id = params.task_id.trim();
        let outcome = match self.visible_task(task_id, &ctx).await {
            Ok(_) => self.shared.engine.cancel(task_id).await,
            Err(e) => Err(e),
        };
        tool_outcome(outcome.map(|task| task_json(&task)))
    }

    #[tool(
        description = "Pause a pending or running task at its next step boundary, keeping its checkpoint."
    )]
    async fn pause_task(
        &self,
        Parameters(params): Parameters<TaskIdParams>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, McpError> {
        let task_id = params.task_id.trim();
        let outcome = match self.visible_task(task_id, &ctx).await {
            Ok(_) => self.shared.engine.pause(task_id).await,
            Err(e) => Err(e),
        };
        tool_outcome(outcome.map(|task| task_json(&task)))
    }

    #[tool(
        description = "Answer the question of a task waiting for input (status input_required; \
        task://status/{task_id} shows the question, its id and the JSON schema of an answer). \
        The answer is applied once and the task continues; a second answer is refused."
    )]
    async fn answer_task(
        &self,
        Parameters(params): Parameters<AnswerParams>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, McpError> {
        let task_id = params.task_id.trim();
        let answer = match (params.action, params.answer) {
            (AnswerAction::Decline, _) => Answer::Decline,
            (AnswerAction::Accept, Some(answer)) => Answer::Accept(Value::Object(answer)),
            (AnswerAction::Accept, None) => {
                return ApiError::InvalidParams(ParamError::new(
                    "answer",
                    "answer is required to accept: an object with the fields the question's \
                     schema asks for (or set action to \"decline\")",
                ))
                .into_tool_result();
            }
        };
        let outcome = match self.visible_task(task_id, &ctx).await {
            Ok(_) => {
                self.shared
                    .engine
                    .answer(task_id, params.question_id.trim(), answer)
                    .await
            }
            Err(e) => Err(e),
        };
        tool_outcome(outcome.map(|task| task_json(&task)))
    }

    #[tool(description = "Resume a paused task from its last checkpoint.")]
    async fn resume_task(
        &self,
        Parameters(params): Parameters<TaskIdParams>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, McpError> {
        let task_id = params.task_id.trim();
        let outcome = match self.visible_task(task_id, &ctx).await {
            Ok(_) => self.shared.engine.resume(task_id).await,
            Err(e) => Err(e),
        };
        tool_outcome(outcome.map(|task| task_json(&task)))
    }

    #[tool(
        description = "Counts of tasks per status, and the workers active in this server process."
    )]
    async fn get_server_stats(&self) -> Result<CallToolResult, McpError> {
        let stats = self.shared.engine.stats().await?;
        Ok(json_result(to_params(&stats)))
    }

    #[tool(
        description = "List the tasks of a client (default: the caller) with progress and percent, \
        newest first, optionally only one status."
    )]
    async fn list_session_tasks(
        &self,
        Parameters(params): Parameters<SessionTasksParams>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, McpError> {
        let status = match params.status.as_deref().map(str::parse::<TaskStatus>) {
            Some(Err(e)) => {
                return Ok(CallToolResult::error(vec![ContentBlock::text(
                    e.to_string(),
                )]));
            }
            Some(Ok(status)) => Some(status),
            None => None,
        };
        // An operator may list anyone's tasks; anyone else only their own.
        let caller = self.caller(&ctx);
        let owner = match params.client_id {
            Some(id) if caller.sees_all && !id.trim().is_empty() => id,
            explicit => match self.caller_named(explicit, &ctx) {
                Ok(caller) => caller.owner,
                Err(e) => return e.into_tool_result(),
            },
        };
        let tasks = self
            .shared
            .engine
            .list(Some(owner.clone()), status, None, SESSION_TASK_LIMIT)
            .await?;
        let rows: Vec<SessionTask<'_>> = tasks
            .iter()
            .map(|task| SessionTask {
                task_id: &task.task_id,
                task_name: &task.kind,
                status: task.status,
                progress: format!("{}/{}", task.progress, task.total),
                progress_percent: task.percent,
                message: &task.message,
                created_at: task.created_at.to_rfc3339(),
                updated_at: task.updated_at.to_rfc3339(),
            })
            .collect();
        Ok(json_result(json!({
            "session_id": session_id(&ctx),
            "persistent_id": owner,
            "total_tasks": rows.len(),
            "tasks": rows,
        })))
    }

    #[tool(
        description = "Statistics of the checkpoint store: tasks per status, steps committed, checkpoint bytes."
    )]
    async fn get_checkpoint_stats(&self) -> Result<CallToolResult, McpError> {
        let stats = self.shared.engine.checkpoint_stats().await?;
        Ok(json_result(to_params(&stats)))
    }

    #[tool(
        description = "The caller's MCP session id, this request's id, its client id and protocol version."
    )]
    async fn get_session_info(
        &self,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, McpError> {
        let client_id = self.caller(&ctx).owner;
        let peer = ctx.peer.peer_info();
        Ok(json_result(json!({
            "session_id": session_id(&ctx),
            "request_id": ctx.id,
            "client_id": client_id,
            "protocol_version": peer.as_ref().map(|info| info.protocol_version.to_string()),
            "client_info": peer.as_ref().map(|info| &info.client_info),
        })))
    }
}

/// The `start_{kind}` tool of a background kind: the kind's description and parameter schema,
/// answered by [`DurableServer::start_kind`].
pub(super) fn start_route(kind: &KindInfo) -> ToolRoute<DurableServer> {
    let name = kind.name;
    let tool = Tool::new(
        start_tool(name),
        kind.description,
        Arc::new(kind.params_schema.clone()),
    )
    .with_title(kind.title);
    ToolRoute::new_dyn(tool, move |call: ToolCallContext<'_, DurableServer>| {
        Box::pin(async move {
            let arguments = Value::Object(call.arguments.unwrap_or_default());
            let result = call
                .service
                .start_kind(name, arguments, &call.request_context)
                .await?;
            Ok(CallToolResponse::from(result))
        })
    })
}

impl DurableServer {
    /// Starts a task of a background kind; the engine validates the arguments, so every error
    /// names its field.
    async fn start_kind(
        &self,
        kind: &str,
        arguments: Value,
        ctx: &RequestContext<RoleServer>,
    ) -> Result<CallToolResult, McpError> {
        let owner = self.caller(ctx).owner;
        let outcome = self.shared.engine.start(kind, &owner, arguments).await;
        tool_outcome(outcome.map(|task| started(&task)))
    }

    /// Records that this call waits on `task_id`, so that a restarted server can still deliver
    /// its progress and result into the call's stream.
    async fn bind_call(
        &self,
        task_id: &str,
        session_id: String,
        ctx: &RequestContext<RoleServer>,
        token: &ProgressToken,
    ) -> Result<OpenCall, McpError> {
        // The id the HTTP layer recorded on this call's stream, so that a restart finds the
        // stream even before the first progress notification links it.
        let id = ctx
            .extensions
            .get::<axum::http::request::Parts>()
            .and_then(|parts| parts.extensions.get::<CallId>())
            .cloned()
            .unwrap_or_else(CallId::random);
        let binding = CallBinding {
            id: id.0,
            task_id: task_id.to_owned(),
            session_id,
            request_id: serde_json::to_string(&ctx.id).expect("request id serializes"),
            progress_token: serde_json::to_string(token).expect("progress token serializes"),
            stream_id: None,
        };
        let id = binding.id.clone();
        self.shared.streams.bind_call(binding).await?;
        Ok(OpenCall {
            id,
            streams: self.shared.streams.clone(),
            shutdown: self.shared.shutdown.clone(),
            finished: false,
        })
    }
}

/// A call's binding while its handler runs. A handler that ends without the task's outcome
/// (the client cancelled, an error, the future dropped) finishes the binding as it goes, so
/// that the relay of a later start never answers the call a second time. Only a shutdown (or a
/// crash) leaves it open: then the next start's relay finishes the call.
struct OpenCall {
    id: String,
    streams: StreamStore,
    shutdown: CancellationToken,
    finished: bool,
}

impl OpenCall {
    /// The handler returns the task's outcome: storing that response closes the binding in the
    /// same commit (see the store's `append_event`), so a crash before it is stored leaves the
    /// call for the next start's relay, and one after it leaves nothing to answer twice.
    fn answered(mut self) {
        self.finished = true;
    }
}

impl Drop for OpenCall {
    fn drop(&mut self) {
        if self.finished || self.shutdown.is_cancelled() {
            return;
        }
        let (streams, id) = (self.streams.clone(), std::mem::take(&mut self.id));
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                if let Err(e) = streams.finish_binding(&id).await {
                    tracing::warn!(binding = id, error = %e, "cannot close an abandoned call");
                }
            });
        }
    }
}

/// What a task's tool call answers once the task has ended; `None` while it has not. Shared by
/// `resumable_data_processing`, the relay that answers the same call after a restart, and
/// `tasks/result`.
pub(crate) fn final_outcome(task: &TaskInfo) -> Option<CallToolResult> {
    let task_id = &task.task_id;
    let error = |text: String| Some(CallToolResult::error(vec![ContentBlock::text(text)]));
    match task.status {
        TaskStatus::Completed => {
            let mut result = task.result_data.clone().unwrap_or(Value::Null);
            if let Value::Object(fields) = &mut result {
                fields.insert("task_id".into(), Value::String(task_id.clone()));
            }
            Some(json_result(result))
        }
        TaskStatus::Failed => error(failure(task)),
        TaskStatus::Cancelled => error(format!(
            "task {task_id} was cancelled after {}/{}",
            task.progress, task.total
        )),
        TaskStatus::Paused
        | TaskStatus::Pending
        | TaskStatus::Running
        | TaskStatus::InputRequired => None,
    }
}

/// What a call reports of a failed task.
pub(super) fn failure(task: &TaskInfo) -> String {
    format!(
        "task {} failed: {}",
        task.task_id,
        task.error.as_deref().unwrap_or_default()
    )
}

/// What `resumable_data_processing` answers for a task in this state, or `None` while it is
/// still to run: a paused task ends the call, which can be made again to continue it.
pub(crate) fn processing_outcome(task: &TaskInfo) -> Option<CallToolResult> {
    if task.status != TaskStatus::Paused {
        return final_outcome(task);
    }
    Some(CallToolResult::error(vec![ContentBlock::text(format!(
        "task {} is paused after {}/{} records; call again with the same arguments \
         (or resume_task) to continue from its checkpoint",
        task.task_id, task.progress, task.total
    ))]))
}

fn task_json(task: &TaskInfo) -> CallToolResult {
    json_result(to_params(task))
}

/// One call waiting for a task, counted (in `Shared::waiters`) until it leaves or is dropped.
/// Calls of other nodes of a fleet are not counted.
struct Waiting<'a> {
    waiters: &'a Counts,
    task_id: String,
    left: bool,
}

impl<'a> Waiting<'a> {
    fn new(waiters: &'a Counts, task_id: &str) -> Self {
        waiters.add(task_id);
        Waiting {
            waiters,
            task_id: task_id.to_owned(),
            left: false,
        }
    }

    /// Stops waiting; whether this was the last call of this process waiting for the task.
    fn leave(&mut self) -> bool {
        !std::mem::replace(&mut self.left, true) && self.waiters.remove(&self.task_id)
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.leave();
    }
}

pub(super) fn session_id(ctx: &RequestContext<RoleServer>) -> Option<String> {
    ctx.extensions
        .get::<axum::http::request::Parts>()
        .and_then(|parts| parts.headers.get("mcp-session-id"))
        .and_then(|value| value.to_str().ok())
        .map(str::to_owned)
}
