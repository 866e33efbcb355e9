//! Prints how fast SSE events are stored durably and how long a reconnecting client waits for
//! 10,000 missed events, each against bare rusqlite doing the same storage work in the same
//! run (the machine is shared and noisy, so only the ratios mean much).
//!
//! Run with `cargo bench -p durable-mcp --bench streams`.

use std::time::Instant;

use durable_mcp_server::store::{NewEvent, Store};
use durable_mcp_server::streams::StreamStore;
use serde_json::json;
use support::{Session, serve};
use tokio_util::sync::CancellationToken;

mod support;

const APPENDS: u64 = 2_000;
const STREAMS: u64 = 64;
const MISSED: usize = 10_000;

fn message(n: u64) -> String {
    json!({"jsonrpc": "2.0", "method": "notifications/resources/updated",
           "params": {"uri": format!("task://status/{n:08}")}})
    .to_string()
}

fn event(stream_id: &str, session: Option<&str>, n: u64) -> NewEvent {
    NewEvent {
        stream_id: stream_id.to_owned(),
        session_id: session.map(str::to_owned),
        message: Some(message(n)),
        retry_ms: None,
        finishes: false,
        binding: None,
        opens: true,
    }
}

fn bare_inserts(path: &std::path::Path) -> f64 {
    let conn = rusqlite::Connection::open(path).unwrap();
    conn.pragma_update(None, "journal_mode", "WAL").unwrap();
    conn.pragma_update(None, "synchronous", "FULL").unwrap();
    conn.execute_batch(
        "CREATE TABLE events (token TEXT, seq INTEGER, message TEXT, PRIMARY KEY (token, seq)) WITHOUT ROWID",
    )
    .unwrap();
    let started = Instant::now();
    for n in 1..=APPENDS {
        conn.execute(
            "INSERT INTO events VALUES ('t', ?1, ?2)",
            rusqlite::params![n, message(n)],
        )
        .unwrap();
    }
    APPENDS as f64 / started.elapsed().as_secs_f64()
}

async fn appends(streams: &StreamStore, concurrent: u64) -> f64 {
    let per_stream = APPENDS.max(concurrent * 50) / concurrent;
    let started = Instant::now();
    let writers = (0..concurrent).map(|s| {
        let streams = streams.clone();
        tokio::spawn(async move {
            let stream_id = format!("bench-{concurrent}-{s}");
            for n in 0..per_stream {
                streams.append(event(&stream_id, None, n)).await.unwrap();
            }
        })
    });
    futures::future::join_all(writers).await;
    (per_stream * concurrent) as f64 / started.elapsed().as_secs_f64()
}

fn bare_replay(path: &std::path::Path, token: &str, after: u64) -> f64 {
    let conn = rusqlite::Connection::open(path).unwrap();
    let started = Instant::now();
    let mut stmt = conn
        .prepare("SELECT seq, message FROM events WHERE token = ?1 AND seq > ?2 ORDER BY seq")
        .unwrap();
    let rows: Vec<(u64, String)> = stmt
        .query_map(rusqlite::params![token, after], |row| {
            Ok((row.get(0)?, row.get(1)?))
        })
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    let parsed: Vec<serde_json::Value> = rows
        .iter()
        .map(|(_, m)| serde_json::from_str(m).unwrap())
        .collect();
    assert_eq!(parsed.len(), MISSED);
    started.elapsed().as_secs_f64()
}

/// Serves HTTP in-process, stores `MISSED` events on a session's standalone stream after the
/// id a client holds, and times the client's GET with `Last-Event-ID` until the last one
/// arrives.
async fn http_replay(dir: &std::path::Path) -> (f64, String, u64) {
    let db = dir.join("http.db");
    let served = serve(support::config(&db, &dir.join("data"))).await;
    let client = Session::open(served.url.clone()).await;
    let session = client.session.clone();

    // A second handle on the same database plays the part of the server's own writes.
    let writer = StreamStore::new(Store::open(&db).unwrap(), "bench", CancellationToken::new());
    let stream_id = format!("{session}:common");
    let first = writer
        .append(event(&stream_id, Some(&session), 0))
        .await
        .unwrap();
    for n in 1..=MISSED as u64 {
        writer
            .append(event(&stream_id, Some(&session), n))
            .await
            .unwrap();
    }

    let started = Instant::now();
    client.receive_replay(&first.to_string(), MISSED).await;
    let elapsed = started.elapsed().as_secs_f64();
    served.stop().await;
    (elapsed, first.token, first.seq)
}

fn main() {
    let dir = tempfile::tempdir().unwrap();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let bare = bare_inserts(&dir.path().join("bare.db"));
    let (one, many) = runtime.block_on(async {
        let streams = StreamStore::new(
            Store::open(&dir.path().join("streams.db")).unwrap(),
            "bench",
            CancellationToken::new(),
        );
        (appends(&streams, 1).await, appends(&streams, STREAMS).await)
    });
    println!("events stored durably (WAL, synchronous=FULL)");
    println!("  bare rusqlite, 1 INSERT per transaction   {bare:>9.0} events/s   1.00x (baseline)");
    println!(
        "  StreamStore::append, 1 stream             {one:>9.0} events/s   {:.2}x",
        one / bare
    );
    println!(
        "  StreamStore::append, {STREAMS} streams at once    {many:>9.0} events/s   {:.2}x",
        many / bare
    );

    let (http, token, first) = runtime.block_on(http_replay(dir.path()));
    let bare = bare_replay(&dir.path().join("http.db"), &token, first);
    println!("replaying {MISSED} missed events to a reconnecting client");
    println!(
        "  bare rusqlite SELECT + JSON parse        {:>9.1} ms        1.00x (baseline)",
        bare * 1e3
    );
    println!(
        "  GET with Last-Event-ID, last event read  {:>9.1} ms        {:.2}x",
        http * 1e3,
        http / bare
    );
}
