//! Following work as it happens: `task watch` (a task's status resource, by subscription; a
//! question the task asks is asked on the terminal) and
//! `process` (the progress notifications of a long call), with a progress bar for people and
//! one JSON line per update with `--json`.

use std::io::IsTerminal;
use std::time::{Duration, Instant};

use durable_shared::kinds::PROCESSING_TOOL;
use durable_shared::{TASK_META_KEY, TaskInfo, TaskStatus, status_uri};
use indicatif::{ProgressBar, ProgressStyle};
use rmcp::model::{
    CallToolRequestParams, ClientRequest, ProgressNotificationParam, Request,
    ResourceUpdatedNotificationParam, ServerResult, SubscribeRequestParams,
};
use rmcp::service::{NotificationContext, PeerRequestOptions};
use rmcp::{ClientHandler, RoleClient};
use serde_json::{Value, json};
use tokio::signal::unix::{Signal, SignalKind, signal};
use tokio::sync::mpsc;

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
        params: ResourceUpdatedNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        let task = params
            .meta
            .as_ref()
            .and_then(|meta| meta.0.0.get(TASK_META_KEY))
            .and_then(|task| serde_json::from_value::<TaskInfo>(task.clone()).ok());
        if let Some(task) = task {
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
        self.service
            .subscribe(SubscribeRequestParams::new(uri.clone()))
            .await
            .map_err(|e| Failure::Refused(format!("cannot follow {task_id}: {e}")))?;
        let mut task: TaskInfo = decode(&self.read(&uri).await?)?;
        let bar = bar(task.total, self.args.json);
        let mut notes = self.notes.lock().await;
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
                note = notes.recv() => match note {
                    Some(Note::Updated(update)) if update.task_id == task.task_id => task = *update,
                    Some(_) => {}
                    None => return Err(lost(task_id)),
                },
                _ = tokio::time::sleep(REREAD_EVERY) => match self.read(&uri).await {
                    Ok(value) => {
                        task = decode(&value)?;
                        reached = Instant::now();
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
