//! The MCP surface: tools, resources, subscriptions and logging, on top of the engine.
//!
//! rmcp creates one [`DurableServer`] per MCP session; what is shared between sessions (the
//! engine, the routing index of who listens to what) sits behind cheap clones, what belongs to
//! one session (its place in that index, its log level) in [`SessionState`].
//!
//! MCP logging (`logging/setLevel`, `notifications/message`) is deprecated by SEP-2577, but the
//! 2025-11-25 clients this server serves use it, so this module allows the deprecation.
#![allow(deprecated)]

pub mod error;
mod notify;
mod prompts;
mod questions;
pub mod relay;
mod resources;
mod routes;
mod tasks;
mod tools;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CancelTaskParams, CustomRequest, CustomResult,
    GetPromptRequestParams, GetPromptResponse, GetTaskParams, GetTaskResult, Implementation,
    JsonObject, ListPromptsResult, ListResourceTemplatesResult, ListResourcesResult,
    ListToolsResult, LoggingLevel, PaginatedRequestParams, ProtocolVersion,
    ReadResourceRequestParams, ReadResourceResponse, ServerCapabilities, ServerConfig,
    ServerResult, SetLevelRequestParams, SubscribeRequestParams, SubscriptionFilter, Tool,
    UnsubscribeRequestParams, UpdateTaskParams,
};
use rmcp::service::{NotificationContext, RequestContext, SubscriptionContext};
use rmcp::{ErrorData as McpError, RoleServer, ServerHandler, tool_handler};
use tokio_util::sync::CancellationToken;

use durable_shared::kinds::Offer;

use crate::auth::Principal;
use crate::config::Limits;
use crate::engine::{Engine, EngineError};
use crate::streams::{SERVED_VERSIONS, StreamStore};
use durable_shared::kinds::ParamError;
use error::ApiError;

pub use durable_shared::CLIENT_ID_HEADER;
pub use tasks::{
    PRIVATE_CALL, PRIVATE_CANCEL, PRIVATE_GET, PRIVATE_LIST_TOOLS, TaskTtl, legacy_capability,
};
pub use tools::started;

/// Everything one MCP session needs. Cloned per request by rmcp; the clones share state.
#[derive(Clone)]
pub struct DurableServer {
    shared: Arc<Shared>,
    session: Arc<SessionState>,
}

/// What all sessions share, made once at start-up.
pub struct Shared {
    engine: Engine,
    streams: StreamStore,
    shutdown: CancellationToken,
    task_ttl: TaskTtl,
    /// The hand-written tools, and the `start_{kind}` tool of every background kind.
    tool_router: ToolRouter<DurableServer>,
    /// The task-only `run_{kind}` tools of the background kinds (answered by `tasks`).
    task_tools: Vec<(Tool, &'static str)>,
    /// Which sessions listen to which tasks.
    routes: Arc<routes::Routes>,
    /// The in-request calls waiting for each task.
    waiters: crate::counts::Counts,
    limits: Limits,
    /// The initialized sessions rmcp holds, by session id: what [`Shared::may_sleep`] asks.
    resident: Mutex<HashMap<String, Weak<SessionState>>>,
}

impl Shared {
    /// Builds what sessions share and starts routing the engine's events to them; a session
    /// may fall `notification_buffer` events behind before it is resynchronised from the store.
    pub fn new(
        engine: Engine,
        streams: StreamStore,
        task_ttl: TaskTtl,
        notification_buffer: usize,
        limits: Limits,
        shutdown: CancellationToken,
    ) -> Arc<Self> {
        let mut tool_router = DurableServer::tool_router();
        let mut task_tools = Vec::new();
        for kind in engine.kinds() {
            if kind.offer == Offer::Background {
                tool_router.add_route(tools::start_route(kind));
                task_tools.push((tasks::task_only_tool(kind), kind.name));
            }
        }
        let shared = Arc::new(Shared {
            engine,
            streams,
            shutdown,
            task_ttl,
            tool_router,
            task_tools,
            routes: routes::Routes::new(notification_buffer),
            waiters: crate::counts::Counts::default(),
            limits,
            resident: Mutex::default(),
        });
        tokio::spawn(notify::route_events(shared.clone()));
        shared
    }

    /// Drops the entries of sessions rmcp no longer holds from [`Shared::resident`].
    pub fn forget_ended_sessions(&self) {
        self.resident
            .lock()
            .expect("resident lock")
            .retain(|_, session| session.strong_count() > 0);
    }

