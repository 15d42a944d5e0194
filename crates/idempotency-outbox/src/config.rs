//! Configuration types for the outbox, its relay, retention and the consumer inbox.
//!
//! They deserialize from any serde format with kebab-case keys and human-readable durations
//! (`250ms`, `5s`, `7d`, via `humantime`), like the idempotency configuration.
//!
//! ```
//! use idempotency_outbox::config::{OutboxConfig, Ordering, WakeUp};
//!
//! let config: OutboxConfig = serde_json::from_value(serde_json::json!({
//!     "table-name": "billing.outbox",
//!     "ordering": "unordered",
//!     "relay": { "workers": 4, "batch-size": 500, "wake-up": "poll", "poll-interval": "250ms" },
//!     "retention": { "published": "3d" }
//! }))?;
//! assert_eq!(config.ordering, Ordering::Unordered);
//! assert_eq!(config.relay.wake_up, WakeUp::Poll);
//! assert_eq!(config.relay.max_attempts, 10);
//! # Ok::<(), serde_json::Error>(())
//! ```

use std::time::Duration;

use idempotency_core::config::SchemaConfig;
use serde::{Deserialize, Serialize};

use crate::error::Error;

const DAY: u64 = 24 * 60 * 60;

/// The smallest `relay.lease-margin`: after the slowest publish (`publish-timeout`) the
/// worker still marks the batch, up to three tries 100 ms and 200 ms apart. A lease that ends
/// first lets another worker publish the batch again while it is being marked.
pub const MIN_LEASE_MARGIN: Duration = Duration::from_secs(1);

/// The longest any of the relay's durations may be (365 days): the lease, the republish
/// window and the retry horizon add and multiply them, and a value near `Duration::MAX`
/// would overflow (or give a lease no database interval can hold).
pub const MAX_RELAY_DURATION: Duration = Duration::from_secs(365 * 24 * 60 * 60);

/// The `outbox` section.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "kebab-case", deny_unknown_fields)]
pub struct OutboxConfig {
    /// Table name, optionally schema-qualified. Default `outbox`; the per-aggregate counters
    /// live in `<table>_sequences` next to it.
    pub table_name: String,
    /// Schema management at startup: `create`, `validate` (default) or `none`.
    pub schema: SchemaConfig,
    /// `ordered` (default) or `unordered`.
    pub ordering: Ordering,
    /// Channel that enqueue notifies (`pg_notify`, delivered at commit) and relays listen on.
    /// `null` sends no notification. Default `outbox`.
    pub notify_channel: Option<String>,
    /// PostgreSQL: an enqueue notifies only when no enqueue through the same outbox (and its
    /// clones) notified within this window; `0s` notifies on every enqueue. A commit that
    /// notifies holds PostgreSQL's database-wide notification lock until its commit record is
    /// flushed, so notifying commits run one at a time: with a notification on every enqueue,
    /// enqueuing transactions cannot commit faster than one disk flush each. The rows an
    /// enqueue left unnotified are found by the relay's next claim: the next notification's,
    /// the look-again of [`RelayConfig::linger`], or at the latest `poll-interval`. Default `5ms`.
    #[serde(with = "humantime_serde")]
    pub notify_interval: Duration,
    /// The relay workers.
    pub relay: RelayConfig,
    /// Deleting published and dead-lettered rows.
    pub retention: RetentionConfig,
    /// A time-partitioned table (PostgreSQL only): retention drops whole partitions instead
    /// of deleting their rows. Off by default (one plain table).
    pub partitioning: PartitioningConfig,
    /// The broker the relay publishes to, built from configuration by
    /// [`ConfiguredPublisher::from_config`](crate::publisher::ConfiguredPublisher::from_config)
    /// (the `idempotency` facade does so at start-up). `null` (default): the application
    /// gives its own publisher.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub publisher: Option<PublisherConfig>,
    /// What the `idempotency` facade's readiness check asks of the outbox.
    pub health: HealthConfig,
}

/// `outbox.publisher`: `logging`, or a table with one of the keys `nats`, `rabbitmq`, `kafka`.
///
/// ```
/// use idempotency_outbox::config::{OutboxConfig, PublisherConfig};
///
/// let config: OutboxConfig = serde_json::from_value(serde_json::json!({
///     "publisher": { "nats": {
///         "url": "nats://127.0.0.1:4222",
///         "subject": "orders.{aggregate_type}.{event_type}",
///         "stream": { "name": "ORDERS", "create": true }
///     } }
/// }))?;
/// let Some(PublisherConfig::Nats(nats)) = &config.publisher else { panic!() };
/// assert!(nats.stream.create);
/// let logging: OutboxConfig = serde_json::from_value(serde_json::json!({ "publisher": "logging" }))?;
/// assert_eq!(logging.publisher, Some(PublisherConfig::Logging));
/// # Ok::<(), serde_json::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PublisherConfig {
    /// NATS JetStream (feature `nats`).
    Nats(NatsPublisherConfig),
    /// RabbitMQ with publisher confirms (feature `rabbitmq`).
    Rabbitmq(RabbitMqPublisherConfig),
    /// Kafka with an idempotent producer and `acks=all` (feature `kafka`).
    Kafka(KafkaPublisherConfig),
    /// Every message logged with `tracing` and confirmed: nothing leaves the process.
    Logging,
}

/// The default NATS subject template.
pub const DEFAULT_NATS_SUBJECT: &str = "outbox.{aggregate_type}.{event_type}";

/// The default RabbitMQ routing-key template.
pub const DEFAULT_ROUTING_KEY: &str = "{aggregate_type}.{event_type}";

/// `outbox.publisher.nats`.
#[derive(Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "kebab-case", deny_unknown_fields)]
pub struct NatsPublisherConfig {
    /// The server, `nats://host:4222`. Required.
    pub url: String,
    /// The subject template (placeholders `{aggregate_type}`, `{aggregate_id}`,
    /// `{event_type}`). Default `outbox.{aggregate_type}.{event_type}`.
    pub subject: String,
    /// The JetStream stream that stores the subjects.
    pub stream: NatsStreamConfig,
}

