//! [`ConfiguredPublisher`]: the publisher `outbox.publisher` describes, connected and its
//! stream or exchange checked at start-up.

use crate::config::{OutboxConfig, PublisherConfig};
use crate::error::Error;
use crate::message::OutboxMessage;
use crate::publisher::{Ack, BrokerHealth, LoggingPublisher, PublishError, Publisher};
#[cfg(any(feature = "nats", feature = "rabbitmq", feature = "kafka"))]
use idempotency_core::error_chain;

/// The publisher built from `outbox.publisher`: NATS JetStream (feature `nats`), RabbitMQ
/// (feature `rabbitmq`), Kafka (feature `kafka`) or logging.
///
/// ```
/// # async fn demo() -> Result<(), idempotency_outbox::Error> {
/// use idempotency_outbox::config::OutboxConfig;
/// use idempotency_outbox::publisher::ConfiguredPublisher;
///
/// let config: OutboxConfig = serde_json::from_value(serde_json::json!({ "publisher": "logging" }))
///     .map_err(|e| idempotency_outbox::Error::Payload(e))?;
/// let publisher = ConfiguredPublisher::from_config(&config).await?;
/// assert!(matches!(publisher, Some(ConfiguredPublisher::Logging(_))));
/// # Ok(()) }
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(demo()).unwrap();
/// ```
#[derive(Debug)]
#[non_exhaustive]
// One value per process, built once and moved into the relay: boxing the variants gains nothing.
#[allow(clippy::large_enum_variant)]
pub enum ConfiguredPublisher {
    /// `outbox.publisher.nats`.
    #[cfg(feature = "nats")]
    #[cfg_attr(docsrs, doc(cfg(feature = "nats")))]
    Nats(super::nats::NatsPublisher),
    /// `outbox.publisher.rabbitmq`.
    #[cfg(feature = "rabbitmq")]
    #[cfg_attr(docsrs, doc(cfg(feature = "rabbitmq")))]
    RabbitMq(super::rabbitmq::RabbitMqPublisher),
    /// `outbox.publisher.kafka`.
    #[cfg(feature = "kafka")]
    #[cfg_attr(docsrs, doc(cfg(feature = "kafka")))]
    Kafka(super::kafka::KafkaPublisher),
    /// `outbox.publisher: logging`.
    Logging(LoggingPublisher),
}

fn property(property: &'static str, reason: impl Into<String>) -> Error {
    Error::Property {
        property,
        reason: reason.into(),
    }
}

impl ConfiguredPublisher {
    /// Builds the publisher of `config.publisher` (`None` when it is not set) and checks it
    /// can work before the relay starts:
    ///
    /// - `nats`: connects to `url`; with `stream.create` makes sure the stream exists and
    ///   captures the subjects ([`NatsPublisher::ensure_stream`](super::nats::NatsPublisher::ensure_stream));
    ///   then fails when the stream is missing or its duplicate window is shorter than the
    ///   relay's republish window ([`RelayConfig::check_duplicate_window`](crate::config::RelayConfig::check_duplicate_window)).
    /// - `rabbitmq`: connects to `url`; with `create` declares `exchange` (durable, `topic`).
    /// - `kafka`: creates the producer (`message-timeout`, default the relay's
    ///   `publish-timeout`, no longer than it) and asks `brokers` for the cluster's metadata;
    ///   with `create` makes each topic exist before its first record
    ///   ([`KafkaPublisher::with_topic_creation`](super::kafka::KafkaPublisher::with_topic_creation)),
    ///   a topic without placeholders at once.
    /// - `logging`: nothing to check.
    ///
    /// Every failure is an [`Error::Property`] naming the property (`outbox.publisher.nats.url`).
    pub async fn from_config(config: &OutboxConfig) -> Result<Option<Self>, Error> {
        let Some(publisher) = &config.publisher else {
            return Ok(None);
        };
        match publisher {
            PublisherConfig::Logging => Ok(Some(Self::Logging(LoggingPublisher::new()))),
            #[cfg(feature = "nats")]
            PublisherConfig::Nats(nats) => {
                Ok(Some(Self::Nats(Self::nats(nats, &config.relay).await?)))
            }
            #[cfg(not(feature = "nats"))]
            PublisherConfig::Nats(_) => Err(property(
                "outbox.publisher.nats",
                "is set, but the `nats` feature is off; enable it",
            )),
            #[cfg(feature = "rabbitmq")]
            PublisherConfig::Rabbitmq(rabbitmq) => {
                Ok(Some(Self::RabbitMq(Self::rabbitmq(rabbitmq).await?)))
            }
            #[cfg(not(feature = "rabbitmq"))]
            PublisherConfig::Rabbitmq(_) => Err(property(
                "outbox.publisher.rabbitmq",
                "is set, but the `rabbitmq` feature is off; enable it",
            )),
            #[cfg(feature = "kafka")]
            PublisherConfig::Kafka(kafka) => {
                Ok(Some(Self::Kafka(Self::kafka(kafka, &config.relay).await?)))
            }
            #[cfg(not(feature = "kafka"))]
            PublisherConfig::Kafka(_) => Err(property(
                "outbox.publisher.kafka",
                "is set, but the `kafka` feature is off; enable it",
            )),
        }
    }

