//! Headless Chromium driven through chromedriver (both from Debian), for the dashboard tests.

use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use fantoccini::{Client, ClientBuilder, Locator};
use serde_json::{Value, json};

use crate::within;

/// How long a browser wait lasts before the test fails.
pub const UI_TIMEOUT: Duration = Duration::from_secs(30);

pub struct Browser {
    pub client: Client,
    driver: Child,
    _profile: tempfile::TempDir,
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .expect("free port")
        .port()
}

impl Browser {
    pub async fn start() -> Browser {
        let port = free_port();
        // Its own process group, so Drop can kill chromedriver and every Chromium it started.
        let driver = Command::new("chromedriver")
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0)
            .spawn()
            .expect("chromedriver (apt-get install chromium-driver; scripts/setup does)");
        within(UI_TIMEOUT, "chromedriver to listen", async {
            while tokio::net::TcpStream::connect(("127.0.0.1", port))
                .await
                .is_err()
            {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
        .await;
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
        let client = within(
            UI_TIMEOUT,
            "a browser session",
            ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new())
                .capabilities(capabilities)
                .connect(&format!("http://127.0.0.1:{port}")),
        )
        .await
        .expect("WebDriver session");
        Browser {
            client,
            driver,
            _profile: profile,
        }
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

    /// Waits until the text of `css` satisfies `check`.
    pub async fn wait_text(&self, css: &str, check: impl Fn(&str) -> bool) -> String {
        self.wait_for(&format!("text of {css}"), || async {
            let text = self.text(css).await;
            check(&text).then_some(text)
        })
        .await
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

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-9", "--", &format!("-{}", self.driver.id())])
            .status();
        let _ = self.driver.wait();
    }
}
