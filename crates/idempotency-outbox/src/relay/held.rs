//! The events a full destination holds back, as one relay sees them: since when each has been
//! refused, so that `relay.full-patience` counts from its first refusal (not from when it was
//! written: an event that waited out an outage in the outbox would otherwise have no patience
//! left when the destination it finally reaches is full).

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::time::Instant;
use uuid::Uuid;

/// The most held events remembered; past it, an event's patience counts from when it was
/// written (its age), so memory stays bounded whatever the backlog.
pub(crate) const MAX_HELD: usize = 100_000;

/// When each held event was first and last refused by a full destination.
#[derive(Debug, Default)]
pub(crate) struct Held {
    refused: Mutex<HashMap<Uuid, Refused>>,
    /// `refused.len()`, read without the lock: the common case (nothing held) takes none.
    count: AtomicUsize,
}

#[derive(Debug, Clone, Copy)]
struct Refused {
    first: Instant,
    last: Instant,
}

impl Held {
    fn lock(&self) -> MutexGuard<'_, HashMap<Uuid, Refused>> {
        self.refused.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// `id` was refused as full at `now`: how long it has been refused, since its first
    /// refusal here. `None` when it is not remembered and [`MAX_HELD`] are, once those not
    /// refused for `stale` are forgotten (another relay took them, or they went out).
    pub(crate) fn refused(&self, id: Uuid, now: Instant, stale: Duration) -> Option<Duration> {
        let mut refused = self.lock();
        if !refused.contains_key(&id) && refused.len() >= MAX_HELD {
            refused.retain(|_, held| now.saturating_duration_since(held.last) < stale);
            if refused.len() >= MAX_HELD {
                return None;
            }
        }
        let held = refused.entry(id).or_insert(Refused {
            first: now,
            last: now,
        });
        held.last = now;
        let first = held.first;
        self.count.store(refused.len(), Ordering::Relaxed);
        Some(now.saturating_duration_since(first))
    }

    /// Forgets `id`: it went out, failed otherwise, or was dead-lettered.
    pub(crate) fn forget(&self, id: Uuid) {
        if self.count.load(Ordering::Relaxed) == 0 {
            return;
        }
        let mut refused = self.lock();
        if refused.remove(&id).is_some() {
            self.count.store(refused.len(), Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tokio::time::Instant;
    use uuid::Uuid;

    use super::{Held, MAX_HELD};

    const STALE: Duration = Duration::from_secs(600);

    #[test]
    fn the_refusals_count_from_the_first_until_the_event_is_forgotten() {
        let held = Held::default();
        let (id, start) = (Uuid::now_v7(), Instant::now());
        assert_eq!(held.refused(id, start, STALE), Some(Duration::ZERO));
        let later = start + Duration::from_secs(90);
        assert_eq!(
            held.refused(id, later, STALE),
            Some(Duration::from_secs(90))
        );
        held.forget(id);
        assert_eq!(
            held.refused(id, later, STALE),
            Some(Duration::ZERO),
            "forgotten: a new first refusal"
        );
    }

    #[test]
    fn past_the_bound_stale_events_are_forgotten_then_new_ones_are_not_remembered() {
        let held = Held::default();
        let start = Instant::now();
        let ids: Vec<Uuid> = (0..MAX_HELD).map(|_| Uuid::now_v7()).collect();
        for id in &ids {
            held.refused(*id, start, STALE);
        }
        let newcomer = Uuid::now_v7();
        assert_eq!(held.refused(newcomer, start, STALE), None, "at the bound");
        assert_eq!(
            held.refused(ids[0], start + Duration::from_secs(5), STALE),
            Some(Duration::from_secs(5)),
            "a remembered one still counts"
        );
        let much_later = start + STALE + Duration::from_secs(1);
        assert_eq!(
            held.refused(newcomer, much_later, STALE),
            Some(Duration::ZERO),
            "the stale ones made room"
        );
        assert_eq!(
            held.refused(ids[0], much_later, STALE),
            Some(Duration::from_secs(601)),
            "refused again 5s after the start: not stale, kept, counted from its first"
        );
        assert_eq!(
            held.refused(ids[1], much_later, STALE),
            Some(Duration::ZERO),
            "stale: forgotten, counted anew"
        );
    }
}
