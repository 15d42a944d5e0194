//! The idempotency records: [`MysqlStore`], its statements and its schema.

mod row;
mod schema;
pub(crate) mod statements;
mod store;

pub(crate) use schema::TRACE_MIGRATION;
pub use schema::{DDL_TEMPLATE, MAX_RECORDS_TABLE_LEN, ddl};
#[cfg(feature = "outbox")]
pub(crate) use statements::sql;
pub use store::MysqlStore;
