//! Turns engine events into a session's notifications: `notifications/resources/updated` for
//! the resources it subscribed to, `notifications/message` log lines for the milestones of its
//! own tasks and of tasks it subscribed to, and MCP task status notifications for the tasks it
//! holds a handle on.
#![allow(
    deprecated,
    reason = "logging is deprecated by SEP-2577 but 2025-11-25 clients use it"
)]

use std::collections::HashMap;

use durable_shared::{TASK_META_KEY, TaskStatus, status_uri};
use rmcp::model::{
    LoggingLevel, LoggingMessageNotificationParam, MetaObject, NotificationMetaObject,
    ResourceUpdatedNotificationParam,
};
use rmcp::{Peer, RoleServer};
use serde_json::json;
use tokio::sync::broadcast::error::RecvError;

use super::{DurableServer, resources};
use crate::engine::{MilestoneLevel, TaskEvent};

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

impl DurableServer {
    /// Starts this session's forwarder once; it ends with the session's transport or the server.
    pub(super) fn start_forwarder(&self, peer: Peer<RoleServer>) {
        if self.session.forwarder.set(()).is_err() {
            return;
        }
        let server = self.clone();
        let mut events = self.shared.engine.subscribe();
        tokio::spawn(async move {
            let mut last_status: HashMap<String, TaskStatus> = HashMap::new();
            loop {
                let event = tokio::select! {
                    _ = server.shared.shutdown.cancelled() => return,
                    event = events.recv() => event,
                };
                let delivered = match event {
                    Ok(event) => {
                        let before =
                            last_status.insert(event.task.task_id.clone(), event.task.status);
                        server.forward(&peer, &event, before).await
                    }
                    Err(RecvError::Lagged(missed)) => {
                        tracing::warn!(missed, "notification forwarder lagged; resynchronising");
                        server.resync(&peer).await
                    }
                    Err(RecvError::Closed) => return,
                };
                if delivered.is_err() || peer.is_transport_closed() {
                    return;
                }
            }
        });
    }

    async fn forward(
        &self,
        peer: &Peer<RoleServer>,
        event: &TaskEvent,
        before: Option<TaskStatus>,
    ) -> Result<(), rmcp::service::ServiceError> {
        let task = &event.task;
        if before != Some(task.status) {
            self.notify_task_status(peer, task).await?;
        }
        let subscribed: Vec<String> = {
            let subscriptions = self
                .session
                .subscriptions
                .lock()
                .expect("subscriptions lock");
            resources::affected_by(&task.task_id, before, task.status)
                .into_iter()
                .filter(|uri| subscriptions.contains(uri))
                .collect()
        };
        if !subscribed.is_empty() {
            // The task's new state rides along in `_meta`, so a subscriber (the dashboard) can
            // apply each change as it happened without reading the resource back.
            let mut meta = serde_json::Map::new();
            meta.insert(
                TASK_META_KEY.into(),
                serde_json::to_value(task).unwrap_or_default(),
            );
            let meta = NotificationMetaObject(MetaObject(meta));
            for uri in &subscribed {
                let mut param = ResourceUpdatedNotificationParam::new(uri.clone());
                param.meta = Some(meta.clone());
                peer.notify_resource_updated(param).await?;
            }
        }
        let Some(milestone) = &event.milestone else {
            return Ok(());
        };
        let watching = subscribed.contains(&status_uri(&task.task_id))
            || self
                .session
                .client_id
                .lock()
                .expect("client id lock")
                .as_deref()
                == Some(task.owner.as_str());
        let level = match milestone.level {
            MilestoneLevel::Info => LoggingLevel::Info,
            MilestoneLevel::Error => LoggingLevel::Error,
        };
        let wanted = self
            .session
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
            peer.notify_logging_message(param).await?;
        }
        Ok(())
    }

    /// After missing events, every subscribed resource may have changed.
    async fn resync(&self, peer: &Peer<RoleServer>) -> Result<(), rmcp::service::ServiceError> {
        let subscriptions: Vec<String> = self
            .session
            .subscriptions
            .lock()
            .expect("subscriptions lock")
            .iter()
            .cloned()
            .collect();
        for uri in subscriptions {
            peer.notify_resource_updated(ResourceUpdatedNotificationParam::new(uri))
                .await?;
        }
        Ok(())
    }
}
