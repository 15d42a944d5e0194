//! A request dropped while its `BEGIN` is on the wire (a client that hangs up, a timeout) must
//! not hand the next user of the pool a connection inside a transaction nobody owns.
//!
//! The answers from the server go through a proxy that can hold them, so the drop lands
//! deterministically after the server ran `BEGIN` and before the client read its answer.

#![allow(clippy::unwrap_used)] // tests fail loudly on unexpected errors

use std::time::Duration;

use idempotency_core::config::{PersistenceConfig, SchemaMode};
use idempotency_core::store::{Acquire, Claim, IdempotencyStore, LockWait};
use idempotency_core::{Fingerprint, RecordId, Scope};
use idempotency_mysql::MysqlStore;
use idempotency_testing::{HoldingProxy, until_idle};
use sqlx::MySqlPool;
use sqlx::mysql::{MySqlConnectOptions, MySqlPoolOptions};

/// A direct pool on a fresh database, and a one-connection pool on the same database through a
/// holding proxy (its connection already open, no ping before it is handed out).
async fn pools() -> (MySqlPool, MySqlPool, HoldingProxy) {
    let direct = idempotency_testing::mysql_pool().await;
    let database: String = sqlx::query_scalar("SELECT DATABASE()")
        .fetch_one(&direct)
        .await
        .unwrap();
    sqlx::raw_sql("CREATE TABLE written (n int NOT NULL) ENGINE = InnoDB")
        .execute(&direct)
        .await
        .unwrap();
    let options: MySqlConnectOptions = idempotency_testing::mysql_url().parse().unwrap();
    let upstream = format!("{}:{}", options.get_host(), options.get_port());
    let proxy = HoldingProxy::start(upstream).await;
    let proxied = MySqlPoolOptions::new()
        .max_connections(1)
        .min_connections(1)
        .test_before_acquire(false)
        .connect_with(
            options
                .host("127.0.0.1")
                .port(proxy.port())
                .database(&database),
        )
        .await
        .unwrap();
    sqlx::query("SELECT 1").execute(&proxied).await.unwrap();
    until_idle(&proxied).await;
    (direct, proxied, proxy)
}

/// After the drop: an autocommit write through the proxied pool is visible to everyone at once,
/// which it is not when it ran inside a transaction left open on the pooled connection.
async fn assert_pool_is_clean(direct: &MySqlPool, proxied: &MySqlPool) {
    sqlx::query("INSERT INTO written (n) VALUES (1)")
        .execute(proxied)
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
}

#[tokio::test]
async fn a_begin_dropped_on_the_wire_leaves_no_transaction_open_in_the_pool() {
    let (direct, proxied, proxy) = pools().await;
    let store = MysqlStore::new(proxied.clone());
    proxy.drop_while_held(store.begin()).await;
    assert_pool_is_clean(&direct, &proxied).await;
}

#[tokio::test]
async fn the_public_begin_dropped_on_the_wire_leaves_no_transaction_open_in_the_pool() {
    let (direct, proxied, proxy) = pools().await;
    proxy
        .drop_while_held(idempotency_mysql::begin(&proxied))
        .await;
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
    let mut tx = idempotency_mysql::begin(&proxied).await.unwrap();
    sqlx::query("INSERT INTO written (n) VALUES (1)")
        .execute(&mut *tx)
        .await
        .unwrap();
    assert_eq!(count().await, 0, "visible before the commit");
    tx.commit().await.unwrap();
    assert_eq!(count().await, 1, "the commit");
    let mut tx = idempotency_mysql::begin(&proxied).await.unwrap();
    sqlx::query("INSERT INTO written (n) VALUES (2)")
        .execute(&mut *tx)
        .await
        .unwrap();
    drop(tx);
    until_idle(&proxied).await;
    assert_eq!(count().await, 1, "a dropped transaction rolls back");
}

