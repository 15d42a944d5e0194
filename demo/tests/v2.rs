//! `/v2/*`, protected by `IdempotencyLayer` alone, answer as `/api/*` and `/charges` do, and
//! keep the transaction: a charge, its record and its `ChargeCreated` event commit together.
//! On a real PostgreSQL with a schema per test.

#![allow(clippy::unwrap_used)] // tests fail loudly on unexpected errors

use axum::Router;
use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, Request, StatusCode};
use http_body_util::BodyExt;
use idempotency_core::config::SchemaMode;
use idempotency_demo::config::DemoConfig;
use idempotency_demo::db::Postgres;
use idempotency_demo::{App, assemble_without_relay, router};
use idempotency_pg::sqlx::{self, PgPool};
use serde_json::Value;
use tower::ServiceExt;

async fn demo() -> (Router, PgPool) {
    let mut config = DemoConfig::default();
    config.idempotency.persistence.schema.mode = SchemaMode::Create;
    config.idempotency.distributed_cache.enabled = false;
    config.outbox.schema.mode = SchemaMode::Create;
    config.outbox.relay.enabled = false;
    let pool = idempotency_testing::pg_pool().await;
    let (db, idempotency) = assemble_without_relay::<Postgres>(pool.clone(), &config)
        .await
        .unwrap();
    let app = App::new(db, idempotency.service().clone(), config.demo.clone());
    (router(app, config.server.max_body_bytes), pool)
}

struct Reply {
    status: StatusCode,
    headers: HeaderMap,
    body: Bytes,
}

impl Reply {
    fn replayed(&self) -> bool {
        self.headers
            .get("idempotent-replayed")
            .is_some_and(|v| v == "true")
    }

    /// The body as JSON with the generated ids blanked, to compare two routes' answers.
    fn shape(&self) -> Value {
        let mut body: Value = serde_json::from_slice(&self.body).unwrap_or(Value::Null);
        for id in ["paymentId", "refundId", "id"] {
            if let Some(value) = body.get_mut(id) {
                *value = Value::from("<id>");
            }
        }
        body
    }
}

async fn post(app: &Router, uri: &str, key: Option<&str>, body: &str) -> Reply {
    let mut request = Request::post(uri).header("content-type", "application/json");
    if let Some(key) = key {
        request = request.header("idempotency-key", key);
    }
    let response = app
        .clone()
        .oneshot(request.body(Body::from(body.to_owned())).unwrap())
        .await
        .unwrap();
    let (parts, body) = response.into_parts();
    Reply {
        status: parts.status,
        headers: parts.headers,
        body: body.collect().await.unwrap().to_bytes(),
    }
}

async fn count(pool: &PgPool, table: &str) -> i64 {
    sqlx::query_scalar(sqlx::AssertSqlSafe(format!("SELECT count(*) FROM {table}")))
        .fetch_one(pool)
        .await
        .unwrap()
}

