//! [`KafkaPublisher`]: Kafka, with an idempotent producer, `acks=all`, the aggregate id as the
//! record key and the outbox id as a header.
//!
//! Each message goes to a topic derived from it ([`Template`], default
//! `outbox.{aggregate_type}`), keyed by its aggregate id, so every event of one aggregate lands
//! in one partition and, with the relay's ordered claim, a consumer of that partition reads an
//! aggregate's events in commit order. The payload bytes are sent unchanged; the event headers
//! and the outbox [`headers`] (with [`headers::ID`], the outbox id: Kafka records have no
//! message id of their own) travel as Kafka headers. A publish resolves when the broker's
//! delivery report is in: with `acks=all`, once every in-sync replica has the record.
//!
//! The producer is librdkafka's idempotent producer (`enable.idempotence=true`), so its own
//! retries never write a record twice or out of order. Across producer sessions Kafka does not
//! deduplicate: a relay that republishes after a lost ack or a crash writes a second record with
//! the same [`headers::ID`], which the consumer's inbox drops
//! ([`Publisher::duplicate_window`] is `None`).
//!
//! Failures: a record over the broker's or the producer's size limit, or a topic name Kafka
//! cannot take (refused before sending, or by the brokers when creating it), is an
//! [`InvalidMessage`](PublishErrorKind::InvalidMessage) (dead-lettered at once); no delivery
//! report within `message.timeout.ms` (an unknown topic, a broker down) is a
//! [`Timeout`](PublishErrorKind::Timeout), retried without counting an attempt; a broker that
//! cannot be reached, an authorization or authentication it refuses (an ACL withdrawn, a
//! credential rotated), or a topic it does not create for the deployment's reasons (no
//! permission, its policy) is [`Unavailable`](PublishErrorKind::Unavailable), retried without
//! counting too. `Debug` hides the value of every property that may hold a secret
//! (passwords, client secrets, inline keys and certificates).

use std::collections::HashSet;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use rdkafka::ClientConfig;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord, Producer};
use rdkafka::util::Timeout;

use crate::error::Error;
use crate::message::OutboxMessage;
use crate::publisher::{
    Ack, BrokerHealth, PublishError, PublishErrorKind, Publisher, Template, headers,
};

/// The rdkafka version this publisher is built on.
pub use rdkafka;

/// The default topic template.
pub const DEFAULT_TOPIC: &str = "outbox.{aggregate_type}";

/// How long the producer tries to deliver a record by default (`message.timeout.ms`): the
/// relay's default `publish-timeout`. Set it to yours with
/// [`with_message_timeout`](KafkaPublisher::with_message_timeout).
pub const DEFAULT_MESSAGE_TIMEOUT: Duration = Duration::from_secs(5);

/// The longest `message.timeout.ms` librdkafka takes (2^31 - 1 ms, about 24.9 days);
/// [`connect`](KafkaPublisher::connect) refuses a longer
/// [`with_message_timeout`](KafkaPublisher::with_message_timeout).
///
/// ```
/// use idempotency_outbox::publisher::kafka::{KafkaPublisher, MAX_MESSAGE_TIMEOUT};
/// use std::time::Duration;
///
/// let too_long = KafkaPublisher::new("127.0.0.1:9092")
///     .with_message_timeout(MAX_MESSAGE_TIMEOUT + Duration::from_millis(1));
/// assert!(too_long.connect().is_err());
/// ```
pub const MAX_MESSAGE_TIMEOUT: Duration = Duration::from_millis(i32::MAX as u64);

/// The longest topic name Kafka accepts.
const MAX_TOPIC_LEN: usize = 249;

/// A rendered topic Kafka cannot take.
#[derive(Debug, thiserror::Error)]
#[error(
    "the topic {topic:?} is not a Kafka topic name (1 to 249 of `a-z A-Z 0-9 . _ -`, not `.` or `..`)"
)]
struct BadTopic {
    topic: String,
}

