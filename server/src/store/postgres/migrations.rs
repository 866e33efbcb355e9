//! Versioned schema migrations, tracked in the one-row table `durable_schema`.
//!
//! Each entry of [`MIGRATIONS`] moves the schema one version up. All pending ones run in one
//! transaction under an advisory lock, so nodes of a fleet starting together migrate once, and
//! a crash mid-migration leaves the previous version intact. A database whose version is newer
//! than this binary knows is refused, never "downgraded".
//!
//! The schema mirrors the SQLite one (`../sqlite/migrations.rs`) column for column: JSON is
//! kept as text (exactly as the kind wrote it, with its key order and number forms), times as
//! milliseconds since the epoch.

use deadpool_postgres::Object;

use crate::store::StoreError;

const MIGRATIONS: &[&str] = &[
    // 1: everything the SQLite schema has at its version 4.
    r#"
    CREATE FUNCTION durable_now_ms() RETURNS BIGINT LANGUAGE sql VOLATILE AS
        $$ SELECT (extract(epoch FROM clock_timestamp()) * 1000)::BIGINT $$;

    CREATE TABLE meta (
        key   TEXT PRIMARY KEY,
        value TEXT NOT NULL
    );

    CREATE TABLE tasks (
        id           TEXT PRIMARY KEY,
        kind         TEXT NOT NULL,
        owner        TEXT NOT NULL,
        params       TEXT NOT NULL,
        status       TEXT NOT NULL CHECK (status IN
                        ('pending', 'running', 'paused', 'completed', 'failed', 'cancelled')),
        progress     BIGINT NOT NULL DEFAULT 0,
        total        BIGINT NOT NULL,
        message      TEXT NOT NULL DEFAULT '',
        checkpoint   TEXT NOT NULL,
        step         BIGINT NOT NULL DEFAULT 0,
        lease        BIGINT NOT NULL DEFAULT 0,
        result       TEXT,
        error        TEXT,
        created_at   BIGINT NOT NULL,
        updated_at   BIGINT NOT NULL,
        completed_at BIGINT,
        node         TEXT,
        lease_expires_at BIGINT
    );
    CREATE INDEX tasks_by_status ON tasks (status, created_at);
    CREATE INDEX tasks_by_owner ON tasks (owner, created_at);
    CREATE INDEX tasks_by_completion ON tasks (completed_at) WHERE completed_at IS NOT NULL;

    CREATE TABLE sessions (
        id               TEXT PRIMARY KEY,
        state            TEXT NOT NULL,
        protocol_version TEXT NOT NULL,
        created_at       BIGINT NOT NULL,
        last_seen_at     BIGINT NOT NULL
    );
    CREATE INDEX sessions_by_last_seen ON sessions (last_seen_at);

    CREATE TABLE streams (
        token      TEXT PRIMARY KEY,
        stream_id  TEXT NOT NULL UNIQUE,
        session_id TEXT,
        next_seq   BIGINT NOT NULL,
        finished   BOOLEAN NOT NULL DEFAULT FALSE,
        created_at BIGINT NOT NULL
    );
    CREATE INDEX streams_by_session ON streams (session_id);

    CREATE TABLE events (
        token      TEXT NOT NULL,
        seq        BIGINT NOT NULL,
        message    TEXT,
        retry_ms   BIGINT,
        created_at BIGINT NOT NULL,
        PRIMARY KEY (token, seq)
    );
    CREATE INDEX events_by_age ON events (created_at);

    CREATE TABLE call_bindings (
        id             TEXT PRIMARY KEY,
        task_id        TEXT NOT NULL,
        session_id     TEXT NOT NULL,
        request_id     TEXT NOT NULL,
        progress_token TEXT NOT NULL,
        instance       TEXT NOT NULL,
        stream_token   TEXT,
        done           BOOLEAN NOT NULL DEFAULT FALSE,
        created_at     BIGINT NOT NULL
    );
    CREATE INDEX call_bindings_open ON call_bindings (instance) WHERE NOT done;
    CREATE INDEX call_bindings_by_session ON call_bindings (session_id);

    -- The server processes alive, renewed while they run: an open call binding whose
    -- instance is not here (or expired) lost its handler.
    CREATE TABLE instances (
        id         TEXT PRIMARY KEY,
        expires_at BIGINT NOT NULL
    );

    CREATE TABLE subscriptions (
        session_id TEXT NOT NULL,
        uri        TEXT NOT NULL,
        PRIMARY KEY (session_id, uri)
    );

    CREATE TABLE mcp_tasks (
        task_id   TEXT NOT NULL,
        requester TEXT NOT NULL,
        tool      TEXT NOT NULL,
        ttl_ms    BIGINT NOT NULL,
        PRIMARY KEY (task_id, requester)
    );
    CREATE INDEX mcp_tasks_by_requester ON mcp_tasks (requester);
    "#,
    // 2: as SQLite's version 5: held resources, unfinished tasks by owner, session subjects.
    r#"
    ALTER TABLE tasks ADD COLUMN exclusive TEXT;
    CREATE UNIQUE INDEX tasks_exclusive ON tasks (exclusive)
        WHERE exclusive IS NOT NULL AND status IN ('pending', 'running', 'paused');
    CREATE INDEX tasks_unfinished_by_owner ON tasks (owner)
        WHERE status IN ('pending', 'running', 'paused');
    CREATE TABLE session_subjects (
        session_id TEXT PRIMARY KEY,
        subject    TEXT NOT NULL
    );
    CREATE INDEX session_subjects_by_subject ON session_subjects (subject);
    "#,
    // 3: as SQLite's version 6: streams and finished call bindings by age, for pruning.
    r#"
    CREATE INDEX streams_by_age ON streams (created_at);
    CREATE INDEX call_bindings_finished ON call_bindings (created_at) WHERE done;
    "#,
    // 4: as SQLite's version 7: the call binding a POST's stream answers.
    r#"
    ALTER TABLE streams ADD COLUMN call_id TEXT;
    "#,
    // 5: as SQLite's version 8: the `input_required` status and the question asked.
    r#"
    ALTER TABLE tasks DROP CONSTRAINT tasks_status_check;
    ALTER TABLE tasks ADD CONSTRAINT tasks_status_check CHECK (status IN ('pending', 'running',
        'paused', 'input_required', 'completed', 'failed', 'cancelled'));
    ALTER TABLE tasks ADD COLUMN question TEXT;
    DROP INDEX tasks_exclusive;
    CREATE UNIQUE INDEX tasks_exclusive ON tasks (exclusive)
        WHERE exclusive IS NOT NULL
          AND status IN ('pending', 'running', 'paused', 'input_required');
    DROP INDEX tasks_unfinished_by_owner;
    CREATE INDEX tasks_unfinished_by_owner ON tasks (owner)
        WHERE status IN ('pending', 'running', 'paused', 'input_required');
    "#,
    // 6: as SQLite's version 9: the process that made a request's stream.
    r#"
    ALTER TABLE streams ADD COLUMN instance TEXT;
    "#,
];