/// Every case of the explicit routes, sent to both: the same status, content type and body
/// (generated ids aside), first and on replay.
#[tokio::test]
async fn v2_routes_answer_as_the_explicit_routes_do() {
    let (app, _pool) = demo().await;
    let cases: &[(&str, &str, Option<&str>, &str)] = &[
        (
            "payments",
            "ok",
            Some("k"),
            r#"{"orderId":"o-1","recipient":"alice","amount":100.00}"#,
        ),
        (
            "payments",
            "over",
            Some("k"),
            r#"{"orderId":"o-2","recipient":"alice","amount":5000}"#,
        ),
        (
            "payments",
            "invalid",
            Some("k"),
            r#"{"orderId":"o","recipient":"a","amount":-1}"#,
        ),
        ("payments", "malformed", Some("k"), "{not json"),
        (
            "payments",
            "tech",
            Some("k"),
            r#"{"orderId":"o","recipient":"FAIL_TECH","amount":1}"#,
        ),
        (
            "payments",
            "nokey",
            None,
            r#"{"orderId":"o","recipient":"a","amount":1}"#,
        ),
        (
            "payments",
            "badkey",
            Some("has space"),
            r#"{"orderId":"o","recipient":"a","amount":1}"#,
        ),
        (
            "refunds",
            "ok",
            Some("k"),
            r#"{"paymentId":"p-1","amount":300.00}"#,
        ),
        (
            "refunds",
            "over",
            Some("k"),
            r#"{"paymentId":"p-1","amount":800.00}"#,
        ),
        (
            "charges",
            "ok",
            Some("8e03978e-40d5-43e8-bc93-6894a57f9324"),
            r#"{"amountCents":4900}"#,
        ),
        (
            "charges",
            "notuuid",
            Some("demo-1"),
            r#"{"amountCents":4900}"#,
        ),
        (
            "charges",
            "invalid",
            Some("8e03978e-40d5-43e8-bc93-6894a57f9325"),
            r#"{"amountCents":0}"#,
        ),
    ];
    for (resource, case, key, body) in cases {
        let explicit = match *resource {
            "charges" => "/charges".to_owned(),
            other => format!("/api/{other}"),
        };
        // The payments also behind the layer's optimistic mode.
        let mut layered = vec![format!("/v2/{resource}")];
        if *resource == "payments" {
            layered.push("/v2/payments/optimistic".to_owned());
        }
        for (n, layered) in layered.iter().enumerate() {
            // Distinct keys per route and case, except the UUID and the invalid ones.
            let keys = key.map(|key| match key {
                k if k.len() == 36 || k.contains(" ") || k == "demo-1" => {
                    (k.to_owned(), k.to_owned())
                }
                k => (
                    format!("{k}-{resource}-{case}-{n}-a"),
                    format!("{k}-{resource}-{case}-{n}-b"),
                ),
            });
            let (a, b) = match &keys {
                Some((a, b)) => (Some(a.as_str()), Some(b.as_str())),
                None => (None, None),
            };
            for round in ["first", "replay"] {
                let want = post(&app, &explicit, a, body).await;
                let got = post(&app, layered, b, body).await;
                let what = format!("{layered} {case} ({round})");
                assert_eq!(got.status, want.status, "{what}: {:?}", got.body);
                assert_eq!(
                    got.headers.get("content-type"),
                    want.headers.get("content-type"),
                    "{what}"
                );
                assert_eq!(got.shape(), want.shape(), "{what}");
                if want.replayed() {
                    assert!(got.replayed(), "{what}");
                }
            }
        }
    }
}

