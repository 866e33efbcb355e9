//! [`StreamRepo`] on SQLite: the `streams`, `events` and `call_bindings` tables.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use rusqlite::{Connection, OptionalExtension, params};

use super::{LiveStreams, Sqlite, Unborn, Undo};
use crate::store::{
    CallBinding, Durable, NewEvent, Pruned, Refusal, StoreError, StoredEvent, StreamInfo,
    StreamRepo, is_standalone, new_stream_token, now_ms,
};

/// Appends `event`: three cached statements (find the stream, advance or create it, insert the
/// event), and a fourth when it reveals a binding's stream or is the response of a bound call.
/// The sequence counter is read and written in two steps rather than by `UPDATE ... RETURNING`,
/// which SQLite runs through a temporary table: this connection is the only writer, so nothing
/// can come between them. `at` is the id the event was promised when it was queued (see
/// [`super::LiveStreams`]); without one, the stream's counter says.
///
/// A stream whose priming event went unstored (see [`StreamRepo::queue_event`]) gets its row
/// here if its event comes before the record of its session, which then finds the row made.
///
/// Every refusal is decided before the first change, and no statement after it can break a
/// constraint (the event's id is its stream's next, and nothing else is unique), so the
/// append needs no savepoint of its own (see `Undo::Statement`).
fn append(
    conn: &Connection,
    live: &Mutex<LiveStreams>,
    event: &NewEvent,
    at: Option<(String, u64)>,
) -> Result<(String, u64), StoreError> {
    let now = now_ms();
    let existing: Option<(i64, String, u64, bool, Option<String>)> = conn
        .prepare_cached(
            "SELECT rowid, token, next_seq, finished, call_id FROM streams WHERE stream_id = ?1",
        )?
        .query_row([&event.stream_id], |row| {
            Ok((
                row.get(0)?,
                row.get(1)?,
                row.get(2)?,
                row.get(3)?,
                row.get(4)?,
            ))
        })
        .optional()?;
    let ended = || Refusal::StreamEnded {
        stream_id: event.stream_id.clone(),
    };
    // The stream's call is the one the HTTP layer recorded, or the one this event reveals.
    let (token, seq, call) = match existing {
        Some((_, _, _, true, _)) => return Err(ended().into()),
        // The stream was forgotten as idle and its id promised anew: it cannot take that id.
        Some((_, token, _, false, _)) if at.as_ref().is_some_and(|(at, _)| *at != token) => {
            return Err(ended().into());
        }
        Some((rowid, token, next_seq, false, call_id)) => {
            let seq = at.map_or(next_seq, |(_, seq)| seq);
            let call = call_id.or_else(|| event.binding.clone());
            conn.prepare_cached(
                "UPDATE streams SET next_seq = ?2, finished = ?3, call_id = ?4 WHERE rowid = ?1",
            )?
            .execute(params![rowid, seq + 1, event.finishes, call])?;
            (token, seq, call)
        }
        None if !event.opens => return Err(ended().into()),
        None => {
            let (token, seq) = at.unwrap_or_else(|| (new_stream_token(), 1));
            live.lock()
                .expect("live streams lock")
                .unborn
                .remove(&token);
            conn.prepare_cached(
                "INSERT INTO streams (token, stream_id, session_id, next_seq, finished, \
                 created_at, call_id) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
            )?
            .execute(params![
                token,
                event.stream_id,
                event.session_id,
                seq + 1,
                event.finishes,
                now,
                event.binding
            ])?;
            (token, seq, event.binding.clone())
        }
    };
    conn.prepare_cached(
        "INSERT INTO events (token, seq, message, retry_ms, created_at) VALUES (?1, ?2, ?3, ?4, ?5)",
    )?
    .execute(params![token, seq, event.message, event.retry_ms, now])?;
    if let Some(binding) = &event.binding {
        conn.prepare_cached(
            "UPDATE call_bindings SET stream_token = ?2 WHERE id = ?1 AND stream_token IS NULL",
        )?
        .execute(params![binding, token])?;
    }
    // A bound call's response closes its binding in the same commit: closed any earlier (by
    // its handler, before returning the response), a kill in between left a call that no
    // restart would relay and whose resumed stream waited for ever; closed any later, a
    // restart would find it open and answer it twice.
    if event.finishes
        && let Some(call) = call
    {
        conn.prepare_cached("UPDATE call_bindings SET done = 1 WHERE id = ?1 AND NOT done")?
            .execute([call])?;
    }
    Ok((token, seq))
}

