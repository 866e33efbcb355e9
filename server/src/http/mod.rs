//! The HTTP front: MCP Streamable HTTP at `/mcp`, the dashboard at `/`, and the wiring of store,
//! engine and MCP service under one cancellation token.
//!
//! The middleware in front of `/mcp` lives beside it: `resume` (resumable streams, session
//! checks) and `task_requests` (the 2025-11-25 task requests renamed for rmcp), each with its
//! decisions as plain functions; `origin` matches browser origins. The body limit is
//! tower-http's, answered as `body_limit` says, and every error the HTTP layer answers itself
//! is an [`ApiError`](crate::mcp::error::ApiError) turned into a response.

mod authorize;
mod batch;
mod body_limit;
mod dashboard;
mod origin;
mod reads;
mod resume;
mod stateless;
mod task_requests;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use axum::Router;
use axum::body::Body;
use axum::extract::Request;
use axum::http::{HeaderName, HeaderValue, Method, header};
use axum::middleware::from_fn_with_state;
use axum::routing::{any, get};
use axum::serve::ListenerExt;
use durable_shared::TaskStatus;
use rmcp::transport::common::server_side_http::SessionId;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{
    SessionManager, StreamableHttpServerConfig, StreamableHttpService,
};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tower::ServiceBuilder;
use tower_http::body::Limited;
use tower_http::cors::{AllowOrigin, CorsLayer};
use tower_http::limit::RequestBodyLimitLayer;
use tower_http::trace::TraceLayer;

use crate::auth::Verifier;
use crate::config::Config;
use crate::engine::{Claimant, Engine, EngineConfig, Env};
use crate::kinds;
use crate::mcp::{CLIENT_ID_HEADER, DurableServer, Shared, TaskTtl, legacy_capability, relay};
use crate::store::Store;
use crate::streams::StreamStore;
use crate::telemetry;
use authorize::AuthState;
use resume::ResumeState;

/// Browser origins always accepted: pages served from this machine (the dashboard itself, or
/// `trunk serve` during development).
const LOOPBACK_ORIGINS: [&str; 3] = ["http://127.0.0.1:*", "http://localhost:*", "http://[::1]:*"];
const LOOPBACK_HOSTS: [&str; 3] = ["127.0.0.1", "localhost", "::1"];
/// How long an MCP task handle is kept when its client does not ask (capped by `--retention`).
const DEFAULT_TASK_TTL: Duration = Duration::from_secs(24 * 60 * 60);

/// The server without its socket: the whole router (`/mcp` behind its middleware, the
/// dashboard, the probes and `/metrics`) and the engine behind it, built by [`app`].
pub struct App {
    pub router: Router,
    pub engine: Engine,
}

