//! [`NotifyGate`]: at most one notifying enqueue per `notify-interval`.

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Decides which enqueues notify. Shared by an outbox and its clones.
///
/// A commit that notifies holds PostgreSQL's database-wide notification lock until its commit
/// record is flushed, so notifying commits run one at a time, a disk flush each. Letting one
/// enqueue per window notify keeps that queue short; the relay's next claim (woken by the next
/// notification, its `linger` look-again or its poll) finds the rows of the others.
#[derive(Debug)]
pub(super) struct NotifyGate {
    interval: Duration,
    last: Mutex<Option<Instant>>,
}

impl NotifyGate {
    /// A gate letting one enqueue per `interval` notify (every one for zero).
    pub(super) fn new(interval: Duration) -> Self {
        Self {
            interval,
            last: Mutex::new(None),
        }
    }

    /// The window.
    pub(super) fn interval(&self) -> Duration {
        self.interval
    }

    /// Whether an enqueue starting now notifies; if it does, the window restarts now.
    pub(super) fn admit(&self) -> bool {
        self.admit_at(Instant::now())
    }

    fn admit_at(&self, now: Instant) -> bool {
        if self.interval.is_zero() {
            return true;
        }
        // A poisoned lock only means another enqueue panicked while holding it: the instant
        // it guards is still a valid instant.
        let mut last = self
            .last
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        match *last {
            Some(at) if now.saturating_duration_since(at) < self.interval => false,
            _ => {
                *last = Some(now);
                true
            }
        }
    }

    /// The notifying enqueue admitted at the last [`admit`](Self::admit) failed: the next
    /// enqueue notifies instead, so a failed statement does not silence a window.
    pub(super) fn reopen(&self) {
        *self
            .last
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_enqueue_per_interval_notifies() {
        let gate = NotifyGate::new(Duration::from_millis(5));
        let start = Instant::now();
        assert!(gate.admit_at(start));
        assert!(!gate.admit_at(start + Duration::from_millis(1)));
        assert!(!gate.admit_at(start + Duration::from_micros(4_999)));
        assert!(gate.admit_at(start + Duration::from_millis(5)));
        assert!(!gate.admit_at(start + Duration::from_millis(6)));
        gate.reopen();
        assert!(gate.admit_at(start + Duration::from_millis(7)), "reopened");
    }

    #[test]
    fn a_zero_interval_notifies_every_enqueue() {
        let gate = NotifyGate::new(Duration::ZERO);
        let now = Instant::now();
        assert!((0..3).all(|_| gate.admit_at(now)));
    }
}
