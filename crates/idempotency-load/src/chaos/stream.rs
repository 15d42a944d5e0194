//! The JetStream stream that captures the relay's messages.

use std::time::Duration;

use idempotency_outbox::publisher::nats::async_nats;
use idempotency_outbox::publisher::nats::async_nats::jetstream;

use crate::Error;

/// Connects to NATS at `url`, bounded by 10 s.
pub async fn connect(url: &str) -> Result<async_nats::Client, Error> {
    match tokio::time::timeout(Duration::from_secs(10), async_nats::connect(url)).await {
        Ok(Ok(client)) => Ok(client),
        Ok(Err(error)) => Err(Error::nats("connect", error)),
        Err(elapsed) => Err(Error::nats("connect", elapsed)),
    }
}

/// Creates (or finds) the stream `name` capturing `subjects` (`chaos.>`), with a duplicate
/// window of `window`: it must outlast the run, or a copy published after the window would be
/// stored twice.
pub async fn create(
    client: &async_nats::Client,
    name: &str,
    subjects: &str,
    window: Duration,
) -> Result<(), Error> {
    jetstream::new(client.clone())
        .get_or_create_stream(jetstream::stream::Config {
            name: name.to_owned(),
            subjects: vec![subjects.to_owned()],
            duplicate_window: window,
            ..Default::default()
        })
        .await
        .map_err(|e| Error::nats("create stream", e))?;
    Ok(())
}
