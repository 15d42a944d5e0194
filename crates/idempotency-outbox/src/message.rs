//! [`NewEvent`], what an application enqueues, and [`OutboxMessage`], what a relay publishes.

use std::borrow::Cow;
use std::collections::BTreeMap;

use idempotency_core::trace;

use chrono::{DateTime, Utc};
use serde::Serialize;
use uuid::Uuid;

use crate::error::Error;

/// Longest aggregate type, aggregate id and event type the schema stores.
pub const MAX_NAME_LEN: usize = 255;

/// An event to write into the outbox, in the caller's transaction.
///
/// Its id is a UUID v7 (time-ordered), generated when the event is built; it travels to the
/// broker as the message id (`Nats-Msg-Id`, AMQP `message_id`) so brokers and consumers can
/// drop duplicates.
///
/// At enqueue, the W3C trace context of the current span (`traceparent`, and `tracestate` when
/// it has one) is added to the headers, unless the caller set either header (any case) or
/// turned it off with [`without_trace_context`](Self::without_trace_context); without the
/// `otel` feature (or without a `tracing-opentelemetry` layer) there is no context to add.
///
/// ```
/// use idempotency_outbox::NewEvent;
///
/// let event = NewEvent::new("charge", "ch_42", "ChargeCreated", &serde_json::json!({"amountCents": 4900}))?
///     .header("traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01");
/// assert_eq!(event.id().get_version_num(), 7);
/// assert_eq!(event.aggregate_id(), "ch_42");
/// # Ok::<(), idempotency_outbox::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewEvent {
    id: Uuid,
    aggregate_type: String,
    aggregate_id: String,
    event_type: String,
    payload: String,
    headers: BTreeMap<String, String>,
    trace_context: bool,
}

impl NewEvent {
    /// An event whose payload is `payload` serialized to JSON.
    pub fn new(
        aggregate_type: impl Into<String>,
        aggregate_id: impl Into<String>,
        event_type: impl Into<String>,
        payload: &impl Serialize,
    ) -> Result<Self, Error> {
        let payload = serde_json::to_string(payload).map_err(Error::Payload)?;
        Ok(Self::from_json_text(
            aggregate_type,
            aggregate_id,
            event_type,
            payload,
        ))
    }

    /// An event whose payload is JSON text the caller already has (checked at enqueue).
    pub fn from_json_text(
        aggregate_type: impl Into<String>,
        aggregate_id: impl Into<String>,
        event_type: impl Into<String>,
        payload: impl Into<String>,
    ) -> Self {
        Self {
            id: Uuid::now_v7(),
            aggregate_type: aggregate_type.into(),
            aggregate_id: aggregate_id.into(),
            event_type: event_type.into(),
            payload: payload.into(),
            headers: BTreeMap::new(),
            trace_context: true,
        }
    }

    /// Adds a header, forwarded to the broker with the message (trace context, tenant...).
    ///
    /// Names are visible ASCII without `:`; values have no line breaks. Both are checked at
    /// enqueue. A header named as one of the outbox's own
    /// ([`publisher::headers`](crate::publisher::headers), in any case) is stored but not
    /// forwarded by the built-in publishers (NATS, RabbitMQ, Kafka; a `Publisher` of your own
    /// gets the message's headers as stored): they send their own header of that name where the broker carries one
    /// (NATS and RabbitMQ carry the outbox id in their own message-id field, not as
    /// `Outbox-Id`).
    #[must_use]
    pub fn header(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.headers.insert(name.into(), value.into());
        self
    }

    /// Enqueues the event without the current span's trace context (the headers are stored as
    /// given).
    #[must_use]
    pub fn without_trace_context(mut self) -> Self {
        self.trace_context = false;
        self
    }

