//! Redis Cluster for the tests: the shared one (`REDIS_CLUSTER_URL`, started by
//! `scripts/services.sh`), and private six-node clusters a test owns and may break.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

/// `REDIS_CLUSTER_URL`, or the cluster `scripts/services.sh` starts on 127.0.0.1:7000-7005.
pub(crate) fn shared_cluster_url() -> String {
    std::env::var("REDIS_CLUSTER_URL")
        .ok()
        .filter(|v| !v.trim().is_empty())
        .unwrap_or_else(|| {
            "redis-cluster://127.0.0.1:7000,127.0.0.1:7001,127.0.0.1:7002,127.0.0.1:7003,127.0.0.1:7004,127.0.0.1:7005"
                .to_owned()
        })
}

/// One `redis-cli` call against `port`; its output, trimmed (`None` if the node does not answer).
pub(crate) fn cli(port: u16, args: &[&str]) -> Option<String> {
    let out = Command::new("redis-cli")
        .args(["-h", "127.0.0.1", "-p", &port.to_string()])
        .args(args)
        .stderr(Stdio::null())
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&out.stdout).replace('\r', "");
    (out.status.success() && !text.starts_with("Could not connect")).then(|| text.trim().to_owned())
}

/// `cluster_state` as `port` reports it.
pub(crate) fn cluster_state(port: u16) -> Option<String> {
    let info = cli(port, &["cluster", "info"])?;
    info.lines()
        .find_map(|l| l.strip_prefix("cluster_state:"))
        .map(str::to_owned)
}

/// A six-node Redis Cluster (three masters, three replicas) of `redis-server` children on free
/// ports, owned by one test: it may kill nodes. Every node is killed when it is dropped.
pub(crate) struct OwnCluster {
    pub(crate) ports: Vec<u16>,
    nodes: Vec<Option<Child>>,
    /// The nodes stopped with SIGSTOP: running, but never answering (not asked by `alive`).
    paused: Vec<u16>,
    dir: PathBuf,
}

/// Starts `redis-server` on `port` in cluster mode, its files (`nodes.conf` too) in `dir/<port>`.
fn spawn_node(port: u16, dir: &Path) -> Child {
    let node_dir = dir.join(port.to_string());
    std::fs::create_dir_all(&node_dir).unwrap();
    Command::new("redis-server")
        .args(["--bind", "127.0.0.1", "--port", &port.to_string()])
        .args(["--cluster-enabled", "yes", "--cluster-node-timeout", "1000"])
        .args(["--save", "", "--appendonly", "no"])
        .arg("--dir")
        .arg(&node_dir)
        .arg("--logfile")
        .arg(node_dir.join("redis.log"))
        .stdout(Stdio::null())
        .spawn()
        .expect("redis-server is not installed (scripts/services.sh installs it)")
}

/// Whether `port` and its cluster bus port (`port + 10000`) are free.
fn free(port: u16) -> bool {
    TcpListener::bind(("127.0.0.1", port)).is_ok()
        && TcpListener::bind(("127.0.0.1", port + 10000)).is_ok()
}

