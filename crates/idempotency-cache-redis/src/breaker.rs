//! A small circuit breaker: after `threshold` consecutive failures, stop calling for `cool_down`,
//! then let one trial call through.
//!
//! A call is admitted with a [`Permit`] that carries the breaker's *generation* (a counter bumped
//! on every change of state) and reports the call's outcome once:
//!
//! - a trial permit dropped without a report (the caller's future was cancelled: client gone, an
//!   outer timeout, a `select!`) counts as a failure, so a cancelled trial reopens the breaker
//!   instead of leaving it half-open for ever; a call cancelled while the breaker is closed
//!   counts for nothing (a client that went away says nothing about Redis, and a burst of
//!   disconnects must not open the breaker on a healthy server);
//! - a trial that has not reported within `trial_timeout` (a permit held by a future that is
//!   never polled again) counts as failed as well: the next trial comes at most
//!   `trial_timeout + cool_down` later (`trial_timeout` is the cool-down plus the call timeout);
//! - an outcome from an older generation is ignored: a slow call admitted before the breaker
//!   opened cannot close it, and one admitted before it closed cannot count against the new run.
//!
//! Every change of state is counted in [`BREAKER_METRIC`](crate::BREAKER_METRIC) and logged
//! once, not once per refused call: `warn` when it opens (Redis is skipped), `info` at the first
//! trial of an outage and when it closes again (with how long the outage lasted), `debug` for the
//! trials in between (one per cool-down), so an outage of any length leaves a handful of lines.
//!
//! Hand-written on purpose: it is a few lines of state under a mutex that is never held across
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

#[derive(Debug, Clone, Copy)]
enum State {
    Closed {
        failures: u32,
    },
    Open {
        until: Instant,
    },
    /// One trial call is out; it counts as failed if it has not reported by `deadline`.
    HalfOpen {
        deadline: Instant,
    },
}

#[derive(Debug)]
struct Inner {
    state: State,
    generation: u64,
    /// When the breaker last opened from closed: the outage's start, for the log line that
    /// closes it; `None` while closed.
    outage_since: Option<Instant>,
    /// Whether this outage's first trial was logged (later ones log at `debug`).
    trial_logged: bool,
}

impl Inner {
    /// Moves to `state`, counting and logging the change (`name`: which breaker).
    fn enter(&mut self, state: State, now: Instant, name: &'static str, cool_down: Duration) {
        let from = self.state;
        self.state = state;
        self.generation = self.generation.wrapping_add(1);
        let to = match (from, state) {
            (State::Closed { .. }, State::Open { .. }) => {
                self.outage_since = Some(now);
                self.trial_logged = false;
                tracing::warn!(
                    breaker = name,
                    cool_down = ?cool_down,
                    "distributed cache circuit breaker opened: Redis is skipped (requests read \
                     the database) and tried again once per cool-down; further failures are \
                     counted, not logged, until it closes"
                );
                "open"
            }
            (_, State::HalfOpen { .. }) => {
                if self.trial_logged {
                    tracing::debug!(
                        breaker = name,
                        "distributed cache circuit breaker half-open"
                    );
                } else {
                    self.trial_logged = true;
                    tracing::info!(
                        breaker = name,
                        "distributed cache circuit breaker half-open: one trial call (then one \
                         per cool-down until one succeeds)"
                    );
                }
                "half_open"
            }
            (_, State::Open { .. }) => {
                tracing::debug!(
                    breaker = name,
                    "distributed cache trial call failed; open again"
                );
                "open"
            }
            (_, State::Closed { .. }) => {
                let outage = self
                    .outage_since
                    .take()
                    .map(|since| now.saturating_duration_since(since));
                tracing::info!(
                    breaker = name,
                    outage = ?outage,
                    "distributed cache circuit breaker closed: Redis answers again"
                );
                "closed"
            }
        };
        metrics::counter!(crate::BREAKER_METRIC, "breaker" => name, "state" => to).increment(1);
    }
}

#[derive(Debug)]
pub(crate) struct Breaker {
    /// Which breaker, in logs and meters: `requests` (reads) or `writes`.
    name: &'static str,
    threshold: u32,
    cool_down: Duration,
    trial_timeout: Duration,
    inner: Mutex<Inner>,
    /// The clock: `Instant::now`, or a test's own.
    now: fn() -> Instant,
}

/// Leave to make one call; report its outcome with [`success`](Self::success) or
/// [`failure`](Self::failure). Dropped without a report, it counts as a failure of a trial, and
/// for nothing while the breaker is closed.
#[derive(Debug)]
#[must_use = "an unreported permit counts as a failure"]
pub(crate) struct Permit<'a> {
    breaker: &'a Breaker,
    generation: u64,
    reported: bool,
}

