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
//! only fails publishes (which the relay retries) until the broker is back.

use chrono::Utc;
use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::{BasicProperties, Channel, Confirmation, Connection, ConnectionProperties};
use tokio::sync::Mutex;

use crate::error::Error;
use crate::message::OutboxMessage;
use crate::publisher::{Ack, PublishError, PublishErrorKind, Publisher, Template, headers};

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

#[derive(Debug)]
struct Link {
    // Kept so the connection lives as long as its channel.
    _connection: Connection,
    channel: Channel,
}

/// Publishes to RabbitMQ and awaits the publisher confirm.
///
/// ```no_run
/// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// use idempotency_outbox::publisher::rabbitmq::RabbitMqPublisher;
///
/// let publisher = RabbitMqPublisher::new("amqp://guest:guest@127.0.0.1:5672/%2f")
///     .with_exchange("billing")
///     .with_routing_key("{aggregate_type}.{event_type}")?;
/// publisher.connect().await?; // optional: fail fast at startup; otherwise on first publish
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct RabbitMqPublisher {
    uri: String,
    exchange: String,
    routing_key: Template,
    mandatory: bool,
    destination: String,
    link: Mutex<Option<Link>>,
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
            link: Mutex::new(None),
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

    /// Sets the metrics label (default `rabbitmq`).
    #[must_use]
    pub fn with_destination(mut self, destination: impl Into<String>) -> Self {
        self.destination = destination.into();
        self
    }

    /// Connects now (otherwise the first publish does), failing if the broker cannot be
    /// reached.
    pub async fn connect(&self) -> Result<(), Error> {
        self.channel().await.map(drop).map_err(Error::Publisher)
    }

    /// The routing key `message` is published with.
    pub fn routing_key(&self, message: &OutboxMessage) -> String {
        self.routing_key.render(message)
    }

    async fn channel(&self) -> Result<Channel, PublishError> {
        let mut link = self.link.lock().await;
        if let Some(current) = link.as_ref()
            && current.channel.status().connected()
        {
            return Ok(current.channel.clone());
        }
        *link = None;
        let unavailable = |e| PublishError::new(PublishErrorKind::Unavailable, e);
        let connection = Connection::connect(&self.uri, ConnectionProperties::default())
            .await
            .map_err(unavailable)?;
        let channel = connection.create_channel().await.map_err(unavailable)?;
        channel
            .confirm_select(ConfirmSelectOptions::default())
            .await
            .map_err(unavailable)?;
        *link = Some(Link {
            _connection: connection,
            channel: channel.clone(),
        });
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
        put(name, value)?;
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
        let properties = properties(message)?;
        let channel = self.channel().await?;
        let confirm = channel
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
            .map_err(|e| PublishError::new(PublishErrorKind::Unavailable, e))?;
        let refused = |what, returned: Option<lapin::message::BasicReturnMessage>| {
            let (code, text) = returned
                .map(|r| (r.reply_code, r.reply_text.to_string()))
                .unwrap_or_default();
            PublishError::new(PublishErrorKind::Rejected, Refused { what, code, text })
        };
        match confirm
            .await
            .map_err(|e| PublishError::new(PublishErrorKind::Unavailable, e))?
        {
            Confirmation::Ack(None) => Ok(Ack::default()),
            Confirmation::Ack(Some(returned)) => Err(refused("unroutable", Some(returned))),
            Confirmation::Nack(returned) => Err(refused("negative confirm", returned)),
            Confirmation::NotRequested => Err(PublishError::kind_only(PublishErrorKind::Other)),
        }
    }
}
