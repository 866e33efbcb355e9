//! [`TaskRepo`] on PostgreSQL: the `tasks` table, one row per task holding its status,
//! progress and checkpoint.
//!
//! Every change is one conditional `UPDATE ... RETURNING`, as on SQLite, so the lifecycle's
//! rules hold whichever node sends it: a terminal status is never left, a paused task is never
//! advanced, and a step is committed only under the task's current lease.

use std::collections::BTreeMap;
use std::str::FromStr;

use async_trait::async_trait;
use chrono::{DateTime, TimeZone, Utc};
use durable_shared::{CheckpointStats, TaskInfo, TaskStatus};
use serde_json::Value;
use tokio_postgres::Row;

use super::{Postgres, signed, unsigned};
use crate::store::{
    Claimant, NewTask, Refusal, StepCommit, StoreError, TaskRepo, TaskRow, Transition,
};

/// The columns of a [`TaskInfo`], in the order [`read_info`] reads them.
macro_rules! info_columns {
    () => {
        "tasks.id, kind, owner, params, status, progress, total, message, step, result, error, \
         created_at, updated_at, completed_at, node, question"
    };
}
pub(super) use info_columns;

/// How many columns [`info_columns!`] lists: the position of the first column after them.
pub(super) const INFO_COUNT: usize = 16;

fn time(ms: i64) -> DateTime<Utc> {
    Utc.timestamp_millis_opt(ms).single().unwrap_or_default()
}

fn json(text: &str) -> Result<Value, StoreError> {
    Ok(serde_json::from_str(text)?)
}

/// Reads the [`info_columns!`] at the start of `row`.
pub(super) fn read_info(row: &Row) -> Result<TaskInfo, StoreError> {
    let status: &str = row.try_get(4)?;
    let status = TaskStatus::from_str(status).map_err(|e| StoreError::Corrupt(e.to_string()))?;
    let progress = unsigned(row, 5)?;
    let total = unsigned(row, 6)?;
    let result: Option<&str> = row.try_get(9)?;
    Ok(TaskInfo {
        task_id: row.try_get(0)?,
        status,
        progress,
        total,
        message: row.try_get(7)?,
        result_data: result.map(json).transpose()?,
        error: row.try_get(10)?,
        created_at: time(row.try_get(11)?),
        updated_at: time(row.try_get(12)?),
        completed_at: row.try_get::<_, Option<i64>>(13)?.map(time),
        kind: row.try_get(1)?,
        parameters: json(row.try_get(3)?)?,
        owner: row.try_get(2)?,
        step: unsigned(row, 8)?,
        percent: TaskInfo::percent_of(progress, total),
        node: row.try_get(14)?,
        question: row
            .try_get::<_, Option<&str>>(15)?
            .map(serde_json::from_str)
            .transpose()?,
    })
}

/// Reads a row of [`info_columns!`] followed by `checkpoint, lease`.
fn read_row(row: &Row) -> Result<TaskRow, StoreError> {
    Ok(TaskRow {
        info: read_info(row)?,
        checkpoint: json(row.try_get(INFO_COUNT)?)?,
        lease: row.try_get(INFO_COUNT + 1)?,
    })
}

/// `$sql`, a statement returning a task's row, made to announce the change to the other nodes
/// (see `wakeups.rs`): the notification carries the task's id and this node's id (the
/// connection's `application_name`), and is delivered when the statement commits.
macro_rules! notifying {
    ($($sql:expr),+ $(,)?) => {
        concat!(
            "WITH t AS (", $($sql),+, ") SELECT t.*, pg_notify('",
            super::wakeups::TASK_CHANNEL!(),
            "', t.id || ' ' || current_setting('application_name')) FROM t"
        )
    };
}

const SELECT_INFO: &str = concat!("SELECT ", info_columns!(), " FROM tasks WHERE id = $1");

