//! RabbitMQ: a queue per test, consumed and acked.

use super::*;
use futures_util::StreamExt;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, QueueDeclareOptions, QueueDeleteOptions,
};
use lapin::types::FieldTable;
use lapin::{Channel, Connection, ConnectionProperties, Consumer};

pub async fn connect(uri: &str) -> Connection {
    tokio::time::timeout(
        Duration::from_secs(10),
        Connection::connect(uri, ConnectionProperties::default()),
    )
    .await
    .unwrap_or_else(|_| panic!("RabbitMQ at {uri} did not answer; start it or set AMQP_URL"))
    .unwrap_or_else(|e| panic!("cannot connect to RabbitMQ at {uri}: {e}"))
}

/// A durable queue of its own on the default exchange, deleted by `delete`.
pub struct TestQueue {
    pub name: String,
    pub connection: Connection,
    pub channel: Channel,
}

impl TestQueue {
    pub async fn new() -> Self {
        Self::with_arguments(FieldTable::default()).await
    }

    /// A queue declared with `arguments` (`x-max-length`, `x-overflow`...).
    pub async fn with_arguments(arguments: FieldTable) -> Self {
        let connection = connect(&idempotency_testing::amqp_url()).await;
        let channel = connection.create_channel().await.unwrap();
        let name = idempotency_testing::unique_name("outbox_q");
        channel
            .queue_declare(
                name.as_str().into(),
                QueueDeclareOptions {
                    durable: true,
                    ..Default::default()
                },
                arguments,
            )
            .await
            .unwrap();
        Self {
            name,
            connection,
            channel,
        }
    }

    pub async fn consumer(&self) -> Consumer {
        self.channel
            .basic_consume(
                self.name.as_str().into(),
                idempotency_testing::unique_name("c").as_str().into(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await
            .unwrap()
    }

    /// Receives and acks `n` deliveries.
    pub async fn receive(consumer: &mut Consumer, n: usize) -> Vec<lapin::message::Delivery> {
        let mut out = Vec::with_capacity(n);
        while out.len() < n {
            let delivery = match tokio::time::timeout(WAIT, consumer.next()).await {
                Ok(Some(Ok(d))) => d,
                other => panic!("got {} of {n} deliveries, then {other:?}", out.len()),
            };
            delivery.ack(BasicAckOptions::default()).await.unwrap();
            out.push(delivery);
        }
        out
    }

    pub async fn delete(&self) {
        let _ = self
            .channel
            .queue_delete(self.name.as_str().into(), QueueDeleteOptions::default())
            .await;
    }
}

pub fn header(delivery: &lapin::message::Delivery, name: &str) -> Option<String> {
    let headers = delivery.properties.headers().as_ref()?;
    match headers.inner().get(name)? {
        lapin::types::AMQPValue::LongString(s) => Some(s.to_string()),
        other => Some(format!("{other:?}")),
    }
}
