//! `Count`: the smallest kind with steps, for tests and benchmarks of the engine itself. No
//! server registers it.

use std::path::Path;

use durable_shared::kinds::{KindSpec, ParamError};
use durable_shared::schemars::{self, JsonSchema};
use serde::{Deserialize, Serialize};
use serde_json::json;
use tokio_util::sync::CancellationToken;

use super::{Engine, EngineConfig, EngineError, Env, LeftWork, Plan, Step, StepError, TaskKind};
use crate::store::{Claimant, NewTask, Store};

/// Counts to its parameter, a step at a time, and ends with the count: its steps do nothing
/// else, so what a run of it costs is the engine's own.
pub struct Count;

/// How far a `Count` task counts. An object, as every kind's parameters must be.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct CountTo {
    pub steps: u64,
}

impl Count {
    /// A task of `owner` that counts to `steps`, as stored `pending` (by an engine without a
    /// running slot free, or by a previous process that left it).
    pub fn task(id: &str, owner: &str, steps: u64) -> NewTask {
        NewTask {
            id: id.to_owned(),
            kind: Count::NAME.to_owned(),
            owner: owner.to_owned(),
            params: json!(CountTo { steps }),
            total: steps,
            checkpoint: json!(0),
            exclusive: None,
            owner_limit: u64::MAX,
            claim: None,
        }
    }

    /// An engine of this kind alone on `store`, with [`Count::config`].
    pub async fn engine(
        store: Store,
        data_dir: &Path,
        claimant: Claimant,
        max_running: usize,
    ) -> Result<(Engine, LeftWork), EngineError> {
        Engine::builder()
            .register(Count)
            .start(
                store,
                Count::config(data_dir, claimant, max_running),
                CancellationToken::new(),
            )
            .await
    }

    /// The engine's settings for tests and benchmarks: as `claimant`, steps unpaced,
    /// `max_running` tasks advancing at once and no limit on any owner's.
    pub fn config(data_dir: &Path, claimant: Claimant, max_running: usize) -> EngineConfig {
        EngineConfig {
            env: Env {
                data_dir: data_dir.to_owned(),
                time_scale: 0.0,
                per_owner: false,
            },
            max_running,
            claimant,
            max_tasks_per_owner: u64::MAX,
        }
    }
}

impl KindSpec for Count {
    const NAME: &'static str = "count";
    const TITLE: &'static str = "Count";
    const DESCRIPTION: &'static str = "Counts its steps.";
    const RESULT: &'static str = "the count";
    type Params = CountTo;
    type Output = u64;
}

impl TaskKind for Count {
    type State = u64;

    fn plan(&self, to: &CountTo, _env: &Env) -> Result<Plan<u64>, ParamError> {
        Ok(Plan {
            state: 0,
            total: to.steps,
        })
    }

    async fn step(
        &self,
        to: &CountTo,
        done: &u64,
        _env: &Env,
    ) -> Result<Step<u64, u64>, StepError> {
        let next = done + 1;
        let message = format!("{next}/{}", to.steps);
        if next < to.steps {
            Ok(Step::Continue {
                state: next,
                progress: next,
                message,
            })
        } else {
            Ok(Step::Done {
                state: next,
                progress: next,
                message,
                output: next,
            })
        }
    }
}
