//! The application: shared state, the router, and the business handlers.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use axum::extract::{DefaultBodyLimit, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use idempotency_axum::{
    Error, IDEMPOTENT_REPLAYED, IdempotencyKeyHeader, OutcomeExt, ProblemJson, ProblemPath,
    ScopedKey, UuidKeyHeader,
};
use idempotency_core::ExecutionResult;
use idempotency_outbox::{Enqueue, NewEvent};
use metrics_exporter_prometheus::PrometheusHandle;
use uuid::Uuid;

use crate::config::BusinessConfig;
use crate::db::Database;
#[allow(unused_imports)] // the OpenAPI attributes name these types
use crate::model::{Charge, Payment as PaymentDoc};
use crate::model::{
    ChargeCreated, ChargeCreatedEvent, CreateCharge, CreatePayment, CreateRefund,
    InsufficientFunds, Payment, Refund, RefundLimit,
};
use crate::ops;
use crate::problem::{method_not_allowed, not_found};
use crate::scope::OptionalTenant;

/// The idempotency service of the demo: moka and Redis when configured, metrics on the facade.
pub type DemoService<S> = idempotency::Service<S>;

/// What every handler shares. Cheap to clone.
pub struct App<DB: Database> {
    /// The database.
    pub db: DB,
    /// The idempotency service.
    pub service: DemoService<DB::Store>,
    /// The business rules.
    pub rules: Arc<BusinessConfig>,
    /// The facade's health probes (`Idempotency::health_check`): `/health/live`,
    /// `/health/ready` and `/health` are served from them when set.
    pub health: Option<idempotency::health::HealthCheck<DB::Pool>>,
    /// The Prometheus recorder, for `GET /metrics`.
    pub prometheus: Option<PrometheusHandle>,
    /// Keys whose `FAIL_ONCE` payment already failed once.
    failed_once: Arc<FailedOnce>,
}

impl<DB: Database> Clone for App<DB> {
    fn clone(&self) -> Self {
        Self {
            db: self.db.clone(),
            service: self.service.clone(),
            rules: Arc::clone(&self.rules),
            health: self.health.clone(),
            prometheus: self.prometheus.clone(),
            failed_once: Arc::clone(&self.failed_once),
        }
    }
}

impl<DB: Database> App<DB> {
    /// Assembles the state.
    pub fn new(db: DB, service: DemoService<DB::Store>, rules: BusinessConfig) -> Self {
        Self {
            db,
            service,
            rules: Arc::new(rules),
            health: None,
            prometheus: None,
            failed_once: Arc::default(),
        }
    }

    /// Whether this is the first `FAIL_ONCE` attempt for the key (which then fails).
    pub(crate) fn first_failure(&self, key: &str) -> bool {
        self.failed_once.first(key)
    }
}

/// The keys whose `FAIL_ONCE` payment already failed, at most [`FailedOnce::MAX`]: a client
/// sending fresh keys cannot grow it without bound. When full it starts over, so a key seen
/// long ago may fail once more (its retry then succeeds, as the scenario expects).
#[derive(Debug, Default)]
pub(crate) struct FailedOnce(Mutex<HashSet<String>>);

impl FailedOnce {
    /// The most keys remembered.
    pub(crate) const MAX: usize = 10_000;

    /// Whether `key` is seen for the first time (and remembers it).
    pub(crate) fn first(&self, key: &str) -> bool {
        let Ok(mut seen) = self.0.lock() else {
            return false;
        };
        if seen.len() >= Self::MAX && !seen.contains(key) {
            seen.clear();
        }
        seen.insert(key.to_owned())
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.0.lock().map(|seen| seen.len()).unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::FailedOnce;

    /// Issue 53: the set grew by one key per `FAIL_ONCE` request, without bound.
    #[test]
    fn failed_once_remembers_each_key_once_and_stays_bounded() {
        let failed = FailedOnce::default();
        assert!(failed.first("a"));
        assert!(!failed.first("a"), "the retry succeeds");
        for i in 0..FailedOnce::MAX + 500 {
            failed.first(&format!("k-{i}"));
        }
        assert!(failed.len() <= FailedOnce::MAX, "{}", failed.len());
    }
}

impl<DB: Database> std::fmt::Debug for App<DB> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("App")
            .field("db", &self.db.describe())
            .finish_non_exhaustive()
    }
}

