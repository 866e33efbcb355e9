//! Faults of the machine under the server, on its embedded SQLite database: a full disk and a
//! database locked by another process. Requests get a clear error naming the cause, what was
//! committed before is neither lost nor corrupted (`PRAGMA integrity_check`), and the work
//! resumes by itself once the fault passes, with the result of a run that never saw it.
//!
//! The full disk is a size-limited tmpfs, which needs root to mount (as `scripts/setup` needs
//! root to install packages).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use durable_shared::TaskStatus;
use durable_tests::raw::{EventExt, RawSession, Sse};
use durable_tests::{Client, Server, TASK_LIMIT, uninterrupted, wait_progress, within};
use rmcp::model::CallToolRequestParams;
use serde_json::{Value, json};

/// A tmpfs of `size` mounted at `path`, unmounted when dropped.
struct Tmpfs {
    path: PathBuf,
}

impl Tmpfs {
    fn mount(path: &Path, size: &str) -> Tmpfs {
        std::fs::create_dir_all(path).unwrap();
        let status = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(path)
            .status()
            .expect("running mount");
        assert!(
            status.success(),
            "mounting a size-limited tmpfs failed (it needs root, as scripts/setup does)"
        );
        Tmpfs {
            path: path.to_owned(),
        }
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        // Lazily: the killed server's files may still be open for a moment.
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(&self.path)
            .status();
    }
}

/// Writes a file into `dir` until its filesystem has no byte left; returns the file.
fn fill(dir: &Path) -> PathBuf {
    let path = dir.join("filler");
    let mut file = std::fs::File::create(&path).unwrap();
    // Big chunks, then the pages and bytes they left.
    for size in [1 << 20, 4096, 1] {
        let chunk = vec![0u8; size];
        while file.write_all(&chunk).is_ok() {}
    }
    let probe = std::fs::File::create(dir.join("probe"))
        .and_then(|mut probe| probe.write_all(&[0; 4096]).and_then(|()| probe.sync_all()));
    let _ = std::fs::remove_file(dir.join("probe"));
    assert!(probe.is_err(), "the filesystem still takes writes");
    path
}

