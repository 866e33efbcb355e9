//! [`SessionRepo`] on PostgreSQL: the `sessions` and `subscriptions` tables.

use async_trait::async_trait;

use super::Postgres;
use crate::store::{SessionRepo, StoreError};

#[async_trait]
impl SessionRepo for Postgres {
    async fn save_session(
        &self,
        id: &str,
        state: String,
        protocol_version: String,
    ) -> Result<(), StoreError> {
        self.execute(
            "INSERT INTO sessions (id, state, protocol_version, created_at, last_seen_at) \
             VALUES ($1, $2, $3, durable_now_ms(), durable_now_ms()) \
             ON CONFLICT (id) DO UPDATE SET state = $2, protocol_version = $3, \
             last_seen_at = durable_now_ms()",
            &[&id, &state, &protocol_version],
        )
        .await?;
        Ok(())
    }

    async fn load_session(&self, id: &str) -> Result<Option<String>, StoreError> {
        self.query_opt("SELECT state FROM sessions WHERE id = $1", &[&id], |row| {
            Ok(row.try_get(0)?)
        })
        .await
    }

    async fn delete_session(&self, id: &str) -> Result<bool, StoreError> {
        let mut client = self.client().await?;
        let tx = client.transaction().await?;
        tx.execute(
            "DELETE FROM events WHERE token IN (SELECT token FROM streams WHERE session_id = $1)",
            &[&id],
        )
        .await?;
        for sql in [
            "DELETE FROM streams WHERE session_id = $1",
            "DELETE FROM call_bindings WHERE session_id = $1",
            "DELETE FROM subscriptions WHERE session_id = $1",
            "DELETE FROM session_subjects WHERE session_id = $1",
        ] {
            tx.execute(sql, &[&id]).await?;
        }
        let existed = tx
            .execute("DELETE FROM sessions WHERE id = $1", &[&id])
            .await?
            > 0;
        tx.commit().await?;
        Ok(existed)
    }

    async fn touch_sessions(&self, ids: Vec<String>) -> Result<(), StoreError> {
        self.execute(
            "UPDATE sessions SET last_seen_at = durable_now_ms() WHERE id = ANY($1)",
            &[&ids],
        )
        .await?;
        Ok(())
    }

    async fn idle_sessions(&self, cutoff_ms: i64) -> Result<Vec<String>, StoreError> {
        self.query(
            "SELECT id FROM sessions WHERE last_seen_at < $1",
            &[&cutoff_ms],
            |row| Ok(row.try_get(0)?),
        )
        .await
    }

    async fn set_subscription(
        &self,
        session_id: &str,
        uri: &str,
        subscribed: bool,
    ) -> Result<(), StoreError> {
        let sql = if subscribed {
            "INSERT INTO subscriptions (session_id, uri) VALUES ($1, $2) ON CONFLICT DO NOTHING"
        } else {
            "DELETE FROM subscriptions WHERE session_id = $1 AND uri = $2"
        };
        self.execute(sql, &[&session_id, &uri]).await?;
        Ok(())
    }

    async fn subscriptions(&self, session_id: &str) -> Result<Vec<String>, StoreError> {
        self.query(
            "SELECT uri FROM subscriptions WHERE session_id = $1",
            &[&session_id],
            |row| Ok(row.try_get(0)?),
        )
        .await
    }

    async fn claim_session(&self, session_id: &str, subject: &str) -> Result<(), StoreError> {
        self.execute(
            "INSERT INTO session_subjects (session_id, subject) VALUES ($1, $2) \
             ON CONFLICT (session_id) DO NOTHING",
            &[&session_id, &subject],
        )
        .await?;
        Ok(())
    }

    async fn session_subject(&self, session_id: &str) -> Result<Option<String>, StoreError> {
        self.query_opt(
            "SELECT subject FROM session_subjects WHERE session_id = $1",
            &[&session_id],
            |row| Ok(row.try_get(0)?),
        )
        .await
    }

    async fn sessions_of(&self, subject: &str) -> Result<u64, StoreError> {
        let count: i64 = self
            .query_opt(
                "SELECT count(*) FROM session_subjects WHERE subject = $1",
                &[&subject],
                |row| Ok(row.try_get(0)?),
            )
            .await?
            .unwrap_or(0);
        Ok(count as u64)
    }
}
