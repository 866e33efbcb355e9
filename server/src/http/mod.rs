//! The HTTP front: MCP Streamable HTTP at `/mcp`, the dashboard at `/`, and the wiring of store,
//! engine and MCP service under one cancellation token.
//!
//! The middleware in front of `/mcp` lives beside it: `resume` (resumable streams, session
//! checks) and `task_requests` (the 2025-11-25 task requests renamed for rmcp), each with its
//! decisions as plain functions; `origin` matches browser origins.

mod origin;
mod resume;
mod task_requests;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use axum::Router;
use axum::http::{HeaderName, HeaderValue, Method, header};
use axum::response::Html;
use axum::routing::get;
use axum::serve::ListenerExt;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{
    SessionManager, StreamableHttpServerConfig, StreamableHttpService,
};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tower_http::cors::{AllowOrigin, CorsLayer};
use tower_http::services::{ServeDir, ServeFile};
use tower_http::trace::TraceLayer;

use crate::config::ServeArgs;
use crate::engine::{Engine, EngineConfig, Env};
use crate::kinds;
use crate::mcp::{CLIENT_ID_HEADER, DurableServer, TaskTtl, legacy_capability, relay};
use crate::store::Store;
use crate::streams::StreamStore;
use resume::ResumeState;
use task_requests::AdaptState;

/// Browser origins always accepted: pages served from this machine (the dashboard itself, or
/// `trunk serve` during development).
const LOOPBACK_ORIGINS: [&str; 3] = ["http://127.0.0.1:*", "http://localhost:*", "http://[::1]:*"];
const LOOPBACK_HOSTS: [&str; 3] = ["127.0.0.1", "localhost", "::1"];
/// How long an MCP task handle is kept when its client does not ask (capped by `--retention`).
const DEFAULT_TASK_TTL: Duration = Duration::from_secs(24 * 60 * 60);

/// Opens the store, starts the engine (resuming unfinished tasks) and serves on `listener`
/// until `shutdown` fires; then lets tasks checkpoint and returns.
pub async fn run(
    args: ServeArgs,
    listener: TcpListener,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    std::fs::create_dir_all(&args.data_dir)
        .with_context(|| format!("creating data directory {}", args.data_dir.display()))?;
    let db = args.db.clone();
    let store = tokio::task::spawn_blocking(move || Store::open(&db))
        .await?
        .with_context(|| format!("opening task store at {}", args.db.display()))?;
    let engine = kinds::register_all(Engine::builder())
        .start(
            store,
            EngineConfig {
                env: Env {
                    data_dir: args.data_dir.clone(),
                    time_scale: args.time_scale,
                },
                max_running: args.max_running_tasks,
            },
            shutdown.child_token(),
        )
        .await
        .context("starting the task engine")?;
    engine.spawn_retention(args.retention, args.retention_interval);
    let streams = StreamStore::new(engine.store().clone(), shutdown.child_token());
    let sessions = Arc::new(session_manager(&args, &streams));
    tokio::spawn(sweep_sessions(
        streams.clone(),
        sessions.clone(),
        args.clone(),
        shutdown.child_token(),
    ));
    relay::resume_orphaned_calls(engine.clone(), streams.clone()).await;

    let app = router(&args, engine.clone(), streams, sessions, shutdown.clone());
    let server = axum::serve(
        listener.tap_io(|stream| {
            // rmcp writes SSE replies in small pieces; without NODELAY each waits ~40 ms for a
            // delayed ACK.
            if let Err(e) = stream.set_nodelay(true) {
                tracing::debug!(error = %e, "cannot set TCP_NODELAY");
            }
        }),
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .with_graceful_shutdown(shutdown.clone().cancelled_owned());

    let grace = args.shutdown_grace;
    tokio::select! {
        served = server => served.context("serving HTTP")?,
        // Graceful shutdown waits for open connections; a stuck one must not hold the process.
        _ = async { shutdown.cancelled().await; tokio::time::sleep(grace).await } => {
            tracing::warn!("connections still open after the grace period; closing them");
        }
    }
    if engine.wait_stopped(grace).await {
        tracing::info!("all tasks checkpointed; they resume at the next start");
    } else {
        tracing::warn!(
            "some task workers did not stop in time; they resume from their last checkpoint"
        );
    }
    Ok(())
}

fn session_manager(args: &ServeArgs, streams: &StreamStore) -> LocalSessionManager {
    let mut sessions = LocalSessionManager::default().with_event_store(Arc::new(streams.clone()));
    // rmcp's own idle timeout counts only requests, so it would close a session (and its open
    // GET stream) that is merely listening. The expiry sweep, which counts open streams as
    // activity, closes idle sessions instead.
    sessions.session_config.keep_alive = None;
    sessions.session_config.sse_retry = Some(args.sse_retry);
    sessions
}

/// Deletes expired sessions (with their events) from the store and from rmcp's memory, and
/// prunes old events, until shutdown.
async fn sweep_sessions(
    streams: StreamStore,
    sessions: Arc<LocalSessionManager>,
    args: ServeArgs,
    shutdown: CancellationToken,
) {
    let every = (args.session_ttl.min(args.event_max_age) / 10)
        .clamp(Duration::from_millis(100), Duration::from_secs(30));
    let mut ticks = tokio::time::interval(every);
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = ticks.tick() => {}
        }
        match streams.sweep(args.session_ttl, args.event_max_age).await {
            Ok(expired) => {
                for id in expired {
                    if let Err(e) = sessions.close_session(&id.clone().into()).await {
                        tracing::debug!(session_id = id, error = %e, "expired session was not open");
                    }
                }
            }
            Err(e) => tracing::error!(error = %e, "session sweep failed"),
        }
    }
}

