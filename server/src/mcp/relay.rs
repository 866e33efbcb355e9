//! Finishes tool calls whose handler died: with the previous process, or in a fleet with
//! another node (whose process stopped announcing itself alive). Each such call is adopted by
//! exactly one process, in the store, before it is relayed.
//!
//! `resumable_data_processing` records a binding (task, session, request id, progress token)
//! when it starts waiting on a task; the stream the call answers on carries the binding's id
//! from its first event on (see [`crate::streams::CallId`]), and the first progress
//! notification links the two as well. If the process dies, the task resumes at the next start
//! but the handler does not: the relay takes its place, writing the task's further progress and
//! finally the exact response the handler would have sent into the call's stored stream. A
//! client that resumes that stream with `Last-Event-ID` receives them like any other events.

use std::time::Duration;

use durable_shared::TaskInfo;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use rmcp::model::ServerResult;

use super::as_sent;
use super::tools::processing_outcome;
use crate::engine::{Engine, EngineError};
use crate::streams::{BINDING_META_KEY, StreamStore};
use crate::streams::{CallBinding, NewEvent, StoreError};

/// How often a node of a fleet looks for calls whose handler died with another node.
const ADOPT_INTERVAL: Duration = Duration::from_secs(1);

/// Finishes the calls left unanswered by dead processes: those found now and, on a database
/// other nodes share, those of nodes that die later, until `shutdown`.
pub async fn relay_orphaned_calls(
    engine: Engine,
    streams: StreamStore,
    shutdown: CancellationToken,
) {
    adopt_orphaned_calls(&engine, &streams).await;
    if !streams.is_shared() {
        return;
    }
    tokio::spawn(async move {
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(ADOPT_INTERVAL) => {}
            }
            adopt_orphaned_calls(&engine, &streams).await;
        }
    });
}

/// Adopts the calls whose handler died and starts a relay for each.
async fn adopt_orphaned_calls(engine: &Engine, streams: &StreamStore) {
    let bindings = match streams.adopt_orphaned_bindings().await {
        Ok(bindings) => bindings,
        Err(e) => {
            tracing::error!(error = %e, "cannot read interrupted tool calls");
            return;
        }
    };
    for binding in bindings {
        let (engine, streams) = (engine.clone(), streams.clone());
        tokio::spawn(async move {
            let id = binding.id.clone();
            if let Err(e) = relay(engine, &streams, binding).await {
                tracing::error!(binding = id, error = %e, "cannot finish an interrupted tool call");
            }
        });
    }
}

#[derive(Debug, thiserror::Error)]
enum RelayError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Engine(#[from] EngineError),
    #[error("stored binding is invalid: {0}")]
    Json(#[from] serde_json::Error),
}

async fn relay(
    engine: Engine,
    streams: &StreamStore,
    binding: CallBinding,
) -> Result<(), RelayError> {
    match relay_until_answered(engine, streams, &binding).await {
        // The call's stream ended (a handler answered it before dying) or went with its
        // session: nothing is left to say on it.
        Err(RelayError::Store(StoreError::Refused(crate::streams::Refusal::StreamEnded {
            ..
        }))) => {
            tracing::info!(
                binding = binding.id,
                "the interrupted call's stream has ended"
            );
            streams.finish_binding(&binding.id).await?;
            Ok(())
        }
        outcome => outcome,
    }
}

async fn relay_until_answered(
    engine: Engine,
    streams: &StreamStore,
    binding: &CallBinding,
) -> Result<(), RelayError> {
    let Some(stream_id) = binding.stream_id.clone() else {
        // The call died before its stream's first event went out (which records the call's
        // id on the stream): no client can have a resumption token for it, and calling again
        // attaches to the task.
        streams.finish_binding(&binding.id).await?;
        return Ok(());
    };
    tracing::info!(
        binding = binding.id,
        task_id = binding.task_id,
        "finishing an interrupted tool call"
    );
    let request_id: Value = serde_json::from_str(&binding.request_id)?;
    let token: Value = serde_json::from_str(&binding.progress_token)?;
    let mut reported = last_reported(streams, &stream_id).await?;
    // Watch before reading, so no change after the read can be missed.
    let mut watch = engine.watch(&binding.task_id);
    let mut task = engine.get(&binding.task_id).await?;
    loop {
        if reported.is_none_or(|reported| task.progress > reported) {
            reported = Some(task.progress);
            append(
                streams,
                &stream_id,
                progress(&token, &task, &binding.id),
                false,
            )
            .await?;
        }
        if let Some(outcome) = processing_outcome(&task) {
            let result = as_sent(ServerResult::CallToolResult(outcome));
            let response = json!({"jsonrpc": "2.0", "id": request_id, "result": result});
            append(streams, &stream_id, response, true).await?;
            streams.finish_binding(&binding.id).await?;
            return Ok(());
        }
        task = match watch.changed().await {
            Some(task) => task,
            // Ended: the stored state is the final one.
            None => engine.get(&binding.task_id).await?,
        };
    }
}

/// The last progress value stored on the call's stream: what its client may already have seen.
async fn last_reported(streams: &StreamStore, stream_id: &str) -> Result<Option<u64>, RelayError> {
    let last = streams
        .last_event_containing(stream_id, "notifications/progress")
        .await?;
    Ok(last
        .map(|message| serde_json::from_str::<Value>(&message))
        .transpose()?
        .and_then(|message| message["params"]["progress"].as_f64())
        .map(|progress| progress as u64))
}

fn progress(token: &Value, task: &TaskInfo, binding: &str) -> Value {
    json!({
        "jsonrpc": "2.0",
        "method": "notifications/progress",
        "params": {
            "progressToken": token,
            // As floats, like the notifications rmcp serialises for the live handler.
            "progress": task.progress as f64,
            "total": task.total as f64,
            "message": task.message,
            "_meta": {BINDING_META_KEY: binding},
        },
    })
}

async fn append(
    streams: &StreamStore,
    stream_id: &str,
    message: Value,
    finishes: bool,
) -> Result<(), RelayError> {
    streams
        .append(NewEvent {
            stream_id: stream_id.to_owned(),
            session_id: None,
            message: Some(message.to_string()),
            retry_ms: None,
            finishes,
            binding: None,
            opens: false,
        })
        .await?;
    Ok(())
}
