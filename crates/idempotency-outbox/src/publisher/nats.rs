//! [`NatsPublisher`]: NATS JetStream, with the outbox id as `Nats-Msg-Id`.
//!
//! Each message is published to a subject derived from its aggregate and event type
//! ([`Template`], default `outbox.{aggregate_type}.{event_type}`) and awaited until JetStream
//! acknowledged it, i.e. stored it in a stream. The outbox id travels as `Nats-Msg-Id`, so
//! JetStream drops a duplicate published inside the stream's duplicate window (the relay
//! republishes after a crash between ack and mark). Event headers are forwarded, plus the
//! [`headers`] the outbox adds.

use std::str::FromStr;

use async_nats::HeaderMap;
use async_nats::header::{HeaderName, HeaderValue};
use async_nats::jetstream::context::{Context, PublishErrorKind as JsKind};
use async_nats::jetstream::message::PublishMessage;

use crate::error::Error;
use crate::message::OutboxMessage;
use crate::publisher::{Ack, PublishError, PublishErrorKind, Publisher, Template, headers};

/// The default subject template.
pub const DEFAULT_SUBJECT: &str = "outbox.{aggregate_type}.{event_type}";

/// The async-nats version this publisher is built on.
pub use async_nats;

/// Publishes to NATS JetStream and awaits the publish ack.
///
/// ```no_run
/// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// use idempotency_outbox::publisher::nats::NatsPublisher;
///
/// let client = async_nats::connect("nats://127.0.0.1:4222").await?;
/// // subjects `billing.charge.ChargeCreated`...; a stream must capture `billing.>`
/// let publisher = NatsPublisher::new(client).with_subject("billing.{aggregate_type}.{event_type}")?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct NatsPublisher {
    jetstream: Context,
    subject: Template,
    destination: String,
}

impl NatsPublisher {
    /// A publisher on `client`, with the default subject template.
    pub fn new(client: async_nats::Client) -> Self {
        Self::from_context(async_nats::jetstream::new(client))
    }

    /// A publisher on a JetStream context you configured (domain, prefix, ack timeout).
    pub fn from_context(jetstream: Context) -> Self {
        Self {
            jetstream,
            subject: Template::aggregate_and_event("outbox."),
            destination: "nats".to_owned(),
        }
    }

    /// Sets the subject template (placeholders `{aggregate_type}`, `{aggregate_id}`,
    /// `{event_type}`).
    pub fn with_subject(mut self, template: &str) -> Result<Self, Error> {
        self.subject = Template::parse(template)?;
        Ok(self)
    }

    /// Sets the metrics label (default `nats`).
    #[must_use]
    pub fn with_destination(mut self, destination: impl Into<String>) -> Self {
        self.destination = destination.into();
        self
    }

    /// The JetStream context.
    pub fn jetstream(&self) -> &Context {
        &self.jetstream
    }

    /// The subject `message` is published to.
    pub fn subject(&self, message: &OutboxMessage) -> String {
        self.subject.render(message)
    }

    /// One JetStream subject filter capturing every subject the template can render: the
    /// fixed tokens before the first placeholder, then `>` (`billing.>` for
    /// `billing.{aggregate_type}.{event_type}`); the subject itself for a template without
    /// placeholders.
    ///
    /// ```
    /// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// # let client = async_nats::connect("nats://127.0.0.1:4222").await?;
    /// use idempotency_outbox::publisher::nats::NatsPublisher;
    /// let publisher = NatsPublisher::new(client).with_subject("billing.{aggregate_type}.{event_type}")?;
    /// assert_eq!(publisher.subject_filter(), "billing.>");
    /// # Ok(()) }
    /// ```
    pub fn subject_filter(&self) -> String {
        let template = self.subject.as_str();
        match template.find('{') {
            None => template.to_owned(),
            Some(placeholder) => {
                // Keep the whole tokens before the placeholder's token.
                let fixed = template[..placeholder]
                    .rfind('.')
                    .map_or("", |dot| &template[..=dot]);
                format!("{fixed}>")
            }
        }
    }

