//! The contract a durable task kind implements, and the type-erased form the engine stores.
//!
//! A kind is first a [`KindSpec`] (in the shared crate: name, title, parameter and result types,
//! validation), from which the MCP tools, the CLI and the dashboard forms are derived. As a
//! [`TaskKind`] it then says three things: how to turn validated parameters into a first checkpoint
//! ([`TaskKind::plan`]), how to advance a checkpoint by one step ([`TaskKind::step`]), and,
//! if its steps touch anything outside SQLite, how to bring that back in line with a checkpoint
//! before continuing ([`TaskKind::restore`]). The engine does the rest: it commits each step's
//! checkpoint, progress and message in one transaction, resumes after crashes, and honours
//! pause and cancel between (and during) steps.

use std::future::Future;
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use durable_shared::kinds::{KindSpec, Offer, ParamError, params_schema, parse_params};
use futures::future::BoxFuture;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Map, Value};
use tokio::sync::OwnedSemaphorePermit;

use super::runner::{self, RunContext};
use super::slots;

/// What a kind can use while planning and stepping.
#[derive(Debug, Clone)]
pub struct Env {
    /// Every path a task reads or writes is resolved inside this directory.
    pub data_dir: PathBuf,
    /// Factor applied to every simulated delay (`--time-scale`).
    pub time_scale: f64,
}

impl Env {
    /// Waits `seconds` of simulated work, scaled by `--time-scale`. The task's running slot is
    /// lent to another task for the wait, as for any I/O-bound wait. The engine drops a step
    /// that is waiting here when its task is paused or cancelled.
    pub async fn pace(&self, seconds: f64) {
        let scaled = (seconds * self.time_scale).max(0.0);
        if scaled > 0.0 {
            slots::released(tokio::time::sleep(Duration::from_secs_f64(scaled))).await;
        }
    }

    /// Resolves a client-supplied relative path inside the data directory, refusing absolute
    /// paths, `..` and anything that would land outside it.
    pub fn resolve(&self, field: &str, path: &str) -> Result<PathBuf, ParamError> {
        let refuse = |message: String| Err(ParamError::new(field, message));
        if path.trim().is_empty() {
            return refuse(format!("{field} must not be empty"));
        }
        let relative = Path::new(path);
        for component in relative.components() {
            match component {
                Component::Normal(_) | Component::CurDir => {}
                Component::ParentDir => {
                    return refuse(format!("{field} {path:?} must not contain '..'"));
                }
                Component::RootDir | Component::Prefix(_) => {
                    return refuse(format!(
                        "{field} {path:?} must be relative to the data directory, not absolute"
                    ));
                }
            }
        }
        let full = self.data_dir.join(relative);
        // A symlink inside the data directory could still point outside it: check where the
        // existing part of the path really is.
        let root = self.data_dir.canonicalize().map_err(|e| {
            ParamError::general(format!(
                "data directory {:?} is unusable: {e}",
                self.data_dir
            ))
        })?;
        let mut existing = full.as_path();
        while !existing.exists() {
            existing = match existing.parent() {
                Some(parent) => parent,
                None => break,
            };
        }
        if let Ok(real) = existing.canonicalize()
            && !real.starts_with(&root)
        {
            return refuse(format!("{field} {path:?} leads outside the data directory"));
        }
        Ok(full)
    }
}

/// A task's first checkpoint and how many units of work it has in all.
#[derive(Debug)]
pub struct Plan<S> {
    pub state: S,
    pub total: u64,
}

/// The outcome of one step.
#[derive(Debug)]
pub enum Step<S, O> {
    /// Commit `state`; more steps follow.
    Continue {
        state: S,
        progress: u64,
        message: String,
    },
    /// Commit `state` and `output` together; the task is completed.
    Done {
        state: S,
        progress: u64,
        message: String,
        output: O,
    },
}

/// Why a step failed; the task becomes `failed` with this message.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct StepError(pub String);

impl From<std::io::Error> for StepError {
    fn from(e: std::io::Error) -> Self {
        StepError(format!("i/o error: {e}"))
    }
}

/// A step that finds its (once valid) parameters no longer usable, e.g. a source file gone.
impl From<ParamError> for StepError {
    fn from(e: ParamError) -> Self {
        StepError(e.message)
    }
}

impl From<serde_json::Error> for StepError {
    fn from(e: serde_json::Error) -> Self {
        StepError(format!("invalid JSON: {e}"))
    }
}

