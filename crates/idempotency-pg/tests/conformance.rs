//! The store conformance suite from `idempotency-core`, against a real PostgreSQL.
//!
//! Each test gets its own schema (see `idempotency_testing::pg_pool`).

#![allow(clippy::unwrap_used)] // tests fail loudly on unexpected errors

use idempotency_core::testing::Capabilities;
use idempotency_pg::PgStore;

async fn fresh_store() -> PgStore {
    let store = PgStore::new(idempotency_testing::pg_pool().await);
    store.create_schema().await.expect("create schema");
    store
}

idempotency_core::store_conformance_tests!(fresh_store, Capabilities::FULL);

mod optimistic {
    use super::*;
    idempotency_core::optimistic_conformance_tests!(fresh_store, Capabilities::FULL);
}