    #[cfg(feature = "kafka")]
    async fn kafka(
        config: &crate::config::KafkaPublisherConfig,
        relay: &crate::config::RelayConfig,
    ) -> Result<super::kafka::KafkaPublisher, Error> {
        use std::time::Duration;

        if config.brokers.trim().is_empty() {
            return Err(property(
                "outbox.publisher.kafka.brokers",
                "is empty; give the bootstrap brokers, e.g. 127.0.0.1:9092",
            ));
        }
        let partitions = config
            .partitions
            .unwrap_or(crate::config::DEFAULT_KAFKA_PARTITIONS);
        if partitions < 1 {
            return Err(property(
                "outbox.publisher.kafka.partitions",
                format!("is {partitions}; a topic has at least 1 partition"),
            ));
        }
        if config.partitions.is_some() && !config.create {
            return Err(property(
                "outbox.publisher.kafka.partitions",
                "is set, but create is false: only topics made at start-up or first use take \
                 it; remove it, or set create: true",
            ));
        }
        let timeout = config.message_timeout.unwrap_or(relay.publish_timeout);
        if timeout.is_zero() || timeout > relay.publish_timeout {
            return Err(property(
                "outbox.publisher.kafka.message-timeout",
                format!(
                    "is {}; it must be above zero and at most relay.publish-timeout ({}): a \
                     record the relay gave up on would otherwise still be delivered beside its \
                     republished copy",
                    humantime_serde::re::humantime::format_duration(timeout),
                    humantime_serde::re::humantime::format_duration(relay.publish_timeout),
                ),
            ));
        }
        if timeout > super::kafka::MAX_MESSAGE_TIMEOUT {
            let show = humantime_serde::re::humantime::format_duration;
            return Err(property(
                "outbox.publisher.kafka.message-timeout",
                format!(
                    "is {}{}; librdkafka's message.timeout.ms takes at most {}: set \
                     message-timeout to at most that",
                    show(timeout),
                    if config.message_timeout.is_none() {
                        " (relay.publish-timeout, as it is not set)"
                    } else {
                        ""
                    },
                    show(super::kafka::MAX_MESSAGE_TIMEOUT),
                ),
            ));
        }
        let mut publisher = super::kafka::KafkaPublisher::new(&config.brokers)
            .with_topic(&config.topic)
            .map_err(|e| property("outbox.publisher.kafka.topic", e.to_string()))?
            .with_message_timeout(timeout);
        if config.create {
            publisher = publisher.with_topic_creation(partitions);
        }
        let publisher = publisher
            .connect()
            .map_err(|e| property("outbox.publisher.kafka.brokers", error_chain(&e)))?;
        publisher
            .check_connection(timeout.max(Duration::from_secs(1)))
            .await
            .map_err(|e| {
                property(
                    "outbox.publisher.kafka.brokers",
                    format!("{}: no answer: {}", config.brokers, error_chain(&e)),
                )
            })?;
        if config.create && !config.topic.contains('{') {
            // A fixed topic (parsed above: no placeholder): made now, so that a broker
            // refusing it stops start-up.
            let topic = &config.topic;
            publisher
                .ensure_topic(topic, partitions)
                .await
                .map_err(|e| {
                    property(
                        "outbox.publisher.kafka.topic",
                        format!("{topic:?}: could not be created: {}", error_chain(&e)),
                    )
                })?;
        }
        Ok(publisher)
    }

