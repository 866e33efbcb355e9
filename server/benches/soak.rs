//! Soak: durable-mcp in a process of its own, under half the load it can carry at most, for
//! ten minutes, while clients drop their connections at random and the server is SIGKILLed
//! once a minute (and restarted at once on the same port and database). Prints:
//!
//! - the maximum load (operations a second, closed loop, no faults) measured first, in the
//!   same run, and the rate the soak then keeps;
//! - errors, which must be 0: any refused request, wrong result or broken stream that no kill
//!   explains (a request cut by a kill is retried the way a resilient client would: a dropped
//!   call is resumed from its last event id, or called again to attach to its task);
//! - the server's resident memory (VmRSS) at the start and just before each kill, which must
//!   stay flat;
//! - tasks lost, which must be 0: tasks not completed at the end, and results that differ
//!   from an uninterrupted run of the same arguments (each `start_batch_processing` result
//!   carries a SHA-256 chain over its items in order, each `resumable_data_processing` result
//!   the sum of its records).
//!
//! The load is a mix of three operations on 16 long-lived sessions, one in ten on a fresh
//! session that is then abandoned: `resumable_data_processing` called in the request (a
//! quarter of them dropped after their first progress message and resumed with
//! `Last-Event-ID`), `start_batch_processing`, and `resources/read` of a started task's status.
//!
//! Run with `cargo bench -p durable-mcp-server --bench soak` (about 12 minutes);
//! `DURABLE_SOAK_SECONDS` shortens the soak for a try.

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use durable_shared::sse::{SseEvent, take_event};
use futures::StreamExt;
use rand::Rng;
use rusqlite::{Connection, OpenFlags};
use serde_json::{Value, json};
use support::Session;
use support::child::{self, Server};
use tokio::sync::{Semaphore, watch};

// Shared by the benches; the soak's server runs only in a process of its own.
#[allow(dead_code)]
mod support;

/// How long the soak runs unless `DURABLE_SOAK_SECONDS` says otherwise.
const SOAK: Duration = Duration::from_secs(600);
const KILL_EVERY: Duration = Duration::from_secs(60);
/// The closed-loop run that measures the maximum load, and its concurrency.
const PROBE: Duration = Duration::from_secs(20);
const PROBE_WORKERS: usize = 64;
/// Operations the soak lets wait on a slow or restarting server before it skips new ones (and
/// says how many it skipped).
const MAX_IN_FLIGHT: usize = 1_024;
const SESSIONS: usize = 16;
/// Task delays are scaled by this: a processing batch takes 20 ms, a batch-tool step 10 ms.
const TIME_SCALE: f64 = 0.02;
const DISCONNECT_CHANCE: f64 = 0.25;
const ABANDONED_SESSION_CHANCE: f64 = 0.1;
/// Processing datasets; each call has a client id of its own, so each is a task of its own.
const DATASETS: [&str; 4] = ["soak-a", "soak-b", "soak-c", "soak-d"];
/// The longest any one request or resumed stream may take before it counts as an error.
const REQUEST_DEADLINE: Duration = Duration::from_secs(60);
/// How long the end of the soak waits for every started task to complete.
const SETTLE: Duration = Duration::from_secs(180);

fn processing_arguments(dataset: &str, client_id: &str) -> Value {
    json!({"dataset_name": dataset, "total_records": 40, "batch_size": 10,
           "client_id": client_id})
}

fn batch_arguments() -> Value {
    json!({"batch_size": 4, "total_items": 12, "processing_delay": 0.5})
}

fn tool_call(id: u64, name: &str, arguments: Value) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {
           "name": name, "arguments": arguments, "_meta": {"progressToken": id}}})
}

/// Why an operation did not go through.
enum Fault {
    /// The connection broke or the server answered 5xx while it was being killed or restarted:
    /// a client retries. Says what the cut looked like, for the report if cuts go on.
    Cut(String),
    /// A resumption refused with 410 because nothing will answer the call any more (its
    /// handler died with a killed server before the answer was stored): the client calls again.
    Gone,
    /// Anything else: counted as an error.
    Wrong(String),
}

