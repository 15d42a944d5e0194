//! What a run measured: the [`Report`] the clients' [`Tally`](crate::tally::Tally)s merge into.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use serde::Serialize;

use crate::client::Endpoint;

/// What one key got over the run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct KeyLine {
    /// The key.
    pub key: String,
    /// When the first request with it was sent, in milliseconds since the start of the run.
    pub first_sent_ms: u64,
    /// The status of the first request sent with it (by send time, over all clients).
    pub first_status: String,
    /// The first answer carried `Idempotent-Replayed: true`.
    pub first_replayed: bool,
    /// The `paymentId` of the first answer, when it was a 201.
    pub first_payment_id: Option<String>,
    /// Requests sent with the key.
    pub requests: u64,
    /// Answers that carried `Idempotent-Replayed: true`.
    pub replayed: u64,
    /// Distinct `paymentId`s (charge ids for charges) seen in its 201 answers: more than one
    /// is a double execution.
    pub payment_ids: BTreeSet<String>,
    /// Distinct digests (FNV-1a, hex) of the bodies of its 201 answers: more than one is a
    /// replay that differs from the first answer.
    pub body_digests: BTreeSet<String>,
    /// The instances (indices of the base URLs) that answered it with a 201.
    pub answered_by: BTreeSet<usize>,
}

/// What one instance (one base URL) answered.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct InstanceSummary {
    /// Its base URL.
    pub url: String,
    /// Requests sent to it.
    pub requests: u64,
    /// How many of each status it answered.
    pub statuses: BTreeMap<String, u64>,
    /// Its answers with `Idempotent-Replayed: true`.
    pub replayed: u64,
}

/// Latency quantiles, in milliseconds (from an HDR histogram with 3 significant digits).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Latency {
    /// Median.
    pub p50: f64,
    /// 99th percentile.
    pub p99: f64,
    /// 99.9th percentile.
    pub p999: f64,
    /// Slowest request.
    pub max: f64,
    /// Mean.
    pub mean: f64,
}

/// The statuses of the requests sent during one second of the run.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Second {
    /// Seconds since the start of the run.
    pub second: u64,
    /// How many of each status.
    pub statuses: BTreeMap<String, u64>,
}

/// Per-key figures of a payments run.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct KeySummary {
    /// Distinct keys sent.
    pub distinct: u64,
    /// 201 answers without `Idempotent-Replayed`: business executions the clients saw.
    pub executed: u64,
    /// Distinct `paymentId`s over all keys.
    pub distinct_payment_ids: u64,
    /// How many keys saw 0, 1, 2... distinct `paymentId`s.
    pub payment_ids_per_key: BTreeMap<u64, u64>,
    /// Keys that saw more than one `paymentId` (double executions).
    pub keys_with_several_payment_ids: u64,
    /// Keys whose 201 answers were not all byte-identical.
    pub keys_with_several_bodies: u64,
    /// Keys answered with a 201 by every instance (with several base URLs, the replays that
    /// crossed instances).
    pub keys_answered_by_every_instance: u64,
}

impl KeySummary {
    pub(crate) fn of(lines: &[KeyLine], executed: u64, instances: usize) -> Self {
        let mut per_key = BTreeMap::new();
        let mut ids = BTreeSet::new();
        for line in lines {
            *per_key.entry(line.payment_ids.len() as u64).or_default() += 1;
            ids.extend(line.payment_ids.iter());
        }
        let count =
            |holds: &dyn Fn(&KeyLine) -> bool| lines.iter().filter(|l| holds(l)).count() as u64;
        Self {
            keys_with_several_bodies: count(&|l| l.body_digests.len() > 1),
            keys_answered_by_every_instance: count(&|l| l.answered_by.len() >= instances),
            distinct: lines.len() as u64,
            executed,
            distinct_payment_ids: ids.len() as u64,
            keys_with_several_payment_ids: per_key.range(2..).map(|(_, n)| n).sum(),
            payment_ids_per_key: per_key,
        }
    }
}

