//! A request dropped while its `BEGIN` is on the wire (a client that hangs up, a timeout) must
//! not hand the next user of the pool a connection inside a transaction nobody owns.
//!
//! The answers from PostgreSQL go through a proxy that can hold them, so the drop lands
//! deterministically after the server ran `BEGIN` and before the client read its answer.

#![allow(clippy::unwrap_used)] // tests fail loudly on unexpected errors

use std::time::Duration;

use idempotency_core::store::{Acquire, Claim, IdempotencyStore, LockWait};
use idempotency_core::{
    Call, ExecutionResult, Fingerprint, IdempotencyKey, IdempotencyService, Outcome, RecordId,
    Scope,
};
use idempotency_pg::PgStore;
use idempotency_testing::{HoldingProxy, until_idle};
use sqlx::PgPool;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

/// A direct pool on a fresh schema, and a one-connection pool on the same schema through a
/// holding proxy (its connection already open). The proxied pool does not ping before handing
/// out its connection, so the first message a test sends is the one whose answer is held; with
/// the ping on, the same window opens right after the ping's answer.
async fn pools() -> (PgPool, PgPool, HoldingProxy) {
    let direct = idempotency_testing::pg_pool().await;
    let schema: String = sqlx::query_scalar("SELECT current_schema()::text")
        .fetch_one(&direct)
        .await
        .unwrap();
    sqlx::raw_sql("CREATE TABLE written (n int NOT NULL)")
        .execute(&direct)
        .await
        .unwrap();
    let options: PgConnectOptions = idempotency_testing::database_url().parse().unwrap();
    let upstream = format!("{}:{}", options.get_host(), options.get_port());
    let proxy = HoldingProxy::start(upstream).await;
    let proxied = PgPoolOptions::new()
        .max_connections(1)
        .min_connections(1)
        .test_before_acquire(false)
        .connect_with(
            options
                .host("127.0.0.1")
                .port(proxy.port())
                .options([("search_path", schema.as_str())]),
        )
        .await
        .unwrap();
    sqlx::query("SELECT 1").execute(&proxied).await.unwrap();
    until_idle(&proxied).await;
    (direct, proxied, proxy)
}

/// After the drop: an autocommit write through the proxied pool is visible to everyone at once,
/// which it is not when it ran inside a transaction left open on the pooled connection; and the
/// connection's backend is idle, not idle in a transaction.
async fn assert_pool_is_clean(direct: &PgPool, proxied: &PgPool) {
    let pid: i32 =
        sqlx::query_scalar("INSERT INTO written (n) VALUES (1) RETURNING pg_backend_pid()")
            .fetch_one(proxied)
            .await
            .unwrap();
    let seen: i64 = sqlx::query_scalar("SELECT count(*) FROM written")
        .fetch_one(direct)
        .await
        .unwrap();
    assert_eq!(
        seen, 1,
        "an autocommit write ran inside a transaction left open on the pooled connection"
    );
    let state: Option<String> =
        sqlx::query_scalar("SELECT state FROM pg_stat_activity WHERE pid = $1")
            .bind(pid)
            .fetch_one(direct)
            .await
            .unwrap();
    assert_eq!(
        state.as_deref(),
        Some("idle"),
        "the pooled connection's backend"
    );
}

/// `execute` of a payment of `amount` under `key`.
async fn pay(
    service: &IdempotencyService<PgStore>,
    key: IdempotencyKey,
    amount: i32,
) -> Outcome<i32> {
    service
        .execute(
            Call::new("PAY", key, &"{}"),
            async move |_conn: &mut sqlx::PgConnection| {
                Ok::<_, idempotency_core::Error>(ExecutionResult::success(amount))
            },
        )
        .await
        .unwrap()
}

#[tokio::test]
async fn a_begin_dropped_on_the_wire_leaves_no_transaction_open_in_the_pool() {
    let (direct, proxied, proxy) = pools().await;
    let store = PgStore::new(proxied.clone());
    proxy.drop_while_held(store.begin()).await;
    assert_pool_is_clean(&direct, &proxied).await;
}

