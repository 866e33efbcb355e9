//! Resumable streams: MCP sessions, the SSE streams rmcp opens for them, every event sent on
//! those streams, and the bindings between durable tasks and the tool calls waiting on them.
//!
//! Event ids are `{token}.{seq}`: `token` is 128 random bits naming one stream (and, through
//! this table, its session), `seq` counts that stream's events from 1. A token is never reused,
//! so ids stay unique across restarts, clean-ups and even a wiped database, and nobody can guess
//! another stream's ids.

use rusqlite::{Connection, OptionalExtension, params};

use super::{Store, StoreError, now_ms};

/// One stored SSE event.
#[derive(Debug, Clone, PartialEq)]
pub struct StoredEvent {
    pub seq: u64,
    /// The JSON-RPC message, or `None` for a priming event.
    pub message: Option<String>,
    pub retry_ms: Option<u64>,
}

/// What an event id's stream looks like.
#[derive(Debug, Clone, PartialEq)]
pub struct StreamInfo {
    /// `None` until the session that received the stream is known.
    pub session_id: Option<String>,
    /// The seq the next event will get.
    pub next_seq: u64,
    /// The stream's final response has been stored: nothing follows it.
    pub finished: bool,
}

/// An event about to be appended.
#[derive(Debug, Clone)]
pub struct NewEvent {
    /// rmcp's id of the stream.
    pub stream_id: String,
    /// The stream's session, when known at the time (the standalone GET stream).
    pub session_id: Option<String>,
    pub message: Option<String>,
    pub retry_ms: Option<u64>,
    /// The event is the stream's final response.
    pub finishes: bool,
    /// The event reveals the stream of this tool-call binding.
    pub binding: Option<String>,
}

/// A tool call that a durable task reports to.
#[derive(Debug, Clone, PartialEq)]
pub struct CallBinding {
    pub id: String,
    pub task_id: String,
    pub session_id: String,
    /// The JSON-RPC request id, as JSON.
    pub request_id: String,
    /// The request's progress token, as JSON.
    pub progress_token: String,
    /// rmcp's id of the call's stream, once its first progress notification was stored.
    pub stream_id: Option<String>,
}

fn new_token() -> String {
    hex::encode(rand::random::<[u8; 16]>())
}

