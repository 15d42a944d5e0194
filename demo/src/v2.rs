//! `/v2/payments`, `/v2/refunds` and `/v2/charges`: the same business as `/api/payments`,
//! `/api/refunds` and `/charges`, made idempotent by `IdempotencyLayer` alone; and
//! `/v2/accounts/{account}/deposits`, whose target (the account in the path, the note in the
//! query) is part of the request's identity; and `/v2/payments/optimistic`, the same payment
//! behind the layer's optimistic mode (`IdempotencyLayer::optimistic`). The handlers
//! hold no idempotency code: they run their statements on the layer's transaction
//! (`IdempotentTx`) and return a response, which the layer stores in that transaction.

use std::sync::Arc;

use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use idempotency_axum::{
    Error, IdempotencyLayer, IdempotentTx, ProblemJson, ProblemPath, ProblemQuery,
    rejection_problem,
};
use idempotency_core::Rejection;
use idempotency_outbox::{Enqueue, NewEvent};
use uuid::Uuid;

use crate::app::{App, database, outbox_error, technical};
use crate::db::Database;
#[allow(unused_imports)] // the OpenAPI attributes name these types
use crate::model::Payment as PaymentDoc;
use crate::model::{
    ChargeCreated, ChargeCreatedEvent, CreateCharge, CreateDeposit, CreatePayment, CreateRefund,
    Deposit, DepositQuery, InsufficientFunds, Payment, Refund, RefundLimit,
};
use crate::scope::OptionalTenant;

/// The `/v2` routes, each behind the layer (UUID keys for `/v2/charges`).
pub(crate) fn routes<DB: Database>(app: &App<DB>, max_body_bytes: usize) -> Router<Arc<App<DB>>> {
    // POST only: the layer wraps the routes' 405 answers too, and a PUT must be a 405 whatever
    // its key.
    let layer = IdempotencyLayer::new(app.service.clone())
        .methods([Method::POST])
        .scope::<OptionalTenant>()
        .max_request_body(max_body_bytes);
    Router::new()
        .route("/v2/payments", post(create_payment::<DB>))
        .route("/v2/refunds", post(create_refund::<DB>))
        .route("/v2/accounts/{account}/deposits", post(create_deposit))
        .route_layer(layer.clone())
        .merge(
            Router::new()
                .route("/v2/charges", post(create_charge::<DB>))
                .route_layer(layer.clone().uuid_keys()),
        )
        .merge(
            Router::new()
                .route(
                    "/v2/payments/optimistic",
                    post(create_payment_optimistic::<DB>),
                )
                .route_layer(layer.optimistic()),
        )
}

/// A business rejection, answered as `/api` answers it: `request-rejected` with the code and
/// the details, 422. The layer stores it like any deterministic client error.
fn rejected<D: serde::Serialize>(code: &str, details: &D) -> Response {
    match Rejection::with_details(code, details) {
        Ok(rejection) => {
            rejection_problem(&rejection, StatusCode::UNPROCESSABLE_ENTITY).into_response()
        }
        Err(error) => Error::internal(error).into_response(),
    }
}

/// `POST /v2/payments`: `POST /api/payments` behind the layer.
#[utoipa::path(
    post,
    path = "/v2/payments",
    request_body = CreatePayment,
    params(crate::openapi::KeyHeader, crate::openapi::TenantHeader),
    responses(
        (status = 201, description = "The payment (replays carry Idempotent-Replayed)", body = Payment, headers(("Idempotent-Replayed" = String, description = "`true` when the stored response of an earlier request is replayed"))),
        crate::openapi::IdempotencyProblems,
    )
)]
pub(crate) async fn create_payment<DB: Database>(
    State(app): State<Arc<App<DB>>>,
    headers: HeaderMap,
    tx: IdempotentTx<DB::Store>,
    ProblemJson(body): ProblemJson<CreatePayment>,
) -> Result<Response, Response> {
    pay(&app, "v2", &headers, tx, body).await
}

