//! [`HandleRepo`] on PostgreSQL: the `mcp_tasks` table, joined with `tasks` for what a handle
//! shows.

use async_trait::async_trait;
use tokio_postgres::Row;

use super::tasks::{INFO_COUNT, info_columns, read_info};
use super::{Postgres, signed, unsigned};
use crate::store::{HandleRepo, StoreError, TaskHandle};

fn read_handle(row: &Row) -> Result<TaskHandle, StoreError> {
    Ok(TaskHandle {
        task: read_info(row)?,
        requester: row.try_get(INFO_COUNT)?,
        tool: row.try_get(INFO_COUNT + 1)?,
        ttl_ms: unsigned(row, INFO_COUNT + 2)?,
    })
}

/// The live handles with their tasks; the statements using it add conditions after it.
macro_rules! live_handles {
    () => {
        concat!(
            "SELECT ",
            info_columns!(),
            ", requester, tool, ttl_ms \
             FROM tasks JOIN mcp_tasks ON mcp_tasks.task_id = tasks.id \
             WHERE tasks.created_at + mcp_tasks.ttl_ms > durable_now_ms()"
        )
    };
}

const SELECT_HANDLE: &str = concat!(live_handles!(), " AND tasks.id = $1 AND requester = $2");

#[async_trait]
impl HandleRepo for Postgres {
    async fn upsert_handle(
        &self,
        task_id: &str,
        requester: &str,
        tool: &str,
        ttl_ms: u64,
    ) -> Result<Option<TaskHandle>, StoreError> {
        let ttl_ms = signed(ttl_ms)?;
        // Announced to the other nodes, whose routers then tell this requester's sessions
        // there of the task's status changes.
        self.query(
            concat!(
                "WITH h AS (INSERT INTO mcp_tasks (task_id, requester, tool, ttl_ms) \
                 VALUES ($1, $2, $3, $4) \
                 ON CONFLICT (task_id, requester) DO UPDATE SET ttl_ms = GREATEST(mcp_tasks.ttl_ms, \
                   $4 + durable_now_ms() - (SELECT created_at FROM tasks WHERE id = $1)) \
                 RETURNING task_id, requester) \
                 SELECT pg_notify('",
                super::wakeups::HANDLE_CHANNEL!(),
                "', h.task_id || ' ' || current_setting('application_name') || ' ' || h.requester) \
                 FROM h"
            ),
            &[&task_id, &requester, &tool, &ttl_ms],
            |_| Ok(()),
        )
        .await?;
        self.handle(task_id, requester).await
    }

    async fn handle(
        &self,
        task_id: &str,
        requester: &str,
    ) -> Result<Option<TaskHandle>, StoreError> {
        self.query_opt(SELECT_HANDLE, &[&task_id, &requester], read_handle)
            .await
    }

    async fn list_handles(
        &self,
        requester: &str,
        after: Option<(i64, String)>,
        limit: usize,
    ) -> Result<Vec<TaskHandle>, StoreError> {
        let (after_ms, after_id) = after.unwrap_or((i64::MIN, String::new()));
        self.query(
            concat!(
                live_handles!(),
                " AND requester = $1 AND (tasks.created_at, tasks.id) > ($2, $3) \
                 ORDER BY tasks.created_at, tasks.id LIMIT $4"
            ),
            &[&requester, &after_ms, &after_id, &signed(limit as u64)?],
            read_handle,
        )
        .await
    }

    async fn unfinished_handles(&self) -> Result<Vec<TaskHandle>, StoreError> {
        self.query(
            concat!(
                live_handles!(),
                " AND tasks.status IN ('pending', 'running', 'paused', 'input_required')"
            ),
            &[],
            read_handle,
        )
        .await
    }

    async fn purge_expired_handles(&self) -> Result<u64, StoreError> {
        self.execute(
            "DELETE FROM mcp_tasks WHERE NOT EXISTS (SELECT 1 FROM tasks \
             WHERE tasks.id = mcp_tasks.task_id \
             AND tasks.created_at + mcp_tasks.ttl_ms > durable_now_ms())",
            &[],
        )
        .await
    }
}
