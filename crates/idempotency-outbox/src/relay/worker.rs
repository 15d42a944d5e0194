//! One worker: claim, publish concurrently, mark; wait when there is nothing to do. After a
//! full batch the next batch is claimed while that one publishes and is marked.

use std::any::Any;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use futures_util::FutureExt;
use futures_util::StreamExt;
use futures_util::future::join_all;
use futures_util::stream::FuturesUnordered;
use idempotency_core::trace;
use tokio::sync::watch;
use tokio::time::Instant;
use tracing::Instrument;
use uuid::Uuid;

use super::Shared;
use super::backoff::{self, Sent};
use crate::config::RelayConfig;
use crate::error::Error;
use crate::message::OutboxMessage;
use crate::metrics;
use crate::publisher::{Ack, PublishError, PublishErrorKind, Publisher};
use crate::store::{ClaimRequest, Failure, Housekeeping, MAX_ERROR_LEN, RelayStore};

/// What one batch did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct BatchReport {
    /// Rows claimed.
    pub claimed: u64,
    /// Messages the broker confirmed.
    pub published: u64,
    /// Publish attempts that failed (retried later or dead-lettered).
    pub failed: u64,
    /// Messages dead-lettered by this batch (after their last failed publish, or by the claim).
    pub dead_lettered: u64,
    /// Of those, rows the claim dead-lettered without handing them out: claimed
    /// `max-attempts` times and never marked, as when each publish crashed its relay.
    pub dead_lettered_at_claim: u64,
    /// Confirmed copies the broker reported as duplicates.
    pub duplicates: u64,
}

/// Store calls after a publish are retried this often before the rows are left to their
/// lease (they are then published again: at least once).
const MARK_TRIES: u32 = 3;

pub(super) async fn work<S, P>(shared: Arc<Shared<S, P>>, n: usize, mut stop: watch::Receiver<bool>)
where
    S: RelayStore + Housekeeping,
    P: Publisher,
{
    tracing::debug!(worker = n, "outbox relay worker started");
    let limit = u64::from(shared.config.batch_size);
    // The batches in flight: each publishes from the moment it is claimed, then is marked.
    // After a full batch the worker claims the next one while the previous batch publishes
    // and is marked, and claims again only once fewer than two are in flight: a worker
    // holds at most two leased batches, the one it claims while the other is in flight or
    // two in flight (the kill bound, RELIABILITY.md). A batch's rows keep their lease until
    // its mark commits, so a concurrent claim cannot hand out a later message of any of
    // their aggregates (`ordered`), and a stop waits for every batch in flight.
    let mut in_flight = FuturesUnordered::new();
    loop {
        while in_flight.len() >= 2 {
            in_flight.next().await;
        }
        if stopping(&stop) {
            break;
        }
        // Whether a batch was in flight while this claim ran: rows committed during its
        // publish may have been missed by the claim.
        let overlapped = !in_flight.is_empty();
        let claimed = {
            let claim = claim(&shared);
            tokio::pin!(claim);
            loop {
                tokio::select! {
                    claimed = &mut claim => break claimed,
                    Some(_) = in_flight.next(), if !in_flight.is_empty() => {}
                }
            }
        };
        // Whether the claim found rows (but not a full batch): then the worker looks again
        // after `linger` instead of waiting for a notification or the poll.
        let found = match claimed {
            Ok(batch) => {
                let report = &batch.report;
                let full = report.claimed + report.dead_lettered_at_claim == limit;
                let found = report.claimed + report.dead_lettered_at_claim > 0;
                in_flight.push(publish_and_mark(&shared, batch));
                if full {
                    // More is probably due: claim again while this batch publishes.
                    continue;
                }
                while in_flight.next().await.is_some() {}
                if overlapped && (!found || shared.config.linger.is_zero()) {
                    // The claim ran while a batch published: look again now that none is
                    // in flight, before waiting for the poll (the notification of a row
                    // committed meanwhile may have gone to another worker, or never come:
                    // polling). A claim that found rows looks again after `linger`.
                    continue;
                }
                found
            }
            Err(error) => {
                tracing::warn!(
                    worker = n,
                    error = &error as &dyn std::error::Error,
                    "outbox claim failed"
                );
                while in_flight.next().await.is_some() {}
                false
            }
        };
        let idle = idle_wait(&shared.config, found);
        tokio::select! {
            () = shared.wake.notified() => {}
            () = tokio::time::sleep(idle) => {}
            changed = stop.changed() => {
                // The handle was dropped: stop as on shutdown.
                if changed.is_err() {
                    break;
                }
            }
        }
    }
    while in_flight.next().await.is_some() {}
    tracing::debug!(worker = n, "outbox relay worker stopped");
}

