//! The live task table with filters and row actions.

use durable_shared::{TaskInfo, TaskStatus, kinds};
use leptos::prelude::*;
use serde_json::json;

use super::dashboard;

/// How a kind is named on screen.
pub(crate) fn kind_label(kind: &str) -> &str {
    match kind {
        kinds::DATA_MIGRATION => "Data migration",
        kinds::BATCH_PROCESSING => "Batch processing",
        kinds::ML_TRAINING => "ML training",
        kinds::DATA_PROCESSING => "Data processing",
        other => other,
    }
}

/// A short description of a task's parameters.
fn summary(task: &TaskInfo) -> String {
    let p = &task.parameters;
    let field = |name: &str| p[name].to_string().trim_matches('"').to_owned();
    match task.kind.as_str() {
        kinds::DATA_MIGRATION => {
            format!("{} → {}", field("source_path"), field("destination_path"))
        }
        kinds::BATCH_PROCESSING => format!(
            "{} items × {}/batch",
            field("total_items"),
            field("batch_size")
        ),
        kinds::ML_TRAINING => format!("{}, {} epochs", field("model_name"), field("epochs")),
        kinds::DATA_PROCESSING => format!(
            "{}, {} records",
            field("dataset_name"),
            field("total_records")
        ),
        _ => p.to_string(),
    }
}

#[component]
pub fn TaskTable() -> impl IntoView {
    let dash = dashboard();
    let client_id = crate::connection().client_id().to_owned();
    let status_filter = RwSignal::new(None::<TaskStatus>);
    let mine_only = RwSignal::new(false);
    // Ids only: each row follows its own task, so a progress update re-renders a few cells,
    // never the row (buttons under the pointer stay put).
    let rows = move || {
        dash.tasks.with(|tasks| {
            let mut rows: Vec<&TaskInfo> = tasks
                .values()
                .filter(|t| status_filter.get().is_none_or(|s| t.status == s))
                .filter(|t| !mine_only.get() || t.owner == client_id)
                .collect();
            rows.sort_by_key(|t| std::cmp::Reverse(t.created_at));
            rows.into_iter()
                .map(|t| t.task_id.clone())
                .collect::<Vec<_>>()
        })
    };
    view! {
        <div class="filters">
            <label>
                "Status "
                <select
                    data-test="status-filter"
                    on:change=move |ev| status_filter.set(event_target_value(&ev).parse().ok())
                >
                    <option value="">"all"</option>
                    {TaskStatus::ALL
                        .into_iter()
                        .map(|s| view! { <option value=s.as_str()>{s.as_str()}</option> })
                        .collect_view()}
                </select>
            </label>
            <div class="toggle" role="group" aria-label="Whose tasks">
                <button class:active=move || !mine_only.get() on:click=move |_| mine_only.set(false)>"All"</button>
                <button class:active=move || mine_only.get() on:click=move |_| mine_only.set(true) data-test="mine">"My tasks"</button>
            </div>
        </div>
        <div class="table-wrap">
            <table>
                <thead>
                    <tr>
                        <th>"Kind"</th>
                        <th>"Parameters"</th>
                        <th>"Status"</th>
                        <th>"Progress"</th>
                        <th>"Message"</th>
                        <th>"Updated"</th>
                        <th>"Actions"</th>
                    </tr>
                </thead>
                <tbody>
                    <For each=rows key=|id| id.clone() let:id>
                        <Row task_id=id />
                    </For>
                </tbody>
            </table>
            {move || dash.tasks.with(|t| t.is_empty()).then(|| view! { <p class="empty">"No tasks yet: start one."</p> })}
        </div>
    }
}