#[tokio::test]
async fn the_public_begin_dropped_on_the_wire_leaves_no_transaction_open_in_the_pool() {
    let (direct, proxied, proxy) = pools().await;
    proxy.drop_while_held(idempotency_pg::begin(&proxied)).await;
    assert_pool_is_clean(&direct, &proxied).await;
}

#[tokio::test]
async fn the_public_begin_hands_out_a_transaction_that_commits_or_rolls_back() {
    let (direct, proxied, _proxy) = pools().await;
    let count = async || -> i64 {
        sqlx::query_scalar("SELECT count(*) FROM written")
            .fetch_one(&direct)
            .await
            .unwrap()
    };
    let mut tx = idempotency_pg::begin(&proxied).await.unwrap();
    sqlx::query("INSERT INTO written (n) VALUES (1)")
        .execute(&mut *tx)
        .await
        .unwrap();
    assert_eq!(count().await, 0, "visible before the commit");
    tx.commit().await.unwrap();
    assert_eq!(count().await, 1, "the commit");
    let mut tx = idempotency_pg::begin(&proxied).await.unwrap();
    sqlx::query("INSERT INTO written (n) VALUES (2)")
        .execute(&mut *tx)
        .await
        .unwrap();
    drop(tx);
    until_idle(&proxied).await;
    assert_eq!(count().await, 1, "a dropped transaction rolls back");
}

#[tokio::test]
async fn an_execute_dropped_during_its_begin_leaves_no_transaction_open_in_the_pool() {
    let (direct, proxied, proxy) = pools().await;
    let store = PgStore::new(proxied.clone());
    store.create_schema().await.unwrap();
    until_idle(&proxied).await;
    let service = IdempotencyService::new(store);
    let key = IdempotencyKey::new("dropped-during-begin").unwrap();
    let execute = service.execute(
        Call::new("PAY", key.clone(), &"{}"),
        async |_conn: &mut sqlx::PgConnection| {
            Ok::<_, idempotency_core::Error>(ExecutionResult::success(1))
        },
    );
    proxy.drop_while_held(execute).await;
    assert_pool_is_clean(&direct, &proxied).await;
    // The key was never taken: the same request runs now.
    assert!(pay(&service, key, 2).await.is_executed());
}

/// The bounded acquire sets `lock_timeout` for its insert only (`set_config(.., true)`, i.e.
/// `SET LOCAL`, in the same statement): dropped while it waits on a holder, or while its answer
/// is on the wire, it leaves no `lock_timeout` on the pooled connection, and the next bounded
/// acquire restores the session's own value. No store statement sets `statement_timeout`.
#[tokio::test]
async fn a_dropped_bounded_acquire_leaves_no_lock_timeout_on_the_connection() {
    let (direct, proxied, proxy) = pools().await;
    let setting = async || -> String {
        sqlx::query_scalar(
            "SELECT current_setting('lock_timeout') || '/' || current_setting('statement_timeout')",
        )
        .fetch_one(&proxied)
        .await
        .unwrap()
    };
    // The pooled connection's own session values, which the store must leave as they are.
    sqlx::raw_sql("SET lock_timeout = '7s'; SET statement_timeout = '9s'")
        .execute(&proxied)
        .await
        .unwrap();
    let before = setting().await;
    assert_eq!(before, "7s/9s");
    let holder_store = PgStore::new(direct.clone());
    holder_store.create_schema().await.unwrap();
    let store = PgStore::new(proxied.clone());
    let id = RecordId::new(
        idempotency_core::testing::op("OP"),
        Scope::new("s").unwrap(),
        IdempotencyKey::new("leak").unwrap(),
    );
    let fingerprint = Fingerprint::new("ab".repeat(32));
    let claim = |wait| Claim {
        id: &id,
        fingerprint: &fingerprint,
        ttl: None,
        wait,
    };
    let bounded = claim(LockWait::Timeout(Duration::from_secs(2)));
    let mut holder = holder_store.begin().await.unwrap();
    let held = holder_store
        .acquire(&mut holder, &claim(LockWait::NoWait))
        .await
        .unwrap();
    assert_eq!(held, Acquire::Acquired);

    // Dropped while it waits on the holder.
    let mut tx = store.begin().await.unwrap();
    let waiting = store.acquire(&mut tx, &bounded);
    assert!(
        tokio::time::timeout(Duration::from_millis(300), waiting)
            .await
            .is_err(),
        "the acquire did not wait for the holder"
    );
    drop(tx);
    holder.rollback().await.unwrap();
    until_idle(&proxied).await;
    assert_eq!(setting().await, before, "a setting leaked into the pool");

    // Dropped while its answer is on the wire.
    let mut tx = store.begin().await.unwrap();
    proxy
        .drop_while_held(store.acquire(&mut tx, &bounded))
        .await;
    drop(tx);
    until_idle(&proxied).await;
    assert_eq!(setting().await, before, "a setting leaked into the pool");

    // A bounded acquire that completes restores the session's own value.
    let mut tx = store.begin().await.unwrap();
    let acquired = store.acquire(&mut tx, &bounded).await.unwrap();
    assert_eq!(acquired, Acquire::Acquired);
    tx.rollback().await.unwrap();
    assert_eq!(setting().await, before);
}