impl Permit<'_> {
    pub(crate) fn success(mut self) {
        self.reported = true;
        self.breaker.report(self.generation, Report::Success);
    }

    pub(crate) fn failure(mut self) {
        self.reported = true;
        self.breaker.report(self.generation, Report::Failure);
    }
}

impl Drop for Permit<'_> {
    fn drop(&mut self) {
        if !self.reported {
            self.breaker.report(self.generation, Report::Dropped);
        }
    }
}

/// How a permitted call ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Report {
    Success,
    Failure,
    /// Its future was dropped before it reported.
    Dropped,
}

/// `now + d`, or a year from now for a `d` too large for the clock (a misconfiguration must not
/// panic, least of all in a `Drop`).
fn later(now: Instant, d: Duration) -> Instant {
    now.checked_add(d)
        .or_else(|| now.checked_add(Duration::from_secs(365 * 24 * 60 * 60)))
        .unwrap_or(now)
}

impl Breaker {
    pub(crate) fn new(
        name: &'static str,
        threshold: u32,
        cool_down: Duration,
        trial_timeout: Duration,
    ) -> Self {
        Self::with_clock(name, threshold, cool_down, trial_timeout, Instant::now)
    }

    fn with_clock(
        name: &'static str,
        threshold: u32,
        cool_down: Duration,
        trial_timeout: Duration,
        now: fn() -> Instant,
    ) -> Self {
        Self {
            name,
            threshold: threshold.max(1),
            cool_down,
            trial_timeout,
            inner: Mutex::new(Inner {
                state: State::Closed { failures: 0 },
                generation: 0,
                outage_since: None,
                trial_logged: false,
            }),
            now,
        }
    }

    /// Runs `f` on the state, after a trial that outlived its deadline was counted as failed.
    fn with<R>(&self, f: impl FnOnce(&mut Inner, Instant) -> R) -> R {
        let mut inner = self
            .inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let now = (self.now)();
        if let State::HalfOpen { deadline } = inner.state
            && now >= deadline
        {
            inner.enter(
                State::Open {
                    until: later(deadline, self.cool_down),
                },
                now,
                self.name,
                self.cool_down,
            );
        }
        f(&mut inner, now)
    }