/// The URL without its password or token ([`redact_url`](idempotency_core::redact_url)):
/// settings are printed with `{:?}` in logs and traces.
impl std::fmt::Debug for NatsPublisherConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let Self {
            url,
            subject,
            stream,
        } = self;
        f.debug_struct("NatsPublisherConfig")
            .field("url", &idempotency_core::redact_url(url))
            .field("subject", subject)
            .field("stream", stream)
            .finish()
    }
}

impl Default for NatsPublisherConfig {
    fn default() -> Self {
        Self {
            url: String::new(),
            subject: DEFAULT_NATS_SUBJECT.to_owned(),
            stream: NatsStreamConfig::default(),
        }
    }
}

/// `outbox.publisher.nats.stream`: checked at start-up (it must exist, capture the subjects
/// when `create`, and deduplicate message ids at least as long as the relay may republish).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "kebab-case", deny_unknown_fields)]
pub struct NatsStreamConfig {
    /// The stream's name. Required.
    pub name: String,
    /// Create the stream when it is missing, and add the subject filter to it when it lacks
    /// it. Default `false`: the stream must exist.
    pub create: bool,
    /// The duplicate window of a stream `create` makes. Default (`null`): the relay's
    /// republish window (`relay.publish-timeout + relay.lease-margin + relay.backoff.max`).
    /// Only with `create: true`.
    #[serde(with = "humantime_serde")]
    pub duplicate_window: Option<Duration>,
}

/// `outbox.publisher.rabbitmq`.
#[derive(Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "kebab-case", deny_unknown_fields)]
pub struct RabbitMqPublisherConfig {
    /// The broker, `amqp://user:password@host:5672/%2f`. Required.
    pub url: String,
    /// The exchange. Default `""`, the default exchange (routes by queue name).
    pub exchange: String,
    /// The routing-key template. Default `{aggregate_type}.{event_type}`.
    pub routing_key: String,
    /// Declare `exchange` (durable, type `topic`) at start-up. Default `false`.
    pub create: bool,
    /// How many channels publish at once, each one publish from `basic.publish` to its
    /// confirm. Default (`null`): the publisher's default, 32. A relay has up to 2 ×
    /// `relay.workers` × `relay.batch-size` publishes in flight, and a publish waiting for a
    /// channel spends its `relay.publish-timeout` waiting: raise it toward that number when
    /// the broker confirms slowly. At least 1, and at most the broker's `channel_max`
    /// (checked at start-up).
    pub channels: Option<usize>,
}

/// The URL without its password or token ([`redact_url`](idempotency_core::redact_url)):
/// settings are printed with `{:?}` in logs and traces.
impl std::fmt::Debug for RabbitMqPublisherConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let Self {
            url,
            exchange,
            routing_key,
            create,
            channels,
        } = self;
        f.debug_struct("RabbitMqPublisherConfig")
            .field("url", &idempotency_core::redact_url(url))
            .field("exchange", exchange)
            .field("routing_key", routing_key)
            .field("create", create)
            .field("channels", channels)
            .finish()
    }
}

impl Default for RabbitMqPublisherConfig {
    fn default() -> Self {
        Self {
            url: String::new(),
            exchange: String::new(),
            routing_key: DEFAULT_ROUTING_KEY.to_owned(),
            create: false,
            channels: None,
        }
    }
}

/// The default Kafka topic template.
pub const DEFAULT_KAFKA_TOPIC: &str = "outbox.{aggregate_type}";

/// The default partition count of a topic `outbox.publisher.kafka.create` makes.
pub const DEFAULT_KAFKA_PARTITIONS: i32 = 3;

/// `outbox.publisher.kafka`.
///
/// ```
/// use std::time::Duration;
/// use idempotency_outbox::config::{OutboxConfig, PublisherConfig};
///
/// let config: OutboxConfig = serde_json::from_value(serde_json::json!({
///     "publisher": { "kafka": {
///         "brokers": "127.0.0.1:9092",
///         "topic": "billing.{aggregate_type}",
///         "create": true,
///         "partitions": 6,
///         "message-timeout": "3s"
///     } }
/// }))?;
/// let Some(PublisherConfig::Kafka(kafka)) = &config.publisher else { panic!() };
/// assert_eq!(kafka.message_timeout, Some(Duration::from_secs(3)));
/// # Ok::<(), serde_json::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "kebab-case", deny_unknown_fields)]
pub struct KafkaPublisherConfig {
    /// The bootstrap brokers, `host:port[,host:port...]`. Required.
    pub brokers: String,
    /// The topic template (placeholders `{aggregate_type}`, `{aggregate_id}`,
    /// `{event_type}`). Default `outbox.{aggregate_type}`. The record key is the aggregate id,
    /// so an aggregate's events share a partition whatever the template.
    pub topic: String,
    /// Create each topic the template renders when it is first published to (and a topic
    /// without placeholders at start-up), with `partitions` partitions; an existing topic is
    /// left as it is. For brokers that do not create topics on first use. Default `false`.
    pub create: bool,
    /// The partition count of a topic `create` makes. Default (`null`): `3`. Only with
    /// `create: true`.
    pub partitions: Option<i32>,
    /// How long the producer tries to deliver one record (`message.timeout.ms`). Default
    /// (`null`): the relay's `publish-timeout`; longer is refused (a record the relay gave up
    /// on could then be delivered after its republished copy).
    #[serde(with = "humantime_serde")]
    pub message_timeout: Option<Duration>,
}

impl Default for KafkaPublisherConfig {
    fn default() -> Self {
        Self {
            brokers: String::new(),
            topic: DEFAULT_KAFKA_TOPIC.to_owned(),
            create: false,
            partitions: None,
            message_timeout: None,
        }
    }
}

