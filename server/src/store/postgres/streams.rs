//! [`StreamRepo`] on PostgreSQL: the `streams`, `events` and `call_bindings` tables.

use std::time::Duration;

use async_trait::async_trait;
use tokio_postgres::Row;
use tokio_postgres::types::ToSql;

use super::{Postgres, signed, unsigned};
use crate::store::{
    CallBinding, NewEvent, Pruned, Refusal, StoreError, StoredEvent, StreamInfo, StreamRepo,
    is_standalone, new_stream_token,
};

/// Appends an event in one statement, so in one transaction: advance (or create) the stream's
/// counter, insert the event, reveal the binding's stream, and close the binding of a call
/// whose response this is (see the SQLite backend's `append` for why in the same commit). The
/// upsert locks the stream's row until the statement commits, so the appends of one stream are
/// serialised and each seq commits before the next is handed out: a reader never sees seq n+1
/// without n. A finished stream is not advanced, and then nothing is inserted and no row
/// returned.
const APPEND: &str = concat!(
    "\
    WITH stream AS ( \
        INSERT INTO streams (token, stream_id, session_id, next_seq, finished, created_at, \
            call_id) \
        VALUES ($1, $2, $3, 2, $4, durable_now_ms(), $7) \
        ON CONFLICT (stream_id) DO UPDATE SET next_seq = streams.next_seq + 1, \
            finished = EXCLUDED.finished, \
            call_id = coalesce(streams.call_id, EXCLUDED.call_id) \
        WHERE NOT streams.finished \
        RETURNING token, next_seq - 1 AS seq, call_id \
    ),",
    append_rest!("$5", "$6", "$7", "$4")
);

/// [`APPEND`] for an event that may not open its stream: only an existing, unfinished stream
/// is advanced. Its parameters: stream id, finishes, message, retry, binding.
const CONTINUE: &str = concat!(
    "\
    WITH stream AS ( \
        UPDATE streams SET next_seq = next_seq + 1, finished = $2, \
            call_id = coalesce(call_id, $5) \
        WHERE stream_id = $1 AND NOT finished \
        RETURNING token, next_seq - 1 AS seq, call_id \
    ),",
    append_rest!("$3", "$4", "$5", "$2")
);

/// What [`APPEND`] and [`CONTINUE`] do once `stream` holds the token, seq and call, given the
/// placeholders of the message, the retry, the binding and whether the event finishes the
/// stream. One UPDATE of `call_bindings` does both of its jobs: two in one statement could not
/// both change the same row.
macro_rules! append_rest {
    ($message:literal, $retry:literal, $binding:literal, $finishes:literal) => {
        concat!(
            "\
    event AS ( \
        INSERT INTO events (token, seq, message, retry_ms, created_at) \
        SELECT token, seq, ",
            $message,
            ", ",
            $retry,
            ", durable_now_ms() FROM stream \
    ), binding AS ( \
        UPDATE call_bindings \
        SET stream_token = coalesce(stream_token, (SELECT token FROM stream)), \
            done = done OR (",
            $finishes,
            " AND id = (SELECT call_id FROM stream)) \
        WHERE (id = ",
            $binding,
            " AND stream_token IS NULL) OR (",
            $finishes,
            " AND NOT done AND id = (SELECT call_id FROM stream)) \
    ) \
    SELECT token, seq, pg_notify('",
            super::wakeups::STREAM_CHANNEL!(),
            "', token || ' ' || current_setting('application_name')) FROM stream"
        )
    };
}
use append_rest;

fn read_binding(row: &Row) -> Result<CallBinding, StoreError> {
    Ok(CallBinding {
        id: row.try_get(0)?,
        task_id: row.try_get(1)?,
        session_id: row.try_get(2)?,
        request_id: row.try_get(3)?,
        progress_token: row.try_get(4)?,
        stream_id: row.try_get(5)?,
    })
}