/// Whether the relay is stopping: [`shutdown`](super::RelayHandle::shutdown) said so, or the
/// handle was dropped (the sender is gone). Checked before every claim, so that a worker whose
/// batches are all full (it never waits) stops too.
fn stopping(stop: &watch::Receiver<bool>) -> bool {
    *stop.borrow() || stop.has_changed().is_err()
}

/// How long a worker waits for a notification before it claims again: `linger` after a claim
/// that found rows (an enqueue that did not notify may have committed just after it; see
/// `outbox.notify-interval`), `poll-interval` after an empty one.
fn idle_wait(config: &RelayConfig, found: bool) -> Duration {
    if found && !config.linger.is_zero() {
        config.linger.min(config.poll_interval)
    } else {
        config.poll_interval
    }
}

/// Claims, publishes and marks one batch.
pub(super) async fn run_batch<S, P>(shared: &Shared<S, P>) -> Result<BatchReport, Error>
where
    S: RelayStore,
    P: Publisher,
{
    let batch = claim(shared).await?;
    Ok(publish_and_mark(shared, batch).await)
}

/// Publishes and marks one claimed batch; returns what it did.
async fn publish_and_mark<S, P>(shared: &Shared<S, P>, batch: Batch) -> BatchReport
where
    S: RelayStore,
    P: Publisher,
{
    let published = publish(shared, batch).await;
    let report = published.report;
    mark(shared, published).await;
    report
}

/// A claimed batch, leased to `token`.
struct Batch {
    token: Uuid,
    claimed_at: Instant,
    messages: Vec<OutboxMessage>,
    report: BatchReport,
}

/// A batch after its publishes: what to mark.
struct Published {
    token: Uuid,
    ids: Vec<Uuid>,
    failures: Vec<Failure>,
    report: BatchReport,
}

async fn claim<S, P>(shared: &Shared<S, P>) -> Result<Batch, Error>
where
    S: RelayStore,
    P: Publisher,
{
    let config = &shared.config;
    let token = Uuid::now_v7();
    let request = ClaimRequest {
        limit: config.batch_size,
        lease: config.lease(),
        token,
        ordering: shared.ordering,
        max_attempts: config.max_attempts,
    };
    let claimed = shared.store.claim(&request).await?;
    let claimed_at = Instant::now();
    let spent = claimed.dead_lettered.len() as u64;
    for id in &claimed.dead_lettered {
        shared.held.forget(*id);
        tracing::error!(%id, max_attempts = config.max_attempts, "outbox message dead-lettered: claimed max-attempts times without completing");
    }
    metrics::dead_lettered_at_claim(shared.publisher.destination(), spent);
    Ok(Batch {
        token,
        claimed_at,
        report: BatchReport {
            claimed: claimed.messages.len() as u64,
            dead_lettered: spent,
            dead_lettered_at_claim: spent,
            ..BatchReport::default()
        },
        messages: claimed.messages,
    })
}

/// Publishes every message of `batch` concurrently, each bounded by `publish-timeout`.
async fn publish<S, P>(shared: &Shared<S, P>, batch: Batch) -> Published
where
    S: RelayStore,
    P: Publisher,
{
    let config = &shared.config;
    let Batch {
        token,
        claimed_at,
        messages: batch,
        report,
    } = batch;
    let published = Published {
        token,
        ids: Vec::with_capacity(batch.len()),
        failures: Vec::new(),
        report,
    };
    if batch.is_empty() {
        return published;
    }
    if batch.len() == config.batch_size as usize {
        // Let an idle worker take the next batch while this one publishes.
        shared.wake.notify_one();
    }
    let destination = shared.publisher.destination();
    metrics::attempts(destination, batch.len());
    // One span per claimed batch (an empty poll has none); each publish is its child.
    let span = tracing::info_span!(
        "outbox.relay.batch",
        messaging.operation.type = "send",
        messaging.batch.message_count = batch.len(),
        outbox.destination = destination,
        outbox.published = tracing::field::Empty,
        outbox.failed = tracing::field::Empty,
    );
    let published = publish_batch(shared, batch, claimed_at, published, report)
        .instrument(span.clone())
        .await;
    span.record("outbox.published", published.report.published);
    span.record("outbox.failed", published.report.failed);
    published
}

