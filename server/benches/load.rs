//! Prints how durable-mcp holds up under load, each figure beside a baseline measured in the
//! same run (the machine is shared and noisy, so only the ratios mean much; nothing here
//! asserts on time):
//!
//! 1. throughput and p99 latency of `ping`, `tools/call start_batch_processing` and
//!    `resources/read task://status/{id}` (of a finished task, and of a paused one) with 16
//!    sessions x 32 requests in flight, against an in-memory ceiling: a small rmcp server
//!    built here from the same dependency tree that answers the same calls from a `HashMap`,
//!    the two servers taking turns in short rounds (the ratio is the median round's);
//! 2. the latency of one `start_*` call as idle sessions pile up (1 to 10,000), and of `ping`
//!    while 40 long tasks run;
//! 3. the resident memory of a server process, idle, with 1,000 idle sessions, with 1,000
//!    mostly sleeping tasks, and with both;
//! 4. how long a server SIGKILLed with 1,000 running tasks takes, once restarted, until every
//!    task has committed a step again, beside the time to its first answered `ping`.
//!
//! Parts 3 and 4 need a server in its own process: the bench re-executes itself with
//! `DURABLE_BENCH_ROLE=serve` (see [`support::child`]). Replay of missed events is
//! `--bench streams`.
//!
//! Run with `cargo bench -p durable-mcp-server --bench load` (about 2 minutes on 2 cores); name
//! parts to run only those: `-- throughput idle memory restart`.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use futures::StreamExt;
use rusqlite::{Connection, OpenFlags};
use serde_json::{Value, json};
use support::child::{SERVE, Server};
use support::{Session, call, serve};

mod support;

/// Concurrent sessions of the throughput runs, and requests each keeps in flight.
const SESSIONS: usize = 16;
const IN_FLIGHT: usize = 32;
/// Each throughput run is timed (not counted), so a slow server gets as long as a fast one.
const WARM_UP: Duration = Duration::from_millis(500);
const MEASURED: Duration = Duration::from_secs(3);
/// The measured time of each server is cut into rounds, the two servers taking turns, so that
/// both see the machine's slow and fast moments alike: on a shared machine, one server's
/// three seconds and then the other's gave ratios from 0.2 to 0.5 for the same binaries. The
/// ratio printed is the median of the rounds' ratios, beside their range.
const ROUNDS: u32 = 5;
/// Sequential calls a latency p50 is taken over, unless they take longer than the budget: a
/// call that takes seconds is measured often enough to know it.
const SEQUENTIAL_CALLS: usize = 100;
const SEQUENTIAL_BUDGET: Duration = Duration::from_secs(10);
const MIN_SEQUENTIAL_CALLS: usize = 5;
/// Idle sessions open beside the measuring one; the first level is the baseline.
const IDLE_LEVELS: [usize; 4] = [1, 100, 1_000, 10_000];
/// Sessions opened (and long tasks started) at once on one client: enough that 10,000 sessions
/// open in seconds, and no more connections than that.
const OPENING_CONCURRENCY: usize = 64;
const LONG_TASKS_BESIDE_PING: usize = 40;
/// Sessions and tasks of the memory and restart measurements.
const CHILD_SESSIONS: usize = 1_000;
const CHILD_TASKS: usize = 1_000;
/// Seconds each step of a long task sleeps (the servers here run with time scale 1). Memory is
/// measured with mostly sleeping tasks; restart uses short steps, since no task can commit a
/// step sooner than one step's sleep after it is resumed.
const SLEEPY_STEP: f64 = 1.0;
const BRISK_STEP: f64 = 0.1;
/// How long a wait on a server may take before the bench gives up.
const PATIENCE: Duration = Duration::from_secs(120);

/// The smallest task there is: one item in one batch, no delay, so it completes at once.
fn instant_task() -> Value {
    json!({"batch_size": 1, "total_items": 1, "processing_delay": 0})
}

/// A task that outlives the bench, sleeping `step` seconds before each of its steps.
fn long_task(step: f64) -> Value {
    json!({"batch_size": 1, "total_items": 1_000_000, "processing_delay": step})
}

