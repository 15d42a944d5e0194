//! Conformance cases for the store SPI itself.

use std::time::{Duration, SystemTime};

use super::Capabilities;
use super::support::{key, op};
use crate::cleanup::purge_expired;
use crate::store::{Acquire, Claim, ExpiredCleanup, IdempotencyStore, LockWait, StoreError};
use crate::{Fingerprint, IdempotencyKey, RecordId, RecordStatus, Scope, StoredOutcome};

fn id(operation: &str) -> RecordId {
    RecordId::new(op(operation), Scope::default(), key("store"))
}

fn fp(seed: &str) -> Fingerprint {
    Fingerprint::new(format!("{seed:0>64}"))
}

fn claim<'a>(id: &'a RecordId, fingerprint: &'a Fingerprint) -> Claim<'a> {
    Claim {
        id,
        fingerprint,
        ttl: Some(Duration::from_secs(3600)),
        wait: LockWait::Timeout(Duration::from_secs(10)),
    }
}

fn completed(payload: &str) -> StoredOutcome {
    StoredOutcome::Completed {
        payload: payload.to_owned(),
    }
}

/// Inserts and commits a completed record.
pub(crate) async fn seed<S: IdempotencyStore>(
    store: &S,
    id: &RecordId,
    fingerprint: &Fingerprint,
    ttl: Option<Duration>,
) {
    let mut tx = store.begin().await.expect("begin");
    let mut c = claim(id, fingerprint);
    c.ttl = ttl;
    assert_eq!(
        store.acquire(&mut tx, &c).await.expect("acquire"),
        Acquire::Acquired
    );
    store
        .complete(&mut tx, id, &completed("1"), None)
        .await
        .expect("complete");
    S::commit(tx).await.expect("commit");
}

async fn find_committed<S: IdempotencyStore>(
    store: &S,
    id: &RecordId,
) -> Option<crate::IdempotencyRecord> {
    let mut tx = store.begin().await.expect("begin");
    let found = store.find(&mut tx, id).await.expect("find");
    S::rollback(tx).await.expect("rollback");
    found
}

/// `acquire` on a new key inserts a `PROCESSING` record visible to the caller's transaction.
pub async fn store_acquire_inserts_processing<S: IdempotencyStore>(store: S, _caps: Capabilities) {
    let id = id("ACQUIRE");
    let fingerprint = fp("a1");
    let mut tx = store.begin().await.expect("begin");
    assert_eq!(
        store
            .acquire(&mut tx, &claim(&id, &fingerprint))
            .await
            .expect("acquire"),
        Acquire::Acquired
    );
    let record = store
        .find(&mut tx, &id)
        .await
        .expect("find")
        .expect("own record visible");
    assert_eq!(record.status(), RecordStatus::Processing);
    assert_eq!(record.fingerprint, fingerprint);
    assert!(record.outcome.is_none());
    assert!(record.completed_at.is_none());
    S::rollback(tx).await.expect("rollback");
}

