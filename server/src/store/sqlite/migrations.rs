//! Versioned schema migrations, tracked with `PRAGMA user_version`.
//!
//! Each entry of [`MIGRATIONS`] moves the schema one version up. All pending ones run in one
//! immediate transaction, so a crash mid-migration leaves the previous version intact. A
//! database whose version is newer than this binary knows is refused, never "downgraded".

use rusqlite::Connection;

use super::StoreError;

/// The indexes of `tasks` since version 8, made again whenever the table is rebuilt (dropping a
/// table drops its indexes). "Unfinished" is spelled with ORs, as in version 5.
macro_rules! tasks_indexes {
    () => {
        r#"
    CREATE INDEX tasks_by_status ON tasks (status, created_at);
    CREATE INDEX tasks_by_owner ON tasks (owner, created_at);
    CREATE INDEX tasks_by_completion ON tasks (completed_at) WHERE completed_at IS NOT NULL;
    CREATE UNIQUE INDEX tasks_exclusive ON tasks (exclusive)
        WHERE exclusive IS NOT NULL
          AND (status = 'pending' OR status = 'running' OR status = 'paused'
               OR status = 'input_required');
    "#
    };
}

/// The triggers of version 10 that kept each owner's count of unfinished tasks in `owner_load`,
/// made again whenever `tasks` was rebuilt (dropping a table drops its triggers), until version
/// 12 dropped them for the store's own counting.
macro_rules! owner_load_triggers {
    () => {
        r#"
    CREATE TRIGGER owner_load_counts_in AFTER INSERT ON tasks
        WHEN NEW.status = 'pending' OR NEW.status = 'running' OR NEW.status = 'paused'
          OR NEW.status = 'input_required'
    BEGIN
        INSERT INTO owner_load (owner, unfinished) VALUES (NEW.owner, 1)
            ON CONFLICT (owner) DO UPDATE SET unfinished = unfinished + 1;
    END;
    CREATE TRIGGER owner_load_counts_out AFTER DELETE ON tasks
        WHEN OLD.status = 'pending' OR OLD.status = 'running' OR OLD.status = 'paused'
          OR OLD.status = 'input_required'
    BEGIN
        UPDATE owner_load SET unfinished = unfinished - 1 WHERE owner = OLD.owner;
    END;
    CREATE TRIGGER owner_load_follows AFTER UPDATE OF status, owner ON tasks
        WHEN OLD.owner IS NOT NEW.owner
          OR (OLD.status = 'pending' OR OLD.status = 'running' OR OLD.status = 'paused'
              OR OLD.status = 'input_required')
          IS NOT (NEW.status = 'pending' OR NEW.status = 'running' OR NEW.status = 'paused'
              OR NEW.status = 'input_required')
    BEGIN
        UPDATE owner_load SET unfinished = unfinished - 1
            WHERE owner = OLD.owner
              AND (OLD.status = 'pending' OR OLD.status = 'running' OR OLD.status = 'paused'
                   OR OLD.status = 'input_required');
        INSERT INTO owner_load (owner, unfinished)
            SELECT NEW.owner, 1
            WHERE NEW.status = 'pending' OR NEW.status = 'running' OR NEW.status = 'paused'
               OR NEW.status = 'input_required'
            ON CONFLICT (owner) DO UPDATE SET unfinished = unfinished + 1;
    END;
    "#
    };
}

