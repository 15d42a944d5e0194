//! A real consumer of the relay's stream: a durable JetStream pull consumer with explicit acks,
//! which accounts for what it receives ([`Accounting`], pure) and, in inbox mode, applies each
//! event through [`PgInbox`] in its own PostgreSQL transaction before the ack.
//!
//! What it checks, against the outbox table at the end ([`Verdict`]):
//! - arrival: every committed event was received (missing = outbox ids never received), and
//!   nothing else (unknown = ids not in the outbox);
//! - order: per aggregate (`Outbox-Aggregate-Type` / `Outbox-Aggregate-Id`), the first
//!   deliveries carry `Outbox-Sequence` 1, 2, 3... in the order the consumer received them;
//! - duplicates: a message id received again under another stream sequence was stored twice
//!   (the `Nats-Msg-Id` window did not absorb the relay's resend); the same stream message
//!   delivered again is a redelivery (no ack in time, or a restarted consumer), counted apart;
//! - inbox mode: every event applied exactly once (an effects row per event id, a per-aggregate
//!   counter equal to the aggregate's event count).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::future::Future;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use idempotency_outbox::publisher::headers;
use idempotency_outbox::publisher::nats::async_nats;
use idempotency_outbox::publisher::nats::async_nats::jetstream::{self, consumer};
use idempotency_pg::PgInbox;
use serde::Serialize;
use sqlx::{AssertSqlSafe, PgPool};

use crate::Error;

/// One delivery, as the consumer saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delivery {
    /// `Nats-Msg-Id`: the outbox id.
    pub id: String,
    /// `<aggregate type>/<aggregate id>`.
    pub aggregate: String,
    /// `Outbox-Sequence` (absent for unordered events).
    pub sequence: Option<i64>,
    /// The message's sequence in the stream.
    pub stream_sequence: u64,
}

/// What a delivery was, to the consumer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Seen {
    /// The first copy of this id.
    First,
    /// A stream message already delivered, delivered again.
    Redelivery,
    /// An id already received, stored again in the stream under another stream sequence.
    Duplicate,
}

/// At most this many order violations are kept as examples.
const EXAMPLES: usize = 10;

/// The consumer's counts: pure, fed one [`Delivery`] at a time.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Accounting {
    /// Deliveries, every copy included.
    pub deliveries: u64,
    /// Distinct ids received.
    pub received: u64,
    /// Stream messages delivered again ([`Seen::Redelivery`]).
    pub redeliveries: u64,
    /// Ids stored twice in the stream ([`Seen::Duplicate`]).
    pub duplicates: u64,
    /// First copies whose sequence was not the aggregate's previous one plus one.
    pub order_violations: u64,
    /// The first few, as `<aggregate>: expected <n>, got <m>`.
    pub order_examples: Vec<String>,
    /// First copies without a sequence (unordered events: no order to check).
    pub without_sequence: u64,
    #[serde(skip)]
    strict_start: bool,
    #[serde(skip)]
    stream_sequences: HashSet<u64>,
    #[serde(skip)]
    ids: HashMap<String, u64>,
    #[serde(skip)]
    last: HashMap<String, i64>,
}

impl Accounting {
    /// Empty counts. With `strict_start` the first event received of each aggregate must be
    /// its sequence 1 (a consumer that read the stream from its beginning); without, any
    /// sequence may come first (a consumer restarted mid-stream) and order is checked from it.
    ///
    /// ```
    /// use idempotency_load::chaos::consume::{Accounting, Delivery, Seen};
    ///
    /// let mut seen = Accounting::new(true);
    /// let d = |id: &str, seq, stream| Delivery {
    ///     id: id.into(), aggregate: "order/1".into(), sequence: Some(seq), stream_sequence: stream,
    /// };
    /// assert_eq!(seen.observe(&d("a", 1, 1)), Seen::First);
    /// assert_eq!(seen.observe(&d("b", 2, 2)), Seen::First);
    /// assert_eq!(seen.observe(&d("a", 1, 3)), Seen::Duplicate); // stored twice in the stream
    /// assert_eq!((seen.received, seen.duplicates, seen.order_violations), (2, 1, 0));
    /// ```
    pub fn new(strict_start: bool) -> Self {
        Self {
            strict_start,
            ..Self::default()
        }
    }

