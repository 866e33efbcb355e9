//! The dashboard in headless Chromium against the real server: live progress for each kind,
//! reload in the middle of a task, two tabs, pause/resume/cancel, a form error, a cut network
//! and a SIGKILLed server. Screenshots of the main views go to `target/screenshots/`.

use std::collections::BTreeSet;

use durable_shared::EventId;
use durable_tests::browser::{Browser, UI_TIMEOUT};
use durable_tests::dashboard::{TrunkServe, dist, finished_tasks, server, watch_rows};
use durable_tests::proxy::Proxy;
use durable_tests::{Client, IO_TIMEOUT, Server, server_build, stdout_lines, wait_progress};
use durable_tests::{output_within, within};
use fantoccini::Locator;

/// A browser showing `server`'s dashboard, connected.
async fn open(server: &Server) -> Browser {
    open_at(&format!("http://{}/", server.addr)).await
}

/// A browser showing the dashboard at `url`, connected.
async fn open_at(url: &str) -> Browser {
    let browser = Browser::start().await;
    browser.goto(url).await;
    browser
        .wait_text("[data-test=conn]", |t| t == "connected")
        .await;
    browser
}

/// Rows currently shown, as (task id, status).
async fn rows(browser: &Browser) -> Vec<(String, String)> {
    within(UI_TIMEOUT, "the task rows", async {
        let mut rows = Vec::new();
        for row in browser
            .client
            .find_all(Locator::Css("tr[data-test=task-row]"))
            .await
            .unwrap_or_default()
        {
            let id = row
                .attr("data-task-id")
                .await
                .ok()
                .flatten()
                .unwrap_or_default();
            let status = row
                .attr("data-status")
                .await
                .ok()
                .flatten()
                .unwrap_or_default();
            // A row re-rendered while being read has no attributes: skip it this time.
            if !id.is_empty() {
                rows.push((id, status));
            }
        }
        rows
    })
    .await
}

async fn wait_status(browser: &Browser, task_id: &str, status: &str) {
    browser
        .wait_for(&format!("task {task_id} to be {status}"), || async {
            rows(browser)
                .await
                .iter()
                .any(|(id, s)| id == task_id && s == status)
                .then_some(())
        })
        .await
}

async fn percent(browser: &Browser, task_id: &str) -> f64 {
    browser
        .text(&format!("tr[data-task-id='{task_id}'] [data-test=percent]"))
        .await
        .trim_end_matches('%')
        .parse()
        .unwrap_or(0.0)
}

/// Starts a task from the form of `tool` with `fields`, and returns the new task's id.
async fn start(browser: &Browser, tool: &str, fields: &[(&str, &str)]) -> String {
    let before: BTreeSet<String> = rows(browser).await.into_iter().map(|(id, _)| id).collect();
    browser
        .click(&format!(".kinds button[data-tool={tool}]"))
        .await;
    for (name, value) in fields {
        browser.fill(&format!("#{tool}-{name}"), value).await;
    }
    browser
        .click(&format!("form[data-test=form-{tool}] button[type=submit]"))
        .await;
    browser
        .wait_for("the new task's row", || async {
            rows(browser)
                .await
                .into_iter()
                .map(|(id, _)| id)
                .find(|id| !before.contains(id))
        })
        .await
}

/// One entry of the open detail panel's timeline: its event id and the progress it shows.
#[derive(Debug)]
struct Entry {
    token: String,
    seq: u64,
    progress: u64,
}

/// The open detail panel's timeline, oldest first.
async fn timeline(browser: &Browser) -> Vec<Entry> {
    within(UI_TIMEOUT, "the timeline", async {
        let mut entries = Vec::new();
        for item in browser
            .client
            .find_all(Locator::Css("[data-test=timeline] li"))
            .await
            .unwrap_or_default()
        {
            let attr = async |name: &str| item.attr(name).await.ok().flatten().unwrap_or_default();
            let id: EventId = attr("data-event-id")
                .await
                .parse()
                .expect("event id token.seq");
            let progress = attr("data-progress").await.parse().expect("progress");
            entries.push(Entry {
                token: id.token,
                seq: id.seq,
                progress,
            });
        }
        entries.reverse();
        entries
    })
    .await
}

/// Waits until the timeline shows the step that reaches `total`, then checks it shows every
/// step of the task exactly once: consecutive event ids of one stream (nothing missed, nothing
/// twice) whose progress climbs through every value from 1 to `total` (the page's list
/// subscription hears of a task from its creation, before the start call answers).
async fn assert_every_step(browser: &Browser, total: u64) {
    assert_steps(browser, total, total).await
}

