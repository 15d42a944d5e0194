//! [`NatsPublisher`]: NATS JetStream, with the outbox id as `Nats-Msg-Id`.
//!
//! Each message is published to a subject derived from its aggregate and event type
//! ([`Template`], default `outbox.{aggregate_type}.{event_type}`) and awaited until JetStream
//! acknowledged it, i.e. stored it in a stream. The outbox id travels as `Nats-Msg-Id`, so
//! JetStream drops a duplicate published inside the stream's duplicate window (the relay
//! republishes after a crash between ack and mark). Event headers are forwarded, plus the
//! [`headers`] the outbox adds.
//!
//! A message NATS can never take is refused with
//! [`InvalidMessage`](PublishErrorKind::InvalidMessage), which the relay dead-letters at its
//! first attempt: a header it cannot carry, a subject a placeholder rendered with whitespace,
//! payload and headers over the server's `max_payload`.
//!
//! A stream that takes no message now (`discard: new` at its `max-msgs`, `max-bytes` or
//! per-subject limit, or JetStream out of resources) is [`Full`](PublishErrorKind::Full):
//! the events wait in the outbox, in order, until the stream has room; their refusals count
//! towards `max-attempts` only after `relay.full-patience`.

use std::str::FromStr;

use async_nats::HeaderMap;
use async_nats::header::{HeaderName, HeaderValue};
use async_nats::jetstream::context::{Context, PublishErrorKind as JsKind};
use async_nats::jetstream::message::PublishMessage;

use crate::config::RelayConfig;
use crate::error::Error;
use crate::message::OutboxMessage;
use crate::publisher::{
    Ack, BrokerHealth, PublishError, PublishErrorKind, Publisher, Template, headers,
};

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
    /// pass [`RelayConfig::republish_window`] or longer). Creates the stream when it is
    /// missing; adds the filter to an existing stream's subjects when they lack it and lengthens
    /// its duplicate window when it is shorter (never shortens it); leaves every other setting
    /// of an existing stream alone.
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
        let short = info.config.duplicate_window < duplicate_window;
        if !covered || short {
            let mut config = info.config.clone();
            if !covered {
                config.subjects.push(filter);
            }
            config.duplicate_window = config.duplicate_window.max(duplicate_window);
            self.jetstream
                .update_stream(config)
                .await
                .map_err(|e| setup(Box::new(e)))?;
        }
        Ok(())
    }
}

impl NatsPublisher {
    /// Fails when stream `name`'s duplicate window is shorter than the republish window of
    /// `relay` ([`RelayConfig::republish_window`]: the lease plus `relay.backoff.max`), naming
    /// the keys; a message published again after a lost ack would then be stored twice. Call it
    /// at startup, after [`ensure_stream`](Self::ensure_stream).
    ///
    /// ```no_run
    /// # async fn demo(publisher: idempotency_outbox::publisher::nats::NatsPublisher) -> Result<(), idempotency_outbox::Error> {
    /// use idempotency_outbox::config::RelayConfig;
    ///
    /// let relay = RelayConfig::default();
    /// publisher.ensure_stream("BILLING", relay.republish_window()).await?;
    /// publisher.check_duplicate_window("BILLING", &relay).await?;
    /// # Ok(()) }
    /// ```
    pub async fn check_duplicate_window(
        &self,
        name: &str,
        relay: &RelayConfig,
    ) -> Result<(), Error> {
        let unavailable = |e: Box<dyn std::error::Error + Send + Sync>| {
            Error::Publisher(PublishError::new(PublishErrorKind::Unavailable, e))
        };
        let mut stream = self
            .jetstream
            .get_stream(name)
            .await
            .map_err(|e| unavailable(Box::new(e)))?;
        let info = stream.info().await.map_err(|e| unavailable(Box::new(e)))?;
        relay.check_duplicate_window(info.config.duplicate_window)
    }
}

