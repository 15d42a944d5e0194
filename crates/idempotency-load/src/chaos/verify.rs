//! After the kills: nothing lost, nothing stored twice, and the duplicates each kill caused.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::Duration;

use futures_util::StreamExt;
use idempotency_outbox::publisher::nats::async_nats;
use idempotency_outbox::publisher::nats::async_nats::jetstream::{self, consumer};
use serde::Serialize;
use sqlx::{self, AssertSqlSafe, PgPool};

use super::acks::AckLogs;
use super::watch::Watched;
use crate::Error;

/// The verdict, with every figure it rests on.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Verdict {
    /// Rows in the outbox.
    pub events: u64,
    /// Rows marked published.
    pub published_rows: u64,
    /// Rows neither published nor dead-lettered.
    pub pending_rows: u64,
    /// Rows dead-lettered.
    pub dead_lettered_rows: u64,
    /// Messages stored in the stream.
    pub stream_messages: u64,
    /// Outbox ids missing from the stream (lost).
    pub missing_from_stream: u64,
    /// Stream messages whose id is not an outbox id, or a second copy of one.
    pub extra_in_stream: u64,
    /// Relay processes started (each was killed with `SIGKILL`).
    pub relay_processes: u64,
    /// Broker acks the relay processes logged, copies included.
    pub acks: u64,
    /// Acks in which JetStream reported a duplicate (`Nats-Msg-Id` already stored).
    pub acks_reported_duplicate: u64,
    /// Copies that reached the server (core subscription), before JetStream's deduplication.
    pub deliveries: u64,
    /// Distinct ids among them.
    pub delivered_ids: u64,
    /// `deliveries - delivered_ids`: copies published more than once.
    pub duplicate_deliveries: u64,
    /// Outbox ids the core subscription never saw (it is at-most-once; the stream decides).
    pub missing_from_subscription: u64,
    /// Copies that reached the server with no ack logged (the relay died before the ack).
    pub deliveries_without_logged_ack: u64,
    /// Per killed process, the messages it had sent that a later process sent again (counted
    /// from the copies the subscription saw, each tagged with its sender): the in-flight rows
    /// its death cost. Maximum over the kills.
    pub resent_per_kill_max: u64,
    /// Mean of the above over all kills.
    pub resent_per_kill_mean: f64,
    /// How many kills cost 0, 1, 2... resent messages.
    pub resent_per_kill: BTreeMap<u64, u64>,
    /// Of those, per kill, the ones JetStream had already acknowledged to the killed process
    /// (it died between the ack and the mark; counted from the ack logs). Maximum.
    pub acked_then_resent_per_kill_max: u64,
    /// The bound: `2 * workers * batch-size` messages in flight per process (each worker's
    /// two batches in flight: a full one publishing or being marked, and the next one).
    pub in_flight_bound: u64,
    /// Every guarantee that does not hold (empty: all hold).
    pub violations: Vec<String>,
}

async fn count(pool: &PgPool, table: &str, filter: &str) -> Result<u64, Error> {
    let sql = format!("SELECT count(*) FROM {table} {filter}");
    let n: i64 = sqlx::query_scalar(AssertSqlSafe(sql))
        .fetch_one(pool)
        .await?;
    Ok(u64::try_from(n).unwrap_or_default())
}

/// Every message of `stream`, as `Nats-Msg-Id`s (each wait for the next bounded by 10 s).
async fn stream_ids(js: &jetstream::Context, stream: &str) -> Result<(u64, Vec<String>), Error> {
    let stream = js
        .get_stream(stream)
        .await
        .map_err(|e| Error::nats("get stream", e))?;
    let stored = stream
        .get_info()
        .await
        .map_err(|e| Error::nats("stream info", e))?
        .state
        .messages;
    let consumer: consumer::PullConsumer = stream
        .create_consumer(consumer::pull::Config {
            ack_policy: consumer::AckPolicy::None,
            ..Default::default()
        })
        .await
        .map_err(|e| Error::nats("create consumer", e))?;
    let mut messages = consumer
        .messages()
        .await
        .map_err(|e| Error::nats("consume", e))?;
    let mut ids = Vec::with_capacity(usize::try_from(stored).unwrap_or_default());
    while (ids.len() as u64) < stored {
        match tokio::time::timeout(Duration::from_secs(10), messages.next()).await {
            Ok(Some(Ok(message))) => ids.push(
                message
                    .headers
                    .as_ref()
                    .and_then(|h| h.get("Nats-Msg-Id"))
                    .map(|v| v.as_str().to_owned())
                    .unwrap_or_default(),
            ),
            Ok(Some(Err(error))) => return Err(Error::nats("read stream", error)),
            Ok(None) | Err(_) => break,
        }
    }
    Ok((stored, ids))
}

