//! Data processing: the in-request job of `resumable_data_processing`.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{KindSpec, Offer, ParamError, check_length, check_range};
use crate::results::ProcessingResult;

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct ProcessingParams {
    /// Name of the dataset; record ids are `{dataset_name}_{index:06}`.
    #[serde(default = "default_dataset")]
    #[schemars(title = "Dataset name", length(min = 1, max = 100))]
    pub dataset_name: String,
    /// Records to process in all.
    #[serde(default = "default_total")]
    #[schemars(title = "Total records", range(min = 1, max = 1_000_000))]
    pub total_records: u64,
    /// Records per batch; one checkpoint and one progress notification per batch.
    #[serde(default = "default_batch")]
    #[schemars(title = "Batch size", range(min = 1, max = 10_000))]
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

pub struct DataProcessing;

impl KindSpec for DataProcessing {
    const NAME: &'static str = "data_processing";
    const TITLE: &'static str = "Data processing";
    const DESCRIPTION: &'static str = "Process total_records records of dataset_name in batches \
        of batch_size, inside this call, streaming progress (send a progressToken) and returning \
        the result. Resumable: calling again with the same arguments and client_id continues \
        from the last checkpoint (or returns the stored result) and never processes a record \
        twice.";
    const RESULT: &'static str = "the processed count, the value sum and the first records";
    const OFFER: Offer = Offer::InRequest;
    type Params = ProcessingParams;
    type Output = ProcessingResult;

    fn validate(params: &ProcessingParams) -> Result<(), ParamError> {
        check_length("dataset_name", &params.dataset_name, 1, 100)?;
        check_range("total_records", params.total_records, 1, 1_000_000)?;
        check_range("batch_size", params.batch_size, 1, 10_000)
    }
}
