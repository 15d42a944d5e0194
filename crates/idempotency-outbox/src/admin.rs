//! Operator operations on the outbox: its status, dead letters found by filter, discarded.
//!
//! An optional capability a store implements next to [`DeadLetters`] and [`Housekeeping`],
//! for the `idempotency` command line and an admin page. Requeuing is
//! [`DeadLetters::requeue`] and purging published rows is
//! [`Housekeeping::delete_published`]; this trait adds what the relay never does.
//!
//! Nothing here audits: the caller (the facade's `ops` module) logs every change it makes.

use std::future::Future;
use std::time::Duration;

use uuid::Uuid;

use crate::error::Error;
use crate::message::DeadLetter;
use crate::store::{DeadLetters, Housekeeping};

/// The outbox at a glance, for `outbox status`.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
#[non_exhaustive]
pub struct OutboxStatus {
    /// Rows neither published nor dead-lettered.
    pub pending: u64,
    /// Age of the oldest pending row in seconds (0 when none).
    pub oldest_pending_age: f64,
    /// Pending rows a relay holds right now (claimed, lease not run out).
    pub leased: u64,
    /// Dead-lettered rows.
    pub dead_lettered: u64,
    /// Aggregates holding a dead letter. Their later events are still published (a dead
    /// letter does not stop its aggregate), so requeuing one of them would publish it out of
    /// order: [`DeadLetters::requeue`] refuses that once a later event went out.
    pub dead_letter_aggregates: u64,
    /// Aggregates whose first pending row failed and backs off, with later rows waiting behind
    /// it (ordered outboxes hand out only an aggregate's first pending row).
    pub blocked_aggregates: u64,
}

impl OutboxStatus {
    /// A status, as a store builds it.
    pub fn new(
        pending: u64,
        oldest_pending_age: f64,
        leased: u64,
        dead_lettered: u64,
        dead_letter_aggregates: u64,
        blocked_aggregates: u64,
    ) -> Self {
        Self {
            pending,
            oldest_pending_age,
            leased,
            dead_lettered,
            dead_letter_aggregates,
            blocked_aggregates,
        }
    }
}

/// What [`OutboxAdmin::expired_counts`] counted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ExpiredCounts {
    /// Rows published before the cut-off.
    pub published: u64,
    /// Rows dead-lettered before the cut-off.
    pub dead_lettered: u64,
}

impl ExpiredCounts {
    /// Counts, as a store builds them.
    pub fn new(published: u64, dead_lettered: u64) -> Self {
        Self {
            published,
            dead_lettered,
        }
    }
}

/// Which dead letters an operation applies to: every set field must match exactly; the empty
/// filter matches every dead letter.
///
/// ```
/// use idempotency_outbox::admin::DeadLetterFilter;
///
/// let filter = DeadLetterFilter::default().aggregate_type("charge").event_type("ChargeCreated");
/// assert!(!filter.is_empty());
/// assert!(DeadLetterFilter::default().is_empty());
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct DeadLetterFilter {
    /// Only this aggregate type.
    pub aggregate_type: Option<String>,
    /// Only this aggregate id.
    pub aggregate_id: Option<String>,
    /// Only this event type.
    pub event_type: Option<String>,
}

impl DeadLetterFilter {
    /// Only dead letters of this aggregate type.
    pub fn aggregate_type(mut self, value: impl Into<String>) -> Self {
        self.aggregate_type = Some(value.into());
        self
    }

    /// Only dead letters of this aggregate id.
    pub fn aggregate_id(mut self, value: impl Into<String>) -> Self {
        self.aggregate_id = Some(value.into());
        self
    }

    /// Only dead letters of this event type.
    pub fn event_type(mut self, value: impl Into<String>) -> Self {
        self.event_type = Some(value.into());
        self
    }

    /// Whether it matches every dead letter.
    pub fn is_empty(&self) -> bool {
        self.aggregate_type.is_none() && self.aggregate_id.is_none() && self.event_type.is_none()
    }
}

/// Optional capability: what an operator does to the outbox.
pub trait OutboxAdmin: DeadLetters + Housekeeping {
    /// Pending, leased and dead-lettered counts, and the aggregates that hold them up.
    fn status(&self) -> impl Future<Output = Result<OutboxStatus, Error>> + Send;

    /// The oldest dead letters matching `filter`, at most `limit`, oldest first.
    fn find_dead_letters(
        &self,
        filter: &DeadLetterFilter,
        limit: u32,
    ) -> impl Future<Output = Result<Vec<DeadLetter>, Error>> + Send;

    /// The dead letter `id`; `None` when no row has that id or the row is not dead-lettered.
    fn dead_letter(
        &self,
        id: Uuid,
    ) -> impl Future<Output = Result<Option<DeadLetter>, Error>> + Send;

    /// The ids of every dead letter matching `filter`, oldest first.
    fn dead_letter_ids(
        &self,
        filter: &DeadLetterFilter,
    ) -> impl Future<Output = Result<Vec<Uuid>, Error>> + Send;

    /// How many rows retention would delete now: published more than `published` ago, and
    /// dead-lettered more than `dead_lettered` ago (0 when `None`). For a dry run of a purge.
    fn expired_counts(
        &self,
        published: Duration,
        dead_lettered: Option<Duration>,
    ) -> impl Future<Output = Result<ExpiredCounts, Error>> + Send;

    /// Deletes the rows of `ids` that are dead-lettered (others are left alone). Returns how
    /// many.
    fn discard(&self, ids: &[Uuid]) -> impl Future<Output = Result<u64, Error>> + Send;
}