/// [`assert_every_step`] through step `complete_through`; after it the timeline may skip
/// steps (never go back), as it does for the steps a restarted server made before the page's
/// session was restored: nothing served the session then, and the restored session is sent
/// the state they led to.
async fn assert_steps(browser: &Browser, total: u64, complete_through: u64) {
    let entries = browser
        .wait_for("every step in the timeline", || async {
            let entries = timeline(browser).await;
            entries
                .iter()
                .any(|e| e.progress == total)
                .then_some(entries)
        })
        .await;
    for pair in entries.windows(2) {
        assert_eq!(pair[0].token, pair[1].token, "one stream: {entries:?}");
        assert!(pair[0].seq < pair[1].seq, "duplicate: {entries:?}");
        // After `complete_through` the restored session's catching up (the current state of
        // each resource it follows, a list among them) has events of no entry here.
        if pair[1].progress <= complete_through {
            assert_eq!(pair[1].seq, pair[0].seq + 1, "gap: {entries:?}");
        }
        assert!(
            pair[0].progress <= pair[1].progress,
            "went back: {entries:?}"
        );
    }
    let shown: BTreeSet<u64> = entries.iter().map(|e| e.progress).collect();
    let missing: Vec<u64> = (1..=complete_through)
        .filter(|p| !shown.contains(p))
        .collect();
    assert!(
        missing.is_empty(),
        "steps missing from the timeline: {missing:?} in {entries:?}"
    );
}

