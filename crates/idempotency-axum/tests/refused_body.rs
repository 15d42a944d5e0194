//! A body, query or path the handler's extractors refuse stores nothing under the key: the corrected
//! retry runs (it is not `422 idempotency-key-reused`). A rejection the handler itself returns (a
//! business 422) is stored and replayed as before. A JSON body nested deeper than
//! `MAX_JSON_DEPTH` never reaches the handler. Every mode of the layer (claim-first, leased,
//! optimistic), on PostgreSQL and SQLite.

#![allow(clippy::unwrap_used)] // tests fail loudly on unexpected errors

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Path, Query, State};
use axum::http::{Method, Request, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use http_body_util::BodyExt;
use idempotency_axum::{IdempotencyLayer, ProblemJson, ProblemPath, ProblemQuery, SharedScope};
use idempotency_core::IdempotencyService;
use idempotency_core::store::InsertCompleted;
use serde::Deserialize;
use support::Reply;
use support::stores::Backend;
use tower::ServiceExt;

#[derive(Clone, Copy, Debug)]
enum Mode {
    Transactional,
    Leased,
    Optimistic,
}

#[derive(Deserialize)]
struct Deposit {
    amount: i64,
}

fn answer(calls: &AtomicUsize, deposit: &Deposit) -> Response {
    calls.fetch_add(1, Ordering::SeqCst);
    if deposit.amount > 1000 {
        return (StatusCode::UNPROCESSABLE_ENTITY, "LIMIT_EXCEEDED").into_response();
    }
    (StatusCode::CREATED, format!("deposited {}", deposit.amount)).into_response()
}

async fn plain(State(calls): State<Arc<AtomicUsize>>, Json(deposit): Json<Deposit>) -> Response {
    answer(&calls, &deposit)
}

async fn problem(
    State(calls): State<Arc<AtomicUsize>>,
    ProblemJson(deposit): ProblemJson<Deposit>,
) -> Response {
    answer(&calls, &deposit)
}

/// The query of the deposit routes: a note, nothing else.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Note {
    #[allow(dead_code)] // read by serde only
    note: Option<String>,
}

async fn problem_query(
    State(calls): State<Arc<AtomicUsize>>,
    ProblemQuery(_): ProblemQuery<Note>,
    ProblemJson(deposit): ProblemJson<Deposit>,
) -> Response {
    answer(&calls, &deposit)
}

async fn plain_query(
    State(calls): State<Arc<AtomicUsize>>,
    Query(_): Query<Note>,
    ProblemJson(deposit): ProblemJson<Deposit>,
) -> Response {
    answer(&calls, &deposit)
}

async fn problem_path(
    State(calls): State<Arc<AtomicUsize>>,
    ProblemPath(_): ProblemPath<String>,
    ProblemJson(deposit): ProblemJson<Deposit>,
) -> Response {
    answer(&calls, &deposit)
}

async fn problem_number(
    State(calls): State<Arc<AtomicUsize>>,
    ProblemPath(_): ProblemPath<u32>,
    ProblemJson(deposit): ProblemJson<Deposit>,
) -> Response {
    answer(&calls, &deposit)
}

async fn plain_path(
    State(calls): State<Arc<AtomicUsize>>,
    Path(_): Path<String>,
    ProblemJson(deposit): ProblemJson<Deposit>,
) -> Response {
    answer(&calls, &deposit)
}

/// Any JSON value, as axum's `Json` reads it (serde_json reads 128 levels).
async fn value(
    State(calls): State<Arc<AtomicUsize>>,
    Json(_): Json<serde_json::Value>,
) -> Response {
    calls.fetch_add(1, Ordering::SeqCst);
    (StatusCode::CREATED, "stored").into_response()
}

/// Any JSON value, through `ProblemJson`.
async fn problem_value(
    State(calls): State<Arc<AtomicUsize>>,
    ProblemJson(_): ProblemJson<serde_json::Value>,
) -> Response {
    calls.fetch_add(1, Ordering::SeqCst);
    (StatusCode::CREATED, "stored").into_response()
}

/// A JSON object `depth` levels deep: `{"amount": 10, "x": [[...]]}`.
fn nested_body(depth: usize) -> String {
    format!(
        r#"{{"amount": 10, "x": {}"]]"{}}}"#,
        "[".repeat(depth - 1),
        "]".repeat(depth - 1)
    )
}

