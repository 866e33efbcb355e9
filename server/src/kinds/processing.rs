//! `resumable_data_processing`: the in-request job of the first reference server, processing
//! synthetic records in batches and never counting one twice.

use durable_shared::kinds::DATA_PROCESSING;
use durable_shared::results::{ProcessedRecord, ProcessingResult};
use rmcp::schemars::{self, JsonSchema};
use serde::{Deserialize, Serialize};

use super::{check_range, seed_of, splitmix64};
use crate::engine::{Env, Plan, Step, StepError, TaskKind};

/// Reference pacing: one second per batch.
const SECONDS_PER_BATCH: f64 = 1.0;
const FIRST_RECORDS_KEPT: usize = 5;

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct ProcessingParams {
    /// Name of the dataset; record ids are `{dataset_name}_{index:06}`.
    #[serde(default = "default_dataset")]
    #[schemars(length(min = 1, max = 100))]
    pub dataset_name: String,
    /// Records to process in all.
    #[serde(default = "default_total")]
    #[schemars(range(min = 1, max = 1_000_000))]
    pub total_records: u64,
    /// Records per batch; one checkpoint and one progress notification per batch.
    #[serde(default = "default_batch")]
    #[schemars(range(min = 1, max = 10_000))]
    pub batch_size: u64,
}

fn default_dataset() -> String {
    "default_dataset".into()
}
fn default_total() -> u64 {
    100
}
fn default_batch() -> u64 {
    10
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ProcessingState {
    processed: u64,
    value_sum: u64,
    first_records: Vec<ProcessedRecord>,
}

pub struct DataProcessing;

fn record(dataset: &str, index: u64) -> ProcessedRecord {
    ProcessedRecord {
        record_id: format!("{dataset}_{index:06}"),
        processed_at: format!("step_{index}"),
        value: 1 + splitmix64(seed_of(dataset) ^ index) % 1000,
    }
}

impl TaskKind for DataProcessing {
    const NAME: &'static str = DATA_PROCESSING;
    type Params = ProcessingParams;
    type State = ProcessingState;
    type Output = ProcessingResult;

    fn plan(&self, params: &ProcessingParams, _env: &Env) -> Result<Plan<ProcessingState>, String> {
        check_range(
            "dataset_name length",
            params.dataset_name.chars().count(),
            1,
            100,
        )?;
        check_range("total_records", params.total_records, 1, 1_000_000)?;
        check_range("batch_size", params.batch_size, 1, 10_000)?;
        Ok(Plan {
            total: params.total_records,
            state: ProcessingState {
                processed: 0,
                value_sum: 0,
                first_records: Vec::new(),
            },
        })
    }

    async fn step(
        &self,
        params: &ProcessingParams,
        state: &ProcessingState,
        env: &Env,
    ) -> Result<Step<ProcessingState, ProcessingResult>, StepError> {
        env.pace(SECONDS_PER_BATCH).await;
        let end = (state.processed + params.batch_size).min(params.total_records);
        let mut next = state.clone();
        for index in state.processed..end {
            let record = record(&params.dataset_name, index);
            next.value_sum += record.value;
            if next.first_records.len() < FIRST_RECORDS_KEPT {
                next.first_records.push(record);
            }
        }
        next.processed = end;
        let message = format!("Processed {end}/{} records", params.total_records);
        if end < params.total_records {
            return Ok(Step::Continue {
                state: next,
                progress: end,
                message,
            });
        }
        let output = ProcessingResult {
            dataset_name: params.dataset_name.clone(),
            total_processed: next.processed,
            records: next.first_records.clone(),
            value_sum: next.value_sum,
            status: "completed".into(),
        };
        Ok(Step::Done {
            state: next,
            progress: end,
            message,
            output,
        })
    }
}
