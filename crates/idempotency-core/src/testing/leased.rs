//! Conformance cases for [`LeasedClaims`], for stores that offer leased claims.

use std::time::Duration;

use super::Capabilities;
use super::support::{key, op};
use crate::admin::{Eviction, Force, KeyAdmin};
use crate::lease::{FencingToken, LeaseClaim, LeasedClaims};
use crate::store::{Claim, ExpiredCleanup, LockWait};
use crate::{Fingerprint, RecordId, RecordStatus, Scope, StoredOutcome};

fn id() -> RecordId {
    RecordId::new(op("LEASED"), Scope::default(), key("leased"))
}

fn fp(seed: &str) -> Fingerprint {
    Fingerprint::new(format!("{seed:0>64}"))
}

fn claim<'a>(id: &'a RecordId, fingerprint: &'a Fingerprint) -> Claim<'a> {
    Claim {
        id,
        fingerprint,
        ttl: Some(Duration::from_secs(3600)),
        wait: LockWait::NoWait,
    }
}

fn done(payload: &str) -> StoredOutcome {
    StoredOutcome::Completed {
        payload: payload.to_owned(),
    }
}

const LONG: Duration = Duration::from_secs(60);
const SHORT: Duration = Duration::from_millis(150);

async fn prepared<S: LeasedClaims>(store: &S) {
    store.prepare_leases().await.expect("prepare leases");
    store.prepare_leases().await.expect("prepare leases twice");
}

async fn acquire<S: LeasedClaims>(store: &S, claim: &Claim<'_>, lease: Duration) -> FencingToken {
    match store.claim_leased(claim, lease).await.expect("claim") {
        LeaseClaim::Acquired { token, .. } => token,
        other => panic!("expected the key to be acquired, got {other:?}"),
    }
}

/// A claim commits a `PROCESSING` record with token 1 (a fresh store) at once; a duplicate sees it with the
/// time its lease has left, and does not take it.
pub async fn leased_claim_commits_processing_and_a_duplicate_sees_the_lease<S: LeasedClaims>(
    store: S,
    _caps: Capabilities,
) {
    prepared(&store).await;
    let (id, f) = (id(), fp("a"));
    let first = store
        .claim_leased(&claim(&id, &f), LONG)
        .await
        .expect("claim");
    assert_eq!(
        first,
        LeaseClaim::Acquired {
            token: FencingToken(1),
            takeover: false
        }
    );
    let committed = store.lookup(&id).await.expect("lookup").expect("committed");
    assert_eq!(committed.status(), RecordStatus::Processing);
    match store
        .claim_leased(&claim(&id, &f), LONG)
        .await
        .expect("claim")
    {
        LeaseClaim::Exists { record, lease_left } => {
            assert_eq!(record.status(), RecordStatus::Processing);
            let left = lease_left.expect("a lease");
            assert!(left > Duration::from_secs(30) && left <= LONG, "{left:?}");
        }
        other => panic!("a live lease was taken: {other:?}"),
    }
}

/// An expired lease is taken over with the next token; the old holder's completion is then
/// refused, the new holder's is stored, and the terminal record is reported from then on.
pub async fn leased_expired_lease_is_taken_over_and_the_stale_holder_is_fenced<S: LeasedClaims>(
    store: S,
    _caps: Capabilities,
) {
    prepared(&store).await;
    let (id, f) = (id(), fp("a"));
    let stale = acquire(&store, &claim(&id, &f), SHORT).await;
    tokio::time::sleep(SHORT * 3).await;
    let taken = store
        .claim_leased(&claim(&id, &f), LONG)
        .await
        .expect("claim");
    let LeaseClaim::Acquired { token, takeover } = taken else {
        panic!("an expired lease was not taken over: {taken:?}");
    };
    assert!(takeover);
    assert!(token > stale, "{token:?} after {stale:?}");
    let late = store
        .complete_leased(&id, stale, &done("\"stale\""), None)
        .await
        .expect("complete");
    assert_eq!(late, None, "the stale holder's completion is refused");
    let record = store
        .complete_leased(&id, token, &done("\"current\""), None)
        .await
        .expect("complete")
        .expect("the current holder completes");
    assert_eq!(record.status(), RecordStatus::Completed);
    assert_eq!(record.outcome, Some(done("\"current\"")));
    let again = store
        .complete_leased(&id, token, &done("\"twice\""), None)
        .await
        .expect("complete");
    assert_eq!(again, None, "a terminal record is not completed twice");
    match store
        .claim_leased(&claim(&id, &f), LONG)
        .await
        .expect("claim")
    {
        LeaseClaim::Exists { record, lease_left } => {
            assert_eq!(record.outcome, Some(done("\"current\"")));
            assert_eq!(lease_left, None);
        }
        other => panic!("a terminal record was claimed: {other:?}"),
    }
}

