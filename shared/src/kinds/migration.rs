//! Data migration: records copied from a source to a JSONL file, 100 per step.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{KindSpec, ParamError, check_range};
use crate::results::MigrationResult;

/// Records one migration may copy.
pub const MAX_RECORDS: u64 = 10_000_000;

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct MigrationParams {
    /// Where records come from: a `.jsonl`/`.ndjson` or `.csv` file relative to the server's data
    /// directory, or a built-in generator: `sample:customers` or `sample:orders`.
    #[serde(default = "default_source")]
    #[schemars(title = "Source")]
    pub source_path: String,
    /// JSONL file to write, relative to the server's data directory (created or overwritten).
    #[serde(default = "default_destination")]
    #[schemars(title = "Destination (JSONL)")]
    pub destination_path: String,
    /// How many records to copy, from the start of the source.
    #[serde(default = "default_record_count")]
    #[schemars(title = "Records", range(min = 1, max = 10_000_000))]
    pub record_count: u64,
}

fn default_source() -> String {
    "sample:customers".into()
}
fn default_destination() -> String {
    "out/customers.jsonl".into()
}
fn default_record_count() -> u64 {
    1000
}

pub struct DataMigration;

impl KindSpec for DataMigration {
    const NAME: &'static str = "data_migration";
    const TITLE: &'static str = "Data migration";
    const DESCRIPTION: &'static str = "Start a durable data migration: copies the first \
        record_count records of source_path (a .jsonl/.csv file in the server's data directory, \
        or sample:customers / sample:orders) to the JSONL file destination_path, 100 records per \
        checkpointed batch. Returns a task://status/{task_id} link at once; the copy continues \
        in the background and survives restarts, writing each record exactly once.";
    const RESULT: &'static str = "the migration report";
    type Params = MigrationParams;
    type Output = MigrationResult;

    /// Paths and the source's size depend on the server's data directory: its `plan` checks them.
    fn validate(params: &MigrationParams) -> Result<(), ParamError> {
        check_range("record_count", params.record_count, 1, MAX_RECORDS)
    }
}
