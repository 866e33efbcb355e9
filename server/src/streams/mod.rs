//! Resumable streams: rmcp's `EventStore` and `SessionStore` on SQLite, so that every SSE event
//! a client could read is durable before it is sent, a client that reconnects with
//! `Last-Event-ID` gets exactly what it missed and then the live events of that stream, and
//! sessions outlive the process.
//!
//! rmcp writes every server message through [`StreamStore::store_event`] before it hands it to
//! the connection, whether or not a connection is listening, and every one a client could ever
//! read is stored (not the standalone stream's before any GET asked for it: see
//! [`StreamStore::store_event`]). A resumed stream therefore never needs rmcp's in-memory
//! channels: [`StreamStore::replay_events_after`] replays the stored
//! events after the given id and then tails the stream from the store, woken by each append. A
//! request's stream ends after its final response; the standalone stream never ends on its own.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use rmcp::model::{
    CustomNotification, CustomRequest, CustomResult, ErrorData, JsonRpcError, JsonRpcNotification,
    JsonRpcRequest, JsonRpcResponse, JsonRpcVersion2_0, ProtocolVersion, RequestId,
    ServerJsonRpcMessage, ServerNotification, ServerRequest, ServerResult,
};
use rmcp::transport::common::server_side_http::ServerSseMessage;
use rmcp::transport::streamable_http_server::session::{
    EventId as RmcpEventId, EventStore, EventStoreError, EventStream, SessionState, SessionStore,
    SessionStoreError,
};
use tokio::sync::{Notify, broadcast, mpsc};
use tokio_util::sync::CancellationToken;

pub use durable_shared::EventId;

use crate::counts::Counts;
pub use crate::store::{CallBinding, NewEvent, Refusal, StoreError, StreamInfo};
use crate::store::{Change, Store, StoredEvent};
use crate::telemetry;

/// Key in a progress notification's `_meta` naming the call binding it belongs to: how the store
/// learns which stream a durable tool call answers on.
pub const BINDING_META_KEY: &str = "durable-mcp/call";

/// The protocol versions served with sessions, newest first: resumption is per session.
pub const PROTOCOL_VERSIONS: [ProtocolVersion; 3] = [
    ProtocolVersion::V_2025_11_25,
    ProtocolVersion::V_2025_06_18,
    ProtocolVersion::V_2025_03_26,
];

/// Every protocol version served, newest first: 2026-07-28 without sessions (see
/// `http::stateless`), then the session versions.
pub const SERVED_VERSIONS: [ProtocolVersion; 4] = [
    ProtocolVersion::V_2026_07_28,
    ProtocolVersion::V_2025_11_25,
    ProtocolVersion::V_2025_06_18,
    ProtocolVersion::V_2025_03_26,
];

/// Events read from the store per query while replaying.
const REPLAY_PAGE: usize = 512;

/// The version a client asking for `requested` gets: the same if served, else the newest.
pub fn negotiated(requested: &str) -> &'static str {
    PROTOCOL_VERSIONS
        .iter()
        .find(|version| version.as_str() == requested)
        .unwrap_or(&PROTOCOL_VERSIONS[0])
        .as_str()
}

/// Whether `version` is the stateless revision 2026-07-28 or a later one: no `initialize`, no
/// session, no resumable stream.
pub fn is_stateless(version: &str) -> bool {
    version >= ProtocolVersion::V_2026_07_28.as_str()
}

/// Whether a session on `version` gets SSE priming events (empty data with an id): only from
/// 2025-11-25 on; older clients fail on empty data.
pub fn wants_priming(version: &str) -> bool {
    version >= ProtocolVersion::V_2025_11_25.as_str()
}

/// The id a POST's call binding takes, chosen by the HTTP layer (which puts it in the request's
/// extensions) and recorded on the POST's stream before its first event, the priming one, goes
/// out. A client holding only that event's id can then still be answered after a crash: a
/// restarted server finds the stream of a call that died before its first progress
/// notification (which links binding and stream otherwise) by this id.
#[derive(Debug, Clone)]
pub struct CallId(pub String);

impl CallId {
    pub fn random() -> CallId {
        // From the thread's generator: `Uuid::new_v4` asks the OS at every call, once per POST.
        CallId(
            uuid::Builder::from_random_bytes(rand::random())
                .into_uuid()
                .to_string(),
        )
    }
}

/// The event and session store, on the server's database. Cheap to clone.
#[derive(Clone)]
pub struct StreamStore {
    inner: Arc<Inner>,
}

struct Inner {
    store: Store,
    /// Wakes the tails of a stream (by token) after each append.
    notifiers: Mutex<HashMap<String, Weak<Notify>>>,
    /// What this process knows of each session it has seen (version, task extension).
    sessions: Mutex<HashMap<String, SessionProfile>>,
    /// Open SSE responses per session: a session with one is in use, however quiet.
    open_streams: Counts,
    /// Open standalone (GET) streams per session: where rmcp sends server-to-client requests.
    standalone: Counts,
    /// Woken whenever a standalone stream opens.
    standalone_opened: Notify,
    /// What this process knows of each session's standalone stream in the store (see
    /// [`StreamStore::store_event`]).
    standalone_streams: Mutex<HashMap<String, StandaloneStream>>,
    /// Sessions that made a request since the last sweep.
    seen: Mutex<HashSet<String>>,
    /// When each session rmcp holds in memory was last active (a request or an open stream),
    /// as of the last sweep: how long it has been dormant.
    last_active: Mutex<HashMap<String, std::time::Instant>>,
    /// Per known session, how this process serves it (see [`StreamStore::serving`]).
    serving: Mutex<HashMap<String, Arc<Serving>>>,
    /// Sessions rmcp restored from the store whose handler has not yet started (see
    /// [`StreamStore::take_restored`]).
    restored: Mutex<HashSet<String>>,
    /// Names this process in call bindings, so a restarted server knows which calls lost their
    /// handler: `{node}/{uuid}`, so that a node restarted under its id can tell its own earlier
    /// processes, which are dead, from other nodes' (see [`Store::keep_alive`]).
    instance: String,
    /// Whether other processes (a fleet's nodes) write to the same database.
    shared: bool,
    shutdown: CancellationToken,
}

