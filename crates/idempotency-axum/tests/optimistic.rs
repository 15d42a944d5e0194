//! `IdempotencyLayer::optimistic`: the handler first, then the terminal record in one insert,
//! on a real PostgreSQL (an isolated schema), MySQL / MariaDB (a database of its own) and
//! SQLite (a fresh file), through `oneshot`.

#![allow(clippy::unwrap_used)] // tests fail loudly on unexpected errors

mod support;

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use axum::extract::State;
use axum::http::{Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use idempotency_axum::{IdempotencyLayer, IdempotentTx, SharedScope};
use idempotency_core::{
    IdempotencyKey, IdempotencyService, IdempotencyStore, Operation, RecordId, RecordStatus, Scope,
    ServiceOptions,
};
use idempotency_mysql::MysqlStore;
use idempotency_pg::{PgStore, sqlx};
use idempotency_sqlite::SqliteStore;
use serde::Deserialize;
use support::Reply;
use support::stores::{Backend, Cleanup};
use tokio::sync::Notify;

/// A fresh store and its business table: one row per reference, references unique.
trait Orders: IdempotencyStore + idempotency_core::store::InsertCompleted + Clone {
    /// A fresh store, and what removes it (its SQLite files).
    fn fresh() -> impl Future<Output = (Self, Option<Cleanup>)> + Send;
    fn create_table(&self) -> impl Future<Output = ()> + Send;
    /// Inserts the order; `false` on a unique violation.
    fn insert(conn: &mut Self::Connection, reference: &str) -> impl Future<Output = bool> + Send;
    fn count(&self) -> impl Future<Output = i64> + Send;
    /// Reads the business table on the handler's connection (on MySQL, the first read of a
    /// transaction takes its repeatable-read snapshot).
    fn read(conn: &mut Self::Connection) -> impl Future<Output = ()> + Send;
    /// How many inserts into the business table wait on a row lock now.
    fn waiting_inserts(&self) -> impl Future<Output = i64> + Send;
    /// Inserts the order with `INSERT OR ROLLBACK` (SQLite only): a taken reference rolls the
    /// whole transaction back; `false` then.
    fn insert_or_roll_back(
        _conn: &mut Self::Connection,
        _reference: &str,
    ) -> impl Future<Output = bool> + Send {
        async { unimplemented!("INSERT OR ROLLBACK is SQLite's") }
    }
    /// Sets the transaction's isolation level before its first statement (PostgreSQL only).
    fn isolate(_conn: &mut Self::Connection, _level: &str) -> impl Future<Output = ()> + Send {
        async { unimplemented!("isolation levels are tested on PostgreSQL") }
    }
}

fn unique_violation(error: sqlx::Error) -> bool {
    match error {
        sqlx::Error::Database(e) if e.is_unique_violation() => false,
        other => panic!("unexpected error: {other}"),
    }
}

/// `read` and `count` of an [`Orders`] impl: the same statement on every backend.
macro_rules! reads {
    () => {
        async fn read(conn: &mut Self::Connection) {
            let _: i64 = sqlx::query_scalar("SELECT count(*) FROM optimistic_orders")
                .fetch_one(conn)
                .await
                .unwrap();
        }
        async fn count(&self) -> i64 {
            sqlx::query_scalar("SELECT count(*) FROM optimistic_orders")
                .fetch_one(self.pool())
                .await
                .unwrap()
        }
    };
}

impl Orders for PgStore {
    async fn fresh() -> (Self, Option<Cleanup>) {
        let (store, cleanup) = <PgStore as Backend>::fresh().await;
        (store, Some(cleanup))
    }
    async fn create_table(&self) {
        sqlx::raw_sql(
            "CREATE TABLE optimistic_orders (reference text PRIMARY KEY);
             INSERT INTO optimistic_orders VALUES ('taken')",
        )
        .execute(self.pool())
        .await
        .unwrap();
    }
    async fn insert(conn: &mut Self::Connection, reference: &str) -> bool {
        sqlx::query("INSERT INTO optimistic_orders (reference) VALUES ($1)")
            .bind(reference)
            .execute(conn)
            .await
            .map_or_else(unique_violation, |_| true)
    }
    reads!();
    async fn isolate(conn: &mut Self::Connection, level: &str) {
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
            "SET TRANSACTION ISOLATION LEVEL {level}"
        )))
        .execute(conn)
        .await
        .unwrap();
    }
    async fn waiting_inserts(&self) -> i64 {
        sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' \
             AND query LIKE 'INSERT INTO optimistic_orders%' AND datname = current_database()",
        )
        .fetch_one(self.pool())
        .await
        .unwrap()
    }
}