/// Which session received a stream (see [`StreamRepo::bind_stream_session`]).
struct StreamSession {
    token: String,
    session_id: String,
    call_id: String,
    instance: String,
}

impl StreamSession {
    fn new(token: &str, session_id: &str, call_id: &str, instance: &str) -> Self {
        StreamSession {
            token: token.to_owned(),
            session_id: session_id.to_owned(),
            call_id: call_id.to_owned(),
            instance: instance.to_owned(),
        }
    }

    /// Records it; false if another session received the stream, or it does not exist. A
    /// request's stream is recorded once, just after its first event: usually the priming
    /// event, which was not stored, and then the record makes the stream's row. Otherwise the
    /// update comes first and the lookup only when it changes nothing.
    fn record(&self, conn: &Connection, live: &Mutex<LiveStreams>) -> Result<bool, StoreError> {
        let unborn = live
            .lock()
            .expect("live streams lock")
            .unborn
            .remove(&self.token);
        if let Some(unborn) = unborn {
            conn.prepare_cached(
                "INSERT INTO streams (token, stream_id, session_id, next_seq, finished, \
                 created_at, call_id, instance) VALUES (?1, ?2, ?3, 2, 0, ?4, ?5, ?6)",
            )?
            .execute(params![
                self.token,
                unborn.stream_id,
                self.session_id,
                now_ms(),
                self.call_id,
                self.instance
            ])?;
            return Ok(true);
        }
        let recorded = conn
            .prepare_cached(
                "UPDATE streams SET session_id = ?2, call_id = ?3, instance = ?4 \
                 WHERE token = ?1 AND session_id IS NULL",
            )?
            .execute(params![
                self.token,
                self.session_id,
                self.call_id,
                self.instance
            ])?;
        if recorded > 0 {
            return Ok(true);
        }
        let owner: Option<Option<String>> = conn
            .prepare_cached("SELECT session_id FROM streams WHERE token = ?1")?
            .query_row([&self.token], |row| row.get(0))
            .optional()?;
        Ok(owner
            .flatten()
            .is_some_and(|owner| owner == self.session_id))
    }
}

#[async_trait]
impl StreamRepo for Sqlite {
    /// Appends an event to its stream (creating the stream on its first event) and returns
    /// the stream's token and the event's seq, once durable.
    async fn append_event(&self, event: NewEvent) -> Result<(String, u64), StoreError> {
        let live = self.live.clone();
        self.write_statement(move |conn| append(conn, &live, &event, None))
            .await
    }

    async fn queue_event(
        &self,
        event: NewEvent,
        durable: Durable,
    ) -> Result<(String, u64), StoreError> {
        // A request stream's priming event (its first, without a message) is not stored: what
        // a client can do with its id, resume the stream after it, needs only the stream,
        // whose row the record of its session makes (`StreamSession::record`), or else its
        // next event. So a POST costs the store one row and one write fewer. Nothing is
        // replayed from before an id a client holds, and the resume middleware's check of an
        // id knows that a request stream's first event may be missing.
        let priming = event.message.is_none() && !event.finishes;
        let at = {
            let mut live = self.live.lock().expect("live streams lock");
            let at = live.next(&event.stream_id, event.finishes);
            if priming && at.1 == 1 {
                let unborn = Unborn {
                    stream_id: event.stream_id,
                    since: Instant::now(),
                };
                live.unborn.insert(at.0.clone(), unborn);
                return Ok(at);
            }
            at
        };
        let promised = at.clone();
        let live = self.live.clone();
        self.queue(
            Undo::Statement,
            move |conn| append(conn, &live, &event, Some(at)),
            durable,
        )
        .await?;
        Ok(promised)
    }

