//! The storage SPI: what an outbox backend implements (PostgreSQL here, SQLite elsewhere).
//!
//! A small base trait per role, so a backend implements what it can:
//!
//! - [`Enqueue`]: write events through the caller's connection, in the caller's transaction;
//! - [`RelayStore`]: claim due rows under a lease, mark them published or failed;
//! - [`Housekeeping`]: gauges and retention, used by the relay's background task;
//! - [`DeadLetters`]: list and requeue dead-lettered rows;
//! - [`Inbox`]: consumer-side deduplication.
//!
//! Every method returns a `Send` future; implementors write `async fn`.

use std::future::Future;
use std::time::Duration;

use uuid::Uuid;

use crate::config::Ordering;
use crate::error::Error;
use crate::message::{DeadLetter, NewEvent, OutboxMessage};

/// Writing events in the caller's transaction.
pub trait Enqueue: Send + Sync + 'static {
    /// The connection the caller's transaction runs on.
    type Connection: Send;

    /// Writes `events` through `conn`, in its transaction; returns their ids in order.
    ///
    /// In `ordered` mode events of one aggregate get consecutive sequence numbers, and two
    /// transactions writing the same aggregate are serialized so that sequence order is
    /// commit order. Nothing is visible to relays before the caller commits; a rollback
    /// removes the events with the business change.
    fn enqueue_all(
        &self,
        conn: &mut Self::Connection,
        events: &[NewEvent],
    ) -> impl Future<Output = Result<Vec<Uuid>, Error>> + Send;
}

/// What a relay worker asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClaimRequest {
    /// At most this many rows.
    pub limit: u32,
    /// Claimed rows stay invisible to other claims this long (database clock).
    pub lease: Duration,
    /// The fencing token: marks only apply to rows still holding it.
    pub token: Uuid,
    /// `ordered`: only the first pending row of each aggregate, and none of an aggregate whose
    /// first pending row is leased or backing off. `unordered`: any due row.
    pub ordering: Ordering,
    /// `relay.max-attempts` (at least 1): a due row already claimed this often is moved to
    /// the dead letters by the claim instead of being handed out again.
    pub max_attempts: u32,
}

/// What one claim did.
#[derive(Debug, Clone, Default, PartialEq)]
#[non_exhaustive]
pub struct Claimed {
    /// The rows to publish, leased to the claim's token.
    pub messages: Vec<OutboxMessage>,
    /// The rows this claim dead-lettered instead: they were claimed `max_attempts` times and
    /// never marked (each publish crashed its process or outlived its lease). Their
    /// `last_error` reads `claimed N times without completing`.
    pub dead_lettered: Vec<Uuid>,
}

impl Claimed {
    /// A claim's result, built by a store.
    pub fn new(messages: Vec<OutboxMessage>, dead_lettered: Vec<Uuid>) -> Self {
        Self {
            messages,
            dead_lettered,
        }
    }

    /// Splits the rows a claim statement returned: those whose `attempts` passed
    /// `max_attempts` were dead-lettered by it, the others are to publish.
    pub fn split(rows: Vec<OutboxMessage>, max_attempts: u32) -> Self {
        let (spent, messages): (Vec<_>, Vec<_>) =
            rows.into_iter().partition(|m| m.attempts > max_attempts);
        Self::new(messages, spent.into_iter().map(|m| m.id).collect())
    }
}

/// A failed publish, as the relay reports it to the store.
#[derive(Debug, Clone, PartialEq)]
pub struct Failure {
    /// The message.
    pub id: Uuid,
    /// The error, already bounded to [`MAX_ERROR_LEN`] characters.
    pub error: String,
    /// Delay before the next attempt, added to the database clock.
    pub retry_in: Duration,
    /// Move the row to the dead letters instead of retrying.
    pub dead_letter: bool,
    /// The failure was the broker's, not the message's (unavailable, timed out, no stream
    /// for the subject, a full destination within `full-patience`): the store gives back the
    /// attempt the claim counted (`attempts - 1`), so that an outage, however long, never
    /// leads to a dead letter. Never set together with `dead_letter`.
    pub transient: bool,
}

/// Longest `last_error` stored.
pub const MAX_ERROR_LEN: usize = 1000;

/// Receives wake-up notifications for a relay.
pub trait NotificationListener: Send + 'static {
    /// Resolves at the next notification (`Ok(true)`), or when the connection was lost and
    /// re-established so notifications may have been missed (`Ok(false)`: poll now).
    fn next(&mut self) -> impl Future<Output = Result<bool, Error>> + Send;
}

/// A listener that never fires, for stores without notifications (they rely on polling).
#[derive(Debug, Clone, Copy, Default)]
pub struct NoNotifications;

impl NotificationListener for NoNotifications {
    async fn next(&mut self) -> Result<bool, Error> {
        std::future::pending().await
    }
}

