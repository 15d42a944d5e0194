//! [`PgNotificationListener`]: `LISTEN` on the outbox channel, and the [`Channel`] name.

use sqlx::PgPool;
use sqlx::postgres::PgListener;

use crate::outbox::error::outbox_error;
use idempotency_outbox::Error;
use idempotency_outbox::store::NotificationListener;

/// A dedicated connection listening on the outbox channel. It reconnects by itself after a
/// lost connection and then reports `Ok(false)` (notifications may have been missed).
#[derive(Debug)]
pub struct PgNotificationListener {
    listener: PgListener,
}

impl PgNotificationListener {
    /// Opens a connection with `pool`'s options and `LISTEN`s on `channel`.
    pub async fn connect(pool: &PgPool, channel: &Channel) -> Result<Self, Error> {
        let mut listener = PgListener::connect_with(pool).await.map_err(outbox_error)?;
        listener
            .listen(channel.as_str())
            .await
            .map_err(outbox_error)?;
        Ok(Self { listener })
    }
}

impl NotificationListener for PgNotificationListener {
    async fn next(&mut self) -> Result<bool, Error> {
        Ok(self
            .listener
            .try_recv()
            .await
            .map_err(outbox_error)?
            .is_some())
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
