//! An operator's forced eviction on PostgreSQL whatever the server's default isolation: a
//! takeover that commits while the eviction's delete waits for its row lock is seen, and the
//! eviction deletes nothing (`Eviction::Changed`), under `default_transaction_isolation =
//! 'repeatable read'` too (before: a serialization failure, reported as a store conflict).

#![allow(clippy::unwrap_used)] // tests fail loudly on unexpected errors

use std::time::Duration;

use idempotency_core::admin::{Eviction, Force, KeyAdmin};
use idempotency_core::lease::{LeaseClaim, LeasedClaims};
use idempotency_core::store::{Claim, LockWait};
use idempotency_core::{
    Fingerprint, IdempotencyKey, IdempotencyStore, Operation, RecordId, RecordStatus, Scope,
};
use idempotency_pg::PgStore;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_takeover_during_a_forced_eviction_is_seen_under_repeatable_read() {
    let pool = idempotency_testing::pg_pool_with_options(4, |options| {
        options.after_connect(|conn, _| {
            Box::pin(async move {
                sqlx::query("SET default_transaction_isolation = 'repeatable read'")
                    .execute(conn)
                    .await
                    .map(drop)
            })
        })
    })
    .await;
    let store = PgStore::new(pool.clone());
    store.create_schema().await.unwrap();
    store.prepare_leases().await.unwrap();
    let id = RecordId::new(
        Operation::new("PAY").unwrap(),
        Scope::new("tenant-a").unwrap(),
        IdempotencyKey::new("k-taken").unwrap(),
    );
    let fingerprint = Fingerprint::new("a".repeat(64));
    let claim = Claim {
        id: &id,
        fingerprint: &fingerprint,
        ttl: Some(Duration::from_secs(3600)),
        wait: LockWait::NoWait,
    };
    let LeaseClaim::Acquired { token: shown, .. } = store
        .claim_leased(&claim, Duration::from_secs(60))
        .await
        .unwrap()
    else {
        panic!("the key was free");
    };
    // Another holder takes the claim over (a new token on the same row), its transaction
    // still open while the eviction of the token shown waits for the row.
    let mut takeover = pool.begin().await.unwrap();
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "UPDATE {} SET lease_token = lease_token + 1000 WHERE idempotency_key = 'k-taken'",
        store.table().quoted()
    )))
    .execute(&mut *takeover)
    .await
    .unwrap();
    let evicting = tokio::spawn({
        let (store, id) = (store.clone(), id.clone());
        async move { store.evict(&id, Force::Claim(Some(shown))).await }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!evicting.is_finished(), "the eviction waits for the row");
    takeover.commit().await.unwrap();
    let eviction = evicting.await.unwrap();
    assert_eq!(
        eviction.unwrap(),
        Eviction::Changed(RecordStatus::Processing),
        "the new holder's claim stays"
    );
    assert!(store.lookup(&id).await.unwrap().is_some());
}
