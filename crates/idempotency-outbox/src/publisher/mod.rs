//! The publisher SPI, and the publishers this crate ships.
//!
//! A [`Publisher`] sends one message and resolves once the broker confirmed it (JetStream
//! publish ack, RabbitMQ publisher confirm). The relay publishes a batch concurrently, each
//! message bounded by `publish-timeout`, and marks published only what was confirmed.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use idempotency_core::BoxError;

use crate::error::Error;
use crate::message::OutboxMessage;

mod configured;
mod health;
#[cfg(feature = "kafka")]
#[cfg_attr(docsrs, doc(cfg(feature = "kafka")))]
pub mod kafka;
mod logging;
#[cfg(feature = "nats")]
#[cfg_attr(docsrs, doc(cfg(feature = "nats")))]
pub mod nats;
#[cfg(feature = "rabbitmq")]
#[cfg_attr(docsrs, doc(cfg(feature = "rabbitmq")))]
pub mod rabbitmq;
mod template;

pub use configured::ConfiguredPublisher;
pub use health::BrokerHealth;
pub use logging::LoggingPublisher;
pub use template::Template;

/// A message of aggregate `order`/`o-1`, event `OrderPlaced`, payload `{}`, with `headers` and
/// `sequence`: what the publishers' unit tests send.
#[cfg(all(test, any(feature = "nats", feature = "rabbitmq", feature = "kafka")))]
pub(crate) fn test_message(headers: &[(&str, &str)], sequence: Option<i64>) -> OutboxMessage {
    OutboxMessage::new(
        uuid::Uuid::now_v7(),
        "order",
        "o-1",
        sequence,
        "OrderPlaced",
        "{}",
        headers
            .iter()
            .map(|(name, value)| ((*name).to_owned(), (*value).to_owned()))
            .collect(),
        chrono::Utc::now(),
        1,
    )
}

/// Header names every publisher adds, so consumers can route and check order without parsing
/// the payload.
pub mod headers {
    /// The aggregate type.
    pub const AGGREGATE_TYPE: &str = "Outbox-Aggregate-Type";
    /// The aggregate id.
    pub const AGGREGATE_ID: &str = "Outbox-Aggregate-Id";
    /// The event type.
    pub const EVENT_TYPE: &str = "Outbox-Event-Type";
    /// The per-aggregate sequence (absent for unordered events).
    pub const SEQUENCE: &str = "Outbox-Sequence";
    /// The outbox id, where the broker has no message-id field of its own (Kafka). NATS carries
    /// it as `Nats-Msg-Id`, RabbitMQ as `message_id`.
    pub const ID: &str = "Outbox-Id";

    /// Whether `name` is one of the names above, in any case: an event's own header of such a
    /// name is not sent beside the outbox's, which a consumer could read first.
    #[cfg(any(feature = "nats", feature = "rabbitmq", feature = "kafka"))]
    pub(crate) fn is_outbox_name(name: &str) -> bool {
        [AGGREGATE_TYPE, AGGREGATE_ID, EVENT_TYPE, SEQUENCE, ID]
            .iter()
            .any(|outbox| outbox.eq_ignore_ascii_case(name))
    }
}

/// What the broker said about a confirmed message.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Ack {
    /// The broker recognised the message id and dropped this copy (JetStream's duplicate
    /// window). The message is delivered once all the same.
    pub duplicate: bool,
}

/// Sends outbox messages to a broker.
pub trait Publisher: Send + Sync + 'static {
    /// A low-cardinality label for metrics and logs (`nats`, `rabbitmq:orders`...).
    fn destination(&self) -> &str;

    /// Publishes `message` with its id as the broker's message id, forwarding its headers,
    /// and resolves once the broker confirmed it.
    fn publish(
        &self,
        message: &OutboxMessage,
    ) -> impl Future<Output = Result<Ack, PublishError>> + Send;

    /// How long the broker remembers a message id to drop a copy published again (JetStream's
    /// stream `duplicate_window`), or `None` when it does not deduplicate by id (the default:
    /// RabbitMQ, a log; the consumers' inbox absorbs the copies).
    /// [`Relay::check_duplicate_window`](crate::Relay::check_duplicate_window) compares it
    /// with the relay's republish window at start-up.
    fn duplicate_window(
        &self,
    ) -> impl Future<Output = Result<Option<Duration>, PublishError>> + Send {
        std::future::ready(Ok(None))
    }

    /// Whether the broker can be reached now, for health endpoints (the `idempotency`
    /// facade's `/health/ready`). It should answer from the connection's state or one cheap
    /// round trip, never publish; the caller bounds it with a timeout. The default,
    /// for publishers that cannot tell, is [`BrokerHealth::Unknown`].
    fn health(&self) -> impl Future<Output = BrokerHealth> + Send {
        std::future::ready(BrokerHealth::Unknown)
    }
}

