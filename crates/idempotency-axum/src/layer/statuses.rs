//! [`StoredStatuses`]: which response statuses the middleware records.

use std::fmt;

use axum::http::StatusCode;

/// 4xx statuses that describe the server's current state or the caller's credentials rather
/// than the request: a retry of the same request may well get another answer, so they are not
/// stored by default.
///
/// 405 is among them: it says that the route does not serve the method, a fact about the route
/// rather than the request, and storing it would leave a record (and a cache entry) per method a
/// client makes up.
const TRANSIENT_4XX: &[u16] = &[401, 403, 404, 405, 408, 409, 423, 424, 425, 428, 429];

/// Which response statuses [`IdempotencyLayer`](crate::IdempotencyLayer) records (and commits)
/// and which it rolls back and leaves retryable.
///
/// The default stores every 2xx and 3xx, and the 4xx that describe the request itself (400,
/// 406, 410, 411, 413, 414, 415, 422, ...). It does not store 5xx, nor the 4xx a retry may
/// answer differently: 401, 403, 404, 408, 409, 423, 424, 425, 428 and 429, nor 405 (the route
/// does not serve the method).
///
/// A status that is not stored rolls the transaction back: the handler's writes and the key go
/// away together, and a retry with the same key runs the handler again.
///
/// ```
/// use axum::http::StatusCode;
/// use idempotency_axum::StoredStatuses;
///
/// let statuses = StoredStatuses::default();
/// assert!(statuses.stores(StatusCode::CREATED));
/// assert!(statuses.stores(StatusCode::UNPROCESSABLE_ENTITY));
/// assert!(!statuses.stores(StatusCode::CONFLICT));
/// assert!(!statuses.stores(StatusCode::INTERNAL_SERVER_ERROR));
///
/// let custom = statuses.skip(StatusCode::UNPROCESSABLE_ENTITY).store(StatusCode::NOT_FOUND);
/// assert!(!custom.stores(StatusCode::UNPROCESSABLE_ENTITY));
/// assert!(custom.stores(StatusCode::NOT_FOUND));
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct StoredStatuses {
    /// One bit per status code 0..640.
    bits: [u64; 10],
}

impl Default for StoredStatuses {
    fn default() -> Self {
        let mut statuses = Self::none();
        for code in 200..500 {
            if !TRANSIENT_4XX.contains(&code) {
                statuses.set(code, true);
            }
        }
        statuses
    }
}

impl StoredStatuses {
    /// Stores no status at all (add some with [`store`](Self::store)).
    pub fn none() -> Self {
        Self { bits: [0; 10] }
    }

    /// Also stores `status`.
    pub fn store(mut self, status: StatusCode) -> Self {
        self.set(status.as_u16(), true);
        self
    }

    /// Does not store `status`.
    pub fn skip(mut self, status: StatusCode) -> Self {
        self.set(status.as_u16(), false);
        self
    }

    /// Whether a response with `status` is stored.
    pub fn stores(&self, status: StatusCode) -> bool {
        let code = usize::from(status.as_u16());
        self.bits
            .get(code / 64)
            .is_some_and(|word| word & (1 << (code % 64)) != 0)
    }

    fn set(&mut self, code: u16, on: bool) {
        let code = usize::from(code);
        if let Some(word) = self.bits.get_mut(code / 64) {
            if on {
                *word |= 1 << (code % 64);
            } else {
                *word &= !(1 << (code % 64));
            }
        }
    }
}

impl fmt::Debug for StoredStatuses {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let stored = (100..600)
            .filter_map(|code| StatusCode::from_u16(code).ok())
            .filter(|status| self.stores(*status))
            .map(|status| status.as_u16());
        f.debug_set().entries(stored).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_stores_successes_and_request_errors_only() {
        let statuses = StoredStatuses::default();
        for code in [200, 201, 204, 303, 400, 413, 415, 422] {
            assert!(
                statuses.stores(StatusCode::from_u16(code).unwrap()),
                "{code}"
            );
        }
        for code in [100, 401, 403, 404, 405, 408, 409, 429, 500, 502, 503, 504] {
            assert!(
                !statuses.stores(StatusCode::from_u16(code).unwrap()),
                "{code}"
            );
        }
    }
}
