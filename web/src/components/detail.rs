//! The detail panel of the selected task: parameters, timestamps, result or error, the event
//! timeline with event ids, and the training chart.

use durable_shared::results::{EpochMetrics, TrainingResult};
use leptos::prelude::*;

use super::chart::{ProgressChart, TrainingChart};
use super::dashboard;
use super::question::QuestionForm;

#[component]
pub fn Detail() -> impl IntoView {
    let dash = dashboard();
    // Memos: the panel is drawn again when the selected task or its timeline changes, not on
    // every other task's event (which would also reset a half-typed answer).
    let task = Memo::new(move |_| {
        let id = dash.selected.get()?;
        let task = dash.tasks.with(|tasks| tasks.get(&id).copied())?;
        Some(task.get())
    });
    let timeline = Memo::new(move |_| {
        let id = dash.selected.get()?;
        dash.timelines.with(|t| t.get(&id).cloned())
    });
    move || {
        task.get().map(|task| {
            let id = task.task_id.clone();
            let timeline = timeline.get().unwrap_or_default();
            let question = (task.status == durable_shared::TaskStatus::InputRequired)
                .then(|| task.question.clone())
                .flatten();
            let history = task
                .result_data
                .clone()
                .and_then(|r| serde_json::from_value::<TrainingResult>(r).ok())
                .map(|r| r.history)
                .unwrap_or_else(|| {
                    // One point per epoch: a pause, a resume or a change announced on two
                    // subscribed resources repeats the last epoch's message.
                    let epochs: std::collections::BTreeMap<u64, _> = timeline
                        .iter()
                        .filter_map(|e| EpochMetrics::from_progress_message(&e.message))
                        .map(|m| (m.epoch, m))
                        .collect();
                    epochs.into_values().collect()
                });
            let time = |t: Option<chrono::DateTime<chrono::Utc>>| {
                t.map(|t| t.format("%Y-%m-%d %H:%M:%S").to_string()).unwrap_or_else(|| "—".into())
            };
            view! {
                <aside class="detail" data-test="detail" aria-label="Task detail">
                    <header>
                        <h2>{super::table::kind_label(&task.kind).to_owned()}</h2>
                        <button class="link" on:click=move |_| dash.selected.set(None) aria-label="Close">"✕"</button>
                    </header>
                    {question.map(|question| view! { <QuestionForm task_id=id.clone() question=question /> })}
                    <dl>
                        <dt>"Task id"</dt><dd><code>{id.clone()}</code></dd>
                        <dt>"Status"</dt><dd><span class=format!("badge {}", task.status)>{task.status.as_str()}</span></dd>
                        <dt>"Owner"</dt><dd>{task.owner.clone()}</dd>
                        <dt title="The server that holds, or last held, the task's lease">"Node"</dt>
                        <dd data-test="node">{task.node.clone().unwrap_or_else(|| "—".into())}</dd>
                        <dt>"Created"</dt><dd>{time(Some(task.created_at))}</dd>
                        <dt>"Updated"</dt><dd>{time(Some(task.updated_at))}</dd>
                        <dt>"Finished"</dt><dd>{time(task.completed_at)}</dd>
                        <dt>"Step"</dt><dd>{task.step}</dd>
                    </dl>
                    <h3>"Parameters"</h3>
                    <pre>{serde_json::to_string_pretty(&task.parameters).unwrap_or_default()}</pre>
                    {task.error.clone().map(|e| view! { <h3>"Error"</h3><pre class="error">{e}</pre> })}
                    <ProgressChart timeline=timeline.clone() />
                    {(task.kind == durable_shared::kinds::ML_TRAINING && !history.is_empty()).then(|| view! { <TrainingChart history=history /> })}
                    {task.result_data.clone().map(|r| view! {
                        <details><summary>"Result"</summary><pre data-test="result">{serde_json::to_string_pretty(&r).unwrap_or_default()}</pre></details>
                    })}
                    <h3>"Event timeline"</h3>
                    <ol class="timeline" data-test="timeline">
                        {timeline
                            .into_iter()
                            .rev()
                            .map(|e| {
                                let event_id = e.event_id.clone();
                                view! {
                                <li data-event-id=event_id data-progress=e.progress>
                                    <span class="at">{e.at}</span>
                                    <span class=format!("badge {}", e.status)>{e.status.as_str()}</span>
                                    <span>{format!("{}/{}", e.progress, e.total)}</span>
                                    <span class="msg">{e.message}</span>
                                    <code class="eid">{e.event_id}</code>
                                </li>
                                }
                            })
                            .collect_view()}
                    </ol>
                </aside>
            }
        })
    }
}
