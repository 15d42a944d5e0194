//! An orders service on SQLite (a file, no server), idempotent from `examples/orders_minimal.yaml`:
//!
//! ```sh
//! cargo run -p idempotency --features sqlite,axum --example orders_sqlite
//! curl -i localhost:3000/orders -H 'Authorization: Bearer alice-token' \
//!   -H 'Idempotency-Key: k-1' -H 'Content-Type: application/json' -d '{"sku":"A-1"}'
//! ```
//!
//! The same request again answers the stored response with `Idempotent-Replayed: true`. The
//! keys are scoped by the authenticated caller: `bob-token` with Alice's key runs on its own
//! and never sees her response.

use axum::extract::Request;
use axum::http::{StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::{Json, Router, routing::post};
use idempotency::axum::PrincipalScope;
use idempotency::core::Scope;
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

/// Stands in for your authentication (a verified JWT, a session): a known bearer token becomes
/// the caller's `Scope`, the principal its idempotency keys belong to; no caller is a 401.
async fn authenticate(mut request: Request, next: Next) -> Response {
    const CALLERS: &[(&str, &str)] = &[("alice-token", "alice"), ("bob-token", "bob")];
    let bearer = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.strip_prefix("Bearer "));
    let caller = CALLERS.iter().find(|(token, _)| Some(*token) == bearer);
    match caller.map(|(_, name)| Scope::new(*name)) {
        Some(Ok(scope)) => {
            request.extensions_mut().insert(scope);
            next.run(request).await
        }
        _ => StatusCode::UNAUTHORIZED.into_response(),
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let settings = Settings::load(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/examples/orders_minimal.yaml"
    ))?;
    // WAL, a busy timeout, and no connection back into the pool while a transaction is open.
    let pool =
        idempotency::sqlite::open_pool(idempotency::sqlite::connect_options("orders.db")?).await?;
    sqlx::raw_sql("CREATE TABLE IF NOT EXISTS orders (id INTEGER PRIMARY KEY, body text)")
        .execute(&pool)
        .await?;
    let idempotency = Idempotency::from_config(&settings, pool).await?;
    let app = Router::new()
        .route("/orders", post(create_order))
        // Keys belong to the authenticated caller: a replay answers before the handler runs,
        // so a key's scope must be at least as narrow as who may read its response.
        .route_layer(idempotency.layer().scope::<PrincipalScope<Scope>>())
        .layer(middleware::from_fn(authenticate));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
    axum::serve(listener, app)
        .with_graceful_shutdown(async { tokio::signal::ctrl_c().await.unwrap_or(()) })
        .await?;
    idempotency.shutdown().await;
    Ok(())
}
