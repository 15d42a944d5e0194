//! A warning repeated for every message of a backlog, given at most once per period.

use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

/// When a throttled warning was last given.
#[derive(Debug, Default)]
pub(crate) struct Throttle {
    last: Mutex<Option<Instant>>,
}

impl Throttle {
    /// Whether the warning is due at `now`: never given, or last given `every` or longer ago.
    /// A `true` counts as giving it.
    pub(crate) fn due(&self, now: Instant, every: Duration) -> bool {
        let mut last = self.last.lock().unwrap_or_else(PoisonError::into_inner);
        match *last {
            Some(given) if now.saturating_duration_since(given) < every => false,
            _ => {
                *last = Some(now);
                true
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tokio::time::Instant;

    use super::Throttle;

    #[test]
    fn a_warning_is_given_once_per_period() {
        let throttle = Throttle::default();
        let start = Instant::now();
        let minute = Duration::from_secs(60);
        assert!(throttle.due(start, minute), "the first is given");
        assert!(!throttle.due(start, minute));
        assert!(!throttle.due(start + Duration::from_secs(59), minute));
        assert!(throttle.due(start + minute, minute), "a minute later");
        assert!(!throttle.due(start + Duration::from_secs(61), minute));
    }
}