impl Orders for MysqlStore {
    async fn fresh() -> (Self, Option<Cleanup>) {
        let store = MysqlStore::new(idempotency_testing::mysql_pool().await);
        store.create_schema().await.unwrap();
        (store, None)
    }
    async fn create_table(&self) {
        sqlx::raw_sql(
            "CREATE TABLE optimistic_orders (reference VARCHAR(64) PRIMARY KEY);
             INSERT INTO optimistic_orders VALUES ('taken')",
        )
        .execute(self.pool())
        .await
        .unwrap();
    }
    async fn insert(conn: &mut Self::Connection, reference: &str) -> bool {
        sqlx::query("INSERT INTO optimistic_orders (reference) VALUES (?)")
            .bind(reference)
            .execute(conn)
            .await
            .map_or_else(unique_violation, |_| true)
    }
    reads!();
    async fn waiting_inserts(&self) -> i64 {
        sqlx::query_scalar(
            // This test's database only (other tests run at once). MariaDB does not report a
            // prepared insert waiting on a duplicate key as `LOCK WAIT` in `innodb_trx`; the
            // process list shows it executing (the one insert that cannot finish at once).
            "SELECT count(*) FROM information_schema.processlist WHERE db = DATABASE() \
             AND command = 'Execute' AND info LIKE 'INSERT INTO optimistic_orders%'",
        )
        .fetch_one(self.pool())
        .await
        .unwrap()
    }
}

impl Orders for SqliteStore {
    async fn fresh() -> (Self, Option<Cleanup>) {
        let (store, cleanup) = <SqliteStore as Backend>::fresh().await;
        (store, Some(cleanup))
    }
    async fn create_table(&self) {
        sqlx::raw_sql(
            "CREATE TABLE optimistic_orders (reference TEXT PRIMARY KEY);
             INSERT INTO optimistic_orders VALUES ('taken')",
        )
        .execute(self.pool())
        .await
        .unwrap();
    }
    async fn insert(conn: &mut Self::Connection, reference: &str) -> bool {
        sqlx::query("INSERT INTO optimistic_orders (reference) VALUES (?)")
            .bind(reference)
            .execute(conn)
            .await
            .map_or_else(unique_violation, |_| true)
    }
    async fn insert_or_roll_back(conn: &mut Self::Connection, reference: &str) -> bool {
        sqlx::query("INSERT OR ROLLBACK INTO optimistic_orders (reference) VALUES (?)")
            .bind(reference)
            .execute(conn)
            .await
            .map_or_else(unique_violation, |_| true)
    }
    reads!();
    /// SQLite's `BEGIN IMMEDIATE` serializes writers before any insert: never called.
    async fn waiting_inserts(&self) -> i64 {
        unreachable!("the races run on PostgreSQL and MySQL")
    }
}

#[derive(Default)]
struct Hooks {
    /// How many times the handler ran.
    runs: AtomicUsize,
    /// When set, the next run signals `entered` after its insert, then waits for `release`.
    hold_first: AtomicBool,
    entered: Notify,
    release: Notify,
    /// The service's metrics of its keys: acquired, found taken, waits measured.
    acquired: AtomicUsize,
    conflicts: AtomicUsize,
    waits: AtomicUsize,
    /// Records counted as stored.
    persisted: AtomicUsize,
}

impl Hooks {
    /// (acquired, found taken, waits measured).
    fn keys(&self) -> (usize, usize, usize) {
        let load = |n: &AtomicUsize| n.load(Ordering::SeqCst);
        (
            load(&self.acquired),
            load(&self.conflicts),
            load(&self.waits),
        )
    }
}

