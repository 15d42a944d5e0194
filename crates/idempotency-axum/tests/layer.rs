//! The HTTP contract through `IdempotencyLayer` in transactional mode, on a real PostgreSQL
//! (an isolated schema from `idempotency_testing::pg_pool()`) and on SQLite (a fresh file),
//! through `oneshot`. Every case runs on both stores.

#![allow(clippy::unwrap_used)] // tests fail loudly on unexpected errors

mod support;

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderValue, Method, Request, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use http_body_util::BodyExt;
use idempotency_axum::{IdempotencyLayer, IdempotentTx, SharedScope, StoredStatuses, TenantHeader};
use idempotency_core::{
    IdempotencyService, IdempotencyStore, InFlightPolicy, ResultSerializer, SerializationError,
    ServiceOptions,
};
use idempotency_pg::PgStore;
use idempotency_pg::sqlx;
use idempotency_sqlite::SqliteStore;
use serde::Deserialize;
use support::Reply;
use tokio::sync::Notify;
use tower::ServiceExt;

/// A store the tests run on, with the one business statement they need.
trait Backend: IdempotencyStore + Clone {
    /// A fresh store with its records table and a `payments` table, and what removes it.
    fn fresh() -> impl Future<Output = (Self, Cleanup)> + Send;
    /// Inserts a payment on the handler's connection; returns its id.
    fn insert_payment(
        conn: &mut Self::Connection,
        tenant: &str,
        amount: i64,
    ) -> impl Future<Output = i64> + Send;
    /// `SELECT count(*) FROM {table}`, outside any transaction.
    fn count(&self, table: &str) -> impl Future<Output = i64> + Send;
    /// Every stored payload and status of the records table, as text.
    fn records(&self) -> impl Future<Output = Vec<(String, Option<String>)>> + Send;
    /// Replaces every stored payload sealed by [`Sealing`] by the text inside its seal.
    fn unseal_stored(&self) -> impl Future<Output = ()> + Send;
}

/// Removes a test's SQLite files when dropped (nothing for PostgreSQL: its schema is dropped
/// by `idempotency_testing` once stale).
struct Cleanup(Option<std::path::PathBuf>);

impl Drop for Cleanup {
    fn drop(&mut self) {
        if let Some(path) = &self.0 {
            for suffix in ["", "-wal", "-shm"] {
                let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
            }
        }
    }
}

impl Backend for PgStore {
    async fn fresh() -> (Self, Cleanup) {
        let pool = idempotency_testing::pg_pool().await;
        let store = PgStore::new(pool.clone());
        store.create_schema().await.unwrap();
        sqlx::raw_sql("CREATE TABLE payments (id bigserial PRIMARY KEY, tenant text NOT NULL, amount bigint NOT NULL)")
            .execute(&pool)
            .await
            .unwrap();
        (store, Cleanup(None))
    }
    async fn insert_payment(conn: &mut Self::Connection, tenant: &str, amount: i64) -> i64 {
        sqlx::query_scalar("INSERT INTO payments (tenant, amount) VALUES ($1, $2) RETURNING id")
            .bind(tenant)
            .bind(amount)
            .fetch_one(conn)
            .await
            .unwrap()
    }
    async fn count(&self, table: &str) -> i64 {
        sqlx::query_scalar(sqlx::AssertSqlSafe(format!("SELECT count(*) FROM {table}")))
            .fetch_one(self.pool())
            .await
            .unwrap()
    }
    async fn records(&self) -> Vec<(String, Option<String>)> {
        sqlx::query_as("SELECT status, result_payload::text FROM idempotency_records")
            .fetch_all(self.pool())
            .await
            .unwrap()
    }
    async fn unseal_stored(&self) {
        sqlx::query(
            "UPDATE idempotency_records SET result_payload = (result_payload ->> 'sealed')::json",
        )
        .execute(self.pool())
        .await
        .unwrap();
    }
}

