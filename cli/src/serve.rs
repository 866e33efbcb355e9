//! `durable-mcp serve`: the server's flags, each with its environment variable and default, and
//! the [`Config`] they make.

use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use durable_mcp_server::auth::{AuthConfig, JwksSource};
use durable_mcp_server::config::{self, Config, Limits};
use durable_mcp_server::store::Database;

/// Settings of the server. Every flag can also be set through the environment variable shown.
#[derive(Debug, Clone, Args)]
pub struct ServeArgs {
    /// Address to listen on. Any address but a loopback one needs --auth-issuer (or
    /// --unsafe-no-auth): without authorization, every client sees and steers every task.
    #[arg(long, env = "DURABLE_MCP_HOST", default_value = "127.0.0.1")]
    pub host: IpAddr,

    /// Serve a non-loopback address without authorization: anyone who reaches the port can see,
    /// start, steer and cancel every task. Only behind a proxy that authenticates.
    #[arg(long, env = "DURABLE_MCP_UNSAFE_NO_AUTH")]
    pub unsafe_no_auth: bool,

    /// OAuth authorization server whose bearer tokens `/mcp` requires (the tokens' `iss`, e.g.
    /// https://keycloak.example.com/realms/ops). With it, every task, session and file belongs
    /// to the token's subject; needs --auth-audience and a JWKS source.
    #[arg(long, env = "DURABLE_MCP_AUTH_ISSUER", requires = "auth_audience")]
    pub auth_issuer: Option<String>,

    /// This server's resource identifier, which tokens must carry in `aud` (RFC 8707), best its
    /// public URL, e.g. https://mcp.example.com/mcp.
    #[arg(long, env = "DURABLE_MCP_AUTH_AUDIENCE", requires = "auth_issuer")]
    pub auth_audience: Option<String>,

