//! Start forms, one per kind the server starts in the background. Nothing here names a kind or
//! a field: each form is read from its `start_{kind}` tool's input schema (titles, defaults,
//! examples, bounds), and the server's validation errors are shown next to the field they name.

use std::collections::HashMap;

use durable_shared::form::Input;
use leptos::prelude::*;
use serde_json::{Map, Value};

use super::dashboard;
use crate::mcp::McpError;
use crate::state::StartKind;
use crate::sync::refresh_task;

/// The server's error on a form: the field it names (None: not about one field) and its message.
pub(super) type FormError = RwSignal<Option<(Option<String>, String)>>;

/// Whether the form's error is about field `name`.
pub(super) fn names(error: &Option<(Option<String>, String)>, name: &str) -> bool {
    matches!(error, Some((Some(field), _)) if field == name)
}

/// The form's error under field `name`, while there is one about it.
pub(super) fn field_error(error: FormError, name: String, test_id: String) -> impl IntoView {
    move || {
        error.with(|e| match e {
            Some((_, message)) if names(e, &name) => Some(view! {
                <p class="field-error" data-test=test_id.clone()>{message.clone()}</p>
            }),
            _ => None,
        })
    }
}

#[component]
pub fn StartForms() -> impl IntoView {
    let dash = dashboard();
    let chosen = RwSignal::new(0usize);
    view! {
        <div class="kinds" role="tablist">
            {move || {
                dash.kinds
                    .get()
                    .into_iter()
                    .enumerate()
                    .map(|(index, kind)| {
                        view! {
                            <button
                                role="tab"
                                data-tool=kind.tool.clone()
                                class:active=move || chosen.get() == index
                                aria-selected=move || (chosen.get() == index).to_string()
                                on:click=move |_| chosen.set(index)
                            >
                                {kind.title}
                            </button>
                        }
                    })
                    .collect_view()
            }}
        </div>
        {move || {
            dash.kinds
                .with(|kinds| kinds.get(chosen.get()).cloned())
                .map(|kind| view! { <KindForm kind=kind /> })
        }}
    }
}

#[component]
fn KindForm(kind: StartKind) -> impl IntoView {
    let dash = dashboard();
    let kind = StoredValue::new(kind);
    let values: HashMap<String, RwSignal<String>> = kind.with_value(|kind| {
        kind.fields
            .iter()
            .map(|field| (field.name.clone(), RwSignal::new(field.initial_text())))
            .collect()
    });
    let values = StoredValue::new(values);
    let error: FormError = RwSignal::new(None);
    let busy = RwSignal::new(false);
    let submit = move |ev: leptos::ev::SubmitEvent| {
        ev.prevent_default();
        let (tool, arguments) = kind.with_value(|kind| {
            let mut arguments = Map::new();
            for field in &kind.fields {
                let typed = values.with_value(|v| v[&field.name].get_untracked());
                // An empty optional field is left to the server's default.
                if typed.trim().is_empty() && !field.required {
                    continue;
                }
                arguments.insert(field.name.clone(), field.value_of(&typed));
            }
            (kind.tool.clone(), arguments)
        });
        busy.set(true);
        error.set(None);
        leptos::task::spawn_local(async move {
            let mcp = crate::connection();
            match mcp.call_tool(&tool, Value::Object(arguments)).await {
                Ok(result) => {
                    if let Some(id) = result["structuredContent"]["task_id"].as_str() {
                        // The list subscription announces the task's changes; this read shows
                        // it at once even if its first announcement is still on its way.
                        let _ = refresh_task(&mcp, dash, id).await;
                        dash.selected.set(Some(id.to_owned()));
                    }
                }
                Err(McpError::Tool { message, field }) => error.set(Some((field, message))),
                Err(other) => error.set(Some((None, other.to_string()))),
            }
            busy.set(false);
        });
    };
    let tool = kind.with_value(|kind| kind.tool.clone());
    let fields = kind.with_value(|kind| kind.fields.clone());
    view! {
        <form class="start-form" on:submit=submit data-test=format!("form-{tool}")>
            {fields
                .into_iter()
                .map(|field| {
                    let value = values.with_value(|v| v[&field.name]);
                    let id = format!("{tool}-{}", field.name);
                    let name = StoredValue::new(field.name.clone());
                    let numeric = matches!(field.input, Input::Integer | Input::Number);
                    view! {
                        <label for=id.clone() title=field.description.clone().unwrap_or_default()>
                            {field.title.clone()}
                        </label>
                        <input
                            id=id
                            name=field.name.clone()
                            inputmode=if numeric { "decimal" } else { "text" }
                            prop:value=move || value.get()
                            on:input=move |ev| value.set(event_target_value(&ev))
                            aria-invalid=move || name.with_value(|name| error.with(|e| names(e, name))).to_string()
                        />
                        {field_error(error, field.name.clone(), format!("error-{}", field.name))}
                    }
                })
                .collect_view()}
            {move || {
                error.with(|e| match e {
                    Some((None, message)) => Some(view! { <p class="field-error" data-test="error-form">{message.clone()}</p> }),
                    _ => None,
                })
            }}
            <button type="submit" class="primary" disabled=move || busy.get()>
                {move || if busy.get() { "Starting…" } else { "Start" }}
            </button>
        </form>
    }
}
