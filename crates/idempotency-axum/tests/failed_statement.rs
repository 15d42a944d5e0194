//! A handler that catches a failed statement ("insert, catch the unique violation, answer
//! 422") gets its answer stored and replayed on every backend, in transactional mode. On
//! PostgreSQL the failed statement aborts the transaction: the layer returns to the savepoint
//! it took before the handler, and stores the answer there.

#![allow(clippy::unwrap_used)] // tests fail loudly on unexpected errors

mod support;

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use axum::extract::State;
use axum::http::{Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use idempotency_axum::{IdempotencyLayer, IdempotentTx, SharedScope};
use idempotency_core::{
    Call, ExecutionResult, IdempotencyKey, IdempotencyService, IdempotencyStore, Operation,
    Outcome, RecordId, RecordStatus, Scope,
};
use idempotency_pg::{PgStore, sqlx};
use idempotency_sqlite::SqliteStore;
use serde::Deserialize;
use support::Reply;
use support::stores::Backend;

/// The business table: account names are unique.
trait Accounts: Backend {
    fn create_table(&self) -> impl Future<Output = ()> + Send;
    /// Inserts the account; `false` on a unique violation.
    fn insert(conn: &mut Self::Connection, name: &str) -> impl Future<Output = bool> + Send;
    fn count(&self) -> impl Future<Output = i64> + Send;
}

fn unique_violation(error: sqlx::Error) -> bool {
    match error {
        sqlx::Error::Database(e) if e.is_unique_violation() => false,
        other => panic!("unexpected error: {other}"),
    }
}

impl Accounts for PgStore {
    async fn create_table(&self) {
        sqlx::raw_sql(
            "CREATE TABLE accounts (name text PRIMARY KEY); INSERT INTO accounts VALUES ('taken')",
        )
        .execute(self.pool())
        .await
        .unwrap();
    }
    async fn insert(conn: &mut Self::Connection, name: &str) -> bool {
        sqlx::query("INSERT INTO accounts (name) VALUES ($1)")
            .bind(name)
            .execute(conn)
            .await
            .map_or_else(unique_violation, |_| true)
    }
    async fn count(&self) -> i64 {
        sqlx::query_scalar("SELECT count(*) FROM accounts")
            .fetch_one(self.pool())
            .await
            .unwrap()
    }
}

impl Accounts for SqliteStore {
    async fn create_table(&self) {
        sqlx::raw_sql(
            "CREATE TABLE accounts (name TEXT PRIMARY KEY); INSERT INTO accounts VALUES ('taken')",
        )
        .execute(self.pool())
        .await
        .unwrap();
    }
    async fn insert(conn: &mut Self::Connection, name: &str) -> bool {
        sqlx::query("INSERT INTO accounts (name) VALUES (?)")
            .bind(name)
            .execute(conn)
            .await
            .map_or_else(unique_violation, |_| true)
    }
    async fn count(&self) -> i64 {
        sqlx::query_scalar("SELECT count(*) FROM accounts")
            .fetch_one(self.pool())
            .await
            .unwrap()
    }
}

#[derive(Deserialize)]
struct NewAccount {
    name: String,
    /// Answer 201 even when the insert failed.
    #[serde(default)]
    anyway: bool,
}

async fn open_account<B: Accounts>(
    State(()): State<()>,
    mut tx: IdempotentTx<B>,
    Json(body): Json<NewAccount>,
) -> Response {
    if B::insert(&mut tx, &body.name).await || body.anyway {
        (StatusCode::CREATED, format!("opened {}", body.name)).into_response()
    } else {
        (StatusCode::UNPROCESSABLE_ENTITY, "NAME_TAKEN").into_response()
    }
}

async fn send(app: &Router, key: &str, name: &str) -> Reply {
    let body = serde_json::json!({ "name": name });
    let headers: [(&str, &[u8]); 1] = [("idempotency-key", key.as_bytes())];
    support::send(app, Method::POST, "/accounts", &headers, Some(&body)).await
}

async fn a_caught_failed_statement_is_stored_and_replayed<B: Accounts>() {
    let (store, _cleanup) = B::fresh().await;
    store.create_table().await;
    let app = Router::new()
        .route("/accounts", post(open_account::<B>))
        .route_layer(
            IdempotencyLayer::new(IdempotencyService::new(store.clone())).scope::<SharedScope>(),
        )
        .with_state(());
    let first = send(&app, "k1", "taken").await;
    assert_eq!(
        (first.status, first.text().as_str()),
        (StatusCode::UNPROCESSABLE_ENTITY, "NAME_TAKEN")
    );
    let retry = send(&app, "k1", "taken").await;
    assert!(retry.is_replay(), "the 422 was stored: {retry:?}");
    assert_eq!(retry.body, first.body);
    let id = RecordId::new(
        Operation::new("POST:/accounts").unwrap(),
        Scope::default(),
        IdempotencyKey::new("k1").unwrap(),
    );
    let record = store.lookup(&id).await.unwrap().unwrap();
    assert_eq!(record.status(), RecordStatus::Rejected);
    // The transaction is still the handler's on the happy path.
    let opened = send(&app, "k2", "fresh").await;
    assert_eq!(opened.status, StatusCode::CREATED);
    assert!(send(&app, "k2", "fresh").await.is_replay());
    assert_eq!(store.count().await, 2);
}

/// A handler that caught the failed statement and still answered 201 on PostgreSQL: the
/// aborted transaction lost its writes, so the 201 is not stored (before: stored after the
/// rollback to the savepoint, and replayed with none of the handler's writes committed).
async fn a_success_on_an_aborted_transaction_is_not_stored() {
    let (store, _cleanup) = PgStore::fresh().await;
    store.create_table().await;
    let app = Router::new()
        .route("/accounts", post(open_account::<PgStore>))
        .route_layer(
            IdempotencyLayer::new(IdempotencyService::new(store.clone())).scope::<SharedScope>(),
        )
        .with_state(());
    let body = serde_json::json!({ "name": "taken", "anyway": true });
    let headers: [(&str, &[u8]); 1] = [("idempotency-key", b"k1")];
    let first = support::send(&app, Method::POST, "/accounts", &headers, Some(&body)).await;
    assert_eq!(first.status, StatusCode::INTERNAL_SERVER_ERROR, "{first:?}");
    let id = RecordId::new(
        Operation::new("POST:/accounts").unwrap(),
        Scope::default(),
        IdempotencyKey::new("k1").unwrap(),
    );
    assert!(store.lookup(&id).await.unwrap().is_none());
}

/// Opens the account like `open_account`, after registering an after-commit hook that counts.
async fn open_account_with_a_hook(
    State(ran): State<Arc<AtomicUsize>>,
    mut tx: IdempotentTx<PgStore>,
    Json(body): Json<NewAccount>,
) -> Response {
    tx.tx().after_commit(async move {
        ran.fetch_add(1, Ordering::SeqCst);
    });
    open_account(State(()), tx, Json(body)).await
}

/// A hook the handler registered goes with the statements the rollback to the savepoint
/// undoes: the stored 422 runs none (before: the hook ran after the commit, for writes that
/// were rolled back). On the happy path it runs once.
async fn hooks_rolled_back_to_the_savepoint_do_not_run() {
    let (store, _cleanup) = PgStore::fresh().await;
    store.create_table().await;
    let ran = Arc::new(AtomicUsize::new(0));
    let app = Router::new()
        .route("/accounts", post(open_account_with_a_hook))
        .route_layer(
            IdempotencyLayer::new(IdempotencyService::new(store.clone())).scope::<SharedScope>(),
        )
        .with_state(Arc::clone(&ran));
    let rejected = send(&app, "k1", "taken").await;
    assert_eq!(rejected.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(ran.load(Ordering::SeqCst), 0, "the rolled-back hook ran");
    let opened = send(&app, "k2", "fresh").await;
    assert_eq!(opened.status, StatusCode::CREATED);
    assert_eq!(ran.load(Ordering::SeqCst), 1);
}

/// Opens the account like `open_account`; when the name is taken, first calls the service's
/// `execute_in` on the aborted transaction (an audit entry of its own), which fails.
async fn open_account_then_audit(
    State(service): State<IdempotencyService<PgStore>>,
    mut tx: IdempotentTx<PgStore>,
    Json(body): Json<NewAccount>,
) -> Response {
    if PgStore::insert(&mut tx, &body.name).await {
        return (StatusCode::CREATED, format!("opened {}", body.name)).into_response();
    }
    let audit = Call::new(
        "AUDIT",
        IdempotencyKey::new(format!("audit-{}", body.name)).unwrap(),
        &(),
    );
    let audited: Result<Outcome<()>, idempotency_core::Error> = service
        .execute_in(tx.tx(), audit, async |_conn| {
            Ok(ExecutionResult::success(()))
        })
        .await;
    assert!(audited.is_err(), "the transaction is aborted: {audited:?}");
    (StatusCode::UNPROCESSABLE_ENTITY, "NAME_TAKEN").into_response()
}

/// A store statement that failed in the handler (a nested `execute_in` on the aborted
/// transaction) went with the rollback to the savepoint: the 4xx is stored as any caught
/// failure's (before: the `Tx` stayed poisoned, its commit refused, 500).
async fn a_store_failure_rolled_back_to_the_savepoint_does_not_refuse_the_commit() {
    let (store, _cleanup) = PgStore::fresh().await;
    store.create_table().await;
    let service = IdempotencyService::new(store.clone());
    let app = Router::new()
        .route("/accounts", post(open_account_then_audit))
        .route_layer(IdempotencyLayer::new(service.clone()).scope::<SharedScope>())
        .with_state(service);
    let first = send(&app, "k1", "taken").await;
    assert_eq!(
        (first.status, first.text().as_str()),
        (StatusCode::UNPROCESSABLE_ENTITY, "NAME_TAKEN")
    );
    let retry = send(&app, "k1", "taken").await;
    assert!(retry.is_replay(), "the 422 was stored: {retry:?}");
}

/// Opens an account "first" with an after-commit hook, then takes a savepoint of its own
/// (`Tx::savepoint`) before opening the account asked for, which may be taken.
async fn open_two_accounts_past_a_savepoint_of_its_own(
    State((service, ran)): State<(IdempotencyService<PgStore>, Arc<AtomicUsize>)>,
    mut tx: IdempotentTx<PgStore>,
    Json(body): Json<NewAccount>,
) -> Response {
    assert!(PgStore::insert(&mut tx, "first").await);
    tx.tx().after_commit(async move {
        ran.fetch_add(1, Ordering::SeqCst);
    });
    tx.tx().savepoint(service.store()).await.unwrap();
    open_account(State(()), tx, Json(body)).await
}

/// A handler that took a savepoint of its own: the layer's rollback returns to the layer's
/// savepoint, not to the handler's, so the statements before the handler's savepoint go with
/// the hooks dropped for them (before: both savepoints had one name, the rollback landed on
/// the handler's, and the account "first" committed with the stored 422 while its hook was
/// dropped).
async fn the_rollback_returns_to_the_layers_savepoint_past_the_handlers() {
    let (store, _cleanup) = PgStore::fresh().await;
    store.create_table().await;
    let ran = Arc::new(AtomicUsize::new(0));
    let service = IdempotencyService::new(store.clone());
    let app = Router::new()
        .route(
            "/accounts",
            post(open_two_accounts_past_a_savepoint_of_its_own),
        )
        .route_layer(IdempotencyLayer::new(service.clone()).scope::<SharedScope>())
        .with_state((service, Arc::clone(&ran)));
    let rejected = send(&app, "k1", "taken").await;
    assert_eq!(
        rejected.status,
        StatusCode::UNPROCESSABLE_ENTITY,
        "{rejected:?}"
    );
    assert_eq!(
        store.count().await,
        1,
        "only the account \"taken\": \"first\" went with the 422's rollback"
    );
    assert_eq!(ran.load(Ordering::SeqCst), 0);
    assert!(send(&app, "k1", "taken").await.is_replay());
    let opened = send(&app, "k2", "fresh").await;
    assert_eq!(opened.status, StatusCode::CREATED, "{opened:?}");
    assert_eq!(store.count().await, 3);
    assert_eq!(ran.load(Ordering::SeqCst), 1);
}

mod postgres {
    #[tokio::test(flavor = "multi_thread")]
    async fn a_store_failure_rolled_back_to_the_savepoint_does_not_refuse_the_commit() {
        super::a_store_failure_rolled_back_to_the_savepoint_does_not_refuse_the_commit().await;
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn hooks_rolled_back_to_the_savepoint_do_not_run() {
        super::hooks_rolled_back_to_the_savepoint_do_not_run().await;
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn the_rollback_returns_to_the_layers_savepoint_past_the_handlers() {
        super::the_rollback_returns_to_the_layers_savepoint_past_the_handlers().await;
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn a_success_on_an_aborted_transaction_is_not_stored() {
        super::a_success_on_an_aborted_transaction_is_not_stored().await;
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn a_caught_failed_statement_is_stored_and_replayed() {
        super::a_caught_failed_statement_is_stored_and_replayed::<idempotency_pg::PgStore>().await;
    }
}

mod sqlite {
    #[tokio::test(flavor = "multi_thread")]
    async fn a_caught_failed_statement_is_stored_and_replayed() {
        super::a_caught_failed_statement_is_stored_and_replayed::<idempotency_sqlite::SqliteStore>(
        )
        .await;
    }
}
