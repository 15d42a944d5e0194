// The README describes the outbox, the relay and the inbox, which the `outbox` feature builds:
// without it, a shorter page whose links all resolve.
#![cfg_attr(feature = "outbox", doc = include_str!("../README.md"))]
#![cfg_attr(
    not(feature = "outbox"),
    doc = "The PostgreSQL store of `idempotency-core` (this build has no `outbox` feature: \
           the crate's README, and its documentation built with all features, describe the \
           outbox, its relay store and the consumer inbox)."
)]
#![cfg_attr(docsrs, feature(doc_cfg))]

use idempotency_core::{IdempotencyService, Tx};

mod admin;
mod begin;
mod error;
#[cfg(feature = "outbox")]
mod inbox;
#[cfg(feature = "outbox")]
mod outbox;
mod pooler;
mod records;
mod table;

pub use begin::begin;
pub use error::{Error, SchemaProblem, store_error};
#[cfg(feature = "outbox")]
#[cfg_attr(docsrs, doc(cfg(feature = "outbox")))]
pub use inbox::{INBOX_DDL_TEMPLATE, PgInbox, inbox_ddl};
#[cfg(feature = "outbox")]
#[cfg_attr(docsrs, doc(cfg(feature = "outbox")))]
pub use outbox::{
    Channel, LISTEN_KEEPALIVE, OUTBOX_DDL_TEMPLATE, OUTBOX_PARTITIONED_DDL_TEMPLATE,
    OutboxPartition, PgNotificationListener, PgOutbox, outbox_ddl, outbox_partitioned_ddl,
};
pub use pooler::Pooler;
pub use records::{
    DDL_TEMPLATE, PgStore, RECORDS_HASH_PARTITION_KEY, ddl, records_hash_partitioned_ddl,
};
pub use table::TableName;

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

/// A relay on the PostgreSQL outbox.
#[cfg(feature = "outbox")]
#[cfg_attr(docsrs, doc(cfg(feature = "outbox")))]
pub type PgRelay<P> = idempotency_outbox::Relay<PgOutbox, P>;
