//! What a backend gives the suite.

use std::future::Future;
use std::ops::DerefMut;

use crate::config::OutboxConfig;
use crate::store::{DeadLetters, Enqueue, Housekeeping, Inbox, RelayStore};

/// An outbox backend under test: one value per test, on its own isolated database (a fresh
/// schema, a fresh file), so that cases run in parallel and again without cleanup.
///
/// The harness panics on setup errors: they are failures of the test environment.
pub trait OutboxBackend: Send + Sync + Sized + 'static {
    /// The connection a caller's transaction runs on.
    type Connection: Send;
    /// An open transaction on the backend; it dereferences to the connection.
    type Transaction: Send + DerefMut<Target = Self::Connection>;
    /// A pooled connection outside any transaction; it dereferences to the connection.
    type Pooled: Send + DerefMut<Target = Self::Connection>;
    /// The outbox store.
    type Outbox: Enqueue<Connection = Self::Connection>
        + RelayStore
        + Housekeeping
        + DeadLetters
        + Clone;
    /// The inbox store.
    type Inbox: Inbox<Connection = Self::Connection> + Clone;

    /// An outbox on this backend's database configured by `config` (table names, ordering,
    /// notifications); the suite sets `schema.mode: create`, so its tables are created. Each
    /// call with another `table-name` gives an independent outbox.
    fn outbox(&self, config: &OutboxConfig) -> impl Future<Output = Self::Outbox> + Send;

    /// An inbox on this backend's database, its table created.
    fn inbox(&self) -> impl Future<Output = Self::Inbox> + Send;

    /// Begins a transaction, as an application writing a business change would.
    fn begin(&self) -> impl Future<Output = Self::Transaction> + Send;

    /// A connection from the pool, in no transaction (writes on it would autocommit).
    fn acquire(&self) -> impl Future<Output = Self::Pooled> + Send;

    /// Commits `tx`.
    fn commit(tx: Self::Transaction) -> impl Future<Output = ()> + Send;

    /// Rolls `tx` back.
    fn rollback(tx: Self::Transaction) -> impl Future<Output = ()> + Send;
}

/// What a backend can do, where backends legitimately differ.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Capabilities {
    /// New rows wake a relay through a notification (PostgreSQL `LISTEN/NOTIFY`). When
    /// `false`, [`listen`](crate::RelayStore::listen) answers `None` and relays poll.
    pub notifications: bool,
    /// Two transactions can both be open and writing; a second writer of an aggregate (or of an
    /// inbox entry) waits inside the statement for the first to end (PostgreSQL). When `false`,
    /// writers are serialized when they begin (SQLite's `BEGIN IMMEDIATE`), so the cases check
    /// the same outcomes with sequential writers.
    pub concurrent_writers: bool,
}

impl Capabilities {
    /// Everything the suite checks (PostgreSQL).
    pub const FULL: Self = Self {
        notifications: true,
        concurrent_writers: true,
    };
    /// One writer at a time and no notifications (SQLite).
    pub const SINGLE_WRITER: Self = Self {
        notifications: false,
        concurrent_writers: false,
    };
}