/// Every route of the demo.
pub fn router<DB: Database>(app: App<DB>, max_body_bytes: usize) -> Router {
    let v2 = crate::v2::routes(&app, max_body_bytes);
    let health = match app.health.clone() {
        Some(check) => check.router(),
        None => Router::new(),
    };
    Router::new()
        .route("/api/payments", post(create_payment::<DB>))
        .route(
            "/api/payments/unprotected",
            post(create_payment_unprotected::<DB>),
        )
        .route("/api/payments/validate", post(validate_payment))
        .route("/api/refunds", post(create_refund::<DB>))
        .route("/charges", post(create_charge::<DB>))
        .route("/charges/{id}", get(get_charge::<DB>))
        .route("/metrics", get(ops::metrics::<DB>))
        .route("/openapi.json", get(crate::openapi::document))
        .merge(health)
        .merge(v2)
        .layer(DefaultBodyLimit::max(max_body_bytes))
        .layer(axum::middleware::map_response(bare_errors))
        .with_state(Arc::new(app))
}

/// axum's own answers for a path no route serves (404) and a method its route does not serve
/// (405) have no body: they are answered as problems like the demo's others
/// (`not-found`, `method-not-allowed`), the `Allow` header kept. Every answer of the demo's
/// own has a content type and passes untouched (a `GET /charges/{id}` of an unknown charge),
/// as does a replay. `main` layers it again over the router with `/admin` nested in it.
pub async fn bare_errors(response: Response) -> Response {
    let status = response.status();
    let bare = response.headers().get(header::CONTENT_TYPE).is_none()
        && axum::body::HttpBody::size_hint(response.body()).exact() == Some(0)
        && response.headers().get(&IDEMPOTENT_REPLAYED).is_none();
    if !bare
        || !matches!(
            status,
            StatusCode::NOT_FOUND | StatusCode::METHOD_NOT_ALLOWED
        )
    {
        return response;
    }
    let allow = response.headers().get(header::ALLOW).cloned();
    let mut answer = if status == StatusCode::NOT_FOUND {
        not_found("route").into_response()
    } else {
        method_not_allowed().into_response()
    };
    if let Some(allow) = allow {
        answer.headers_mut().insert(header::ALLOW, allow);
    }
    answer
}

pub(crate) fn technical(message: &'static str) -> Error {
    Error::internal(message)
}

/// A business statement failed: classified like the store's own errors, so a lost connection
/// answers 503 `store-unavailable` and a serialization failure 409, not 500.
pub(crate) fn database<DB: Database>(error: sqlx::Error) -> Error {
    Error::from(idempotency_core::Error::Store(DB::classify(error)))
}

/// An outbox enqueue failed: the same classification.
pub(crate) fn outbox_error(error: idempotency_outbox::Error) -> Error {
    use idempotency_core::StoreError;
    match error {
        idempotency_outbox::Error::Unavailable(e) => {
            Error::from(idempotency_core::Error::Store(StoreError::Unavailable(e)))
        }
        idempotency_outbox::Error::Conflict(e) => {
            Error::from(idempotency_core::Error::Store(StoreError::Conflict(e)))
        }
        other => Error::internal(other),
    }
}

/// `POST /api/payments` (reference 001): 201 with the payment, or 422 `INSUFFICIENT_FUNDS`;
/// `FAIL_ONCE` fails with 500 once per key, `FAIL_TECH` always.
#[utoipa::path(
    post,
    path = "/api/payments",
    request_body = CreatePayment,
    params(crate::openapi::KeyHeader, crate::openapi::TenantHeader),
    responses(
        (status = 201, description = "The payment (replays carry Idempotent-Replayed)", body = Payment, headers(("Idempotent-Replayed" = String, description = "`true` when the stored outcome of an earlier request is replayed"))),
        crate::openapi::IdempotencyProblems,
    )
)]
pub(crate) async fn create_payment<DB: Database>(
    State(app): State<Arc<App<DB>>>,
    key: ScopedKey<OptionalTenant, IdempotencyKeyHeader>,
    ProblemJson(body): ProblemJson<CreatePayment>,
) -> Result<Response, Response> {
    let request = body.validate().map_err(IntoResponse::into_response)?;
    let failure_key = format!("{}/{}", key.scope, key.key.key().as_str());
    let outcome = app
        .service
        .execute(key.call("CREATE_PAYMENT", &request), async |conn| {
            match request.recipient.as_str() {
                "FAIL_TECH" => return Err(technical("simulated technical failure (FAIL_TECH)")),
                "FAIL_ONCE" if app.first_failure(&failure_key) => {
                    return Err(technical("simulated technical failure (FAIL_ONCE)"));
                }
                _ => {}
            }
            if request.amount > app.rules.available_balance {
                let details = InsufficientFunds {
                    requested_amount: request.amount,
                    available_balance: app.rules.available_balance,
                };
                return ExecutionResult::rejected_with("INSUFFICIENT_FUNDS", &details)
                    .map_err(Error::internal);
            }
            let payment = Payment {
                payment_id: Uuid::now_v7(),
                order_id: request.order_id.clone(),
                amount: request.amount,
                status: "CONFIRMED".to_owned(),
            };
            DB::insert_payment(conn, &payment, &request.recipient)
                .await
                .map_err(database::<DB>)?;
            Ok(ExecutionResult::success(payment))
        })
        .await
        .map_err(IntoResponse::into_response)?;
    Ok(outcome.into_json(StatusCode::CREATED).into_response())
}

