//! [`LoggingPublisher`]: logs each message with `tracing`, for demos and local runs.

use crate::message::OutboxMessage;
use crate::publisher::{Ack, BrokerHealth, PublishError, Publisher};

/// Logs every message at `INFO` (target `idempotency_outbox::published`) and confirms it.
///
/// Nothing leaves the process: use it where no broker is configured.
#[derive(Debug, Clone, Default)]
pub struct LoggingPublisher {
    _private: (),
}

impl LoggingPublisher {
    /// A logging publisher.
    pub fn new() -> Self {
        Self::default()
    }
}

impl Publisher for LoggingPublisher {
    fn destination(&self) -> &str {
        "log"
    }

    async fn publish(&self, message: &OutboxMessage) -> Result<Ack, PublishError> {
        tracing::info!(
            target: "idempotency_outbox::published",
            id = %message.id,
            aggregate_type = %message.aggregate_type,
            aggregate_id = %message.aggregate_id,
            sequence = ?message.sequence,
            event_type = %message.event_type,
            headers = ?message.headers,
            payload = %message.payload,
            "outbox message"
        );
        Ok(Ack::default())
    }

    /// Always `Up`: the log is in the process.
    async fn health(&self) -> BrokerHealth {
        BrokerHealth::Up
    }
}