impl idempotency_core::IdempotencyMetrics for Hooks {
    fn acquired(&self, _: &str) {
        self.acquired.fetch_add(1, Ordering::SeqCst);
    }
    fn acquire_conflict(&self, _: &str) {
        self.conflicts.fetch_add(1, Ordering::SeqCst);
    }
    fn acquire_wait(&self, _: &str, _: Duration) {
        self.waits.fetch_add(1, Ordering::SeqCst);
    }
    fn persisted(&self, _: &str, _: RecordStatus) {
        self.persisted.fetch_add(1, Ordering::SeqCst);
    }
}

#[derive(Deserialize)]
struct NewOrder {
    reference: String,
    /// Insert `{reference}-{run}`: duplicates do not wait on each other's row.
    #[serde(default)]
    per_run: bool,
    /// Answer this status (`taken`) when the reference is taken, instead of 422
    /// `REFERENCE_TAKEN`: 500 or 409, neither stored.
    #[serde(default)]
    when_taken: Option<u16>,
    /// Insert with `INSERT OR ROLLBACK` (SQLite).
    #[serde(default)]
    or_roll_back: bool,
    /// Run the transaction at this isolation level (PostgreSQL).
    #[serde(default)]
    isolation: Option<String>,
    /// Answer 201 even when the reference is taken (the insert failed).
    #[serde(default)]
    succeed_anyway: bool,
    /// Register an after-commit hook that never finishes.
    #[serde(default)]
    hanging_hook: bool,
}

async fn create_order<B: Orders>(
    State(hooks): State<Arc<Hooks>>,
    mut tx: IdempotentTx<B>,
    Json(order): Json<NewOrder>,
) -> Response {
    let run = hooks.runs.fetch_add(1, Ordering::SeqCst) + 1;
    let reference = if order.per_run {
        format!("{}-{run}", order.reference)
    } else {
        order.reference
    };
    if let Some(level) = &order.isolation {
        B::isolate(&mut tx, level).await;
    }
    B::read(&mut tx).await;
    if order.hanging_hook {
        tx.tx().after_commit(std::future::pending());
    }
    let inserted = if order.or_roll_back {
        B::insert_or_roll_back(&mut tx, &reference).await
    } else {
        B::insert(&mut tx, &reference).await
    };
    if hooks.hold_first.swap(false, Ordering::SeqCst) {
        hooks.entered.notify_one();
        hooks.release.notified().await;
    }
    match (inserted || order.succeed_anyway, order.when_taken) {
        (true, _) => (
            StatusCode::CREATED,
            format!("order {reference} (run {run})"),
        )
            .into_response(),
        (false, None) => (StatusCode::UNPROCESSABLE_ENTITY, "REFERENCE_TAKEN").into_response(),
        (false, Some(status)) => (StatusCode::from_u16(status).unwrap(), "taken").into_response(),
    }
}

fn app<B: Orders>(store: B, options: ServiceOptions) -> (Router, Arc<Hooks>) {
    app_in(store, options, true)
}

/// The same app, behind the optimistic layer or (with `optimistic` false) the claim-first one.
fn app_in<B: Orders>(store: B, options: ServiceOptions, optimistic: bool) -> (Router, Arc<Hooks>) {
    let hooks = Arc::new(Hooks::default());
    let service = IdempotencyService::builder(store)
        .config(options)
        .metrics(Arc::clone(&hooks))
        .build();
    let layer = IdempotencyLayer::new(service).scope::<SharedScope>();
    let app = Router::new().route("/orders", post(create_order::<B>));
    let app = if optimistic {
        app.route_layer(layer.optimistic())
    } else {
        app.route_layer(layer)
    };
    (app.with_state(Arc::clone(&hooks)), hooks)
}

async fn send(app: &Router, key: &str, body: serde_json::Value) -> Reply {
    let headers: [(&str, &[u8]); 1] = [("idempotency-key", key.as_bytes())];
    support::send(app, Method::POST, "/orders", &headers, Some(&body)).await
}

fn record_id(key: &str) -> RecordId {
    RecordId::new(
        Operation::new("POST:/orders").unwrap(),
        Scope::default(),
        IdempotencyKey::new(key).unwrap(),
    )
}

