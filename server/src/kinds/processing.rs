//! `resumable_data_processing`: the in-request job of the first reference server, processing
//! synthetic records in batches and never counting one twice.

use durable_shared::kinds::{DataProcessing, ParamError, ProcessingParams};
use durable_shared::results::{ProcessedRecord, ProcessingResult};
use serde::{Deserialize, Serialize};

use super::{seed_of, splitmix64};
use crate::engine::{Env, Plan, Step, StepError, TaskKind};

/// Reference pacing: one second per batch.
const SECONDS_PER_BATCH: f64 = 1.0;
const FIRST_RECORDS_KEPT: usize = 5;

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ProcessingState {
    processed: u64,
    value_sum: u64,
    first_records: Vec<ProcessedRecord>,
}

fn record(dataset: &str, index: u64) -> ProcessedRecord {
    ProcessedRecord {
        record_id: format!("{dataset}_{index:06}"),
        processed_at: format!("step_{index}"),
        value: 1 + splitmix64(seed_of(dataset) ^ index) % 1000,
    }
}

impl TaskKind for DataProcessing {
    type State = ProcessingState;

    fn plan(
        &self,
        params: &ProcessingParams,
        _env: &Env,
    ) -> Result<Plan<ProcessingState>, ParamError> {
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
