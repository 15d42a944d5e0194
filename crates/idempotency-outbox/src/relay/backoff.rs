//! Backoff with jitter: `ceiling(attempt) * [0.5, 1.0)`, so workers that failed together do
//! not retry together.

use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, Ordering as AtomicOrdering};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use uuid::Uuid;

use crate::config::BackoffConfig;

/// A random factor in `[0.5, 1.0)`. `RandomState` is seeded per process and varies per
/// instance, which is all jitter needs; no extra dependency.
fn jitter(id: Uuid, attempt: u32) -> f64 {
    let bits = std::hash::RandomState::new().hash_one((id, attempt)) >> 11;
    0.5 + 0.5 * (bits as f64 / (1u64 << 53) as f64)
}

/// The delay before the next attempt of `id`, which failed `attempt` times.
pub(crate) fn delay(config: &BackoffConfig, id: Uuid, attempt: u32) -> Duration {
    config.ceiling(attempt).mul_f64(jitter(id, attempt))
}

/// The delay before the next attempt of `id`, which a full destination has refused for
/// `refused`: about as long (within `base..=max`, with jitter), so the retries of a
/// destination that stays full thin out as an exponential backoff's do.
pub(crate) fn after_wait(config: &BackoffConfig, id: Uuid, refused: Duration) -> Duration {
    let secs = refused.as_secs();
    refused
        .max(config.base)
        .min(config.max)
        .mul_f64(jitter(id, u32::try_from(secs).unwrap_or(u32::MAX)))
}

/// A broker outage as one relay sees it: since when its publishes fail transiently
/// (unavailable, timed out) with none confirmed. A transient failure does not count towards
/// `max-attempts`, so its backoff cannot grow with the message's attempts; it grows with the
/// outage instead: the next attempt comes after about as long as the outage has lasted
/// (within `base..=max`, with jitter), so the retries of a long outage thin out as an
/// exponential backoff's do, and the first confirmed publish (or answer that the destination
/// is full) ends the outage.
///
/// A publish's result speaks of the state the broker was in when the publish was sent
/// ([`Outage::sent`]), which a batch's concurrent publishes may outlive: a confirmation of a
/// publish sent before the outage started does not end it, and a failure of a publish sent
/// before it ended (a timeout that comes after another publish was confirmed) does not start
/// another, and waits as at the start of one (the broker answered since). Each outage starts
/// and ends once.
#[derive(Debug)]
pub(crate) struct Outage {
    origin: Instant,
    /// Even while the broker answers, odd during an outage; each change of state adds one.
    /// Written under `since`'s lock only; read without it for the publishes about to be sent.
    epoch: AtomicU64,
    /// Milliseconds from `origin` to the start of the last outage. Its lock orders the changes
    /// of state, so that whoever sees an outage sees when it started.
    since: Mutex<u64>,
}

/// The state of an [`Outage`] a publish was sent in.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Sent(u64);

impl Sent {
    /// Sent while the broker answered (no outage).
    fn healthy(self) -> bool {
        self.0.is_multiple_of(2)
    }
}

impl Default for Outage {
    fn default() -> Self {
        Self {
            origin: Instant::now(),
            epoch: AtomicU64::new(0),
            since: Mutex::new(0),
        }
    }
}

impl Outage {
    /// The state now, for the publishes about to be sent.
    pub(crate) fn sent(&self) -> Sent {
        Sent(self.epoch.load(AtomicOrdering::Acquire))
    }

