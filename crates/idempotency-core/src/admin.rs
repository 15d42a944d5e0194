//! Operator operations on the records table: evict one key, count the table.
//!
//! What an operator (the `idempotency` command line, an admin page) does on day two, as an
//! optional capability a store implements next to [`IdempotencyStore`]. Reading one key is
//! [`IdempotencyStore::lookup`]; this trait adds what the request path never does.
//!
//! Nothing here audits: the caller (the facade's `ops` module) logs every change it makes.

use std::future::Future;
use std::time::SystemTime;

use crate::key::RecordId;
use crate::lease::FencingToken;
use crate::record::RecordStatus;
use crate::store::{IdempotencyStore, StoreError};

/// What [`KeyAdmin::evict`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Eviction {
    /// The record was deleted: the next request with the key runs the action again.
    Evicted(RecordStatus),
    /// No committed record has the key.
    NotFound,
    /// The record is `PROCESSING` (a leased claim whose holder may still be running) and
    /// eviction was not forced: nothing was deleted.
    InProgress,
    /// Eviction was forced for a claim ([`Force::Claim`]) and the record is no longer that
    /// claim: another holder took the key over (`Processing`), or the claim settled
    /// (`Completed`, `Rejected`: its outcome is stored, and deleting it would run a finished
    /// action again). Nothing was deleted; the status is the one read.
    Changed(RecordStatus),
}

/// What [`KeyAdmin::evict`] deletes: a settled record (`COMPLETED`, `REJECTED`) and nothing
/// else ([`No`](Self::No)), or one `PROCESSING` claim and nothing else ([`Claim`](Self::Claim)).
///
/// A claim is named by its lease (fencing) token, read with [`KeyAdmin::lease_token`] when the
/// operator is shown the record: a takeover of an expired lease keeps the row and its
/// `created_at` but takes a new token, so forcing the claim that was shown never ends the
/// claim of a holder that took the key over since, nor deletes the outcome of a claim that
/// settled since.
///
/// ```
/// use idempotency_core::RecordStatus;
/// use idempotency_core::admin::Force;
/// use idempotency_core::lease::FencingToken;
///
/// let shown = Force::Claim(Some(FencingToken(7)));
/// assert!(shown.allows(RecordStatus::Processing, Some(FencingToken(7))));
/// assert!(!shown.allows(RecordStatus::Processing, Some(FencingToken(8)))); // taken over
/// assert!(!shown.allows(RecordStatus::Completed, Some(FencingToken(7)))); // settled since
/// assert!(!Force::No.allows(RecordStatus::Processing, Some(FencingToken(7))));
/// assert!(Force::No.allows(RecordStatus::Completed, None));
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Force {
    /// A settled record only: a `PROCESSING` one is left alone ([`Eviction::InProgress`]).
    #[default]
    No,
    /// The `PROCESSING` record whose lease token is this one (`None`: a record that carries
    /// none, such as a claim committed without a lease), and nothing else
    /// ([`Eviction::Changed`]).
    Claim(Option<FencingToken>),
}

impl Force {
    /// Whether a record of `status` carrying lease token `token` may be deleted.
    pub fn allows(self, status: RecordStatus, token: Option<FencingToken>) -> bool {
        match (status, self) {
            (RecordStatus::Processing, Self::Claim(shown)) => shown == token,
            (RecordStatus::Processing, Self::No) => false,
            (RecordStatus::Completed | RecordStatus::Rejected, Self::No) => true,
            (RecordStatus::Completed | RecordStatus::Rejected, Self::Claim(_)) => false,
        }
    }

    /// The token the `PROCESSING` record must carry, for a store that compares it in SQL:
    /// `(forced, token)`.
    pub fn claim(self) -> (bool, Option<i64>) {
        match self {
            Self::No => (false, None),
            Self::Claim(token) => (true, token.map(|token| token.0)),
        }
    }
}

/// One group of [`KeyStats`]: the records of one operation in one status.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct KeyGroup {
    /// The operation.
    pub operation: String,
    /// The status.
    pub status: RecordStatus,
    /// How many records.
    pub count: u64,
    /// When the oldest of them was created (database clock).
    pub oldest: SystemTime,
}

