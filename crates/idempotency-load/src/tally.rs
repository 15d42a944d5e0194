//! [`Tally`]: one client's counts, merged with the other clients' at the end of the run.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::Duration;

use hdrhistogram::Histogram;

use crate::client::{Endpoint, Reply, Status};
use crate::report::{InstanceSummary, KeyLine, KeySummary, Latency, Report, Second};

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
    /// Per instance (index of its base URL): statuses and replays.
    instances: BTreeMap<usize, (BTreeMap<Status, u64>, u64)>,
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
            instances: BTreeMap::new(),
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
        let instance = self.instances.entry(reply.instance).or_default();
        *instance.0.entry(reply.status).or_default() += 1;
        instance.1 += u64::from(reply.replayed);
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
                body_digests: BTreeSet::new(),
                answered_by: BTreeSet::new(),
            },
        });
        state.line.requests += 1;
        state.line.replayed += u64::from(reply.replayed);
        if let Some(id) = reply.payment_id {
            state.line.payment_ids.insert(id);
        }
        if let Some(digest) = reply.body_digest {
            state.line.body_digests.insert(format!("{digest:016x}"));
            state.line.answered_by.insert(reply.instance);
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
        for (index, (statuses, replayed)) in other.instances {
            let mine = self.instances.entry(index).or_default();
            for (status, n) in statuses {
                *mine.0.entry(status).or_default() += n;
            }
            mine.1 += replayed;
        }
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
                    known.line.body_digests.append(&mut line.body_digests);
                    known.line.answered_by.append(&mut line.answered_by);
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

    /// The report of a run of `clients` clients on `endpoint` of the instances at `base_urls`
    /// that started at `started_unix_ms` (milliseconds since the Unix epoch) and lasted
    /// `elapsed`.
    pub fn finish(
        self,
        base_urls: &[String],
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
        let keys = endpoint
            .keyed()
            .then(|| KeySummary::of(&key_log, self.executed, base_urls.len()));
        let instances = base_urls
            .iter()
            .enumerate()
            .map(|(index, url)| {
                let (statuses, replayed) = self.instances.get(&index).cloned().unwrap_or_default();
                InstanceSummary {
                    url: url.clone(),
                    requests: statuses.values().sum(),
                    statuses: statuses.iter().map(|(s, n)| (s.to_string(), *n)).collect(),
                    replayed,
                }
            })
            .collect();
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
            instances,
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
            body_digest: id.map(|id| crate::keys::fnv1a_bytes(id.as_bytes())),
            instance: 0,
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
        let report = a.finish(
            &["u".to_owned()],
            Endpoint::Payments,
            2,
            0,
            Duration::from_secs(1),
        );

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
        let report = tally.finish(
            &["u".to_owned()],
            Endpoint::Health,
            1,
            0,
            Duration::from_secs(1),
        );
        assert_eq!(
            (report.server_errors, report.server_errors_without_problem),
            (2, 1)
        );
        assert!(report.keys.is_none() && report.key_log.is_empty());
    }

    #[test]
    fn answers_from_several_instances_are_counted_per_instance_and_per_key() {
        let ms = Duration::from_millis;
        let at = |instance, r: Reply| Reply { instance, ..r };
        let urls = ["a".to_owned(), "b".to_owned(), "c".to_owned()];
        let mut one = Tally::new(true);
        one.record("k", ms(1), ms(1), at(0, reply(201, false, Some("p1"))));
        one.record("k", ms(2), ms(1), at(1, reply(201, true, Some("p1"))));
        one.record("j", ms(3), ms(1), at(2, reply(409, false, None)));
        let mut two = Tally::new(true);
        two.record("k", ms(4), ms(1), at(2, reply(201, true, Some("p1"))));
        two.record("j", ms(5), ms(1), at(0, reply(201, false, Some("p2"))));
        // A replay whose bytes differ from the first answer (same id, other body).
        let mut other_body = at(1, reply(201, true, Some("p2")));
        other_body.body_digest = Some(7);
        two.record("j", ms(6), ms(1), other_body);
        two.record(
            "j",
            ms(7),
            ms(1),
            at(1, Reply::without_answer_for_tests(Status::Failed)),
        );
        one.merge(two);
        let report = one.finish(&urls, Endpoint::Charges, 2, 0, Duration::from_secs(1));

        let per_instance: Vec<_> = report
            .instances
            .iter()
            .map(|i| (i.url.as_str(), i.requests, i.replayed))
            .collect();
        assert_eq!(per_instance, [("a", 2, 0), ("b", 3, 2), ("c", 2, 1)]);
        assert_eq!(report.instances[1].statuses["connection-error"], 1);
        let k = report.key_log.iter().find(|l| l.key == "k").unwrap();
        assert_eq!(k.answered_by, BTreeSet::from([0, 1, 2]));
        assert_eq!((k.payment_ids.len(), k.body_digests.len()), (1, 1));
        let j = report.key_log.iter().find(|l| l.key == "j").unwrap();
        assert_eq!(j.answered_by, BTreeSet::from([0, 1]));
        assert_eq!((j.payment_ids.len(), j.body_digests.len()), (1, 2));
        let keys = report.keys.unwrap();
        assert_eq!(keys.keys_with_several_payment_ids, 0);
        assert_eq!(keys.keys_with_several_bodies, 1, "j's replay differs");
        assert_eq!(keys.keys_answered_by_every_instance, 1, "k only");
    }
}
