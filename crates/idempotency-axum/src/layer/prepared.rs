//! Replays from L1 prepared once per cached record: the stored response read, checked and
//! filtered the first time a record is replayed, then answered from that for every replay of
//! the same cached record, without reading its JSON again.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};

use idempotency_core::IdempotencyRecord;

use crate::stored::StoredResponse;

/// How many prepared responses are kept before the ones whose record left L1 are dropped (and,
/// when every one is still cached, all of them).
const CAPACITY: usize = 4096;

/// Prepared responses by the address of the L1 record they were read from. An entry holds a
/// [`Weak`] of its record: while it does, the record's allocation is never reused, so an
/// address that matches is the same record, and a record L1 replaced is another address. Only
/// records L1 holds (committed, terminal: the caches hold nothing else) are prepared.
#[derive(Default)]
pub(crate) struct PreparedReplays {
    entries: Mutex<HashMap<usize, (Weak<IdempotencyRecord>, StoredResponse)>>,
}

fn address(record: &Arc<IdempotencyRecord>) -> usize {
    Arc::as_ptr(record) as usize
}

impl PreparedReplays {
    /// The response prepared for `record`, if any.
    pub(super) fn get(&self, record: &Arc<IdempotencyRecord>) -> Option<StoredResponse> {
        let entries = self.entries.lock().ok()?;
        let (weak, response) = entries.get(&address(record))?;
        (Weak::as_ptr(weak) == Arc::as_ptr(record)).then(|| response.clone())
    }

    /// Keeps the response prepared for `record`.
    pub(super) fn put(&self, record: &Arc<IdempotencyRecord>, response: &StoredResponse) {
        let Ok(mut entries) = self.entries.lock() else {
            return;
        };
        if entries.len() >= CAPACITY {
            entries.retain(|_, (weak, _)| weak.strong_count() > 0);
            if entries.len() >= CAPACITY {
                entries.clear();
            }
        }
        entries.insert(address(record), (Arc::downgrade(record), response.clone()));
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.entries.lock().map(|e| e.len()).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::time::SystemTime;

    use axum::http::{HeaderMap, StatusCode};
    use idempotency_core::{Fingerprint, StoredOutcome};

    use super::*;
    use crate::stored::HeaderFilter;

    fn record(payload: &str) -> Arc<IdempotencyRecord> {
        Arc::new(IdempotencyRecord {
            fingerprint: Fingerprint::new("f".repeat(64)),
            outcome: Some(StoredOutcome::Completed {
                payload: payload.to_owned(),
            }),
            created_at: SystemTime::now(),
            completed_at: Some(SystemTime::now()),
            expires_at: None,
        })
    }

    fn response(body: &'static str) -> StoredResponse {
        StoredResponse::from_parts(
            StatusCode::CREATED,
            &HeaderMap::new(),
            body,
            &HeaderFilter::default(),
        )
    }

    #[test]
    fn a_response_is_kept_for_its_record_only() {
        let prepared = PreparedReplays::default();
        let (a, same_text) = (record("{}"), record("{}"));
        assert!(prepared.get(&a).is_none());
        prepared.put(&a, &response("a"));
        assert_eq!(prepared.get(&a).unwrap().body(), "a");
        assert!(
            prepared.get(&same_text).is_none(),
            "another record, equal or not"
        );
    }

    #[test]
    fn records_no_longer_cached_are_dropped_when_full() {
        let prepared = PreparedReplays::default();
        let kept = record("{}");
        prepared.put(&kept, &response("kept"));
        for _ in 0..CAPACITY {
            prepared.put(&record("{}"), &response("gone"));
        }
        assert!(prepared.len() < CAPACITY, "{}", prepared.len());
        assert_eq!(prepared.get(&kept).unwrap().body(), "kept");
    }
}
