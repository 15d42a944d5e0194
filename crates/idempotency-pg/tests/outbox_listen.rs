//! The outbox's `LISTEN` connection dying silently (a half-open socket: no error, no
//! notification, ever) is detected by the listener's keepalive and re-established.

#![allow(clippy::unwrap_used)]
#![cfg(feature = "outbox")]

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering as AtomicOrdering};
use std::time::Duration;

use idempotency_outbox::store::NotificationListener;
use idempotency_pg::{Channel, PgNotificationListener};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use tokio::net::{TcpListener, TcpStream};

/// Forwards a local port to PostgreSQL. [`freeze`](Self::freeze) silences every connection
/// open at that moment for good (the bytes stop in both directions, the sockets stay open, as a
/// peer that vanished behind a NAT); connections opened later work.
struct FreezingProxy {
    port: u16,
    generation: Arc<AtomicU64>,
    frozen: tokio::sync::watch::Sender<u64>,
}

impl FreezingProxy {
    async fn start(upstream: String) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let generation = Arc::new(AtomicU64::new(0));
        let (frozen, _) = tokio::sync::watch::channel(0u64);
        let (current, gate) = (Arc::clone(&generation), frozen.clone());
        tokio::spawn(async move {
            while let Ok((mut inbound, _)) = listener.accept().await {
                let Ok(mut outbound) = TcpStream::connect(&upstream).await else {
                    continue;
                };
                let born = current.load(AtomicOrdering::SeqCst);
                let mut freeze = gate.subscribe();
                tokio::spawn(async move {
                    let frozen = tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => false,
                        _ = freeze.wait_for(|g| *g > born) => true,
                    };
                    if frozen {
                        // Keep both sockets open, silent, until the test ends.
                        std::future::pending::<()>().await;
                    }
                    drop((inbound, outbound));
                });
            }
        });
        Self {
            port,
            generation,
            frozen,
        }
    }

    fn freeze(&self) {
        let next = self.generation.fetch_add(1, AtomicOrdering::SeqCst) + 1;
        self.frozen.send_replace(next);
    }
}

async fn notify(pool: &sqlx::PgPool, channel: &Channel) {
    sqlx::query("SELECT pg_notify($1, '')")
        .bind(channel.as_str())
        .execute(pool)
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listen_connection_that_went_silent_is_detected_and_replaced() {
    let options: PgConnectOptions = idempotency_testing::database_url().parse().unwrap();
    let upstream = format!("{}:{}", options.get_host(), options.get_port());
    let proxy = FreezingProxy::start(upstream).await;
    let via_proxy = PgPoolOptions::new()
        .max_connections(2)
        .connect_lazy_with(options.clone().host("127.0.0.1").port(proxy.port));
    let direct = PgPoolOptions::new()
        .max_connections(2)
        .connect_with(options)
        .await
        .unwrap();
    let channel = Channel::parse(&idempotency_testing::unique_name("ka")).unwrap();
    let keepalive = Duration::from_millis(300);
    let mut listener = PgNotificationListener::connect(&via_proxy, &channel)
        .await
        .unwrap()
        .with_keepalive(keepalive);
    let within = Duration::from_secs(10);

    notify(&direct, &channel).await;
    let first = tokio::time::timeout(within, listener.next()).await;
    assert!(matches!(first, Ok(Ok(true))), "{first:?}");

    proxy.freeze(); // the connection is gone, and nobody says so
    notify(&direct, &channel).await; // lost with it
    let noticed = tokio::time::timeout(within, listener.next()).await;
    assert!(
        matches!(noticed, Ok(Ok(false))),
        "the silent connection was replaced and a poll asked for: {noticed:?}"
    );

    notify(&direct, &channel).await;
    let after = tokio::time::timeout(within, listener.next()).await;
    assert!(
        matches!(after, Ok(Ok(true))),
        "the new connection listens: {after:?}"
    );
}