/// The client id (browser-wide) and the session id (this tab's) the page keeps.
async fn stored_ids(browser: &Browser) -> (String, String) {
    let state = browser
        .js("return [localStorage.getItem('durable-mcp/client-id'), \
                     sessionStorage.getItem('durable-mcp/session')];")
        .await;
    let client = state[0].as_str().unwrap_or_default().to_owned();
    let session: serde_json::Value =
        serde_json::from_str(state[1].as_str().unwrap_or("{}")).unwrap();
    (
        client,
        session["session_id"]
            .as_str()
            .unwrap_or_default()
            .to_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_runs_steers_and_survives_a_reload() {
    let (_dir, server) = server(&["--time-scale", "0.02"]).await;
    let base = format!("http://{}/", server.addr);
    let browser = open_at(&base).await;
    let (client_id, session) = stored_ids(&browser).await;
    assert!(client_id.starts_with("web-"), "{client_id}");
    assert_eq!(browser.text("[data-test=client-id]").await, client_id);

    // Each kind shows live progress to completion.
    let migration = start(&browser, "start_data_migration", &[("record_count", "500")]).await;
    let batch = start(
        &browser,
        "start_batch_processing",
        &[
            ("batch_size", "10"),
            ("total_items", "100"),
            ("processing_delay", "2"),
        ],
    )
    .await;
    let training = start(
        &browser,
        "start_ml_training",
        &[("dataset_size", "500"), ("epochs", "30")],
    )
    .await;
    browser
        .wait_for("live progress", || async {
            let p = percent(&browser, &training).await;
            (p > 0.0 && p < 100.0).then_some(())
        })
        .await;
    browser.screenshot("dashboard-running").await;
    for id in [&migration, &batch, &training] {
        wait_status(&browser, id, "completed").await;
        assert_eq!(percent(&browser, id).await, 100.0);
    }
    browser
        .click(&format!("tr[data-task-id='{training}'] button.link"))
        .await;
    browser
        .wait_for("the training chart", || async {
            browser
                .client
                .find(Locator::Css("[data-test=training-chart]"))
                .await
                .ok()
        })
        .await;
    browser
        .wait_for("the progress chart", || async {
            browser
                .client
                .find(Locator::Css("[data-test=progress-chart] polyline"))
                .await
                .ok()
        })
        .await;
    browser.screenshot("dashboard-training-detail").await;

    // Reload in the middle of a task: same client and session, timeline without gaps.
    let long = start(
        &browser,
        "start_batch_processing",
        &[
            ("batch_size", "1"),
            ("total_items", "60"),
            ("processing_delay", "5"),
        ],
    )
    .await;
    browser
        .click(&format!("tr[data-task-id='{long}'] button.link"))
        .await;
    browser
        .wait_for("a few steps", || async {
            (timeline(&browser).await.len() >= 5).then_some(())
        })
        .await;
    browser.refresh().await;
    browser
        .wait_text("[data-test=conn]", |t| {
            t == "connected" || t.starts_with("replaying")
        })
        .await;
    assert_eq!(
        stored_ids(&browser).await,
        (client_id.clone(), session.clone())
    );
    wait_status(&browser, &long, "completed").await;
    browser
        .click(&format!("tr[data-task-id='{long}'] button.link"))
        .await;
    assert_every_step(&browser, 60).await;
    let shown = browser
        .wait_for("the four tasks' rows", || async {
            let shown = rows(&browser).await;
            (shown.len() >= 4).then_some(shown)
        })
        .await;
    let unique: BTreeSet<&String> = shown.iter().map(|(id, _)| id).collect();
    assert_eq!(unique.len(), shown.len(), "no duplicate rows");
    assert_eq!(shown.len(), 4);

    // Pause, resume, cancel.
    let steered = start(
        &browser,
        "start_ml_training",
        &[("dataset_size", "100"), ("epochs", "1000")],
    )
    .await;
    wait_status(&browser, &steered, "running").await;
    browser
        .click(&format!("tr[data-task-id='{steered}'] [data-test=pause]"))
        .await;
    wait_status(&browser, &steered, "paused").await;
    browser
        .click(&format!("tr[data-task-id='{steered}'] [data-test=resume]"))
        .await;
    wait_status(&browser, &steered, "running").await;
    browser
        .click(&format!("tr[data-task-id='{steered}'] [data-test=cancel]"))
        .await;
    browser
        .wait_text(
            &format!("tr[data-task-id='{steered}'] [data-test=cancel]"),
            |t| t == "Confirm cancel",
        )
        .await;
    browser
        .click(&format!("tr[data-task-id='{steered}'] [data-test=cancel]"))
        .await;
    wait_status(&browser, &steered, "cancelled").await;

    // A bad value shows the server's message next to its field.
    browser
        .click(".kinds button[data-tool=start_batch_processing]")
        .await;
    browser
        .fill("#start_batch_processing-batch_size", "0")
        .await;
    browser
        .click("form[data-test=form-start_batch_processing] button[type=submit]")
        .await;
    let error = browser
        .wait_text("[data-test=error-batch_size]", |t| !t.is_empty())
        .await;
    assert_eq!(error, "batch_size must be between 1 and 1000000, got 0");
    browser.screenshot("dashboard-form-error").await;

    // A second tab stays live too.
    let first_tab = within(UI_TIMEOUT, "the window", browser.client.window())
        .await
        .unwrap();
    let second_tab = within(UI_TIMEOUT, "a new tab", browser.client.new_window(true))
        .await
        .unwrap()
        .handle;
    within(
        UI_TIMEOUT,
        "switching tabs",
        browser.client.switch_to_window(second_tab),
    )
    .await
    .unwrap();
    browser.goto(&base).await;
    browser
        .wait_text("[data-test=conn]", |t| t == "connected")
        .await;
    let (second_client, second_session) = stored_ids(&browser).await;
    assert_eq!(second_client, client_id, "tabs share the client id");
    assert_ne!(second_session, session, "each tab has its own session");
    let from_second = start(
        &browser,
        "start_batch_processing",
        &[
            ("batch_size", "5"),
            ("total_items", "20"),
            ("processing_delay", "1"),
        ],
    )
    .await;
    within(
        UI_TIMEOUT,
        "switching back",
        browser.client.switch_to_window(first_tab),
    )
    .await
    .unwrap();
    wait_status(&browser, &from_second, "completed").await;
    browser.screenshot("dashboard-overview").await;

    let console = browser.js("return (window.__errors || []).length").await;
    assert_eq!(console, 0);
    browser.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_recovers_from_a_cut_network_and_a_killed_server() {
    let dir = tempfile::tempdir().unwrap();
    let dist = dist();
    let mut server = Server::start(
        dir.path(),
        &[
            "--dashboard-dir",
            &dist,
            "--time-scale",
            "0.02",
            "--sse-retry",
            "500ms",
        ],
    )
    .await;
    let proxy = Proxy::start(server.addr).await;
    let browser = Browser::start().await;
    browser.goto(&format!("http://{}/", proxy.addr)).await;
    browser
        .wait_text("[data-test=conn]", |t| t == "connected")
        .await;

    // 0.2 s a step: still running at the kill, after the cut's reconnection; and few enough
    // steps that the timeline (200 entries) keeps them all.
    const TOTAL: u64 = 150;
    let task = start(
        &browser,
        "start_batch_processing",
        &[
            ("batch_size", "1"),
            ("total_items", &TOTAL.to_string()),
            ("processing_delay", "10"),
        ],
    )
    .await;
    browser
        .click(&format!("tr[data-task-id='{task}'] button.link"))
        .await;
    browser
        .wait_for("some progress", || async {
            (percent(&browser, &task).await >= 5.0).then_some(())
        })
        .await;

    proxy.cut();
    browser
        .wait_text("[data-test=conn]", |t| {
            t.starts_with("reconnecting") || t == "offline"
        })
        .await;
    browser.screenshot("dashboard-reconnecting").await;
    let frozen = percent(&browser, &task).await;
    // Let the task move on while the page is cut off, so the page has events to catch up on.
    let watcher = Client::connect(&server.mcp_url(), None).await;
    let cut_at = watcher.task(&task).await.progress;
    wait_progress(&watcher, &task, cut_at + 10).await;
    watcher.close().await;
    proxy.restore();
    browser
        .wait_text("[data-test=conn]", |t| t == "connected")
        .await;
    browser
        .wait_for("catching up", || async {
            (percent(&browser, &task).await > frozen).then_some(())
        })
        .await;

    // Every step up to the kill is stored before the process dies.
    let watcher = Client::connect(&server.mcp_url(), None).await;
    let killed_at = watcher.task(&task).await.progress;
    watcher.close().await;
    assert!(
        killed_at < TOTAL,
        "the task must still run at the kill: make it longer"
    );
    server.kill9().await;
    server.restart().await;
    // The proxy still points at the same port; the page finds the restarted server by itself.
    wait_status(&browser, &task, "completed").await;
    browser
        .wait_text("[data-test=conn]", |t| t == "connected")
        .await;
    // Every step before the cut, during it and up to the kill; then the steps since the page's
    // session was restored, and at least one entry with the state the task had by then.
    assert_steps(&browser, TOTAL, killed_at).await;
    browser.screenshot("dashboard-recovered").await;
    browser.close().await;
}

/// A server that requires tokens: the dashboard asks for one, says why a bad one was refused,
/// works as ever with a good one (its tasks the token subject's), and asks again after sign-out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_signs_in_with_a_bearer_token_and_out_again() {
    let dir = tempfile::tempdir().unwrap();
    let issuer = durable_tests::auth::Issuer::new(dir.path());
    let dist = dist();
    let server = issuer
        .start_server(
            dir.path(),
            &["--dashboard-dir", &dist, "--time-scale", "0.02"],
        )
        .await;
    let browser = Browser::start().await;
    browser.goto(&format!("http://{}/", server.addr)).await;
    browser
        .wait_text("[data-test=sign-in-reason]", |t| t.contains("bearer token"))
        .await;
    browser.fill("#sign-in-token", "not-a-token").await;
    browser
        .click("form[data-test=sign-in] button[type=submit]")
        .await;
    browser
        .wait_text("[data-test=sign-in-reason]", |t| {
            t.contains("not a signed JWT")
        })
        .await;
    let token = issuer.token("dana", durable_tests::auth::WRITE);
    browser.fill("#sign-in-token", &token).await;
    browser
        .click("form[data-test=sign-in] button[type=submit]")
        .await;
    browser
        .wait_text("[data-test=conn]", |t| t == "connected")
        .await;
    let task = start(
        &browser,
        "start_batch_processing",
        &[("batch_size", "1"), ("total_items", "3")],
    )
    .await;
    wait_status(&browser, &task, "completed").await;
    assert_eq!(
        issuer.operator(&server).await.task(&task).await.owner,
        "dana"
    );
    browser.click("[data-test=sign-out]").await;
    browser
        .wait_text("[data-test=sign-in-reason]", |t| t.contains("signed out"))
        .await;
    assert!(
        rows(&browser).await.is_empty(),
        "signed out, no task is shown"
    );
    browser.close().await;
}

/// A task that asks its person: the question appears in the detail panel as a form read from
/// its schema (a select of the hotels offered, then yes or no), stays there across a reload
/// while it waits, and the answers given through the form end the trip exactly as the same
/// answers given with `answer_task` do.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_answers_a_tasks_questions_with_forms() {
    let (_dir, server) = server(&["--time-scale", "0.01"]).await;
    let browser = open(&server).await;
    let fields = [
        ("destination", "Lisbon"),
        ("start_date", "2027-05-14"),
        ("nights", "3"),
        ("budget", "900"),
    ];
    let trip = start(&browser, "start_trip_planning", &fields).await;
    wait_status(&browser, &trip, "input_required").await;
    let client = Client::connect(&server.mcp_url(), Some("observer")).await;
    let question = client
        .task(&trip)
        .await
        .question
        .expect("the first question");
    let hotels = durable_tests::trip::hotels(&question);
    let choose = "form[data-test=question][data-question-id=choose_hotel]";
    browser
        .wait_text(&format!("{choose} [data-test=question-message]"), |t| {
            t == question.message
        })
        .await;
    browser.screenshot("dashboard-question").await;

    // The question waits across a reload.
    browser.refresh().await;
    browser
        .wait_text("[data-test=conn]", |t| t == "connected")
        .await;
    browser
        .click(&format!("tr[data-task-id='{trip}'] button.link"))
        .await;
    browser
        .select(&format!("{choose} #answer-hotel"), &hotels[1])
        .await;
    browser.click(&format!("{choose} [data-test=answer]")).await;
    let confirm = "form[data-test=question][data-question-id=confirm_booking]";
    browser
        .wait_text(&format!("{confirm} [data-test=question-message]"), |t| {
            t.starts_with(&format!("Book {}", hotels[1]))
        })
        .await;
    browser
        .select(&format!("{confirm} #answer-book"), "yes")
        .await;
    browser
        .click(&format!("{confirm} [data-test=answer]"))
        .await;
    wait_status(&browser, &trip, "completed").await;
    let done = client.task(&trip).await;

    let baseline = durable_tests::trip::answered(&client, &hotels[1]).await;
    assert_eq!(done.result_data, baseline.result_data);
    assert_eq!(done.result_data.unwrap()["answers_applied"], 2);
    client.close().await;
    browser.close().await;
}

/// Each tab has its own session (so its own stream and last event id): a second tab, and a copy
/// of a tab made as "Duplicate tab" makes one (`window.open` copies the tab's storage, its id
/// with it, while the first page runs), each start their own, and a reload keeps it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_tab_and_a_duplicated_tab_keep_their_own_session() {
    let (_dir, server) = server(&[]).await;
    let browser = open(&server).await;
    let connected = async || {
        browser
            .wait_text("[data-test=conn]", |t| t == "connected")
            .await;
        stored_ids(&browser).await
    };
    let (client_id, first) = connected().await;
    let first_window = browser.window().await;

    browser.js("window.open(location.href); return null;").await;
    browser.switch_to_new_window(&first_window).await;
    let (copy_client, copy) = connected().await;
    assert_eq!(copy_client, client_id, "one browser, one client id");
    assert_ne!(copy, first, "the copy has a session of its own");
    browser.refresh().await;
    assert_eq!(
        connected().await.1,
        copy,
        "a reload keeps the copy's session"
    );

    browser.new_tab().await;
    browser.goto(&format!("http://{}/", server.addr)).await;
    let (_, second) = connected().await;
    assert!(
        second != first && second != copy,
        "a new tab starts its own"
    );

    browser.switch_to(first_window).await;
    // What an earlier version left behind for each tab it ever had is cleared on load.
    browser
        .js("localStorage.setItem('durable-mcp/tab/gone', '{}'); return null;")
        .await;
    browser.refresh().await;
    assert_eq!(connected().await.1, first, "the first tab kept its session");
    let kept = browser
        .js("return Object.keys(localStorage).filter(k => k.startsWith('durable-mcp/')).sort();")
        .await;
    assert_eq!(
        kept,
        serde_json::json!(["durable-mcp/client-id"]),
        "nothing per tab in the browser-wide storage"
    );
    browser.close().await;
}

