//! [`RabbitMqPublisher`]: RabbitMQ with publisher confirms, persistent delivery and the outbox
//! id as `message_id`.
//!
//! Each message goes to the configured exchange with a routing key derived from it
//! ([`Template`], default `{aggregate_type}.{event_type}`), with `delivery_mode = 2`
//! (persistent), `message_id` = the outbox id, `type` = the event type, `content_type =
//! application/json`, the event headers plus the outbox [`headers`] as AMQP
//! headers, and `mandatory` set so an unroutable message is a failure rather than silently
//! dropped. The publish resolves when the broker confirmed it (publisher confirms are on).
//!
//! AMQP carries the routing key, the `type` and every header name as a short string of at
//! most 255 bytes. A message that would need a longer one fails with
//! [`InvalidMessage`](PublishErrorKind::InvalidMessage) before anything is sent (the relay
//! dead-letters it at once); the connection and the other messages are not affected.
//!
//! The connection is opened on first use and re-opened after it broke, so a broker outage
//! only fails publishes (which the relay retries) until the broker is back. A negative confirm
//! (a queue at its `x-max-length` with `x-overflow: reject-publish` or `reject-publish-dlx`, or
//! a queue process that went down) is [`Full`](PublishErrorKind::Full): it refuses every
//! message alike, so the events wait in the outbox, in order, until the queue takes them
//! again; their refusals count towards `max-attempts` only after `relay.full-patience`. (A
//! message routed to several queues and refused by one of them was taken by the others: each
//! retry adds a copy there.) An unroutable message is
//! [`Rejected`](PublishErrorKind::Rejected).

use std::sync::atomic::{AtomicUsize, Ordering as AtomicOrdering};

use chrono::Utc;
use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::{BasicProperties, Channel, Confirmation, Connection, ConnectionProperties};
use tokio::sync::Mutex;

use crate::error::Error;
use crate::message::OutboxMessage;
use crate::publisher::{
    Ack, BrokerHealth, PublishError, PublishErrorKind, Publisher, Template, headers,
};

/// The lapin version this publisher is built on.
pub use lapin;

/// The default routing-key template.
pub const DEFAULT_ROUTING_KEY: &str = "{aggregate_type}.{event_type}";

/// The broker returned the message as unroutable, or refused it.
#[derive(Debug, thiserror::Error)]
#[error("{what} (reply code {code}: {text})")]
struct Refused {
    what: &'static str,
    code: u16,
    text: String,
}

/// A message body is larger than the publisher sends.
#[derive(Debug, thiserror::Error)]
#[error("the body is {len} bytes, larger than max-message-size ({max} bytes)")]
struct TooLarge {
    len: usize,
    max: usize,
}

/// A name AMQP sends as a short string is too long.
#[derive(Debug, thiserror::Error)]
#[error("the {what} is {len} bytes, longer than 255 bytes (an AMQP short string)")]
struct TooLong {
    what: &'static str,
    len: usize,
}

/// `value` as a short string, or an `InvalidMessage` error naming `what`.
fn short(what: &'static str, value: &str) -> Result<ShortString, PublishError> {
    ShortString::try_new(value).map_err(|_| {
        PublishError::new(
            PublishErrorKind::InvalidMessage,
            TooLong {
                what,
                len: value.len(),
            },
        )
    })
}

/// Channels a publisher opens at most, by default ([`RabbitMqPublisher::with_channels`]).
pub const DEFAULT_CHANNELS: usize = 32;

/// The largest message body sent by default: RabbitMQ 3.8-3.13's default `max_message_size`,
/// 128 MiB (the generation the tests run against; 4.0 lowered its default to 16 MiB: set
/// [`RabbitMqPublisher::with_max_message_size`] to `16 * 1024 * 1024` there). A larger body
/// fails before anything is sent. A body under this but over the broker's own limit is sent
/// and refused by the broker (reply 406 on its channel): the publish fails as an
/// `InvalidMessage` all the same, and the relay dead-letters it at once.
pub const DEFAULT_MAX_MESSAGE_SIZE: usize = 128 * 1024 * 1024;

