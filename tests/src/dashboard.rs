//! What the dashboard's browser tests and its benchmark share: the built dashboard, a server
//! that serves it, `trunk serve` in front of a server, many finished tasks, and a record of what
//! changes in the task table's DOM.

use std::path::{Path, PathBuf};
use std::time::Duration;

use futures::StreamExt;
use serde_json::json;
use tokio::process::Command;

use crate::browser::{Browser, ProcessGroup};
use crate::{Client, Server, TASK_LIMIT, within};

/// The workspace's root directory.
pub fn workspace_root() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
}

/// The built dashboard (`web/dist`).
pub fn dist() -> String {
    let dist = workspace_root().join("web/dist");
    assert!(
        dist.join("index.html").is_file(),
        "the dashboard is not built; run scripts/build-dashboard (scripts/test does)"
    );
    dist.display().to_string()
}

/// A server serving the dashboard, started with `extra` flags.
pub async fn server(extra: &[&str]) -> (tempfile::TempDir, Server) {
    let dir = tempfile::tempdir().unwrap();
    let dist = dist();
    let mut args = vec!["--dashboard-dir", dist.as_str()];
    args.extend_from_slice(extra);
    let server = Server::start(dir.path(), &args).await;
    (dir, server)
}

/// Starts `count` one-item batch tasks (16 calls at a time) and waits until all of them have
/// completed, so that none of them changes any more. Tasks that were unfinished before stay
/// so meanwhile.
pub async fn finished_tasks(client: &Client, count: usize) {
    let unfinished = || async {
        let stats = client.call_ok("get_server_stats", json!({})).await;
        ["pending_tasks", "running_tasks"]
            .iter()
            .map(|field| stats[field].as_u64().unwrap_or(0))
            .sum::<u64>()
    };
    let before = unfinished().await;
    let instant = json!({"batch_size": 1, "total_items": 1, "processing_delay": 0});
    futures::stream::iter(0..count)
        .map(|_| client.call_ok("start_batch_processing", instant.clone()))
        .buffer_unordered(16)
        .collect::<Vec<_>>()
        .await;
    within(TASK_LIMIT, "the tasks to finish", async {
        while unfinished().await > before {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await
}

/// Starts recording which rows of the task table change from now on: `window.touched` counts
/// the DOM changes (text, attributes, children) inside each row by task id, and
/// `window.outside` those of the table body itself (rows drawn, removed or moved).
pub async fn watch_rows(browser: &Browser) {
    browser
        .js("window.touched = {}; window.outside = 0; \
             const body = document.querySelector('tbody'); \
             new MutationObserver(records => { for (const record of records) { \
               const node = record.target.nodeType === 1 ? record.target : record.target.parentElement; \
               const row = record.target === body ? null : node.closest('tr[data-test=task-row]'); \
               if (row) { const id = row.dataset.taskId; window.touched[id] = (window.touched[id] || 0) + 1; } \
               else { window.outside += 1; } } }) \
               .observe(body, {subtree: true, childList: true, attributes: true, characterData: true}); \
             return null;")
        .await;
}

/// Records, in `window.reached`, the page's clock (ms since the epoch) at each change of task
/// `task_id`'s row status, with the status it changed to.
pub async fn time_status_changes(browser: &Browser, task_id: &str) {
    browser
        .js(&format!(
            "window.reached = []; \
             const row = document.querySelector(\"tr[data-task-id='{task_id}']\"); \
             new MutationObserver(() => window.reached.push([Date.now(), row.dataset.status])) \
               .observe(row, {{attributes: true, attributeFilter: ['data-status']}}); \
             return null;"
        ))
        .await;
}

/// How long `trunk serve` may take to build the dashboard and serve it: a cold debug build of
/// the web crate for wasm, on cores the other suites share.
pub const TRUNK_BUILD_LIMIT: Duration = Duration::from_secs(900);

/// `trunk serve`, the development loop, run as a developer runs it (the workspace's
/// `Trunk.toml`, a debug build) but on a free port, proxying `/mcp` to `backend` and building
/// into `dir`, so that it neither needs port 8080 nor replaces `web/dist`. Trunk runs in a
/// process group of its own, which dropping this kills with its cargo and wasm-bindgen.
pub struct TrunkServe {
    trunk: ProcessGroup,
    pub port: u16,
    log: PathBuf,
}

impl TrunkServe {
    /// Starts Trunk and waits until it serves the built dashboard.
    pub async fn start(dir: &Path, backend: &str) -> TrunkServe {
        let root = workspace_root();
        let config = dir.join("Trunk.toml");
        std::fs::write(&config, trunk_config(&root, dir, backend)).expect("writing Trunk.toml");
        let log = dir.join("trunk.log");
        let output = std::fs::File::create(&log).expect("trunk log file");
        let mut command = Command::new("trunk");
        command
            .args(["serve", "--config"])
            .arg(&config)
            .current_dir(&root)
            .env("PATH", path_with_tools(&root))
            .env("TRUNK_SKIP_VERSION_CHECK", "true")
            .env("NO_COLOR", "true")
            .stdout(output.try_clone().expect("trunk log file"))
            .stderr(output);
        let mut trunk = TrunkServe {
            trunk: ProcessGroup::spawn(&mut command)
                .expect("starting trunk (scripts/setup installs it)"),
            port: 0,
            log,
        };
        let pid = trunk.trunk.pid();
        let http = reqwest::Client::new();
        let served = async {
            loop {
                if trunk.port == 0 {
                    trunk.port = listening_port(pid).unwrap_or(0);
                }
                if trunk.port != 0 {
                    let page = http
                        .get(trunk.url())
                        .timeout(Duration::from_secs(5))
                        .send()
                        .await;
                    if let Ok(page) = page
                        && page.status().is_success()
                        && let Ok(text) = page.text().await
                        && text.contains("durable-web")
                    {
                        return true;
                    }
                }
                if !Path::new(&format!("/proc/{pid}")).exists() {
                    return false;
                }
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        };
        // Not `within`: a build that takes too long should show Trunk's log too.
        let served = tokio::time::timeout(TRUNK_BUILD_LIMIT, served)
            .await
            .unwrap_or(false);
        assert!(
            served,
            "trunk serve did not serve the dashboard; its log:\n{}",
            trunk.log()
        );
        trunk
    }

    /// The page Trunk serves.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}/", self.port)
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

/// The workspace's `Trunk.toml` with what a test changes: absolute paths (the copy lives in
/// `dir`, and Trunk resolves paths from its config's directory), the build in `dir`, port 0 and
/// the one proxy to `backend`.
fn trunk_config(root: &Path, dir: &Path, backend: &str) -> String {
    let text = std::fs::read_to_string(root.join("Trunk.toml")).expect("reading Trunk.toml");
    let mut config: toml::Table = text.parse().expect("Trunk.toml is TOML");
    let absolute = |path: &toml::Value| {
        toml::Value::from(
            root.join(path.as_str().expect("a path"))
                .display()
                .to_string(),
        )
    };
    let build = config["build"].as_table_mut().expect("[build]");
    build["target"] = absolute(&build["target"]);
    build.insert("dist".into(), dir.join("dist").display().to_string().into());
    let watch = config["watch"].as_table_mut().expect("[watch]");
    let paths = watch["watch"].as_array().expect("watch paths").iter();
    watch["watch"] = paths.map(absolute).collect::<Vec<_>>().into();
    config["serve"].as_table_mut().expect("[serve]")["port"] = 0.into();
    let mut proxy = toml::Table::new();
    proxy.insert("backend".into(), backend.into());
    config["proxy"] = vec![toml::Value::from(proxy)].into();
    config.to_string()
}

/// `PATH` with the workspace's `.tools/` (where scripts/setup puts wasm-opt) in front.
fn path_with_tools(root: &Path) -> std::ffi::OsString {
    let rest = std::env::var_os("PATH").unwrap_or_default();
    let tools = root.join(".tools/node_modules/.bin");
    std::env::join_paths(std::iter::once(tools).chain(std::env::split_paths(&rest))).unwrap_or(rest)
}

/// The TCP port process `pid` listens on, from `/proc`: the port of a listening socket among
/// its open files. Hand-written because Trunk, given port 0, prints 0 rather than the port it
/// got.
fn listening_port(pid: i32) -> Option<u16> {
    let inodes: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .ok()?
        .filter_map(|fd| std::fs::read_link(fd.ok()?.path()).ok())
        .filter_map(|link| {
            let link = link.to_str()?;
            Some(link.strip_prefix("socket:[")?.strip_suffix(']')?.to_owned())
        })
        .collect();
    let table = std::fs::read_to_string(format!("/proc/{pid}/net/tcp")).ok()?;
    // sl local_address rem_address st tx_queue:rx_queue tr:tm->when retrnsmt uid timeout inode
    table.lines().skip(1).find_map(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let listening = fields.get(3) == Some(&"0A");
        let ours = fields
            .get(9)
            .is_some_and(|inode| inodes.iter().any(|i| i == inode));
        let (_, port) = fields.get(1)?.split_once(':')?;
        (listening && ours).then(|| u16::from_str_radix(port, 16).ok())?
    })
}
