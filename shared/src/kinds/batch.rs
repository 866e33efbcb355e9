//! Batch processing: numbered items processed in batches, folded into a SHA-256 chain.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{KindSpec, ParamError, check_range};
use crate::results::BatchResult;

/// Items one task may process.
pub const MAX_ITEMS: u64 = 100_000_000;
/// Batches one task may have (each is a committed step).
pub const MAX_BATCHES: u64 = 1_000_000;

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct BatchParams {
    /// Items per batch.
    #[schemars(title = "Batch size", range(min = 1, max = 1_000_000), example = 100)]
    pub batch_size: u64,
    /// Items to process in all.
    #[schemars(
        title = "Total items",
        range(min = 1, max = 100_000_000),
        example = 1000
    )]
    pub total_items: u64,
    /// Simulated seconds of work per batch (scaled by the server's --time-scale).
    #[serde(default = "default_delay")]
    #[schemars(title = "Delay per batch (s)", range(min = 0.0, max = 3600.0))]
    pub processing_delay: f64,
}

fn default_delay() -> f64 {
    10.0
}

pub struct BatchProcessing;

impl KindSpec for BatchProcessing {
    const NAME: &'static str = "batch_processing";
    const TITLE: &'static str = "Batch processing";
    const DESCRIPTION: &'static str = "Start durable batch processing of total_items items, \
        batch_size per checkpointed batch, with processing_delay seconds of work per batch. \
        Returns a task://status/{task_id} link at once; the result holds a digest over every item.";
    const RESULT: &'static str = "the digest over every item";
    type Params = BatchParams;
    type Output = BatchResult;

    fn validate(params: &BatchParams) -> Result<(), ParamError> {
        check_range("batch_size", params.batch_size, 1, 1_000_000)?;
        check_range("total_items", params.total_items, 1, MAX_ITEMS)?;
        if !params.processing_delay.is_finite() {
            return Err(ParamError::new(
                "processing_delay",
                "processing_delay must be a finite number of seconds",
            ));
        }
        check_range("processing_delay", params.processing_delay, 0.0, 3600.0)?;
        let batches = params.total_items.div_ceil(params.batch_size);
        if batches > MAX_BATCHES {
            return Err(ParamError::new(
                "batch_size",
                format!(
                    "total_items / batch_size gives {batches} batches; at most {MAX_BATCHES} are \
                     allowed, so raise batch_size to at least {}",
                    params.total_items.div_ceil(MAX_BATCHES)
                ),
            ));
        }
        Ok(())
    }
}