/// The schema version this binary writes.
pub const SCHEMA_VERSION: i64 = MIGRATIONS.len() as i64;

/// Any constant works; it only has to be the same on every node.
const MIGRATION_LOCK: i64 = 0x6475_7261_626c_6500; // "durable\0"

pub async fn migrate(client: &mut Object) -> Result<(), StoreError> {
    let tx = client.transaction().await?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK])
        .await?;
    tx.batch_execute("CREATE TABLE IF NOT EXISTS durable_schema (version BIGINT NOT NULL)")
        .await?;
    let found: i64 = tx
        .query_opt("SELECT version FROM durable_schema", &[])
        .await?
        .map(|row| row.get(0))
        .unwrap_or(0);
    if found > SCHEMA_VERSION {
        return Err(StoreError::TooNew {
            found,
            supported: SCHEMA_VERSION,
        });
    }
    for (index, sql) in MIGRATIONS.iter().enumerate().skip(found as usize) {
        tx.batch_execute(sql).await?;
        tracing::info!(version = index + 1, "applied schema migration");
    }
    if found == 0 {
        tx.execute(
            "INSERT INTO durable_schema (version) VALUES ($1)",
            &[&SCHEMA_VERSION],
        )
        .await?;
    } else {
        tx.execute("UPDATE durable_schema SET version = $1", &[&SCHEMA_VERSION])
            .await?;
    }
    tx.commit().await?;
    Ok(())
}