    /// Records which session received the stream `token`; false if another session did.
    async fn bind_stream_session(
        &self,
        token: &str,
        session_id: &str,
        call_id: &str,
        instance: &str,
    ) -> Result<bool, StoreError> {
        let binding = StreamSession::new(token, session_id, call_id, instance);
        let live = self.live.clone();
        self.write_statement(move |conn| binding.record(conn, &live))
            .await
    }

    async fn queue_stream_session(
        &self,
        token: &str,
        session_id: &str,
        call_id: &str,
        instance: &str,
    ) -> Result<(), StoreError> {
        let binding = StreamSession::new(token, session_id, call_id, instance);
        let live = self.live.clone();
        self.queue(
            Undo::Statement,
            move |conn| binding.record(conn, &live),
            |recorded| match recorded {
                Ok(true) => {}
                Ok(false) => tracing::warn!("a stream's session was not recorded: not its stream"),
                Err(e) => tracing::error!(error = %e, "cannot record the session of a stream"),
            },
        )
        .await
    }

    async fn queued_durable(&self) {
        self.fence().await;
    }

    async fn abandoned(&self, token: &str, instance: &str) -> Result<bool, StoreError> {
        let (token, instance) = (token.to_owned(), instance.to_owned());
        // One process owns the file: every other process is dead.
        self.read(move |conn| {
            Ok(conn
                .prepare_cached(
                    "SELECT 1 FROM streams s WHERE s.token = ?1 AND NOT s.finished \
                     AND s.instance IS NOT NULL AND s.instance != ?2 \
                     AND NOT EXISTS (SELECT 1 FROM call_bindings b \
                                     WHERE b.id = s.call_id AND NOT b.done)",
                )?
                .query_row(params![token, instance], |_| Ok(()))
                .optional()?
                .is_some())
        })
        .await
    }

    async fn stream_info(&self, token: &str) -> Result<Option<StreamInfo>, StoreError> {
        let token = token.to_owned();
        self.read(move |conn| {
            Ok(conn
                .prepare_cached(
                    "SELECT session_id, next_seq, finished, stream_id FROM streams WHERE token = ?1",
                )?
                .query_row([token], |row| {
                    Ok(StreamInfo {
                        session_id: row.get(0)?,
                        next_seq: row.get(1)?,
                        finished: row.get(2)?,
                        standalone: is_standalone(&row.get::<_, String>(3)?),
                    })
                })
                .optional()?)
        })
        .await
    }

    async fn event_exists(&self, token: &str, seq: u64) -> Result<bool, StoreError> {
        let token = token.to_owned();
        self.read(move |conn| {
            Ok(conn
                .prepare_cached("SELECT 1 FROM events WHERE token = ?1 AND seq = ?2")?
                .query_row(params![token, seq], |_| Ok(()))
                .optional()?
                .is_some())
        })
        .await
    }

    /// Up to `limit` events of stream `token` after `seq`, in order.
    async fn events_after(
        &self,
        token: &str,
        seq: u64,
        limit: usize,
    ) -> Result<Vec<StoredEvent>, StoreError> {
        let token = token.to_owned();
        self.read(move |conn| {
            let mut stmt = conn.prepare_cached(
                "SELECT seq, message, retry_ms FROM events WHERE token = ?1 AND seq > ?2 \
                 ORDER BY seq LIMIT ?3",
            )?;
            let rows = stmt.query_map(params![token, seq, limit as i64], |row| {
                Ok(StoredEvent {
                    seq: row.get(0)?,
                    message: row.get(1)?,
                    retry_ms: row.get(2)?,
                })
            })?;
            Ok(rows.collect::<Result<_, _>>()?)
        })
        .await
    }

