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

use durable_shared::Question;
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
    /// Each owner gets a directory of its own under `data_dir` (with authorization on, where
    /// owners are subjects who must not see each other's files); see [`Env::for_owner`].
    pub per_owner: bool,
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

    /// The environment of `owner`'s tasks: its own directory `subjects/{name}` when
    /// [`Env::per_owner`], else this one.
    pub fn for_owner(&self, owner: &str) -> Env {
        if !self.per_owner {
            return self.clone();
        }
        Env {
            data_dir: self.data_dir.join("subjects").join(owner_dir_name(owner)),
            time_scale: self.time_scale,
            per_owner: false,
        }
    }

    /// Checks a client-supplied path before anything is opened: relative, without `..`, not
    /// empty. Returns it without `.` components. Where it really leads is decided when it is
    /// opened through [`Env::dir`].
    pub fn relative(&self, field: &str, path: &str) -> Result<PathBuf, ParamError> {
        let refuse = |message: String| Err(ParamError::new(field, message));
        if path.trim().is_empty() {
            return refuse(format!("{field} must not be empty"));
        }
        let mut relative = PathBuf::new();
        for component in Path::new(path).components() {
            match component {
                Component::Normal(part) => relative.push(part),
                Component::CurDir => {}
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
        if relative.as_os_str().is_empty() {
            return refuse(format!("{field} {path:?} names the data directory itself"));
        }
        Ok(relative)
    }

    /// The data directory as a capability (created if missing): every file a task opens is
    /// opened through it, and cap-std resolves each path beneath it at open time (with
    /// `openat2(RESOLVE_BENEATH)` where the kernel has it), so no `..`, absolute path or
    /// symlink, even one swapped in after a check, leads outside.
    pub fn dir(&self) -> std::io::Result<cap_std::fs::Dir> {
        std::fs::create_dir_all(&self.data_dir)?;
        cap_std::fs::Dir::open_ambient_dir(&self.data_dir, cap_std::ambient_authority())
    }
}

/// Runs blocking work of a kind (file I/O, fsync, long hashing) without stalling the runtime's
/// other tasks: tokio hands them to other threads meanwhile. Unlike `spawn_blocking` this adds
/// no await point, so a step stays uninterruptible in the middle of its effect: a worker
/// stopped by a pause never leaves a write running behind it while its successor restores.
/// The hand-over wakes another thread, which costs more than a few microseconds of work: what
/// is that short runs in place.
pub fn blocking<T>(work: impl FnOnce() -> T) -> T {
    match tokio::runtime::Handle::try_current() {
        Ok(runtime) if runtime.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => {
            tokio::task::block_in_place(work)
        }
        // A single-threaded runtime (unit tests) has no other thread to hand tasks to.
        _ => work(),
    }
}

/// What opening `path` (the value of `field`) through [`Env::dir`] failing means to a client.
pub fn path_error(field: &str, path: &str, error: &std::io::Error) -> ParamError {
    let message = match error.kind() {
        std::io::ErrorKind::NotFound => {
            format!("{field} {path:?} does not exist in the data directory")
        }
        // cap-std's refusal of a path that escapes the directory.
        std::io::ErrorKind::PermissionDenied => {
            format!("{field} {path:?} leads outside the data directory")
        }
        // Making its directories met something that is not one here.
        std::io::ErrorKind::AlreadyExists => format!(
            "{field} {path:?} passes through something that is not a directory of the data \
             directory (a file, or a link leading outside)"
        ),
        _ => format!("{field} {path:?} cannot be opened: {error}"),
    };
    ParamError::new(field, message)
}

/// The directory name of `owner` under `subjects/`: the owner itself when it is a plain name,
/// else a hash of it (`~` never starts a plain name, so the two forms cannot collide).
fn owner_dir_name(owner: &str) -> String {
    let plain = (1..=64).contains(&owner.len())
        && !owner.starts_with('.')
        && owner
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | '@'));
    if plain {
        return owner.to_owned();
    }
    use sha2::{Digest, Sha256};
    format!("~{}", &hex::encode(Sha256::digest(owner.as_bytes()))[..32])
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
    /// Commit `state` and ask a person `question`: the task waits as `input_required`, without
    /// a worker and across restarts, until [`TaskKind::answer`] folds the answer into the
    /// checkpoint; the next step continues from there.
    Ask {
        state: S,
        progress: u64,
        message: String,
        question: Question,
    },
}