impl Default for OutboxConfig {
    fn default() -> Self {
        Self {
            table_name: "outbox".to_owned(),
            schema: SchemaConfig::default(),
            ordering: Ordering::Ordered,
            notify_channel: Some("outbox".to_owned()),
            notify_interval: Duration::from_millis(5),
            relay: RelayConfig::default(),
            retention: RetentionConfig::default(),
            partitioning: PartitioningConfig::default(),
            publisher: None,
            health: HealthConfig::default(),
        }
    }
}

/// `outbox.health`: when the outbox's backlog makes the service unready.
///
/// ```
/// use std::time::Duration;
/// use idempotency_outbox::config::OutboxConfig;
///
/// let config: OutboxConfig = serde_json::from_value(serde_json::json!({
///     "health": { "max-pending-age": "2m" }
/// }))?;
/// assert_eq!(config.health.max_pending_age, Some(Duration::from_secs(120)));
/// config.health.validate()?;
/// let zero: OutboxConfig = serde_json::from_value(serde_json::json!({
///     "health": { "max-pending-age": "0s" }
/// }))?;
/// assert!(zero.health.validate().is_err());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "kebab-case", deny_unknown_fields)]
pub struct HealthConfig {
    /// The readiness check fails (503) while the oldest pending event is older than this: a
    /// relay that stopped publishing, a broker outage that outlasted it, or an event a full
    /// destination holds back (see `relay.full-patience`). `null` reports
    /// the backlog without failing on it. Default `5m`, the threshold of the `OutboxRelayStuck`
    /// alert in `deploy/prometheus`.
    #[serde(with = "humantime_serde")]
    pub max_pending_age: Option<Duration>,
}

impl Default for HealthConfig {
    fn default() -> Self {
        Self {
            max_pending_age: Some(Duration::from_secs(5 * 60)),
        }
    }
}

impl HealthConfig {
    /// Refuses a zero `max-pending-age`: every event waits for its relay a moment, so the
    /// service would be unready whenever one is pending (`null` turns the check off).
    pub fn validate(&self) -> Result<(), Error> {
        if self.max_pending_age.is_some_and(|age| age.is_zero()) {
            return Err(Error::invalid_config(
                "health.max-pending-age must not be zero: every pending event would make the \
                 service unready; use null to report the backlog without failing on it",
            ));
        }
        Ok(())
    }
}

/// `outbox.partitioning`: the outbox table as a parent partitioned by `RANGE (created_at)`
/// into partitions of `interval` each (PostgreSQL only; SQLite and MySQL refuse it).
///
/// Partitions are aligned on multiples of `interval` since the Unix epoch (UTC): with `1d`,
/// one partition per UTC day. `ahead` partitions after the current one are created at schema
/// creation and by every retention pass, so an insert always finds its partition; a `DEFAULT`
/// partition catches rows anyway should maintenance fall behind. Retention then detaches and
/// drops a partition whose every row it would delete, and deletes in batches what remains
/// elsewhere.
///
/// ```
/// use std::time::Duration;
/// use idempotency_outbox::config::OutboxConfig;
///
/// let config: OutboxConfig = serde_json::from_value(serde_json::json!({
///     "partitioning": { "enabled": true, "interval": "1d", "ahead": 3 }
/// }))?;
/// assert_eq!(config.partitioning.interval, Duration::from_secs(86_400));
/// config.partitioning.validate()?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "kebab-case", deny_unknown_fields)]
pub struct PartitioningConfig {
    /// Whether the table is partitioned. Default `false`.
    pub enabled: bool,
    /// The time range of one partition: whole seconds, at least one minute. Default `1d`.
    #[serde(with = "humantime_serde")]
    pub interval: Duration,
    /// Partitions created ahead of the current one, at least 1. Default `3`.
    pub ahead: u32,
}

impl Default for PartitioningConfig {
    fn default() -> Self {
        Self {
            enabled: false,
            interval: Duration::from_secs(DAY),
            ahead: 3,
        }
    }
}

/// The shortest `partitioning.interval`: shorter partitions only multiply the partitions every
/// statement plans over.
pub const MIN_PARTITION_INTERVAL: Duration = Duration::from_secs(60);

/// The largest `partitioning.ahead`.
pub const MAX_PARTITIONS_AHEAD: u32 = 1000;

impl PartitioningConfig {
    /// Checks ranges when partitioning is on: an `interval` of whole seconds, at least
    /// [`MIN_PARTITION_INTERVAL`] (a zero interval is refused), and `ahead` in
    /// `1..=`[`MAX_PARTITIONS_AHEAD`].
    ///
    /// ```
    /// use std::time::Duration;
    /// use idempotency_outbox::config::PartitioningConfig;
    ///
    /// let zero = PartitioningConfig { enabled: true, interval: Duration::ZERO, ahead: 3 };
    /// assert!(zero.validate().unwrap_err().to_string().contains("partitioning.interval"));
    /// ```
    pub fn validate(&self) -> Result<(), Error> {
        if !self.enabled {
            return Ok(());
        }
        if self.interval.is_zero() {
            return Err(Error::invalid_config(
                "partitioning.interval must not be zero",
            ));
        }
        if self.interval.subsec_nanos() != 0 || self.interval < MIN_PARTITION_INTERVAL {
            return Err(Error::invalid_config(format!(
                "partitioning.interval ({}) must be whole seconds and at least {}",
                humantime_serde::re::humantime::format_duration(self.interval),
                humantime_serde::re::humantime::format_duration(MIN_PARTITION_INTERVAL),
            )));
        }
        if self.ahead == 0 || self.ahead > MAX_PARTITIONS_AHEAD {
            return Err(Error::invalid_config(format!(
                "partitioning.ahead must be 1..={MAX_PARTITIONS_AHEAD}, so that the next \
                 partition exists before its time begins"
            )));
        }
        Ok(())
    }
}