/// The handler's answer is stored with its writes; a retry answers it byte for byte and its
/// own handler run is rolled back. With `lookup_before_acquire`, the retry never runs it.
async fn a_first_execution_is_stored_and_replayed<B: Orders>(lookup_before_acquire: bool) {
    let (store, _cleanup) = <B as Orders>::fresh().await;
    store.create_table().await;
    let options = ServiceOptions {
        lookup_before_acquire,
        ..ServiceOptions::default()
    };
    let (app, hooks) = app(store.clone(), options);
    let order = serde_json::json!({ "reference": "r1" });
    let first = send(&app, "k1", order.clone()).await;
    assert_eq!(
        (first.status, first.text().as_str()),
        (StatusCode::CREATED, "order r1 (run 1)")
    );
    assert!(!first.is_replay());
    let record = store.lookup(&record_id("k1")).await.unwrap().unwrap();
    assert_eq!(record.status(), RecordStatus::Completed);

    let retry = send(&app, "k1", order).await;
    assert!(retry.is_replay(), "{retry:?}");
    assert_eq!((retry.status, &retry.body), (first.status, &first.body));
    let runs = if lookup_before_acquire { 1 } else { 2 };
    assert_eq!(hooks.runs.load(Ordering::SeqCst), runs);
    // 'taken' and r1: the retry's insert, if it ran, was rolled back.
    assert_eq!(store.count().await, 2);

    let other = send(&app, "k1", serde_json::json!({ "reference": "r2" })).await;
    other.assert_problem(422, "idempotency-key-reused");
    assert_eq!(store.count().await, 2);
}

/// "Insert, catch the unique violation, answer 422": on PostgreSQL the caught statement
/// aborted the transaction, so the layer stores the answer in a new one.
async fn a_caught_failed_statement_is_stored_and_replayed<B: Orders>() {
    let (store, _cleanup) = <B as Orders>::fresh().await;
    store.create_table().await;
    let (app, hooks) = app(store.clone(), ServiceOptions::default());
    let first = send(&app, "k1", serde_json::json!({ "reference": "taken" })).await;
    assert_eq!(
        (first.status, first.text().as_str()),
        (StatusCode::UNPROCESSABLE_ENTITY, "REFERENCE_TAKEN")
    );
    let record = store.lookup(&record_id("k1")).await.unwrap().unwrap();
    assert_eq!(record.status(), RecordStatus::Rejected);
    let retry = send(&app, "k1", serde_json::json!({ "reference": "taken" })).await;
    assert!(retry.is_replay(), "the 422 was stored: {retry:?}");
    assert_eq!(retry.body, first.body);
    assert_eq!(store.count().await, 1);
    // One wait per request, also where the insert on the aborted transaction was tried again
    // in a new one (before, on PostgreSQL: four).
    assert_eq!(hooks.keys(), (1, 1, 2), "acquired, conflicts, waits");
}

/// A 5xx (or a 409) is not stored and, with no record for the key, answered as is; the retry
/// runs the handler again.
async fn an_unstored_answer_without_a_record_is_answered_as_is<B: Orders>(status: StatusCode) {
    let (store, _cleanup) = <B as Orders>::fresh().await;
    store.create_table().await;
    let (app, hooks) = app(store.clone(), ServiceOptions::default());
    let order = serde_json::json!({ "reference": "taken", "when_taken": status.as_u16() });
    for _ in 0..2 {
        let reply = send(&app, "k1", order.clone()).await;
        assert_eq!(
            (reply.status, reply.text().as_str(), reply.is_replay()),
            (status, "taken", false)
        );
    }
    assert_eq!(hooks.runs.load(Ordering::SeqCst), 2);
    assert!(store.lookup(&record_id("k1")).await.unwrap().is_none());
}