/// A row action waits for its answer, so a double click sends one call; an action that fails
/// shows its error, apart from the connection's state, until it is dismissed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn row_actions_wait_for_their_answer_and_their_errors_can_be_dismissed() {
    let (_dir, mut server) = server(&["--time-scale", "0.02"]).await;
    let browser = open(&server).await;
    let task = start(
        &browser,
        "start_batch_processing",
        &[
            ("batch_size", "1"),
            ("total_items", "1000"),
            ("processing_delay", "5"),
        ],
    )
    .await;
    wait_status(&browser, &task, "running").await;
    // Counts the page's pause_task calls, then clicks Pause twice in one turn of its event loop.
    browser
        .js(&format!(
            "window.pauses = 0; \
             const fetch = window.fetch; \
             window.fetch = (request, init) => {{ \
               request.clone().text().then(body => {{ \
                 if (body.includes('\"pause_task\"')) window.pauses += 1; }}); \
               return fetch.call(window, request, init); }}; \
             const pause = document.querySelector(\"tr[data-task-id='{task}'] [data-test=pause]\"); \
             pause.click(); pause.click(); return null;"
        ))
        .await;
    wait_status(&browser, &task, "paused").await;
    browser
        .wait_text(
            &format!("tr[data-task-id='{task}'] [data-test=resume]"),
            |t| t == "Resume",
        )
        .await;
    assert_eq!(browser.js("return window.pauses;").await, 1, "one call");

    // With the server gone, Resume fails: its error stays until dismissed.
    server.kill9().await;
    browser
        .click(&format!("tr[data-task-id='{task}'] [data-test=resume]"))
        .await;
    let error = browser
        .wait_text("[data-test=error]", |t| t.contains("resume_task"))
        .await;
    assert!(error.contains(&task), "{error}");
    browser.screenshot("dashboard-action-error").await;
    browser.click("[data-test=dismiss]").await;
    browser
        .wait_for("the error dismissed", || async {
            browser
                .client
                .find_all(Locator::Css("[data-test=error]"))
                .await
                .ok()
                .filter(Vec::is_empty)
        })
        .await;
    browser.close().await;
}

