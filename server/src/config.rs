//! Command-line and environment configuration.

use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

/// durable-mcp: an MCP server whose long-running tools survive crashes, restarts and dropped
/// clients.
///
/// Without a subcommand it serves: MCP (Streamable HTTP) at /mcp and the dashboard at /.
#[derive(Debug, Parser)]
#[command(name = "durable-mcp", version, args_conflicts_with_subcommands = true)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,
    #[command(flatten)]
    pub serve: ServeArgs,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Serve MCP at /mcp and the dashboard at / (the default).
    Serve(ServeArgs),
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
    /// a dropped connection), the same command continues from the task's checkpoint.
    Process {
        #[command(flatten)]
        client: ClientArgs,
        #[arg(long, default_value = "default_dataset")]
        dataset_name: String,
        #[arg(long, default_value_t = 100)]
        total_records: u64,
        #[arg(long, default_value_t = 10)]
        batch_size: u64,
    },
}

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

    /// Print machine-readable JSON instead of text.
    #[arg(long, global = true)]
    pub json: bool,

    /// Where the client keeps its persistent client id (default: the XDG state directory,
    /// ~/.local/state/durable-mcp/client.json).
    #[arg(long, env = "DURABLE_MCP_STATE_FILE", global = true)]
    pub state_file: Option<PathBuf>,
}

#[derive(Debug, Clone, Subcommand)]
pub enum TaskCommand {
    /// Start a background task and print its id and task://status link.
    Start {
        /// Follow the task to its end, like `task watch`.
        #[arg(long, global = true)]
        watch: bool,
        #[command(subcommand)]
        kind: StartKind,
    },
    /// Follow a task with a progress bar until it ends; the exit code tells how it ended
    /// (0 completed, 4 failed, 5 cancelled). Ctrl-C stops watching, not the task.
    Watch { task_id: String },
    /// List tasks, newest first.
    List {
        /// Only tasks with this status (pending, running, paused, completed, failed, cancelled).
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
}

/// The background kinds, with the tools' parameters and defaults.
#[derive(Debug, Clone, Subcommand)]
pub enum StartKind {
    /// Copy records from a source (file in the data directory or sample:customers) to JSONL.
    DataMigration {
        #[arg(long, default_value = "sample:customers")]
        source_path: String,
        #[arg(long, default_value = "out/customers.jsonl")]
        destination_path: String,
        #[arg(long, default_value_t = 1000)]
        record_count: u64,
    },
    /// Process items in batches.
    BatchProcessing {
        #[arg(long)]
        batch_size: u64,
        #[arg(long)]
        total_items: u64,
        /// Simulated seconds of work per batch.
        #[arg(long, default_value_t = 10.0)]
        processing_delay: f64,
    },
    /// Train a logistic-regression model on a synthetic data set.
    MlTraining {
        #[arg(long)]
        model_name: String,
        #[arg(long, default_value_t = 10_000)]
        dataset_size: u64,
        #[arg(long, default_value_t = 100)]
        epochs: u64,
    },
}

/// Settings of the server. Every flag can also be set through the environment variable shown.
#[derive(Debug, Clone, Args)]
pub struct ServeArgs {
    /// Address to listen on. Keep the loopback default unless a proxy with authentication sits
    /// in front: the server has no authentication of its own.
    #[arg(long, env = "DURABLE_MCP_HOST", default_value = "127.0.0.1")]
    pub host: IpAddr,

    /// Port to listen on; 0 picks a free one (the chosen address is printed).
    #[arg(long, env = "DURABLE_MCP_PORT", default_value_t = 8080)]
    pub port: u16,

    /// SQLite database holding tasks and checkpoints (created if missing).
    #[arg(long, env = "DURABLE_MCP_DB", default_value = "durable-mcp.db")]
    pub db: PathBuf,

    /// Directory that data-migration source and destination paths are resolved in (created if
    /// missing); nothing outside it is read or written.
    #[arg(long, env = "DURABLE_MCP_DATA_DIR", default_value = "data")]
    pub data_dir: PathBuf,

    /// Factor applied to every simulated delay: 0.01 makes a 10 s epoch take 0.1 s.
    #[arg(long, env = "DURABLE_MCP_TIME_SCALE", default_value_t = 1.0, value_parser = parse_time_scale)]
    pub time_scale: f64,