fn start_request(id: u64, arguments: Value) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {
           "name": "start_batch_processing", "arguments": arguments}})
}

fn ping_request(id: u64) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "method": "ping"})
}

fn read_request(id: u64, uri: &str) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "method": "resources/read", "params": {"uri": uri}})
}

fn quantile(sorted: &[Duration], q: f64) -> Duration {
    sorted[((sorted.len() - 1) as f64 * q).round() as usize]
}

fn ms(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1e3
}

/// Prints one figure of parts 2 to 4: what, how much, its ratio to the part's baseline, and
/// the target or how the state was reached.
fn row(label: &str, value: String, ratio: f64, note: &str) {
    let line = format!("  {label:<42} {value:>11} {ratio:>8.2}x  {note}");
    println!("{}", line.trim_end());
}

/// The p50 of up to `SEQUENTIAL_CALLS` requests sent one after the other, and how many were
/// sent: sending stops early once `SEQUENTIAL_BUDGET` is spent and `MIN_SEQUENTIAL_CALLS` were.
async fn sequential_p50(session: &Session, body: impl Fn(u64) -> Value) -> (Duration, usize) {
    let started = Instant::now();
    let mut latencies = Vec::with_capacity(SEQUENTIAL_CALLS);
    while latencies.len() < SEQUENTIAL_CALLS
        && (latencies.len() < MIN_SEQUENTIAL_CALLS || started.elapsed() < SEQUENTIAL_BUDGET)
    {
        let sent = Instant::now();
        call(session, body(latencies.len() as u64)).await;
        latencies.push(sent.elapsed());
    }
    latencies.sort();
    (quantile(&latencies, 0.5), latencies.len())
}

/// Opens `count` sessions on one shared client, `OPENING_CONCURRENCY` at a time.
async fn open_sessions(http: &reqwest::Client, url: &str, count: usize) -> Vec<Session> {
    futures::stream::iter(0..count)
        .map(|_| Session::open_with(http.clone(), url.to_owned()))
        .buffer_unordered(OPENING_CONCURRENCY)
        .collect()
        .await
}

/// Builds the body of a request from its JSON-RPC id.
type Request = Arc<dyn Fn(u64) -> Value + Send + Sync>;

/// What a throughput run measured: every request's latency, and how long the run took.
#[derive(Default)]
struct Load {
    latencies: Vec<Duration>,
    elapsed: Duration,
}

impl Load {
    fn per_second(&self) -> f64 {
        self.latencies.len() as f64 / self.elapsed.as_secs_f64()
    }

    /// This run and `other` as one.
    fn add(&mut self, other: Load) {
        self.latencies.extend(other.latencies);
        self.elapsed += other.elapsed;
    }

    fn p99(&mut self) -> Duration {
        self.latencies.sort();
        quantile(&self.latencies, 0.99)
    }
}

/// The load generator, the same for both servers: `IN_FLIGHT` workers per session, each
/// sending `request(id)` and reading the whole reply before the next, for `duration`.
async fn load(sessions: &[Session], duration: Duration, request: Request) -> Load {
    // JSON-RPC ids must not repeat among a session's requests in flight.
    let ids = Arc::new(AtomicU64::new(1));
    let started = Instant::now();
    let deadline = started + duration;
    let workers: Vec<_> = sessions
        .iter()
        .flat_map(|session| std::iter::repeat_n(session, IN_FLIGHT))
        .map(|session| {
            let (session, ids, request) = (session.clone(), ids.clone(), request.clone());
            tokio::spawn(async move {
                let mut latencies = Vec::new();
                while Instant::now() < deadline {
                    let body = request(ids.fetch_add(1, Ordering::Relaxed));
                    let sent = Instant::now();
                    call(&session, body).await;
                    latencies.push(sent.elapsed());
                }
                latencies
            })
        })
        .collect();
    let mut latencies = Vec::new();
    for worker in workers {
        latencies.extend(worker.await.expect("load worker"));
    }
    Load {
        latencies,
        elapsed: started.elapsed(),
    }
}

