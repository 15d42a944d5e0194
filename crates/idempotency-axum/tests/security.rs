//! What a client cannot make the layer do (SECURITY.md): create records, operation names and
//! meter labels out of methods of its choosing; replay headers the allow-list refuses; run a
//! leased handler a second time by hanging up. On SQLite (a fresh file per test).

#![allow(clippy::unwrap_used)] // tests fail loudly on unexpected errors

mod support;

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::http::{Method, StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::post;
use idempotency_axum::{IdempotencyLayer, SharedScope};
use idempotency_core::{
    CacheError, IdempotencyMetrics, IdempotencyRecord, IdempotencyService, InFlightPolicy,
    LeasedClaims, Level, LocalCache, RecordId, RecordStatus, ServiceOptions, StoredOutcome,
};
use idempotency_pg::PgStore;
use idempotency_sqlite::SqliteStore;
use idempotency_sqlite::sqlx;
use support::Reply;
use tokio::sync::Notify;

/// A fresh SQLite store with its records table (and leases), removed when dropped.
struct Fresh {
    store: SqliteStore,
    path: std::path::PathBuf,
}

impl Drop for Fresh {
    fn drop(&mut self) {
        for suffix in ["", "-wal", "-shm"] {
            let _ = std::fs::remove_file(format!("{}{suffix}", self.path.display()));
        }
    }
}

async fn fresh() -> Fresh {
    let path = std::env::temp_dir().join(format!("{}.db", idempotency_testing::unique_name("sec")));
    let mut config = idempotency_core::config::PersistenceConfig::default();
    config.schema.mode = idempotency_core::config::SchemaMode::Create;
    let store = SqliteStore::connect(path.to_str().unwrap(), &config)
        .await
        .unwrap();
    store.prepare_leases().await.unwrap();
    Fresh { store, path }
}

async fn records(store: &SqliteStore) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM idempotency_records")
        .fetch_one(store.pool())
        .await
        .unwrap()
}

/// Every operation name a meter was recorded with.
#[derive(Clone, Default)]
struct Labels(Arc<Mutex<Vec<String>>>);

impl Labels {
    fn add(&self, operation: &str) {
        self.0.lock().unwrap().push(operation.to_owned());
    }
    fn seen(&self) -> Vec<String> {
        self.0.lock().unwrap().clone()
    }
}

impl IdempotencyMetrics for Labels {
    fn lookup_hit(&self, operation: &str, _level: Level) {
        self.add(operation);
    }
    fn replayed(&self, operation: &str, _status: RecordStatus) {
        self.add(operation);
    }
    fn payload_conflict(&self, operation: &str) {
        self.add(operation);
    }
    fn acquired(&self, operation: &str) {
        self.add(operation);
    }
    fn acquire_conflict(&self, operation: &str) {
        self.add(operation);
    }
    fn acquire_wait(&self, operation: &str, _waited: Duration) {
        self.add(operation);
    }
    fn persisted(&self, operation: &str, _status: RecordStatus) {
        self.add(operation);
    }
    fn cache_error(&self, operation: &str, _level: Level, _error: &CacheError) {
        self.add(operation);
    }
    fn in_flight(&self, operation: &str) {
        self.add(operation);
    }
    fn cleanup_deleted(&self, _count: u64) {}
}

async fn send(app: &Router, method: Method, key: &str) -> Reply {
    let body = serde_json::json!({});
    support::send(
        app,
        method,
        "/payments",
        &[("idempotency-key", key.as_bytes())],
        Some(&body),
    )
    .await
}

