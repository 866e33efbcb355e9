//! `start_ml_training`: logistic regression trained by full-batch gradient descent on a
//! synthetic data set derived from the model name, one epoch per step.
//!
//! The weights live in the checkpoint (serde_json is built with `float_roundtrip`, so they come
//! back bit for bit), which makes a resumed run produce exactly the metrics of an uninterrupted
//! one.

use durable_shared::kinds::{MlTraining, ParamError, TrainingParams};
use durable_shared::results::{EpochMetrics, TrainingResult};
use serde::{Deserialize, Serialize};

use super::{seed_of, splitmix64};
use crate::engine::{Env, Plan, Step, StepError, TaskKind};

/// Reference pacing: ten seconds per epoch.
const SECONDS_PER_EPOCH: f64 = 10.0;
const FEATURES: usize = 4;
const TRUE_WEIGHTS: [f64; FEATURES] = [1.5, -2.0, 0.75, 1.0];
const TRUE_BIAS: f64 = 0.25;
const LEARNING_RATE: f64 = 0.5;

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TrainingState {
    /// Weights, bias last.
    weights: Vec<f64>,
    history: Vec<EpochMetrics>,
}

/// A uniform sample in [-1, 1) from the bits of `x`.
fn unit(x: u64) -> f64 {
    (x >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0
}

struct Sample {
    x: [f64; FEATURES],
    label: f64,
}

fn dataset(model_name: &str, size: u64) -> Vec<Sample> {
    let seed = seed_of(model_name);
    (0..size)
        .map(|i| {
            let base = seed ^ i.wrapping_mul(0x1000_0000_01b3);
            let mut x = [0.0; FEATURES];
            for (j, xj) in x.iter_mut().enumerate() {
                *xj = unit(splitmix64(base.wrapping_add(j as u64 * 0x9E37)));
            }
            let noise = 0.5 * unit(splitmix64(base.wrapping_add(0xABCD)));
            let score: f64 =
                x.iter().zip(TRUE_WEIGHTS).map(|(a, b)| a * b).sum::<f64>() + TRUE_BIAS + noise;
            Sample {
                x,
                label: if score > 0.0 { 1.0 } else { 0.0 },
            }
        })
        .collect()
}

fn sigmoid(z: f64) -> f64 {
    1.0 / (1.0 + (-z).exp())
}

fn predict(weights: &[f64], x: &[f64; FEATURES]) -> f64 {
    sigmoid(x.iter().zip(weights).map(|(a, b)| a * b).sum::<f64>() + weights[FEATURES])
}

/// One epoch of gradient descent; returns the new weights and their loss and accuracy.
fn epoch(weights: &[f64], data: &[Sample]) -> (Vec<f64>, f64, f64) {
    let n = data.len() as f64;
    let mut gradient = vec![0.0; FEATURES + 1];
    for sample in data {
        let error = predict(weights, &sample.x) - sample.label;
        for (g, x) in gradient.iter_mut().zip(sample.x) {
            *g += error * x;
        }
        gradient[FEATURES] += error;
    }
    let next: Vec<f64> = weights
        .iter()
        .zip(&gradient)
        .map(|(w, g)| w - LEARNING_RATE * g / n)
        .collect();
    let (mut loss, mut correct) = (0.0, 0u64);
    for sample in data {
        let p = predict(&next, &sample.x).clamp(1e-12, 1.0 - 1e-12);
        loss -= sample.label * p.ln() + (1.0 - sample.label) * (1.0 - p).ln();
        if (p >= 0.5) == (sample.label == 1.0) {
            correct += 1;
        }
    }
    (next, loss / n, correct as f64 / n)
}

impl TaskKind for MlTraining {
    type State = TrainingState;

    fn plan(&self, params: &TrainingParams, _env: &Env) -> Result<Plan<TrainingState>, ParamError> {
        Ok(Plan {
            total: params.epochs,
            state: TrainingState {
                weights: vec![0.0; FEATURES + 1],
                history: Vec::new(),
            },
        })
    }

    async fn step(
        &self,
        params: &TrainingParams,
        state: &TrainingState,
        env: &Env,
    ) -> Result<Step<TrainingState, TrainingResult>, StepError> {
        env.pace(SECONDS_PER_EPOCH).await;
        if state.weights.len() != FEATURES + 1 {
            return Err(StepError(
                "checkpoint has the wrong number of weights".into(),
            ));
        }
        let data = dataset(&params.model_name, params.dataset_size);
        let (weights, loss, accuracy) = epoch(&state.weights, &data);
        let number = state.history.len() as u64 + 1;
        let mut history = state.history.clone();
        let metrics = EpochMetrics {
            epoch: number,
            loss,
            accuracy,
        };
        history.push(metrics);
        let next = TrainingState { weights, history };
        let message = metrics.progress_message(params.epochs);
        if number < params.epochs {
            return Ok(Step::Continue {
                state: next,
                progress: number,
                message,
            });
        }
        let output = TrainingResult {
            model_name: params.model_name.clone(),
            dataset_size: params.dataset_size,
            epochs_completed: number,
            final_loss: loss,
            final_accuracy: accuracy,
            weights: next.weights.clone(),
            history: next.history.clone(),
            success: true,
        };
        Ok(Step::Done {
            state: next,
            progress: number,
            message,
            output,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn training_learns_the_synthetic_boundary() {
        let data = dataset("demo", 2_000);
        let mut weights = vec![0.0; FEATURES + 1];
        let mut first_loss = None;
        let (mut loss, mut accuracy) = (0.0, 0.0);
        for _ in 0..50 {
            (weights, loss, accuracy) = epoch(&weights, &data);
            first_loss.get_or_insert(loss);
        }
        assert!(
            loss < first_loss.unwrap(),
            "loss must fall: {first_loss:?} -> {loss}"
        );
        assert!(accuracy > 0.85, "accuracy {accuracy}");
    }
}