const MIGRATIONS: &[&str] = &[
    // 1: tasks and their checkpoints.
    r#"
    CREATE TABLE meta (
        key   TEXT PRIMARY KEY,
        value TEXT NOT NULL
    ) STRICT;

    CREATE TABLE tasks (
        id           TEXT PRIMARY KEY,
        kind         TEXT NOT NULL,
        owner        TEXT NOT NULL,
        params       TEXT NOT NULL,
        status       TEXT NOT NULL CHECK (status IN
                        ('pending', 'running', 'paused', 'completed', 'failed', 'cancelled')),
        progress     INTEGER NOT NULL DEFAULT 0,
        total        INTEGER NOT NULL,
        message      TEXT NOT NULL DEFAULT '',
        checkpoint   TEXT NOT NULL,
        step         INTEGER NOT NULL DEFAULT 0,
        lease        INTEGER NOT NULL DEFAULT 0,
        result       TEXT,
        error        TEXT,
        created_at   INTEGER NOT NULL,
        updated_at   INTEGER NOT NULL,
        completed_at INTEGER
    ) STRICT;

    CREATE INDEX tasks_by_status ON tasks (status, created_at);
    CREATE INDEX tasks_by_owner ON tasks (owner, created_at);
    CREATE INDEX tasks_by_completion ON tasks (completed_at) WHERE completed_at IS NOT NULL;
    "#,
    // 2: resumable streams: MCP sessions, SSE streams and their events, and the tool calls a
    // durable task reports to.
    r#"
    CREATE TABLE sessions (
        id               TEXT PRIMARY KEY,
        state            TEXT NOT NULL,
        protocol_version TEXT NOT NULL,
        created_at       INTEGER NOT NULL,
        last_seen_at     INTEGER NOT NULL
    ) STRICT;

    CREATE TABLE streams (
        token      TEXT PRIMARY KEY,
        stream_id  TEXT NOT NULL UNIQUE,
        session_id TEXT,
        next_seq   INTEGER NOT NULL,
        finished   INTEGER NOT NULL DEFAULT 0,
        created_at INTEGER NOT NULL
    ) STRICT;
    CREATE INDEX streams_by_session ON streams (session_id);

    CREATE TABLE events (
        token      TEXT NOT NULL,
        seq        INTEGER NOT NULL,
        message    TEXT,
        retry_ms   INTEGER,
        created_at INTEGER NOT NULL,
        PRIMARY KEY (token, seq)
    ) STRICT, WITHOUT ROWID;
    CREATE INDEX events_by_age ON events (created_at);

    CREATE TABLE call_bindings (
        id             TEXT PRIMARY KEY,
        task_id        TEXT NOT NULL,
        session_id     TEXT NOT NULL,
        request_id     TEXT NOT NULL,
        progress_token TEXT NOT NULL,
        instance       TEXT NOT NULL,
        stream_token   TEXT,
        done           INTEGER NOT NULL DEFAULT 0,
        created_at     INTEGER NOT NULL
    ) STRICT;
    CREATE INDEX call_bindings_open ON call_bindings (done, instance);

    CREATE TABLE subscriptions (
        session_id TEXT NOT NULL,
        uri        TEXT NOT NULL,
        PRIMARY KEY (session_id, uri)
    ) STRICT, WITHOUT ROWID;
    "#,
    // 3: MCP task handles: the engine tasks that task-augmented tool calls created, whose
    // call it was (a task attached to by two clients has a handle for each), the tool, and how
    // long (from the task's creation) the handle is kept.
    r#"
    CREATE TABLE mcp_tasks (
        task_id   TEXT NOT NULL,
        requester TEXT NOT NULL,
        tool      TEXT NOT NULL,
        ttl_ms    INTEGER NOT NULL,
        PRIMARY KEY (task_id, requester)
    ) STRICT, WITHOUT ROWID;
    CREATE INDEX mcp_tasks_by_requester ON mcp_tasks (requester);
    "#,
    // 4: leases: which node holds a running task, and until when (a task that was running
    // before this version has no lease, so any node may claim it).
    r#"
    ALTER TABLE tasks ADD COLUMN node TEXT;
    ALTER TABLE tasks ADD COLUMN lease_expires_at INTEGER;
    "#,
    // 5: tenants: what only one unfinished task may hold (a destination file), owners' counts
    // of unfinished tasks, and which authenticated subject each session belongs to. The
    // partial indexes spell "unfinished" with ORs: `status IN (…)` would make every UPDATE of a
    // task build an ephemeral table per index to test it (+11 % instructions per task).
    r#"
    ALTER TABLE tasks ADD COLUMN exclusive TEXT;
    CREATE UNIQUE INDEX tasks_exclusive ON tasks (exclusive)
        WHERE exclusive IS NOT NULL
          AND (status = 'pending' OR status = 'running' OR status = 'paused');
    CREATE INDEX tasks_unfinished_by_owner ON tasks (owner)
        WHERE status = 'pending' OR status = 'running' OR status = 'paused';
    CREATE TABLE session_subjects (
        session_id TEXT PRIMARY KEY,
        subject    TEXT NOT NULL
    ) STRICT, WITHOUT ROWID;
    CREATE INDEX session_subjects_by_subject ON session_subjects (subject);
    "#,
    // 6: pruning finds streams and finished call bindings by age, not by scanning.
    r#"
    CREATE INDEX streams_by_age ON streams (created_at);
    CREATE INDEX call_bindings_finished ON call_bindings (created_at) WHERE done;
    "#,
    // 7: the call binding a POST's stream answers, known before the call's first progress
    // notification. Unindexed: it is looked up only when a restart adopts a call that died in
    // that moment, and an index would cost every POST a write.
    r#"
    ALTER TABLE streams ADD COLUMN call_id TEXT;
    "#,
    // 8: tasks that wait for a person: the `input_required` status and the question asked.
    // SQLite cannot change a CHECK constraint in place, so the table is rebuilt (its indexes
    // go with it and are made again, the "unfinished" ones counting the new status).
    concat!(
        r#"
    CREATE TABLE tasks_v8 (
        id           TEXT PRIMARY KEY,
        kind         TEXT NOT NULL,
        owner        TEXT NOT NULL,
        params       TEXT NOT NULL,
        status       TEXT NOT NULL CHECK (status IN ('pending', 'running', 'paused',
                        'input_required', 'completed', 'failed', 'cancelled')),
        progress     INTEGER NOT NULL DEFAULT 0,
        total        INTEGER NOT NULL,
        message      TEXT NOT NULL DEFAULT '',
        checkpoint   TEXT NOT NULL,
        step         INTEGER NOT NULL DEFAULT 0,
        lease        INTEGER NOT NULL DEFAULT 0,
        result       TEXT,
        error        TEXT,
        created_at   INTEGER NOT NULL,
        updated_at   INTEGER NOT NULL,
        completed_at INTEGER,
        node         TEXT,
        lease_expires_at INTEGER,
        exclusive    TEXT,
        question     TEXT
    ) STRICT;
    INSERT INTO tasks_v8 (id, kind, owner, params, status, progress, total, message,
            checkpoint, step, lease, result, error, created_at, updated_at, completed_at, node,
            lease_expires_at, exclusive)
        SELECT id, kind, owner, params, status, progress, total, message, checkpoint, step,
            lease, result, error, created_at, updated_at, completed_at, node,
            lease_expires_at, exclusive
        FROM tasks;
    DROP TABLE tasks;
    ALTER TABLE tasks_v8 RENAME TO tasks;
    "#,
        tasks_indexes!(),
        r#"
    CREATE INDEX tasks_unfinished_by_owner ON tasks (owner)
        WHERE status = 'pending' OR status = 'running' OR status = 'paused'
           OR status = 'input_required';
    "#
    ),
    // 9: the process that made a request's stream, so that a resumption of a stream whose
    // handler died unanswered (and that no relay will answer) is refused instead of waiting
    // for ever.
    r#"
    ALTER TABLE streams ADD COLUMN instance TEXT;
    "#,
    // 10: each owner's count of unfinished tasks, kept by triggers, for the per-owner limit
    // that every new task is checked against. Counting the owner's rows instead cost each
    // insert a walk over all of them: under a burst of starts, thousands of pending tasks made
    // the count cost more than the rest of the start. The index that count used goes.
    // "Unfinished" is spelled with ORs, as in version 5. A task's owner never changes, and a
    // terminal status is never left, but the counts follow either should it ever happen.
    concat!(
        r#"
    CREATE TABLE owner_load (
        owner      TEXT PRIMARY KEY,
        unfinished INTEGER NOT NULL
    ) STRICT, WITHOUT ROWID;
    INSERT INTO owner_load (owner, unfinished)
        SELECT owner, count(*) FROM tasks
        WHERE status = 'pending' OR status = 'running' OR status = 'paused'
           OR status = 'input_required'
        GROUP BY owner;
    DROP INDEX tasks_unfinished_by_owner;
    "#,
        owner_load_triggers!()
    ),
    // 11: the status check spelled with ORs, as the partial indexes are (version 5): `status
    // IN (…)` made every insert of a task, and every update of its status, build and fill an
    // ephemeral table to test the new value against, three times a task (4 % of a `start_*`
    // call's instructions). SQLite cannot change a CHECK constraint in place, so the table is
    // rebuilt as in version 8; its indexes and triggers go with the old one and are made again.
    concat!(
        r#"
    CREATE TABLE tasks_v11 (
        id           TEXT PRIMARY KEY,
        kind         TEXT NOT NULL,
        owner        TEXT NOT NULL,
        params       TEXT NOT NULL,
        status       TEXT NOT NULL CHECK (status = 'pending' OR status = 'running'
                        OR status = 'paused' OR status = 'input_required'
                        OR status = 'completed' OR status = 'failed' OR status = 'cancelled'),
        progress     INTEGER NOT NULL DEFAULT 0,
        total        INTEGER NOT NULL,
        message      TEXT NOT NULL DEFAULT '',
        checkpoint   TEXT NOT NULL,
        step         INTEGER NOT NULL DEFAULT 0,
        lease        INTEGER NOT NULL DEFAULT 0,
        result       TEXT,
        error        TEXT,
        created_at   INTEGER NOT NULL,
        updated_at   INTEGER NOT NULL,
        completed_at INTEGER,
        node         TEXT,
        lease_expires_at INTEGER,
        exclusive    TEXT,
        question     TEXT
    ) STRICT;
    INSERT INTO tasks_v11 (id, kind, owner, params, status, progress, total, message,
            checkpoint, step, lease, result, error, created_at, updated_at, completed_at, node,
            lease_expires_at, exclusive, question)
        SELECT id, kind, owner, params, status, progress, total, message, checkpoint, step,
            lease, result, error, created_at, updated_at, completed_at, node,
            lease_expires_at, exclusive, question
        FROM tasks;
    DROP TABLE tasks;
    ALTER TABLE tasks_v11 RENAME TO tasks;
    "#,
        tasks_indexes!(),
        owner_load_triggers!()
    ),
    // 12: the store keeps `owner_load` itself, in the statements that insert a task or finish
    // one (`count_unfinished` in `tasks.rs`), and the triggers go. A trigger is a program run
    // for every row its table's statement writes, and it makes SQLite journal every page such a
    // statement changes, in case it must be undone halfway. Under the profile bench's
    // `start-load` (callgrind), a `start_*` call took 686,000 instructions with them and 646,000
    // without (-5.8 %). The counts they kept stay.
    r#"
    DROP TRIGGER owner_load_counts_in;
    DROP TRIGGER owner_load_counts_out;
    DROP TRIGGER owner_load_follows;
    "#,
    // 13: the counts live in the writer's memory, taken from the tasks at open (`owners.rs`),
    // and `owner_load` goes: reading and writing it cost each task's insert and last commit
    // two statements and a lookup, about 15,000 of a `start_*` call's 650,000 instructions.
    r#"
    DROP TABLE owner_load;
    "#,
];