/// Publishes to Kafka and awaits each record's delivery report.
///
/// ```no_run
/// # async fn demo() -> Result<(), idempotency_outbox::Error> {
/// use idempotency_outbox::publisher::kafka::KafkaPublisher;
///
/// let publisher = KafkaPublisher::new("127.0.0.1:9092")
///     .with_topic("billing.{aggregate_type}")?
///     .connect()?;
/// publisher.ensure_topic("billing.charge", 3).await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct KafkaPublisher {
    config: ClientConfig,
    topic: Template,
    destination: String,
    producer: Option<Arc<Producers>>,
    create: Option<Arc<TopicCreation>>,
    /// A [`with_message_timeout`](KafkaPublisher::with_message_timeout) over
    /// [`MAX_MESSAGE_TIMEOUT`], which `connect` refuses.
    too_long: Option<Duration>,
}

/// [`KafkaPublisher::with_topic_creation`]: the partition count, and the topics made sure of.
#[derive(Debug)]
struct TopicCreation {
    partitions: i32,
    known: Mutex<HashSet<String>>,
}

impl TopicCreation {
    fn is_known(&self, topic: &str) -> bool {
        match self.known.lock() {
            Ok(known) => known.contains(topic),
            Err(poisoned) => poisoned.into_inner().contains(topic),
        }
    }

    fn insert(&self, topic: String) {
        match self.known.lock() {
            Ok(mut known) => known.insert(topic),
            Err(poisoned) => poisoned.into_inner().insert(topic),
        };
    }
}

/// The producer in use, replaced when librdkafka declares it fatally failed (an idempotent
/// producer fenced after its records timed out, on brokers that cannot bump its epoch).
struct Producers {
    config: ClientConfig,
    current: RwLock<(u64, FutureProducer)>,
}

impl Producers {
    fn current(&self) -> (u64, FutureProducer) {
        match self.current.read() {
            Ok(current) => current.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    /// Replaces generation `failed` by a new producer, once however many publishes saw it fail.
    fn replace(&self, failed: u64) {
        let mut current = match self.current.write() {
            Ok(current) => current,
            Err(poisoned) => poisoned.into_inner(),
        };
        if current.0 != failed {
            return;
        }
        match self.config.create::<FutureProducer>() {
            Ok(producer) => {
                tracing::warn!(
                    generation = failed + 1,
                    "kafka producer failed fatally; replaced by a new one"
                );
                *current = (failed + 1, producer);
            }
            Err(error) => {
                let error = redacted(error);
                tracing::warn!(%error, "kafka producer could not be replaced");
            }
        }
    }
}

/// Whether a librdkafka property may hold a secret: a password or passphrase, a client secret,
/// a private key or a certificate given inline (`ssl.key.pem`, `ssl.certificate.pem`), or the
/// OAUTHBEARER configuration (`sasl.oauthbearer.config`, which may carry a client secret).
fn secret_property(key: &str) -> bool {
    let key = key.to_ascii_lowercase();
    [
        "password",
        "passphrase",
        "secret",
        "private",
        "pem",
        "oauthbearer.config",
        "token",
    ]
    .iter()
    .any(|part| key.contains(part))
}

/// The properties of a configuration as `Debug` shows them, each secret one's value hidden.
struct Properties<'a>(&'a ClientConfig);

impl std::fmt::Debug for Properties<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_map()
            .entries(self.0.config_map().into_iter().map(|(key, value)| {
                (
                    key,
                    if secret_property(key) {
                        "<redacted>"
                    } else {
                        value
                    },
                )
            }))
            .finish()
    }
}

impl std::fmt::Debug for KafkaPublisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KafkaPublisher")
            .field("config", &Properties(&self.config))
            .field("topic", &self.topic)
            .field("destination", &self.destination)
            .field("connected", &self.producer.is_some())
            .field(
                "create_partitions",
                &self.create.as_ref().map(|c| c.partitions),
            )
            .field("message_timeout_refused", &self.too_long)
            .finish()
    }
}

