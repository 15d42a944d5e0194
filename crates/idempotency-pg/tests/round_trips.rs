//! Round trips per call, counted from sqlx's own statement log (`sqlx::query` events). `BEGIN`
//! is sent by sqlx's transaction manager without a log event, so a path that opens a
//! transaction costs one round trip more than it logs.
//!
//! | path | statements |
//! |---|---|
//! | `execute`, first run | BEGIN, acquire, business insert, complete, COMMIT |
//! | `execute_optimistic`, first run | BEGIN, business insert, insert completed, COMMIT |
//! | replay, `lookup-before-acquire` | find (no transaction) |
//! | replay, insert first | BEGIN, acquire, find, COMMIT |
//! | replay from the L1 cache | none |

#![allow(clippy::unwrap_used)] // tests fail loudly on unexpected errors

use std::sync::{Arc, Mutex};

use idempotency_cache_moka::MokaCache;
use idempotency_core::{
    Call, Error, ExecutionResult, IdempotencyKey, IdempotencyService, Outcome, ServiceOptions,
};
use idempotency_pg::PgStore;
use sqlx::{self, PgConnection};
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

async fn insert(conn: &mut PgConnection) -> Result<i64, sqlx::Error> {
    sqlx::query_scalar("INSERT INTO payments (amount) VALUES (1) RETURNING id")
        .fetch_one(conn)
        .await
}

#[derive(Debug, thiserror::Error)]
enum AppError {
    #[error(transparent)]
    Idempotency(#[from] Error),
    #[error(transparent)]
    Database(#[from] sqlx::Error),
}

#[tokio::test]
async fn statements_per_path() {
    let statements = Statements::default();
    let subscriber = tracing_subscriber::registry().with(
        statements
            .clone()
            .with_filter(tracing_subscriber::filter::LevelFilter::DEBUG),
    );
    let _guard = tracing::subscriber::set_default(subscriber);

    let pool = idempotency_testing::pg_pool().await;
    let store = PgStore::new(pool.clone());
    store.create_schema().await.unwrap();
    sqlx::raw_sql("CREATE TABLE payments (id bigserial PRIMARY KEY, amount int NOT NULL)")
        .execute(&pool)
        .await
        .unwrap();
    let no_l1: Option<MokaCache> = None;
    let insert_first = IdempotencyService::builder(store.clone())
        .local_cache(no_l1.clone())
        .build();
    let lookup_first = IdempotencyService::builder(store.clone())
        .config(ServiceOptions {
            lookup_before_acquire: true,
            ..Default::default()
        })
        .local_cache(no_l1)
        .build();
    let cached = IdempotencyService::builder(store.clone())
        .local_cache(Some(MokaCache::default()))
        .build();
    statements.take();

    let run = async |service: &IdempotencyService<PgStore, Option<MokaCache>>,
                     key: &str,
                     optimistic: bool|
           -> Vec<String> {
        let call = Call::new("PAY", IdempotencyKey::new(key).unwrap(), &1);
        let action = async |conn: &mut PgConnection| {
            Ok::<_, AppError>(ExecutionResult::success(insert(conn).await?))
        };
        let outcome: Outcome<i64> = if optimistic {
            service.execute_optimistic(call, action).await
        } else {
            service.execute(call, action).await
        }
        .unwrap();
        let _ = outcome;
        statements.take()
    };

    let claim = run(&insert_first, "claim", false).await;
    assert_eq!(
        claim.len(),
        4,
        "acquire, business, complete, COMMIT (+ BEGIN): {claim:?}"
    );
    assert!(
        claim[0].starts_with("WITH cfg"),
        "the bounded acquire first: {claim:?}"
    );
    assert!(claim[1].starts_with("INSERT INTO payments"));
    assert!(claim[2].starts_with("UPDATE"));
    assert_eq!(claim[3], "COMMIT");

    let optimistic = run(&insert_first, "optimistic", true).await;
    assert_eq!(
        optimistic.len(),
        3,
        "business, insert completed, COMMIT (+ BEGIN): {optimistic:?}"
    );

    let replay = run(&lookup_first, "claim", false).await;
    assert_eq!(replay.len(), 1, "one SELECT, no transaction: {replay:?}");
    assert!(replay[0].starts_with("SELECT"));

    let replay = run(&insert_first, "claim", false).await;
    assert_eq!(
        replay.len(),
        3,
        "acquire, find, COMMIT (+ BEGIN): {replay:?}"
    );

    run(&cached, "claim", false).await; // fills the L1 cache from the store
    let from_cache = run(&cached, "claim", false).await;
    assert!(
        from_cache.is_empty(),
        "an L1 replay touches no database: {from_cache:?}"
    );
}