/// `POST /api/payments/unprotected`: the same payment without idempotency, for comparison in
/// benchmarks, and to show what a retry does without a key: a second payment.
#[utoipa::path(
    post,
    path = "/api/payments/unprotected",
    request_body = CreatePayment,
    responses(
        (status = 201, description = "A new payment, every time", body = Payment),
        crate::openapi::BodyProblems,
        (status = 409, description = "The transaction conflicted with a concurrent one (`transaction-conflict`); retrying is safe", body = crate::openapi::Problem, content_type = "application/problem+json"),
        (status = 500, description = "Technical failure", body = crate::openapi::Problem, content_type = "application/problem+json"),
        (status = 503, description = "Database unavailable", body = crate::openapi::Problem, content_type = "application/problem+json"),
    )
)]
pub(crate) async fn create_payment_unprotected<DB: Database>(
    State(app): State<Arc<App<DB>>>,
    ProblemJson(body): ProblemJson<CreatePayment>,
) -> Result<Response, Response> {
    let request = body.validate().map_err(IntoResponse::into_response)?;
    let payment = Payment {
        payment_id: Uuid::now_v7(),
        order_id: request.order_id.clone(),
        amount: request.amount,
        status: "CONFIRMED".to_owned(),
    };
    let failed = |error: idempotency_core::StoreError| {
        Error::from(idempotency_core::Error::Store(error)).into_response()
    };
    let mut tx = app.service.begin().await.map_err(failed)?;
    DB::insert_payment(&mut tx, &payment, &request.recipient)
        .await
        .map_err(|e| database::<DB>(e).into_response())?;
    tx.commit().await.map_err(failed)?;
    Ok((StatusCode::CREATED, Json(payment)).into_response())
}

/// `POST /api/payments/validate`: checks a payment request as `POST /api/payments` would and
/// answers it normalized (the amount with two decimals), without paying, touching the database
/// or needing a key. The HTTP bench's floor: every payment request costs at least this.
#[utoipa::path(
    post,
    path = "/api/payments/validate",
    request_body = CreatePayment,
    responses(
        (status = 200, description = "The request, valid and normalized; nothing is paid", body = CreatePayment),
        crate::openapi::BodyProblems,
    )
)]
pub(crate) async fn validate_payment(
    ProblemJson(body): ProblemJson<CreatePayment>,
) -> Result<Json<CreatePayment>, Response> {
    body.validate()
        .map(Json)
        .map_err(IntoResponse::into_response)
}