    /// A permit if a call may go out now.
    pub(crate) fn allow(&self) -> Option<Permit<'_>> {
        let (trial_timeout, name, cool_down) = (self.trial_timeout, self.name, self.cool_down);
        let generation = self.with(|inner, now| match inner.state {
            State::Closed { .. } => Some(inner.generation),
            State::Open { until } if now >= until => {
                inner.enter(
                    State::HalfOpen {
                        deadline: later(now, trial_timeout),
                    },
                    now,
                    name,
                    cool_down,
                );
                Some(inner.generation)
            }
            State::Open { .. } | State::HalfOpen { .. } => None,
        })?;
        Some(Permit {
            breaker: self,
            generation,
            reported: false,
        })
    }

    fn report(&self, generation: u64, report: Report) {
        let (threshold, cool_down, name) = (self.threshold, self.cool_down, self.name);
        self.with(|inner, now| {
            if generation != inner.generation {
                return; // admitted under an older state
            }
            match (inner.state, report) {
                (State::Closed { .. }, Report::Dropped) => {} // the caller left; Redis said nothing
                (State::Closed { .. }, Report::Success) => {
                    inner.state = State::Closed { failures: 0 };
                }
                (State::HalfOpen { .. }, Report::Success) => {
                    inner.enter(State::Closed { failures: 0 }, now, name, cool_down);
                }
                (State::Closed { failures }, Report::Failure) if failures + 1 < threshold => {
                    inner.state = State::Closed {
                        failures: failures + 1,
                    };
                }
                (State::Closed { .. }, Report::Failure)
                | (State::HalfOpen { .. }, Report::Failure | Report::Dropped) => {
                    inner.enter(
                        State::Open {
                            until: later(now, cool_down),
                        },
                        now,
                        name,
                        cool_down,
                    );
                }
                (State::Open { .. }, _) => {} // nothing is admitted while open
            }
        });
    }

    pub(crate) fn state(&self) -> BreakerState {
        self.with(|inner, now| match inner.state {
            State::Closed { failures } => BreakerState::Closed { failures },
            State::Open { until } if now < until => BreakerState::Open,
            State::Open { .. } | State::HalfOpen { .. } => BreakerState::HalfOpen,
        })
    }
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;

    use super::*;

    const TRIAL: Duration = Duration::from_secs(60);

    thread_local! {
        /// This test's clock: a fixed start plus what the test advanced it by.
        static CLOCK: (Instant, Cell<Duration>) = (Instant::now(), Cell::new(Duration::ZERO));
    }

    fn clock() -> Instant {
        CLOCK.with(|(start, elapsed)| *start + elapsed.get())
    }

    /// Moves this test's clock forward: no sleep, so a slow machine cannot let more time pass
    /// between two steps than the test says.
    fn advance(d: Duration) {
        CLOCK.with(|(_, elapsed)| elapsed.set(elapsed.get() + d));
    }

    fn test_breaker(threshold: u32, cool_down: Duration, trial_timeout: Duration) -> Breaker {
        Breaker::with_clock("test", threshold, cool_down, trial_timeout, clock)
    }

    #[test]
    fn opens_after_threshold_and_recovers_through_one_trial() {
        let breaker = test_breaker(3, Duration::from_millis(50), TRIAL);
        for _ in 0..2 {
            breaker.allow().unwrap().failure();
        }
        assert_eq!(breaker.state(), BreakerState::Closed { failures: 2 });
        breaker.allow().unwrap().failure();
        assert_eq!(breaker.state(), BreakerState::Open);
        assert!(breaker.allow().is_none());
        advance(Duration::from_millis(60));
        let trial = breaker.allow().expect("one trial after the cool-down");
        assert!(breaker.allow().is_none(), "only one trial at a time");
        trial.failure();
        assert_eq!(
            breaker.state(),
            BreakerState::Open,
            "a failed trial reopens"
        );
        advance(Duration::from_millis(60));
        breaker.allow().unwrap().success();
        assert_eq!(breaker.state(), BreakerState::Closed { failures: 0 });
    }

    #[test]
    fn success_resets_the_count() {
        let breaker = test_breaker(2, Duration::from_secs(60), TRIAL);
        breaker.allow().unwrap().failure();
        breaker.allow().unwrap().success();
        breaker.allow().unwrap().failure();
        assert_eq!(breaker.state(), BreakerState::Closed { failures: 1 });
    }

    #[test]
    fn a_late_success_of_a_call_admitted_before_the_breaker_opened_is_ignored() {
        let breaker = test_breaker(1, Duration::from_secs(60), TRIAL);
        let slow = breaker.allow().unwrap();
        breaker.allow().unwrap().failure(); // another call fails and opens the breaker
        slow.success(); // the slow call finally answers
        assert_eq!(breaker.state(), BreakerState::Open);
    }

    #[test]
    fn a_late_failure_from_before_the_breaker_closed_does_not_count() {
        let breaker = test_breaker(1, Duration::from_millis(10), TRIAL);
        let slow = breaker.allow().unwrap();
        breaker.allow().unwrap().failure();
        advance(Duration::from_millis(20));
        breaker.allow().unwrap().success(); // the trial closes it
        slow.failure();
        assert_eq!(breaker.state(), BreakerState::Closed { failures: 0 });
    }

    #[test]
    fn a_call_dropped_while_closed_counts_for_nothing() {
        let breaker = test_breaker(1, Duration::from_secs(60), Duration::from_secs(1));
        for _ in 0..5 {
            drop(breaker.allow().expect("closed"));
        }
        assert_eq!(breaker.state(), BreakerState::Closed { failures: 0 });
        breaker.allow().expect("closed").failure();
        assert!(matches!(breaker.state(), BreakerState::Open));
    }

    #[test]
    fn durations_too_large_for_the_clock_do_not_panic() {
        let breaker = test_breaker(1, Duration::MAX, Duration::MAX);
        breaker.allow().expect("closed").failure();
        assert!(breaker.allow().is_none(), "open for a very long time");
    }

    #[test]
    fn a_dropped_trial_counts_as_failed() {
        let breaker = test_breaker(1, Duration::from_millis(30), TRIAL);
        breaker.allow().unwrap().failure();
        advance(Duration::from_millis(40));
        drop(breaker.allow().unwrap()); // the caller's future was cancelled
        assert_eq!(breaker.state(), BreakerState::Open, "reopened, not stuck");
        advance(Duration::from_millis(40));
        breaker.allow().expect("a new trial").success();
        assert_eq!(breaker.state(), BreakerState::Closed { failures: 0 });
    }

    #[test]
    fn a_trial_that_never_reports_expires() {
        let breaker = test_breaker(1, Duration::from_millis(30), Duration::from_millis(20));
        breaker.allow().unwrap().failure();
        advance(Duration::from_millis(40));
        let lost = breaker.allow().unwrap(); // held by a future that is never polled again
        assert!(breaker.allow().is_none());
        advance(Duration::from_millis(60));
        let trial = breaker.allow().expect("a new trial after the lost one");
        drop(lost); // reports far too late: ignored
        assert_eq!(breaker.state(), BreakerState::HalfOpen);
        trial.success();
        assert_eq!(breaker.state(), BreakerState::Closed { failures: 0 });
    }
}