    /// Counts one delivery and says what it was.
    pub fn observe(&mut self, delivery: &Delivery) -> Seen {
        self.deliveries += 1;
        if !self.stream_sequences.insert(delivery.stream_sequence) {
            self.redeliveries += 1;
            return Seen::Redelivery;
        }
        if self.ids.contains_key(&delivery.id) {
            self.duplicates += 1;
            return Seen::Duplicate;
        }
        self.ids
            .insert(delivery.id.clone(), delivery.stream_sequence);
        self.received += 1;
        let Some(sequence) = delivery.sequence else {
            self.without_sequence += 1;
            return Seen::First;
        };
        let expected = match self.last.get(&delivery.aggregate) {
            Some(last) => Some(last + 1),
            None => self.strict_start.then_some(1),
        };
        if expected.is_some_and(|e| e != sequence) {
            self.order_violations += 1;
            if self.order_examples.len() < EXAMPLES {
                self.order_examples.push(format!(
                    "{}: expected {}, got {sequence}",
                    delivery.aggregate,
                    expected.unwrap_or_default()
                ));
            }
        }
        // A later sequence moves the mark forward; an earlier one (out of order) does not.
        let last = self.last.entry(delivery.aggregate.clone()).or_insert(0);
        *last = (*last).max(sequence);
        Seen::First
    }

    /// Whether `id` was received.
    pub fn has(&self, id: &str) -> bool {
        self.ids.contains_key(id)
    }

    /// How many distinct ids were received that `known` does not hold.
    pub fn unknown(&self, known: &HashSet<String>) -> u64 {
        self.ids.keys().filter(|id| !known.contains(*id)).count() as u64
    }
}

/// One row of the outbox table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutboxRow {
    /// The outbox id.
    pub id: String,
    /// `<aggregate type>/<aggregate id>`.
    pub aggregate: String,
    /// Marked published.
    pub published: bool,
    /// Dead-lettered.
    pub dead_lettered: bool,
}

/// What the outbox committed, compared with what the consumer received.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Arrival {
    /// Rows in the outbox.
    pub events: u64,
    /// Rows marked published.
    pub published_rows: u64,
    /// Rows neither published nor dead-lettered.
    pub pending_rows: u64,
    /// Rows dead-lettered.
    pub dead_lettered_rows: u64,
    /// Aggregates in the outbox.
    pub aggregates: u64,
    /// Aggregates with more than one event: those whose order is tested.
    pub multi_event_aggregates: u64,
    /// Events of those aggregates.
    pub events_in_multi_event_aggregates: u64,
    /// Outbox ids never received.
    pub missing: u64,
    /// Ids received that are not in the outbox.
    pub unknown: u64,
    /// Events per aggregate type (`charge`, `chaos`).
    pub per_aggregate_type: BTreeMap<String, u64>,
}

impl Arrival {
    /// Compares the outbox `rows` with what `seen` received.
    pub fn of(rows: &[OutboxRow], seen: &Accounting) -> Self {
        let mut per_aggregate: HashMap<&str, u64> = HashMap::new();
        let mut per_type = BTreeMap::new();
        for row in rows {
            *per_aggregate.entry(row.aggregate.as_str()).or_default() += 1;
            let kind = row.aggregate.split('/').next().unwrap_or_default();
            *per_type.entry(kind.to_owned()).or_default() += 1;
        }
        let known: HashSet<String> = rows.iter().map(|r| r.id.clone()).collect();
        let count =
            |holds: &dyn Fn(&OutboxRow) -> bool| rows.iter().filter(|r| holds(r)).count() as u64;
        Self {
            events: rows.len() as u64,
            published_rows: count(&|r| r.published),
            pending_rows: count(&|r| !r.published && !r.dead_lettered),
            dead_lettered_rows: count(&|r| r.dead_lettered),
            aggregates: per_aggregate.len() as u64,
            multi_event_aggregates: per_aggregate.values().filter(|&&n| n > 1).count() as u64,
            events_in_multi_event_aggregates: per_aggregate.values().filter(|&&n| n > 1).sum(),
            missing: count(&|r| !seen.has(&r.id)),
            unknown: seen.unknown(&known),
            per_aggregate_type: per_type,
        }
    }
}

