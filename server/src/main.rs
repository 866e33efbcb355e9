//! The `durable-mcp` binary: parse the command line, set up logging, bind, serve.

use std::io::IsTerminal;
use std::process::ExitCode;

use anyhow::Context;
use clap::Parser;
use durable_mcp::config::{Cli, Command};
use tokio_util::sync::CancellationToken;
use tracing_subscriber::EnvFilter;

#[tokio::main]
async fn main() -> anyhow::Result<ExitCode> {
    let cli = Cli::parse();
    // The server logs its lifecycle; client commands only warnings, to keep their output clean.
    let default_filter = match cli.command {
        Some(Command::Task { .. } | Command::Stats { .. }) => "warn,rmcp=off",
        _ => "info,tower_http=warn,rmcp=warn",
    };
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default_filter)),
        )
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr)
        .init();

    let args = match cli.command {
        Some(Command::Serve(args)) => args,
        None => cli.serve,
        Some(command) => return Ok(durable_mcp::cli::run(command).await),
    };
    let listener = tokio::net::TcpListener::bind((args.host, args.port))
        .await
        .with_context(|| format!("binding {}:{}", args.host, args.port))?;
    let address = listener.local_addr()?;
    // Printed on stdout, alone on its line, so scripts and tests can find a port-0 server.
    println!("durable-mcp listening on http://{address}/mcp");

    let shutdown = CancellationToken::new();
    tokio::spawn(signal_shutdown(shutdown.clone()));
    durable_mcp::http::run(args, listener, shutdown).await?;
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