impl StreamStore {
    pub fn new(store: Store, node: &str, shutdown: CancellationToken) -> Self {
        let changes = store.changes();
        let streams = StreamStore {
            inner: Arc::new(Inner {
                store,
                notifiers: Mutex::default(),
                sessions: Mutex::default(),
                open_streams: Counts::default(),
                standalone: Counts::default(),
                standalone_opened: Notify::new(),
                standalone_streams: Mutex::default(),
                seen: Mutex::default(),
                last_active: Mutex::default(),
                serving: Mutex::default(),
                restored: Mutex::default(),
                instance: format!("{node}/{}", uuid::Uuid::new_v4()),
                shared: changes.is_some(),
                shutdown,
            }),
        };
        if let Some(changes) = changes {
            tokio::spawn(streams.clone().follow_other_nodes(changes));
        }
        streams
    }

    /// Wakes this process's tails of the streams other nodes append to; all of them when
    /// appends may have been missed (each re-reads the store).
    async fn follow_other_nodes(self, mut changes: broadcast::Receiver<Change>) {
        loop {
            let change = tokio::select! {
                _ = self.inner.shutdown.cancelled() => return,
                change = changes.recv() => change,
            };
            match change {
                Ok(Change::Stream { token }) => self.wake(&token),
                Ok(Change::Task { .. } | Change::Handle { .. }) => {}
                Ok(Change::Resync) | Err(broadcast::error::RecvError::Lagged(_)) => {
                    let notifiers: Vec<Arc<Notify>> = self
                        .inner
                        .notifiers
                        .lock()
                        .expect("notifiers lock")
                        .values()
                        .filter_map(Weak::upgrade)
                        .collect();
                    for notify in notifiers {
                        notify.notify_waiters();
                    }
                }
                Err(broadcast::error::RecvError::Closed) => return,
            }
        }
    }

    /// Whether other processes (a fleet's nodes) write to the same database.
    pub fn is_shared(&self) -> bool {
        self.inner.shared
    }

    /// Wakes the tails of stream `token` in this process.
    fn wake(&self, token: &str) {
        let notify = self
            .inner
            .notifiers
            .lock()
            .expect("notifiers lock")
            .get(token)
            .and_then(Weak::upgrade);
        if let Some(notify) = notify {
            notify.notify_waiters();
        }
    }

    /// What the store knows of the stream with `token`.
    pub async fn stream_info(&self, token: &str) -> Result<Option<StreamInfo>, StoreError> {
        self.inner.store.stream_info(token).await
    }

    /// Whether event `seq` of stream `token` is still stored.
    pub async fn event_exists(&self, token: &str, seq: u64) -> Result<bool, StoreError> {
        self.inner.store.event_exists(token, seq).await
    }

    /// Queues the record that `session_id` received stream `token`, answering the call with
    /// `call_id`: durable once [`StreamStore::durable`] returns.
    pub async fn bind_stream_session(
        &self,
        token: &str,
        session_id: &str,
        call_id: &CallId,
    ) -> Result<(), StoreError> {
        self.inner
            .store
            .queue_stream_session(token, session_id, &call_id.0, &self.inner.instance)
            .await
    }

    /// Returns once every event and record queued before the call is durable (or failed):
    /// what the HTTP layer waits for before it sends a frame (see [`EventStore::store_event`]).
    pub async fn durable(&self) {
        self.inner.store.queued_durable().await;
    }

    /// Whether stream `token` waits for an answer no process will send (see
    /// [`crate::store::StreamRepo::abandoned`]).
    pub async fn abandoned(&self, token: &str) -> Result<bool, StoreError> {
        self.inner
            .store
            .abandoned(token, &self.inner.instance)
            .await
    }

    /// Records that a tool call of this process waits on a task, so that a restarted server can
    /// still deliver the task's progress and result into the call's stream.
    pub async fn bind_call(&self, binding: CallBinding) -> Result<(), StoreError> {
        self.inner
            .store
            .insert_binding(binding, &self.inner.instance)
            .await
    }

    /// Records that a bound call got its final answer.
    pub async fn finish_binding(&self, id: &str) -> Result<(), StoreError> {
        self.inner.store.finish_binding(id).await
    }

    /// Unfinished calls whose handler died with its process, now this process's to finish.
    pub async fn adopt_orphaned_bindings(&self) -> Result<Vec<CallBinding>, StoreError> {
        self.inner
            .store
            .adopt_orphaned_bindings(&self.inner.instance)
            .await
    }

