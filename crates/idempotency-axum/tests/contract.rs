//! The HTTP contract, row by row, on a real PostgreSQL (`idempotency_pg::PgStore` on an
//! isolated schema from `idempotency_testing::pg_pool()`), through `oneshot`.
//!
//! The fail-fast cache row uses `FailingCache` below, a test double of the L2 cache that always
//! errors with policy `FailFast`: the Redis crate is written elsewhere, and the row is about the
//! mapping of `Error::Cache`, not about Redis.

#![allow(clippy::unwrap_used)] // tests fail loudly on unexpected errors

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::http::{Method, StatusCode};
use axum::routing::post;
use axum::{Json, Router};
use idempotency_axum::{Error, IdempotentJson, OutcomeExt, ScopedKey, TenantHeader, UuidKeyHeader};
use idempotency_core::{
    CacheError, DistributedCache, ExecutionResult, FailurePolicy, IdempotencyRecord,
    IdempotencyService, InFlightPolicy, NoCache, RecordId, ServiceOptions,
};
use idempotency_pg::PgStore;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use sqlx::{self, PgPool};
use support::{Reply, send};
use tokio::sync::Notify;

/// An L2 cache whose every read fails, with policy `FailFast`.
#[derive(Debug, Clone, Copy)]
struct FailingCache;

impl DistributedCache for FailingCache {
    async fn get(&self, _id: &RecordId) -> Result<Option<IdempotencyRecord>, CacheError> {
        Err(CacheError::Backend(Box::new(std::io::Error::other(
            "redis at 10.0.0.7:6379 refused the connection",
        ))))
    }
    async fn put(&self, _id: &RecordId, _record: &IdempotencyRecord) -> Result<(), CacheError> {
        Err(CacheError::Timeout(Duration::from_millis(50)))
    }
    fn failure_policy(&self) -> FailurePolicy {
        FailurePolicy::FailFast
    }
}

#[derive(Debug, Serialize, Deserialize)]
struct CreatePayment {
    order_id: String,
    amount_cents: i64,
}

#[derive(Debug, Serialize, Deserialize)]
struct Payment {
    id: i64,
    tenant: String,
    order_id: String,
    amount_cents: i64,
}

/// Hooks the tests use to steer the next action.
#[derive(Default)]
struct Hooks {
    /// The next action fails with a technical error after its insert.
    fail_next: AtomicBool,
    /// The next action signals `entered`, then waits for `release`.
    hold_next: AtomicBool,
    entered: Notify,
    release: Notify,
}

struct AppState<D> {
    service: IdempotencyService<PgStore, NoCache, D>,
    hooks: Arc<Hooks>,
}

impl<D> Clone for AppState<D> {
    fn clone(&self) -> Self {
        Self {
            service: self.service.clone(),
            hooks: Arc::clone(&self.hooks),
        }
    }
}

async fn create_payment<D: DistributedCache>(
    State(state): State<AppState<D>>,
    scoped: ScopedKey<TenantHeader>,
    Json(request): Json<CreatePayment>,
) -> Result<IdempotentJson<Payment>, Error> {
    let tenant = scoped.scope.to_string();
    let hooks = &state.hooks;
    let outcome = state
        .service
        .execute(scoped.call("CREATE_PAYMENT", &request), async |conn| {
            if hooks.hold_next.swap(false, Ordering::SeqCst) {
                hooks.entered.notify_one();
                hooks.release.notified().await;
            }
            if request.amount_cents > 1000 {
                let details = json!({"requested": request.amount_cents, "available": 1000});
                return ExecutionResult::rejected_with("INSUFFICIENT_FUNDS", &details)
                    .map_err(Error::internal);
            }
            let id: i64 = sqlx::query_scalar(
                "INSERT INTO payments (tenant, order_id, amount_cents) VALUES ($1, $2, $3) RETURNING id",
            )
            .bind(&tenant)
            .bind(&request.order_id)
            .bind(request.amount_cents)
            .fetch_one(&mut *conn)
            .await
            .map_err(Error::internal)?;
            if hooks.fail_next.swap(false, Ordering::SeqCst) {
                return Err(Error::internal(std::io::Error::other(
                    "boom: password=hunter2 at db.internal",
                )));
            }
            Ok(ExecutionResult::success(Payment {
                id,
                tenant: tenant.clone(),
                order_id: request.order_id.clone(),
                amount_cents: request.amount_cents,
            }))
        })
        .await?;
    Ok(outcome.into_json(StatusCode::CREATED))
}

