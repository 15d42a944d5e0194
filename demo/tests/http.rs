//! The demo through its router (`tower::ServiceExt::oneshot`), on a real PostgreSQL with a
//! schema per test: reference 000's proof, reference 001's demo suite, bad input, scoping.

#![allow(clippy::unwrap_used)] // tests fail loudly on unexpected errors

use axum::Router;
use axum::body::Body;
use axum::http::{HeaderMap, Request, StatusCode};
use http_body_util::BodyExt;
use idempotency_core::config::{InFlightPolicyKind, SchemaMode};
use idempotency_demo::config::DemoConfig;
use idempotency_demo::db::Postgres;
use idempotency_demo::{App, assemble, assemble_without_relay, router};
use serde_json::{Value, json};
use sqlx::{self, PgPool};
use tower::ServiceExt;

fn config() -> DemoConfig {
    let mut config = DemoConfig::default();
    config.idempotency.persistence.schema.mode = SchemaMode::Create;
    config.idempotency.distributed_cache.enabled = false;
    config.outbox.schema.mode = SchemaMode::Create;
    config.outbox.relay.enabled = false;
    config
}

async fn demo_with(config: DemoConfig) -> (Router, PgPool) {
    let pool = idempotency_testing::pg_pool().await;
    let (db, idempotency) = assemble_without_relay::<Postgres>(pool.clone(), &config)
        .await
        .unwrap();
    let mut app = App::new(db, idempotency.service().clone(), config.demo.clone());
    app.health = Some(idempotency.health_check());
    (router(app, config.server.max_body_bytes), pool)
}

async fn demo() -> (Router, PgPool) {
    demo_with(config()).await
}

struct Reply {
    status: StatusCode,
    headers: HeaderMap,
    body: Value,
}

impl Reply {
    fn replayed(&self) -> bool {
        self.headers
            .get("idempotent-replayed")
            .is_some_and(|v| v == "true")
    }
    fn problem_type(&self) -> &str {
        assert_eq!(
            self.headers["content-type"], "application/problem+json",
            "{:?}",
            self.body
        );
        self.body["type"]
            .as_str()
            .unwrap()
            .rsplit('/')
            .next()
            .unwrap()
    }
}

