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
use crate::engine::{Engine, EngineError, TaskWatch};
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

/// Adopts the calls whose handler died and starts a relay for each. Each relay watches its
/// task before this returns: at start-up that is before the engine resumes the task (see
/// `LeftWork::resume`), so the relay hears of every step the resumed task takes.
async fn adopt_orphaned_calls(engine: &Engine, streams: &StreamStore) {
    let bindings = match streams.adopt_orphaned_bindings().await {
        Ok(bindings) => bindings,
        Err(e) => {
            tracing::error!(error = %e, "cannot read interrupted tool calls");
            return;
        }
    };
    let relays = futures::future::join_all(bindings.into_iter().map(|binding| async move {
        let id = binding.id.clone();
        Relay::follow(engine.clone(), streams.clone(), binding)
            .await
            .inspect_err(|e| {
                tracing::error!(binding = id, error = %e, "cannot follow an interrupted tool call");
            })
            .ok()
            .flatten()
    }))
    .await;
    for relay in relays.into_iter().flatten() {
        tokio::spawn(async move {
            let id = relay.id.clone();
            if let Err(e) = relay.finish().await {
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

/// One interrupted call, followed: what its client last heard and its task's changes since.
struct Relay {
    engine: Engine,
    streams: StreamStore,
    /// The call's binding.
    id: String,
    task_id: String,
    stream_id: String,
    request_id: Value,
    token: Value,
    reported: Option<u64>,
    watch: TaskWatch,
    task: TaskInfo,
}

impl Relay {
    /// Starts following `binding`'s task; `None` for a call that has nothing to relay.
    async fn follow(
        engine: Engine,
        streams: StreamStore,
        binding: CallBinding,
    ) -> Result<Option<Relay>, RelayError> {
        let CallBinding {
            id,
            task_id,
            request_id,
            progress_token,
            stream_id,
            ..
        } = binding;
        let Some(stream_id) = stream_id else {
            // The call died before its stream's first event went out (which records the call's
            // id on the stream): no client can have a resumption token for it, and calling
            // again attaches to the task.
            streams.finish_binding(&id).await?;
            return Ok(None);
        };
        tracing::info!(binding = id, task_id, "finishing an interrupted tool call");
        let request_id = serde_json::from_str(&request_id)?;
        let token = serde_json::from_str(&progress_token)?;
        let reported = last_reported(&streams, &stream_id).await?;
        // Watch before reading, so no change after the read can be missed.
        let watch = engine.watch(&task_id);
        let task = engine.get(&task_id).await?;
        Ok(Some(Relay {
            engine,
            streams,
            id,
            task_id,
            stream_id,
            request_id,
            token,
            reported,
            watch,
            task,
        }))
    }

    /// Writes the task's further progress and its outcome into the call's stream.
    async fn finish(mut self) -> Result<(), RelayError> {
        match self.until_answered().await {
            // The call's stream ended (a handler answered it before dying) or went with its
            // session: nothing is left to say on it.
            Err(RelayError::Store(StoreError::Refused(crate::streams::Refusal::StreamEnded {
                ..
            }))) => {
                tracing::info!(binding = self.id, "the interrupted call's stream has ended");
                self.streams.finish_binding(&self.id).await?;
                Ok(())
            }
            outcome => outcome,
        }
    }

    async fn until_answered(&mut self) -> Result<(), RelayError> {
        loop {
            let task = &self.task;
            if self
                .reported
                .is_none_or(|reported| task.progress > reported)
            {
                self.reported = Some(task.progress);
                let message = progress(&self.token, task, &self.id);
                self.append(message, false).await?;
            }
            if let Some(outcome) = processing_outcome(&self.task) {
                let result = as_sent(ServerResult::CallToolResult(outcome));
                let response = json!({"jsonrpc": "2.0", "id": self.request_id, "result": result});
                self.append(response, true).await?;
                self.streams.finish_binding(&self.id).await?;
                return Ok(());
            }
            self.task = match self.watch.changed().await {
                Some(task) => task,
                // Ended: the stored state is the final one.
                None => self.engine.get(&self.task_id).await?,
            };
        }
    }

    async fn append(&self, message: Value, finishes: bool) -> Result<(), RelayError> {
        self.streams
            .append(NewEvent {
                stream_id: self.stream_id.clone(),
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