#[component]
fn Row(task_id: String) -> impl IntoView {
    let dash = dashboard();
    let task = Memo::new({
        let id = task_id.clone();
        move |_| dash.tasks.with(|tasks| tasks.get(&id).cloned())
    });
    let status = Memo::new(move |_| task.with(|t| t.as_ref().map(|t| t.status)));
    let field = move |f: fn(&TaskInfo) -> String| {
        move || task.with(|t| t.as_ref().map(f).unwrap_or_default())
    };
    let percent = move || task.with(|t| t.as_ref().map_or(0.0, |t| t.percent));
    let status_name = move || status.get().map_or("", TaskStatus::as_str);
    let (select_id, click_id, actions_id) = (task_id.clone(), task_id.clone(), task_id.clone());
    view! {
        <tr
            data-test="task-row"
            data-task-id=task_id
            data-status=status_name
            class:selected=move || dash.selected.get().as_deref() == Some(select_id.as_str())
        >
            <td>
                <button class="link" on:click=move |_| dash.selected.set(Some(click_id.clone()))>
                    {field(|t| kind_label(&t.kind).to_owned())}
                </button>
            </td>
            <td class="params">{field(summary)}</td>
            <td><span class=move || format!("badge {}", status_name()) data-test="status">{status_name}</span></td>
            <td class="progress-cell">
                <div class="bar" role="progressbar" aria-valuenow=percent aria-valuemin="0" aria-valuemax="100">
                    <div class="fill" style=move || format!("width: {}%", percent())></div>
                </div>
                <span class="percent" data-test="percent">{move || format!("{:.1}%", percent())}</span>
                <span class="count">{field(|t| format!("{}/{}", t.progress, t.total))}</span>
            </td>
            <td class="message">{field(|t| t.message.clone())}</td>
            <td class="updated">{field(|t| t.updated_at.format("%H:%M:%S").to_string())}</td>
            <td class="actions">
                {move || status.get().map(|status| view! { <Actions task_id=actions_id.clone() status=status /> })}
            </td>
        </tr>
    }
}

#[component]
fn Actions(task_id: String, status: TaskStatus) -> impl IntoView {
    let dash = dashboard();
    let confirming = RwSignal::new(false);
    // The action whose call is on its way: the buttons wait for its answer, so a double click
    // sends one call.
    let pending = RwSignal::new(None::<&'static str>);
    let act = move |tool: &'static str, task_id: String| {
        if pending.get_untracked().is_some() {
            return;
        }
        pending.set(Some(tool));
        leptos::task::spawn_local(async move {
            let mcp = crate::connection();
            let answer = mcp.call_tool(tool, json!({"task_id": task_id})).await;
            // The new status may have drawn other buttons already, which dropped these.
            pending.try_set(None);
            match answer {
                Ok(result) => {
                    if let Ok(task) =
                        serde_json::from_value::<TaskInfo>(result["structuredContent"].clone())
                    {
                        dash.upsert(task);
                    }
                }
                Err(e) => dash.report(format!("{tool} of task {task_id} failed: {e}")),
            }
        });
    };
    let busy = move || pending.get().is_some();
    let label = move |tool: &'static str, idle: &'static str, working: &'static str| {
        move || {
            if pending.get() == Some(tool) {
                working
            } else {
                idle
            }
        }
    };
    let (pause_id, resume_id, cancel_id) = (task_id.clone(), task_id.clone(), task_id);
    view! {
        {matches!(status, TaskStatus::Pending | TaskStatus::Running).then(|| view! {
            <button data-test="pause" disabled=busy on:click=move |_| act("pause_task", pause_id.clone())>
                {label("pause_task", "Pause", "Pausing…")}
            </button>
        })}
        {(status == TaskStatus::Paused).then(|| view! {
            <button data-test="resume" disabled=busy on:click=move |_| act("resume_task", resume_id.clone())>
                {label("resume_task", "Resume", "Resuming…")}
            </button>
        })}
        {(!status.is_terminal()).then(|| view! {
            <button
                class:danger=move || confirming.get()
                data-test="cancel"
                disabled=busy
                on:click=move |_| {
                    if confirming.get_untracked() {
                        act("cancel_task", cancel_id.clone());
                    }
                    confirming.update(|c| *c = !*c);
                }
            >
                {move || match (pending.get(), confirming.get()) {
                    (Some("cancel_task"), _) => "Cancelling…",
                    (_, true) => "Confirm cancel",
                    _ => "Cancel",
                }}
            </button>
        })}
    }
}