/// A person's reply to a task's question.
#[derive(Debug, Clone, PartialEq)]
pub enum Answer {
    /// The answer: an object of the fields the question's schema asks for.
    Accept(Value),
    /// The person declined to answer.
    Decline,
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
    /// client as an invalid-parameters error: name the field and what is allowed. It runs on
    /// the caller's async worker: a plan that reads files does so inside [`blocking`].
    fn plan(&self, params: &Self::Params, env: &Env) -> Result<Plan<Self::State>, ParamError>;

    /// What only one unfinished task may hold at a time, as the parameter that names it and
    /// its value (e.g. the destination file a task writes): a second task naming it is refused
    /// while the first is unfinished. Resolved within the owner's data directory.
    fn exclusive(&self, _params: &Self::Params, _env: &Env) -> Option<(&'static str, String)> {
        None
    }

    /// Makes effects outside SQLite match `state` before the first step of a run (e.g. truncate
    /// an output file back to the checkpointed length). It runs on the worker's async thread:
    /// a restore that touches files does so inside [`blocking`].
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

    /// The checkpoint after a person's `answer` to the question the last step asked
    /// ([`Step::Ask`]); the engine commits it with the task's return to `pending`, once. An
    /// `Err` refuses the answer (the question stays open): name the field that is wrong. A
    /// pure function of its inputs: it may run for an answer that loses a race to another.
    fn answer(
        &self,
        _params: &Self::Params,
        _state: &Self::State,
        _answer: Answer,
    ) -> Result<Self::State, ParamError> {
        Err(ParamError::general(format!(
            "{} tasks ask no questions",
            Self::NAME
        )))
    }
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
    /// [`TaskKind::exclusive`].
    pub exclusive: Option<(&'static str, String)>,
}

/// [`TaskKind`] without its types, so kinds of different types share one registry.
pub(crate) trait ErasedKind: Send + Sync {
    fn name(&self) -> &'static str;
    fn info(&self) -> KindInfo;
    fn plan(&self, params: Value, env: &Env) -> Result<Planned, ParamError>;
    /// [`TaskKind::answer`] on stored JSON: the checkpoint to commit.
    fn answer(&self, params: Value, checkpoint: Value, answer: Answer)
    -> Result<Value, ParamError>;
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
            exclusive: self.0.exclusive(&params, env),
        })
    }

    fn answer(
        &self,
        params: Value,
        checkpoint: Value,
        answer: Answer,
    ) -> Result<Value, ParamError> {
        let unreadable = |e: serde_json::Error| {
            ParamError::general(format!("the task's stored checkpoint is unreadable: {e}"))
        };
        let params: K::Params = serde_json::from_value(params).map_err(unreadable)?;
        let state: K::State = serde_json::from_value(checkpoint).map_err(unreadable)?;
        let next = self.0.answer(&params, &state, answer)?;
        serde_json::to_value(&next)
            .map_err(|e| ParamError::general(format!("cannot store the answer: {e}")))
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
    fn paths_are_checked_before_anything_is_opened() {
        let env = Env {
            data_dir: PathBuf::from("/data"),
            time_scale: 1.0,
            per_owner: false,
        };
        assert_eq!(
            env.relative("destination_path", "./out/./a.jsonl").unwrap(),
            Path::new("out/a.jsonl")
        );
        assert_eq!(
            env.relative("destination_path", "../etc/passwd")
                .unwrap_err(),
            ParamError::new(
                "destination_path",
                "destination_path \"../etc/passwd\" must not contain '..'"
            )
        );
        assert_eq!(
            env.relative("source_path", "/etc/passwd")
                .unwrap_err()
                .message,
            "source_path \"/etc/passwd\" must be relative to the data directory, not absolute"
        );
        assert!(env.relative("source_path", "./").is_err());
    }

    #[test]
    fn each_owner_gets_a_directory_no_other_name_maps_to() {
        let env = Env {
            data_dir: PathBuf::from("/data"),
            time_scale: 1.0,
            per_owner: true,
        };
        assert_eq!(
            env.for_owner("alice@example.com").data_dir,
            Path::new("/data/subjects/alice@example.com")
        );
        let odd = env.for_owner("auth0|42/../x").data_dir;
        assert!(
            odd.to_str().unwrap().starts_with("/data/subjects/~"),
            "{odd:?}"
        );
        assert_eq!(
            odd.components().count(),
            4,
            "one component under subjects: {odd:?}"
        );
        assert_ne!(env.for_owner("..").data_dir, Path::new("/data"));
        assert!(
            !env.for_owner("x").per_owner,
            "an owner's directory has no subdirectories"
        );
        let shared = Env {
            per_owner: false,
            ..env
        };
        assert_eq!(shared.for_owner("alice").data_dir, Path::new("/data"));
    }
}