/// An unscoped endpoint that asks for UUID keys.
async fn create_charge<D: DistributedCache>(
    State(state): State<AppState<D>>,
    key: UuidKeyHeader,
    Json(request): Json<Value>,
) -> Result<IdempotentJson<Value>, Error> {
    let outcome = state
        .service
        .execute(key.call("CREATE_CHARGE", &request), async |conn| {
            let id: i64 = sqlx::query_scalar(
                "INSERT INTO payments (tenant, order_id, amount_cents) VALUES ('', 'charge', 1) RETURNING id",
            )
            .fetch_one(&mut *conn)
            .await
            .map_err(Error::internal)?;
            Ok::<_, Error>(ExecutionResult::success(json!({"chargeId": id})))
        })
        .await?;
    Ok(outcome.into_json(StatusCode::CREATED))
}

fn router<D: DistributedCache>(
    service: IdempotencyService<PgStore, NoCache, D>,
) -> (Router, Arc<Hooks>) {
    let hooks = Arc::new(Hooks::default());
    let state = AppState {
        service,
        hooks: Arc::clone(&hooks),
    };
    let app = Router::new()
        .route("/payments", post(create_payment::<D>))
        .route("/charges", post(create_charge::<D>))
        .with_state(state);
    (app, hooks)
}

async fn database() -> (PgPool, PgStore) {
    let pool = idempotency_testing::pg_pool().await;
    let store = PgStore::new(pool.clone());
    store.create_schema().await.unwrap();
    sqlx::raw_sql(
        "CREATE TABLE payments (id bigserial PRIMARY KEY, tenant text NOT NULL, order_id text NOT NULL, amount_cents bigint NOT NULL)",
    )
    .execute(&pool)
    .await
    .unwrap();
    (pool, store)
}

async fn setup_with(config: ServiceOptions) -> (PgPool, Router, Arc<Hooks>) {
    let (pool, store) = database().await;
    let service = IdempotencyService::builder(store).config(config).build();
    let (app, hooks) = router(service);
    (pool, app, hooks)
}

async fn setup() -> (PgPool, Router, Arc<Hooks>) {
    setup_with(ServiceOptions::default()).await
}

async fn count(pool: &PgPool, table: &str) -> i64 {
    sqlx::query_scalar(sqlx::AssertSqlSafe(format!("SELECT count(*) FROM {table}")))
        .fetch_one(pool)
        .await
        .unwrap()
}

async fn pay(app: &Router, tenant: &str, key: &str, amount: i64) -> Reply {
    let body = json!({"order_id": "o-1", "amount_cents": amount});
    send(
        app,
        Method::POST,
        "/payments",
        &[
            ("idempotency-key", key.as_bytes()),
            ("x-tenant-id", tenant.as_bytes()),
        ],
        Some(&body),
    )
    .await
}

/// Replay of a completed request: the stored status and body, plus `Idempotent-Replayed`.
#[tokio::test]
async fn replay_returns_the_stored_status_and_body() {
    let (pool, app, _) = setup().await;
    let first = pay(&app, "acme", "k-1", 100).await;
    assert_eq!(first.status, 201, "{}", first.text());
    assert_eq!(first.header("content-type"), Some("application/json"));
    assert!(!first.is_replay());
    assert_eq!(first.headers.get("idempotent-replayed"), None);
    assert_eq!(first.json()["tenant"], "acme");

    for _ in 0..2 {
        let replay = pay(&app, "acme", "\"k-1\"", 100).await; // quoted form: same key
        assert_eq!(replay.status, 201);
        assert!(replay.is_replay());
        assert_eq!(replay.header("content-type"), Some("application/json"));
        assert_eq!(replay.body, first.body, "byte-identical body");
    }
    assert_eq!(count(&pool, "payments").await, 1);
    assert_eq!(count(&pool, "idempotency_records").await, 1);
}

/// Replay of a rejected request: the same 422 problem, code and details, plus the header.
#[tokio::test]
async fn business_rejection_is_a_problem_and_replays_identically() {
    let (pool, app, _) = setup().await;
    let first = pay(&app, "acme", "k-rej", 5000).await;
    let body = first.assert_problem(422, "request-rejected");
    assert_eq!(body["code"], "INSUFFICIENT_FUNDS");
    assert_eq!(
        body["details"],
        json!({"requested": 5000, "available": 1000})
    );
    assert!(!first.is_replay());

    let replay = pay(&app, "acme", "k-rej", 5000).await;
    replay.assert_problem(422, "request-rejected");
    assert!(replay.is_replay());
    assert_eq!(replay.body, first.body);
    assert_eq!(count(&pool, "payments").await, 0);
    let status: String = sqlx::query_scalar("SELECT status FROM idempotency_records")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(status, "REJECTED");
}