/// The result of a run: throughput, latency, statuses, replays and per-key executions.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Report {
    /// The endpoint called.
    pub endpoint: Endpoint,
    /// Concurrent clients.
    pub clients: usize,
    /// When the run started, in milliseconds since the Unix epoch.
    pub started_unix_ms: u64,
    /// Wall time of the run, in seconds.
    pub elapsed_s: f64,
    /// Requests completed (answered, timed out or failed).
    pub requests: u64,
    /// Requests per second.
    pub ops_per_s: f64,
    /// Latency of every request, failures included.
    pub latency_ms: Latency,
    /// How many of each status (`201`, `409`, `timeout`, `connection-error`...).
    pub statuses: BTreeMap<String, u64>,
    /// How many of each problem, as `<status> <type>` (`503 store-unavailable`).
    pub problems: BTreeMap<String, u64>,
    /// Answers with `Idempotent-Replayed: true`.
    pub replayed: u64,
    /// 5xx answers.
    pub server_errors: u64,
    /// 5xx answers that were not `application/problem+json`.
    pub server_errors_without_problem: u64,
    /// Per-key figures (payments and charges).
    pub keys: Option<KeySummary>,
    /// Per instance (base URL), in the order given.
    pub instances: Vec<InstanceSummary>,
    /// Statuses per second of the run, by send time.
    pub timeline: Vec<Second>,
    /// One line per key (payments only), for `--key-log`.
    #[serde(skip)]
    pub key_log: Vec<KeyLine>,
}

impl Report {
    /// The timeline as text, one line per second: `  12s 201: 450, 503: 12`.
    pub fn timeline_text(&self) -> String {
        let mut text = String::new();
        for second in &self.timeline {
            let statuses: Vec<_> = second
                .statuses
                .iter()
                .map(|(s, n)| format!("{s}: {n}"))
                .collect();
            text.push_str(&format!("{:>5}s {}\n", second.second, statuses.join(", ")));
        }
        text
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let l = &self.latency_ms;
        writeln!(
            f,
            "{:?}: {} requests from {} clients in {:.2} s = {:.0} ops/s",
            self.endpoint, self.requests, self.clients, self.elapsed_s, self.ops_per_s
        )?;
        writeln!(
            f,
            "latency ms: p50 {:.2}  p99 {:.2}  p99.9 {:.2}  max {:.2}  mean {:.2}",
            l.p50, l.p99, l.p999, l.max, l.mean
        )?;
        let statuses: Vec<_> = self
            .statuses
            .iter()
            .map(|(s, n)| format!("{s}: {n}"))
            .collect();
        writeln!(f, "statuses: {}", statuses.join(", "))?;
        for (problem, n) in &self.problems {
            writeln!(f, "  problem {problem}: {n}")?;
        }
        writeln!(
            f,
            "Idempotent-Replayed: true: {}; 5xx: {} ({} not problem+json)",
            self.replayed, self.server_errors, self.server_errors_without_problem
        )?;
        if let Some(k) = &self.keys {
            let per_key: Vec<_> = k
                .payment_ids_per_key
                .iter()
                .map(|(ids, keys)| format!("{ids} id: {keys} keys"))
                .collect();
            writeln!(
                f,
                "keys: {} distinct, {} executions (201 not replayed), {} distinct paymentIds; \
                 paymentIds per key: {}; keys with several: {}; with differing bodies: {}",
                k.distinct,
                k.executed,
                k.distinct_payment_ids,
                per_key.join(", "),
                k.keys_with_several_payment_ids,
                k.keys_with_several_bodies
            )?;
        }
        if self.instances.len() > 1 {
            for instance in &self.instances {
                let statuses: Vec<_> = instance
                    .statuses
                    .iter()
                    .map(|(s, n)| format!("{s}: {n}"))
                    .collect();
                writeln!(
                    f,
                    "  {}: {} requests, {} replayed; {}",
                    instance.url,
                    instance.requests,
                    instance.replayed,
                    statuses.join(", ")
                )?;
            }
        }
        Ok(())
    }
}
