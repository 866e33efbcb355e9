//! [`TaskRepo`] on SQLite: the `tasks` table, one row per task holding its status, progress and checkpoint.
//!
//! Every change is a conditional `UPDATE ... RETURNING` so that the rules of the lifecycle are
//! enforced by the database, not by the timing of callers: a terminal status is never left, a
//! paused task is never advanced, and a step is committed only by the worker holding the task's
//! current lease.

use async_trait::async_trait;
use std::collections::BTreeMap;
use std::str::FromStr;

use chrono::{DateTime, TimeZone, Utc};
use durable_shared::{CheckpointStats, TaskInfo, TaskStatus};
use rusqlite::{Connection, OptionalExtension, Row, ToSql, params};
use serde_json::Value;

use super::Sqlite;
use super::owners::OwnerLoad;
use crate::store::{
    Claimant, NewTask, Refusal, StepCommit, StoreError, TaskRepo, TaskRow, Transition, now_ms,
};

/// The columns of a [`TaskInfo`], in the order [`read_info`] reads them; the checkpoint is read
/// only when a worker claims the task. A macro rather than a constant so that the statements
/// using it are constant strings too: each is found in the statement cache without being
/// formatted first.
macro_rules! info_columns {
    () => {
        "id, kind, owner, params, status, progress, total, message, step, result, error, \
         created_at, updated_at, completed_at, node, question"
    };
}
pub(super) use info_columns;

/// How many columns [`info_columns!`] lists: the position of the first column after them.
pub(super) const INFO_COUNT: usize = 16;

fn time(ms: i64) -> DateTime<Utc> {
    Utc.timestamp_millis_opt(ms).single().unwrap_or_default()
}

fn parse_json(text: &str) -> rusqlite::Result<Value> {
    serde_json::from_str(text).map_err(|e| {
        rusqlite::Error::FromSqlConversionFailure(0, rusqlite::types::Type::Text, Box::new(e))
    })
}

/// The [`info_columns!`] of a row as stored, its JSON still text. A write that reads its row
/// back returns this, so that the parsing happens on the caller's thread after the write, not
/// on the writer's inside it, where it could fail after the write's statement had applied
/// (see `Undo::Statement`).
struct StoredInfo {
    id: String,
    kind: String,
    owner: String,
    params: String,
    status: String,
    progress: u64,
    total: u64,
    message: String,
    step: u64,
    result: Option<String>,
    error: Option<String>,
    created_at: i64,
    updated_at: i64,
    completed_at: Option<i64>,
    node: Option<String>,
    question: Option<String>,
}

impl StoredInfo {
    /// Reads the [`info_columns!`] at the start of `row`, by position: a column looked up by
    /// name is compared with the name of every column before it, on every row.
    fn read(row: &Row<'_>) -> rusqlite::Result<Self> {
        Ok(StoredInfo {
            id: row.get(0)?,
            kind: row.get(1)?,
            owner: row.get(2)?,
            params: row.get(3)?,
            status: row.get(4)?,
            progress: row.get(5)?,
            total: row.get(6)?,
            message: row.get(7)?,
            step: row.get(8)?,
            result: row.get(9)?,
            error: row.get(10)?,
            created_at: row.get(11)?,
            updated_at: row.get(12)?,
            completed_at: row.get(13)?,
            node: row.get(14)?,
            question: row.get(15)?,
        })
    }

    fn parse(self) -> rusqlite::Result<TaskInfo> {
        let conversion = |column, e| {
            rusqlite::Error::FromSqlConversionFailure(column, rusqlite::types::Type::Text, e)
        };
        let status = TaskStatus::from_str(&self.status).map_err(|e| conversion(4, Box::new(e)))?;
        let question = self
            .question
            .as_deref()
            .map(serde_json::from_str)
            .transpose();
        Ok(TaskInfo {
            task_id: self.id,
            status,
            progress: self.progress,
            total: self.total,
            message: self.message,
            result_data: self.result.as_deref().map(parse_json).transpose()?,
            error: self.error,
            created_at: time(self.created_at),
            updated_at: time(self.updated_at),
            completed_at: self.completed_at.map(time),
            kind: self.kind,
            parameters: parse_json(&self.params)?,
            owner: self.owner,
            step: self.step,
            percent: TaskInfo::percent_of(self.progress, self.total),
            node: self.node,
            question: question.map_err(|e| conversion(15, Box::new(e)))?,
        })
    }
}

