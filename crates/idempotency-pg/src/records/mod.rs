//! The idempotency records of PostgreSQL: the store, its statements, row decoding and schema.

mod lease;
mod row;
mod schema;
mod statements;
mod store;

#[cfg(feature = "outbox")]
pub(crate) use schema::QUIET;
pub(crate) use schema::TRACE_MIGRATION;
pub use schema::{DDL_TEMPLATE, RECORDS_HASH_PARTITION_KEY, ddl, records_hash_partitioned_ddl};
pub use store::PgStore;