/// Publishes to RabbitMQ and awaits the publisher confirm.
///
/// Each channel carries one publish at a time, from `basic.publish` to its confirm: lapin hands
/// a returned (unroutable) message to whichever pending confirm of the channel it completes
/// first, so with several publishes in flight on one channel an unroutable message could be
/// confirmed as routed and a routable one reported returned. Concurrency comes from a pool of
/// channels on one connection ([`with_channels`](Self::with_channels)), and the returned
/// message's `message_id` is checked against the publish all the same.
///
/// ```no_run
/// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// use idempotency_outbox::publisher::rabbitmq::RabbitMqPublisher;
///
/// let publisher = RabbitMqPublisher::new("amqp://guest:guest@127.0.0.1:5672/%2f")
///     .with_exchange("billing")
///     .with_routing_key("{aggregate_type}.{event_type}")?
///     .with_channels(16);
/// publisher.connect().await?; // optional: fail fast at startup; otherwise on first publish
/// # Ok(()) }
/// ```
pub struct RabbitMqPublisher {
    uri: String,
    exchange: String,
    routing_key: Template,
    mandatory: bool,
    destination: String,
    max_message_size: usize,
    connection: Mutex<Option<Connection>>,
    /// One publish in flight per channel: a slot is empty while its channel is out (or after
    /// its publish was dropped mid-flight, whose channel is then closed).
    channels: Box<[Mutex<Option<Channel>>]>,
    next: AtomicUsize,
}

/// A connection to the broker failed: lapin's error and its causes, the URI in them redacted.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct ConnectFailed(String);

/// The URI without its password ([`redact_url`](idempotency_core::redact_url)).
impl std::fmt::Debug for RabbitMqPublisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RabbitMqPublisher")
            .field("uri", &idempotency_core::redact_url(&self.uri))
            .field("exchange", &self.exchange)
            .field("routing_key", &self.routing_key)
            .field("mandatory", &self.mandatory)
            .field("destination", &self.destination)
            .field("max_message_size", &self.max_message_size)
            .field("channels", &self.channels.len())
            .finish_non_exhaustive()
    }
}

fn slots(n: usize) -> Box<[Mutex<Option<Channel>>]> {
    (0..n.max(1)).map(|_| Mutex::new(None)).collect()
}

impl RabbitMqPublisher {
    /// A publisher on `uri` (`amqp://user:pass@host:port/vhost`), to the default exchange
    /// with the default routing-key template. Nothing is connected yet.
    pub fn new(uri: impl Into<String>) -> Self {
        Self {
            uri: uri.into(),
            exchange: String::new(),
            routing_key: Template::aggregate_and_event(""),
            mandatory: true,
            destination: "rabbitmq".to_owned(),
            max_message_size: DEFAULT_MAX_MESSAGE_SIZE,
            connection: Mutex::new(None),
            channels: slots(DEFAULT_CHANNELS),
            next: AtomicUsize::new(0),
        }
    }

    /// Sets the exchange (default: the default exchange `""`, which routes by queue name).
    #[must_use]
    pub fn with_exchange(mut self, exchange: impl Into<String>) -> Self {
        self.exchange = exchange.into();
        self
    }

    /// Sets the routing-key template (placeholders `{aggregate_type}`, `{aggregate_id}`,
    /// `{event_type}`).
    pub fn with_routing_key(mut self, template: &str) -> Result<Self, Error> {
        self.routing_key = Template::parse(template)?;
        Ok(self)
    }

    /// Whether an unroutable message fails the publish (default `true`).
    #[must_use]
    pub fn with_mandatory(mut self, mandatory: bool) -> Self {
        self.mandatory = mandatory;
        self
    }

    /// Sets how many channels publish at once (default [`DEFAULT_CHANNELS`], at least 1):
    /// each carries one publish at a time, so this bounds the publishes in flight. A relay
    /// has up to 2 × `workers` × `batch-size` publishes in flight (each worker claims its
    /// next batch while a full one publishes); a publish waiting for a channel spends its
    /// `publish-timeout` waiting, so size the channels near that number when the broker is
    /// slow (from configuration: `outbox.publisher.rabbitmq.channels`).
    #[must_use]
    pub fn with_channels(mut self, channels: usize) -> Self {
        self.channels = slots(channels);
        self
    }

    /// Sets the largest message body sent (default [`DEFAULT_MAX_MESSAGE_SIZE`]); set it to
    /// the broker's `max_message_size`. A larger body fails with
    /// [`InvalidMessage`](PublishErrorKind::InvalidMessage) before anything is sent, and the
    /// relay dead-letters it at once. (A body the broker refuses anyway closes its channel
    /// with reply 406; that channel carried only this publish, which fails the same way.)
    #[must_use]
    pub fn with_max_message_size(mut self, bytes: usize) -> Self {
        self.max_message_size = bytes;
        self
    }