macro_rules! insert {
    () => {
        "INSERT INTO tasks (id, kind, owner, params, status, total, checkpoint, message, \
         created_at, updated_at, exclusive, node, lease, lease_expires_at) \
         SELECT $1, $2, $3, $4, $9, $5, $6, 'queued', durable_now_ms(), durable_now_ms(), \
           $7, $10, $11, durable_now_ms() + $12 \
         WHERE (SELECT count(*) FROM tasks WHERE owner = $3 \
           AND status IN ('pending', 'running', 'paused', 'input_required')) < $8"
    };
}

/// Inserts a task (no row: its owner has too many unfinished ones); an id that is taken, or
/// an exclusive resource another unfinished task holds, is an error.
const INSERT: &str = notifying!(insert!(), " RETURNING ", info_columns!());

/// Inserts a task unless its id is taken or its owner has too many unfinished ones; returns
/// no row then.
const INSERT_OR_SKIP: &str = notifying!(
    insert!(),
    " ON CONFLICT (id) DO NOTHING RETURNING ",
    info_columns!()
);

fn names(statuses: &[TaskStatus]) -> Vec<&'static str> {
    statuses.iter().map(|s| s.as_str()).collect()
}

impl Postgres {
    /// Runs `sql`, one of the inserts, for `task`; a held exclusive resource is refused with
    /// the task that holds it.
    async fn insert(&self, sql: &str, task: &NewTask) -> Result<Option<TaskInfo>, StoreError> {
        // An unclaimed task's lease expiry stays NULL (NULL plus anything).
        let initial = task.initial_lease();
        let inserted = self
            .query_opt(
                sql,
                &[
                    &task.id,
                    &task.kind,
                    &task.owner,
                    &task.params.to_string(),
                    &signed(task.total)?,
                    &task.checkpoint.to_string(),
                    &task.exclusive,
                    &signed(task.owner_limit.min(i64::MAX as u64))?,
                    &initial.status.as_str(),
                    &initial.node,
                    &initial.lease,
                    &initial.ttl_ms,
                ],
                read_info,
            )
            .await;
        let held = |e: &StoreError| match e {
            StoreError::Postgres(e) => e
                .as_db_error()
                .is_some_and(|db| db.constraint() == Some("tasks_exclusive")),
            _ => false,
        };
        match (inserted, &task.exclusive) {
            (Err(e), Some(key)) if held(&e) => {
                let holder = self
                    .query_opt(
                        "SELECT id FROM tasks WHERE exclusive = $1 \
                         AND status IN ('pending', 'running', 'paused', 'input_required')",
                        &[key],
                        |row| Ok(row.try_get::<_, String>(0)?),
                    )
                    .await?;
                Err(Refusal::Held {
                    key: key.clone(),
                    // Finished in between: the caller may simply try again.
                    task_id: holder.unwrap_or_else(|| "(just finished)".into()),
                }
                .into())
            }
            (inserted, _) => inserted,
        }
    }
}

impl Postgres {
    /// What a conditional update of task `id` did: applied (`applied` is the row it returned),
    /// or refused, with how the task stands, or the task does not exist.
    async fn outcome(&self, id: &str, applied: Option<TaskInfo>) -> Result<Transition, StoreError> {
        Ok(match applied {
            Some(info) => Transition::Applied(info),
            None => match self.get_task(id).await? {
                Some(info) => Transition::Refused(info),
                None => Transition::NotFound,
            },
        })
    }
}

#[async_trait]
impl TaskRepo for Postgres {
    async fn insert_task(&self, task: NewTask) -> Result<TaskInfo, StoreError> {
        self.insert(INSERT, &task).await?.ok_or_else(|| {
            Refusal::OwnerLimit {
                limit: task.owner_limit,
            }
            .into()
        })
    }

    async fn insert_or_get_task(&self, task: NewTask) -> Result<(TaskInfo, bool), StoreError> {
        if let Some(info) = self.insert(INSERT_OR_SKIP, &task).await? {
            return Ok((info, true));
        }
        let info = self.get_task(&task.id).await?.ok_or(Refusal::OwnerLimit {
            limit: task.owner_limit,
        })?;
        Ok((info, false))
    }

