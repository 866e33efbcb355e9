//! The form of a task's open question, read from the question's JSON schema with
//! `durable_shared::form`, as the CLI's `task answer` reads it: a choice is a select, a yes/no
//! field a select, any other field text; defaults are shown, empty optional fields left out.
//! Answering calls `answer_task`; the server's error is shown next to the field it names, and
//! one about no field (a question meanwhile answered elsewhere) under the form.

use std::collections::HashMap;

use durable_shared::Question;
use durable_shared::form::{Input, fields};
use leptos::prelude::*;
use serde_json::{Map, Value, json};

use super::dashboard;
use super::forms::{FormError, field_error, names};
use crate::mcp::McpError;
use crate::sync::refresh_task;

#[component]
pub fn QuestionForm(task_id: String, question: Question) -> impl IntoView {
    let dash = dashboard();
    let fields = question
        .schema
        .as_object()
        .map(|schema| fields(schema, &[]))
        .unwrap_or_default();
    // What the schema gives (a default, else an example), else nothing: a person makes each
    // choice, a yes or no included, themselves.
    let values: HashMap<String, RwSignal<String>> = fields
        .iter()
        .map(|field| {
            let initial = match (&field.input, field.initial_text().as_str()) {
                (Input::Boolean, "true") => "yes".to_owned(),
                (Input::Boolean, "false") => "no".to_owned(),
                (_, initial) => initial.to_owned(),
            };
            (field.name.clone(), RwSignal::new(initial))
        })
        .collect();
    let values = StoredValue::new(values);
    let answer_fields = StoredValue::new(fields.clone());
    let error: FormError = RwSignal::new(None);
    let busy = RwSignal::new(false);
    let ids = StoredValue::new((task_id, question.id.clone()));
    let send = move |action: &'static str| {
        let (task_id, question_id) = ids.get_value();
        let mut arguments =
            json!({"task_id": task_id, "question_id": question_id, "action": action});
        if action == "accept" {
            // An empty optional field is left out; an empty required one is sent as it is, so
            // that the server's error names it.
            let answer: Map<String, Value> = answer_fields.with_value(|fields| {
                fields
                    .iter()
                    .filter_map(|field| {
                        let typed = values.with_value(|v| v[&field.name].get_untracked());
                        (field.required || !typed.trim().is_empty())
                            .then(|| (field.name.clone(), field.value_of(&typed)))
                    })
                    .collect()
            });
            arguments["answer"] = Value::Object(answer);
        }
        busy.set(true);
        error.set(None);
        leptos::task::spawn_local(async move {
            let mcp = crate::connection();
            match mcp.call_tool("answer_task", arguments).await {
                Ok(_) => {
                    let _ = refresh_task(&mcp, dash, &task_id).await;
                }
                Err(McpError::Tool { message, field }) => error.set(Some((field, message))),
                Err(other) => error.set(Some((None, other.to_string()))),
            }
            busy.set(false);
        });
    };
    // An error about no field of this form (a question answered meanwhile elsewhere, say) is
    // shown under the whole form.
    let names_a_field = move |e: &Option<(Option<String>, String)>| {
        answer_fields.with_value(|fields| fields.iter().any(|field| names(e, &field.name)))
    };
    let question_id = question.id.clone();
    view! {
        <form
            class="start-form question"
            data-test="question"
            data-question-id=question_id
            on:submit=move |ev: leptos::ev::SubmitEvent| {
                ev.prevent_default();
                send("accept");
            }
        >
            <h3>"Waiting for your answer"</h3>
            <p data-test="question-message">{question.message.clone()}</p>
            {fields
                .into_iter()
                .map(|field| {
                    let value = values.with_value(|v| v[&field.name]);
                    let id = format!("answer-{}", field.name);
                    let name = StoredValue::new(field.name.clone());
                    let invalid = move || name.with_value(|name| error.with(|e| names(e, name))).to_string();
                    // Selects start with an empty option: nothing is chosen for the person.
                    let options = match &field.input {
                        Input::Choice(choices) => Some(choices.clone()),
                        Input::Boolean => Some(vec!["yes".to_owned(), "no".to_owned()]),
                        _ => None,
                    }
                    .map(|options| std::iter::once(String::new()).chain(options).collect::<Vec<_>>());
                    let input = match options {
                        Some(options) => view! {
                            <select
                                id=id.clone()
                                name=field.name.clone()
                                prop:value=move || value.get()
                                on:change=move |ev| value.set(event_target_value(&ev))
                                aria-invalid=invalid
                            >
                                {options
                                    .into_iter()
                                    .map(|option| view! { <option value=option.clone()>{option.clone()}</option> })
                                    .collect_view()}
                            </select>
                        }
                        .into_any(),
                        None => view! {
                            <input
                                id=id.clone()
                                name=field.name.clone()
                                prop:value=move || value.get()
                                on:input=move |ev| value.set(event_target_value(&ev))
                                aria-invalid=invalid
                            />
                        }
                        .into_any(),
                    };
                    view! {
                        <label for=id title=field.description.clone().unwrap_or_default()>
                            {field.title.clone()}
                        </label>
                        {input}
                        {field_error(error, field.name.clone(), format!("answer-error-{}", field.name))}
                    }
                })
                .collect_view()}
            {move || {
                error.with(|e| match e {
                    Some((_, message)) if !names_a_field(e) => Some(view! {
                        <p class="field-error" data-test="answer-error">{message.clone()}</p>
                    }),
                    _ => None,
                })
            }}
            <div class="actions">
                <button type="submit" class="primary" data-test="answer" disabled=move || busy.get()>
                    {move || if busy.get() { "Sending…" } else { "Answer" }}
                </button>
                <button type="button" data-test="decline" disabled=move || busy.get() on:click=move |_| send("decline")>
                    "Decline"
                </button>
            </div>
        </form>
    }
}