fn app<B: Backend + InsertCompleted>(store: B, mode: Mode) -> (Router, Arc<AtomicUsize>) {
    let calls = Arc::new(AtomicUsize::new(0));
    let layer = IdempotencyLayer::new(IdempotencyService::new(store)).scope::<SharedScope>();
    let routes = Router::new()
        .route("/plain", post(plain))
        .route("/problem", post(problem))
        .route("/value", post(value))
        .route("/problem-value", post(problem_value))
        .route("/problem-query", post(problem_query))
        .route("/plain-query", post(plain_query))
        .route("/problem-path/{account}", post(problem_path))
        .route("/problem-number/{account}", post(problem_number))
        .route("/plain-path/{account}", post(plain_path));
    let routes = match mode {
        Mode::Transactional => routes.route_layer(layer),
        Mode::Leased => routes.route_layer(layer.leased(Duration::from_secs(60))),
        Mode::Optimistic => routes.route_layer(layer.optimistic()),
    };
    (routes.with_state(Arc::clone(&calls)), calls)
}

async fn send(app: &Router, uri: &str, key: &str, content_type: Option<&str>, body: &str) -> Reply {
    let mut request = Request::builder()
        .method(Method::POST)
        .uri(uri)
        .header("idempotency-key", key);
    if let Some(content_type) = content_type {
        request = request.header(header::CONTENT_TYPE, content_type);
    }
    let request = request.body(Body::from(body.to_owned())).unwrap();
    let response = app.clone().oneshot(request).await.unwrap();
    let (parts, body) = response.into_parts();
    Reply {
        status: parts.status,
        headers: parts.headers,
        body: body.collect().await.unwrap().to_bytes(),
    }
}

const JSON: Option<&str> = Some("application/json");

/// How often the handler runs: `claim_first` times in the claim-first and leased modes, and
/// `more` times more in the optimistic one, whose handler also runs (and is rolled back) for
/// a replay and for a key reused with another payload.
fn runs(mode: Mode, claim_first: usize, more: usize) -> usize {
    match mode {
        Mode::Optimistic => claim_first + more,
        Mode::Transactional | Mode::Leased => claim_first,
    }
}

