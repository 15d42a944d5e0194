#![doc = include_str!("../README.md")]
#![cfg_attr(docsrs, feature(doc_cfg))]

mod error;
mod lease;
mod schema;
mod store;
mod table;

pub use error::{Error, SchemaProblem, store_error};
pub use schema::{DDL_TEMPLATE, ddl};
pub use store::PgStore;
pub use table::TableName;

/// The core crate, re-exported so one dependency line is enough.
pub use idempotency_core as core;
pub use idempotency_core::{
    Call, ExecutionResult, IdempotencyKey, IdempotencyService, Outcome, Rejection, Scope, Tx,
};
/// The sqlx version this crate is built on.
pub use sqlx;

/// An [`IdempotencyService`] on PostgreSQL.
pub type PgIdempotencyService<
    L = idempotency_core::NoCache,
    D = idempotency_core::NoCache,
    M = idempotency_core::NoopMetrics,
> = IdempotencyService<PgStore, L, D, M>;

/// A transaction on the PostgreSQL store, for [`IdempotencyService::execute_in`].
pub type PgTx = Tx<PgStore>;
