//! Durable keys: a caller that gave up (or restarted) mid-operation sends the operation's key
//! again and gets the replay.

#![allow(clippy::unwrap_used)] // tests fail loudly on unexpected errors

mod support;

use std::time::Duration;

use idempotency_client::{
    Error, IdempotencyMiddleware, KeyStore, MemoryKeyStore, Operation, PgKeyStore, ResponseExt,
    RetryPolicy, SqliteKeyStore, sqlx,
};
use idempotency_core::InFlightPolicy;
use reqwest::StatusCode;

fn client(store: impl KeyStore) -> reqwest_middleware::ClientWithMiddleware {
    let policy = RetryPolicy::default()
        .max_attempts(1)
        .initial_backoff(Duration::from_millis(10));
    reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
        .with(
            IdempotencyMiddleware::new()
                .retry_policy(policy)
                .key_store(store),
        )
        .build()
}

/// The first client loses the answer after the server committed and gives up; a second client
/// (the caller after a restart) sends the operation again with the stored key: the replay.
///
/// `before` is the caller's store before its restart, `reopen` opens it after.
async fn a_new_client_reuses_the_operations_key<K: KeyStore>(
    before: K,
    reopen: impl AsyncFnOnce() -> K,
) {
    let server = support::start(InFlightPolicy::Reject).await;
    let proxy = support::lose_first_answer(server.addr).await;
    let send = |client: reqwest_middleware::ClientWithMiddleware, url: String| async move {
        client
            .post(url)
            .header("content-type", "application/json")
            .body(r#"{"amount":10}"#)
            .with_extension(Operation::new("payout-1"))
            .send()
            .await
    };
    let lost = send(client(before), format!("http://{proxy}/payments"))
        .await
        .unwrap_err();
    assert!(
        matches!(Error::from_middleware(&lost), Some(Error::Exhausted { .. })),
        "{lost:?}"
    );
    assert_eq!(server.payments().await, 1, "the server committed");

    // The first client and its store are gone; the restarted caller opens the store again.
    let store = std::sync::Arc::new(reopen().await);
    let after_restart = send(client(SharedStore(store.clone())), server.url("/payments"))
        .await
        .unwrap();
    assert_eq!(after_restart.status(), StatusCode::CREATED);
    assert!(after_restart.is_replay(), "the same key: the stored answer");
    assert_eq!(server.payments().await, 1, "one execution");

    // Once forgotten, the operation id starts a new operation.
    store.forget("payout-1").await.unwrap();
    let again = send(client(SharedStore(store)), server.url("/payments"))
        .await
        .unwrap();
    assert!(!again.is_replay());
    assert_eq!(server.payments().await, 2);
}

/// A store shared between the test and the middleware.
struct SharedStore<K>(std::sync::Arc<K>);

impl<K: KeyStore> KeyStore for SharedStore<K> {
    async fn key_for(
        &self,
        operation: &str,
        fresh: &str,
    ) -> Result<String, idempotency_client::KeyStoreError> {
        self.0.key_for(operation, fresh).await
    }

    async fn forget(&self, operation: &str) -> Result<(), idempotency_client::KeyStoreError> {
        self.0.forget(operation).await
    }
}

#[tokio::test]
async fn in_memory_keys_survive_a_new_client() {
    let store = MemoryKeyStore::default();
    let kept = store.clone();
    a_new_client_reuses_the_operations_key(store, async || kept).await;
}

#[tokio::test]
async fn sqlite_keys_survive_a_restart_of_the_caller() {
    let path = std::env::temp_dir().join(format!(
        "{}.db",
        idempotency_testing::unique_name("client-keys")
    ));
    let url = format!("sqlite://{}?mode=rwc", path.display());
    let open = || async {
        let store = SqliteKeyStore::new(sqlx::SqlitePool::connect(&url).await.unwrap());
        store.create_table().await.unwrap();
        store
    };
    // The first pool is dropped with the first client, before the second opens the file.
    a_new_client_reuses_the_operations_key(open().await, open).await;
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
    }
}

#[tokio::test]
async fn postgres_keys_survive_a_restart_of_the_caller() {
    let pool = idempotency_testing::pg_pool().await;
    let before = PgKeyStore::new(pool.clone());
    before.create_table().await.unwrap();
    let url = idempotency_testing::database_url();
    let schema: String = sqlx::query_scalar("SELECT current_schema()")
        .fetch_one(&pool)
        .await
        .unwrap();
    drop(pool);
    // A new pool, as a restarted caller opens, on the same schema.
    let reopen = async || {
        let pool = sqlx::postgres::PgPoolOptions::new()
            .after_connect(move |conn, _| {
                let schema = schema.clone();
                Box::pin(async move {
                    sqlx::query("SELECT set_config('search_path', $1, false)")
                        .bind(schema)
                        .execute(conn)
                        .await
                        .map(drop)
                })
            })
            .connect(&url)
            .await
            .unwrap();
        PgKeyStore::new(pool)
    };
    a_new_client_reuses_the_operations_key(before, reopen).await;
}

