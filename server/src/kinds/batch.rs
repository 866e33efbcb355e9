//! `start_batch_processing`: processes numbered items in batches, folding each into a SHA-256
//! chain, so the result proves every item was processed once and in order.

use durable_shared::kinds::BATCH_PROCESSING;
use durable_shared::results::BatchResult;
use rmcp::schemars::{self, JsonSchema};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::{check_range, splitmix64};
use crate::engine::{Env, Plan, Step, StepError, TaskKind};

const MAX_ITEMS: u64 = 100_000_000;
const MAX_BATCHES: u64 = 1_000_000;

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct BatchParams {
    /// Items per batch.
    #[schemars(range(min = 1, max = 1_000_000))]
    pub batch_size: u64,
    /// Items to process in all.
    #[schemars(range(min = 1, max = 100_000_000))]
    pub total_items: u64,
    /// Simulated seconds of work per batch (scaled by the server's --time-scale).
    #[serde(default = "default_delay")]
    #[schemars(range(min = 0.0, max = 3600.0))]
    pub processing_delay: f64,
}

fn default_delay() -> f64 {
    10.0
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct BatchState {
    processed: u64,
    batches: u64,
    /// Hex SHA-256 chain over every processed item so far.
    digest: String,
    checksum: u64,
}

pub struct BatchProcessing;

/// The value of item `index`: what "processing" it yields.
fn item_value(index: u64) -> u64 {
    splitmix64(index) % 1_000_000
}

impl TaskKind for BatchProcessing {
    const NAME: &'static str = BATCH_PROCESSING;
    type Params = BatchParams;
    type State = BatchState;
    type Output = BatchResult;

    fn plan(&self, params: &BatchParams, _env: &Env) -> Result<Plan<BatchState>, String> {
        check_range("batch_size", params.batch_size, 1, 1_000_000)?;
        check_range("total_items", params.total_items, 1, MAX_ITEMS)?;
        if !params.processing_delay.is_finite() {
            return Err("processing_delay must be a finite number of seconds".into());
        }
        check_range("processing_delay", params.processing_delay, 0.0, 3600.0)?;
        let batches = params.total_items.div_ceil(params.batch_size);
        if batches > MAX_BATCHES {
            return Err(format!(
                "total_items / batch_size gives {batches} batches; at most {MAX_BATCHES} are \
                 allowed, so raise batch_size to at least {}",
                params.total_items.div_ceil(MAX_BATCHES)
            ));
        }
        Ok(Plan {
            total: params.total_items,
            state: BatchState {
                processed: 0,
                batches: 0,
                digest: hex::encode(Sha256::digest(b"durable-mcp batch v1")),
                checksum: 0,
            },
        })
    }

    async fn step(
        &self,
        params: &BatchParams,
        state: &BatchState,
        env: &Env,
    ) -> Result<Step<BatchState, BatchResult>, StepError> {
        env.pace(params.processing_delay).await;
        let end = (state.processed + params.batch_size).min(params.total_items);
        let mut hasher = Sha256::new();
        hasher.update(
            hex::decode(&state.digest).map_err(|e| StepError(format!("corrupt digest: {e}")))?,
        );
        let mut checksum = state.checksum;
        for index in state.processed..end {
            let value = item_value(index);
            hasher.update(index.to_le_bytes());
            hasher.update(value.to_le_bytes());
            checksum += value;
        }
        let next = BatchState {
            processed: end,
            batches: state.batches + 1,
            digest: hex::encode(hasher.finalize()),
            checksum,
        };
        let message = format!("Processed {end}/{} items", params.total_items);
        if end < params.total_items {
            return Ok(Step::Continue {
                state: next,
                progress: end,
                message,
            });
        }
        let output = BatchResult {
            processed: end,
            total: params.total_items,
            batch_size: params.batch_size,
            batches: next.batches,
            processing_delay: params.processing_delay,
            digest: next.digest.clone(),
            checksum: next.checksum,
            success: true,
        };
        Ok(Step::Done {
            state: next,
            progress: end,
            message,
            output,
        })
    }
}