impl KafkaPublisher {
    /// A publisher for the brokers `bootstrap_servers` (`host:port[,host:port...]`), with the
    /// default topic template, an idempotent producer, `acks=all` and
    /// [`DEFAULT_MESSAGE_TIMEOUT`]. Nothing connects before [`connect`](Self::connect).
    pub fn new(bootstrap_servers: &str) -> Self {
        let mut config = ClientConfig::new();
        config
            .set("bootstrap.servers", bootstrap_servers)
            .set("enable.idempotence", "true")
            .set("acks", "all")
            .set(
                "message.timeout.ms",
                DEFAULT_MESSAGE_TIMEOUT.as_millis().to_string(),
            );
        Self {
            config,
            topic: Template::aggregate("outbox."),
            destination: "kafka".to_owned(),
            producer: None,
            create: None,
            too_long: None,
        }
    }

    /// Sets the topic template (placeholders `{aggregate_type}`, `{aggregate_id}`,
    /// `{event_type}`). Keep `{aggregate_id}` out of it unless every aggregate has a topic:
    /// order holds within a partition.
    pub fn with_topic(mut self, template: &str) -> Result<Self, Error> {
        self.topic = Template::parse(template)?;
        Ok(self)
    }

    /// How long the producer tries to deliver one record (`message.timeout.ms`, librdkafka's
    /// retries included) before the publish fails with `Timeout`. Keep it at most the relay's
    /// `publish-timeout`, so a record the relay gave up on is not delivered later beside its
    /// republished copy, and at most [`MAX_MESSAGE_TIMEOUT`]: [`connect`](Self::connect)
    /// refuses a longer one.
    #[must_use]
    pub fn with_message_timeout(mut self, timeout: Duration) -> Self {
        self.too_long = (timeout > MAX_MESSAGE_TIMEOUT).then_some(timeout);
        let millis = timeout.min(MAX_MESSAGE_TIMEOUT).as_millis().max(1);
        self.config.remove("delivery.timeout.ms"); // its alias: one name holds it
        self.config.set("message.timeout.ms", millis.to_string());
        self
    }

    /// Sets any librdkafka property (`linger.ms`, `compression.type`, `security.protocol`...).
    /// `enable.idempotence` and `acks` may be changed too: then the guarantees above are yours.
    /// The value goes to librdkafka as it is: it reads integers into 32 bits, so a
    /// `message.timeout.ms` over 2^31 - 1 wraps instead of being refused (prefer
    /// [`with_message_timeout`](Self::with_message_timeout), which checks it).
    #[must_use]
    pub fn with_property(mut self, key: &str, value: &str) -> Self {
        if matches!(key, "message.timeout.ms" | "delivery.timeout.ms") {
            // The caller's own value replaces the one `with_message_timeout` refused; the
            // alias is dropped so that one name holds it.
            self.too_long = None;
            self.config.remove("message.timeout.ms");
            self.config.remove("delivery.timeout.ms");
        }
        self.config.set(key, value);
        self
    }

    /// Makes sure each topic exists before the first record to it, creating it with
    /// `partitions` partitions when missing ([`ensure_topic`](Self::ensure_topic), once per
    /// topic and publisher, clones included): for brokers that do not create topics on first
    /// use. A topic the brokers do not create is a publish failure the relay retries
    /// ([`Unavailable`](PublishErrorKind::Unavailable): no permission, their policy), unless
    /// they refuse its name ([`InvalidMessage`](PublishErrorKind::InvalidMessage): two names
    /// alike once `.` and `_` are one). Off by default.
    #[must_use]
    pub fn with_topic_creation(mut self, partitions: i32) -> Self {
        self.create = Some(Arc::new(TopicCreation {
            partitions,
            known: Mutex::new(HashSet::new()),
        }));
        self
    }

    /// Sets the metrics label (default `kafka`).
    #[must_use]
    pub fn with_destination(mut self, destination: impl Into<String>) -> Self {
        self.destination = destination.into();
        self
    }