/// `POST /v2/payments/optimistic`: `POST /v2/payments` behind the layer's optimistic mode.
/// The handler runs before the key is recorded, and the payment and its stored response are
/// inserted in one transaction: two statements fewer per first execution than
/// `/v2/payments`. Concurrent duplicates may each run the handler; one commits, the others
/// roll their payment back and answer its response.
#[utoipa::path(
    post,
    path = "/v2/payments/optimistic",
    request_body = CreatePayment,
    params(crate::openapi::KeyHeader, crate::openapi::TenantHeader),
    responses(
        (status = 201, description = "The payment (replays carry Idempotent-Replayed)", body = Payment, headers(("Idempotent-Replayed" = String, description = "`true` when the stored response of an earlier request is replayed"))),
        crate::openapi::IdempotencyProblems,
    )
)]
pub(crate) async fn create_payment_optimistic<DB: Database>(
    State(app): State<Arc<App<DB>>>,
    headers: HeaderMap,
    tx: IdempotentTx<DB::Store>,
    ProblemJson(body): ProblemJson<CreatePayment>,
) -> Result<Response, Response> {
    pay(&app, "v2-optimistic", &headers, tx, body).await
}

/// The payment of both `/v2` payment routes; `route` keeps their `FAIL_ONCE` simulations
/// apart.
async fn pay<DB: Database>(
    app: &App<DB>,
    route: &str,
    headers: &HeaderMap,
    mut tx: IdempotentTx<DB::Store>,
    body: CreatePayment,
) -> Result<Response, Response> {
    let request = body.validate().map_err(IntoResponse::into_response)?;
    match request.recipient.as_str() {
        "FAIL_TECH" => {
            return Err(technical("simulated technical failure (FAIL_TECH)").into_response());
        }
        // The simulation fails once per (tenant, key); reading the headers for it is the
        // demo's fault injection, not idempotency code.
        "FAIL_ONCE" if app.first_failure(&failure_key(route, headers)) => {
            return Err(technical("simulated technical failure (FAIL_ONCE)").into_response());
        }
        _ => {}
    }
    if request.amount > app.rules.available_balance {
        let details = InsufficientFunds {
            requested_amount: request.amount,
            available_balance: app.rules.available_balance,
        };
        return Ok(rejected("INSUFFICIENT_FUNDS", &details));
    }
    let payment = Payment {
        payment_id: Uuid::now_v7(),
        order_id: request.order_id.clone(),
        amount: request.amount,
        status: "CONFIRMED".to_owned(),
    };
    DB::insert_payment(&mut tx, &payment, &request.recipient)
        .await
        .map_err(|e| database::<DB>(e).into_response())?;
    Ok((StatusCode::CREATED, Json(payment)).into_response())
}

/// The `FAIL_ONCE` memory's key: the route, the tenant and the key as the layer reads it (a
/// bare `fo-1` and a quoted `"fo-1"` are one key, failed once between them, as on `/api`).
fn failure_key(route: &str, headers: &HeaderMap) -> String {
    let tenant = headers
        .get("x-tenant-id")
        .map(|v| String::from_utf8_lossy(v.as_bytes()).trim().to_owned())
        .unwrap_or_default();
    let key = headers
        .get("idempotency-key")
        .map(|v| match idempotency_axum::parse_key(v.as_bytes()) {
            Ok(key) => key.as_str().to_owned(),
            Err(_) => String::from_utf8_lossy(v.as_bytes()).into_owned(),
        })
        .unwrap_or_default();
    format!("{route}/{tenant}/{key}")
}