/// A durable-mcp run, until the tasks its requests started have all finished: their work is
/// part of what the requests cost (and would otherwise run during the ceiling's next turn).
async fn load_durable(sessions: &[Session], db: &Path, request: Request) -> Load {
    let mut run = load(sessions, MEASURED / ROUNDS, request).await;
    let draining = Instant::now();
    drained(db).await;
    run.elapsed += draining.elapsed();
    run
}

/// Returns once no task in the database at `db` is pending or running.
async fn drained(db: &Path) {
    let db = db.to_owned();
    tokio::task::spawn_blocking(move || {
        Database::open(&db).wait_every(Duration::from_millis(1), "tasks to finish", |db| {
            db.unfinished() == 0
        })
    })
    .await
    .expect("waiting for tasks to finish");
}

/// One request type on both servers: each warmed up, then measured in [`ROUNDS`] turns.
/// Returns the ceiling's and durable-mcp's runs, and the ratio of each round.
async fn compare(
    ceiling: (&[Session], Request),
    durable: (&[Session], Request),
    durable_db: &Path,
) -> (Load, Load, Vec<f64>) {
    load(ceiling.0, WARM_UP, ceiling.1.clone()).await;
    load(durable.0, WARM_UP, durable.1.clone()).await;
    drained(durable_db).await;
    let (mut on_ceiling, mut on_durable, mut ratios) =
        (Load::default(), Load::default(), Vec::new());
    for _ in 0..ROUNDS {
        let round = load(ceiling.0, MEASURED / ROUNDS, ceiling.1.clone()).await;
        let durable_round = load_durable(durable.0, durable_db, durable.1.clone()).await;
        ratios.push(durable_round.per_second() / round.per_second());
        on_ceiling.add(round);
        on_durable.add(durable_round);
    }
    ratios.sort_by(f64::total_cmp);
    (on_ceiling, on_durable, ratios)
}

/// Opens the sessions of a throughput run on `url`, and starts the task every read of it asks
/// for, whose status URI comes back.
async fn prepare(url: &str) -> (Vec<Session>, String) {
    let mut sessions = Vec::new();
    for _ in 0..SESSIONS {
        sessions.push(Session::open(url.to_owned()).await);
    }
    let started = call(&sessions[0], start_request(0, instant_task())).await;
    let uri = started["structuredContent"]["status_uri"]
        .as_str()
        .expect("a status link")
        .to_owned();
    (sessions, uri)
}

/// Starts a long task on `session` and pauses it: a task whose status is read from the store
/// (a finished task's is answered from memory), and which takes no CPU meanwhile.
async fn paused_task(session: &Session) -> String {
    let started = call(session, start_request(0, long_task(SLEEPY_STEP))).await;
    let task = &started["structuredContent"];
    let id = task["task_id"].as_str().expect("a task id");
    call(
        session,
        json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {
               "name": "pause_task", "arguments": {"task_id": id}}}),
    )
    .await;
    task["status_uri"]
        .as_str()
        .expect("a status link")
        .to_owned()
}

