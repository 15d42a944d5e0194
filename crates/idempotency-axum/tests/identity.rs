//! The identity of a request through `IdempotencyLayer`: the concrete target (path with its
//! parameters, normalised query, host when configured) is part of it, so the same key and body
//! sent to another target is `422 idempotency-key-reused`, never a replay. Every case runs in
//! both modes (transactional, leased) on a real PostgreSQL and on SQLite.

#![allow(clippy::unwrap_used)] // tests fail loudly on unexpected errors

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{OriginalUri, State};
use axum::http::{Method, StatusCode};
use axum::routing::post;
use idempotency_axum::{IdempotencyLayer, SharedScope};
use idempotency_core::IdempotencyService;
use support::Reply;
use support::stores::Backend;

#[derive(Clone, Copy, Debug)]
enum Mode {
    Transactional,
    Leased,
}

/// Answers 201 with the target it ran for and how many times the handler ran.
async fn handler(
    State(calls): State<Arc<AtomicUsize>>,
    OriginalUri(uri): OriginalUri,
    _body: Bytes,
) -> (StatusCode, String) {
    let call = calls.fetch_add(1, Ordering::SeqCst) + 1;
    (StatusCode::CREATED, format!("{call} {uri}"))
}

fn layer<B: Backend>(
    store: B,
    mode: Mode,
    host: bool,
) -> impl Fn(Router<Arc<AtomicUsize>>) -> Router<Arc<AtomicUsize>> {
    move |router| {
        let layer =
            IdempotencyLayer::new(IdempotencyService::new(store.clone())).scope::<SharedScope>();
        let layer = if host {
            layer.fingerprint_host()
        } else {
            layer
        };
        match mode {
            Mode::Transactional => router.route_layer(layer),
            Mode::Leased => router.route_layer(layer.leased(Duration::from_secs(60))),
        }
    }
}

/// Routes with path parameters, a wildcard, a query, and a parameter in a nest prefix.
fn app<B: Backend>(store: B, mode: Mode, host: bool) -> (Router, Arc<AtomicUsize>) {
    let calls = Arc::new(AtomicUsize::new(0));
    let with = layer(store, mode, host);
    let routes = with(
        Router::new()
            .route("/accounts/{account}/charges", post(handler))
            .route("/files/{*rest}", post(handler))
            .route("/transfers", post(handler)),
    );
    let nested = with(Router::new().route("/orders", post(handler)));
    let app = routes
        .nest("/tenants/{tenant}", nested)
        .with_state(Arc::clone(&calls));
    (app, calls)
}

async fn send(app: &Router, uri: &str, key: &str, host: Option<&str>) -> Reply {
    let mut headers: Vec<(&str, &[u8])> = vec![("idempotency-key", key.as_bytes())];
    if let Some(host) = host {
        headers.push(("host", host.as_bytes()));
    }
    let body = serde_json::json!({"amount": 10});
    support::send(app, Method::POST, uri, &headers, Some(&body)).await
}

/// Sends `first`, its retry (a replay), then `second` under the same key and body: a 422 key
/// reuse that runs nothing.
async fn another_target_is_a_key_reuse(
    app: &Router,
    calls: &AtomicUsize,
    first: &str,
    second: &str,
) {
    let key = format!("k-{}", idempotency_testing::unique_name("id"));
    let ran = send(app, first, &key, None).await;
    assert_eq!(ran.status, StatusCode::CREATED, "{first}: {}", ran.text());
    let replay = send(app, first, &key, None).await;
    assert!(replay.is_replay(), "{first} retried");
    assert_eq!(replay.body, ran.body);
    let before = calls.load(Ordering::SeqCst);
    send(app, second, &key, None)
        .await
        .assert_problem(422, "idempotency-key-reused");
    assert_eq!(calls.load(Ordering::SeqCst), before, "{second} ran nothing");
}

/// Sends `first`, then `second` under the same key and body: one target, so a replay.
async fn same_target(app: &Router, first: &str, second: &str) {
    let key = format!("k-{}", idempotency_testing::unique_name("id"));
    let ran = send(app, first, &key, None).await;
    assert_eq!(ran.status, StatusCode::CREATED, "{first}: {}", ran.text());
    let replay = send(app, second, &key, None).await;
    assert!(
        replay.is_replay(),
        "{second} after {first}: {}",
        replay.text()
    );
    assert_eq!(replay.body, ran.body);
}

async fn path_parameters_are_part_of_the_identity<B: Backend>(mode: Mode) {
    let (store, _cleanup) = B::fresh().await;
    let (app, calls) = app(store, mode, false);
    another_target_is_a_key_reuse(&app, &calls, "/accounts/A/charges", "/accounts/B/charges").await;
    another_target_is_a_key_reuse(&app, &calls, "/tenants/t1/orders", "/tenants/t2/orders").await;
    another_target_is_a_key_reuse(
        &app,
        &calls,
        "/accounts/a%2Fb/charges",
        "/accounts/a/charges",
    )
    .await;
    same_target(&app, "/accounts/A/charges", "/accounts/%41/charges").await;
}

