//! Metric names, recorded through the [`metrics`](https://docs.rs/metrics) facade.
//!
//! Install any `metrics` recorder (Prometheus exporter, `idempotency-metrics`...) and the relay
//! reports:
//!
//! | name | kind | labels | meaning |
//! |---|---|---|---|
//! | `outbox_pending` | gauge | | rows neither published nor dead-lettered |
//! | `outbox_oldest_pending_age_seconds` | gauge | | age of the oldest pending row; a rising value means a stuck relay |
//! | `outbox_dead_lettered` | gauge | | dead-lettered rows |
//! | `outbox_published_total` | counter | `destination` | messages the broker confirmed |
//! | `outbox_publish_failures_total` | counter | `destination`, `kind` | failed publish attempts (`kind`: `unavailable`, `rejected`, `full`, `timeout`, `invalid`, `panicked`, `other`) |
//! | `outbox_publish_attempts_total` | counter | `destination` | publish attempts, successful or not |
//! | `outbox_dead_lettered_total` | counter | `destination` | messages moved to the dead letters (after their last failed publish, or by the claim after `max-attempts` claims that never completed) |
//! | `outbox_relay_worker_panics_total` | counter | | relay worker tasks that panicked outside a publish (each is restarted) |
//! | `outbox_broker_duplicates_total` | counter | `destination` | confirmed copies the broker reported as duplicates |
//! | `outbox_publish_latency_seconds` | histogram | `destination` | enqueue (commit) to broker ack |
//! | `outbox_broker_state_changes_total` | counter | `destination`, `state` | the broker as one relay sees it: `lost` (a publish failed on the broker's side after one was confirmed), `back` (a publish confirmed, or answered that the destination is full, after such failures); each also logged once |
//!
//! Gauges are refreshed every `relay.stats-interval` by one query per relay process.

use crate::publisher::PublishErrorKind;
use crate::store::OutboxStats;

/// Gauge: pending rows.
pub const PENDING: &str = "outbox_pending";
/// Gauge: age of the oldest pending row, in seconds.
pub const OLDEST_PENDING_AGE: &str = "outbox_oldest_pending_age_seconds";
/// Gauge: dead-lettered rows.
pub const DEAD_LETTERED: &str = "outbox_dead_lettered";
/// Counter: messages confirmed by the broker.
pub const PUBLISHED: &str = "outbox_published_total";
/// Counter: failed publish attempts.
pub const FAILED: &str = "outbox_publish_failures_total";
/// Counter: publish attempts.
pub const ATTEMPTS: &str = "outbox_publish_attempts_total";
/// Counter: messages dead-lettered.
pub const DEAD_LETTERED_TOTAL: &str = "outbox_dead_lettered_total";
/// Counter: relay worker tasks that panicked (each is restarted).
pub const WORKER_PANICS: &str = "outbox_relay_worker_panics_total";
/// Counter: confirmed copies the broker dropped as duplicates.
pub const BROKER_DUPLICATES: &str = "outbox_broker_duplicates_total";
/// Histogram: enqueue (commit) to broker ack, in seconds.
pub const LATENCY: &str = "outbox_publish_latency_seconds";
/// Counter: the broker lost (`state="lost"`) and back (`state="back"`), as one relay sees it.
pub const BROKER_STATE_CHANGES: &str = "outbox_broker_state_changes_total";

