//! The worker loop that advances one task, generic over its kind.
//!
//! A worker claims the task (taking a fresh lease), restores outside effects to the checkpoint,
//! then repeats: run one step, commit its checkpoint, publish. A step is dropped, uncommitted,
//! the moment its task is paused, cancelled or the server shuts down; since only committed steps
//! count and `restore` undoes anything an uncommitted step left behind, each step's effect
//! happens exactly once however the worker is interrupted.
//!
//! A store error (the database locked by another process, unreachable, out of space) does not
//! end the worker: it waits, with backoff and without its running slot, and claims the task
//! again, resuming from whatever is durable. So a task is never left without a worker while
//! its process runs.

use std::sync::Arc;
use std::time::Duration;

use durable_shared::TaskStatus;
use serde::Deserialize;
use tokio::sync::OwnedSemaphorePermit;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::kind::{Erased, Step, TaskKind};
use super::{Inner, Milestone, TaskEvent, slots};
use crate::store::{StepCommit, StoreError, TaskRow};
use crate::telemetry;

/// The first wait after a store error; it doubles up to [`RETRY_MAX`].
const RETRY_FIRST: Duration = Duration::from_millis(100);
const RETRY_MAX: Duration = Duration::from_secs(5);

pub(crate) struct RunContext {
    pub(crate) engine: Arc<Inner>,
    pub(crate) task_id: String,
    /// Fires on pause, cancel or shutdown.
    pub(crate) stop: CancellationToken,
    /// Identifies this worker in the engine's worker table.
    pub(crate) generation: u64,
    /// The task as this process stored it, which the worker's first run begins from.
    pub(crate) stored: Option<Stored>,
}

/// A task as this process stored it, known without reading it back.
pub(crate) enum Stored {
    /// Stored claimed for this worker (see `NewTask::claim`): its first run begins with the
    /// row instead of claiming.
    Claimed(TaskRow),
    /// Stored `pending`, to be claimed once a running slot is free: the claim need not read
    /// the row (see `TaskRepo::claim_known`).
    Pending(TaskRow),
}

impl Drop for RunContext {
    fn drop(&mut self) {
        self.engine.worker_finished(&self.task_id, self.generation);
    }
}

/// The worker of a task, holding `slot`. Not an `async fn`, for the reason `slots::holding`
/// gives: this future is kept by every running task, and moved whole into its box.
pub(crate) fn run<K: TaskKind>(
    kind: Arc<Erased<K>>,
    mut ctx: RunContext,
    slot: OwnedSemaphorePermit,
) -> impl Future<Output = ()> {
    let stored = ctx.stored.take();
    let slots = ctx.engine.queue.slots().clone();
    slots::holding(slots, slot, advance_until_stopped(kind, ctx, stored))
}

/// Advances the task until it ends, is stopped or loses its lease, claiming it again after a
/// store error.
async fn advance_until_stopped<K: TaskKind>(
    kind: Arc<Erased<K>>,
    ctx: RunContext,
    mut stored: Option<Stored>,
) {
    let mut delay = RETRY_FIRST;
    loop {
        let Err(e) = advance(&kind, &ctx, stored.take()).await else {
            return;
        };
        metrics::counter!(telemetry::STORE_ERRORS, "during" => "step").increment(1);
        tracing::warn!(
            task_id = ctx.task_id,
            error = %e,
            retry_in = ?delay,
            "store error; the task is claimed again after a pause"
        );
        // The slot is lent out meanwhile: a store that fails is no reason to stop other work.
        let stopped = slots::released(async {
            tokio::select! {
                _ = ctx.stop.cancelled() => true,
                _ = tokio::time::sleep(delay) => false,
            }
        })
        .await;
        if stopped {
            return;
        }
        delay = (delay * 2).min(RETRY_MAX);
    }
}