/// Opens the store, starts the engine (resuming unfinished tasks) and serves on `listener`
/// until `shutdown` fires; then lets tasks checkpoint and returns.
pub async fn run(
    config: Config,
    listener: TcpListener,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let App { router, engine } = app(&config, &shutdown).await?;
    let server = axum::serve(
        listener.tap_io(|stream| {
            // rmcp writes SSE replies in small pieces; without NODELAY each waits ~40 ms for a
            // delayed ACK.
            if let Err(e) = stream.set_nodelay(true) {
                tracing::debug!(error = %e, "cannot set TCP_NODELAY");
            }
        }),
        router.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .with_graceful_shutdown(shutdown.clone().cancelled_owned());
    // One grace period for everything after the signal, connections and workers together:
    // the process exits within `--shutdown-grace`, as promised.
    let grace = config.shutdown_grace;
    let deadline = {
        let shutdown = shutdown.clone();
        tokio::spawn(async move {
            shutdown.cancelled().await;
            tokio::time::Instant::now() + grace
        })
    };
    tokio::select! {
        served = server => served.context("serving HTTP")?,
        // Graceful shutdown waits for open connections; a stuck one must not hold the process.
        _ = async { shutdown.cancelled().await; tokio::time::sleep(grace).await } => {
            tracing::warn!("connections still open after the grace period; closing them");
        }
    }
    let deadline = deadline
        .await
        .unwrap_or_else(|_| tokio::time::Instant::now());
    let left = deadline.saturating_duration_since(tokio::time::Instant::now());
    if engine.wait_stopped(left).await {
        tracing::info!("all tasks checkpointed; they resume at the next start");
    } else {
        tracing::warn!(
            "some task workers did not stop in time; they resume from their last checkpoint"
        );
    }
    Ok(())
}

/// Builds the server of `config` without binding a socket: opens the store, starts the engine,
/// the session sweep and the relay of orphaned calls, then resumes unfinished tasks, all under
/// `shutdown`, and returns the router that serves them. [`run`] serves it on a listener; the
/// fuzz targets call it in process.
pub async fn app(config: &Config, shutdown: &CancellationToken) -> anyhow::Result<App> {
    std::fs::create_dir_all(&config.data_dir)
        .with_context(|| format!("creating data directory {}", config.data_dir.display()))?;
    // Installed before anything is recorded, so that /metrics counts from the start.
    telemetry::recorder();
    tokio::spawn(telemetry::upkeep(shutdown.child_token()));
    let verifier = match &config.auth {
        Some(auth) => Some(
            Verifier::load(auth.clone())
                .await
                .context("loading the authorization server's keys")?,
        ),
        None => None,
    };
    let store = Store::connect(&config.database, &config.node_id)
        .await
        .with_context(|| format!("opening the {}", config.database))?;
    let (engine, left_work) = kinds::register_all(Engine::builder())
        .start(
            store.clone(),
            EngineConfig {
                env: Env {
                    data_dir: config.data_dir.clone(),
                    time_scale: config.time_scale,
                    per_owner: config.auth.is_some(),
                },
                max_running: config.max_running_tasks,
                claimant: Claimant {
                    node: config.node_id.clone(),
                    ttl: config.lease_ttl,
                },
                max_tasks_per_owner: config.limits.tasks_per_owner,
            },
            shutdown.child_token(),
        )
        .await
        .context("starting the task engine")?;
    engine.spawn_retention(config.retention, config.retention_interval);
    let streams = StreamStore::new(store.clone(), &config.node_id, shutdown.child_token());
    let sessions = Arc::new(session_manager(config, &streams));
    let task_ttl = TaskTtl {
        default: DEFAULT_TASK_TTL.min(config.retention),
        max: config.retention,
    };
    let shared = Shared::new(
        engine.clone(),
        streams.clone(),
        task_ttl,
        config.notification_buffer,
        config.limits.clone(),
        shutdown.clone(),
    );
    tokio::spawn(sweep_sessions(
        streams.clone(),
        sessions.clone(),
        shared.clone(),
        config.clone(),
        shutdown.child_token(),
    ));
    streams
        .keep_alive(config.lease_ttl)
        .await
        .context("announcing this process to the other nodes")?;
    relay::relay_orphaned_calls(engine.clone(), streams.clone(), shutdown.child_token()).await;
    // After the relay watches the tasks of interrupted calls, so that it hears of every step.
    left_work
        .resume()
        .await
        .context("resuming unfinished tasks")?;

    let router = router(
        config,
        shared,
        streams.clone(),
        sessions,
        verifier,
        shutdown.clone(),
    )
    .merge(operations(store, streams, shutdown.clone()));
    Ok(App { router, engine })
}

fn session_manager(config: &Config, streams: &StreamStore) -> LocalSessionManager {
    let mut sessions = LocalSessionManager::default().with_event_store(Arc::new(streams.clone()));
    // rmcp's own idle timeout counts only requests, so it would close a session (and its open
    // GET stream) that is merely listening. The expiry sweep, which counts open streams as
    // activity, closes idle sessions instead.
    sessions.session_config.keep_alive = None;
    sessions.session_config.sse_retry = Some(config.sse_retry);
    // rmcp keeps each answered request's channel, with a copy of the messages it sent, for a
    // minute, so that a late resumption could be answered from memory. With an event store it
    // never is (resumption reads the store), and under load the copies were most of the
    // process's memory: 16 busy sessions grew it from 41 to 410 MiB within a minute in the
    // soak. Zero drops an answered request's channel at its session's next event.
    sessions.session_config.completed_cache_ttl = Duration::ZERO;
    sessions
}

/// Deletes expired sessions (with their events) from the store and from rmcp's memory, prunes
/// old events, and lets dormant sessions leave memory, until shutdown.
async fn sweep_sessions(
    streams: StreamStore,
    sessions: Arc<LocalSessionManager>,
    shared: Arc<Shared>,
    config: Config,
    shutdown: CancellationToken,
) {
    let every = (config
        .session_ttl
        .min(config.event_max_age)
        .min(config.session_dormant_after)
        / 10)
        .clamp(Duration::from_millis(100), Duration::from_secs(30));
    let mut ticks = tokio::time::interval(every);
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = ticks.tick() => {}
        }
        match streams
            .sweep(config.session_ttl, config.event_max_age)
            .await
        {
            Ok(expired) => {
                for id in expired {
                    if let Err(e) = sessions.close_session(&id.clone().into()).await {
                        tracing::debug!(session_id = id, error = %e, "expired session was not open");
                    }
                }
            }
            Err(e) => tracing::error!(error = %e, "session sweep failed"),
        }
        let slept = put_to_sleep(&streams, &sessions, &shared, config.session_dormant_after).await;
        if slept > 0 {
            tracing::debug!(sessions = slept, "dormant sessions left memory");
            let _ = tokio::task::spawn_blocking(crate::heap::trim).await;
        }
    }
}

