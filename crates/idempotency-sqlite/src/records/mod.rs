//! The idempotency records: [`SqliteStore`], its statements and its schema.
//!
//! The outbox store will sit next to this module, sharing `connect`, `table`, `introspect`,
//! `clock` and `error`.

mod lease;
mod row;
mod schema;
mod statements;
mod store;

pub(crate) use schema::TRACE_MIGRATION;
pub use schema::{DDL_TEMPLATE, ddl};
pub use store::SqliteStore;