type Outcome<T> = Result<T, Fault>;

/// The server under soak: where it is, and whether it is up. `generation` counts the kills, so
/// that an operation can tell whether a kill explains a failure it saw.
struct Target {
    url: String,
    http: reqwest::Client,
    generation: AtomicU64,
    up: watch::Sender<bool>,
    ids: AtomicU64,
}

impl Target {
    fn id(&self) -> u64 {
        self.ids.fetch_add(1, Ordering::Relaxed)
    }

    async fn wait_up(&self) {
        let mut up = self.up.subscribe();
        let _ = tokio::time::timeout(REQUEST_DEADLINE, up.wait_for(|up| *up)).await;
    }

    /// A failure seen by an operation that began in `generation`: a cut if a kill came since
    /// (or is under way), else `wrong`.
    fn explain(&self, generation: u64, wrong: String) -> Fault {
        if self.generation.load(Ordering::SeqCst) != generation || !*self.up.borrow() {
            Fault::Cut(wrong)
        } else {
            Fault::Wrong(wrong)
        }
    }

    /// POSTs `body` on `session` and returns the response, checked for a 2xx status.
    async fn post(
        &self,
        session: &Session,
        generation: u64,
        body: &Value,
    ) -> Outcome<reqwest::Response> {
        let request = session.http.post(&self.url).json(body);
        self.send(session, generation, request).await
    }

    /// Resumes the stream that event `last_event_id` was on.
    async fn resume(
        &self,
        session: &Session,
        generation: u64,
        last_event_id: &str,
    ) -> Outcome<reqwest::Response> {
        let request = session
            .http
            .get(&self.url)
            .header("Last-Event-ID", last_event_id);
        self.send(session, generation, request).await
    }

    /// Sends `request` on `session`, within `REQUEST_DEADLINE`, and checks its status.
    async fn send(
        &self,
        session: &Session,
        generation: u64,
        request: reqwest::RequestBuilder,
    ) -> Outcome<reqwest::Response> {
        let sent = request
            .timeout(REQUEST_DEADLINE)
            .header("Accept", "application/json, text/event-stream")
            .header("Mcp-Session-Id", &session.session)
            .header("MCP-Protocol-Version", "2025-11-25")
            .send()
            .await;
        let response =
            sent.map_err(|e| self.explain(generation, format!("request failed: {e}")))?;
        let status = response.status();
        if status.is_success() {
            Ok(response)
        } else if status == reqwest::StatusCode::GONE {
            Err(Fault::Gone)
        } else {
            Err(self.explain(generation, format!("HTTP {status}")))
        }
    }
}

/// SSE events read one at a time from a response, remembering the last event id; or the one
/// message of a JSON response (a session's reads are answered so).
struct Events {
    body: futures::stream::BoxStream<'static, reqwest::Result<bytes::Bytes>>,
    json: bool,
    pending: Vec<u8>,
    last_id: Option<String>,
    /// The ids of the events read, and how the body ended: what an error report shows.
    ids: Vec<String>,
    ending: Option<String>,
}

impl Events {
    fn new(response: reqwest::Response) -> Events {
        let json = response
            .headers()
            .get("content-type")
            .is_some_and(|value| value.as_bytes().starts_with(b"application/json"));
        Events {
            json,
            body: response.bytes_stream().boxed(),
            pending: Vec::new(),
            last_id: None,
            ids: Vec::new(),
            ending: None,
        }
    }

