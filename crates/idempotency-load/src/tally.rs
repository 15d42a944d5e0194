//! [`Tally`]: one client's counts, merged with the other clients' at the end of the run.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::Duration;

use hdrhistogram::Histogram;

use crate::client::{Endpoint, Reply, Status};
use crate::report::{KeyLine, KeySummary, Latency, Report, Second};

/// Highest latency recorded, in microseconds (longer ones count as this): one hour.
const MAX_MICROS: u64 = 3_600_000_000;

#[derive(Debug)]
struct KeyState {
    first_at: Duration,
    line: KeyLine,
}

/// One client's counts; merged with the others' at the end of the run.
#[derive(Debug)]
pub struct Tally {
    latency: Histogram<u64>,
    statuses: BTreeMap<Status, u64>,
    problems: BTreeMap<(Status, String), u64>,
    replayed: u64,
    executed: u64,
    server_errors_without_problem: u64,
    timeline: BTreeMap<u64, BTreeMap<Status, u64>>,
    keys: Option<HashMap<String, KeyState>>,
}

impl Tally {
    /// An empty tally; `track_keys` keeps per-key details (payments only).
    pub fn new(track_keys: bool) -> Self {
        Self {
            latency: Histogram::new_with_bounds(1, MAX_MICROS, 3)
                .expect("constant bounds are valid"),
            statuses: BTreeMap::new(),
            problems: BTreeMap::new(),
            replayed: 0,
            executed: 0,
            server_errors_without_problem: 0,
            timeline: BTreeMap::new(),
            keys: track_keys.then(HashMap::new),
        }
    }

    /// Counts `reply` to a request with `key` sent `at` (since the start), which took `latency`.
    pub fn record(&mut self, key: &str, at: Duration, latency: Duration, reply: Reply) {
        let micros = u64::try_from(latency.as_micros()).unwrap_or(MAX_MICROS);
        self.latency.saturating_record(micros.clamp(1, MAX_MICROS));
        *self.statuses.entry(reply.status).or_default() += 1;
        *self
            .timeline
            .entry(at.as_secs())
            .or_default()
            .entry(reply.status)
            .or_default() += 1;
        if let Some(kind) = &reply.problem_type {
            *self
                .problems
                .entry((reply.status, kind.clone()))
                .or_default() += 1;
        }
        self.replayed += u64::from(reply.replayed);
        self.executed += u64::from(reply.status == Status::Http(201) && !reply.replayed);
        if reply.status.is_server_error() && !reply.problem_json {
            self.server_errors_without_problem += 1;
        }
        let Some(keys) = &mut self.keys else { return };
        let state = keys.entry(key.to_owned()).or_insert_with(|| KeyState {
            first_at: at,
            line: KeyLine {
                key: key.to_owned(),
                first_sent_ms: u64::try_from(at.as_millis()).unwrap_or(u64::MAX),
                first_status: reply.status.to_string(),
                first_replayed: reply.replayed,
                first_payment_id: reply.payment_id.clone(),
                requests: 0,
                replayed: 0,
                payment_ids: BTreeSet::new(),
            },
        });
        state.line.requests += 1;
        state.line.replayed += u64::from(reply.replayed);
        if let Some(id) = reply.payment_id {
            state.line.payment_ids.insert(id);
        }
    }

    /// Adds `other` to this tally; a key's first request is the earlier of the two.
    pub fn merge(&mut self, other: Self) {
        let _ = self.latency.add(&other.latency);
        for (status, n) in other.statuses {
            *self.statuses.entry(status).or_default() += n;
        }
        for (problem, n) in other.problems {
            *self.problems.entry(problem).or_default() += n;
        }
        self.replayed += other.replayed;
        self.executed += other.executed;
        self.server_errors_without_problem += other.server_errors_without_problem;
        for (second, statuses) in other.timeline {
            let mine = self.timeline.entry(second).or_default();
            for (status, n) in statuses {
                *mine.entry(status).or_default() += n;
            }
        }
        let (Some(mine), Some(theirs)) = (&mut self.keys, other.keys) else {
            return;
        };
        for (key, state) in theirs {
            match mine.get_mut(&key) {
                None => {
                    mine.insert(key, state);
                }
                Some(known) => {
                    let mut line = state.line;
                    known.line.requests += line.requests;
                    known.line.replayed += line.replayed;
                    known.line.payment_ids.append(&mut line.payment_ids);
                    if state.first_at < known.first_at {
                        known.first_at = state.first_at;
                        known.line.first_sent_ms = line.first_sent_ms;
                        known.line.first_status = line.first_status;
                        known.line.first_replayed = line.first_replayed;
                        known.line.first_payment_id = line.first_payment_id;
                    }
                }
            }
        }
    }