#[async_trait]
impl StreamRepo for Postgres {
    async fn append_event(&self, event: NewEvent) -> Result<(String, u64), StoreError> {
        let retry_ms = event.retry_ms.map(signed).transpose()?;
        let read = |row: &Row| Ok((row.try_get(0)?, unsigned(row, 1)?));
        let appended = if event.opens {
            let token = new_stream_token();
            let params: [&(dyn ToSql + Sync); 7] = [
                &token,
                &event.stream_id,
                &event.session_id,
                &event.finishes,
                &event.message,
                &retry_ms,
                &event.binding,
            ];
            self.query_opt(APPEND, &params, read).await?
        } else {
            let params: [&(dyn ToSql + Sync); 5] = [
                &event.stream_id,
                &event.finishes,
                &event.message,
                &retry_ms,
                &event.binding,
            ];
            self.query_opt(CONTINUE, &params, read).await?
        };
        appended.ok_or_else(|| {
            Refusal::StreamEnded {
                stream_id: event.stream_id,
            }
            .into()
        })
    }

    async fn bind_stream_session(
        &self,
        token: &str,
        session_id: &str,
        call_id: &str,
        instance: &str,
    ) -> Result<bool, StoreError> {
        let claimed = self
            .execute(
                "UPDATE streams SET session_id = $2, call_id = $3, instance = $4 \
                 WHERE token = $1 AND session_id IS NULL",
                &[&token, &session_id, &call_id, &instance],
            )
            .await?;
        if claimed > 0 {
            return Ok(true);
        }
        let owner = self
            .query_opt(
                "SELECT session_id FROM streams WHERE token = $1",
                &[&token],
                |row| Ok(row.try_get::<_, Option<String>>(0)?),
            )
            .await?;
        Ok(matches!(owner, Some(Some(owner)) if owner == session_id))
    }

    async fn abandoned(&self, token: &str, instance: &str) -> Result<bool, StoreError> {
        let found = self
            .query_opt(
                "SELECT 1 FROM streams s WHERE s.token = $1 AND NOT s.finished \
                 AND s.instance IS NOT NULL AND s.instance != $2 \
                 AND NOT EXISTS (SELECT 1 FROM instances i \
                                 WHERE i.id = s.instance AND i.expires_at >= durable_now_ms()) \
                 AND NOT EXISTS (SELECT 1 FROM call_bindings b \
                                 WHERE b.id = s.call_id AND NOT b.done)",
                &[&token, &instance],
                |_| Ok(()),
            )
            .await?;
        Ok(found.is_some())
    }

    async fn stream_info(&self, token: &str) -> Result<Option<StreamInfo>, StoreError> {
        self.query_opt(
            "SELECT session_id, next_seq, finished, stream_id FROM streams WHERE token = $1",
            &[&token],
            |row| {
                Ok(StreamInfo {
                    session_id: row.try_get(0)?,
                    next_seq: unsigned(row, 1)?,
                    finished: row.try_get(2)?,
                    standalone: is_standalone(row.try_get(3)?),
                })
            },
        )
        .await
    }

    async fn event_exists(&self, token: &str, seq: u64) -> Result<bool, StoreError> {
        Ok(self
            .query_opt(
                "SELECT 1 FROM events WHERE token = $1 AND seq = $2",
                &[&token, &signed(seq)?],
                |_| Ok(()),
            )
            .await?
            .is_some())
    }

    async fn events_after(
        &self,
        token: &str,
        seq: u64,
        limit: usize,
    ) -> Result<Vec<StoredEvent>, StoreError> {
        self.query(
            "SELECT seq, message, retry_ms FROM events WHERE token = $1 AND seq > $2 \
             ORDER BY seq LIMIT $3",
            &[&token, &signed(seq)?, &signed(limit as u64)?],
            |row| {
                Ok(StoredEvent {
                    seq: unsigned(row, 0)?,
                    message: row.try_get(1)?,
                    retry_ms: row.try_get::<_, Option<i64>>(2)?.map(|ms| ms.max(0) as u64),
                })
            },
        )
        .await
    }