/// Whether events of one aggregate are published in commit order.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Ordering {
    /// Enqueue numbers each aggregate's events through a counter row locked until commit, so
    /// the sequence is the commit order; the relay keeps at most one message per aggregate in
    /// flight and a failing message holds back the later ones of its aggregate only.
    #[default]
    Ordered,
    /// No counter and no per-aggregate rule: any pending row may be published at any time.
    /// Higher throughput, for events whose consumers do not depend on order.
    Unordered,
}

/// How idle relay workers learn about new rows.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum WakeUp {
    /// `LISTEN` on the notify channel, debounced, with polling as the fallback.
    #[default]
    Listen,
    /// Poll every `poll-interval` only (for connection poolers that cannot `LISTEN`).
    Poll,
}

/// `outbox.relay`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "kebab-case", deny_unknown_fields)]
pub struct RelayConfig {
    /// Whether the application runs a relay. Default `true`.
    pub enabled: bool,
    /// Worker tasks in this process. Default `2`.
    pub workers: usize,
    /// Rows claimed per batch. Default `100`.
    pub batch_size: u32,
    /// How often an idle worker looks for due rows without a notification. Default `1s`.
    #[serde(with = "humantime_serde")]
    pub poll_interval: Duration,
    /// `listen` (default) or `poll`.
    pub wake_up: WakeUp,
    /// Notifications arriving within this window after a wake-up are coalesced into one
    /// more wake-up at its end. Default `5ms`.
    #[serde(with = "humantime_serde")]
    pub notify_debounce: Duration,
    /// A worker whose claim found rows, but fewer than a full batch, claims once more after
    /// this long before it waits for a notification; it keeps doing so while claims find rows.
    /// It picks up rows whose enqueue did not notify (see `outbox.notify-interval`) and that
    /// committed just after the claim that the notification woke. `0s` waits at once. (A
    /// claim made while the worker's previous, full batch was still in flight, and that found
    /// nothing, or with `0s`, is followed by one more claim at once when that batch is done:
    /// rows committed during its publish are not left for the poll.) Default `20ms`.
    #[serde(with = "humantime_serde")]
    pub linger: Duration,
    /// Bound on one publish, broker confirmation included. Default `5s`.
    #[serde(with = "humantime_serde")]
    pub publish_timeout: Duration,
    /// Added to `publish-timeout` to form the claim lease: a crashed worker's rows become
    /// claimable again after `publish-timeout + lease-margin`. It covers marking the batch
    /// after its slowest publish, so it is at least [`MIN_LEASE_MARGIN`]. Default `5s`.
    #[serde(with = "humantime_serde")]
    pub lease_margin: Duration,
    /// Attempts before a message is dead-lettered. Default `10`.
    pub max_attempts: u32,
    /// How long a full destination ([`PublishErrorKind::Full`](crate::PublishErrorKind::Full): a
    /// stream or queue at its limit) may refuse an event before its refusals count towards
    /// `max-attempts`, from the first refusal this relay saw (a timeout or an outage meanwhile does
    /// not start it again, unless no refusal came for an hour, or two `backoff.max` and leases if
    /// longer; a relay that restarts does, and a requeue on the relay that dead-lettered the event;
    /// a relay remembers up to 100,000 events refused in the last hour, and does not count the
    /// refusals of the others until it remembers them). Until then each refusal gives its attempt back and the next
    /// comes after about as long as the event has been refused (within
    /// `backoff.base..=backoff.max`), so a consumer that falls behind for less does not turn the
    /// backlog into dead letters; the event, and its aggregate's later events, wait in the outbox
    /// (and count towards `health.max-pending-age`). `0s` counts every refusal, like any other
    /// failure. Default `24h`.
    #[serde(with = "humantime_serde")]
    pub full_patience: Duration,
    /// Delay between attempts.
    pub backoff: BackoffConfig,
    /// How long a graceful shutdown waits for in-flight batches. Default `30s`; `0s` is
    /// refused (every shutdown would abort every worker mid-batch).
    #[serde(with = "humantime_serde")]
    pub shutdown_timeout: Duration,
    /// How often the pending / oldest-age / dead-letter gauges are refreshed. Default `15s`.
    #[serde(with = "humantime_serde")]
    pub stats_interval: Duration,
}

impl Default for RelayConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            workers: 2,
            batch_size: 100,
            poll_interval: Duration::from_secs(1),
            wake_up: WakeUp::Listen,
            notify_debounce: Duration::from_millis(5),
            linger: Duration::from_millis(20),
            publish_timeout: Duration::from_secs(5),
            lease_margin: Duration::from_secs(5),
            max_attempts: 10,
            full_patience: Duration::from_secs(24 * 60 * 60),
            backoff: BackoffConfig::default(),
            shutdown_timeout: Duration::from_secs(30),
            stats_interval: Duration::from_secs(15),
        }
    }
}

