//! The client's command line. The flags of `task start <kind>` and `process` are not written
//! here: they are read from the server's tool schemas (see [`crate::forms`]), so every kind the
//! server offers has its flags, defaults and bounds without a change to this crate.

use std::path::PathBuf;

use clap::{Args, Subcommand, ValueEnum};

/// How the client subcommands reach the server and who they are.
#[derive(Debug, Clone, Args)]
pub struct ClientArgs {
    /// The server's MCP endpoint.
    #[arg(
        long,
        env = "DURABLE_MCP_SERVER",
        default_value = "http://127.0.0.1:8080/mcp",
        global = true
    )]
    pub server: String,

    /// OAuth bearer token for a server that requires one (sent as Authorization: Bearer). Your
    /// tasks are then the token subject's, whatever the client id.
    #[arg(long, env = "DURABLE_MCP_TOKEN", global = true, hide_env_values = true)]
    pub token: Option<String>,

    /// Print machine-readable JSON instead of text.
    #[arg(long, global = true)]
    pub json: bool,

    /// Where the client keeps its persistent client id (default: the XDG state directory,
    /// ~/.local/state/durable-mcp/client.json).
    #[arg(long, env = "DURABLE_MCP_STATE_FILE", global = true)]
    pub state_file: Option<PathBuf>,

    /// Which MCP lifecycle to use. `auto` asks the server with server/discover and speaks the
    /// stateless 2026-07-28 revision where the server offers it, or else starts a 2025-11-25
    /// session as servers before that revision expect; the other two insist on one.
    #[arg(
        long,
        env = "DURABLE_MCP_PROTOCOL",
        value_enum,
        default_value_t = Protocol::Auto,
        global = true
    )]
    pub protocol: Protocol,
}

/// The MCP lifecycles the client can speak (see [`ClientArgs::protocol`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Protocol {
    /// server/discover first, a session where the server does not know it.
    Auto,
    /// The stateless 2026-07-28 revision only.
    Stateless,
    /// An initialized 2025-11-25 session only.
    Session,
}

/// The client subcommands of `durable-mcp`.
#[derive(Debug, Subcommand)]
pub enum ClientCommand {
    /// Start, list, inspect and steer tasks on a running server.
    Task {
        #[command(flatten)]
        client: ClientArgs,
        #[command(subcommand)]
        command: TaskCommand,
    },
    /// Tasks per status on a running server.
    Stats {
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Run resumable_data_processing inside the call, with a progress bar. Interrupted (Ctrl-C,
    /// a dropped connection), the same command continues from the task's checkpoint. Its flags
    /// are the tool's arguments (`durable-mcp process --help` asks the server for them).
    Process {
        #[command(flatten)]
        client: ClientArgs,
        /// `--field value` pairs, read against the tool's schema.
        #[arg(
            trailing_var_arg = true,
            allow_hyphen_values = true,
            value_name = "ARGUMENTS"
        )]
        arguments: Vec<String>,
    },
}

#[derive(Debug, Clone, Subcommand)]
pub enum TaskCommand {
    /// Start a background task of KIND (data-migration, batch-processing, ml-training, or any
    /// other kind the server offers) and print its id and task://status link. The flags are
    /// the kind's parameters: `task start KIND --help` lists them with defaults and bounds.
    Start {
        /// Follow the task to its end, like `task watch`.
        #[arg(long)]
        watch: bool,
        kind: String,
        /// `--field value` pairs, read against the kind's schema.
        #[arg(
            trailing_var_arg = true,
            allow_hyphen_values = true,
            value_name = "ARGUMENTS"
        )]
        arguments: Vec<String>,
    },
    /// Follow a task with a progress bar until it ends; the exit code tells how it ended
    /// (0 completed, 4 failed, 5 cancelled). Ctrl-C stops watching, not the task.
    Watch { task_id: String },
    /// List tasks, newest first.
    List {
        /// Only tasks with this status (pending, running, paused, input_required, completed,
        /// failed, cancelled).
        #[arg(long)]
        status: Option<String>,
        /// Only this client's tasks.
        #[arg(long)]
        mine: bool,
    },
    /// Show one task.
    Show { task_id: String },
    /// Pause a task at its next step boundary.
    Pause { task_id: String },
    /// Resume a paused task from its checkpoint.
    Resume { task_id: String },
    /// Cancel a task for good.
    Cancel { task_id: String },
    /// Answer the question of a task that waits for input (status input_required). Without
    /// --answer or --decline it shows the question and asks for each field on the terminal.
    Answer {
        task_id: String,
        /// The answer as a JSON object with the fields the question asks for, e.g.
        /// '{"hotel": "Harbour View Lisbon"}'.
        #[arg(long, value_name = "JSON", conflicts_with = "decline")]
        answer: Option<String>,
        /// Decline to answer.
        #[arg(long)]
        decline: bool,
    },
}