    /// The issuer's signing keys as a JWKS file (for air-gapped use; re-read when a token names
    /// a key it lacks).
    #[arg(
        long,
        env = "DURABLE_MCP_AUTH_JWKS_FILE",
        conflicts_with = "auth_jwks_url",
        requires = "auth_issuer"
    )]
    pub auth_jwks_file: Option<PathBuf>,

    /// The issuer's JWKS URL (its `jwks_uri`), fetched at start and again when a token names a
    /// key it lacks (at most every 30 s).
    #[arg(long, env = "DURABLE_MCP_AUTH_JWKS_URL", requires = "auth_issuer")]
    pub auth_jwks_url: Option<String>,

    /// Unfinished (pending, running, paused) tasks one owner may have.
    #[arg(long, env = "DURABLE_MCP_MAX_TASKS_PER_OWNER", default_value_t = Limits::default().tasks_per_owner)]
    pub max_tasks_per_owner: u64,

    /// Live MCP sessions one authenticated subject may have.
    #[arg(long, env = "DURABLE_MCP_MAX_SESSIONS_PER_SUBJECT", default_value_t = Limits::default().sessions_per_subject)]
    pub max_sessions_per_subject: u64,

    /// Open SSE streams (listening streams and streamed answers) one session may have.
    #[arg(long, env = "DURABLE_MCP_MAX_STREAMS_PER_SESSION", default_value_t = Limits::default().streams_per_session, value_parser = parse_at_least_one)]
    pub max_streams_per_session: usize,

    /// Resource subscriptions one session may have.
    #[arg(long, env = "DURABLE_MCP_MAX_SUBSCRIPTIONS_PER_SESSION", default_value_t = Limits::default().subscriptions_per_session)]
    pub max_subscriptions_per_session: usize,

    /// Requests to /mcp served at once over all clients (listening streams excepted); more get
    /// 429 with Retry-After.
    #[arg(long, env = "DURABLE_MCP_MAX_CONCURRENT_REQUESTS", default_value_t = Limits::default().concurrent_requests, value_parser = parse_at_least_one)]
    pub max_concurrent_requests: usize,

    /// Port to listen on; 0 picks a free one (the chosen address is printed).
    #[arg(long, env = "DURABLE_MCP_PORT", default_value_t = 8080)]
    pub port: u16,

    /// SQLite database holding tasks and checkpoints (created if missing); the embedded
    /// default for one machine.
    #[arg(long, env = "DURABLE_MCP_DB", default_value = "durable-mcp.db")]
    pub db: PathBuf,

    /// PostgreSQL database to keep the state in instead of --db, so that several nodes can
    /// share it: postgres://user[:password]@host[:port]/database. TLS is not supported: keep
    /// the database on the same machine or a private network.
    #[arg(long, env = "DURABLE_MCP_DATABASE_URL", value_parser = parse_database_url, conflicts_with = "db")]
    pub database_url: Option<String>,

    /// This server's id among the nodes sharing a PostgreSQL database (letters, digits, `.`,
    /// `_` and `-`). Each node needs its own; the default is a random one per start. A node
    /// restarted under the same id takes its tasks back at once instead of after their leases
    /// lapse.
    #[arg(long, env = "DURABLE_MCP_NODE_ID", value_parser = parse_node_id)]
    pub node_id: Option<String>,

    /// How long a node's lease on a task lasts unless renewed (every third of it): when a node
    /// dies, another takes its tasks over within this plus one step.
    #[arg(long, env = "DURABLE_MCP_LEASE_TTL", default_value = "10s", value_parser = parse_lease_ttl)]
    pub lease_ttl: Duration,

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

    /// Tasks doing work at the same time; further ones wait as `pending`, in order. A task whose
    /// step waits (I/O, a simulated delay) lends its slot to another while it waits, and one
    /// that has finished its last step waits for that step's commit without one, so this
    /// bounds CPU and database work, not how many tasks make progress: thousands of mostly
    /// waiting tasks all advance. 32 keeps a small machine's cores and the single SQLite writer
    /// busy without letting a burst of compute-heavy tasks starve requests.
    #[arg(long, env = "DURABLE_MCP_MAX_RUNNING_TASKS", default_value_t = 32, value_parser = parse_at_least_one)]
    pub max_running_tasks: usize,

    /// Notifications a session may fall behind (a slow client, a stalled connection) before it
    /// is resynchronised: sent the current state of what it follows instead of each change.
    #[arg(long, env = "DURABLE_MCP_NOTIFICATION_BUFFER", default_value_t = 1024, value_parser = parse_at_least_one)]
    pub notification_buffer: usize,

    /// An MCP session with no request and no open stream for this long is deleted with its
    /// stored events; its client gets 404 and initializes again.
    #[arg(long, env = "DURABLE_MCP_SESSION_TTL", default_value = "1h", value_parser = humantime::parse_duration)]
    pub session_ttl: Duration,

    /// An MCP session with no request, no open stream, no call in progress and nothing it
    /// follows (subscriptions, its client's unfinished tasks) for this long leaves memory,
    /// where rmcp keeps about 70 KiB of it: it stays stored, and its next request restores it
    /// (about a millisecond, once), so a server's memory follows the sessions in use, not the
    /// sessions open.
    #[arg(long, env = "DURABLE_MCP_SESSION_DORMANT_AFTER", default_value = "1m", value_parser = parse_dormancy)]
    pub session_dormant_after: Duration,

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

    /// Directory of the built dashboard (Trunk's dist) served at /. Default: web/dist if it
    /// holds a build, else the dashboard built into the binary (feature embedded-dashboard)
    #[arg(long, env = "DURABLE_MCP_DASHBOARD_DIR")]
    pub dashboard_dir: Option<PathBuf>,

    /// On SIGTERM or Ctrl-C, how long to wait for tasks to checkpoint and connections to close.
    #[arg(long, env = "DURABLE_MCP_SHUTDOWN_GRACE", default_value = "5s", value_parser = humantime::parse_duration)]
    pub shutdown_grace: Duration,
}