impl RelayConfig {
    /// Checks ranges: at least one worker, batch size 1..=10000, non-zero timeouts (the
    /// shutdown timeout included), a lease margin of at least [`MIN_LEASE_MARGIN`], no
    /// duration over [`MAX_RELAY_DURATION`].
    pub fn validate(&self) -> Result<(), Error> {
        if self.workers == 0 {
            return Err(Error::invalid_config("relay.workers must be at least 1"));
        }
        if self.batch_size == 0 || self.batch_size > 10_000 {
            return Err(Error::invalid_config("relay.batch-size must be 1..=10000"));
        }
        if self.max_attempts == 0 {
            return Err(Error::invalid_config(
                "relay.max-attempts must be at least 1",
            ));
        }
        for (name, value) in [
            ("relay.poll-interval", self.poll_interval),
            ("relay.publish-timeout", self.publish_timeout),
            ("relay.backoff.base", self.backoff.base),
            ("relay.stats-interval", self.stats_interval),
        ] {
            if value.is_zero() {
                return Err(Error::invalid_config(format!("{name} must not be zero")));
            }
        }
        if self.shutdown_timeout.is_zero() {
            return Err(Error::invalid_config(
                "relay.shutdown-timeout must not be zero: every shutdown would abort every \
                 worker mid-batch (its rows published again after the lease)",
            ));
        }
        if self.lease_margin < MIN_LEASE_MARGIN {
            return Err(Error::invalid_config(format!(
                "relay.lease-margin ({}) must be at least {}: the lease (publish-timeout + \
                 lease-margin) must outlive the slowest publish and the marking after it",
                humantime_serde::re::humantime::format_duration(self.lease_margin),
                humantime_serde::re::humantime::format_duration(MIN_LEASE_MARGIN),
            )));
        }
        if self.backoff.max < self.backoff.base {
            return Err(Error::invalid_config(
                "relay.backoff.max must be at least relay.backoff.base",
            ));
        }
        for (name, value) in [
            ("relay.poll-interval", self.poll_interval),
            ("relay.notify-debounce", self.notify_debounce),
            ("relay.linger", self.linger),
            ("relay.publish-timeout", self.publish_timeout),
            ("relay.lease-margin", self.lease_margin),
            ("relay.backoff.base", self.backoff.base),
            ("relay.backoff.max", self.backoff.max),
            ("relay.stats-interval", self.stats_interval),
            ("relay.shutdown-timeout", self.shutdown_timeout),
            ("relay.full-patience", self.full_patience),
        ] {
            if value > MAX_RELAY_DURATION {
                return Err(Error::invalid_config(format!(
                    "{name} must be at most 365 days"
                )));
            }
        }
        Ok(())
    }

    /// The claim lease: how long a claimed row stays invisible to other workers.
    pub fn lease(&self) -> Duration {
        self.publish_timeout.saturating_add(self.lease_margin)
    }

    /// The longest time between a publish the broker may have stored (its ack lost, or the
    /// relay gone before marking) and the relay's next publish of the same message: the row
    /// returns after the lease, or after a failed attempt's backoff (at most `backoff.max`).
    /// A broker deduplicating by message id (JetStream's duplicate window) must remember ids
    /// at least this long, or the copy is delivered twice.
    ///
    /// ```
    /// use std::time::Duration;
    /// use idempotency_outbox::config::RelayConfig;
    ///
    /// let relay = RelayConfig::default(); // lease 10s, backoff.max 5m
    /// assert_eq!(relay.republish_window(), Duration::from_secs(310));
    /// let error = relay.check_duplicate_window(Duration::from_secs(120)).unwrap_err();
    /// assert!(error.to_string().contains("relay.backoff.max"));
    /// relay.check_duplicate_window(Duration::from_secs(600))?;
    /// # Ok::<(), idempotency_outbox::Error>(())
    /// ```
    pub fn republish_window(&self) -> Duration {
        self.lease().saturating_add(self.backoff.max)
    }

    /// Fails when a broker's deduplication window (JetStream's `duplicate_window`) is shorter
    /// than [`republish_window`](Self::republish_window), naming the keys that set it.
    pub fn check_duplicate_window(&self, window: Duration) -> Result<(), Error> {
        let needed = self.republish_window();
        if window < needed {
            let show = humantime_serde::re::humantime::format_duration;
            return Err(Error::invalid_config(format!(
                "the broker's duplicate window ({}) is shorter than the relay's republish window \
                 ({}: relay.publish-timeout + relay.lease-margin + relay.backoff.max): a message \
                 published again after a lost ack would be delivered twice; lengthen the \
                 stream's duplicate window or shorten relay.backoff.max",
                show(window),
                show(needed),
            )));
        }
        Ok(())
    }

    /// The longest time between a message's first and last publish attempt by this relay
    /// configuration, failures of the message's own counted: every lease plus every backoff at
    /// its maximum (jitter only shortens them), plus, with a non-zero `full-patience`, that
    /// patience and one more `backoff.max` (a full destination's refusals go on for that
    /// long, then the attempts left). A broker outage adds its length
    /// (its failures do not count towards `max-attempts`). A consumer inbox must keep ids
    /// longer than this (plus the longest outage to ride out, any broker redelivery window,
    /// and any manual requeue of dead letters).
    ///
    /// ```
    /// use std::time::Duration;
    /// use idempotency_outbox::config::RelayConfig;
    ///
    /// let relay = RelayConfig {
    ///     max_attempts: 2,
    ///     full_patience: Duration::ZERO,
    ///     ..RelayConfig::default()
    /// };
    /// // Two leases of 10s and the backoff of 1s between them.
    /// assert_eq!(relay.retry_horizon(), Duration::from_secs(21));
    /// let patient = RelayConfig {
    ///     full_patience: Duration::from_secs(3600),
    ///     ..relay
    /// };
    /// // And an hour of a full destination, then one more backoff at its maximum (5m).
    /// assert_eq!(patient.retry_horizon(), Duration::from_secs(21 + 3600 + 300));
    /// ```
    pub fn retry_horizon(&self) -> Duration {
        let counted = self.counted_horizon();
        if self.full_patience.is_zero() {
            return counted;
        }
        counted
            .saturating_add(self.full_patience)
            .saturating_add(self.backoff.max)
    }

    /// [`retry_horizon`](Self::retry_horizon) without `full-patience`.
    fn counted_horizon(&self) -> Duration {
        let backoffs = self.max_attempts.saturating_sub(1);
        let mut total = self.lease().saturating_mul(self.max_attempts);
        // The ceiling grows for the first `GROWING` failures at most (its exponent stops at
        // `MAX_BACKOFF_EXPONENT`), then stays: the rest is one product, not a step per attempt.
        const GROWING: u32 = MAX_BACKOFF_EXPONENT + 1;
        for failed in 1..=backoffs.min(GROWING) {
            total = total.saturating_add(self.backoff.ceiling(failed));
        }
        let rest = backoffs.saturating_sub(GROWING);
        total.saturating_add(self.backoff.ceiling(GROWING + 1).saturating_mul(rest))
    }
}

