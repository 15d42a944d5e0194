//! The demo on MySQL / MariaDB through its router (`tower::ServiceExt::oneshot`), on a database
//! of its own: the business tables take any text, whatever the server's default character set.

#![allow(clippy::unwrap_used)] // tests fail loudly on unexpected errors

use axum::body::Body;
use axum::http::{Request, StatusCode};
use http_body_util::BodyExt;
use idempotency_core::config::SchemaMode;
use idempotency_demo::config::DemoConfig;
use idempotency_demo::db::Mysql;
use idempotency_demo::{App, assemble_without_relay, router};
use serde_json::{Value, json};
use tower::ServiceExt;

/// On a database whose default character set is `latin1` (upstream MariaDB before 11.6 ships
/// it), a payment whose text is outside Latin-1 is stored and replayed as on PostgreSQL and
/// SQLite (before: the business tables took the database's default, the insert failed with
/// 1366 and the answer was `500 internal-error`).
#[tokio::test(flavor = "multi_thread")]
async fn text_outside_latin1_is_stored_on_a_latin1_database() {
    let pool = idempotency_testing::mysql_pool().await;
    sqlx::query("ALTER DATABASE CHARACTER SET latin1 COLLATE latin1_swedish_ci")
        .execute(&pool)
        .await
        .unwrap();
    let mut config = DemoConfig::default();
    config.idempotency.persistence.schema.mode = SchemaMode::Create;
    config.idempotency.distributed_cache.enabled = false;
    config.outbox.schema.mode = SchemaMode::Create;
    config.outbox.relay.enabled = false;
    config.outbox.notify_channel = None;
    let (db, idempotency) = assemble_without_relay::<Mysql>(pool.clone(), &config)
        .await
        .unwrap();
    let app = App::new(db, idempotency.service().clone(), config.demo.clone());
    let app = router(app, config.server.max_body_bytes);
    let body = json!({"orderId": "o-😀", "recipient": "Ωmega 😀", "amount": 12.5}).to_string();
    let mut answers = Vec::new();
    for _ in 0..2 {
        let request = Request::post("/api/payments")
            .header("content-type", "application/json")
            .header("idempotency-key", "utf8-1")
            .body(Body::from(body.clone()))
            .unwrap();
        let response = app.clone().oneshot(request).await.unwrap();
        let status = response.status();
        let replayed = response.headers().get("idempotent-replayed").is_some();
        let bytes = response.into_body().collect().await.unwrap().to_bytes();
        let json: Value = serde_json::from_slice(&bytes).unwrap();
        answers.push((status, replayed, json));
    }
    assert_eq!(answers[0].0, StatusCode::CREATED, "{}", answers[0].2);
    assert_eq!(answers[0].2["orderId"], "o-😀");
    assert_eq!((answers[1].0, answers[1].1), (StatusCode::CREATED, true));
    assert_eq!(answers[1].2, answers[0].2);
    let stored: String = sqlx::query_scalar("SELECT recipient FROM payments")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(stored, "Ωmega 😀");
}
