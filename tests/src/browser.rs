//! Headless Chromium driven through chromedriver (both from Debian), for the dashboard tests.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use fantoccini::wd::WindowHandle;
use fantoccini::{Client, ClientBuilder, Locator};
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use serde_json::{Value, json};
use tokio::process::{Child, Command};

use crate::within;

/// How long a browser wait lasts before the test fails.
pub const UI_TIMEOUT: Duration = Duration::from_secs(30);

pub struct Browser {
    pub client: Client,
    _driver: ProcessGroup,
    _profile: tempfile::TempDir,
}

/// A child in its own process group (chromedriver, Trunk); dropping it kills the child and
/// every process it started (Chromium; cargo and wasm-bindgen).
pub(crate) struct ProcessGroup {
    /// Kept to be dropped: `kill_on_drop` kills the child itself and tokio reaps it.
    _child: Child,
    /// The child's pid, which is also its process group's id.
    group: Pid,
}

impl ProcessGroup {
    pub(crate) fn spawn(command: &mut Command) -> std::io::Result<ProcessGroup> {
        let child = command.process_group(0).kill_on_drop(true).spawn()?;
        let pid = child.id().expect("a child just spawned has a pid");
        let group = Pid::from_raw(i32::try_from(pid).expect("a pid fits in pid_t"));
        Ok(ProcessGroup {
            _child: child,
            group,
        })
    }

    /// The child's pid.
    pub(crate) fn pid(&self) -> i32 {
        self.group.as_raw()
    }
}

impl Drop for ProcessGroup {
    fn drop(&mut self) {
        let _ = killpg(self.group, Signal::SIGKILL);
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .expect("free port")
        .port()
}

/// Attempts at starting chromedriver and a session before a test gives up.
const START_ATTEMPTS: usize = 3;

impl Browser {
    /// Starts chromedriver and a headless Chromium session. The free port chromedriver is given
    /// can be taken by another process before it binds, so a failed start is retried on a new
    /// port.
    pub async fn start() -> Browser {
        let mut failures = Vec::new();
        for _ in 0..START_ATTEMPTS {
            match Self::try_start().await {
                Ok(browser) => return browser,
                Err(e) => failures.push(e),
            }
        }
        panic!("cannot start a WebDriver session: {failures:#?}");
    }