/// The handler's own after-commit hook hangs (a notifier that never answers) and the request
/// is given up meanwhile (a client gone, a timeout): the record committed, and it is counted
/// as acquired and stored, because the layer counts it before the handler's hooks run
/// (before: after them, so never). The caches are filled after the handler's hooks. The same
/// in both modes of the layer (`optimistic` false: claim-first).
async fn a_hanging_handler_hook_does_not_lose_the_stored_records_count<B: Orders>(
    optimistic: bool,
) {
    let (store, _cleanup) = <B as Orders>::fresh().await;
    store.create_table().await;
    let (app, hooks) = app_in(store.clone(), ServiceOptions::default(), optimistic);
    let order = serde_json::json!({ "reference": "h1", "hanging_hook": true });
    let given_up = tokio::time::timeout(Duration::from_millis(500), send(&app, "k1", order)).await;
    assert!(given_up.is_err(), "the handler's hook hangs");
    let record = store.lookup(&record_id("k1")).await.unwrap().unwrap();
    assert_eq!(record.status(), RecordStatus::Completed);
    assert_eq!(hooks.keys().0, 1, "acquired");
    assert_eq!(hooks.persisted.load(Ordering::SeqCst), 1, "persisted");
}

/// A handler that caught a failed statement on PostgreSQL and still answered 201: its other
/// writes went with the aborted transaction, so the 201 is not stored; the answer is 500.
async fn a_success_on_an_aborted_transaction_is_not_stored() {
    let (store, _cleanup) = <PgStore as Orders>::fresh().await;
    store.create_table().await;
    let (app, _hooks) = app(store.clone(), ServiceOptions::default());
    let order = serde_json::json!({ "reference": "taken", "succeed_anyway": true });
    let reply = send(&app, "k1", order).await;
    assert_eq!(reply.status, StatusCode::INTERNAL_SERVER_ERROR, "{reply:?}");
    assert!(store.lookup(&record_id("k1")).await.unwrap().is_none());
}

/// On SQLite, `INSERT OR ROLLBACK` on a taken reference rolled the whole transaction back and
/// left the connection in autocommit; the handler caught it and answered 201. The record must
/// not commit on its own (before: stored, and the 201 replayed with no order written): the
/// answer is a 500, not a retryable 409 (the handler's statements after the one that ended the
/// transaction committed one by one, and a retry would run them again), nothing stored.
async fn a_success_after_a_statement_rolled_the_transaction_back_is_not_stored() {
    let (store, _cleanup) = <SqliteStore as Orders>::fresh().await;
    store.create_table().await;
    let (app, _hooks) = app(store.clone(), ServiceOptions::default());
    let order =
        serde_json::json!({ "reference": "taken", "or_roll_back": true, "succeed_anyway": true });
    let reply = send(&app, "k1", order).await;
    reply.assert_problem(500, "internal-error");
    assert!(store.lookup(&record_id("k1")).await.unwrap().is_none());
    assert_eq!(store.count().await, 1);
    // The connection went back to the pool in a state sqlx knows: the next request works.
    let next = send(&app, "k2", serde_json::json!({ "reference": "fresh" })).await;
    assert_eq!(next.status, StatusCode::CREATED, "{next:?}");
}