impl Backend for SqliteStore {
    async fn fresh() -> (Self, Cleanup) {
        let path =
            std::env::temp_dir().join(format!("{}.db", idempotency_testing::unique_name("layer")));
        let mut config = idempotency_core::config::PersistenceConfig::default();
        config.schema.mode = idempotency_core::config::SchemaMode::Create;
        let store = SqliteStore::connect(path.to_str().unwrap(), &config)
            .await
            .unwrap();
        sqlx::raw_sql("CREATE TABLE payments (id INTEGER PRIMARY KEY, tenant TEXT NOT NULL, amount INTEGER NOT NULL)")
            .execute(store.pool())
            .await
            .unwrap();
        (store, Cleanup(Some(path)))
    }
    async fn insert_payment(conn: &mut Self::Connection, tenant: &str, amount: i64) -> i64 {
        sqlx::query_scalar("INSERT INTO payments (tenant, amount) VALUES (?, ?) RETURNING id")
            .bind(tenant)
            .bind(amount)
            .fetch_one(conn)
            .await
            .unwrap()
    }
    async fn count(&self, table: &str) -> i64 {
        sqlx::query_scalar(sqlx::AssertSqlSafe(format!("SELECT count(*) FROM {table}")))
            .fetch_one(self.pool())
            .await
            .unwrap()
    }
    async fn records(&self) -> Vec<(String, Option<String>)> {
        sqlx::query_as("SELECT status, result_payload FROM idempotency_records")
            .fetch_all(self.pool())
            .await
            .unwrap()
    }
    async fn unseal_stored(&self) {
        sqlx::query(
            "UPDATE idempotency_records SET result_payload = json_extract(result_payload, '$.sealed')",
        )
        .execute(self.pool())
        .await
        .unwrap();
    }
}

#[derive(Debug, Deserialize)]
struct CreatePayment {
    amount: i64,
    #[serde(default)]
    mode: String,
}

/// Hooks the tests use to steer the handler.
#[derive(Default)]
struct Hooks {
    /// The next `hold` payment signals `entered`, then waits for `release`.
    entered: Notify,
    release: Notify,
    /// `fail` payments fail with 500 while this is set.
    failing: AtomicBool,
}

/// The handler a user writes: no idempotency code, its statements on the layer's transaction.
async fn create_payment<B: Backend>(
    State(hooks): State<Arc<Hooks>>,
    mut tx: IdempotentTx<B>,
    headers: axum::http::HeaderMap,
    Json(body): Json<CreatePayment>,
) -> Response {
    let tenant = headers["x-tenant-id"].to_str().unwrap().to_owned();
    if body.amount > 1000 {
        return (
            StatusCode::UNPROCESSABLE_ENTITY,
            [(header::CONTENT_TYPE, "application/problem+json")],
            r#"{"type":"about:blank","status":422,"code":"INSUFFICIENT_FUNDS"}"#,
        )
            .into_response();
    }
    let id = B::insert_payment(&mut tx, &tenant, body.amount).await;
    match body.mode.as_str() {
        "hold" => {
            hooks.entered.notify_one();
            hooks.release.notified().await;
        }
        "fail" if hooks.failing.load(Ordering::SeqCst) => {
            return (StatusCode::INTERNAL_SERVER_ERROR, "boom").into_response();
        }
        "busy" => return (StatusCode::CONFLICT, "busy").into_response(),
        "stream" => {
            let chunks = futures_util::stream::iter([Ok::<_, std::io::Error>(Bytes::from("a"))]);
            return (StatusCode::CREATED, Body::from_stream(chunks)).into_response();
        }
        "big" => return (StatusCode::CREATED, "x".repeat(4096)).into_response(),
        _ => {}
    }
    // Keys deliberately not sorted, and credentials among the headers.
    let body = format!(
        r#"{{"zeta":1,"id":{id},"alpha":"{tenant}","amount":{}}}"#,
        body.amount
    );
    (
        StatusCode::CREATED,
        [
            (header::CONTENT_TYPE, "application/json".to_owned()),
            (header::LOCATION, format!("/payments/{id}")),
            (header::SET_COOKIE, "session=s3cr3t".to_owned()),
            (
                header::HeaderName::from_static("x-api-key"),
                "k-s3cr3t".to_owned(),
            ),
            (
                header::HeaderName::from_static("x-request-id"),
                uuid::Uuid::now_v7().to_string(),
            ),
        ],
        body,
    )
        .into_response()
}

