#![doc = include_str!("../README.md")]
#![cfg_attr(docsrs, feature(doc_cfg))]

mod clock;
mod connect;
mod error;
mod inbox;
mod introspect;
mod outbox;
mod records;
mod table;

pub use connect::{DEFAULT_BUSY_TIMEOUT, connect_options};
pub use error::{Error, SchemaProblem, store_error};
pub use inbox::{INBOX_DDL_TEMPLATE, SqliteInbox, inbox_ddl};
pub use outbox::{OUTBOX_DDL_TEMPLATE, SqliteOutbox, outbox_ddl};
pub use records::{DDL_TEMPLATE, SqliteStore, ddl};
pub use table::TableName;

/// The core crate, re-exported so one dependency line is enough.
pub use idempotency_core as core;
pub use idempotency_core::{
    Call, ExecutionResult, IdempotencyKey, IdempotencyService, Outcome, Rejection, Scope, Tx,
};
/// The outbox crate (events, relay, publishers, configuration), re-exported so one dependency
/// line is enough for the SQLite outbox.
pub use idempotency_outbox;
/// The sqlx version this crate is built on.
pub use sqlx;

/// An [`IdempotencyService`] on SQLite.
pub type SqliteIdempotencyService<
    L = idempotency_core::NoCache,
    D = idempotency_core::NoCache,
    M = idempotency_core::NoopMetrics,
> = IdempotencyService<SqliteStore, L, D, M>;

/// A transaction on the SQLite store, for [`IdempotencyService::execute_in`].
pub type SqliteTx = Tx<SqliteStore>;

/// A relay on the SQLite outbox.
pub type SqliteRelay<P> = idempotency_outbox::Relay<SqliteOutbox, P>;