#[tokio::test]
async fn concurrent_callers_of_one_operation_get_one_key() {
    let pool = idempotency_testing::pg_pool().await;
    let store = std::sync::Arc::new(PgKeyStore::new(pool));
    store.create_table().await.unwrap();
    let calls = (0..8).map(|i| {
        let store = store.clone();
        tokio::spawn(async move { store.key_for("job", &format!("k-{i}")).await.unwrap() })
    });
    let keys = futures_util::future::join_all(calls).await;
    let first = keys[0].as_ref().unwrap();
    assert!(
        keys.iter().all(|k| k.as_ref().unwrap() == first),
        "{keys:?}"
    );
}

/// Behind PgBouncer in transaction pooling (the topology `persistence.pooler: transaction`
/// serves), the store's statements are unnamed: a server connection that another client
/// prepared a statement on does not answer "prepared statement already exists" (before:
/// sqlx's named statements collided, and every request of an operation was refused).
#[tokio::test]
async fn the_postgres_store_works_behind_a_transaction_pooler() {
    let (pool, _schema) = idempotency_testing::pgbouncer_pool(8).await;
    // No `search_path` through PgBouncer: the table is the database's `public` one, shared
    // with other runs; unique operation ids keep this test's rows its own.
    let store = std::sync::Arc::new(PgKeyStore::new(pool));
    store.create_table().await.unwrap();
    let run = idempotency_testing::unique_name("op");
    let calls = (0..8).map(|task| {
        let (store, run) = (store.clone(), run.clone());
        tokio::spawn(async move {
            for call in 0..20 {
                let operation = format!("{run}-{task}-{call}");
                let key = store.key_for(&operation, "k").await?;
                assert_eq!(key, "k");
                store.forget(&operation).await?;
            }
            Ok::<_, idempotency_client::KeyStoreError>(())
        })
    });
    for result in futures_util::future::join_all(calls).await {
        result.unwrap().unwrap();
    }
}

/// A caller's future dropped while the store's `BEGIN` is answered (a timeout around the
/// request, a client gone) leaves no transaction open on the pooled connection: the next
/// user's autocommit write is visible to others at once.
#[tokio::test(flavor = "multi_thread")]
async fn a_key_for_dropped_midway_leaves_no_transaction_on_the_pool() {
    use sqlx::Connection as _;
    use std::future::Future;
    let pool = idempotency_testing::pg_pool_with(1).await;
    let store = PgKeyStore::new(pool.clone());
    store.create_table().await.unwrap();
    sqlx::query("CREATE TABLE probe (n int)")
        .execute(&pool)
        .await
        .unwrap();
    let schema: String = sqlx::query_scalar("SELECT current_schema()")
        .fetch_one(&pool)
        .await
        .unwrap();
    let mut other = sqlx::PgConnection::connect(&idempotency_testing::database_url())
        .await
        .unwrap();
    // Dropped after 1, 2, ... polls (the runtime moving the I/O in between): some drop it
    // while `BEGIN` is answered.
    for n in 0..60 {
        {
            let operation = format!("op-{n}");
            let mut call = std::pin::pin!(store.key_for(&operation, "k"));
            for _ in 0..=n {
                let ready = std::future::poll_fn(|cx| {
                    std::task::Poll::Ready(call.as_mut().poll(cx).is_ready())
                })
                .await;
                if ready {
                    break;
                }
                tokio::task::yield_now().await;
            }
        }
        sqlx::query("INSERT INTO probe VALUES ($1)")
            .bind(n)
            .execute(&pool)
            .await
            .unwrap();
        let seen: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
            "SELECT count(*) FROM \"{schema}\".probe WHERE n = $1"
        )))
        .bind(n)
        .fetch_one(&mut other)
        .await
        .unwrap();
        assert_eq!(
            seen, 1,
            "round {n}: the write went into a transaction left open"
        );
    }
}

#[tokio::test]
async fn an_operation_without_a_key_store_is_not_sent() {
    let server = support::start(InFlightPolicy::Reject).await;
    let client = reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
        .with(IdempotencyMiddleware::new())
        .build();
    let refused = client
        .post(server.url("/unavailable"))
        .with_extension(Operation::new("payout-1"))
        .send()
        .await
        .unwrap_err();
    assert!(
        matches!(
            Error::from_middleware(&refused),
            Some(Error::NoKeyStore { operation }) if operation == "payout-1"
        ),
        "{refused:?}"
    );
    assert!(server.keys().is_empty(), "nothing sent");
}
