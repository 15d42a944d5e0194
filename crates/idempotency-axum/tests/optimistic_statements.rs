//! The statements of one first execution through `IdempotencyLayer` on PostgreSQL, in both
//! modes, from sqlx's statement log (`sqlx::query` events; `BEGIN` is sent by sqlx's
//! transaction manager without one). Alone in its test binary: the log is this thread's
//! subscriber, which tests running at once on other threads would disturb.
//!
//! | mode | statements |
//! |---|---|
//! | claim-first (default) | BEGIN, claim, SAVEPOINT, the handler's insert, complete, COMMIT |
//! | `optimistic()` | BEGIN, the handler's insert, the record's insert, COMMIT |

#![allow(clippy::unwrap_used)] // tests fail loudly on unexpected errors

mod support;

use std::sync::{Arc, Mutex};

use axum::Router;
use axum::http::{Method, StatusCode};
use axum::routing::post;
use idempotency_axum::{IdempotencyLayer, IdempotentTx, SharedScope};
use idempotency_core::IdempotencyService;
use idempotency_pg::{PgStore, sqlx};
use support::stores::Backend;
use tracing::field::{Field, Visit};
use tracing_subscriber::Layer;
use tracing_subscriber::layer::{Context, SubscriberExt};

#[derive(Clone, Default)]
struct Statements(Arc<Mutex<Vec<String>>>);

struct Summary(String);

impl Visit for Summary {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "summary" {
            self.0 = format!("{value:?}").trim_matches('"').to_owned();
        }
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "summary" {
            self.0 = value.to_owned();
        }
    }
}

impl<S: tracing::Subscriber> Layer<S> for Statements {
    fn on_event(&self, event: &tracing::Event<'_>, _ctx: Context<'_, S>) {
        if event.metadata().target() == "sqlx::query" {
            let mut summary = Summary(String::new());
            event.record(&mut summary);
            self.0.lock().unwrap().push(summary.0);
        }
    }
}

impl Statements {
    fn take(&self) -> Vec<String> {
        std::mem::take(&mut *self.0.lock().unwrap())
    }
}

async fn create(mut tx: IdempotentTx<PgStore>) -> StatusCode {
    sqlx::query("INSERT INTO layer_orders DEFAULT VALUES")
        .execute(&mut *tx)
        .await
        .unwrap();
    StatusCode::CREATED
}

async fn first_execution(app: &Router, key: &str, statements: &Statements) -> Vec<String> {
    let headers: [(&str, &[u8]); 1] = [("idempotency-key", key.as_bytes())];
    let reply = support::send(app, Method::POST, "/orders", &headers, None).await;
    assert_eq!(reply.status, StatusCode::CREATED, "{reply:?}");
    statements.take()
}

/// Current-thread: every statement runs on this thread, under its subscriber.
#[tokio::test]
async fn the_optimistic_mode_saves_the_claim_and_the_savepoint() {
    let statements = Statements::default();
    let subscriber = tracing_subscriber::registry().with(
        statements
            .clone()
            .with_filter(tracing_subscriber::filter::LevelFilter::DEBUG),
    );
    let _guard = tracing::subscriber::set_default(subscriber);

    let (store, _cleanup) = PgStore::fresh().await;
    sqlx::raw_sql("CREATE TABLE layer_orders (id bigserial PRIMARY KEY)")
        .execute(store.pool())
        .await
        .unwrap();
    let layer = IdempotencyLayer::new(IdempotencyService::new(store)).scope::<SharedScope>();
    let claim_first = Router::new()
        .route("/orders", post(create))
        .route_layer(layer.clone());
    let optimistic = Router::new()
        .route("/orders", post(create))
        .route_layer(layer.optimistic());
    statements.take();

    let logged = first_execution(&claim_first, "c1", &statements).await;
    assert_eq!(
        logged.len(),
        5,
        "claim, SAVEPOINT, insert, complete, COMMIT: {logged:?}"
    );
    assert!(!logged[0].contains("layer_orders"), "{logged:?}");
    assert!(logged[1].starts_with("SAVEPOINT"), "{logged:?}");
    assert!(
        logged[2].starts_with("INSERT INTO layer_orders"),
        "{logged:?}"
    );
    assert!(logged[3].starts_with("UPDATE"), "{logged:?}");
    assert_eq!(logged[4], "COMMIT");

    let logged = first_execution(&optimistic, "o1", &statements).await;
    assert_eq!(
        logged.len(),
        3,
        "insert, the record's insert, COMMIT: {logged:?}"
    );
    assert!(
        logged[0].starts_with("INSERT INTO layer_orders"),
        "{logged:?}"
    );
    // The record's insert, with its lock budget: `insert_completed_bounded`.
    assert!(
        logged[1].starts_with("WITH cfg AS MATERIALIZED"),
        "{logged:?}"
    );
    assert_eq!(logged[2], "COMMIT");
}
