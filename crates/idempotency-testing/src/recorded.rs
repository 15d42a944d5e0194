//! What a test reads back from a `metrics_util` [`DebuggingRecorder`] (feature `metrics`).
//!
//! [`DebuggingRecorder`]: metrics_util::debugging::DebuggingRecorder

use std::collections::BTreeMap;
use std::fmt;

use metrics_util::debugging::{DebugValue, Snapshotter};

/// A series' labels, sorted by key, then value.
pub type Labels = Vec<(String, String)>;

/// Every series of one snapshot of a recorder: its name and sorted labels, to its value.
///
/// Taking a snapshot sets the recorder's counters and gauges to 0 and empties its histograms,
/// so a test takes one and asks it everything. Two snapshots compare equal when they hold the
/// same series with the same values.
///
/// ```
/// use idempotency_testing::recorded::Recorded;
/// use metrics_util::debugging::DebuggingRecorder;
///
/// let recorder = DebuggingRecorder::new();
/// let snapshotter = recorder.snapshotter();
/// metrics::with_local_recorder(&recorder, || {
///     metrics::counter!("sent_total", "queue" => "orders", "kind" => "new").increment(2);
///     metrics::counter!("sent_total", "queue" => "refunds", "kind" => "new").increment(1);
///     metrics::gauge!("pending").set(7.0);
/// });
/// let recorded = Recorded::take(&snapshotter);
/// assert_eq!(recorded.counter("sent_total", &[("queue", "orders"), ("kind", "new")]), 2);
/// assert_eq!(recorded.total("sent_total"), 3);
/// assert_eq!(recorded.gauge("pending", &[]), 7.0);
/// assert_eq!(recorded.number("pending", &[]), Some(7.0));
/// assert!(recorded.get("missing_total", &[]).is_none());
/// ```
#[derive(PartialEq, Eq)]
pub struct Recorded(BTreeMap<(String, Labels), DebugValue>);

impl Recorded {
    /// Takes a snapshot of the recorder behind `snapshotter` (which resets its values, as
    /// above).
    pub fn take(snapshotter: &Snapshotter) -> Self {
        let series = snapshotter
            .snapshot()
            .into_vec()
            .into_iter()
            .map(|(key, _, _, value)| {
                let key = key.key();
                let mut labels: Labels = key
                    .labels()
                    .map(|l| (l.key().to_owned(), l.value().to_owned()))
                    .collect();
                labels.sort();
                ((key.name().to_owned(), labels), value)
            })
            .collect();
        Self(series)
    }

    /// Every series, by name and sorted labels.
    pub fn series(&self) -> &BTreeMap<(String, Labels), DebugValue> {
        &self.0
    }

    /// The value of the series named `name` whose labels are exactly `labels`, in any order
    /// (`&[]`: a series without labels); `None` when there is none.
    pub fn get(&self, name: &str, labels: &[(&str, &str)]) -> Option<&DebugValue> {
        let mut labels: Labels = labels
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        labels.sort();
        self.0.get(&(name.to_owned(), labels))
    }

    /// The counter named `name` with `labels` (as in [`get`](Self::get)).
    ///
    /// # Panics
    ///
    /// When there is no such series, or it is not a counter.
    pub fn counter(&self, name: &str, labels: &[(&str, &str)]) -> u64 {
        match self.get(name, labels) {
            Some(DebugValue::Counter(n)) => *n,
            other => panic!("{name} {labels:?}: {other:?}; have {self:?}"),
        }
    }

    /// The gauge named `name` with `labels` (as in [`get`](Self::get)).
    ///
    /// # Panics
    ///
    /// When there is no such series, or it is not a gauge.
    pub fn gauge(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        match self.get(name, labels) {
            Some(DebugValue::Gauge(g)) => g.into_inner(),
            other => panic!("{name} {labels:?}: {other:?}; have {self:?}"),
        }
    }

    /// The counter or gauge named `name` with `labels` (as in [`get`](Self::get)) as a number;
    /// `None` when there is no such series or it is a histogram. For a test that waits until a
    /// value shows up.
    pub fn number(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        match self.get(name, labels)? {
            DebugValue::Counter(n) => Some(*n as f64),
            DebugValue::Gauge(g) => Some(g.into_inner()),
            DebugValue::Histogram(_) => None,
        }
    }

    /// The sum of the counter `name` over all its label sets (0 when it has none).
    ///
    /// # Panics
    ///
    /// When a series of that name is not a counter.
    pub fn total(&self, name: &str) -> u64 {
        self.0
            .iter()
            .filter(|((series, _), _)| series == name)
            .map(|(_, value)| match value {
                DebugValue::Counter(n) => *n,
                other => panic!("{name}: {other:?}"),
            })
            .sum()
    }
}

impl fmt::Debug for Recorded {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map()
            .entries(self.0.iter().map(|((name, labels), value)| {
                let labels: Vec<String> = labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
                (format!("{name}{{{}}}", labels.join(",")), value)
            }))
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use metrics_util::debugging::DebuggingRecorder;

    use super::Recorded;

    fn recorded() -> Recorded {
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        metrics::with_local_recorder(&recorder, || {
            metrics::counter!("sent_total", "queue" => "orders", "kind" => "new").increment(2);
            metrics::counter!("sent_total", "queue" => "refunds", "kind" => "new").increment(1);
            metrics::histogram!("latency_seconds").record(0.5);
        });
        Recorded::take(&snapshotter)
    }

    #[test]
    #[should_panic(expected = "sent_total")]
    fn labels_must_match_exactly() {
        // a subset of the series' labels names no series
        recorded().counter("sent_total", &[]);
    }

    #[test]
    #[should_panic(expected = "missing_total")]
    fn a_missing_counter_fails() {
        recorded().counter("missing_total", &[]);
    }

    #[test]
    fn labels_match_in_any_order_and_histograms_are_no_number() {
        let recorded = recorded();
        assert_eq!(
            recorded.counter("sent_total", &[("kind", "new"), ("queue", "refunds")]),
            1
        );
        assert!(
            recorded
                .get("sent_total", &[("queue", "refunds")])
                .is_none()
        );
        assert_eq!(recorded.number("latency_seconds", &[]), None);
        assert_eq!(recorded.series().len(), 3);
        assert_eq!(
            format!("{recorded:?}")
                .matches("sent_total{kind=new,queue=")
                .count(),
            2
        );
    }
}
