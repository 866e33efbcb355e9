//! A fleet for tests: several `durable-mcp` nodes on one scratch PostgreSQL database and one
//! shared data directory, behind HAProxy from Debian (round-robin, no stickiness), as the
//! README's "Run a fleet" describes.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use durable_mcp_server::store::postgres::scratch::{ScratchDatabase, TEST_SERVER_VAR};
use tokio::process::{Child, Command};

use crate::{Server, within};

/// The lease the fleet's nodes take on a task: short, so that a test sees a dead node's tasks
/// taken over quickly.
pub const LEASE_TTL: Duration = Duration::from_secs(2);

pub struct Fleet {
    pub nodes: Vec<Server>,
    balancer: Child,
    /// Where clients reach the fleet.
    pub balancer_addr: SocketAddr,
    pub data_dir: PathBuf,
    dir: PathBuf,
    // Last: the database is dropped after the nodes are killed.
    _database: ScratchDatabase,
}

impl Fleet {
    /// Starts `count` nodes (`node-0`, `node-1`, ...) with `extra_args`, and the balancer in
    /// front of them; logs and the shared data directory go under `dir`.
    pub async fn start(dir: &Path, count: usize, extra_args: &[&str]) -> Fleet {
        Fleet::start_with_lease(dir, count, LEASE_TTL, extra_args).await
    }

    /// [`Fleet::start`] with leases of `lease` (whole seconds).
    pub async fn start_with_lease(
        dir: &Path,
        count: usize,
        lease: Duration,
        extra_args: &[&str],
    ) -> Fleet {
        let database = ScratchDatabase::from_env()
            .await
            .unwrap_or_else(|| panic!("fleet tests need {TEST_SERVER_VAR} (see scripts/test)"))
            .expect("creating the fleet's database");
        let data_dir = dir.join("shared-data");
        let ttl = format!("{}s", lease.as_secs());
        let mut args = vec!["--lease-ttl", ttl.as_str()];
        args.extend_from_slice(extra_args);
        let mut nodes = Vec::with_capacity(count);
        for n in 0..count {
            let node_dir = dir.join(format!("node-{n}"));
            std::fs::create_dir_all(&node_dir).expect("node directory");
            let node_id = format!("node-{n}");
            nodes.push(
                Server::start_node(&node_dir, database.url(), &data_dir, &node_id, &args).await,
            );
        }
        let (balancer, balancer_addr) = start_balancer(dir, &nodes).await;
        Fleet {
            nodes,
            balancer,
            balancer_addr,
            data_dir,
            dir: dir.to_owned(),
            _database: database,
        }
    }

    /// The fleet's MCP endpoint, through the balancer.
    pub fn mcp_url(&self) -> String {
        format!("http://{}/mcp", self.balancer_addr)
    }

    pub fn data_path(&self, relative: &str) -> PathBuf {
        self.data_dir.join(relative)
    }

    /// The index of node `node_id`.
    pub fn index_of(&self, node_id: &str) -> usize {
        self.nodes
            .iter()
            .position(|node| node.node_id == node_id)
            .unwrap_or_else(|| panic!("no node {node_id:?} in the fleet"))
    }

    /// Every node's log, for a failing test's message.
    pub fn logs(&self) -> String {
        let mut logs: Vec<String> = self
            .nodes
            .iter()
            .map(|node| format!("=== {} ===\n{}", node.node_id, node.log()))
            .collect();
        logs.push(format!(
            "=== balancer ===\n{}",
            std::fs::read_to_string(self.dir.join("haproxy.log")).unwrap_or_default()
        ));
        logs.join("\n")
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        // `kill_on_drop` would do it too; this stops the balancer before the nodes go.
        let _ = self.balancer.start_kill();
    }
}

/// Writes the balancer's configuration and starts HAProxy on a free port.
async fn start_balancer(dir: &Path, nodes: &[Server]) -> (Child, SocketAddr) {
    // HAProxy cannot report a port it picked, so one is picked here and handed to it; another
    // process taking it in between makes HAProxy fail to bind, and the test retries.
    for _ in 0..5 {
        let port = {
            let probe = std::net::TcpListener::bind("127.0.0.1:0").expect("probe bind");
            probe.local_addr().expect("probe address").port()
        };
        let servers: String = nodes
            .iter()
            .map(|node| format!("    server {} {}\n", node.node_id, node.addr))
            .collect();
        // Round-robin with no stickiness. A request that cannot reach a node (connection
        // refused: the node is down) is sent to the next one; one that reached a node is never
        // sent twice. Timeouts are long: SSE streams stay open.
        let config = format!(
            "global\n    maxconn 2000\n\
             defaults\n    mode http\n    timeout connect 1s\n    timeout client 1h\n    \
             timeout server 1h\n    timeout tunnel 1h\n    retries 3\n    option redispatch 1\n\
             frontend fleet\n    bind 127.0.0.1:{port}\n    default_backend nodes\n\
             backend nodes\n    balance roundrobin\n{servers}"
        );
        let path = dir.join("haproxy.cfg");
        std::fs::write(&path, config).expect("writing haproxy.cfg");
        let log = std::fs::File::create(dir.join("haproxy.log")).expect("balancer log");
        let mut child = Command::new("haproxy")
            .arg("-db")
            .arg("-f")
            .arg(&path)
            .stdout(Stdio::null())
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .expect("starting haproxy (scripts/setup installs it)");
        let addr: SocketAddr = format!("127.0.0.1:{port}").parse().expect("address");
        let ready = within(Duration::from_secs(10), "the balancer to listen", async {
            loop {
                if let Ok(Some(_)) = child.try_wait() {
                    return false;
                }
                if tokio::net::TcpStream::connect(addr).await.is_ok() {
                    return true;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
        .await;
        if ready {
            return (child, addr);
        }
    }
    panic!(
        "haproxy did not start; log:\n{}",
        std::fs::read_to_string(dir.join("haproxy.log")).unwrap_or_default()
    );
}

/// The `host:port` a `postgres://` URL points at (127.0.0.1:5432 when it names none).
pub fn database_addr(url: &str) -> SocketAddr {
    let (start, end) = authority(url);
    let host_port = &url[start..end];
    let host_port = host_port.rsplit_once('@').map_or(host_port, |(_, hp)| hp);
    let with_port = if host_port.contains(':') {
        host_port.to_owned()
    } else {
        format!("{host_port}:5432")
    };
    let with_port = with_port.replace("localhost", "127.0.0.1");
    with_port
        .parse()
        .unwrap_or_else(|e| panic!("{with_port:?} in the database URL is not an address: {e}"))
}

/// `url` pointed at `addr` instead of its own host and port (to go through a proxy).
pub fn through(url: &str, addr: SocketAddr) -> String {
    let (start, end) = authority(url);
    let user = url[start..end]
        .rsplit_once('@')
        .map_or(String::new(), |(user, _)| format!("{user}@"));
    format!("{}{user}{addr}{}", &url[..start], &url[end..])
}

/// Where the authority (`user@host:port`) of `url` starts and ends.
fn authority(url: &str) -> (usize, usize) {
    let start = url.find("://").expect("a postgres:// URL") + 3;
    let end = url[start..]
        .find(['/', '?'])
        .map_or(url.len(), |i| start + i);
    (start, end)
}
