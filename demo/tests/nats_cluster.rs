//! The demo binary against a three-node JetStream cluster (`NATS_CLUSTER_URL`, the cluster
//! `scripts/services.sh` starts on ports 4232-4234), named as an operator names a cluster:
//! `NATS_URL` lists the nodes, comma-separated, one of them dead. The demo's stream is created
//! beforehand with three replicas, as an operator would (the demo only creates a missing
//! stream, with one replica). The demo must start, say its broker is up, and publish a charge's
//! event to that stream.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use async_nats::jetstream::{self, stream};

fn cluster_url() -> String {
    std::env::var("NATS_CLUSTER_URL").unwrap_or_else(|_| {
        "nats://127.0.0.1:4232,nats://127.0.0.1:4233,nats://127.0.0.1:4234".to_owned()
    })
}

struct Demo {
    child: Child,
    dir: std::path::PathBuf,
    port: u16,
}

impl Drop for Demo {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// `(status, body)` of a plain HTTP/1.0 request to the demo.
fn http(port: u16, method: &str, path: &str, headers: &[&str], body: &str) -> (u16, String) {
    let mut socket = TcpStream::connect(("127.0.0.1", port)).unwrap();
    socket
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut request = format!("{method} {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n");
    for header in headers {
        request.push_str(header);
        request.push_str("\r\n");
    }
    request.push_str(&format!("Content-Length: {}\r\n\r\n{body}", body.len()));
    socket.write_all(request.as_bytes()).unwrap();
    let mut response = String::new();
    socket.read_to_string(&mut response).unwrap();
    let status = response
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let body = response
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    (status, body)
}

/// Starts the demo on SQLite in an empty directory with `NATS_URL`, and waits for `/health`.
fn start_demo(nats_url: &str) -> Demo {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let dir = std::env::temp_dir().join(format!("demo-nats-cluster-{}-{port}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let log = std::fs::File::create(dir.join("demo.log")).unwrap();
    let child = Command::new(env!("CARGO_BIN_EXE_idempotency-demo"))
        .current_dir(&dir)
        .env_remove("DATABASE_URL")
        .env_remove("MYSQL_URL")
        .env_remove("REDIS_URL")
        .env("NATS_URL", nats_url)
        .env("SERVER__PORT", port.to_string())
        .env(
            "DEMO_CONFIG",
            concat!(env!("CARGO_MANIFEST_DIR"), "/config/demo.yaml"),
        )
        .stdin(Stdio::null())
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .unwrap();
    let mut demo = Demo { child, dir, port };
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(status) = demo.child.try_wait().unwrap() {
            let log = std::fs::read_to_string(demo.dir.join("demo.log")).unwrap_or_default();
            panic!("the demo exited ({status}) with NATS_URL={nats_url}:\n{log}");
        }
        if TcpStream::connect(("127.0.0.1", demo.port)).is_ok() {
            return demo;
        }
        assert!(Instant::now() < deadline, "the demo did not listen");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_demo_takes_a_list_of_cluster_nodes_and_publishes_to_the_replicated_stream() {
    let urls = cluster_url();
    let servers = idempotency_outbox::publisher::nats::server_addrs(&urls).unwrap();
    let client = async_nats::connect(servers.as_slice()).await.unwrap();
    let js = jetstream::new(client);
    let mut stream = js
        .get_or_create_stream(stream::Config {
            name: "IDEMPOTENCY_DEMO".to_owned(),
            subjects: vec!["demo.>".to_owned()],
            num_replicas: 3,
            duplicate_window: Duration::from_secs(120),
            ..Default::default()
        })
        .await
        .unwrap();
    let info = stream.info().await.unwrap();
    assert_eq!(
        info.config.num_replicas, 3,
        "the demo's stream is replicated"
    );
    let before = info.state.messages;

    // A node that is not there first, then the cluster's nodes, spaces after the commas.
    let demo = start_demo(&format!("nats://127.0.0.1:1, {}", urls.replace(',', ", ")));
    let (status, body) = http(demo.port, "GET", "/health", &[], "");
    assert_eq!(status, 200, "{body}");
    let health: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(health["broker"]["status"], "UP", "{body}");
    assert_eq!(health["relay"]["status"], "UP", "{body}");

    let key = uuid::Uuid::now_v7().to_string();
    let (status, body) = http(
        demo.port,
        "POST",
        "/charges",
        &[
            &format!("Idempotency-Key: {key}"),
            "Content-Type: application/json",
        ],
        r#"{"amountCents":100}"#,
    );
    assert_eq!(status, 201, "{body}");
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let messages = stream.info().await.unwrap().state.messages;
        if messages > before {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the charge's event never reached the replicated stream"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[test]
fn a_nats_url_list_with_an_empty_entry_stops_the_demo_naming_the_entry() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let dir = std::env::temp_dir().join(format!("demo-nats-list-{}-{port}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_idempotency-demo"))
        .current_dir(&dir)
        .env_remove("DATABASE_URL")
        .env_remove("MYSQL_URL")
        .env_remove("REDIS_URL")
        .env("NATS_URL", "nats://127.0.0.1:4232,,nats://127.0.0.1:4233")
        .env("SERVER__PORT", port.to_string())
        .env(
            "DEMO_CONFIG",
            concat!(env!("CARGO_MANIFEST_DIR"), "/config/demo.yaml"),
        )
        .output()
        .unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    let log = String::from_utf8_lossy(&output.stdout).into_owned()
        + &String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "{log}");
    assert!(
        log.contains("entry 2 of 3 of the NATS URL list: empty"),
        "{log}"
    );
}