/// The servers of a NATS URL as operators write it: one URL, or several comma-separated
/// (`nats://n1:4222,nats://n2:4222,nats://n3:4222`, the nodes of a cluster), spaces around each
/// ignored; a URL without a scheme is `nats://`. Pass them to `async_nats::connect` (or
/// `ConnectOptions::connect`): the client connects to the first that answers and, when its
/// node dies, reconnects to the others (and to those the cluster advertises). A single string
/// given to `async_nats::connect` is one URL: a list in it does not parse.
///
/// Fails with [`Error::InvalidConfig`] on an empty list or an entry that is not a URL, naming
/// the entry by its position (not its text, which may carry credentials).
///
/// ```
/// use idempotency_outbox::publisher::nats::server_addrs;
///
/// let servers = server_addrs("nats://127.0.0.1:4232, nats://127.0.0.1:4233,127.0.0.1:4234")?;
/// assert_eq!(servers.len(), 3);
/// assert_eq!(servers[2].port(), 4234);
/// assert!(server_addrs("nats://127.0.0.1:4232,,").is_err());
/// # Ok::<(), idempotency_outbox::Error>(())
/// ```
///
/// ```no_run
/// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// use idempotency_outbox::publisher::nats::{NatsPublisher, server_addrs};
///
/// let servers = server_addrs("nats://n1:4222,nats://n2:4222,nats://n3:4222")?;
/// let client = async_nats::connect(servers.as_slice()).await?;
/// let publisher = NatsPublisher::new(client);
/// # Ok(()) }
/// ```
pub fn server_addrs(urls: &str) -> Result<Vec<async_nats::ServerAddr>, Error> {
    let entries: Vec<&str> = urls.split(',').map(str::trim).collect();
    if entries.iter().all(|entry| entry.is_empty()) {
        return Err(Error::InvalidConfig {
            reason: "the NATS URL list is empty".to_owned(),
        });
    }
    entries
        .iter()
        .enumerate()
        .map(|(n, entry)| {
            let invalid = |why: String| Error::InvalidConfig {
                reason: format!(
                    "entry {} of {} of the NATS URL list: {why}",
                    n + 1,
                    entries.len()
                ),
            };
            if entry.is_empty() {
                return Err(invalid("empty".to_owned()));
            }
            entry
                .parse::<async_nats::ServerAddr>()
                .map_err(|e| invalid(e.to_string()))
        })
        .collect()
}

// The names the outbox adds, made once: `from_static` neither parses nor allocates, where
// parsing them cost every publish. `names_are_valid` checks that each one is what parsing
// would give.
const AGGREGATE_TYPE: HeaderName = HeaderName::from_static(headers::AGGREGATE_TYPE);
const AGGREGATE_ID: HeaderName = HeaderName::from_static(headers::AGGREGATE_ID);
const EVENT_TYPE: HeaderName = HeaderName::from_static(headers::EVENT_TYPE);
const SEQUENCE: HeaderName = HeaderName::from_static(headers::SEQUENCE);

fn invalid<E: std::error::Error + Send + Sync + 'static>(error: E) -> PublishError {
    PublishError::new(PublishErrorKind::InvalidMessage, error)
}

fn value(value: &str) -> Result<HeaderValue, PublishError> {
    HeaderValue::from_str(value).map_err(invalid)
}

/// The event's headers, the outbox's and `Nats-Msg-Id` (the outbox id), in that order of
/// precedence: a later one replaces an event header of the same name.
fn headers_of(message: &OutboxMessage) -> Result<HeaderMap, PublishError> {
    let mut map = HeaderMap::new();
    for (name, text) in &message.headers {
        // The outbox's names are its own, in any case (an unordered event's `Outbox-Sequence`
        // would otherwise go out as it came).
        if headers::is_outbox_name(name) {
            continue;
        }
        map.insert(HeaderName::from_str(name).map_err(invalid)?, value(text)?);
    }
    map.insert(AGGREGATE_TYPE, value(&message.aggregate_type)?);
    map.insert(AGGREGATE_ID, value(&message.aggregate_id)?);
    map.insert(EVENT_TYPE, value(&message.event_type)?);
    if let Some(sequence) = message.sequence {
        map.insert(SEQUENCE, HeaderValue::from(sequence));
    }
    let mut id = uuid::Uuid::encode_buffer();
    map.insert(
        async_nats::header::NATS_MESSAGE_ID,
        value(message.id.hyphenated().encode_lower(&mut id))?,
    );
    Ok(map)
}

