//! The command-line client: `durable-mcp task ...`, `durable-mcp process` and `durable-mcp
//! stats`, speaking MCP to a running server with rmcp's Streamable HTTP client, like any other
//! client. It knows no kind by name: `task start KIND` finds the server's `start_{kind}` tool and
//! reads its flags from the tool's schema.
//!
//! Exit codes: 0 success (a watched task completed), 1 the server refused the request (bad
//! input, unknown task, a transition the task's status does not allow), 3 the server cannot be
//! reached, 4 the watched task failed, 5 it was cancelled, 130 interrupted by Ctrl-C (the task
//! keeps running on the server).

mod answer;
pub mod args;
mod follow;
mod forms;
mod state;

use std::collections::HashMap;
use std::process::ExitCode;

use durable_shared::kinds::{PROCESSING_TOOL, start_tool};
use durable_shared::{ServerStats, TaskInfo, TaskList, list_uri, status_uri};
use rmcp::model::{
    CallToolRequestParams, CallToolResult, ProtocolVersion, ReadResourceRequestParams,
    ResourceContents, Tool,
};
use rmcp::service::RunningService;
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::{ClientLifecycleMode, ClientServiceExt, RoleClient};
use serde_json::{Value, json};

use args::{ClientArgs, ClientCommand, Protocol, TaskCommand};
use state::ClientState;

const REFUSED: u8 = 1;
const UNREACHABLE: u8 = 3;
const TASK_FAILED: u8 = 4;
const TASK_CANCELLED: u8 = 5;
const INTERRUPTED: u8 = 130;

/// Why a client command did not succeed.
enum Failure {
    /// The server answered with an error for the user to fix.
    Refused(String),
    /// The flags do not fit the tool's schema, or help was asked for (clap prints either).
    Usage(clap::Error),
    /// The server could not be reached or broke the protocol.
    Unreachable(String),
    /// A followed task ended without completing; its final state was printed.
    Ended(u8),
    /// Ctrl-C; how to re-attach was printed.
    Interrupted,
}

type Outcome<T> = Result<T, Failure>;

struct Client {
    service: RunningService<RoleClient, follow::Notifications>,
    notes: tokio::sync::Mutex<tokio::sync::mpsc::UnboundedReceiver<follow::Note>>,
    args: ClientArgs,
    client_id: String,
}

/// Runs a client subcommand and returns the process exit code.
pub async fn run(command: ClientCommand) -> ExitCode {
    let (args, action): (ClientArgs, Action) = match command {
        ClientCommand::Task { client, command } => {
            // Client flags may follow the kind's own flags.
            let client = match &command {
                TaskCommand::Start { arguments, .. } => forms::client_flags(&client, arguments),
                _ => client,
            };
            (client, Action::Task(command))
        }
        ClientCommand::Stats { client } => (client, Action::Stats),
        ClientCommand::Process { client, arguments } => (
            forms::client_flags(&client, &arguments),
            Action::Process(arguments),
        ),
    };
    let path = args.state_file.clone().unwrap_or_else(state::default_path);
    let client_id = ClientState::load_or_create(&path).client_id;
    let outcome = match Client::connect(args, client_id).await {
        Ok(client) => {
            let outcome = client.perform(action).await;
            let _ = client.service.cancel().await;
            outcome
        }
        Err(failure) => Err(failure),
    };
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(Failure::Refused(message)) => {
            eprintln!("error: {message}");
            ExitCode::from(REFUSED)
        }
        Err(Failure::Unreachable(message)) => {
            eprintln!("error: {message}");
            ExitCode::from(UNREACHABLE)
        }
        Err(Failure::Usage(error)) => {
            let _ = error.print();
            ExitCode::from(error.exit_code().clamp(0, 255) as u8)
        }
        Err(Failure::Ended(code)) => ExitCode::from(code),
        Err(Failure::Interrupted) => ExitCode::from(INTERRUPTED),
    }
}

enum Action {
    Task(TaskCommand),
    Stats,
    Process(Vec<String>),
}

impl Client {
    async fn connect(args: ClientArgs, client_id: String) -> Outcome<Client> {
        let mut headers = HashMap::new();
        let value = client_id.parse().map_err(|_| {
            Failure::Refused(format!(
                "client id {client_id:?} is not a valid header value"
            ))
        })?;
        headers.insert(
            http::HeaderName::from_static(durable_shared::CLIENT_ID_HEADER),
            value,
        );
        let mut config = StreamableHttpClientTransportConfig::with_uri(args.server.clone())
            .custom_headers(headers);
        if let Some(token) = &args.token {
            // rmcp adds the "Bearer " scheme itself.
            config = config.auth_header(token.trim());
        }
        let transport = StreamableHttpClientTransport::from_config(config);
        let (notifications, notes) = follow::Notifications::new();
        let lifecycle = match args.protocol {
            // rmcp's probe: server/discover, and initialize where the server answers it as a
            // server before 2026-07-28 does (an error), or not at all within 10 s.
            Protocol::Auto => ClientLifecycleMode::Auto {
                preferred_versions: vec![ProtocolVersion::V_2026_07_28],
                legacy_version: Some(ProtocolVersion::V_2025_11_25),
            },
            Protocol::Stateless => ClientLifecycleMode::Discover {
                preferred_versions: vec![ProtocolVersion::V_2026_07_28],
            },
            Protocol::Session => ClientLifecycleMode::Initialize,
        };
        let service = notifications
            .serve_with_lifecycle(transport, lifecycle)
            .await
            .map_err(|e| connect_failure(&args.server, &e))?;
        Ok(Client {
            service,
            notes: tokio::sync::Mutex::new(notes),
            args,
            client_id,
        })
    }