    async fn prune_before(&self, cutoff_ms: i64) -> Result<Pruned, StoreError> {
        let (events, event_batches) = self
            .delete_in_batches(
                "DELETE FROM events WHERE (token, seq) IN \
                 (SELECT token, seq FROM events WHERE created_at < $1 LIMIT $2)",
                cutoff_ms,
            )
            .await?;
        let (streams, stream_batches) = self
            .delete_in_batches(
                "DELETE FROM streams WHERE token IN (SELECT token FROM streams AS s \
                 WHERE finished AND created_at < $1 \
                 AND NOT EXISTS (SELECT 1 FROM events AS e WHERE e.token = s.token) LIMIT $2)",
                cutoff_ms,
            )
            .await?;
        let (bindings, binding_batches) = self
            .delete_in_batches(
                "DELETE FROM call_bindings WHERE id IN \
                 (SELECT id FROM call_bindings WHERE done AND created_at < $1 LIMIT $2)",
                cutoff_ms,
            )
            .await?;
        Ok(Pruned {
            events,
            streams,
            bindings,
            batches: event_batches + stream_batches + binding_batches,
        })
    }

    async fn insert_binding(&self, binding: CallBinding, instance: &str) -> Result<(), StoreError> {
        self.execute(
            "INSERT INTO call_bindings (id, task_id, session_id, request_id, progress_token, \
             instance, created_at) VALUES ($1, $2, $3, $4, $5, $6, durable_now_ms())",
            &[
                &binding.id,
                &binding.task_id,
                &binding.session_id,
                &binding.request_id,
                &binding.progress_token,
                &instance,
            ],
        )
        .await?;
        Ok(())
    }

    async fn adopt_orphaned_bindings(
        &self,
        instance: &str,
    ) -> Result<Vec<CallBinding>, StoreError> {
        // The row lock taken by the update makes a concurrent adopter re-check the condition
        // against this one's (live) instance, so each binding is adopted once.
        self.query(
            "UPDATE call_bindings b SET instance = $1 WHERE NOT b.done AND b.instance != $1 \
             AND NOT EXISTS (SELECT 1 FROM instances i \
               WHERE i.id = b.instance AND i.expires_at >= durable_now_ms()) \
             RETURNING b.id, b.task_id, b.session_id, b.request_id, b.progress_token, \
             coalesce((SELECT stream_id FROM streams s WHERE s.token = b.stream_token), \
                      (SELECT stream_id FROM streams s WHERE s.call_id = b.id))",
            &[&instance],
            read_binding,
        )
        .await
    }

    async fn keep_alive(&self, instance: &str, ttl: Duration) -> Result<(), StoreError> {
        let ttl_ms = i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX);
        self.execute(
            "INSERT INTO instances (id, expires_at) VALUES ($1, durable_now_ms() + $2) \
             ON CONFLICT (id) DO UPDATE SET expires_at = EXCLUDED.expires_at",
            &[&instance, &ttl_ms],
        )
        .await?;
        // This node's earlier processes are dead (see `StreamRepo::keep_alive`), and
        // instances that stopped a day ago have no open binding left to prove dead.
        let node = instance.split_once('/').map_or(instance, |(node, _)| node);
        self.execute(
            "DELETE FROM instances WHERE expires_at < durable_now_ms() - 86400000 \
             OR (starts_with(id, $1) AND id != $2)",
            &[&format!("{node}/"), &instance],
        )
        .await?;
        Ok(())
    }

    async fn finish_binding(&self, id: &str) -> Result<(), StoreError> {
        self.execute("UPDATE call_bindings SET done = TRUE WHERE id = $1", &[&id])
            .await?;
        Ok(())
    }

    async fn last_event_containing(
        &self,
        stream_id: &str,
        needle: &str,
    ) -> Result<Option<String>, StoreError> {
        self.query_opt(
            "SELECT e.message FROM events e JOIN streams s ON s.token = e.token \
             WHERE s.stream_id = $1 AND strpos(e.message, $2) > 0 \
             ORDER BY e.seq DESC LIMIT 1",
            &[&stream_id, &needle],
            |row| Ok(row.try_get(0)?),
        )
        .await
    }
}