/// A running task's actions are on screen without scrolling sideways, at desktop width and at a
/// phone's 390 px.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_tasks_actions_fit_on_desktop_and_phone_screens() {
    let (_dir, server) = server(&["--time-scale", "0.02"]).await;
    let browser = open(&server).await;
    // Rows of other kinds widen the kind and parameter columns, as a real list has them.
    start(&browser, "start_data_migration", &[("record_count", "500")]).await;
    start(
        &browser,
        "start_batch_processing",
        &[("batch_size", "10"), ("total_items", "100")],
    )
    .await;
    let task = start(
        &browser,
        "start_ml_training",
        // A long name and message: the free-text columns must give way to the actions.
        &[
            ("model_name", "customer-churn-gradient-boosted-ensemble"),
            ("dataset_size", "100"),
            ("epochs", "1000"),
        ],
    )
    .await;
    wait_status(&browser, &task, "running").await;
    browser
        .wait_text(&format!("tr[data-task-id='{task}'] .message"), |t| {
            t.starts_with("Epoch")
        })
        .await;
    for (width, name) in [(1280, "dashboard-desktop"), (390, "dashboard-phone")] {
        browser.resize(width, 900).await;
        let sizes = browser
            .wait_for(&format!("the page at {width} px"), || async {
                let sizes = browser
                    .js(&format!(
                        "const wrap = document.querySelector('.table-wrap'); \
                         const cancel = document.querySelector(\"tr[data-task-id='{task}'] [data-test=cancel]\"); \
                         return [window.innerWidth, document.scrollingElement.scrollWidth, \
                                 wrap.scrollWidth, wrap.clientWidth, \
                                 cancel.getBoundingClientRect().right];"
                    ))
                    .await;
                let sizes: Vec<f64> = sizes
                    .as_array()?
                    .iter()
                    .map(|size| size.as_f64().unwrap_or(f64::MAX))
                    .collect();
                (sizes[0] <= f64::from(width)).then_some(sizes)
            })
            .await;
        browser.screenshot(name).await;
        let [window, page, table, table_box, cancel] = sizes[..] else {
            unreachable!("five sizes")
        };
        // Nothing to scroll sideways to, and the last button inside the window.
        assert!(
            page <= window && table <= table_box && cancel <= window,
            "at {width} px: window {window}, page {page}, table {table} in {table_box}, \
             Cancel ends at {cancel}"
        );
    }
    browser.close().await;
}

