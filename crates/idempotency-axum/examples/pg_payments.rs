//! A payments endpoint on PostgreSQL: a retried `POST /payments` with the same
//! `Idempotency-Key` replays the first answer instead of charging twice.
//!
//! ```sh
//! DATABASE_URL=postgres://postgres@127.0.0.1/test cargo run -p idempotency-axum --example pg_payments
//! curl -i -X POST localhost:3000/payments -H 'Idempotency-Key: k-1' \
//!      -H 'Content-Type: application/json' -d '{"order_id":"o-1","amount_cents":4900}'
//! ```

use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::post;
use axum::{Json, Router};
use idempotency_axum::{Error, IdempotencyKeyHeader, IdempotentJson, OutcomeExt};
use idempotency_core::ExecutionResult;
use idempotency_core::config::{PersistenceConfig, SchemaMode};
use idempotency_pg::{PgIdempotencyService, PgStore, sqlx};

#[derive(serde::Serialize, serde::Deserialize)]
struct CreatePayment {
    order_id: String,
    amount_cents: i64,
}

#[derive(serde::Serialize, serde::Deserialize)]
struct Payment {
    id: i64,
    order_id: String,
}

async fn create_payment(
    State(service): State<PgIdempotencyService>,
    IdempotencyKeyHeader(key): IdempotencyKeyHeader,
    Json(request): Json<CreatePayment>,
) -> Result<IdempotentJson<Payment>, Error> {
    let call = idempotency_core::Call::new("CREATE_PAYMENT", key, &request);
    let outcome = service
        .execute(call, async |conn| {
            if request.amount_cents > 100_000 {
                return Ok::<_, Error>(ExecutionResult::rejected("LIMIT_EXCEEDED")); // replayed too
            }
            let id: i64 = sqlx::query_scalar(
                "INSERT INTO payments (order_id, amount_cents) VALUES ($1, $2) RETURNING id",
            )
            .bind(&request.order_id)
            .bind(request.amount_cents)
            .fetch_one(&mut *conn) // the same transaction as the idempotency record
            .await
            .map_err(Error::internal)?;
            Ok(ExecutionResult::success(Payment {
                id,
                order_id: request.order_id.clone(),
            }))
        })
        .await?;
    Ok(outcome.into_json(StatusCode::CREATED))
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned());
    let pool = sqlx::PgPool::connect(&url).await?;
    sqlx::query("CREATE TABLE IF NOT EXISTS payments (id bigserial PRIMARY KEY, order_id text, amount_cents bigint)")
        .execute(&pool)
        .await?;
    let mut persistence = PersistenceConfig::default();
    persistence.schema.mode = SchemaMode::Create; // `validate` in production, with migrations/
    let service = PgIdempotencyService::new(PgStore::from_config(pool, &persistence).await?);
    let app = Router::new()
        .route("/payments", post(create_payment))
        .with_state(service);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
    axum::serve(listener, app).await?;
    Ok(())
}
