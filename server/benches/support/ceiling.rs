//! The in-memory ceiling: an rmcp 3.11 server as plain as a server can be, in stateful mode
//! like durable-mcp, answering the same calls from a `HashMap`: what the load bench measures
//! durable-mcp's throughput against and the profile bench its instruction counts.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use axum::serve::ListenerExt;
use chrono::Utc;
use durable_mcp_server::engine::{Env, Step, TaskKind};
use durable_mcp_server::mcp::started;
use durable_shared::kinds::{BatchParams, BatchProcessing, KindSpec, parse_params};
use durable_shared::{TaskInfo, TaskStatus};
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, ReadResourceRequestParams, ReadResourceResponse,
    ReadResourceResult, ResourceContents, ServerCapabilities, ServerConfig,
};
use rmcp::service::RequestContext;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use rmcp::{ErrorData as McpError, RoleServer, ServerHandler};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

/// Shared by every session, like durable-mcp's engine. A std mutex: it is never held
/// across an await.
#[derive(Clone, Default)]
struct Ceiling {
    tasks: Arc<Mutex<HashMap<String, TaskInfo>>>,
}

impl Ceiling {
    /// Runs the real batch kind to completion in memory: the same parameters, the same
    /// work per step and the same task JSON as durable-mcp, without the durability.
    async fn run(&self, arguments: Value, owner: String) -> Result<TaskInfo, McpError> {
        let invalid =
            |e: durable_shared::kinds::ParamError| McpError::invalid_params(e.message, None);
        let params: BatchParams =
            parse_params(BatchProcessing::NAME, arguments).map_err(invalid)?;
        BatchProcessing::validate(&params).map_err(invalid)?;
        let env = Env {
            data_dir: PathBuf::new(),
            time_scale: 0.0,
            per_owner: false,
        };
        let plan = BatchProcessing.plan(&params, &env).map_err(invalid)?;
        let (mut state, mut steps) = (plan.state, 0);
        let (progress, message, output) = loop {
            steps += 1;
            match BatchProcessing.step(&params, &state, &env).await {
                Ok(Step::Continue { state: next, .. }) => state = next,
                Ok(Step::Done {
                    progress,
                    message,
                    output,
                    ..
                }) => break (progress, message, output),
                Ok(Step::Ask { .. }) => {
                    return Err(McpError::internal_error("batches ask nothing", None));
                }
                Err(e) => return Err(McpError::internal_error(e.0, None)),
            }
        };
        let now = Utc::now();
        let task = TaskInfo {
            task_id: uuid::Uuid::new_v4().to_string(),
            status: TaskStatus::Completed,
            progress,
            total: plan.total,
            message,
            result_data: Some(json!(output)),
            error: None,
            created_at: now,
            updated_at: now,
            completed_at: Some(now),
            kind: BatchProcessing::NAME.to_owned(),
            parameters: json!(params),
            owner,
            step: steps,
            percent: TaskInfo::percent_of(progress, plan.total),
            node: None,
            question: None,
        };
        self.tasks
            .lock()
            .expect("tasks lock")
            .insert(task.task_id.clone(), task.clone());
        Ok(task)
    }
}

impl ServerHandler for Ceiling {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(
            ServerCapabilities::builder()
                .enable_tools()
                .enable_resources()
                .build(),
        )
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        if request.name != "start_batch_processing" {
            return Err(McpError::invalid_params(
                format!("unknown tool {}", request.name),
                None,
            ));
        }
        // The owner is the session, as durable-mcp makes it for a client without an id.
        let owner = context
            .extensions
            .get::<axum::http::request::Parts>()
            .and_then(|parts| parts.headers.get("mcp-session-id"))
            .and_then(|value| value.to_str().ok())
            .unwrap_or_default()
            .to_owned();
        let arguments = Value::Object(request.arguments.unwrap_or_default());
        let task = self.run(arguments, owner).await?;
        // Exactly durable-mcp's answer, so both send the same bytes.
        Ok(started(&task).into())
    }

    async fn read_resource(
        &self,
        request: ReadResourceRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<ReadResourceResponse, McpError> {
        let task = request
            .uri
            .strip_prefix("task://status/")
            .and_then(|id| self.tasks.lock().expect("tasks lock").get(id).cloned())
            .ok_or_else(|| McpError::resource_not_found(request.uri.clone(), None))?;
        let body = serde_json::to_string_pretty(&task)
            .map_err(|e| McpError::internal_error(e.to_string(), None))?;
        Ok(ReadResourceResult::new(vec![
            ResourceContents::text(body, request.uri).with_mime_type("application/json"),
        ])
        .into())
    }
}

/// Serves the ceiling at `/mcp` on `127.0.0.1:0` as durable-mcp serves itself: rmcp's
/// service with its in-memory session manager, on axum, with TCP_NODELAY.
pub async fn serve() -> super::Served {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/mcp", listener.local_addr().unwrap());
    let shutdown = CancellationToken::new();
    let mut sessions = LocalSessionManager::default();
    // As in durable-mcp: sessions live until closed, not until a request-idle timeout.
    sessions.session_config.keep_alive = None;
    let ceiling = Ceiling::default();
    let service = StreamableHttpService::new(
        move || Ok(ceiling.clone()),
        Arc::new(sessions),
        StreamableHttpServerConfig::default().with_cancellation_token(shutdown.child_token()),
    );
    let app = axum::Router::new().route_service("/mcp", service);
    let listener = listener.tap_io(|stream| {
        // rmcp writes SSE replies in small pieces, which would otherwise wait for ACKs.
        let _ = stream.set_nodelay(true);
    });
    let server = axum::serve(listener, app)
        .with_graceful_shutdown(shutdown.clone().cancelled_owned())
        .into_future();
    let task = tokio::spawn(async move {
        server.await?;
        Ok(())
    });
    super::Served {
        url,
        shutdown,
        task,
    }
}
