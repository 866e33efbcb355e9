//! Following work as it happens: `task watch` (a task's status resource, by subscription on a
//! session or by `subscriptions/listen` on the stateless revision; a question the task asks is
//! asked on the terminal) and
//! `process` (the progress notifications of a long call), with a progress bar for people and
//! one JSON line per update with `--json`.

use std::io::IsTerminal;
use std::time::{Duration, Instant};

use durable_shared::kinds::PROCESSING_TOOL;
use durable_shared::{TASK_META_KEY, TaskInfo, TaskStatus, status_uri};
use indicatif::{ProgressBar, ProgressStyle};
use rmcp::model::{
    CallToolRequestParams, ClientRequest, GetMeta, NotificationMetaObject,
    ProgressNotificationParam, Request, ResourceUpdatedNotificationParam, ServerNotification,
    ServerResult, SubscribeRequestParams, SubscriptionFilter,
};
use rmcp::service::{NotificationContext, PeerRequestOptions, Subscription};
use rmcp::{ClientHandler, RoleClient};
use serde_json::{Value, json};
use tokio::signal::unix::{Signal, SignalKind, signal};
use tokio::sync::{MutexGuard, mpsc};

use super::answer::ask_on_terminal;
use super::{Client, Failure, Outcome, TASK_CANCELLED, TASK_FAILED, decode, describe, tool_text};

/// How long `watch` keeps trying to reach a server that went away (e.g. while it restarts).
const RECONNECT_GRACE: Duration = Duration::from_secs(30);
/// A watched task is re-read this often even without notifications, as a safety net.
const REREAD_EVERY: Duration = Duration::from_secs(2);

/// A notification the client cares about.
pub(super) enum Note {
    Updated(Box<TaskInfo>),
    Progress(ProgressNotificationParam),
}

/// Forwards notifications to the command that follows them.
#[derive(Clone)]
pub(super) struct Notifications {
    tx: mpsc::UnboundedSender<Note>,
}

impl Notifications {
    pub(super) fn new() -> (Notifications, mpsc::UnboundedReceiver<Note>) {
        let (tx, rx) = mpsc::unbounded_channel();
        (Notifications { tx }, rx)
    }
}

impl ClientHandler for Notifications {
    async fn on_resource_updated(
        &self,
        _params: ResourceUpdatedNotificationParam,
        context: NotificationContext<RoleClient>,
    ) {
        // rmcp 3.11 moves the notification's extensions, which hold its `_meta`, into the
        // context before it takes the meta out of them: `context.meta` stays empty.
        let meta = context
            .extensions
            .get::<NotificationMetaObject>()
            .unwrap_or(&context.meta);
        if let Some(task) = carried_task(meta) {
            let _ = self.tx.send(Note::Updated(Box::new(task)));
        }
    }

    async fn on_progress(
        &self,
        params: ProgressNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        let _ = self.tx.send(Note::Progress(params));
    }
}

/// The task's new state a resource update carries in its `_meta` (which rmcp hands over apart
/// from the notification's params).
fn carried_task(meta: &NotificationMetaObject) -> Option<TaskInfo> {
    serde_json::from_value(meta.0.0.get(TASK_META_KEY)?.clone()).ok()
}

/// Where `watch` hears of its task's changes.
enum Updates<'a> {
    /// The session's notifications, which the client handler forwards (`resources/subscribe`
    /// on a 2025-11-25 session, whose stream rmcp resumes after a reconnect).
    Session(MutexGuard<'a, mpsc::UnboundedReceiver<Note>>),
    /// A `subscriptions/listen` request of the watch's own (2026-07-28). Its stream cannot be
    /// resumed, so one that ended (a dropped connection, a restarted server) is opened again
    /// after the next successful read; the read covers what was missed in between.
    Listen(Option<Box<Subscription>>),
}

