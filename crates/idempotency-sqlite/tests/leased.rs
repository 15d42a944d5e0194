//! The leased-claim conformance cases from `idempotency-core`, against SQLite (a database file
//! per test, see `support`).

mod support;

use support::fresh_store;

idempotency_core::leased_conformance_tests!(
    fresh_store,
    idempotency_core::testing::Capabilities::SINGLE_WRITER
);
