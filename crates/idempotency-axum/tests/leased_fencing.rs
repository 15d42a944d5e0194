//! Leased mode through `IdempotencyLayer`: the fencing token never comes back after a release.
//! A holds the key past its lease, B takes it over and answers a status that is not stored
//! (the claim is released), C claims the key again. A's late completion must not be stored as
//! C's, and A's late release must not free C's claim. And a claim left by a holder that died
//! under the previous fingerprint algorithm is taken over during the transition. On a real
//! PostgreSQL and on SQLite.

#![allow(clippy::unwrap_used)] // tests fail loudly on unexpected errors

mod support;

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use idempotency_axum::{IdempotencyLayer, SharedScope};
use idempotency_core::{
    HashAlgorithm, IdempotencyService, InFlightPolicy, JcsFingerprint, ServiceOptions,
};
use support::Reply;
use support::stores::Backend;
use tokio::sync::Notify;

/// How one request (named by `x-step`) behaves: held until released, then answers `status`.
#[derive(Default)]
struct Step {
    hold: bool,
    status: Option<StatusCode>,
    entered: Notify,
    release: Notify,
}

#[derive(Default)]
struct Provider {
    calls: AtomicUsize,
    steps: HashMap<&'static str, Step>,
}

async fn charge(State(provider): State<Arc<Provider>>, headers: HeaderMap, _: Bytes) -> Response {
    provider.calls.fetch_add(1, Ordering::SeqCst);
    let name = headers["x-step"].to_str().unwrap().to_owned();
    let step = &provider.steps[name.as_str()];
    if step.hold {
        step.entered.notify_one();
        step.release.notified().await;
    }
    let status = step.status.unwrap_or(StatusCode::CREATED);
    (status, format!("ran {name}")).into_response()
}

/// The lease: the test outlives it once on purpose (A's), and the steps after the takeover
/// finish well within it.
const LEASE: Duration = Duration::from_secs(3);

fn app<B: Backend>(store: B, steps: HashMap<&'static str, Step>) -> (Router, Arc<Provider>) {
    let provider = Arc::new(Provider {
        calls: AtomicUsize::new(0),
        steps,
    });
    (with_provider(store, &provider, None), provider)
}

/// The route behind a leased layer with `fingerprint` (the service's strategy when `None`).
fn with_provider<B: Backend>(
    store: B,
    provider: &Arc<Provider>,
    fingerprint: Option<JcsFingerprint>,
) -> Router {
    let config = ServiceOptions {
        in_flight: InFlightPolicy::Reject,
        ..ServiceOptions::default()
    };
    let service = IdempotencyService::builder(store).config(config).build();
    let layer = IdempotencyLayer::new(service).scope::<SharedScope>();
    let layer = match fingerprint {
        Some(strategy) => layer.fingerprint(strategy),
        None => layer,
    };
    Router::new()
        .route("/charge", post(charge))
        .route_layer(layer.leased(LEASE))
        .with_state(Arc::clone(provider))
}

async fn send(app: &Router, step: &str) -> Reply {
    let headers: [(&str, &[u8]); 2] = [("idempotency-key", b"k"), ("x-step", step.as_bytes())];
    let body = serde_json::json!({"amount": 4900});
    support::send(app, Method::POST, "/charge", &headers, Some(&body)).await
}

fn steps(a_status: StatusCode) -> HashMap<&'static str, Step> {
    let step = |hold, status| Step {
        hold,
        status: Some(status),
        ..Step::default()
    };
    HashMap::from([
        ("a", step(true, a_status)),
        ("b", step(false, StatusCode::BAD_GATEWAY)),
        ("c", step(true, StatusCode::CREATED)),
        ("d", step(false, StatusCode::CREATED)),
        ("e", step(false, StatusCode::CREATED)),
    ])
}

