//! A production orders service, whole: PostgreSQL, the moka L1 and Redis L2 caches, an outbox
//! relayed to NATS JetStream (the stream created at start-up), `/metrics`, `/health/live` and
//! `/health/ready` (database, cache, relay, broker, backlog), the application's
//! own configuration section next to the library's in one file (`examples/orders.yaml`), and a
//! graceful shutdown on Ctrl-C or SIGTERM that stops the relay and the cleanup job.
//!
//! ```sh
//! IDEMPOTENCY__DISTRIBUTED_CACHE__SECRET=$(openssl rand -hex 32) \
//!   cargo run -p idempotency --features postgres,redis,nats,axum --example orders_production
//! curl -i localhost:3000/orders -H 'X-Tenant-Id: alice' -H 'Idempotency-Key: k-1' \
//!   -H 'Content-Type: application/json' -d '{"sku":"A-1"}'
//! nats sub 'orders.>'   # the OrderCreated event, once per order
//! ```
//!
//! The same request again answers the stored response with `Idempotent-Replayed: true`; the same
//! key with another body is `422`. The service sits behind a gateway that authenticates the
//! caller and sets `X-Tenant-Id` (stripping any the client sent): keys belong to that tenant.
//! Any key of `orders.yaml` can be overridden from the environment (`APP__LISTEN=0.0.0.0:8080`).
//!
//! The wiring outside the business handler, counted as scripts/example-production.sh does:
//! `sed '/BEGIN business/,/END business/d' examples/orders_production.rs | grep -cvE '^\s*(//|$)'`

use axum::{Json, Router, extract::State, routing::post};
use idempotency::axum::{Error, IdempotentTx, TenantHeader};
use idempotency::outbox::NewEvent;
use idempotency::pool::{TEST_AFTER_IDLE, TestWhenIdle};
use idempotency::postgres::{PgOutbox, PgStore};
use idempotency::{Builder, EnqueueInTx, Report, Settings, sqlx};
use serde_json::{Value, json};

/// The application's own section of the file, `app:`; unknown keys are refused.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct App {
    listen: String,
    database_url: String,
    max_connections: u32,
}

// BEGIN business handler
/// `POST /orders`: the order row, its `OrderCreated` event and the idempotency record commit
/// together, or not at all.
async fn create_order(
    State(outbox): State<PgOutbox>,
    mut tx: IdempotentTx<PgStore>,
    Json(order): Json<Value>,
) -> Result<Json<Value>, Error> {
    let insert = sqlx::query_scalar("INSERT INTO orders (body) VALUES ($1) RETURNING id");
    let id: i64 = insert
        .bind(order.to_string())
        .fetch_one(&mut *tx)
        .await
        .map_err(Error::internal)?;
    let event =
        NewEvent::new("order", id.to_string(), "OrderCreated", &order).map_err(Error::internal)?;
    tx.enqueue(&outbox, event).await.map_err(Error::internal)?;
    Ok(Json(json!({ "id": id, "order": order })))
}
// END business handler

#[tokio::main]
async fn main() -> Result<(), Report> {
    tracing_subscriber::fmt::init();
    let file = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/orders.yaml");
    let (app, settings) = Settings::load_with::<App>(file, "app")?;
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(app.max_connections)
        .test_when_idle(TEST_AFTER_IDLE)
        .connect(&app.database_url)
        .await?;
    // Your migrations create the business tables; the example makes its own.
    sqlx::raw_sql("CREATE TABLE IF NOT EXISTS orders (id bigserial PRIMARY KEY, body text)")
        .execute(&pool)
        .await?;
    // Store, caches, outbox, relay to NATS, cleanup job, meters: all from `settings`.
    let idempotency = Builder::new(&settings)
        .prometheus(idempotency::metrics::install()?)
        .build(pool)
        .await?;
    let router = Router::new()
        .route("/orders", post(create_order))
        // Keys belong to the tenant the gateway authenticated: it sets X-Tenant-Id and strips
        // the client's. Without such a gateway, use PrincipalScope (see orders_postgres.rs).
        .route_layer(idempotency.layer().scope::<TenantHeader>())
        .with_state(idempotency.outbox()?.clone())
        .merge(idempotency.metrics_router())
        .merge(idempotency.health_router());
    let listener = tokio::net::TcpListener::bind(&app.listen).await?;
    axum::serve(listener, router)
        .with_graceful_shutdown(idempotency::shutdown_signal())
        .await?;
    let report = idempotency.shutdown().await;
    tracing::info!(?report, "stopped");
    Ok(())
}
