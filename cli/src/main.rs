//! The `durable-mcp` binary: the server (`durable-mcp [serve]`) and its command-line client
//! (`durable-mcp task …`, `process`, `stats`) in one executable. It parses the command line,
//! sets up logging and hands over to the server or the client crate.

mod serve;

durable_mcp_server::jemalloc!();

use std::io::IsTerminal;
use std::process::ExitCode;

use anyhow::Context;
use clap::{Parser, Subcommand};
use durable_mcp_client::args::ClientCommand;
use serve::ServeArgs;
use tokio_util::sync::CancellationToken;
use tracing_subscriber::EnvFilter;

/// durable-mcp: an MCP server whose long-running tools survive crashes, restarts and dropped
/// clients.
///
/// Without a subcommand it serves: MCP (Streamable HTTP) at /mcp and the dashboard at /.
#[derive(Debug, Parser)]
#[command(name = "durable-mcp", version, args_conflicts_with_subcommands = true)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    /// How logs are written to stderr: `text` for people, `json` (one object per line, with
    /// the request's or task step's span) for a log collector.
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text, env = "DURABLE_MCP_LOG_FORMAT")]
    log_format: LogFormat,
    #[command(flatten)]
    serve: ServeArgs,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Serve MCP at /mcp and the dashboard at / (the default).
    Serve(Box<ServeArgs>),
    #[command(flatten)]
    Client(ClientCommand),
}

#[tokio::main]
async fn main() -> anyhow::Result<ExitCode> {
    let cli = Cli::parse();
    // The server logs its lifecycle; client commands only warnings, to keep their output clean.
    let default_filter = match cli.command {
        Some(Command::Client(_)) => "warn,rmcp=off",
        _ => "info,tower_http=warn,rmcp=warn",
    };
    let logs = tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default_filter)),
        )
        .with_writer(std::io::stderr);
    match cli.log_format {
        LogFormat::Text => logs.with_ansi(std::io::stderr().is_terminal()).init(),
        LogFormat::Json => logs
            .json()
            .with_current_span(true)
            .with_span_list(true)
            .init(),
    }

    let args = match cli.command {
        Some(Command::Serve(args)) => *args,
        None => cli.serve,
        Some(Command::Client(command)) => return Ok(durable_mcp_client::run(command).await),
    };
    let (host, port) = (args.host, args.port);
    let config = args.into_config()?;
    let listener = tokio::net::TcpListener::bind((host, port))
        .await
        .with_context(|| format!("binding {host}:{port}"))?;
    let address = listener.local_addr()?;
    // Printed on stdout, alone on its line, so scripts and tests can find a port-0 server.
    println!("durable-mcp listening on http://{address}/mcp");

    let shutdown = CancellationToken::new();
    tokio::spawn(signal_shutdown(shutdown.clone()));
    durable_mcp_server::http::run(config, listener, shutdown).await?;
    Ok(ExitCode::SUCCESS)
}

/// Fires `shutdown` on Ctrl-C or SIGTERM.
async fn signal_shutdown(shutdown: CancellationToken) {
    let ctrl_c = tokio::signal::ctrl_c();
    let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(term) => term,
        Err(e) => {
            tracing::error!(error = %e, "cannot listen for SIGTERM");
            let _ = ctrl_c.await;
            shutdown.cancel();
            return;
        }
    };
    tokio::select! {
        _ = ctrl_c => {}
        _ = term.recv() => {}
    }
    tracing::info!("shutting down: checkpointing tasks");
    shutdown.cancel();
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

    #[test]
    fn client_commands_sit_beside_serve() {
        let cli = Cli::try_parse_from([
            "durable-mcp",
            "task",
            "start",
            "batch-processing",
            "--batch-size",
            "2",
            "--json",
        ])
        .unwrap();
        assert!(matches!(cli.command, Some(Command::Client(_))), "{cli:?}");
    }
}
