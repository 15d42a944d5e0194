//! The leased-claim conformance cases from `idempotency-core`, against a real PostgreSQL.

#![allow(clippy::unwrap_used)] // tests fail loudly on unexpected errors

use idempotency_core::testing::Capabilities;
use idempotency_pg::PgStore;

async fn fresh_store() -> PgStore {
    let store = PgStore::new(idempotency_testing::pg_pool().await);
    store.create_schema().await.expect("create schema");
    store
}

idempotency_core::leased_conformance_tests!(fresh_store, Capabilities::FULL);
