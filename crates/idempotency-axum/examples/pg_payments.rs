//! A payments endpoint on PostgreSQL: a retried `POST /payments` with the same
//! `Idempotency-Key` replays the first answer instead of charging twice.
//!
//! ```sh
//! DATABASE_URL=postgres://postgres@127.0.0.1/test cargo run -p idempotency-axum --example pg_payments
//! curl -i -X POST localhost:3000/payments -H 'Authorization: Bearer alice-token' \
//!      -H 'Idempotency-Key: k-1' \
//!      -H 'Content-Type: application/json' -d '{"order_id":"o-1","amount_cents":4900}'
//! ```
//!
//! Keys belong to the authenticated caller: `bob-token` with Alice's key runs on its own and
//! never sees her payment. The scope must come from the authenticated principal, at least as
//! fine-grained as who may read a response: a replay answers before the handler's own checks
//! run, so a call without a scope (`Call::new` alone: one scope shared by every client) would
//! hand Alice's payment to anyone who sends her key.

use axum::extract::{Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use idempotency_axum::{Error, IdempotentJson, OutcomeExt, PrincipalScope, ScopedKey};
use idempotency_core::config::{PersistenceConfig, SchemaMode};
use idempotency_core::{ExecutionResult, Scope};
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
    // The `Idempotency-Key` header, scoped by the caller that `authenticate` put in the request.
    key: ScopedKey<PrincipalScope<Scope>>,
    Json(request): Json<CreatePayment>,
) -> Result<IdempotentJson<Payment>, Error> {
    let call = key.call("CREATE_PAYMENT", &request);
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
        .layer(middleware::from_fn(authenticate))
        .with_state(service);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
    axum::serve(listener, app).await?;
    Ok(())
}
