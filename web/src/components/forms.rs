//! Start forms for the three background kinds, with the tools' defaults; the server's
//! validation errors are shown next to the field they name.

use std::collections::HashMap;

use leptos::prelude::*;
use serde_json::{Map, Value};

use super::dashboard;
use crate::mcp::McpError;
use crate::sync::{refresh_task, subscribe};

struct Field {
    name: &'static str,
    label: &'static str,
    default: &'static str,
    numeric: bool,
}

struct Kind {
    tool: &'static str,
    title: &'static str,
    fields: &'static [Field],
}

const fn text(name: &'static str, label: &'static str, default: &'static str) -> Field {
    Field {
        name,
        label,
        default,
        numeric: false,
    }
}

const fn number(name: &'static str, label: &'static str, default: &'static str) -> Field {
    Field {
        name,
        label,
        default,
        numeric: true,
    }
}

const KINDS: [Kind; 3] = [
    Kind {
        tool: "start_data_migration",
        title: "Data migration",
        fields: &[
            text("source_path", "Source", "sample:customers"),
            text(
                "destination_path",
                "Destination (JSONL)",
                "out/customers.jsonl",
            ),
            number("record_count", "Records", "1000"),
        ],
    },
    Kind {
        tool: "start_batch_processing",
        title: "Batch processing",
        fields: &[
            number("batch_size", "Batch size", "100"),
            number("total_items", "Total items", "1000"),
            number("processing_delay", "Delay per batch (s)", "10"),
        ],
    },
    Kind {
        tool: "start_ml_training",
        title: "ML training",
        fields: &[
            text("model_name", "Model name", "churn-model"),
            number("dataset_size", "Dataset size", "10000"),
            number("epochs", "Epochs", "100"),
        ],
    },
];

#[component]
pub fn StartForms() -> impl IntoView {
    let chosen = RwSignal::new(0usize);
    view! {
        <div class="kinds" role="tablist">
            {KINDS
                .iter()
                .enumerate()
                .map(|(index, kind)| {
                    view! {
                        <button
                            role="tab"
                            class:active=move || chosen.get() == index
                            aria-selected=move || (chosen.get() == index).to_string()
                            on:click=move |_| chosen.set(index)
                        >
                            {kind.title}
                        </button>
                    }
                })
                .collect_view()}
        </div>
        {move || view! { <KindForm kind=&KINDS[chosen.get()] /> }}
    }
}

#[component]
fn KindForm(kind: &'static Kind) -> impl IntoView {
    let dash = dashboard();
    let values: HashMap<&'static str, RwSignal<String>> = kind
        .fields
        .iter()
        .map(|field| (field.name, RwSignal::new(field.default.to_owned())))
        .collect();
    let values = StoredValue::new(values);
    // The server's message and the field it names (None: not about one field).
    let error = RwSignal::new(None::<(Option<&'static str>, String)>);
    let busy = RwSignal::new(false);
    let submit = move |ev: leptos::ev::SubmitEvent| {
        ev.prevent_default();
        let mut arguments = Map::new();
        for field in kind.fields {
            let text = values.with_value(|v| v[field.name].get_untracked());
            let value = if field.numeric {
                // A number if it is one; otherwise sent as typed, for the server to name the error.
                serde_json::from_str::<Value>(text.trim())
                    .ok()
                    .filter(Value::is_number)
                    .unwrap_or(Value::String(text))
            } else {
                Value::String(text)
            };
            arguments.insert(field.name.into(), value);
        }
        busy.set(true);
        error.set(None);
        leptos::task::spawn_local(async move {
            let mcp = crate::connection();
            match mcp.call_tool(kind.tool, Value::Object(arguments)).await {
                Ok(result) => {
                    if let Some(id) = result["structuredContent"]["task_id"].as_str() {
                        let _ = subscribe(&mcp, &durable_shared::status_uri(id)).await;
                        let _ = refresh_task(&mcp, dash, id).await;
                        dash.selected.set(Some(id.to_owned()));
                    }
                }
                Err(McpError::Rpc(message)) => {
                    let field = kind
                        .fields
                        .iter()
                        .find(|field| message.contains(field.name))
                        .map(|field| field.name);
                    error.set(Some((field, message)));
                }
                Err(other) => error.set(Some((None, other.to_string()))),
            }
            busy.set(false);
        });
    };
    view! {
        <form class="start-form" on:submit=submit data-test=format!("form-{}", kind.tool)>
            {kind
                .fields
                .iter()
                .map(|field| {
                    let value = values.with_value(|v| v[field.name]);
                    let id = format!("{}-{}", kind.tool, field.name);
                    view! {
                        <label for=id.clone()>{field.label}</label>
                        <input
                            id=id
                            name=field.name
                            inputmode=if field.numeric { "decimal" } else { "text" }
                            prop:value=move || value.get()
                            on:input=move |ev| value.set(event_target_value(&ev))
                            aria-invalid=move || {
                                error.with(|e| matches!(e, Some((Some(f), _)) if *f == field.name)).to_string()
                            }
                        />
                        {move || {
                            error.with(|e| match e {
                                Some((Some(f), message)) if *f == field.name => Some(view! {
                                    <p class="field-error" data-test=format!("error-{}", field.name)>{message.clone()}</p>
                                }),
                                _ => None,
                            })
                        }}
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