    /// Whether session `session_id` may leave memory (see `Config::session_dormant_after`):
    /// nothing would reach it meanwhile that a restore does not make up for. So no call of it
    /// is in progress and no question is being put to it (either would die with it), and it
    /// follows nothing live: no subscription, and its client owns no unfinished task and holds
    /// no handle on one (their milestones and statuses are sent to it as they happen). A
    /// session that set a log level stays too: the level lives in memory only. So does one not
    /// initialized yet.
    pub async fn may_sleep(&self, session_id: &str, after: Duration) -> bool {
        let session = self
            .resident
            .lock()
            .expect("resident lock")
            .get(session_id)
            .and_then(Weak::upgrade);
        let Some(session) = session else {
            return false;
        };
        let key = session.route.key;
        if !session.idle_for(after)
            || !session.asking.lock().expect("asking lock").is_empty()
            || session.log_level.lock().expect("log level lock").is_some()
            || self.routes.subscription_count(key) > 0
        {
            return false;
        }
        let Some(client) = self.routes.client(key) else {
            return true;
        };
        if self.routes.holds_handles(&client) {
            return false;
        }
        match self.engine.unfinished_tasks_of(&client).await {
            Ok(unfinished) => unfinished == 0,
            Err(e) => {
                tracing::warn!(error = %e, "cannot tell whether a quiet session follows tasks");
                false
            }
        }
    }
}

/// What belongs to one MCP session.
struct SessionState {
    /// The session's place in the routing index (its subscriptions and client id live there);
    /// dropped with the session.
    route: routes::Registration,
    /// Its queue of notifications, until the forwarder takes it.
    inbox: Mutex<Option<routes::Inbox>>,
    /// Lowest level of log notifications this session wants (shared with its forwarder).
    log_level: Arc<Mutex<Option<LoggingLevel>>>,
    /// The questions this session is being asked (shared with its forwarder).
    asking: questions::Asking,
    /// The MCP session id, known once the session is initialized.
    session_id: std::sync::OnceLock<String>,
    /// Its request handlers (see [`Busy`]).
    handlers: Mutex<Handlers>,
}

/// A session's request handlers: how many run, and when the last one ended.
struct Handlers {
    running: usize,
    last_done: Instant,
}

impl SessionState {
    /// Whether no handler of the session has run for `period`. Counted from a handler's end, not
    /// from when it is idle: its response is on its way to the store for a moment after.
    fn idle_for(&self, period: Duration) -> bool {
        let handlers = self.handlers.lock().expect("handlers lock");
        handlers.running == 0 && handlers.last_done.elapsed() >= period
    }
}

/// Counts a request of a session as in progress until dropped: a session with one stays in
/// memory, since its handler would die with it.
struct Busy<'a>(&'a SessionState);

impl<'a> Busy<'a> {
    fn of(session: &'a SessionState) -> Self {
        session.handlers.lock().expect("handlers lock").running += 1;
        Busy(session)
    }
}

impl Drop for Busy<'_> {
    fn drop(&mut self) {
        let mut handlers = self.0.handlers.lock().expect("handlers lock");
        handlers.running -= 1;
        handlers.last_done = Instant::now();
    }
}

impl DurableServer {
    /// A new session's server.
    pub fn new(shared: Arc<Shared>) -> Self {
        let (route, inbox) = shared.routes.register();
        let session = SessionState {
            route,
            inbox: Mutex::new(Some(inbox)),
            log_level: Arc::default(),
            asking: Arc::default(),
            session_id: std::sync::OnceLock::new(),
            handlers: Mutex::new(Handlers {
                running: 0,
                last_done: Instant::now(),
            }),
        };
        DurableServer {
            shared,
            session: Arc::new(session),
        }
    }

    fn key(&self) -> routes::SessionKey {
        self.session.route.key
    }

    /// Who the request comes from. With authorization on: the token's subject, who sees all
    /// tasks only with the operator scope. Without: the client id (below), and a single-user
    /// local server shows every client everything. A session remembers it in the routing
    /// index, for its notifications; a stateless request, which has none, does not.
    fn caller(&self, ctx: &RequestContext<RoleServer>) -> Caller {
        match principal(ctx) {
            Some(principal) => {
                let sees_all = principal.scopes.operator;
                if !stateless(ctx) {
                    self.shared
                        .routes
                        .set_viewer(self.key(), &principal.subject, sees_all);
                }
                Caller {
                    owner: principal.subject.clone(),
                    sees_all,
                }
            }
            None => Caller {
                owner: self.client_id(None, ctx),
                sees_all: true,
            },
        }
    }