/// A `/v2/charges` charge, its record and its event commit in the layer's transaction; the
/// replay is byte-identical and adds nothing.
#[tokio::test]
async fn a_v2_charge_its_record_and_its_event_commit_together() {
    let (app, pool) = demo().await;
    let key = Some("0b5cb1e0-3a57-4c3e-9d0c-8f2a1e9f6a11");
    let first = post(&app, "/v2/charges", key, r#"{"amountCents":4900}"#).await;
    let replay = post(&app, "/v2/charges", key, r#"{ "amountCents" : 4900 }"#).await;
    assert_eq!(first.status, StatusCode::CREATED);
    assert!(!first.replayed() && replay.replayed());
    assert_eq!(replay.body, first.body, "byte for byte");
    assert_eq!(count(&pool, "charges").await, 1);
    assert_eq!(count(&pool, "outbox").await, 1);
    assert_eq!(count(&pool, "idempotency_records").await, 1);
    let payload: String = sqlx::query_scalar("SELECT payload::text FROM outbox")
        .fetch_one(&pool)
        .await
        .unwrap();
    let payload: Value = serde_json::from_str(&payload).unwrap();
    let first: Value = serde_json::from_slice(&first.body).unwrap();
    assert_eq!(payload["chargeId"], first["id"]);
}

/// A failed `/v2/payments` (or `/v2/payments/optimistic`) leaves nothing (no payment, no
/// record), and the retry runs.
#[tokio::test]
async fn a_failed_v2_payment_leaves_nothing_and_the_retry_runs() {
    let (app, pool) = demo().await;
    let body = r#"{"orderId":"o-3","recipient":"FAIL_ONCE","amount":100}"#;
    for (n, route) in ["/v2/payments", "/v2/payments/optimistic"]
        .iter()
        .enumerate()
    {
        let failed = post(&app, route, Some("once"), body).await;
        assert_eq!(failed.status, StatusCode::INTERNAL_SERVER_ERROR, "{route}");
        assert_eq!(count(&pool, "payments").await, n as i64, "{route}");
        assert_eq!(
            count(&pool, "idempotency_records").await,
            n as i64,
            "{route}"
        );
        // The retry spells the key quoted (`"once"`): the same key, so it does not fail
        // again (before: the simulation's memory was keyed on the raw header, and it did).
        let retry = post(&app, route, Some("\"once\""), body).await;
        assert_eq!(retry.status, StatusCode::CREATED, "{route}");
        assert!(!retry.replayed(), "{route}");
        assert_eq!(count(&pool, "payments").await, n as i64 + 1, "{route}");
        let replay = post(&app, route, Some("once"), body).await;
        assert!(replay.replayed(), "{route}");
    }
}

/// Concurrent duplicates on `/v2/payments/optimistic` may each run the handler, but one
/// payment and one record commit, and every answer is that payment.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_duplicates_on_the_optimistic_route_pay_once() {
    let (app, pool) = demo().await;
    let body = r#"{"orderId":"o-9","recipient":"alice","amount":10}"#;
    let racing: Vec<_> = (0..8)
        .map(|_| {
            let app = app.clone();
            tokio::spawn(async move {
                post(&app, "/v2/payments/optimistic", Some("racing"), body).await
            })
        })
        .collect();
    let mut replies = Vec::new();
    for reply in racing {
        replies.push(reply.await.unwrap());
    }
    // A duplicate past the in-flight policy's waiters is told to retry (409); every other
    // answer is the one payment.
    let paid: Vec<&Reply> = replies
        .iter()
        .filter(|r| r.status == StatusCode::CREATED)
        .collect();
    for reply in &replies {
        if reply.status != StatusCode::CREATED {
            assert_eq!(reply.status, StatusCode::CONFLICT, "{:?}", reply.body);
            assert_eq!(problem_type(reply), "request-in-flight");
        }
    }
    let first: Value = serde_json::from_slice(&paid[0].body).unwrap();
    for reply in &paid {
        let payment: Value = serde_json::from_slice(&reply.body).unwrap();
        assert_eq!(payment["paymentId"], first["paymentId"]);
    }
    assert_eq!(paid.iter().filter(|r| !r.replayed()).count(), 1);
    assert_eq!(count(&pool, "payments").await, 1);
    assert_eq!(count(&pool, "idempotency_records").await, 1);
}

/// `/v2/payments/optimistic` runs the handler before the key is recorded, `/v2/payments`
/// after: with the records table locked, the optimistic request waits on its record's insert
/// holding the payment's row, the claim-first one waits on its claim with no payment written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_optimistic_route_runs_the_handler_before_recording_the_key() {
    let (app, pool) = demo().await;
    let body = r#"{"orderId":"o-7","recipient":"alice","amount":7}"#;
    for (route, handler_first) in [("/v2/payments/optimistic", true), ("/v2/payments", false)] {
        let mut blocker = pool.begin().await.unwrap();
        sqlx::query("LOCK TABLE idempotency_records IN SHARE ROW EXCLUSIVE MODE")
            .execute(&mut *blocker)
            .await
            .unwrap();
        let request = {
            let app = app.clone();
            tokio::spawn(async move { post(&app, route, Some("order"), body).await })
        };
        // Wait until the request waits on the records table, then see whether it holds a
        // lock on the payments table (its handler's insert).
        let mut waiting = false;
        for _ in 0..500 {
            waiting = sqlx::query_scalar(
                "SELECT EXISTS (SELECT 1 FROM pg_locks \
                 WHERE relation = 'idempotency_records'::regclass AND NOT granted)",
            )
            .fetch_one(&pool)
            .await
            .unwrap();
            if waiting {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        assert!(waiting, "{route}: never waited on the records table");
        let paid: bool = sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM pg_locks \
             WHERE relation = 'payments'::regclass AND granted)",
        )
        .fetch_one(&pool)
        .await
        .unwrap();
        assert_eq!(paid, handler_first, "{route}: the handler ran first");
        blocker.commit().await.unwrap();
        let reply = request.await.unwrap();
        assert_eq!(
            reply.status,
            StatusCode::CREATED,
            "{route}: {:?}",
            reply.body
        );
    }
    assert_eq!(count(&pool, "payments").await, 2);
}

