//! A fixed workload to profile under callgrind, not a timing benchmark: the in-process server
//! answers `CALLS` sequential `ping`s (`ping`), `CALLS` `start_batch_processing` calls whose
//! instant tasks (time scale 0) are then waited for (`start`), or `CALLS` reads of a finished
//! task's `task://status/{id}` (`read`), on one session over HTTP; the same calls `CALLS` x 16
//! times from 16 sessions with 32 in flight each, the load bench's shape, in which the store's
//! writer commits many writes per transaction (`ping-load`, `start-load`, `read-load`); or it
//! replays `MISSED` stored events to a client resuming the session's standalone stream with
//! `Last-Event-ID` (`replay`, as `benches/streams.rs` times it). Prefixed `ceiling-`, the
//! workload runs on the in-memory ceiling the load bench compares with (`ceiling-read`), the
//! baseline of an instruction count.
//!
//! The measured part runs between `profile_begin` and `profile_end`, which do nothing: callgrind
//! zeroes its counters on entering the first and dumps them on entering the second, so start-up,
//! the session's opening, a warm-up and shutdown stay out of the figure:
//!
//! ```text
//! CARGO_PROFILE_BENCH_DEBUG=line-tables-only cargo bench -p durable-mcp-server --bench profile --no-run
//! valgrind --tool=callgrind --zero-before='*profile_begin*' --dump-before='*profile_end*' \
//!     target/release/deps/profile-<hash> ping     # or: start, read, replay, ceiling-ping, ...
//! grep '^totals' callgrind.out.<pid>.1
//! callgrind_annotate --inclusive=yes callgrind.out.<pid>.1 | head -60
//! ```
//!
//! The figure is the dump's `totals:` line. Its `summary:` line, which callgrind_annotate shows
//! as the program total, also counts what other threads did before the counters were zeroed
//! (for `replay`, the storing of the events), and so do the inclusive costs of calls that began
//! before: of thread start-up, worker loops and the like.
//!
//! With debug information, callgrind files costs under each inlined function's source file; to
//! see them per function, strip it from a copy first (`objcopy --strip-debug`).
//!
//! Each run also prints the process's CPU time per call, user and kernel, over the same part:
//! callgrind counts no kernel work (the writer's WAL writes and fsyncs, the thread wake-ups,
//! the socket writes and reads), and neither does its figure. It is wall-clock noisy, so
//! compare several runs of each side; the read and write system calls per call printed beside
//! it are not.
//!
//! The instruction count includes the client (reqwest) in the same process; it is the same on
//! both sides of a comparison.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use durable_mcp_server::store::{NewEvent, Store};
use durable_mcp_server::streams::StreamStore;
use rusqlite::{Connection, OpenFlags};
use serde_json::{Value, json};
use support::{Session, serve};
use tokio_util::sync::CancellationToken;

mod support;

const CALLS: usize = 300;
/// The `-load` workloads' sessions, and requests each keeps in flight (as `benches/load.rs`).
const LOAD_SESSIONS: usize = 16;
const LOAD_IN_FLIGHT: usize = 32;
const WARM_UP: usize = 20;
const MISSED: usize = 10_000;

// Each touches its own name so that the linker cannot fold the two into one function.
#[inline(never)]
fn profile_begin() {
    std::hint::black_box("profile_begin");
}

#[inline(never)]
fn profile_end() {
    std::hint::black_box("profile_end");
}

/// The process's CPU time so far, user and kernel, its context switches, and its read and
/// write system calls (sockets and files alike): what callgrind does not count. Under
/// `start-load` the store's writer spends about half its time in the kernel (WAL writes and
/// fsync), and each socket write on loopback costs its reader a wake-up and a read, so an
/// instruction count alone misjudges a change to how the writer batches or a response is
/// written. Unlike the CPU times, the call counts are steady from run to run.
#[derive(Clone, Copy)]
struct Usage {
    user: Duration,
    kernel: Duration,
    switches: i64,
    reads: i64,
    writes: i64,
}

impl Usage {
    fn now() -> Usage {
        use nix::sys::resource::{UsageWho, getrusage};
        use nix::sys::time::TimeValLike;
        let usage = getrusage(UsageWho::RUSAGE_SELF).expect("the process's resource usage");
        let time = |t: nix::sys::time::TimeVal| Duration::from_micros(t.num_microseconds() as u64);
        Usage {
            user: time(usage.user_time()),
            kernel: time(usage.system_time()),
            switches: usage.voluntary_context_switches() + usage.involuntary_context_switches(),
            reads: io_calls("syscr"),
            writes: io_calls("syscw"),
        }
    }

    /// Prints what was spent since `self`, per call.
    fn report_since(self, calls: usize) {
        let now = Usage::now();
        let per_call = |d: Duration| d.as_secs_f64() * 1e6 / calls as f64;
        let count_per_call = |count: i64| count as f64 / calls as f64;
        eprintln!(
            "cpu per call: {:.1} us user, {:.1} us kernel, {:.2} context switches, {:.2} read and \
             {:.2} write system calls ({calls} calls)",
            per_call(now.user - self.user),
            per_call(now.kernel - self.kernel),
            count_per_call(now.switches - self.switches),
            count_per_call(now.reads - self.reads),
            count_per_call(now.writes - self.writes),
        );
    }
}

/// The process's count of read (`syscr`) or write (`syscw`) system calls so far, from
/// `/proc/self/io`.
fn io_calls(field: &str) -> i64 {
    let io = std::fs::read_to_string("/proc/self/io").expect("/proc/self/io");
    io.lines()
        .find_map(|line| line.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|count| count.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {field} in /proc/self/io"))
}

fn ping(id: usize) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "method": "ping"})
}