/// A handler that does not take the transaction.
async fn echo(body: Bytes) -> (StatusCode, [(header::HeaderName, &'static str); 1], Bytes) {
    (StatusCode::OK, [(header::CONTENT_TYPE, "text/plain")], body)
}

fn app<B: Backend>(store: B, config: ServiceOptions) -> (Router, Arc<Hooks>) {
    let hooks = Arc::new(Hooks::default());
    hooks.failing.store(true, Ordering::SeqCst);
    let service = IdempotencyService::builder(store).config(config).build();
    let layer = IdempotencyLayer::new(service)
        .scope::<TenantHeader>()
        .max_request_body(1024)
        .max_response_body(1024);
    let app = Router::new()
        .route("/payments", post(create_payment::<B>))
        .route("/echo", post(echo))
        .route_layer(layer)
        .with_state(Arc::clone(&hooks));
    (app, hooks)
}

fn config(in_flight: InFlightPolicy) -> ServiceOptions {
    ServiceOptions {
        in_flight,
        ..ServiceOptions::default()
    }
}

async fn call(app: &Router, uri: &str, headers: &[(&str, &str)], body: &str) -> Reply {
    let mut request = Request::builder().method(Method::POST).uri(uri);
    for (name, value) in headers {
        request = request.header(*name, HeaderValue::from_str(value).unwrap());
    }
    let request = request
        .header("content-type", "application/json")
        .body(Body::from(body.to_owned()))
        .unwrap();
    let response = app.clone().oneshot(request).await.unwrap();
    let (parts, body) = response.into_parts();
    Reply {
        status: parts.status,
        headers: parts.headers,
        body: body.collect().await.unwrap().to_bytes(),
    }
}

async fn pay(app: &Router, key: &str, tenant: &str, body: &str) -> Reply {
    call(
        app,
        "/payments",
        &[("idempotency-key", key), ("x-tenant-id", tenant)],
        body,
    )
    .await
}

async fn missing_and_invalid_keys_are_refused_before_anything_runs<B: Backend>() {
    let (store, _cleanup) = B::fresh().await;
    let (app, _) = app(store.clone(), ServiceOptions::default());
    let body = r#"{"amount": 10}"#;
    call(&app, "/payments", &[("x-tenant-id", "t")], body)
        .await
        .assert_problem(400, "idempotency-key-missing");
    pay(&app, "has space", "t", body)
        .await
        .assert_invalid_key("invalid-character");
    pay(&app, r#""a", "b""#, "t", body)
        .await
        .assert_invalid_key("list");
    call(
        &app,
        "/payments",
        &[
            ("idempotency-key", "a"),
            ("idempotency-key", "b"),
            ("x-tenant-id", "t"),
        ],
        body,
    )
    .await
    .assert_invalid_key("repeated");
    call(&app, "/payments", &[("idempotency-key", "k")], body)
        .await
        .assert_problem(403, "scope-missing");
    assert_eq!(store.count("payments").await, 0);
    assert_eq!(store.count("idempotency_records").await, 0);
}

async fn a_replay_is_byte_identical_and_runs_nothing<B: Backend>() {
    let (store, _cleanup) = B::fresh().await;
    let (app, _) = app(store.clone(), ServiceOptions::default());
    let first = pay(&app, "k-1", "t", r#"{"mode":"","amount":10}"#).await;
    assert_eq!(first.status, StatusCode::CREATED, "{}", first.text());
    assert!(!first.is_replay());
    assert!(
        first.text().starts_with(r#"{"zeta":1,"id":"#),
        "{}",
        first.text()
    );
    // The same request spelled differently (order, spaces, number form) is the same request.
    for body in [
        r#"{"mode":"","amount":10}"#,
        r#"{ "amount" : 1e1, "mode": "" }"#,
    ] {
        let replay = pay(&app, "k-1", "t", body).await;
        assert_eq!(replay.status, first.status);
        assert_eq!(replay.body, first.body, "byte for byte");
        assert!(replay.is_replay());
        for name in ["content-type", "location"] {
            assert_eq!(replay.header(name), first.header(name), "{name}");
        }
        for name in ["set-cookie", "x-api-key", "x-request-id"] {
            assert!(first.header(name).is_some(), "{name} on the first answer");
            assert_eq!(replay.header(name), None, "{name} is not replayed");
        }
    }
    assert_eq!(store.count("payments").await, 1);
    let records = store.records().await;
    assert_eq!(records.len(), 1);
    assert_eq!(records[0].0, "COMPLETED");
    let payload = records[0].1.clone().unwrap();
    assert!(
        !payload.contains("s3cr3t"),
        "credentials never stored: {payload}"
    );
}

async fn another_payload_under_the_same_key_is_422<B: Backend>() {
    let (store, _cleanup) = B::fresh().await;
    let (app, _) = app(store.clone(), ServiceOptions::default());
    assert_eq!(pay(&app, "k", "t", r#"{"amount": 10}"#).await.status, 201);
    let reused = pay(&app, "k", "t", r#"{"amount": 11}"#)
        .await
        .assert_problem(422, "idempotency-key-reused");
    assert_eq!(reused["code"], "IDEMPOTENCY_KEY_CONFLICT");
    // The route is part of the request: the same key on another route is another operation.
    let echo = call(
        &app,
        "/echo",
        &[("idempotency-key", "k"), ("x-tenant-id", "t")],
        "{}",
    )
    .await;
    assert_eq!(echo.status, 200);
    assert_eq!(store.count("payments").await, 1);
}

async fn a_stored_rejection_replays_identically<B: Backend>() {
    let (store, _cleanup) = B::fresh().await;
    let (app, _) = app(store.clone(), ServiceOptions::default());
    let first = pay(&app, "k", "t", r#"{"amount": 5000}"#).await;
    assert_eq!(first.status, 422);
    let replay = pay(&app, "k", "t", r#"{"amount": 5000}"#).await;
    assert_eq!((replay.status, &replay.body), (first.status, &first.body));
    assert!(replay.is_replay());
    assert_eq!(
        replay.header("content-type"),
        Some("application/problem+json")
    );
    assert_eq!(store.records().await[0].0, "REJECTED");
}

async fn a_5xx_is_rolled_back_with_the_handlers_writes_and_the_retry_runs<B: Backend>() {
    let (store, _cleanup) = B::fresh().await;
    let (app, hooks) = app(store.clone(), ServiceOptions::default());
    let body = r#"{"amount": 10, "mode": "fail"}"#;
    let failed = pay(&app, "k", "t", body).await;
    assert_eq!(
        (failed.status.as_u16(), failed.text().as_str()),
        (500, "boom")
    );
    assert_eq!(
        store.count("payments").await,
        0,
        "the handler's insert rolled back"
    );
    assert_eq!(store.count("idempotency_records").await, 0);
    hooks.failing.store(false, Ordering::SeqCst);
    let retry = pay(&app, "k", "t", body).await;
    assert_eq!(retry.status, 201);
    assert!(!retry.is_replay());
    assert_eq!(store.count("payments").await, 1);
}

async fn a_409_is_not_stored<B: Backend>() {
    let (store, _cleanup) = B::fresh().await;
    let (app, _) = app(store.clone(), ServiceOptions::default());
    let busy = pay(&app, "k", "t", r#"{"amount": 10, "mode": "busy"}"#).await;
    assert_eq!(busy.status, 409);
    assert_eq!(store.count("payments").await, 0);
    assert_eq!(store.count("idempotency_records").await, 0);
}

async fn responses_that_cannot_be_stored_leave_nothing<B: Backend>() {
    let (store, _cleanup) = B::fresh().await;
    let (app, _) = app(store.clone(), ServiceOptions::default());
    for (key, mode) in [("k-stream", "stream"), ("k-big", "big")] {
        let body = format!(r#"{{"amount": 10, "mode": "{mode}"}}"#);
        pay(&app, key, "t", &body)
            .await
            .assert_problem(500, "internal-error");
    }
    assert_eq!(store.count("payments").await, 0);
    assert_eq!(store.count("idempotency_records").await, 0);
}

async fn a_request_body_over_the_limit_is_413<B: Backend>() {
    let (store, _cleanup) = B::fresh().await;
    let (app, _) = app(store.clone(), ServiceOptions::default());
    let body = format!(r#"{{"amount": 10, "mode": "{}"}}"#, "x".repeat(2000));
    pay(&app, "k", "t", &body)
        .await
        .assert_problem(413, "payload-too-large");
    assert_eq!(store.count("idempotency_records").await, 0);
}

async fn tenants_are_isolated<B: Backend>() {
    let (store, _cleanup) = B::fresh().await;
    let (app, _) = app(store.clone(), ServiceOptions::default());
    let a = pay(&app, "shared", "tenant-a", r#"{"amount": 10}"#).await;
    let b = pay(&app, "shared", "tenant-b", r#"{"amount": 10}"#).await;
    assert_eq!(
        (a.status, b.status),
        (StatusCode::CREATED, StatusCode::CREATED)
    );
    assert!(!b.is_replay());
    assert_ne!(a.json()["id"], b.json()["id"]);
    assert_eq!(store.count("payments").await, 2);
}

async fn a_handler_without_the_transaction_still_records_and_replays<B: Backend>() {
    let (store, _cleanup) = B::fresh().await;
    let (app, _) = app(store.clone(), ServiceOptions::default());
    let headers = [("idempotency-key", "k"), ("x-tenant-id", "t")];
    let first = call(&app, "/echo", &headers, r#"{"b":1,"a":2}"#).await;
    assert_eq!(
        (first.status, first.text().as_str()),
        (StatusCode::OK, r#"{"b":1,"a":2}"#)
    );
    let replay = call(&app, "/echo", &headers, r#"{"a":2,"b":1}"#).await;
    assert!(replay.is_replay());
    assert_eq!(replay.body, first.body);
    assert_eq!(replay.header("content-type"), Some("text/plain"));
    assert_eq!(store.count("idempotency_records").await, 1);
}

/// A duplicate of a request in flight: 409 with `Retry-After` under the reject policy (on
/// PostgreSQL; SQLite's writers queue on its write lock), a replay under the wait policy.
async fn a_duplicate_in_flight_waits_or_is_refused<B: Backend>(reject: bool) {
    let (store, _cleanup) = B::fresh().await;
    let policy = if reject {
        InFlightPolicy::Reject
    } else {
        InFlightPolicy::Wait {
            timeout: Some(Duration::from_secs(10)),
        }
    };
    let (app, hooks) = app(store.clone(), config(policy));
    let body = r#"{"amount": 10, "mode": "hold"}"#;
    let holder = tokio::spawn({
        let app = app.clone();
        async move { pay(&app, "k", "t", body).await }
    });
    hooks.entered.notified().await;
    let duplicate = tokio::spawn({
        let app = app.clone();
        async move { pay(&app, "k", "t", body).await }
    });
    if reject {
        let duplicate = duplicate.await.unwrap();
        duplicate.assert_problem(409, "request-in-flight");
        assert_eq!(duplicate.header("retry-after"), Some("1"));
        hooks.release.notify_one();
        assert_eq!(holder.await.unwrap().status, 201);
    } else {
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(
            !duplicate.is_finished(),
            "the duplicate waits for the holder"
        );
        hooks.release.notify_one();
        let first = holder.await.unwrap();
        let duplicate = duplicate.await.unwrap();
        assert_eq!(first.status, 201);
        assert!(duplicate.is_replay());
        assert_eq!(duplicate.body, first.body);
    }
    assert_eq!(store.count("payments").await, 1);
}

async fn idempotent_tx_without_the_layer_is_a_500<B: Backend>() {
    let app = Router::new()
        .route("/payments", post(create_payment::<B>))
        .with_state(Arc::new(Hooks::default()));
    pay(&app, "k", "t", r#"{"amount": 10}"#)
        .await
        .assert_problem(500, "internal-error");
}

async fn the_stored_status_policy_is_configurable<B: Backend>() {
    let (store, _cleanup) = B::fresh().await;
    let service = IdempotencyService::new(store.clone());
    let layer = IdempotencyLayer::new(service)
        .scope::<TenantHeader>()
        .stored_statuses(StoredStatuses::default().skip(StatusCode::UNPROCESSABLE_ENTITY));
    let app = Router::new()
        .route("/payments", post(create_payment::<B>))
        .route_layer(layer)
        .with_state(Arc::new(Hooks::default()));
    assert_eq!(pay(&app, "k", "t", r#"{"amount": 5000}"#).await.status, 422);
    assert_eq!(store.count("idempotency_records").await, 0);
}

/// Changing the fingerprint algorithm: a retry of a key stored with the old one is a 422
/// unless the layer also accepts the old one (`JcsFingerprint::accepting`).
async fn a_changed_fingerprint_algorithm_replays_while_the_previous_is_accepted<B: Backend>() {
    use idempotency_core::{HashAlgorithm, JcsFingerprint};
    let (store, _cleanup) = B::fresh().await;
    let with = |strategy: JcsFingerprint| {
        let service = IdempotencyService::new(store.clone());
        Router::new().route("/echo", post(echo)).route_layer(
            IdempotencyLayer::new(service)
                .scope::<SharedScope>()
                .fingerprint(strategy),
        )
    };
    let headers = [("idempotency-key", "fp-1")];
    let before = with(JcsFingerprint::default());
    let first = call(&before, "/echo", &headers, r#"{"n":1}"#).await;
    assert_eq!(first.status, StatusCode::OK);

    let switched = with(JcsFingerprint::new(HashAlgorithm::Sha512));
    let refused = call(&switched, "/echo", &headers, r#"{"n":1}"#).await;
    assert_eq!(refused.status, StatusCode::UNPROCESSABLE_ENTITY);

    let transition =
        with(JcsFingerprint::new(HashAlgorithm::Sha512).accepting(HashAlgorithm::Sha256));
    let replayed = call(&transition, "/echo", &headers, r#"{"n":1}"#).await;
    assert_eq!(replayed.status, StatusCode::OK);
    assert_eq!(replayed.headers["idempotent-replayed"], "true");
    assert_eq!(replayed.body, first.body);
    // A layer given no strategy uses the service's.
    let service = IdempotencyService::builder(store.clone())
        .fingerprint(JcsFingerprint::new(HashAlgorithm::Sha512).accepting(HashAlgorithm::Sha256))
        .build();
    let from_service = Router::new()
        .route("/echo", post(echo))
        .route_layer(IdempotencyLayer::new(service).scope::<SharedScope>());
    let replayed = call(&from_service, "/echo", &headers, r#"{"n":1}"#).await;
    assert_eq!(replayed.headers["idempotent-replayed"], "true");
    let fresh = call(
        &from_service,
        "/echo",
        &[("idempotency-key", "fp-2")],
        r#"{"n":1}"#,
    )
    .await;
    assert_eq!(fresh.status, StatusCode::OK);
    let id = idempotency_core::RecordId::new(
        idempotency_core::Operation::new("POST:/echo").unwrap(),
        idempotency_core::Scope::default(),
        idempotency_core::IdempotencyKey::new("fp-2").unwrap(),
    );
    let record = store.lookup(&id).await.unwrap().unwrap();
    assert_eq!(
        record.fingerprint.as_str().len(),
        128,
        "stored with the service's SHA-512"
    );
    let other = call(&transition, "/echo", &headers, r#"{"n":2}"#).await;
    assert_eq!(
        other.status,
        StatusCode::UNPROCESSABLE_ENTITY,
        "another payload stays a conflict"
    );
}

/// A serializer that seals what it stores (as an encrypting or signing one would: the JSON
/// inside an envelope) and reads back only what it sealed.
#[derive(Debug, Clone, Copy)]
struct Sealing;

impl ResultSerializer for Sealing {
    fn serialize<T: serde::Serialize + ?Sized>(
        &self,
        value: &T,
    ) -> Result<String, SerializationError> {
        let inner = serde_json::to_string(value).map_err(SerializationError::Serialize)?;
        serde_json::to_string(&serde_json::json!({ "sealed": inner }))
            .map_err(SerializationError::Serialize)
    }

    fn deserialize<T: serde::de::DeserializeOwned>(
        &self,
        stored: &str,
    ) -> Result<T, SerializationError> {
        let envelope: serde_json::Value =
            serde_json::from_str(stored).map_err(SerializationError::Deserialize)?;
        let inner = envelope["sealed"]
            .as_str()
            .ok_or_else(|| SerializationError::Custom("not sealed".to_owned()))?;
        serde_json::from_str(inner).map_err(SerializationError::Deserialize)
    }
}

/// The layer stores responses with the service's serializer and reads them back with it: a
/// record holds the sealed text, replays open it, and a record whose seal was taken off in the
/// database is not replayed (before: the layer wrote and read plain JSON whatever serializer
/// the service had, so a service configured to encrypt or sign its records stored responses
/// in the clear, and replayed an altered record without the check).
async fn responses_are_stored_with_the_services_serializer<B>()
where
    B: Backend + idempotency_core::store::InsertCompleted + idempotency_core::lease::LeasedClaims,
{
    let (store, _cleanup) = B::fresh().await;
    let service = IdempotencyService::builder(store.clone())
        .serializer(Sealing)
        .build();
    let layer = IdempotencyLayer::new(service).scope::<TenantHeader>();
    let routes = || Router::new().route("/payments", post(create_payment::<B>));
    let state = Arc::new(Hooks::default());
    // Each mode stores through its own path: transactional, leased (its handler has no
    // transaction: its effect is outside the database), optimistic.
    let apps = [
        (
            "transactional",
            routes()
                .route_layer(layer.clone())
                .with_state(Arc::clone(&state)),
        ),
        (
            "leased",
            Router::new()
                .route("/payments", post(external_payment))
                .route_layer(layer.clone().leased(Duration::from_secs(60))),
        ),
        (
            "optimistic",
            routes()
                .route_layer(layer.optimistic())
                .with_state(Arc::clone(&state)),
        ),
    ];
    let body = r#"{"amount":10}"#;
    let mut firsts = Vec::new();
    for (mode, app) in &apps {
        let key = format!("k-sealed-{mode}");
        let first = pay(app, &key, "t", body).await;
        assert_eq!(
            first.status,
            StatusCode::CREATED,
            "{mode}: {}",
            first.text()
        );
        let replay = pay(app, &key, "t", body).await;
        assert!(replay.is_replay(), "{mode}");
        assert_eq!(
            (replay.status, &replay.body),
            (first.status, &first.body),
            "{mode}"
        );
        let rejected_key = format!("k-sealed-422-{mode}");
        let rejected = pay(app, &rejected_key, "t", r#"{"amount":5000}"#).await;
        assert_eq!(rejected.status, StatusCode::UNPROCESSABLE_ENTITY, "{mode}");
        let again = pay(app, &rejected_key, "t", r#"{"amount":5000}"#).await;
        assert!(again.is_replay(), "{mode}");
        assert_eq!(again.body, rejected.body, "{mode}");
        firsts.push(key);
    }
    for (status, payload) in store.records().await {
        let payload = payload.unwrap_or_default();
        assert!(payload.starts_with(r#"{"sealed":"#), "{status}: {payload}");
    }

    store.unseal_stored().await;
    for ((mode, app), key) in apps.iter().zip(&firsts) {
        let unsealed = pay(app, key, "t", body).await;
        assert_eq!(unsealed.status, StatusCode::INTERNAL_SERVER_ERROR, "{mode}");
        assert!(!unsealed.is_replay(), "{mode}");
    }
    assert_eq!(store.count("payments").await, 2, "nothing ran again");
}

/// A payment whose effect is outside the database (leased mode's kind of handler): 201, or 422
/// above 1000.
async fn external_payment(Json(body): Json<CreatePayment>) -> Response {
    if body.amount > 1000 {
        return (
            StatusCode::UNPROCESSABLE_ENTITY,
            [(header::CONTENT_TYPE, "application/problem+json")],
            r#"{"type":"about:blank","status":422,"code":"INSUFFICIENT_FUNDS"}"#,
        )
            .into_response();
    }
    let id = uuid::Uuid::now_v7();
    (
        StatusCode::CREATED,
        [(header::CONTENT_TYPE, "application/json")],
        format!(r#"{{"id":"{id}","amount":{}}}"#, body.amount),
    )
        .into_response()
}

macro_rules! on {
    ($store:ty, $($name:ident $(($arg:expr))?),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread")]
            async fn $name() {
                super::$name::<$store>($($arg)?).await;
            }
        )*
    };
}

macro_rules! every_case {
    ($store:ty) => {
        on!(
            $store,
            missing_and_invalid_keys_are_refused_before_anything_runs,
            a_replay_is_byte_identical_and_runs_nothing,
            another_payload_under_the_same_key_is_422,
            a_stored_rejection_replays_identically,
            a_5xx_is_rolled_back_with_the_handlers_writes_and_the_retry_runs,
            a_409_is_not_stored,
            responses_that_cannot_be_stored_leave_nothing,
            a_request_body_over_the_limit_is_413,
            tenants_are_isolated,
            a_handler_without_the_transaction_still_records_and_replays,
            idempotent_tx_without_the_layer_is_a_500,
            the_stored_status_policy_is_configurable,
            a_changed_fingerprint_algorithm_replays_while_the_previous_is_accepted,
            responses_are_stored_with_the_services_serializer,
        );
        #[tokio::test(flavor = "multi_thread")]
        async fn a_duplicate_in_flight_waits_for_the_holder_and_replays() {
            super::a_duplicate_in_flight_waits_or_is_refused::<$store>(false).await;
        }
    };
}

mod postgres {
    use super::*;
    every_case!(PgStore);

    #[tokio::test(flavor = "multi_thread")]
    async fn a_duplicate_in_flight_is_409_with_retry_after() {
        a_duplicate_in_flight_waits_or_is_refused::<PgStore>(true).await;
    }
}

mod sqlite {
    use super::*;
    every_case!(SqliteStore);
}