    /// Completed, failed and cancelled tasks are deleted this long after they finished
    /// (e.g. 7d, 12h, 30m).
    #[arg(long, env = "DURABLE_MCP_RETENTION", default_value = "7d", value_parser = humantime::parse_duration)]
    pub retention: Duration,

    /// How often expired tasks are looked for.
    #[arg(long, env = "DURABLE_MCP_RETENTION_INTERVAL", default_value = "10m", value_parser = humantime::parse_duration)]
    pub retention_interval: Duration,

    /// Tasks advanced at the same time; further ones wait as `pending`.
    #[arg(long, env = "DURABLE_MCP_MAX_RUNNING_TASKS", default_value_t = 32)]
    pub max_running_tasks: usize,

    /// An MCP session with no request and no open stream for this long is deleted with its
    /// stored events; its client gets 404 and initializes again.
    #[arg(long, env = "DURABLE_MCP_SESSION_TTL", default_value = "1h", value_parser = humantime::parse_duration)]
    pub session_ttl: Duration,

    /// Stored SSE events older than this are deleted even while their session lives; resuming
    /// from before then gets 410.
    #[arg(long, env = "DURABLE_MCP_EVENT_MAX_AGE", default_value = "24h", value_parser = humantime::parse_duration)]
    pub event_max_age: Duration,

    /// Reconnect delay suggested to clients in SSE priming events (`retry:`).
    #[arg(long, env = "DURABLE_MCP_SSE_RETRY", default_value = "3s", value_parser = humantime::parse_duration)]
    pub sse_retry: Duration,

    /// Interval of keep-alive comments on open SSE streams.
    #[arg(long, env = "DURABLE_MCP_SSE_KEEP_ALIVE", default_value = "15s", value_parser = humantime::parse_duration)]
    pub sse_keep_alive: Duration,

    /// Browser origins allowed besides loopback ones (comma-separated, e.g.
    /// https://ops.example.com). Requests from any other Origin get 403.
    #[arg(
        long = "allowed-origin",
        env = "DURABLE_MCP_ALLOWED_ORIGINS",
        value_delimiter = ','
    )]
    pub allowed_origins: Vec<String>,

    /// Host names accepted in the Host header besides loopback ones (comma-separated); needed
    /// when clients reach the server under a public name.
    #[arg(
        long = "allowed-host",
        env = "DURABLE_MCP_ALLOWED_HOSTS",
        value_delimiter = ','
    )]
    pub allowed_hosts: Vec<String>,

    /// Largest accepted request body in bytes; larger ones get 413.
    #[arg(long, env = "DURABLE_MCP_MAX_BODY_BYTES", default_value_t = 1024 * 1024)]
    pub max_body_bytes: usize,

    /// Directory of the built dashboard (Trunk's dist) served at /.
    #[arg(long, env = "DURABLE_MCP_DASHBOARD_DIR", default_value = "web/dist")]
    pub dashboard_dir: PathBuf,

    /// On SIGTERM or Ctrl-C, how long to wait for tasks to checkpoint and connections to close.
    #[arg(long, env = "DURABLE_MCP_SHUTDOWN_GRACE", default_value = "5s", value_parser = humantime::parse_duration)]
    pub shutdown_grace: Duration,
}

fn parse_time_scale(text: &str) -> Result<f64, String> {
    let value: f64 = text
        .parse()
        .map_err(|_| format!("{text:?} is not a number"))?;
    if !(0.0..=1000.0).contains(&value) {
        return Err(format!("must be between 0 and 1000, got {value}"));
    }
    Ok(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_work_with_and_without_the_serve_subcommand() {
        let bare = Cli::try_parse_from(["durable-mcp", "--port", "9000"]).unwrap();
        assert_eq!(bare.serve.port, 9000);
        let explicit = Cli::try_parse_from(["durable-mcp", "serve", "--port", "9001"]).unwrap();
        match explicit.command {
            Some(Command::Serve(args)) => assert_eq!(args.port, 9001),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn bad_values_are_refused_with_the_reason() {
        let err = Cli::try_parse_from(["durable-mcp", "--time-scale=-1"]).unwrap_err();
        assert!(
            err.to_string().contains("must be between 0 and 1000"),
            "{err}"
        );
        let err = Cli::try_parse_from(["durable-mcp", "--retention", "soon"]).unwrap_err();
        assert!(err.to_string().contains("--retention"), "{err}");
    }
}
