//! A small circuit breaker: after `threshold` consecutive failures, stop calling for `cool_down`,
//! then let one trial call through.
//!
//! Hand-written on purpose: it is a dozen lines of state under a mutex that is never held across
//! an `.await`, and the crates that offer one are either tied to `tower` services or unmaintained.

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The breaker's state, as reported by [`RedisCache::breaker_state`](crate::RedisCache::breaker_state).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BreakerState {
    /// Calls go through; the count of consecutive failures so far.
    Closed {
        /// Consecutive failures.
        failures: u32,
    },
    /// Calls are refused until the cool-down ends.
    Open,
    /// The cool-down ended; one trial call is in flight or allowed.
    HalfOpen,
}

#[derive(Debug)]
enum State {
    Closed { failures: u32 },
    Open { until: Instant },
    HalfOpen { trial_running: bool },
}

#[derive(Debug)]
pub(crate) struct Breaker {
    threshold: u32,
    cool_down: Duration,
    state: Mutex<State>,
}

impl Breaker {
    pub(crate) fn new(threshold: u32, cool_down: Duration) -> Self {
        Self {
            threshold: threshold.max(1),
            cool_down,
            state: Mutex::new(State::Closed { failures: 0 }),
        }
    }

    fn with<R>(&self, f: impl FnOnce(&mut State) -> R) -> R {
        let mut guard = self
            .state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        f(&mut guard)
    }

    /// Whether a call may go out now.
    pub(crate) fn allow(&self) -> bool {
        self.with(|state| match *state {
            State::Closed { .. } => true,
            State::Open { until } if Instant::now() >= until => {
                *state = State::HalfOpen {
                    trial_running: true,
                };
                true
            }
            State::Open { .. } => false,
            State::HalfOpen {
                trial_running: false,
            } => {
                *state = State::HalfOpen {
                    trial_running: true,
                };
                true
            }
            State::HalfOpen {
                trial_running: true,
            } => false,
        })
    }

    pub(crate) fn on_success(&self) {
        self.with(|state| *state = State::Closed { failures: 0 });
    }

    pub(crate) fn on_failure(&self) {
        let (threshold, cool_down) = (self.threshold, self.cool_down);
        self.with(|state| {
            let failures = match *state {
                State::Closed { failures } => failures + 1,
                State::HalfOpen { .. } | State::Open { .. } => threshold,
            };
            *state = if failures >= threshold {
                State::Open {
                    until: Instant::now() + cool_down,
                }
            } else {
                State::Closed { failures }
            };
        });
    }

    pub(crate) fn state(&self) -> BreakerState {
        self.with(|state| match *state {
            State::Closed { failures } => BreakerState::Closed { failures },
            State::Open { until } if Instant::now() < until => BreakerState::Open,
            State::Open { .. } | State::HalfOpen { .. } => BreakerState::HalfOpen,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opens_after_threshold_and_recovers_through_one_trial() {
        let breaker = Breaker::new(3, Duration::from_millis(50));
        for _ in 0..2 {
            assert!(breaker.allow());
            breaker.on_failure();
        }
        assert_eq!(breaker.state(), BreakerState::Closed { failures: 2 });
        breaker.on_failure();
        assert_eq!(breaker.state(), BreakerState::Open);
        assert!(!breaker.allow());
        std::thread::sleep(Duration::from_millis(60));
        assert!(breaker.allow(), "one trial after the cool-down");
        assert!(!breaker.allow(), "only one trial at a time");
        breaker.on_failure();
        assert_eq!(
            breaker.state(),
            BreakerState::Open,
            "a failed trial reopens"
        );
        std::thread::sleep(Duration::from_millis(60));
        assert!(breaker.allow());
        breaker.on_success();
        assert_eq!(breaker.state(), BreakerState::Closed { failures: 0 });
    }

    #[test]
    fn success_resets_the_count() {
        let breaker = Breaker::new(2, Duration::from_secs(60));
        breaker.on_failure();
        breaker.on_success();
        breaker.on_failure();
        assert_eq!(breaker.state(), BreakerState::Closed { failures: 1 });
    }
}