    /// Whether the server and client agreed on the stateless 2026-07-28 revision (no session,
    /// nothing kept between requests).
    fn stateless(&self) -> bool {
        self.service
            .peer_info()
            .is_some_and(|info| info.protocol_version == ProtocolVersion::V_2026_07_28)
    }

    /// The server's tool `name`; `what` names it for the user if the server has none.
    async fn tool(&self, name: &str, what: &str) -> Outcome<Tool> {
        let tools =
            self.service.list_all_tools().await.map_err(|e| {
                Failure::Unreachable(format!("cannot list the server's tools: {e}"))
            })?;
        let offered: Vec<String> = tools
            .iter()
            .filter_map(|tool| durable_shared::kinds::kind_of_start_tool(&tool.name))
            .map(|kind| kind.replace('_', "-"))
            .collect();
        tools
            .into_iter()
            .find(|tool| tool.name == name)
            .ok_or_else(|| {
                Failure::Refused(format!(
                    "the server offers no {what:?} (it has no tool {name}); kinds it offers: {}",
                    offered.join(", ")
                ))
            })
    }

    async fn call(&self, tool: &str, arguments: Value) -> Outcome<Value> {
        let Value::Object(arguments) = arguments else {
            unreachable!("tool arguments are objects")
        };
        let params = CallToolRequestParams::new(tool.to_owned()).with_arguments(arguments);
        let result: CallToolResult = self
            .service
            .call_tool(params)
            .await
            .map_err(|e| Failure::Unreachable(format!("{tool} failed: {e}")))?;
        if result.is_error == Some(true) {
            return Err(Failure::Refused(tool_text(&result)));
        }
        Ok(result.structured_content.unwrap_or(Value::Null))
    }

    async fn read(&self, uri: &str) -> Outcome<Value> {
        let result = self
            .service
            .read_resource(ReadResourceRequestParams::new(uri.to_owned()))
            .await
            .map_err(|e| match e {
                rmcp::service::ServiceError::McpError(error) => {
                    Failure::Refused(error.message.to_string())
                }
                other => Failure::Unreachable(format!("reading {uri} failed: {other}")),
            })?;
        let text = match result.contents.first() {
            Some(ResourceContents::TextResourceContents { text, .. }) => text.clone(),
            _ => return Err(Failure::Unreachable(format!("{uri} has no text content"))),
        };
        serde_json::from_str(&text)
            .map_err(|e| Failure::Unreachable(format!("{uri} is not JSON: {e}")))
    }

    fn print(&self, json: &Value, text: impl FnOnce() -> String) {
        if self.args.json {
            println!("{}", serde_json::to_string_pretty(json).unwrap_or_default());
        } else {
            println!("{}", text());
        }
    }

