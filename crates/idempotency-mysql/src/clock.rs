//! Time on MySQL: `DATETIME(6)` in UTC, from the database clock.
//!
//! `UTC_TIMESTAMP(6)` does not depend on the session's `time_zone` (a `TIMESTAMP` column and
//! `NOW()` do), and `DATETIME` reaches year 9999 (`TIMESTAMP` stops in 2038). It is fixed for
//! the duration of one statement, so a statement that uses it twice sees one instant.

use std::time::Duration;

/// The database clock, UTC, microseconds.
pub(crate) const NOW: &str = "UTC_TIMESTAMP(6)";

/// Durations above this are capped (1000 years), so `now + d` stays inside `DATETIME`'s range
/// (an overflow would fail the statement).
const MAX_MICROS: i64 = 1000 * 366 * 86_400 * 1_000_000;

/// A duration in microseconds, capped.
pub(crate) fn micros(duration: Duration) -> i64 {
    i64::try_from(duration.as_micros()).map_or(MAX_MICROS, |us| us.min(MAX_MICROS))
}

/// A TTL in microseconds, capped; `None` keeps the record forever (`now + NULL` is `NULL`).
pub(crate) fn ttl_micros(ttl: Option<Duration>) -> Option<i64> {
    ttl.map(micros)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_are_capped() {
        assert_eq!(ttl_micros(None), None);
        assert_eq!(micros(Duration::from_millis(2)), 2_000);
        assert_eq!(micros(Duration::MAX), MAX_MICROS);
    }
}
