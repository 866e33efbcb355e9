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

use std::fs::File;
use std::io::{BufRead, BufReader, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use cap_std::fs::{Dir, OpenOptions};

use durable_shared::kinds::{DataMigration, MigrationParams, ParamError};
use durable_shared::results::MigrationResult;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};
use sha2::{Digest, Sha256};

use super::splitmix64;
use crate::engine::{Env, Plan, Step, StepError, TaskKind, blocking, path_error};

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

/// Reads up to `count` records of `file` starting at byte `offset`; returns them and the offset
/// after.
fn read_file_records(
    mut file: File,
    format: SourceFormat,
    offset: u64,
    count: u64,
) -> Result<(Vec<Value>, u64), StepError> {
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

fn count_file_records(
    dir: &Dir,
    path: &Path,
    format: SourceFormat,
    limit: u64,
) -> Result<u64, ParamError> {
    let mut offset = 0;
    let mut counted = 0;
    while counted < limit {
        let file = open_source(dir, path)
            .map_err(|e| ParamError::new("source_path", format!("cannot read source_path: {e}")))?;
        let (records, next) = read_file_records(file, format, offset, 10_000.min(limit - counted))
            .map_err(|e| ParamError::new("source_path", format!("cannot read source_path: {e}")))?;
        if records.is_empty() {
            break;
        }
        counted += records.len() as u64;
        offset = next;
    }
    Ok(counted)
}

/// The source file (none for a generator) and the destination, relative to the data
/// directory, which every open goes through.
fn paths(params: &MigrationParams, env: &Env) -> Result<(Option<PathBuf>, PathBuf), ParamError> {
    let format = source_format(&params.source_path)?;
    let source = match format {
        SourceFormat::Sample(_) => None,
        _ => Some(env.relative("source_path", &params.source_path)?),
    };
    let destination = env.relative("destination_path", &params.destination_path)?;
    Ok((source, destination))
}

fn data_dir(env: &Env) -> Result<Dir, StepError> {
    env.dir()
        .map_err(|e| StepError(format!("the data directory is unusable: {e}")))
}

fn open_source(dir: &Dir, path: &Path) -> std::io::Result<File> {
    Ok(dir.open(path)?.into_std())
}

/// The destination opened for writing (created if missing, with its directories).
fn open_destination(dir: &Dir, path: &Path) -> std::io::Result<File> {
    if let Some(parent) = path
        .parent()
        .filter(|parent| !parent.as_os_str().is_empty())
    {
        dir.create_dir_all(parent)?;
    }
    let file = dir.open_with(
        path,
        OpenOptions::new().create(true).truncate(false).write(true),
    )?;
    Ok(file.into_std())
}

/// [`TaskKind::plan`] of a migration: checks both paths and counts the source's records.
fn plan(params: &MigrationParams, env: &Env) -> Result<Plan<MigrationState>, ParamError> {
    let (source, destination) = paths(params, env)?;
    let dir = env
        .dir()
        .map_err(|e| ParamError::general(format!("the data directory is unusable: {e}")))?;
    if dir.metadata(&destination).is_ok_and(|meta| meta.is_dir()) {
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
        match dir.metadata(&source) {
            Ok(meta) if meta.is_file() => {}
            Ok(_) => {
                return Err(ParamError::new(
                    "source_path",
                    format!("source_path {:?} is not a file", params.source_path),
                ));
            }
            Err(e) => return Err(path_error("source_path", &params.source_path, &e)),
        }
        let format = source_format(&params.source_path)?;
        let available = count_file_records(&dir, &source, format, params.record_count)?;
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

impl TaskKind for DataMigration {
    type State = MigrationState;

    /// Reads the whole source file to count its records: on a thread of its own (see
    /// [`blocking`]), so that other calls go on meanwhile.
    fn plan(
        &self,
        params: &MigrationParams,
        env: &Env,
    ) -> Result<Plan<MigrationState>, ParamError> {
        blocking(|| plan(params, env))
    }

    /// Two unfinished tasks writing one file would interleave their batches.
    fn exclusive(&self, params: &MigrationParams, env: &Env) -> Option<(&'static str, String)> {
        let destination = env
            .relative("destination_path", &params.destination_path)
            .ok()?;
        Some((
            "destination_path",
            env.data_dir.join(destination).display().to_string(),
        ))
    }

    /// Truncates and fsyncs the destination: on a thread of its own (see [`blocking`]).
    fn restore(
        &self,
        params: &MigrationParams,
        state: &MigrationState,
        env: &Env,
    ) -> Result<(), StepError> {
        blocking(|| {
            let (_, destination) = paths(params, env)?;
            let file = open_destination(&data_dir(env)?, &destination).map_err(|e| {
                StepError(path_error("destination_path", &params.destination_path, &e).message)
            })?;
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
        })
    }

    async fn step(
        &self,
        params: &MigrationParams,
        state: &MigrationState,
        env: &Env,
    ) -> Result<Step<MigrationState, MigrationResult>, StepError> {
        env.pace(SECONDS_PER_BATCH).await;
        // No await from here on: the batch's I/O cannot be interrupted half-way.
        blocking(|| migrate_batch(params, state, env))
    }
}

/// Copies the next batch of records to the destination, fsynced, and after the last one
/// hashes the whole destination.
fn migrate_batch(
    params: &MigrationParams,
    state: &MigrationState,
    env: &Env,
) -> Result<Step<MigrationState, MigrationResult>, StepError> {
    let (source, destination) = paths(params, env)?;
    let dir = data_dir(env)?;
    let count = BATCH.min(params.record_count - state.records_done);
    let (records, source_offset) = match source_format(&params.source_path)? {
        SourceFormat::Sample(name) => (
            (state.records_done..state.records_done + count)
                .map(|index| sample_record(name, index))
                .collect::<Vec<_>>(),
            0,
        ),
        format => {
            let source = source.ok_or_else(|| StepError("file source without a path".into()))?;
            read_file_records(
                open_source(&dir, &source)?,
                format,
                state.source_offset,
                count,
            )?
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
    let mut file = dir
        .open_with(&destination, OpenOptions::new().write(true))?
        .into_std();
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
    let mut written = dir.open(&destination)?.into_std();
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn csv_and_jsonl_sources_resume_from_their_offsets() {
        let dir = tempfile::tempdir().unwrap();
        let csv = dir.path().join("in.csv");
        std::fs::write(&csv, "id,name\n1,a\n2,\"b, with comma\"\n3,c\n").unwrap();
        let open = |path: &Path| File::open(path).unwrap();
        let (first, offset) = read_file_records(open(&csv), SourceFormat::Csv, 0, 2).unwrap();
        assert_eq!(
            first,
            vec![
                json!({"id": "1", "name": "a"}),
                json!({"id": "2", "name": "b, with comma"})
            ]
        );
        let (rest, _) = read_file_records(open(&csv), SourceFormat::Csv, offset, 10).unwrap();
        assert_eq!(rest, vec![json!({"id": "3", "name": "c"})]);

        let jsonl = dir.path().join("in.jsonl");
        std::fs::write(&jsonl, "{\"a\":1}\n\n{\"a\":2}\n{\"a\":3}\n").unwrap();
        let (first, offset) = read_file_records(open(&jsonl), SourceFormat::Jsonl, 0, 2).unwrap();
        assert_eq!(first, vec![json!({"a": 1}), json!({"a": 2})]);
        let (rest, _) = read_file_records(open(&jsonl), SourceFormat::Jsonl, offset, 10).unwrap();
        assert_eq!(rest, vec![json!({"a": 3})]);
        assert_eq!(
            count_file_records(
                &Dir::open_ambient_dir(dir.path(), cap_std::ambient_authority()).unwrap(),
                Path::new("in.jsonl"),
                SourceFormat::Jsonl,
                100
            )
            .unwrap(),
            3
        );
    }

    /// A subject's directory with a secret file beside it, outside.
    fn tenant() -> (tempfile::TempDir, Env) {
        let root = tempfile::tempdir().unwrap();
        std::fs::write(root.path().join("secret.jsonl"), "{\"secret\":1}\n").unwrap();
        std::fs::create_dir(root.path().join("elsewhere")).unwrap();
        let env = Env {
            data_dir: root.path().join("subject"),
            time_scale: 0.0,
            per_owner: false,
        };
        std::fs::create_dir(&env.data_dir).unwrap();
        (root, env)
    }

    fn params(source: &str, destination: &str) -> MigrationParams {
        MigrationParams {
            source_path: source.into(),
            destination_path: destination.into(),
            record_count: 1,
        }
    }

    fn refused(env: &Env, source: &str, destination: &str) -> ParamError {
        DataMigration
            .plan(&params(source, destination), env)
            .unwrap_err()
    }

    #[test]
    fn no_path_or_link_leads_out_of_the_subjects_directory() {
        let (root, env) = tenant();
        let outside = |name: &str| root.path().join(name);
        let link = |target: &Path, name: &str| {
            std::os::unix::fs::symlink(target, env.data_dir.join(name)).unwrap()
        };
        assert!(
            refused(&env, "../secret.jsonl", "out.jsonl")
                .message
                .contains("'..'")
        );
        let absolute = outside("secret.jsonl").display().to_string();
        assert!(
            refused(&env, &absolute, "out.jsonl")
                .message
                .contains("not absolute")
        );

        link(&outside("secret.jsonl"), "existing.jsonl");
        let error = refused(&env, "existing.jsonl", "out.jsonl");
        assert_eq!(error.field.as_deref(), Some("source_path"));
        assert!(error.message.contains("leads outside"), "{error:?}");

        // A dangling link out: following it would create a file outside.
        link(&outside("planted.jsonl"), "dangling.jsonl");
        let plan = DataMigration.plan(&params("sample:customers", "dangling.jsonl"), &env);
        let state = plan.map(|plan| plan.state);
        let restored = state
            .as_ref()
            .map_err(|e| e.message.clone())
            .and_then(|state| {
                DataMigration
                    .restore(&params("sample:customers", "dangling.jsonl"), state, &env)
                    .map_err(|e| e.0)
            });
        assert!(restored.unwrap_err().contains("leads outside"));
        assert!(!outside("planted.jsonl").exists());

        link(&outside("elsewhere"), "linked-dir");
        let error = refused(&env, "linked-dir/../secret.jsonl", "out.jsonl");
        assert!(error.message.contains("'..'"), "{error:?}");
        let ok = DataMigration.plan(&params("sample:customers", "linked-dir/out.jsonl"), &env);
        let state = ok.unwrap().state;
        let restored = DataMigration.restore(
            &params("sample:customers", "linked-dir/out.jsonl"),
            &state,
            &env,
        );
        let error = restored.unwrap_err().0;
        assert!(error.contains("link leading outside"), "{error}");
        assert!(!outside("elsewhere/out.jsonl").exists());
    }

    /// A directory checked at planning time and swapped for a link out before the first step
    /// still cannot be written through: every open is resolved beneath the directory.
    #[test]
    fn a_link_swapped_in_after_planning_is_not_followed_out() {
        let (root, env) = tenant();
        std::fs::create_dir(env.data_dir.join("out")).unwrap();
        let params = params("sample:customers", "out/customers.jsonl");
        let plan = DataMigration.plan(&params, &env).unwrap();
        DataMigration.restore(&params, &plan.state, &env).unwrap();
        std::fs::remove_dir_all(env.data_dir.join("out")).unwrap();
        std::os::unix::fs::symlink(root.path().join("elsewhere"), env.data_dir.join("out"))
            .unwrap();
        let step = futures::executor::block_on(DataMigration.step(&params, &plan.state, &env));
        assert!(step.is_err(), "the step wrote through the swapped link");
        assert!(!root.path().join("elsewhere/customers.jsonl").exists());
        assert!(DataMigration.restore(&params, &plan.state, &env).is_err());
        assert!(!root.path().join("elsewhere/customers.jsonl").exists());
    }
}