    /// [`Self::caller`], for a request that may name its client id (`client_id` arguments):
    /// with authorization on, naming anyone but oneself is refused.
    fn caller_named(
        &self,
        explicit: Option<String>,
        ctx: &RequestContext<RoleServer>,
    ) -> Result<Caller, ApiError> {
        let explicit = explicit.filter(|id| !id.trim().is_empty());
        let Some(principal) = principal(ctx) else {
            return Ok(Caller {
                owner: self.client_id(explicit, ctx),
                sees_all: true,
            });
        };
        match explicit {
            Some(id) if id != principal.subject => Err(ApiError::InvalidParams(ParamError::new(
                "client_id",
                format!(
                    "client_id {id:?} is not yours: with authorization on, your tasks belong to \
                     your token's subject; leave client_id out"
                ),
            ))),
            _ => Ok(self.caller(ctx)),
        }
    }

    /// The persistent client id of a server without authorization: an explicit argument
    /// first, then the `X-Client-Id` header, then the MCP session id (so a client that says
    /// nothing still owns its tasks for the life of its session).
    fn client_id(&self, explicit: Option<String>, ctx: &RequestContext<RoleServer>) -> String {
        let parts = ctx.extensions.get::<axum::http::request::Parts>();
        let header = |name: &str| {
            parts
                .and_then(|parts| parts.headers.get(name))
                .and_then(|value| value.to_str().ok())
                .map(str::trim)
                .filter(|value| !value.is_empty())
                .map(str::to_owned)
        };
        let id = explicit
            .filter(|id| !id.trim().is_empty())
            .or_else(|| header(CLIENT_ID_HEADER))
            .or_else(|| header("mcp-session-id"))
            .unwrap_or_else(|| "anonymous".to_owned());
        if !stateless(ctx) {
            self.shared.routes.set_client(self.key(), &id);
        }
        id
    }

    /// The task `task_id` if the caller may see it; another owner's is as unknown as a task
    /// that does not exist.
    async fn visible_task(
        &self,
        task_id: &str,
        ctx: &RequestContext<RoleServer>,
    ) -> Result<durable_shared::TaskInfo, EngineError> {
        let task = self.shared.engine.get(task_id).await?;
        if self.caller(ctx).may_see(&task.owner) {
            Ok(task)
        } else {
            Err(EngineError::NotFound(task_id.to_owned()))
        }
    }
}

/// Who a request comes from, as far as ownership goes.
pub(crate) struct Caller {
    /// The owner of what it starts, and of the tasks it sees without `sees_all`.
    owner: String,
    /// Sees and steers every owner's tasks.
    sees_all: bool,
}

impl Caller {
    fn may_see(&self, owner: &str) -> bool {
        self.sees_all || self.owner == owner
    }

    /// The owner a listing is restricted to; `None`: all.
    fn filter(&self) -> Option<String> {
        (!self.sees_all).then(|| self.owner.clone())
    }
}

/// Whether a request speaks the stateless protocol 2026-07-28 (or later), where no session
/// and no resumable stream exists.
fn stateless(ctx: &RequestContext<RoleServer>) -> bool {
    ctx.protocol_version()
        .is_some_and(|version| crate::streams::is_stateless(version.as_str()))
}

/// The authenticated principal of a request (see `http::authorize`); `None` without
/// authorization.
fn principal(ctx: &RequestContext<RoleServer>) -> Option<&Principal> {
    ctx.extensions
        .get::<axum::http::request::Parts>()?
        .extensions
        .get::<Principal>()
}

impl DurableServer {
    /// Stores a subscription change so that it survives a restart of the server.
    async fn persist_subscription(
        &self,
        ctx: &RequestContext<RoleServer>,
        uri: &str,
        subscribed: bool,
    ) -> Result<(), McpError> {
        let Some(session_id) = tools::session_id(ctx) else {
            return Ok(());
        };
        Ok(self
            .shared
            .streams
            .set_subscription(&session_id, uri, subscribed)
            .await?)
    }
}