/// Reads and parses the [`info_columns!`] at the start of `row`.
pub(super) fn read_info(row: &Row<'_>) -> rusqlite::Result<TaskInfo> {
    StoredInfo::read(row)?.parse()
}

/// A row of [`info_columns!`] followed by `checkpoint, lease`, as stored (see [`StoredInfo`]).
struct StoredRow {
    info: StoredInfo,
    checkpoint: String,
    lease: i64,
}

impl StoredRow {
    fn read(row: &Row<'_>) -> rusqlite::Result<Self> {
        Ok(StoredRow {
            info: StoredInfo::read(row)?,
            checkpoint: row.get(INFO_COUNT)?,
            lease: row.get(INFO_COUNT + 1)?,
        })
    }

    fn parse(self) -> rusqlite::Result<TaskRow> {
        Ok(TaskRow {
            info: self.info.parse()?,
            checkpoint: parse_json(&self.checkpoint)?,
            lease: self.lease,
        })
    }
}

/// Task `id` as stored, to be changed by a write: the writer, the only one, changes a row it
/// has read and answers with what it read and what it set. `UPDATE ... RETURNING` would read
/// it back instead, through a temporary table SQLite makes for every call, which cost more
/// than the row.
fn select_stored(conn: &Connection, id: &str) -> Result<Option<StoredInfo>, StoreError> {
    let mut stmt = conn.prepare_cached(concat!(
        "SELECT ",
        info_columns!(),
        " FROM tasks WHERE id = ?1"
    ))?;
    Ok(stmt.query_row([id], StoredInfo::read).optional()?)
}

/// Task `id` as stored, with its checkpoint and lease (see [`select_stored`]).
fn select_stored_row(conn: &Connection, id: &str) -> Result<Option<StoredRow>, StoreError> {
    let mut stmt = conn.prepare_cached(concat!(
        "SELECT ",
        info_columns!(),
        ", checkpoint, lease FROM tasks WHERE id = ?1"
    ))?;
    Ok(stmt.query_row([id], StoredRow::read).optional()?)
}

fn select_info(conn: &Connection, id: &str) -> Result<Option<TaskInfo>, StoreError> {
    Ok(select_stored(conn, id)?
        .map(StoredInfo::parse)
        .transpose()?)
}

/// What a conditional update of task `id` did: applied (`applied` is the row it returned), or
/// refused, with how the task stands, or the task does not exist.
fn outcome(
    conn: &Connection,
    id: &str,
    applied: Option<TaskInfo>,
) -> Result<Transition, StoreError> {
    Ok(match applied {
        Some(info) => Transition::Applied(info),
        None => match select_info(conn, id)? {
            Some(info) => Transition::Refused(info),
            None => Transition::NotFound,
        },
    })
}

fn in_list(statuses: &[TaskStatus]) -> String {
    let names: Vec<String> = statuses.iter().map(|s| format!("'{s}'")).collect();
    names.join(", ")
}

#[async_trait]
impl TaskRepo for Sqlite {
    /// Stores a new task as `pending` (or claimed, see [`NewTask::claim`]).
    async fn insert_task(&self, task: NewTask) -> Result<TaskInfo, StoreError> {
        let owners = self.owners.clone();
        self.write_statement(move |conn| insert(conn, &owners, task))
            .await
    }