/// A holds past its lease; B takes over and answers 502 (released); C claims and holds.
/// Returns A's and C's running requests.
async fn interleave(
    app: &Router,
    provider: &Arc<Provider>,
) -> (
    tokio::task::JoinHandle<Reply>,
    tokio::task::JoinHandle<Reply>,
) {
    let spawn = |step: &'static str| {
        let app = app.clone();
        tokio::spawn(async move { send(&app, step).await })
    };
    let a = spawn("a");
    provider.steps["a"].entered.notified().await;
    tokio::time::sleep(LEASE + LEASE / 2).await;
    let b = send(app, "b").await;
    assert_eq!(
        b.status,
        StatusCode::BAD_GATEWAY,
        "B took over: {}",
        b.text()
    );
    let c = spawn("c");
    provider.steps["c"].entered.notified().await;
    (a, c)
}

async fn a_stale_completion_after_a_release_is_not_stored<B: Backend>() {
    let (store, _cleanup) = B::fresh().await;
    let (app, provider) = app(store, steps(StatusCode::CREATED));
    let (a, c) = interleave(&app, &provider).await;
    provider.steps["a"].release.notify_one();
    assert_eq!(a.await.unwrap().text(), "ran a", "A's own answer");
    let d = send(&app, "d").await;
    d.assert_problem(409, "request-in-flight");
    provider.steps["c"].release.notify_one();
    let c = c.await.unwrap();
    assert_eq!(
        (c.status, c.text().as_str()),
        (StatusCode::CREATED, "ran c")
    );
    let e = send(&app, "e").await;
    assert!(e.is_replay());
    assert_eq!(e.text(), "ran c", "C's answer is the stored one");
    assert_eq!(provider.calls.load(Ordering::SeqCst), 3, "A, B and C ran");
}

async fn a_stale_release_does_not_free_a_later_claim<B: Backend>() {
    let (store, _cleanup) = B::fresh().await;
    let (app, provider) = app(store, steps(StatusCode::SERVICE_UNAVAILABLE));
    let (a, c) = interleave(&app, &provider).await;
    provider.steps["a"].release.notify_one();
    assert_eq!(a.await.unwrap().status, StatusCode::SERVICE_UNAVAILABLE);
    let d = send(&app, "d").await;
    d.assert_problem(409, "request-in-flight");
    provider.steps["c"].release.notify_one();
    assert_eq!(c.await.unwrap().text(), "ran c");
    let e = send(&app, "e").await;
    assert!(e.is_replay());
    assert_eq!(e.text(), "ran c");
    assert_eq!(
        provider.calls.load(Ordering::SeqCst),
        3,
        "D never ran beside C"
    );
}

/// A holder that died under the old fingerprint algorithm leaves an expired claim; during the
/// transition to a new algorithm (which accepts the old one), the next request takes it over
/// and runs, instead of answering 409 until cleanup.
async fn a_claim_left_under_the_previous_algorithm_is_taken_over<B: Backend>() {
    let (store, _cleanup) = B::fresh().await;
    let (before, provider) = app(store.clone(), steps(StatusCode::CREATED));
    let a = tokio::spawn({
        let before = before.clone();
        async move { send(&before, "a").await }
    });
    provider.steps["a"].entered.notified().await;
    a.abort();
    assert!(
        a.await.unwrap_err().is_cancelled(),
        "A died holding the key"
    );
    tokio::time::sleep(LEASE + LEASE / 2).await;
    let transition = JcsFingerprint::new(HashAlgorithm::Sha512).accepting(HashAlgorithm::Sha256);
    let after = with_provider(store, &provider, Some(transition));
    let d = send(&after, "d").await;
    assert_eq!(
        (d.status, d.text().as_str()),
        (StatusCode::CREATED, "ran d"),
        "the expired claim was taken over"
    );
    let e = send(&after, "e").await;
    assert!(e.is_replay());
    assert_eq!(e.text(), "ran d");
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
        a_stale_completion_after_a_release_is_not_stored,
        a_stale_release_does_not_free_a_later_claim,
        a_claim_left_under_the_previous_algorithm_is_taken_over,
    );
}

mod sqlite {
    every_case!(idempotency_sqlite::SqliteStore;
        a_stale_completion_after_a_release_is_not_stored,
        a_stale_release_does_not_free_a_later_claim,
        a_claim_left_under_the_previous_algorithm_is_taken_over,
    );
}