/// The largest power of two [`BackoffConfig::ceiling`] multiplies `base` by.
const MAX_BACKOFF_EXPONENT: u32 = 30;

/// `outbox.relay.backoff`: exponential, with jitter, computed on the database clock.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "kebab-case", deny_unknown_fields)]
pub struct BackoffConfig {
    /// Delay after the first failure. Default `1s`.
    #[serde(with = "humantime_serde")]
    pub base: Duration,
    /// Upper bound of the delay. Default `5m`.
    #[serde(with = "humantime_serde")]
    pub max: Duration,
}

impl Default for BackoffConfig {
    fn default() -> Self {
        Self {
            base: Duration::from_secs(1),
            max: Duration::from_secs(5 * 60),
        }
    }
}

impl BackoffConfig {
    /// The delay before attempt `failed + 1`, before jitter: `min(max, base * 2^(failed-1))`.
    pub fn ceiling(&self, failed: u32) -> Duration {
        let exponent = failed.saturating_sub(1).min(MAX_BACKOFF_EXPONENT);
        self.base
            .checked_mul(1 << exponent)
            .unwrap_or(self.max)
            .min(self.max)
    }
}

/// `outbox.retention`: published rows are deleted after `published`, dead letters after the
/// longer `dead-lettered`, in bounded batches.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "kebab-case", deny_unknown_fields)]
pub struct RetentionConfig {
    /// Whether the relay runs retention. Default `true`.
    pub enabled: bool,
    /// How long published rows are kept. Default `7d`.
    #[serde(with = "humantime_serde")]
    pub published: Duration,
    /// How long dead-lettered rows are kept; `null` keeps them until requeued. Default `30d`.
    #[serde(with = "humantime_serde")]
    pub dead_lettered: Option<Duration>,
    /// Rows per delete (one short statement each). Default `1000`.
    pub batch_size: u32,
    /// How often retention runs. Default `10m`.
    #[serde(with = "humantime_serde")]
    pub interval: Duration,
}

impl RetentionConfig {
    /// Checks ranges when retention runs: a non-zero `interval` and `batch-size`, and a
    /// non-zero `dead-lettered` (it would delete dead letters, committed events never
    /// delivered, as soon as they are dead-lettered; `null` keeps them).
    pub fn validate(&self) -> Result<(), Error> {
        if !self.enabled {
            return Ok(());
        }
        if self.dead_lettered.is_some_and(|keep| keep.is_zero()) {
            return Err(Error::invalid_config(
                "retention.dead-lettered must not be zero: dead letters (committed events never \
                 delivered) would be deleted as soon as they are dead-lettered; use null to \
                 keep them until requeued",
            ));
        }
        if self.interval.is_zero() {
            return Err(Error::invalid_config("retention.interval must not be zero"));
        }
        if self.batch_size == 0 {
            return Err(Error::invalid_config(
                "retention.batch-size must be at least 1",
            ));
        }
        Ok(())
    }
}

impl Default for RetentionConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            published: Duration::from_secs(7 * DAY),
            dead_lettered: Some(Duration::from_secs(30 * DAY)),
            batch_size: 1000,
            interval: Duration::from_secs(10 * 60),
        }
    }
}

/// The `inbox` section: consumer-side deduplication.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "kebab-case", deny_unknown_fields)]
pub struct InboxConfig {
    /// Table name, optionally schema-qualified. Default `inbox`.
    pub table_name: String,
    /// Schema management at startup: `create`, `validate` (default) or `none`.
    pub schema: SchemaConfig,
    /// How long a processed message id is remembered: the age to give the inbox's
    /// `purge_older_than` (`PgInbox`, `MysqlInbox`, `SqliteInbox`), which the consumer runs
    /// on a schedule of its own (nothing purges the inbox by itself). It must exceed the
    /// producer's retry horizon ([`RelayConfig::retry_horizon`]) plus the broker's redelivery
    /// window, and, for a Kafka consumer group whose committed offsets can expire
    /// (`offsets.retention.minutes`) with `auto.offset.reset=earliest`, the topic's retention:
    /// a duplicate arriving after its id was purged is processed again. Default `14d`.
    #[serde(with = "humantime_serde")]
    pub retention: Duration,
    /// Rows per delete when purging. Default `1000`.
    pub batch_size: u32,
}

impl Default for InboxConfig {
    fn default() -> Self {
        Self {
            table_name: "inbox".to_owned(),
            schema: SchemaConfig::default(),
            retention: Duration::from_secs(14 * DAY),
            batch_size: 1000,
        }
    }
}

