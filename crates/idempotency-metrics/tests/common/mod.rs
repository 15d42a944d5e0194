//! What the tests read back from a `DebuggingRecorder`.

use std::collections::BTreeMap;

use metrics_util::debugging::{DebugValue, Snapshotter};

/// A series' labels, sorted.
pub(crate) type Labels = Vec<(String, String)>;

/// Every series of the recorder: its name and sorted labels to its value. A snapshot resets
/// the recorder's values, so a test takes one.
pub(crate) fn series(snapshotter: &Snapshotter) -> BTreeMap<(String, Labels), DebugValue> {
    snapshotter
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
        .collect()
}