    /// Creates the producer. Fails on a property librdkafka refuses, naming it; connects to
    /// the brokers in the background (a broker down shows as publishes that time out).
    pub fn connect(mut self) -> Result<Self, Error> {
        if let Some(asked) = self.too_long {
            // librdkafka would read a wrapped 32-bit value, not refuse it.
            return Err(Error::invalid_config(format!(
                "the message timeout ({asked:?}) is longer than librdkafka's \
                 message.timeout.ms takes ({MAX_MESSAGE_TIMEOUT:?})"
            )));
        }
        let producer: FutureProducer = self.config.create().map_err(setup)?;
        self.producer = Some(Arc::new(Producers {
            config: self.config.clone(),
            current: RwLock::new((0, producer)),
        }));
        Ok(self)
    }

    /// The topic `message` is published to.
    pub fn topic(&self, message: &OutboxMessage) -> String {
        self.topic.render(message)
    }

    /// Makes sure topic `name` exists, creating it with `partitions` partitions (replication
    /// factor 1 on a one-broker cluster, else the broker's default) when it is missing; an
    /// existing topic is left as it is. Kafka brokers that create topics on first use do not
    /// need it; brokers that do not (tansu) time out on records to an unknown topic.
    pub async fn ensure_topic(&self, name: &str, partitions: i32) -> Result<(), Error> {
        let admin: AdminClient<DefaultClientContext> = self.config.create().map_err(setup)?;
        let topic = NewTopic::new(name, partitions, TopicReplication::Fixed(-1));
        let options = AdminOptions::new().operation_timeout(Some(Duration::from_secs(10)));
        let results = admin
            .create_topics([&topic], &options)
            .await
            .map_err(setup)?;
        for result in results {
            match result {
                Ok(_) | Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
                Err((topic, code)) => return Err(not_created(code).context(&topic)),
            }
        }
        Ok(())
    }

    /// Asks the brokers for the cluster's metadata within `timeout` (at most
    /// [`MAX_MESSAGE_TIMEOUT`]: librdkafka takes 32-bit milliseconds): whether they answer.
    pub async fn check_connection(&self, timeout: Duration) -> Result<(), Error> {
        let timeout = timeout.min(MAX_MESSAGE_TIMEOUT);
        let (_, producer) = self.producers()?.current();
        tokio::task::spawn_blocking(move || {
            producer
                .client()
                .fetch_metadata(None, Timeout::After(timeout))
                .map(|_| ())
        })
        .await
        .map_err(|e| setup_boxed(Box::new(e)))?
        .map_err(setup)
    }

    fn producers(&self) -> Result<&Producers, Error> {
        self.producer.as_deref().ok_or_else(|| {
            Error::invalid_config("KafkaPublisher::connect was not called before publishing")
        })
    }
}

trait Context {
    fn context(self, topic: &str) -> Self;
}

impl Context for Error {
    fn context(self, topic: &str) -> Self {
        match self {
            Error::Publisher(error) => Error::Publisher(PublishError::new(
                error.kind(),
                format!("topic {topic}: {}", source_text(&error)),
            )),
            other => other,
        }
    }
}

fn source_text(error: &PublishError) -> String {
    std::error::Error::source(error).map_or_else(|| error.to_string(), ToString::to_string)
}

/// Why the brokers did not create a topic: a name they refuse (`InvalidTopic`: two topics
/// whose names differ only by `.` against `_`, which Kafka takes for one) is the message's, an
/// [`InvalidMessage`](PublishErrorKind::InvalidMessage); anything else (no permission to
/// create, a replication factor or policy the cluster refuses) is the deployment's, retried
/// without counting as an unreachable broker is.
fn not_created(code: RDKafkaErrorCode) -> Error {
    let kind = match code {
        RDKafkaErrorCode::InvalidTopic => PublishErrorKind::InvalidMessage,
        _ => PublishErrorKind::Unavailable,
    };
    Error::Publisher(PublishError::new(kind, KafkaError::AdminOp(code)))
}

