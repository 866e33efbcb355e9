//! The live task table: searched, filtered and paged, with row actions.

use std::cell::RefCell;
use std::collections::HashMap;

use durable_shared::{TaskInfo, TaskStatus, kinds};
use leptos::prelude::*;
use serde_json::json;
use wasm_bindgen::prelude::wasm_bindgen;

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

thread_local! {
    /// How often each row has rendered, by task id: see [`row_renders`].
    static RENDERS: RefCell<HashMap<String, u64>> = RefCell::new(HashMap::new());
}

fn rendered(task_id: &str) {
    RENDERS.with_borrow_mut(|renders| *renders.entry(task_id.to_owned()).or_default() += 1);
}

/// How often each row has rendered so far (drawn, or one of its cells computed again), by task
/// id, as `window.wasmBindings.row_renders()`: what shows that an event of one task renders
/// that task's row and no other, however many tasks there are. An increment per render is all
/// it costs.
#[wasm_bindgen]
pub fn row_renders() -> js_sys::Object {
    let counts = js_sys::Object::new();
    RENDERS.with_borrow(|renders| {
        for (id, count) in renders {
            let _ = js_sys::Reflect::set(&counts, &id.into(), &(*count as f64).into());
        }
    });
    counts
}

/// Rows on one page of the table: the page draws these, however many tasks there are.
const PAGE_SIZE: usize = 50;

/// Whether `task` matches what was typed in the search box (lowercase): a part of its id,
/// kind, parameters or owner.
fn matches_search(task: &TaskInfo, needle: &str) -> bool {
    needle.is_empty()
        || [
            task.task_id.to_lowercase(),
            kind_label(&task.kind).to_lowercase(),
            summary(task).to_lowercase(),
            task.owner.to_lowercase(),
        ]
        .iter()
        .any(|text| text.contains(needle))
}

#[component]
pub fn TaskTable() -> impl IntoView {
    let dash = dashboard();
    let client_id = crate::connection().client_id().to_owned();
    let status_filter = RwSignal::new(None::<TaskStatus>);
    let mine_only = RwSignal::new(false);
    let search = RwSignal::new(String::new());
    let page = RwSignal::new(0usize);
    // The tasks that pass the filters, newest first, as ids. It follows the set of tasks (not
    // each task's changes), the filters, and status changes only while a status is filtered
    // on; what it reads of each task (creation time, id, kind, parameters, owner) never
    // changes.
    let matching = Memo::new(move |_| {
        let status = status_filter.get();
        if status.is_some() {
            dash.status_changes.track();
        }
        let needle = search.get().trim().to_lowercase();
        let mine = mine_only.get();
        dash.tasks.with(|tasks| {
            let mut matching: Vec<(chrono::DateTime<chrono::Utc>, String)> = tasks
                .values()
                .filter_map(|task| {
                    task.with_untracked(|t| {
                        (status.is_none_or(|s| t.status == s)
                            && (!mine || t.owner == client_id)
                            && matches_search(t, &needle))
                        .then(|| (t.created_at, t.task_id.clone()))
                    })
                })
                .collect();
            matching.sort_unstable_by(|a, b| b.cmp(a));
            matching.into_iter().map(|(_, id)| id).collect::<Vec<_>>()
        })
    });
    let pages = move || matching.with(|ids| ids.len().div_ceil(PAGE_SIZE).max(1));
    // A page past the end (tasks went, or a filter narrowed the list) shows the last one.
    let shown_page = move || page.get().min(pages() - 1);
    let rows = move || {
        let first = shown_page() * PAGE_SIZE;
        matching.with(|ids| {
            ids.iter()
                .skip(first)
                .take(PAGE_SIZE)
                .cloned()
                .collect::<Vec<_>>()
        })
    };
    let page_info = move || {
        let total = matching.with(Vec::len);
        let first = shown_page() * PAGE_SIZE;
        if total == 0 {
            "no tasks match".to_owned()
        } else {
            format!(
                "{}–{} of {total}",
                first + 1,
                (first + PAGE_SIZE).min(total)
            )
        }
    };
    // A narrower list starts at its first page.
    let refilter = move || page.set(0);
    view! {
        <div class="filters">
            <input
                type="search"
                class="search"
                data-test="search"
                placeholder="Search id, kind, parameters, owner"
                aria-label="Search tasks"
                prop:value=move || search.get()
                on:input=move |ev| {
                    search.set(event_target_value(&ev));
                    refilter();
                }
                // Clearing the box (its ✕, or a script) may fire only `change`.
                on:change=move |ev| search.set(event_target_value(&ev))
            />
            <label>
                "Status "
                <select
                    data-test="status-filter"
                    on:change=move |ev| {
                        status_filter.set(event_target_value(&ev).parse().ok());
                        refilter();
                    }
                >
                    <option value="">"all"</option>
                    {TaskStatus::ALL
                        .into_iter()
                        .map(|s| view! { <option value=s.as_str()>{s.as_str()}</option> })
                        .collect_view()}
                </select>
            </label>
            <div class="toggle" role="group" aria-label="Whose tasks">
                <button class:active=move || !mine_only.get() on:click=move |_| { mine_only.set(false); refilter(); }>"All"</button>
                <button class:active=move || mine_only.get() on:click=move |_| { mine_only.set(true); refilter(); } data-test="mine">"My tasks"</button>
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
                        {dash.task(&id).map(|task| view! { <Row task=task /> })}
                    </For>
                </tbody>
            </table>
            {move || dash.tasks.with(HashMap::is_empty).then(|| view! { <p class="empty">"No tasks yet: start one."</p> })}
        </div>
        <nav class="pager" aria-label="Pages of tasks">
            <button data-test="prev-page" disabled=move || { shown_page() == 0 } on:click=move |_| page.set(shown_page().saturating_sub(1))>"‹ Newer"</button>
            <span data-test="page-info">{page_info}</span>
            <button data-test="next-page" disabled=move || { shown_page() + 1 >= pages() } on:click=move |_| page.set(shown_page() + 1)>"Older ›"</button>
        </nav>
    }
}

/// One task's row. It reads only its own task's signal, so another task's event leaves it
/// alone, and each cell changes only when what it shows does.
#[component]
fn Row(task: RwSignal<TaskInfo>) -> impl IntoView {
    let dash = dashboard();
    let task_id = task.with_untracked(|t| t.task_id.clone());
    rendered(&task_id);
    let status = Memo::new(move |_| task.with(|t| t.status));
    let counted = StoredValue::new(task_id.clone());
    let field = move |f: fn(&TaskInfo) -> String| {
        move || {
            counted.with_value(|id| rendered(id));
            task.with(f)
        }
    };
    let percent = move || task.with(|t| t.percent);
    let status_name = move || status.get().as_str();
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
            <td class="updated">
                {field(|t| t.updated_at.format("%H:%M:%S").to_string())}
                <span class="node" title="The node that holds the task" data-test="row-node">
                    {field(|t| t.node.clone().unwrap_or_default())}
                </span>
            </td>
            <td class="actions">
                {move || { let status = status.get(); view! { <Actions task_id=actions_id.clone() status=status /> } }}
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