    /// Sets the metrics label (default `rabbitmq`).
    #[must_use]
    pub fn with_destination(mut self, destination: impl Into<String>) -> Self {
        self.destination = destination.into();
        self
    }

    /// How many channels publish at once ([`with_channels`](Self::with_channels)).
    pub fn channels(&self) -> usize {
        self.channels.len()
    }

    /// Connects now (otherwise the first publish does), failing if the broker cannot be
    /// reached, or with [`Error::InvalidConfig`] if it allows fewer channels on a connection
    /// (its negotiated `channel_max`) than [`channels`](Self::channels): the publishes beyond
    /// would fail one by one instead.
    pub async fn connect(&self) -> Result<(), Error> {
        let channel = self.open_channel().await.map_err(Error::Publisher)?;
        if let Some(connection) = self.connection.lock().await.as_ref() {
            // 0: no limit but the protocol's (a u16 channel number).
            let max = match connection.configuration().channel_max() {
                0 => usize::from(u16::MAX),
                max => usize::from(max),
            };
            if self.channels.len() > max {
                let _ = channel
                    .close(200, ShortString::from("too many channels"))
                    .await;
                return Err(Error::invalid_config(format!(
                    "{} channels, but the broker allows {max} on a connection (its \
                     channel_max)",
                    self.channels.len()
                )));
            }
        }
        if let Some(slot) = self.channels.first() {
            let mut held = slot.lock().await;
            if held.is_none() {
                *held = Some(channel);
            }
        }
        Ok(())
    }

    /// Declares the exchange (durable, type `topic`) when it is missing; an existing one of
    /// another type or durability fails (the broker's 406). The default exchange `""` always
    /// exists and is not declared.
    pub async fn declare_exchange(&self) -> Result<(), Error> {
        if self.exchange.is_empty() {
            return Ok(());
        }
        let channel = self.open_channel().await.map_err(Error::Publisher)?;
        let declared = channel
            .exchange_declare(
                ShortString::from(self.exchange.as_str()),
                lapin::ExchangeKind::Topic,
                lapin::options::ExchangeDeclareOptions {
                    durable: true,
                    ..Default::default()
                },
                FieldTable::default(),
            )
            .await;
        let _ = channel.close(200, ShortString::from("declared")).await;
        declared.map_err(|e| Error::Publisher(PublishError::new(PublishErrorKind::Unavailable, e)))
    }

    /// Whether the publisher's connection is up: connected now, or connected anew (as the
    /// next publish would). `Down` names the connect error.
    async fn check_connection(&self) -> BrokerHealth {
        let mut held = self.connection.lock().await;
        if held
            .as_ref()
            .is_some_and(|connection| connection.status().connected())
        {
            return BrokerHealth::Up;
        }
        match self.open_connection().await {
            Ok(connection) => {
                *held = Some(connection);
                BrokerHealth::Up
            }
            Err(error) => BrokerHealth::Down(format!("RabbitMQ connection failed: {error}")),
        }
    }

    /// The routing key `message` is published with.
    pub fn routing_key(&self, message: &OutboxMessage) -> String {
        self.routing_key.render(message)
    }

    /// A new connection to the broker. Its error names the URI without its password: lapin
    /// repeats an invalid URI whole (`Invalid URL: 'amqp:user:password@host'`), and the text
    /// goes to the relay's `last_error`, the health report and start-up errors.
    async fn open_connection(&self) -> Result<Connection, ConnectFailed> {
        Connection::connect(&self.uri, ConnectionProperties::default())
            .await
            .map_err(|error| {
                let text = idempotency_core::error_chain(&error);
                ConnectFailed(text.replace(&self.uri, &idempotency_core::redact_url(&self.uri)))
            })
    }

    /// A new channel in confirm mode, on the connection (re-opened when it broke).
    async fn open_channel(&self) -> Result<Channel, PublishError> {
        let unavailable = |e| PublishError::new(PublishErrorKind::Unavailable, e);
        let channel = {
            let mut held = self.connection.lock().await;
            let connection = match held.take() {
                Some(connection) if connection.status().connected() => connection,
                _ => self
                    .open_connection()
                    .await
                    .map_err(|e| PublishError::new(PublishErrorKind::Unavailable, e))?,
            };
            held.insert(connection).create_channel().await
        }
        .map_err(unavailable)?;
        channel
            .confirm_select(ConfirmSelectOptions::default())
            .await
            .map_err(unavailable)?;
        Ok(channel)
    }
}

