//! The top bar: connection state, client id, tasks per status.

use durable_shared::TaskStatus;
use leptos::prelude::*;

use super::dashboard;

#[component]
pub fn Header(client_id: String) -> impl IntoView {
    let dash = dashboard();
    view! {
        <header class="top">
            <h1>"durable-mcp"</h1>
            <span class=move || dash.conn.get().class() data-test="conn" role="status">
                {move || dash.conn.get().label()}
            </span>
            <span class="client" title="This browser's client id" data-test="client-id">{client_id}</span>
            <Show when=move || dash.signed_in.get()>
                <button
                    class="sign-out"
                    data-test="sign-out"
                    on:click=move |_| {
                        crate::mcp::sign_out();
                        dash.signed_in.set(false);
                        // The session was the token's subject's: start over, signed out.
                        crate::connection().forget_session();
                        dash.clear_tasks();
                        dash.sign_in.set(Some("signed out".into()));
                    }
                >
                    "Sign out"
                </button>
            </Show>
            <ul class="stats" aria-label="Tasks by status">
                {TaskStatus::ALL
                    .into_iter()
                    .map(|status| {
                        view! {
                            <li class=format!("badge {status}") data-test=format!("stat-{status}")>
                                {status.as_str()} " " <b>{move || dash.count(status)}</b>
                            </li>
                        }
                    })
                    .collect_view()}
            </ul>
        </header>
    }
}
