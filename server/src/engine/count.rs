//! `Count`: the smallest kind with steps, for tests and benchmarks of the engine itself. No
//! server registers it.

use durable_shared::kinds::{KindSpec, ParamError};

use super::{Env, Plan, Step, StepError, TaskKind};

/// Counts to its parameter, a step at a time, and ends with the count: its steps do nothing
/// else, so what a run of it costs is the engine's own.
pub struct Count;

impl KindSpec for Count {
    const NAME: &'static str = "count";
    const TITLE: &'static str = "Count";
    const DESCRIPTION: &'static str = "Counts its steps.";
    const RESULT: &'static str = "the count";
    type Params = u64;
    type Output = u64;
}

impl TaskKind for Count {
    type State = u64;

    fn plan(&self, steps: &u64, _env: &Env) -> Result<Plan<u64>, ParamError> {
        Ok(Plan {
            state: 0,
            total: *steps,
        })
    }

    async fn step(&self, steps: &u64, done: &u64, _env: &Env) -> Result<Step<u64, u64>, StepError> {
        let next = done + 1;
        let message = format!("{next}/{steps}");
        if next < *steps {
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