/// Part 1: throughput of durable-mcp against the in-memory ceiling, request type by request
/// type, the two measured back to back so that both see the same machine.
async fn throughput(dir: &Path) {
    println!(
        "1. throughput, {SESSIONS} sessions x {IN_FLIGHT} requests in flight, {} s per figure \
         after {} ms of warm-up, in {ROUNDS} rounds that alternate the servers (ratio: the \
         median round's)",
        MEASURED.as_secs(),
        WARM_UP.as_millis()
    );
    let ceiling = support::ceiling::serve().await;
    let db = dir.join("load.db");
    let durable = serve(support::config(&db, &dir.join("data"))).await;
    let (ceiling_sessions, ceiling_uri) = prepare(&ceiling.url).await;
    let (durable_sessions, durable_uri) = prepare(&durable.url).await;
    let unfinished_uri = paused_task(&durable_sessions[0]).await;

    println!(
        "  {:<24} {:>13} {:>9} {:>13} {:>9} {:>7} {:>11}  target",
        "request", "ceiling req/s", "p99", "durable req/s", "p99", "ratio", "rounds"
    );
    let reads = |uri: String| -> Request { Arc::new(move |id| read_request(id, &uri)) };
    let cases: [(&str, Request, Request, &str); 4] = [
        ("ping", Arc::new(ping_request), Arc::new(ping_request), "-"),
        (
            "start_batch_processing",
            Arc::new(|id| start_request(id, instant_task())),
            Arc::new(|id| start_request(id, instant_task())),
            ">= 0.50x",
        ),
        (
            "resources/read status",
            reads(ceiling_uri.clone()),
            reads(durable_uri),
            ">= 0.80x",
        ),
        // The ceiling's tasks are all finished, and it reads any of them from the same map;
        // durable-mcp reads an unfinished task's status from the store.
        (
            "  ... of a paused task",
            reads(ceiling_uri),
            reads(unfinished_uri),
            "-",
        ),
    ];
    for (name, on_ceiling, on_durable, target) in cases {
        let (mut ceiling, mut durable, ratios) = compare(
            (&ceiling_sessions, on_ceiling),
            (&durable_sessions, on_durable),
            &db,
        )
        .await;
        let median = ratios[ratios.len() / 2];
        let range = format!("{:.2}-{:.2}", ratios[0], ratios[ratios.len() - 1]);
        println!(
            "  {name:<24} {:>13.0} {:>7.1}ms {:>13.0} {:>7.1}ms {median:>6.2}x {range:>11}  {target}",
            ceiling.per_second(),
            ms(ceiling.p99()),
            durable.per_second(),
            ms(durable.p99()),
        );
    }
    drop((ceiling_sessions, durable_sessions));
    durable.stop().await;
    ceiling.stop().await;
}

/// Part 2: a `start_*` call's latency as idle sessions pile up, then `ping` beside long tasks.
async fn idle_sessions_and_busy_engine(dir: &Path) {
    println!(
        "2. sequential latency on one session: p50 of up to {SEQUENTIAL_CALLS} calls (at least \
         {MIN_SEQUENTIAL_CALLS}, else as many as fit in {} s)",
        SEQUENTIAL_BUDGET.as_secs()
    );
    // In a process of its own, as in parts 3 and 4: what is measured is the server's cost of
    // the idle sessions, not that of the bench's side of them sharing its runtime and heap.
    let instant = [("TIME_SCALE", "0".to_owned())];
    let mut server = Server::start_as(SERVE, &dir.join("idle.db"), &dir.join("data"), &instant)
        .healthy()
        .await;
    let probe = Session::open(server.url.clone()).await;
    let start = |i| start_request(i, instant_task());
    sequential_p50(&probe, start).await;
    let opener = reqwest::Client::new();
    let mut idle = Vec::new();
    let mut baseline = None;
    for level in IDLE_LEVELS {
        let opening = Instant::now();
        let more = level - idle.len();
        idle.extend(open_sessions(&opener, &server.url, more).await);
        let opened = opening.elapsed();
        let (p50, calls) = sequential_p50(&probe, start).await;
        let base = *baseline.get_or_insert(p50);
        let target = if level == IDLE_LEVELS[0] {
            "baseline"
        } else {
            "target <= 1.20x"
        };
        row(
            &format!(
                "start_batch_processing, {level} idle session{}",
                if level == 1 { "" } else { "s" }
            ),
            format!("{:.2} ms", ms(p50)),
            p50.as_secs_f64() / base.as_secs_f64(),
            &format!(
                "{target}; {calls} calls; {more} opened in {:.2} s",
                opened.as_secs_f64()
            ),
        );
    }
    server.kill().await;
    drop((idle, probe, opener));

    let db = dir.join("busy.db");
    let mut config = support::config(&db, &dir.join("data"));
    config.time_scale = 1.0;
    let served = serve(config).await;
    let session = Session::open(served.url.clone()).await;
    sequential_p50(&session, ping_request).await;
    let (quiet, _) = sequential_p50(&session, ping_request).await;
    row(
        "ping, no task running",
        format!("{:.2} ms", ms(quiet)),
        1.0,
        "baseline",
    );
    for i in 0..LONG_TASKS_BESIDE_PING as u64 {
        call(&session, start_request(i, long_task(BRISK_STEP))).await;
    }
    Database::open(&db)
        .wait_stepping(LONG_TASKS_BESIDE_PING)
        .await;
    let (busy, _) = sequential_p50(&session, ping_request).await;
    row(
        &format!(
            "ping, {LONG_TASKS_BESIDE_PING} tasks stepping every {:.0} ms",
            BRISK_STEP * 1e3
        ),
        format!("{:.2} ms", ms(busy)),
        busy.as_secs_f64() / quiet.as_secs_f64(),
        "",
    );
    drop(session);
    served.stop().await;
}