    /// The next JSON-RPC message, or None at the end of the stream (clean or cut).
    async fn next_message(&mut self) -> Option<Value> {
        loop {
            while !self.json
                && let Some(raw) = take_event(&mut self.pending)
            {
                let Some(event) = SseEvent::parse(&String::from_utf8_lossy(&raw)) else {
                    continue;
                };
                if let Some(id) = &event.id {
                    self.last_id = Some(id.clone());
                    self.ids.push(id.clone());
                }
                if !event.is_priming()
                    && let Ok(message) = serde_json::from_str(&event.data)
                {
                    return Some(message);
                }
            }
            match self.body.next().await {
                Some(Ok(chunk)) => self.pending.extend_from_slice(&chunk),
                Some(Err(e)) => {
                    self.ending = Some(format!("broke: {e}"));
                    return None;
                }
                None if self.json && !self.pending.is_empty() => {
                    self.ending = Some("ended".into());
                    return serde_json::from_slice(&std::mem::take(&mut self.pending)).ok();
                }
                None => {
                    self.ending = Some("ended".into());
                    return None;
                }
            }
        }
    }

    /// The answer (the message with an id), skipping notifications before it.
    async fn answer(&mut self) -> Option<Value> {
        loop {
            let message = self.next_message().await?;
            if message.get("id").is_some() {
                return Some(message);
            }
        }
    }
}

/// The tool result in a JSON-RPC answer, or why there is none.
fn tool_result(message: &Value) -> Result<Value, String> {
    let result = &message["result"];
    if result.is_object() && result["isError"] != true {
        Ok(result["structuredContent"].clone())
    } else {
        Err(format!("refused: {message}"))
    }
}

/// What the soak saw.
#[derive(Default)]
struct Tally {
    operations: AtomicU64,
    errors: AtomicU64,
    first_errors: Mutex<Vec<String>>,
    /// Requests cut by a kill, and retried.
    cut: AtomicU64,
    /// Calls dropped on purpose and resumed with Last-Event-ID.
    dropped: AtomicU64,
    /// Calls whose resumption was refused (410: killed before anything could answer them) and
    /// that were sent again.
    called_again: AtomicU64,
    /// Operations not started because `MAX_IN_FLIGHT` were still waiting.
    skipped: AtomicU64,
}

impl Tally {
    fn error(&self, what: String) {
        self.errors.fetch_add(1, Ordering::Relaxed);
        let mut first = self.first_errors.lock().unwrap();
        if first.len() < 5 {
            first.push(what);
        }
    }
}

/// What every operation needs: the target, the expected results, the long-lived sessions and
/// the tasks started so far.
struct Soak {
    target: Target,
    tally: Tally,
    sessions: Vec<Session>,
    expected_sums: HashMap<&'static str, u64>,
    expected_digest: String,
    started: Mutex<Vec<String>>,
    /// The last event id of each processing call that never got its answer (None: no event
    /// came), whose stored stream and binding the report shows.
    hung: Mutex<Vec<Option<String>>>,
    /// Whether clients drop calls and abandon sessions (not while the maximum is measured).
    faults: AtomicBool,
}

impl Soak {
    /// A session for one operation: a long-lived one, or now and then a fresh one that is
    /// abandoned afterwards (a client that went away without a word).
    async fn session(&self) -> Session {
        let (abandon, index) = {
            let mut rng = rand::rng();
            (
                rng.random_bool(ABANDONED_SESSION_CHANCE),
                rng.random_range(0..self.sessions.len()),
            )
        };
        if abandon && self.faults.load(Ordering::Relaxed) {
            loop {
                self.target.wait_up().await;
                let generation = self.target.generation.load(Ordering::SeqCst);
                let opened = tokio::time::timeout(
                    REQUEST_DEADLINE,
                    Session::try_open_with(self.target.http.clone(), self.target.url.clone()),
                )
                .await;
                match opened {
                    Ok(Ok(session)) => return session,
                    Ok(Err(e)) => match self.target.explain(generation, e) {
                        Fault::Cut(_) => self.tally.cut.fetch_add(1, Ordering::Relaxed),
                        Fault::Wrong(e) => {
                            self.tally.error(format!("opening a session: {e}"));
                            break;
                        }
                        Fault::Gone => {
                            self.tally.error("opening a session: HTTP 410 Gone".into());
                            break;
                        }
                    },
                    Err(_) => {
                        self.tally.error("opening a session timed out".into());
                        break;
                    }
                };
            }
        }
        self.sessions[index].clone()
    }