fn start(id: usize) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {
        "name": "start_batch_processing",
        "arguments": {"batch_size": 10, "total_items": 10, "processing_delay": 0}}})
}

fn read(id: usize, uri: &str) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "method": "resources/read", "params": {"uri": uri}})
}

/// Starts an instant task and returns its status URI, for `read` to read.
async fn first_status_uri(session: &Session) -> String {
    let result = support::call(session, start(0)).await;
    result["structuredContent"]["status_uri"]
        .as_str()
        .expect("a status link")
        .to_owned()
}

/// A read-only connection to the server's database, opened once: opening one reads and parses
/// the schema. Under callgrind, where the wait for the last tasks of `start-load` polls about a
/// hundred times, opening one per poll and counting the unfinished tasks at each cost the run
/// 27,000 instructions a call of the durable server's figure.
fn beside(db: &std::path::Path) -> Connection {
    let conn = Connection::open_with_flags(db, OpenFlags::SQLITE_OPEN_READ_ONLY).unwrap();
    conn.busy_timeout(Duration::from_secs(5)).unwrap();
    conn
}

/// Whether no task is pending or running, read from the database beside the server (a
/// `task://list` read would cost the server, and so the figure, more than the tasks do). Each
/// status is one look into the status index, not a count of the tasks that have it.
fn all_finished(conn: &Connection) -> bool {
    let unfinished: bool = conn
        .query_row(
            "SELECT EXISTS (SELECT 1 FROM tasks WHERE status = 'pending') \
                 OR EXISTS (SELECT 1 FROM tasks WHERE status = 'running')",
            [],
            |row| row.get(0),
        )
        .unwrap();
    !unfinished
}

/// Stores `MISSED` events on the session's standalone stream after the one whose id the client
/// holds, then reads them all through a GET with `Last-Event-ID`.
async fn replay(db: &std::path::Path, session: &Session) {
    // A second handle on the same database plays the part of the server's own writes.
    let writer = StreamStore::new(Store::open(db).unwrap(), "bench", CancellationToken::new());
    let event = |n: usize| NewEvent {
        stream_id: format!("{}:common", session.session),
        session_id: Some(session.session.clone()),
        message: Some(
            json!({"jsonrpc": "2.0", "method": "notifications/resources/updated",
                   "params": {"uri": format!("task://status/{n:08}")}})
            .to_string(),
        ),
        retry_ms: None,
        finishes: false,
        binding: None,
        opens: true,
    };
    let first = writer.append(event(0)).await.unwrap();
    for n in 1..=MISSED {
        writer.append(event(n)).await.unwrap();
    }
    profile_begin();
    session.receive_replay(&first.to_string(), MISSED).await;
    profile_end();
}

async fn run(workload: &str) {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("profile.db");
    // `ceiling-ping` and the like: the same workload on the in-memory ceiling, whose tasks are
    // done when their start is answered.
    let (served, workload, durable) = match workload.strip_prefix("ceiling-") {
        Some(workload) => (support::ceiling::serve().await, workload, false),
        None => (
            serve(support::config(&db, &dir.path().join("data"))).await,
            workload,
            true,
        ),
    };
    let (workload, sessions) = match workload.strip_suffix("-load") {
        Some(workload) => (workload, LOAD_SESSIONS),
        None => (workload, 1),
    };
    let mut all = Vec::new();
    for _ in 0..sessions {
        all.push(Session::open(served.url.clone()).await);
    }
    let session = all[0].clone();
    if workload == "replay" {
        assert!(durable, "the ceiling stores no events to replay");
        replay(&db, &session).await;
        served.stop().await;
        return;
    }
    let body: Arc<dyn Fn(usize) -> Value + Send + Sync> = match workload {
        "ping" => Arc::new(ping),
        "start" => Arc::new(start),
        "read" => {
            let uri = first_status_uri(&session).await;
            Arc::new(move |id| read(id, &uri))
        }
        other => panic!("unknown workload {other:?}: ping, start, read or replay, -load"),
    };
    for i in 0..WARM_UP {
        assert!(session.post(body(i + 1)).await.contains("\"result\""));
    }
    let database = durable.then(|| beside(&db));
    let finished = || database.as_ref().is_none_or(all_finished);
    while !finished() {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let usage = Usage::now();
    profile_begin();
    if sessions == 1 {
        for i in 0..CALLS {
            let reply = session.post(body(i + 1_000)).await;
            assert!(reply.contains("\"result\""), "unexpected reply {reply}");
        }
    } else {
        // Every in-flight slot takes the next call number until `CALLS` per session are sent.
        let next = Arc::new(AtomicUsize::new(1_000));
        let last = 1_000 + CALLS * sessions;
        let slots: Vec<_> = all
            .iter()
            .flat_map(|session| std::iter::repeat_n(session, LOAD_IN_FLIGHT))
            .map(|session| {
                let (session, next, body) = (session.clone(), next.clone(), body.clone());
                tokio::spawn(async move {
                    loop {
                        let id = next.fetch_add(1, Ordering::Relaxed);
                        if id >= last {
                            return;
                        }
                        let reply = session.post(body(id)).await;
                        assert!(reply.contains("\"result\""), "unexpected reply {reply}");
                    }
                })
            })
            .collect();
        for slot in slots {
            slot.await.expect("a load slot");
        }
    }
    // A start is done when its task is: wait for the tail, polling as little as possible.
    while !finished() {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    profile_end();
    usage.report_since(CALLS * sessions);
    served.stop().await;
}

fn main() {
    let workload = std::env::args()
        .skip(1)
        .find(|arg| !arg.starts_with('-'))
        .unwrap_or_else(|| "ping".to_owned());
    tokio::runtime::Runtime::new()
        .unwrap()
        .block_on(run(&workload));
}
