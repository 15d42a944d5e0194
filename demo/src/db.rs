//! The databases the demo runs on: PostgreSQL (when `DATABASE_URL` is set), MySQL / MariaDB
//! (when `MYSQL_URL`, or a `mysql://` `DATABASE_URL`, is set) and an embedded SQLite file
//! (otherwise). Each holds the business tables, the idempotency records and the
//! outbox; the business statements differ only in their SQL dialect.

use std::future::Future;

use idempotency_core::store::InsertCompleted;
use idempotency_core::{ExpiredCleanup, IdempotencyStore, StoreError};
use idempotency_outbox::{Enqueue, Housekeeping, RelayStore};
use idempotency_pg::sqlx;
use uuid::Uuid;

use crate::model::{Charge, Payment, Refund};

mod mysql;
mod postgres;
mod sqlite;

pub use mysql::Mysql;
pub use postgres::Postgres;
pub use sqlite::Sqlite;

/// The connection a database's transactions run on.
pub type Conn<DB> = <<DB as Database>::Store as IdempotencyStore>::Connection;

/// A database the demo can run on.
pub trait Database: Clone + Send + Sync + 'static {
    /// The pool the `idempotency` facade assembles the store and the outbox on.
    type Pool: idempotency::Database<Store = Self::Store, Outbox = Self::Outbox>;
    /// The idempotency store.
    type Store: IdempotencyStore + ExpiredCleanup + InsertCompleted + Clone;
    /// The outbox, written through the same connection as the business rows.
    type Outbox: Enqueue<Connection = Conn<Self>> + RelayStore + Housekeeping + Clone;

    /// Creates the business tables (payments, refunds, charges) when missing.
    fn create_business_tables(
        pool: &Self::Pool,
    ) -> impl Future<Output = Result<(), sqlx::Error>> + Send;
    /// The demo's database over `pool`, with the store and outbox the facade assembled.
    fn new(pool: Self::Pool, store: Self::Store, outbox: Self::Outbox) -> Self;

    /// The idempotency store.
    fn store(&self) -> &Self::Store;
    /// The outbox.
    fn outbox(&self) -> &Self::Outbox;
    /// Where the data lives, for the startup banner.
    fn describe(&self) -> String;
    /// Closes the pool at shutdown, once nothing uses it any more (SQLite: a final checkpoint
    /// that empties the WAL first). Servers need nothing: their pools close on drop.
    fn close(&self) -> impl Future<Output = ()> + Send {
        async {}
    }
    /// Classifies an error of a business statement the way the store classifies its own:
    /// a lost connection is `Unavailable` (503), a serialization failure `Conflict` (409).
    fn classify(error: sqlx::Error) -> StoreError;

    /// Inserts a confirmed payment.
    fn insert_payment(
        conn: &mut Conn<Self>,
        payment: &Payment,
        recipient: &str,
    ) -> impl Future<Output = Result<(), sqlx::Error>> + Send;
    /// Inserts a refund.
    fn insert_refund(
        conn: &mut Conn<Self>,
        refund: &Refund,
    ) -> impl Future<Output = Result<(), sqlx::Error>> + Send;
    /// Inserts a charge.
    fn insert_charge(
        conn: &mut Conn<Self>,
        id: Uuid,
        amount_cents: i64,
    ) -> impl Future<Output = Result<(), sqlx::Error>> + Send;
    /// Reads a charge.
    fn find_charge(
        &self,
        id: Uuid,
    ) -> impl Future<Output = Result<Option<Charge>, sqlx::Error>> + Send;
    /// The outbox article's production check: charges created in the last `window` seconds
    /// that have no `ChargeCreated` event in the outbox. Always zero while charge and event
    /// commit together; `window` stays within the outbox retention, after which published
    /// events are deleted.
    fn charges_without_event(
        &self,
        window_secs: i64,
    ) -> impl Future<Output = Result<i64, sqlx::Error>> + Send;
    /// Checks that the database answers.
    fn ping(&self) -> impl Future<Output = Result<(), sqlx::Error>> + Send;
}