/// Sends `order` under key `k1` twice at once: the first run of the handler waits after its
/// insert until the second request's handler has finished, or (with `blocked`) until the
/// second request waits on the first one's row lock. Returns (first, second).
async fn duplicates<B: Orders>(
    store: &B,
    app: &Router,
    hooks: &Hooks,
    order: serde_json::Value,
    blocked: bool,
) -> (Reply, Reply) {
    hooks.hold_first.store(true, Ordering::SeqCst);
    let first = {
        let (app, order) = (app.clone(), order.clone());
        tokio::spawn(async move { send(&app, "k1", order).await })
    };
    hooks.entered.notified().await;
    let second = {
        let (app, order) = (app.clone(), order.clone());
        tokio::spawn(async move { send(&app, "k1", order).await })
    };
    let second = if blocked {
        // Until the second handler's insert waits on the first one's uncommitted row.
        let mut waited = 0;
        loop {
            if store.waiting_inserts().await > 0 {
                break;
            }
            waited += 1;
            assert!(
                waited < 500,
                "the second insert never waited on the first one"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        hooks.release.notify_one();
        second.await.unwrap()
    } else {
        let second = second.await.unwrap();
        hooks.release.notify_one();
        second
    };
    (first.await.unwrap(), second)
}

/// The second duplicate's handler finished first and its record won: the first one's insert
/// finds the key taken, rolls back its handler's writes and answers the winner's response.
async fn a_duplicate_whose_insert_comes_second_answers_the_winner<B: Orders>() {
    let (store, _cleanup) = <B as Orders>::fresh().await;
    store.create_table().await;
    let (app, hooks) = app(store.clone(), ServiceOptions::default());
    let order = serde_json::json!({ "reference": "a", "per_run": true });
    let (first, second) = duplicates(&store, &app, &hooks, order, false).await;
    assert_eq!(
        (second.status, second.text().as_str(), second.is_replay()),
        (StatusCode::CREATED, "order a-2 (run 2)", false)
    );
    assert!(first.is_replay(), "{first:?}");
    assert_eq!(first.body, second.body);
    assert_eq!(hooks.runs.load(Ordering::SeqCst), 2, "both handlers ran");
    // 'taken' and the winner's a-2; the first handler's a-1 was rolled back.
    assert_eq!(store.count().await, 2);
}

/// The second duplicate's handler waited on the first one's row and failed once it committed
/// (a 500, or a 409 "already exists", neither stored): it answers the winner's response, not
/// its own.
async fn a_duplicate_whose_handler_failed_on_the_winners_row_answers_the_winner<B: Orders>(
    status: StatusCode,
) {
    let (store, _cleanup) = <B as Orders>::fresh().await;
    store.create_table().await;
    let (app, hooks) = app(store.clone(), ServiceOptions::default());
    let order = serde_json::json!({ "reference": "a", "when_taken": status.as_u16() });
    let (first, second) = duplicates(&store, &app, &hooks, order, true).await;
    assert_eq!(
        (first.status, first.text().as_str(), first.is_replay()),
        (StatusCode::CREATED, "order a (run 1)", false)
    );
    assert!(second.is_replay(), "{second:?}");
    assert_eq!(second.body, first.body);
    assert_eq!(hooks.runs.load(Ordering::SeqCst), 2, "both handlers ran");
    assert_eq!(store.count().await, 2);
    // The second found the key taken, though it never reached its insert (before: counted
    // neither as acquired nor as a conflict).
    assert_eq!(hooks.keys(), (1, 1, 1), "acquired, conflicts, waits");
}

/// The second duplicate's handler waited on the first one's row, caught the unique violation
/// and answered 422 on its aborted transaction; storing that in a new transaction finds the
/// winner's record, so it answers the winner's 201, not its own 422.
async fn a_duplicate_whose_caught_failure_came_from_the_winner_answers_the_winner<B: Orders>() {
    let (store, _cleanup) = <B as Orders>::fresh().await;
    store.create_table().await;
    let (app, hooks) = app(store.clone(), ServiceOptions::default());
    let order = serde_json::json!({ "reference": "a" });
    let (first, second) = duplicates(&store, &app, &hooks, order, true).await;
    assert_eq!(
        (first.status, first.text().as_str(), first.is_replay()),
        (StatusCode::CREATED, "order a (run 1)", false)
    );
    assert!(second.is_replay(), "{second:?}");
    assert_eq!((second.status, &second.body), (first.status, &first.body));
    let record = store.lookup(&record_id("k1")).await.unwrap().unwrap();
    assert_eq!(record.status(), RecordStatus::Completed);
    assert_eq!(store.count().await, 2);
}

/// The second duplicate's handler waited on the first one's row, caught the unique violation
/// and still answered 201 on its aborted transaction: nothing of it can be stored, and the
/// winner's committed record answers it (before: 500).
async fn a_duplicate_whose_success_was_aborted_by_the_winner_answers_the_winner() {
    let (store, _cleanup) = <PgStore as Orders>::fresh().await;
    store.create_table().await;
    let (app, hooks) = app(store.clone(), ServiceOptions::default());
    let order = serde_json::json!({ "reference": "a", "succeed_anyway": true });
    let (first, second) = duplicates(&store, &app, &hooks, order, true).await;
    assert_eq!(
        (first.status, first.text().as_str(), first.is_replay()),
        (StatusCode::CREATED, "order a (run 1)", false)
    );
    assert!(second.is_replay(), "{second:?}");
    assert_eq!((second.status, &second.body), (first.status, &first.body));
    assert_eq!(store.count().await, 2);
}

/// Under REPEATABLE READ or SERIALIZABLE on PostgreSQL, the first duplicate's snapshot
/// predates the winner's commit: its insert of the record fails with a serialization failure
/// rather than finding the key taken. It still answers the winner's response.
async fn a_duplicate_whose_snapshot_predates_the_winner_answers_the_winner(isolation: &str) {
    let (store, _cleanup) = <PgStore as Orders>::fresh().await;
    store.create_table().await;
    let (app, hooks) = app(store.clone(), ServiceOptions::default());
    let order = serde_json::json!({ "reference": "a", "per_run": true, "isolation": isolation });
    let (first, second) = duplicates(&store, &app, &hooks, order, false).await;
    assert_eq!(
        (second.status, second.text().as_str(), second.is_replay()),
        (StatusCode::CREATED, "order a-2 (run 2)", false),
        "{isolation}"
    );
    assert!(first.is_replay(), "{isolation}: {first:?}");
    assert_eq!(first.body, second.body);
    assert_eq!(
        store.count().await,
        2,
        "the first handler's a-1 was rolled back"
    );
    // The loser found the key taken, as a loser of the insert does (before: its serialization
    // failure counted as no conflict).
    assert_eq!(
        hooks.keys(),
        (1, 1, 2),
        "{isolation}: acquired, conflicts, waits"
    );
}

mod postgres {
    use axum::http::StatusCode;
    use idempotency_pg::PgStore;

    #[tokio::test(flavor = "multi_thread")]
    async fn a_duplicate_whose_success_was_aborted_by_the_winner_answers_the_winner() {
        super::a_duplicate_whose_success_was_aborted_by_the_winner_answers_the_winner().await;
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn a_duplicate_whose_snapshot_predates_the_winner_answers_the_winner_repeatable_read() {
        super::a_duplicate_whose_snapshot_predates_the_winner_answers_the_winner("REPEATABLE READ")
            .await;
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn a_duplicate_whose_snapshot_predates_the_winner_answers_the_winner_serializable() {
        super::a_duplicate_whose_snapshot_predates_the_winner_answers_the_winner("SERIALIZABLE")
            .await;
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn a_first_execution_is_stored_and_replayed() {
        super::a_first_execution_is_stored_and_replayed::<PgStore>(false).await;
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn with_lookup_before_acquire_a_replay_never_runs_the_handler() {
        super::a_first_execution_is_stored_and_replayed::<PgStore>(true).await;
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn a_caught_failed_statement_is_stored_and_replayed() {
        super::a_caught_failed_statement_is_stored_and_replayed::<PgStore>().await;
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn a_hanging_handler_hook_does_not_lose_the_stored_records_count() {
        super::a_hanging_handler_hook_does_not_lose_the_stored_records_count::<PgStore>(true).await;
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn a_hanging_handler_hook_does_not_lose_the_claim_first_records_count() {
        super::a_hanging_handler_hook_does_not_lose_the_stored_records_count::<PgStore>(false)
            .await;
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn a_5xx_without_a_record_is_answered_as_is() {
        super::an_unstored_answer_without_a_record_is_answered_as_is::<PgStore>(
            StatusCode::INTERNAL_SERVER_ERROR,
        )
        .await;
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn a_409_without_a_record_is_answered_as_is() {
        super::an_unstored_answer_without_a_record_is_answered_as_is::<PgStore>(
            StatusCode::CONFLICT,
        )
        .await;
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn a_success_on_an_aborted_transaction_is_not_stored() {
        super::a_success_on_an_aborted_transaction_is_not_stored().await;
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn a_duplicate_whose_caught_failure_came_from_the_winner_answers_the_winner() {
        super::a_duplicate_whose_caught_failure_came_from_the_winner_answers_the_winner::<PgStore>(
        )
        .await;
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn a_duplicate_whose_insert_comes_second_answers_the_winner() {
        super::a_duplicate_whose_insert_comes_second_answers_the_winner::<PgStore>().await;
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn a_duplicate_whose_handler_failed_on_the_winners_row_answers_the_winner() {
        super::a_duplicate_whose_handler_failed_on_the_winners_row_answers_the_winner::<PgStore>(
            StatusCode::INTERNAL_SERVER_ERROR,
        )
        .await;
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn a_duplicate_whose_handler_answered_409_on_the_winners_row_answers_the_winner() {
        super::a_duplicate_whose_handler_failed_on_the_winners_row_answers_the_winner::<PgStore>(
            StatusCode::CONFLICT,
        )
        .await;
    }
}

mod mysql {
    use axum::http::StatusCode;
    use idempotency_mysql::MysqlStore;

    #[tokio::test(flavor = "multi_thread")]
    async fn a_first_execution_is_stored_and_replayed() {
        super::a_first_execution_is_stored_and_replayed::<MysqlStore>(false).await;
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn with_lookup_before_acquire_a_replay_never_runs_the_handler() {
        super::a_first_execution_is_stored_and_replayed::<MysqlStore>(true).await;
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn a_caught_failed_statement_is_stored_and_replayed() {
        super::a_caught_failed_statement_is_stored_and_replayed::<MysqlStore>().await;
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn a_5xx_without_a_record_is_answered_as_is() {
        super::an_unstored_answer_without_a_record_is_answered_as_is::<MysqlStore>(
            StatusCode::INTERNAL_SERVER_ERROR,
        )
        .await;
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn a_409_without_a_record_is_answered_as_is() {
        super::an_unstored_answer_without_a_record_is_answered_as_is::<MysqlStore>(
            StatusCode::CONFLICT,
        )
        .await;
    }

    /// The winner commits while the loser's handler has already read (MySQL's repeatable
    /// read took its snapshot then): the loser still answers the winner's response.
    #[tokio::test(flavor = "multi_thread")]
    async fn a_duplicate_whose_insert_comes_second_answers_the_winner() {
        super::a_duplicate_whose_insert_comes_second_answers_the_winner::<MysqlStore>().await;
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn a_duplicate_whose_handler_failed_on_the_winners_row_answers_the_winner() {
        super::a_duplicate_whose_handler_failed_on_the_winners_row_answers_the_winner::<MysqlStore>(
            StatusCode::INTERNAL_SERVER_ERROR,
        )
        .await;
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn a_duplicate_whose_handler_answered_409_on_the_winners_row_answers_the_winner() {
        super::a_duplicate_whose_handler_failed_on_the_winners_row_answers_the_winner::<MysqlStore>(
            StatusCode::CONFLICT,
        )
        .await;
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn a_duplicate_whose_caught_failure_came_from_the_winner_answers_the_winner() {
        super::a_duplicate_whose_caught_failure_came_from_the_winner_answers_the_winner::<
            MysqlStore,
        >()
        .await;
    }
}

mod sqlite {
    use axum::http::StatusCode;
    use idempotency_sqlite::SqliteStore;

    #[tokio::test(flavor = "multi_thread")]
    async fn a_success_after_a_statement_rolled_the_transaction_back_is_not_stored() {
        super::a_success_after_a_statement_rolled_the_transaction_back_is_not_stored().await;
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn a_first_execution_is_stored_and_replayed() {
        super::a_first_execution_is_stored_and_replayed::<SqliteStore>(false).await;
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn with_lookup_before_acquire_a_replay_never_runs_the_handler() {
        super::a_first_execution_is_stored_and_replayed::<SqliteStore>(true).await;
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn a_caught_failed_statement_is_stored_and_replayed() {
        super::a_caught_failed_statement_is_stored_and_replayed::<SqliteStore>().await;
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn a_hanging_handler_hook_does_not_lose_the_stored_records_count() {
        super::a_hanging_handler_hook_does_not_lose_the_stored_records_count::<SqliteStore>(true)
            .await;
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn a_hanging_handler_hook_does_not_lose_the_claim_first_records_count() {
        super::a_hanging_handler_hook_does_not_lose_the_stored_records_count::<SqliteStore>(false)
            .await;
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn a_5xx_without_a_record_is_answered_as_is() {
        super::an_unstored_answer_without_a_record_is_answered_as_is::<SqliteStore>(
            StatusCode::INTERNAL_SERVER_ERROR,
        )
        .await;
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn a_409_without_a_record_is_answered_as_is() {
        super::an_unstored_answer_without_a_record_is_answered_as_is::<SqliteStore>(
            StatusCode::CONFLICT,
        )
        .await;
    }
}