    async fn claim_task(
        &self,
        id: &str,
        claimant: &Claimant,
    ) -> Result<Option<TaskRow>, StoreError> {
        // SKIP LOCKED: a row another node is claiming or committing right now is not waited
        // for; that node holds it.
        self.query_opt(
            notifying!(
                "UPDATE tasks SET status = 'running', lease = lease + 1, node = $2, \
                 lease_expires_at = durable_now_ms() + $3, updated_at = durable_now_ms() \
                 WHERE id = (SELECT id FROM tasks WHERE id = $1 AND (status = 'pending' OR \
                   (status = 'running' AND (node = $2 OR lease_expires_at IS NULL \
                     OR lease_expires_at < durable_now_ms()))) \
                   FOR UPDATE SKIP LOCKED) \
                 RETURNING ",
                info_columns!(),
                ", checkpoint, lease"
            ),
            &[&id, &claimant.node, &claimant.ttl_ms()],
            read_row,
        )
        .await
    }

    async fn claimable_tasks(
        &self,
        claimant: &Claimant,
        own: bool,
        limit: usize,
    ) -> Result<Vec<(String, String)>, StoreError> {
        self.query(
            "SELECT id, kind FROM tasks WHERE status = 'pending' OR (status = 'running' \
             AND (lease_expires_at IS NULL OR lease_expires_at < durable_now_ms() \
               OR ($2 AND node = $1))) \
             ORDER BY created_at LIMIT $3",
            &[&claimant.node, &own, &signed(limit as u64)?],
            |row| Ok((row.try_get(0)?, row.try_get(1)?)),
        )
        .await
    }

    async fn renew_leases(
        &self,
        claimant: &Claimant,
        held: Vec<(String, i64)>,
    ) -> Result<Vec<String>, StoreError> {
        let (ids, leases): (Vec<String>, Vec<i64>) = held.into_iter().unzip();
        self.query(
            "UPDATE tasks SET lease_expires_at = durable_now_ms() + $4 \
             FROM unnest($1::TEXT[], $2::BIGINT[]) AS held (id, lease) \
             WHERE tasks.id = held.id AND tasks.lease = held.lease AND tasks.node = $3 \
               AND tasks.status = 'running' \
             RETURNING tasks.id",
            &[&ids, &leases, &claimant.node, &claimant.ttl_ms()],
            |row| Ok(row.try_get(0)?),
        )
        .await
    }

    async fn release_leases(&self, node: &str) -> Result<u64, StoreError> {
        self.execute(
            "UPDATE tasks SET lease_expires_at = 0 WHERE node = $1 AND status = 'running'",
            &[&node],
        )
        .await
    }

    async fn release_stale_leases(&self) -> Result<u64, StoreError> {
        // Other nodes may be alive: their leases lapse by themselves if they are not.
        Ok(0)
    }