/// Inbox mode: what this process applied, and the effects table checked at the end.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Applied {
    /// Deliveries this process applied (the inbox said new).
    pub applied: u64,
    /// Deliveries the inbox refused as already processed (by this or an earlier process).
    pub refused_by_inbox: u64,
    /// Acks deliberately not sent after the commit (`--skip-ack-every`): each comes back as a
    /// redelivery that the inbox must refuse.
    pub acks_skipped: u64,
    /// Rows of the effects table.
    pub effects: u64,
    /// Effects rows beyond one per event id (an event applied twice).
    pub applied_twice: u64,
    /// Outbox ids without an effects row.
    pub not_applied: u64,
    /// Effects rows whose event id is not in the outbox.
    pub unknown_effects: u64,
    /// Aggregates whose applied counter differs from their outbox event count.
    pub counter_mismatches: u64,
    /// Effects whose sequence is not its aggregate's previous applied one plus one, in the
    /// order applied (a figure, not a guarantee: a restarted consumer gets its unacked messages
    /// back only after the ack wait, behind newer ones).
    pub application_order_violations: u64,
}

/// The verdict of a consumer run.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Verdict {
    /// The durable consumer's name.
    pub consumer: String,
    /// What this process received.
    pub seen: Accounting,
    /// The outbox compared with it.
    pub arrival: Arrival,
    /// Inbox mode only.
    pub inbox: Option<Applied>,
    /// The bound on [`Accounting::duplicates`] it was checked against.
    pub duplicate_bound: u64,
    /// Seconds the drain after the stop took.
    pub drain_seconds: f64,
    /// Every guarantee that does not hold (empty: all hold).
    pub violations: Vec<String>,
}

impl Verdict {
    /// Names each broken guarantee. `check_arrival_and_order`: this process read the whole
    /// stream (not a restarted inbox consumer, whose predecessor received a part).
    pub fn check(&self, check_arrival_and_order: bool) -> Vec<String> {
        let mut violations = Vec::new();
        let mut fail = |holds: bool, what: String| {
            if !holds {
                violations.push(what);
            }
        };
        let a = &self.arrival;
        fail(a.events > 0, "the outbox is empty".into());
        fail(
            a.pending_rows == 0 && a.dead_lettered_rows == 0,
            format!(
                "{} rows pending, {} dead-lettered",
                a.pending_rows, a.dead_lettered_rows
            ),
        );
        if check_arrival_and_order {
            fail(
                a.missing == 0,
                format!("{} committed events never received", a.missing),
            );
            fail(
                self.seen.order_violations == 0,
                format!(
                    "{} events out of per-aggregate order: {}",
                    self.seen.order_violations,
                    self.seen.order_examples.join("; ")
                ),
            );
        }
        fail(
            a.unknown == 0,
            format!("{} received ids not in the outbox", a.unknown),
        );
        fail(
            self.seen.duplicates <= self.duplicate_bound,
            format!(
                "{} duplicates in the stream, above the bound {}",
                self.seen.duplicates, self.duplicate_bound
            ),
        );
        if let Some(i) = &self.inbox {
            fail(
                i.applied_twice == 0,
                format!("{} events applied twice", i.applied_twice),
            );
            fail(
                i.not_applied == 0,
                format!("{} events never applied", i.not_applied),
            );
            fail(
                i.unknown_effects == 0,
                format!("{} effects of unknown events", i.unknown_effects),
            );
            fail(
                i.counter_mismatches == 0,
                format!(
                    "{} aggregates with a wrong applied counter",
                    i.counter_mismatches
                ),
            );
        }
        violations
    }
}

