#![doc = include_str!("../README.md")]
#![cfg_attr(docsrs, feature(doc_cfg))]

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
mod transaction_end;

use idempotency_core::{IdempotencyService, Tx};

pub use connect::{
    DEFAULT_BUSY_TIMEOUT, JOURNAL_SIZE_LIMIT, close_pool, connect_options, open_pool, reusable,
};
pub use error::{Error, SchemaProblem, store_error};
#[cfg(feature = "outbox")]
#[cfg_attr(docsrs, doc(cfg(feature = "outbox")))]
pub use inbox::{INBOX_DDL_TEMPLATE, SqliteInbox, inbox_ddl};
#[cfg(feature = "outbox")]
#[cfg_attr(docsrs, doc(cfg(feature = "outbox")))]
pub use outbox::{OUTBOX_DDL_TEMPLATE, SqliteOutbox, outbox_ddl};
pub use records::{DDL_TEMPLATE, SqliteStore, ddl};
pub use table::TableName;

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
#[cfg(feature = "outbox")]
#[cfg_attr(docsrs, doc(cfg(feature = "outbox")))]
pub type SqliteRelay<P> = idempotency_outbox::Relay<SqliteOutbox, P>;
