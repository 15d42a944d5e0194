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
#[derive(Debug)]
pub(crate) struct Outage {
    origin: Instant,
    /// Milliseconds from `origin` to the outage's start, plus one; 0 when there is none.
    since: AtomicU64,
}

impl Default for Outage {
    fn default() -> Self {
        Self {
            origin: Instant::now(),
            since: AtomicU64::new(0),
        }
    }
}

impl Outage {
    /// A publish failed transiently: how long the outage has lasted (zero at its start), and
    /// whether this failure started it.
    fn failed(&self) -> (Duration, bool) {
        let now = u64::try_from(self.origin.elapsed().as_millis()).unwrap_or(u64::MAX - 1);
        let (start, started) = match self.since.compare_exchange(
            0,
            now + 1,
            AtomicOrdering::Relaxed,
            AtomicOrdering::Relaxed,
        ) {
            Ok(_) => (now, true),
            Err(since) => (since - 1, false),
        };
        (Duration::from_millis(now.saturating_sub(start)), started)
    }

    /// A publish was confirmed: the broker is back. How long the outage it ended lasted, if
    /// there was one (exactly one caller sees it end).
    pub(crate) fn ended(&self) -> Option<Duration> {
        // A load first: the common case (no outage) writes nothing shared.
        if self.since.load(AtomicOrdering::Relaxed) == 0 {
            return None;
        }
        let since = self.since.swap(0, AtomicOrdering::Relaxed);
        let now = u64::try_from(self.origin.elapsed().as_millis()).unwrap_or(u64::MAX - 1);
        (since > 0).then(|| Duration::from_millis(now.saturating_sub(since - 1)))
    }

    /// The delay before the next attempt of `id` after a transient failure, and whether this
    /// failure started the outage.
    pub(crate) fn delay(&self, config: &BackoffConfig, id: Uuid, attempt: u32) -> (Duration, bool) {
        let (lasted, started) = self.failed();
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
        assert_eq!(outage.ended(), None, "no outage yet");
        let (first, started) = outage.delay(&config, id, 1);
        assert!(started, "the first failure starts the outage");
        assert!(!outage.delay(&config, id, 1).1, "the next ones do not");
        assert!(first >= config.base / 2 && first < config.base, "{first:?}");
        std::thread::sleep(Duration::from_millis(200));
        let later = outage.delay(&config, id, 1).0;
        assert!(
            later >= Duration::from_millis(100),
            "grows with the outage: {later:?}"
        );
        std::thread::sleep(Duration::from_millis(300));
        assert!(
            outage.delay(&config, id, 1).0 < config.max,
            "never past max"
        );
        let lasted = outage.ended().expect("the outage ends once");
        assert!(lasted >= Duration::from_millis(500), "{lasted:?}");
        assert_eq!(outage.ended(), None, "and only once");
        let (again, started) = outage.delay(&config, id, 1);
        assert!(again < config.base, "a new outage starts small");
        assert!(started);
    }
}
