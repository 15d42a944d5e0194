//! [`PgNotificationListener`]: `LISTEN` on the outbox channel.

use sqlx::PgPool;
use sqlx::postgres::PgListener;

use crate::error::Error;
use crate::pg::names::Channel;
use crate::store::NotificationListener;

/// A dedicated connection listening on the outbox channel. It reconnects by itself after a
/// lost connection and then reports `Ok(false)` (notifications may have been missed).
#[derive(Debug)]
pub struct PgNotificationListener {
    listener: PgListener,
}

impl PgNotificationListener {
    /// Opens a connection with `pool`'s options and `LISTEN`s on `channel`.
    pub async fn connect(pool: &PgPool, channel: &Channel) -> Result<Self, Error> {
        let mut listener = PgListener::connect_with(pool).await?;
        listener.listen(channel.as_str()).await?;
        Ok(Self { listener })
    }
}

impl NotificationListener for PgNotificationListener {
    async fn next(&mut self) -> Result<bool, Error> {
        Ok(self.listener.try_recv().await?.is_some())
    }
}
