//! Turns engine events into notifications, for the sessions that care (see `routes`):
//! `notifications/resources/updated` for the resources a session subscribed to,
//! `notifications/message` log lines for the milestones of its client's tasks and of tasks it
//! subscribed to, and MCP task status notifications for the tasks its client holds a handle on.
//!
//! One router task reads the engine's events and queues each for the interested sessions; each
//! session's forwarder sends what its queue holds, so a slow session holds up only itself.
//!
//! A 2026-07-28 `subscriptions/listen` request is a session of its own in the routing index for
//! as long as its stream is open, with a forwarder that sends only what the revision allows on
//! a subscription stream: `notifications/resources/updated` for the resources it accepted.
#![allow(
    deprecated,
    reason = "logging is deprecated by SEP-2577 but 2025-11-25 clients use it"
)]

use std::sync::{Arc, Mutex};

use durable_shared::{TASK_LIST_META_KEY, TASK_META_KEY, TaskStatus, status_uri};
use rmcp::model::{
    CustomNotification, LoggingLevel, LoggingMessageNotificationParam, MetaObject,
    NotificationMetaObject, ResourceUpdatedNotification, ResourceUpdatedNotificationParam,
    ServerNotification, TaskStatusNotificationParams,
};
use rmcp::service::{ServiceError, SubscriptionContext, SubscriptionSendError, SubscriptionSink};
use rmcp::{ErrorData as McpError, Peer, RoleServer};
use serde_json::{Value, json};
use tokio::sync::broadcast;
use tokio::sync::broadcast::error::RecvError;

use super::resources::{self, LIST_LIMIT, TaskUri};
use super::routes::{Delivery, Inbox, Next, Routes, SessionKey};
use super::tasks::{detailed_task, legacy_task, speaks_legacy_tasks};
use super::{DurableServer, Shared, questions};
use crate::engine::{Change, Engine, MilestoneLevel, TaskHandle};
use crate::telemetry;

fn rank(level: LoggingLevel) -> u8 {
    match level {
        LoggingLevel::Debug => 0,
        LoggingLevel::Info => 1,
        LoggingLevel::Notice => 2,
        LoggingLevel::Warning => 3,
        LoggingLevel::Error => 4,
        LoggingLevel::Critical => 5,
        LoggingLevel::Alert => 6,
        LoggingLevel::Emergency => 7,
    }
}

/// Reads the engine's events until shutdown and routes each to the sessions interested in it.
/// The handles of unfinished tasks are loaded first, so their status changes reach their
/// requesters across restarts.
pub(super) async fn route_events(shared: Arc<Shared>) {
    // Subscribed before loading, so no event or handle after the load is missed.
    let mut events = shared.engine.subscribe();
    let mut fleet = shared.engine.fleet_changes();
    load_handles(&shared).await;
    // What lagging sessions must be resynchronised from when the router itself falls behind.
    let mut routed_up_to_ms = i64::MIN;
    loop {
        let heard = tokio::select! {
            _ = shared.shutdown.cancelled() => return,
            event = events.recv() => Ok(event),
            change = next_change(&mut fleet) => Err(change),
        };
        let event = match heard {
            Ok(event) => event,
            Err(Err(RecvError::Closed)) => {
                fleet = None;
                continue;
            }
            Err(change) => {
                follow_handles(&shared, change).await;
                continue;
            }
        };
        match event {
            Ok(event) => {
                routed_up_to_ms = event.task.updated_at.timestamp_millis();
                shared
                    .routes
                    .route(event, |session_id| shared.streams.deaf(session_id));
            }
            Err(RecvError::Lagged(missed)) => {
                metrics::counter!(telemetry::ROUTER_LAGGED_EVENTS).increment(missed);
                tracing::warn!(missed, "event router lagged; resynchronising every session");
                shared.routes.all_lagging(routed_up_to_ms);
            }
            Err(RecvError::Closed) => return,
        }
    }
}

/// Indexes every live handle on an unfinished task.
async fn load_handles(shared: &Shared) {
    match shared.engine.unfinished_handles().await {
        Ok(handles) => handles
            .iter()
            .for_each(|handle| shared.routes.add_handle(handle)),
        Err(e) => {
            tracing::error!(error = %e, "cannot load task handles; their status changes go unannounced")
        }
    }
}

