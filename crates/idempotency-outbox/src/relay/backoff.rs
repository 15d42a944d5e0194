//! Backoff with jitter: `ceiling(attempt) * [0.5, 1.0)`, so workers that failed together do
//! not retry together.

use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, Ordering as AtomicOrdering};
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

/// A broker outage as one relay sees it: since when its publishes fail transiently
/// (unavailable, timed out) with none confirmed. A transient failure does not count towards
/// `max-attempts`, so its backoff cannot grow with the message's attempts; it grows with the
/// outage instead: the next attempt comes after about as long as the outage has lasted
/// (within `base..=max`, with jitter), so the retries of a long outage thin out as an
/// exponential backoff's do, and the first confirmed publish ends the outage.
///
/// A publish's result speaks of the state the broker was in when the publish was sent
/// ([`Outage::sent`]), which a batch's concurrent publishes may outlive: a confirmation of a
/// publish sent before the outage started does not end it, and a failure of a publish sent
/// before it ended (a timeout that comes after another publish was confirmed) does not start
/// another. Each outage starts and ends once.
#[derive(Debug)]
pub(crate) struct Outage {
    origin: Instant,
    /// Even while the broker answers, odd during an outage; each change of state adds one.
    epoch: AtomicU64,
    /// Milliseconds from `origin` to the start of the last outage.
    since: AtomicU64,
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
            since: AtomicU64::new(0),
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

    /// A publish sent in state `sent` failed transiently: how long the outage has lasted (zero
    /// at its start), and whether this failure started it (only a publish sent while the
    /// broker answered, and only the first such failure).
    fn failed(&self, sent: Sent) -> (Duration, bool) {
        let now = self.now();
        let started = sent.healthy()
            && self
                .epoch
                .compare_exchange(
                    sent.0,
                    sent.0 + 1,
                    AtomicOrdering::AcqRel,
                    AtomicOrdering::Acquire,
                )
                .is_ok();
        if started {
            self.since.store(now, AtomicOrdering::Release);
            return (Duration::ZERO, true);
        }
        let since = self.since.load(AtomicOrdering::Acquire);
        (Duration::from_millis(now.saturating_sub(since)), false)
    }

    /// A publish sent in state `sent` was confirmed: how long the outage it ended lasted, if
    /// it ended one (a publish sent during the outage; exactly one caller sees it end).
    pub(crate) fn ended(&self, sent: Sent) -> Option<Duration> {
        // The common case (sent while the broker answered) reads nothing shared.
        if sent.healthy() {
            return None;
        }
        self.epoch
            .compare_exchange(
                sent.0,
                sent.0 + 1,
                AtomicOrdering::AcqRel,
                AtomicOrdering::Acquire,
            )
            .ok()?;
        let since = self.since.load(AtomicOrdering::Acquire);
        Some(Duration::from_millis(self.now().saturating_sub(since)))
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
}