/// What SQLite says of the database file, read by a connection of this process.
fn integrity(db: &Path) -> String {
    let conn =
        rusqlite::Connection::open_with_flags(db, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
            .expect("opening the database read-only");
    conn.query_row("PRAGMA integrity_check", [], |row| row.get(0))
        .expect("integrity_check")
}

fn batch(total_items: u64) -> Value {
    json!({"batch_size": 10, "total_items": total_items, "processing_delay": 1})
}

/// Starts batch processing until the server refuses a start; returns the refusal.
async fn first_refused_start(client: &Client) -> String {
    let Value::Object(args) = batch(20) else {
        unreachable!("arguments are an object")
    };
    within(Duration::from_secs(60), "a start to be refused", async {
        loop {
            let params =
                CallToolRequestParams::new("start_batch_processing").with_arguments(args.clone());
            match client.service.call_tool(params).await {
                Err(refused) => return refused.to_string(),
                Ok(result) if result.is_error == Some(true) => return format!("{result:?}"),
                Ok(_) => tokio::time::sleep(Duration::from_millis(20)).await,
            }
        }
    })
    .await
}

/// What a fault must not change: a finished task's result, and a running task that finishes
/// with the result of a run that never saw the fault.
struct Witnesses {
    finished: (String, Option<Value>),
    running: String,
}

impl Witnesses {
    async fn before_the_fault(client: &Client) -> Witnesses {
        let started = client.call_ok("start_batch_processing", batch(30)).await;
        let id = started["task_id"].as_str().unwrap().to_owned();
        let finished = client.wait_terminal(&id, TASK_LIMIT).await;
        assert_eq!(finished.status, TaskStatus::Completed, "{finished:?}");
        let started = client.call_ok("start_batch_processing", batch(1500)).await;
        let running = started["task_id"].as_str().unwrap().to_owned();
        wait_progress(client, &running, 50).await;
        Witnesses {
            finished: (id, finished.result_data),
            running,
        }
    }

    /// During the fault: what was committed still reads the same.
    async fn still_readable(&self, client: &Client) {
        let (id, result) = &self.finished;
        assert_eq!(&client.task(id).await.result_data, result);
        let running = client.task(&self.running).await;
        assert_ne!(running.status, TaskStatus::Failed, "{running:?}");
    }

    /// After the fault: the running task finished exactly as an undisturbed run.
    async fn unharmed(&self, client: &Client, clean: Option<Value>) {
        let task = client.wait_terminal(&self.running, TASK_LIMIT).await;
        assert_eq!(task.status, TaskStatus::Completed, "{task:?}");
        assert_eq!(task.result_data, clean);
        let (id, result) = &self.finished;
        assert_eq!(&client.task(id).await.result_data, result);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_gets_a_clear_error_loses_nothing_and_recovers() {
    let clean =
        tokio::spawn(async { uninterrupted("0.02", "start_batch_processing", &batch(1500)).await });
    let dir = tempfile::tempdir().unwrap();
    let disk = Tmpfs::mount(&dir.path().join("disk"), "16m");
    let db = disk.path.join("tasks.db");
    let mut server = Server::start_on_sqlite(dir.path(), &db, &["--time-scale", "0.02"]).await;
    let client = Client::connect(&server.mcp_url(), None).await;
    let witnesses = Witnesses::before_the_fault(&client).await;

    let filler = fill(&disk.path);
    let refusal = first_refused_start(&client).await;
    assert!(
        refusal.contains("the database's disk is full; nothing was changed"),
        "{refusal}"
    );
    witnesses.still_readable(&client).await;
    assert_eq!(integrity(&db), "ok");

    std::fs::remove_file(filler).unwrap();
    client.call_ok("start_batch_processing", batch(20)).await;
    let (_clean_dir, _clean_server, clean) = clean.await.unwrap();
    witnesses.unharmed(&client, clean.result_data).await;
    client.close().await;
    server.kill9().await;
    assert_eq!(integrity(&db), "ok");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_locked_by_another_process_gets_busy_and_recovers() {
    let clean =
        tokio::spawn(async { uninterrupted("0.02", "start_batch_processing", &batch(1500)).await });
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("tasks.db");
    let server = Server::start_on_sqlite(dir.path(), &db, &["--time-scale", "0.02"]).await;
    let client = Client::connect(&server.mcp_url(), None).await;
    let witnesses = Witnesses::before_the_fault(&client).await;

    // This test process is the other process: it takes the write lock and keeps it.
    let holder = rusqlite::Connection::open(&db).unwrap();
    holder.execute_batch("BEGIN EXCLUSIVE").unwrap();
    let refusal = first_refused_start(&client).await;
    assert!(
        refusal.contains("the database is busy") && refusal.contains("nothing was changed"),
        "{refusal}"
    );
    witnesses.still_readable(&client).await;

    holder.execute_batch("COMMIT").unwrap();
    drop(holder);
    client.call_ok("start_batch_processing", batch(20)).await;
    let (_clean_dir, _clean_server, clean) = clean.await.unwrap();
    witnesses.unharmed(&client, clean.result_data).await;
    client.close().await;
    assert_eq!(integrity(&db), "ok");
}

/// Nothing a client is sent goes out before it is durable. While another process holds the
/// database's lock, an answer's events (queued, not waited for, by the session's worker)
/// cannot be committed, and not a byte of the answer is sent; once the lock is released, the
/// answer arrives, and every event id it carries is in the database: the answer's as its
/// event, the priming event's (which nothing replays, so it is not stored as an event) as its
/// stream, recorded with the session that may resume it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_goes_out_only_once_its_events_are_durable() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("tasks.db");
    let server = Server::start_on_sqlite(dir.path(), &db, &[]).await;
    let session = RawSession::open(&server.mcp_url(), "2025-11-25").await;

    let holder = rusqlite::Connection::open(&db).unwrap();
    holder.execute_batch("BEGIN EXCLUSIVE").unwrap();
    let list = json!({"jsonrpc": "2.0", "id": 7, "method": "tools/list"});
    let mut answer = Sse::new(session.post(list).await);
    // The writer waits up to 5 s for the lock before it gives up.
    let early = answer.next_or_idle(Duration::from_secs(1)).await;
    assert!(early.is_none(), "sent before it was stored: {early:?}");
    holder.execute_batch("COMMIT").unwrap();
    drop(holder);

    let events = answer
        .until(Duration::from_secs(10), |message| message["id"] == 7)
        .await;
    assert!(
        events.len() >= 2,
        "a priming event, then the answer: {events:?}"
    );
    let stored = rusqlite::Connection::open(&db).unwrap();
    for event in &events {
        let (token, seq) = event.seq();
        let found: i64 = if event.is_priming() {
            stored.query_row(
                "SELECT count(*) FROM streams WHERE token = ?1 AND next_seq > ?2 \
                 AND session_id = ?3",
                rusqlite::params![token, seq, session.session_id],
                |row| row.get(0),
            )
        } else {
            stored.query_row(
                "SELECT count(*) FROM events WHERE token = ?1 AND seq = ?2",
                rusqlite::params![token, seq],
                |row| row.get(0),
            )
        }
        .unwrap();
        assert_eq!(found, 1, "event {token}.{seq} was sent but is not stored");
    }
}