/// An expired lease of a request with another fingerprint is never taken over: the key was
/// used for another payload.
pub async fn leased_another_fingerprint_never_takes_over<S: LeasedClaims>(
    store: S,
    _caps: Capabilities,
) {
    prepared(&store).await;
    let id = id();
    let (a, b) = (fp("a"), fp("b"));
    acquire(&store, &claim(&id, &a), SHORT).await;
    tokio::time::sleep(SHORT * 3).await;
    match store
        .claim_leased(&claim(&id, &b), LONG)
        .await
        .expect("claim")
    {
        LeaseClaim::Exists { record, lease_left } => {
            assert_eq!(record.fingerprint, a);
            assert_eq!(lease_left, Some(Duration::ZERO));
        }
        other => panic!("another payload took the key over: {other:?}"),
    }
}

/// A release deletes the claim only with its token; the key is then free at once.
pub async fn leased_release_frees_the_key_with_its_token_only<S: LeasedClaims>(
    store: S,
    _caps: Capabilities,
) {
    prepared(&store).await;
    let (id, f) = (id(), fp("a"));
    let token = acquire(&store, &claim(&id, &f), LONG).await;
    let other = FencingToken(token.0 + 1);
    assert!(!store.release_leased(&id, other).await.expect("release"));
    assert!(store.lookup(&id).await.expect("lookup").is_some());
    assert!(store.release_leased(&id, token).await.expect("release"));
    assert!(store.lookup(&id).await.expect("lookup").is_none());
    let next = acquire(&store, &claim(&id, &f), LONG).await;
    assert!(next > token, "{next:?} after the released {token:?}");
}

/// A holds the key until its lease expires, B takes it over and releases it (a status that is
/// not stored), C claims the key again: C's token is above both, so A's late completion is
/// refused and C's is stored.
pub async fn leased_a_token_never_comes_back_after_a_release<S: LeasedClaims>(
    store: S,
    _caps: Capabilities,
) {
    prepared(&store).await;
    let (id, f) = (id(), fp("a"));
    let a = acquire(&store, &claim(&id, &f), SHORT).await;
    tokio::time::sleep(SHORT * 3).await;
    let b = acquire(&store, &claim(&id, &f), LONG).await;
    assert!(b > a, "{b:?} after {a:?}");
    assert!(store.release_leased(&id, b).await.expect("release"));
    let c = acquire(&store, &claim(&id, &f), LONG).await;
    assert!(c > b, "{c:?} after the released {b:?} (and {a:?})");
    let late = store
        .complete_leased(&id, a, &done("\"stale\""), None)
        .await
        .expect("complete");
    assert_eq!(late, None, "A's late completion is refused");
    let record = store
        .complete_leased(&id, c, &done("\"current\""), None)
        .await
        .expect("complete")
        .expect("C completes");
    assert_eq!(record.outcome, Some(done("\"current\"")));
}