fn kind(error: &async_nats::jetstream::context::PublishError) -> PublishErrorKind {
    match error.kind() {
        JsKind::StreamNotFound | JsKind::BrokenPipe | JsKind::MaxAckPending => {
            PublishErrorKind::Unavailable
        }
        JsKind::TimedOut => PublishErrorKind::Timeout,
        // Payload and headers over the server's `max_payload`: this message never fits.
        JsKind::MaxPayloadExceeded => PublishErrorKind::InvalidMessage,
        JsKind::WrongLastMessageId | JsKind::WrongLastSequence => PublishErrorKind::Rejected,
        JsKind::Other if takes_nothing(error) => PublishErrorKind::Full,
        _ => PublishErrorKind::Other,
    }
}

/// The texts JetStream answers (error code 10077, "store failed") when a stream with
/// `discard: new` is at one of its limits, or its storage is out of resources: every publish to
/// the stream (or, for the per-subject limit, to the subject) is refused until room is made.
/// The same code also carries refusals of one message ("message too large"), which stay the
/// message's failure.
const STREAM_FULL: [&str; 4] = [
    "maximum messages exceeded",
    "maximum bytes exceeded",
    "maximum messages per subject exceeded",
    "insufficient resources",
];

/// Whether JetStream refused the publish because the stream, the account or the server has no
/// room for it now: the relay counts its refusals only after `relay.full-patience` (dead-lettered
/// after `max-attempts`, the events of a stream full for a few minutes would be lost to their
/// consumers, and an aggregate's later events would pass them once there is room).
fn takes_nothing(error: &async_nats::jetstream::context::PublishError) -> bool {
    use async_nats::jetstream::ErrorCode;
    let Some(api) = std::error::Error::source(error)
        .and_then(|source| source.downcast_ref::<async_nats::jetstream::Error>())
    else {
        return false;
    };
    match api.error_code() {
        ErrorCode::ACCOUNT_RESOURCES_EXCEEDED
        | ErrorCode::INSUFFICIENT_RESOURCES
        | ErrorCode::MEMORY_RESOURCES_EXCEEDED
        | ErrorCode::STORAGE_RESOURCES_EXCEEDED => true,
        // The description has no accessor of its own; `Display` starts with it.
        ErrorCode::STREAM_STORE_FAILED => {
            let text = api.to_string();
            STREAM_FULL.iter().any(|full| text.starts_with(full))
        }
        _ => false,
    }
}

/// A subject NATS cannot carry: empty, or with whitespace (which would break the protocol
/// line), as a placeholder can render it.
#[derive(Debug, thiserror::Error)]
#[error("the subject {0:?} is empty or contains whitespace")]
struct InvalidSubject(String);

/// The subject, or an `InvalidMessage` error: the checks the client makes before sending.
fn subject(rendered: String) -> Result<String, PublishError> {
    if rendered.is_empty()
        || rendered
            .bytes()
            .any(|b| matches!(b, b' ' | b'\t' | b'\r' | b'\n'))
    {
        return Err(invalid(InvalidSubject(rendered)));
    }
    Ok(rendered)
}

impl Publisher for NatsPublisher {
    fn destination(&self) -> &str {
        &self.destination
    }

