// The README describes the outbox, the relay and the inbox, which the `outbox` feature builds:
// without it, a shorter page whose links all resolve.
#![cfg_attr(feature = "outbox", doc = include_str!("../README.md"))]
#![cfg_attr(
    not(feature = "outbox"),
    doc = "The MySQL / MariaDB store of `idempotency-core` (this build has no `outbox` feature: \
           the crate's README, and its documentation built with all features, describe the \
           outbox, its relay store and the consumer inbox)."
)]
#![cfg_attr(docsrs, feature(doc_cfg))]

/// The most rows one list statement carries: MySQL allows 65,535 placeholders, and a statement
/// must stay well under `max_allowed_packet` (16 MiB by default) with keys of 255 bytes.
pub(crate) const CHUNK: usize = 1000;

mod admin;
mod clock;
mod connect;
mod error;
#[cfg(feature = "outbox")]
mod inbox;
mod introspect;
#[cfg(feature = "outbox")]
mod outbox;
mod records;
mod table;
mod transaction;

pub use connect::begin;
pub use error::{Error, SchemaProblem, TransactionRolledBack, store_error};
#[cfg(feature = "outbox")]
pub use inbox::{INBOX_DDL_TEMPLATE, MysqlInbox, inbox_ddl};
#[cfg(feature = "outbox")]
pub use outbox::{DEFAULT_RELAY_LOCK, MysqlOutbox, OUTBOX_DDL_TEMPLATE, outbox_ddl};
pub use records::{DDL_TEMPLATE, MAX_RECORDS_TABLE_LEN, MysqlStore, ddl};
pub use table::TableName;
pub use transaction::MysqlTransaction;

/// The sqlx version this crate is built on.
pub use sqlx;

/// An [`IdempotencyService`](idempotency_core::IdempotencyService) on MySQL or MariaDB.
pub type MysqlIdempotencyService<
    L = idempotency_core::NoCache,
    D = idempotency_core::NoCache,
    M = idempotency_core::NoopMetrics,
> = idempotency_core::IdempotencyService<MysqlStore, L, D, M>;

/// A transaction on the MySQL store, for
/// [`IdempotencyService::execute_in`](idempotency_core::IdempotencyService::execute_in).
pub type MysqlTx = idempotency_core::Tx<MysqlStore>;

/// A relay on the MySQL outbox.
#[cfg(feature = "outbox")]
pub type MysqlRelay<P> = idempotency_outbox::Relay<MysqlOutbox, P>;
