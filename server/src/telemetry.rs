//! What an operator scrapes at `/metrics`, in Prometheus's text format.
//!
//! Counters and histograms are recorded where things happen, through the `metrics` facade;
//! gauges of current state (tasks by status, open streams, sessions, memory) are read when
//! scraped. The names, all prefixed `durable_`:
//!
//! | name | type | what |
//! |---|---|---|
//! | `durable_tasks{status}` | gauge | tasks in the store, by status |
//! | `durable_steps_committed_total` | counter | steps committed by this process's workers |
//! | `durable_step_commit_seconds` | histogram | a step's checkpoint commit, from request to durable |
//! | `durable_store_batch_writes` | histogram | writes per group-committed transaction (SQLite) |
//! | `durable_store_write_queue` | gauge | writes waiting for the writer (SQLite) |
//! | `durable_store_writer_panics_total` | counter | writes the writer gave up on after a panic |
//! | `durable_store_errors_total{during}` | counter | store errors met serving a `request` or running a `step` |
//! | `durable_events_appended_total` | counter | SSE events stored |
//! | `durable_events_replayed_total` | counter | stored SSE events sent again to a resuming client |
//! | `durable_open_streams` | gauge | SSE responses open now |
//! | `durable_sessions` | gauge | MCP sessions this process knows of (open or restored) |
//! | `durable_sessions_slept_total` | counter | dormant sessions taken out of memory (each stays stored; its next request restores it) |
//! | `durable_router_lagged_events_total` | counter | engine events the notification router missed (each makes every session resynchronise) |
//! | `durable_forwarder_resyncs_total` | counter | times a session's notifications fell behind and were resynchronised |
//! | `durable_process_resident_bytes` | gauge | the process's resident memory |

use std::sync::OnceLock;
use std::time::Duration;

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use tokio_util::sync::CancellationToken;

pub const TASKS: &str = "durable_tasks";
pub const STEPS_COMMITTED: &str = "durable_steps_committed_total";
pub const STEP_COMMIT_SECONDS: &str = "durable_step_commit_seconds";
pub const STORE_BATCH_WRITES: &str = "durable_store_batch_writes";
pub const STORE_WRITE_QUEUE: &str = "durable_store_write_queue";
pub const STORE_WRITER_PANICS: &str = "durable_store_writer_panics_total";
pub const STORE_ERRORS: &str = "durable_store_errors_total";
pub const EVENTS_APPENDED: &str = "durable_events_appended_total";
pub const EVENTS_REPLAYED: &str = "durable_events_replayed_total";
pub const OPEN_STREAMS: &str = "durable_open_streams";
pub const SESSIONS: &str = "durable_sessions";
pub const SESSIONS_SLEPT: &str = "durable_sessions_slept_total";
pub const ROUTER_LAGGED_EVENTS: &str = "durable_router_lagged_events_total";
pub const FORWARDER_RESYNCS: &str = "durable_forwarder_resyncs_total";
pub const PROCESS_RESIDENT_BYTES: &str = "durable_process_resident_bytes";

/// The process's Prometheus recorder, installed on first use. Were another recorder installed
/// first (an application embedding the server), the handle renders only what this one saw.
pub fn recorder() -> &'static PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE.get_or_init(|| {
        let recorder = PrometheusBuilder::new()
            .set_buckets_for_metric(
                Matcher::Full(STEP_COMMIT_SECONDS.into()),
                &[
                    0.000_5, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0,
                ],
            )
            .and_then(|builder| {
                builder.set_buckets_for_metric(
                    Matcher::Full(STORE_BATCH_WRITES.into()),
                    &[1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0],
                )
            })
            .expect("histogram buckets are not empty")
            .build_recorder();
        let handle = recorder.handle();
        if metrics::set_global_recorder(recorder).is_err() {
            tracing::warn!("another metrics recorder is installed; /metrics shows only gauges");
        }
        handle
    })
}

/// Drains the recorded histogram samples into their summaries every few seconds, until
/// `shutdown`. `build_recorder` leaves this to its user: without it every sample stays in
/// memory until the next scrape, so a server nobody scrapes grows with every step it commits.
pub async fn upkeep(shutdown: CancellationToken) {
    let mut ticks = tokio::time::interval(UPKEEP_EVERY);
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = ticks.tick() => recorder().run_upkeep(),
        }
    }
}

/// How often [`upkeep`] runs: the exporter's own upkeep task's default.
const UPKEEP_EVERY: Duration = Duration::from_secs(5);

/// The process's resident memory, from `/proc/self/status` (Linux); `None` elsewhere.
pub fn resident_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|line| line.starts_with("VmRSS:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}
