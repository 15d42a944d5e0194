//! Bytes the layer must neither merge nor lose: opted-in request header values that are not
//! UTF-8 (fingerprinted as their bytes), response header values that are not visible ASCII
//! (stored and replayed as they were), and JSON numbers a double cannot hold (two such
//! payloads stay two). On PostgreSQL and SQLite.

#![allow(clippy::unwrap_used)] // tests fail loudly on unexpected errors

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderName, HeaderValue, Method, Request, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use http_body_util::BodyExt;
use idempotency_axum::{IdempotencyLayer, SharedScope};
use idempotency_core::IdempotencyService;
use support::Reply;
use support::stores::Backend;
use tower::ServiceExt;

const FILENAME: &[u8] = "attachment; filename=\"résumé.pdf\"".as_bytes();
const LATIN1: &[u8] = b"fr-\xe9t\xe9";

async fn handler(State(calls): State<Arc<AtomicUsize>>, _body: Bytes) -> Response {
    let call = calls.fetch_add(1, Ordering::SeqCst) + 1;
    let mut response = (StatusCode::CREATED, format!("call {call}")).into_response();
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_DISPOSITION,
        HeaderValue::from_bytes(FILENAME).unwrap(),
    );
    headers.insert(
        header::CONTENT_LANGUAGE,
        HeaderValue::from_bytes(LATIN1).unwrap(),
    );
    response
}

fn app<B: Backend>(store: B) -> (Router, Arc<AtomicUsize>) {
    let calls = Arc::new(AtomicUsize::new(0));
    let layer = IdempotencyLayer::new(IdempotencyService::new(store))
        .scope::<SharedScope>()
        .fingerprint_header(HeaderName::from_static("x-customer"))
        .unwrap();
    let app = Router::new()
        .route("/files", post(handler))
        .route_layer(layer)
        .with_state(Arc::clone(&calls));
    (app, calls)
}

async fn send(app: &Router, key: &str, customer: &[u8], body: &str) -> Reply {
    let request = Request::builder()
        .method(Method::POST)
        .uri("/files")
        .header("idempotency-key", key)
        .header("x-customer", HeaderValue::from_bytes(customer).unwrap())
        .header("content-type", "application/json")
        .body(Body::from(body.to_owned()))
        .unwrap();
    let response = app.clone().oneshot(request).await.unwrap();
    let (parts, body) = response.into_parts();
    Reply {
        status: parts.status,
        headers: parts.headers,
        body: body.collect().await.unwrap().to_bytes(),
    }
}

async fn header_values_that_are_not_utf8_are_fingerprinted_as_bytes<B: Backend>() {
    let (store, _cleanup) = B::fresh().await;
    let (app, calls) = app(store);
    let first = send(&app, "k", b"M\xfcller", "{}").await;
    assert_eq!(first.status, StatusCode::CREATED);
    assert!(send(&app, "k", b"M\xfcller", "{}").await.is_replay());
    send(&app, "k", b"M\xe4ller", "{}")
        .await
        .assert_problem(422, "idempotency-key-reused");
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

async fn response_header_bytes_replay_as_they_were<B: Backend>() {
    let (store, _cleanup) = B::fresh().await;
    let (app, _calls) = app(store);
    let first = send(&app, "k", b"a", "{}").await;
    let replay = send(&app, "k", b"a", "{}").await;
    assert!(replay.is_replay());
    for reply in [&first, &replay] {
        assert_eq!(
            reply.headers[header::CONTENT_DISPOSITION].as_bytes(),
            FILENAME
        );
        assert_eq!(reply.headers[header::CONTENT_LANGUAGE].as_bytes(), LATIN1);
    }
}

async fn numbers_a_double_cannot_hold_are_not_merged<B: Backend>() {
    let (store, _cleanup) = B::fresh().await;
    let (app, calls) = app(store);
    for (key, first, second) in [
        (
            "big",
            r#"{"n":1234567890123456789012345678901}"#,
            r#"{"n":1234567890123456789012345678902}"#,
        ),
        (
            "fraction",
            r#"{"n":0.1}"#,
            r#"{"n":0.10000000000000000001}"#,
        ),
        (
            "above-2^53",
            r#"{"n":9007199254740992.0}"#,
            r#"{"n":9007199254740993.0}"#,
        ),
    ] {
        assert_eq!(
            send(&app, key, b"a", first).await.status,
            StatusCode::CREATED
        );
        send(&app, key, b"a", second)
            .await
            .assert_problem(422, "idempotency-key-reused");
    }
    // Spellings of one exact value stay one payload.
    assert_eq!(
        send(&app, "same", b"a", r#"{"n": 100, "m": 0.5}"#)
            .await
            .status,
        201
    );
    assert!(
        send(&app, "same", b"a", r#"{"m":5e-1,"n":1e2}"#)
            .await
            .is_replay()
    );
    assert_eq!(calls.load(Ordering::SeqCst), 4);
}

macro_rules! every_case {
    ($store:ty; $($name:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread")]
            async fn $name() {
                super::$name::<$store>().await;
            }
        )*
    };
}

mod postgres {
    every_case!(idempotency_pg::PgStore;
        header_values_that_are_not_utf8_are_fingerprinted_as_bytes,
        response_header_bytes_replay_as_they_were,
        numbers_a_double_cannot_hold_are_not_merged,
    );
}

mod sqlite {
    every_case!(idempotency_sqlite::SqliteStore;
        header_values_that_are_not_utf8_are_fingerprinted_as_bytes,
        response_header_bytes_replay_as_they_were,
        numbers_a_double_cannot_hold_are_not_merged,
    );
}
