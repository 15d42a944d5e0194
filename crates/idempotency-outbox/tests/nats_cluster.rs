//! The relay on a three-node JetStream cluster, with a stream of three replicas: the node the
//! relay's client is on dies, then the stream's leader dies. Each is SIGKILLed while events are
//! committed, and started again on its store. Every event must be stored exactly once, none
//! dead-lettered (relay.max-attempts is 1: any failure counted towards it dead-letters; only the
//! broker's failures, never counted, may happen during an election), and the duplicate window
//! must survive the leader change.
//!
//! The test starts its own cluster (`nats-server` on `PATH`, in `/usr/sbin`, or
//! `NATS_SERVER_BIN`) on free ports, so that it can kill nodes without touching the shared
//! servers; `scripts/test.sh` installs `nats-server` with the shared cluster.

#![cfg(feature = "nats")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::HashSet;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering as AtomicOrdering};
use std::time::Duration;

use async_nats::jetstream::{self, stream};
use common::*;
use futures_util::StreamExt;
use idempotency_outbox::config::Ordering;
use idempotency_outbox::publisher::nats::{NatsPublisher, server_addrs};
use idempotency_outbox::{OutboxMessage, Publisher, Relay};

const NODES: usize = 3;

/// Three `nats-server` processes clustered with JetStream, on free ports, their stores in a
/// directory of their own; killed and removed on drop.
struct Cluster {
    dir: PathBuf,
    /// (client, route, monitoring) port of each node.
    ports: Vec<(u16, u16, u16)>,
    nodes: Vec<Option<Child>>,
}

fn nats_server() -> String {
    if let Ok(bin) = std::env::var("NATS_SERVER_BIN") {
        return bin;
    }
    let on_path = std::env::var_os("PATH")
        .map(|path| std::env::split_paths(&path).any(|dir| dir.join("nats-server").is_file()))
        .unwrap_or(false);
    if on_path {
        "nats-server".to_owned()
    } else {
        "/usr/sbin/nats-server".to_owned()
    }
}

fn free_ports(n: usize) -> Vec<u16> {
    let listeners: Vec<std::net::TcpListener> = (0..n)
        .map(|_| std::net::TcpListener::bind("127.0.0.1:0").unwrap())
        .collect();
    listeners
        .iter()
        .map(|l| l.local_addr().unwrap().port())
        .collect()
}

impl Cluster {
    fn start() -> Self {
        let dir = std::env::temp_dir().join(idempotency_testing::unique_name("nats-cluster"));
        std::fs::create_dir_all(&dir).unwrap();
        let ports = free_ports(3 * NODES);
        let mut cluster = Self {
            dir,
            ports: (0..NODES)
                .map(|i| (ports[3 * i], ports[3 * i + 1], ports[3 * i + 2]))
                .collect(),
            nodes: (0..NODES).map(|_| None).collect(),
        };
        for i in 0..NODES {
            cluster.start_node(i);
        }
        cluster
    }

    /// Starts node `i` (again) on its store.
    fn start_node(&mut self, i: usize) {
        let (client, route, monitor) = self.ports[i];
        let routes: Vec<String> = (0..NODES)
            .filter(|&j| j != i)
            .map(|j| format!("nats://127.0.0.1:{}", self.ports[j].1))
            .collect();
        let store = self.dir.join(format!("n{i}"));
        std::fs::create_dir_all(&store).unwrap();
        let child = Command::new(nats_server())
            .args(["-n", &format!("n{i}"), "-a", "127.0.0.1"])
            .args(["-p", &client.to_string(), "-m", &monitor.to_string()])
            .args(["-js", "-sd", store.to_str().unwrap()])
            .args(["--cluster_name", "outbox-test"])
            .args(["--cluster", &format!("nats://127.0.0.1:{route}")])
            .args(["--routes", &routes.join(",")])
            .args(["-l", store.join("nats.log").to_str().unwrap()])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", nats_server()));
        self.nodes[i] = Some(child);
    }

    /// SIGKILL node `i`.
    fn kill(&mut self, i: usize) {
        if let Some(mut child) = self.nodes[i].take() {
            child.kill().unwrap();
            child.wait().unwrap();
        }
    }

    fn url(&self, i: usize) -> String {
        format!("nats://127.0.0.1:{}", self.ports[i].0)
    }