/// As above, but A's late answer is not stored and releases the key: the release carries A's
/// token, so C's live claim stays and a duplicate still sees it.
pub async fn leased_a_stale_release_never_frees_a_later_claim<S: LeasedClaims>(
    store: S,
    _caps: Capabilities,
) {
    prepared(&store).await;
    let (id, f) = (id(), fp("a"));
    let a = acquire(&store, &claim(&id, &f), SHORT).await;
    tokio::time::sleep(SHORT * 3).await;
    let b = acquire(&store, &claim(&id, &f), LONG).await;
    assert!(store.release_leased(&id, b).await.expect("release"));
    let c = acquire(&store, &claim(&id, &f), LONG).await;
    assert!(
        !store.release_leased(&id, a).await.expect("release"),
        "A's late release is refused"
    );
    match store
        .claim_leased(&claim(&id, &f), LONG)
        .await
        .expect("claim")
    {
        LeaseClaim::Exists { record, lease_left } => {
            assert_eq!(record.status(), RecordStatus::Processing);
            assert!(lease_left.is_some_and(|left| left > Duration::from_secs(30)));
        }
        other => panic!("C's live claim was freed by A's release: {other:?}"),
    }
    assert!(store.release_leased(&id, c).await.expect("release"));
}

/// `complete_leased` keeps the span reference it is given, as `complete` does: returned, then
/// read back by `lookup` and reported by a later claim.
pub async fn leased_completion_keeps_the_execution_span<S: LeasedClaims>(
    store: S,
    _caps: Capabilities,
) {
    prepared(&store).await;
    let span =
        crate::trace::SpanRef::from_hex("4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7")
            .expect("valid ids");
    let (id, f) = (id(), fp("s"));
    let token = acquire(&store, &claim(&id, &f), LONG).await;
    let record = store
        .complete_leased(&id, token, &done("\"traced\""), Some(span))
        .await
        .expect("complete")
        .expect("the holder completes");
    assert_eq!(record.execution_span, Some(span));
    let found = store.lookup(&id).await.expect("lookup").expect("found");
    assert_eq!(found.execution_span, Some(span));
    match store
        .claim_leased(&claim(&id, &f), LONG)
        .await
        .expect("claim")
    {
        LeaseClaim::Exists { record, .. } => assert_eq!(record.execution_span, Some(span)),
        other => panic!("a terminal record was claimed: {other:?}"),
    }
}

/// A forced eviction ends only the claim it names: the operator was shown the claim with one
/// token, the lease expired and another holder took the key over (same row, same
/// `created_at`, a new token); forcing the token shown leaves the new holder's claim alone,
/// and forcing the token read again evicts it. `lease_token` reads the token of a
/// `PROCESSING` record, and nothing for a key without a record.
pub async fn leased_a_forced_eviction_ends_only_the_claim_it_names<S: LeasedClaims + KeyAdmin>(
    store: S,
    _caps: Capabilities,
) {
    prepared(&store).await;
    let (id, f) = (id(), fp("a"));
    assert_eq!(store.lease_token(&id).await.expect("lease token"), None);
    let shown = acquire(&store, &claim(&id, &f), SHORT).await;
    assert_eq!(
        store.lease_token(&id).await.expect("lease token"),
        Some(shown)
    );
    let created = store
        .lookup(&id)
        .await
        .expect("lookup")
        .expect("the claim")
        .created_at;
    tokio::time::sleep(SHORT * 3).await;
    let taken = acquire(&store, &claim(&id, &f), LONG).await;
    assert!(taken > shown, "{taken:?} after {shown:?}");
    let record = store.lookup(&id).await.expect("lookup").expect("the claim");
    assert_eq!(record.created_at, created, "a takeover keeps the row");
    assert_eq!(
        store.evict(&id, Force::No).await.expect("evict"),
        Eviction::InProgress
    );
    assert_eq!(
        store
            .evict(&id, Force::Claim(Some(shown)))
            .await
            .expect("evict"),
        Eviction::Changed(RecordStatus::Processing),
        "the claim shown was taken over: the new holder's claim stays"
    );
    assert_eq!(
        store.evict(&id, Force::Claim(None)).await.expect("evict"),
        Eviction::Changed(RecordStatus::Processing),
        "a claim with a token is not a claim without one"
    );
    assert_eq!(
        store.lease_token(&id).await.expect("lease token"),
        Some(taken)
    );
    assert_eq!(
        store
            .evict(&id, Force::Claim(Some(taken)))
            .await
            .expect("evict"),
        Eviction::Evicted(RecordStatus::Processing)
    );
    assert_eq!(store.lookup(&id).await.expect("lookup"), None);
    assert_eq!(
        store
            .complete_leased(&id, taken, &done("\"late\""), None)
            .await
            .expect("complete"),
        None,
        "the evicted holder cannot complete"
    );
    // A claim that settled since it was shown keeps its outcome: forcing it deletes nothing
    // (the next request would run a finished action again); an eviction without force
    // deletes it.
    let token = acquire(&store, &claim(&id, &f), LONG).await;
    store
        .complete_leased(&id, token, &done("\"done\""), None)
        .await
        .expect("complete")
        .expect("completed");
    assert_eq!(
        store
            .evict(&id, Force::Claim(Some(token)))
            .await
            .expect("evict"),
        Eviction::Changed(RecordStatus::Completed)
    );
    assert!(store.lookup(&id).await.expect("lookup").is_some());
    assert_eq!(
        store.evict(&id, Force::No).await.expect("evict"),
        Eviction::Evicted(RecordStatus::Completed)
    );
}

