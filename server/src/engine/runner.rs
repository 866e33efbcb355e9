//! The worker loop that advances one task, generic over its kind.
//!
//! A worker claims the task (taking a fresh lease), restores outside effects to the checkpoint,
//! then repeats: run one step, commit its checkpoint, publish. A step is dropped, uncommitted,
//! the moment its task is paused, cancelled or the server shuts down; since only committed steps
//! count and `restore` undoes anything an uncommitted step left behind, each step's effect
//! happens exactly once however the worker is interrupted.

use std::sync::Arc;

use tokio::sync::OwnedSemaphorePermit;
use tokio_util::sync::CancellationToken;

use super::kind::{Erased, Step, TaskKind};
use super::{Inner, Milestone, TaskEvent, slots};
use crate::store::StepCommit;

pub(crate) struct RunContext {
    pub(crate) engine: Arc<Inner>,
    pub(crate) task_id: String,
    /// Fires on pause, cancel or shutdown.
    pub(crate) stop: CancellationToken,
    /// Identifies this worker in the engine's worker table.
    pub(crate) generation: u64,
}

impl Drop for RunContext {
    fn drop(&mut self) {
        self.engine.worker_finished(&self.task_id, self.generation);
    }
}

pub(crate) async fn run<K: TaskKind>(
    kind: Arc<Erased<K>>,
    ctx: RunContext,
    slot: OwnedSemaphorePermit,
) {
    let slots = ctx.engine.queue.slots().clone();
    slots::holding(slots, slot, advance(kind, ctx)).await;
}

async fn advance<K: TaskKind>(kind: Arc<Erased<K>>, ctx: RunContext) {
    let engine = ctx.engine.clone();
    let id = ctx.task_id.as_str();
    if ctx.stop.is_cancelled() {
        return;
    }
    let row = match engine.store.claim_task(id, &engine.claimant).await {
        Ok(Some(row)) => row,
        Ok(None) => return,
        Err(e) => {
            tracing::error!(task_id = id, error = %e, "cannot claim task; it stays unfinished");
            return;
        }
    };
    // Paused, cancelled or superseded while claiming: a successor may be running already, and
    // this worker's `restore` must not touch what the successor restored.
    if ctx.stop.is_cancelled() {
        return;
    }
    let lease = row.lease;
    engine.claimed(id, ctx.generation, lease);
    let mut step = row.info.step;
    let milestone = if step == 0 {
        Milestone::info(format!("task {id} ({}) started", K::NAME))
    } else {
        Milestone::info(format!("task {id} ({}) resumed from step {step}", K::NAME))
    };
    tracing::info!(task_id = id, kind = K::NAME, step, "worker running");
    engine.publish(TaskEvent::with(row.info.clone(), milestone));

    let decoded = serde_json::from_value::<K::Params>(row.info.parameters)
        .and_then(|params| Ok((params, serde_json::from_value::<K::State>(row.checkpoint)?)));
    let (params, mut state) = match decoded {
        Ok(decoded) => decoded,
        Err(e) => {
            return fail(
                &engine,
                id,
                lease,
                format!("stored checkpoint is unreadable: {e}"),
            )
            .await;
        }
    };
    let env = engine.env.for_owner(&row.info.owner);
    if let Err(e) = kind.kind().restore(&params, &state, &env) {
        return fail(
            &engine,
            id,
            lease,
            format!("cannot restore checkpoint: {e}"),
        )
        .await;
    }

    loop {
        let outcome = tokio::select! {
            biased;
            _ = ctx.stop.cancelled() => {
                tracing::debug!(task_id = id, step, "worker stopped between steps");
                return;
            }
            outcome = kind.kind().step(&params, &state, &env) => outcome,
        };
        let (next, progress, message, output) = match outcome {
            Ok(Step::Continue {
                state,
                progress,
                message,
            }) => (state, progress, message, None),
            Ok(Step::Done {
                state,
                progress,
                message,
                output,
            }) => (state, progress, message, Some(output)),
            Err(e) => return fail(&engine, id, lease, e.0).await,
        };
        let encoded = serde_json::to_value(&next).and_then(|checkpoint| {
            let result = output.as_ref().map(serde_json::to_value).transpose()?;
            Ok((checkpoint, result))
        });
        let (checkpoint, result) = match encoded {
            Ok(encoded) => encoded,
            Err(e) => {
                return fail(&engine, id, lease, format!("cannot encode checkpoint: {e}")).await;
            }
        };
        let done = result.is_some();
        let commit = StepCommit {
            id: id.to_owned(),
            lease,
            step: step + 1,
            checkpoint,
            progress,
            message,
            result,
        };
        match engine.store.commit_step(commit).await {
            Ok(Some(info)) => {
                step += 1;
                state = next;
                if done {
                    tracing::info!(task_id = id, kind = K::NAME, steps = step, "task completed");
                    let milestone = Milestone::info(format!("task {id} ({}) completed", K::NAME));
                    engine.publish(TaskEvent::with(info, milestone));
                    return;
                }
                engine.publish(TaskEvent::changed(info));
            }
            Ok(None) => {
                tracing::debug!(task_id = id, step, "lease lost; step discarded");
                return;
            }
            Err(e) => {
                // The step may or may not be durable; a later run resumes from whatever is.
                tracing::error!(task_id = id, error = %e, "cannot commit step; worker stops");
                return;
            }
        }
    }
}

async fn fail(engine: &Inner, id: &str, lease: i64, error: String) {
    tracing::warn!(task_id = id, %error, "task failed");
    match engine.store.fail_task(id, lease, error.clone()).await {
        Ok(Some(info)) => {
            let milestone = Milestone::error(format!("task {id} failed: {error}"));
            engine.publish(TaskEvent::with(info, milestone));
        }
        Ok(None) => {}
        Err(e) => tracing::error!(task_id = id, error = %e, "cannot record failure"),
    }
}