    /// Stores `task` unless a task with its id exists; returns the stored task and whether it was
    /// created by this call. Used for tasks whose id is derived from their arguments.
    async fn insert_or_get_task(&self, task: NewTask) -> Result<(TaskInfo, bool), StoreError> {
        let owners = self.owners.clone();
        self.write_statement(move |conn| {
            Ok(match select_info(conn, &task.id)? {
                Some(info) => (info, false),
                None => (insert(conn, &owners, task)?, true),
            })
        })
        .await
    }

    /// Marks a `pending` (or orphaned `running`) task as running under a fresh lease and returns
    /// it with its checkpoint; `None` if its status does not allow running.
    async fn claim_task(
        &self,
        id: &str,
        claimant: &Claimant,
    ) -> Result<Option<TaskRow>, StoreError> {
        let (id, node, ttl_ms) = (id.to_owned(), claimant.node.clone(), claimant.ttl_ms());
        let claimed = self.write_statement(move |conn| claim(conn, &id, node, ttl_ms));
        Ok(claimed.await?.map(StoredRow::parse).transpose()?)
    }

    async fn claim_known(
        &self,
        known: TaskRow,
        claimant: &Claimant,
    ) -> Result<Option<TaskRow>, StoreError> {
        let (id, lease) = (known.info.task_id.clone(), known.lease);
        let (node, ttl_ms) = (claimant.node.clone(), claimant.ttl_ms());
        let claimed = self.write_statement(move |conn| {
            let now = now_ms();
            let changed = conn
                .prepare_cached(
                    "UPDATE tasks SET status = 'running', lease = lease + 1, node = ?2, \
                     lease_expires_at = ?3 + ?4, updated_at = ?3 \
                     WHERE id = ?1 AND status = 'pending' AND lease = ?5",
                )?
                .execute(params![id, node, now, ttl_ms, lease])?;
            // Not as known any more (paused, claimed, deleted): claimed as any other task.
            Ok(match changed {
                0 => Err(claim(conn, &id, node, ttl_ms)?),
                _ => Ok((now, node)),
            })
        });
        Ok(match claimed.await? {
            Ok((now, node)) => {
                let mut row = known;
                row.lease += 1;
                let info = &mut row.info;
                (info.status, info.node, info.updated_at) =
                    (TaskStatus::Running, Some(node), time(now));
                Some(row)
            }
            Err(stored) => stored.map(StoredRow::parse).transpose()?,
        })
    }

    async fn claimable_tasks(
        &self,
        claimant: &Claimant,
        own: bool,
        limit: usize,
    ) -> Result<Vec<(String, String)>, StoreError> {
        let node = own.then(|| claimant.node.clone());
        self.read(move |conn| {
            let mut stmt = conn.prepare_cached(
                "SELECT id, kind FROM tasks WHERE status = 'pending' OR (status = 'running' \
                 AND (lease_expires_at IS NULL OR lease_expires_at < ?1 OR node = ?2)) \
                 ORDER BY created_at LIMIT ?3",
            )?;
            let ids = stmt.query_map(params![now_ms(), node, limit as i64], |row| {
                Ok((row.get(0)?, row.get(1)?))
            })?;
            Ok(ids.collect::<Result<_, _>>()?)
        })
        .await
    }

    async fn renew_leases(
        &self,
        claimant: &Claimant,
        held: Vec<(String, i64)>,
    ) -> Result<Vec<String>, StoreError> {
        let (node, ttl_ms) = (claimant.node.clone(), claimant.ttl_ms());
        self.write(move |conn| {
            let mut stmt = conn.prepare_cached(
                "UPDATE tasks SET lease_expires_at = ?4 + ?5 \
                 WHERE id = ?1 AND lease = ?2 AND node = ?3 AND status = 'running'",
            )?;
            let now = now_ms();
            let mut renewed = Vec::with_capacity(held.len());
            for (id, lease) in held {
                if stmt.execute(params![id, lease, node, now, ttl_ms])? > 0 {
                    renewed.push(id);
                }
            }
            Ok(renewed)
        })
        .await
    }

