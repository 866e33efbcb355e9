//! The embedded SQLite backend, for one machine.
//!
//! Writes go through one writer thread that owns the read-write connection and commits whatever
//! is queued in one transaction (group commit): each caller is answered only after the batch
//! holding its write is durable, so nothing is announced before it is on disk, and a burst of
//! small writes costs one fsync instead of one each. A failing write rolls back alone and does
//! not take its batch-mates with it: by its own savepoint, or, for the writes that decide every
//! refusal before their first change (most of the hot ones), by SQLite's undo of the statement
//! that failed (see [`Undo`]).
//!
//! The events of a request's stream are queued instead (see [`StreamRepo::queue_event`]): a
//! session's rmcp worker stores its requests' events one after another, and waiting for each
//! one's fsync let a session's 32 requests in flight share a transaction with nobody but other
//! sessions. Their ids are handed out as they are queued, which only this process can do, since
//! only its writer writes these streams; the HTTP layer holds each frame back until
//! [`Sqlite::fence`] says that everything queued before it is durable.
//!
//! Reads use a small pool of read-only connections on blocking threads; WAL lets them run while
//! the writer commits. Neither path ever blocks the async runtime.

mod handles;
mod migrations;
mod owners;
mod progress;
mod sessions;
mod streams;
mod tasks;

use std::collections::HashMap;
use std::panic::AssertUnwindSafe;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rusqlite::{Connection, OpenFlags};
use tokio::sync::{mpsc, oneshot};

use self::owners::OwnerLoad;
use self::progress::Progress;
use super::{Change, ChangeFeed, Health, PRUNE_BATCH, StoreError};
use crate::telemetry;

/// Most writes one transaction takes before it commits; bounds the latency of the first writer.
const MAX_BATCH: usize = 256;

/// Prepared statements each connection keeps. rusqlite keeps 16, fewer than the writer runs
/// (some thirty, with the transaction control), so a statement evicted by the others would be
/// prepared again.
const STATEMENT_CACHE: usize = 64;

/// How many writes may wait for the writer, and how long a caller waits for a place among them
/// before it is told the store is busy. A full queue means the disk cannot keep up: waiting
/// callers slow their clients down instead of queueing without bound.
#[derive(Debug, Clone, Copy)]
pub struct WriteQueue {
    pub capacity: usize,
    pub wait: Duration,
}

impl Default for WriteQueue {
    fn default() -> Self {
        WriteQueue {
            capacity: 4096,
            wait: Duration::from_secs(5),
        }
    }
}