    /// Announces that this process is alive (and the handler of its calls) for `ttl`, and
    /// again every third of it until shutdown, on a database other processes share.
    pub async fn keep_alive(&self, ttl: Duration) -> Result<(), StoreError> {
        let store = &self.inner.store;
        store.keep_alive(&self.inner.instance, ttl).await?;
        if store.changes().is_none() {
            return Ok(());
        }
        let streams = self.clone();
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = streams.inner.shutdown.cancelled() => return,
                    _ = tokio::time::sleep(ttl / 3) => {}
                }
                if let Err(e) = streams
                    .inner
                    .store
                    .keep_alive(&streams.inner.instance, ttl)
                    .await
                {
                    tracing::warn!(error = %e, "cannot announce this process alive; retrying");
                }
            }
        });
        Ok(())
    }

    /// Stores a session's resource subscription (or its removal), so it survives a restart.
    pub async fn set_subscription(
        &self,
        session_id: &str,
        uri: &str,
        subscribed: bool,
    ) -> Result<(), StoreError> {
        self.inner
            .store
            .set_subscription(session_id, uri, subscribed)
            .await
    }

    /// The newest message stored on `stream_id` that contains `needle`.
    pub async fn last_event_containing(
        &self,
        stream_id: &str,
        needle: &str,
    ) -> Result<Option<String>, StoreError> {
        self.inner
            .store
            .last_event_containing(stream_id, needle)
            .await
    }

    /// The stored resource subscriptions of a session.
    pub async fn subscriptions(&self, session_id: &str) -> Result<Vec<String>, StoreError> {
        self.inner.store.subscriptions(session_id).await
    }

    /// Records that `session_id` belongs to the authenticated `subject`.
    pub async fn claim_session(&self, session_id: &str, subject: &str) -> Result<(), StoreError> {
        self.inner.store.claim_session(session_id, subject).await
    }

    /// The subject a session belongs to; `None` for one opened without authorization.
    pub async fn session_subject(&self, session_id: &str) -> Result<Option<String>, StoreError> {
        self.inner.store.session_subject(session_id).await
    }

    /// How many live sessions `subject` has.
    pub async fn sessions_of(&self, subject: &str) -> Result<u64, StoreError> {
        self.inner.store.sessions_of(subject).await
    }

    /// How many SSE responses of `session_id` are open now.
    pub fn open_streams(&self, session_id: &str) -> usize {
        self.inner.open_streams.get(session_id)
    }

    /// SSE responses open now, of all sessions.
    pub fn open_stream_total(&self) -> usize {
        self.inner.open_streams.total()
    }

    /// Sessions this process knows of: opened here or restored from the store since it started,
    /// and not deleted.
    pub fn known_sessions(&self) -> usize {
        self.inner.sessions.lock().expect("sessions lock").len()
    }

    /// Queues `event`, an event of a request's stream (see [`crate::store::StreamRepo::queue_event`]):
    /// its tails are woken once it is durable.
    async fn queue(&self, event: NewEvent) -> Result<EventId, StoreError> {
        let streams = self.clone();
        let durable = Box::new(
            move |stored: Result<(String, u64), StoreError>| match stored {
                Ok((token, _)) => {
                    metrics::counter!(telemetry::EVENTS_APPENDED).increment(1);
                    streams.wake(&token);
                }
                // It goes out all the same (see `store_event`), as an event of a stream that lacks
                // it: a resumption from it is answered with what the stream holds after it.
                Err(e) => tracing::error!(error = e.with_causes(), "cannot store a queued event"),
            },
        );
        let (token, seq) = self.inner.store.queue_event(event, durable).await?;
        Ok(EventId { token, seq })
    }

    /// Appends `event` to its stream, wakes the stream's tails and returns the event's id.
    pub async fn append(&self, event: NewEvent) -> Result<EventId, crate::store::StoreError> {
        let (token, seq) = self.inner.store.append_event(event).await?;
        metrics::counter!(telemetry::EVENTS_APPENDED).increment(1);
        self.wake(&token);
        Ok(EventId { token, seq })
    }

    /// The negotiated protocol version of a session, from memory or the store.
    pub async fn session_version(&self, session_id: &str) -> Option<&'static str> {
        Some(self.session_profile(session_id).await?.version)
    }

    /// What the server knows of a session from its initialize request, from memory or the store.
    pub async fn session_profile(&self, session_id: &str) -> Option<SessionProfile> {
        if let Some(profile) = self
            .inner
            .sessions
            .lock()
            .expect("sessions lock")
            .get(session_id)
        {
            return Some(*profile);
        }
        let state = self.inner.store.load_session(session_id).await.ok()??;
        let state: SessionState = serde_json::from_str(&state).ok()?;
        Some(self.remember(session_id, &state))
    }

    fn remember(&self, session_id: &str, state: &SessionState) -> SessionProfile {
        let params = &state.initialize_params;
        let profile = SessionProfile {
            version: negotiated(params.protocol_version.as_str()),
            tasks_extension: params.capabilities.supports_tasks(),
        };
        self.inner
            .sessions
            .lock()
            .expect("sessions lock")
            .insert(session_id.to_owned(), profile);
        profile
    }

    /// How this process serves stored session `session_id`: its gate and its requests in
    /// flight (see [`Serving`]).
    pub fn serving(&self, session_id: &str) -> Arc<Serving> {
        let mut serving = self.inner.serving.lock().expect("serving lock");
        // Every request of a session comes here: the key is copied only for its first.
        match serving.get(session_id) {
            Some(entry) => entry.clone(),
            None => serving.entry(session_id.to_owned()).or_default().clone(),
        }
    }

    /// Whether rmcp has just restored `session_id` from the store (once per restoration): it was
    /// served by a process that ended, or by another node, and whatever changed since then was
    /// announced to nobody on its behalf.
    pub fn take_restored(&self, session_id: &str) -> bool {
        self.inner
            .restored
            .lock()
            .expect("restored lock")
            .remove(session_id)
    }

    /// Forgets what this process knew of a session that ended.
    fn forget(&self, session_id: &str) {
        self.inner
            .sessions
            .lock()
            .expect("sessions lock")
            .remove(session_id);
        self.inner
            .serving
            .lock()
            .expect("serving lock")
            .remove(session_id);
        self.take_restored(session_id);
        self.inner
            .last_active
            .lock()
            .expect("last active lock")
            .remove(session_id);
        self.inner
            .standalone_streams
            .lock()
            .expect("standalone streams lock")
            .remove(session_id);
    }

    /// Notes that a client asks for the standalone stream of `session_id` (a GET, fresh or
    /// resuming it), before rmcp opens it: from then on every event of that stream is stored,
    /// opening the stream if it has none yet (see [`StreamStore::store_event`]).
    pub fn standalone_asked(&self, session_id: &str) {
        self.inner
            .standalone_streams
            .lock()
            .expect("standalone streams lock")
            .insert(session_id.to_owned(), StandaloneStream::Asked);
    }

    /// Whether nothing sent on the standalone stream of `session_id` can reach its client: no
    /// GET asked for that stream in this process and the store has none (learnt when an event
    /// of it was refused, see [`StreamStore::store_event`]). rmcp would send such an event to
    /// no one, so the notifier need not make it.
    pub fn deaf(&self, session_id: &str) -> bool {
        self.standalone_stream(session_id) == Some(StandaloneStream::Absent)
    }

    fn standalone_stream(&self, session_id: &str) -> Option<StandaloneStream> {
        self.inner
            .standalone_streams
            .lock()
            .expect("standalone streams lock")
            .get(session_id)
            .copied()
    }

    /// Notes that the store refused to continue the standalone stream of `session_id`, unless
    /// a GET asked for it meanwhile. Only on a store no other process writes (elsewhere a GET
    /// on another node may open the stream at any time), and only while the session is known:
    /// an ended one is forgotten for good, though rmcp may still notify it for a moment.
    fn standalone_absent(&self, session_id: &str) {
        if self.is_shared() {
            return;
        }
        // Held across the insert, so that `forget` cannot come in between.
        let sessions = self.inner.sessions.lock().expect("sessions lock");
        if sessions.contains_key(session_id) {
            self.inner
                .standalone_streams
                .lock()
                .expect("standalone streams lock")
                .entry(session_id.to_owned())
                .or_insert(StandaloneStream::Absent);
        }
    }

    /// Notes that a session made a request; the next sweep refreshes its last-seen time.
    pub fn saw(&self, session_id: &str) {
        self.inner
            .seen
            .lock()
            .expect("seen lock")
            .insert(session_id.to_owned());
    }

    /// Marks an SSE response of `session_id` open until the guard drops.
    pub fn open_stream(&self, session_id: &str, standalone: bool) -> OpenStream {
        self.inner.open_streams.add(session_id);
        if standalone {
            self.inner.standalone.add(session_id);
            self.inner.standalone_opened.notify_waiters();
        }
        OpenStream {
            streams: self.clone(),
            session_id: session_id.to_owned(),
            standalone,
        }
    }

    /// Whether `session_id` has a stream open or a request in flight.
    fn in_use(&self, session_id: &str) -> bool {
        self.inner.open_streams.get(session_id) > 0
            || self
                .inner
                .serving
                .lock()
                .expect("serving lock")
                .get(session_id)
                .is_some_and(|serving| serving.in_flight.load(Ordering::Acquire) > 0)
    }

    /// Waits up to `limit` for `session_id` to have a standalone stream open; whether it has.
    ///
    /// rmcp sends a server-to-client request of a session on its standalone stream, and one sent
    /// while none is open is lost to a client that opens one afterwards (a fresh stream replays
    /// nothing), so a request made at a session's start must wait for the client's GET.
    pub async fn until_standalone(&self, session_id: &str, limit: Duration) -> bool {
        let open = || self.inner.standalone.get(session_id) > 0;
        tokio::time::timeout(limit, async {
            loop {
                let opened = self.inner.standalone_opened.notified();
                let mut opened = std::pin::pin!(opened);
                opened.as_mut().enable();
                if open() {
                    return;
                }
                opened.await;
            }
        })
        .await
        .is_ok()
    }

    /// Refreshes the sessions that were active since the last sweep, then returns those idle for
    /// longer than `ttl` (deleted from the store; the caller closes them in rmcp) and prunes
    /// events older than `max_event_age`.
    pub async fn sweep(
        &self,
        ttl: Duration,
        max_event_age: Duration,
    ) -> Result<Vec<String>, crate::store::StoreError> {
        let mut active: Vec<String> = self.inner.seen.lock().expect("seen lock").drain().collect();
        let open: HashSet<String> = self.inner.open_streams.keys().into_iter().collect();
        active.extend(open.iter().cloned());
        {
            let now = std::time::Instant::now();
            let mut last_active = self.inner.last_active.lock().expect("last active lock");
            for id in &active {
                last_active.insert(id.clone(), now);
            }
        }
        let store = &self.inner.store;
        if !active.is_empty() {
            store.touch_sessions(active).await?;
        }
        let now = crate::store::now_ms();
        let mut expired = Vec::new();
        for id in store.idle_sessions(now - ttl.as_millis() as i64).await? {
            if !open.contains(&id) && store.delete_session(&id).await? {
                self.forget(&id);
                expired.push(id);
            }
        }
        let pruned = store
            .prune_before(now - max_event_age.as_millis() as i64)
            .await?;
        if pruned.events + pruned.streams + pruned.bindings > 0 || !expired.is_empty() {
            tracing::info!(
                sessions = expired.len(),
                events = pruned.events,
                streams = pruned.streams,
                bindings = pruned.bindings,
                transactions = pruned.batches,
                "expired sessions, old events and what they left"
            );
        }
        Ok(expired)
    }

    /// Which of the sessions rmcp holds in memory (`resident`) had no request and no open stream
    /// for `after`, as of the last sweep. A session first met here is timed from now.
    pub fn quiet_sessions(&self, resident: Vec<String>, after: Duration) -> Vec<String> {
        let now = std::time::Instant::now();
        let mut last_active = self.inner.last_active.lock().expect("last active lock");
        let resident: HashSet<String> = resident.into_iter().collect();
        last_active.retain(|id, _| resident.contains(id));
        resident
            .into_iter()
            .filter(|id| {
                let since = *last_active.entry(id.clone()).or_insert(now);
                now.duration_since(since) >= after && !self.in_use(id)
            })
            .collect()
    }

    /// Times a quiet session that must stay in memory (it follows something, or a call of it is
    /// in progress) from now again, so that it is asked once per dormancy period, not per sweep.
    pub fn still_awake(&self, session_id: &str) {
        if let Some(since) = self
            .inner
            .last_active
            .lock()
            .expect("last active lock")
            .get_mut(session_id)
        {
            *since = std::time::Instant::now();
        }
    }

    /// Runs `close`, which takes quiet session `session_id` out of rmcp's memory, unless a
    /// request or a stream of it came since it was found quiet; whether it ran. It runs under
    /// the session's serving gate, so no request of the session is between the gate and rmcp
    /// meanwhile, and the session's next request is then served as a stored session's first
    /// (see [`Serving`]), restoring it.
    pub async fn put_to_sleep(&self, session_id: &str, close: impl Future<Output = ()>) -> bool {
        let Ok(mut served) = self.serving(session_id).gate.clone().try_lock_owned() else {
            return false;
        };
        let woke = self
            .inner
            .seen
            .lock()
            .expect("seen lock")
            .contains(session_id)
            || self.in_use(session_id);
        if woke {
            return false;
        }
        close.await;
        *served = false;
        self.inner
            .last_active
            .lock()
            .expect("last active lock")
            .remove(session_id);
        metrics::counter!(telemetry::SESSIONS_SLEPT).increment(1);
        true
    }

    fn notifier(&self, token: &str) -> Arc<Notify> {
        let mut notifiers = self.inner.notifiers.lock().expect("notifiers lock");
        if let Some(notify) = notifiers.get(token).and_then(Weak::upgrade) {
            return notify;
        }
        notifiers.retain(|_, weak| weak.strong_count() > 0);
        let notify = Arc::new(Notify::new());
        notifiers.insert(token.to_owned(), Arc::downgrade(&notify));
        notify
    }

    /// The events of stream `token` after `seq`, then its new ones as they are stored, until
    /// its final response, the client's disconnect or shutdown.
    fn tail(&self, token: String, after: u64) -> EventStream {
        let (tx, rx) = mpsc::channel::<ServerSseMessage>(64);
        let streams = self.clone();
        tokio::spawn(async move {
            let notify = streams.notifier(&token);
            let mut after = after;
            loop {
                // Armed before the query, so an append racing with it is not missed.
                let notified = notify.notified();
                tokio::pin!(notified);
                notified.as_mut().enable();
                let events = match streams
                    .inner
                    .store
                    .events_after(&token, after, REPLAY_PAGE)
                    .await
                {
                    Ok(events) => events,
                    Err(e) => {
                        tracing::error!(error = %e, "cannot read stored events; ending the stream");
                        return;
                    }
                };
                let mut pending: VecDeque<StoredEvent> = events.into();
                if pending.is_empty() {
                    match streams.inner.store.stream_info(&token).await {
                        Ok(Some(info)) if !info.finished => {
                            tokio::select! {
                                _ = &mut notified => continue,
                                _ = tx.closed() => return,
                                _ = streams.inner.shutdown.cancelled() => return,
                            }
                        }
                        // The stream's response is stored: it may have been committed between
                        // the two reads above, so read once more; after it nothing follows.
                        Ok(Some(_)) => match streams
                            .inner
                            .store
                            .events_after(&token, after, REPLAY_PAGE)
                            .await
                        {
                            Ok(events) if !events.is_empty() => pending = events.into(),
                            _ => return,
                        },
                        _ => return,
                    }
                }
                while let Some(event) = pending.pop_front() {
                    after = event.seq;
                    let (message, last) = match decode(&token, &event) {
                        Ok(decoded) => decoded,
                        Err(e) => {
                            tracing::error!(error = %e, "stored event is unreadable; skipping it");
                            continue;
                        }
                    };
                    if tx.send(message).await.is_err() {
                        return;
                    }
                    metrics::counter!(telemetry::EVENTS_REPLAYED).increment(1);
                    if last {
                        return;
                    }
                }
            }
        });
        Box::pin(tokio_stream::wrappers::ReceiverStream::new(rx))
    }
}