async fn wildcards_are_part_of_the_identity<B: Backend>(mode: Mode) {
    let (store, _cleanup) = B::fresh().await;
    let (app, calls) = app(store, mode, false);
    another_target_is_a_key_reuse(&app, &calls, "/files/a/b.txt", "/files/a/c.txt").await;
    another_target_is_a_key_reuse(&app, &calls, "/files/a", "/files/a/b").await;
}

async fn the_normalised_query_is_part_of_the_identity<B: Backend>(mode: Mode) {
    let (store, _cleanup) = B::fresh().await;
    let (app, calls) = app(store, mode, false);
    another_target_is_a_key_reuse(&app, &calls, "/transfers?to=alice", "/transfers?to=bob").await;
    another_target_is_a_key_reuse(&app, &calls, "/transfers", "/transfers?to=bob").await;
    another_target_is_a_key_reuse(&app, &calls, "/transfers?to=a&to=b", "/transfers?to=b&to=a")
        .await;
    same_target(
        &app,
        "/transfers?to=alice&n=1+2",
        "/transfers?n=1%202&to=al%69ce&",
    )
    .await;
    same_target(&app, "/transfers?", "/transfers").await;
}

async fn the_host_is_part_of_the_identity_when_configured<B: Backend>(mode: Mode) {
    let (store, _cleanup) = B::fresh().await;
    let key = format!("k-{}", idempotency_testing::unique_name("id"));
    let (app, calls) = app(store.clone(), mode, true);
    let ran = send(&app, "/transfers", &key, Some("a.example.com")).await;
    assert_eq!(ran.status, StatusCode::CREATED);
    assert!(
        send(&app, "/transfers", &key, Some("A.Example.com"))
            .await
            .is_replay()
    );
    send(&app, "/transfers", &key, Some("b.example.com"))
        .await
        .assert_problem(422, "idempotency-key-reused");
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    // Not configured: the host is not part of it.
    let (app, _) = self::app(store, mode, false);
    let key = format!("k-{}", idempotency_testing::unique_name("id"));
    assert_eq!(
        send(&app, "/transfers", &key, Some("a.example.com"))
            .await
            .status,
        201
    );
    assert!(
        send(&app, "/transfers", &key, Some("b.example.com"))
            .await
            .is_replay()
    );
}

/// `POST /transfers` with `body` as `content_type`.
async fn send_typed(app: &Router, key: &str, content_type: &str, body: &str) -> Reply {
    use tower::ServiceExt;
    let request = axum::http::Request::post("/transfers")
        .header("idempotency-key", key)
        .header("content-type", content_type)
        .body(axum::body::Body::from(body.to_owned()))
        .unwrap();
    support::reply(app.clone().oneshot(request).await.unwrap()).await
}

/// A body is compared as JSON only under a JSON media type as `axum::Json` takes it
/// (`application/json`, `application/*+json`): under `text/x+json` the same members in
/// another order are another body, `422`, as under any type that is not JSON (before: any
/// `*+json` was compared as JSON, so the handler, reading the bytes, was answered with the
/// response to other bytes).
async fn a_body_is_json_only_under_a_json_media_type<B: Backend>(mode: Mode) {
    let (store, _cleanup) = B::fresh().await;
    let (app, calls) = app(store, mode, false);
    for (content_type, same) in [("application/vnd.api+json", true), ("text/x+json", false)] {
        let key = format!("k-{}", idempotency_testing::unique_name("mt"));
        let ran = send_typed(&app, &key, content_type, r#"{"a":1,"b":2}"#).await;
        assert_eq!(ran.status, StatusCode::CREATED, "{content_type}");
        let before = calls.load(Ordering::SeqCst);
        let second = send_typed(&app, &key, content_type, r#"{"b":2,"a":1}"#).await;
        if same {
            assert!(second.is_replay(), "{content_type}: {}", second.text());
        } else {
            second.assert_problem(422, "idempotency-key-reused");
        }
        assert_eq!(calls.load(Ordering::SeqCst), before, "{content_type}");
    }
}

macro_rules! every_case {
    ($store:ty) => {
        every_case!(@ $store;
            path_parameters_are_part_of_the_identity,
            wildcards_are_part_of_the_identity,
            the_normalised_query_is_part_of_the_identity,
            the_host_is_part_of_the_identity_when_configured,
            a_body_is_json_only_under_a_json_media_type,
        );
    };
    (@ $store:ty; $($name:ident),* $(,)?) => {
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
    };
}

mod postgres {
    every_case!(idempotency_pg::PgStore);
}

mod sqlite {
    every_case!(idempotency_sqlite::SqliteStore);
}
