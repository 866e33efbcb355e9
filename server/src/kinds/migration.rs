//! `start_data_migration`: copies the first `record_count` records of a source (a JSONL or CSV
//! file in the data directory, or a built-in generator such as `sample:customers`) to a JSONL
//! destination, one batch of 100 per step.
//!
//! Exactly once: the checkpoint holds how many records and bytes the destination has and where
//! the next source record starts. A run first truncates the destination back to the checkpointed
//! length ([`TaskKind::restore`]), so a batch written before a crash but never committed is
//! dropped and written again, once. Each batch's file I/O runs synchronously between two awaits,
//! so a pause or cancel can never interrupt it half-way, and the batch is fsynced before its
//! checkpoint commits.

use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use durable_shared::kinds::{DataMigration, MigrationParams, ParamError};
use durable_shared::results::MigrationResult;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};
use sha2::{Digest, Sha256};

use super::splitmix64;
use crate::engine::{Env, Plan, Step, StepError, TaskKind};

const BATCH: u64 = 100;
/// Reference pacing: one second per batch.
const SECONDS_PER_BATCH: f64 = 1.0;
const SAMPLES: &[&str] = &["sample:customers", "sample:orders"];

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct MigrationState {
    records_done: u64,
    destination_bytes: u64,
    /// Byte offset of the next record in a file source.
    source_offset: u64,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum SourceFormat {
    Sample(&'static str),
    Jsonl,
    Csv,
}

fn source_format(source: &str) -> Result<SourceFormat, ParamError> {
    let refuse = |message: String| ParamError::new("source_path", message);
    if source.starts_with("sample:") {
        return SAMPLES
            .iter()
            .find(|name| **name == source)
            .map(|name| SourceFormat::Sample(name))
            .ok_or_else(|| {
                refuse(format!(
                    "source_path {source:?} is not a known generator; use one of: {}",
                    SAMPLES.join(", ")
                ))
            });
    }
    match Path::new(source).extension().and_then(|e| e.to_str()) {
        Some("jsonl" | "ndjson") => Ok(SourceFormat::Jsonl),
        Some("csv") => Ok(SourceFormat::Csv),
        _ => Err(refuse(format!(
            "source_path {source:?} must end in .jsonl, .ndjson or .csv, or name a generator \
             ({})",
            SAMPLES.join(", ")
        ))),
    }
}

/// Record `index` (0-based) of a built-in generator.
fn sample_record(name: &str, index: u64) -> Value {
    let id = index + 1;
    let noise = splitmix64(index ^ super::seed_of(name));
    const ORDER_STATUSES: [&str; 4] = ["new", "paid", "shipped", "delivered"];
    const COUNTRIES: [&str; 5] = ["DE", "ES", "FR", "JP", "US"];
    let pick = (noise >> 20) as usize;
    match name {
        "sample:orders" => json!({
            "order_id": id,
            "customer_id": 1 + noise % 5000,
            "amount_cents": noise % 100_000,
            "status": ORDER_STATUSES[pick % ORDER_STATUSES.len()],
        }),
        _ => json!({
            "id": id,
            "name": format!("Customer {id:06}"),
            "email": format!("customer{id}@example.com"),
            "country": COUNTRIES[pick % COUNTRIES.len()],
            "balance_cents": noise % 1_000_000,
        }),
    }
}

/// Reads up to `count` records starting at byte `offset`; returns them and the offset after.
fn read_file_records(
    path: &Path,
    format: SourceFormat,
    offset: u64,
    count: u64,
) -> Result<(Vec<Value>, u64), StepError> {
    let mut file = File::open(path)?;
    match format {
        SourceFormat::Csv => {
            let mut reader = csv::Reader::from_reader(file);
            let headers = reader
                .headers()
                .map_err(|e| StepError(format!("source CSV header: {e}")))?
                .clone();
            if offset > 0 {
                let mut position = csv::Position::new();
                position.set_byte(offset);
                reader
                    .seek(position)
                    .map_err(|e| StepError(format!("source CSV seek: {e}")))?;
            }
            let mut records = Vec::new();
            let mut row = csv::StringRecord::new();
            while (records.len() as u64) < count {
                let more = reader
                    .read_record(&mut row)
                    .map_err(|e| StepError(format!("source CSV: {e}")))?;
                if !more {
                    break;
                }
                let object: Map<String, Value> = headers
                    .iter()
                    .zip(row.iter())
                    .map(|(key, value)| (key.to_owned(), Value::String(value.to_owned())))
                    .collect();
                records.push(Value::Object(object));
            }
            Ok((records, reader.position().byte()))
        }
        _ => {
            file.seek(SeekFrom::Start(offset))?;
            let mut reader = BufReader::new(file);
            let mut records = Vec::new();
            let mut position = offset;
            let mut line = String::new();
            while (records.len() as u64) < count {
                line.clear();
                let read = reader.read_line(&mut line)?;
                if read == 0 {
                    break;
                }
                position += read as u64;
                if line.trim().is_empty() {
                    continue;
                }
                let value: Value = serde_json::from_str(&line).map_err(|e| {
                    StepError(format!(
                        "source record at byte {} is not JSON: {e}",
                        position - read as u64
                    ))
                })?;
                records.push(value);
            }
            Ok((records, position))
        }
    }
}

fn count_file_records(path: &Path, format: SourceFormat, limit: u64) -> Result<u64, ParamError> {
    let mut offset = 0;
    let mut counted = 0;
    while counted < limit {
        let (records, next) = read_file_records(path, format, offset, 10_000.min(limit - counted))
            .map_err(|e| ParamError::new("source_path", format!("cannot read source_path: {e}")))?;
        if records.is_empty() {
            break;
        }
        counted += records.len() as u64;
        offset = next;
    }
    Ok(counted)
}

/// The source file (none for a generator) and the destination, inside the data directory.
fn paths(params: &MigrationParams, env: &Env) -> Result<(Option<PathBuf>, PathBuf), ParamError> {
    let format = source_format(&params.source_path)?;
    let source = match format {
        SourceFormat::Sample(_) => None,
        _ => Some(env.resolve("source_path", &params.source_path)?),
    };
    let destination = env.resolve("destination_path", &params.destination_path)?;
    Ok((source, destination))
}

impl TaskKind for DataMigration {
    type State = MigrationState;

    fn plan(
        &self,
        params: &MigrationParams,
        env: &Env,
    ) -> Result<Plan<MigrationState>, ParamError> {
        let (source, destination) = paths(params, env)?;
        if destination.is_dir() {
            return Err(ParamError::new(
                "destination_path",
                format!(
                    "destination_path {:?} is a directory; name a file",
                    params.destination_path
                ),
            ));
        }
        if let Some(source) = source {
            if source == destination {
                return Err(ParamError::new(
                    "destination_path",
                    "source_path and destination_path must differ",
                ));
            }
            if !source.is_file() {
                return Err(ParamError::new(
                    "source_path",
                    format!(
                        "source_path {:?} does not exist in the data directory",
                        params.source_path
                    ),
                ));
            }
            let format = source_format(&params.source_path)?;
            let available = count_file_records(&source, format, params.record_count)?;
            if available < params.record_count {
                return Err(ParamError::new(
                    "record_count",
                    format!(
                        "record_count is {} but source_path {:?} holds only {available} records",
                        params.record_count, params.source_path
                    ),
                ));
            }
        }
        Ok(Plan {
            total: params.record_count,
            state: MigrationState {
                records_done: 0,
                destination_bytes: 0,
                source_offset: 0,
            },
        })
    }

    fn restore(
        &self,
        params: &MigrationParams,
        state: &MigrationState,
        env: &Env,
    ) -> Result<(), StepError> {
        let (_, destination) = paths(params, env)?;
        if let Some(parent) = destination.parent() {
            std::fs::create_dir_all(parent)?;
        }
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&destination)?;
        let length = file.metadata()?.len();
        if length < state.destination_bytes {
            return Err(StepError(format!(
                "destination is {length} bytes but the checkpoint says {} were written; it was \
                 changed outside durable-mcp",
                state.destination_bytes
            )));
        }
        // Drop whatever a step wrote after the last committed checkpoint.
        file.set_len(state.destination_bytes)?;
        file.sync_all()?;
        Ok(())
    }

    async fn step(
        &self,
        params: &MigrationParams,
        state: &MigrationState,
        env: &Env,
    ) -> Result<Step<MigrationState, MigrationResult>, StepError> {
        env.pace(SECONDS_PER_BATCH).await;
        // From here to the end, no await: the batch's I/O cannot be interrupted half-way.
        let (source, destination) = paths(params, env)?;
        let count = BATCH.min(params.record_count - state.records_done);
        let (records, source_offset) = match source_format(&params.source_path)? {
            SourceFormat::Sample(name) => (
                (state.records_done..state.records_done + count)
                    .map(|index| sample_record(name, index))
                    .collect::<Vec<_>>(),
                0,
            ),
            format => {
                let source =
                    source.ok_or_else(|| StepError("file source without a path".into()))?;
                read_file_records(&source, format, state.source_offset, count)?
            }
        };
        if (records.len() as u64) < count {
            return Err(StepError(format!(
                "source ended after {} records; {} were requested",
                state.records_done + records.len() as u64,
                params.record_count
            )));
        }
        let mut batch = Vec::new();
        for record in &records {
            serde_json::to_writer(&mut batch, record)?;
            batch.push(b'\n');
        }
        let mut file = OpenOptions::new().write(true).open(&destination)?;
        file.seek(SeekFrom::Start(state.destination_bytes))?;
        file.write_all(&batch)?;
        file.sync_data()?;

        let next = MigrationState {
            records_done: state.records_done + count,
            destination_bytes: state.destination_bytes + batch.len() as u64,
            source_offset,
        };
        let message = format!(
            "Migrated {}/{} records",
            next.records_done, params.record_count
        );
        if next.records_done < params.record_count {
            return Ok(Step::Continue {
                progress: next.records_done,
                state: next,
                message,
            });
        }
        let mut hasher = Sha256::new();
        let mut written = File::open(&destination)?;
        let mut buffer = vec![0; 64 * 1024];
        loop {
            let read = written.read(&mut buffer)?;
            if read == 0 {
                break;
            }
            hasher.update(&buffer[..read]);
        }
        let output = MigrationResult {
            migrated_records: next.records_done,
            total_records: params.record_count,
            source_path: params.source_path.clone(),
            destination_path: params.destination_path.clone(),
            destination_bytes: next.destination_bytes,
            destination_sha256: hex::encode(hasher.finalize()),
            success: true,
        };
        Ok(Step::Done {
            progress: next.records_done,
            state: next,
            message,
            output,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn csv_and_jsonl_sources_resume_from_their_offsets() {
        let dir = tempfile::tempdir().unwrap();
        let csv = dir.path().join("in.csv");
        std::fs::write(&csv, "id,name\n1,a\n2,\"b, with comma\"\n3,c\n").unwrap();
        let (first, offset) = read_file_records(&csv, SourceFormat::Csv, 0, 2).unwrap();
        assert_eq!(
            first,
            vec![
                json!({"id": "1", "name": "a"}),
                json!({"id": "2", "name": "b, with comma"})
            ]
        );
        let (rest, _) = read_file_records(&csv, SourceFormat::Csv, offset, 10).unwrap();
        assert_eq!(rest, vec![json!({"id": "3", "name": "c"})]);

        let jsonl = dir.path().join("in.jsonl");
        std::fs::write(&jsonl, "{\"a\":1}\n\n{\"a\":2}\n{\"a\":3}\n").unwrap();
        let (first, offset) = read_file_records(&jsonl, SourceFormat::Jsonl, 0, 2).unwrap();
        assert_eq!(first, vec![json!({"a": 1}), json!({"a": 2})]);
        let (rest, _) = read_file_records(&jsonl, SourceFormat::Jsonl, offset, 10).unwrap();
        assert_eq!(rest, vec![json!({"a": 3})]);
        assert_eq!(
            count_file_records(&jsonl, SourceFormat::Jsonl, 100).unwrap(),
            3
        );
    }
}
