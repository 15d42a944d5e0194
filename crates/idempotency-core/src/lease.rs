//! Optional capability: leased claims, for actions whose effects are outside the database.
//!
//! The transactional model keeps a `PROCESSING` record inside the transaction that runs the
//! action, so a crash rolls it back. An action that calls a payment provider cannot run inside
//! a database transaction for its whole length, so a leased claim *commits* the `PROCESSING`
//! record at once, with a lease (an expiry on the database clock) and a fencing token:
//!
//! - a duplicate sees the live lease and is told to retry later, instead of blocking on a row
//!   lock;
//! - the holder stores the outcome with its token, in a transaction of its own; a completion
//!   with a token that is no longer current is refused;
//! - when the holder crashes, its lease expires and the next request with the same key and
//!   payload takes the key over, with a new token.
//!
//! This is the one place where a committed `PROCESSING` record is allowed. What it guarantees,
//! and what it does not, is in RELIABILITY.md ("Leased claims").

use std::future::Future;
use std::time::Duration;

use crate::key::RecordId;
use crate::record::{IdempotencyRecord, StoredOutcome};
use crate::store::{Claim, IdempotencyStore, StoreError};
use crate::trace::SpanRef;

/// The fencing token of a leased claim: it grows with every claim of the key, takeovers and
/// claims after a release alike, so a holder whose lease was taken over can neither complete
/// the record nor release a later holder's claim.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct FencingToken(pub i64);

/// The result of [`LeasedClaims::claim_leased`].
#[derive(Debug, Clone, PartialEq)]
pub enum LeaseClaim {
    /// The key is this caller's until the lease expires: run the action, then
    /// [`complete_leased`](LeasedClaims::complete_leased) or
    /// [`release_leased`](LeasedClaims::release_leased) with the token.
    Acquired {
        /// The token to complete or release with.
        token: FencingToken,
        /// Whether an expired lease of another holder was taken over.
        takeover: bool,
    },
    /// A record exists and was not taken: terminal (replay it), a live lease (in flight), or an
    /// expired lease of a request with another fingerprint (a reused key).
    Exists {
        /// The record as stored.
        record: IdempotencyRecord,
        /// For a `PROCESSING` record, how long its lease has left (zero when expired).
        lease_left: Option<Duration>,
    },
}

/// Optional capability of a store: leased claims committed outside the action's transaction.
///
/// Each method runs in a short transaction of its own on the store's pool. Implementations must
/// guarantee:
///
/// - `claim_leased` inserts a `PROCESSING` record with a new token and a lease of `lease`
///   (database clock), or takes over a `PROCESSING` record whose lease has expired *and* whose
///   fingerprint is the claim's, with a new token; otherwise it reports the record. A new token
///   is above every token the store issued before, for any key (1 on a fresh store), so it is
///   never one a previous holder of the key carries, even after a release deleted the record
///   (a sequence, not a counter on the row);
/// - `complete_leased` stores the outcome only on a `PROCESSING` record that still carries
///   `token`, returning `None` otherwise (fenced out, or already terminal);
/// - `release_leased` deletes the `PROCESSING` record only while it carries `token`.
///
/// The conformance cases are in the `testing` module (feature `test-utils`, `leased_conformance_tests!`).
pub trait LeasedClaims: IdempotencyStore {
    /// Prepares the store for leases (the lease columns of the records table and the token
    /// sequence); idempotent.
    fn prepare_leases(&self) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Claims the key with a lease, in a transaction of its own that commits at once.
    /// `claim.wait` is not used: a held key is reported, never waited for.
    fn claim_leased(
        &self,
        claim: &Claim<'_>,
        lease: Duration,
    ) -> impl Future<Output = Result<LeaseClaim, StoreError>> + Send;

    /// Stores `outcome` on the `PROCESSING` record of `id` if it still carries `token`, and
    /// returns the terminal record; `None` when the token is no longer current.
    /// `execution_span` is kept on the record as by
    /// [`complete`](IdempotencyStore::complete).
    fn complete_leased(
        &self,
        id: &RecordId,
        token: FencingToken,
        outcome: &StoredOutcome,
        execution_span: Option<SpanRef>,
    ) -> impl Future<Output = Result<Option<IdempotencyRecord>, StoreError>> + Send;

    /// Deletes the `PROCESSING` record of `id` if it still carries `token`, so that a retry
    /// runs at once; returns whether it did.
    fn release_leased(
        &self,
        id: &RecordId,
        token: FencingToken,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send;
}