fn properties(message: &OutboxMessage) -> Result<BasicProperties, PublishError> {
    let mut table = FieldTable::default();
    let mut put = |name: &str, value: &str| -> Result<(), PublishError> {
        table.insert(
            short("header name", name)?,
            AMQPValue::LongString(LongString::from(value)),
        );
        Ok(())
    };
    for (name, value) in &message.headers {
        // The outbox's names are its own, in any case (AMQP tables tell cases apart).
        if !headers::is_outbox_name(name) {
            put(name, value)?;
        }
    }
    put(headers::AGGREGATE_TYPE, &message.aggregate_type)?;
    put(headers::AGGREGATE_ID, &message.aggregate_id)?;
    put(headers::EVENT_TYPE, &message.event_type)?;
    if let Some(sequence) = message.sequence {
        put(headers::SEQUENCE, &sequence.to_string())?;
    }
    let timestamp = u64::try_from(message.created_at.timestamp())
        .unwrap_or_else(|_| u64::try_from(Utc::now().timestamp()).unwrap_or_default());
    Ok(BasicProperties::default()
        .with_message_id(short("message id", &message.id.to_string())?)
        .with_delivery_mode(2)
        .with_content_type(short("content type", "application/json")?)
        .with_type(short(
            "type property (the event type)",
            &message.event_type,
        )?)
        .with_timestamp(timestamp)
        .with_headers(table))
}

/// How a failed publish or confirm is classified: a channel the broker closed with 406
/// (`PRECONDITION_FAILED`, e.g. a body over `max_message_size`) or 311 (`CONTENT_TOO_LARGE`)
/// refused this message, which that channel alone carried; anything else is the broker's
/// (connection lost, channel closed for another reason).
fn failed(error: lapin::Error) -> PublishError {
    use lapin::protocol::{AMQPErrorKind, AMQPSoftError};
    let kind = match error.kind() {
        lapin::ErrorKind::ProtocolError(amqp) => match amqp.kind() {
            AMQPErrorKind::Soft(
                AMQPSoftError::PRECONDITIONFAILED | AMQPSoftError::CONTENTTOOLARGE,
            ) => PublishErrorKind::InvalidMessage,
            _ => PublishErrorKind::Unavailable,
        },
        _ => PublishErrorKind::Unavailable,
    };
    PublishError::new(kind, error)
}

impl Publisher for RabbitMqPublisher {
    fn destination(&self) -> &str {
        &self.destination
    }

    async fn publish(&self, message: &OutboxMessage) -> Result<Ack, PublishError> {
        // Everything checked before the connection is touched. A too-long exchange name is
        // configuration, not this message: retried (and logged) rather than dead-lettered.
        let exchange = ShortString::try_new(self.exchange.as_str())
            .map_err(|e| PublishError::new(PublishErrorKind::Other, e))?;
        let routing_key = short("routing key", &self.routing_key.render(message))?;
        let span = tracing::Span::current();
        span.record("messaging.system", "rabbitmq");
        span.record("messaging.destination.name", self.exchange.as_str());
        span.record(
            "messaging.rabbitmq.destination.routing_key",
            routing_key.as_str(),
        );
        let properties = properties(message)?;
        if message.payload.len() > self.max_message_size {
            return Err(PublishError::new(
                PublishErrorKind::InvalidMessage,
                TooLarge {
                    len: message.payload.len(),
                    max: self.max_message_size,
                },
            ));
        }
        let n = self.next.fetch_add(1, AtomicOrdering::Relaxed) % self.channels.len();
        let mut slot = self.channels[n].lock().await;
        // The channel is out of its slot until its confirm arrived: if this future is dropped
        // mid-flight (publish-timeout), the channel is dropped and closed with it, so a late
        // return cannot reach the next publish.
        let channel = match slot.take() {
            Some(channel) if channel.status().connected() => channel,
            _ => self.open_channel().await?,
        };
        let confirmation = channel
            .basic_publish(
                exchange,
                routing_key,
                BasicPublishOptions {
                    mandatory: self.mandatory,
                    ..BasicPublishOptions::default()
                },
                message.payload.as_bytes(),
                properties,
            )
            .await
            .map_err(failed)?
            .await
            .map_err(failed)?;
        *slot = Some(channel);
        drop(slot);
        let refused = |kind, what, returned: Option<lapin::message::BasicReturnMessage>| {
            let (code, text) = returned
                .map(|r| (r.reply_code, r.reply_text.to_string()))
                .unwrap_or_default();
            PublishError::new(kind, Refused { what, code, text })
        };
        match confirmation {
            Confirmation::Ack(None) => Ok(Ack::default()),
            Confirmation::Ack(Some(returned)) if is_for(&returned, message) => Err(refused(
                PublishErrorKind::Rejected,
                "unroutable",
                Some(returned),
            )),
            // One publish in flight per channel, so this cannot be; should it be, the
            // return is not this message's, and retrying is the safe answer.
            Confirmation::Ack(Some(returned)) => Err(PublishError::new(
                PublishErrorKind::Other,
                Refused {
                    what: "returned message of another publish",
                    code: returned.reply_code,
                    text: returned.reply_text.to_string(),
                },
            )),
            // A queue full with `x-overflow: reject-publish`, or the broker's internal error:
            // every publish to that queue is refused until room is made, whatever the message.
            Confirmation::Nack(returned) => Err(refused(
                PublishErrorKind::Full,
                "negative confirm",
                returned,
            )),
            Confirmation::NotRequested => Err(PublishError::kind_only(PublishErrorKind::Other)),
        }
    }