    async fn perform(&self, action: Action) -> Outcome<()> {
        match action {
            Action::Stats => {
                let stats = self.call("get_server_stats", json!({})).await?;
                let parsed: ServerStats = decode(&stats)?;
                self.print(&stats, || {
                    format!(
                        "tasks {}: pending {}, running {}, paused {}, completed {}, failed {}, \
                         cancelled {} ({} active workers)",
                        parsed.total_tasks,
                        parsed.pending_tasks,
                        parsed.running_tasks,
                        parsed.paused_tasks,
                        parsed.completed_tasks,
                        parsed.failed_tasks,
                        parsed.cancelled_tasks,
                        parsed.active_background_tasks
                    )
                });
            }
            Action::Task(TaskCommand::Start {
                kind,
                watch,
                arguments,
            }) => {
                let kind = kind.replace('-', "_");
                let tool = self.tool(&start_tool(&kind), &kind).await?;
                let about = tool.description.as_deref().unwrap_or_default();
                let parsed = forms::parse(&kind, about, &tool.input_schema, &[], &arguments)
                    .map_err(Failure::Usage)?;
                let started = self
                    .call(&tool.name, Value::Object(parsed.arguments))
                    .await?;
                let task_id = started["task_id"].as_str().unwrap_or_default().to_owned();
                let watch = watch || parsed.watch;
                if !(watch && self.args.json) {
                    self.print(&started, || {
                        format!(
                            "started {} task {task_id}\n  follow it at {}",
                            started["kind"].as_str().unwrap_or_default(),
                            started["status_uri"].as_str().unwrap_or_default()
                        )
                    });
                }
                if watch {
                    self.watch(&task_id).await?;
                }
            }
            Action::Task(TaskCommand::Watch { task_id }) => self.watch(&task_id).await?,
            Action::Process(arguments) => {
                let tool = self.tool(PROCESSING_TOOL, "process").await?;
                let about = tool.description.as_deref().unwrap_or_default();
                let parsed = forms::parse(
                    "process",
                    about,
                    &tool.input_schema,
                    &["client_id"],
                    &arguments,
                )
                .map_err(Failure::Usage)?;
                self.process(Value::Object(parsed.arguments)).await?
            }
            Action::Task(TaskCommand::List { status, mine }) => {
                let status = status
                    .map(|s| {
                        s.parse().map_err(|e: durable_shared::UnknownStatus| {
                            Failure::Refused(e.to_string())
                        })
                    })
                    .transpose()?;
                let list: TaskList = decode(&self.read(&list_uri(status)).await?)?;
                let tasks: Vec<&TaskInfo> = list
                    .tasks
                    .iter()
                    .filter(|task| !mine || task.owner == self.client_id)
                    .collect();
                self.print(&json!({"tasks": tasks, "total": tasks.len()}), || {
                    table(&tasks)
                });
            }
            Action::Task(TaskCommand::Show { task_id }) => {
                let task = self.read(&status_uri(&task_id)).await?;
                let parsed: TaskInfo = decode(&task)?;
                self.print(&task, || describe(&parsed));
            }
            Action::Task(TaskCommand::Pause { task_id }) => {
                self.steer("pause_task", &task_id).await?
            }
            Action::Task(TaskCommand::Resume { task_id }) => {
                self.steer("resume_task", &task_id).await?
            }
            Action::Task(TaskCommand::Cancel { task_id }) => {
                self.steer("cancel_task", &task_id).await?
            }
            Action::Task(TaskCommand::Answer {
                task_id,
                answer,
                decline,
            }) => self.answer(&task_id, answer.as_deref(), decline).await?,
        }
        Ok(())
    }

    async fn steer(&self, tool: &str, task_id: &str) -> Outcome<()> {
        let task = self.call(tool, json!({"task_id": task_id})).await?;
        let parsed: TaskInfo = decode(&task)?;
        self.print(&task, || {
            format!("task {} is now {}", parsed.task_id, parsed.status)
        });
        Ok(())
    }
}

/// What the user is told when the client cannot start talking to `server`.
fn connect_failure(server: &str, e: &impl std::fmt::Display) -> Failure {
    let text = e.to_string();
    if text.contains("authorization required") || text.contains("Auth required") {
        return Failure::Refused(format!(
            "the durable-mcp server at {server} refused the request ({e}): it requires an OAuth \
             bearer token; pass a valid one with --token (DURABLE_MCP_TOKEN)"
        ));
    }
    Failure::Unreachable(format!(
        "cannot reach the durable-mcp server at {server} ({e}); is it running? Start one with \
         scripts/serve or point --server (DURABLE_MCP_SERVER) at it"
    ))
}

/// The text content of a tool result: a tool error's message.
fn tool_text(result: &CallToolResult) -> String {
    result
        .content
        .iter()
        .filter_map(|block| block.as_text().map(|t| t.text.clone()))
        .collect::<Vec<_>>()
        .join("\n")
}

fn decode<T: serde::de::DeserializeOwned>(value: &Value) -> Outcome<T> {
    serde_json::from_value(value.clone())
        .map_err(|e| Failure::Unreachable(format!("unexpected answer from the server: {e}")))
}

fn table(tasks: &[&TaskInfo]) -> String {
    if tasks.is_empty() {
        return "no tasks".into();
    }
    let mut out = format!(
        "{:<36}  {:<16}  {:<9}  {:>6}  {}\n",
        "TASK", "KIND", "STATUS", "DONE", "MESSAGE"
    );
    for task in tasks {
        out.push_str(&format!(
            "{:<36}  {:<16}  {:<9}  {:>5.1}%  {}\n",
            task.task_id, task.kind, task.status, task.percent, task.message
        ));
    }
    out.trim_end().to_owned()
}

fn describe(task: &TaskInfo) -> String {
    let mut out = format!(
        "task     {}\nkind     {}\nstatus   {}\nprogress {}/{} ({:.1}%)\nmessage  {}\nowner    {}\ncreated  {}\nupdated  {}",
        task.task_id,
        task.kind,
        task.status,
        task.progress,
        task.total,
        task.percent,
        task.message,
        task.owner,
        task.created_at.to_rfc3339(),
        task.updated_at.to_rfc3339()
    );
    if let Some(error) = &task.error {
        out.push_str(&format!("\nerror    {error}"));
    }
    if let Some(question) = &task.question {
        out.push_str(&format!(
            "\nasks     {} ({}; answer with `durable-mcp task answer {}`)",
            question.message, question.id, task.task_id
        ));
    }
    if let Some(result) = &task.result_data {
        out.push_str(&format!("\nresult   {result}"));
    }
    out
}