async fn send(
    app: &Router,
    method: &str,
    uri: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> Reply {
    let mut request = Request::builder()
        .method(method)
        .uri(uri)
        .header("content-type", "application/json");
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let response = app
        .clone()
        .oneshot(request.body(Body::from(body.to_owned())).unwrap())
        .await
        .unwrap();
    let status = response.status();
    let headers = response.headers().clone();
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    let body = if bytes.is_empty() {
        Value::Null
    } else {
        serde_json::from_slice(&bytes).unwrap_or(Value::Null)
    };
    Reply {
        status,
        headers,
        body,
    }
}

async fn count(pool: &PgPool, table: &str) -> i64 {
    sqlx::query_scalar(sqlx::AssertSqlSafe(format!("SELECT count(*) FROM {table}")))
        .fetch_one(pool)
        .await
        .unwrap()
}

async fn pay(app: &Router, key: &str, body: Value) -> Reply {
    send(
        app,
        "POST",
        "/api/payments",
        &[("idempotency-key", key)],
        &body.to_string(),
    )
    .await
}

async fn refund(app: &Router, key: &str, body: &Value) -> Reply {
    send(
        app,
        "POST",
        "/api/refunds",
        &[("idempotency-key", key)],
        &body.to_string(),
    )
    .await
}

async fn charge(app: &Router, key: &str, amount_cents: i64) -> Reply {
    let body = format!(r#"{{"amountCents":{amount_cents}}}"#);
    send(app, "POST", "/charges", &[("idempotency-key", key)], &body).await
}

const CHARGE_KEY: &str = "8e03978e-40d5-43e8-bc93-6894a57f9324";

/// Reference 000: two identical POST /charges, one charge, one outbox row, one record.
#[tokio::test]
async fn same_key_creates_one_charge_and_one_outbox_row() {
    let (app, pool) = demo().await;
    let first = charge(&app, CHARGE_KEY, 4900).await;
    let replay = charge(&app, CHARGE_KEY, 4900).await;
    assert_eq!(first.status, StatusCode::CREATED);
    assert_eq!(replay.status, StatusCode::CREATED);
    assert_eq!(first.body, replay.body);
    assert!(!first.replayed() && replay.replayed());
    assert_eq!(count(&pool, "charges").await, 1);
    assert_eq!(count(&pool, "outbox").await, 1);
    assert_eq!(count(&pool, "idempotency_records").await, 1);
    let event: (String, String) = sqlx::query_as("SELECT event_type, payload::text FROM outbox")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(event.0, "ChargeCreated");
    let payload: Value = serde_json::from_str(&event.1).unwrap();
    assert_eq!(payload["chargeId"], first.body["id"]);

    // Quoted (Structured Field) and upper-case spellings are the same UUID key.
    let quoted = format!("\"{}\"", CHARGE_KEY.to_uppercase());
    let again = charge(&app, &quoted, 4900).await;
    assert!(again.replayed());
    assert_eq!(again.body, first.body);

    let id = first.body["id"].as_str().unwrap();
    let charge = send(&app, "GET", &format!("/charges/{id}"), &[], "").await;
    assert_eq!(charge.status, StatusCode::OK);
    assert_eq!(charge.body["amountCents"], 4900);
    let missing = send(
        &app,
        "GET",
        "/charges/01a22b5e-0000-7000-8000-000000000000",
        &[],
        "",
    )
    .await;
    assert_eq!(missing.status, StatusCode::NOT_FOUND);
    assert_eq!(missing.problem_type(), "not-found");
    // An id that is not UTF-8 once percent-decoded: the documented 400 problem, not axum's
    // plain text.
    let not_utf8 = send(&app, "GET", "/charges/%FF", &[], "").await;
    assert_eq!(not_utf8.status, StatusCode::BAD_REQUEST);
    assert_eq!(not_utf8.problem_type(), "invalid-request-path");
}

/// Reference 000: the same key with a different amount is 422; a key that is not a UUID is 400.
#[tokio::test]
async fn charge_key_reuse_and_bad_keys() {
    let (app, pool) = demo().await;
    charge(&app, CHARGE_KEY, 4900).await;
    let reused = charge(&app, CHARGE_KEY, 5000).await;
    assert_eq!(reused.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(reused.problem_type(), "idempotency-key-reused");
    let not_uuid = charge(&app, "demo-1", 4900).await;
    assert_eq!(not_uuid.status, StatusCode::BAD_REQUEST);
    assert_eq!(not_uuid.problem_type(), "idempotency-key-invalid");
    let missing = send(&app, "POST", "/charges", &[], r#"{"amountCents":4900}"#).await;
    assert_eq!(missing.status, StatusCode::BAD_REQUEST);
    assert_eq!(missing.problem_type(), "idempotency-key-missing");
    assert_eq!(count(&pool, "charges").await, 1);
}

/// Reference 000: two overlapping calls give one winner and one 409 (reject) or replay (wait).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn overlapping_charges_one_winner() {
    for policy in [InFlightPolicyKind::Reject, InFlightPolicyKind::Wait] {
        let mut config = config();
        config.idempotency.in_flight.policy = policy;
        let (app, pool) = demo_with(config).await;
        let key = "1b4e28ba-2fa1-4d3b-a3f5-ef19b5a7633b";
        let calls = (0..8).map(|_| {
            let app = app.clone();
            tokio::spawn(async move { charge(&app, key, 100).await })
        });
        let mut replies = Vec::new();
        for call in calls.collect::<Vec<_>>() {
            replies.push(call.await.unwrap());
        }
        let winners = replies
            .iter()
            .filter(|r| r.status == StatusCode::CREATED && !r.replayed())
            .count();
        assert_eq!(winners, 1, "{policy:?}");
        for reply in &replies {
            match reply.status {
                StatusCode::CREATED => {}
                StatusCode::CONFLICT => {
                    assert_eq!(reply.problem_type(), "request-in-flight");
                    assert!(reply.headers.contains_key("retry-after"));
                }
                other => panic!("{policy:?}: unexpected {other}"),
            }
        }
        assert_eq!(count(&pool, "charges").await, 1);
        assert_eq!(count(&pool, "outbox").await, 1);
    }
}

/// Reference 001: a duplicate returns the same payment and writes one payment row.
#[tokio::test]
async fn duplicate_payment_is_replayed() {
    let (app, pool) = demo().await;
    let body = json!({"orderId": "o-1", "recipient": "alice", "amount": 100.00});
    let first = pay(&app, "demo-1", body.clone()).await;
    let second = pay(
        &app,
        "demo-1",
        json!({"amount": "100", "recipient": "alice", "orderId": "o-1"}),
    )
    .await;
    assert_eq!(first.status, StatusCode::CREATED);
    assert_eq!(first.body["status"], "CONFIRMED");
    assert_eq!(first.body["amount"], "100.00");
    assert_eq!(second.status, StatusCode::CREATED);
    assert!(
        second.replayed(),
        "the same payment spelled differently is a replay"
    );
    assert_eq!(first.body["paymentId"], second.body["paymentId"]);
    assert_eq!(count(&pool, "payments").await, 1);
    // Reference 001 answers 409 here; the IETF draft (and this project) answer 422.
    let other = pay(
        &app,
        "demo-1",
        json!({"orderId": "o-1", "recipient": "alice", "amount": 200.00}),
    )
    .await;
    assert_eq!(other.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(other.problem_type(), "idempotency-key-reused");
}

/// Reference 001: over the balance is 422 `INSUFFICIENT_FUNDS`, twice, and no payment row.
#[tokio::test]
async fn insufficient_funds_is_replayed() {
    let (app, pool) = demo().await;
    let body = json!({"orderId": "o-2", "recipient": "alice", "amount": 5000.00});
    let first = pay(&app, "demo-2", body.clone()).await;
    let second = pay(&app, "demo-2", body).await;
    for reply in [&first, &second] {
        assert_eq!(reply.status, StatusCode::UNPROCESSABLE_ENTITY);
        assert_eq!(reply.problem_type(), "request-rejected");
        assert_eq!(reply.body["code"], "INSUFFICIENT_FUNDS");
        assert_eq!(
            reply.body["details"],
            json!({"requestedAmount": "5000.00", "availableBalance": "1000.00"})
        );
    }
    assert_eq!(first.body, second.body);
    assert!(second.replayed());
    assert_eq!(count(&pool, "payments").await, 0);
}

/// Reference 001: `FAIL_ONCE` fails with 500 and stores nothing; the retry succeeds.
/// `FAIL_TECH` always fails.
#[tokio::test]
async fn technical_failures_store_nothing() {
    let (app, pool) = demo().await;
    let body = json!({"orderId": "o-3", "recipient": "FAIL_ONCE", "amount": 100.00});
    let failed = pay(&app, "demo-3", body.clone()).await;
    assert_eq!(failed.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(failed.problem_type(), "internal-error");
    assert_eq!(count(&pool, "idempotency_records").await, 0);
    let retried = pay(&app, "demo-3", body).await;
    assert_eq!(retried.status, StatusCode::CREATED);
    assert!(!retried.replayed());
    for _ in 0..2 {
        let tech = pay(
            &app,
            "demo-tech",
            json!({"orderId": "o-4", "recipient": "FAIL_TECH", "amount": 1}),
        )
        .await;
        assert_eq!(tech.status, StatusCode::INTERNAL_SERVER_ERROR);
    }
    assert_eq!(count(&pool, "payments").await, 1);
    assert_eq!(count(&pool, "idempotency_records").await, 1);
}

/// Reference 001: a refund over the limit is 422 and replayed; a new key then refunds, and its
/// repeat returns the same refund.
#[tokio::test]
async fn refunds() {
    let (app, pool) = demo().await;
    let over = json!({"paymentId": "p-1", "amount": 800.00});
    for _ in 0..2 {
        let reply = refund(&app, "refund-1", &over).await;
        assert_eq!(reply.status, StatusCode::UNPROCESSABLE_ENTITY);
        assert_eq!(reply.body["code"], "REFUND_LIMIT_EXCEEDED");
    }
    let ok = json!({"paymentId": "p-1", "amount": 300.00});
    let first = refund(&app, "refund-2", &ok).await;
    let second = refund(&app, "refund-2", &ok).await;
    assert_eq!(first.status, StatusCode::OK);
    assert_eq!(first.body["status"], "REFUNDED");
    assert_eq!(second.status, StatusCode::OK);
    assert_eq!(first.body["refundId"], second.body["refundId"]);
    assert_eq!(count(&pool, "refunds").await, 1);
}

/// Reference 001: with Redis unreachable (fail-open) every scenario still works.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_unreachable_changes_nothing() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let dead = format!("redis://{}", listener.local_addr().unwrap());
    drop(listener);
    let mut config = config();
    config.idempotency.distributed_cache.enabled = true;
    config.idempotency.distributed_cache.url = Some(dead);
    config.idempotency.distributed_cache.secret = Some(
        idempotency_cache_redis::CacheSecret::new("tests-only-secret-0123456789abcdef").unwrap(),
    );
    let (app, pool) = demo_with(config).await;
    let body = json!({"orderId": "o-5", "recipient": "bob", "amount": 10});
    let first = pay(&app, "demo-5", body.clone()).await;
    let second = pay(&app, "demo-5", body).await;
    assert_eq!(first.status, StatusCode::CREATED);
    assert!(second.replayed());
    assert_eq!(first.body, second.body);
    let poor = pay(
        &app,
        "demo-6",
        json!({"orderId": "o-6", "recipient": "bob", "amount": 5000}),
    )
    .await;
    assert_eq!(poor.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(count(&pool, "payments").await, 1);
}

/// Bad input: malformed JSON 400 and wrong shape 422 (`invalid-request-body`), invalid fields
/// 422 (`invalid-request`), oversized 413, wrong content type 415 (`unsupported-media-type`);
/// nothing runs and nothing is stored.
#[tokio::test]
async fn bad_bodies_are_problems_and_write_nothing() {
    let (app, pool) = demo().await;
    let key = [("idempotency-key", "bad-1")];
    let cases: [(&str, StatusCode, &str); 7] = [
        ("{not json", StatusCode::BAD_REQUEST, "invalid-request-body"),
        (
            r#"{"orderId":"o","recipient":"a"}"#,
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid-request-body",
        ),
        (
            r#"{"orderId":"o","recipient":"a","amount":-5}"#,
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid-request",
        ),
        (
            r#"{"orderId":"o","recipient":"a","amount":1.001}"#,
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid-request",
        ),
        (
            r#"{"orderId":"o","recipient":"a","amount":"12abc"}"#,
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid-request-body",
        ),
        (
            r#"{"orderId":"","recipient":"a","amount":1}"#,
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid-request",
        ),
        (
            r#"{"orderId":"o","recipient":"a","amount":1,"extra":true}"#,
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid-request-body",
        ),
    ];
    for (body, status, kind) in cases {
        let reply = send(&app, "POST", "/api/payments", &key, body).await;
        assert_eq!(reply.status, status, "{body}");
        assert_eq!(reply.problem_type(), kind, "{body}");
    }
    let huge = format!(
        r#"{{"orderId":"{}","recipient":"a","amount":1}}"#,
        "x".repeat(64 * 1024)
    );
    let reply = send(&app, "POST", "/api/payments", &key, &huge).await;
    assert_eq!(reply.status, StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(reply.problem_type(), "payload-too-large");
    let response = app
        .clone()
        .oneshot(
            Request::post("/api/payments")
                .header("idempotency-key", "bad-2")
                .header("content-type", "text/plain")
                .body(Body::from("{}"))
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::UNSUPPORTED_MEDIA_TYPE);
    assert_eq!(
        response.headers()["content-type"],
        "application/problem+json"
    );
    let problem: Value =
        serde_json::from_slice(&response.into_body().collect().await.unwrap().to_bytes()).unwrap();
    assert_eq!(
        problem["type"],
        "https://idempotency-rs.github.io/problems/unsupported-media-type"
    );
    assert_eq!(count(&pool, "idempotency_records").await, 0);
    assert_eq!(count(&pool, "payments").await, 0);
}

/// Scoping: the same key used by tenant A, then tenant B, runs twice; B never sees A's body.
#[tokio::test]
async fn tenants_never_see_each_others_responses() {
    let (app, pool) = demo().await;
    let body = json!({"orderId": "o-7", "recipient": "carol", "amount": 42});
    let a = send(
        &app,
        "POST",
        "/api/payments",
        &[("idempotency-key", "shared"), ("x-tenant-id", "tenant-a")],
        &body.to_string(),
    )
    .await;
    let b = send(
        &app,
        "POST",
        "/api/payments",
        &[("idempotency-key", "shared"), ("x-tenant-id", "tenant-b")],
        &body.to_string(),
    )
    .await;
    assert_eq!(a.status, StatusCode::CREATED);
    assert_eq!(b.status, StatusCode::CREATED);
    assert!(!b.replayed(), "tenant B got a replay of tenant A's request");
    assert_ne!(a.body["paymentId"], b.body["paymentId"]);
    let a_again = send(
        &app,
        "POST",
        "/api/payments",
        &[("idempotency-key", "shared"), ("x-tenant-id", "tenant-a")],
        &body.to_string(),
    )
    .await;
    assert_eq!(a_again.body, a.body);
    assert_eq!(count(&pool, "payments").await, 2);
    let twice = send(
        &app,
        "POST",
        "/api/payments",
        &[
            ("idempotency-key", "x"),
            ("x-tenant-id", "a"),
            ("x-tenant-id", "b"),
        ],
        &body.to_string(),
    )
    .await;
    assert_eq!(twice.status, StatusCode::BAD_REQUEST);
    assert_eq!(twice.problem_type(), "scope-invalid");
}

/// `/health` (the facade's readiness report, as `/health/ready`) lists each dependency;
/// `/health/live` asks none.
#[tokio::test]
async fn health_reports_the_database() {
    let (app, _pool) = demo().await;
    for path in ["/health", "/health/ready"] {
        let health = send(&app, "GET", path, &[], "").await;
        assert_eq!(health.status, StatusCode::OK, "{path}");
        assert_eq!(health.body["status"], "UP", "{path}: {}", health.body);
        assert_eq!(health.body["database"], json!({"status": "UP"}));
        assert_eq!(health.body["cache"], json!({"status": "DISABLED"}));
        assert_eq!(health.body["broker"], json!({"status": "DISABLED"}));
        assert_eq!(health.body["relay"], json!({"status": "DISABLED"}));
        assert_eq!(health.body["outbox"]["status"], "UP");
        assert_eq!(health.body["outbox"]["pending"], 0);
    }
    let live = send(&app, "GET", "/health/live", &[], "").await;
    assert_eq!(live.status, StatusCode::OK);
    assert_eq!(live.body, json!({"status": "UP"}));
}

/// `/health` reports the cache from `RedisCache::is_healthy` (its breaker and a bounded `PING`):
/// `UP` with a Redis that answers, `DOWN` with one that does not; requests are served either way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_reports_the_cache_up_when_redis_answers_and_down_when_not() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let dead = format!("redis://{}", listener.local_addr().unwrap());
    drop(listener);
    for (url, expected) in [(idempotency_testing::redis_url(), "UP"), (dead, "DOWN")] {
        let mut config = config();
        config.idempotency.distributed_cache.enabled = true;
        config.idempotency.distributed_cache.url = Some(url.clone());
        config.idempotency.distributed_cache.secret = Some(
            idempotency_cache_redis::CacheSecret::new("tests-only-secret-0123456789abcdef")
                .unwrap(),
        );
        let (app, _pool) = demo_with(config).await;
        let started = std::time::Instant::now();
        let mut health = send(&app, "GET", "/health", &[], "").await;
        while health.body["cache"]["status"] != expected && started.elapsed().as_secs() < 10 {
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            health = send(&app, "GET", "/health", &[], "").await;
        }
        assert_eq!(health.status, StatusCode::OK, "{url}");
        assert_eq!(
            health.body["cache"]["status"], expected,
            "{url}: {}",
            health.body
        );
    }
}

/// `/health` shows the relay's workers: `DOWN` once they no longer run.
#[tokio::test]
async fn health_reports_the_relay_workers() {
    let mut config = config();
    config.outbox.relay.enabled = true;
    let pool = idempotency_testing::pg_pool().await;
    let (db, idempotency) = assemble::<Postgres, _>(
        pool.clone(),
        &config,
        Some(idempotency_outbox::LoggingPublisher::new()),
        None,
    )
    .await
    .unwrap();
    let mut app = App::new(db, idempotency.service().clone(), config.demo.clone());
    app.health = Some(idempotency.health_check());
    let app = router(app, config.server.max_body_bytes);
    let health = send(&app, "GET", "/health", &[], "").await;
    assert_eq!(health.status, StatusCode::OK);
    assert_eq!(
        health.body["relay"],
        json!({"status": "UP", "configured": 2, "running": 2, "panics": 0})
    );
    assert_eq!(
        health.body["broker"],
        json!({"status": "UP", "destination": "log"})
    );
    idempotency.shutdown().await;
    let health = send(&app, "GET", "/health", &[], "").await;
    assert_eq!(health.status, StatusCode::OK, "requests are still served");
    assert_eq!(health.body["relay"]["status"], "DOWN");
    assert_eq!(health.body["relay"]["running"], 0);
}

/// `GET /openapi.json` documents every endpoint, its key header and its problem responses.
#[tokio::test]
async fn openapi_document_lists_every_endpoint() {
    let (app, _pool) = demo().await;
    let doc = send(&app, "GET", "/openapi.json", &[], "").await;
    assert_eq!(doc.status, StatusCode::OK);
    assert!(doc.body["openapi"].as_str().unwrap().starts_with("3."));
    for path in [
        "/api/payments",
        "/api/payments/validate",
        "/api/refunds",
        "/charges",
        "/charges/{id}",
        "/health",
        "/health/live",
        "/health/ready",
        "/metrics",
    ] {
        assert!(doc.body["paths"][path].is_object(), "{path} missing");
    }
    let payments = &doc.body["paths"]["/api/payments"]["post"];
    let params: Vec<&str> = payments["parameters"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["name"].as_str().unwrap())
        .collect();
    assert!(params.contains(&"Idempotency-Key"));
    for status in ["201", "400", "409", "413", "415", "422", "500", "503"] {
        assert!(
            payments["responses"][status].is_object(),
            "POST /api/payments {status} undocumented"
        );
    }
    // An amount is a string of the pattern or a JSON number, as the service reads it.
    for schema in ["CreatePayment", "CreateRefund", "CreateDeposit"] {
        let amount = &doc.body["components"]["schemas"][schema]["properties"]["amount"];
        let forms = amount["oneOf"].as_array().unwrap();
        assert_eq!(forms[0]["type"], "string", "{schema}: {amount}");
        assert_eq!(forms[0]["pattern"], r"^[0-9]{1,7}(\.[0-9]{1,2})?$");
        assert_eq!(forms[1]["type"], "number", "{schema}: {amount}");
        assert_eq!(forms[1]["exclusiveMinimum"], 0, "{schema}: {amount}");
        assert_eq!(forms[1]["maximum"], 1_000_000, "{schema}: {amount}");
    }
}

/// Without idempotency, a retry is a second payment: the contrast the other endpoints avoid.
#[tokio::test]
async fn the_unprotected_endpoint_pays_twice() {
    let (app, pool) = demo().await;
    let body = json!({"orderId": "o-9", "recipient": "erin", "amount": 9}).to_string();
    let first = send(&app, "POST", "/api/payments/unprotected", &[], &body).await;
    let retry = send(&app, "POST", "/api/payments/unprotected", &[], &body).await;
    assert_eq!(first.status, StatusCode::CREATED);
    assert_eq!(retry.status, StatusCode::CREATED);
    assert_ne!(first.body["paymentId"], retry.body["paymentId"]);
    assert_eq!(count(&pool, "payments").await, 2);
}

/// Validation answers the normalized request and pays nothing; a bad field is the same 422 a
/// payment gets, a body that is not JSON the same 400.
#[tokio::test]
async fn validate_checks_without_paying() {
    let (app, pool) = demo().await;
    let body = json!({"orderId": "o-11", "recipient": "gil", "amount": 9.5}).to_string();
    let reply = send(&app, "POST", "/api/payments/validate", &[], &body).await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(
        reply.body,
        json!({"orderId": "o-11", "recipient": "gil", "amount": "9.50"})
    );
    let zero = json!({"orderId": "o-11", "recipient": "gil", "amount": 0}).to_string();
    let refused = send(&app, "POST", "/api/payments/validate", &[], &zero).await;
    let paid = send(&app, "POST", "/api/payments/unprotected", &[], &zero).await;
    assert_eq!(refused.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(refused.body, paid.body);
    let garbled = send(&app, "POST", "/api/payments/validate", &[], "{").await;
    assert_eq!(garbled.status, StatusCode::BAD_REQUEST);
    assert_eq!(count(&pool, "payments").await, 0);
}

/// A present but empty tenant header is an error, never the shared default scope.
#[tokio::test]
async fn an_empty_tenant_is_refused() {
    let (app, pool) = demo().await;
    let body = json!({"orderId": "o-10", "recipient": "f", "amount": 1}).to_string();
    let reply = send(
        &app,
        "POST",
        "/api/payments",
        &[("idempotency-key", "t-1"), ("x-tenant-id", "")],
        &body,
    )
    .await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST);
    assert_eq!(reply.problem_type(), "scope-invalid");
    assert_eq!(count(&pool, "payments").await, 0);
}

/// A path no route serves and a method a route does not serve are answered as problems, like
/// every other error of the demo (before: axum's 404 and 405 with an empty body and no content
/// type); the 405 keeps its `Allow` header.
#[tokio::test(flavor = "multi_thread")]
async fn unknown_routes_and_methods_are_problems() {
    let (app, _pool) = demo().await;
    let missing = send(&app, "GET", "/api/payment", &[], "").await;
    assert_eq!(missing.status, StatusCode::NOT_FOUND);
    assert_eq!(missing.problem_type(), "not-found");
    for uri in ["/api/payments", "/v2/payments"] {
        let wrong = send(&app, "PUT", uri, &[("idempotency-key", "m-1")], "{}").await;
        assert_eq!(wrong.status, StatusCode::METHOD_NOT_ALLOWED, "{uri}");
        assert_eq!(wrong.problem_type(), "method-not-allowed", "{uri}");
        let allow = wrong.headers["allow"].to_str().unwrap();
        assert!(allow.contains("POST"), "{uri}: {allow}");
    }
    // The demo's own 404s say what is missing: a metrics recorder (this app has none).
    let metrics = send(&app, "GET", "/metrics", &[], "").await;
    assert_eq!(metrics.status, StatusCode::NOT_FOUND);
    assert_eq!(metrics.problem_type(), "not-found");
    assert!(
        metrics.body["detail"]
            .as_str()
            .unwrap()
            .contains("metrics recorder"),
        "{}",
        metrics.body
    );
    // A problem the demo answers itself passes untouched.
    let charge = send(
        &app,
        "GET",
        "/charges/00000000-0000-7000-8000-000000000000",
        &[],
        "",
    )
    .await;
    assert_eq!(charge.status, StatusCode::NOT_FOUND);
    assert!(charge.body["detail"].as_str().unwrap().contains("charge"));
}