/// Registers the help text and unit of every outbox meter with the installed recorder (the
/// Prometheus exporter prints them as `# HELP` / `# TYPE`). Call it once after installing it.
///
/// ```
/// idempotency_outbox::metrics::describe(); // no recorder installed: a no-op
/// ```
pub fn describe() {
    use metrics::{Unit, describe_counter, describe_gauge, describe_histogram};
    describe_gauge!(
        PENDING,
        Unit::Count,
        "Outbox rows neither published nor dead-lettered"
    );
    describe_gauge!(
        OLDEST_PENDING_AGE,
        Unit::Seconds,
        "Age of the oldest pending outbox row; rising means a stuck relay"
    );
    describe_gauge!(DEAD_LETTERED, Unit::Count, "Dead-lettered outbox rows");
    describe_counter!(
        PUBLISHED,
        Unit::Count,
        "Outbox messages the broker confirmed"
    );
    describe_counter!(FAILED, Unit::Count, "Failed publish attempts, by kind");
    describe_counter!(ATTEMPTS, Unit::Count, "Publish attempts, successful or not");
    describe_counter!(
        DEAD_LETTERED_TOTAL,
        Unit::Count,
        "Outbox messages moved to the dead letters"
    );
    describe_counter!(
        WORKER_PANICS,
        Unit::Count,
        "Relay worker tasks that panicked outside a publish (each is restarted)"
    );
    describe_counter!(
        BROKER_DUPLICATES,
        Unit::Count,
        "Confirmed copies the broker reported as duplicates"
    );
    describe_histogram!(
        LATENCY,
        Unit::Seconds,
        "Commit of the enqueue to the broker's confirmation"
    );
    describe_counter!(
        BROKER_STATE_CHANGES,
        Unit::Count,
        "The broker lost (state=lost) and back (state=back), as a relay sees it"
    );
}

fn kind_label(kind: PublishErrorKind) -> &'static str {
    match kind {
        PublishErrorKind::Unavailable => "unavailable",
        PublishErrorKind::Rejected => "rejected",
        PublishErrorKind::Full => "full",
        PublishErrorKind::Timeout => "timeout",
        PublishErrorKind::InvalidMessage => "invalid",
        PublishErrorKind::Panicked => "panicked",
        _ => "other",
    }
}

pub(crate) fn stats(stats: &OutboxStats) {
    metrics::gauge!(PENDING).set(stats.pending as f64);
    metrics::gauge!(OLDEST_PENDING_AGE).set(stats.oldest_pending_age);
    metrics::gauge!(DEAD_LETTERED).set(stats.dead_lettered as f64);
}

pub(crate) fn attempts(destination: &str, n: usize) {
    metrics::counter!(ATTEMPTS, "destination" => destination.to_owned()).increment(n as u64);
}

/// The meters of one batch's confirmed messages. The published counter and the latency
/// histogram are registered with the recorder at the batch's first confirmation, not at each:
/// a registration builds the key and looks it up in the recorder's registry, which costs more
/// than the increment itself.
pub(crate) struct Confirmed<'a> {
    destination: &'a str,
    handles: Option<(metrics::Counter, metrics::Histogram)>,
}

impl<'a> Confirmed<'a> {
    pub(crate) fn new(destination: &'a str) -> Self {
        Self {
            destination,
            handles: None,
        }
    }

    /// One message confirmed by the broker, `latency_seconds` after its commit.
    pub(crate) fn record(&mut self, latency_seconds: f64, duplicate: bool) {
        let destination = self.destination;
        let (published, latency) = self.handles.get_or_insert_with(|| {
            (
                metrics::counter!(PUBLISHED, "destination" => destination.to_owned()),
                metrics::histogram!(LATENCY, "destination" => destination.to_owned()),
            )
        });
        published.increment(1);
        latency.record(latency_seconds);
        if duplicate {
            metrics::counter!(BROKER_DUPLICATES, "destination" => destination.to_owned())
                .increment(1);
        }
    }
}

pub(crate) fn dead_lettered_at_claim(destination: &str, n: u64) {
    if n > 0 {
        metrics::counter!(DEAD_LETTERED_TOTAL, "destination" => destination.to_owned())
            .increment(n);
    }
}

pub(crate) fn worker_panicked() {
    metrics::counter!(WORKER_PANICS).increment(1);
}

pub(crate) fn failed(destination: &str, kind: PublishErrorKind, dead_lettered: bool) {
    metrics::counter!(FAILED, "destination" => destination.to_owned(), "kind" => kind_label(kind))
        .increment(1);
    if dead_lettered {
        metrics::counter!(DEAD_LETTERED_TOTAL, "destination" => destination.to_owned())
            .increment(1);
    }
}

pub(crate) fn broker_state(destination: &str, state: &'static str) {
    metrics::counter!(BROKER_STATE_CHANGES, "destination" => destination.to_owned(), "state" => state)
        .increment(1);
}