/// Inbox mode: the inbox and the effects tables, in the database of the outbox.
#[derive(Debug, Clone)]
pub struct InboxMode {
    /// The inbox.
    pub inbox: PgInbox,
    /// The effects table (a plain identifier); `<effects>_counters` holds the counters.
    pub effects: String,
    /// Skip the ack of every Nth first delivery, after its commit (0: never).
    pub skip_ack_every: u64,
}

/// How the consumer reads.
#[derive(Debug, Clone)]
pub struct ConsumerConfig {
    /// The stream.
    pub stream: String,
    /// The durable consumer's name (also the inbox's consumer name).
    pub durable: String,
    /// How long JetStream waits for an ack before it redelivers.
    pub ack_wait: Duration,
    /// After the stop, give up waiting for the consumer to catch up after this long.
    pub drain_timeout: Duration,
    /// See [`Accounting::new`].
    pub strict_start: bool,
}

fn plain(name: &str) -> Result<&str, Error> {
    if name.is_empty() || !name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
        return Err(Error::Invalid(format!("not a plain table name: {name}")));
    }
    Ok(name)
}

/// Creates the effects tables of inbox mode (`<effects>`: one row per application, with no
/// unique constraint, so that an event applied twice is counted rather than refused;
/// `<effects>_counters`: applied events per aggregate).
pub async fn create_effects(pool: &PgPool, effects: &str) -> Result<(), Error> {
    let t = plain(effects)?;
    for sql in [
        format!(
            "CREATE TABLE IF NOT EXISTS {t} (applied BIGSERIAL PRIMARY KEY, event_id TEXT NOT NULL, \
             aggregate TEXT NOT NULL, sequence BIGINT)"
        ),
        format!(
            "CREATE TABLE IF NOT EXISTS {t}_counters (aggregate TEXT PRIMARY KEY, applied BIGINT NOT NULL)"
        ),
    ] {
        sqlx::query(AssertSqlSafe(sql)).execute(pool).await?;
    }
    Ok(())
}

async fn apply(
    pool: &PgPool,
    mode: &InboxMode,
    consumer: &str,
    delivery: &Delivery,
) -> Result<bool, Error> {
    let t = &mode.effects;
    let mut tx = pool.begin().await?;
    let fresh = mode.inbox.record(&mut tx, consumer, &delivery.id).await?;
    if fresh {
        sqlx::query(AssertSqlSafe(format!(
            "INSERT INTO {t} (event_id, aggregate, sequence) VALUES ($1, $2, $3)"
        )))
        .bind(&delivery.id)
        .bind(&delivery.aggregate)
        .bind(delivery.sequence)
        .execute(&mut *tx)
        .await?;
        sqlx::query(AssertSqlSafe(format!(
            "INSERT INTO {t}_counters (aggregate, applied) VALUES ($1, 1) \
             ON CONFLICT (aggregate) DO UPDATE SET applied = {t}_counters.applied + 1"
        )))
        .bind(&delivery.aggregate)
        .execute(&mut *tx)
        .await?;
    }
    tx.commit().await?;
    Ok(fresh)
}

async fn outbox_rows(pool: &PgPool, table: &str) -> Result<Vec<OutboxRow>, Error> {
    let t = plain(table)?;
    let rows: Vec<(String, String, bool, bool)> = sqlx::query_as(AssertSqlSafe(format!(
        "SELECT id::text, aggregate_type || '/' || aggregate_id, published_at IS NOT NULL, \
         dead_lettered_at IS NOT NULL FROM {t}"
    )))
    .fetch_all(pool)
    .await?;
    Ok(rows
        .into_iter()
        .map(|(id, aggregate, published, dead_lettered)| OutboxRow {
            id,
            aggregate,
            published,
            dead_lettered,
        })
        .collect())
}

