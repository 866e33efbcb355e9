//! Entry point of the dashboard: panic hook, then mount.

fn main() {
    console_error_panic_hook::set_once();
    leptos::mount::mount_to_body(durable_web::App);
}