/// With 2,000 tasks the page reads every one (the list's four pages), shows them 50 at a time
/// with search and filters, and an event of one task changes the DOM of that task's row only:
/// every other row, and the table's body, stay untouched. A reload keeps the session and the
/// whole list.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_of_two_thousand_tasks_changing_touches_only_its_own_row() {
    const TASKS: usize = 2_000;
    let (_dir, server) = server(&[]).await;
    let client = Client::connect(&server.mcp_url(), Some("loader")).await;
    finished_tasks(&client, TASKS - 1).await;
    // The newest task, so on the first page; a step every 200 ms while it is watched.
    let watched = client
        .call_ok(
            "start_batch_processing",
            serde_json::json!({"batch_size": 1, "total_items": 1000, "processing_delay": 0.2}),
        )
        .await["task_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let browser = open(&server).await;
    let first_page = "1–50 of 2000";
    browser
        .wait_text("[data-test=page-info]", |t| t == first_page)
        .await;
    let shown = rows(&browser).await;
    assert_eq!(shown.len(), 50);
    assert_eq!(shown[0], (watched.clone(), "running".to_owned()));
    let (_, session) = stored_ids(&browser).await;

    // Counted before the rows are watched: a step drawn between the two would otherwise be a
    // change the watch sees (one step alone touches five nodes of its row) but the count missed.
    let renders_before = browser
        .js("return window.wasmBindings.row_renders();")
        .await;
    watch_rows(&browser).await;
    browser
        .wait_for("a few steps of the watched task in its row", || async {
            let touched = browser
                .js(&format!("return window.touched['{watched}'] || 0;"))
                .await;
            (touched.as_u64() >= Some(5)).then_some(())
        })
        .await;
    let touched = browser
        .js("return [Object.keys(window.touched), window.outside];")
        .await;
    assert_eq!(
        touched,
        serde_json::json!([[watched], 0]),
        "only the watched task's row changed"
    );
    let renders = browser
        .js("return window.wasmBindings.row_renders();")
        .await;
    let rendered: Vec<&String> = renders
        .as_object()
        .expect("renders by task id")
        .iter()
        .filter(|(id, count)| renders_before[id.as_str()] != **count)
        .map(|(id, _)| id)
        .collect();
    assert_eq!(rendered, [&watched], "only the watched task's row rendered");

    // Search and filters look through every task, not a page.
    browser.fill("[data-test=search]", &watched[..13]).await;
    browser
        .wait_text("[data-test=page-info]", |t| t == "1–1 of 1")
        .await;
    assert_eq!(rows(&browser).await[0].0, watched);
    browser.fill("[data-test=search]", "").await;
    browser.select("[data-test=status-filter]", "running").await;
    browser
        .wait_text("[data-test=page-info]", |t| t == "1–1 of 1")
        .await;
    browser.select("[data-test=status-filter]", "").await;
    browser
        .wait_text("[data-test=page-info]", |t| t == first_page)
        .await;
    browser.click("[data-test=next-page]").await;
    browser
        .wait_text("[data-test=page-info]", |t| t == "51–100 of 2000")
        .await;
    let second = rows(&browser).await;
    assert_eq!(second.len(), 50);
    assert!(
        second
            .iter()
            .all(|(id, status)| *id != watched && status == "completed"),
        "{second:?}"
    );

    // The server's throughput from its /metrics, read every 5 s: the watched task's steps.
    browser
        .wait_text("[data-test=server-rates]", |t| {
            t.trim()
                .strip_prefix("now: ")
                .and_then(|rest| rest.split(' ').next())
                .and_then(|steps| steps.parse::<f64>().ok())
                .is_some_and(|steps| steps > 0.0)
        })
        .await;

    browser.refresh().await;
    browser
        .wait_text("[data-test=page-info]", |t| t == first_page)
        .await;
    assert_eq!(stored_ids(&browser).await.1, session, "the session is kept");
    browser.screenshot("dashboard-2000-tasks").await;
    client.close().await;
    browser.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trunk_serve_runs_the_dashboard_against_a_server_through_its_proxy() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path(), &["--time-scale", "0.02"]).await;
    let trunk = TrunkServe::start(dir.path(), &server.mcp_url()).await;
    let browser = open_at(&trunk.url()).await;
    let task = start(
        &browser,
        "start_batch_processing",
        &[
            ("batch_size", "10"),
            ("total_items", "50"),
            ("processing_delay", "1"),
        ],
    )
    .await;
    wait_status(&browser, &task, "completed").await;
    assert_eq!(percent(&browser, &task).await, 100.0);
    // The task is the server's: started, run and seen to its end through Trunk's proxy.
    let (client_id, _) = stored_ids(&browser).await;
    let client = Client::connect(&server.mcp_url(), Some(&client_id)).await;
    let info = client.task(&task).await;
    assert_eq!(
        info.status,
        durable_shared::TaskStatus::Completed,
        "{info:?}"
    );
    let errors = browser.js("return window.__errors;").await;
    assert_eq!(errors, serde_json::json!([]), "trunk log:\n{}", trunk.log());
}