    /// One operation of the mix, retried while kills cut it.
    async fn operation(&self) {
        let session = self.session().await;
        let pick = rand::rng().random_range(0..10);
        let outcome = match pick {
            0..4 => self.process(&session).await,
            4..7 => self.start_batch(&session).await,
            _ => self.read_status(&session).await,
        };
        match outcome {
            Ok(()) => {
                self.tally.operations.fetch_add(1, Ordering::Relaxed);
            }
            Err(what) => self.tally.error(what),
        }
    }

    /// Waits until the server is up, and returns the generation an attempt begins in.
    async fn begin(&self) -> u64 {
        self.target.wait_up().await;
        self.target.generation.load(Ordering::SeqCst)
    }

    /// After a failed attempt at `what`: Ok to try again if a kill cut it (and `deadline` has
    /// not passed), else the error.
    async fn after(&self, fault: Fault, what: &str, deadline: Instant) -> Result<(), String> {
        match fault {
            Fault::Wrong(e) => Err(format!("{what}: {e}")),
            Fault::Gone => Err(format!("{what}: HTTP 410 Gone")),
            Fault::Cut(_) if Instant::now() < deadline => {
                self.tally.cut.fetch_add(1, Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(50)).await;
                Ok(())
            }
            Fault::Cut(last) => Err(format!("{what}: still cut after {SETTLE:?}, last: {last}")),
        }
    }

    /// Sends `body` (made afresh for each attempt, with a new id) and reads its answer,
    /// retried while kills cut it.
    async fn request(
        &self,
        what: &str,
        session: &Session,
        body: impl Fn(u64) -> Value,
    ) -> Result<Value, String> {
        let deadline = Instant::now() + SETTLE;
        loop {
            let generation = self.begin().await;
            let answer = async {
                let response = self
                    .target
                    .post(session, generation, &body(self.target.id()))
                    .await?;
                let mut events = Events::new(response);
                match tokio::time::timeout(REQUEST_DEADLINE, events.answer()).await {
                    Ok(Some(message)) => Ok(message),
                    Ok(None) => Err(self.target.explain(generation, "no answer".into())),
                    Err(_) => Err(Fault::Wrong("no answer in time".into())),
                }
            };
            match answer.await {
                Ok(message) => return Ok(message),
                Err(fault) => self.after(fault, what, deadline).await?,
            }
        }
    }

    /// `resumable_data_processing` in the request, its answer checked against the
    /// uninterrupted run. A dropped or cut stream is resumed after its last event id; a call
    /// cut before any event id came is called again, which attaches to the same task.
    async fn process(&self, session: &Session) -> Result<(), String> {
        let dataset = DATASETS[rand::rng().random_range(0..DATASETS.len())];
        let client_id = format!("soak-{}", self.target.id());
        let mut drop_early =
            self.faults.load(Ordering::Relaxed) && rand::rng().random_bool(DISCONNECT_CHANCE);
        let mut last_id: Option<String> = None;
        let deadline = Instant::now() + SETTLE;
        let answer = loop {
            let generation = self.begin().await;
            let attempt = self.process_attempt(
                session,
                generation,
                (dataset, &client_id),
                &mut last_id,
                &mut drop_early,
            );
            match attempt.await {
                Ok(Some(answer)) => break answer,
                Ok(None) => {}
                Err(Fault::Gone) => {
                    self.tally.called_again.fetch_add(1, Ordering::Relaxed);
                    last_id = None;
                }
                Err(fault) => {
                    if let Err(e) = self
                        .after(fault, "resumable_data_processing", deadline)
                        .await
                    {
                        self.hung.lock().unwrap().push(last_id.clone());
                        return Err(format!("{e} ({client_id}, last event {last_id:?})"));
                    }
                }
            }
        };
        let result = tool_result(&answer)?;
        let expected = self.expected_sums[dataset];
        if result["value_sum"] != expected {
            return Err(format!(
                "{dataset}: value_sum {} where an uninterrupted run gives {expected}",
                result["value_sum"]
            ));
        }
        Ok(())
    }

