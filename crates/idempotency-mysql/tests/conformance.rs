//! The store conformance suite from `idempotency-core`, against MySQL / MariaDB (`MYSQL_URL`),
//! each test on a fresh database. InnoDB has row locks and concurrent writers: a duplicate
//! waits in `acquire` like on PostgreSQL, so every case runs with `Capabilities::FULL`.

mod support;

use support::fresh_store;

idempotency_core::store_conformance_tests!(
    fresh_store,
    idempotency_core::testing::Capabilities::FULL
);

/// `execute_optimistic`, on the store's `InsertCompleted`.
mod optimistic {
    use super::fresh_store;

    idempotency_core::optimistic_conformance_tests!(
        fresh_store,
        idempotency_core::testing::Capabilities::FULL
    );
}