    /// `Up` while the publisher's connection is connected; otherwise it connects, as the next
    /// publish would, and is `Up` once that succeeds, `Down` naming the error if not.
    async fn health(&self) -> BrokerHealth {
        self.check_connection().await
    }
}

/// Whether `returned` is `message` (by the `message_id` every publish carries).
fn is_for(returned: &lapin::message::BasicReturnMessage, message: &OutboxMessage) -> bool {
    let mut id = uuid::Uuid::encode_buffer();
    returned
        .properties
        .message_id()
        .as_ref()
        .map(ShortString::as_str)
        == Some(message.id.hyphenated().encode_lower(&mut id))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    /// The publisher's `Debug` shows its broker without the password.
    #[test]
    fn debug_output_hides_the_password() {
        let publisher = RabbitMqPublisher::new("amqp://guest:s3cret@mq:5672/%2f");
        let shown = format!("{publisher:?}");
        assert!(!shown.contains("s3cret"), "{shown}");
        assert!(shown.contains("amqp://guest:***@mq:5672/%2f"), "{shown}");
    }

    /// lapin repeats a URI it cannot parse whole in its error; the publisher's errors (the
    /// health report, a publish's `last_error`, `connect`) show it without the password
    /// (before: `Invalid URL: 'amqp:guest:s3cret@mq:5672/%2f'`).
    #[tokio::test]
    async fn connection_errors_hide_the_password() {
        let publisher = RabbitMqPublisher::new("amqp:guest:s3cret@mq:5672/%2f");
        let BrokerHealth::Down(down) = publisher.health().await else {
            panic!("an invalid URI connected")
        };
        assert!(!down.contains("s3cret"), "{down}");
        assert!(down.contains("amqp:…"), "{down}");
        let error = publisher.connect().await.unwrap_err();
        let Error::Publisher(publish) = &error else {
            panic!("{error:?}")
        };
        let text = format!("{error} {error:?} {}", publish.chain());
        assert!(!text.contains("s3cret"), "{text}");
        let failed = publisher
            .publish(&crate::publisher::test_message(&[], None))
            .await
            .unwrap_err();
        assert!(!failed.chain().contains("s3cret"), "{}", failed.chain());
    }

    /// AMQP header tables tell cases apart: an event's own header of an outbox name in
    /// another case would go out beside the outbox's, and an unordered event's own
    /// `Outbox-Sequence` as it came.
    #[test]
    fn the_outbox_names_are_sent_once_with_the_outboxs_values() {
        let own = [
            (headers::SEQUENCE, "99"),
            ("outbox-aggregate-id", "other"),
            ("OUTBOX-EVENT-TYPE", "forged"),
            ("x-keep", "1"),
        ];
        let message = crate::publisher::test_message(&own, None);
        let properties = properties(&message).unwrap();
        let table = properties.headers().as_ref().unwrap().inner();
        let named = |name: &str| -> Vec<String> {
            table
                .iter()
                .filter(|(key, _)| key.as_str().eq_ignore_ascii_case(name))
                .map(|(_, value)| match value {
                    AMQPValue::LongString(text) => text.to_string(),
                    other => format!("{other:?}"),
                })
                .collect()
        };
        assert!(named(headers::SEQUENCE).is_empty(), "{table:?}");
        assert_eq!(named(headers::AGGREGATE_ID), ["o-1"]);
        assert_eq!(named(headers::EVENT_TYPE), ["OrderPlaced"]);
        assert_eq!(named("x-keep"), ["1"]);
    }
}
