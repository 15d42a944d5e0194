//! Backoff with jitter: `ceiling(attempt) * [0.5, 1.0)`, so workers that failed together do
//! not retry together.

use std::hash::BuildHasher;
use std::time::Duration;

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
}
