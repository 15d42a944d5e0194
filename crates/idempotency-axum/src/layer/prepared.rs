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

/// The body bytes the kept responses may hold together, on the same terms as [`CAPACITY`]: a
/// prepared response is a second copy of what L1 holds, so its memory is bounded apart from
/// L1's own bound.
const BUDGET: usize = 16 * 1024 * 1024;

/// A response with a larger body is not kept (it is read from its record on every replay).
const LARGEST: usize = 64 * 1024;

/// Prepared responses by the address of the L1 record they were read from. An entry holds a
/// [`Weak`] of its record: while it does, the record's allocation is never reused, so an
/// address that matches is the same record, and a record L1 replaced is another address. Only
/// records L1 holds (committed, terminal: the caches hold nothing else) are prepared.
#[derive(Default)]
pub(crate) struct PreparedReplays {
    entries: Mutex<Entries>,
}

#[derive(Default)]
struct Entries {
    by_address: HashMap<usize, (Weak<IdempotencyRecord>, StoredResponse)>,
    /// The body bytes of `by_address`.
    bytes: usize,
}

fn address(record: &Arc<IdempotencyRecord>) -> usize {
    Arc::as_ptr(record) as usize
}

impl PreparedReplays {
    /// The response prepared for `record`, if any.
    pub(super) fn get(&self, record: &Arc<IdempotencyRecord>) -> Option<StoredResponse> {
        let entries = self.entries.lock().ok()?;
        let (weak, response) = entries.by_address.get(&address(record))?;
        (Weak::as_ptr(weak) == Arc::as_ptr(record)).then(|| response.clone())
    }

    /// Keeps the response prepared for `record` (unless its body is over [`LARGEST`]).
    pub(super) fn put(&self, record: &Arc<IdempotencyRecord>, response: &StoredResponse) {
        let size = response.body().len();
        if size > LARGEST {
            return;
        }
        let Ok(mut entries) = self.entries.lock() else {
            return;
        };
        if entries.by_address.len() >= CAPACITY || entries.bytes + size > BUDGET {
            entries
                .by_address
                .retain(|_, (weak, _)| weak.strong_count() > 0);
            entries.bytes = entries
                .by_address
                .values()
                .map(|(_, kept)| kept.body().len())
                .sum();
            if entries.by_address.len() >= CAPACITY || entries.bytes + size > BUDGET {
                entries.by_address.clear();
                entries.bytes = 0;
            }
        }
        let previous = entries
            .by_address
            .insert(address(record), (Arc::downgrade(record), response.clone()));
        entries.bytes += size;
        if let Some((_, previous)) = previous {
            entries.bytes -= previous.body().len();
        }
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.entries
            .lock()
            .map(|e| e.by_address.len())
            .unwrap_or_default()
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
            execution_span: None,
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
    fn a_large_body_is_not_kept_and_the_bytes_are_bounded() {
        let prepared = PreparedReplays::default();
        let large = record("{}");
        let body: &'static str = Box::leak("x".repeat(LARGEST + 1).into_boxed_str());
        prepared.put(&large, &response(body));
        assert!(prepared.get(&large).is_none());
        let half: &'static str = Box::leak("y".repeat(LARGEST).into_boxed_str());
        let records: Vec<_> = (0..BUDGET / LARGEST + 1).map(|_| record("{}")).collect();
        for r in &records {
            prepared.put(r, &response(half));
        }
        let kept = prepared.entries.lock().unwrap().bytes;
        assert!(kept <= BUDGET, "{kept} bytes kept");
        assert!(prepared.get(records.last().unwrap()).is_some());
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