    async fn try_start() -> Result<Browser, String> {
        let port = free_port();
        let driver = ProcessGroup::spawn(
            Command::new("chromedriver")
                .arg(format!("--port={port}"))
                .stdout(Stdio::null())
                .stderr(Stdio::null()),
        )
        .expect("chromedriver (apt-get install chromium-driver; scripts/setup does)");
        // Ready when this chromedriver answers its status endpoint (a bare TCP connect could
        // reach whatever else holds the port).
        let status = format!("http://127.0.0.1:{port}/status");
        let http = reqwest::Client::new();
        tokio::time::timeout(UI_TIMEOUT, async {
            loop {
                let ready = match http.get(&status).send().await {
                    Ok(response) => response
                        .json::<Value>()
                        .await
                        .is_ok_and(|status| status["value"]["ready"] == true),
                    Err(_) => false,
                };
                if ready {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
        .await
        .map_err(|_| format!("chromedriver on port {port} never became ready"))?;
        let profile = tempfile::tempdir().expect("browser profile");
        let mut capabilities = serde_json::Map::new();
        capabilities.insert(
            "goog:chromeOptions".into(),
            json!({
                "binary": "/usr/bin/chromium",
                "args": [
                    "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                    "--disable-background-networking", "--disable-component-update",
                    "--disable-sync", "--no-first-run", "--window-size=1280,900",
                    format!("--user-data-dir={}", profile.path().display()),
                ],
            }),
        );
        let client = tokio::time::timeout(
            UI_TIMEOUT,
            ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new())
                .capabilities(capabilities)
                .connect(&format!("http://127.0.0.1:{port}")),
        )
        .await
        .map_err(|_| format!("no WebDriver session on port {port} within {UI_TIMEOUT:?}"))?
        .map_err(|e| format!("WebDriver session on port {port}: {e}"))?;
        Ok(Browser {
            client,
            _driver: driver,
            _profile: profile,
        })
    }

    /// Text of the first element matching `css`, or "" if there is none.
    pub async fn text(&self, css: &str) -> String {
        within(UI_TIMEOUT, css, async {
            match self.client.find(Locator::Css(css)).await {
                Ok(element) => element.text().await.unwrap_or_default(),
                Err(_) => String::new(),
            }
        })
        .await
    }

    /// Waits until `check` returns `Some`, polling the page.
    pub async fn wait_for<T, F, Fut>(&self, what: &str, check: F) -> T
    where
        F: Fn() -> Fut,
        Fut: std::future::Future<Output = Option<T>>,
    {
        within(UI_TIMEOUT, what, async {
            loop {
                if let Some(value) = check().await {
                    return value;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
        .await
    }

    /// Waits until the text of `css` satisfies `check`; a timeout says what the text was.
    pub async fn wait_text(&self, css: &str, check: impl Fn(&str) -> bool) -> String {
        let last = std::cell::RefCell::new(String::new());
        let waited = tokio::time::timeout(UI_TIMEOUT, async {
            loop {
                let text = self.text(css).await;
                if check(&text) {
                    return text;
                }
                *last.borrow_mut() = text;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
        .await;
        waited.unwrap_or_else(|_| {
            panic!(
                "timed out after {UI_TIMEOUT:?} waiting for the text of {css}; it was {:?}",
                last.borrow()
            )
        })
    }

    /// Runs JavaScript and returns its value.
    pub async fn js(&self, script: &str) -> Value {
        within(UI_TIMEOUT, "a script", self.client.execute(script, vec![]))
            .await
            .expect("script")
    }

    /// Loads `url` and waits for the page to load.
    pub async fn goto(&self, url: &str) {
        within(UI_TIMEOUT, url, self.client.goto(url))
            .await
            .expect("page load");
    }

    /// Reloads the page.
    pub async fn refresh(&self) {
        within(UI_TIMEOUT, "a reload", self.client.refresh())
            .await
            .expect("reload");
    }

    /// Clicks the element matching `css`, finding it again if it was re-rendered meanwhile.
    pub async fn click(&self, css: &str) {
        self.wait_for(&format!("a clickable {css}"), || async {
            let element = self.client.find(Locator::Css(css)).await.ok()?;
            element.click().await.ok()
        })
        .await
    }

    /// Replaces the value of the input `css` with `value`.
    pub async fn fill(&self, css: &str, value: &str) {
        within(UI_TIMEOUT, &format!("typing into {css}"), async {
            let input = self.client.find(Locator::Css(css)).await.expect("input");
            input.clear().await.expect("clear");
            input.send_keys(value).await.expect("type");
        })
        .await
    }

    /// Chooses the option `value` of the select `css`, finding it again if it was re-rendered.
    pub async fn select(&self, css: &str, value: &str) {
        self.wait_for(&format!("a select {css} with {value}"), || async {
            let element = self.client.find(Locator::Css(css)).await.ok()?;
            element.select_by_value(value).await.ok()
        })
        .await
    }

    /// The window (tab) the browser drives now.
    pub async fn window(&self) -> WindowHandle {
        within(UI_TIMEOUT, "the current window", self.client.window())
            .await
            .expect("current window")
    }

    /// Waits for a window other than `known` (one the page opened) and drives it from now on.
    pub async fn switch_to_new_window(&self, known: &WindowHandle) -> WindowHandle {
        let opened = self
            .wait_for("a new window", || async {
                let windows = self.client.windows().await.ok()?;
                windows.into_iter().find(|window| window != known)
            })
            .await;
        self.switch_to(opened.clone()).await;
        opened
    }

    /// Opens an empty tab and drives it from now on.
    pub async fn new_tab(&self) -> WindowHandle {
        let tab = within(UI_TIMEOUT, "a new tab", self.client.new_window(true))
            .await
            .expect("new tab")
            .handle;
        self.switch_to(tab.clone()).await;
        tab
    }

    /// Drives `window` from now on.
    pub async fn switch_to(&self, window: WindowHandle) {
        within(
            UI_TIMEOUT,
            "switching windows",
            self.client.switch_to_window(window),
        )
        .await
        .expect("switch window")
    }

    /// Resizes the browser window.
    pub async fn resize(&self, width: u32, height: u32) {
        within(
            UI_TIMEOUT,
            "resizing the window",
            self.client.set_window_size(width, height),
        )
        .await
        .expect("resize")
    }

    /// Saves a screenshot as `target/screenshots/<name>.png` (a test artifact).
    pub async fn screenshot(&self, name: &str) {
        let png = within(UI_TIMEOUT, "a screenshot", self.client.screenshot())
            .await
            .expect("screenshot");
        let dir = PathBuf::from(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../target/screenshots"
        ));
        std::fs::create_dir_all(&dir).expect("screenshot dir");
        std::fs::write(dir.join(format!("{name}.png")), png).expect("write screenshot");
    }

    pub async fn close(self) {
        let _ = within(
            UI_TIMEOUT,
            "closing the browser",
            self.client.clone().close(),
        )
        .await;
    }
}