async fn scalar(pool: &PgPool, sql: String) -> Result<u64, Error> {
    let n: i64 = sqlx::query_scalar(AssertSqlSafe(sql))
        .fetch_one(pool)
        .await?;
    Ok(u64::try_from(n).unwrap_or_default())
}

async fn check_effects(
    pool: &PgPool,
    table: &str,
    effects: &str,
    applied: &mut Applied,
) -> Result<(), Error> {
    let (o, t) = (plain(table)?, plain(effects)?);
    applied.effects = scalar(pool, format!("SELECT count(*) FROM {t}")).await?;
    applied.applied_twice =
        applied.effects - scalar(pool, format!("SELECT count(DISTINCT event_id) FROM {t}")).await?;
    applied.not_applied = scalar(
        pool,
        format!("SELECT count(*) FROM {o} o WHERE NOT EXISTS (SELECT 1 FROM {t} e WHERE e.event_id = o.id::text)"),
    )
    .await?;
    applied.unknown_effects = scalar(
        pool,
        format!("SELECT count(*) FROM {t} e WHERE NOT EXISTS (SELECT 1 FROM {o} o WHERE o.id::text = e.event_id)"),
    )
    .await?;
    applied.counter_mismatches = scalar(
        pool,
        format!(
            "SELECT count(*) FROM (SELECT aggregate_type || '/' || aggregate_id AS aggregate, count(*) AS n \
             FROM {o} GROUP BY 1) x FULL JOIN {t}_counters c USING (aggregate) \
             WHERE x.n IS DISTINCT FROM c.applied"
        ),
    )
    .await?;
    applied.application_order_violations = scalar(
        pool,
        format!(
            "SELECT count(*) FROM (SELECT sequence, lag(sequence) OVER (PARTITION BY aggregate ORDER BY applied) AS prev \
             FROM {t} WHERE sequence IS NOT NULL) x WHERE sequence <> coalesce(prev, 0) + 1"
        ),
    )
    .await?;
    Ok(())
}

fn delivery_of(message: &jetstream::Message) -> Result<Delivery, Error> {
    let info = message.info().map_err(|e| Error::nats("message info", e))?;
    let header = |name| {
        message
            .headers
            .as_ref()
            .and_then(|h| h.get(name))
            .map(|v| v.as_str().to_owned())
    };
    Ok(Delivery {
        id: header("Nats-Msg-Id").unwrap_or_default(),
        aggregate: format!(
            "{}/{}",
            header(headers::AGGREGATE_TYPE).unwrap_or_default(),
            header(headers::AGGREGATE_ID).unwrap_or_default()
        ),
        sequence: header(headers::SEQUENCE).and_then(|s| s.parse().ok()),
        stream_sequence: info.stream_sequence,
    })
}