    fn now(&self) -> u64 {
        u64::try_from(self.origin.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// The start of the last outage, under the lock that orders the changes of state. A
    /// poisoned lock still holds a whole `u64`: a panic cannot leave it half-written.
    fn since(&self) -> MutexGuard<'_, u64> {
        self.since.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A publish sent in state `sent` failed transiently: how long the outage has lasted (zero
    /// at its start, and when the broker answered since), and whether this failure started it
    /// (only a publish sent while the broker answered, and only the first such failure).
    fn failed(&self, sent: Sent) -> (Duration, bool) {
        let mut since = self.since();
        let now = self.now();
        let epoch = self.epoch.load(AtomicOrdering::Acquire);
        if sent.healthy() && epoch == sent.0 {
            *since = now;
            self.epoch.store(epoch + 1, AtomicOrdering::Release);
            return (Duration::ZERO, true);
        }
        if epoch.is_multiple_of(2) {
            // Sent during an outage that has ended since: the broker answers again.
            return (Duration::ZERO, false);
        }
        (Duration::from_millis(now.saturating_sub(*since)), false)
    }

    /// A publish sent in state `sent` was confirmed: how long the outage it ended lasted, if
    /// it ended one (a publish sent during the outage; exactly one caller sees it end).
    pub(crate) fn ended(&self, sent: Sent) -> Option<Duration> {
        // The common case (sent while the broker answered) takes no lock.
        if sent.healthy() {
            return None;
        }
        let since = self.since();
        if self.epoch.load(AtomicOrdering::Acquire) != sent.0 {
            return None;
        }
        self.epoch.store(sent.0 + 1, AtomicOrdering::Release);
        Some(Duration::from_millis(self.now().saturating_sub(*since)))
    }

    /// The delay before the next attempt of `id` after a transient failure of a publish sent
    /// in state `sent`, and whether this failure started the outage.
    pub(crate) fn delay(
        &self,
        config: &BackoffConfig,
        id: Uuid,
        attempt: u32,
        sent: Sent,
    ) -> (Duration, bool) {
        let (lasted, started) = self.failed(sent);
        let lasted = lasted.clamp(config.base, config.max.max(config.base));
        (lasted.mul_f64(jitter(id, attempt)), started)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A full destination's retry comes after about as long as it has refused the event, within
    /// `base..=max`, jitter halving it at most.
    #[test]
    fn the_delay_after_a_full_destination_follows_the_wait() {
        let config = BackoffConfig {
            base: Duration::from_secs(1),
            max: Duration::from_secs(60),
        };
        let id = Uuid::now_v7();
        for (waited, ceiling) in [(0, 1), (10, 10), (59, 59), (600, 60), (u64::MAX, 60)] {
            let delay = after_wait(&config, id, Duration::from_secs(waited));
            let ceiling = Duration::from_secs(ceiling);
            assert!(
                delay >= ceiling / 2 && delay < ceiling,
                "{waited}: {delay:?}"
            );
        }
    }

    #[test]
    fn delays_stay_within_half_and_full_ceiling_and_vary() {
        let config = BackoffConfig {
            base: Duration::from_millis(200),
            max: Duration::from_secs(2),
        };
        let id = Uuid::now_v7();
        let mut seen = std::collections::HashSet::new();
        for attempt in 1..=8 {
            let ceiling = config.ceiling(attempt);
            for _ in 0..50 {
                let d = delay(&config, id, attempt);
                assert!(d >= ceiling / 2 && d < ceiling, "{d:?} vs {ceiling:?}");
                seen.insert(d);
            }
        }
        assert!(
            seen.len() > 100,
            "jitter should vary: {} values",
            seen.len()
        );
    }

    #[test]
    fn a_transient_failure_waits_about_as_long_as_the_outage_lasted() {
        let config = BackoffConfig {
            base: Duration::from_millis(20),
            max: Duration::from_millis(400),
        };
        let outage = Outage::default();
        let id = Uuid::now_v7();
        let healthy = outage.sent();
        assert_eq!(outage.ended(healthy), None, "no outage yet");
        let (first, started) = outage.delay(&config, id, 1, healthy);
        assert!(started, "the first failure starts the outage");
        assert!(
            !outage.delay(&config, id, 1, healthy).1,
            "the next ones do not"
        );
        assert!(first >= config.base / 2 && first < config.base, "{first:?}");
        let during = outage.sent();
        assert!(!outage.delay(&config, id, 1, during).1);
        std::thread::sleep(Duration::from_millis(200));
        let later = outage.delay(&config, id, 1, during).0;
        assert!(
            later >= Duration::from_millis(100),
            "grows with the outage: {later:?}"
        );
        std::thread::sleep(Duration::from_millis(300));
        assert!(
            outage.delay(&config, id, 1, during).0 < config.max,
            "never past max"
        );
        assert_eq!(
            outage.ended(healthy),
            None,
            "a publish sent before the outage proves nothing"
        );
        let lasted = outage.ended(during).expect("the outage ends once");
        assert!(lasted >= Duration::from_millis(500), "{lasted:?}");
        assert_eq!(outage.ended(during), None, "and only once");
        assert!(
            !outage.delay(&config, id, 1, during).1,
            "a failure of a publish sent during the outage that ended starts none"
        );
        let (again, started) = outage.delay(&config, id, 1, outage.sent());
        assert!(again < config.base, "a new outage starts small");
        assert!(started);
        assert_eq!(
            outage.ended(during),
            None,
            "a publish sent during the last outage does not end this one"
        );
        assert!(outage.ended(outage.sent()).is_some());
    }

    /// A publish sent during an outage that fails after the outage ended waits as after a
    /// first failure: the broker answers again (before: as long as the whole outage had
    /// lasted, up to `max`).
    #[test]
    fn a_failure_sent_during_an_outage_that_ended_waits_as_a_first_one() {
        let config = BackoffConfig {
            base: Duration::from_millis(20),
            max: Duration::from_secs(60),
        };
        let outage = Outage::default();
        let id = Uuid::now_v7();
        assert!(outage.delay(&config, id, 1, outage.sent()).1);
        let during = outage.sent();
        std::thread::sleep(Duration::from_millis(300));
        assert!(outage.ended(during).is_some());
        let (late, started) = outage.delay(&config, id, 1, during);
        assert!(!started);
        assert!(late < config.base, "{late:?}");
    }

    /// Workers failing at the start of an outage all read when it started: none reads the
    /// start of an earlier outage (here: the relay's start, ten seconds ago) and waits as long
    /// (before: the start was stored after the state changed, and a worker in between read
    /// the old one).
    #[test]
    fn concurrent_first_failures_all_wait_as_first_ones() {
        let config = BackoffConfig {
            base: Duration::from_millis(20),
            max: Duration::from_secs(60),
        };
        for _ in 0..2_000 {
            let outage = Outage {
                origin: Instant::now().checked_sub(Duration::from_secs(10)).unwrap(),
                ..Outage::default()
            };
            let healthy = outage.sent();
            let start = std::sync::Barrier::new(4);
            let delays: Vec<Duration> = std::thread::scope(|scope| {
                let workers: Vec<_> = (0..4)
                    .map(|_| {
                        let (outage, config, start) = (&outage, &config, &start);
                        scope.spawn(move || {
                            start.wait();
                            outage.delay(config, Uuid::now_v7(), 1, healthy).0
                        })
                    })
                    .collect();
                workers.into_iter().map(|w| w.join().unwrap()).collect()
            });
            // A stale start gives 5 to 10 s (10 s before jitter); a preempted thread on a
            // loaded machine, never that much.
            assert!(
                delays.iter().all(|d| *d < Duration::from_secs(1)),
                "{delays:?}"
            );
        }
    }
}