impl<P: Publisher> Publisher for Arc<P> {
    fn destination(&self) -> &str {
        (**self).destination()
    }

    fn publish(
        &self,
        message: &OutboxMessage,
    ) -> impl Future<Output = Result<Ack, PublishError>> + Send {
        (**self).publish(message)
    }

    fn duplicate_window(
        &self,
    ) -> impl Future<Output = Result<Option<Duration>, PublishError>> + Send {
        (**self).duplicate_window()
    }

    fn health(&self) -> impl Future<Output = BrokerHealth> + Send {
        (**self).health()
    }
}

/// Why a publish failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum PublishErrorKind {
    /// The broker cannot be reached, or has nothing to take the message (no stream for the
    /// subject). Retried with backoff, without counting towards `max-attempts`
    /// ([`is_transient`](Self::is_transient)).
    Unavailable,
    /// The broker refused the message (unroutable, too large).
    Rejected,
    /// The destination has no room now: a JetStream stream with `discard: new` at one of its
    /// limits (or JetStream out of resources), a RabbitMQ negative confirm (a queue at its
    /// `x-max-length` with `x-overflow: reject-publish`, or a queue that went down). Not
    /// counted towards `max-attempts` while the destination has refused the event for less
    /// than `relay.full-patience` (from its first refusal the relay saw): the attempt is given
    /// back and the next one comes after about as long as it has been refused, so a consumer
    /// that falls behind for a while does not turn a backlog into dead letters, and the
    /// aggregate's later events wait behind it, in order. Past the patience the refusals
    /// count, `max-attempts` of them dead-letter it: that bounds what the broker refuses for
    /// good under the same answer (a message larger than the stream's `max_bytes`). Not the
    /// relay's outage state: the broker answers, and ends an outage by it.
    Full,
    /// No confirmation within `publish-timeout`. Retried without counting towards
    /// `max-attempts` ([`is_transient`](Self::is_transient)).
    Timeout,
    /// The message cannot be expressed for this broker (invalid subject, header, a name too
    /// long). Never retried: the relay dead-letters it at once.
    InvalidMessage,
    /// The publisher panicked; the relay caught it and counts it as a failed attempt.
    Panicked,
    /// Anything else.
    Other,
}

impl PublishErrorKind {
    /// Whether the failure is the broker's rather than the message's: `Unavailable` (no
    /// connection, no stream for the subject: NATS "no responders") and `Timeout`. The relay
    /// retries such a failure without counting it towards `max-attempts`, so an outage, however
    /// long, never dead-letters a message; its backoff grows with the outage instead.
    ///
    /// ```
    /// use idempotency_outbox::PublishErrorKind;
    ///
    /// assert!(PublishErrorKind::Unavailable.is_transient());
    /// assert!(!PublishErrorKind::Rejected.is_transient());
    /// ```
    pub fn is_transient(self) -> bool {
        matches!(self, Self::Unavailable | Self::Timeout)
    }
}

impl fmt::Display for PublishErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Unavailable => "broker unavailable",
            Self::Rejected => "rejected by the broker",
            Self::Full => "destination full",
            Self::Timeout => "publish timed out",
            Self::InvalidMessage => "message invalid for the broker",
            Self::Panicked => "publisher panicked",
            Self::Other => "publish failed",
        })
    }
}

/// A publish failed; the relay records it as the row's `last_error` and retries.
#[derive(Debug, thiserror::Error)]
#[error("{kind}")]
pub struct PublishError {
    kind: PublishErrorKind,
    #[source]
    source: Option<BoxError>,
}

impl PublishError {
    /// An error of `kind` caused by `source`.
    pub fn new(kind: PublishErrorKind, source: impl Into<BoxError>) -> Self {
        Self {
            kind,
            source: Some(source.into()),
        }
    }

    /// An error of `kind` without a cause.
    pub fn kind_only(kind: PublishErrorKind) -> Self {
        Self { kind, source: None }
    }

    /// What went wrong.
    pub fn kind(&self) -> PublishErrorKind {
        self.kind
    }

    /// The error and its causes, `: `-separated, for the row's `last_error`.
    pub fn chain(&self) -> String {
        idempotency_core::error_chain(self)
    }
}

impl From<PublishError> for Error {
    fn from(error: PublishError) -> Self {
        Self::Publisher(error)
    }
}

/// Checks a header name once for all brokers: visible ASCII without `:`.
pub(crate) fn header_name_ok(name: &str) -> bool {
    !name.is_empty() && name.bytes().all(|b| b.is_ascii_graphic() && b != b':')
}