/// `complete` makes the record terminal; after the commit another transaction reads it.
pub async fn store_complete_then_find_after_commit<S: IdempotencyStore>(
    store: S,
    _caps: Capabilities,
) {
    let id = id("COMPLETE");
    let fingerprint = fp("b2");
    let mut tx = store.begin().await.expect("begin");
    store
        .acquire(&mut tx, &claim(&id, &fingerprint))
        .await
        .expect("acquire");
    let record = store
        .complete(&mut tx, &id, &completed(r#"{"paymentId":"p-1"}"#), None)
        .await
        .expect("complete");
    assert_eq!(record.status(), RecordStatus::Completed);
    assert_eq!(record.fingerprint, fingerprint);
    assert!(record.completed_at.is_some());
    S::commit(tx).await.expect("commit");

    let found = find_committed(&store, &id).await.expect("committed record");
    assert_eq!(found.status(), RecordStatus::Completed);
    let Some(StoredOutcome::Completed { payload }) = found.outcome else {
        panic!("expected a completed outcome");
    };
    let value: serde_json::Value = serde_json::from_str(&payload).expect("json payload");
    assert_eq!(value, serde_json::json!({"paymentId": "p-1"}));
    assert!(found.created_at <= found.completed_at.expect("completed_at"));
}

/// `acquire` on a committed key reports `Exists` and changes nothing.
pub async fn store_acquire_existing_reports_exists<S: IdempotencyStore>(
    store: S,
    _caps: Capabilities,
) {
    let id = id("EXISTS");
    let fingerprint = fp("c3");
    seed(&store, &id, &fingerprint, None).await;
    let mut tx = store.begin().await.expect("begin");
    let other = fp("ff");
    assert_eq!(
        store
            .acquire(&mut tx, &claim(&id, &other))
            .await
            .expect("acquire"),
        Acquire::Exists
    );
    S::commit(tx).await.expect("commit");
    let found = find_committed(&store, &id).await.expect("record");
    assert_eq!(found.fingerprint, fingerprint, "acquire must not overwrite");
    assert_eq!(found.status(), RecordStatus::Completed);
}

/// A rejection keeps its code and details (or their absence).
pub async fn store_rejected_round_trip<S: IdempotencyStore>(store: S, _caps: Capabilities) {
    for details in [
        Some(r#"{"requestedAmount":"5000.00","availableBalance":"1000.00"}"#),
        None,
    ] {
        let id = id("REJECT");
        let fingerprint = fp("d4");
        let mut tx = store.begin().await.expect("begin");
        store
            .acquire(&mut tx, &claim(&id, &fingerprint))
            .await
            .expect("acquire");
        let outcome = StoredOutcome::Rejected {
            code: "INSUFFICIENT_FUNDS".to_owned(),
            details: details.map(str::to_owned),
        };
        let record = store
            .complete(&mut tx, &id, &outcome, None)
            .await
            .expect("complete");
        assert_eq!(record.status(), RecordStatus::Rejected);
        S::commit(tx).await.expect("commit");
        let found = find_committed(&store, &id).await.expect("record");
        let Some(StoredOutcome::Rejected {
            code,
            details: stored,
        }) = found.outcome
        else {
            panic!("expected a rejection");
        };
        assert_eq!(code, "INSUFFICIENT_FUNDS");
        let parse = |s: &str| serde_json::from_str::<serde_json::Value>(s).expect("json");
        assert_eq!(stored.as_deref().map(parse), details.map(parse));
    }
}

/// Rolling back removes the record: the key can be acquired again.
pub async fn store_rollback_removes_record<S: IdempotencyStore>(store: S, _caps: Capabilities) {
    let id = id("ROLLBACK");
    let fingerprint = fp("e5");
    let mut tx = store.begin().await.expect("begin");
    store
        .acquire(&mut tx, &claim(&id, &fingerprint))
        .await
        .expect("acquire");
    store
        .complete(&mut tx, &id, &completed("2"), None)
        .await
        .expect("complete");
    S::rollback(tx).await.expect("rollback");
    assert!(find_committed(&store, &id).await.is_none());
    let mut tx = store.begin().await.expect("begin");
    assert_eq!(
        store
            .acquire(&mut tx, &claim(&id, &fingerprint))
            .await
            .expect("acquire"),
        Acquire::Acquired
    );
    S::rollback(tx).await.expect("rollback");
}

/// `complete` without a `PROCESSING` record fails loudly.
pub async fn store_complete_without_claim_fails<S: IdempotencyStore>(
    store: S,
    _caps: Capabilities,
) {
    let id = id("NOCLAIM");
    let mut tx = store.begin().await.expect("begin");
    let error = store
        .complete(&mut tx, &id, &completed("3"), None)
        .await
        .expect_err("must fail");
    assert!(
        matches!(error, StoreError::NotProcessing { found: None }),
        "{error:?}"
    );
    S::rollback(tx).await.expect("rollback");
}

/// `complete` on a terminal record fails loudly and leaves it unchanged.
pub async fn store_complete_twice_fails<S: IdempotencyStore>(store: S, _caps: Capabilities) {
    let id = id("TWICE");
    let fingerprint = fp("f6");
    seed(&store, &id, &fingerprint, None).await;
    let mut tx = store.begin().await.expect("begin");
    let error = store
        .complete(&mut tx, &id, &completed("4"), None)
        .await
        .expect_err("must fail");
    assert!(
        matches!(
            error,
            StoreError::NotProcessing {
                found: Some(RecordStatus::Completed)
            }
        ),
        "{error:?}"
    );
    S::rollback(tx).await.expect("rollback");
    let Some(StoredOutcome::Completed { payload }) =
        find_committed(&store, &id).await.and_then(|r| r.outcome)
    else {
        panic!("record lost");
    };
    assert_eq!(payload.trim(), "1");
}

/// Uniqueness is per `(operation, scope, key)`: changing any part is another record.
pub async fn store_identity_is_operation_scope_key<S: IdempotencyStore>(
    store: S,
    _caps: Capabilities,
) {
    let base = id("IDENTITY");
    let fingerprint = fp("07");
    seed(&store, &base, &fingerprint, None).await;
    let other_op = RecordId::new(op("IDENTITY_OTHER"), base.scope.clone(), base.key.clone());
    let other_scope = RecordId::new(
        base.operation.clone(),
        Scope::new("tenant-b").expect("scope"),
        base.key.clone(),
    );
    let other_key = RecordId::new(base.operation.clone(), base.scope.clone(), key("store"));
    for id in [&other_op, &other_scope, &other_key] {
        let mut tx = store.begin().await.expect("begin");
        assert_eq!(
            store
                .acquire(&mut tx, &claim(id, &fingerprint))
                .await
                .expect("acquire"),
            Acquire::Acquired,
            "{id:?}"
        );
        S::rollback(tx).await.expect("rollback");
    }
}

/// `expires_at` is `created_at + ttl` on the database clock, or absent without a TTL.
pub async fn store_ttl_sets_expires_at<S: IdempotencyStore>(store: S, _caps: Capabilities) {
    let ttl = Duration::from_secs(2 * 24 * 3600);
    let with_ttl = id("TTL");
    seed(&store, &with_ttl, &fp("08"), Some(ttl)).await;
    let record = find_committed(&store, &with_ttl).await.expect("record");
    let expires = record.expires_at.expect("expires_at");
    let lived = expires
        .duration_since(record.created_at)
        .expect("expires after creation");
    assert!(
        lived.abs_diff(ttl) < Duration::from_secs(1),
        "lived {lived:?}"
    );

    let forever = id("TTL");
    seed(&store, &forever, &fp("09"), None).await;
    assert_eq!(
        find_committed(&store, &forever)
            .await
            .expect("record")
            .expires_at,
        None
    );
}

/// `find` of an unknown key is `None`.
pub async fn store_find_unknown_is_none<S: IdempotencyStore>(store: S, _caps: Capabilities) {
    assert!(find_committed(&store, &id("UNKNOWN")).await.is_none());
}

/// Payloads keep their JSON value: nesting, Unicode, escapes, `null`, large integers.
pub async fn store_payload_round_trip<S: IdempotencyStore>(store: S, _caps: Capabilities) {
    let payloads = [
        "null",
        r#"{"a":[1,2,{"b":"\u00e9\u20ac\ud83d\ude00"}],"c":"line\nbreak \"quoted\" \\ \u0001"}"#,
        "9007199254740993",
        r#""just a string""#,
        "[]",
    ];
    for payload in payloads {
        let id = id("PAYLOAD");
        let fingerprint = fp("0a");
        let mut tx = store.begin().await.expect("begin");
        store
            .acquire(&mut tx, &claim(&id, &fingerprint))
            .await
            .expect("acquire");
        store
            .complete(&mut tx, &id, &completed(payload), None)
            .await
            .expect("complete");
        S::commit(tx).await.expect("commit");
        let Some(StoredOutcome::Completed { payload: stored }) =
            find_committed(&store, &id).await.and_then(|r| r.outcome)
        else {
            panic!("record lost");
        };
        let expected: serde_json::Value = serde_json::from_str(payload).expect("json");
        let actual: serde_json::Value = serde_json::from_str(&stored).expect("stored json");
        assert_eq!(actual, expected, "{payload}");
    }
}

/// The longest key, operation and scope, with every visible ASCII character, are stored exactly.
pub async fn store_long_keys_round_trip<S: IdempotencyStore>(store: S, _caps: Capabilities) {
    let visible: String = (0x21u8..=0x7e).map(char::from).collect();
    let long_key: String = visible.chars().cycle().take(crate::MAX_KEY_LEN).collect();
    let id = RecordId::new(
        op(&"O".repeat(crate::MAX_OPERATION_LEN)),
        Scope::new(
            visible
                .chars()
                .rev()
                .cycle()
                .take(crate::MAX_SCOPE_LEN)
                .collect::<String>(),
        )
        .expect("scope"),
        IdempotencyKey::new(long_key).expect("key"),
    );
    let fingerprint = Fingerprint::new("f".repeat(crate::fingerprint::MAX_FINGERPRINT_LEN));
    seed(&store, &id, &fingerprint, None).await;
    let record = find_committed(&store, &id).await.expect("record");
    assert_eq!(record.fingerprint, fingerprint);
}

/// An expired record is still found: `expires_at` is only a cleanup marker.
pub async fn store_expired_record_is_still_found<S: IdempotencyStore>(
    store: S,
    _caps: Capabilities,
) {
    let id = id("EXPIRED");
    seed(&store, &id, &fp("0b"), Some(Duration::from_millis(1))).await;
    tokio::time::sleep(Duration::from_millis(20)).await;
    let record = find_committed(&store, &id)
        .await
        .expect("expired but present");
    assert!(record.expires_at.expect("expires_at") < SystemTime::now() + Duration::from_secs(1));
}

/// Cleanup deletes expired records only, batch by batch, and reports counts.
pub async fn store_cleanup_deletes_only_expired_in_batches<S: IdempotencyStore + ExpiredCleanup>(
    store: S,
    _caps: Capabilities,
) {
    let mut expired = Vec::new();
    for _ in 0..5 {
        let id = id("CLEANUP");
        seed(&store, &id, &fp("0c"), Some(Duration::from_millis(1))).await;
        expired.push(id);
    }
    let live = id("CLEANUP");
    seed(&store, &live, &fp("0d"), Some(Duration::from_secs(3600))).await;
    let forever = id("CLEANUP");
    seed(&store, &forever, &fp("0e"), None).await;
    tokio::time::sleep(Duration::from_millis(20)).await;

    let report = purge_expired(&store, 2).await.expect("purge");
    assert_eq!(report.deleted, 5);
    assert_eq!(report.batches, 3, "2 + 2 + 1: stops after the short batch");
    for id in &expired {
        assert!(find_committed(&store, id).await.is_none());
    }
    assert!(find_committed(&store, &live).await.is_some());
    assert!(find_committed(&store, &forever).await.is_some());
    assert_eq!(purge_expired(&store, 2).await.expect("purge").deleted, 0);
}

/// The span reference given to `complete` (the span that ran the action) is kept on the record:
/// `complete`, `find` and `lookup` return it; a record completed without one has none.
pub async fn store_keeps_the_execution_span<S: IdempotencyStore>(store: S, _caps: Capabilities) {
    let span =
        crate::trace::SpanRef::from_hex("4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7")
            .expect("valid ids");
    for (name, given) in [("TRACED", Some(span)), ("UNTRACED", None)] {
        let id = id(name);
        let fingerprint = fp("e5");
        let mut tx = store.begin().await.expect("begin");
        store
            .acquire(&mut tx, &claim(&id, &fingerprint))
            .await
            .expect("acquire");
        let record = store
            .complete(&mut tx, &id, &completed("5"), given)
            .await
            .expect("complete");
        assert_eq!(record.execution_span, given, "{name}: complete");
        S::commit(tx).await.expect("commit");
        let found = find_committed(&store, &id).await.expect("committed record");
        assert_eq!(found.execution_span, given, "{name}: find");
        let looked_up = store.lookup(&id).await.expect("lookup").expect("found");
        assert_eq!(looked_up.execution_span, given, "{name}: lookup");
    }
}