/// Appends `event`: three cached statements (find the stream, advance or create it, insert the
/// event), and a fourth when it reveals a binding's stream. The sequence counter is read and
/// written in two steps rather than by `UPDATE ... RETURNING`, which SQLite runs through a
/// temporary table: this connection is the only writer, so nothing can come between them.
fn append(conn: &Connection, event: &NewEvent) -> Result<(String, u64), StoreError> {
    let now = now_ms();
    let existing: Option<(i64, String, u64)> = conn
        .prepare_cached("SELECT rowid, token, next_seq FROM streams WHERE stream_id = ?1")?
        .query_row([&event.stream_id], |row| {
            Ok((row.get(0)?, row.get(1)?, row.get(2)?))
        })
        .optional()?;
    let (token, seq) = match existing {
        Some((rowid, token, seq)) => {
            conn.prepare_cached(
                "UPDATE streams SET next_seq = ?2, finished = finished OR ?3 WHERE rowid = ?1",
            )?
            .execute(params![rowid, seq + 1, event.finishes])?;
            (token, seq)
        }
        None => {
            let token = new_token();
            conn.prepare_cached(
                "INSERT INTO streams (token, stream_id, session_id, next_seq, finished, created_at) \
                 VALUES (?1, ?2, ?3, 2, ?4, ?5)",
            )?
            .execute(params![
                token,
                event.stream_id,
                event.session_id,
                event.finishes,
                now
            ])?;
            (token, 1)
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
    Ok((token, seq))
}

fn delete_session(conn: &Connection, session_id: &str) -> Result<bool, StoreError> {
    conn.execute(
        "DELETE FROM events WHERE token IN (SELECT token FROM streams WHERE session_id = ?1)",
        [session_id],
    )?;
    conn.execute("DELETE FROM streams WHERE session_id = ?1", [session_id])?;
    conn.execute(
        "DELETE FROM call_bindings WHERE session_id = ?1",
        [session_id],
    )?;
    Ok(conn.execute("DELETE FROM sessions WHERE id = ?1", [session_id])? > 0)
}

impl Store {
    /// Appends an event to its stream (creating the stream on its first event) and returns
    /// the stream's token and the event's seq, once durable.
    pub async fn append_event(&self, event: NewEvent) -> Result<(String, u64), StoreError> {
        self.write(move |conn| append(conn, &event)).await
    }

    /// Records which session received the stream `token`; false if another session did.
    pub async fn bind_stream_session(
        &self,
        token: &str,
        session_id: &str,
    ) -> Result<bool, StoreError> {
        let (token, session_id) = (token.to_owned(), session_id.to_owned());
        self.write(move |conn| {
            let owner: Option<Option<String>> = conn
                .prepare_cached("SELECT session_id FROM streams WHERE token = ?1")?
                .query_row([&token], |row| row.get(0))
                .optional()?;
            Ok(match owner {
                Some(Some(owner)) => owner == session_id,
                Some(None) => {
                    conn.prepare_cached("UPDATE streams SET session_id = ?2 WHERE token = ?1")?
                        .execute(params![token, session_id])?;
                    true
                }
                None => false,
            })
        })
        .await
    }

    pub async fn stream_info(&self, token: &str) -> Result<Option<StreamInfo>, StoreError> {
        let token = token.to_owned();
        self.read(move |conn| {
            Ok(conn
                .prepare_cached(
                    "SELECT session_id, next_seq, finished FROM streams WHERE token = ?1",
                )?
                .query_row([token], |row| {
                    Ok(StreamInfo {
                        session_id: row.get(0)?,
                        next_seq: row.get(1)?,
                        finished: row.get(2)?,
                    })
                })
                .optional()?)
        })
        .await
    }

    pub async fn event_exists(&self, token: &str, seq: u64) -> Result<bool, StoreError> {
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
    pub async fn events_after(
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
    pub async fn prune_events_before(&self, cutoff_ms: i64) -> Result<u64, StoreError> {
        self.write(move |conn| {
            Ok(conn.execute("DELETE FROM events WHERE created_at < ?1", [cutoff_ms])? as u64)
        })
        .await
    }

    pub async fn save_session(
        &self,
        id: &str,
        state: String,
        protocol_version: String,
    ) -> Result<(), StoreError> {
        let id = id.to_owned();
        self.write(move |conn| {
            let now = now_ms();
            conn.execute(
                "INSERT INTO sessions (id, state, protocol_version, created_at, last_seen_at) \
                 VALUES (?1, ?2, ?3, ?4, ?4) ON CONFLICT (id) DO UPDATE SET state = ?2, \
                 protocol_version = ?3, last_seen_at = ?4",
                params![id, state, protocol_version, now],
            )?;
            Ok(())
        })
        .await
    }

    /// A session's stored state.
    pub async fn load_session(&self, id: &str) -> Result<Option<String>, StoreError> {
        let id = id.to_owned();
        self.read(move |conn| {
            Ok(conn
                .prepare_cached("SELECT state FROM sessions WHERE id = ?1")?
                .query_row([id], |row| row.get(0))
                .optional()?)
        })
        .await
    }

    /// Deletes a session with its streams, events and call bindings.
    pub async fn delete_session(&self, id: &str) -> Result<bool, StoreError> {
        let id = id.to_owned();
        self.write(move |conn| delete_session(conn, &id)).await
    }

    pub async fn touch_sessions(&self, ids: Vec<String>) -> Result<(), StoreError> {
        self.write(move |conn| {
            let now = now_ms();
            let mut stmt =
                conn.prepare_cached("UPDATE sessions SET last_seen_at = ?2 WHERE id = ?1")?;
            for id in ids {
                stmt.execute(params![id, now])?;
            }
            Ok(())
        })
        .await
    }

    /// Ids of sessions not seen since `cutoff_ms`.
    pub async fn idle_sessions(&self, cutoff_ms: i64) -> Result<Vec<String>, StoreError> {
        self.read(move |conn| {
            let mut stmt = conn.prepare("SELECT id FROM sessions WHERE last_seen_at < ?1")?;
            let ids = stmt.query_map([cutoff_ms], |row| row.get(0))?;
            Ok(ids.collect::<Result<_, _>>()?)
        })
        .await
    }

    pub async fn insert_binding(
        &self,
        binding: CallBinding,
        instance: &str,
    ) -> Result<(), StoreError> {
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
    pub async fn orphaned_bindings(&self, instance: &str) -> Result<Vec<CallBinding>, StoreError> {
        let instance = instance.to_owned();
        self.read(move |conn| {
            let mut stmt = conn.prepare(
                "SELECT b.id, b.task_id, b.session_id, b.request_id, b.progress_token, \
                 s.stream_id FROM call_bindings b \
                 LEFT JOIN streams s ON s.token = b.stream_token \
                 WHERE b.done = 0 AND b.instance != ?1",
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

    /// Adds (`subscribed`) or removes a session's resource subscription.
    pub async fn set_subscription(
        &self,
        session_id: &str,
        uri: &str,
        subscribed: bool,
    ) -> Result<(), StoreError> {
        let (session_id, uri) = (session_id.to_owned(), uri.to_owned());
        self.write(move |conn| {
            let sql = if subscribed {
                "INSERT OR IGNORE INTO subscriptions (session_id, uri) VALUES (?1, ?2)"
            } else {
                "DELETE FROM subscriptions WHERE session_id = ?1 AND uri = ?2"
            };
            conn.prepare_cached(sql)?
                .execute(params![session_id, uri])?;
            Ok(())
        })
        .await
    }

    pub async fn subscriptions(&self, session_id: &str) -> Result<Vec<String>, StoreError> {
        let session_id = session_id.to_owned();
        self.read(move |conn| {
            let mut stmt =
                conn.prepare_cached("SELECT uri FROM subscriptions WHERE session_id = ?1")?;
            let uris = stmt.query_map([session_id], |row| row.get(0))?;
            Ok(uris.collect::<Result<_, _>>()?)
        })
        .await
    }

    /// Records that a binding's call got its final answer.
    pub async fn finish_binding(&self, id: &str) -> Result<(), StoreError> {
        let id = id.to_owned();
        self.write(move |conn| {
            conn.prepare_cached("UPDATE call_bindings SET done = 1 WHERE id = ?1")?
                .execute([id])?;
            Ok(())
        })
        .await
    }

    /// The message of the newest event of stream `stream_id` whose JSON contains `needle`.
    pub async fn last_event_containing(
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