/// A caller's `execute_in` dropped while its claim's answer is on the wire (a timeout around
/// the call, a `select!`): the insert ran on the server, so a commit of the caller's
/// transaction would store a `PROCESSING` record that answers every retry "in flight" until
/// its TTL, and the action never ran. The commit refuses the unfinished claim and rolls back.
#[tokio::test]
async fn an_execute_in_dropped_during_its_claim_cannot_commit_the_claim() {
    let (_direct, proxied, proxy) = pools().await;
    let store = PgStore::new(proxied.clone());
    store.create_schema().await.unwrap();
    let service = IdempotencyService::new(store);
    // The claim's statement is prepared on the one pooled connection first, so that the
    // answer held below is the insert's own, not its preparation's.
    let mut tx = service.begin().await.unwrap();
    let warm: Outcome<i32> = service
        .execute_in(
            &mut tx,
            Call::new("PAY", IdempotencyKey::new("warm").unwrap(), &"{}"),
            async |_conn: &mut sqlx::PgConnection| {
                Ok::<_, idempotency_core::Error>(ExecutionResult::success(0))
            },
        )
        .await
        .unwrap();
    assert!(warm.is_executed());
    tx.commit().await.unwrap();
    until_idle(&proxied).await;

    let key = IdempotencyKey::new("dropped-during-claim").unwrap();
    let mut tx = service.begin().await.unwrap();
    proxy
        .drop_while_held(service.execute_in(
            &mut tx,
            Call::new("PAY", key.clone(), &"{}"),
            async |_conn: &mut sqlx::PgConnection| {
                Ok::<_, idempotency_core::Error>(ExecutionResult::success(1))
            },
        ))
        .await;
    assert_eq!(tx.unfinished_claims(), 1);
    let committed = tx.commit().await;
    assert!(
        matches!(
            committed,
            Err(idempotency_core::StoreError::UnfinishedClaim { count: 1 })
        ),
        "the claim of a dropped execute_in was committed: {committed:?}"
    );
    until_idle(&proxied).await;
    // Nothing of it was stored: the same request runs now.
    assert!(pay(&service, key, 2).await.is_executed());
}

/// The count of a claim that the store answered with "taken already" (or an error) is undone:
/// an `execute_in` that replays leaves a transaction that commits.
#[tokio::test]
async fn an_execute_in_that_replays_leaves_a_transaction_that_commits() {
    let (_direct, proxied, _proxy) = pools().await;
    let store = PgStore::new(proxied.clone());
    store.create_schema().await.unwrap();
    let service = IdempotencyService::new(store);
    let key = IdempotencyKey::new("stored-before").unwrap();
    assert!(pay(&service, key.clone(), 1).await.is_executed());
    let mut tx = service.begin().await.unwrap();
    let again: Outcome<i32> = service
        .execute_in(
            &mut tx,
            Call::new("PAY", key, &"{}"),
            async |_conn: &mut sqlx::PgConnection| {
                Ok::<_, idempotency_core::Error>(ExecutionResult::success(2))
            },
        )
        .await
        .unwrap();
    assert!(again.is_replayed());
    assert_eq!(tx.unfinished_claims(), 0);
    tx.commit().await.unwrap();
}