    async fn release_leases(&self, node: &str) -> Result<u64, StoreError> {
        let node = node.to_owned();
        self.write(move |conn| {
            Ok(conn.execute(
                "UPDATE tasks SET lease_expires_at = 0 WHERE node = ?1 AND status = 'running'",
                [node],
            )? as u64)
        })
        .await
    }

    async fn release_stale_leases(&self) -> Result<u64, StoreError> {
        self.write(|conn| {
            Ok(conn.execute(
                "UPDATE tasks SET lease_expires_at = 0 WHERE status = 'running'",
                [],
            )? as u64)
        })
        .await
    }

    async fn commit_step(&self, mut commit: StepCommit) -> Result<Option<TaskInfo>, StoreError> {
        // Intermediate steps leave status and completion alone, so the indexes on them are
        // not rewritten on every step.
        let (sql, last) = match (&commit.result, &commit.question) {
            (None, None) => (
                "UPDATE tasks SET checkpoint = ?3, progress = ?4, message = ?5, step = ?6, \
                 updated_at = ?7 \
                 WHERE id = ?1 AND lease = ?2 AND status = 'running'",
                None,
            ),
            (Some(result), _) => (
                "UPDATE tasks SET checkpoint = ?3, progress = ?4, message = ?5, step = ?6, \
                 updated_at = ?7, completed_at = ?7, status = 'completed', result = ?8 \
                 WHERE id = ?1 AND lease = ?2 AND status = 'running'",
                Some(result.to_string()),
            ),
            (None, Some(question)) => (
                "UPDATE tasks SET checkpoint = ?3, progress = ?4, message = ?5, step = ?6, \
                 updated_at = ?7, status = 'input_required', question = ?8, \
                 lease_expires_at = NULL \
                 WHERE id = ?1 AND lease = ?2 AND status = 'running'",
                Some(serde_json::to_string(question)?),
            ),
        };
        // The last step finishes the task (a question leaves it unfinished), and only it
        // changes the owner's count.
        let finishing_owner = commit.result.is_some().then(|| commit.task.owner.clone());
        let (id, lease, checkpoint, progress, message, step) = (
            commit.id().to_owned(),
            commit.lease,
            // Only the row needs it: the answer is made without.
            std::mem::take(&mut commit.checkpoint),
            commit.progress,
            commit.message.clone(),
            commit.step,
        );
        // The row is not read back: under the lease the commit's own view of the task is the
        // row (see `StepCommit::task`), and reading it cost the writer a query and the caller a
        // parse of the task's JSON at every step.
        let owners = self.owners.clone();
        let written_at = self.write_statement(move |conn| {
            let now = now_ms();
            let values: [&dyn ToSql; 8] = [
                &id,
                &lease,
                &checkpoint,
                &progress,
                &message,
                &step,
                &now,
                &last,
            ];
            // Only the last step's and a question's statement take `?8`.
            let bound = match last {
                Some(_) => &values[..],
                None => &values[..7],
            };
            let changed = conn.prepare_cached(sql)?.execute(bound)?;
            if let Some(owner) = finishing_owner.filter(|_| changed > 0) {
                owners.change(&owner, -1);
            }
            Ok((changed > 0).then_some(now))
        });
        Ok(written_at.await?.map(|now| commit.applied(time(now))))
    }

    async fn task_row(&self, id: &str) -> Result<Option<TaskRow>, StoreError> {
        let id = id.to_owned();
        self.read(move |conn| {
            Ok(select_stored_row(conn, &id)?
                .map(StoredRow::parse)
                .transpose()?)
        })
        .await
    }