impl Updates<'_> {
    /// The next state of `task_id` heard of; `None` when the session's notifications ended for
    /// good. While a stateless watch has no stream open, this waits for ever.
    async fn next(&mut self, task_id: &str) -> Option<TaskInfo> {
        loop {
            let update = match self {
                Updates::Session(notes) => match notes.recv().await? {
                    Note::Updated(task) => Some(*task),
                    Note::Progress(_) => None,
                },
                Updates::Listen(None) => std::future::pending().await,
                Updates::Listen(Some(subscription)) => match subscription.next().await {
                    Ok(Some(update @ ServerNotification::ResourceUpdatedNotification(_))) => {
                        carried_task(update.get_meta())
                    }
                    Ok(Some(_)) => None,
                    Ok(None) | Err(_) => {
                        *self = Updates::Listen(None);
                        None
                    }
                },
            };
            if let Some(task) = update.filter(|task| task.task_id == task_id) {
                return Some(task);
            }
        }
    }

    fn listening(&self) -> bool {
        !matches!(self, Updates::Listen(None))
    }
}

/// Ctrl-C, heard from the moment this returns until it is dropped. A fresh
/// `tokio::signal::ctrl_c()` each loop turn would miss a Ctrl-C arriving between turns: tokio
/// tells only the listeners that exist when the signal comes, and once its handler is installed
/// the default one no longer ends the process, so the client would silently run on to the end.
fn interrupts() -> Outcome<Signal> {
    signal(SignalKind::interrupt())
        .map_err(|e| Failure::Unreachable(format!("cannot listen for Ctrl-C: {e}")))
}