/// The publish error of a topic [`KafkaPublisher::ensure_topic`] could not create: the
/// creation's own kind, with the topic named.
fn creation_failed(topic: &str, error: Error) -> PublishError {
    match error {
        Error::Publisher(error) => PublishError::new(
            error.kind(),
            format!(
                "topic {topic} could not be created: {}",
                source_text(&error)
            ),
        ),
        other => PublishError::new(PublishErrorKind::Unavailable, other.to_string()),
    }
}

fn setup(error: KafkaError) -> Error {
    setup_boxed(Box::new(redacted(error)))
}

/// `error` without the value of a secret property librdkafka refused: its text names the
/// property, its reason and the value given (a private key inline, a password), which would go
/// into the caller's logs. librdkafka's reason may quote the value, or a cut part of it: a
/// reason holding the value's first characters is replaced whole. A value with a NUL byte is
/// refused before librdkafka sees it, in an error whose `Debug` holds the value's bytes and not
/// the property's name: it is replaced too.
fn redacted(error: KafkaError) -> KafkaError {
    match error {
        KafkaError::ClientConfig(result, reason, key, value)
            if secret_property(&key) && !value.is_empty() =>
        {
            let start: String = value.chars().take(8).collect();
            let reason = if reason.contains(&start) {
                "the value was refused".to_owned()
            } else {
                reason
            };
            KafkaError::ClientConfig(result, reason, key, "<redacted>".to_owned())
        }
        KafkaError::Nul(_) => KafkaError::ClientCreation(
            "a property's value holds a NUL byte (value not shown)".to_owned(),
        ),
        other => other,
    }
}

fn setup_boxed(error: Box<dyn std::error::Error + Send + Sync>) -> Error {
    Error::Publisher(PublishError::new(PublishErrorKind::Unavailable, error))
}