/// The refused request, then the corrected one under the same key: it runs.
async fn refused_then_corrected(
    app: &Router,
    uri: &str,
    content_type: Option<&str>,
    body: &str,
) -> Reply {
    let key = idempotency_testing::unique_name("refused");
    let refused = send(app, uri, &key, content_type, body).await;
    assert!(
        refused.status.is_client_error(),
        "{uri} {body}: {refused:?}"
    );
    let corrected = send(app, uri, &key, JSON, r#"{"amount": 10}"#).await;
    assert_eq!(
        (corrected.status, corrected.text().as_str()),
        (StatusCode::CREATED, "deposited 10"),
        "the corrected retry of {uri} {body} ({}) runs",
        refused.status
    );
    assert!(!corrected.is_replay());
    refused
}

async fn a_body_the_extractors_refuse_stores_nothing<B: Backend + InsertCompleted>(mode: Mode) {
    let (store, _cleanup) = B::fresh().await;
    let (app, calls) = app(store, mode);
    // axum's plain Json: a syntax error is its plain-text 400.
    let refused = refused_then_corrected(&app, "/plain", JSON, r#"{"amount": "#).await;
    assert_eq!(refused.status, StatusCode::BAD_REQUEST);
    refused_then_corrected(&app, "/plain", JSON, "not json").await;
    // ProblemJson: syntax, shape and media type refusals are problems; none is stored.
    refused_then_corrected(&app, "/problem", JSON, r#"{"amount": "#)
        .await
        .assert_problem(400, "invalid-request-body");
    refused_then_corrected(&app, "/problem", JSON, r#"{"amount": "ten"}"#)
        .await
        .assert_problem(422, "invalid-request-body");
    refused_then_corrected(&app, "/problem", None, r#"{"amount": 10}"#)
        .await
        .assert_problem(415, "unsupported-media-type");
    assert_eq!(
        calls.load(Ordering::SeqCst),
        5,
        "only the corrected requests ran"
    );
}

/// `ProblemQuery` refusing the query (an unknown parameter, one given twice) answers `400
/// invalid-request-query` and stores nothing: the retry with the corrected query runs under
/// the same key. axum's plain `Query` refusal is a plain-text 400 the layer stores like the
/// handler's own, as documented: the corrected retry is another payload.
async fn a_query_the_extractor_refuses_stores_nothing<B: Backend + InsertCompleted>(mode: Mode) {
    let (store, _cleanup) = B::fresh().await;
    let (app, calls) = app(store, mode);
    let body = r#"{"amount": 10}"#;
    for (refused_uri, named) in [
        ("/problem-query?memo=rent", "memo"),
        ("/problem-query?note=a&note=b", "note"),
    ] {
        let key = idempotency_testing::unique_name("refused-query");
        let refused = send(&app, refused_uri, &key, JSON, body).await;
        let problem = refused.assert_problem(400, "invalid-request-query");
        let detail = problem["detail"].as_str().unwrap_or_default();
        assert!(detail.contains(named), "{refused_uri}: {problem}");
        assert!(!refused.is_replay());
        let corrected = send(&app, "/problem-query?note=rent", &key, JSON, body).await;
        assert_eq!(
            (corrected.status, corrected.text().as_str()),
            (StatusCode::CREATED, "deposited 10"),
            "the corrected retry of {refused_uri} runs"
        );
        assert!(!corrected.is_replay());
    }
    let key = idempotency_testing::unique_name("plain-query");
    let refused = send(&app, "/plain-query?memo=rent", &key, JSON, body).await;
    assert_eq!(refused.status, StatusCode::BAD_REQUEST, "{refused:?}");
    send(&app, "/plain-query?note=rent", &key, JSON, body)
        .await
        .assert_problem(422, "idempotency-key-reused");
    assert_eq!(
        calls.load(Ordering::SeqCst),
        runs(mode, 2, 1),
        "only the corrected requests ran"
    );
}

/// `ProblemPath` refusing a path parameter (not UTF-8 once percent-decoded, not of the
/// parameter's type) answers `400 invalid-request-path` and stores nothing: the retry to the
/// corrected path runs under the same key. axum's plain `Path` refusal is a plain-text 400 the
/// layer stores like the handler's own, as documented: the corrected retry is another target.
async fn a_path_the_extractor_refuses_stores_nothing<B: Backend + InsertCompleted>(mode: Mode) {
    let (store, _cleanup) = B::fresh().await;
    let (app, calls) = app(store, mode);
    let body = r#"{"amount": 10}"#;
    for (refused_uri, corrected_uri) in [
        ("/problem-path/%FF", "/problem-path/A"),
        ("/problem-path/A%C3%28", "/problem-path/A"),
        ("/problem-number/alice", "/problem-number/7"),
        ("/problem-number/-1", "/problem-number/7"),
    ] {
        let key = idempotency_testing::unique_name("refused-path");
        let refused = send(&app, refused_uri, &key, JSON, body).await;
        refused.assert_problem(400, "invalid-request-path");
        assert!(!refused.is_replay());
        let corrected = send(&app, corrected_uri, &key, JSON, body).await;
        assert_eq!(
            (corrected.status, corrected.text().as_str()),
            (StatusCode::CREATED, "deposited 10"),
            "the corrected retry of {refused_uri} runs"
        );
        assert!(!corrected.is_replay());
    }
    let key = idempotency_testing::unique_name("plain-path");
    let refused = send(&app, "/plain-path/%FF", &key, JSON, body).await;
    assert_eq!(refused.status, StatusCode::BAD_REQUEST, "{refused:?}");
    send(&app, "/plain-path/A", &key, JSON, body)
        .await
        .assert_problem(422, "idempotency-key-reused");
    assert_eq!(
        calls.load(Ordering::SeqCst),
        runs(mode, 4, 1),
        "only the corrected requests ran"
    );
}

/// A JSON body nested deeper than `MAX_JSON_DEPTH` is refused by the layer before the key is
/// acquired: `422 invalid-request-body` (`reason: too-deep`), the handler never runs (even one
/// whose extractor would take it), nothing is stored, a retry is refused the same way, and the
/// key stays free for a body of the deepest allowed nesting.
async fn a_body_nested_deeper_than_the_limit_never_reaches_the_handler<
    B: Backend + InsertCompleted,
>(
    mode: Mode,
) {
    let (store, _cleanup) = B::fresh().await;
    let (app, calls) = app(store, mode);
    let depth = idempotency_core::MAX_JSON_DEPTH;
    for uri in ["/value", "/problem-value", "/plain"] {
        let key = idempotency_testing::unique_name("too-deep");
        for attempt in 0..2 {
            let refused = send(&app, uri, &key, JSON, &nested_body(depth + 1)).await;
            let problem = refused.assert_problem(422, "invalid-request-body");
            assert_eq!(problem["reason"], "too-deep", "{uri}: {problem}");
            assert_eq!(problem["maxDepth"], depth, "{uri}: {problem}");
            assert!(!refused.is_replay(), "{uri}, attempt {attempt}");
            assert_eq!(
                calls.load(Ordering::SeqCst),
                0,
                "{uri}, attempt {attempt}: the handler never ran"
            );
        }
        // Far beyond serde_json's own 128 levels: the same answer.
        send(&app, uri, &key, JSON, &nested_body(1000))
            .await
            .assert_problem(422, "invalid-request-body");
    }
    // Nothing was stored under the keys: the deepest allowed body runs, then replays.
    let key = idempotency_testing::unique_name("deepest");
    let _ = send(&app, "/value", &key, JSON, &nested_body(depth + 1)).await;
    let first = send(&app, "/value", &key, JSON, &nested_body(depth)).await;
    assert_eq!(
        (first.status, first.text().as_str()),
        (StatusCode::CREATED, "stored"),
        "{first:?}"
    );
    assert!(!first.is_replay());
    let again = send(&app, "/value", &key, JSON, &nested_body(depth)).await;
    assert!(again.is_replay());
    assert_eq!(calls.load(Ordering::SeqCst), runs(mode, 1, 1));
    // A body not declared JSON is the handler's to judge (axum's Json answers 415).
    let key = idempotency_testing::unique_name("not-json");
    let not_json = send(
        &app,
        "/value",
        &key,
        Some("text/plain"),
        &nested_body(depth + 1),
    )
    .await;
    assert_eq!(not_json.status, StatusCode::UNSUPPORTED_MEDIA_TYPE);
}

/// `ProblemJson` without the layer refuses a body nested deeper than `MAX_JSON_DEPTH` the same
/// way, before the handler: `422 invalid-request-body`, `reason: too-deep`; a body of the
/// deepest allowed nesting reaches it; media type and syntax are judged as before.
#[tokio::test]
async fn problem_json_refuses_a_body_nested_deeper_than_the_limit() {
    let calls = Arc::new(AtomicUsize::new(0));
    let app = Router::new()
        .route("/problem-value", post(problem_value))
        .with_state(Arc::clone(&calls));
    let depth = idempotency_core::MAX_JSON_DEPTH;
    for body in [nested_body(depth + 1), nested_body(200)] {
        let refused = send(&app, "/problem-value", "k", JSON, &body).await;
        let problem = refused.assert_problem(422, "invalid-request-body");
        assert_eq!(problem["reason"], "too-deep");
    }
    send(
        &app,
        "/problem-value",
        "k",
        Some("application/vnd.api+json"),
        &nested_body(depth + 1),
    )
    .await
    .assert_problem(422, "invalid-request-body");
    assert_eq!(calls.load(Ordering::SeqCst), 0);
    send(&app, "/problem-value", "k", None, &nested_body(depth + 1))
        .await
        .assert_problem(415, "unsupported-media-type");
    send(&app, "/problem-value", "k", JSON, r#"{"x": [[["#)
        .await
        .assert_problem(400, "invalid-request-body");
    let ok = send(&app, "/problem-value", "k", JSON, &nested_body(depth)).await;
    assert_eq!(ok.status, StatusCode::CREATED, "{ok:?}");
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

async fn a_rejection_the_handler_returns_is_stored<B: Backend + InsertCompleted>(mode: Mode) {
    let (store, _cleanup) = B::fresh().await;
    let (app, calls) = app(store, mode);
    for uri in ["/plain", "/problem"] {
        let key = idempotency_testing::unique_name("rejected");
        let first = send(&app, uri, &key, JSON, r#"{"amount": 5000}"#).await;
        assert_eq!(first.status, StatusCode::UNPROCESSABLE_ENTITY);
        let retry = send(&app, uri, &key, JSON, r#"{"amount": 5000}"#).await;
        assert!(retry.is_replay(), "{uri}");
        assert_eq!(retry.body, first.body);
        send(&app, uri, &key, JSON, r#"{"amount": 10}"#)
            .await
            .assert_problem(422, "idempotency-key-reused");
    }
    assert_eq!(calls.load(Ordering::SeqCst), runs(mode, 2, 4));
}

macro_rules! every_case {
    ($store:ty; $($name:ident),* $(,)?) => {
        mod transactional {
            use super::super::*;
            $(
                #[tokio::test(flavor = "multi_thread")]
                async fn $name() {
                    super::super::$name::<$store>(Mode::Transactional).await;
                }
            )*
        }
        mod leased {
            use super::super::*;
            $(
                #[tokio::test(flavor = "multi_thread")]
                async fn $name() {
                    super::super::$name::<$store>(Mode::Leased).await;
                }
            )*
        }
        mod optimistic {
            use super::super::*;
            $(
                #[tokio::test(flavor = "multi_thread")]
                async fn $name() {
                    super::super::$name::<$store>(Mode::Optimistic).await;
                }
            )*
        }
    };
}

mod postgres {
    every_case!(idempotency_pg::PgStore;
        a_body_the_extractors_refuse_stores_nothing,
        a_query_the_extractor_refuses_stores_nothing,
        a_path_the_extractor_refuses_stores_nothing,
        a_body_nested_deeper_than_the_limit_never_reaches_the_handler,
        a_rejection_the_handler_returns_is_stored,
    );
}

mod sqlite {
    every_case!(idempotency_sqlite::SqliteStore;
        a_body_the_extractors_refuse_stores_nothing,
        a_query_the_extractor_refuses_stores_nothing,
        a_path_the_extractor_refuses_stores_nothing,
        a_body_nested_deeper_than_the_limit_never_reaches_the_handler,
        a_rejection_the_handler_returns_is_stored,
    );
}