impl InboxConfig {
    /// Fails when `retention` does not exceed the relay's retry horizon.
    pub fn check_against(&self, relay: &RelayConfig) -> Result<(), Error> {
        let horizon = relay.retry_horizon();
        if self.retention <= horizon {
            return Err(Error::invalid_config(format!(
                "inbox.retention ({}) must exceed the relay's retry horizon ({})",
                humantime_serde::re::humantime::format_duration(self.retention),
                humantime_serde::re::humantime::format_duration(horizon),
            )));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Settings are printed with `{:?}` (logs, `#[instrument]`): the brokers' passwords and
    /// tokens are not (before: derived `Debug`, the URL as written).
    #[test]
    fn debug_output_hides_the_brokers_passwords() {
        let nats = NatsPublisherConfig {
            url: "nats://s3cret-token@nats:4222".to_owned(),
            ..NatsPublisherConfig::default()
        };
        let rabbitmq = RabbitMqPublisherConfig {
            url: "amqp://guest:s3cret@mq:5672/%2f".to_owned(),
            ..RabbitMqPublisherConfig::default()
        };
        let config = OutboxConfig {
            publisher: Some(PublisherConfig::Rabbitmq(rabbitmq)),
            ..OutboxConfig::default()
        };
        for shown in [format!("{nats:?}"), format!("{config:?}")] {
            assert!(!shown.contains("s3cret"), "{shown}");
            assert!(
                shown.contains("@nats:4222") || shown.contains("guest:***@mq:5672"),
                "{shown}"
            );
        }
    }

    #[test]
    fn defaults_and_kebab_case() {
        let config: OutboxConfig = serde_json::from_str("{}").unwrap();
        assert_eq!(config, OutboxConfig::default());
        assert_eq!(config.relay.batch_size, 100);
        assert_eq!(config.relay.lease(), Duration::from_secs(10));
        let config: OutboxConfig = serde_json::from_value(serde_json::json!({
            "notify-channel": null,
            "relay": {"publish-timeout": "2s", "backoff": {"base": "100ms", "max": "1s"},
                      "notify-debounce": "0s", "max-attempts": 3},
            "retention": {"dead-lettered": null, "batch-size": 7}
        }))
        .unwrap();
        assert_eq!(config.notify_channel, None);
        assert_eq!(config.relay.publish_timeout, Duration::from_secs(2));
        assert_eq!(config.retention.dead_lettered, None);
        assert_eq!(config.retention.batch_size, 7);
        config.relay.validate().unwrap();
    }

    #[test]
    fn unknown_keys_and_bad_values_are_errors() {
        assert!(serde_json::from_str::<OutboxConfig>(r#"{"relay": {"wokers": 2}}"#).is_err());
        assert!(serde_json::from_str::<OutboxConfig>(r#"{"ordering": "random"}"#).is_err());
        let bad = RelayConfig {
            workers: 0,
            ..RelayConfig::default()
        };
        assert!(matches!(bad.validate(), Err(Error::InvalidConfig { .. })));
        let bad = RelayConfig {
            backoff: BackoffConfig {
                base: Duration::from_secs(10),
                max: Duration::from_secs(1),
            },
            ..RelayConfig::default()
        };
        assert!(bad.validate().is_err());
    }

    /// Durations near `Duration::MAX` are refused by name, and the sums and products of the
    /// lease, the republish window and the retry horizon saturate instead of panicking.
    #[test]
    fn durations_too_long_are_refused_and_their_sums_do_not_overflow() {
        let huge = RelayConfig {
            publish_timeout: Duration::MAX,
            lease_margin: Duration::MAX,
            backoff: BackoffConfig {
                base: Duration::MAX,
                max: Duration::MAX,
            },
            max_attempts: u32::MAX,
            ..RelayConfig::default()
        };
        assert_eq!(huge.lease(), Duration::MAX);
        assert_eq!(huge.republish_window(), Duration::MAX);
        assert_eq!(
            RelayConfig {
                max_attempts: 40,
                ..huge.clone()
            }
            .retry_horizon(),
            Duration::MAX
        );
        let error = huge.validate().unwrap_err().to_string();
        assert!(
            error.contains("relay.publish-timeout must be at most 365 days"),
            "{error}"
        );
        for (name, config) in [
            (
                "relay.backoff.max",
                RelayConfig {
                    backoff: BackoffConfig {
                        base: Duration::from_secs(1),
                        max: MAX_RELAY_DURATION + Duration::from_secs(1),
                    },
                    ..RelayConfig::default()
                },
            ),
            (
                "relay.shutdown-timeout",
                RelayConfig {
                    shutdown_timeout: Duration::MAX,
                    ..RelayConfig::default()
                },
            ),
        ] {
            let error = config.validate().unwrap_err().to_string();
            assert!(error.contains(name), "{error}");
        }
        let longest = RelayConfig {
            publish_timeout: MAX_RELAY_DURATION,
            lease_margin: MAX_RELAY_DURATION,
            backoff: BackoffConfig {
                base: MAX_RELAY_DURATION,
                max: MAX_RELAY_DURATION,
            },
            max_attempts: u32::MAX,
            ..RelayConfig::default()
        };
        longest.validate().unwrap();
        assert!(longest.republish_window() < Duration::MAX);
    }

    #[test]
    fn a_lease_that_does_not_outlive_the_publish_timeout_and_the_marking_is_refused() {
        for margin in [Duration::ZERO, Duration::from_millis(999)] {
            let bad = RelayConfig {
                lease_margin: margin,
                ..RelayConfig::default()
            };
            let error = bad.validate().unwrap_err().to_string();
            assert!(
                error.contains("relay.lease-margin") && error.contains("at least 1s"),
                "{margin:?}: {error}"
            );
        }
        let edge = RelayConfig {
            lease_margin: Duration::from_secs(1),
            ..RelayConfig::default()
        };
        edge.validate().unwrap();
        assert!(edge.lease() > edge.publish_timeout);
    }

    #[test]
    fn partitioning_is_off_by_default_and_its_ranges_are_checked() {
        let config: OutboxConfig = serde_json::from_str("{}").unwrap();
        assert!(!config.partitioning.enabled);
        assert_eq!(config.partitioning.interval, Duration::from_secs(DAY));
        assert_eq!(config.partitioning.ahead, 3);
        let mut partitioning = PartitioningConfig {
            enabled: true,
            ..PartitioningConfig::default()
        };
        partitioning.validate().unwrap();
        for (interval, ahead, key) in [
            (Duration::ZERO, 3, "partitioning.interval must not be zero"),
            (Duration::from_secs(59), 3, "at least 1m"),
            (Duration::from_millis(60_500), 3, "whole seconds"),
            (Duration::from_secs(3600), 0, "partitioning.ahead"),
            (Duration::from_secs(3600), 1001, "partitioning.ahead"),
        ] {
            partitioning.interval = interval;
            partitioning.ahead = ahead;
            let error = partitioning.validate().unwrap_err().to_string();
            assert!(error.contains(key), "{interval:?} {ahead}: {error}");
        }
        partitioning.enabled = false;
        assert!(partitioning.validate().is_ok(), "not checked when off");
        assert!(
            serde_json::from_str::<OutboxConfig>(r#"{"partitioning": {"intervall": "1d"}}"#)
                .is_err()
        );
    }

    #[test]
    fn backoff_doubles_up_to_the_cap() {
        let backoff = BackoffConfig {
            base: Duration::from_millis(100),
            max: Duration::from_secs(1),
        };
        let delays: Vec<_> = (1..=6).map(|n| backoff.ceiling(n).as_millis()).collect();
        assert_eq!(delays, [100, 200, 400, 800, 1000, 1000]);
        assert_eq!(backoff.ceiling(200), Duration::from_secs(1));
    }

    /// `max-attempts` may be any `u32`: the horizon is computed without a step per attempt
    /// (before: one loop turn per attempt, some 4e9 for `u32::MAX`, in the inbox check
    /// at start-up), and equals the sum attempt by attempt for every count it can be
    /// checked against.
    #[test]
    fn the_retry_horizon_of_any_attempt_count_is_computed_at_once() {
        let (sender, receiver) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let relay = RelayConfig {
                max_attempts: u32::MAX,
                full_patience: Duration::ZERO,
                ..RelayConfig::default()
            };
            sender.send(relay.retry_horizon()).unwrap();
        });
        let horizon = receiver
            .recv_timeout(Duration::from_secs(10))
            .expect("the retry horizon of u32::MAX attempts within 10s");
        // Leases of 10s; backoffs 1s, 2s, ... 256s, then 300s (`backoff.max`) for the rest.
        let n = u64::from(u32::MAX);
        assert_eq!(
            horizon,
            Duration::from_secs(10 * n + 511 + 300 * (n - 1 - 9))
        );
        for (base, max) in [(1, 300_000), (7, 7), (3, u64::MAX / 4), (1, u64::MAX)] {
            let backoff = BackoffConfig {
                base: Duration::from_millis(base),
                max: Duration::from_millis(max),
            };
            for max_attempts in 1..=80 {
                let relay = RelayConfig {
                    max_attempts,
                    backoff: backoff.clone(),
                    full_patience: Duration::ZERO,
                    ..RelayConfig::default()
                };
                let by_attempt = (1..max_attempts).fold(
                    relay.lease().saturating_mul(max_attempts),
                    |total, failed| total.saturating_add(backoff.ceiling(failed)),
                );
                assert_eq!(
                    relay.retry_horizon(),
                    by_attempt,
                    "{base} {max} {max_attempts}"
                );
            }
        }
    }

    #[test]
    fn inbox_retention_must_exceed_the_retry_horizon() {
        let relay = RelayConfig {
            max_attempts: 3,
            publish_timeout: Duration::from_secs(1),
            lease_margin: Duration::from_secs(1),
            backoff: BackoffConfig {
                base: Duration::from_secs(10),
                max: Duration::from_secs(15),
            },
            full_patience: Duration::ZERO,
            ..RelayConfig::default()
        };
        // 3 leases of 2s + backoffs 10s and 15s
        assert_eq!(relay.retry_horizon(), Duration::from_secs(31));
        let mut inbox = InboxConfig {
            retention: Duration::from_secs(31),
            ..InboxConfig::default()
        };
        assert!(inbox.check_against(&relay).is_err());
        inbox.retention = Duration::from_secs(32);
        inbox.check_against(&relay).unwrap();
        // A full destination's refusals go on for full-patience (100s), then one more
        // backoff.max (15s) and the counted attempts.
        let patient = RelayConfig {
            full_patience: Duration::from_secs(100),
            ..relay
        };
        assert_eq!(patient.retry_horizon(), Duration::from_secs(31 + 100 + 15));
        inbox.retention = Duration::from_secs(146);
        assert!(inbox.check_against(&patient).is_err());
        inbox.retention = Duration::from_secs(147);
        inbox.check_against(&patient).unwrap();
    }

    #[test]
    fn unsafe_zeros_are_refused_naming_the_key() {
        let relay = RelayConfig {
            shutdown_timeout: Duration::ZERO,
            ..RelayConfig::default()
        };
        let error = relay.validate().unwrap_err().to_string();
        assert!(error.contains("relay.shutdown-timeout"), "{error}");
        let retention = RetentionConfig {
            dead_lettered: Some(Duration::ZERO),
            ..RetentionConfig::default()
        };
        let error = retention.validate().unwrap_err().to_string();
        assert!(error.contains("retention.dead-lettered"), "{error}");
        let keep = RetentionConfig {
            dead_lettered: None,
            ..RetentionConfig::default()
        };
        keep.validate().unwrap();
    }

    #[test]
    fn a_duplicate_window_shorter_than_the_republish_window_is_refused() {
        let relay = RelayConfig {
            publish_timeout: Duration::from_secs(2),
            lease_margin: Duration::from_secs(1),
            backoff: BackoffConfig {
                base: Duration::from_millis(100),
                max: Duration::from_secs(60),
            },
            ..RelayConfig::default()
        };
        assert_eq!(relay.republish_window(), Duration::from_secs(63));
        let error = relay
            .check_duplicate_window(Duration::from_secs(62))
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("relay.backoff.max") && error.contains("1m 3s"),
            "{error}"
        );
        relay
            .check_duplicate_window(Duration::from_secs(63))
            .unwrap();
    }

    #[test]
    fn zero_intervals_and_batch_sizes_are_refused_naming_the_key() {
        let relay = RelayConfig {
            stats_interval: Duration::ZERO,
            ..RelayConfig::default()
        };
        let error = relay.validate().unwrap_err().to_string();
        assert!(error.contains("relay.stats-interval"), "{error}");
        let mut retention = RetentionConfig {
            interval: Duration::ZERO,
            ..RetentionConfig::default()
        };
        assert!(
            retention
                .validate()
                .unwrap_err()
                .to_string()
                .contains("retention.interval")
        );
        retention.interval = Duration::from_secs(1);
        retention.batch_size = 0;
        assert!(
            retention
                .validate()
                .unwrap_err()
                .to_string()
                .contains("retention.batch-size")
        );
        retention.enabled = false;
        assert!(
            retention.validate().is_ok(),
            "not checked when retention is off"
        );
    }
}