/// A durable task kind. See the module documentation and the README for an example.
pub trait TaskKind: KindSpec {
    /// The checkpoint: everything needed to continue after the last committed step.
    type State: Serialize + DeserializeOwned + Send + Sync + 'static;

    /// Returns the first checkpoint of parameters that passed [`KindSpec::validate`], checking
    /// what depends on the server (files in the data directory). An `Err` is shown to the
    /// client as an invalid-parameters error: name the field and what is allowed.
    fn plan(&self, params: &Self::Params, env: &Env) -> Result<Plan<Self::State>, ParamError>;

    /// Makes effects outside SQLite match `state` before the first step of a run (e.g. truncate
    /// an output file back to the checkpointed length).
    fn restore(
        &self,
        _params: &Self::Params,
        _state: &Self::State,
        _env: &Env,
    ) -> Result<(), StepError> {
        Ok(())
    }

    /// Advances `state` by one step. It must not change anything a later `restore` cannot undo:
    /// a step may run again after a crash, but only its committed result counts.
    fn step(
        &self,
        params: &Self::Params,
        state: &Self::State,
        env: &Env,
    ) -> impl Future<Output = Result<Step<Self::State, Self::Output>, StepError>> + Send;
}

/// What the engine knows of a registered kind, for the layers that offer it (tools, forms).
#[derive(Debug, Clone)]
pub struct KindInfo {
    pub name: &'static str,
    pub title: &'static str,
    pub description: &'static str,
    pub result: &'static str,
    pub offer: Offer,
    /// The JSON schema of the parameters, as MCP tools declare input schemas.
    pub params_schema: Map<String, Value>,
}

/// A planned task in JSON, ready to store.
#[derive(Debug)]
pub struct Planned {
    pub params: Value,
    pub checkpoint: Value,
    pub total: u64,
}

/// [`TaskKind`] without its types, so kinds of different types share one registry.
pub(crate) trait ErasedKind: Send + Sync {
    fn name(&self) -> &'static str;
    fn info(&self) -> KindInfo;
    fn plan(&self, params: Value, env: &Env) -> Result<Planned, ParamError>;
    fn run(self: Arc<Self>, ctx: RunContext, slot: OwnedSemaphorePermit) -> BoxFuture<'static, ()>;
}

pub(crate) struct Erased<K>(pub K);

impl<K: TaskKind> ErasedKind for Erased<K> {
    fn name(&self) -> &'static str {
        K::NAME
    }

    fn info(&self) -> KindInfo {
        KindInfo {
            name: K::NAME,
            title: K::TITLE,
            description: K::DESCRIPTION,
            result: K::RESULT,
            offer: K::OFFER,
            params_schema: params_schema::<K::Params>(),
        }
    }

    fn plan(&self, params: Value, env: &Env) -> Result<Planned, ParamError> {
        let params: K::Params = parse_params(K::NAME, params)?;
        K::validate(&params)?;
        let plan = self.0.plan(&params, env)?;
        let json = |value: Result<Value, serde_json::Error>| {
            value.map_err(|e| ParamError::general(format!("cannot store the plan: {e}")))
        };
        Ok(Planned {
            params: json(serde_json::to_value(&params))?,
            checkpoint: json(serde_json::to_value(&plan.state))?,
            total: plan.total,
        })
    }

    fn run(self: Arc<Self>, ctx: RunContext, slot: OwnedSemaphorePermit) -> BoxFuture<'static, ()> {
        Box::pin(runner::run(self, ctx, slot))
    }
}

impl<K: TaskKind> Erased<K> {
    pub(crate) fn kind(&self) -> &K {
        &self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_outside_the_data_directory_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let env = Env {
            data_dir: dir.path().to_owned(),
            time_scale: 1.0,
        };
        assert!(env.resolve("destination_path", "out/a.jsonl").is_ok());
        assert_eq!(
            env.resolve("destination_path", "../etc/passwd")
                .unwrap_err(),
            ParamError::new(
                "destination_path",
                "destination_path \"../etc/passwd\" must not contain '..'"
            )
        );
        assert_eq!(
            env.resolve("source_path", "/etc/passwd")
                .unwrap_err()
                .message,
            "source_path \"/etc/passwd\" must be relative to the data directory, not absolute"
        );
        std::os::unix::fs::symlink("/tmp", dir.path().join("escape")).unwrap();
        assert_eq!(
            env.resolve("source_path", "escape/x").unwrap_err().message,
            "source_path \"escape/x\" leads outside the data directory"
        );
    }
}
