//! The store conformance suite from `idempotency-core`, against SQLite.
//!
//! Each test gets its own database file (WAL), see `support`. The suite's concurrency cases check
//! the single-writer behaviour (`Capabilities::SINGLE_WRITER`): duplicates wait at `BEGIN
//! IMMEDIATE` and replay instead of being rejected in `acquire`.

mod support;

use support::fresh_store;

idempotency_core::store_conformance_tests!(
    fresh_store,
    idempotency_core::testing::Capabilities::SINGLE_WRITER
);

/// `execute_optimistic`, on the store's `InsertCompleted`.
mod optimistic {
    use super::fresh_store;

    idempotency_core::optimistic_conformance_tests!(
        fresh_store,
        idempotency_core::testing::Capabilities::SINGLE_WRITER
    );
}
