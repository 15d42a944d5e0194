//! The OpenAPI 3.1 document of the demo (utoipa), served at `GET /openapi.json`.

use std::collections::BTreeMap;

use axum::Json;
use utoipa::openapi::OpenApi as Document;
use utoipa::{IntoParams, IntoResponses, OpenApi, ToSchema};

use crate::model::{
    Charge, ChargeCreated, CreateCharge, CreateDeposit, CreatePayment, CreateRefund, Deposit,
    InsufficientFunds, Payment, Refund, RefundLimit,
};

/// An RFC 9457 problem, as every error of the demo is answered.
#[derive(Debug, ToSchema)]
#[allow(dead_code)] // documentation only
pub struct Problem {
    /// A stable URI naming the kind of problem.
    #[schema(format = "uri")]
    r#type: String,
    /// A short summary of the kind.
    title: String,
    /// The HTTP status.
    status: u16,
    /// What happened in this occurrence.
    detail: Option<String>,
    /// For `request-rejected`: the business rejection code; for `idempotency-key-reused`:
    /// `IDEMPOTENCY_KEY_CONFLICT`.
    code: Option<String>,
    /// For `request-rejected`: the rejection details.
    details: Option<BTreeMap<String, serde_json::Value>>,
    /// For `idempotency-key-invalid`: why the key was refused.
    reason: Option<String>,
    /// For `invalid-request`: the field at fault.
    field: Option<String>,
}

/// The `Idempotency-Key` header of the endpoints that take any key.
#[derive(Debug, IntoParams)]
#[into_params(parameter_in = Header)]
#[allow(dead_code)] // documentation only
pub struct KeyHeader {
    #[doc = "1 to 255 visible ASCII characters: bare (without `\"`, `,` or `;`), or as a quoted \
             Structured Field string where `\\\"` and `\\\\` escape `\"` and `\\`; spaces and tabs \
             around the value are HTTP's optional whitespace, not part of the key"]
    #[param(
        rename = "Idempotency-Key",
        pattern = r#"^[ \t]*(?:[!#-+\--:<-~]{1,255}|"(?:[!#-\[\]-~]|\\["\\]){1,255}")[ \t]*$"#
    )]
    key: String,
}

/// The `Idempotency-Key` header of the endpoints that take UUID keys.
#[derive(Debug, IntoParams)]
#[into_params(parameter_in = Header)]
#[allow(dead_code)] // documentation only
pub struct UuidKeyHeader {
    /// A UUID (8-4-4-4-12), bare or quoted; case-insensitive
    #[param(rename = "Idempotency-Key")]
    key: uuid::Uuid,
}

/// The optional tenant header every idempotent endpoint reads.
#[derive(Debug, IntoParams)]
#[into_params(parameter_in = Header)]
#[allow(dead_code)] // documentation only
pub struct TenantHeader {
    /// Scopes the key to a tenant (set by a trusted gateway): 1 to 255 visible ASCII
    /// characters; spaces and tabs around the value are HTTP's optional whitespace
    #[param(rename = "X-Tenant-Id", pattern = r"^[ \t]*[!-~]{1,255}[ \t]*$")]
    tenant: Option<String>,
}

/// The problem responses of a payment request's body, on the endpoints without a key.
#[derive(Debug, IntoResponses)]
#[allow(dead_code)] // documentation only
pub enum BodyProblems {
    /// The body is not JSON (`invalid-request-body`)
    #[response(status = 400, content_type = "application/problem+json")]
    BadRequest(Problem),
    /// The body is too large (`payload-too-large`)
    #[response(status = 413, content_type = "application/problem+json")]
    TooLarge(Problem),
    /// The body is not application/json (`unsupported-media-type`)
    #[response(status = 415, content_type = "application/problem+json")]
    UnsupportedMediaType(Problem),
    /// JSON that does not match the request (`invalid-request-body`), or a field out of range
    /// (`invalid-request`)
    #[response(status = 422, content_type = "application/problem+json")]
    Unprocessable(Problem),
}

/// The problem responses of every idempotent endpoint (the HTTP contract of DESIGN.md).
#[derive(Debug, IntoResponses)]
#[allow(dead_code)] // documentation only
pub enum IdempotencyProblems {
    /// Idempotency-Key missing or invalid (`idempotency-key-missing`, `idempotency-key-invalid`),
    /// a body that is not JSON (`invalid-request-body`), a query the operation refuses
    /// (`invalid-request-query`: a deposit's parameter other than `note`, or `note` twice), a
    /// deposit's account that is not UTF-8 once percent-decoded (`invalid-request-path`), or
    /// an invalid scope (`scope-invalid`)
    #[response(status = 400, content_type = "application/problem+json")]
    BadRequest(Problem),
    /// The same key is still in flight
    #[response(
        status = 409,
        content_type = "application/problem+json",
        headers(("Retry-After" = u32, description = "Seconds to wait before retrying"))
    )]
    InFlight(Problem),
    /// The body is too large (`payload-too-large`)
    #[response(status = 413, content_type = "application/problem+json")]
    TooLarge(Problem),
    /// The body is not application/json (`unsupported-media-type`)
    #[response(status = 415, content_type = "application/problem+json")]
    UnsupportedMediaType(Problem),
    /// JSON that does not match the request (`invalid-request-body`), a field out of range
    /// (`invalid-request`), the key reused with another payload (`idempotency-key-reused`), or a
    /// business rejection, replayed (`request-rejected`)
    #[response(status = 422, content_type = "application/problem+json")]
    Unprocessable(Problem),
    /// Technical failure; nothing stored, a retry runs again
    #[response(status = 500, content_type = "application/problem+json")]
    Internal(Problem),
    /// Database or cache (fail-fast) unavailable; nothing ran
    #[response(
        status = 503,
        content_type = "application/problem+json",
        headers(("Retry-After" = u32, description = "Seconds to wait before retrying"))
    )]
    Unavailable(Problem),
}

/// The demo's API.
#[derive(Debug, OpenApi)]
#[openapi(
    info(
        title = "idempotency demo",
        description = "Every scenario of the idempotency and outbox references. Mutating endpoints \
                       require an Idempotency-Key header: a repeat replays the stored outcome with \
                       `Idempotent-Replayed: true`."
    ),
    paths(
        crate::app::create_payment,
        crate::app::create_payment_unprotected,
        crate::app::validate_payment,
        crate::app::create_refund,
        crate::app::create_charge,
        crate::app::get_charge,
        crate::v2::create_payment,
        crate::v2::create_payment_optimistic,
        crate::v2::create_refund,
        crate::v2::create_charge,
        crate::v2::create_deposit,
        crate::ops::health,
        crate::ops::health_live,
        crate::ops::health_ready,
        crate::ops::metrics,
    ),
    components(schemas(
        Problem,
        CreatePayment,
        Payment,
        InsufficientFunds,
        CreateRefund,
        Refund,
        RefundLimit,
        CreateCharge,
        CreateDeposit,
        Deposit,
        ChargeCreated,
        Charge
    ))
)]
pub struct ApiDoc;

/// `GET /openapi.json`.
pub async fn document() -> Json<Document> {
    Json(ApiDoc::openapi())
}