    async fn publish(&self, message: &OutboxMessage) -> Result<Ack, PublishError> {
        let subject = subject(self.subject.render(message))?;
        let span = tracing::Span::current();
        span.record("messaging.system", "nats");
        span.record("messaging.destination.name", subject.as_str());
        let publish = PublishMessage::build()
            .payload(message.payload.clone().into())
            .headers(headers_of(message)?);
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

    /// The shortest duplicate window of the streams that capture a subject this publisher can
    /// publish to ([`subject_filter`](NatsPublisher::subject_filter)). No such stream is
    /// [`Unavailable`](PublishErrorKind::Unavailable): every publish would be refused.
    async fn duplicate_window(&self) -> Result<Option<std::time::Duration>, PublishError> {
        use futures_util::TryStreamExt;
        let filter = self.subject_filter();
        let unavailable = |e: Box<dyn std::error::Error + Send + Sync>| {
            PublishError::new(PublishErrorKind::Unavailable, e)
        };
        let streams: Vec<_> = self
            .jetstream
            .streams()
            .try_collect()
            .await
            .map_err(|e| unavailable(Box::new(e)))?;
        let window = streams
            .iter()
            .filter(|info| {
                info.config
                    .subjects
                    .iter()
                    .any(|subject| overlaps(subject, &filter))
            })
            .map(|info| info.config.duplicate_window)
            .min();
        match window {
            Some(window) => Ok(Some(window)),
            None => Err(unavailable(
                format!("no JetStream stream captures the subjects {filter}").into(),
            )),
        }
    }

    /// `Up` when the client is connected and JetStream answers its API's `INFO` request (one
    /// round trip: a server without JetStream, or whose JetStream is down, accepts the
    /// connection but stores nothing, and answers "no responders"); `Down` naming the
    /// connection state or the request's error otherwise. Any answer counts, whatever it
    /// says: the account's limits are not health.
    async fn health(&self) -> BrokerHealth {
        let state = self.jetstream.client().connection_state();
        if state != async_nats::connection::State::Connected {
            return BrokerHealth::Down(format!("NATS connection {state}"));
        }
        let empty = serde_json::Map::new();
        let info = self
            .jetstream
            .request::<_, _, serde_json::Value>("INFO", &empty);
        match info.await {
            Ok(_) => BrokerHealth::Up,
            Err(error) => BrokerHealth::Down(format!("JetStream did not answer: {error}")),
        }
    }
}

/// Whether two subject filters can match one same subject: token by token, `*` matches any
/// one token, `>` any rest of at least one token.
fn overlaps(a: &str, b: &str) -> bool {
    let mut a = a.split('.');
    let mut b = b.split('.');
    loop {
        match (a.next(), b.next()) {
            (Some(">"), Some(_)) | (Some(_), Some(">")) => return true,
            (Some(x), Some(y)) if x == y || x == "*" || y == "*" => {}
            (None, None) => return true,
            _ => return false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subject_filters_overlap_token_by_token() {
        for (a, b, both) in [
            ("outbox.>", "outbox.>", true),
            ("outbox.>", ">", true),
            ("outbox.>", "outbox.order.*", true),
            ("outbox.*.OrderPlaced", "outbox.order.>", true),
            ("outbox.order", "outbox.order", true),
            ("outbox.>", "outbox", false),
            ("outbox.order", "outbox.order.placed", false),
            ("billing.>", "outbox.>", false),
            ("outbox.*", "outbox.order.placed", false),
        ] {
            assert_eq!(overlaps(a, b), both, "{a} / {b}");
            assert_eq!(overlaps(b, a), both, "{b} / {a}");
        }
    }

    #[test]
    fn names_are_valid() {
        for (made, text) in [
            (AGGREGATE_TYPE, headers::AGGREGATE_TYPE),
            (AGGREGATE_ID, headers::AGGREGATE_ID),
            (EVENT_TYPE, headers::EVENT_TYPE),
            (SEQUENCE, headers::SEQUENCE),
        ] {
            assert_eq!(Some(made), HeaderName::from_str(text).ok(), "{text}");
        }
    }

    /// JetStream's answer to a publish, as the server sends it.
    fn refusal(json: &str) -> async_nats::jetstream::context::PublishError {
        let api: async_nats::jetstream::Error = serde_json::from_str(json).unwrap();
        async_nats::jetstream::context::PublishError::with_source(JsKind::Other, api)
    }

    /// A stream at one of its limits with `discard: new`, or JetStream out of resources,
    /// refuses every publish until room is made: `Full`. A refusal of the message itself
    /// stays an ordinary failure.
    #[test]
    fn a_full_stream_is_full_and_a_refused_message_is_not() {
        for full in [
            r#"{"code":503,"err_code":10077,"description":"maximum messages exceeded"}"#,
            r#"{"code":503,"err_code":10077,"description":"maximum bytes exceeded"}"#,
            r#"{"code":503,"err_code":10077,"description":"maximum messages per subject exceeded"}"#,
            r#"{"code":503,"err_code":10077,"description":"insufficient resources"}"#,
            r#"{"code":400,"err_code":10002,"description":"resource limits exceeded for account"}"#,
            r#"{"code":503,"err_code":10023,"description":"insufficient resources"}"#,
            r#"{"code":500,"err_code":10028,"description":"insufficient memory resources available"}"#,
            r#"{"code":500,"err_code":10047,"description":"insufficient storage resources available"}"#,
        ] {
            assert_eq!(kind(&refusal(full)), PublishErrorKind::Full, "{full}");
        }
        for refused in [
            r#"{"code":503,"err_code":10077,"description":"message too large"}"#,
            r#"{"code":400,"err_code":10054,"description":"message size exceeds maximum allowed"}"#,
            r#"{"code":503}"#,
        ] {
            assert_eq!(
                kind(&refusal(refused)),
                PublishErrorKind::Other,
                "{refused}"
            );
        }
    }

    use crate::publisher::test_message as message;

    fn text<'m>(map: &'m HeaderMap, name: &str) -> Option<&'m str> {
        map.get(name).map(HeaderValue::as_str)
    }

    #[test]
    fn the_event_headers_the_outbox_headers_and_the_id_as_nats_msg_id() {
        let message = message(&[("traceparent", "00-ab-cd-01")], Some(7));
        let map = headers_of(&message).unwrap();
        assert_eq!(text(&map, "traceparent"), Some("00-ab-cd-01"));
        assert_eq!(text(&map, headers::AGGREGATE_TYPE), Some("order"));
        assert_eq!(text(&map, headers::AGGREGATE_ID), Some("o-1"));
        assert_eq!(text(&map, headers::EVENT_TYPE), Some("OrderPlaced"));
        assert_eq!(text(&map, headers::SEQUENCE), Some("7"));
        let id = message.id.to_string();
        assert_eq!(text(&map, "Nats-Msg-Id"), Some(id.as_str()));
        assert_eq!(map.len(), 6);
    }

    #[test]
    fn no_sequence_header_when_unordered_and_the_outbox_names_win() {
        let message = message(
            &[
                (headers::EVENT_TYPE, "forged"),
                ("Nats-Msg-Id", "x"),
                (headers::SEQUENCE, "99"),
                ("outbox-sequence", "98"),
                ("OUTBOX-AGGREGATE-ID", "other"),
            ],
            None,
        );
        let map = headers_of(&message).unwrap();
        assert_eq!(text(&map, headers::SEQUENCE), None);
        assert_eq!(text(&map, "outbox-sequence"), None);
        assert_eq!(text(&map, "OUTBOX-AGGREGATE-ID"), None);
        assert_eq!(text(&map, headers::EVENT_TYPE), Some("OrderPlaced"));
        let id = message.id.to_string();
        assert_eq!(text(&map, "Nats-Msg-Id"), Some(id.as_str()));
    }

    #[test]
    fn a_header_nats_cannot_carry_is_an_invalid_message() {
        for headers in [[("bad name", "v")], [("x-ok", "line\r\nbreak")]] {
            let error = headers_of(&message(&headers, None)).unwrap_err();
            assert_eq!(
                error.kind(),
                PublishErrorKind::InvalidMessage,
                "{headers:?}"
            );
        }
    }
}