    #[cfg(feature = "nats")]
    async fn nats(
        config: &crate::config::NatsPublisherConfig,
        relay: &crate::config::RelayConfig,
    ) -> Result<super::nats::NatsPublisher, Error> {
        if config.url.trim().is_empty() {
            return Err(property(
                "outbox.publisher.nats.url",
                "is empty; give the server, e.g. nats://127.0.0.1:4222",
            ));
        }
        if config.stream.name.trim().is_empty() {
            return Err(property(
                "outbox.publisher.nats.stream.name",
                "is empty; name the JetStream stream that stores the subjects (and set \
                 stream.create: true to have it created)",
            ));
        }
        if config.stream.duplicate_window.is_some() && !config.stream.create {
            return Err(property(
                "outbox.publisher.nats.stream.duplicate-window",
                "is set, but stream.create is false: only a stream created at start-up takes \
                 it; remove it, or set stream.create: true",
            ));
        }
        let client = async_nats::connect(config.url.as_str())
            .await
            .map_err(|e| {
                property(
                    "outbox.publisher.nats.url",
                    format!(
                        "{}: cannot connect: {e}",
                        idempotency_core::redact_url(&config.url)
                    ),
                )
            })?;
        let publisher = super::nats::NatsPublisher::new(client)
            .with_subject(&config.subject)
            .map_err(|e| property("outbox.publisher.nats.subject", e.to_string()))?;
        let stream = &config.stream.name;
        if config.stream.create {
            let window = config
                .stream
                .duplicate_window
                .unwrap_or_else(|| relay.republish_window());
            publisher.ensure_stream(stream, window).await.map_err(|e| {
                property(
                    "outbox.publisher.nats.stream.name",
                    format!(
                        "{stream:?}: the stream could not be created: {}",
                        error_chain(&e)
                    ),
                )
            })?;
        }
        publisher
            .check_duplicate_window(stream, relay)
            .await
            .map_err(|e| match e {
                Error::InvalidConfig { reason } => property(
                    "outbox.publisher.nats.stream.name",
                    format!("{stream:?}: {reason}"),
                ),
                other => property(
                    "outbox.publisher.nats.stream.name",
                    format!(
                        "{stream:?}: the stream could not be read (set stream.create: true to \
                         create it): {}",
                        error_chain(&other)
                    ),
                ),
            })?;
        Ok(publisher)
    }

    #[cfg(feature = "rabbitmq")]
    async fn rabbitmq(
        config: &crate::config::RabbitMqPublisherConfig,
    ) -> Result<super::rabbitmq::RabbitMqPublisher, Error> {
        if config.url.trim().is_empty() {
            return Err(property(
                "outbox.publisher.rabbitmq.url",
                "is empty; give the broker, e.g. amqp://guest:guest@127.0.0.1:5672/%2f",
            ));
        }
        if config.create && config.exchange.is_empty() {
            return Err(property(
                "outbox.publisher.rabbitmq.create",
                "is true, but exchange is empty (the default exchange exists always); name the \
                 exchange, or remove create",
            ));
        }
        if config.channels == Some(0) {
            return Err(property(
                "outbox.publisher.rabbitmq.channels",
                "is 0; at least one channel publishes",
            ));
        }
        let mut publisher = super::rabbitmq::RabbitMqPublisher::new(config.url.as_str())
            .with_exchange(config.exchange.as_str())
            .with_routing_key(&config.routing_key)
            .map_err(|e| property("outbox.publisher.rabbitmq.routing-key", e.to_string()))?;
        if let Some(channels) = config.channels {
            publisher = publisher.with_channels(channels);
        }
        publisher.connect().await.map_err(|e| match e {
            Error::InvalidConfig { reason } => {
                property("outbox.publisher.rabbitmq.channels", reason)
            }
            e => property(
                "outbox.publisher.rabbitmq.url",
                format!(
                    "{}: cannot connect: {}",
                    idempotency_core::redact_url(&config.url),
                    error_chain(&e)
                ),
            ),
        })?;
        if config.create {
            publisher.declare_exchange().await.map_err(|e| {
                property(
                    "outbox.publisher.rabbitmq.exchange",
                    format!(
                        "{:?}: could not be declared: {}",
                        config.exchange,
                        error_chain(&e)
                    ),
                )
            })?;
        }
        Ok(publisher)
    }
}