/// The OpenAPI document lists the `/v2` routes.
#[tokio::test]
async fn the_openapi_document_lists_the_v2_routes() {
    let (app, _pool) = demo().await;
    let response = app
        .oneshot(Request::get("/openapi.json").body(Body::empty()).unwrap())
        .await
        .unwrap();
    let doc: Value =
        serde_json::from_slice(&response.into_body().collect().await.unwrap().to_bytes()).unwrap();
    for path in [
        "/v2/payments",
        "/v2/payments/optimistic",
        "/v2/refunds",
        "/v2/charges",
        "/v2/accounts/{account}/deposits",
    ] {
        let post = &doc["paths"][path]["post"];
        assert!(post.is_object(), "{path} undocumented");
        for status in ["400", "409", "413", "422", "500", "503"] {
            assert!(post["responses"][status].is_object(), "{path} {status}");
        }
    }
}

/// A deposit behind the layer: 201 with the deposit, replayed for the same account and note;
/// the same key and body for another account, or another note, is a key reuse (422).
#[tokio::test]
async fn a_deposit_to_another_account_under_the_same_key_is_422() {
    let (app, _pool) = demo().await;
    let body = r#"{"amount": 25}"#;
    let first = post(
        &app,
        "/v2/accounts/A/deposits?note=rent",
        Some("dep-1"),
        body,
    )
    .await;
    assert_eq!(first.status, StatusCode::CREATED);
    let deposit: Value = serde_json::from_slice(&first.body).unwrap();
    assert_eq!(deposit["account"], "A");
    assert_eq!(deposit["amount"], "25.00");
    assert_eq!(deposit["note"], "rent");
    let replay = post(
        &app,
        "/v2/accounts/A/deposits?note=rent",
        Some("dep-1"),
        body,
    )
    .await;
    assert!(replay.replayed());
    assert_eq!(replay.body, first.body);
    for other in [
        "/v2/accounts/B/deposits?note=rent",
        "/v2/accounts/A/deposits?note=food",
    ] {
        let reused = post(&app, other, Some("dep-1"), body).await;
        assert_eq!(reused.status, StatusCode::UNPROCESSABLE_ENTITY, "{other}");
        let problem: Value = serde_json::from_slice(&reused.body).unwrap();
        assert!(
            problem["type"]
                .as_str()
                .unwrap()
                .ends_with("idempotency-key-reused"),
            "{problem}"
        );
    }
    let invalid = post(
        &app,
        "/v2/accounts/A/deposits",
        Some("dep-2"),
        r#"{"amount": -1}"#,
    )
    .await;
    assert_eq!(invalid.status, StatusCode::UNPROCESSABLE_ENTITY);
}

fn problem_type(reply: &Reply) -> String {
    assert_eq!(
        reply.headers.get("content-type").unwrap(),
        "application/problem+json"
    );
    let problem: Value = serde_json::from_slice(&reply.body).unwrap();
    let uri = problem["type"].as_str().unwrap();
    uri.rsplit('/').next().unwrap().to_owned()
}