    async fn answer_question(
        &self,
        id: &str,
        question_id: &str,
        checkpoint: Value,
    ) -> Result<Transition, StoreError> {
        let (id, question_id) = (id.to_owned(), question_id.to_owned());
        self.write(move |conn| {
            let applied = conn
                .prepare_cached(concat!(
                    "UPDATE tasks SET status = 'pending', checkpoint = ?3, question = NULL, \
                     updated_at = ?4 \
                     WHERE id = ?1 AND status = 'input_required' \
                       AND json_extract(question, '$.id') = ?2 RETURNING ",
                    info_columns!()
                ))?
                .query_row(
                    params![id, question_id, checkpoint.to_string(), now_ms()],
                    read_info,
                )
                .optional()?;
            outcome(conn, &id, applied)
        })
        .await
    }

    /// Marks the task `failed` if `lease` is still its worker's.
    async fn fail_task(
        &self,
        id: &str,
        lease: i64,
        error: String,
    ) -> Result<Option<TaskInfo>, StoreError> {
        let (id, owners) = (id.to_owned(), self.owners.clone());
        self.write(move |conn| {
            let mut stmt = conn.prepare_cached(concat!(
                "UPDATE tasks SET status = 'failed', error = ?3, completed_at = ?4, updated_at = ?4 \
                 WHERE id = ?1 AND lease = ?2 AND status = 'running' RETURNING ",
                info_columns!()
            ))?;
            let failed = stmt
                .query_row(params![id, lease, error, now_ms()], read_info)
                .optional()?;
            if let Some(task) = &failed {
                owners.change(&task.owner, -1);
            }
            Ok(failed)
        })
        .await
    }

    /// Moves the task to `to` if its status is one of `from`.
    async fn transition(
        &self,
        id: &str,
        from: &'static [TaskStatus],
        to: TaskStatus,
    ) -> Result<Transition, StoreError> {
        let (id, owners) = (id.to_owned(), self.owners.clone());
        self.write(move |conn| {
            let now = now_ms();
            let completed_at = to.is_terminal().then_some(now);
            let sql = format!(
                "UPDATE tasks SET status = ?2, updated_at = ?3, question = NULL, \
                 completed_at = COALESCE(?4, completed_at) \
                 WHERE id = ?1 AND status IN ({}) RETURNING {}",
                in_list(from),
                info_columns!()
            );
            // What it leaves, for the owner's count: steering never leaves a terminal status,
            // but the count follows whatever `from` allows.
            let left: Option<String> = conn
                .prepare_cached("SELECT status FROM tasks WHERE id = ?1")?
                .query_row([&id], |row| row.get(0))
                .optional()?;
            let applied = conn
                .prepare_cached(&sql)?
                .query_row(params![id, to.as_str(), now, completed_at], read_info)
                .optional()?;
            if let (Some(task), Some(left)) = (&applied, left) {
                // The table's check admits only statuses that parse.
                let left_unfinished = TaskStatus::from_str(&left).is_ok_and(|s| !s.is_terminal());
                let delta = i64::from(!to.is_terminal()) - i64::from(left_unfinished);
                if delta != 0 {
                    owners.change(&task.owner, delta);
                }
            }
            outcome(conn, &id, applied)
        })
        .await
    }

    async fn get_task(&self, id: &str) -> Result<Option<TaskInfo>, StoreError> {
        let id = id.to_owned();
        self.read(move |conn| select_info(conn, &id)).await
    }

    async fn unfinished_tasks_of(&self, owner: &str) -> Result<u64, StoreError> {
        Ok(self.owners.committed(owner))
    }

    /// Tasks, newest first, optionally only one owner's and only one status.
    async fn list_tasks(
        &self,
        owner: Option<String>,
        status: Option<TaskStatus>,
        after: Option<(i64, String)>,
        limit: usize,
    ) -> Result<Vec<TaskInfo>, StoreError> {
        self.read(move |conn| {
            let mut stmt = conn.prepare_cached(concat!(
                "SELECT ",
                info_columns!(),
                " FROM tasks WHERE (?1 IS NULL OR owner = ?1) AND (?2 IS NULL OR status = ?2) \
                 AND (?3 IS NULL OR created_at < ?3 OR (created_at = ?3 AND id > ?4)) \
                 ORDER BY created_at DESC, id LIMIT ?5"
            ))?;
            let (after_ms, after_id) = after.unzip();
            let rows = stmt.query_map(
                params![
                    owner,
                    status.map(TaskStatus::as_str),
                    after_ms,
                    after_id,
                    limit as i64
                ],
                read_info,
            )?;
            Ok(rows.collect::<Result<_, _>>()?)
        })
        .await
    }