/// The members of a stored JSON-RPC message (its `jsonrpc` is always "2.0").
#[derive(serde::Deserialize)]
struct StoredMessage {
    id: Option<RequestId>,
    method: Option<String>,
    params: Option<serde_json::Value>,
    result: Option<serde_json::Value>,
    error: Option<ErrorData>,
}

/// A stored message as it is sent again, with its result or params exactly as stored.
///
/// rmcp sends only its typed messages, so the stored text is parsed, but only as far as its
/// members: rmcp's custom request, notification and result carry params and result as JSON
/// values. rmcp's own parse into its typed messages would lose the fields its types do not
/// model (the 2025-11-25 task shapes, tools' `execution`) or take a result for another type,
/// and it cost as much as all the rest of a replay: it tries each message shape, then each
/// notification type, in turn.
fn replayed(text: &str) -> Result<ServerJsonRpcMessage, serde_json::Error> {
    let StoredMessage {
        id,
        method,
        params,
        result,
        error,
    } = serde_json::from_str(text)?;
    let jsonrpc = JsonRpcVersion2_0;
    Ok(match (id, method, result, error) {
        (Some(id), None, Some(result), None) => ServerJsonRpcMessage::Response(JsonRpcResponse {
            jsonrpc,
            id,
            result: ServerResult::CustomResult(CustomResult(result)),
        }),
        (Some(id), Some(method), None, None) => ServerJsonRpcMessage::Request(JsonRpcRequest {
            jsonrpc,
            id,
            request: ServerRequest::CustomRequest(CustomRequest::new(method, params)),
        }),
        (None, Some(method), None, None) => {
            ServerJsonRpcMessage::Notification(JsonRpcNotification {
                jsonrpc,
                notification: ServerNotification::CustomNotification(CustomNotification::new(
                    method, params,
                )),
            })
        }
        (id, None, None, Some(error)) => {
            ServerJsonRpcMessage::Error(JsonRpcError { jsonrpc, id, error })
        }
        _ => {
            return Err(serde::de::Error::custom(
                "neither a request, a notification, a result nor an error",
            ));
        }
    })
}

