//! The durable-mcp dashboard: a Leptos CSR app that watches and steers durable tasks, and is
//! itself a resumable MCP client (see [`mcp`] and [`sync`]).

pub mod components;
pub mod mcp;
pub mod state;
pub mod sync;

use std::rc::Rc;

use leptos::prelude::*;

use components::{Detail, Header, ServerChart, SignIn, StartForms, TaskTable};
use state::Dashboard;

thread_local! {
    /// The page's one MCP connection. A thread-local rather than a prop: it is not `Send`, and
    /// the browser runs the whole app on one thread.
    static MCP: Rc<mcp::Mcp> = Rc::new(mcp::Mcp::new("/mcp"));
}

/// The page's MCP connection.
pub fn connection() -> Rc<mcp::Mcp> {
    MCP.with(Rc::clone)
}

#[component]
pub fn App() -> impl IntoView {
    let mcp = connection();
    let dash = Dashboard::restore();
    provide_context(dash);
    leptos::task::spawn_local(sync::run(mcp.clone(), dash));
    let client_id = mcp.client_id().to_owned();
    view! {
        <Header client_id=client_id />
        {move || dash.notice.get().map(|text| view! { <p class="notice" role="status">{text}</p> })}
        <ul class="errors" aria-label="Errors">
            <For each=move || dash.errors.get() key=|error| error.id let:error>
                <li class="error" role="alert" data-test="error">
                    <span>{error.text}</span>
                    <button
                        class="dismiss"
                        data-test="dismiss"
                        aria-label="Dismiss"
                        on:click=move |_| dash.dismiss(error.id)
                    >
                        "×"
                    </button>
                </li>
            </For>
        </ul>
        <SignIn />
        <main>
            <section class="start" aria-label="Start a task">
                <StartForms />
                <ServerChart />
            </section>
            <section class="tasks" aria-label="Tasks">
                <TaskTable />
            </section>
            <Detail />
        </main>
    }
}