    /// The nodes' URLs in `order`, comma-separated.
    fn urls(&self, order: &[usize]) -> String {
        order
            .iter()
            .map(|&i| self.url(i))
            .collect::<Vec<_>>()
            .join(",")
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for i in 0..NODES {
            self.kill(i);
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A client named `name` that tries the nodes of `urls` in the list's order (so that the test
/// chooses its node), once one of them listens.
async fn connect(urls: &str, name: &str) -> async_nats::Client {
    let servers = server_addrs(urls).unwrap();
    until("a node listening", || async {
        async_nats::ConnectOptions::new()
            .name(name)
            .retain_servers_order()
            .connect(servers.as_slice())
            .await
            .ok()
    })
    .await
}

/// Polls `check` until it returns `Some`, or panics after `WAIT`.
async fn until<T, F, Fut>(what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        if let Some(value) = check().await {
            return value;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The stream's leader (its node index) once it has one and every replica is current.
async fn settled_leader(js: &jetstream::Context, name: &str) -> Option<usize> {
    let mut stream = js.get_stream(name).await.ok()?;
    let info = stream.info().await.ok()?;
    let cluster = info.cluster.as_ref()?;
    let leader = cluster.leader.as_deref()?;
    let all_current = cluster.replicas.len() == NODES - 1
        && cluster.replicas.iter().all(|p| p.current && !p.offline);
    all_current.then(|| leader.trim_start_matches('n').parse().ok())?
}

/// The response (headers and body) of node `i`'s monitoring endpoint `path`, if it answers.
async fn monitor(cluster: &Cluster, i: usize, path: &str) -> Option<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let port = cluster.ports[i].2;
    let mut socket = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .ok()?;
    let request = format!("GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n");
    socket.write_all(request.as_bytes()).await.ok()?;
    let mut response = String::new();
    socket.read_to_string(&mut response).await.ok()?;
    Some(response)
}

/// The node a client connection named `name` is on.
async fn on_node(cluster: &Cluster, name: &str) -> Option<usize> {
    for i in 0..NODES {
        if let Some(body) = monitor(cluster, i, "/connz").await
            && body.contains(&format!("\"name\": \"{name}\""))
        {
            return Some(i);
        }
    }
    None
}

/// Whether every node answers and knows the JetStream meta leader (before it, a JetStream API
/// request waits for its timeout).
async fn meta_leader_elected(cluster: &Cluster) -> Option<()> {
    for i in 0..NODES {
        let body = monitor(cluster, i, "/jsz").await?;
        let json = body.split_once("\r\n\r\n")?.1;
        let jsz: serde_json::Value = serde_json::from_str(json).ok()?;
        jsz["meta_cluster"]["leader"]
            .as_str()
            .filter(|l| !l.is_empty())?;
    }
    Some(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_on_a_cluster_stores_each_event_once_through_the_death_of_its_node_and_of_the_leader()
 {
    let mut cluster = Cluster::start();
    until("a meta leader", || meta_leader_elected(&cluster)).await;
    let admin = connect(&cluster.urls(&[0, 1, 2]), "test admin").await;
    let js = jetstream::new(admin);
    let name = idempotency_testing::unique_name("CLUSTER");
    let prefix = name.to_lowercase();
    until("the stream with 3 replicas", || async {
        js.create_stream(stream::Config {
            name: name.clone(),
            subjects: vec![format!("{prefix}.>")],
            num_replicas: 3,
            duplicate_window: Duration::from_secs(600),
            ..Default::default()
        })
        .await
        .ok()
    })
    .await;
    let leader = until("a stream leader", || settled_leader(&js, &name)).await;
    let followers: Vec<usize> = (0..NODES).filter(|&i| i != leader).collect();
    let (first, second) = (followers[0], followers[1]);

    let mut config = config(Ordering::Ordered);
    config.relay.max_attempts = 1;
    let (pool, outbox) = outbox(&config).await;
    // The relay's client, on a follower first; named so that /connz shows where it is.
    let relay_client = connect(
        &cluster.urls(&[first, second, leader]),
        "outbox relay under test",
    )
    .await;
    let publisher = NatsPublisher::new(relay_client)
        .with_subject(&format!("{prefix}.{{aggregate_type}}.{{event_type}}"))
        .unwrap();
    let handle = Relay::new(outbox.clone(), publisher, &config)
        .unwrap()
        .spawn();
    assert_eq!(
        until("the relay's connection", || on_node(
            &cluster,
            "outbox relay under test"
        ))
        .await,
        first
    );

    // Events all along: 5 per transaction every 20 ms.
    let stop = Arc::new(AtomicBool::new(false));
    let load = tokio::spawn({
        let (pool, outbox, stop) = (pool.clone(), outbox.clone(), stop.clone());
        async move {
            let mut n = 0;
            while !stop.load(AtomicOrdering::SeqCst) {
                let events: Vec<_> = (n..n + 5)
                    .map(|k| event(&format!("a{}", k % 20), k))
                    .collect();
                commit(&pool, &outbox, &events).await;
                n += 5;
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            n
        }
    });
    tokio::time::sleep(Duration::from_millis(500)).await;

    // The relay's node dies: its client goes on with the next node of its list.
    cluster.kill(first);
    let moved = until("the relay on another node", || async {
        on_node(&cluster, "outbox relay under test")
            .await
            .filter(|&i| i != first)
    })
    .await;
    assert_eq!(moved, second, "the next node of the relay's list");
    tokio::time::sleep(Duration::from_millis(500)).await;
    cluster.start_node(first);
    let leader = until("the restarted node current again", || {
        settled_leader(&js, &name)
    })
    .await;
    assert_ne!(
        leader, second,
        "the relay's node is not the leader: unchanged"
    );

    // The stream's leader dies: no leader until the other two elect one.
    let failed_before = handle.totals().failed;
    cluster.kill(leader);
    let elected = until("a new stream leader", || async {
        let mut stream = js.get_stream(&name).await.ok()?;
        let info = stream.info().await.ok()?;
        info.cluster
            .clone()?
            .leader
            .filter(|l| *l != format!("n{leader}"))
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    cluster.start_node(leader);
    stop.store(true, AtomicOrdering::SeqCst);
    let committed = load.await.unwrap();
    eventually("every event published", || async {
        pending(&pool).await == 0
    })
    .await;
    let totals = handle.totals();
    let report = handle.shutdown().await;
    assert!(report.graceful);
    assert!(
        totals.failed > failed_before,
        "publishes failed while the stream had no leader (new leader {elected}): the test saw an election"
    );

    let dead = scalar_i64(
        &pool,
        "SELECT count(*) FROM outbox WHERE dead_lettered_at IS NOT NULL",
    )
    .await;
    assert_eq!(
        dead, 0,
        "no dead letter: the election's failures are the broker's"
    );
    assert_eq!(published(&pool).await, committed as i64);

    // Exactly once in the stream, by Nats-Msg-Id.
    let mut stream = until("the stream readable", || async {
        let mut stream = js.get_stream(&name).await.ok()?;
        stream.info().await.ok()?;
        Some(stream)
    })
    .await;
    let stored = stream.info().await.unwrap().state.messages;
    assert_eq!(stored, committed as u64, "one message per committed event");
    let consumer: jetstream::consumer::PullConsumer = stream
        .create_consumer(jetstream::consumer::pull::Config {
            ack_policy: jetstream::consumer::AckPolicy::None,
            ..Default::default()
        })
        .await
        .unwrap();
    let mut messages = consumer.messages().await.unwrap();
    let mut ids = HashSet::new();
    while (ids.len() as u64) < stored {
        let message = tokio::time::timeout(WAIT, messages.next())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        let id = message
            .headers
            .as_ref()
            .unwrap()
            .get("Nats-Msg-Id")
            .unwrap();
        assert!(ids.insert(id.as_str().to_owned()), "{id} stored twice");
    }
    let rows: Vec<uuid::Uuid> = sqlx::query_scalar("SELECT id FROM outbox")
        .fetch_all(&pool)
        .await
        .unwrap();
    for id in &rows {
        assert!(
            ids.contains(&id.to_string()),
            "event {id} not in the stream"
        );
    }

    // The duplicate window survived the leader change: the first events, published again
    // (a relay's republish after a lost ack), are dropped as duplicates.
    let again = NatsPublisher::from_context(js.clone())
        .with_subject(&format!("{prefix}.{{aggregate_type}}.{{event_type}}"))
        .unwrap();
    let first_ids: Vec<(uuid::Uuid, String)> =
        sqlx::query_as("SELECT id, aggregate_id FROM outbox ORDER BY published_at, id LIMIT 20")
            .fetch_all(&pool)
            .await
            .unwrap();
    for (id, aggregate) in first_ids {
        let message = OutboxMessage::new(
            id,
            "order",
            aggregate,
            None,
            "OrderUpdated",
            "{}",
            Default::default(),
            chrono::Utc::now(),
            1,
        );
        let ack = again.publish(&message).await.unwrap();
        assert!(ack.duplicate, "{id} published again was stored again");
    }
    assert_eq!(
        stream.info().await.unwrap().state.messages,
        stored,
        "nothing stored by the republish"
    );
}
