//! The OpenAPI 3.1 document of the demo (utoipa), served at `GET /openapi.json`.

use std::collections::BTreeMap;

use axum::Json;
use utoipa::openapi::OpenApi as Document;
use utoipa::{OpenApi, ToSchema};

use crate::model::{
    Charge, ChargeCreated, CreateCharge, CreatePayment, CreateRefund, InsufficientFunds, Payment,
    Refund, RefundLimit,
};
use crate::ops::{Health, Status};

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
    /// For `request-rejected`: the business rejection code.
    code: Option<String>,
    /// For `request-rejected`: the rejection details.
    details: Option<BTreeMap<String, serde_json::Value>>,
    /// For `idempotency-key-invalid`: why the key was refused.
    reason: Option<String>,
    /// For `invalid-request`: the field at fault.
    field: Option<String>,
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
        crate::app::create_refund,
        crate::app::create_charge,
        crate::app::get_charge,
        crate::ops::health,
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
        ChargeCreated,
        Charge,
        Health,
        Status
    ))
)]
pub struct ApiDoc;

/// `GET /openapi.json`.
pub async fn document() -> Json<Document> {
    Json(ApiDoc::openapi())
}