type Reply = Box<dyn FnOnce(Result<(), &Arc<StoreError>>) + Send>;
/// A queued write. It is called inside the batch's transaction, or with `None` when that
/// transaction could not even begin; either way it returns what it did and the reply to send
/// once the batch's fate is known.
type WriteJob = Box<dyn FnOnce(Option<Batch<'_>>) -> (Ran, Reply) + Send>;

/// What a write did to the transaction it ran in.
#[derive(Clone, Copy, PartialEq)]
enum Ran {
    Applied,
    /// It failed, leaving the transaction as it found it.
    Failed,
    /// It failed after changing the database, without a savepoint that could undo its changes
    /// alone: only rolling the whole transaction back can.
    FailedMidway,
}

impl Ran {
    /// What a write that returned `outcome`, having `changed` the database or not, did.
    fn of<T>(outcome: &Result<T, StoreError>, changed: bool) -> Ran {
        match (outcome, changed) {
            (Ok(_), _) => Ran::Applied,
            (Err(_), false) => Ran::Failed,
            (Err(_), true) => Ran::FailedMidway,
        }
    }
}

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

/// How a write that fails is undone when other writes share its transaction.
#[derive(Clone, Copy, PartialEq)]
enum Undo {
    /// By its own savepoint: the write runs several statements that change the database, and
    /// a later one failing must take the earlier ones with it.
    Savepoint,
    /// By SQLite itself: the write checks everything that could refuse it before its first
    /// change, so that no statement after that one can fail but as the whole transaction does
    /// (a full disk, say). A statement that fails undoes what it did and leaves the transaction
    /// as it was, so the savepoint (two more statements, and a copy of every page the write
    /// changes) would buy nothing. Should such a write fail midway all the same, the writer
    /// sees that it changed the database and rolls the whole batch back (see [`Ran`]).
    Statement,
}

/// The SQLite backend: its writer thread and its readers.
#[derive(Clone)]
pub struct Sqlite {
    writer: mpsc::Sender<WriteJob>,
    /// Writes placed in the writer's queue so far, counted as each is placed.
    placed: Arc<Mutex<u64>>,
    /// Writes the writer has finished so far, and who waits for more; should the writer end,
    /// nobody waits on it for ever.
    progress: Arc<Mutex<Progress>>,
    queue_wait: Duration,
    readers: Arc<ReaderPool>,
    /// The request streams whose events are queued (see [`Sqlite::queue_event`]).
    live: Arc<Mutex<LiveStreams>>,
    /// Each owner's count of unfinished tasks, which the writer keeps (see `owners`).
    owners: Arc<OwnerLoad>,
    path: Arc<PathBuf>,
}

/// The next event id of each request stream whose events this process queues, until its final
/// response. A stream whose request was cancelled or whose session closed never gets one: it
/// is forgotten once idle for [`LIVE_STREAM_IDLE`].
#[derive(Default)]
struct LiveStreams {
    streams: HashMap<String, LiveStream>,
    /// The streams whose priming event went unstored, by token: the first write that names
    /// one makes its row (see `streams::queue_event`), the record of its session (usual) or
    /// its next event, whichever the writer runs first. An entry is taken on the writer's
    /// thread, so that whichever write comes second finds the row made.
    unborn: HashMap<String, Unborn>,
    swept: Option<Instant>,
}

/// A request stream that has a token, and has sent its priming event under it, but no row yet.
struct Unborn {
    stream_id: String,
    since: Instant,
}

struct LiveStream {
    token: String,
    next_seq: u64,
    touched: Instant,
}

/// How long a request stream may go without an event before [`LiveStreams`] forgets it. Its
/// next event, if one ever comes, fails to append (its id would be another stream's) and goes
/// out unstored, as any event the store refuses.
const LIVE_STREAM_IDLE: Duration = Duration::from_secs(3600);

impl LiveStreams {
    /// The id of the next event of stream `stream_id`, the first of a new stream if unknown.
    fn next(&mut self, stream_id: &str, finishes: bool) -> (String, u64) {
        let now = Instant::now();
        if self
            .swept
            .is_none_or(|swept| now.duration_since(swept) > LIVE_STREAM_IDLE / 60)
        {
            self.streams
                .retain(|_, stream| now.duration_since(stream.touched) < LIVE_STREAM_IDLE);
            // A request whose stream got neither a session nor a second event (it was
            // cancelled before either) leaves its entry behind.
            self.unborn
                .retain(|_, unborn| now.duration_since(unborn.since) < LIVE_STREAM_IDLE);
            self.swept = Some(now);
        }
        let stream = self
            .streams
            .entry(stream_id.to_owned())
            .or_insert_with(|| LiveStream {
                token: super::new_stream_token(),
                next_seq: 1,
                touched: now,
            });
        let id = (stream.token.clone(), stream.next_seq);
        stream.next_seq += 1;
        stream.touched = now;
        if finishes {
            self.streams.remove(stream_id);
        }
        id
    }
}

impl std::fmt::Debug for Sqlite {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sqlite").field("path", &self.path).finish()
    }
}