/// One run of the worker from a fresh claim, its own or the one the task was `stored` with.
/// `Err`: the store failed; what is durable stands, and a new claim resumes from it.
async fn advance<K: TaskKind>(
    kind: &Erased<K>,
    ctx: &RunContext,
    stored: Option<Stored>,
) -> Result<(), StoreError> {
    let engine = ctx.engine.clone();
    let id = ctx.task_id.as_str();
    if ctx.stop.is_cancelled() {
        return Ok(());
    }
    let claimed = match stored {
        Some(Stored::Claimed(row)) => Some(row),
        Some(Stored::Pending(known)) => engine.store.claim_known(known, &engine.claimant).await?,
        None => engine.store.claim_task(id, &engine.claimant).await?,
    };
    let Some(row) = claimed else {
        return Ok(());
    };
    // Paused, cancelled or superseded while claiming: a successor may be running already, and
    // this worker's `restore` must not touch what the successor restored.
    if ctx.stop.is_cancelled() {
        return Ok(());
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

    // The task as this worker knows it, which each commit answers with the step applied.
    let mut task = row.info;
    let decoded = K::Params::deserialize(&task.parameters)
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
    let env = engine.env.for_owner(&task.owner);
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
        let span = tracing::info_span!("step", task_id = id, kind = K::NAME, step = step + 1);
        let outcome = tokio::select! {
            biased;
            _ = ctx.stop.cancelled() => {
                tracing::debug!(task_id = id, step, "worker stopped between steps");
                return Ok(());
            }
            outcome = kind.kind().step(&params, &state, &env).instrument(span.clone()) => outcome,
        };
        let (next, progress, message, output, question) = match outcome {
            Ok(Step::Continue {
                state,
                progress,
                message,
            }) => (state, progress, message, None, None),
            Ok(Step::Done {
                state,
                progress,
                message,
                output,
            }) => (state, progress, message, Some(output), None),
            Ok(Step::Ask {
                state,
                progress,
                message,
                question,
            }) => (state, progress, message, None, Some(question)),
            Err(e) => return fail(&engine, id, lease, e.0).await,
        };
        let encoded = serde_json::to_string(&next).and_then(|checkpoint| {
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
        // The task's last commit (it completes, or waits for a person's answer) holds no slot.
        if done || question.is_some() {
            slots::give_back();
        }
        let commit = StepCommit {
            task,
            lease,
            step: step + 1,
            checkpoint,
            progress,
            message,
            result,
            question,
        };
        let started = std::time::Instant::now();
        let committed = engine.store.commit_step(commit).instrument(span).await;
        metrics::histogram!(telemetry::STEP_COMMIT_SECONDS).record(started.elapsed().as_secs_f64());
        match committed {
            Ok(Some(info)) => {
                metrics::counter!(telemetry::STEPS_COMMITTED).increment(1);
                step += 1;
                state = next;
                if done {
                    tracing::info!(task_id = id, kind = K::NAME, steps = step, "task completed");
                    let milestone = Milestone::info(format!("task {id} ({}) completed", K::NAME));
                    engine.publish(TaskEvent::with(info, milestone));
                    return Ok(());
                }
                if info.status == TaskStatus::InputRequired {
                    // The worker ends here: the task holds no slot while a person thinks.
                    tracing::info!(task_id = id, kind = K::NAME, step, "task waits for input");
                    let asked = info.question.as_ref().map_or("", |q| q.message.as_str());
                    let milestone = Milestone::info(format!("task {id} asks: {asked}"));
                    engine.publish(TaskEvent::with(info, milestone));
                    return Ok(());
                }
                task = info.clone();
                engine.publish(TaskEvent::changed(info));
            }
            Ok(None) => {
                tracing::debug!(task_id = id, step, "lease lost; step discarded");
                return Ok(());
            }
            // The step may or may not be durable; the next claim resumes from whatever is.
            Err(e) => return Err(e),
        }
    }
}

/// Records that the task failed (if `lease` is still its worker's).
async fn fail(engine: &Inner, id: &str, lease: i64, error: String) -> Result<(), StoreError> {
    tracing::warn!(task_id = id, %error, "task failed");
    if let Some(info) = engine.store.fail_task(id, lease, error.clone()).await? {
        let milestone = Milestone::error(format!("task {id} failed: {error}"));
        engine.publish(TaskEvent::with(info, milestone));
    }
    Ok(())
}
