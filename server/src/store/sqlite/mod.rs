//! The embedded SQLite backend, for one machine.
//!
//! Writes go through one writer thread that owns the read-write connection and commits whatever
//! is queued in one transaction (group commit): each caller is answered only after the batch
//! holding its write is durable, so nothing is announced before it is on disk, and a burst of
//! small writes costs one fsync instead of one each. Every write runs in its own savepoint, so a
//! failing write rolls back alone and does not take its batch-mates with it.
//!
//! Reads use a small pool of read-only connections on blocking threads; WAL lets them run while
//! the writer commits. Neither path ever blocks the async runtime.

mod handles;
mod migrations;
mod sessions;
mod streams;
mod tasks;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rusqlite::{Connection, OpenFlags};
use tokio::sync::oneshot;

use super::{Change, ChangeFeed, Health, StoreError};

/// Most writes one transaction takes before it commits; bounds the latency of the first writer.
const MAX_BATCH: usize = 256;

/// Prepared statements each connection keeps. rusqlite keeps 16, fewer than the writer runs
/// (some thirty, with the transaction control), so a statement evicted by the others would be
/// prepared again.
const STATEMENT_CACHE: usize = 64;

type Reply = Box<dyn FnOnce(Result<(), &Arc<StoreError>>) + Send>;
/// A queued write. It is called inside the batch's transaction, or with `None` when that
/// transaction could not even begin; either way it returns whether the write succeeded and the
/// reply to send once the batch's fate is known.
type WriteJob = Box<dyn FnOnce(Option<Batch<'_>>) -> (bool, Reply) + Send>;

/// The transaction a queued write runs in.
#[derive(Clone, Copy)]
struct Batch<'c> {
    conn: &'c Connection,
    /// Other writes share the transaction, so this one runs in its own savepoint. A write
    /// alone in its transaction needs none: if it fails, the writer rolls the transaction back,
    /// which undoes that write and nothing else. Most transactions hold a single write, and a
    /// savepoint costs two statements and a copy of every page the write changes.
    shared: bool,
}

/// The SQLite backend: its writer thread and its readers.
#[derive(Clone)]
pub struct Sqlite {
    writer: std::sync::mpsc::Sender<WriteJob>,
    readers: Arc<ReaderPool>,
    path: Arc<PathBuf>,
}

impl std::fmt::Debug for Sqlite {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sqlite").field("path", &self.path).finish()
    }
}

impl Sqlite {
    /// Opens (creating if needed) and migrates the database at `path`, and starts its writer.
    pub fn open(path: &Path) -> Result<Sqlite, StoreError> {
        let mut conn = Connection::open(path)?;
        configure(&conn)?;
        migrations::migrate(&mut conn)?;
        let (writer, jobs) = std::sync::mpsc::channel::<WriteJob>();
        std::thread::Builder::new()
            .name("store-writer".into())
            .spawn(move || write_loop(conn, jobs))
            .map_err(StoreError::WriterThread)?;
        Ok(Sqlite {
            writer,
            readers: Arc::new(ReaderPool {
                path: path.to_owned(),
                idle: Mutex::new(Vec::new()),
            }),
            path: Arc::new(path.to_owned()),
        })
    }