/// An acquire waiting on a holder with a short budget, dropped (the client went away): the
/// pooled connection must come back with the session's own `innodb_lock_wait_timeout`, for the
/// next user and for the next acquire's restore.
#[tokio::test]
async fn an_acquire_dropped_while_waiting_leaves_no_lock_wait_budget_on_the_connection() {
    let (direct, proxied, _proxy) = pools().await;
    let lock_wait = async || -> u64 {
        sqlx::query_scalar("SELECT @@SESSION.innodb_lock_wait_timeout")
            .fetch_one(&proxied)
            .await
            .unwrap()
    };
    let before = lock_wait().await;
    assert!(before > 2, "the session's budget is {before}");
    let mut config = PersistenceConfig::default();
    config.schema.mode = SchemaMode::Create;
    let holder_store = MysqlStore::from_config(direct.clone(), &config)
        .await
        .unwrap();
    let store = MysqlStore::from_config(proxied.clone(), &config)
        .await
        .unwrap();
    let id = RecordId::new(
        idempotency_core::testing::op("OP"),
        Scope::new("s").unwrap(),
        idempotency_core::testing::key("leak"),
    );
    let fingerprint = Fingerprint::new("ab".repeat(32));
    let claim = |wait| Claim {
        id: &id,
        fingerprint: &fingerprint,
        ttl: None,
        wait,
    };
    let mut holder = holder_store.begin().await.unwrap();
    let held = holder_store
        .acquire(&mut holder, &claim(LockWait::NoWait))
        .await
        .unwrap();
    assert_eq!(held, Acquire::Acquired);

    let bounded = claim(LockWait::Timeout(Duration::from_secs(2)));
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
    assert_eq!(lock_wait().await, before, "the budget leaked into the pool");

    // A bounded acquire on the same connection restores the session's own value.
    let mut tx = store.begin().await.unwrap();
    let acquired = store.acquire(&mut tx, &bounded).await.unwrap();
    assert_eq!(acquired, Acquire::Acquired);
    tx.rollback().await.unwrap();
    assert_eq!(lock_wait().await, before);
}

/// The same drop, in a transaction the caller then rolls back: unlike a dropped transaction
/// (whose connection is closed), the rollback hands the very connection back to the pool, so
/// whatever the dropped acquire left on the session is there for the next user. It must find
/// the session's own `innodb_lock_wait_timeout` (before the statement-scoped wait: 2 s left on
/// the pooled connection).
#[tokio::test]
async fn a_dropped_acquire_rolled_back_returns_its_connection_with_its_own_lock_wait() {
    let (direct, proxied, _proxy) = pools().await;
    let session = async || -> (u64, u64) {
        sqlx::query_as("SELECT CONNECTION_ID(), @@SESSION.innodb_lock_wait_timeout")
            .fetch_one(&proxied)
            .await
            .unwrap()
    };
    let (connection, before) = session().await;
    assert!(before > 2, "the session's budget is {before}");
    let mut config = PersistenceConfig::default();
    config.schema.mode = SchemaMode::Create;
    let holder_store = MysqlStore::from_config(direct.clone(), &config)
        .await
        .unwrap();
    let store = MysqlStore::from_config(proxied.clone(), &config)
        .await
        .unwrap();
    let id = RecordId::new(
        idempotency_core::testing::op("OP"),
        Scope::new("s").unwrap(),
        idempotency_core::testing::key("leak-rolled-back"),
    );
    let fingerprint = Fingerprint::new("ab".repeat(32));
    let claim = |wait| Claim {
        id: &id,
        fingerprint: &fingerprint,
        ttl: None,
        wait,
    };
    let mut holder = holder_store.begin().await.unwrap();
    let held = holder_store
        .acquire(&mut holder, &claim(LockWait::NoWait))
        .await
        .unwrap();
    assert_eq!(held, Acquire::Acquired);

    let bounded = claim(LockWait::Timeout(Duration::from_secs(2)));
    let mut tx = store.begin().await.unwrap();
    let waiting = store.acquire(&mut tx, &bounded);
    assert!(
        tokio::time::timeout(Duration::from_millis(300), waiting)
            .await
            .is_err(),
        "the acquire did not wait for the holder"
    );
    holder.rollback().await.unwrap();
    tx.rollback().await.unwrap();
    until_idle(&proxied).await;
    let (returned, after) = session().await;
    assert_eq!(
        returned, connection,
        "the rollback did not hand the connection back to the pool"
    );
    assert_eq!(after, before, "the budget leaked into the pool");
}