/// A result as rmcp sends it to the sessions served here (all before protocol 2026-07-28):
/// answers built outside rmcp's dispatch (task results, a relayed response) must look exactly
/// like the ones rmcp shapes itself.
fn as_sent(mut result: ServerResult) -> JsonObject {
    result.strip_result_type_for_legacy_peer();
    result.strip_non_object_output_for_legacy_peer();
    match serde_json::to_value(result) {
        Ok(serde_json::Value::Object(result)) => result,
        _ => JsonObject::new(),
    }
}

// rmcp runs each request as a tokio task whose future holds the future of whichever method
// answers it, so every request's task is as large as the largest of them: with `listen` inline,
// 10 KB, which tokio copies several times over a task's life (a quarter of a ping's
// instructions). The methods that await more than a lookup await it boxed.
#[tool_handler(router = self.shared.tool_router)]
impl ServerHandler for DurableServer {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(
            ServerCapabilities::builder()
                .enable_tools()
                .enable_prompts()
                .enable_resources()
                .enable_resources_subscribe()
                .enable_logging()
                .enable_tasks()
                .build(),
        )
        .with_server_info(Implementation::new(
            "durable-mcp",
            env!("CARGO_PKG_VERSION"),
        ))
        .with_instructions(
            "Durable long-running tasks. start_* tools return a task://status/{task_id} link at \
             once and keep working in the background, across client disconnects and server \
             restarts. Read or subscribe to that resource to follow a task; pause_task, \
             resume_task and cancel_task steer it. A task whose status is input_required waits \
             for the answer to its question (in its status), given with answer_task. \
             resumable_data_processing runs inside the \
             call, streams progress, and continues from its checkpoint when called again with \
             the same arguments.",
        )
    }

    /// The session versions, and 2026-07-28 without sessions (`server/discover` lists them all;
    /// `initialize` never answers 2026-07-28).
    fn supported_protocol_versions(&self) -> std::borrow::Cow<'static, [ProtocolVersion]> {
        std::borrow::Cow::Borrowed(&SERVED_VERSIONS)
    }

    /// What 2026-07-28 `subscriptions/listen` follows: task resources, as `resources/subscribe`
    /// does for sessions (the list-changed notifications are never sent: the lists of tools,
    /// prompts and resources are fixed).
    fn accepted_subscription_filter(
        &self,
        requested: &SubscriptionFilter,
    ) -> Option<SubscriptionFilter> {
        // At most as many as a session may subscribe to, so that the acknowledgment shows what
        // is followed (whether each task may be seen is checked once the request runs).
        let mut accepted = SubscriptionFilter::new();
        accepted.resource_subscriptions = requested.resource_subscriptions.as_ref().map(|uris| {
            uris.iter()
                .filter(|uri| resources::parse(uri).is_ok())
                .take(self.shared.limits.subscriptions_per_session)
                .cloned()
                .collect()
        });
        Some(accepted)
    }

    async fn listen(&self, subscription: SubscriptionContext) -> Result<(), McpError> {
        Box::pin(self.listen_to(subscription)).await
    }

    async fn set_level(
        &self,
        request: SetLevelRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        *self.session.log_level.lock().expect("log level lock") = Some(request.level);
        Ok(())
    }

    /// Runs after the handshake, and again when a restarted server restores the session from
    /// the store: the session's subscriptions come back from the database.
    async fn on_initialized(&self, context: NotificationContext<RoleServer>) {
        let parts = context.extensions.get::<axum::http::request::Parts>();
        let header = |name: &str| {
            parts
                .and_then(|parts| parts.headers.get(name))
                .and_then(|value| value.to_str().ok())
                .map(str::to_owned)
        };
        if let Some(session_id) = header("mcp-session-id") {
            let _ = self.session.session_id.set(session_id.clone());
            self.shared.routes.set_session(self.key(), &session_id);
            self.shared
                .resident
                .lock()
                .expect("resident lock")
                .insert(session_id.clone(), Arc::downgrade(&self.session));
            match parts.and_then(|parts| parts.extensions.get::<Principal>()) {
                Some(principal) => self.shared.routes.set_viewer(
                    self.key(),
                    &principal.subject,
                    principal.scopes.operator,
                ),
                None => {
                    let client_id = header(CLIENT_ID_HEADER).unwrap_or_else(|| session_id.clone());
                    self.shared.routes.set_client(self.key(), &client_id);
                }
            }
            match self.shared.streams.subscriptions(&session_id).await {
                Ok(uris) => {
                    for uri in uris {
                        self.shared.routes.subscribe(self.key(), &uri);
                    }
                }
                Err(e) => tracing::error!(error = %e, "cannot restore the session's subscriptions"),
            }
            if self.shared.streams.take_restored(&session_id) {
                // Nothing here served the session until now: its forwarder first sends the
                // current state of what it follows, and every handle's status (when the session
                // last heard of one is not known, and sending one again is harmless).
                self.shared.routes.lagging(self.key(), i64::MIN);
            }
        }
        if questions::can_ask(&context.peer)
            && let Some(owner) = self.shared.routes.client(self.key())
        {
            tokio::spawn(questions::ask_open_questions(
                self.shared.clone(),
                context.peer.clone(),
                owner,
                self.session.asking.clone(),
                self.session.session_id.get().cloned(),
            ));
        }
        self.start_forwarder(context.peer);
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, McpError> {
        let mut tools = self.shared.tool_router.list_all();
        tools.extend(self.shared.task_tools.iter().map(|(tool, _)| tool.clone()));
        Ok(ListToolsResult::with_all_items(tools))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        let _busy = Busy::of(&self.session);
        Box::pin(self.call_tool_with_tasks(request, context)).await
    }

    /// The 2025-11-25 task methods rmcp 3.11 does not model (see `tasks`).
    async fn on_custom_request(
        &self,
        request: CustomRequest,
        context: RequestContext<RoleServer>,
    ) -> Result<CustomResult, McpError> {
        let _busy = Busy::of(&self.session);
        Box::pin(self.private_request(&request.method, request.params, context))
            .await
            .map(CustomResult)
    }

    /// SEP-2663 `tasks/get`: the result (or error) is inlined once the task has ended.
    async fn get_task(
        &self,
        request: GetTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<GetTaskResult, McpError> {
        let handle = Box::pin(self.owned_handle(&request.task_id, &context)).await?;
        Ok(GetTaskResult::new(tasks::detailed_task(&handle)))
    }

    async fn cancel_task(
        &self,
        request: CancelTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        Box::pin(self.cancel_owned(&request.task_id, &context)).await?;
        Ok(())
    }

    /// SEP-2663 `tasks/update`: the response keyed by the task's open question answers it
    /// (once; the engine refuses a second). Responses under other keys are ignored, as the
    /// extension says of keys that are not outstanding.
    async fn update_task(
        &self,
        request: UpdateTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        Box::pin(async move {
            let handle = self.owned_handle(&request.task_id, &context).await?;
            let Some(question) = handle.task.question.as_ref() else {
                return Ok(());
            };
            let Some(response) = request.input_responses.get(&question.id) else {
                return Ok(());
            };
            if let Some(answer) = tasks::elicited_answer(response)? {
                self.shared
                    .engine
                    .answer(&handle.task.task_id, &question.id, answer)
                    .await
                    .map_err(ApiError::from)?;
            }
            Ok(())
        })
        .await
    }

    async fn list_prompts(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListPromptsResult, McpError> {
        Ok(ListPromptsResult::with_all_items(prompts::listed()))
    }

    async fn get_prompt(
        &self,
        request: GetPromptRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<GetPromptResponse, McpError> {
        let task_id = prompts::task_id(&request)?;
        let task = Box::pin(self.visible_task(task_id, &context)).await?;
        Ok(prompts::report(task).into())
    }

    async fn list_resources(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListResourcesResult, McpError> {
        Ok(ListResourcesResult::with_all_items(resources::listed()))
    }

    async fn list_resource_templates(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListResourceTemplatesResult, McpError> {
        Ok(ListResourceTemplatesResult::with_all_items(
            resources::templates(),
        ))
    }

    async fn read_resource(
        &self,
        request: ReadResourceRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<ReadResourceResponse, McpError> {
        let caller = self.caller(&context);
        Box::pin(resources::read(&self.shared.engine, &caller, &request.uri))
            .await
            .map(Into::into)
    }

    #[allow(
        deprecated,
        reason = "resources/subscribe is what 2025-11-25 clients use"
    )]
    async fn subscribe(
        &self,
        request: SubscribeRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        let caller = self.caller(&context);
        Box::pin(resources::check_subscribable(
            &self.shared.engine,
            &caller,
            &request.uri,
        ))
        .await?;
        let limit = self.shared.limits.subscriptions_per_session;
        if self.shared.routes.subscription_count(self.key()) >= limit {
            return Err(ApiError::Limit {
                limit: "max_subscriptions_per_session",
                message: format!(
                    "this session already has {limit} subscriptions, the most one session may \
                     have (--max-subscriptions-per-session); unsubscribe from some first"
                ),
            }
            .into());
        }
        Box::pin(self.persist_subscription(&context, &request.uri, true)).await?;
        self.shared.routes.subscribe(self.key(), &request.uri);
        self.start_forwarder(context.peer);
        Ok(())
    }

    #[allow(
        deprecated,
        reason = "resources/unsubscribe is what 2025-11-25 clients use"
    )]
    async fn unsubscribe(
        &self,
        request: UnsubscribeRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        Box::pin(self.persist_subscription(&context, &request.uri, false)).await?;
        self.shared.routes.unsubscribe(self.key(), &request.uri);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use durable_shared::kinds::{KindSpec, PROCESSING_TOOL, ParamError};
    use durable_shared::schemars::{self, JsonSchema};
    use serde::{Deserialize, Serialize};

    use super::*;
    use crate::engine::{EngineConfig, Env, Plan, Step, StepError, TaskKind};
    use crate::store::Store;

    #[derive(Serialize, Deserialize, JsonSchema)]
    struct EchoParams {
        /// What to echo.
        #[schemars(title = "Text")]
        text: String,
    }

    /// A kind this crate has never heard of: registering it is all it takes to be offered.
    struct Echo;

    impl KindSpec for Echo {
        const NAME: &'static str = "echo";
        const TITLE: &'static str = "Echo";
        const DESCRIPTION: &'static str = "Echoes its text.";
        const RESULT: &'static str = "the text";
        type Params = EchoParams;
        type Output = String;
    }

    impl TaskKind for Echo {
        type State = ();

        fn plan(&self, _params: &EchoParams, _env: &Env) -> Result<Plan<()>, ParamError> {
            Ok(Plan {
                state: (),
                total: 1,
            })
        }

        async fn step(
            &self,
            params: &EchoParams,
            _state: &(),
            _env: &Env,
        ) -> Result<Step<(), String>, StepError> {
            Ok(Step::Done {
                state: (),
                progress: 1,
                message: params.text.clone(),
                output: params.text.clone(),
            })
        }
    }

    #[tokio::test]
    async fn a_registered_kind_gets_its_start_and_task_tools_from_its_description() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("t.db")).unwrap();
        let shutdown = CancellationToken::new();
        let (engine, _) = Engine::builder()
            .register(Echo)
            .start(
                store.clone(),
                EngineConfig {
                    env: Env {
                        data_dir: dir.path().to_owned(),
                        time_scale: 0.0,
                        per_owner: false,
                    },
                    max_running: 1,
                    claimant: crate::engine::Claimant {
                        node: "test".into(),
                        ttl: std::time::Duration::from_secs(10),
                    },
                    max_tasks_per_owner: u64::MAX,
                },
                shutdown.clone(),
            )
            .await
            .unwrap();
        let streams = StreamStore::new(store, "test-node", shutdown.clone());
        let ttl = TaskTtl {
            default: Duration::from_secs(60),
            max: Duration::from_secs(60),
        };
        let shared = Shared::new(
            engine,
            streams,
            ttl,
            64,
            Limits::default(),
            shutdown.clone(),
        );
        let start = shared.tool_router.get("start_echo").expect("a start tool");
        assert_eq!(start.description.as_deref(), Some(Echo::DESCRIPTION));
        assert_eq!(start.title.as_deref(), Some("Echo"));
        assert_eq!(start.input_schema["required"], serde_json::json!(["text"]));
        assert_eq!(
            start.input_schema["properties"]["text"]["title"],
            serde_json::json!("Text")
        );
        let (run, kind) = &shared.task_tools[0];
        assert_eq!((run.name.as_ref(), *kind), ("run_echo", "echo"));
        assert!(
            shared.tool_router.has_route("cancel_task")
                && shared.tool_router.has_route(PROCESSING_TOOL),
            "the hand-written tools stay, the in-request one under its shared name"
        );
        shutdown.cancel();
    }
}