    /// Runs `f` inside the next group-committed transaction and returns its value once that
    /// transaction is durable.
    async fn write<T, F>(&self, f: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> Result<T, StoreError> + Send + 'static,
    {
        let (tx, rx) = oneshot::channel();
        let job: WriteJob = Box::new(move |batch| {
            let outcome = batch.map(|batch| match batch.shared {
                true => in_savepoint(batch.conn, f),
                false => f(batch.conn),
            });
            let succeeded = matches!(outcome, Some(Ok(_)));
            let reply = Box::new(move |commit: Result<(), &Arc<StoreError>>| {
                let reply = match (outcome, commit) {
                    (Some(Err(e)), _) => Err(e),
                    (Some(Ok(value)), Ok(())) => Ok(value),
                    (_, Err(e)) => Err(StoreError::Commit(e.clone())),
                    // The writer calls a job without a connection only with an error; were it
                    // ever otherwise, the write did not happen.
                    (None, Ok(())) => Err(StoreError::Closed),
                };
                let _ = tx.send(reply);
            });
            (succeeded, reply as Reply)
        });
        self.writer.send(job).map_err(|_| StoreError::Closed)?;
        rx.await.map_err(|_| StoreError::Closed)?
    }

    /// Runs `f` on a read-only connection on a blocking thread.
    async fn read<T, F>(&self, f: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> Result<T, StoreError> + Send + 'static,
    {
        let readers = self.readers.clone();
        tokio::task::spawn_blocking(move || {
            let conn = readers.take()?;
            let result = f(&conn);
            readers.put(conn);
            result
        })
        .await
        .map_err(|_| StoreError::Closed)?
    }
}

#[async_trait::async_trait]
impl Health for Sqlite {
    async fn round_trip(&self) -> Result<(), StoreError> {
        let one =
            |conn: &Connection| Ok(conn.query_row("SELECT 1", [], |row| row.get::<_, i64>(0))?);
        self.write(one).await?;
        self.read(one).await?;
        Ok(())
    }
}

impl ChangeFeed for Sqlite {
    fn changes(&self) -> Option<tokio::sync::broadcast::Receiver<Change>> {
        None
    }
}

fn configure(conn: &Connection) -> Result<(), StoreError> {
    // WAL lets readers run during a write; FULL makes each commit survive power loss, not just a
    // process crash. Both are connection settings, so they live here, not in a migration.
    conn.pragma_update(None, "journal_mode", "WAL")?;
    conn.pragma_update(None, "synchronous", "FULL")?;
    conn.pragma_update(None, "foreign_keys", true)?;
    conn.busy_timeout(Duration::from_secs(5))?;
    keep_plans(conn)
}

/// Makes the statements `prepare_cached` keeps worth keeping, on every connection.
///
/// SQLite marks a statement for re-planning when a bound value might change its plan (a
/// `LIMIT ?`, an `ORDER BY` next to `col = ?`, most joins), and then parses it again whenever
/// its bindings are cleared, which rusqlite's cache does each time a statement is returned to
/// it: the cached task-handle lookup was parsed afresh on every call, a third of the
/// instructions of a `start_*` call. The query planner stability guarantee makes plans
/// independent of bound values, which costs nothing here: the store keeps no statistics that a
/// value could refine a plan with.
fn keep_plans(conn: &Connection) -> Result<(), StoreError> {
    conn.set_db_config(
        rusqlite::config::DbConfig::SQLITE_DBCONFIG_ENABLE_QPSG,
        true,
    )?;
    conn.set_prepared_statement_cache_capacity(STATEMENT_CACHE);
    Ok(())
}

/// Runs one statement that returns no rows through the connection's statement cache. The
/// writer's transaction control (`BEGIN`, `COMMIT`, the savepoint around every write) runs this
/// way, so that it is parsed once per connection rather than at every write, as
/// `execute_batch` did.
fn run_cached(conn: &Connection, sql: &str) -> rusqlite::Result<()> {
    conn.prepare_cached(sql)?.execute([])?;
    Ok(())
}

fn in_savepoint<T>(
    conn: &Connection,
    f: impl FnOnce(&Connection) -> Result<T, StoreError>,
) -> Result<T, StoreError> {
    run_cached(conn, "SAVEPOINT job")?;
    match f(conn) {
        Ok(value) => {
            run_cached(conn, "RELEASE job")?;
            Ok(value)
        }
        Err(e) => {
            run_cached(conn, "ROLLBACK TO job")?;
            run_cached(conn, "RELEASE job")?;
            Err(e)
        }
    }
}

fn write_loop(conn: Connection, jobs: std::sync::mpsc::Receiver<WriteJob>) {
    while let Ok(first) = jobs.recv() {
        let mut batch = vec![first];
        while batch.len() < MAX_BATCH {
            match jobs.try_recv() {
                Ok(job) => batch.push(job),
                Err(_) => break,
            }
        }
        let begun = run_cached(&conn, "BEGIN IMMEDIATE").map_err(|e| Arc::new(StoreError::from(e)));
        if let Err(e) = begun {
            tracing::error!(error = %e, "cannot begin a write transaction");
            for job in batch {
                job(None).1(Err(&e));
            }
            continue;
        }
        let shared = batch.len() > 1;
        let mut succeeded = true;
        let replies: Vec<Reply> = batch
            .into_iter()
            .map(|job| {
                let (ok, reply) = job(Some(Batch {
                    conn: &conn,
                    shared,
                }));
                succeeded &= ok;
                reply
            })
            .collect();
        let committed = if shared || succeeded {
            run_cached(&conn, "COMMIT").map_err(|e| Arc::new(StoreError::from(e)))
        } else {
            // The only write failed: rolling the transaction back undoes it, and its caller
            // gets the write's own error.
            if let Err(e) = run_cached(&conn, "ROLLBACK") {
                tracing::error!(error = %e, "cannot roll back a failed write");
            }
            Ok(())
        };
        if let Err(e) = &committed {
            tracing::error!(error = %e, "group commit failed");
            let _ = conn.execute_batch("ROLLBACK");
        }
        for reply in replies {
            reply(committed.as_ref().map(|_| ()));
        }
    }
}

struct ReaderPool {
    path: PathBuf,
    idle: Mutex<Vec<Connection>>,
}

impl ReaderPool {
    fn take(&self) -> Result<Connection, StoreError> {
        if let Some(conn) = self.idle.lock().expect("reader pool lock").pop() {
            return Ok(conn);
        }
        let conn = Connection::open_with_flags(
            &self.path,
            OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )?;
        conn.busy_timeout(Duration::from_secs(5))?;
        keep_plans(&conn)?;
        Ok(conn)
    }

    fn put(&self, conn: Connection) {
        let mut idle = self.idle.lock().expect("reader pool lock");
        // A handful of connections covers the blocking pool's useful parallelism on this
        // workload; extra ones are closed rather than hoarded.
        if idle.len() < 8 {
            idle.push(conn);
        }
    }
}

#[cfg(test)]
mod tests {
    use rusqlite::StatementStatus;

    use super::*;

    /// The cached task-handle lookup was parsed afresh on every call: SQLite re-plans a statement
    /// whose plan may depend on a bound value (here its `LIMIT ?`) each time rusqlite's cache
    /// clears its bindings, unless the connection is set up by `keep_plans`.
    #[test]
    fn cached_statements_are_not_parsed_again() {
        let conn = Connection::open_in_memory().unwrap();
        keep_plans(&conn).unwrap();
        conn.execute_batch("CREATE TABLE t (a INTEGER PRIMARY KEY, b TEXT)")
            .unwrap();
        const SQL: &str = "SELECT a FROM t WHERE b = ?1 ORDER BY a LIMIT ?2";
        for limit in 1..4 {
            let mut stmt = conn.prepare_cached(SQL).unwrap();
            let rows = stmt
                .query_map(rusqlite::params!["x", limit], |row| row.get::<_, i64>(0))
                .unwrap();
            assert_eq!(rows.count(), 0);
        }
        let stmt = conn.prepare_cached(SQL).unwrap();
        assert_eq!(stmt.get_status(StatementStatus::RePrepare), 0);
    }
}
