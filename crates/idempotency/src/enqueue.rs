//! [`EnqueueInTx`]: an outbox event enqueued in the transaction of an idempotent request.

use idempotency_core::{IdempotencyStore, Tx};
use idempotency_outbox::uuid::Uuid;
use idempotency_outbox::{Enqueue, NewEvent};

/// Enqueues an outbox event in this transaction, in one call: it commits with the business
/// change and the idempotency record, or rolls back with them.
///
/// Implemented for the explicit API's [`Tx`] (`execute_in`) and, with the `axum` feature, the
/// middleware's [`IdempotentTx`](idempotency_axum::IdempotentTx). The outbox is
/// [`Idempotency::outbox`](crate::Idempotency::outbox).
///
/// ```no_run
/// # #[cfg(all(feature = "postgres", feature = "axum"))]
/// # mod demo {
/// use idempotency::axum::{Error, IdempotentTx};
/// use idempotency::outbox::NewEvent;
/// use idempotency::postgres::{PgOutbox, PgStore};
/// use idempotency::EnqueueInTx;
///
/// async fn create_order(outbox: PgOutbox, mut tx: IdempotentTx<PgStore>) -> Result<(), Error> {
///     idempotency::sqlx::query("INSERT INTO orders (sku) VALUES ('A-1')")
///         .execute(&mut *tx)
///         .await
///         .map_err(Error::internal)?;
///     let event = NewEvent::new("order", "1", "OrderCreated", &serde_json::json!({ "sku": "A-1" }))
///         .map_err(Error::internal)?;
///     tx.enqueue(&outbox, event).await.map_err(Error::internal)?;
///     Ok(())
/// }
/// # }
/// ```
pub trait EnqueueInTx {
    /// The connection of the transaction.
    type Connection;

    /// Writes `event` to `outbox` in this transaction; returns its message id.
    fn enqueue<O>(
        &mut self,
        outbox: &O,
        event: NewEvent,
    ) -> impl Future<Output = Result<Uuid, idempotency_outbox::Error>> + Send
    where
        O: Enqueue<Connection = Self::Connection>;
}

async fn enqueue_one<O: Enqueue>(
    outbox: &O,
    conn: &mut O::Connection,
    event: NewEvent,
) -> Result<Uuid, idempotency_outbox::Error> {
    let ids = outbox
        .enqueue_all(conn, std::slice::from_ref(&event))
        .await?;
    ids.first()
        .copied()
        .ok_or_else(|| idempotency_outbox::Error::InvalidEvent {
            reason: "the outbox returned no id for the event".to_owned(),
        })
}

impl<S: IdempotencyStore> EnqueueInTx for Tx<S>
where
    S::Transaction: Send,
{
    type Connection = S::Connection;

    async fn enqueue<O>(
        &mut self,
        outbox: &O,
        event: NewEvent,
    ) -> Result<Uuid, idempotency_outbox::Error>
    where
        O: Enqueue<Connection = S::Connection>,
    {
        enqueue_one(outbox, self.connection(), event).await
    }
}

#[cfg(feature = "axum")]
impl<S: IdempotencyStore> EnqueueInTx for idempotency_axum::IdempotentTx<S>
where
    S::Transaction: Send,
{
    type Connection = S::Connection;

    async fn enqueue<O>(
        &mut self,
        outbox: &O,
        event: NewEvent,
    ) -> Result<Uuid, idempotency_outbox::Error>
    where
        O: Enqueue<Connection = S::Connection>,
    {
        enqueue_one(outbox, &mut **self, event).await
    }
}
