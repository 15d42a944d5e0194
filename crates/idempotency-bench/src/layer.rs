//! The middleware against the explicit path: the same payment handler, behind
//! `IdempotencyLayer` (the handler takes `IdempotentTx`; claim-first and optimistic) and
//! calling `execute` itself, and the same insert in a plain transaction without idempotency,
//! all through an axum router in process (`oneshot`, no socket), first executions and replays.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::State;
use axum::http::{Request, StatusCode};
use axum::routing::post;
use axum::{Json, Router};
use idempotency_axum::{
    Error, IdempotencyKeyHeader, IdempotencyLayer, IdempotentTx, OutcomeExt, SharedScope,
};
use idempotency_core::{ExecutionResult, IdempotencyService, ServiceOptions};
use idempotency_pg::PgStore;
use tower::ServiceExt;

use crate::harness::{Op, Scenario, op};
use crate::idempotency::{Setup, insert_payment};

/// The explicit path: the handler calls `execute`.
async fn explicit(
    State(service): State<IdempotencyService<PgStore>>,
    key: IdempotencyKeyHeader,
    Json(body): Json<serde_json::Value>,
) -> Result<axum::response::Response, Error> {
    use axum::response::IntoResponse;
    let order = body["orderId"].as_str().unwrap_or_default().to_owned();
    let outcome = service
        .execute(key.call("PAY_EXPLICIT", &body), async |conn| {
            let id = insert_payment(conn, &order)
                .await
                .map_err(Error::internal)?;
            Ok::<_, Error>(ExecutionResult::success(payment(id, &order)))
        })
        .await?;
    Ok(outcome.into_json(StatusCode::CREATED).into_response())
}

/// The layered route: the same statement on the layer's transaction, no idempotency code.
async fn layered(
    mut tx: IdempotentTx<PgStore>,
    Json(body): Json<serde_json::Value>,
) -> Result<(StatusCode, Json<serde_json::Value>), Error> {
    let order = body["orderId"].as_str().unwrap_or_default().to_owned();
    let id = insert_payment(&mut tx, &order)
        .await
        .map_err(Error::internal)?;
    Ok((StatusCode::CREATED, Json(payment(id, &order))))
}

/// The same insert in a transaction of its own: no key, no record.
async fn plain(
    State(pool): State<sqlx::PgPool>,
    Json(body): Json<serde_json::Value>,
) -> Result<(StatusCode, Json<serde_json::Value>), Error> {
    let order = body["orderId"].as_str().unwrap_or_default().to_owned();
    let mut tx = pool.begin().await.map_err(Error::internal)?;
    let id = insert_payment(&mut tx, &order)
        .await
        .map_err(Error::internal)?;
    tx.commit().await.map_err(Error::internal)?;
    Ok((StatusCode::CREATED, Json(payment(id, &order))))
}

fn payment(id: i64, order: &str) -> serde_json::Value {
    serde_json::json!({"paymentId": id, "orderId": order, "amount": "100.00", "status": "CONFIRMED"})
}

fn router(service: IdempotencyService<PgStore>) -> Router {
    let layer = IdempotencyLayer::new(service.clone()).scope::<SharedScope>();
    Router::new()
        .route("/plain", post(plain))
        .with_state(service.store().pool().clone())
        .merge(
            Router::new()
                .route("/explicit", post(explicit))
                .with_state(service),
        )
        .merge(
            Router::new()
                .route("/layered", post(layered))
                .route_layer(layer.clone()),
        )
        .merge(
            Router::new()
                .route("/optimistic", post(layered))
                .route_layer(layer.optimistic()),
        )
}

/// One POST; panics unless the answer is a 201 (`replayed` says whether it must be a replay).
fn post_op(
    app: Router,
    path: &'static str,
    key: impl Fn(u64, u64) -> String + Send + Sync + 'static,
    replayed: bool,
) -> Op {
    let app = Arc::new(app);
    op(move |c, i| {
        let app = Arc::clone(&app);
        let key = key(c, i);
        async move {
            let body = format!(r#"{{"orderId":"{key}","recipient":"alice","amount":"100.00"}}"#);
            let request = Request::post(path)
                .header("content-type", "application/json")
                .header("idempotency-key", &key)
                .body(Body::from(body))
                .expect("request");
            let response = (*app).clone().oneshot(request).await.expect("infallible");
            assert_eq!(response.status(), StatusCode::CREATED, "{path}");
            assert_eq!(
                response.headers().contains_key("idempotent-replayed"),
                replayed,
                "{path}"
            );
            axum::body::to_bytes(response.into_body(), usize::MAX)
                .await
                .expect("body");
        }
    })
}

/// First executions (a fresh key per request) through both routes.
pub(crate) fn first_executions(setup: &Setup, clients: u64) -> Vec<Scenario> {
    let app = router(IdempotencyService::new(setup.store.clone()));
    let run = setup.run;
    vec![
        Scenario::new(
            "HTTP plain transaction, no idempotency",
            clients,
            post_op(
                app.clone(),
                "/plain",
                move |c, i| format!("p-{run}-{c}-{i}"),
                false,
            ),
        ),
        Scenario::new(
            "HTTP explicit execute: first execution",
            clients,
            post_op(
                app.clone(),
                "/explicit",
                move |c, i| format!("x-{run}-{c}-{i}"),
                false,
            ),
        ),
        Scenario::new(
            "HTTP IdempotencyLayer: first execution",
            clients,
            post_op(
                app.clone(),
                "/layered",
                move |c, i| format!("l-{run}-{c}-{i}"),
                false,
            ),
        ),
        Scenario::new(
            "HTTP IdempotencyLayer optimistic: first execution",
            clients,
            post_op(
                app,
                "/optimistic",
                move |c, i| format!("o-{run}-{c}-{i}"),
                false,
            ),
        ),
    ]
}

/// Replays of one key through both routes, with `lookup_before_acquire` (one read, no
/// transaction) on both.
pub(crate) async fn replays(setup: &Setup, clients: u64) -> Vec<Scenario> {
    let config = ServiceOptions {
        lookup_before_acquire: true,
        ..ServiceOptions::default()
    };
    let service = IdempotencyService::builder(setup.store.clone())
        .config(config)
        .build();
    let app = router(service);
    let key = format!("layer-replay-{}", setup.run);
    for path in ["/explicit", "/layered"] {
        let seed = key.clone();
        post_op(app.clone(), path, move |_, _| seed.clone(), false)(0, 0).await;
    }
    let (a, b) = (key.clone(), key);
    vec![
        Scenario::new(
            "HTTP explicit execute: replay",
            clients,
            post_op(app.clone(), "/explicit", move |_, _| a.clone(), true),
        ),
        Scenario::new(
            "HTTP IdempotencyLayer: replay",
            clients,
            post_op(app, "/layered", move |_, _| b.clone(), true),
        ),
    ]
}