/// The next change of another node, or never on a database no other node writes.
async fn next_change(fleet: &mut Option<broadcast::Receiver<Change>>) -> Result<Change, RecvError> {
    match fleet {
        Some(changes) => changes.recv().await,
        None => std::future::pending().await,
    }
}

/// Indexes a handle another node made, so that its requester's sessions here hear of the
/// task's status too; after missed changes, every handle again.
async fn follow_handles(shared: &Shared, change: Result<Change, RecvError>) {
    match change {
        Ok(Change::Handle { task_id, requester }) => {
            match shared.engine.handle(&task_id, &requester).await {
                Ok(Some(handle)) => shared.routes.add_handle(&handle),
                Ok(None) => {}
                Err(e) => {
                    tracing::warn!(%task_id, error = %e, "cannot read a task handle another node made")
                }
            }
        }
        Ok(Change::Task { .. } | Change::Stream { .. }) => {}
        Ok(Change::Resync) | Err(RecvError::Lagged(_)) => load_handles(shared).await,
        Err(RecvError::Closed) => {}
    }
}

/// What a session's forwarder needs; it holds no part of the session, which leaves the routing
/// index (ending the forwarder) when rmcp drops it.
struct Forwarder {
    shared: Arc<Shared>,
    peer: Peer<RoleServer>,
    key: SessionKey,
    log_level: Arc<Mutex<Option<LoggingLevel>>>,
    asking: questions::Asking,
    /// A `subscriptions/listen` stream's sink: then only resource updates are sent, through it.
    sink: Option<SubscriptionSink>,
    /// The MCP session's id, once initialized.
    session_id: Option<String>,
}

impl DurableServer {
    /// Starts this session's forwarder once; it ends with the session, its transport or the
    /// server.
    pub(super) fn start_forwarder(&self, peer: Peer<RoleServer>) {
        let Some(inbox) = self.session.inbox.lock().expect("inbox lock").take() else {
            return;
        };
        let forwarder = Forwarder {
            shared: self.shared.clone(),
            peer,
            key: self.session.route.key,
            log_level: self.session.log_level.clone(),
            asking: self.session.asking.clone(),
            sink: None,
            session_id: self.session.session_id.get().cloned(),
        };
        tokio::spawn(forwarder.run(inbox, std::future::pending()));
    }

    /// Serves a 2026-07-28 `subscriptions/listen` request until its stream closes: the accepted
    /// task resources are followed as `resources/subscribe` follows them for a session, and each
    /// change is sent as `notifications/resources/updated` with the task's new state in `_meta`.
    /// A resource the caller may not see ends the request with the error naming it.
    pub(super) async fn listen_to(
        &self,
        subscription: SubscriptionContext,
    ) -> Result<(), McpError> {
        let caller = self.caller(subscription.request_context());
        // What its `task://list` notifications may show.
        self.shared
            .routes
            .set_viewer(self.key(), &caller.owner, caller.sees_all);
        let uris = subscription
            .accepted()
            .resource_subscriptions
            .clone()
            .unwrap_or_default();
        for uri in &uris {
            resources::check_subscribable(&self.shared.engine, &caller, uri).await?;
        }
        for uri in &uris {
            self.shared.routes.subscribe(self.key(), uri);
        }
        let Some(inbox) = self.session.inbox.lock().expect("inbox lock").take() else {
            return Ok(());
        };
        let forwarder = Forwarder {
            shared: self.shared.clone(),
            peer: subscription.request_context().peer.clone(),
            key: self.key(),
            log_level: self.session.log_level.clone(),
            asking: self.session.asking.clone(),
            sink: Some(subscription.sink().clone()),
            session_id: None,
        };
        // The acknowledgment went out before the routes above were in place: each resource's
        // current state first, so that a change in between is not lost.
        if forwarder.resync(i64::MAX).await.is_err() {
            return Ok(());
        }
        forwarder.run(inbox, subscription.cancelled()).await;
        Ok(())
    }
}

