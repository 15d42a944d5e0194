//! The JetStream stream that captures the relay's messages.

use std::time::Duration;

use idempotency_outbox::publisher::nats::async_nats;
use idempotency_outbox::publisher::nats::async_nats::jetstream;
use idempotency_outbox::publisher::nats::server_addrs;

use crate::Error;

/// Connects to NATS at `urls` (one URL, or a cluster's comma-separated list: the client
/// reconnects to another node when its own dies), bounded by 10 s. The nodes are tried in the
/// list's order, at the first connect and at each reconnect (not shuffled, as clients do by
/// default), so that a script chooses the node a process is on; `name` is the connection's
/// name in the servers' monitoring (`/connz`), so that the script can see where it went.
pub async fn connect(urls: &str, name: &str) -> Result<async_nats::Client, Error> {
    let servers = server_addrs(urls)?;
    let connecting = async_nats::ConnectOptions::new()
        .name(name)
        .retain_servers_order()
        .connect(servers.as_slice());
    match tokio::time::timeout(Duration::from_secs(10), connecting).await {
        Ok(Ok(client)) => Ok(client),
        Ok(Err(error)) => Err(Error::nats("connect", error)),
        Err(elapsed) => Err(Error::nats("connect", elapsed)),
    }
}

/// Creates (or finds) the stream `name` capturing `subjects` (`chaos.>`), with a duplicate
/// window of `window`: it must outlast the run, or a copy published after the window would be
/// stored twice. `replicas` is its replication factor (1 on a single server, up to the
/// cluster's size).
pub async fn create(
    client: &async_nats::Client,
    name: &str,
    subjects: &str,
    window: Duration,
    replicas: usize,
) -> Result<(), Error> {
    jetstream::new(client.clone())
        .get_or_create_stream(jetstream::stream::Config {
            name: name.to_owned(),
            subjects: vec![subjects.to_owned()],
            duplicate_window: window,
            num_replicas: replicas,
            ..Default::default()
        })
        .await
        .map_err(|e| Error::nats("create stream", e))?;
    Ok(())
}
