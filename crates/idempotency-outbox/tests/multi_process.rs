//! Relays in separate OS processes (this test binary re-executed as children): two processes
//! with two workers each over 10,000 events, and a process killed between ack and mark.

#![cfg(feature = "nats")]
#![allow(clippy::unwrap_used, clippy::print_stdout)]

mod common;

use std::collections::HashSet;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use common::nats::{self, TestStream, header};
use common::*;
use idempotency_outbox::config::{Ordering, OutboxConfig};
use idempotency_outbox::{Ack, NewEvent, OutboxMessage, PublishError, Publisher, Relay};
use idempotency_pg::PgOutbox;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

const EVENTS: usize = 10_000;
const CHILD_ENV: &str = "OUTBOX_RELAY_CHILD";

#[derive(serde::Serialize, serde::Deserialize)]
struct ChildArgs {
    schema: String,
    stream_name: String,
    subject: String,
    config: OutboxConfig,
    expected: i64,
    /// Publish, print `CHILD_ACKED`, then hang before marking (the parent kills the process).
    hang_after_ack: bool,
}

/// The child's publisher: the real one, optionally announcing each ack and hanging after it.
struct ChildPublisher {
    inner: idempotency_outbox::publisher::nats::NatsPublisher,
    hang_after_ack: bool,
}

impl Publisher for ChildPublisher {
    fn destination(&self) -> &str {
        self.inner.destination()
    }

    async fn publish(&self, message: &OutboxMessage) -> Result<Ack, PublishError> {
        let ack = self.inner.publish(message).await?;
        if self.hang_after_ack {
            println!("CHILD_ACKED {}", message.id);
            std::future::pending::<()>().await;
        }
        Ok(ack)
    }
}

fn spawn_child(args: &ChildArgs) -> std::process::Child {
    Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "relay_child",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_ENV, serde_json::to_string(args).unwrap())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap()
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

#[test]
fn two_relay_processes_deliver_ten_thousand_events_none_lost() {
    let rt = runtime();
    let mut config = config(Ordering::Ordered);
    config.relay.workers = 2;
    config.relay.batch_size = 100;
    let (pool, outbox, stream, schema) = rt.block_on(async {
        let (pool, outbox) = outbox(&config).await;
        let schema: String = sqlx::query_scalar("SELECT current_schema()::text")
            .fetch_one(&pool)
            .await
            .unwrap();
        (pool, outbox, TestStream::new().await, schema)
    });
    let args = ChildArgs {
        schema,
        stream_name: stream.name.clone(),
        subject: stream.subject_template(),
        config: config.clone(),
        expected: EVENTS as i64,
        hang_after_ack: false,
    };
    let mut children: Vec<_> = (0..2).map(|_| spawn_child(&args)).collect();
    let mut lines: Vec<_> = children
        .iter_mut()
        .map(|c| BufReader::new(c.stdout.take().unwrap()).lines())
        .collect();
    for lines in &mut lines {
        // Wait until each child runs its relay.
        assert!(
            lines
                .by_ref()
                .map_while(Result::ok)
                .any(|l| l.contains("CHILD_READY")),
            "a child relay did not start"
        );
    }

    // 10,000 events over 500 aggregates, 100 transactions of 100, while both relays run.
    let mut ids = HashSet::with_capacity(EVENTS);
    rt.block_on(async {
        for t in 0..EVENTS / 100 {
            let events: Vec<NewEvent> = (0..100)
                .map(|i| event(&format!("agg-{}", (t * 100 + i) % 500), t * 100 + i))
                .collect();
            ids.extend(events.iter().map(|e| e.id().to_string()));
            commit(&pool, &outbox, &events).await;
        }
    });

    let mut reports = Vec::new();
    for (child, lines) in children.iter_mut().zip(lines) {
        let mut lines = lines.map_while(Result::ok);
        let report = lines
            .by_ref()
            .find_map(|l| l.split_once("CHILD_REPORT ").map(|(_, r)| r.to_owned()))
            .expect("a child exited without a report");
        lines.for_each(drop); // let the child finish writing
        assert!(child.wait().unwrap().success());
        reports.push(serde_json::from_str::<serde_json::Value>(&report).unwrap());
    }
    let field = |r: &serde_json::Value, k: &str| r[k].as_u64().unwrap();
    let published_rows = published;
    let published: u64 = reports.iter().map(|r| field(r, "published")).sum();
    let duplicates: u64 = reports.iter().map(|r| field(r, "duplicates")).sum();
    println!(
        "2 processes x 2 workers, {EVENTS} events: published {published} \
         (per process (published, seconds) {:?}), republished {}, JetStream-reported duplicates {duplicates}",
        reports
            .iter()
            .map(|r| (field(r, "published"), r["seconds"].as_f64().unwrap()))
            .collect::<Vec<_>>(),
        published - EVENTS as u64,
    );
    assert!(
        reports.iter().all(|r| field(r, "published") > 0),
        "both processes took part: {reports:?}"
    );
    assert!(published >= EVENTS as u64, "{published}");
    assert_eq!(
        published - EVENTS as u64,
        duplicates,
        "every extra publish was a JetStream duplicate"
    );

    rt.block_on(async {
        assert_eq!(published_rows(&pool).await, EVENTS as i64);
        assert_eq!(stream.count().await, EVENTS as u64, "no duplicate stored");
        let messages = stream.read(EVENTS).await;
        let delivered: HashSet<String> = messages
            .iter()
            .map(|m| header(m, "Nats-Msg-Id").unwrap().to_owned())
            .collect();
        assert_eq!(delivered.len(), EVENTS, "distinct ids in the stream");
        assert_eq!(delivered, ids, "every event delivered, none lost");
        stream.delete().await;
    });
}