/// Issue 53, item 2: a made-up method (61 characters, and one of 120 that no operation name
/// can hold) and a standard method outside the layer's set reach the route's 405 without a
/// record, without an operation name in any meter, and without a 500. The layer's own methods
/// that the route does not serve (`PUT`, `PATCH`, `DELETE` on a `POST` route) answer the same
/// 405, which is transient and never stored, and name only their own operation: a bounded set.
#[tokio::test]
async fn methods_the_route_does_not_serve_store_no_record_and_name_only_the_layers_operations() {
    let fresh = fresh().await;
    let labels = Labels::default();
    let service = IdempotencyService::builder(fresh.store.clone())
        .metrics(labels.clone())
        .build();
    let app = Router::new()
        .route(
            "/payments",
            post(|| async { (StatusCode::CREATED, "paid") }),
        )
        .route_layer(IdempotencyLayer::new(service).scope::<SharedScope>());
    for (i, length) in [61, 120].into_iter().enumerate() {
        let method = Method::from_bytes("X".repeat(length).as_bytes()).unwrap();
        let reply = send(&app, method, &format!("m-{i}")).await;
        assert_eq!(reply.status, StatusCode::METHOD_NOT_ALLOWED, "{length}");
    }
    for method in [Method::GET, Method::HEAD, Method::OPTIONS] {
        let reply = send(&app, method.clone(), "std").await;
        assert_eq!(reply.status, StatusCode::METHOD_NOT_ALLOWED, "{method}");
    }
    assert_eq!(records(&fresh.store).await, 0, "no record for a 405");
    assert_eq!(
        labels.seen(),
        Vec::<String>::new(),
        "methods outside the layer's set name no operation"
    );
    // The layer's methods: each runs through the layer, gets the route's 405, stores nothing,
    // and a second try with the same key runs again (nothing to replay).
    for method in [Method::PUT, Method::PATCH, Method::DELETE] {
        for _ in 0..2 {
            let reply = send(&app, method.clone(), "layer-method").await;
            assert_eq!(reply.status, StatusCode::METHOD_NOT_ALLOWED, "{method}");
            assert!(!reply.is_replay(), "{method}: a 405 is never replayed");
        }
    }
    assert_eq!(records(&fresh.store).await, 0, "no record for a 405");
    let seen = labels.seen();
    let bounded = ["PUT:/payments", "PATCH:/payments", "DELETE:/payments"];
    assert!(
        seen.iter().all(|op| bounded.contains(&op.as_str())),
        "only the layer's methods name operations: {seen:?}"
    );
    for op in bounded {
        assert!(
            seen.iter().any(|seen| seen == op),
            "{op} went through the layer: {seen:?}"
        );
    }
    // The method the route serves still works, and is the only one stored.
    let paid = send(&app, Method::POST, "p-1").await;
    assert_eq!(paid.status, StatusCode::CREATED);
    assert_eq!(records(&fresh.store).await, 1);
}

/// A local cache a test can tamper with, as anyone who can write a shared cache could.
#[derive(Clone, Default)]
struct Tamperable(Arc<Mutex<HashMap<RecordId, Arc<IdempotencyRecord>>>>);

impl LocalCache for Tamperable {
    fn get(&self, id: &RecordId) -> Option<Arc<IdempotencyRecord>> {
        self.0.lock().unwrap().get(id).cloned()
    }
    fn put(&self, id: &RecordId, record: Arc<IdempotencyRecord>) {
        self.0.lock().unwrap().insert(id.clone(), record);
    }
}