impl Forwarder {
    /// Forwards until the session leaves the index, its transport closes, `stop` completes or
    /// the server shuts down.
    async fn run(self, mut inbox: Inbox, stop: impl Future<Output = ()>) {
        let mut stop = std::pin::pin!(stop);
        loop {
            let next = tokio::select! {
                _ = self.shared.shutdown.cancelled() => return,
                _ = &mut stop => return,
                next = inbox.next() => next,
            };
            // Boxed, so that the future of an idle forwarder, which most sessions' are, stays
            // the size of a queue wait rather than of the largest send.
            let sent = match next {
                Some(Next::Deliver(delivery)) => Box::pin(self.deliver(delivery)).await,
                Some(Next::Resync { since_ms }) => {
                    metrics::counter!(telemetry::FORWARDER_RESYNCS).increment(1);
                    tracing::warn!(
                        session = self.key,
                        "notifications fell behind; resynchronising"
                    );
                    Box::pin(self.resync(since_ms)).await
                }
                None => return,
            };
            if sent.is_err() || self.peer.is_transport_closed() {
                return;
            }
        }
    }

    fn routes(&self) -> &Routes {
        &self.shared.routes
    }

    fn engine(&self) -> &Engine {
        &self.shared.engine
    }

    async fn deliver(&self, delivery: Delivery) -> Result<(), ServiceError> {
        let event = &delivery.routed.event;
        let task = &event.task;
        if let Some(handle) = &delivery.handle
            && self.sink.is_none()
        {
            self.task_status(handle.with(task.clone())).await?;
        }
        if !delivery.uris.is_empty() {
            // The task's new state rides along in `_meta`, so a subscriber (the dashboard) can
            // apply each change as it happened without reading the resource back.
            let meta = meta(TASK_META_KEY, delivery.routed.task_json().clone());
            for uri in &delivery.uris {
                self.resource_updated(uri, Some(meta.clone())).await?;
            }
        }
        let Some(milestone) = &event.milestone else {
            return Ok(());
        };
        if self.sink.is_some() {
            return Ok(());
        }
        // The task has just asked its owner something.
        if delivery.owner
            && task.status == TaskStatus::InputRequired
            && questions::can_ask(&self.peer)
        {
            questions::ask(
                self.shared.clone(),
                self.peer.clone(),
                task,
                self.asking.clone(),
                self.session_id.clone(),
            );
        }
        let watching = delivery.owner || delivery.uris.contains(&status_uri(&task.task_id));
        let level = match milestone.level {
            MilestoneLevel::Info => LoggingLevel::Info,
            MilestoneLevel::Error => LoggingLevel::Error,
        };
        let wanted = self
            .log_level
            .lock()
            .expect("log level lock")
            .unwrap_or(LoggingLevel::Info);
        if watching && rank(level) >= rank(wanted) {
            let mut param = LoggingMessageNotificationParam::new(
                level,
                json!({
                    "message": milestone.text,
                    "task_id": task.task_id,
                    "status": task.status,
                    "step": task.step,
                }),
            );
            param.logger = Some("durable-mcp".into());
            self.peer.notify_logging_message(param).await?;
        }
        Ok(())
    }

    async fn resource_updated(
        &self,
        uri: &str,
        meta: Option<NotificationMetaObject>,
    ) -> Result<(), ServiceError> {
        let mut param = ResourceUpdatedNotificationParam::new(uri.to_owned());
        param.meta = meta;
        let Some(sink) = &self.sink else {
            return self.peer.notify_resource_updated(param).await;
        };
        let notification = ServerNotification::ResourceUpdatedNotification(
            ResourceUpdatedNotification::new(param),
        );
        match sink.send(notification).await {
            Ok(()) => Ok(()),
            Err(SubscriptionSendError::Service(e)) => Err(e),
            Err(SubscriptionSendError::SubscriptionClosed) => Err(ServiceError::TransportClosed),
            // Only accepted resources are followed; nothing else is offered to a sink.
            Err(e) => {
                tracing::debug!(error = %e, uri, "a subscription stream refused an update");
                Ok(())
            }
        }
    }