/// An account that is not UTF-8 once percent-decoded (`%FF`, `%C3%28`) is `400
/// invalid-request-path`, a problem like every other refusal the document lists, and stores
/// nothing under the key: the retry to the corrected account runs (it is not `422
/// idempotency-key-reused`).
#[tokio::test]
async fn a_deposit_to_an_account_that_is_not_utf8_stores_nothing() {
    let (app, _pool) = demo().await;
    for (n, account) in ["%FF", "%C3%28", "A%FFB"].into_iter().enumerate() {
        let key = format!("dep-path-{n}");
        let uri = format!("/v2/accounts/{account}/deposits");
        let refused = post(&app, &uri, Some(&key), r#"{"amount": "25.00"}"#).await;
        assert_eq!(
            refused.status,
            StatusCode::BAD_REQUEST,
            "{uri}: {}",
            String::from_utf8_lossy(&refused.body)
        );
        assert_eq!(problem_type(&refused), "invalid-request-path", "{uri}");
        let corrected = post(
            &app,
            "/v2/accounts/A/deposits",
            Some(&key),
            r#"{"amount": "25.00"}"#,
        )
        .await;
        assert_eq!(corrected.status, StatusCode::CREATED, "after {uri}");
        assert!(!corrected.replayed());
    }
}

/// The deposit's query and amount are taken as the OpenAPI document gives them, and a refused
/// one stores nothing under the key: a query parameter other than `note`, or `note` twice, is
/// `400 invalid-request-query`; an amount string outside `^[0-9]{1,7}(\.[0-9]{1,2})?$` (which
/// `Decimal` alone would read: `"1e2"`, `"+5"`, `"1_000"`) is `422 invalid-request-body`. The
/// corrected request then runs under the same key. A JSON number is an amount, as documented.
#[tokio::test]
async fn a_deposit_refuses_what_its_openapi_document_refuses_and_stores_nothing() {
    let (app, _pool) = demo().await;
    let refused_queries = [
        "/v2/accounts/A/deposits?memo=rent",
        "/v2/accounts/A/deposits?note=rent&note=food",
        "/v2/accounts/A/deposits?note=rent&=null",
    ];
    for (n, uri) in refused_queries.into_iter().enumerate() {
        let key = format!("dep-query-{n}");
        let refused = post(&app, uri, Some(&key), r#"{"amount": "25.00"}"#).await;
        assert_eq!(refused.status, StatusCode::BAD_REQUEST, "{uri}");
        assert_eq!(problem_type(&refused), "invalid-request-query", "{uri}");
        let corrected = post(
            &app,
            "/v2/accounts/A/deposits?note=rent",
            Some(&key),
            r#"{"amount": "25.00"}"#,
        )
        .await;
        assert_eq!(corrected.status, StatusCode::CREATED, "after {uri}");
        assert!(!corrected.replayed());
    }
    for (n, amount) in [r#""1e2""#, r#""+5""#, r#""1_000""#, r#"" 5""#, r#""5.""#]
        .into_iter()
        .enumerate()
    {
        let key = format!("dep-amount-{n}");
        let body = format!(r#"{{"amount": {amount}}}"#);
        let refused = post(&app, "/v2/accounts/A/deposits", Some(&key), &body).await;
        assert_eq!(refused.status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
        assert_eq!(problem_type(&refused), "invalid-request-body", "{body}");
        let corrected = post(
            &app,
            "/v2/accounts/A/deposits",
            Some(&key),
            r#"{"amount": "100.00"}"#,
        )
        .await;
        assert_eq!(corrected.status, StatusCode::CREATED, "after {body}");
    }
    let number = post(
        &app,
        "/v2/accounts/A/deposits",
        Some("dep-number"),
        r#"{"amount": 834}"#,
    )
    .await;
    assert_eq!(number.status, StatusCode::CREATED);
    let deposit: Value = serde_json::from_slice(&number.body).unwrap();
    assert_eq!(deposit["amount"], "834.00");
}