/// Part 3: resident memory of a server process, idle, with idle sessions, with mostly
/// sleeping tasks, and with both.
async fn memory(dir: &Path) {
    println!(
        "3. resident memory (VmRSS) of a server process; tasks sleep {SLEEPY_STEP} s before each \
         step"
    );
    let data = dir.join("data");
    let http = reqwest::Client::new();
    let mib = |rss: f64| format!("{rss:.1} MiB");

    let mut server = Server::spawn(&dir.join("sessions.db"), &data).await;
    let idle = server.rss_mib();
    row("idle after start", mib(idle), 1.0, "baseline");
    let opening = Instant::now();
    let sessions = open_sessions(&http, &server.url, CHILD_SESSIONS).await;
    let opened = opening.elapsed();
    let rss = server.rss_mib();
    row(
        &format!("{CHILD_SESSIONS} idle sessions"),
        mib(rss),
        rss / idle,
        &format!("opened in {:.2} s", opened.as_secs_f64()),
    );
    server.kill().await;
    drop(sessions);
    let durable_per_session = (rss - idle) * 1024.0 / CHILD_SESSIONS as f64;

    // What rmcp's own sessions cost: the ceiling's process, idle, then with as many sessions.
    let mut ceiling = ceiling_process::spawn(dir).await;
    let ceiling_idle = ceiling.rss_mib();
    let sessions = open_sessions(&http, &ceiling.url, CHILD_SESSIONS).await;
    let ceiling_rss = ceiling.rss_mib();
    ceiling.kill().await;
    drop(sessions);
    let ceiling_per_session = (ceiling_rss - ceiling_idle) * 1024.0 / CHILD_SESSIONS as f64;
    row(
        "memory per idle session, rmcp ceiling",
        format!("{ceiling_per_session:.1} KiB"),
        1.0,
        &format!("baseline; {ceiling_idle:.1} MiB idle, {ceiling_rss:.1} MiB with sessions"),
    );
    row(
        "memory per idle session, durable-mcp",
        format!("{durable_per_session:.1} KiB"),
        durable_per_session / ceiling_per_session,
        "",
    );

    // A second process, with the tasks started before the sessions are opened: every open
    // session slows each start down (part 2), and what is measured is the state reached.
    let db = dir.join("tasks.db");
    let mut server = Server::start_as(
        SERVE,
        &db,
        &data,
        &[("DORMANT_AFTER", DORMANT_AFTER.to_string())],
    )
    .healthy()
    .await;
    let driver = Session::open_with(http.clone(), server.url.clone()).await;
    let starting = Instant::now();
    start_tasks(&driver, CHILD_TASKS, SLEEPY_STEP).await;
    Database::open(&db).wait_stepping(CHILD_TASKS).await;
    let started = starting.elapsed();
    let rss = server.rss_mib();
    row(
        &format!("{CHILD_TASKS} running tasks (another process)"),
        mib(rss),
        rss / idle,
        &format!("started and stepping in {:.2} s", started.as_secs_f64()),
    );
    let opening = Instant::now();
    let sessions = open_sessions(&http, &server.url, CHILD_SESSIONS).await;
    let opened = opening.elapsed();
    // Long enough for every session to have seen every task step.
    tokio::time::sleep(Duration::from_secs_f64(2.0 * SLEEPY_STEP)).await;
    let rss = server.rss_mib();
    row(
        &format!("{CHILD_TASKS} running tasks + {CHILD_SESSIONS} idle sessions"),
        mib(rss),
        rss / idle,
        &format!(
            "target <= 64 MiB; sessions opened in {:.2} s",
            opened.as_secs_f64()
        ),
    );
    // The idle sessions go dormant; the driver's, whose client's tasks run, stays.
    let sleeping = Instant::now();
    let slept = until_slept(&http, &server.url, CHILD_SESSIONS).await;
    let rss = server.rss_mib();
    row(
        &format!("{CHILD_TASKS} running tasks + {CHILD_SESSIONS} dormant sessions"),
        mib(rss),
        rss / idle,
        &format!(
            "target <= 64 MiB; {slept} slept within {:.1} s of --session-dormant-after {DORMANT_AFTER} s",
            sleeping.elapsed().as_secs_f64()
        ),
    );
    server.kill().await;
    drop(sessions);
}

