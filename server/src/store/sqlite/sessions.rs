//! [`SessionRepo`] on SQLite: the `sessions` and `subscriptions` tables.

use async_trait::async_trait;
use rusqlite::{Connection, OptionalExtension, params};

use super::Sqlite;
use crate::store::{SessionRepo, StoreError, now_ms};

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
    conn.execute(
        "DELETE FROM subscriptions WHERE session_id = ?1",
        [session_id],
    )?;
    conn.execute(
        "DELETE FROM session_subjects WHERE session_id = ?1",
        [session_id],
    )?;
    Ok(conn.execute("DELETE FROM sessions WHERE id = ?1", [session_id])? > 0)
}

#[async_trait]
impl SessionRepo for Sqlite {
    async fn save_session(
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
    async fn load_session(&self, id: &str) -> Result<Option<String>, StoreError> {
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
    async fn delete_session(&self, id: &str) -> Result<bool, StoreError> {
        let id = id.to_owned();
        self.write(move |conn| delete_session(conn, &id)).await
    }

    async fn touch_sessions(&self, ids: Vec<String>) -> Result<(), StoreError> {
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
    async fn idle_sessions(&self, cutoff_ms: i64) -> Result<Vec<String>, StoreError> {
        self.read(move |conn| {
            let mut stmt = conn.prepare("SELECT id FROM sessions WHERE last_seen_at < ?1")?;
            let ids = stmt.query_map([cutoff_ms], |row| row.get(0))?;
            Ok(ids.collect::<Result<_, _>>()?)
        })
        .await
    }

    /// Adds (`subscribed`) or removes a session's resource subscription.
    async fn set_subscription(
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

    async fn subscriptions(&self, session_id: &str) -> Result<Vec<String>, StoreError> {
        let session_id = session_id.to_owned();
        self.read(move |conn| {
            let mut stmt =
                conn.prepare_cached("SELECT uri FROM subscriptions WHERE session_id = ?1")?;
            let uris = stmt.query_map([session_id], |row| row.get(0))?;
            Ok(uris.collect::<Result<_, _>>()?)
        })
        .await
    }

    async fn claim_session(&self, session_id: &str, subject: &str) -> Result<(), StoreError> {
        let (session_id, subject) = (session_id.to_owned(), subject.to_owned());
        self.write(move |conn| {
            conn.prepare_cached(
                "INSERT INTO session_subjects (session_id, subject) VALUES (?1, ?2) \
                 ON CONFLICT (session_id) DO NOTHING",
            )?
            .execute(params![session_id, subject])?;
            Ok(())
        })
        .await
    }

    async fn session_subject(&self, session_id: &str) -> Result<Option<String>, StoreError> {
        let session_id = session_id.to_owned();
        self.read(move |conn| {
            Ok(conn
                .prepare_cached("SELECT subject FROM session_subjects WHERE session_id = ?1")?
                .query_row([session_id], |row| row.get(0))
                .optional()?)
        })
        .await
    }

    async fn sessions_of(&self, subject: &str) -> Result<u64, StoreError> {
        let subject = subject.to_owned();
        self.read(move |conn| {
            Ok(conn
                .prepare_cached("SELECT count(*) FROM session_subjects WHERE subject = ?1")?
                .query_row([subject], |row| row.get(0))?)
        })
        .await
    }
}