    /// Id and kind of the tasks a worker should be advancing: `pending` and `running`, oldest
    /// first.
    async fn status_counts(&self) -> Result<BTreeMap<TaskStatus, u64>, StoreError> {
        self.read(|conn| {
            let mut counts: BTreeMap<TaskStatus, u64> =
                TaskStatus::ALL.into_iter().map(|s| (s, 0)).collect();
            let mut stmt =
                conn.prepare_cached("SELECT status, COUNT(*) FROM tasks GROUP BY status")?;
            let mut rows = stmt.query([])?;
            while let Some(row) = rows.next()? {
                let status: String = row.get(0)?;
                let status = TaskStatus::from_str(&status)
                    .map_err(|e| StoreError::Corrupt(e.to_string()))?;
                counts.insert(status, row.get(1)?);
            }
            Ok(counts)
        })
        .await
    }

    async fn checkpoint_stats(&self) -> Result<CheckpointStats, StoreError> {
        let counts = self.status_counts().await?;
        self.read(move |conn| {
            let (steps, bytes, oldest, newest): (i64, i64, Option<i64>, Option<i64>) = conn
                .query_row(
                    "SELECT COALESCE(SUM(step), 0), COALESCE(SUM(LENGTH(checkpoint)), 0), \
                     MIN(updated_at), MAX(updated_at) FROM tasks",
                    [],
                    |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?, row.get(3)?)),
                )?;
            Ok(CheckpointStats {
                total_checkpoints: counts.values().sum(),
                checkpoint_stats: counts,
                total_steps_committed: steps as u64,
                checkpoint_bytes: bytes as u64,
                oldest_checkpoint_at: oldest.map(time),
                newest_checkpoint_at: newest.map(time),
            })
        })
        .await
    }

    /// Deletes terminal tasks that finished before `cutoff`; returns how many.
    async fn purge_finished_before(&self, cutoff: DateTime<Utc>) -> Result<u64, StoreError> {
        let (deleted, _) = self
            .delete_in_batches(
                "DELETE FROM tasks WHERE id IN (SELECT id FROM tasks WHERE completed_at < ?1 \
                 AND (status = 'completed' OR status = 'failed' OR status = 'cancelled') \
                 LIMIT ?2)",
                cutoff.timestamp_millis(),
            )
            .await?;
        Ok(deleted)
    }

    /// A random secret created with the database, for deriving ids that must be stable for the
    /// same inputs yet unguessable to anyone without the database.
    async fn server_secret(&self) -> Result<[u8; 32], StoreError> {
        self.write(|conn| {
            let existing: Option<String> = conn
                .query_row("SELECT value FROM meta WHERE key = 'secret'", [], |row| {
                    row.get(0)
                })
                .optional()?;
            let hex = match existing {
                Some(hex) => hex,
                None => {
                    let hex = hex::encode(rand::random::<[u8; 32]>());
                    conn.execute(
                        "INSERT INTO meta (key, value) VALUES ('secret', ?1)",
                        [&hex],
                    )?;
                    hex
                }
            };
            let mut secret = [0u8; 32];
            hex::decode_to_slice(&hex, &mut secret)
                .map_err(|e| StoreError::Corrupt(format!("meta.secret: {e}")))?;
            Ok(secret)
        })
        .await
    }
}