/// The publishes of a non-empty batch.
async fn publish_batch<S, P>(
    shared: &Shared<S, P>,
    batch: Vec<OutboxMessage>,
    claimed_at: Instant,
    published: Published,
    report: BatchReport,
) -> Published
where
    S: RelayStore,
    P: Publisher,
{
    let timeout = shared.config.publish_timeout;
    let sent = shared.outage.sent();
    let results = join_all(batch.iter().map(|message| {
        let span = publish_span(message);
        let publish = publish_one(shared, message, timeout, claimed_at);
        async move {
            let (result, elapsed) = publish.instrument(span.clone()).await;
            if let Err(error) = &result {
                span.record("otel.status_code", "ERROR");
                span.record("error.type", tracing::field::debug(error.kind()));
            }
            (result, elapsed)
        }
    }))
    .await;
    publish_results(shared, &batch, sent, results, published, report)
}

/// The span of one publish: a producer span with OpenTelemetry's messaging attributes (the
/// publisher records `messaging.system` and `messaging.destination.name`), linked to the span
/// that enqueued the message when its headers carry a valid `traceparent`. A link, not a
/// parent: a batch holds messages of many requests, and the relay's work is not part of any
/// of them.
fn publish_span(message: &OutboxMessage) -> tracing::Span {
    let span = tracing::info_span!(
        "outbox.publish",
        otel.kind = "producer",
        otel.status_code = tracing::field::Empty,
        messaging.operation.type = "send",
        messaging.system = tracing::field::Empty,
        messaging.destination.name = tracing::field::Empty,
        messaging.rabbitmq.destination.routing_key = tracing::field::Empty,
        messaging.message.id = %message.id,
        outbox.attempt = message.attempts,
        error.type = tracing::field::Empty,
    );
    let traceparent = message
        .headers
        .iter()
        .find(|(name, _)| name.eq_ignore_ascii_case(trace::TRACEPARENT))
        .and_then(|(_, value)| trace::TraceParent::parse(value));
    if let Some(producer) = traceparent {
        trace::link(&span, &producer);
    }
    span
}

/// One message's publish, bounded by `timeout`, a panic caught as its failure.
async fn publish_one<S, P>(
    shared: &Shared<S, P>,
    message: &OutboxMessage,
    timeout: Duration,
    claimed_at: Instant,
) -> (Result<Ack, PublishError>, Duration)
where
    S: RelayStore,
    P: Publisher,
{
    // A panic is this message's failure: the batch's other messages are still marked and
    // the worker lives on. `publish` is called inside the guarded future, so a publisher
    // that panics before returning its future is caught too.
    let publish =
        AssertUnwindSafe(async { shared.publisher.publish(message).await }).catch_unwind();
    let result = match tokio::time::timeout(timeout, publish).await {
        Ok(Ok(result)) => result,
        Ok(Err(panic)) => Err(PublishError::new(
            PublishErrorKind::Panicked,
            panic_text(panic.as_ref()),
        )),
        Err(_) => Err(PublishError::kind_only(PublishErrorKind::Timeout)),
    };
    (result, claimed_at.elapsed())
}

/// Counts and logs the results of a batch's publishes.
fn publish_results<S, P>(
    shared: &Shared<S, P>,
    batch: &[OutboxMessage],
    sent: Sent,
    results: Vec<(Result<Ack, PublishError>, Duration)>,
    mut published: Published,
    mut report: BatchReport,
) -> Published
where
    S: RelayStore,
    P: Publisher,
{
    let destination = shared.publisher.destination();
    let mut confirmed = metrics::Confirmed::new(destination);
    for (message, (result, elapsed)) in batch.iter().zip(results) {
        match result {
            Ok(Ack { duplicate }) => {
                broker_answered(shared, sent, "a publish was confirmed");
                shared.held.forget(message.id);
                published.ids.push(message.id);
                report.published += 1;
                report.duplicates += u64::from(duplicate);
                let latency = message.age_at_claim.max(0.0) + elapsed.as_secs_f64();
                confirmed.record(latency, duplicate);
            }
            Err(error) => {
                if error.kind() == PublishErrorKind::Full {
                    // The broker answered (no room): whatever outage there was has ended.
                    broker_answered(shared, sent, "it answered that the destination is full");
                }
                let failure = failure(shared, message, sent, &error);
                report.failed += 1;
                report.dead_lettered += u64::from(failure.dead_letter);
                metrics::failed(destination, error.kind(), failure.dead_letter);
                if failure.dead_letter {
                    tracing::error!(id = %message.id, attempts = message.attempts, error = %failure.error, "outbox message dead-lettered");
                } else if error.kind() == PublishErrorKind::Full {
                    // Every event of a backlog is refused alike: one warning a minute at most.
                    tracing::debug!(id = %message.id, attempts = message.attempts, error = %failure.error, "outbox destination full; will retry");
                    if shared.full_warned.due(Instant::now(), FULL_WARNING_EVERY) {
                        tracing::warn!(
                            destination,
                            error = %failure.error,
                            "outbox destination full: it refuses publishes until room is made; \
                             events wait in the outbox, in their aggregates' order, retried \
                             without counting an attempt until it has refused them for \
                             relay.full-patience, then dead-lettered after max-attempts \
                             (outbox_publish_failures_total{{kind=\"full\"}} counts each refusal; \
                             logged once a minute at most)"
                        );
                    }
                } else if failure.transient {
                    // Counted; the outage is logged once, when it starts and when it ends.
                    tracing::debug!(id = %message.id, error = %failure.error, "outbox publish failed on the broker's side; will retry, not counted towards max-attempts");
                } else {
                    tracing::warn!(id = %message.id, attempts = message.attempts, error = %failure.error, "outbox publish failed; will retry");
                }
                published.failures.push(failure);
            }
        }
    }
    published.report = report;
    published
}