    /// One attempt at a processing call: calls (or, once an event id came, resumes) and reads
    /// until the answer, or None when this client dropped the stream on purpose.
    async fn process_attempt(
        &self,
        session: &Session,
        generation: u64,
        (dataset, client_id): (&str, &str),
        last_id: &mut Option<String>,
        drop_early: &mut bool,
    ) -> Outcome<Option<Value>> {
        let resumed_after = last_id.clone();
        let response = match last_id.as_deref() {
            Some(id) => self.target.resume(session, generation, id).await?,
            None => {
                let body = tool_call(
                    self.target.id(),
                    "resumable_data_processing",
                    processing_arguments(dataset, client_id),
                );
                self.target.post(session, generation, &body).await?
            }
        };
        let mut events = Events::new(response);
        let read = tokio::time::timeout(REQUEST_DEADLINE, async {
            while let Some(message) = events.next_message().await {
                if message.get("id").is_some() {
                    return Ok(Some(message));
                }
                if *drop_early && events.last_id.is_some() {
                    *drop_early = false;
                    self.tally.dropped.fetch_add(1, Ordering::Relaxed);
                    return Ok(None);
                }
            }
            let wrong = format!(
                "the stream ({}) {} before the answer, after events {:?}",
                match &resumed_after {
                    Some(id) => format!("resumed after {id}"),
                    None => "posted".into(),
                },
                events.ending.as_deref().unwrap_or("stopped"),
                events.ids
            );
            Err(self.target.explain(generation, wrong))
        });
        let read = read.await;
        if events.last_id.is_some() {
            *last_id = events.last_id;
        }
        read.unwrap_or_else(|_| {
            Err(Fault::Wrong(format!(
                "no answer within {REQUEST_DEADLINE:?}"
            )))
        })
    }

    /// `start_batch_processing`, whose task is checked at the end.
    async fn start_batch(&self, session: &Session) -> Result<(), String> {
        let answer = self
            .request("start_batch_processing", session, |id| {
                tool_call(id, "start_batch_processing", batch_arguments())
            })
            .await?;
        let result = tool_result(&answer)?;
        let task_id = result["task_id"]
            .as_str()
            .ok_or_else(|| format!("no task id in {result}"))?;
        self.started.lock().unwrap().push(task_id.to_owned());
        Ok(())
    }

    /// Reads the status of a task started earlier.
    async fn read_status(&self, session: &Session) -> Result<(), String> {
        let task_id = {
            let started = self.started.lock().unwrap();
            if started.is_empty() {
                return Ok(());
            }
            started[rand::rng().random_range(0..started.len())].clone()
        };
        self.task(session, &task_id).await.map(|_| ())
    }