/// Issue 53, item 1: a stored response whose headers were changed after it was stored (in a
/// cache or a table someone else can write) replays only the headers the layer's allow-list
/// keeps: no `Access-Control-Allow-Origin`, `Refresh` or `Set-Cookie` from a forgery.
#[tokio::test]
async fn a_replay_applies_the_header_allow_list_again() {
    let fresh = fresh().await;
    let cache = Tamperable::default();
    let service = IdempotencyService::builder(fresh.store.clone())
        .local_cache(cache.clone())
        .build();
    let app = Router::new()
        .route(
            "/payments",
            post(|| async {
                (
                    StatusCode::CREATED,
                    [(header::CONTENT_TYPE, "application/json")],
                    r#"{"paid":true}"#,
                )
                    .into_response()
            }),
        )
        .route_layer(IdempotencyLayer::new(service).scope::<SharedScope>());
    let first = send(&app, Method::POST, "h-1").await;
    assert_eq!(first.status, StatusCode::CREATED);

    let tamper = |record: &mut Arc<IdempotencyRecord>| {
        let mut tampered = (**record).clone();
        let Some(StoredOutcome::Completed { payload }) = &mut tampered.outcome else {
            panic!("{tampered:?}")
        };
        let mut stored: serde_json::Value = serde_json::from_str(payload).unwrap();
        stored["headers"] = serde_json::json!([
            ["content-type", "text/html"],
            ["access-control-allow-origin", "*"],
            ["refresh", "0;url=https://evil.example/"],
            ["location", "https://evil.example/x"],
            ["x-frame-options", "ALLOWALL"],
        ]);
        *payload = stored.to_string();
        *record = Arc::new(tampered);
    };
    cache.0.lock().unwrap().values_mut().for_each(tamper);

    let replay = send(&app, Method::POST, "h-1").await;
    assert!(replay.is_replay());
    for refused in ["access-control-allow-origin", "refresh", "x-frame-options"] {
        assert_eq!(replay.header(refused), None, "{refused} replayed");
    }
    // What the allow-list keeps is replayed as stored (the entry's integrity is the cache's
    // tag, SECURITY.md): the replay never adds a header the layer would not have stored.
    assert_eq!(replay.header("content-type"), Some("text/html"));
}

/// Issue 53, item 5: in leased mode a client that hangs up after the handler's external effect
/// does not cancel the handler: its response is stored, the retry replays it, and the effect
/// happened once (before: the claim stayed until the lease expired and the retry ran the
/// effect again).
#[tokio::test]
async fn leased_a_client_that_hangs_up_does_not_cancel_the_handler() {
    let fresh = fresh().await;
    let effects = Arc::new(AtomicUsize::new(0));
    let entered = Arc::new(Notify::new());
    let release = Arc::new(Notify::new());
    let service = IdempotencyService::new(fresh.store.clone());
    let handler = {
        let (effects, entered, release) = (
            Arc::clone(&effects),
            Arc::clone(&entered),
            Arc::clone(&release),
        );
        move || async move {
            let n = effects.fetch_add(1, Ordering::SeqCst) + 1;
            entered.notify_one();
            release.notified().await;
            (StatusCode::CREATED, format!("charge {n}"))
        }
    };
    let app = Router::new().route("/payments", post(handler)).route_layer(
        IdempotencyLayer::new(service)
            .scope::<SharedScope>()
            .leased(Duration::from_millis(300)),
    );
    let client = tokio::spawn({
        let app = app.clone();
        async move { send(&app, Method::POST, "hang-up").await }
    });
    entered.notified().await;
    client.abort(); // the client goes away after the effect, before the answer
    assert!(client.await.unwrap_err().is_cancelled());
    release.notify_one();
    // Past the lease: before the fix, the claim had expired and the retry ran again.
    tokio::time::sleep(Duration::from_millis(600)).await;
    let retry = send(&app, Method::POST, "hang-up").await;
    assert_eq!(retry.status, StatusCode::CREATED, "{}", retry.text());
    assert!(retry.is_replay(), "the retry replays: {}", retry.text());
    assert_eq!(retry.text(), "charge 1");
    assert_eq!(effects.load(Ordering::SeqCst), 1, "the effect ran once");
}

/// Connections of `pool` checked out now.
fn in_use(pool: &sqlx::PgPool) -> u32 {
    pool.size() - u32::try_from(pool.num_idle()).unwrap()
}