/// Marks what the broker confirmed published and records the failures; adds the batch to
/// the totals.
async fn mark<S, P>(shared: &Shared<S, P>, published: Published)
where
    S: RelayStore,
    P: Publisher,
{
    let Published {
        token,
        ids,
        failures,
        report,
    } = published;
    if !ids.is_empty() {
        retry(|| shared.store.mark_published(token, &ids)).await;
    }
    if !failures.is_empty() {
        retry(|| shared.store.mark_failed(token, &failures)).await;
    }
    shared.totals.add(&report);
}

/// The message of a panic (`panic!` with a literal or a format string), or a placeholder.
pub(super) fn panic_text(payload: &(dyn Any + Send)) -> String {
    if let Some(text) = payload.downcast_ref::<&str>() {
        (*text).to_owned()
    } else if let Some(text) = payload.downcast_ref::<String>() {
        text.clone()
    } else {
        "a panic without a message".to_owned()
    }
}

fn failure<S, P: Publisher>(
    shared: &Shared<S, P>,
    message: &OutboxMessage,
    sent: Sent,
    error: &PublishError,
) -> Failure {
    let mut text = error.chain();
    if text.contains('\0') {
        // PostgreSQL's text refuses NUL (the whole batch's mark would fail) and SQLite's
        // `substr` ends at it: every store gets U+FFFD in its place.
        text = text.replace('\0', "\u{fffd}");
    }
    if let Some((cut, _)) = text.char_indices().nth(MAX_ERROR_LEN) {
        text.truncate(cut);
    }
    let config = &shared.config;
    let kind = error.kind();
    // How long a full destination has refused the event: since its first refusal this relay
    // saw.
    // Another failure meanwhile (a timeout, the broker unavailable) does not start it again:
    // a blip a day would otherwise hold a message the destination refuses for good for ever.
    let refused_for = if kind == PublishErrorKind::Full {
        // An event this relay has not seen refused for `stale` is forgotten (published or held
        // by another relay, or gone): an hour, or a few backoffs if longer. A held event is
        // retried at least every `backoff.max` + lease by one of the relays sharing the outbox,
        // so each of up to a dozen relays sees it within the hour; entries of events that went
        // out through another relay leave room under the bound after an hour.
        let stale = config
            .backoff
            .max
            .saturating_add(config.lease())
            .saturating_mul(2)
            .saturating_add(config.poll_interval)
            .max(STALE_HELD);
        shared
            .held
            .refused(message.id, message.attempts, Instant::now(), stale)
    } else {
        None
    };
    let judged = judge(config, kind, message.attempts, refused_for);
    if judged == (Judged::Counted { dead_letter: true }) {
        shared.held.forget(message.id);
    }
    let (retry_in, dead_letter, transient) = match judged {
        // The broker's failure, not the message's: retried without counting the attempt,
        // after a delay that grows with the outage.
        Judged::Outage => {
            let (retry_in, started) =
                shared
                    .outage
                    .delay(&config.backoff, message.id, message.attempts, sent);
            if started {
                let destination = shared.publisher.destination();
                metrics::broker_state(destination, "lost");
                tracing::warn!(
                    destination,
                    error = %text,
                    "outbox broker lost: publishes fail on the broker's side; events wait in \
                     the outbox and are retried (not counted towards max-attempts); further \
                     failures are counted (outbox_publish_failures_total), not logged, until \
                     one is confirmed"
                );
            }
            (retry_in, false, true)
        }
        // No room at the destination, within the patience: not counted, retried after about
        // as long as it has been refused. Not the relay's outage state: other destinations
        // (subjects, queues) may take messages meanwhile.
        // Not remembered (too many held): its retry spaced by its age.
        Judged::Full => (
            backoff::after_wait(
                &config.backoff,
                message.id,
                refused_for.unwrap_or_else(|| age(message)),
            ),
            false,
            true,
        ),
        Judged::Counted { dead_letter } => (
            backoff::delay(&config.backoff, message.id, message.attempts),
            dead_letter,
            false,
        ),
    };
    Failure {
        id: message.id,
        error: text,
        retry_in,
        dead_letter,
        transient,
    }
}