/// Closes in rmcp the sessions that have been dormant for `after` (see
/// [`Config::session_dormant_after`]), keeping them stored; how many. rmcp holds about 70 KiB
/// per session (its worker's channels and tasks), which made a thousand idle sessions most of a
/// server's memory. A dormant session's next request restores it from the store, as after a
/// restart: its subscriptions and state are stored, and it follows nothing live meanwhile.
async fn put_to_sleep(
    streams: &StreamStore,
    sessions: &LocalSessionManager,
    shared: &Shared,
    after: Duration,
) -> usize {
    let resident: Vec<String> = sessions
        .sessions
        .read()
        .await
        .keys()
        .map(|id| id.to_string())
        .collect();
    shared.forget_ended_sessions();
    let mut slept = 0;
    for id in streams.quiet_sessions(resident, after) {
        // Asked first, without the session's gate: it may read the store.
        if !shared.may_sleep(&id, after).await {
            streams.still_awake(&id);
            continue;
        }
        let closed = streams
            .put_to_sleep(&id, close_and_wait(sessions, id.clone().into()))
            .await;
        slept += usize::from(closed);
    }
    slept
}

/// Ends session `id`'s worker in rmcp and waits until rmcp has let go of it. Not
/// `close_session`, which forgets the session at once: rmcp's task that ran the worker
/// forgets it again once the worker has ended, and were a request restoring the session by
/// then, that late removal would close the restored one.
async fn close_and_wait(sessions: &LocalSessionManager, id: SessionId) {
    let Some(handle) = sessions.sessions.read().await.get(&id).cloned() else {
        return;
    };
    if handle.close().await.is_err() {
        // The worker had ended already; its task forgets the session.
        tracing::debug!(session_id = %id, "dormant session's worker had ended");
    }
    let waiting = async {
        while sessions.has_session(&id).await.unwrap_or(false) {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    };
    if tokio::time::timeout(WORKER_END_LIMIT, waiting)
        .await
        .is_err()
    {
        tracing::warn!(session_id = %id, "a dormant session's worker did not end; closing it");
        let _ = sessions.close_session(&id).await;
    }
}

/// How long a dormant session's worker may take to end: rmcp gives a closing session 5 s to
/// finish what it was sending.
const WORKER_END_LIMIT: Duration = Duration::from_secs(10);

fn router(
    config: &Config,
    shared: Arc<Shared>,
    streams: StreamStore,
    sessions: Arc<LocalSessionManager>,
    verifier: Option<Arc<Verifier>>,
    shutdown: CancellationToken,
) -> Router {
    let origins: Vec<String> = LOOPBACK_ORIGINS
        .iter()
        .map(|origin| origin.to_string())
        .chain(config.allowed_origins.iter().cloned())
        .collect();
    let hosts: Vec<String> = LOOPBACK_HOSTS
        .iter()
        .map(|host| host.to_string())
        .chain(config.allowed_hosts.iter().cloned())
        .collect();
    let mut transport = StreamableHttpServerConfig::default()
        .with_allowed_hosts(hosts)
        .with_allowed_origins(origins.clone())
        .enforce_origin_validation()
        // rmcp's own cap, kept equal so that it never refuses what the body limit lets through.
        .with_max_request_body_bytes(config.max_body_bytes)
        .with_sse_retry(Some(config.sse_retry))
        .with_sse_keep_alive(Some(config.sse_keep_alive))
        .with_cancellation_token(shutdown.child_token());
    transport.session_store = Some(Arc::new(streams.clone()));
    // Protocol 2026-07-28 has no sessions and no resumption, and a closed response stream
    // cancels its request: its requests get a service of their own without the event store
    // (see `stateless`), sharing everything else. A session's reads are answered there too
    // (see `reads`).
    let mut stateless_transport = transport
        .clone()
        .with_legacy_session_mode(false)
        .with_json_response(true);
    stateless_transport.session_store = None;
    let stateless_mcp = {
        let shared = shared.clone();
        Arc::new(StreamableHttpService::new(
            move || Ok(DurableServer::new(shared.clone())),
            Arc::new(LocalSessionManager::default()),
            stateless_transport,
        ))
    };
    // rmcp's service clones itself for every request it serves, configuration and all (its
    // allowed hosts and origins are vectors of strings), and the router clones it once more
    // before that: 5 % of a ping's instructions. Behind an `Arc` in a handler, a request clones
    // a pointer instead.
    let mcp = Arc::new(StreamableHttpService::new(
        move || Ok(DurableServer::new(shared.clone())),
        sessions,
        transport,
    ));
    let auth = AuthState::new(verifier.clone(), streams.clone(), config.limits.clone());
    let resume = ResumeState {
        streams,
        max_streams: config.limits.streams_per_session,
        sse_retry: config.sse_retry,
        added_capabilities: Arc::new(
            [("tasks".to_owned(), legacy_capability())]
                .into_iter()
                .collect(),
        ),
    };

    let mut app = guarded(
        Router::new().route(
            "/mcp",
            any(move |request: Request| async move {
                if request.extensions().get::<reads::SessionRead>().is_some() {
                    let mut response = stateless_mcp.handle(request).await;
                    response.extensions_mut().insert(reads::SessionRead);
                    response
                } else if request.extensions().get::<stateless::Stateless>().is_some() {
                    stateless_mcp.handle(request).await
                } else {
                    mcp.handle(request).await
                }
            }),
        ),
        auth,
        resume,
        config.max_body_bytes,
    );
    if let Some(verifier) = verifier {
        let metadata = Router::new()
            .route(authorize::METADATA_PATH, get(authorize::metadata))
            .route(
                &format!("{}/mcp", authorize::METADATA_PATH),
                get(authorize::metadata),
            )
            .with_state(verifier);
        app = app.merge(metadata);
    }
    app.fallback_service(dashboard::router(config.dashboard_dir.as_deref()))
        .layer(cors(&origins))
        .layer(TraceLayer::new_for_http().make_span_with(request_span))
}

/// The span every request's logs carry, at the level the server logs at by default.
fn request_span(request: &Request) -> tracing::Span {
    let session = request
        .headers()
        .get("mcp-session-id")
        .and_then(|value| value.to_str().ok())
        .unwrap_or("");
    tracing::info_span!(
        "request",
        method = %request.method(),
        path = request.uri().path(),
        session,
    )
}

/// `mcp` at `/mcp` behind the middleware, outermost first: authorization and the request
/// limits, the split of a JSON-RPC batch into its messages, resumable streams, the answer to a
/// body over the limit, the limit itself, the scopes a body's requests need, the mark of
/// stateless (2026-07-28) requests and the task-request adaptation (all three read the body).
///
/// The layers wrap one another directly, not each its own route (as `Router::route_layer`
/// does): every middleware clones the service inside it for each request, and a route boxes
/// what it holds, so layered routes made every request allocate and free a copy of each inner
/// layer at every level, 7 % of a `start_*` call's instructions. Here a clone is a few
/// reference counts, and `mcp` (a `Router`) is a pointer.
fn guarded(mcp: Router, auth: AuthState, resume: ResumeState, max_body_bytes: usize) -> Router {
    // Only tokens have scopes: without authorization the layer would pass everything.
    let scopes = auth
        .verifier
        .is_some()
        .then(|| axum::middleware::from_fn(authorize::require_scopes));
    let batches = batch::BatchState {
        streams: resume.streams.clone(),
        max_body_bytes,
    };
    let tasks = resume.streams.clone();
    let guarded = ServiceBuilder::new()
        .layer(from_fn_with_state(auth, authorize::authorize))
        .layer(from_fn_with_state(batches, batch::answer_batches))
        .layer(from_fn_with_state(resume, resume::resumable))
        .layer(from_fn_with_state(max_body_bytes, body_limit::too_large))
        .layer(RequestBodyLimitLayer::new(max_body_bytes))
        // The limit wraps the body; axum's middleware takes its own body type.
        .map_request(|request: axum::http::Request<Limited<Body>>| request.map(Body::new))
        .option_layer(scopes)
        .layer(axum::middleware::from_fn(stateless::mark))
        .layer(from_fn_with_state(
            tasks,
            task_requests::adapt_task_requests,
        ))
        .service(mcp);
    Router::new().route_service("/mcp", guarded)
}

/// `/metrics`: the counters and histograms recorded so far (see [`crate::telemetry`]), with the
/// gauges of current state read now. Aggregates only: no task, owner or session is named.
async fn metrics(store: Store, streams: StreamStore) -> axum::response::Response {
    use axum::response::IntoResponse;
    let handle = telemetry::recorder();
    match tokio::time::timeout(PROBE_TIMEOUT, store.status_counts()).await {
        Ok(Ok(counts)) => {
            for status in TaskStatus::ALL {
                let count = counts.get(&status).copied().unwrap_or(0);
                metrics::gauge!(telemetry::TASKS, "status" => status.as_str()).set(count as f64);
            }
        }
        Ok(Err(e)) => tracing::warn!(error = e.with_causes(), "metrics: cannot count tasks"),
        Err(_) => tracing::warn!("metrics: counting tasks timed out"),
    }
    metrics::gauge!(telemetry::OPEN_STREAMS).set(streams.open_stream_total() as f64);
    metrics::gauge!(telemetry::SESSIONS).set(streams.known_sessions() as f64);
    if let Some(bytes) = telemetry::resident_bytes() {
        metrics::gauge!(telemetry::PROCESS_RESIDENT_BYTES).set(bytes as f64);
    }
    (
        [(
            axum::http::header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        handle.render(),
    )
        .into_response()
}

/// How long a probe waits for the store's round trip.
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// What an operator's tools ask: `/metrics`, and the probes `/healthz` and `/readyz`: 200 once
/// the store answers a write's and a read's round trip within [`PROBE_TIMEOUT`], else 503 with
/// the cause (a dead or stuck writer thread, an unreachable database). `/readyz` also answers
/// 503 once the server is shutting down, so a balancer stops sending it work while it drains.
fn operations(store: Store, streams: StreamStore, shutdown: CancellationToken) -> Router {
    let (health, counted) = (store.clone(), store.clone());
    Router::new()
        .route(
            "/metrics",
            get(move || metrics(counted.clone(), streams.clone())),
        )
        .route(
            "/healthz",
            get(move || async move { probe(&health, None).await }),
        )
        .route(
            "/readyz",
            get(move || async move { probe(&store, Some(&shutdown)).await }),
        )
}

async fn probe(store: &Store, shutdown: Option<&CancellationToken>) -> axum::response::Response {
    use axum::response::IntoResponse;
    let unavailable = |cause: String| {
        (
            axum::http::StatusCode::SERVICE_UNAVAILABLE,
            axum::Json(serde_json::json!({"status": "unavailable", "cause": cause})),
        )
            .into_response()
    };
    if shutdown.is_some_and(CancellationToken::is_cancelled) {
        return unavailable("the server is shutting down".into());
    }
    match tokio::time::timeout(PROBE_TIMEOUT, store.round_trip()).await {
        Ok(Ok(())) => axum::Json(serde_json::json!({"status": "ok"})).into_response(),
        Ok(Err(e)) => {
            let cause = e.with_causes();
            tracing::warn!(cause, "health probe: the store cannot serve");
            unavailable(format!("the store cannot serve: {cause}"))
        }
        Err(_) => {
            tracing::warn!("health probe: the store did not answer in time");
            unavailable(format!("the store did not answer within {PROBE_TIMEOUT:?}"))
        }
    }
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
            header::AUTHORIZATION,
            HeaderName::from_static("mcp-session-id"),
            HeaderName::from_static("mcp-protocol-version"),
            HeaderName::from_static("last-event-id"),
            HeaderName::from_static("mcp-method"),
            HeaderName::from_static("mcp-name"),
            HeaderName::from_static(CLIENT_ID_HEADER),
        ])
        .expose_headers([
            HeaderName::from_static("mcp-session-id"),
            header::WWW_AUTHENTICATE,
        ])
}

#[cfg(test)]
mod tests {
    use std::future::poll_fn;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use axum::body::{Body, Bytes};
    use axum::extract::Request;
    use axum::http::StatusCode;
    use axum::response::IntoResponse;
    use axum::routing::post;
    use futures::StreamExt;
    use serde_json::Value;
    use serde_json::json;
    use tower::Service;

    use super::*;
    use crate::mcp::PRIVATE_LIST_TOOLS;
    use crate::mcp::error::ApiError;

    const LIMIT: usize = 64;

    /// `guarded` in front of a `/mcp` that echoes the body it receives.
    fn echo(streams: StreamStore) -> Router {
        let auth = AuthState::new(None, streams.clone(), Default::default());
        let resume = ResumeState {
            streams,
            max_streams: 64,
            sse_retry: Duration::from_millis(500),
            added_capabilities: Arc::default(),
        };
        let mcp = Router::new().route("/mcp", post(|body: Bytes| async move { body }));
        guarded(mcp, auth, resume, LIMIT)
    }

    async fn send(app: &mut Router, body: Body, length: Option<usize>) -> (StatusCode, Bytes) {
        let mut request = Request::post("/mcp");
        if let Some(length) = length {
            request = request.header(header::CONTENT_LENGTH, length);
        }
        poll_fn(|cx| Service::<Request>::poll_ready(app, cx))
            .await
            .unwrap();
        let response = app.call(request.body(body).unwrap()).await.unwrap();
        let status = response.status();
        (
            status,
            axum::body::to_bytes(response.into_body(), usize::MAX)
                .await
                .unwrap(),
        )
    }

    #[tokio::test]
    async fn a_body_over_the_limit_gets_a_json_rpc_413_with_or_without_its_length() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("t.db")).unwrap();
        let mut app = echo(StreamStore::new(
            store,
            "test-node",
            CancellationToken::new(),
        ));

        let small = r#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#;
        let (status, body) = send(&mut app, Body::from(small), Some(small.len())).await;
        assert_eq!((status, &body[..]), (StatusCode::OK, small.as_bytes()));

        let renamed = r#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#;
        let (status, body) = send(&mut app, Body::from(renamed), None).await;
        assert_eq!(status, StatusCode::OK);
        let body: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(body["method"], PRIVATE_LIST_TOOLS);

        // Refused before or while it is read, a body is still read to its end, so that a
        // client writing all of it before reading the answer gets that answer.
        for (case, length) in [("declared length", Some(4 * LIMIT)), ("no length", None)] {
            let read = Arc::new(AtomicUsize::new(0));
            let counted = read.clone();
            let chunks = futures::stream::iter(0..8).map(move |_| {
                counted.fetch_add(1, Ordering::SeqCst);
                Ok::<_, std::io::Error>(Bytes::from(vec![b'x'; LIMIT / 2]))
            });
            let (status, body) = send(&mut app, Body::from_stream(chunks), length).await;
            assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE, "{case}");
            let body: Value = serde_json::from_slice(&body).unwrap();
            assert_eq!(body["error"]["code"], -32600, "{case}: {body}");
            assert_eq!(
                body["error"]["message"],
                format!("request body exceeds {LIMIT} bytes"),
                "{case}"
            );
            assert_eq!(
                read.load(Ordering::SeqCst),
                8,
                "{case}: body not read to its end"
            );
        }
    }

    #[tokio::test]
    async fn a_rejection_is_a_json_rpc_error_with_its_status() {
        let response = ApiError::Http {
            status: StatusCode::GONE,
            message: "gone: start over".into(),
        }
        .into_response();
        assert_eq!(response.status(), StatusCode::GONE);
        let body = axum::body::to_bytes(response.into_body(), usize::MAX)
            .await
            .unwrap();
        let body: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(
            body,
            json!({"jsonrpc": "2.0", "id": null,
                   "error": {"code": -32600, "message": "gone: start over"}})
        );
    }
}