/// The schema version this binary writes.
pub const SCHEMA_VERSION: i64 = MIGRATIONS.len() as i64;

pub fn migrate(conn: &mut Connection) -> Result<(), StoreError> {
    let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
    let found: i64 = tx.pragma_query_value(None, "user_version", |row| row.get(0))?;
    if found > SCHEMA_VERSION {
        return Err(StoreError::TooNew {
            found,
            supported: SCHEMA_VERSION,
        });
    }
    for (index, sql) in MIGRATIONS.iter().enumerate().skip(found as usize) {
        tx.execute_batch(sql)?;
        tracing::info!(version = index + 1, "applied schema migration");
    }
    tx.pragma_update(None, "user_version", SCHEMA_VERSION)?;
    tx.commit()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::sqlite::owners::{OwnerLoad, sample};

    #[test]
    fn migrating_twice_is_a_no_op() {
        let mut conn = Connection::open_in_memory().unwrap();
        migrate(&mut conn).unwrap();
        migrate(&mut conn).unwrap();
        let version: i64 = conn
            .pragma_query_value(None, "user_version", |row| row.get(0))
            .unwrap();
        assert_eq!(version, SCHEMA_VERSION);
    }

    /// The table and the triggers that kept each owner's count of unfinished tasks (versions
    /// 10 to 12) are gone once migrated, and the counts the store keeps in memory instead are
    /// those of the tasks there were (the store's contract tests and its lifecycle model test
    /// check that its writes keep them).
    #[test]
    fn owner_counts_start_from_the_tasks_there_are() {
        let mut conn = Connection::open_in_memory().unwrap();
        for sql in &MIGRATIONS[..9] {
            conn.execute_batch(sql).unwrap();
        }
        conn.pragma_update(None, "user_version", 9).unwrap();
        for (id, owner, status) in sample::TASKS {
            conn.execute(
                "INSERT INTO tasks (id, kind, owner, params, status, total, checkpoint, \
                 created_at, updated_at) VALUES (?1, 'k', ?2, '{}', ?3, 1, '{}', 0, 0)",
                [id, owner, status],
            )
            .unwrap();
        }
        migrate(&mut conn).unwrap();
        let load = OwnerLoad::load(&conn).unwrap();
        let counts = sample::UNFINISHED.map(|(owner, _)| (owner, load.committed(owner)));
        assert_eq!(counts, sample::UNFINISHED);
        let left: i64 = conn
            .query_row(
                "SELECT count(*) FROM sqlite_master WHERE type = 'trigger' \
                 OR name = 'owner_load'",
                [],
                |row| row.get(0),
            )
            .unwrap();
        assert_eq!(left, 0);
    }

    /// Version 11 keeps every row and column of the tasks it rebuilds its table for, and the
    /// check it rewrites still refuses a status that does not exist.
    #[test]
    fn rebuilding_tasks_keeps_every_row() {
        let mut conn = Connection::open_in_memory().unwrap();
        for sql in &MIGRATIONS[..10] {
            conn.execute_batch(sql).unwrap();
        }
        conn.pragma_update(None, "user_version", 10).unwrap();
        for (i, status) in [
            "pending",
            "running",
            "paused",
            "input_required",
            "completed",
            "failed",
            "cancelled",
        ]
        .into_iter()
        .enumerate()
        {
            conn.execute(
                "INSERT INTO tasks (id, kind, owner, params, status, progress, total, message, \
                 checkpoint, step, lease, result, error, created_at, updated_at, completed_at, \
                 node, lease_expires_at, exclusive, question) VALUES (?1, 'k', 'o', '{\"n\":1}', \
                 ?2, ?3, 9, 'm', '{}', ?3, 2, 'r', 'e', 1, 2, 3, 'n', 4, ?1, '{\"id\":\"q\"}')",
                rusqlite::params![format!("t{i}"), status, i as i64],
            )
            .unwrap();
        }
        let rows = |conn: &Connection| -> Vec<String> {
            let mut stmt = conn
                .prepare(
                    "SELECT json_array(id, kind, owner, params, status, progress, total, message, \
                     checkpoint, step, lease, result, error, created_at, updated_at, \
                     completed_at, node, lease_expires_at, exclusive, question) \
                     FROM tasks ORDER BY id",
                )
                .unwrap();
            let rows = stmt.query_map([], |row| row.get(0));
            rows.unwrap().map(Result::unwrap).collect()
        };
        let before = rows(&conn);
        migrate(&mut conn).unwrap();
        assert_eq!(rows(&conn), before);
        let bogus = conn.execute("UPDATE tasks SET status = 'bogus' WHERE id = 't0'", []);
        assert!(bogus.is_err(), "{bogus:?}");
    }

    /// Writing a task's status tests it against the check without building a table of the
    /// allowed values, as `status IN (...)` made SQLite do on every write.
    #[test]
    fn checking_a_status_builds_no_table() {
        let mut conn = Connection::open_in_memory().unwrap();
        migrate(&mut conn).unwrap();
        let mut stmt = conn
            .prepare("EXPLAIN UPDATE tasks SET status = 'running' WHERE id = ?1")
            .unwrap();
        let opcodes: Vec<String> = stmt
            .query_map([""], |row| row.get(1))
            .unwrap()
            .map(Result::unwrap)
            .collect();
        assert!(!opcodes.is_empty());
        assert!(
            !opcodes.iter().any(|opcode| opcode == "OpenEphemeral"),
            "{opcodes:?}"
        );
    }

    #[test]
    fn a_newer_database_is_refused_with_its_version() {
        let mut conn = Connection::open_in_memory().unwrap();
        conn.pragma_update(None, "user_version", SCHEMA_VERSION + 1)
            .unwrap();
        let err = migrate(&mut conn).unwrap_err();
        assert!(
            err.to_string().starts_with(&format!(
                "database schema version {} is newer than this binary supports ({SCHEMA_VERSION})",
                SCHEMA_VERSION + 1
            )),
            "{err}"
        );
    }
}