/// What a failed publish leads to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Judged {
    /// The broker's failure ([`PublishErrorKind::is_transient`]): not counted, the delay
    /// grows with the outage.
    Outage,
    /// The destination is full and has refused the event for less than `full-patience`: not
    /// counted, the delay grows with the time it has been refused.
    Full,
    /// Counted towards `max-attempts`.
    Counted {
        /// The message goes to the dead letters.
        dead_letter: bool,
    },
}

/// How a failure of kind `kind`, at attempt `attempts`, is handled; `refused_for`: how long a
/// full destination has refused the event (for [`PublishErrorKind::Full`]; `None` when too
/// many are held to remember it, which is not counted until it is remembered, unless the
/// patience is `0s`).
fn judge(
    config: &RelayConfig,
    kind: PublishErrorKind,
    attempts: u32,
    refused_for: Option<Duration>,
) -> Judged {
    match kind {
        kind if kind.is_transient() => Judged::Outage,
        // A destination with no room now: the event waits (and its aggregate behind it) until
        // it has been refused for `full-patience`; then its refusals count, which bounds a
        // refusal that is for good (a message larger than the stream's `max_bytes`).
        PublishErrorKind::Full
            if refused_for.map_or(!config.full_patience.is_zero(), |refused| {
                refused < config.full_patience
            }) =>
        {
            Judged::Full
        }
        // A message the broker can never take as it is (a name too long for it...) is not
        // retried: it would only hold back its aggregate.
        PublishErrorKind::InvalidMessage => Judged::Counted { dead_letter: true },
        _ => Judged::Counted {
            dead_letter: attempts >= config.max_attempts,
        },
    }
}

/// How long ago the event was written: its age at the claim, on the database clock (the
/// relay's clock may run ahead of it); the relay's clock only for a store that leaves
/// `age_at_claim` at zero (the built-in stores set it).
fn age(message: &OutboxMessage) -> Duration {
    match Duration::try_from_secs_f64(message.age_at_claim) {
        Ok(at_claim) if !at_claim.is_zero() => at_claim,
        _ => (chrono::Utc::now() - message.created_at)
            .to_std()
            .unwrap_or(Duration::ZERO),
    }
}

/// The broker answered a publish sent in state `sent`: an outage it was in has ended, logged
/// once.
fn broker_answered<S, P: Publisher>(shared: &Shared<S, P>, sent: Sent, how: &str) {
    if let Some(lasted) = shared.outage.ended(sent) {
        let destination = shared.publisher.destination();
        metrics::broker_state(destination, "back");
        tracing::info!(destination, outage = ?lasted, "outbox broker back: {how}");
    }
}

/// How long, at least, a held event not refused again is remembered (see `failure`).
const STALE_HELD: Duration = Duration::from_secs(60 * 60);

/// Least time between two warnings that the destination is full.
const FULL_WARNING_EVERY: Duration = Duration::from_secs(60);