#[test]
fn a_relay_process_killed_between_ack_and_mark_is_replaced_and_jetstream_drops_the_copy() {
    let rt = runtime();
    let mut config = config(Ordering::Ordered);
    config.relay.workers = 1;
    let (pool, outbox, stream, schema) = rt.block_on(async {
        let (pool, outbox) = outbox(&config).await;
        let schema: String = sqlx::query_scalar("SELECT current_schema()::text")
            .fetch_one(&pool)
            .await
            .unwrap();
        (pool, outbox, TestStream::new().await, schema)
    });
    let the_event = event("killed", 1);
    rt.block_on(commit(&pool, &outbox, std::slice::from_ref(&the_event)));
    let mut args = ChildArgs {
        schema,
        stream_name: stream.name.clone(),
        subject: stream.subject_template(),
        config,
        expected: 1,
        hang_after_ack: true,
    };

    // The first process publishes, JetStream acks, and it is killed (SIGKILL) before marking.
    let mut doomed = spawn_child(&args);
    let lines = BufReader::new(doomed.stdout.take().unwrap()).lines();
    assert!(
        lines
            .map_while(Result::ok)
            .any(|l| l.contains("CHILD_ACKED")),
        "the first relay did not publish"
    );
    doomed.kill().unwrap();
    doomed.wait().unwrap();
    rt.block_on(async {
        assert_eq!(pending(&pool).await, 1, "not marked");
        assert_eq!(stream.count().await, 1);
    });

    // A second process takes the row once the lease (3 s) ends and publishes the same id again.
    args.hang_after_ack = false;
    let mut replacement = spawn_child(&args);
    let mut lines = BufReader::new(replacement.stdout.take().unwrap())
        .lines()
        .map_while(Result::ok);
    let report = lines
        .by_ref()
        .find_map(|l| l.split_once("CHILD_REPORT ").map(|(_, r)| r.to_owned()))
        .expect("no report");
    lines.for_each(drop);
    assert!(replacement.wait().unwrap().success());
    let report: serde_json::Value = serde_json::from_str(&report).unwrap();
    assert_eq!(report["published"], 1);
    assert_eq!(
        report["duplicates"], 1,
        "JetStream recognised the Nats-Msg-Id"
    );
    rt.block_on(async {
        assert_eq!(published(&pool).await, 1);
        assert_eq!(stream.count().await, 1, "the copy was dropped");
        let message = &stream.read(1).await[0];
        assert_eq!(
            header(message, "Nats-Msg-Id"),
            Some(the_event.id().to_string().as_str())
        );
        let attempts = scalar_i64(&pool, "SELECT attempts::int8 FROM outbox").await;
        assert_eq!(attempts, 2);
        stream.delete().await;
    });
}

/// The child relay process; run only by the tests above.
#[test]
#[ignore = "child relay process, spawned by the other tests of this file"]
fn relay_child() {
    let args: ChildArgs = serde_json::from_str(
        &std::env::var(CHILD_ENV).expect("run by the parent test, which sets OUTBOX_RELAY_CHILD"),
    )
    .unwrap();
    runtime().block_on(async {
        let options: PgConnectOptions = idempotency_testing::database_url().parse().unwrap();
        let pool = PgPoolOptions::new()
            .max_connections(4)
            .connect_with(options.options([("search_path", args.schema.as_str())]))
            .await
            .unwrap();
        let outbox = PgOutbox::from_config(pool.clone(), &args.config)
            .await
            .unwrap();
        let js = async_nats::jetstream::new(nats::client().await);
        let publisher = idempotency_outbox::publisher::nats::NatsPublisher::from_context(js)
            .with_subject(&args.subject)
            .unwrap();
        let publisher = ChildPublisher {
            inner: publisher,
            hang_after_ack: args.hang_after_ack,
        };
        let handle = Relay::new(outbox, publisher, &args.config).unwrap().spawn();
        println!("CHILD_READY");
        let started = std::time::Instant::now();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(300);
        while published(&pool).await < args.expected {
            assert!(
                tokio::time::Instant::now() < deadline,
                "relay child timed out"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let report = handle.shutdown().await;
        println!(
            "CHILD_REPORT {}",
            serde_json::json!({
                "published": report.totals.published,
                "duplicates": report.totals.duplicates,
                "failed": report.totals.failed,
                "graceful": report.graceful,
                "stream": args.stream_name,
                "seconds": started.elapsed().as_secs_f64(),
            })
        );
    });
}