/// Consumes `config.stream` through the durable pull consumer `config.durable` (created if
/// missing: explicit acks, from the start of the stream) until `stop` completes and then until
/// the consumer has nothing pending or unacknowledged (bounded by `config.drain_timeout`);
/// calls `ready` once the consumer exists. In inbox mode each delivery is applied in its own
/// transaction, then acked. Compares what it received with the outbox `table`.
#[allow(clippy::too_many_arguments)]
pub async fn run(
    client: &async_nats::Client,
    pool: &PgPool,
    table: &str,
    config: &ConsumerConfig,
    inbox: Option<&InboxMode>,
    duplicate_bound: u64,
    ready: impl FnOnce(),
    stop: impl Future<Output = ()>,
) -> Result<Verdict, Error> {
    let js = jetstream::new(client.clone());
    let stream = js
        .get_stream(&config.stream)
        .await
        .map_err(|e| Error::nats("get stream", e))?;
    let consumer: consumer::PullConsumer = stream
        .get_or_create_consumer(
            &config.durable,
            consumer::pull::Config {
                durable_name: Some(config.durable.clone()),
                ack_policy: consumer::AckPolicy::Explicit,
                ack_wait: config.ack_wait,
                ..Default::default()
            },
        )
        .await
        .map_err(|e| Error::nats("create consumer", e))?;
    let mut messages = consumer
        .messages()
        .await
        .map_err(|e| Error::nats("consume", e))?;
    ready();
    let mut seen = Accounting::new(config.strict_start);
    let mut applied = inbox.map(|_| Applied::default());
    let mut firsts = 0u64;
    let mut stopped_at: Option<Instant> = None;
    tokio::pin!(stop);
    loop {
        let next = tokio::select! {
            () = &mut stop, if stopped_at.is_none() => {
                stopped_at = Some(Instant::now());
                continue;
            }
            next = tokio::time::timeout(Duration::from_millis(500), messages.next()) => next,
        };
        let message = match next {
            Ok(Some(Ok(message))) => message,
            Ok(Some(Err(error))) => {
                tracing::warn!(%error, "pull failed; pulling again");
                continue;
            }
            Ok(None) => break,
            Err(_) => {
                // Quiet for 500 ms: after the stop, done once nothing is pending or unacked.
                if let Some(at) = stopped_at {
                    let info = consumer
                        .get_info()
                        .await
                        .map_err(|e| Error::nats("consumer info", e))?;
                    if (info.num_pending == 0 && info.num_ack_pending == 0)
                        || at.elapsed() > config.drain_timeout
                    {
                        break;
                    }
                }
                continue;
            }
        };
        let delivery = delivery_of(&message)?;
        let what = seen.observe(&delivery);
        let mut ack = true;
        if let (Some(mode), Some(applied)) = (inbox, applied.as_mut()) {
            if apply(pool, mode, &config.durable, &delivery).await? {
                applied.applied += 1;
            } else {
                applied.refused_by_inbox += 1;
            }
            if what == Seen::First {
                firsts += 1;
                if mode.skip_ack_every > 0 && firsts.is_multiple_of(mode.skip_ack_every) {
                    applied.acks_skipped += 1;
                    ack = false;
                }
            }
        }
        if ack {
            message.ack().await.map_err(|e| Error::nats("ack", e))?;
        }
    }
    let drain_seconds = stopped_at.map_or(0.0, |at| at.elapsed().as_secs_f64());
    let rows = outbox_rows(pool, table).await?;
    let arrival = Arrival::of(&rows, &seen);
    if let (Some(mode), Some(applied)) = (inbox, applied.as_mut()) {
        check_effects(pool, table, &mode.effects, applied).await?;
    }
    let mut verdict = Verdict {
        consumer: config.durable.clone(),
        seen,
        arrival,
        inbox: applied,
        duplicate_bound,
        drain_seconds,
        violations: Vec::new(),
    };
    verdict.violations = verdict.check(config.strict_start);
    Ok(verdict)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(id: &str, aggregate: &str, sequence: i64, stream_sequence: u64) -> Delivery {
        Delivery {
            id: id.into(),
            aggregate: aggregate.into(),
            sequence: Some(sequence),
            stream_sequence,
        }
    }

    #[test]
    fn redeliveries_and_stored_duplicates_are_told_apart_and_do_not_break_order() {
        let mut seen = Accounting::new(true);
        let order = [
            (d("a1", "a", 1, 1), Seen::First),
            (d("b1", "b", 1, 2), Seen::First),
            (d("a2", "a", 2, 3), Seen::First),
            (d("a1", "a", 1, 1), Seen::Redelivery), // no ack in time
            (d("a1", "a", 1, 4), Seen::Duplicate),  // resent after the window: stored again
            (d("a3", "a", 3, 5), Seen::First),
            (d("b2", "b", 2, 6), Seen::First),
        ];
        for (delivery, expected) in &order {
            assert_eq!(seen.observe(delivery), *expected, "{delivery:?}");
        }
        assert_eq!(
            (
                seen.deliveries,
                seen.received,
                seen.redeliveries,
                seen.duplicates
            ),
            (7, 5, 1, 1)
        );
        assert_eq!(seen.order_violations, 0, "{:?}", seen.order_examples);
    }

    #[test]
    fn an_overtaking_event_a_gap_and_a_late_first_event_are_order_violations() {
        let mut seen = Accounting::new(true);
        seen.observe(&d("a2", "a", 2, 1)); // the aggregate's first event must be 1
        seen.observe(&d("a1", "a", 1, 2)); // came after its successor
        seen.observe(&d("b1", "b", 1, 3));
        seen.observe(&d("b3", "b", 3, 4)); // b2 skipped
        seen.observe(&d("b4", "b", 4, 5)); // in order after b3
        assert_eq!(seen.order_violations, 3, "{:?}", seen.order_examples);
        assert_eq!(seen.order_examples[0], "a: expected 1, got 2");
        assert_eq!(seen.order_examples[1], "a: expected 3, got 1");
        assert_eq!(seen.order_examples[2], "b: expected 2, got 3");

        // Restarted mid-stream: the first event seen of an aggregate may be any.
        let mut resumed = Accounting::new(false);
        resumed.observe(&d("a7", "a", 7, 10));
        resumed.observe(&d("a8", "a", 8, 11));
        assert_eq!(resumed.order_violations, 0);
        let unordered = Delivery {
            sequence: None,
            ..d("u", "u", 0, 12)
        };
        resumed.observe(&unordered);
        assert_eq!((resumed.without_sequence, resumed.order_violations), (1, 0));
    }

    fn row(id: &str, aggregate: &str) -> OutboxRow {
        OutboxRow {
            id: id.into(),
            aggregate: aggregate.into(),
            published: true,
            dead_lettered: false,
        }
    }

    #[test]
    fn arrival_names_missing_and_unknown_ids_and_the_aggregates_whose_order_is_tested() {
        let mut seen = Accounting::new(true);
        seen.observe(&d("a1", "chaos/a", 1, 1));
        seen.observe(&d("x", "chaos/x", 1, 2));
        let rows = [
            row("a1", "chaos/a"),
            row("a2", "chaos/a"),
            row("c", "charge/c"),
        ];
        let arrival = Arrival::of(&rows, &seen);
        assert_eq!(
            (arrival.events, arrival.missing, arrival.unknown),
            (3, 2, 1),
            "a2 and c missing, x unknown"
        );
        assert_eq!((arrival.aggregates, arrival.multi_event_aggregates), (2, 1));
        assert_eq!(arrival.events_in_multi_event_aggregates, 2);
        assert_eq!(
            arrival.per_aggregate_type,
            BTreeMap::from([("chaos".to_owned(), 2), ("charge".to_owned(), 1)])
        );
    }

    #[test]
    fn a_verdict_names_each_broken_guarantee() {
        let mut seen = Accounting::new(true);
        seen.observe(&d("a1", "chaos/a", 1, 1));
        seen.observe(&d("a1", "chaos/a", 1, 2));
        let verdict = |duplicate_bound, inbox| Verdict {
            consumer: "c".into(),
            arrival: Arrival::of(&[row("a1", "chaos/a")], &seen),
            seen: seen.clone(),
            inbox,
            duplicate_bound,
            drain_seconds: 0.0,
            violations: Vec::new(),
        };
        assert!(verdict(1, None).check(true).is_empty());
        assert!(verdict(0, None).check(true)[0].contains("above the bound 0"));
        let twice = Applied {
            applied_twice: 1,
            ..Applied::default()
        };
        assert_eq!(
            verdict(1, Some(twice)).check(true),
            ["1 events applied twice"]
        );
        let missing = Verdict {
            arrival: Arrival::of(&[row("a1", "chaos/a"), row("a2", "chaos/a")], &seen),
            ..verdict(1, None)
        };
        assert_eq!(missing.check(true), ["1 committed events never received"]);
        assert!(
            missing.check(false).is_empty(),
            "a restarted consumer: arrival not its to check"
        );
    }
}
