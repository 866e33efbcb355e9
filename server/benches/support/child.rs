//! durable-mcp in a process of its own, so that its memory can be read and it can be killed:
//! the bench binary, run again with `DURABLE_BENCH_ROLE` set (see [`role`]). A bench's `main`
//! hands a child its role before doing anything else.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Stdio;

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::ChildStdin;
use tokio_util::sync::CancellationToken;

const ROLE_VAR: &str = "DURABLE_BENCH_ROLE";
/// The role of a durable-mcp server process.
pub const SERVE: &str = "serve";

/// The role this process was started in, if it is a bench's child.
pub fn role() -> Option<String> {
    std::env::var_os(ROLE_VAR).map(|role| role.to_string_lossy().into_owned())
}

/// Ends this process when the bench that started it goes away: a bench killed before it could
/// kill its children closes its end of their stdin.
pub fn exit_with_parent() {
    std::thread::spawn(|| {
        let _ = std::io::copy(&mut std::io::stdin(), &mut std::io::sink());
        std::process::exit(1);
    });
}

/// Prints the bound address on stdout, where [`Starting::listening`] waits for it.
pub fn announce(address: impl std::fmt::Display) {
    let mut stdout = std::io::stdout();
    writeln!(stdout, "{address}").unwrap();
    stdout.flush().unwrap();
}

/// The child's side of role [`SERVE`]: serves durable-mcp with the bench settings on `DB` and
/// `DATA`, on `127.0.0.1:PORT` (0 when unset), with task delays scaled by `TIME_SCALE` (1, real
/// seconds, when unset) and sessions dormant after `DORMANT_AFTER` seconds (the bench
/// settings' when unset).
pub fn serve() {
    exit_with_parent();
    // Warnings and errors on stderr, interleaved with the bench's report.
    tracing_subscriber::fmt()
        .with_max_level(tracing::Level::WARN)
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .init();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let var = |name| PathBuf::from(std::env::var_os(name).expect(name));
        let number = |name: &str, default: &str| std::env::var(name).unwrap_or(default.into());
        let mut config = super::config(&var("DB"), &var("DATA"));
        // The running-task limit stays at its default: a task that sleeps lends its slot out.
        config.time_scale = number("TIME_SCALE", "1").parse().expect("TIME_SCALE");
        if let Ok(seconds) = std::env::var("DORMANT_AFTER") {
            config.session_dormant_after =
                std::time::Duration::from_secs_f64(seconds.parse().expect("DORMANT_AFTER"));
        }
        let port: u16 = number("PORT", "0").parse().expect("PORT");
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
            .await
            .unwrap();
        announce(listener.local_addr().unwrap());
        durable_mcp_server::http::run(config, listener, CancellationToken::new())
            .await
            .unwrap();
    });
}

/// A server process on its way up.
pub struct Starting(tokio::process::Child);

/// A server process that is listening.
pub struct Server {
    pub url: String,
    process: tokio::process::Child,
    /// Held open for the process's life: it exits when this closes (see [`exit_with_parent`]).
    _stdin: ChildStdin,
}

impl Server {
    /// Starts a durable-mcp process on `db`; see [`Starting::listening`].
    pub fn start(db: &Path, data: &Path) -> Starting {
        Self::start_as(SERVE, db, data, &[])
    }

    /// Starts this bench binary in `role`, with `DB`, `DATA` and `env` set.
    pub fn start_as(role: &str, db: &Path, data: &Path, env: &[(&str, String)]) -> Starting {
        let process = tokio::process::Command::new(std::env::current_exe().unwrap())
            .env(ROLE_VAR, role)
            .env("DB", db)
            .env("DATA", data)
            .envs(env.iter().map(|(name, value)| (name, value)))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            // A bench that panics must not leave a server behind.
            .kill_on_drop(true)
            .spawn()
            .expect("spawning the server process");
        Starting(process)
    }

    /// Starts a server process on `db` and waits until it answers.
    pub async fn spawn(db: &Path, data: &Path) -> Server {
        Server::start(db, data).healthy().await
    }

    /// Resident memory, from `/proc/<pid>/status`.
    pub fn rss_mib(&self) -> f64 {
        let pid = self.process.id().expect("server process running");
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
        let kib: f64 = status
            .lines()
            .find_map(|line| line.strip_prefix("VmRSS:"))
            .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
            .expect("VmRSS in /proc status");
        kib / 1024.0
    }

    /// SIGKILL: the process gets no chance to checkpoint or close anything.
    pub async fn kill(&mut self) {
        let pid = self.process.id().expect("server process running");
        kill(Pid::from_raw(pid as i32), Signal::SIGKILL).unwrap();
        self.process.wait().await.unwrap();
    }
}

impl Starting {
    /// Waits for the address the server prints once its listener is bound (it answers as
    /// soon as it has opened its database and resumed its tasks).
    pub async fn listening(mut self) -> Server {
        let stdin = self.0.stdin.take().expect("server stdin");
        let stdout = self.0.stdout.take().expect("server stdout");
        let mut line = String::new();
        BufReader::new(stdout).read_line(&mut line).await.unwrap();
        assert!(!line.is_empty(), "server process exited before listening");
        Server {
            url: format!("http://{}/mcp", line.trim()),
            process: self.0,
            _stdin: stdin,
        }
    }

    /// Waits until the server listens and `/healthz` answers.
    pub async fn healthy(self) -> Server {
        let server = self.listening().await;
        let health = server.url.replace("/mcp", "/healthz");
        let response = reqwest::get(health).await.unwrap();
        assert!(response.status().is_success(), "server unhealthy");
        server
    }
}