/// A relay worker aborted (the shutdown deadline) while its claim's `START TRANSACTION` is on
/// the wire must not hand the pool a connection inside a transaction nobody owns.
#[cfg(feature = "outbox")]
#[tokio::test]
async fn a_claim_dropped_during_its_begin_leaves_no_transaction_open_in_the_pool() {
    use idempotency_mysql::{MysqlOutbox, TableName};
    use idempotency_outbox::config::Ordering;
    use idempotency_outbox::store::{ClaimRequest, RelayStore};

    let (direct, proxied, proxy) = pools().await;
    let table = TableName::parse("outbox").unwrap();
    MysqlOutbox::with_options(direct.clone(), table.clone(), Ordering::Ordered)
        .unwrap()
        .create_schema()
        .await
        .unwrap();
    let outbox = MysqlOutbox::with_options(proxied.clone(), table, Ordering::Ordered).unwrap();
    let request = ClaimRequest {
        limit: 10,
        lease: Duration::from_secs(30),
        token: uuid::Uuid::now_v7(),
        ordering: Ordering::Ordered,
        max_attempts: 5,
    };
    proxy.drop_while_held(outbox.claim(&request)).await;
    assert_pool_is_clean(&direct, &proxied).await;
}

/// A single-relay claim dropped while the answer to its `GET_LOCK` is on the wire (the server
/// granted the lock): the connection holding the lock must not go back to the pool, where it
/// would keep the lock with no relay behind it and every relay's claim would return nothing.
#[cfg(feature = "outbox")]
#[tokio::test]
async fn a_single_relay_claim_dropped_during_its_get_lock_leaves_no_lock_in_the_pool() {
    use idempotency_mysql::{MysqlOutbox, TableName};
    use idempotency_outbox::NewEvent;
    use idempotency_outbox::config::Ordering;
    use idempotency_outbox::store::{ClaimRequest, RelayStore};

    let (direct, proxied, proxy) = pools().await;
    // Named locks are the server's, not a database's: one of this test's own.
    let lock = idempotency_testing::unique_name("relay");
    let table = TableName::parse("outbox").unwrap();
    let survivor = MysqlOutbox::with_options(direct.clone(), table.clone(), Ordering::Ordered)
        .unwrap()
        .with_single_relay(&lock)
        .unwrap();
    survivor.create_schema().await.unwrap();
    let mut tx = idempotency_mysql::begin(&direct).await.unwrap();
    let event = NewEvent::new("order", "o-1", "Placed", &serde_json::json!({"n": 1})).unwrap();
    survivor.enqueue(&mut tx, &event).await.unwrap();
    tx.commit().await.unwrap();
    let dropped = MysqlOutbox::with_options(proxied.clone(), table, Ordering::Ordered)
        .unwrap()
        .with_single_relay(&lock)
        .unwrap();
    let request = ClaimRequest {
        limit: 10,
        lease: Duration::from_secs(30),
        token: uuid::Uuid::now_v7(),
        ordering: Ordering::Ordered,
        max_attempts: 5,
    };
    // The claim's statement is prepared on the pooled connection already: the answer held is
    // the one to its execution, after the server granted the lock.
    for sql in ["SELECT GET_LOCK(?, 0)", "SELECT RELEASE_LOCK(?)"] {
        sqlx::query_scalar::<_, Option<i64>>(sql)
            .bind("warm-up")
            .fetch_one(&proxied)
            .await
            .unwrap();
    }
    until_idle(&proxied).await;
    let lock_held = async || -> bool {
        let held: i64 = sqlx::query_scalar("SELECT IS_USED_LOCK(?) IS NOT NULL")
            .bind(&lock)
            .fetch_one(&direct)
            .await
            .unwrap();
        held == 1
    };
    proxy.hold();
    let (claimed, granted) = tokio::join!(
        tokio::time::timeout(Duration::from_millis(300), dropped.claim(&request)),
        async {
            tokio::time::sleep(Duration::from_millis(150)).await;
            lock_held().await
        }
    );
    proxy.release();
    assert!(
        claimed.is_err(),
        "the claim finished while its answer was held"
    );
    assert!(
        granted,
        "the server had not granted the lock when the claim was dropped"
    );
    let deadline = tokio::time::Instant::now() + RETURN_WITHIN;
    while lock_held().await && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        !lock_held().await,
        "a session nobody runs a relay on still holds the single-relay lock"
    );
    let taken = survivor.claim(&request).await.unwrap();
    assert_eq!(taken.messages.len(), 1, "the other relay claimed nothing");
    assert!(
        comes_back(&proxied).await,
        "the connection did not come back"
    );
}