/// `--session-dormant-after` of part 3's second server, in seconds: short, so that the bench
/// need not wait the default minute.
const DORMANT_AFTER: f64 = 3.0;

/// Waits (a minute at most) until the server at `mcp_url` has put `count` sessions to sleep;
/// how many it had.
async fn until_slept(http: &reqwest::Client, mcp_url: &str, count: usize) -> usize {
    let metrics = mcp_url.replace("/mcp", "/metrics");
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let text = http
            .get(&metrics)
            .timeout(Duration::from_secs(10))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        let slept = text
            .lines()
            .find_map(|line| line.strip_prefix("durable_sessions_slept_total "))
            .map_or(0, |value| value.parse::<f64>().unwrap() as usize);
        if slept >= count || Instant::now() > deadline {
            return slept;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Part 4: SIGKILL a server with running tasks, restart it on the same database, and time
/// how long until every task has committed a step in the new process.
async fn restart(dir: &Path) {
    println!(
        "4. restart after SIGKILL with {CHILD_TASKS} running tasks, each sleeping {:.0} ms before \
         a step",
        BRISK_STEP * 1e3
    );
    let db = dir.join("restart.db");
    let data = dir.join("data");
    let mut server = Server::spawn(&db, &data).await;
    let session = Session::open(server.url.clone()).await;
    start_tasks(&session, CHILD_TASKS, BRISK_STEP).await;
    let database = Database::open(&db).wait_stepping(CHILD_TASKS).await;
    server.kill().await;
    let before = database.steps();
    assert_eq!(before.len(), CHILD_TASKS, "unfinished tasks after the kill");

    let spawned = Instant::now();
    let server = Server::start(&db, &data);
    let recovered = tokio::task::spawn_blocking(move || {
        database.wait("every task stepping again", |db| {
            let now = db.steps();
            before.iter().all(|(id, step)| now.get(id) > Some(step))
        });
        spawned.elapsed()
    });
    let server = server.listening().await;
    // The session outlives the process: the restarted server restores it from the database.
    // A new client, since the old one's pooled connections died with the old process.
    let session = Session {
        http: reqwest::Client::new(),
        url: server.url.clone(),
        ..session
    };
    call(&session, ping_request(1)).await;
    let pinged = spawned.elapsed();
    let recovered = recovered.await.unwrap();
    row(
        "spawn to first ping answered",
        format!("{:.0} ms", ms(pinged)),
        1.0,
        "baseline",
    );
    row(
        &format!("spawn to all {CHILD_TASKS} tasks stepped again"),
        format!("{:.0} ms", ms(recovered)),
        recovered.as_secs_f64() / pinged.as_secs_f64(),
        "target <= 1000 ms",
    );
}

/// Starts `count` long tasks from `session`, `OPENING_CONCURRENCY` calls at a time.
async fn start_tasks(session: &Session, count: usize, step: f64) {
    futures::stream::iter(0..count as u64)
        .map(|i| call(session, start_request(i, long_task(step))))
        .buffer_unordered(OPENING_CONCURRENCY)
        .collect::<Vec<_>>()
        .await;
}

/// The server's database, read directly (read-only) to see what its tasks have committed.
struct Database(Connection);

impl Database {
    fn open(path: &Path) -> Database {
        let conn = Connection::open_with_flags(path, OpenFlags::SQLITE_OPEN_READ_ONLY).unwrap();
        conn.busy_timeout(Duration::from_secs(5)).unwrap();
        Database(conn)
    }

    /// Tasks whose row meets `condition`, an SQL expression.
    fn count(&self, condition: &str) -> usize {
        self.0
            .query_row(
                &format!("SELECT COUNT(*) FROM tasks WHERE {condition}"),
                [],
                |row| row.get(0),
            )
            .unwrap()
    }

    /// Running tasks that have committed at least one step.
    fn stepping(&self) -> usize {
        self.count("status = 'running' AND step > 0")
    }

    /// The step each unfinished task has committed.
    fn steps(&self) -> HashMap<String, u64> {
        let mut stmt = self
            .0
            .prepare_cached("SELECT id, step FROM tasks WHERE status IN ('pending', 'running')")
            .unwrap();
        stmt.query_map([], |row| Ok((row.get(0)?, row.get(1)?)))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap()
    }

    /// Tasks pending or running.
    fn unfinished(&self) -> usize {
        self.count("status IN ('pending', 'running')")
    }

    /// Polls every 5 ms until `done` holds, panicking after `PATIENCE`.
    fn wait(&self, what: &str, done: impl Fn(&Database) -> bool) {
        self.wait_every(Duration::from_millis(5), what, done);
    }

    /// Polls every `interval` until `done` holds, panicking after `PATIENCE`.
    fn wait_every(&self, interval: Duration, what: &str, done: impl Fn(&Database) -> bool) {
        let started = Instant::now();
        while !done(self) {
            assert!(started.elapsed() < PATIENCE, "gave up waiting for {what}");
            std::thread::sleep(interval);
        }
    }

    /// Waits on a blocking thread until `count` tasks are running and have committed a step.
    async fn wait_stepping(self, count: usize) -> Database {
        tokio::task::spawn_blocking(move || {
            self.wait("tasks running and stepping", |db| db.stepping() == count);
            self
        })
        .await
        .unwrap()
    }
}

/// The ceiling in a process of its own, so that its memory can be read beside durable-mcp's.
mod ceiling_process {
    use std::path::Path;

    use super::support::child::{self, Server};

    const CEILING: &str = "ceiling";

    /// The child's side: serves the ceiling on `127.0.0.1:0` and prints the bound address.
    fn main() {
        child::exit_with_parent();
        let runtime = tokio::runtime::Runtime::new().unwrap();
        runtime.block_on(async {
            let served = super::support::ceiling::serve().await;
            child::announce(
                served
                    .url
                    .trim_start_matches("http://")
                    .trim_end_matches("/mcp"),
            );
            std::future::pending::<()>().await
        });
    }

    /// Runs this process's role, if it is a child: the ceiling, or durable-mcp.
    pub fn run_role() -> bool {
        match child::role().as_deref() {
            Some(CEILING) => main(),
            Some(_) => child::serve(),
            None => return false,
        }
        true
    }

    /// Starts the ceiling in a process of its own and waits until it listens.
    pub async fn spawn(dir: &Path) -> Server {
        Server::start_as(CEILING, dir, dir, &[]).listening().await
    }
}

fn main() {
    if ceiling_process::run_role() {
        return;
    }
    // Parts named on the command line (`-- idle memory`), else all; cargo passes `--bench`.
    let named: Vec<String> = std::env::args()
        .skip(1)
        .filter(|arg| !arg.starts_with("--"))
        .collect();
    let wanted = |part: &str| named.is_empty() || named.iter().any(|name| name == part);
    let dir = tempfile::tempdir().unwrap();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        if wanted("throughput") {
            throughput(dir.path()).await;
        }
        if wanted("idle") {
            idle_sessions_and_busy_engine(dir.path()).await;
        }
        if wanted("memory") {
            memory(dir.path()).await;
        }
        if wanted("restart") {
            restart(dir.path()).await;
        }
    });
}