/// `POST /api/refunds` (reference 001): 200 with the refund, or 422 `REFUND_LIMIT_EXCEEDED`.
#[utoipa::path(
    post,
    path = "/api/refunds",
    request_body = CreateRefund,
    params(crate::openapi::KeyHeader, crate::openapi::TenantHeader),
    responses(
        (status = 200, description = "The refund (replays carry Idempotent-Replayed)", body = Refund, headers(("Idempotent-Replayed" = String, description = "`true` when the stored outcome of an earlier request is replayed"))),
        crate::openapi::IdempotencyProblems,
    )
)]
pub(crate) async fn create_refund<DB: Database>(
    State(app): State<Arc<App<DB>>>,
    key: ScopedKey<OptionalTenant, IdempotencyKeyHeader>,
    ProblemJson(body): ProblemJson<CreateRefund>,
) -> Result<Response, Response> {
    let request = body.validate().map_err(IntoResponse::into_response)?;
    let outcome = app
        .service
        .execute(key.call("REFUND", &request), async |conn| {
            if request.amount > app.rules.refund_limit {
                let details = RefundLimit {
                    requested_amount: request.amount,
                    limit: app.rules.refund_limit,
                };
                return ExecutionResult::rejected_with("REFUND_LIMIT_EXCEEDED", &details)
                    .map_err(Error::internal);
            }
            let refund = Refund {
                refund_id: Uuid::now_v7(),
                payment_id: request.payment_id.clone(),
                amount: request.amount,
                status: "REFUNDED".to_owned(),
            };
            DB::insert_refund(conn, &refund)
                .await
                .map_err(database::<DB>)?;
            Ok(ExecutionResult::success(refund))
        })
        .await
        .map_err(IntoResponse::into_response)?;
    Ok(outcome.into_json(StatusCode::OK).into_response())
}

/// `POST /charges` (reference 000): UUID keys; the charge, the idempotency record and a
/// `ChargeCreated` outbox event commit in one transaction.
#[utoipa::path(
    post,
    path = "/charges",
    request_body = CreateCharge,
    params(crate::openapi::UuidKeyHeader, crate::openapi::TenantHeader),
    responses(
        (status = 201, description = "The charge id (replays carry Idempotent-Replayed)", body = ChargeCreated, headers(("Idempotent-Replayed" = String, description = "`true` when the stored outcome of an earlier request is replayed"))),
        crate::openapi::IdempotencyProblems,
    )
)]
pub(crate) async fn create_charge<DB: Database>(
    State(app): State<Arc<App<DB>>>,
    key: ScopedKey<OptionalTenant, UuidKeyHeader>,
    ProblemJson(body): ProblemJson<CreateCharge>,
) -> Result<Response, Response> {
    let request = body.validate().map_err(IntoResponse::into_response)?;
    let outbox = app.db.outbox().clone();
    let outcome = app
        .service
        .execute(key.call("POST:/charges", &request), async |conn| {
            let id = Uuid::now_v7();
            DB::insert_charge(conn, id, request.amount_cents)
                .await
                .map_err(database::<DB>)?;
            let event = ChargeCreatedEvent {
                charge_id: id,
                amount_cents: request.amount_cents,
            };
            let event = NewEvent::new("charge", id.to_string(), "ChargeCreated", &event)
                .map_err(Error::internal)?;
            outbox
                .enqueue_all(conn, &[event])
                .await
                .map_err(outbox_error)?;
            Ok::<_, Error>(ExecutionResult::success(ChargeCreated { id }))
        })
        .await
        .map_err(IntoResponse::into_response)?;
    Ok(outcome.into_json(StatusCode::CREATED).into_response())
}

/// `GET /charges/{id}`.
#[utoipa::path(
    get,
    path = "/charges/{id}",
    params(("id" = String, Path, description = "The charge id")),
    responses(
        (status = 200, description = "The charge", body = Charge),
        (status = 400, description = "The id is not UTF-8 once percent-decoded (`invalid-request-path`)", body = crate::openapi::Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such charge", body = crate::openapi::Problem, content_type = "application/problem+json"),
        (status = 409, description = "The read conflicted with a concurrent transaction (`transaction-conflict`); retrying is safe", body = crate::openapi::Problem, content_type = "application/problem+json"),
        (status = 500, description = "Technical failure", body = crate::openapi::Problem, content_type = "application/problem+json"),
        (status = 503, description = "Database unavailable (`store-unavailable`)", body = crate::openapi::Problem, content_type = "application/problem+json"),
    )
)]
pub(crate) async fn get_charge<DB: Database>(
    State(app): State<Arc<App<DB>>>,
    ProblemPath(id): ProblemPath<String>,
) -> Result<Response, Response> {
    let id = Uuid::parse_str(&id).map_err(|_| not_found("charge").into_response())?;
    match app.db.find_charge(id).await {
        Ok(Some(charge)) => Ok(Json(charge).into_response()),
        Ok(None) => Err(not_found("charge").into_response()),
        Err(error) => Err(database::<DB>(error).into_response()),
    }
}