impl KeyGroup {
    /// A group, as a store builds it.
    pub fn new(operation: String, status: RecordStatus, count: u64, oldest: SystemTime) -> Self {
        Self {
            operation,
            status,
            count,
            oldest,
        }
    }
}

/// The records table counted, for `keys stats`.
///
/// ```
/// use idempotency_core::admin::{KeyGroup, KeyStats};
/// use idempotency_core::RecordStatus;
///
/// let now = std::time::SystemTime::now();
/// let stats = KeyStats::new(
///     vec![KeyGroup::new("PAY".into(), RecordStatus::Completed, 3, now)],
///     1,
/// );
/// assert_eq!(stats.total(), 3);
/// assert_eq!(stats.oldest(), Some(now));
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct KeyStats {
    /// Counts by operation and status, ordered by operation then status.
    pub groups: Vec<KeyGroup>,
    /// Records whose `expires_at` has passed and that cleanup has not deleted yet.
    pub expired: u64,
}

impl KeyStats {
    /// Stats, as a store builds them.
    pub fn new(groups: Vec<KeyGroup>, expired: u64) -> Self {
        Self { groups, expired }
    }

    /// All records.
    pub fn total(&self) -> u64 {
        self.groups.iter().map(|g| g.count).sum()
    }

    /// When the oldest record was created; `None` for an empty table.
    pub fn oldest(&self) -> Option<SystemTime> {
        self.groups.iter().map(|g| g.oldest).min()
    }
}

/// Optional capability: what an operator does to the records table.
pub trait KeyAdmin: IdempotencyStore {
    /// Deletes the committed record of `id`, so that the next request with the key runs the
    /// action again: a settled one with [`Force::No`], the `PROCESSING` claim `force` names
    /// with [`Force::Claim`] (its holder may still be running, and a second run would run
    /// beside it). The read of the status and token and the deletion cannot be split by
    /// another writer. A key held by an
    /// uncommitted transaction is invisible here and reads as [`Eviction::NotFound`].
    fn evict(
        &self,
        id: &RecordId,
        force: Force,
    ) -> impl Future<Output = Result<Eviction, StoreError>> + Send;

    /// The lease (fencing) token the committed record of `id` carries: `None` without a
    /// record, for a record without one, and on a table without the lease columns (leased
    /// claims never prepared). What [`Force::Claim`] names the claim an operator is shown by.
    fn lease_token(
        &self,
        id: &RecordId,
    ) -> impl Future<Output = Result<Option<FencingToken>, StoreError>> + Send;

    /// Counts records by operation and status, and the expired ones cleanup has not deleted.
    fn key_stats(&self) -> impl Future<Output = Result<KeyStats, StoreError>> + Send;
}

/// How the stores decide an eviction from the status they read before their conditional
/// delete (`found`) and the status of the row it deleted (`deleted`): shared so that the three
/// backends answer alike.
///
/// ```
/// use idempotency_core::admin::{Eviction, Force, eviction};
/// use idempotency_core::RecordStatus::{Completed, Processing};
///
/// assert_eq!(eviction(Force::No, None, None), Eviction::NotFound);
/// assert_eq!(eviction(Force::No, Some(Processing), None), Eviction::InProgress);
/// assert_eq!(eviction(Force::No, Some(Completed), Some(Completed)), Eviction::Evicted(Completed));
/// assert_eq!(eviction(Force::Claim(None), Some(Completed), None), Eviction::Changed(Completed));
/// ```
pub fn eviction(
    force: Force,
    found: Option<RecordStatus>,
    deleted: Option<RecordStatus>,
) -> Eviction {
    match (found, deleted, force) {
        (_, Some(status), _) => Eviction::Evicted(status),
        (None, None, _) => Eviction::NotFound,
        (Some(status), None, Force::Claim(_)) => Eviction::Changed(status),
        (Some(RecordStatus::Processing), None, Force::No) => Eviction::InProgress,
        // Deleted by someone else (cleanup) between the read and the delete.
        (Some(_), None, Force::No) => Eviction::NotFound,
    }
}
