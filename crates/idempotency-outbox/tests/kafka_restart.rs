//! A Kafka broker killed (`kill -9`) mid-drain and started again: nothing is lost.
//!
//! The broker is a tansu of this test's own, on a free port, whose storage outlives it: its
//! S3 storage engine on an S3 server of the test's own (moto, `MOTO_SERVER`, default
//! `/var/tmp/tools/moto-venv/bin/moto_server`). tansu's memory storage would lose the topic
//! with the process; its PostgreSQL storage needs a schema that tansu 0.6.0 ships only in its
//! source repository (`etc/initdb.d/010-schema.sql`), not in the crate or the binary.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::{HashMap, HashSet};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::kafka::{Record, TestTopic};
use common::*;
use idempotency_outbox::config::Ordering;
use idempotency_outbox::publisher::headers;
use idempotency_outbox::{NewEvent, Relay};

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn wait_for(what: &str, address: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while std::net::TcpStream::connect(address).is_err() {
        assert!(
            Instant::now() < deadline,
            "{what} did not start on {address}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A child process killed with the test.
struct Process(Child);

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// An S3 server (moto) with bucket `bucket`, in memory: it outlives the brokers the test
/// kills.
fn s3(bucket: &str) -> (Process, String) {
    let binary = std::env::var("MOTO_SERVER")
        .unwrap_or_else(|_| "/var/tmp/tools/moto-venv/bin/moto_server".to_owned());
    let port = free_port();
    let child = Command::new(&binary)
        .args(["-H", "127.0.0.1", "-p", &port.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("{binary} (MOTO_SERVER): {e}"));
    let process = Process(child);
    let address = format!("127.0.0.1:{port}");
    wait_for("moto", &address);
    // Create the bucket: a path-style PUT (moto checks no signature).
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(&address).unwrap();
    write!(
        stream,
        "PUT /{bucket} HTTP/1.1\r\nHost: {address}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).unwrap();
    assert!(
        answer.starts_with("HTTP/1.1 200"),
        "create bucket: {answer}"
    );
    (process, format!("http://{address}"))
}

/// tansu on `port`, storing in bucket `bucket` of the S3 server at `endpoint`.
fn broker(port: u16, endpoint: &str, bucket: &str) -> Process {
    let binary = std::env::var("TANSU_BIN").unwrap_or_else(|_| "tansu".to_owned());
    let listen = format!("tcp://127.0.0.1:{port}");
    let child = Command::new(&binary)
        .args(["broker", "--listener-url", &listen])
        .args(["--advertised-listener-url", &listen])
        .args(["--storage-engine", &format!("s3://{bucket}/")])
        .env("AWS_ENDPOINT", endpoint)
        .env("AWS_ALLOW_HTTP", "true")
        .env("AWS_ACCESS_KEY_ID", "test")
        .env("AWS_SECRET_ACCESS_KEY", "test")
        .env("AWS_DEFAULT_REGION", "us-east-1")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("{binary} (TANSU_BIN): {e}"));
    let process = Process(child);
    wait_for("tansu", &format!("127.0.0.1:{port}"));
    process
}

/// 2,000 events over 20 aggregates, two workers; the broker is killed with SIGKILL after a
/// third is published and started again on the same storage a moment later. Publishes fail
/// meanwhile and are retried without counting attempts; at the end every outbox id is in the
/// topic, none dead-lettered, and every copy (a record written before the kill whose delivery
/// report was lost with the broker) carries the same id, key and payload as its original.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_killed_mid_drain_and_restarted_loses_nothing() {
    let bucket = idempotency_testing::unique_name("tansu").replace('_', "-");
    let (_s3, endpoint) = s3(&bucket);
    let port = free_port();
    let mut first = Some(broker(port, &endpoint, &bucket));

    let mut config = config(Ordering::Ordered);
    config.relay.max_attempts = 2; // an attempt counted for the outage would dead-letter
    let (pool, outbox) = outbox(&config).await;
    let topic = TestTopic {
        url: format!("127.0.0.1:{port}"),
        ..TestTopic::named(3)
    };
    topic.create().await;
    let events: Vec<NewEvent> = (0..2_000)
        .map(|n| event(&format!("a{}", n % 20), n))
        .collect();
    commit(&pool, &outbox, &events).await;

    let handle = Relay::new(outbox.clone(), topic.publisher(), &config)
        .unwrap()
        .spawn();
    eventually("a third published", || async {
        published(&pool).await >= 650
    })
    .await;
    drop(first.take()); // SIGKILL, then reaped
    let at_kill = published(&pool).await;
    assert!(at_kill < 2_000, "the drain finished before the kill");
    tokio::time::sleep(Duration::from_secs(3)).await; // publishes fail meanwhile
    let _second = broker(port, &endpoint, &bucket);
    let deadline = Instant::now() + Duration::from_secs(120);
    while published(&pool).await < 2_000 {
        assert!(
            Instant::now() < deadline,
            "drain did not finish after the restart ({} of 2000)",
            published(&pool).await
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let report = handle.shutdown().await;
    assert!(
        report.totals.failed > 0,
        "publishes failed while the broker was down"
    );
    let dead = scalar_i64(
        &pool,
        "SELECT count(*) FROM outbox WHERE dead_lettered_at IS NOT NULL",
    )
    .await;
    assert_eq!(dead, 0, "the outage dead-letters nothing");

    let records = topic.read(2_000, Duration::from_secs(2)).await;
    let mut ids: HashMap<&str, Vec<&Record>> = HashMap::new();
    for record in &records {
        ids.entry(record.headers[headers::ID].as_str())
            .or_default()
            .push(record);
    }
    let got: HashSet<String> = ids.keys().map(|id| (*id).to_owned()).collect();
    let want: HashSet<String> = events.iter().map(|e| e.id().to_string()).collect();
    assert_eq!(
        got, want,
        "every committed event across the restart, nothing else"
    );
    for (id, same) in &ids {
        for copy in &same[1..] {
            assert_eq!(
                copy.payload, same[0].payload,
                "{id}: a copy is the same event"
            );
            assert_eq!(copy.key, same[0].key, "{id}");
        }
    }
    eprintln!(
        "broker killed at {at_kill} published; {} records for 2000 events ({} copies)",
        records.len(),
        records.len() - want.len()
    );
}
