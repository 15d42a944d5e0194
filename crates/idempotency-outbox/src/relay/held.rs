//! The events a full destination holds back, as one relay sees them: since when each has been
//! refused, so that `relay.full-patience` counts from its first refusal (not from when it was
//! written: an event that waited out an outage in the outbox would otherwise have no patience
//! left when the destination it finally reaches is full). An entry lasts while its event is
//! refused: another failure (a timeout, the broker unavailable) does not start the patience
//! again, only a confirmed publish, a dead letter or a requeue do, or no refusal for `stale`.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::time::Instant;
use uuid::Uuid;

/// The most held events remembered; past it, an event's refusals are not counted until it is
/// remembered (room is made as held events go out or go unrefused for `stale`), so memory
/// stays bounded whatever the backlog and no event loses its patience to the bound.
pub(crate) const MAX_HELD: usize = 100_000;

/// How often the entries of events no longer refused here are looked for and forgotten.
const PRUNE_EVERY: Duration = Duration::from_secs(60);

/// When each held event was first and last refused by a full destination.
#[derive(Debug, Default)]
pub(crate) struct Held {
    state: Mutex<State>,
    /// The number of entries, read without the lock: the common case (nothing held) takes
    /// none.
    count: AtomicUsize,
}

#[derive(Debug, Default)]
struct State {
    refused: HashMap<Uuid, Refused>,
    /// When the entries not refused for `stale` are next forgotten.
    next_prune: Option<Instant>,
}

#[derive(Debug, Clone, Copy)]
struct Refused {
    first: Instant,
    last: Instant,
    /// The event's attempts then: fewer later means it was requeued, refused anew.
    attempts: u32,
}

impl Held {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// `id`, at `attempts`, was refused as full at `now`: how long it has been refused, since
    /// its first refusal here (or its requeue since). `None` when it is not remembered and
    /// [`MAX_HELD`] are. Entries not refused for `stale` (another relay publishes or holds the
    /// event, or it is gone) are forgotten once a minute.
    pub(crate) fn refused(
        &self,
        id: Uuid,
        attempts: u32,
        now: Instant,
        stale: Duration,
    ) -> Option<Duration> {
        let mut state = self.lock();
        if state.next_prune.is_none_or(|at| now >= at) {
            state
                .refused
                .retain(|_, held| now.saturating_duration_since(held.last) < stale);
            state.next_prune = Some(now + PRUNE_EVERY);
        }
        if !state.refused.contains_key(&id) && state.refused.len() >= MAX_HELD {
            return None;
        }
        let held = state.refused.entry(id).or_insert(Refused {
            first: now,
            last: now,
            attempts,
        });
        if attempts < held.attempts {
            held.first = now;
        }
        held.last = now;
        held.attempts = attempts;
        let first = held.first;
        self.count.store(state.refused.len(), Ordering::Relaxed);
        Some(now.saturating_duration_since(first))
    }

    /// Forgets `id`: it went out, or was dead-lettered.
    pub(crate) fn forget(&self, id: Uuid) {
        if self.count.load(Ordering::Relaxed) == 0 {
            return;
        }
        let mut state = self.lock();
        if state.refused.remove(&id).is_some() {
            self.count.store(state.refused.len(), Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tokio::time::Instant;
    use uuid::Uuid;

    use super::{Held, MAX_HELD, PRUNE_EVERY};

    const STALE: Duration = Duration::from_secs(600);

    #[test]
    fn the_refusals_count_from_the_first_until_the_event_is_forgotten() {
        let held = Held::default();
        let (id, start) = (Uuid::now_v7(), Instant::now());
        assert_eq!(held.refused(id, 1, start, STALE), Some(Duration::ZERO));
        let later = start + Duration::from_secs(90);
        assert_eq!(
            held.refused(id, 1, later, STALE),
            Some(Duration::from_secs(90))
        );
        held.forget(id);
        assert_eq!(
            held.refused(id, 1, later, STALE),
            Some(Duration::ZERO),
            "forgotten: a new first refusal"
        );
    }

    /// Fewer attempts than at the last refusal: the event was requeued, its patience starts
    /// again (a dead letter requeued while the destination is still full).
    #[test]
    fn a_requeued_event_is_refused_anew() {
        let held = Held::default();
        let (id, start) = (Uuid::now_v7(), Instant::now());
        held.refused(id, 1, start, STALE);
        let later = start + Duration::from_secs(300);
        assert_eq!(
            held.refused(id, 5, later, STALE),
            Some(Duration::from_secs(300)),
            "counted refusals past the patience"
        );
        assert_eq!(
            held.refused(id, 1, later + Duration::from_secs(1), STALE),
            Some(Duration::ZERO),
            "requeued"
        );
    }

    /// At the bound, a new event is not remembered, and the map is not scanned at each of its
    /// refusals; entries refused within `stale` are kept by the prune, older ones go.
    #[test]
    fn the_bound_and_the_prune() {
        let held = Held::default();
        let start = Instant::now();
        let ids: Vec<Uuid> = (0..MAX_HELD).map(|_| Uuid::now_v7()).collect();
        for id in &ids {
            held.refused(*id, 1, start, STALE);
        }
        let newcomer = Uuid::now_v7();
        assert_eq!(
            held.refused(newcomer, 1, start, STALE),
            None,
            "at the bound"
        );
        let kept = start + Duration::from_secs(100);
        assert_eq!(
            held.refused(ids[0], 1, kept, STALE),
            Some(Duration::from_secs(100)),
            "a remembered one still counts"
        );
        let scan = std::time::Instant::now();
        for _ in 0..10_000 {
            assert_eq!(held.refused(Uuid::now_v7(), 1, kept, STALE), None);
        }
        assert!(
            scan.elapsed() < Duration::from_secs(1),
            "no scan per refusal at the bound: {:?}",
            scan.elapsed()
        );
        let much_later = start + STALE + PRUNE_EVERY;
        assert_eq!(
            held.refused(newcomer, 1, much_later, STALE),
            Some(Duration::ZERO),
            "the stale ones made room"
        );
        assert_eq!(
            held.refused(ids[0], 1, much_later, STALE),
            Some(much_later - start),
            "refused within stale of the prune: kept, counted from its first"
        );
        assert_eq!(
            held.refused(ids[1], 1, much_later, STALE),
            Some(Duration::ZERO),
            "stale: forgotten, counted anew"
        );
    }
}