fn bar(total: u64, hidden: bool) -> ProgressBar {
    if hidden {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(total);
    bar.set_style(
        ProgressStyle::with_template("{bar:40.cyan/blue} {pos}/{len} {per_sec} ETA {eta} {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    bar
}

impl Client {
    /// Follows `task_id` until it ends; Ok only if it completed.
    #[allow(
        deprecated,
        reason = "resources/subscribe is how 2025-11-25 clients follow a resource"
    )]
    pub(super) async fn watch(&self, task_id: &str) -> Outcome<()> {
        let mut interrupted = interrupts()?;
        let uri = status_uri(task_id);
        let mut updates = if self.stateless() {
            Updates::Listen(Some(Box::new(self.listen(&uri).await?)))
        } else {
            self.service
                .subscribe(SubscribeRequestParams::new(uri.clone()))
                .await
                .map_err(|e| Failure::Refused(format!("cannot follow {task_id}: {e}")))?;
            Updates::Session(self.notes.lock().await)
        };
        let mut task: TaskInfo = decode(&self.read(&uri).await?)?;
        let bar = bar(task.total, self.args.json);
        let mut reached = Instant::now();
        // The question last shown, so that each is asked once while it stays open.
        let mut asked: Option<String> = None;
        loop {
            bar.set_length(task.total);
            bar.set_position(task.progress);
            bar.set_message(format!("{} {}", task.status, task.message));
            if self.args.json {
                println!(
                    "{}",
                    json!({"task_id": task.task_id, "status": task.status, "progress": task.progress, "total": task.total, "message": task.message})
                );
            }
            if let Some(question) = task
                .question
                .as_ref()
                .filter(|q| asked.as_ref() != Some(&q.id))
            {
                asked = Some(question.id.clone());
                // A person at a terminal answers here; anyone else is told how to.
                if !self.args.json && std::io::stdin().is_terminal() {
                    let answer = bar.suspend(|| ask_on_terminal(question))?;
                    let arguments = json!({"task_id": task_id, "question_id": question.id,
                                           "answer": answer});
                    match self.call("answer_task", arguments).await {
                        Ok(_) => {}
                        // Refused (answered elsewhere, or a field out of bounds): shown, and
                        // the question asked again while it is open.
                        Err(Failure::Refused(reason)) => {
                            bar.suspend(|| eprintln!("{reason}"));
                            asked = None;
                        }
                        Err(other) => return Err(other),
                    }
                } else if !self.args.json {
                    bar.suspend(|| {
                        eprintln!(
                            "task {task_id} asks: {}\n  answer with: durable-mcp task answer {task_id}",
                            question.message
                        )
                    });
                }
            }
            if task.status.is_terminal() {
                bar.finish();
                if !self.args.json {
                    println!("{}", describe(&task));
                }
                return match task.status {
                    TaskStatus::Completed => Ok(()),
                    TaskStatus::Failed => Err(Failure::Ended(TASK_FAILED)),
                    _ => Err(Failure::Ended(TASK_CANCELLED)),
                };
            }
            tokio::select! {
                update = updates.next(task_id) => match update {
                    Some(update) => task = update,
                    None => return Err(lost(task_id)),
                },
                _ = tokio::time::sleep(REREAD_EVERY) => match self.read(&uri).await {
                    Ok(value) => {
                        task = decode(&value)?;
                        reached = Instant::now();
                        if !updates.listening() {
                            // Reachable again: listen again (a failure is retried next time).
                            updates = Updates::Listen(self.listen(&uri).await.ok().map(Box::new));
                        }
                    }
                    Err(Failure::Unreachable(_)) if reached.elapsed() < RECONNECT_GRACE => {
                        bar.set_message("server unreachable; retrying");
                    }
                    Err(Failure::Unreachable(_)) => return Err(lost(task_id)),
                    Err(other) => return Err(other),
                },
                _ = interrupted.recv() => {
                    bar.abandon();
                    eprintln!(
                        "stopped watching; task {task_id} keeps running on the server. \
                         Re-attach with: durable-mcp task watch {task_id}"
                    );
                    return Err(Failure::Interrupted);
                }
            }
        }
    }

    /// A `subscriptions/listen` request for the changes of resource `uri`.
    async fn listen(&self, uri: &str) -> Outcome<Subscription> {
        let filter = SubscriptionFilter::builder()
            .resource_subscription(uri)
            .build();
        self.service
            .listen(filter)
            .await
            .map_err(|e| Failure::Refused(format!("cannot follow {uri}: {e}")))
    }

    /// Runs `resumable_data_processing` with `arguments`, showing its progress.
    pub(super) async fn process(&self, mut arguments: Value) -> Outcome<()> {
        let mut interrupted = interrupts()?;
        arguments["client_id"] = Value::String(self.client_id.clone());
        let Value::Object(object) = arguments.clone() else {
            unreachable!("arguments are an object")
        };
        let params = CallToolRequestParams::new(PROCESSING_TOOL).with_arguments(object);
        let handle = self
            .service
            .send_cancellable_request(
                ClientRequest::CallToolRequest(Request::new(params)),
                PeerRequestOptions::no_options(),
            )
            .await
            .map_err(|e| Failure::Unreachable(format!("cannot start processing: {e}")))?;
        let token = handle.progress_token.clone();
        // Arguments left out take the server's defaults: the total comes with the progress.
        let bar = bar(
            arguments["total_records"].as_u64().unwrap_or(0),
            self.args.json,
        );
        let mut notes = self.notes.lock().await;
        let response = handle.await_response();
        tokio::pin!(response);
        let answer = loop {
            tokio::select! {
                answer = &mut response => break answer,
                note = notes.recv() => {
                    if let Some(Note::Progress(progress)) = note
                        && progress.progress_token == token
                    {
                        if let Some(total) = progress.total {
                            bar.set_length(total as u64);
                        }
                        bar.set_position(progress.progress as u64);
                        if let Some(message) = &progress.message {
                            bar.set_message(message.clone());
                        }
                        if self.args.json {
                            println!("{}", json!({"progress": progress.progress, "total": progress.total}));
                        }
                    }
                }
                _ = interrupted.recv() => {
                    bar.abandon();
                    eprintln!(
                        "interrupted; the processing task keeps its checkpoint on the server. \
                         Run the same command again to continue from it."
                    );
                    return Err(Failure::Interrupted);
                }
            }
        };
        let result = match answer {
            Ok(ServerResult::CallToolResult(result)) => result,
            Ok(other) => {
                return Err(Failure::Unreachable(format!(
                    "unexpected answer: {other:?}"
                )));
            }
            Err(e) => {
                return Err(Failure::Unreachable(format!(
                    "the connection broke during processing ({e}); run the same command again to \
                     continue from the task's checkpoint"
                )));
            }
        };
        if result.is_error == Some(true) {
            return Err(Failure::Refused(tool_text(&result)));
        }
        bar.finish();
        let output = result.structured_content.unwrap_or(Value::Null);
        if self.args.json {
            // One JSON object per line, like the progress lines before it.
            println!("{}", json!({"result": output}));
        } else {
            println!(
                "processed {} records of {} (task {}, value sum {})",
                output["total_processed"],
                output["dataset_name"],
                output["task_id"],
                output["value_sum"]
            );
        }
        Ok(())
    }
}

fn lost(task_id: &str) -> Failure {
    Failure::Unreachable(format!(
        "lost the server while watching; the task keeps running there. Re-attach with: \
         durable-mcp task watch {task_id}"
    ))
}