/// How long the build of the server with the dashboard built in may take: the server crate
/// again with the feature, and a cold release build of the web crate for wasm beside it.
const EMBEDDED_BUILD_LIMIT: std::time::Duration = std::time::Duration::from_secs(1200);

/// Builds made before a copy of the binary with the dashboard is one (see below).
const EMBEDDED_BUILD_ATTEMPTS: usize = 3;

/// Builds the server binary with `--features embedded-dashboard` (the test's profile, the same
/// target directory: only the server crate and the dashboard are built again) and copies it
/// into `dir`. The copy is what runs: the other test processes' builds put the plain binary
/// back at the same path, one of them at times between this build and the copy, so a copy
/// without the dashboard (without the name of its WASM module, `..._bg.wasm`) is made again.
async fn binary_with_embedded_dashboard(dir: &std::path::Path) -> std::path::PathBuf {
    let copy = dir.join("durable-mcp");
    for _ in 0..EMBEDDED_BUILD_ATTEMPTS {
        let (build, built) = server_build(&["embedded-dashboard"]);
        let output = output_within(&mut build.into(), EMBEDDED_BUILD_LIMIT).await;
        assert!(
            output.status.success(),
            "the build with the embedded dashboard failed:\n{}",
            String::from_utf8_lossy(&output.stderr)
        );
        std::fs::copy(&built, &copy).expect("copying the binary");
        let binary = std::fs::read(&copy).expect("reading the copy");
        if memchr::memmem::find(&binary, b"_bg.wasm").is_some() {
            return copy;
        }
    }
    panic!("each copy of the binary built with the dashboard was the plain binary");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_with_the_dashboard_built_in_serves_it_from_any_directory() {
    let dir = tempfile::tempdir().unwrap();
    let binary = binary_with_embedded_dashboard(dir.path()).await;
    // Run where there is no web/dist, and without --dashboard-dir, as after `cargo install`.
    let log = std::fs::File::create(dir.path().join("server.log")).unwrap();
    let mut child = tokio::process::Command::new(&binary)
        .current_dir(dir.path())
        .args(["--host", "127.0.0.1", "--port", "0"])
        .args(["--db", "tasks.db", "--data-dir", "data"])
        .stdout(std::process::Stdio::piped())
        .stderr(log)
        .kill_on_drop(true)
        .spawn()
        .expect("starting the binary");
    let mut lines = stdout_lines(&mut child);
    let line = within(IO_TIMEOUT, "the server to start", lines.recv())
        .await
        .expect("the server's first line");
    let base = line
        .strip_prefix("durable-mcp listening on ")
        .and_then(|url| url.strip_suffix("mcp"))
        .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
        .to_owned();

    let http = reqwest::Client::new();
    let get = async |path: &str, etag: Option<&str>| {
        let mut request = http.get(format!("{base}{path}"));
        if let Some(etag) = etag {
            request = request.header("if-none-match", etag);
        }
        within(IO_TIMEOUT, path, request.send()).await.unwrap()
    };
    let page = get("", None).await;
    assert_eq!(page.status(), 200);
    assert_eq!(page.headers()["content-type"], "text/html");
    let page = page.text().await.unwrap();
    let wasm = page
        .split(['"', '\'', '/'])
        .find(|part| part.starts_with("durable-web-") && part.ends_with("_bg.wasm"))
        .unwrap_or_else(|| panic!("no wasm named in the page:\n{page}"))
        .to_owned();
    let module = get(&wasm, None).await;
    assert_eq!(module.status(), 200);
    // The content type the browser's streaming compilation insists on.
    assert_eq!(module.headers()["content-type"], "application/wasm");
    let etag = module.headers()["etag"].to_str().unwrap().to_owned();
    assert!(module.bytes().await.unwrap().starts_with(b"\0asm"));
    assert_eq!(get(&wasm, Some(&etag)).await.status(), 304);
    // A client-side route gets the page, as from a directory.
    let route = get("tasks/any", None).await;
    assert_eq!(route.status(), 200);
    assert_eq!(route.text().await.unwrap(), page);

    let browser = open_at(&base).await;
    let errors = browser.js("return window.__errors;").await;
    assert_eq!(errors, serde_json::json!([]));
}