/// Same key, different payload: 422 `idempotency-key-reused`; the action does not run.
#[tokio::test]
async fn same_key_other_payload_is_422_key_reused() {
    let (pool, app, _) = setup().await;
    assert_eq!(pay(&app, "acme", "k-2", 100).await.status, 201);
    let reused = pay(&app, "acme", "k-2", 200).await;
    let body = reused.assert_problem(422, "idempotency-key-reused");
    // The starter's body code for the same situation, for clients that read it.
    assert_eq!(body["code"], idempotency_axum::KEY_CONFLICT_CODE);
    assert_eq!(body["code"], "IDEMPOTENCY_KEY_CONFLICT");
    assert!(
        body["detail"]
            .as_str()
            .unwrap()
            .contains("different request payload")
    );
    assert!(!reused.is_replay());
    assert_eq!(count(&pool, "payments").await, 1);
}

/// Technical failure: a bare 500 that leaks nothing; nothing stored; a retry runs again.
#[tokio::test]
async fn technical_failure_is_500_and_stores_nothing() {
    let (pool, app, hooks) = setup().await;
    hooks.fail_next.store(true, Ordering::SeqCst);
    let failed = pay(&app, "acme", "k-3", 100).await;
    let body = failed.assert_problem(500, "internal-error");
    let text = failed.text();
    for leak in ["boom", "hunter2", "db.internal", "password"] {
        assert!(!text.contains(leak), "{leak} leaked: {text}");
    }
    assert_eq!(body.get("detail"), None);
    assert_eq!(
        count(&pool, "payments").await,
        0,
        "business row rolled back"
    );
    assert_eq!(
        count(&pool, "idempotency_records").await,
        0,
        "no record kept"
    );

    let retry = pay(&app, "acme", "k-3", 100).await;
    assert_eq!(retry.status, 201, "{}", retry.text());
    assert!(!retry.is_replay(), "the retry ran the action");
    assert!(pay(&app, "acme", "k-3", 100).await.is_replay());
    assert_eq!(count(&pool, "payments").await, 1);
}

/// Sends a request that holds its key inside the action until released; returns once it is
/// inside (the key's record is inserted and locked by its open transaction).
async fn hold_key(app: &Router, hooks: &Arc<Hooks>, key: &str) -> tokio::task::JoinHandle<Reply> {
    hooks.hold_next.store(true, Ordering::SeqCst);
    let (app2, key) = (app.clone(), key.to_owned());
    let first = tokio::spawn(async move { pay(&app2, "acme", &key, 100).await });
    tokio::time::timeout(Duration::from_secs(10), hooks.entered.notified())
        .await
        .expect("the first request never reached its action");
    first
}

/// Still in flight, reject policy: 409 `request-in-flight` with `Retry-After`, at once.
#[tokio::test]
async fn in_flight_with_reject_policy_is_409_with_retry_after() {
    let config = ServiceOptions {
        in_flight: InFlightPolicy::Reject,
        ..ServiceOptions::default()
    };
    let (pool, app, hooks) = setup_with(config).await;
    let first = hold_key(&app, &hooks, "k-4").await;

    let busy = pay(&app, "acme", "k-4", 100).await;
    busy.assert_problem(409, "request-in-flight");
    assert_eq!(busy.header("retry-after"), Some("1"));

    hooks.release.notify_one();
    let first = first.await.unwrap();
    assert_eq!(first.status, 201);
    let replay = pay(&app, "acme", "k-4", 100).await;
    assert!(replay.is_replay());
    assert_eq!(replay.body, first.body);
    assert_eq!(count(&pool, "payments").await, 1);
}

