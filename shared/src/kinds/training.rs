//! ML training: logistic regression on a synthetic data set, one epoch per step.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{KindSpec, ParamError, check_length, check_range};
use crate::results::TrainingResult;

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct TrainingParams {
    /// Name of the model; it also seeds the synthetic data set.
    #[schemars(title = "Model name", length(min = 1, max = 100), example = &"churn-model")]
    pub model_name: String,
    /// Training samples.
    #[serde(default = "default_dataset_size")]
    #[schemars(title = "Dataset size", range(min = 10, max = 100_000))]
    pub dataset_size: u64,
    /// Passes over the data set; one checkpoint per epoch.
    #[serde(default = "default_epochs")]
    #[schemars(title = "Epochs", range(min = 1, max = 1_000))]
    pub epochs: u64,
}

fn default_dataset_size() -> u64 {
    10_000
}
fn default_epochs() -> u64 {
    100
}

pub struct MlTraining;

impl KindSpec for MlTraining {
    const NAME: &'static str = "ml_training";
    const TITLE: &'static str = "ML training";
    const DESCRIPTION: &'static str = "Start durable training of a logistic-regression model on \
        a synthetic data set of dataset_size samples, one checkpointed epoch per step. Returns a \
        task://status/{task_id} link at once; the result holds final loss and accuracy and the \
        per-epoch series.";
    const RESULT: &'static str = "final loss, accuracy and the per-epoch series";
    type Params = TrainingParams;
    type Output = TrainingResult;

    fn validate(params: &TrainingParams) -> Result<(), ParamError> {
        check_length("model_name", &params.model_name, 1, 100)?;
        check_range("dataset_size", params.dataset_size, 10, 100_000)?;
        check_range("epochs", params.epochs, 1, 1_000)
    }
}