/// Claiming and marking rows: what relay workers need.
///
/// Claims are leases with a fencing token: a claim increments `attempts`, sets the row's
/// `next_attempt_at` to the end of the lease and stores the token, in one short statement.
/// `mark_published` and `mark_failed` only touch rows that still hold the token,
/// so a worker whose lease ran out cannot overwrite the work of the worker that took over.
///
/// The same statement dead-letters the due rows whose `attempts` already reached
/// `max_attempts` (their `attempts` becomes `max_attempts + 1`, counting that claim): a message
/// whose publish crashes the process every time is never marked, so only the claim can stop it.
pub trait RelayStore: Send + Sync + 'static {
    /// The listener type of [`listen`](Self::listen).
    type Listener: NotificationListener;

    /// Claims due rows for one batch, and dead-letters the due rows claimed
    /// `request.max_attempts` times already.
    fn claim(&self, request: &ClaimRequest) -> impl Future<Output = Result<Claimed, Error>> + Send;

    /// Marks rows published (after the broker confirmed them). Returns rows updated.
    fn mark_published(
        &self,
        token: Uuid,
        ids: &[Uuid],
    ) -> impl Future<Output = Result<u64, Error>> + Send;

    /// Records failures: error, backoff from the database clock, or dead-lettering.
    fn mark_failed(
        &self,
        token: Uuid,
        failures: &[Failure],
    ) -> impl Future<Output = Result<u64, Error>> + Send;

    /// A listener for new-row notifications, or `None` when the store has none.
    fn listen(&self) -> impl Future<Output = Result<Option<Self::Listener>, Error>> + Send;
}

/// Counts the relay exports as gauges.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
#[non_exhaustive]
pub struct OutboxStats {
    /// Rows neither published nor dead-lettered.
    pub pending: u64,
    /// Age of the oldest pending row in seconds (0 when none).
    pub oldest_pending_age: f64,
    /// Dead-lettered rows.
    pub dead_lettered: u64,
}

impl OutboxStats {
    /// Stats built by a store.
    pub fn new(pending: u64, oldest_pending_age: f64, dead_lettered: u64) -> Self {
        Self {
            pending,
            oldest_pending_age,
            dead_lettered,
        }
    }
}

/// Gauges and retention.
pub trait Housekeeping: Send + Sync + 'static {
    /// Pending count, oldest pending age and dead-letter count.
    fn stats(&self) -> impl Future<Output = Result<OutboxStats, Error>> + Send;

    /// Deletes at most `limit` rows published more than `older_than` ago, in one short
    /// statement. Returns how many.
    fn delete_published(
        &self,
        older_than: Duration,
        limit: u32,
    ) -> impl Future<Output = Result<u64, Error>> + Send;

    /// Deletes at most `limit` rows dead-lettered more than `older_than` ago.
    fn delete_dead_lettered(
        &self,
        older_than: Duration,
        limit: u32,
    ) -> impl Future<Output = Result<u64, Error>> + Send;

    /// Prepares storage for the rows to come; returns how many storage units it created.
    /// A time-partitioned PostgreSQL outbox creates its partitions ahead of time here. Run
    /// by every retention pass, before anything is deleted. The default does nothing.
    fn prepare_storage(&self) -> impl Future<Output = Result<u32, Error>> + Send {
        std::future::ready(Ok(0))
    }

    /// Drops whole storage units (partitions) every row of which retention would delete:
    /// published more than `published` ago, or dead-lettered more than `dead_lettered` ago
    /// (`None`: dead letters are kept, so a unit holding one is kept). Returns how many it
    /// dropped. Run by every retention pass before the batched deletes, which then remove the
    /// old rows that remain elsewhere, so what is kept is the same either way. The default
    /// drops nothing.
    fn drop_expired(
        &self,
        published: Duration,
        dead_lettered: Option<Duration>,
    ) -> impl Future<Output = Result<u32, Error>> + Send {
        let _ = (published, dead_lettered);
        std::future::ready(Ok(0))
    }
}

/// Operating on dead letters.
pub trait DeadLetters: Send + Sync + 'static {
    /// The oldest dead letters, at most `limit`.
    fn dead_letters(
        &self,
        limit: u32,
    ) -> impl Future<Output = Result<Vec<DeadLetter>, Error>> + Send;

    /// Puts dead-lettered rows back to pending, due now, attempts reset. Returns how many
    /// (ids that are not dead-lettered are ignored).
    ///
    /// Order: while a row is dead-lettered, its aggregate's later events are published.
    /// Requeuing one whose aggregate already published a later event would publish it after
    /// that event, so it is refused: [`Error::RequeueOutOfOrder`] names those ids, and nothing
    /// is requeued. (A later event in flight at the moment of the requeue can still go out
    /// first.) The check sees the rows still stored: a later event that retention has already
    /// purged (published longer ago than `retention.published`) does not refuse the requeue.
    fn requeue(&self, ids: &[Uuid]) -> impl Future<Output = Result<u64, Error>> + Send;
}

/// Consumer-side deduplication: remember which messages a consumer processed.
pub trait Inbox: Send + Sync + 'static {
    /// The connection the consumer's transaction runs on.
    type Connection: Send;

    /// Records `(consumer, message_id)` in the consumer's transaction. `true` when it is new
    /// (process the message), `false` when it was already recorded (a redelivery: skip it).
    ///
    /// A concurrent transaction recording the same pair waits for the first to end: it sees
    /// `false` if that one commits, `true` if it rolls back.
    fn record(
        &self,
        conn: &mut Self::Connection,
        consumer: &str,
        message_id: &str,
    ) -> impl Future<Output = Result<bool, Error>> + Send;

    /// Deletes at most `limit` entries older than `older_than`. Returns how many.
    fn purge(
        &self,
        older_than: Duration,
        limit: u32,
    ) -> impl Future<Output = Result<u64, Error>> + Send;
}