impl ServeArgs {
    /// The server's settings; the address is bound by `main`. Refuses a non-loopback address
    /// without authorization (unless told it is on purpose) and an issuer without keys.
    pub fn into_config(self) -> anyhow::Result<Config> {
        let auth = match (self.auth_issuer, self.auth_audience) {
            (Some(issuer), Some(audience)) => {
                let jwks = match (self.auth_jwks_file, self.auth_jwks_url) {
                    (Some(path), None) => JwksSource::File(path),
                    (None, Some(url)) => JwksSource::Url(url),
                    _ => anyhow::bail!(
                        "--auth-issuer needs the issuer's keys: --auth-jwks-file or --auth-jwks-url"
                    ),
                };
                Some(AuthConfig {
                    issuer,
                    audience,
                    jwks,
                })
            }
            _ => None,
        };
        if auth.is_none() && !self.host.is_loopback() && !self.unsafe_no_auth {
            anyhow::bail!(
                "refusing to serve {} without authorization: anyone who reaches it could see and \
                 steer every task. Set --auth-issuer, --auth-audience and a JWKS source, or pass \
                 --unsafe-no-auth if a proxy in front authenticates",
                self.host
            );
        }
        Ok(Config {
            database: match self.database_url {
                Some(url) => Database::Postgres(url),
                None => Database::Sqlite(self.db),
            },
            node_id: self.node_id.unwrap_or_else(config::random_node_id),
            lease_ttl: self.lease_ttl,
            data_dir: self.data_dir,
            time_scale: self.time_scale,
            retention: self.retention,
            retention_interval: self.retention_interval,
            max_running_tasks: self.max_running_tasks,
            notification_buffer: self.notification_buffer,
            session_ttl: self.session_ttl,
            session_dormant_after: self.session_dormant_after,
            event_max_age: self.event_max_age,
            sse_retry: self.sse_retry,
            sse_keep_alive: self.sse_keep_alive,
            allowed_origins: self.allowed_origins,
            allowed_hosts: self.allowed_hosts,
            max_body_bytes: self.max_body_bytes,
            dashboard_dir: self.dashboard_dir,
            shutdown_grace: self.shutdown_grace,
            auth,
            limits: Limits {
                tasks_per_owner: self.max_tasks_per_owner,
                sessions_per_subject: self.max_sessions_per_subject,
                streams_per_session: self.max_streams_per_session,
                subscriptions_per_session: self.max_subscriptions_per_session,
                concurrent_requests: self.max_concurrent_requests,
            },
        })
    }
}

fn parse_database_url(text: &str) -> Result<String, String> {
    if text.starts_with("postgres://") || text.starts_with("postgresql://") {
        Ok(text.to_owned())
    } else {
        Err("must be a postgres:// URL, e.g. postgres://durable@127.0.0.1:5432/durable".into())
    }
}

fn parse_node_id(text: &str) -> Result<String, String> {
    let valid = (1..=64).contains(&text.len())
        && text
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'));
    if valid {
        Ok(text.to_owned())
    } else {
        Err("must be 1 to 64 letters, digits, '.', '_' or '-'".into())
    }
}

fn parse_lease_ttl(text: &str) -> Result<Duration, String> {
    let ttl = humantime::parse_duration(text).map_err(|e| e.to_string())?;
    if ttl < Duration::from_secs(1) {
        return Err(format!("must be at least 1s, got {text}"));
    }
    Ok(ttl)
}

fn parse_at_least_one(text: &str) -> Result<usize, String> {
    match text.parse::<usize>() {
        Ok(0) => Err("must be at least 1".into()),
        Ok(value) => Ok(value),
        Err(_) => Err(format!("{text:?} is not a whole number")),
    }
}

/// A dormancy period of at least a second: a session put to sleep at every sweep would be
/// restored at nearly every request.
fn parse_dormancy(text: &str) -> Result<Duration, String> {
    let period = humantime::parse_duration(text).map_err(|e| e.to_string())?;
    if period < Duration::from_secs(1) {
        return Err("must be at least 1s".into());
    }
    Ok(period)
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
