//! An orders service on SQLite (a file, no server), idempotent from `examples/orders.yaml`:
//!
//! ```sh
//! cargo run -p idempotency --features sqlite,axum --example orders_sqlite
//! curl -i localhost:3000/orders -H 'Idempotency-Key: k-1' -H 'Content-Type: application/json' -d '{"sku":"A-1"}'
//! ```
//!
//! The same request again answers the stored response with `Idempotent-Replayed: true`.

use axum::{Json, Router, routing::post};
use idempotency::{
    Idempotency, Settings, axum::Error, axum::IdempotentTx, sqlite::SqliteStore, sqlx,
};
use serde_json::Value;

async fn create_order(
    mut tx: IdempotentTx<SqliteStore>,
    Json(order): Json<Value>,
) -> Result<Json<Value>, Error> {
    let insert = sqlx::query("INSERT INTO orders (body) VALUES ($1)").bind(order.to_string());
    insert.execute(&mut *tx).await.map_err(Error::internal)?; // commits with the idempotency record
    Ok(Json(order))
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let settings = Settings::load(concat!(env!("CARGO_MANIFEST_DIR"), "/examples/orders.yaml"))?;
    let pool = sqlx::SqlitePool::connect("sqlite://orders.db?mode=rwc").await?;
    sqlx::raw_sql("CREATE TABLE IF NOT EXISTS orders (id INTEGER PRIMARY KEY, body text)")
        .execute(&pool)
        .await?;
    let idempotency = Idempotency::from_config(&settings, pool).await?;
    let app = Router::new()
        .route("/orders", post(create_order))
        .route_layer(idempotency.layer());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
    axum::serve(listener, app)
        .with_graceful_shutdown(async { tokio::signal::ctrl_c().await.unwrap_or(()) })
        .await?;
    idempotency.shutdown().await;
    Ok(())
}
