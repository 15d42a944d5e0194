//! [`PgNotificationListener`]: `LISTEN` on the outbox channel, and the [`Channel`] name.

use std::time::Duration;

use sqlx::PgPool;
use sqlx::postgres::{PgListener, PgPoolOptions};

use crate::outbox::error::outbox_error;
use idempotency_outbox::Error;
use idempotency_outbox::store::NotificationListener;

/// How long a [`PgNotificationListener`] waits without a notification before it checks that
/// its connection still answers.
pub const LISTEN_KEEPALIVE: Duration = Duration::from_secs(30);

/// A dedicated connection listening on the outbox channel. It reconnects by itself after a
/// lost connection and then reports `Ok(false)` (notifications may have been missed).
///
/// A connection can also die silently (a half-open socket behind a NAT or a firewall that
/// forgot it: no error, no notification, ever). After [`LISTEN_KEEPALIVE`] without a
/// notification the listener sends `SELECT 1` on its connection; without an answer within the
/// same time it opens a new connection, `LISTEN`s again and reports `Ok(false)`.
///
/// ```no_run
/// # async fn demo(pool: sqlx::PgPool) -> Result<(), idempotency_outbox::Error> {
/// use std::time::Duration;
/// use idempotency_outbox::store::NotificationListener;
/// use idempotency_pg::{Channel, PgNotificationListener};
///
/// let channel = Channel::parse("outbox")?;
/// let mut listener = PgNotificationListener::connect(&pool, &channel)
///     .await?
///     .with_keepalive(Duration::from_secs(10));
/// let notified = listener.next().await?; // false: reconnected, poll now
/// # let _ = notified;
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct PgNotificationListener {
    pool: PgPool,
    channel: Channel,
    keepalive: Duration,
    listener: PgListener,
}

impl PgNotificationListener {
    /// Opens a connection with `pool`'s options and `LISTEN`s on `channel`.
    pub async fn connect(pool: &PgPool, channel: &Channel) -> Result<Self, Error> {
        Ok(Self {
            pool: pool.clone(),
            channel: channel.clone(),
            keepalive: LISTEN_KEEPALIVE,
            listener: open(pool, channel).await?,
        })
    }

    /// Sets how long the listener waits without a notification before it checks its
    /// connection, and how long it waits for that check's answer (default
    /// [`LISTEN_KEEPALIVE`]).
    #[must_use]
    pub fn with_keepalive(mut self, keepalive: Duration) -> Self {
        self.keepalive = keepalive;
        self
    }
}

/// A listener on a connection of its own, outside `pool` (with `pool`'s options): a
/// connection found dead is closed with it, never handed back to `pool`'s users, and the
/// listener takes none of their connections.
async fn open(pool: &PgPool, channel: &Channel) -> Result<PgListener, Error> {
    let own = PgPoolOptions::new()
        .max_connections(1)
        // Closed, not pinged, when released: the ping of a dead connection never ends.
        .after_release(|_, _| Box::pin(async { Ok(false) }))
        .connect_lazy_with(pool.connect_options().as_ref().clone());
    let mut listener = PgListener::connect_with(&own).await.map_err(outbox_error)?;
    listener
        .listen(channel.as_str())
        .await
        .map_err(outbox_error)?;
    Ok(listener)
}

impl NotificationListener for PgNotificationListener {
    async fn next(&mut self) -> Result<bool, Error> {
        loop {
            if let Ok(received) =
                tokio::time::timeout(self.keepalive, self.listener.try_recv()).await
            {
                return Ok(received.map_err(outbox_error)?.is_some());
            }
            // Silence: is anyone still there?
            let probe = sqlx::query("SELECT 1").execute(&mut self.listener);
            if let Ok(Ok(_)) = tokio::time::timeout(self.keepalive, probe).await {
                continue;
            }
            tracing::warn!(
                channel = self.channel.as_str(),
                keepalive = ?self.keepalive,
                "the outbox LISTEN connection did not answer; opening a new one"
            );
            self.listener = open(&self.pool, &self.channel).await?;
            return Ok(false);
        }
    }
}

/// A `LISTEN`/`NOTIFY` channel name: letters, digits and `_`, starting with a letter or `_`,
/// at most 63 bytes (sent as a bind parameter by enqueue, quoted by `LISTEN`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Channel(String);

impl Channel {
    /// Validates `input`.
    pub fn parse(input: &str) -> Result<Self, Error> {
        let invalid = |reason: &'static str| Error::InvalidName {
            what: "notify channel",
            name: input.to_owned(),
            reason,
        };
        let mut bytes = input.bytes();
        match bytes.next() {
            None => return Err(invalid("the name is empty")),
            Some(b) if !(b.is_ascii_alphabetic() || b == b'_') => {
                return Err(invalid("the name must start with a letter or '_'"));
            }
            Some(_) => {}
        }
        if !bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_') {
            return Err(invalid("only letters, digits and '_' are allowed"));
        }
        if input.len() > 63 {
            return Err(invalid("the name is longer than 63 bytes"));
        }
        Ok(Self(input.to_ascii_lowercase()))
    }

    /// The channel name.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn channel_names_are_validated() {
        assert_eq!(
            Channel::parse("Outbox_Events").unwrap().as_str(),
            "outbox_events"
        );
        for bad in ["", "a$b", "a'b", "1a", "a b", &"c".repeat(64)] {
            assert!(Channel::parse(bad).is_err(), "{bad:?}");
        }
    }
}