/// An SSE event from the store, and whether it ends its stream (a response or error).
fn decode(token: &str, event: &StoredEvent) -> Result<(ServerSseMessage, bool), serde_json::Error> {
    let message = event.message.as_deref().map(replayed).transpose()?;
    let last = matches!(
        message,
        Some(ServerJsonRpcMessage::Response(_) | ServerJsonRpcMessage::Error(_))
    );
    let id = EventId {
        token: token.to_owned(),
        seq: event.seq,
    };
    // `ServerSseMessage` is non-exhaustive: start from a constructor, then set the rest.
    let mut sse = match message {
        Some(message) => ServerSseMessage::new(id.to_string(), message),
        None => ServerSseMessage::priming(id.to_string(), Duration::ZERO),
    };
    sse.retry = event.retry_ms.map(Duration::from_millis);
    Ok((sse, last))
}

/// What a session's initialize request said that the HTTP layer needs.
#[derive(Debug, Clone, Copy)]
pub struct SessionProfile {
    /// The negotiated protocol version.
    pub version: &'static str,
    /// Whether the client declared the `io.modelcontextprotocol/tasks` extension (SEP-2663).
    pub tasks_extension: bool,
}

/// Keeps a session counted as having an open stream while alive.
pub struct OpenStream {
    streams: StreamStore,
    session_id: String,
    standalone: bool,
}

