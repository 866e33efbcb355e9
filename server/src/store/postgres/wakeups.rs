//! Cross-node wake-ups: `LISTEN`/`NOTIFY` on a connection of its own.
//!
//! Writes that other nodes must hear about notify inside their own statement, so the
//! notification is delivered exactly when the change commits (and never for a change rolled
//! back): every change of a task on [`TASK_CHANNEL!`], every event appended to a stream on
//! [`STREAM_CHANNEL!`], every MCP task handle made or extended on [`HANDLE_CHANNEL!`]. A payload is ids only, `"{id} {node}"` (PostgreSQL caps payloads at
//! 8,000 bytes): the receiver reads the row. A node ignores its own notifications; it already
//! published those changes in process.
//!
//! Notifications sent while the listening connection is down are lost, so every reconnect is
//! announced as [`Change::Resync`]: listeners then re-read what they follow (and poll besides).

use std::time::Duration;

use futures::StreamExt;
use tokio::sync::broadcast;
use tokio_postgres::{AsyncMessage, NoTls};

use crate::store::Change;

/// The channel of task changes; a macro so that statements can embed it with `concat!`.
macro_rules! TASK_CHANNEL {
    () => {
        "durable_task"
    };
}
/// The channel of stream appends.
macro_rules! STREAM_CHANNEL {
    () => {
        "durable_stream"
    };
}
/// The channel of MCP task handles made or extended.
macro_rules! HANDLE_CHANNEL {
    () => {
        "durable_handle"
    };
}
pub(super) use {HANDLE_CHANNEL, STREAM_CHANNEL, TASK_CHANNEL};

/// How many changes a slow listener may fall behind before it must resynchronise.
const BUFFER: usize = 4096;
/// Wait before connecting again after the listening connection failed.
const RECONNECT_DELAY: Duration = Duration::from_secs(1);

/// Starts listening for other nodes' changes in the background; returns where they arrive.
pub(super) fn listen(config: tokio_postgres::Config, node: String) -> broadcast::Sender<Change> {
    let (sender, _) = broadcast::channel(BUFFER);
    let changes = sender.clone();
    tokio::spawn(async move {
        let mut first = true;
        loop {
            match listen_once(&config, &node, &changes, first).await {
                Ok(()) => {
                    tracing::warn!("the PostgreSQL listening connection closed; reconnecting")
                }
                Err(e) => {
                    tracing::warn!(error = %e, "PostgreSQL listening connection failed; reconnecting")
                }
            }
            first = false;
            tokio::time::sleep(RECONNECT_DELAY).await;
        }
    });
    sender
}

/// Connects, listens, and forwards notifications until the connection ends.
async fn listen_once(
    config: &tokio_postgres::Config,
    node: &str,
    changes: &broadcast::Sender<Change>,
    first: bool,
) -> Result<(), tokio_postgres::Error> {
    let (client, mut connection) = config.connect(NoTls).await?;
    let (messages_tx, mut messages) = tokio::sync::mpsc::unbounded_channel();
    // The connection delivers notifications only while it is polled, so it is driven here
    // and its messages forwarded.
    let driver = tokio::spawn(async move {
        let mut stream = futures::stream::poll_fn(move |cx| connection.poll_message(cx));
        while let Some(message) = stream.next().await {
            if messages_tx.send(message).is_err() {
                break;
            }
        }
    });
    let listened = client
        .batch_execute(concat!(
            "LISTEN ",
            TASK_CHANNEL!(),
            "; LISTEN ",
            STREAM_CHANNEL!(),
            "; LISTEN ",
            HANDLE_CHANNEL!()
        ))
        .await;
    if let Err(e) = listened {
        driver.abort();
        return Err(e);
    }
    if !first {
        let _ = changes.send(Change::Resync);
    }
    while let Some(message) = messages.recv().await {
        let notification = match message? {
            AsyncMessage::Notification(notification) => notification,
            _ => continue,
        };
        // `{id} {node}`, and for a handle `{task id} {node} {requester}` (a node id has no
        // spaces; a requester may).
        let Some((id, rest)) = notification.payload().split_once(' ') else {
            continue;
        };
        let (from, requester) = rest.split_once(' ').unwrap_or((rest, ""));
        if from == node {
            continue;
        }
        let change = match notification.channel() {
            TASK_CHANNEL!() => Change::Task { id: id.to_owned() },
            STREAM_CHANNEL!() => Change::Stream {
                token: id.to_owned(),
            },
            HANDLE_CHANNEL!() => Change::Handle {
                task_id: id.to_owned(),
                requester: requester.to_owned(),
            },
            _ => continue,
        };
        // No receiver is fine: nobody follows changes (yet).
        let _ = changes.send(change);
    }
    drop(client);
    Ok(())
}