/// A single-relay claim dropped while its `START TRANSACTION` is on the wire, on the connection
/// that already holds the lock: the next claim claims the pending event.
#[cfg(feature = "outbox")]
#[tokio::test]
async fn a_single_relay_claim_dropped_during_its_begin_does_not_fail_the_next_claim() {
    use idempotency_mysql::{MysqlOutbox, TableName};
    use idempotency_outbox::NewEvent;
    use idempotency_outbox::config::Ordering;
    use idempotency_outbox::store::{ClaimRequest, RelayStore};

    let (direct, proxied, proxy) = pools().await;
    // Named locks are the server's, not a database's: one of this test's own.
    let lock = idempotency_testing::unique_name("relay");
    let table = TableName::parse("outbox").unwrap();
    let writer =
        MysqlOutbox::with_options(direct.clone(), table.clone(), Ordering::Ordered).unwrap();
    writer.create_schema().await.unwrap();
    let relay = MysqlOutbox::with_options(proxied.clone(), table, Ordering::Ordered)
        .unwrap()
        .with_single_relay(&lock)
        .unwrap();
    let request = ClaimRequest {
        limit: 10,
        lease: Duration::from_secs(30),
        token: uuid::Uuid::now_v7(),
        ordering: Ordering::Ordered,
        max_attempts: 5,
    };
    // The lock taken, its connection kept.
    assert!(relay.claim(&request).await.unwrap().messages.is_empty());
    let mut tx = idempotency_mysql::begin(&direct).await.unwrap();
    let event = NewEvent::new("order", "o-1", "Placed", &serde_json::json!({"n": 1})).unwrap();
    writer.enqueue(&mut tx, &event).await.unwrap();
    tx.commit().await.unwrap();
    proxy.drop_while_held(relay.claim(&request)).await;
    // The relay's next polls: the lock may take a moment to come free if it went with the
    // session.
    let deadline = tokio::time::Instant::now() + RETURN_WITHIN;
    loop {
        let claimed = tokio::time::timeout(RETURN_WITHIN, relay.claim(&request))
            .await
            .expect("the next claim did not answer")
            .expect("the next claim failed");
        if !claimed.messages.is_empty() {
            assert_eq!(claimed.messages.len(), 1);
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the event was never claimed"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// How long a pooled connection may take to come back once its user is gone.
const RETURN_WITHIN: Duration = Duration::from_secs(3);

/// Whether the (one-connection) pool hands its connection out again within [`RETURN_WITHIN`].
async fn comes_back(pool: &MySqlPool) -> bool {
    tokio::time::timeout(RETURN_WITHIN, pool.acquire())
        .await
        .is_ok_and(|acquired| acquired.is_ok())
}

/// sqlx 0.9's MySQL connection counts a statement's result as pending before it sends the
/// statement, and a statement with arguments is first prepared (`COM_STMT_PREPARE`). A future
/// dropped while the prepare's answer is on the wire leaves the connection expecting a result
/// set the server never sends: the prepare's answer is read as that result, the transaction's
/// queued `ROLLBACK` is then read as a row of a result set that never ends, and the pool's
/// release ping waits for it forever. The server's session sits idle, outside a transaction;
/// the pool is one connection short for good.
///
/// This is sqlx's own behaviour, shown on sqlx alone (`pool.begin()`): when this test fails,
/// sqlx has fixed it and `MysqlTransaction`'s close-on-drop may be reconsidered.
#[tokio::test]
async fn sqlx_keeps_a_connection_whose_prepare_was_dropped_on_the_wire() {
    let (_direct, proxied, proxy) = pools().await;
    let mut tx = proxied.begin().await.unwrap();
    proxy
        .drop_while_held(
            sqlx::query("INSERT INTO written (n) VALUES (?)")
                .bind(1)
                .execute(&mut *tx),
        )
        .await;
    drop(tx);
    assert!(
        !comes_back(&proxied).await,
        "sqlx returned the connection: its prepare is cancel-safe now"
    );
}

/// The same drop in a transaction of this crate's `begin`: the connection is closed rather
/// than returned, and the pool opens a fresh one.
#[tokio::test]
async fn a_statement_dropped_during_its_prepare_does_not_keep_the_connection() {
    let (direct, proxied, proxy) = pools().await;
    let mut tx = idempotency_mysql::begin(&proxied).await.unwrap();
    proxy
        .drop_while_held(
            sqlx::query("INSERT INTO written (n) VALUES (?)")
                .bind(1)
                .execute(&mut *tx),
        )
        .await;
    drop(tx);
    assert!(
        comes_back(&proxied).await,
        "the connection did not come back"
    );
    assert_pool_is_clean(&direct, &proxied).await;
}

/// The same through the store's transactions (what `execute_in` and the layer use).
#[tokio::test]
async fn a_store_transaction_dropped_during_a_prepare_does_not_keep_the_connection() {
    let (direct, proxied, proxy) = pools().await;
    let store = MysqlStore::new(proxied.clone());
    let mut tx = store.begin().await.unwrap();
    proxy
        .drop_while_held(
            sqlx::query("INSERT INTO written (n) VALUES (?)")
                .bind(1)
                .execute(&mut *tx),
        )
        .await;
    drop(tx);
    assert!(
        comes_back(&proxied).await,
        "the connection did not come back"
    );
    assert_pool_is_clean(&direct, &proxied).await;
}

/// A statement dropped during its prepare on the pool itself, outside a transaction: nothing
/// is queued after it, the release ping reads the prepare's answer and then fails, and sqlx
/// closes the connection; the pool opens a fresh one.
#[tokio::test]
async fn a_statement_on_the_pool_dropped_during_its_prepare_does_not_keep_the_connection() {
    let (direct, proxied, proxy) = pools().await;
    proxy
        .drop_while_held(
            sqlx::query("INSERT INTO written (n) VALUES (?)")
                .bind(1)
                .execute(&proxied),
        )
        .await;
    assert!(
        comes_back(&proxied).await,
        "the connection did not come back"
    );
    assert_pool_is_clean(&direct, &proxied).await;
}

/// `MysqlTransaction` counts its transaction on the connection as sqlx's does: a nested begin
/// on it is a savepoint (a plain `BEGIN` there would commit the outer transaction at once).
#[tokio::test]
async fn a_nested_begin_in_the_public_begin_is_a_savepoint() {
    let (direct, proxied, _proxy) = pools().await;
    let count = async || -> i64 {
        sqlx::query_scalar("SELECT count(*) FROM written")
            .fetch_one(&direct)
            .await
            .unwrap()
    };
    let mut tx = idempotency_mysql::begin(&proxied).await.unwrap();
    sqlx::query("INSERT INTO written (n) VALUES (1)")
        .execute(&mut *tx)
        .await
        .unwrap();
    let mut savepoint = sqlx::Connection::begin(&mut *tx).await.unwrap();
    sqlx::query("INSERT INTO written (n) VALUES (2)")
        .execute(&mut *savepoint)
        .await
        .unwrap();
    savepoint.rollback().await.unwrap();
    assert_eq!(
        count().await,
        0,
        "the nested begin committed the outer transaction"
    );
    tx.commit().await.unwrap();
    let rows: Vec<i32> = sqlx::query_scalar("SELECT n FROM written")
        .fetch_all(&direct)
        .await
        .unwrap();
    assert_eq!(
        rows,
        [1],
        "the savepoint's row was rolled back, the outer one committed"
    );
}

/// A caller's `execute_in` dropped during its claim's prepare, the caller's transaction kept:
/// its commit refuses the unfinished claim and rolls back, and neither the rollback nor the
/// connection hangs (sqlx would read the prepare's answer as the `ROLLBACK`'s).
#[tokio::test]
async fn an_execute_in_dropped_during_its_claim_neither_commits_nor_hangs() {
    let (direct, proxied, proxy) = pools().await;
    let mut config = PersistenceConfig::default();
    config.schema.mode = SchemaMode::Create;
    let store = MysqlStore::from_config(proxied.clone(), &config)
        .await
        .unwrap();
    until_idle(&proxied).await;
    let service = idempotency_core::IdempotencyService::new(store);
    let key = idempotency_core::IdempotencyKey::new("dropped-during-claim").unwrap();
    let mut tx = service.begin().await.unwrap();
    proxy
        .drop_while_held(service.execute_in(
            &mut tx,
            idempotency_core::Call::new("PAY", key.clone(), &"{}"),
            async |_conn: &mut sqlx::MySqlConnection| {
                Ok::<_, idempotency_core::Error>(idempotency_core::ExecutionResult::success(1))
            },
        ))
        .await;
    let committed = tokio::time::timeout(Duration::from_secs(30), tx.commit())
        .await
        .expect("the refused commit's rollback hung");
    assert!(
        matches!(
            committed,
            Err(idempotency_core::StoreError::UnfinishedClaim { count: 1 })
        ),
        "{committed:?}"
    );
    assert!(
        comes_back(&proxied).await,
        "the connection did not come back"
    );
    assert_pool_is_clean(&direct, &proxied).await;
}