impl Sqlite {
    /// Opens (creating if needed) and migrates the database at `path`, and starts its writer.
    pub fn open(path: &Path, queue: WriteQueue) -> Result<Sqlite, StoreError> {
        let mut conn = Connection::open(path)?;
        configure(&conn)?;
        migrations::migrate(&mut conn)?;
        let owners = Arc::new(OwnerLoad::load(&conn)?);
        let (writer, jobs) = mpsc::channel::<WriteJob>(queue.capacity);
        let progress = Arc::<Mutex<Progress>>::default();
        let writer_progress = WriterProgress(progress.clone());
        let writer_owners = owners.clone();
        std::thread::Builder::new()
            .name("store-writer".into())
            .spawn(move || write_loop(conn, jobs, writer_progress, &writer_owners))
            .map_err(StoreError::WriterThread)?;
        Ok(Sqlite {
            writer,
            placed: Arc::default(),
            progress,
            queue_wait: queue.wait,
            readers: Arc::new(ReaderPool {
                path: path.to_owned(),
                idle: Mutex::new(Vec::new()),
            }),
            live: Arc::default(),
            owners,
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
        self.write_as(Undo::Savepoint, f).await
    }

    /// [`Sqlite::write`] for an `f` that needs no savepoint: nothing after its first change
    /// can fail (see [`Undo::Statement`]). What it reads back it returns as stored, for the
    /// caller to parse after the write.
    async fn write_statement<T, F>(&self, f: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> Result<T, StoreError> + Send + 'static,
    {
        self.write_as(Undo::Statement, f).await
    }

    async fn write_as<T, F>(&self, undo: Undo, f: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> Result<T, StoreError> + Send + 'static,
    {
        let (tx, rx) = oneshot::channel();
        self.queue(undo, f, move |outcome| {
            let _ = tx.send(outcome);
        })
        .await?;
        // The writer drops a job's reply unsent only when the job panicked.
        rx.await.map_err(|_| StoreError::Aborted)?
    }

    /// Places `f` in the writer's queue and returns; `answer` gets its outcome once the
    /// transaction that ran it is durable (or failed), on the writer's thread. It is never
    /// called if `f` panics.
    async fn queue<T, F>(
        &self,
        undo: Undo,
        f: F,
        answer: impl FnOnce(Result<T, StoreError>) + Send + 'static,
    ) -> Result<(), StoreError>
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> Result<T, StoreError> + Send + 'static,
    {
        let job: WriteJob = Box::new(move |batch| {
            let (ran, outcome) = match batch {
                None => (Ran::Failed, None),
                Some(batch) if batch.shared && undo == Undo::Savepoint => {
                    let outcome = in_savepoint(batch.conn, f);
                    (Ran::of(&outcome, false), Some(outcome))
                }
                Some(batch) => {
                    // Rows changed by statements that went through: a statement that failed
                    // counts none.
                    let before = batch.conn.total_changes();
                    let outcome = f(batch.conn);
                    let changed = batch.conn.total_changes() != before;
                    (Ran::of(&outcome, changed), Some(outcome))
                }
            };
            let reply = Box::new(move |commit: Result<(), &Arc<StoreError>>| {
                answer(match (outcome, commit) {
                    (Some(Err(e)), _) => Err(e),
                    (Some(Ok(value)), Ok(())) => Ok(value),
                    (_, Err(e)) => Err(StoreError::Commit(e.clone())),
                    // The writer calls a job without a connection only with an error; were it
                    // ever otherwise, the write did not happen.
                    (None, Ok(())) => Err(StoreError::Closed),
                });
            });
            (ran, reply as Reply)
        });
        let place = match tokio::time::timeout(self.queue_wait, self.writer.reserve()).await {
            Ok(place) => place.map_err(|_| StoreError::Closed)?,
            Err(_) => {
                return Err(StoreError::Busy {
                    queued: self.queued(),
                });
            }
        };
        // Counted and placed under one lock, so that the writer takes jobs in the order they
        // were counted (see `Progress`).
        let mut placed = self.placed.lock().expect("placed lock");
        *placed += 1;
        place.send(job);
        Ok(())
    }

    /// Returns once every write placed before the call is done (durable, or failed).
    async fn fence(&self) {
        let placed = *self.placed.lock().expect("placed lock");
        let waiting = self
            .progress
            .lock()
            .expect("progress lock")
            .wait_for(placed);
        if let Some(woken) = waiting {
            // An error means the writer has ended: nothing more will become durable.
            let _ = woken.await;
        }
    }

    /// Runs `sql`, a DELETE of at most `?2` rows among those older than `?1`, in one
    /// transaction after another until one deletes fewer: other writes queue between them.
    /// Returns the rows deleted and the transactions taken.
    async fn delete_in_batches(
        &self,
        sql: &'static str,
        cutoff: i64,
    ) -> Result<(u64, u64), StoreError> {
        let (mut deleted, mut batches) = (0, 0);
        loop {
            let batch = self
                .write(move |conn| {
                    Ok(conn
                        .prepare_cached(sql)?
                        .execute(rusqlite::params![cutoff, PRUNE_BATCH as i64])?
                        as u64)
                })
                .await?;
            deleted += batch;
            batches += 1;
            if batch < PRUNE_BATCH as u64 {
                return Ok((deleted, batches));
            }
        }
    }

    /// Writes waiting for the writer.
    pub fn queued(&self) -> usize {
        self.writer.max_capacity() - self.writer.capacity()
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
    conn.busy_timeout(LOCK_WAIT)?;
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

/// How long a write waits for a lock held by another process before it fails.
const LOCK_WAIT: Duration = Duration::from_secs(5);
/// The same while the database is known to be locked: each batch would otherwise wait the whole
/// [`LOCK_WAIT`] before failing, one after another, and a request whose answer needs a few
/// writes would wait many times that. Every batch still tries, so the first one after the
/// lock's release succeeds and restores the full wait.
const LOCK_WAIT_WHILE_LOCKED: Duration = Duration::from_millis(100);

/// The writer's hold on [`Progress`]: it reports each batch finished, and lets every waiter go
/// when the writer ends, however it ends.
struct WriterProgress(Arc<Mutex<Progress>>);

impl WriterProgress {
    fn advance(&self, writes: u64) {
        self.0.lock().expect("progress lock").advance(writes);
    }
}

impl Drop for WriterProgress {
    fn drop(&mut self) {
        // Even poisoned: the waiters must be let go.
        let mut progress = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        progress.end();
    }
}

fn write_loop(
    conn: Connection,
    mut jobs: mpsc::Receiver<WriteJob>,
    progress: WriterProgress,
    owners: &OwnerLoad,
) {
    let mut locked = false;
    while let Some(first) = jobs.blocking_recv() {
        let mut batch = vec![first];
        while batch.len() < MAX_BATCH {
            match jobs.try_recv() {
                Ok(job) => batch.push(job),
                Err(_) => break,
            }
        }
        let size = batch.len() as u64;
        metrics::histogram!(telemetry::STORE_BATCH_WRITES).record(size as f64);
        metrics::gauge!(telemetry::STORE_WRITE_QUEUE).set(jobs.len() as f64);
        // A panic outside the writes themselves (none is known) must not end the writer either:
        // every later write would fail while the process went on answering.
        let begun = std::panic::catch_unwind(AssertUnwindSafe(|| commit(&conn, batch, owners)));
        progress.advance(size);
        match begun {
            Ok(Begun::Locked) if !locked => {
                tracing::error!(
                    "the database is locked by another process; writes fail (as busy) until it \
                     releases the lock"
                );
                locked = true;
                let _ = conn.busy_timeout(LOCK_WAIT_WHILE_LOCKED);
            }
            Ok(Begun::Yes) if locked => {
                tracing::info!("the database's lock was released; writes go on");
                locked = false;
                let _ = conn.busy_timeout(LOCK_WAIT);
            }
            Ok(_) => {}
            Err(panic) => {
                tracing::error!(
                    panic = panic_message(&*panic),
                    "the store's writer panicked; its batch is rolled back and the writer goes on"
                );
                if !conn.is_autocommit() {
                    let _ = conn.execute_batch("ROLLBACK");
                }
                owners.settle(false);
            }
        }
    }
}

/// Whether a batch's transaction began.
#[derive(PartialEq)]
enum Begun {
    Yes,
    /// No: another process holds the database's lock.
    Locked,
    /// No, for another reason.
    No,
}

/// Runs `batch` in one transaction and answers each write once its fate is known. The owners'
/// counts follow the tasks: a write undone alone takes its changes to them with it, and the
/// batch's changes count once it commits.
fn commit(conn: &Connection, batch: Vec<WriteJob>, owners: &OwnerLoad) -> Begun {
    if let Err(e) = run_cached(conn, "BEGIN IMMEDIATE") {
        let locked = matches!(
            e.sqlite_error_code(),
            Some(rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked)
        );
        let e = Arc::new(StoreError::from(e));
        if !locked {
            tracing::error!(error = %e, "cannot begin a write transaction");
        }
        for job in batch {
            job(None).1(Err(&e));
        }
        return if locked { Begun::Locked } else { Begun::No };
    }
    let shared = batch.len() > 1;
    let mut succeeded = true;
    let mut undone = Ok(());
    let mut replies: Vec<Reply> = Vec::with_capacity(batch.len());
    for job in batch {
        // A write failed midway: the batch is rolled back whole, and the writes after it
        // are not run.
        if undone.is_err() {
            replies.push(job(None).1);
            continue;
        }
        let mark = owners.mark();
        let ran = std::panic::catch_unwind(AssertUnwindSafe(|| job(Some(Batch { conn, shared }))));
        if !matches!(ran, Ok((Ran::Applied, _))) {
            owners.undo_to(mark);
        }
        match ran {
            Ok((ran, reply)) => {
                succeeded &= ran == Ran::Applied;
                if ran == Ran::FailedMidway && shared {
                    tracing::error!(
                        "a write failed after changing the database; its batch is undone"
                    );
                    undone = Err(StoreError::Undone);
                }
                replies.push(reply);
            }
            Err(panic) => {
                // The job's reply went down with it: its caller learns `Aborted`. What it wrote
                // is undone: its savepoint, or (alone) the whole transaction below. A write
                // that has no savepoint (`Undo::Statement`) makes `ROLLBACK TO` fail, and then
                // nothing of the batch is kept.
                tracing::error!(
                    panic = panic_message(&*panic),
                    "a write panicked; it is undone and its caller told"
                );
                metrics::counter!(telemetry::STORE_WRITER_PANICS).increment(1);
                succeeded = false;
                if shared && undone.is_ok() {
                    undone = run_cached(conn, "ROLLBACK TO job")
                        .and_then(|()| run_cached(conn, "RELEASE job"))
                        .map_err(StoreError::from);
                }
            }
        }
    }
    let committed = match undone {
        // What a write that panicked or failed midway left behind could not be undone alone:
        // nothing of the batch is kept.
        Err(e) => {
            let _ = conn.execute_batch("ROLLBACK");
            Err(Arc::new(e))
        }
        Ok(()) if shared || succeeded => {
            run_cached(conn, "COMMIT").map_err(|e| Arc::new(StoreError::from(e)))
        }
        Ok(()) => {
            // The only write failed: rolling the transaction back undoes it, and its caller
            // gets the write's own error.
            if let Err(e) = run_cached(conn, "ROLLBACK") {
                tracing::error!(error = %e, "cannot roll back a failed write");
            }
            Ok(())
        }
    };
    if let Err(e) = &committed {
        tracing::error!(error = e.with_causes(), "group commit failed");
        if !conn.is_autocommit() {
            let _ = conn.execute_batch("ROLLBACK");
        }
    }
    owners.settle(committed.is_ok());
    for reply in replies {
        reply(committed.as_ref().map(|_| ()));
    }
    Begun::Yes
}

/// The text a panic was raised with.
fn panic_message(panic: &(dyn std::any::Any + Send)) -> &str {
    panic
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| panic.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("a panic without a message")
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
        conn.busy_timeout(LOCK_WAIT)?;
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

    fn open(dir: &tempfile::TempDir, queue: WriteQueue) -> Sqlite {
        Sqlite::open(&dir.path().join("t.db"), queue).unwrap()
    }

    /// A write that stores `key` in the `meta` table, then panics if asked to.
    fn insert(
        store: &Sqlite,
        key: &str,
        panics: bool,
    ) -> impl Future<Output = Result<(), StoreError>> + use<> {
        let store = store.clone();
        let key = key.to_owned();
        async move {
            store
                .write(move |conn| {
                    conn.execute("INSERT INTO meta (key, value) VALUES (?1, 'v')", [&key])?;
                    assert!(!panics, "the write of {key} panics");
                    Ok(())
                })
                .await
        }
    }

    async fn keys(store: &Sqlite) -> Vec<String> {
        store
            .read(|conn| {
                let mut stmt =
                    conn.prepare("SELECT key FROM meta WHERE value = 'v' ORDER BY key")?;
                let keys = stmt.query_map([], |row| row.get(0))?;
                Ok(keys.collect::<Result<_, _>>()?)
            })
            .await
            .unwrap()
    }

    /// Queues a write that, once the writer runs it, signals `started` and holds its
    /// transaction open until the returned sender is dropped.
    fn holding_write(
        store: &Sqlite,
    ) -> (
        tokio::task::JoinHandle<Result<(), StoreError>>,
        oneshot::Receiver<()>,
        std::sync::mpsc::Sender<()>,
    ) {
        let (release, held) = std::sync::mpsc::channel::<()>();
        let (started, running) = oneshot::channel();
        let holder = store.clone();
        let write = tokio::spawn(async move {
            holder
                .write(move |_| {
                    let _ = started.send(());
                    let _ = held.recv();
                    Ok(())
                })
                .await
        });
        (write, running, release)
    }

    /// Returns once `writes` writes wait for the writer; panics after a while.
    async fn until_queued(store: &Sqlite, writes: usize) {
        let queued = async {
            while store.queued() < writes {
                tokio::task::yield_now().await;
            }
        };
        tokio::time::timeout(Duration::from_secs(10), queued)
            .await
            .unwrap_or_else(|_| panic!("{writes} writes never queued"));
    }

    /// Holds the writer inside a write until the returned sender is dropped.
    async fn hold_writer(store: &Sqlite) -> std::sync::mpsc::Sender<()> {
        let (_, running, release) = holding_write(store);
        running.await.unwrap();
        release
    }

    /// Writes that queue while the writer is busy commit together: while the last of them
    /// holds the transaction open, none of the others is answered or visible to readers (one
    /// transaction each, they would be). A failing write among them is rolled back alone.
    #[tokio::test]
    async fn queued_writes_share_one_transaction_and_a_failing_one_rolls_back_alone() {
        let dir = tempfile::tempdir().unwrap();
        let store = open(&dir, WriteQueue::default());
        let release = hold_writer(&store).await;
        let mut writes: Vec<_> = (0..40)
            .map(|i| tokio::spawn(insert(&store, &format!("k{i:02}"), false)))
            .collect();
        writes.push(tokio::spawn({
            let store = store.clone();
            async move {
                store
                    .write(|conn| {
                        conn.execute("INSERT INTO meta (key, value) VALUES ('bad', 'v')", [])?;
                        conn.execute("INSERT INTO meta (key, value) VALUES ('bad', 'v')", [])?;
                        Ok(())
                    })
                    .await
            }
        }));
        until_queued(&store, writes.len()).await;
        // The last write of the batch waits until told, keeping its transaction open.
        let (last, running, finish) = holding_write(&store);
        until_queued(&store, writes.len() + 1).await;
        drop(release);
        running.await.unwrap();
        let answered = writes.iter().filter(|write| write.is_finished()).count();
        assert_eq!(answered, 0, "answered before their transaction committed");
        assert!(keys(&store).await.is_empty(), "visible before the commit");

        drop(finish);
        last.await.unwrap().unwrap();
        let outcomes: Vec<_> = futures::future::join_all(writes).await;
        let failed: Vec<usize> = (0..outcomes.len())
            .filter(|&i| outcomes[i].as_ref().unwrap().is_err())
            .collect();
        assert_eq!(failed, [40], "only the failing write fails");
        let expected: Vec<String> = (0..40).map(|i| format!("k{i:02}")).collect();
        assert_eq!(
            keys(&store).await,
            expected,
            "the failing write left nothing"
        );
    }

    /// One panicking write among others of its transaction is undone alone: its caller is told,
    /// its batch-mates commit, and the writer goes on serving (as it does after a panicking
    /// write alone in its transaction).
    #[tokio::test]
    async fn a_panicking_write_is_undone_alone_and_the_writer_goes_on() {
        let dir = tempfile::tempdir().unwrap();
        let store = open(&dir, WriteQueue::default());
        let release = hold_writer(&store).await;
        let writes = [("a", false), ("p", true), ("b", false)]
            .map(|(key, panics)| tokio::spawn(insert(&store, key, panics)));
        // The three wait behind the held write, so they share the next transaction.
        until_queued(&store, 3).await;
        drop(release);
        let outcomes = futures::future::join_all(writes).await;
        let outcomes: Vec<_> = outcomes.into_iter().map(|o| o.unwrap()).collect();
        assert!(outcomes[0].is_ok() && outcomes[2].is_ok(), "{outcomes:?}");
        assert!(
            matches!(outcomes[1], Err(StoreError::Aborted)),
            "{outcomes:?}"
        );
        assert_eq!(keys(&store).await, ["a", "b"]);

        let alone = insert(&store, "q", true).await;
        assert!(matches!(alone, Err(StoreError::Aborted)), "{alone:?}");
        insert(&store, "c", false).await.unwrap();
        assert_eq!(keys(&store).await, ["a", "b", "c"]);
        store.round_trip().await.unwrap();
    }

    /// A write undone by its statement (`Undo::Statement`, here a task insert) that fails
    /// among others of its transaction leaves nothing behind, not even in its owner's count,
    /// and its batch-mates commit.
    #[tokio::test]
    async fn a_failing_statement_write_is_undone_alone() {
        use crate::store::TaskRepo;
        use crate::store::tests::new_task;

        let deadline = Duration::from_secs(10);
        let dir = tempfile::tempdir().unwrap();
        let store = open(&dir, WriteQueue::default());
        store.insert_task(new_task("a")).await.unwrap();
        let release = hold_writer(&store).await;
        let inserts = ["b", "a", "c"].map(|id| {
            let store = store.clone();
            tokio::spawn(async move { store.insert_task(new_task(id)).await })
        });
        until_queued(&store, 3).await;
        drop(release);
        let outcomes = tokio::time::timeout(deadline, futures::future::join_all(inserts))
            .await
            .unwrap();
        let failed: Vec<bool> = outcomes
            .iter()
            .map(|o| o.as_ref().unwrap().is_err())
            .collect();
        assert_eq!(failed, [false, true, false], "only the taken id fails");
        let mut ids: Vec<String> = store
            .list_tasks(None, None, None, 10)
            .await
            .unwrap()
            .into_iter()
            .map(|task| task.task_id)
            .collect();
        ids.sort();
        assert_eq!(ids, ["a", "b", "c"]);
        assert_eq!(store.unfinished_tasks_of("o").await.unwrap(), 3);
    }

    /// A write without a savepoint that fails after changing the database (which its rule,
    /// `Undo::Statement`, says cannot happen) takes its whole batch with it: nothing of what it
    /// changed is kept (a task a batch-mate stored is not counted either), its batch-mates are
    /// told, and the writer goes on.
    #[tokio::test]
    async fn a_statement_write_failing_midway_undoes_its_batch() {
        use crate::store::TaskRepo;
        use crate::store::tests::new_task;

        let deadline = Duration::from_secs(10);
        let dir = tempfile::tempdir().unwrap();
        let store = open(&dir, WriteQueue::default());
        let release = hold_writer(&store).await;
        // The task is stored first in the batch, before the write that fails.
        let before = {
            let store = store.clone();
            tokio::spawn(async move { store.insert_task(new_task("t")).await.map(drop) })
        };
        until_queued(&store, 1).await;
        let midway = {
            let store = store.clone();
            tokio::spawn(async move {
                store
                    .write_statement(|conn| {
                        conn.execute("INSERT INTO meta (key, value) VALUES ('m', 'v')", [])?;
                        conn.execute("INSERT INTO meta (key, value) VALUES ('m', 'v')", [])?;
                        Ok(())
                    })
                    .await
            })
        };
        until_queued(&store, 2).await;
        let after = tokio::spawn(insert(&store, "b", false));
        until_queued(&store, 3).await;
        drop(release);
        let midway = tokio::time::timeout(deadline, midway)
            .await
            .unwrap()
            .unwrap();
        assert!(matches!(midway, Err(StoreError::Sqlite(_))), "{midway:?}");
        for mate in [before, after] {
            let told = tokio::time::timeout(deadline, mate).await.unwrap().unwrap();
            assert!(
                matches!(&told, Err(StoreError::Commit(cause)) if matches!(**cause, StoreError::Undone)),
                "{told:?}"
            );
        }
        assert!(keys(&store).await.is_empty(), "{:?}", keys(&store).await);
        assert!(store.get_task("t").await.unwrap().is_none());
        assert_eq!(store.unfinished_tasks_of("o").await.unwrap(), 0);
        insert(&store, "c", false).await.unwrap();
        assert_eq!(keys(&store).await, ["c"]);
    }

    /// Writes beyond the queue's capacity wait for a place, and past the wait are told the
    /// store is busy instead of queueing without bound; the queued ones still commit.
    #[tokio::test]
    async fn a_full_write_queue_answers_busy() {
        let dir = tempfile::tempdir().unwrap();
        let queue = WriteQueue {
            capacity: 2,
            wait: Duration::from_millis(200),
        };
        let store = open(&dir, queue);
        let release = hold_writer(&store).await;
        let queued = ["a", "b"].map(|key| tokio::spawn(insert(&store, key, false)));
        until_queued(&store, 2).await;
        let refused = insert(&store, "c", false).await;
        assert!(
            matches!(refused, Err(StoreError::Busy { queued: 2 })),
            "{refused:?}"
        );
        drop(release);
        for write in queued {
            write.await.unwrap().unwrap();
        }
        assert_eq!(keys(&store).await, ["a", "b"]);
    }

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
