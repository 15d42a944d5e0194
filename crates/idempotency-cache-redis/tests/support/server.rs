//! A private standalone `redis-server` a test owns and may stop and start again.

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::cluster::cli;

/// A `redis-server` child on a free port, killed when dropped.
pub(crate) struct OwnRedis {
    pub(crate) port: u16,
    extra: Vec<String>,
    dir: PathBuf,
    child: Option<Child>,
}

impl OwnRedis {
    /// Starts a server with `extra` arguments (`--maxmemory 1`, ...) and waits until it answers.
    pub(crate) async fn start(name: &str, extra: &[&str]) -> Self {
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let dir = std::env::temp_dir().join(idempotency_testing::unique_name(name));
        std::fs::create_dir_all(&dir).unwrap();
        let mut server = Self {
            port,
            extra: extra.iter().map(|&a| a.to_owned()).collect(),
            dir,
            child: None,
        };
        server.restart().await;
        server
    }

    /// `redis://127.0.0.1:<port>`.
    pub(crate) fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// SIGKILLs the server.
    pub(crate) fn kill(&mut self) {
        let mut child = self.child.take().expect("the server runs");
        child.kill().unwrap();
        child.wait().unwrap();
    }

    /// Starts the server again on its port (empty: nothing is saved) and waits until it answers.
    pub(crate) async fn restart(&mut self) {
        assert!(self.child.is_none(), "the server runs");
        self.child = Some(
            Command::new("redis-server")
                .args(["--bind", "127.0.0.1", "--port", &self.port.to_string()])
                .args(["--save", "", "--appendonly", "no"])
                .args(&self.extra)
                .arg("--dir")
                .arg(&self.dir)
                .stdout(Stdio::null())
                .spawn()
                .expect("redis-server is not installed (scripts/services.sh installs it)"),
        );
        let started = Instant::now();
        while cli(self.port, &["ping"]).as_deref() != Some("PONG") {
            assert!(
                started.elapsed() < Duration::from_secs(20),
                "redis-server on {} does not answer",
                self.port
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

impl Drop for OwnRedis {
    fn drop(&mut self) {
        if let Some(child) = &mut self.child {
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