fn router(
    args: &ServeArgs,
    engine: Engine,
    streams: StreamStore,
    sessions: Arc<LocalSessionManager>,
    shutdown: CancellationToken,
) -> Router {
    let origins: Vec<String> = LOOPBACK_ORIGINS
        .iter()
        .map(|origin| origin.to_string())
        .chain(args.allowed_origins.iter().cloned())
        .collect();
    let hosts: Vec<String> = LOOPBACK_HOSTS
        .iter()
        .map(|host| host.to_string())
        .chain(args.allowed_hosts.iter().cloned())
        .collect();
    let mut config = StreamableHttpServerConfig::default()
        .with_allowed_hosts(hosts)
        .with_allowed_origins(origins.clone())
        .enforce_origin_validation()
        .with_max_request_body_bytes(args.max_body_bytes)
        .with_sse_retry(Some(args.sse_retry))
        .with_sse_keep_alive(Some(args.sse_keep_alive))
        .with_cancellation_token(shutdown.child_token());
    config.session_store = Some(Arc::new(streams.clone()));
    let factory_shutdown = shutdown.clone();
    let factory_streams = streams.clone();
    let task_ttl = TaskTtl {
        default: DEFAULT_TASK_TTL.min(args.retention),
        max: args.retention,
    };
    let mcp = StreamableHttpService::new(
        move || {
            Ok(DurableServer::new(
                engine.clone(),
                factory_streams.clone(),
                task_ttl,
                factory_shutdown.clone(),
            ))
        },
        sessions,
        config,
    );
    let resume = ResumeState {
        streams,
        sse_retry: args.sse_retry,
        origins: Arc::new(origins.clone()),
        added_capabilities: Arc::new(
            [("tasks".to_owned(), legacy_capability())]
                .into_iter()
                .collect(),
        ),
    };

    Router::new()
        .route_service("/mcp", mcp)
        .route_layer(axum::middleware::from_fn_with_state(
            AdaptState {
                streams: resume.streams.clone(),
                max_body_bytes: args.max_body_bytes,
            },
            task_requests::adapt_task_requests,
        ))
        .route_layer(axum::middleware::from_fn_with_state(
            resume,
            resume::resumable,
        ))
        .route("/healthz", get(|| async { "ok" }))
        .fallback_service(dashboard(args))
        .layer(cors(&origins))
        .layer(TraceLayer::new_for_http())
}

/// CORS for browser clients on other allowed origins (same-origin pages need none). Exposes
/// `Mcp-Session-Id`, which a browser client must read to continue its session.
fn cors(origins: &[String]) -> CorsLayer {
    let patterns: Vec<String> = origins.to_vec();
    CorsLayer::new()
        .allow_origin(AllowOrigin::predicate(move |origin: &HeaderValue, _| {
            origin
                .to_str()
                .is_ok_and(|origin| origin::allowed(&patterns, origin))
        }))
        .allow_methods([Method::GET, Method::POST, Method::DELETE])
        .allow_headers([
            header::CONTENT_TYPE,
            header::ACCEPT,
            HeaderName::from_static("mcp-session-id"),
            HeaderName::from_static("mcp-protocol-version"),
            HeaderName::from_static("last-event-id"),
            HeaderName::from_static("mcp-method"),
            HeaderName::from_static("mcp-name"),
            HeaderName::from_static(CLIENT_ID_HEADER),
        ])
        .expose_headers([HeaderName::from_static("mcp-session-id")])
}

/// The built dashboard with single-page-app fallback, or a page saying how to build it.
fn dashboard(args: &ServeArgs) -> Router {
    let dir = &args.dashboard_dir;
    let index = dir.join("index.html");
    if index.is_file() {
        tracing::info!(dir = %dir.display(), "serving the dashboard");
        return Router::new().fallback_service(ServeDir::new(dir).fallback(ServeFile::new(index)));
    }
    tracing::warn!(dir = %dir.display(), "no dashboard build found; / explains how to build it");
    let page = format!(
        "<!doctype html><title>durable-mcp</title><h1>durable-mcp</h1>\
         <p>The MCP endpoint is at <code>/mcp</code>.</p>\
         <p>No dashboard build was found in <code>{}</code>. Build it with \
         <code>trunk build --release</code> (see the README), or point \
         <code>--dashboard-dir</code> at one.</p>",
        dir.display()
    );
    Router::new().fallback(get(move || async move { Html(page) }))
}
