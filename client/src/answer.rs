//! `task answer`: the answer to a task's question, from `--answer`, `--decline`, or asked
//! field by field on the terminal from the question's schema (the same fields the dashboard's
//! forms show).

use std::io::{BufRead, Write};

use durable_shared::form::{FormField, Input, fields};
use durable_shared::{Question, TaskInfo, TaskStatus, status_uri};
use serde_json::{Map, Value, json};

use super::{Client, Failure, Outcome, decode};

impl Client {
    pub(super) async fn answer(
        &self,
        task_id: &str,
        answer: Option<&str>,
        decline: bool,
    ) -> Outcome<()> {
        let task: TaskInfo = decode(&self.read(&status_uri(task_id)).await?)?;
        let question = match (&task.question, task.status) {
            (Some(question), TaskStatus::InputRequired) => question.clone(),
            (_, status) => {
                return Err(Failure::Refused(format!(
                    "task {task_id} asks nothing: it is {status}"
                )));
            }
        };
        let mut arguments = json!({"task_id": task_id, "question_id": question.id});
        if decline {
            arguments["action"] = json!("decline");
        } else {
            arguments["answer"] = match answer {
                Some(text) => serde_json::from_str::<Value>(text)
                    .ok()
                    .filter(Value::is_object)
                    .ok_or_else(|| {
                        Failure::Refused(format!(
                            "--answer must be a JSON object with the fields the question asks \
                             for, got {text:?}"
                        ))
                    })?,
                None => Value::Object(ask_on_terminal(&question)?),
            };
        }
        let answered = self.call("answer_task", arguments).await?;
        let parsed: TaskInfo = decode(&answered)?;
        self.print(&answered, || {
            format!(
                "answered {} of task {}; it is now {}",
                question.id, parsed.task_id, parsed.status
            )
        });
        Ok(())
    }
}

/// Shows `question` and reads each of its fields from standard input, a line each.
pub(super) fn ask_on_terminal(question: &Question) -> Outcome<Map<String, Value>> {
    let schema = question.schema.as_object().cloned().unwrap_or_default();
    let stdin = std::io::stdin();
    let mut lines = stdin.lock().lines();
    let mut out = std::io::stderr();
    let _ = writeln!(out, "{}", question.message);
    let mut answer = Map::new();
    for field in fields(&schema, &[]) {
        let _ = write!(out, "{}", prompt(&field));
        let _ = out.flush();
        let line = match lines.next() {
            Some(Ok(line)) => line,
            _ => {
                return Err(Failure::Refused(format!(
                    "no answer for {} (standard input ended); use --answer to answer without \
                     a terminal",
                    field.name
                )));
            }
        };
        let typed = if line.trim().is_empty() {
            field.initial_text()
        } else {
            line
        };
        if !typed.trim().is_empty() {
            answer.insert(field.name.clone(), field.value_of(&typed));
        }
    }
    Ok(answer)
}

/// "Hotel [one of: a, b, c]: ", with the default to take on an empty line.
fn prompt(field: &FormField) -> String {
    let mut text = field.title.clone();
    match &field.input {
        Input::Choice(choices) => text.push_str(&format!(" [one of: {}]", choices.join(", "))),
        Input::Boolean => text.push_str(" [yes/no]"),
        _ => {}
    }
    let initial = field.initial_text();
    if !initial.is_empty() {
        text.push_str(&format!(" ({initial})"));
    }
    text.push_str(": ");
    text
}