    /// The report of a run of `clients` clients on `endpoint` that started at `started_unix_ms`
    /// (milliseconds since the Unix epoch) and lasted `elapsed`.
    pub fn finish(
        self,
        endpoint: Endpoint,
        clients: usize,
        started_unix_ms: u64,
        elapsed: Duration,
    ) -> Report {
        let requests: u64 = self.statuses.values().sum();
        let ms = |q: f64| self.latency.value_at_quantile(q) as f64 / 1000.0;
        let mut key_log: Vec<KeyLine> = self
            .keys
            .map(|keys| keys.into_values().map(|s| s.line).collect())
            .unwrap_or_default();
        key_log.sort_by(|a, b| a.key.cmp(&b.key));
        let keys =
            (endpoint == Endpoint::Payments).then(|| KeySummary::of(&key_log, self.executed));
        let timeline = self
            .timeline
            .iter()
            .map(|(second, statuses)| Second {
                second: *second,
                statuses: statuses.iter().map(|(s, n)| (s.to_string(), *n)).collect(),
            })
            .collect();
        Report {
            endpoint,
            clients,
            started_unix_ms,
            elapsed_s: elapsed.as_secs_f64(),
            requests,
            ops_per_s: requests as f64 / elapsed.as_secs_f64().max(1e-9),
            latency_ms: Latency {
                p50: ms(0.5),
                p99: ms(0.99),
                p999: ms(0.999),
                max: self.latency.max() as f64 / 1000.0,
                mean: self.latency.mean() / 1000.0,
            },
            server_errors: self
                .statuses
                .iter()
                .filter(|(s, _)| s.is_server_error())
                .map(|(_, n)| n)
                .sum(),
            statuses: self
                .statuses
                .iter()
                .map(|(s, n)| (s.to_string(), *n))
                .collect(),
            problems: self
                .problems
                .iter()
                .map(|((s, kind), n)| (format!("{s} {kind}"), *n))
                .collect(),
            replayed: self.replayed,
            server_errors_without_problem: self.server_errors_without_problem,
            keys,
            timeline,
            key_log,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reply(status: u16, replayed: bool, id: Option<&str>) -> Reply {
        Reply {
            status: Status::Http(status),
            replayed,
            payment_id: id.map(str::to_owned),
            problem_json: status >= 400,
            problem_type: (status == 409).then(|| "request-in-flight".to_owned()),
        }
    }

    #[test]
    fn merged_tallies_keep_the_earliest_first_answer_and_every_payment_id() {
        let ms = Duration::from_millis;
        let mut a = Tally::new(true);
        a.record("k", ms(20), ms(5), reply(201, true, Some("p1")));
        a.record("k", ms(30), ms(5), reply(409, false, None));
        let mut b = Tally::new(true);
        b.record("k", ms(10), ms(7), reply(201, false, Some("p1")));
        b.record("j", ms(1), ms(7), reply(201, false, Some("p2")));
        b.record("j", ms(2), ms(7), reply(201, false, Some("p3")));
        a.merge(b);
        let report = a.finish(Endpoint::Payments, 2, 0, Duration::from_secs(1));

        assert_eq!(report.requests, 5);
        assert_eq!(report.statuses["201"], 4);
        assert_eq!(report.problems["409 request-in-flight"], 1);
        assert_eq!(report.replayed, 1);
        let k = report.key_log.iter().find(|l| l.key == "k").unwrap();
        assert_eq!((k.first_sent_ms, k.first_status.as_str()), (10, "201"));
        assert!(!k.first_replayed);
        assert_eq!((k.requests, k.replayed, k.payment_ids.len()), (3, 1, 1));
        let keys = report.keys.unwrap();
        assert_eq!(keys.executed, 3);
        assert_eq!(keys.distinct_payment_ids, 3);
        assert_eq!(
            keys.keys_with_several_payment_ids, 1,
            "j saw two paymentIds"
        );
        assert_eq!(keys.payment_ids_per_key, BTreeMap::from([(1, 1), (2, 1)]));
        assert!(report.latency_ms.p50 >= 5.0 && report.latency_ms.max >= 7.0);
    }

    #[test]
    fn server_errors_without_a_problem_body_are_counted() {
        let mut tally = Tally::new(false);
        let mut bare = reply(502, false, None);
        bare.problem_json = false;
        tally.record("k", Duration::ZERO, Duration::from_millis(1), bare);
        tally.record(
            "k",
            Duration::ZERO,
            Duration::from_millis(1),
            reply(503, false, None),
        );
        let report = tally.finish(Endpoint::Health, 1, 0, Duration::from_secs(1));
        assert_eq!(
            (report.server_errors, report.server_errors_without_problem),
            (2, 1)
        );
        assert!(report.keys.is_none() && report.key_log.is_empty());
    }
}
