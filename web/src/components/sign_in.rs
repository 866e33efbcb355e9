//! The sign-in form, shown while the server wants a bearer token: the token is kept in
//! `localStorage` (until sign-out) and sent with every request.

use leptos::prelude::*;

use super::dashboard;

#[component]
pub fn SignIn() -> impl IntoView {
    let dash = dashboard();
    let token = RwSignal::new(String::new());
    let submit = move |event: leptos::ev::SubmitEvent| {
        event.prevent_default();
        let value = token.get_untracked();
        if value.trim().is_empty() {
            return;
        }
        crate::mcp::sign_in(&value);
        token.set(String::new());
        dash.signed_in.set(true);
        dash.conn.set(crate::state::Conn::Connecting);
        // The connection loop waits for this to be cleared.
        dash.sign_in.set(None);
    };
    view! {
        <Show when=move || dash.sign_in.get().is_some()>
            <form class="sign-in" data-test="sign-in" on:submit=submit>
                <h2>"Sign in"</h2>
                <p class="why" data-test="sign-in-reason">
                    "This server requires an OAuth bearer token: "
                    {move || dash.sign_in.get().unwrap_or_default()}
                </p>
                <label>
                    "Access token"
                    <input
                        type="password"
                        id="sign-in-token"
                        autocomplete="off"
                        prop:value=move || token.get()
                        on:input=move |event| token.set(event_target_value(&event))
                    />
                </label>
                <button type="submit">"Sign in"</button>
            </form>
        </Show>
    }
}