async fn retry<F, Fut>(mut call: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<u64, Error>>,
{
    for attempt in 1..=MARK_TRIES {
        match call().await {
            Ok(_) => return,
            Err(error) if attempt < MARK_TRIES => {
                tracing::warn!(
                    error = &error as &dyn std::error::Error,
                    attempt,
                    "outbox mark failed; retrying"
                );
                tokio::time::sleep(Duration::from_millis(100 * u64::from(attempt))).await;
            }
            Err(error) => {
                tracing::error!(
                    error = &error as &dyn std::error::Error,
                    "outbox mark failed; the rows will be published again after their lease"
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::{Judged, age, idle_wait, judge};
    use crate::config::RelayConfig;
    use crate::publisher::PublishErrorKind;

    /// A full destination's refusals are not counted while it has refused the event for less
    /// than `full-patience`, then count like any failure (before: counted from the first, so ten
    /// refusals over some eight minutes by default dead-lettered it). An outage is never
    /// counted; an invalid message is dead-lettered at once; `0s` of patience counts every
    /// refusal.
    #[test]
    fn a_full_destination_is_not_counted_within_the_patience() {
        let hour = Duration::from_secs(3600);
        let config = RelayConfig {
            max_attempts: 3,
            full_patience: hour,
            ..RelayConfig::default()
        };
        let full = PublishErrorKind::Full;
        let counted = |dead_letter| Judged::Counted { dead_letter };
        assert_eq!(
            judge(&config, full, 3, Some(hour - Duration::from_secs(1))),
            Judged::Full
        );
        assert_eq!(judge(&config, full, 9, Some(Duration::ZERO)), Judged::Full);
        assert_eq!(
            judge(&config, full, 2, Some(hour)),
            counted(false),
            "attempts left"
        );
        assert_eq!(judge(&config, full, 3, Some(hour)), counted(true));
        for other in [PublishErrorKind::Rejected, PublishErrorKind::Other] {
            assert_eq!(
                judge(&config, other, 2, Some(Duration::ZERO)),
                counted(false)
            );
            assert_eq!(
                judge(&config, other, 3, Some(Duration::ZERO)),
                counted(true)
            );
        }
        for outage in [PublishErrorKind::Unavailable, PublishErrorKind::Timeout] {
            assert_eq!(judge(&config, outage, 3, Some(hour * 2)), Judged::Outage);
        }
        assert_eq!(
            judge(
                &config,
                PublishErrorKind::InvalidMessage,
                1,
                Some(Duration::ZERO)
            ),
            counted(true)
        );
        let impatient = RelayConfig {
            full_patience: Duration::ZERO,
            ..config.clone()
        };
        assert_eq!(
            judge(&impatient, full, 3, Some(Duration::ZERO)),
            counted(true)
        );
        assert_eq!(
            judge(&impatient, full, 2, Some(Duration::ZERO)),
            counted(false)
        );
        // Not remembered (too many held): not counted, whatever its attempts (before: counted
        // from when it was written, so an old backlog past the bound was dead-lettered); with
        // `0s` of patience, counted as every refusal is.
        assert_eq!(judge(&config, full, 9, None), Judged::Full);
        assert_eq!(judge(&impatient, full, 9, None), counted(true));
    }

    /// The age is the age at the claim (database clock), whatever the relay's clock says; the
    /// relay's clock only when a store leaves the age at zero.
    #[test]
    fn the_age_is_the_age_at_claim_or_the_relays_clocks() {
        let written = chrono::Utc::now() - chrono::Duration::seconds(100);
        let message = crate::OutboxMessage::new(
            uuid::Uuid::now_v7(),
            "order",
            "o-1",
            None,
            "OrderPlaced",
            "{}",
            Default::default(),
            written,
            1,
        )
        .with_age_at_claim(5.0);
        let at_claim = age(&message);
        assert_eq!(
            at_claim,
            Duration::from_secs(5),
            "the database clock, though the relay's says 100s"
        );
        let mut message = message.with_age_at_claim(0.0);
        let now = age(&message);
        assert!(
            now >= Duration::from_secs(100) && now < Duration::from_secs(200),
            "{now:?}"
        );
        message.created_at = chrono::Utc::now() + chrono::Duration::seconds(100);
        let message = message.with_age_at_claim(-3.0);
        assert_eq!(age(&message), Duration::ZERO, "a clock behind, no panic");
    }

    #[test]
    fn a_worker_that_found_rows_looks_again_after_linger_and_otherwise_after_the_poll() {
        let mut config = RelayConfig {
            poll_interval: Duration::from_secs(1),
            linger: Duration::from_millis(20),
            ..RelayConfig::default()
        };
        assert_eq!(idle_wait(&config, true), Duration::from_millis(20));
        assert_eq!(idle_wait(&config, false), Duration::from_secs(1));
        config.linger = Duration::ZERO;
        assert_eq!(
            idle_wait(&config, true),
            Duration::from_secs(1),
            "0s: no look-again"
        );
        config.linger = Duration::from_secs(5);
        assert_eq!(
            idle_wait(&config, true),
            Duration::from_secs(1),
            "never past the poll"
        );
    }
}