/// A leased record expires no earlier than its lease: cleanup never deletes a claim whose
/// lease is live, however short the operation's TTL (before: with a TTL shorter than the
/// lease, cleanup deleted the claim mid-run; the next duplicate claimed the key afresh and ran
/// the effect a second time, and the holder's completion found nothing to complete). A claim
/// without a TTL stays without expiry.
pub async fn leased_cleanup_never_deletes_a_live_lease<S: LeasedClaims + ExpiredCleanup>(
    store: S,
    _caps: Capabilities,
) {
    prepared(&store).await;
    let (id, f) = (id(), fp("e"));
    let short = Claim {
        ttl: Some(Duration::from_secs(1)),
        ..claim(&id, &f)
    };
    let token = acquire(&store, &short, LONG).await;
    tokio::time::sleep(Duration::from_millis(1300)).await;
    assert_eq!(
        store.delete_expired_batch(100).await.expect("cleanup"),
        0,
        "cleanup deleted a claim whose lease is live"
    );
    match store.claim_leased(&short, LONG).await.expect("claim") {
        LeaseClaim::Exists {
            lease_left: Some(left),
            ..
        } => assert!(left > Duration::from_secs(30), "{left:?}"),
        other => panic!("a live lease was claimed again: {other:?}"),
    }
    assert!(
        store
            .complete_leased(&id, token, &done("{}"), None)
            .await
            .expect("complete")
            .is_some(),
        "the holder's completion found nothing"
    );
    let forever = RecordId::new(op("LEASED"), Scope::default(), key("forever"));
    let never = Claim {
        ttl: None,
        ..claim(&forever, &f)
    };
    acquire(&store, &never, SHORT).await;
    let record = store
        .lookup(&forever)
        .await
        .expect("lookup")
        .expect("claimed");
    assert_eq!(record.expires_at, None, "a claim without a TTL got one");
}

/// Generates the leased-claim conformance cases, for stores that implement
/// [`LeasedClaims`](crate::lease::LeasedClaims), [`KeyAdmin`] and [`ExpiredCleanup`].
#[macro_export]
macro_rules! leased_conformance_tests {
    ($factory:path, $caps:expr) => {
        $crate::__conformance_cases!($factory, $caps;
            leased_claim_commits_processing_and_a_duplicate_sees_the_lease,
            leased_expired_lease_is_taken_over_and_the_stale_holder_is_fenced,
            leased_another_fingerprint_never_takes_over,
            leased_release_frees_the_key_with_its_token_only,
            leased_a_token_never_comes_back_after_a_release,
            leased_a_stale_release_never_frees_a_later_claim,
            leased_completion_keeps_the_execution_span,
            leased_a_forced_eviction_ends_only_the_claim_it_names,
            leased_cleanup_never_deletes_a_live_lease,
        );
    };
}