/// Claims task `id` for `node` (see [`TaskRepo::claim_task`]): the row as it leaves it.
fn claim(
    conn: &Connection,
    id: &str,
    node: String,
    ttl_ms: i64,
) -> Result<Option<StoredRow>, StoreError> {
    let Some(mut row) = select_stored_row(conn, id)? else {
        return Ok(None);
    };
    let now = now_ms();
    let changed = conn
        .prepare_cached(
            "UPDATE tasks SET status = 'running', lease = lease + 1, node = ?2, \
             lease_expires_at = ?3 + ?4, updated_at = ?3 \
             WHERE id = ?1 AND (status = 'pending' OR (status = 'running' AND \
               (node IS ?2 OR lease_expires_at IS NULL OR lease_expires_at < ?3)))",
        )?
        .execute(params![id, node, now, ttl_ms])?;
    if changed == 0 {
        return Ok(None);
    }
    row.lease += 1;
    let info = &mut row.info;
    (info.status, info.node, info.updated_at) = (TaskStatus::Running.to_string(), Some(node), now);
    Ok(Some(row))
}

/// Inserts `task` as pending (or claimed), or refuses it (see [`TaskRepo::insert_task`]), and
/// returns it as stored. The one writer thread serialises inserts, so the checks and the
/// insert are atomic.
fn insert(conn: &Connection, owners: &OwnerLoad, task: NewTask) -> Result<TaskInfo, StoreError> {
    if let Some(key) = &task.exclusive {
        let holder: Option<String> = conn
            .prepare_cached(
                "SELECT id FROM tasks WHERE exclusive = ?1 AND exclusive IS NOT NULL \
                 AND (status = 'pending' OR status = 'running' OR status = 'paused' \
                 OR status = 'input_required')",
            )?
            .query_row([key], |row| row.get(0))
            .optional()?;
        if let Some(task_id) = holder {
            return Err(Refusal::Held {
                key: key.clone(),
                task_id,
            }
            .into());
        }
    }
    if task.owner_limit < u64::MAX && owners.unfinished(&task.owner) >= task.owner_limit {
        return Err(Refusal::OwnerLimit {
            limit: task.owner_limit,
        }
        .into());
    }
    let now = now_ms();
    let initial = task.initial_lease();
    conn.prepare_cached(
        "INSERT INTO tasks (id, kind, owner, params, status, total, checkpoint, message, \
         created_at, updated_at, exclusive, node, lease, lease_expires_at) \
         VALUES (?1, ?2, ?3, ?4, ?9, ?5, ?6, ?13, ?7, ?7, ?8, ?10, ?11, ?12)",
    )?
    .execute(params![
        task.id,
        task.kind,
        task.owner,
        task.params.to_string(),
        task.total,
        task.checkpoint.to_string(),
        now,
        task.exclusive,
        initial.status.as_str(),
        initial.node,
        initial.lease,
        initial.ttl_ms.map(|ttl| now + ttl),
        QUEUED,
    ])?;
    // A new task is pending or running: unfinished.
    owners.change(&task.owner, 1);
    // The row just written, as `read_info` would read it back: reading it costs the writer a
    // query and a parse of the parameters for nothing it does not know.
    let (status, node) = (initial.status, initial.node.map(str::to_owned));
    Ok(TaskInfo {
        task_id: task.id,
        status,
        progress: 0,
        total: task.total,
        message: QUEUED.to_owned(),
        result_data: None,
        error: None,
        created_at: time(now),
        updated_at: time(now),
        completed_at: None,
        kind: task.kind,
        parameters: task.params,
        owner: task.owner,
        step: 0,
        percent: TaskInfo::percent_of(0, task.total),
        node,
        question: None,
    })
}

/// The message of a task no worker has advanced yet.
const QUEUED: &str = "queued";

#[cfg(test)]
mod tests {
    use chrono::TimeZone;

    use super::*;
    use crate::store::sqlite::owners::sample;
    use crate::store::tests::new_task;