    /// Makes sure the JetStream stream `name` exists and captures
    /// [`subject_filter`](Self::subject_filter), with `duplicate_window` as its message-id
    /// deduplication window (it absorbs a relay's re-publish of a message whose ack was lost;
    /// make it longer than the relay's lease). Creates the stream when it is missing; adds the
    /// filter to an existing stream's subjects when they lack it; leaves every other setting of
    /// an existing stream alone.
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// use idempotency_outbox::publisher::nats::NatsPublisher;
    /// let client = async_nats::connect("nats://127.0.0.1:4222").await?;
    /// let publisher = NatsPublisher::new(client).with_subject("billing.{aggregate_type}.{event_type}")?;
    /// publisher.ensure_stream("BILLING", std::time::Duration::from_secs(120)).await?;
    /// # Ok(()) }
    /// ```
    pub async fn ensure_stream(
        &self,
        name: &str,
        duplicate_window: std::time::Duration,
    ) -> Result<(), Error> {
        use async_nats::jetstream::stream::Config;
        let setup = |e: Box<dyn std::error::Error + Send + Sync>| {
            Error::Publisher(PublishError::new(PublishErrorKind::Unavailable, e))
        };
        let filter = self.subject_filter();
        let mut stream = self
            .jetstream
            .get_or_create_stream(Config {
                name: name.to_owned(),
                subjects: vec![filter.clone()],
                duplicate_window,
                ..Default::default()
            })
            .await
            .map_err(|e| setup(Box::new(e)))?;
        let info = stream.info().await.map_err(|e| setup(Box::new(e)))?;
        let covered = info
            .config
            .subjects
            .iter()
            .any(|subject| subject == &filter || subject == ">");
        if !covered {
            let mut config = info.config.clone();
            config.subjects.push(filter);
            self.jetstream
                .update_stream(config)
                .await
                .map_err(|e| setup(Box::new(e)))?;
        }
        Ok(())
    }
}

fn header(map: &mut HeaderMap, name: &str, value: &str) -> Result<(), PublishError> {
    let name = HeaderName::from_str(name)
        .map_err(|e| PublishError::new(PublishErrorKind::InvalidMessage, e))?;
    let value = HeaderValue::from_str(value)
        .map_err(|e| PublishError::new(PublishErrorKind::InvalidMessage, e))?;
    map.insert(name, value);
    Ok(())
}

fn headers_of(message: &OutboxMessage) -> Result<HeaderMap, PublishError> {
    let mut map = HeaderMap::new();
    for (name, value) in &message.headers {
        header(&mut map, name, value)?;
    }
    header(&mut map, headers::AGGREGATE_TYPE, &message.aggregate_type)?;
    header(&mut map, headers::AGGREGATE_ID, &message.aggregate_id)?;
    header(&mut map, headers::EVENT_TYPE, &message.event_type)?;
    if let Some(sequence) = message.sequence {
        header(&mut map, headers::SEQUENCE, &sequence.to_string())?;
    }
    Ok(map)
}

fn kind(error: &async_nats::jetstream::context::PublishError) -> PublishErrorKind {
    match error.kind() {
        JsKind::StreamNotFound | JsKind::BrokenPipe | JsKind::MaxAckPending => {
            PublishErrorKind::Unavailable
        }
        JsKind::TimedOut => PublishErrorKind::Timeout,
        JsKind::MaxPayloadExceeded | JsKind::WrongLastMessageId | JsKind::WrongLastSequence => {
            PublishErrorKind::Rejected
        }
        _ => PublishErrorKind::Other,
    }
}

impl Publisher for NatsPublisher {
    fn destination(&self) -> &str {
        &self.destination
    }

    async fn publish(&self, message: &OutboxMessage) -> Result<Ack, PublishError> {
        let subject = self.subject.render(message);
        let publish = PublishMessage::build()
            .payload(message.payload.clone().into())
            .headers(headers_of(message)?)
            .message_id(message.id.to_string());
        let pending = self
            .jetstream
            .send_publish(subject, publish)
            .await
            .map_err(|e| PublishError::new(kind(&e), e))?;
        let ack = pending.await.map_err(|e| PublishError::new(kind(&e), e))?;
        Ok(Ack {
            duplicate: ack.duplicate,
        })
    }
}