    /// After missed deliveries: the current state of every subscribed resource, the open
    /// questions of the client's tasks, and the status of each of the client's handles that
    /// changed since `since_ms`.
    async fn resync(&self, since_ms: i64) -> Result<(), ServiceError> {
        for uri in self.routes().subscriptions(self.key) {
            let meta = match resources::parse(&uri) {
                Ok(TaskUri::Status(id)) => match self.engine().get(id).await {
                    Ok(task) => Some(meta(TASK_META_KEY, to_json(&task))),
                    Err(e) => {
                        tracing::warn!(error = %e, uri, "cannot resynchronise a subscription");
                        None
                    }
                },
                Ok(TaskUri::List(status, _)) => {
                    self.resync_list(&uri, status, since_ms).await?;
                    continue;
                }
                // Other schemes never change.
                Err(_) => continue,
            };
            self.resource_updated(&uri, meta).await?;
        }
        if self.sink.is_some() {
            return Ok(());
        }
        let Some(client) = self.routes().client(self.key) else {
            return Ok(());
        };
        // A question one of its tasks raised meanwhile was asked nowhere here: ask every open
        // one (a question this session is being asked already is not asked twice).
        if questions::can_ask(&self.peer) {
            tokio::spawn(questions::ask_open_questions(
                self.shared.clone(),
                self.peer.clone(),
                client.clone(),
                self.asking.clone(),
                self.session_id.clone(),
            ));
        }
        let mut after = None;
        loop {
            let page = match self.engine().handles(&client, after.clone(), 200).await {
                Ok(page) => page,
                Err(e) => {
                    tracing::warn!(error = %e, "cannot resynchronise task status notifications");
                    return Ok(());
                }
            };
            let Some(last) = page.last() else {
                return Ok(());
            };
            after = Some((
                last.task.created_at.timestamp_millis(),
                last.task.task_id.clone(),
            ));
            for handle in page {
                if handle.task.updated_at.timestamp_millis() >= since_ms {
                    self.task_status(handle).await?;
                }
            }
        }
    }

    /// A subscribed list's current state: its newest page, then every older task of it that
    /// changed since `since_ms` (each one, for a restored session), a page at most per
    /// notification. Only the newest page would leave an older task that changed meanwhile
    /// stale wherever the list is shown.
    async fn resync_list(
        &self,
        uri: &str,
        status: Option<TaskStatus>,
        since_ms: i64,
    ) -> Result<(), ServiceError> {
        let owner = self.routes().list_filter(self.key);
        let mut after = None;
        let mut newest = true;
        loop {
            let page = match self
                .engine()
                .list(owner.clone(), status, after, LIST_LIMIT)
                .await
            {
                Ok(page) => page,
                Err(e) => {
                    tracing::warn!(error = %e, uri, "cannot resynchronise a subscription");
                    // Without the tasks: the subscriber can still read the list back.
                    return self.resource_updated(uri, None).await;
                }
            };
            // A new listener's resync (since `i64::MAX`) wants the newest page only.
            let last_page = page.len() < LIST_LIMIT || since_ms == i64::MAX;
            after = page
                .last()
                .map(|task| (task.created_at.timestamp_millis(), task.task_id.clone()));
            let tasks: Vec<_> = page
                .into_iter()
                .filter(|task| newest || task.updated_at.timestamp_millis() >= since_ms)
                .collect();
            if newest || !tasks.is_empty() {
                let meta = meta(TASK_LIST_META_KEY, to_json(&tasks));
                self.resource_updated(uri, Some(meta)).await?;
            }
            if last_page {
                return Ok(());
            }
            newest = false;
        }
    }

    /// An MCP task status notification, in the shape the session's client speaks (none to a
    /// client that speaks neither).
    async fn task_status(&self, handle: TaskHandle) -> Result<(), ServiceError> {
        let Some(info) = self.peer.peer_info() else {
            return Ok(());
        };
        let notification = if info.capabilities.supports_tasks() {
            ServerNotification::TaskStatusNotification(rmcp::model::TaskStatusNotification::new(
                TaskStatusNotificationParams::new(detailed_task(&handle)),
            ))
        } else if speaks_legacy_tasks(info.protocol_version.as_str()) {
            ServerNotification::CustomNotification(CustomNotification::new(
                "notifications/tasks/status",
                Some(legacy_task(&handle)),
            ))
        } else {
            return Ok(());
        };
        self.peer.send_notification(notification).await
    }
}

fn to_json<T: serde::Serialize>(value: &T) -> Value {
    serde_json::to_value(value).unwrap_or_default()
}

fn meta(key: &str, value: Value) -> NotificationMetaObject {
    let mut meta = serde_json::Map::new();
    meta.insert(key.into(), value);
    NotificationMetaObject(MetaObject(meta))
}
