//! The bound on duplicates of one key that wait at once in this process.
//!
//! In transactional mode a duplicate of a key in flight waits on the holder's row lock (or, on
//! SQLite, at `BEGIN`) with a pooled connection. Without a bound, a client could hold the whole
//! pool with copies of one slow request. Past the bound, a duplicate answers `409
//! request-in-flight` with `Retry-After` at once, without taking a connection.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard, PoisonError};

use idempotency_core::RecordId;

/// How many requests of each key are under way in this process.
#[derive(Debug, Default)]
pub(crate) struct Waiters {
    counts: Mutex<HashMap<RecordId, usize>>,
}

impl Waiters {
    fn counts(&self) -> MutexGuard<'_, HashMap<RecordId, usize>> {
        // The map stays consistent whatever panicked while it was held.
        self.counts.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Enters a request of `id` when fewer than `1 + max_waiters` are under way (one holder and
    /// its waiters); `None` otherwise. The request counts until the guard is dropped.
    pub(crate) fn enter(&self, id: &RecordId, max_waiters: usize) -> Option<Entered<'_>> {
        let mut counts = self.counts();
        let count = counts.entry(id.clone()).or_insert(0);
        if *count > max_waiters {
            return None;
        }
        *count += 1;
        Some(Entered {
            waiters: self,
            id: id.clone(),
        })
    }
}

/// A request counted by [`Waiters::enter`].
pub(crate) struct Entered<'a> {
    waiters: &'a Waiters,
    id: RecordId,
}

impl Drop for Entered<'_> {
    fn drop(&mut self) {
        let mut counts = self.waiters.counts();
        if let Some(count) = counts.get_mut(&self.id) {
            *count -= 1;
            if *count == 0 {
                counts.remove(&self.id);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use idempotency_core::{IdempotencyKey, Operation, Scope};

    use super::*;

    #[test]
    fn one_holder_and_max_waiters_enter_and_leaving_makes_room() {
        let id = RecordId::new(
            Operation::new("OP").unwrap(),
            Scope::default(),
            IdempotencyKey::new("k").unwrap(),
        );
        let waiters = Waiters::default();
        let first = waiters.enter(&id, 1).unwrap();
        let second = waiters.enter(&id, 1).unwrap();
        assert!(waiters.enter(&id, 1).is_none());
        drop(first);
        let third = waiters.enter(&id, 1).unwrap();
        drop((second, third));
        assert!(
            waiters.counts().is_empty(),
            "no key is kept once its requests are done"
        );
    }
}
