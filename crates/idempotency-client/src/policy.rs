//! [`RetryPolicy`]: which answers are retried, how long to wait, when to give up.

use std::time::Duration;

use reqwest::StatusCode;

/// When a request is tried again and how long the client waits in between.
///
/// Retried: connection errors and timeouts (always), every `5xx`, `409` and `429` (these
/// statuses configurable).
/// Never retried, whatever the configuration: `400` and `422` (the request must change; see
/// [`Error::Refused`](crate::Error::Refused) for the key). A `Retry-After` on a retried answer is honoured when it is at most
/// [`max_retry_after`](Self::max_retry_after); a longer one ends the retries. Without it the
/// wait is an exponential backoff with jitter: half of `initial_backoff * 2^(n-1)` (capped at
/// `max_backoff`) plus a random part of the other half.
///
/// ```
/// use std::time::Duration;
/// use idempotency_client::RetryPolicy;
/// use reqwest::StatusCode;
///
/// let policy = RetryPolicy::default()
///     .max_attempts(5)
///     .max_elapsed(Duration::from_secs(10))
///     .retry_statuses([StatusCode::SERVICE_UNAVAILABLE, StatusCode::CONFLICT]);
/// assert!(policy.retries(StatusCode::CONFLICT));
/// assert!(!policy.retries(StatusCode::BAD_GATEWAY));
/// assert!(!RetryPolicy::default().retries(StatusCode::UNPROCESSABLE_ENTITY));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetryPolicy {
    max_attempts: u32,
    initial_backoff: Duration,
    max_backoff: Duration,
    max_elapsed: Duration,
    max_retry_after: Duration,
    server_errors: bool,
    statuses: Vec<StatusCode>,
}

impl Default for RetryPolicy {
    /// 4 attempts, backoff from 100 ms up to 5 s, no retry starting later than 30 s after the
    /// first attempt (an attempt itself is bounded by the reqwest client's timeout, not by
    /// this), `Retry-After` up to 10 s; retried statuses: every `5xx`, `409`, `429`.
    fn default() -> Self {
        Self {
            max_attempts: 4,
            initial_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(5),
            max_elapsed: Duration::from_secs(30),
            max_retry_after: Duration::from_secs(10),
            server_errors: true,
            statuses: vec![StatusCode::CONFLICT, StatusCode::TOO_MANY_REQUESTS],
        }
    }
}

impl RetryPolicy {
    /// Attempts in all, the first included (at least 1).
    #[must_use]
    pub fn max_attempts(mut self, attempts: u32) -> Self {
        self.max_attempts = attempts.max(1);
        self
    }

    /// The backoff before the first retry; it doubles at each retry.
    #[must_use]
    pub fn initial_backoff(mut self, backoff: Duration) -> Self {
        self.initial_backoff = backoff;
        self
    }

    /// The longest backoff between two attempts (a `Retry-After` is bounded separately).
    #[must_use]
    pub fn max_backoff(mut self, backoff: Duration) -> Self {
        self.max_backoff = backoff;
        self
    }

    /// No retry starts later than this after the first attempt started.
    #[must_use]
    pub fn max_elapsed(mut self, elapsed: Duration) -> Self {
        self.max_elapsed = elapsed;
        self
    }

    /// The longest `Retry-After` the client waits; a longer one ends the retries.
    #[must_use]
    pub fn max_retry_after(mut self, bound: Duration) -> Self {
        self.max_retry_after = bound;
        self
    }

    /// Retries exactly these statuses (`5xx` no longer retried unless listed). `400` and
    /// `422` are ignored.
    #[must_use]
    pub fn retry_statuses(mut self, statuses: impl IntoIterator<Item = StatusCode>) -> Self {
        self.server_errors = false;
        self.statuses = statuses.into_iter().collect();
        self
    }

    /// The configured attempts, the first included.
    pub fn attempts(&self) -> u32 {
        self.max_attempts
    }

    /// Whether an answer with `status` is tried again.
    pub fn retries(&self, status: StatusCode) -> bool {
        if matches!(
            status,
            StatusCode::BAD_REQUEST | StatusCode::UNPROCESSABLE_ENTITY
        ) {
            return false;
        }
        (self.server_errors && status.is_server_error()) || self.statuses.contains(&status)
    }

    pub(crate) fn elapsed_budget(&self) -> Duration {
        self.max_elapsed
    }

    pub(crate) fn retry_after_bound(&self) -> Duration {
        self.max_retry_after
    }

    /// The wait before retry `retry` (1 for the first retry), jitter included.
    pub(crate) fn backoff(&self, retry: u32) -> Duration {
        let factor = 2u32.saturating_pow(retry.saturating_sub(1));
        let base = self
            .initial_backoff
            .saturating_mul(factor)
            .min(self.max_backoff);
        let half = base / 2;
        let jitter = u64::try_from(half.as_nanos()).unwrap_or(u64::MAX);
        half + Duration::from_nanos(rand::random_range(0..=jitter))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_within_its_jitter_and_stops_at_the_cap() {
        let policy = RetryPolicy::default()
            .initial_backoff(Duration::from_millis(100))
            .max_backoff(Duration::from_millis(350));
        for _ in 0..50 {
            let first = policy.backoff(1);
            assert!((50..=100).contains(&first.as_millis()), "{first:?}");
            let second = policy.backoff(2);
            assert!((100..=200).contains(&second.as_millis()), "{second:?}");
            let capped = policy.backoff(30);
            assert!((175..=350).contains(&capped.as_millis()), "{capped:?}");
        }
    }

    #[test]
    fn bad_request_and_key_reuse_are_never_retried() {
        let policy = RetryPolicy::default().retry_statuses([
            StatusCode::BAD_REQUEST,
            StatusCode::UNPROCESSABLE_ENTITY,
            StatusCode::CONFLICT,
        ]);
        assert!(!policy.retries(StatusCode::BAD_REQUEST));
        assert!(!policy.retries(StatusCode::UNPROCESSABLE_ENTITY));
        assert!(policy.retries(StatusCode::CONFLICT));
        assert!(!policy.retries(StatusCode::INTERNAL_SERVER_ERROR));
        let default = RetryPolicy::default();
        for code in [500, 502, 503, 504, 409, 429] {
            assert!(
                default.retries(StatusCode::from_u16(code).unwrap()),
                "{code}"
            );
        }
        for code in [200, 201, 401, 403, 404, 412] {
            assert!(
                !default.retries(StatusCode::from_u16(code).unwrap()),
                "{code}"
            );
        }
    }
}