/// Still in flight, wait policy whose budget runs out: 409 `request-in-flight` after the wait.
#[tokio::test]
async fn in_flight_wait_timeout_is_409_with_retry_after() {
    let budget = Duration::from_millis(300);
    let config = ServiceOptions {
        in_flight: InFlightPolicy::Wait {
            timeout: Some(budget),
        },
        ..ServiceOptions::default()
    };
    let (pool, app, hooks) = setup_with(config).await;
    let first = hold_key(&app, &hooks, "k-5").await;

    let started = Instant::now();
    let busy = pay(&app, "acme", "k-5", 100).await;
    busy.assert_problem(409, "request-in-flight");
    assert_eq!(busy.header("retry-after"), Some("1"));
    assert!(
        started.elapsed() >= budget,
        "answered before the wait budget"
    );

    hooks.release.notify_one();
    assert_eq!(first.await.unwrap().status, 201);
    assert_eq!(count(&pool, "payments").await, 1);
}

/// Fail-fast cache failure: 503 `cache-unavailable` with `Retry-After`; nothing ran.
#[tokio::test]
async fn fail_fast_cache_failure_is_503() {
    let (pool, store) = database().await;
    let service = IdempotencyService::builder(store)
        .distributed_cache(FailingCache)
        .build();
    let (app, _) = router(service);
    let reply = pay(&app, "acme", "k-6", 100).await;
    reply.assert_problem(503, "cache-unavailable");
    assert_eq!(reply.header("retry-after"), Some("5"));
    assert!(!reply.text().contains("10.0.0.7"), "cache address leaked");
    assert_eq!(count(&pool, "payments").await, 0);
    assert_eq!(count(&pool, "idempotency_records").await, 0);
}

/// The store cannot be reached: 503 `store-unavailable` with `Retry-After`.
#[tokio::test]
async fn unreachable_store_is_503() {
    // Port 1: nothing listens there.
    let pool = sqlx::postgres::PgPoolOptions::new()
        .acquire_timeout(Duration::from_secs(2))
        .connect_lazy("postgres://postgres@127.0.0.1:1/test")
        .unwrap();
    let (app, _) = router(IdempotencyService::builder(PgStore::new(pool)).build());
    let reply = pay(&app, "acme", "k-7", 100).await;
    reply.assert_problem(503, "store-unavailable");
    assert_eq!(reply.header("retry-after"), Some("5"));
    assert!(!reply.text().contains("127.0.0.1"), "address leaked");
}

/// One tenant never receives another's stored response for the same key.
#[tokio::test]
async fn same_key_in_two_tenants_runs_twice_and_never_crosses() {
    let (pool, app, _) = setup().await;
    let a = pay(&app, "tenant-a", "shared-key", 100).await;
    let b = pay(&app, "tenant-b", "shared-key", 100).await;
    assert_eq!(
        (a.status, b.status),
        (StatusCode::CREATED, StatusCode::CREATED)
    );
    assert!(!b.is_replay(), "B must not get a replay of A");
    assert_ne!(a.body, b.body);
    assert_eq!(a.json()["tenant"], "tenant-a");
    assert_eq!(b.json()["tenant"], "tenant-b");
    assert_ne!(a.json()["id"], b.json()["id"]);

    let a2 = pay(&app, "tenant-a", "shared-key", 100).await;
    let b2 = pay(&app, "tenant-b", "shared-key", 100).await;
    assert!(a2.is_replay() && b2.is_replay());
    assert_eq!(a2.body, a.body);
    assert_eq!(b2.body, b.body);
    assert_eq!(count(&pool, "payments").await, 2);
    assert_eq!(count(&pool, "idempotency_records").await, 2);
}

/// UUID endpoint: differently spelled UUIDs are one key; a non-UUID is refused before any I/O.
#[tokio::test]
async fn uuid_keys_are_normalized_before_the_lookup() {
    let (pool, app, _) = setup().await;
    let uuid = "8e03978e-40d5-43e8-bc93-6894a57f9324";
    let body = json!({"amountCents": 4900});
    let charge = async |key: &str| {
        send(
            &app,
            Method::POST,
            "/charges",
            &[("idempotency-key", key.as_bytes())],
            Some(&body),
        )
        .await
    };
    let first = charge(&uuid.to_uppercase()).await;
    assert_eq!(first.status, 201, "{}", first.text());
    let replay = charge(&format!("\"{uuid}\"")).await;
    assert!(replay.is_replay());
    assert_eq!(replay.body, first.body);
    charge("charge-1").await.assert_invalid_key("not-uuid");
    let missing = send(&app, Method::POST, "/charges", &[], Some(&body)).await;
    missing.assert_problem(400, "idempotency-key-missing");
    assert_eq!(count(&pool, "payments").await, 1);
    assert_eq!(count(&pool, "idempotency_records").await, 1);
}