impl Publisher for ConfiguredPublisher {
    fn destination(&self) -> &str {
        match self {
            #[cfg(feature = "nats")]
            Self::Nats(publisher) => publisher.destination(),
            #[cfg(feature = "rabbitmq")]
            Self::RabbitMq(publisher) => publisher.destination(),
            #[cfg(feature = "kafka")]
            Self::Kafka(publisher) => publisher.destination(),
            Self::Logging(publisher) => publisher.destination(),
        }
    }

    async fn publish(&self, message: &OutboxMessage) -> Result<Ack, PublishError> {
        match self {
            #[cfg(feature = "nats")]
            Self::Nats(publisher) => publisher.publish(message).await,
            #[cfg(feature = "rabbitmq")]
            Self::RabbitMq(publisher) => publisher.publish(message).await,
            #[cfg(feature = "kafka")]
            Self::Kafka(publisher) => publisher.publish(message).await,
            Self::Logging(publisher) => publisher.publish(message).await,
        }
    }

    async fn duplicate_window(&self) -> Result<Option<std::time::Duration>, PublishError> {
        match self {
            #[cfg(feature = "nats")]
            Self::Nats(publisher) => publisher.duplicate_window().await,
            #[cfg(feature = "rabbitmq")]
            Self::RabbitMq(publisher) => publisher.duplicate_window().await,
            #[cfg(feature = "kafka")]
            Self::Kafka(publisher) => publisher.duplicate_window().await,
            Self::Logging(publisher) => publisher.duplicate_window().await,
        }
    }

    async fn health(&self) -> BrokerHealth {
        match self {
            #[cfg(feature = "nats")]
            Self::Nats(publisher) => publisher.health().await,
            #[cfg(feature = "rabbitmq")]
            Self::RabbitMq(publisher) => publisher.health().await,
            #[cfg(feature = "kafka")]
            Self::Kafka(publisher) => publisher.health().await,
            Self::Logging(publisher) => publisher.health().await,
        }
    }
}

#[cfg(test)]
mod tests {
    #[cfg(not(all(feature = "nats", feature = "rabbitmq", feature = "kafka")))]
    use super::*;

    /// A publisher whose feature is off is refused naming its property, not ignored.
    #[cfg(not(all(feature = "nats", feature = "rabbitmq", feature = "kafka")))]
    #[tokio::test]
    async fn a_publisher_whose_feature_is_off_is_refused_naming_it() {
        use crate::config::{KafkaPublisherConfig, NatsPublisherConfig, RabbitMqPublisherConfig};

        let off = [
            (
                cfg!(feature = "nats"),
                PublisherConfig::Nats(NatsPublisherConfig::default()),
                "outbox.publisher.nats",
                "`nats`",
            ),
            (
                cfg!(feature = "rabbitmq"),
                PublisherConfig::Rabbitmq(RabbitMqPublisherConfig::default()),
                "outbox.publisher.rabbitmq",
                "`rabbitmq`",
            ),
            (
                cfg!(feature = "kafka"),
                PublisherConfig::Kafka(KafkaPublisherConfig {
                    brokers: "127.0.0.1:9092".to_owned(),
                    ..KafkaPublisherConfig::default()
                }),
                "outbox.publisher.kafka",
                "`kafka`",
            ),
        ];
        for (on, publisher, property, feature) in off {
            if on {
                continue;
            }
            let config = OutboxConfig {
                publisher: Some(publisher),
                ..OutboxConfig::default()
            };
            let Err(error) = ConfiguredPublisher::from_config(&config).await else {
                panic!("{property}: accepted with its feature off");
            };
            let text = error.to_string();
            assert!(
                text.starts_with(property) && text.contains(feature),
                "{text}"
            );
        }
    }
}