    /// The status of `task_id` once it has ended, or as it is at `deadline`.
    async fn ended(&self, task_id: &str, deadline: Instant) -> Result<Value, String> {
        loop {
            let task = self.task(&self.sessions[0], task_id).await?;
            let ended = ["completed", "failed", "cancelled"]
                .contains(&task["status"].as_str().unwrap_or(""));
            if ended || Instant::now() >= deadline {
                return Ok(task);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The status of `task_id`.
    async fn task(&self, session: &Session, task_id: &str) -> Result<Value, String> {
        let uri = format!("task://status/{task_id}");
        let answer = self
            .request("resources/read", session, |id| {
                json!({"jsonrpc": "2.0", "id": id, "method": "resources/read",
                       "params": {"uri": uri}})
            })
            .await?;
        let text = answer["result"]["contents"][0]["text"]
            .as_str()
            .ok_or_else(|| format!("no status in {answer}"))?;
        serde_json::from_str(text).map_err(|e| format!("unreadable status {text:?}: {e}"))
    }
}

/// Runs operations back to back on `workers` loops for `duration`; the operations a second.
async fn closed_loop(soak: &Arc<Soak>, workers: usize, duration: Duration) -> f64 {
    let before = soak.tally.operations.load(Ordering::Relaxed);
    let started = Instant::now();
    let loops: Vec<_> = (0..workers)
        .map(|_| {
            let soak = soak.clone();
            tokio::spawn(async move {
                while started.elapsed() < duration {
                    soak.operation().await;
                }
            })
        })
        .collect();
    for worker in loops {
        worker.await.expect("load loop");
    }
    (soak.tally.operations.load(Ordering::Relaxed) - before) as f64
        / started.elapsed().as_secs_f64()
}

/// Spawns `rate` operations a second for `duration`, each waiting as long as it must.
async fn open_loop(soak: &Arc<Soak>, rate: f64, duration: Duration) {
    let room = Arc::new(Semaphore::new(MAX_IN_FLIGHT));
    let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / rate));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let started = Instant::now();
    while started.elapsed() < duration {
        tick.tick().await;
        let Ok(permit) = room.clone().try_acquire_owned() else {
            soak.tally.skipped.fetch_add(1, Ordering::Relaxed);
            continue;
        };
        let soak = soak.clone();
        tokio::spawn(async move {
            soak.operation().await;
            drop(permit);
        });
    }
    // Every operation in flight ends (each is bounded by its retries' deadline).
    let _ = room.acquire_many(MAX_IN_FLIGHT as u32).await;
}

/// The server process, restarted on the same port and database after each kill.
struct Process {
    server: Server,
    db: std::path::PathBuf,
    data: std::path::PathBuf,
    port: u16,
}

impl Process {
    async fn start(db: &Path, data: &Path, port: u16) -> Server {
        let env = [
            ("PORT", port.to_string()),
            ("TIME_SCALE", TIME_SCALE.to_string()),
        ];
        Server::start_as(child::SERVE, db, data, &env)
            .healthy()
            .await
    }

