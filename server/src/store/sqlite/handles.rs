//! [`HandleRepo`] on SQLite: the `mcp_tasks` table, joined with `tasks` for what a handle shows.

use async_trait::async_trait;
use rusqlite::{OptionalExtension, Row, params};

use super::Sqlite;
use super::tasks::{INFO_COUNT, info_columns, read_info};
use crate::store::{HandleRepo, StoreError, TaskHandle, now_ms};

/// Reads a row of `live_handles!`.
fn read_handle(row: &Row<'_>) -> rusqlite::Result<TaskHandle> {
    Ok(TaskHandle {
        task: read_info(row)?,
        requester: row.get(INFO_COUNT)?,
        tool: row.get(INFO_COUNT + 1)?,
        ttl_ms: row.get(INFO_COUNT + 2)?,
    })
}

/// The handles joined with their tasks, as [`read_handle`] reads them; `:now` must be bound to
/// the current time in ms. A macro, so that the statements built on it are constant strings.
macro_rules! live_handles {
    () => {
        concat!(
            "SELECT ",
            info_columns!(),
            ", requester, tool, ttl_ms \
             FROM tasks JOIN mcp_tasks ON mcp_tasks.task_id = tasks.id \
             WHERE tasks.created_at + mcp_tasks.ttl_ms > :now"
        )
    };
}

fn select_handle(
    conn: &rusqlite::Connection,
    task_id: &str,
    requester: &str,
    now: i64,
) -> Result<Option<TaskHandle>, StoreError> {
    let mut stmt = conn.prepare_cached(concat!(
        live_handles!(),
        " AND tasks.id = :id AND requester = :requester"
    ))?;
    Ok(stmt
        .query_row(
            rusqlite::named_params! {":now": now, ":id": task_id, ":requester": requester},
            read_handle,
        )
        .optional()?)
}

#[async_trait]
impl HandleRepo for Sqlite {
    /// Makes `task_id` an MCP task handle of `requester`'s, created by `tool`, kept `ttl_ms` from the
    /// task's creation. A handle that exists (a repeated call attached to the same task) is
    /// kept, its ttl extended so that it lasts at least `ttl_ms` from now.
    async fn upsert_handle(
        &self,
        task_id: &str,
        requester: &str,
        tool: &str,
        ttl_ms: u64,
    ) -> Result<Option<TaskHandle>, StoreError> {
        let (task_id, requester, tool) =
            (task_id.to_owned(), requester.to_owned(), tool.to_owned());
        self.write(move |conn| {
            let now = now_ms();
            conn.prepare_cached(
                "INSERT INTO mcp_tasks (task_id, requester, tool, ttl_ms) VALUES (?1, ?2, ?3, ?4) \
                 ON CONFLICT (task_id, requester) DO UPDATE SET ttl_ms = MAX(ttl_ms, \
                   ?4 + ?5 - (SELECT created_at FROM tasks WHERE id = ?1))",
            )?
            .execute(params![task_id, requester, tool, ttl_ms as i64, now])?;
            select_handle(conn, &task_id, &requester, now)
        })
        .await
    }

    /// `requester`'s live handle on `task_id`; `None` if there is none (another client's handle on
    /// the same task included: a caller must not learn that it exists).
    async fn handle(
        &self,
        task_id: &str,
        requester: &str,
    ) -> Result<Option<TaskHandle>, StoreError> {
        let (task_id, requester) = (task_id.to_owned(), requester.to_owned());
        self.read(move |conn| select_handle(conn, &task_id, &requester, now_ms()))
            .await
    }

    /// Up to `limit` of `requester`'s live handles in creation order, starting after the
    /// `(created_at ms, task id)` position `after`.
    async fn list_handles(
        &self,
        requester: &str,
        after: Option<(i64, String)>,
        limit: usize,
    ) -> Result<Vec<TaskHandle>, StoreError> {
        let requester = requester.to_owned();
        self.read(move |conn| {
            let (after_ms, after_id) = after.unwrap_or((i64::MIN, String::new()));
            let mut stmt = conn.prepare_cached(concat!(
                live_handles!(),
                " AND requester = :requester \
                 AND (tasks.created_at, tasks.id) > (:after_ms, :after_id) \
                 ORDER BY tasks.created_at, tasks.id LIMIT :limit"
            ))?;
            let rows = stmt.query_map(
                rusqlite::named_params! {
                    ":now": now_ms(),
                    ":requester": requester,
                    ":after_ms": after_ms,
                    ":after_id": after_id,
                    ":limit": limit as i64,
                },
                read_handle,
            )?;
            Ok(rows.collect::<Result<_, _>>()?)
        })
        .await
    }

    /// The live handles of tasks that have not ended, for routing their status changes.
    async fn unfinished_handles(&self) -> Result<Vec<TaskHandle>, StoreError> {
        self.read(move |conn| {
            let mut stmt = conn.prepare_cached(concat!(
                live_handles!(),
                " AND tasks.status IN ('pending', 'running', 'paused', 'input_required')"
            ))?;
            let rows = stmt.query_map(rusqlite::named_params! {":now": now_ms()}, read_handle)?;
            Ok(rows.collect::<Result<_, _>>()?)
        })
        .await
    }

    /// Deletes handles past their ttl, and handles whose task the retention removed.
    async fn purge_expired_handles(&self) -> Result<u64, StoreError> {
        self.write(|conn| {
            let deleted = conn.execute(
                "DELETE FROM mcp_tasks WHERE NOT EXISTS (SELECT 1 FROM tasks \
                 WHERE tasks.id = mcp_tasks.task_id AND tasks.created_at + mcp_tasks.ttl_ms > ?1)",
                [now_ms()],
            )?;
            Ok(deleted as u64)
        })
        .await
    }
}