    async fn commit_step(&self, commit: StepCommit) -> Result<Option<TaskInfo>, StoreError> {
        // The row comes back by `RETURNING`, not from `commit.task`: its times are the
        // database's clock, the one the fleet shares.
        let checkpoint = &commit.checkpoint;
        let (progress, step) = (signed(commit.progress)?, signed(commit.step)?);
        match (&commit.result, &commit.question) {
            // Intermediate steps leave status and completion alone, so the indexes on them are
            // not rewritten on every step.
            (None, None) => {
                self.query_opt(
                    notifying!(
                        "UPDATE tasks SET checkpoint = $3, progress = $4, message = $5, \
                         step = $6, updated_at = durable_now_ms() \
                         WHERE id = $1 AND lease = $2 AND status = 'running' RETURNING ",
                        info_columns!()
                    ),
                    &[
                        &commit.task.task_id,
                        &commit.lease,
                        &checkpoint,
                        &progress,
                        &commit.message,
                        &step,
                    ],
                    read_info,
                )
                .await
            }
            (Some(result), _) => {
                self.query_opt(
                    notifying!(
                        "UPDATE tasks SET checkpoint = $3, progress = $4, message = $5, \
                         step = $6, updated_at = durable_now_ms(), \
                         completed_at = durable_now_ms(), status = 'completed', result = $7 \
                         WHERE id = $1 AND lease = $2 AND status = 'running' RETURNING ",
                        info_columns!()
                    ),
                    &[
                        &commit.task.task_id,
                        &commit.lease,
                        &checkpoint,
                        &progress,
                        &commit.message,
                        &step,
                        &result.to_string(),
                    ],
                    read_info,
                )
                .await
            }
            (None, Some(question)) => {
                self.query_opt(
                    notifying!(
                        "UPDATE tasks SET checkpoint = $3, progress = $4, message = $5, \
                         step = $6, updated_at = durable_now_ms(), status = 'input_required', \
                         question = $7, lease_expires_at = NULL \
                         WHERE id = $1 AND lease = $2 AND status = 'running' RETURNING ",
                        info_columns!()
                    ),
                    &[
                        &commit.task.task_id,
                        &commit.lease,
                        &checkpoint,
                        &progress,
                        &commit.message,
                        &step,
                        &serde_json::to_string(question)?,
                    ],
                    read_info,
                )
                .await
            }
        }
    }

    async fn task_row(&self, id: &str) -> Result<Option<TaskRow>, StoreError> {
        self.query_opt(
            concat!(
                "SELECT ",
                info_columns!(),
                ", checkpoint, lease FROM tasks WHERE id = $1"
            ),
            &[&id],
            read_row,
        )
        .await
    }

    async fn answer_question(
        &self,
        id: &str,
        question_id: &str,
        checkpoint: Value,
    ) -> Result<Transition, StoreError> {
        let applied = self
            .query_opt(
                notifying!(
                    "UPDATE tasks SET status = 'pending', checkpoint = $3, question = NULL, \
                     updated_at = durable_now_ms() \
                     WHERE id = $1 AND status = 'input_required' \
                       AND question::jsonb ->> 'id' = $2 RETURNING ",
                    info_columns!()
                ),
                &[&id, &question_id, &checkpoint.to_string()],
                read_info,
            )
            .await?;
        self.outcome(id, applied).await
    }

    async fn fail_task(
        &self,
        id: &str,
        lease: i64,
        error: String,
    ) -> Result<Option<TaskInfo>, StoreError> {
        self.query_opt(
            notifying!(
                "UPDATE tasks SET status = 'failed', error = $3, \
                 completed_at = durable_now_ms(), updated_at = durable_now_ms() \
                 WHERE id = $1 AND lease = $2 AND status = 'running' RETURNING ",
                info_columns!()
            ),
            &[&id, &lease, &error],
            read_info,
        )
        .await
    }

    async fn transition(
        &self,
        id: &str,
        from: &'static [TaskStatus],
        to: TaskStatus,
    ) -> Result<Transition, StoreError> {
        let applied = self
            .query_opt(
                notifying!(
                    "UPDATE tasks SET status = $2, updated_at = durable_now_ms(), question = NULL, \
                     completed_at = CASE WHEN $3 THEN durable_now_ms() ELSE completed_at END \
                     WHERE id = $1 AND status = ANY($4) RETURNING ",
                    info_columns!()
                ),
                &[&id, &to.as_str(), &to.is_terminal(), &names(from)],
                read_info,
            )
            .await?;
        self.outcome(id, applied).await
    }

    async fn get_task(&self, id: &str) -> Result<Option<TaskInfo>, StoreError> {
        self.query_opt(SELECT_INFO, &[&id], read_info).await
    }