/// How this process serves one stored session.
#[derive(Default)]
pub struct Serving {
    /// Whether rmcp serves the session in this process yet, behind the gate of its requests.
    /// rmcp restores a stored session on its first request after a restart, and a second
    /// request arriving meanwhile reaches the half-restored session before its replayed
    /// `initialize`, which ends it (both get 500). So a session's first request here runs
    /// alone: it holds the lock until its answer starts, and marks the session served if that
    /// succeeded. A session put to sleep is unmarked (see [`StreamStore::put_to_sleep`]).
    pub gate: Arc<tokio::sync::Mutex<bool>>,
    /// Its requests between the resume middleware and rmcp's answer: the session is in use,
    /// though no stream of it is open yet.
    in_flight: AtomicUsize,
}

impl Serving {
    /// Counts a request of the session in flight until the guard drops.
    pub fn in_flight(self: &Arc<Self>) -> InFlight {
        self.in_flight.fetch_add(1, Ordering::AcqRel);
        InFlight(self.clone())
    }
}

/// A request in flight (see [`Serving::in_flight`]).
pub struct InFlight(Arc<Serving>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Drop for OpenStream {
    fn drop(&mut self) {
        self.streams.inner.open_streams.remove(&self.session_id);
        if self.standalone {
            self.streams.inner.standalone.remove(&self.session_id);
        }
    }
}

/// What this process knows of a session's standalone stream in the store.
#[derive(Debug, Clone, Copy, PartialEq)]
enum StandaloneStream {
    /// A GET for it was made in this process: every event of it is stored, the first one
    /// opening it.
    Asked,
    /// The store has none that takes events, and no GET asked for one here: its events go
    /// unstored.
    Absent,
}

/// The id of an event that goes out unstored: no stream has it, so a resumption from it is
/// refused as unknown rather than answered from a gap.
fn unstored_id() -> String {
    EventId {
        token: hex::encode(rand::random::<[u8; 16]>()),
        seq: 1,
    }
    .to_string()
}

fn binding_of(message: &ServerJsonRpcMessage) -> Option<String> {
    let ServerJsonRpcMessage::Notification(notification) = message else {
        return None;
    };
    let rmcp::model::ServerNotification::ProgressNotification(progress) =
        &notification.notification
    else {
        return None;
    };
    progress
        .params
        .meta
        .as_ref()?
        .0
        .0
        .get(BINDING_META_KEY)?
        .as_str()
        .map(str::to_owned)
}

#[async_trait::async_trait]
impl EventStore for StreamStore {
    async fn store_event(
        &self,
        stream_id: &str,
        event: &ServerSseMessage,
    ) -> Result<RmcpEventId, EventStoreError> {
        let message = event.message.as_deref();
        let finishes = matches!(
            message,
            Some(ServerJsonRpcMessage::Response(_) | ServerJsonRpcMessage::Error(_))
        );
        let session = stream_id.strip_suffix(":common");
        let standalone = session.is_some();
        // A client reads a standalone stream through a GET and resumes it only from an event it
        // read there, so an event before any GET asked for the stream would be replayed to
        // nobody: a fresh GET replays nothing, and rmcp drops what it sends while no GET is
        // open. Such an event continues a stream the store has (a client may hold an id of
        // it, from an earlier process or another node) and is otherwise left unstored.
        let known = session.and_then(|session| self.standalone_stream(session));
        if known == Some(StandaloneStream::Absent) {
            return Ok(unstored_id());
        }
        let opens = !standalone || known == Some(StandaloneStream::Asked);
        let event = NewEvent {
            stream_id: stream_id.to_owned(),
            session_id: session.map(str::to_owned),
            message: message.map(serde_json::to_string).transpose()?,
            retry_ms: event.retry.map(|retry| retry.as_millis() as u64),
            finishes,
            binding: message.and_then(binding_of),
            opens,
        };
        // A request's stream is written by this process alone, in the order of its events, so
        // its events are queued, not waited for: the HTTP layer sends each frame only once
        // [`StreamStore::durable`] returns after it arrived, which is after this queued it. A
        // session's standalone stream is also written by other processes (a node taking the
        // session over), so its events are appended before they are sent.
        let appended = match standalone {
            true => self.append(event).await,
            false => self.queue(event).await,
        };
        match appended {
            Ok(id) => Ok(id.to_string()),
            Err(StoreError::Refused(Refusal::StreamEnded { .. })) if !opens => {
                if let Some(session) = session {
                    self.standalone_absent(session);
                }
                Ok(unstored_id())
            }
            // rmcp drops a message whose storing failed, so a request answered while the
            // database is full or unreachable would never be answered and its stream would
            // hang. The message goes out unstored instead, under an id no stream has: what it
            // says (often exactly that error) reaches the client, and a resumption from it is
            // refused as unknown rather than answered from a gap. What a task did is stored
            // with the task, not in its stream, so nothing durable is lost.
            Err(e) => {
                tracing::error!(
                    stream_id,
                    error = e.with_causes(),
                    "cannot store an event; sending it unstored"
                );
                Ok(unstored_id())
            }
        }
    }

    async fn replay_events_after(
        &self,
        last_event_id: &str,
    ) -> Result<EventStream, EventStoreError> {
        // The HTTP layer has already checked the id against the caller's session.
        let id: EventId = last_event_id.parse()?;
        Ok(self.tail(id.token, id.seq))
    }
}

#[async_trait::async_trait]
impl SessionStore for StreamStore {
    async fn load(&self, session_id: &str) -> Result<Option<SessionState>, SessionStoreError> {
        let Some(state) = self.inner.store.load_session(session_id).await? else {
            return Ok(None);
        };
        let state: SessionState = serde_json::from_str(&state)?;
        self.remember(session_id, &state);
        self.inner
            .restored
            .lock()
            .expect("restored lock")
            .insert(session_id.to_owned());
        tracing::info!(session_id, "restoring session from the store");
        Ok(Some(state))
    }

    async fn store(&self, session_id: &str, state: &SessionState) -> Result<(), SessionStoreError> {
        let requested = state.initialize_params.protocol_version.to_string();
        self.remember(session_id, state);
        self.inner
            .store
            .save_session(session_id, serde_json::to_string(state)?, requested)
            .await?;
        Ok(())
    }

    async fn delete(&self, session_id: &str) -> Result<(), SessionStoreError> {
        self.forget(session_id);
        self.inner.store.delete_session(session_id).await?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    /// A POST's priming event is not stored, yet its id can be resumed from: the record of the
    /// session that received the stream makes the stream's row, and so does the stream's next
    /// event, whichever of the two the writer runs first; the other finds the row made.
    #[tokio::test]
    async fn a_request_stream_is_made_by_its_session_record_or_its_next_event() {
        let check = async {
            for answer_first in [false, true] {
                let dir = tempfile::tempdir().unwrap();
                let database = crate::store::Database::Sqlite(dir.path().join("t.db"));
                let store = Store::connect(&database, "test-node").await.unwrap();
                let streams = StreamStore::new(store, "test-node", CancellationToken::new());
                let priming = ServerSseMessage::priming("", Duration::from_secs(3));
                let message = json!({"jsonrpc": "2.0", "id": 1, "result": {}});
                let answer = ServerSseMessage::new("", serde_json::from_value(message).unwrap());
                let stream = "session-a/1";
                let first: EventId = streams
                    .store_event(stream, &priming)
                    .await
                    .unwrap()
                    .parse()
                    .unwrap();
                assert_eq!(first.seq, 1);
                let call = CallId::random();
                let bind = || streams.bind_stream_session(&first.token, "session-a", &call);
                if answer_first {
                    streams.store_event(stream, &answer).await.unwrap();
                    bind().await.unwrap();
                } else {
                    bind().await.unwrap();
                    streams.durable().await;
                    let info = streams.stream_info(&first.token).await.unwrap();
                    let info = info.expect("the record makes the stream");
                    assert_eq!(info.session_id.as_deref(), Some("session-a"));
                    assert_eq!(info.next_seq, 2, "the priming event's id is taken");
                    streams.store_event(stream, &answer).await.unwrap();
                }
                streams.durable().await;
                let info = streams.stream_info(&first.token).await.unwrap().unwrap();
                assert_eq!(
                    info.session_id.as_deref(),
                    Some("session-a"),
                    "answer first: {answer_first}"
                );
                assert_eq!((info.next_seq, info.finished), (3, true));
                assert!(!streams.event_exists(&first.token, 1).await.unwrap());
                assert!(streams.event_exists(&first.token, 2).await.unwrap());
                // Recorded once: another session cannot take the stream over.
                streams
                    .bind_stream_session(&first.token, "session-b", &CallId::random())
                    .await
                    .unwrap();
                streams.durable().await;
                let info = streams.stream_info(&first.token).await.unwrap().unwrap();
                assert_eq!(info.session_id.as_deref(), Some("session-a"));
            }
        };
        tokio::time::timeout(Duration::from_secs(30), check)
            .await
            .expect("the store answers within 30 s");
    }

    /// An event the store refuses (here a second answer on an ended stream; in production a
    /// full or unreachable database) still goes out, under an id of no stream: rmcp would drop
    /// the message and leave its request unanswered.
    #[tokio::test]
    async fn an_event_that_cannot_be_stored_goes_out_under_an_id_no_stream_has() {
        let dir = tempfile::tempdir().unwrap();
        let database = crate::store::Database::Sqlite(dir.path().join("t.db"));
        let store = Store::connect(&database, "test-node").await.unwrap();
        let streams = StreamStore::new(store, "test-node", CancellationToken::new());
        let answer = |id: u64| {
            let message = serde_json::from_value(json!({"jsonrpc": "2.0", "id": id, "result": {}}));
            ServerSseMessage::new("", message.unwrap())
        };
        let stored: EventId = streams
            .store_event("s", &answer(1))
            .await
            .unwrap()
            .parse()
            .unwrap();
        let unstored: EventId = streams
            .store_event("s", &answer(2))
            .await
            .unwrap()
            .parse()
            .unwrap();
        assert_ne!(unstored.token, stored.token);
        streams.durable().await;
        assert!(streams.stream_info(&stored.token).await.unwrap().is_some());
        assert!(
            streams
                .stream_info(&unstored.token)
                .await
                .unwrap()
                .is_none(),
            "a resumption from the unstored event is refused as unknown"
        );
        assert!(
            !streams
                .event_exists(&stored.token, stored.seq + 1)
                .await
                .unwrap()
        );
    }

    /// A log line on the standalone stream of `session`, stored (or not) as rmcp stores it.
    async fn log_on(streams: &StreamStore, session: &str, n: u64) -> EventId {
        let message = json!({"jsonrpc": "2.0", "method": "notifications/message",
                             "params": {"level": "info", "data": n}});
        let event = ServerSseMessage::new("", serde_json::from_value(message).unwrap());
        let id = streams
            .store_event(&format!("{session}:common"), &event)
            .await
            .unwrap();
        id.parse().unwrap()
    }

    async fn stored(streams: &StreamStore, id: &EventId) -> bool {
        streams.stream_info(&id.token).await.unwrap().is_some()
    }

    /// A standalone stream's events are stored once a GET asks for the stream, or when the
    /// store has the stream already (its client may hold an id of it from an earlier process);
    /// before either, no client could ever be replayed them, and they go unstored.
    #[tokio::test]
    async fn standalone_events_are_stored_once_a_client_may_read_them() {
        let dir = tempfile::tempdir().unwrap();
        let database = crate::store::Database::Sqlite(dir.path().join("t.db"));
        let open = async || {
            let store = Store::connect(&database, "test-node").await.unwrap();
            StreamStore::new(store, "test-node", CancellationToken::new())
        };
        let streams = open().await;
        for n in 0..2 {
            let id = log_on(&streams, "quiet", n).await;
            assert!(!stored(&streams, &id).await, "nobody asked for it: {id}");
        }
        streams.standalone_asked("heard");
        let first = log_on(&streams, "heard", 0).await;
        let second = log_on(&streams, "heard", 1).await;
        assert!(stored(&streams, &first).await);
        assert_eq!((&second.token, second.seq), (&first.token, first.seq + 1));
        streams.standalone_asked("quiet");
        let asked_late = log_on(&streams, "quiet", 2).await;
        assert!(
            stored(&streams, &asked_late).await,
            "asked after events went unstored"
        );
        drop(streams);

        // A later process, where no GET has asked yet, continues the streams the store has.
        let later = open().await;
        let third = log_on(&later, "heard", 2).await;
        assert_eq!((&third.token, third.seq), (&first.token, second.seq + 1));
        let never = log_on(&later, "never", 0).await;
        assert!(!stored(&later, &never).await);
    }

    /// Each kind of stored message is sent again as stored, fields rmcp does not model included,
    /// and only a response or an error ends its stream.
    #[test]
    fn stored_messages_are_sent_as_stored() {
        let messages = [
            (
                json!({"jsonrpc": "2.0", "method": "notifications/progress", "params": {
                    "progressToken": 1, "progress": 2, "unmodelled": [true],
                    "_meta": {BINDING_META_KEY: "b"}}}),
                false,
            ),
            (
                json!({"jsonrpc": "2.0", "method": "notifications/tasks/status",
                       "params": {"taskId": "t", "status": "working"}}),
                false,
            ),
            (
                json!({"jsonrpc": "2.0", "id": 7, "method": "elicitation/create",
                       "params": {"message": "m", "requestedSchema": {}}}),
                false,
            ),
            (
                json!({"jsonrpc": "2.0", "id": "a",
                       "result": {"task": {"taskId": "t", "status": "working"}}}),
                true,
            ),
            (
                json!({"jsonrpc": "2.0", "id": 8, "error": {"code": -32602,
                       "message": "bad", "data": {"field": "x"}}}),
                true,
            ),
        ];
        for (message, ends) in messages {
            let stored = StoredEvent {
                seq: 3,
                message: Some(message.to_string()),
                retry_ms: None,
            };
            let (sse, last) = decode("tok", &stored).unwrap();
            let sent = serde_json::to_value(sse.message.as_deref().unwrap()).unwrap();
            assert_eq!((sent, last), (message, ends));
            assert_eq!(sse.event_id.as_deref(), Some("tok.3"));
        }
        let priming = StoredEvent {
            seq: 1,
            message: None,
            retry_ms: Some(3000),
        };
        let (sse, last) = decode("tok", &priming).unwrap();
        assert!(sse.message.is_none() && !last);
        assert_eq!(sse.retry, Some(Duration::from_secs(3)));
        for malformed in ["[]", r#"{"jsonrpc": "2.0"}"#, r#"{"id": 1, "method": 2}"#] {
            let stored = StoredEvent {
                seq: 2,
                message: Some(malformed.into()),
                retry_ms: None,
            };
            assert!(decode("tok", &stored).is_err(), "{malformed}");
        }
    }
}