/// `POST /v2/refunds`: `POST /api/refunds` behind the layer.
#[utoipa::path(
    post,
    path = "/v2/refunds",
    request_body = CreateRefund,
    params(crate::openapi::KeyHeader, crate::openapi::TenantHeader),
    responses(
        (status = 200, description = "The refund (replays carry Idempotent-Replayed)", body = Refund, headers(("Idempotent-Replayed" = String, description = "`true` when the stored response of an earlier request is replayed"))),
        crate::openapi::IdempotencyProblems,
    )
)]
pub(crate) async fn create_refund<DB: Database>(
    State(app): State<Arc<App<DB>>>,
    mut tx: IdempotentTx<DB::Store>,
    ProblemJson(body): ProblemJson<CreateRefund>,
) -> Result<Response, Response> {
    let request = body.validate().map_err(IntoResponse::into_response)?;
    if request.amount > app.rules.refund_limit {
        let details = RefundLimit {
            requested_amount: request.amount,
            limit: app.rules.refund_limit,
        };
        return Ok(rejected("REFUND_LIMIT_EXCEEDED", &details));
    }
    let refund = Refund {
        refund_id: Uuid::now_v7(),
        payment_id: request.payment_id.clone(),
        amount: request.amount,
        status: "REFUNDED".to_owned(),
    };
    DB::insert_refund(&mut tx, &refund)
        .await
        .map_err(|e| database::<DB>(e).into_response())?;
    Ok((StatusCode::OK, Json(refund)).into_response())
}

/// `POST /v2/charges`: `POST /charges` behind the layer; the charge, its `ChargeCreated`
/// event and the stored response commit in the layer's transaction.
#[utoipa::path(
    post,
    path = "/v2/charges",
    request_body = CreateCharge,
    params(crate::openapi::UuidKeyHeader, crate::openapi::TenantHeader),
    responses(
        (status = 201, description = "The charge id (replays carry Idempotent-Replayed)", body = ChargeCreated, headers(("Idempotent-Replayed" = String, description = "`true` when the stored response of an earlier request is replayed"))),
        crate::openapi::IdempotencyProblems,
    )
)]
pub(crate) async fn create_charge<DB: Database>(
    State(app): State<Arc<App<DB>>>,
    mut tx: IdempotentTx<DB::Store>,
    ProblemJson(body): ProblemJson<CreateCharge>,
) -> Result<Response, Response> {
    let request = body.validate().map_err(IntoResponse::into_response)?;
    let id = Uuid::now_v7();
    DB::insert_charge(&mut tx, id, request.amount_cents)
        .await
        .map_err(|e| database::<DB>(e).into_response())?;
    let event = ChargeCreatedEvent {
        charge_id: id,
        amount_cents: request.amount_cents,
    };
    let event = NewEvent::new("charge", id.to_string(), "ChargeCreated", &event)
        .map_err(|e| Error::internal(e).into_response())?;
    app.db
        .outbox()
        .enqueue_all(&mut tx, &[event])
        .await
        .map_err(|e| outbox_error(e).into_response())?;
    Ok((StatusCode::CREATED, Json(ChargeCreated { id })).into_response())
}

/// `POST /v2/accounts/{account}/deposits`: a deposit to the account in the path, with an
/// optional `?note=`. The same key and body for another account (or another note) is
/// `422 idempotency-key-reused`: the layer fingerprints the concrete path and query.
#[utoipa::path(
    post,
    path = "/v2/accounts/{account}/deposits",
    request_body = CreateDeposit,
    params(
        ("account" = String, Path, description = "The account credited"),
        DepositQuery,
        crate::openapi::KeyHeader,
        crate::openapi::TenantHeader,
    ),
    responses(
        (status = 201, description = "The deposit (replays carry Idempotent-Replayed)", body = Deposit, headers(("Idempotent-Replayed" = String, description = "`true` when the stored response of an earlier request is replayed"))),
        crate::openapi::IdempotencyProblems,
    )
)]
pub(crate) async fn create_deposit(
    ProblemPath(account): ProblemPath<String>,
    ProblemQuery(query): ProblemQuery<DepositQuery>,
    ProblemJson(body): ProblemJson<CreateDeposit>,
) -> Result<Response, Response> {
    let request = body
        .validate(&account)
        .map_err(IntoResponse::into_response)?;
    let deposit = Deposit {
        deposit_id: Uuid::now_v7(),
        account,
        amount: request.amount,
        note: query.note,
    };
    Ok((StatusCode::CREATED, Json(deposit)).into_response())
}