    async fn kill_and_restart(&mut self, target: &Target) {
        target.up.send_replace(false);
        target.generation.fetch_add(1, Ordering::SeqCst);
        self.server.kill().await;
        self.server = Process::start(&self.db, &self.data, self.port).await;
        target.up.send_replace(true);
    }
}

/// Tasks in the database that are not completed, by status.
fn unfinished(db: &Path) -> Vec<(String, u64)> {
    let connection = Connection::open_with_flags(db, OpenFlags::SQLITE_OPEN_READ_ONLY).unwrap();
    let mut query = connection
        .prepare("SELECT status, count(*) FROM tasks WHERE status != 'completed' GROUP BY status")
        .unwrap();
    query
        .query_map([], |row| Ok((row.get(0)?, row.get(1)?)))
        .unwrap()
        .map(Result::unwrap)
        .collect()
}

fn tasks_in(db: &Path) -> u64 {
    let connection = Connection::open_with_flags(db, OpenFlags::SQLITE_OPEN_READ_ONLY).unwrap();
    connection
        .query_row("SELECT count(*) FROM tasks", [], |row| row.get(0))
        .unwrap()
}

fn soak_duration() -> Duration {
    std::env::var("DURABLE_SOAK_SECONDS")
        .ok()
        .map(|seconds| Duration::from_secs(seconds.parse().expect("DURABLE_SOAK_SECONDS")))
        .unwrap_or(SOAK)
}

async fn run(dir: &Path) {
    let (db, data) = (dir.join("soak.db"), dir.join("data"));
    // The first process picks a free port; its successors take the same one.
    let first = Process::start(&db, &data, 0).await;
    let port = first
        .url
        .trim_start_matches("http://127.0.0.1:")
        .trim_end_matches("/mcp")
        .parse()
        .expect("the server's port");
    let mut process = Process {
        server: first,
        db: db.clone(),
        data,
        port,
    };
    let url = process.server.url.clone();
    let http = reqwest::Client::new();
    let mut sessions = Vec::new();
    for _ in 0..SESSIONS {
        sessions.push(Session::open_with(http.clone(), url.clone()).await);
    }
    let target = Target {
        url: url.clone(),
        http,
        generation: AtomicU64::new(0),
        up: watch::Sender::new(true),
        ids: AtomicU64::new(1),
    };

    // The uninterrupted runs every result is compared with.
    let baseline = Soak {
        target,
        tally: Tally::default(),
        sessions,
        expected_sums: HashMap::new(),
        expected_digest: String::new(),
        started: Mutex::new(Vec::new()),
        hung: Mutex::new(Vec::new()),
        faults: AtomicBool::new(false),
    };
    let mut expected_sums = HashMap::new();
    for dataset in DATASETS {
        let arguments = processing_arguments(dataset, "soak-baseline");
        let answer = baseline
            .request("the uninterrupted run", &baseline.sessions[0], |id| {
                tool_call(id, "resumable_data_processing", arguments.clone())
            })
            .await
            .unwrap();
        let result = tool_result(&answer).unwrap();
        expected_sums.insert(dataset, result["value_sum"].as_u64().unwrap());
    }
    baseline.start_batch(&baseline.sessions[0]).await.unwrap();
    let baseline_task = baseline.started.lock().unwrap().pop().unwrap();
    let baseline_task = baseline
        .ended(&baseline_task, Instant::now() + SETTLE)
        .await
        .unwrap();
    assert_eq!(baseline_task["status"], "completed", "{baseline_task}");
    let expected_digest = baseline_task["result_data"]["digest"]
        .as_str()
        .unwrap()
        .to_owned();
    let soak = Arc::new(Soak {
        expected_sums,
        expected_digest,
        ..baseline
    });

    let maximum = closed_loop(&soak, PROBE_WORKERS, PROBE).await;
    let rate = maximum / 2.0;
    let duration = soak_duration();
    println!(
        "maximum load: {maximum:.0} operations/s ({PROBE_WORKERS} loops, {} s, no faults); \
         soaking at {rate:.0}/s for {} s with a SIGKILL every {} s",
        PROBE.as_secs(),
        duration.as_secs(),
        KILL_EVERY.as_secs()
    );
    let before = soak.tally.operations.load(Ordering::Relaxed);
    soak.faults.store(true, Ordering::Relaxed);
    let rss_start = process.server.rss_mib();
    let db_start = std::fs::metadata(&db).unwrap().len();
    let load = tokio::spawn({
        let soak = soak.clone();
        async move { open_loop(&soak, rate, duration).await }
    });
    let started = Instant::now();
    let mut before_kills = Vec::new();
    while started.elapsed() + KILL_EVERY <= duration {
        tokio::time::sleep(KILL_EVERY).await;
        before_kills.push(process.server.rss_mib());
        process.kill_and_restart(&soak.target).await;
    }
    load.await.expect("the soak's load");
    let rss_end = process.server.rss_mib();
    let db_end = std::fs::metadata(&db).unwrap().len();

    // Every task started, in the end completed with the uninterrupted run's result.
    let started_tasks = soak.started.lock().unwrap().clone();
    let settle = Instant::now() + SETTLE;
    let lost: Vec<String> = futures::stream::iter(&started_tasks)
        .map(|task_id| {
            let soak = &soak;
            async move {
                match soak.ended(task_id, settle).await {
                    Ok(task) if task["status"] != "completed" => {
                        Some(format!("{task_id}: {}", task["status"]))
                    }
                    Ok(task) if task["result_data"]["digest"] != soak.expected_digest.as_str() => {
                        Some(format!("{task_id}: a different digest"))
                    }
                    Ok(_) => None,
                    Err(e) => Some(format!("{task_id}: {e}")),
                }
            }
        })
        .buffer_unordered(SESSIONS)
        .filter_map(std::future::ready)
        .collect()
        .await;
    // Any task still unfinished in the database (started by a request a kill cut before its
    // answer came, say) has been left behind.
    let mut left = unfinished(&db);
    while !left.is_empty() && Instant::now() < settle {
        tokio::time::sleep(Duration::from_millis(100)).await;
        left = unfinished(&db);
    }

    let tally = &soak.tally;
    let done = tally.operations.load(Ordering::Relaxed) - before;
    println!(
        "operations: {done} in {} s ({:.0}/s), {} skipped while {MAX_IN_FLIGHT} waited",
        duration.as_secs(),
        done as f64 / duration.as_secs_f64(),
        tally.skipped.load(Ordering::Relaxed)
    );
    println!(
        "faults: {} kills, {} requests cut by a kill and retried, {} calls dropped and resumed, \
         {} calls sent again after their resumption was refused (410)",
        before_kills.len(),
        tally.cut.load(Ordering::Relaxed),
        tally.dropped.load(Ordering::Relaxed),
        tally.called_again.load(Ordering::Relaxed)
    );
    println!(
        "errors: {} (must be 0){}",
        tally.errors.load(Ordering::Relaxed),
        tally
            .first_errors
            .lock()
            .unwrap()
            .iter()
            .map(|e| format!("\n  {e}"))
            .collect::<String>()
    );
    let series: Vec<String> = before_kills.iter().map(|rss| format!("{rss:.1}")).collect();
    println!(
        "RSS: {rss_start:.1} MiB at the start, {rss_end:.1} MiB at the end; before each kill: \
         [{}] MiB (must be flat)",
        series.join(", ")
    );
    println!(
        "database: {:.1} MiB at the start, {:.1} MiB at the end, {} tasks",
        db_start as f64 / 1048576.0,
        db_end as f64 / 1048576.0,
        tasks_in(&db)
    );
    println!(
        "tasks lost: {} of {} started (must be 0){}; unfinished in the database: {left:?}",
        lost.len(),
        started_tasks.len(),
        lost.iter()
            .take(5)
            .map(|e| format!("\n  {e}"))
            .collect::<String>()
    );
    for last_id in soak.hung.lock().unwrap().iter().take(5) {
        println!(
            "a call that never got its answer: {}",
            stored_call(&db, last_id.as_deref())
        );
    }
    process.server.kill().await;
}

/// What the database holds of the stream event `last_id` was on and of the call it answers.
fn stored_call(db: &Path, last_id: Option<&str>) -> String {
    let Some(last_id) = last_id else {
        return "no event came".into();
    };
    let token = last_id.split('.').next().unwrap_or_default();
    let connection = Connection::open_with_flags(db, OpenFlags::SQLITE_OPEN_READ_ONLY).unwrap();
    let rows = |sql: &str| -> Vec<String> {
        let mut query = connection.prepare(sql).unwrap();
        let columns = query.column_count();
        query
            .query_map([token], |row| {
                (0..columns)
                    .map(|i| {
                        row.get::<_, rusqlite::types::Value>(i)
                            .map(|v| format!("{v:?}"))
                    })
                    .collect::<Result<Vec<_>, _>>()
                    .map(|values| values.join(" "))
            })
            .unwrap()
            .map(Result::unwrap)
            .collect()
    };
    let stream =
        rows("SELECT token, session_id, next_seq, finished, call_id FROM streams WHERE token = ?1");
    let events =
        rows("SELECT seq, substr(message, 1, 120) FROM events WHERE token = ?1 ORDER BY seq");
    let bindings = rows(
        "SELECT b.id, b.task_id, b.instance, b.stream_token, b.done, t.status, t.progress \
         FROM call_bindings b LEFT JOIN tasks t ON t.id = b.task_id \
         WHERE b.stream_token = ?1 OR b.id = (SELECT call_id FROM streams WHERE token = ?1)",
    );
    format!(
        "last event {last_id}\n    stream {stream:?}\n    events {events:#?}\n    bindings {bindings:?}"
    )
}

fn main() {
    if child::role().is_some() {
        return child::serve();
    }
    let dir = tempfile::tempdir().unwrap();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(run(dir.path()));
}
