//! Time on SQLite: INTEGER milliseconds since the Unix epoch, from the database clock.
//!
//! SQLite has no timestamp type. Integers compare numerically in every index and `WHERE`, with
//! no text format to get wrong (`datetime('now')` and ISO 8601 with `T` do not sort together),
//! and convert to [`SystemTime`] exactly.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The database clock in Unix milliseconds. `julianday('now')` has millisecond resolution and
/// exists in every SQLite version (`unixepoch('subsec')` needs 3.42); `'now'` is fixed for the
/// duration of one statement, so a statement that uses it twice sees one instant.
pub(crate) const NOW_MS: &str =
    "CAST(ROUND((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER)";

/// TTLs above this are capped (about 146 million years), so `now + ttl` cannot overflow.
const MAX_TTL_MS: i64 = i64::MAX / 2;

/// A TTL in milliseconds, capped; `None` keeps the record forever.
pub(crate) fn ttl_millis(ttl: Option<Duration>) -> Option<i64> {
    ttl.map(|ttl| i64::try_from(ttl.as_millis()).map_or(MAX_TTL_MS, |ms| ms.min(MAX_TTL_MS)))
}

/// A stored instant.
pub(crate) fn to_system_time(millis: i64) -> SystemTime {
    let offset = Duration::from_millis(millis.unsigned_abs());
    let time = if millis >= 0 {
        UNIX_EPOCH.checked_add(offset)
    } else {
        UNIX_EPOCH.checked_sub(offset)
    };
    time.unwrap_or(UNIX_EPOCH)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn millis_round_trip() {
        assert_eq!(
            to_system_time(1_700_000_000_123),
            UNIX_EPOCH + Duration::from_millis(1_700_000_000_123)
        );
        assert_eq!(to_system_time(-1_000), UNIX_EPOCH - Duration::from_secs(1));
    }

    #[test]
    fn ttls_are_capped() {
        assert_eq!(ttl_millis(None), None);
        assert_eq!(ttl_millis(Some(Duration::from_secs(2))), Some(2_000));
        assert_eq!(ttl_millis(Some(Duration::MAX)), Some(MAX_TTL_MS));
    }
}