/// Checks the outbox `table` (a plain identifier), the `stream`, the relays' `acks` and the
/// subscription's `watched` against each other; `in_flight_bound` is
/// `2 * workers * batch-size` (each worker's two batches in flight: a full one publishing or
/// being marked, and the next one).
pub async fn run(
    pool: &PgPool,
    table: &str,
    client: &async_nats::Client,
    stream: &str,
    acks: &AckLogs,
    watched: &Watched,
    in_flight_bound: u64,
) -> Result<Verdict, Error> {
    if table.is_empty()
        || !table
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_')
    {
        return Err(Error::Invalid(format!("not a plain table name: {table}")));
    }
    let events = count(pool, table, "").await?;
    let published_rows = count(pool, table, "WHERE published_at IS NOT NULL").await?;
    let dead_lettered_rows = count(pool, table, "WHERE dead_lettered_at IS NOT NULL").await?;
    let pending_rows = count(
        pool,
        table,
        "WHERE published_at IS NULL AND dead_lettered_at IS NULL",
    )
    .await?;
    let sql = format!("SELECT id::text FROM {table}");
    let outbox_ids: HashSet<String> = sqlx::query_scalar(AssertSqlSafe(sql))
        .fetch_all(pool)
        .await?
        .into_iter()
        .collect();

    let (stream_messages, in_stream) = stream_ids(&jetstream::new(client.clone()), stream).await?;
    let stream_set: HashSet<&String> = in_stream.iter().collect();
    let missing_from_stream = outbox_ids
        .iter()
        .filter(|id| !stream_set.contains(id))
        .count();
    let extra_in_stream = in_stream.len()
        - in_stream
            .iter()
            .filter(|id| outbox_ids.contains(*id))
            .collect::<HashSet<_>>()
            .len();

    // Which processes acked each id, in start order.
    let mut acked_by: HashMap<&str, Vec<usize>> = HashMap::new();
    for (life, lines) in acks.lives.iter().enumerate() {
        for (id, _) in lines {
            acked_by.entry(id.as_str()).or_default().push(life);
        }
    }
    let acked_then_resent = acks
        .lives
        .iter()
        .enumerate()
        .map(|(life, lines)| {
            lines
                .iter()
                .filter(|(id, _)| acked_by[id.as_str()].iter().any(|&l| l > life))
                .count() as u64
        })
        .max()
        .unwrap_or_default();
    let lives = acks.lives.len() as u64;
    let resent = watched.resent_after();
    let mut resent_per_kill = BTreeMap::new();
    for life in 1..=lives {
        *resent_per_kill
            .entry(resent.get(&life).copied().unwrap_or(0))
            .or_default() += 1;
    }
    let acks_total: u64 = acks.lives.iter().map(|l| l.len() as u64).sum();
    let duplicate_deliveries = watched.deliveries - watched.unique();
    let mut verdict = Verdict {
        events,
        published_rows,
        pending_rows,
        dead_lettered_rows,
        stream_messages,
        missing_from_stream: missing_from_stream as u64,
        extra_in_stream: extra_in_stream as u64,
        relay_processes: lives,
        acks: acks_total,
        acks_reported_duplicate: acks.lives.iter().flatten().filter(|(_, d)| *d).count() as u64,
        deliveries: watched.deliveries,
        delivered_ids: watched.unique(),
        duplicate_deliveries,
        missing_from_subscription: outbox_ids
            .iter()
            .filter(|id| !watched.copies.contains_key(*id))
            .count() as u64,
        deliveries_without_logged_ack: watched.deliveries.saturating_sub(acks_total),
        resent_per_kill_max: resent.values().copied().max().unwrap_or_default(),
        resent_per_kill_mean: resent.values().sum::<u64>() as f64 / lives.max(1) as f64,
        resent_per_kill,
        acked_then_resent_per_kill_max: acked_then_resent,
        in_flight_bound,
        violations: Vec::new(),
    };
    verdict.violations = verdict.check();
    Ok(verdict)
}

impl Verdict {
    fn check(&self) -> Vec<String> {
        let mut violations = Vec::new();
        let mut fail = |holds: bool, what: String| {
            if !holds {
                violations.push(what);
            }
        };
        fail(self.events > 0, "the outbox is empty".into());
        fail(
            self.published_rows == self.events && self.pending_rows == 0,
            format!(
                "{} of {} rows published, {} pending",
                self.published_rows, self.events, self.pending_rows
            ),
        );
        fail(
            self.missing_from_stream == 0,
            format!(
                "{} events lost (not in the stream)",
                self.missing_from_stream
            ),
        );
        fail(
            self.extra_in_stream == 0 && self.stream_messages == self.events,
            format!(
                "the stream holds {} messages for {} events",
                self.stream_messages, self.events
            ),
        );
        fail(
            self.resent_per_kill_max <= self.in_flight_bound,
            format!(
                "a kill cost {} resent messages, above the in-flight bound {}",
                self.resent_per_kill_max, self.in_flight_bound
            ),
        );
        fail(
            self.duplicate_deliveries <= self.relay_processes * self.in_flight_bound,
            format!(
                "{} duplicate deliveries for {} kills, above {} per kill",
                self.duplicate_deliveries, self.relay_processes, self.in_flight_bound
            ),
        );
        violations
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn verdict() -> Verdict {
        Verdict {
            events: 10,
            published_rows: 10,
            pending_rows: 0,
            dead_lettered_rows: 0,
            stream_messages: 10,
            missing_from_stream: 0,
            extra_in_stream: 0,
            relay_processes: 2,
            acks: 12,
            acks_reported_duplicate: 2,
            deliveries: 12,
            delivered_ids: 10,
            duplicate_deliveries: 2,
            missing_from_subscription: 0,
            deliveries_without_logged_ack: 0,
            resent_per_kill_max: 2,
            resent_per_kill_mean: 1.0,
            resent_per_kill: BTreeMap::from([(0, 1), (2, 1)]),
            acked_then_resent_per_kill_max: 1,
            in_flight_bound: 2,
            violations: Vec::new(),
        }
    }

    #[test]
    fn a_clean_run_holds_and_each_broken_guarantee_is_named() {
        assert!(verdict().check().is_empty());
        let lost = Verdict {
            missing_from_stream: 1,
            ..verdict()
        };
        assert!(lost.check()[0].contains("lost"));
        let too_many = Verdict {
            resent_per_kill_max: 3,
            ..verdict()
        };
        assert!(too_many.check()[0].contains("in-flight bound"));
        let pending = Verdict {
            published_rows: 9,
            pending_rows: 1,
            ..verdict()
        };
        assert_eq!(pending.check().len(), 1);
    }
}