impl OwnCluster {
    /// Starts the nodes and creates the cluster; returns once every node says
    /// `cluster_state:ok` and every master has its replica.
    pub(crate) async fn start(name: &str) -> Self {
        let base = {
            // Bases handed to the clusters of this process, whose nodes may not listen yet.
            static TAKEN: Mutex<Vec<u16>> = Mutex::new(Vec::new());
            let mut taken = TAKEN.lock().unwrap_or_else(PoisonError::into_inner);
            let first = (std::process::id() % 90) as u16;
            let base = (0..90)
                .map(|i| 7100 + (first + i) % 90 * 10)
                .find(|base| !taken.contains(base) && (*base..base + 6).all(free))
                .expect("no six free ports between 7100 and 7999 (and their bus ports)");
            taken.push(base);
            base
        };
        let ports: Vec<u16> = (base..base + 6).collect();
        let dir = std::env::temp_dir().join(idempotency_testing::unique_name(name));
        let mut nodes = Vec::new();
        for &port in &ports {
            nodes.push(Some(spawn_node(port, &dir)));
        }
        let cluster = Self {
            ports,
            nodes,
            paused: Vec::new(),
            dir,
        };
        cluster
            .wait("every node answers", |c| {
                c.ports
                    .iter()
                    .all(|&p| cli(p, &["ping"]).as_deref() == Some("PONG"))
            })
            .await;
        let hosts: Vec<String> = cluster
            .ports
            .iter()
            .map(|p| format!("127.0.0.1:{p}"))
            .collect();
        let created = Command::new("redis-cli")
            .args(["--cluster", "create"])
            .args(&hosts)
            .args(["--cluster-replicas", "1", "--cluster-yes"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .unwrap();
        assert!(created.success(), "redis-cli --cluster create failed");
        cluster
            .wait("cluster_state:ok with three replicas", Self::healthy)
            .await;
        cluster
    }

    /// `redis-cluster://` with every node.
    pub(crate) fn url(&self) -> String {
        let hosts: Vec<String> = self
            .ports
            .iter()
            .map(|p| format!("127.0.0.1:{p}"))
            .collect();
        format!("redis-cluster://{}", hosts.join(","))
    }

    fn alive(&self) -> impl Iterator<Item = u16> + '_ {
        self.ports
            .iter()
            .zip(&self.nodes)
            .filter(|(p, n)| n.is_some() && !self.paused.contains(p))
            .map(|(p, _)| *p)
    }

    /// Every live node says `cluster_state:ok`, and three masters serve the slots.
    pub(crate) fn ok(&self) -> bool {
        self.alive()
            .all(|p| cluster_state(p).as_deref() == Some("ok"))
            && self.masters().len() == 3
    }

    /// The ports of the live replicas.
    pub(crate) fn replicas(&self) -> Vec<u16> {
        self.nodes_lines()
            .iter()
            .filter(|f| f[2].contains("slave"))
            .filter_map(|f| f[1].split(['@', ':']).nth(1)?.parse().ok())
            .collect()
    }

    /// How many keys the replicas hold together (each key has one replica).
    pub(crate) fn replicated_keys(&self) -> u64 {
        self.replicas()
            .iter()
            .filter_map(|&p| cli(p, &["dbsize"])?.parse::<u64>().ok())
            .sum()
    }

    /// [`ok`](Self::ok), and three replicas in sync with their masters (a replica that never
    /// synced does not take over).
    fn healthy(&self) -> bool {
        let replicas = self.replicas();
        self.ok()
            && replicas.len() == 3
            && replicas.iter().all(|&p| {
                cli(p, &["info", "replication"])
                    .is_some_and(|info| info.contains("master_link_status:up"))
            })
    }

    /// `CLUSTER NODES` as seen by a live node, split on blanks.
    fn nodes_lines(&self) -> Vec<Vec<String>> {
        self.alive()
            .find_map(|p| cli(p, &["cluster", "nodes"]))
            .unwrap_or_default()
            .lines()
            .map(|l| l.split_whitespace().map(str::to_owned).collect::<Vec<_>>())
            .filter(|f| f.len() >= 8)
            .collect()
    }

    /// The ports of the live masters that serve slots.
    pub(crate) fn masters(&self) -> Vec<u16> {
        self.nodes_lines()
            .iter()
            .filter(|f| f[2].contains("master") && !f[2].contains("fail") && f.len() > 8)
            .filter_map(|f| f[1].split(['@', ':']).nth(1)?.parse().ok())
            .collect()
    }

    /// The port of the master that serves `key`.
    pub(crate) fn master_of(&self, key: &str) -> u16 {
        let port = self.alive().next().unwrap();
        let slot: u16 = cli(port, &["cluster", "keyslot", key])
            .unwrap()
            .parse()
            .unwrap();
        for f in self.nodes_lines() {
            if !f[2].contains("master") || f[2].contains("fail") {
                continue;
            }
            for range in &f[8..] {
                let (lo, hi) = range.split_once('-').unwrap_or((range, range));
                let (Ok(lo), Ok(hi)) = (lo.parse::<u16>(), hi.parse::<u16>()) else {
                    continue;
                };
                if (lo..=hi).contains(&slot) {
                    return f[1].split(['@', ':']).nth(1).unwrap().parse().unwrap();
                }
            }
        }
        panic!("no master serves slot {slot}");
    }

    /// SIGKILLs the node on `port`.
    pub(crate) fn kill(&mut self, port: u16) {
        let i = self.ports.iter().position(|&p| p == port).unwrap();
        let mut child = self.nodes[i].take().unwrap();
        child.kill().unwrap();
        child.wait().unwrap();
    }

    /// SIGSTOPs the node on `port`: it hangs, its connections open and unanswered.
    pub(crate) fn pause(&mut self, port: u16) {
        let i = self.ports.iter().position(|&p| p == port).unwrap();
        let pid = self.nodes[i].as_ref().unwrap().id();
        let stopped = Command::new("kill")
            .args(["-STOP", &pid.to_string()])
            .status()
            .unwrap();
        assert!(stopped.success(), "kill -STOP {pid}");
        self.paused.push(port);
    }

    /// Starts the node on `port` again, with the cluster configuration it had: it rejoins.
    pub(crate) fn restart(&mut self, port: u16) {
        let i = self.ports.iter().position(|&p| p == port).unwrap();
        assert!(self.nodes[i].is_none(), "node {port} is running");
        self.nodes[i] = Some(spawn_node(port, &self.dir));
    }

    /// Waits (up to 60 s) until `done` holds.
    pub(crate) async fn wait(&self, what: &str, done: impl Fn(&Self) -> bool) -> Duration {
        let started = Instant::now();
        while !done(self) {
            assert!(
                started.elapsed() < Duration::from_secs(60),
                "cluster: not within 60 s: {what}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        started.elapsed()
    }
}

impl Drop for OwnCluster {
    fn drop(&mut self) {
        for child in self.nodes.iter_mut().flatten() {
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