/// Waits until `pool` has `n` connections checked out (at most 10 s).
async fn until_in_use(pool: &sqlx::PgPool, n: u32) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while in_use(pool) != n {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{} connections in use, not {n}",
            in_use(pool)
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Issue 53, item 6: duplicates of one slow request wait for it with a pooled connection each;
/// past `max_waiters_per_key` they answer 409 at once, without one, and the ones that waited
/// replay the holder's response. The pool has exactly one connection more than the holder and
/// its two waiters need: while four more copies arrive, it stays the only free one, and a
/// request of another key gets it. (Without the bound, the first copy past the waiters takes
/// it and blocks on the row lock, and the others queue for a connection: the other key's
/// request then waits for the pool's acquire timeout.)
#[tokio::test]
async fn duplicates_beyond_the_waiters_of_a_key_answer_409_without_a_connection() {
    let pool = idempotency_testing::pg_pool_with_options(4, |options| {
        options.acquire_timeout(Duration::from_secs(3))
    })
    .await;
    let store = PgStore::new(pool.clone());
    store.create_schema().await.unwrap();
    let entered = Arc::new(Notify::new());
    let release = Arc::new(Notify::new());
    let handler = {
        let (entered, release) = (Arc::clone(&entered), Arc::clone(&release));
        move || async move {
            entered.notify_one();
            release.notified().await;
            (StatusCode::CREATED, "done")
        }
    };
    let app = Router::new()
        .route("/payments", post(handler))
        .route("/other", post(|| async { (StatusCode::CREATED, "other") }))
        .route_layer(
            IdempotencyLayer::new(IdempotencyService::new(store))
                .scope::<SharedScope>()
                .max_waiters_per_key(2),
        );
    let spawn = || {
        let app = app.clone();
        tokio::spawn(async move { send(&app, Method::POST, "slow").await })
    };
    let holder = spawn();
    entered.notified().await;
    let mut duplicates: Vec<_> = (0..2).map(|_| spawn()).collect();
    until_in_use(&pool, 3).await; // the holder and its two waiters
    duplicates.extend((0..4).map(|_| spawn()));
    // The refused ones answer while the holder still runs, without taking the spare connection.
    four_answered_within(&duplicates, Duration::from_secs(1)).await;
    assert_eq!(in_use(&pool), 3, "the refused copies hold no connection");
    let other = tokio::time::timeout(
        Duration::from_secs(2),
        support::send(
            &app,
            Method::POST,
            "/other",
            &[("idempotency-key", b"other-key")],
            Some(&serde_json::json!({})),
        ),
    )
    .await
    .expect("another key's request gets the spare connection");
    assert_eq!(other.status, StatusCode::CREATED, "{}", other.text());
    assert!(!holder.is_finished(), "the holder still runs");
    release.notify_one();
    assert_eq!(holder.await.unwrap().status, StatusCode::CREATED);
    assert_eq!(statuses(duplicates).await, [201, 201, 409, 409, 409, 409]);
}

/// The same bound in leased mode, where a duplicate waits by polling the store (a statement
/// per poll): beyond the holder and its two waiters, copies answer `409` with `Retry-After`
/// at once (before: every copy polled until the in-flight timeout, 5 s here, each poll on the
/// shared pool), and the waiters replay the holder's response.
#[tokio::test]
async fn leased_duplicates_beyond_the_waiters_of_a_key_answer_409_at_once() {
    let fresh = fresh().await;
    let entered = Arc::new(Notify::new());
    let release = Arc::new(Notify::new());
    let handler = {
        let (entered, release) = (Arc::clone(&entered), Arc::clone(&release));
        move || async move {
            entered.notify_one();
            release.notified().await;
            (StatusCode::CREATED, "done")
        }
    };
    let service = IdempotencyService::builder(fresh.store.clone())
        .config(ServiceOptions {
            in_flight: InFlightPolicy::Wait {
                timeout: Some(Duration::from_secs(5)),
            },
            ..ServiceOptions::default()
        })
        .build();
    let app = Router::new().route("/payments", post(handler)).route_layer(
        IdempotencyLayer::new(service)
            .scope::<SharedScope>()
            .max_waiters_per_key(2)
            .leased(Duration::from_secs(30)),
    );
    let spawn = || {
        let app = app.clone();
        tokio::spawn(async move { send(&app, Method::POST, "slow-leased").await })
    };
    let holder = spawn();
    entered.notified().await;
    let mut duplicates: Vec<_> = (0..2).map(|_| spawn()).collect();
    tokio::time::sleep(Duration::from_millis(300)).await; // the two waiters are polling
    duplicates.extend((0..4).map(|_| spawn()));
    four_answered_within(&duplicates, Duration::from_secs(2)).await;
    assert!(!holder.is_finished(), "the holder still runs");
    release.notify_one();
    assert_eq!(holder.await.unwrap().status, StatusCode::CREATED);
    assert_eq!(statuses(duplicates).await, [201, 201, 409, 409, 409, 409]);
}

/// Waits until four of `duplicates` have answered, at most `within`.
async fn four_answered_within(duplicates: &[tokio::task::JoinHandle<Reply>], within: Duration) {
    let deadline = tokio::time::Instant::now() + within;
    while duplicates.iter().filter(|d| d.is_finished()).count() < 4 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "four duplicates refused at once"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The statuses `duplicates` answered, sorted: each `409` with `Retry-After`, any other a
/// replay.
async fn statuses(duplicates: Vec<tokio::task::JoinHandle<Reply>>) -> Vec<u16> {
    let mut statuses = Vec::new();
    for duplicate in duplicates {
        let reply = duplicate.await.unwrap();
        if reply.status == StatusCode::CONFLICT {
            assert!(reply.header("retry-after").is_some());
        } else {
            assert!(reply.is_replay(), "{}", reply.text());
        }
        statuses.push(reply.status.as_u16());
    }
    statuses.sort_unstable();
    statuses
}

/// Issue 53, item 5, transactional mode, decided: a client that hangs up cancels the handler
/// and its transaction rolls back, so nothing remains (no record, no business row) and the
/// retry runs once. The database effects happen exactly once; the handler is not kept running
/// for a client that is gone.
#[tokio::test]
async fn transactional_a_client_that_hangs_up_leaves_nothing_and_the_retry_runs_once() {
    let pool = idempotency_testing::pg_pool().await;
    let store = PgStore::new(pool.clone());
    store.create_schema().await.unwrap();
    sqlx::raw_sql("CREATE TABLE charges (id bigserial PRIMARY KEY)")
        .execute(&pool)
        .await
        .unwrap();
    let entered = Arc::new(Notify::new());
    let hold = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let handler = {
        let (entered, hold) = (Arc::clone(&entered), Arc::clone(&hold));
        move |mut tx: idempotency_axum::IdempotentTx<PgStore>| async move {
            sqlx::query("INSERT INTO charges DEFAULT VALUES")
                .execute(&mut *tx)
                .await
                .unwrap();
            if hold.swap(false, Ordering::SeqCst) {
                entered.notify_one();
                std::future::pending::<()>().await;
            }
            (StatusCode::CREATED, "charged")
        }
    };
    let app = Router::new()
        .route("/payments", post(handler))
        .route_layer(IdempotencyLayer::new(IdempotencyService::new(store)).scope::<SharedScope>());
    let client = tokio::spawn({
        let app = app.clone();
        async move { send(&app, Method::POST, "tx-hang-up").await }
    });
    entered.notified().await;
    client.abort();
    assert!(client.await.unwrap_err().is_cancelled());
    let retry = send(&app, Method::POST, "tx-hang-up").await;
    assert_eq!(retry.status, StatusCode::CREATED);
    assert!(!retry.is_replay(), "the retry runs: nothing was stored");
    let charges: i64 = sqlx::query_scalar("SELECT count(*) FROM charges")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(charges, 1, "the hung-up run's row was rolled back");
    assert!(send(&app, Method::POST, "tx-hang-up").await.is_replay());
}
