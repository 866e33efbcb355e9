//! `start_batch_processing`: processes numbered items in batches, folding each into a SHA-256
//! chain, so the result proves every item was processed once and in order.

use durable_shared::kinds::{BatchParams, BatchProcessing, ParamError};
use durable_shared::results::BatchResult;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::splitmix64;
use crate::engine::{Env, Plan, Step, StepError, TaskKind, blocking};

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct BatchState {
    processed: u64,
    batches: u64,
    /// Hex SHA-256 chain over every processed item so far.
    digest: String,
    checksum: u64,
}

/// Most items a step hashes on its async worker (well under a millisecond); a bigger batch is
/// hashed through [`blocking`].
const ITEMS_HASHED_IN_PLACE: u64 = 1_000;

/// The value of item `index`: what "processing" it yields.
fn item_value(index: u64) -> u64 {
    splitmix64(index) % 1_000_000
}

impl TaskKind for BatchProcessing {
    type State = BatchState;

    fn plan(&self, params: &BatchParams, _env: &Env) -> Result<Plan<BatchState>, ParamError> {
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
        let mut hash = || {
            let mut checksum = state.checksum;
            for index in state.processed..end {
                let value = item_value(index);
                hasher.update(index.to_le_bytes());
                hasher.update(value.to_le_bytes());
                checksum += value;
            }
            checksum
        };
        // Up to a million items: hashing them would hold up the runtime's other tasks.
        let checksum = match end - state.processed {
            items if items > ITEMS_HASHED_IN_PLACE => blocking(hash),
            _ => hash(),
        };
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