    async fn store() -> (tempfile::TempDir, Sqlite) {
        let dir = tempfile::tempdir().unwrap();
        let store = Sqlite::open(
            &dir.path().join("t.db"),
            crate::store::sqlite::WriteQueue::default(),
        )
        .unwrap();
        (dir, store)
    }

    /// A write alone in its transaction runs without a savepoint: when it fails, the writer
    /// rolls the transaction back, so nothing of it stays, and the next write starts afresh.
    #[tokio::test]
    async fn a_failing_write_alone_is_rolled_back() {
        let (_dir, store) = store().await;
        let owners = store.owners.clone();
        let failed = store
            .write(move |conn| {
                insert(conn, &owners, new_task("bad"))?;
                conn.execute("UPDATE tasks SET status = 'bogus' WHERE id = 'bad'", [])?;
                Ok(())
            })
            .await;
        assert!(matches!(failed, Err(StoreError::Sqlite(_))), "{failed:?}");
        assert!(store.get_task("bad").await.unwrap().is_none());
        store.insert_task(new_task("good")).await.unwrap();
        assert_eq!(
            store.list_tasks(None, None, None, 10).await.unwrap().len(),
            1
        );
        assert_eq!(store.unfinished_tasks_of("o").await.unwrap(), 1);
    }

    /// The owners' counts, which live in memory, are taken from the tasks again when the
    /// database is opened: what each owner has unfinished, whatever the status.
    #[tokio::test]
    async fn owner_counts_are_taken_from_the_tasks_at_open() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.db");
        let open = || Sqlite::open(&path, crate::store::sqlite::WriteQueue::default()).unwrap();
        let store = open();
        let stored = async {
            for (id, owner, status) in sample::TASKS {
                let mut task = new_task(id);
                task.owner = owner.to_owned();
                store.insert_task(task).await.unwrap();
                let (id, status) = (id.to_owned(), status.to_owned());
                store
                    .write(move |conn| {
                        conn.execute("UPDATE tasks SET status = ?2 WHERE id = ?1", [id, status])?;
                        Ok(())
                    })
                    .await
                    .unwrap();
            }
        };
        tokio::time::timeout(std::time::Duration::from_secs(10), stored)
            .await
            .expect("the tasks are stored in time");
        drop(store);
        let store = open();
        for (owner, unfinished) in sample::UNFINISHED {
            assert_eq!(
                store.unfinished_tasks_of(owner).await.unwrap(),
                unfinished,
                "{owner}"
            );
        }
    }

    /// The first reference server computed its clean-up date by subtracting days from the day
    /// of the month, which breaks at the start of every month.
    #[tokio::test]
    async fn retention_purges_across_a_month_boundary() {
        let (_dir, store) = store().await;
        let at = |y, m, d, h| Utc.with_ymd_and_hms(y, m, d, h, 0, 0).unwrap();
        for (id, completed) in [
            ("old", at(2026, 2, 27, 23)),
            ("recent", at(2026, 2, 28, 12)),
        ] {
            store.insert_task(new_task(id)).await.unwrap();
            let id = id.to_owned();
            store
                .write(move |conn| {
                    conn.execute(
                        "UPDATE tasks SET status = 'completed', completed_at = ?2 WHERE id = ?1",
                        params![id, completed.timestamp_millis()],
                    )?;
                    Ok(())
                })
                .await
                .unwrap();
        }
        store.insert_task(new_task("unfinished")).await.unwrap();

        // A day before 2026-03-01 00:00 (see the engine's retention_cutoff test).
        let cutoff = at(2026, 2, 28, 0);
        assert_eq!(store.purge_finished_before(cutoff).await.unwrap(), 1);
        let left: Vec<String> = store
            .list_tasks(None, None, None, 10)
            .await
            .unwrap()
            .into_iter()
            .map(|t| t.task_id)
            .collect();
        assert_eq!(left.len(), 2);
        assert!(!left.contains(&"old".to_owned()));
    }
}