    /// The headers as enqueue stores them: the event's own, plus the current span's W3C trace
    /// context (`traceparent`, `tracestate`) unless the caller set either of them or turned it
    /// off with [`without_trace_context`](Self::without_trace_context). Backends call it in
    /// `enqueue`, inside the caller's span.
    pub fn headers_to_store(&self) -> Cow<'_, BTreeMap<String, String>> {
        let set_by_caller = || {
            self.headers.keys().any(|name| {
                name.eq_ignore_ascii_case(trace::TRACEPARENT)
                    || name.eq_ignore_ascii_case(trace::TRACESTATE)
            })
        };
        if !self.trace_context || set_by_caller() {
            return Cow::Borrowed(&self.headers);
        }
        let Some((parent, state)) = trace::current_context() else {
            return Cow::Borrowed(&self.headers);
        };
        let mut headers = self.headers.clone();
        headers.insert(trace::TRACEPARENT.to_owned(), parent.to_string());
        if let Some(state) = state {
            headers.insert(trace::TRACESTATE.to_owned(), state);
        }
        Cow::Owned(headers)
    }

    /// Replaces the generated id (for example with an id derived from a request, so that a
    /// retried request enqueues the same message id).
    #[must_use]
    pub fn with_id(mut self, id: Uuid) -> Self {
        self.id = id;
        self
    }

    /// The message id.
    pub fn id(&self) -> Uuid {
        self.id
    }

    /// The aggregate type (`charge`, `order`...).
    pub fn aggregate_type(&self) -> &str {
        &self.aggregate_type
    }

    /// The aggregate id; events of one aggregate are published in commit order.
    pub fn aggregate_id(&self) -> &str {
        &self.aggregate_id
    }

    /// The event type (`ChargeCreated`...).
    pub fn event_type(&self) -> &str {
        &self.event_type
    }

    /// The JSON payload, as text.
    pub fn payload(&self) -> &str {
        &self.payload
    }

    /// The headers.
    pub fn headers(&self) -> &BTreeMap<String, String> {
        &self.headers
    }

    /// Checks the lengths, the header syntax and the JSON payload the stores and brokers need:
    /// the payload must be JSON nested at most
    /// [`MAX_JSON_DEPTH`](idempotency_core::MAX_JSON_DEPTH) (31) levels deep, the limit every
    /// backend shares (MariaDB's `json_valid` refuses 32).
    ///
    /// Every backend calls it before writing anything, so an invalid event is the same
    /// [`Error::InvalidEvent`] everywhere and leaves the caller's transaction usable (a payload
    /// refused by the database instead would abort a PostgreSQL transaction).
    ///
    /// ```
    /// use idempotency_outbox::{Error, NewEvent};
    ///
    /// let deep = format!("{}{}", "[".repeat(32), "]".repeat(32));
    /// let event = NewEvent::from_json_text("order", "o-1", "Placed", deep);
    /// assert!(matches!(event.validate(), Err(Error::InvalidEvent { .. })));
    /// ```
    pub fn validate(&self) -> Result<(), Error> {
        if let Err(too_deep) = idempotency_core::check_json_depth(&self.payload) {
            return Err(Error::invalid_event(format!(
                "the payload of {}: {too_deep}",
                self.id
            )));
        }
        if let Err(e) = serde_json::from_str::<serde::de::IgnoredAny>(&self.payload) {
            return Err(Error::invalid_event(format!(
                "the payload of {} is not JSON: {e}",
                self.id
            )));
        }
        for (what, value) in [
            ("aggregate type", &self.aggregate_type),
            ("aggregate id", &self.aggregate_id),
            ("event type", &self.event_type),
        ] {
            if value.is_empty() {
                return Err(Error::invalid_event(format!("the {what} is empty")));
            }
            if value.chars().count() > MAX_NAME_LEN {
                return Err(Error::invalid_event(format!(
                    "the {what} is longer than {MAX_NAME_LEN} characters"
                )));
            }
        }
        for (name, value) in &self.headers {
            if !crate::publisher::header_name_ok(name) {
                return Err(Error::invalid_event(format!(
                    "header name {name:?} must be visible ASCII without ':'"
                )));
            }
            if value.contains(['\r', '\n']) {
                return Err(Error::invalid_event(format!(
                    "header {name} has a line break in its value"
                )));
            }
        }
        Ok(())
    }
}

/// A claimed outbox row, handed to a [`Publisher`](crate::Publisher).
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct OutboxMessage {
    /// The message id (UUID v7); publishers send it as the broker's message id.
    pub id: Uuid,
    /// The aggregate type.
    pub aggregate_type: String,
    /// The aggregate id.
    pub aggregate_id: String,
    /// Position in the aggregate's stream (1, 2, ...), in commit order; `None` for events
    /// enqueued in `unordered` mode.
    pub sequence: Option<i64>,
    /// The event type.
    pub event_type: String,
    /// The JSON payload, as text.
    pub payload: String,
    /// The event headers.
    pub headers: BTreeMap<String, String>,
    /// When the event was written (database clock).
    pub created_at: DateTime<Utc>,
    /// Delivery attempts so far, this one included.
    pub attempts: u32,
    /// Seconds between `created_at` and the claim (database clock); the relay adds the time to
    /// the broker's ack for its commit-to-ack latency, free of clock skew between hosts.
    pub age_at_claim: f64,
}

impl OutboxMessage {
    /// A message built by hand, for publishers' tests and custom stores.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        id: Uuid,
        aggregate_type: impl Into<String>,
        aggregate_id: impl Into<String>,
        sequence: Option<i64>,
        event_type: impl Into<String>,
        payload: impl Into<String>,
        headers: BTreeMap<String, String>,
        created_at: DateTime<Utc>,
        attempts: u32,
    ) -> Self {
        Self {
            id,
            aggregate_type: aggregate_type.into(),
            aggregate_id: aggregate_id.into(),
            sequence,
            event_type: event_type.into(),
            payload: payload.into(),
            headers,
            created_at,
            attempts,
            age_at_claim: 0.0,
        }
    }

    /// Sets [`age_at_claim`](Self::age_at_claim).
    #[must_use]
    pub fn with_age_at_claim(mut self, seconds: f64) -> Self {
        self.age_at_claim = seconds;
        self
    }
}

/// A dead-lettered message: given up on after `max-attempts`, kept until requeued or purged.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct DeadLetter {
    /// The message as it would be published.
    pub message: OutboxMessage,
    /// The last publish error.
    pub last_error: Option<String>,
    /// When it was dead-lettered (database clock).
    pub dead_lettered_at: DateTime<Utc>,
}

impl DeadLetter {
    /// A dead letter built by a store.
    pub fn new(
        message: OutboxMessage,
        last_error: Option<String>,
        dead_lettered_at: DateTime<Utc>,
    ) -> Self {
        Self {
            message,
            last_error,
            dead_lettered_at,
        }
    }
}