fn valid_topic(topic: &str) -> bool {
    !topic.is_empty()
        && topic.len() <= MAX_TOPIC_LEN
        && topic != "."
        && topic != ".."
        && topic
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

fn headers_of(message: &OutboxMessage) -> OwnedHeaders {
    let id = message.id.hyphenated().to_string();
    let sequence = message.sequence.map(|s| s.to_string());
    let mut map = OwnedHeaders::new_with_capacity(message.headers.len() + 5);
    // Kafka keeps every header given (librdkafka appends): an event's own header of an
    // outbox name would be sent beside the outbox's, and first.
    for (name, value) in &message.headers {
        if headers::is_outbox_name(name) {
            continue;
        }
        map = map.insert(Header {
            key: name,
            value: Some(value.as_bytes()),
        });
    }
    map = map
        .insert(Header {
            key: headers::ID,
            value: Some(id.as_bytes()),
        })
        .insert(Header {
            key: headers::AGGREGATE_TYPE,
            value: Some(message.aggregate_type.as_bytes()),
        })
        .insert(Header {
            key: headers::AGGREGATE_ID,
            value: Some(message.aggregate_id.as_bytes()),
        })
        .insert(Header {
            key: headers::EVENT_TYPE,
            value: Some(message.event_type.as_bytes()),
        });
    if let Some(sequence) = &sequence {
        map = map.insert(Header {
            key: headers::SEQUENCE,
            value: Some(sequence.as_bytes()),
        });
    }
    map
}

fn kind(error: &KafkaError) -> PublishErrorKind {
    match error.rdkafka_error_code() {
        // Over the producer's `message.max.bytes` or the broker's limit: never fits.
        Some(
            RDKafkaErrorCode::MessageSizeTooLarge
            | RDKafkaErrorCode::InvalidMessageSize
            | RDKafkaErrorCode::InvalidRecord
            | RDKafkaErrorCode::InvalidTopic,
        ) => PublishErrorKind::InvalidMessage,
        Some(RDKafkaErrorCode::MessageTimedOut | RDKafkaErrorCode::RequestTimedOut) => {
            PublishErrorKind::Timeout
        }
        // An authorization or authentication the brokers refuse (an ACL withdrawn, a password
        // rotated) is the deployment's, not the message's: every event would be refused alike,
        // so counting it would dead-letter each aggregate's head and let its later events out
        // past it once the access is back. Retried without counting, as RabbitMQ's 403 is.
        Some(
            RDKafkaErrorCode::QueueFull
            | RDKafkaErrorCode::TopicAuthorizationFailed
            | RDKafkaErrorCode::ClusterAuthorizationFailed
            | RDKafkaErrorCode::TransactionalIdAuthorizationFailed
            | RDKafkaErrorCode::SaslAuthenticationFailed
            | RDKafkaErrorCode::Authentication
            | RDKafkaErrorCode::AllBrokersDown
            | RDKafkaErrorCode::BrokerTransportFailure
            | RDKafkaErrorCode::UnknownTopic
            | RDKafkaErrorCode::UnknownTopicOrPartition
            | RDKafkaErrorCode::LeaderNotAvailable
            | RDKafkaErrorCode::NotLeaderForPartition
            | RDKafkaErrorCode::NotEnoughReplicas
            | RDKafkaErrorCode::NotEnoughReplicasAfterAppend,
        ) => PublishErrorKind::Unavailable,
        _ => PublishErrorKind::Rejected,
    }
}

impl Publisher for KafkaPublisher {
    fn destination(&self) -> &str {
        &self.destination
    }

    /// `Up` when the brokers answer a metadata request within a second.
    async fn health(&self) -> BrokerHealth {
        match self.check_connection(Duration::from_secs(1)).await {
            Ok(()) => BrokerHealth::Up,
            Err(error) => BrokerHealth::Down(idempotency_core::error_chain(&error)),
        }
    }

    async fn publish(&self, message: &OutboxMessage) -> Result<Ack, PublishError> {
        let producers = self
            .producers()
            .map_err(|e| PublishError::new(PublishErrorKind::Other, e.to_string()))?;
        let (generation, producer) = producers.current();
        let topic = self.topic.render(message);
        if !valid_topic(&topic) {
            return Err(PublishError::new(
                PublishErrorKind::InvalidMessage,
                BadTopic { topic },
            ));
        }
        if let Some(create) = &self.create
            && !create.is_known(&topic)
        {
            self.ensure_topic(&topic, create.partitions)
                .await
                .map_err(|e| creation_failed(&topic, e))?;
            create.insert(topic.clone());
        }
        let record = FutureRecord::to(&topic)
            .key(message.aggregate_id.as_bytes())
            .payload(message.payload.as_bytes())
            .headers(headers_of(message));
        // A full local queue waits for room (bounded by the relay's `publish-timeout`).
        match producer.send(record, Timeout::Never).await {
            Ok(_) => Ok(Ack { duplicate: false }),
            Err((error, _)) => {
                if producer.client().fatal_error().is_some()
                    || error.rdkafka_error_code() == Some(RDKafkaErrorCode::ProducerFenced)
                {
                    // The producer is done for; the message is not at fault.
                    producers.replace(generation);
                    return Err(PublishError::new(PublishErrorKind::Unavailable, error));
                }
                Err(PublishError::new(kind(&error), error))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An ACL withdrawn or a credential rotated refuses every event alike: retried without
    /// counting, like an unreachable broker (before: `Rejected`, counted, so the head of each
    /// aggregate was dead-lettered after `max-attempts`).
    #[test]
    fn an_authorization_refused_is_the_brokers_not_the_messages() {
        for code in [
            RDKafkaErrorCode::TopicAuthorizationFailed,
            RDKafkaErrorCode::ClusterAuthorizationFailed,
            RDKafkaErrorCode::TransactionalIdAuthorizationFailed,
            RDKafkaErrorCode::SaslAuthenticationFailed,
            RDKafkaErrorCode::Authentication,
        ] {
            let kind = kind(&KafkaError::MessageProduction(code));
            assert_eq!(kind, PublishErrorKind::Unavailable, "{code:?}");
            assert!(kind.is_transient(), "{code:?}");
        }
        // What the message itself cannot be is still its own.
        assert_eq!(
            kind(&KafkaError::MessageProduction(
                RDKafkaErrorCode::InvalidRecord
            )),
            PublishErrorKind::InvalidMessage
        );
    }

    /// A topic the brokers refuse to create under its name is the message's (dead-lettered at
    /// once, as the module says of a name Kafka cannot take); one they do not create for the
    /// deployment's reasons is retried without counting (before: every creation failure was
    /// `Unavailable`, so an event whose topic name collides was retried for ever).
    #[test]
    fn a_topic_name_the_brokers_refuse_is_the_messages() {
        let refused = creation_failed("outbox.a_b", not_created(RDKafkaErrorCode::InvalidTopic));
        assert_eq!(refused.kind(), PublishErrorKind::InvalidMessage);
        let text = source_text(&refused);
        assert!(text.contains("outbox.a_b"), "{text}");
        for code in [
            RDKafkaErrorCode::TopicAuthorizationFailed,
            RDKafkaErrorCode::PolicyViolation,
            RDKafkaErrorCode::InvalidReplicationFactor,
        ] {
            let failed = creation_failed("outbox.t", not_created(code));
            assert_eq!(failed.kind(), PublishErrorKind::Unavailable, "{code:?}");
        }
    }

    /// `Debug` shows the properties, never a secret one's value: rdkafka hides five names, not
    /// a private key given inline (`ssl.key.pem`) nor the OAUTHBEARER configuration.
    #[test]
    fn debug_hides_every_secret_property() {
        let publisher = KafkaPublisher::new("127.0.0.1:1")
            .with_property("ssl.key.pem", "SECRET-KEY")
            .with_property("ssl.certificate.pem", "SECRET-CERT")
            .with_property("sasl.oauthbearer.config", "clientSecret=SECRET-OAUTH")
            .with_property("sasl.password", "SECRET-PASSWORD")
            .with_property("ssl.key.password", "SECRET-KEY-PASSWORD")
            .with_property("sasl.oauthbearer.client.secret", "SECRET-CLIENT")
            .with_property(
                "sasl.oauthbearer.assertion.private.key.passphrase",
                "SECRET-PASSPHRASE",
            )
            .with_property("linger.ms", "7");
        let debug = format!("{publisher:?}");
        assert!(!debug.contains("SECRET"), "{debug}");
        assert!(debug.contains("ssl.key.pem"), "{debug}");
        assert!(debug.contains("\"linger.ms\": \"7\""), "{debug}");
        assert!(debug.contains("127.0.0.1:1"), "{debug}");
    }

    /// A secret property librdkafka refuses at `connect` (unknown to it, or `ssl.key.pem` on a
    /// build without OpenSSL) is named in the error, its value is not (before: librdkafka's
    /// text ends with the value given, a private key inline in the caller's logs). A refused
    /// ordinary property still shows its value.
    #[test]
    fn a_refused_secret_property_is_named_without_its_value() {
        for (key, value) in [
            ("ssl.key.pem", "-----BEGIN PRIVATE KEY----- SECRET-KEY"),
            ("my.client.secret", "SECRET-UNKNOWN"),
            ("sasl.password.file", "SECRET-FILE"),
        ] {
            let Err(error) = KafkaPublisher::new("127.0.0.1:1")
                .with_property(key, value)
                .connect()
            else {
                // Taken (a build with OpenSSL takes an inline key until it connects).
                continue;
            };
            let text = format!("{:?} {}", error, idempotency_core::error_chain(&error));
            assert!(!text.contains("SECRET"), "{text}");
            assert!(text.contains(key), "{text}");
        }
        let error = KafkaPublisher::new("127.0.0.1:1")
            .with_property("linger.ms", "soon")
            .connect()
            .map(|_| ())
            .unwrap_err();
        let text = idempotency_core::error_chain(&error);
        assert!(text.contains("soon"), "{text}");
        let error = KafkaPublisher::new("127.0.0.1:1")
            .with_property("sasl.password", "SECRET\0PASSWORD")
            .connect()
            .map(|_| ())
            .unwrap_err();
        let text = format!("{error:?} {}", idempotency_core::error_chain(&error));
        assert!(!text.contains("83, 69, 67"), "{text}");
        assert!(text.contains("NUL"), "{text}");
    }

    /// librdkafka reads `message.timeout.ms` into a 32-bit int: 50 days (4,320,000,000 ms)
    /// wrapped to about 7 hours and was taken. A timeout over [`MAX_MESSAGE_TIMEOUT`] is
    /// refused at `connect`, naming the property; the longest one it takes is taken.
    #[test]
    fn a_message_timeout_longer_than_librdkafka_takes_is_refused_at_connect() {
        let day = Duration::from_secs(24 * 3600);
        for too_long in [50 * day, MAX_MESSAGE_TIMEOUT + Duration::from_millis(1)] {
            let error = KafkaPublisher::new("127.0.0.1:1")
                .with_message_timeout(too_long)
                .connect()
                .map(|_| ())
                .unwrap_err();
            let Error::InvalidConfig { reason: text } = error else {
                panic!("{too_long:?}: {error}");
            };
            assert!(text.contains("message.timeout.ms"), "{too_long:?}: {text}");
        }
        KafkaPublisher::new("127.0.0.1:1")
            .with_message_timeout(MAX_MESSAGE_TIMEOUT)
            .connect()
            .unwrap();
        // The caller's own value, under either name, replaces the refused one.
        for name in ["message.timeout.ms", "delivery.timeout.ms"] {
            KafkaPublisher::new("127.0.0.1:1")
                .with_message_timeout(50 * day)
                .with_property(name, "60000")
                .connect()
                .unwrap();
        }
    }

    #[test]
    fn topic_names_are_checked_as_kafka_does() {
        for good in ["outbox.order", "a", "A-b_c.9", &"t".repeat(249)] {
            assert!(valid_topic(good), "{good}");
        }
        for bad in ["", ".", "..", "has space", "slash/y", "ü", &"t".repeat(250)] {
            assert!(!valid_topic(bad), "{bad}");
        }
    }

    /// librdkafka appends every header it is given: an event's own header of an outbox name
    /// (any case) would go out beside the outbox's, and before it.
    #[test]
    fn the_outbox_names_are_sent_once_with_the_outboxs_values() {
        use rdkafka::message::Headers as _;
        let own = [
            (headers::ID, "upstream"),
            ("outbox-sequence", "99"),
            ("OUTBOX-EVENT-TYPE", "forged"),
            ("x-keep", "1"),
        ];
        let message = crate::publisher::test_message(&own, None);
        let sent = headers_of(&message);
        let pairs: Vec<(String, String)> = sent
            .iter()
            .map(|h| {
                let value = String::from_utf8(h.value.unwrap_or_default().to_vec()).unwrap();
                (h.key.to_owned(), value)
            })
            .collect();
        let named = |name: &str| -> Vec<&str> {
            pairs
                .iter()
                .filter(|(key, _)| key.eq_ignore_ascii_case(name))
                .map(|(_, value)| value.as_str())
                .collect()
        };
        assert_eq!(named(headers::ID), [message.id.to_string()]);
        assert_eq!(named(headers::EVENT_TYPE), ["OrderPlaced"]);
        assert!(named(headers::SEQUENCE).is_empty(), "{pairs:?}");
        assert_eq!(named("x-keep"), ["1"]);
    }

    #[test]
    fn size_and_name_failures_are_permanent_and_broker_ones_transient() {
        let code = |c| kind(&KafkaError::MessageProduction(c));
        assert_eq!(
            code(RDKafkaErrorCode::MessageSizeTooLarge),
            PublishErrorKind::InvalidMessage
        );
        assert_eq!(
            code(RDKafkaErrorCode::MessageTimedOut),
            PublishErrorKind::Timeout
        );
        assert_eq!(
            code(RDKafkaErrorCode::AllBrokersDown),
            PublishErrorKind::Unavailable
        );
        assert_eq!(
            code(RDKafkaErrorCode::UnknownTopicOrPartition),
            PublishErrorKind::Unavailable
        );
        assert!(code(RDKafkaErrorCode::AllBrokersDown).is_transient());
    }
}