    /// Deletes events stored before `cutoff_ms`; their streams (and so their ids) are kept.
    async fn prune_before(&self, cutoff_ms: i64) -> Result<Pruned, StoreError> {
        let (events, event_batches) = self
            .delete_in_batches(
                "DELETE FROM events WHERE (token, seq) IN \
                 (SELECT token, seq FROM events WHERE created_at < ?1 LIMIT ?2)",
                cutoff_ms,
            )
            .await?;
        let (streams, stream_batches) = self
            .delete_in_batches(
                "DELETE FROM streams WHERE token IN (SELECT token FROM streams AS s \
                 WHERE finished AND created_at < ?1 \
                 AND NOT EXISTS (SELECT 1 FROM events AS e WHERE e.token = s.token) LIMIT ?2)",
                cutoff_ms,
            )
            .await?;
        let (bindings, binding_batches) = self
            .delete_in_batches(
                "DELETE FROM call_bindings WHERE id IN \
                 (SELECT id FROM call_bindings WHERE done AND created_at < ?1 LIMIT ?2)",
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
        let instance = instance.to_owned();
        self.write(move |conn| {
            conn.prepare_cached(
                "INSERT INTO call_bindings (id, task_id, session_id, request_id, progress_token, \
                 instance, created_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
            )?
            .execute(params![
                binding.id,
                binding.task_id,
                binding.session_id,
                binding.request_id,
                binding.progress_token,
                instance,
                now_ms()
            ])?;
            Ok(())
        })
        .await
    }

    /// Unfinished bindings made by other processes: calls whose handler died with its process.
    async fn adopt_orphaned_bindings(
        &self,
        instance: &str,
    ) -> Result<Vec<CallBinding>, StoreError> {
        let instance = instance.to_owned();
        self.write(move |conn| {
            let mut stmt = conn.prepare_cached(
                "UPDATE call_bindings SET instance = ?1 WHERE done = 0 AND instance != ?1 \
                 RETURNING id, task_id, session_id, request_id, progress_token, \
                 coalesce((SELECT stream_id FROM streams WHERE token = stream_token), \
                          (SELECT stream_id FROM streams WHERE call_id = call_bindings.id))",
            )?;
            let rows = stmt.query_map([instance], |row| {
                Ok(CallBinding {
                    id: row.get(0)?,
                    task_id: row.get(1)?,
                    session_id: row.get(2)?,
                    request_id: row.get(3)?,
                    progress_token: row.get(4)?,
                    stream_id: row.get(5)?,
                })
            })?;
            Ok(rows.collect::<Result<_, _>>()?)
        })
        .await
    }

    async fn keep_alive(&self, _instance: &str, _ttl: Duration) -> Result<(), StoreError> {
        // One process owns the file: every other instance is dead, so none needs to prove it
        // is alive.
        Ok(())
    }

    async fn finish_binding(&self, id: &str) -> Result<(), StoreError> {
        let id = id.to_owned();
        self.write(move |conn| {
            conn.prepare_cached("UPDATE call_bindings SET done = 1 WHERE id = ?1")?
                .execute([id])?;
            Ok(())
        })
        .await
    }

    /// The message of the newest event of stream `stream_id` whose JSON contains `needle`.
    async fn last_event_containing(
        &self,
        stream_id: &str,
        needle: &str,
    ) -> Result<Option<String>, StoreError> {
        let (stream_id, pattern) = (stream_id.to_owned(), format!("%{needle}%"));
        self.read(move |conn| {
            Ok(conn
                .query_row(
                    "SELECT e.message FROM events e JOIN streams s ON s.token = e.token \
                     WHERE s.stream_id = ?1 AND e.message LIKE ?2 ORDER BY e.seq DESC LIMIT 1",
                    params![stream_id, pattern],
                    |row| row.get(0),
                )
                .optional()?)
        })
        .await
    }
}