    async fn list_tasks(
        &self,
        owner: Option<String>,
        status: Option<TaskStatus>,
        after: Option<(i64, String)>,
        limit: usize,
    ) -> Result<Vec<TaskInfo>, StoreError> {
        let (after_ms, after_id) = after.unzip();
        self.query(
            concat!(
                "SELECT ",
                info_columns!(),
                " FROM tasks WHERE ($1::TEXT IS NULL OR owner = $1) \
                 AND ($2::TEXT IS NULL OR status = $2) \
                 AND ($3::BIGINT IS NULL OR created_at < $3 OR (created_at = $3 AND id > $4)) \
                 ORDER BY created_at DESC, id LIMIT $5"
            ),
            &[
                &owner,
                &status.map(TaskStatus::as_str),
                &after_ms,
                &after_id,
                &signed(limit as u64)?,
            ],
            read_info,
        )
        .await
    }

    async fn unfinished_tasks_of(&self, owner: &str) -> Result<u64, StoreError> {
        let count = self
            .query_opt(
                "SELECT count(*) FROM tasks WHERE owner = $1 \
                 AND status IN ('pending', 'running', 'paused', 'input_required')",
                &[&owner],
                |row| unsigned(row, 0),
            )
            .await?;
        Ok(count.unwrap_or(0))
    }

    async fn status_counts(&self) -> Result<BTreeMap<TaskStatus, u64>, StoreError> {
        let rows = self
            .query(
                "SELECT status, COUNT(*) FROM tasks GROUP BY status",
                &[],
                |row| {
                    let status: &str = row.try_get(0)?;
                    let status = TaskStatus::from_str(status)
                        .map_err(|e| StoreError::Corrupt(e.to_string()))?;
                    Ok((status, unsigned(row, 1)?))
                },
            )
            .await?;
        let mut counts: BTreeMap<TaskStatus, u64> =
            TaskStatus::ALL.into_iter().map(|s| (s, 0)).collect();
        counts.extend(rows);
        Ok(counts)
    }

    async fn checkpoint_stats(&self) -> Result<CheckpointStats, StoreError> {
        let counts = self.status_counts().await?;
        let (steps, bytes, oldest, newest) = self
            .query_opt(
                "SELECT COALESCE(SUM(step), 0)::BIGINT, \
                 COALESCE(SUM(octet_length(checkpoint)), 0)::BIGINT, \
                 MIN(updated_at), MAX(updated_at) FROM tasks",
                &[],
                |row| {
                    Ok((
                        unsigned(row, 0)?,
                        unsigned(row, 1)?,
                        row.try_get::<_, Option<i64>>(2)?,
                        row.try_get::<_, Option<i64>>(3)?,
                    ))
                },
            )
            .await?
            .unwrap_or_default();
        Ok(CheckpointStats {
            total_checkpoints: counts.values().sum(),
            checkpoint_stats: counts,
            total_steps_committed: steps,
            checkpoint_bytes: bytes,
            oldest_checkpoint_at: oldest.map(time),
            newest_checkpoint_at: newest.map(time),
        })
    }

    async fn purge_finished_before(&self, cutoff: DateTime<Utc>) -> Result<u64, StoreError> {
        let (deleted, _) = self
            .delete_in_batches(
                "DELETE FROM tasks WHERE id IN (SELECT id FROM tasks WHERE completed_at < $1 \
                 AND status IN ('completed', 'failed', 'cancelled') LIMIT $2)",
                cutoff.timestamp_millis(),
            )
            .await?;
        Ok(deleted)
    }

    async fn server_secret(&self) -> Result<[u8; 32], StoreError> {
        let candidate = hex::encode(rand::random::<[u8; 32]>());
        // Whichever node inserts first wins; every node then reads that one.
        self.execute(
            "INSERT INTO meta (key, value) VALUES ('secret', $1) ON CONFLICT (key) DO NOTHING",
            &[&candidate],
        )
        .await?;
        let hex: String = self
            .query_opt("SELECT value FROM meta WHERE key = 'secret'", &[], |row| {
                Ok(row.try_get(0)?)
            })
            .await?
            .ok_or_else(|| StoreError::Corrupt("meta.secret vanished".into()))?;
        let mut secret = [0u8; 32];
        hex::decode_to_slice(&hex, &mut secret)
            .map_err(|e| StoreError::Corrupt(format!("meta.secret: {e}")))?;
        Ok(secret)
    }
}
