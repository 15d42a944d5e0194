//! `IdempotencyLayer` in leased mode, for a handler whose effect is outside the database (a
//! counter stands for the payment provider), on a real PostgreSQL and on SQLite: the claim
//! commits at once, a duplicate is told to retry, a dead holder's lease expires and the next
//! request takes the key over, and a stale holder's late completion is refused.

#![allow(clippy::unwrap_used)] // tests fail loudly on unexpected errors

mod support;

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{Method, Request, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use http_body_util::BodyExt;
use idempotency_axum::{IdempotencyLayer, SharedScope};
use idempotency_core::config::{PersistenceConfig, SchemaMode};
use idempotency_core::{
    IdempotencyKey, IdempotencyService, InFlightPolicy, LeasedClaims, Operation, RecordId,
    RecordStatus, Scope, ServiceOptions,
};
use idempotency_pg::PgStore;
use idempotency_sqlite::SqliteStore;
use support::Reply;
use tokio::sync::Notify;
use tower::ServiceExt;

/// A store with leases, fresh per test, and what removes it.
trait Backend: LeasedClaims + Clone {
    fn fresh() -> impl Future<Output = (Self, Cleanup)> + Send;
}

struct Cleanup(Option<std::path::PathBuf>);

impl Drop for Cleanup {
    fn drop(&mut self) {
        if let Some(path) = &self.0 {
            for suffix in ["", "-wal", "-shm"] {
                let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
            }
        }
    }
}

impl Backend for PgStore {
    async fn fresh() -> (Self, Cleanup) {
        let store = PgStore::new(idempotency_testing::pg_pool().await);
        store.create_schema().await.unwrap();
        store.prepare_leases().await.unwrap();
        (store, Cleanup(None))
    }
}

impl Backend for SqliteStore {
    async fn fresh() -> (Self, Cleanup) {
        let path =
            std::env::temp_dir().join(format!("{}.db", idempotency_testing::unique_name("leased")));
        let mut config = PersistenceConfig::default();
        config.schema.mode = SchemaMode::Create;
        let store = SqliteStore::connect(path.to_str().unwrap(), &config)
            .await
            .unwrap();
        store.prepare_leases().await.unwrap();
        (store, Cleanup(Some(path)))
    }
}

/// The "payment provider": counts its calls; steered by the test.
#[derive(Default)]
struct Provider {
    calls: AtomicUsize,
    hold_next: AtomicBool,
    fail_next: AtomicBool,
    stream_next: AtomicBool,
    entered: Notify,
    release: Notify,
}

async fn charge(State(provider): State<Arc<Provider>>, _body: Bytes) -> Response {
    let call = provider.calls.fetch_add(1, Ordering::SeqCst) + 1;
    if provider.hold_next.swap(false, Ordering::SeqCst) {
        provider.entered.notify_one();
        provider.release.notified().await;
    }
    if provider.fail_next.swap(false, Ordering::SeqCst) {
        return (StatusCode::BAD_GATEWAY, "provider down").into_response();
    }
    if provider.stream_next.swap(false, Ordering::SeqCst) {
        let chunks = futures_util::stream::iter([Ok::<_, std::io::Error>(Bytes::from("streamed"))]);
        return (StatusCode::CREATED, Body::from_stream(chunks)).into_response();
    }
    let body = format!(r#"{{"provider_call":{call},"charge":"ch_{call}"}}"#);
    (
        StatusCode::CREATED,
        [("content-type", "application/json")],
        body,
    )
        .into_response()
}

fn app<B: Backend>(
    store: B,
    in_flight: InFlightPolicy,
    lease: Duration,
) -> (Router, Arc<Provider>) {
    let provider = Arc::new(Provider::default());
    let config = ServiceOptions {
        in_flight,
        ..ServiceOptions::default()
    };
    let service = IdempotencyService::builder(store).config(config).build();
    let app = Router::new()
        .route("/charge", post(charge))
        .route_layer(
            IdempotencyLayer::new(service)
                .scope::<SharedScope>()
                .leased(lease),
        )
        .with_state(Arc::clone(&provider));
    (app, provider)
}

async fn send(app: &Router, key: &str) -> Reply {
    let request = Request::builder()
        .method(Method::POST)
        .uri("/charge")
        .header("idempotency-key", key)
        .header("content-type", "application/json")
        .body(Body::from(r#"{"amount": 4900}"#))
        .unwrap();
    let response = app.clone().oneshot(request).await.unwrap();
    let (parts, body) = response.into_parts();
    Reply {
        status: parts.status,
        headers: parts.headers,
        body: body.collect().await.unwrap().to_bytes(),
    }
}

async fn record<B: Backend>(store: &B, key: &str) -> Option<RecordStatus> {
    let id = RecordId::new(
        Operation::new("POST:/charge").unwrap(),
        Scope::default(),
        IdempotencyKey::new(key).unwrap(),
    );
    store.lookup(&id).await.unwrap().map(|r| r.status())
}

const REJECT: InFlightPolicy = InFlightPolicy::Reject;
const LONG: Duration = Duration::from_secs(60);
/// A lease the tests outlive on purpose; long enough that the steps which must come before it
/// ends (a commit, an abort, a duplicate's claim) do, even behind a slow fsync.
const SHORT: Duration = Duration::from_secs(3);

async fn leased_first_run_then_byte_identical_replay<B: Backend>() {
    let (store, _cleanup) = B::fresh().await;
    let (app, provider) = app(store.clone(), REJECT, LONG);
    let first = send(&app, "k").await;
    assert_eq!(first.status, StatusCode::CREATED);
    let replay = send(&app, "k").await;
    assert!(replay.is_replay());
    assert_eq!((replay.status, &replay.body), (first.status, &first.body));
    assert_eq!(provider.calls.load(Ordering::SeqCst), 1);
    assert_eq!(record(&store, "k").await, Some(RecordStatus::Completed));
}

/// A duplicate of a request in flight answers 409 at once (the claim is committed, there is no
/// row lock to wait on) with `Retry-After` from the lease.
async fn leased_duplicate_in_flight_is_409_with_retry_after<B: Backend>() {
    let (store, _cleanup) = B::fresh().await;
    let (app, provider) = app(store, REJECT, LONG);
    provider.hold_next.store(true, Ordering::SeqCst);
    let holder = tokio::spawn({
        let app = app.clone();
        async move { send(&app, "k").await }
    });
    provider.entered.notified().await;
    let started = Instant::now();
    let duplicate = send(&app, "k").await;
    assert!(started.elapsed() < Duration::from_secs(5), "did not block");
    duplicate.assert_problem(409, "request-in-flight");
    let retry_after: u64 = duplicate.header("retry-after").unwrap().parse().unwrap();
    assert!(
        (30..=60).contains(&retry_after),
        "Retry-After {retry_after}"
    );
    provider.release.notify_one();
    assert_eq!(holder.await.unwrap().status, StatusCode::CREATED);
    assert_eq!(provider.calls.load(Ordering::SeqCst), 1);
}

/// Under the wait policy, a duplicate waits for the holder's outcome and replays it.
async fn leased_duplicate_waits_under_the_wait_policy<B: Backend>() {
    duplicate_waits::<B>(Duration::from_secs(10)).await;
}

/// A wait too long for the clock (`Duration::MAX`) is a wait without end, not a panic of the
/// connection's task.
async fn leased_a_wait_without_end_waits<B: Backend>() {
    duplicate_waits::<B>(Duration::MAX).await;
}

async fn duplicate_waits<B: Backend>(timeout: Duration) {
    let (store, _cleanup) = B::fresh().await;
    let wait = InFlightPolicy::Wait {
        timeout: Some(timeout),
    };
    let (app, provider) = app(store, wait, LONG);
    provider.hold_next.store(true, Ordering::SeqCst);
    let holder = tokio::spawn({
        let app = app.clone();
        async move { send(&app, "k").await }
    });
    tokio::time::timeout(Duration::from_secs(10), provider.entered.notified())
        .await
        .expect("the holder's handler was entered");
    let duplicate = tokio::spawn({
        let app = app.clone();
        async move { send(&app, "k").await }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!duplicate.is_finished(), "the duplicate waits");
    provider.release.notify_one();
    let first = holder.await.unwrap();
    let duplicate = tokio::time::timeout(Duration::from_secs(30), duplicate)
        .await
        .expect("the duplicate was answered")
        .unwrap();
    assert!(duplicate.is_replay());
    assert_eq!(duplicate.body, first.body);
    assert_eq!(provider.calls.load(Ordering::SeqCst), 1);
}

/// A holder killed mid-request leaves its claim; once the lease expires the next request takes
/// the key over and runs once, and later ones replay it.
async fn leased_a_killed_holders_lease_expires_and_the_next_request_runs_once<B: Backend>() {
    let (store, _cleanup) = B::fresh().await;
    let (app, provider) = app(store.clone(), REJECT, SHORT);
    provider.hold_next.store(true, Ordering::SeqCst);
    let holder = tokio::spawn({
        let app = app.clone();
        async move { send(&app, "k").await }
    });
    provider.entered.notified().await;
    holder.abort();
    assert!(holder.await.unwrap_err().is_cancelled());
    assert_eq!(record(&store, "k").await, Some(RecordStatus::Processing));
    send(&app, "k")
        .await
        .assert_problem(409, "request-in-flight");
    tokio::time::sleep(SHORT * 2).await;
    let next = send(&app, "k").await;
    assert_eq!(next.status, StatusCode::CREATED);
    assert!(!next.is_replay());
    assert_eq!(
        provider.calls.load(Ordering::SeqCst),
        2,
        "the dead call and this one"
    );
    let replay = send(&app, "k").await;
    assert!(replay.is_replay());
    assert_eq!(replay.body, next.body);
    assert_eq!(provider.calls.load(Ordering::SeqCst), 2);
}

/// A holder still running past its lease is taken over; its late completion is refused by the
/// fencing token, and the stored response stays the one of the request that took over.
async fn leased_a_stale_holders_late_completion_is_refused<B: Backend>() {
    let (store, _cleanup) = B::fresh().await;
    let (app, provider) = app(store, REJECT, SHORT);
    provider.hold_next.store(true, Ordering::SeqCst);
    let stale = tokio::spawn({
        let app = app.clone();
        async move { send(&app, "k").await }
    });
    provider.entered.notified().await;
    tokio::time::sleep(SHORT * 2).await;
    let current = send(&app, "k").await;
    assert_eq!(current.status, StatusCode::CREATED);
    assert!(
        current.text().contains("\"provider_call\":2"),
        "{}",
        current.text()
    );
    provider.release.notify_one();
    let stale = stale.await.unwrap();
    assert!(
        stale.text().contains("\"provider_call\":1"),
        "{}",
        stale.text()
    );
    let replay = send(&app, "k").await;
    assert!(replay.is_replay());
    assert_eq!(
        replay.body, current.body,
        "the stale completion was refused"
    );
}

/// A status that is not stored releases the claim: the retry runs at once.
async fn leased_a_5xx_releases_the_claim_and_the_retry_runs<B: Backend>() {
    let (store, _cleanup) = B::fresh().await;
    let (app, provider) = app(store.clone(), REJECT, LONG);
    provider.fail_next.store(true, Ordering::SeqCst);
    assert_eq!(send(&app, "k").await.status, StatusCode::BAD_GATEWAY);
    assert_eq!(record(&store, "k").await, None);
    let retry = send(&app, "k").await;
    assert_eq!(retry.status, StatusCode::CREATED);
    assert!(!retry.is_replay());
    assert_eq!(provider.calls.load(Ordering::SeqCst), 2);
}

/// A streaming response is answered but not stored; the claim is released.
async fn leased_a_streaming_response_is_answered_not_stored<B: Backend>() {
    let (store, _cleanup) = B::fresh().await;
    let (app, provider) = app(store.clone(), REJECT, LONG);
    provider.stream_next.store(true, Ordering::SeqCst);
    let streamed = send(&app, "k").await;
    assert_eq!(
        (streamed.status, streamed.text().as_str()),
        (StatusCode::CREATED, "streamed")
    );
    assert_eq!(record(&store, "k").await, None);
    assert!(!send(&app, "k").await.is_replay());
    assert_eq!(provider.calls.load(Ordering::SeqCst), 2);
}

macro_rules! every_case {
    ($store:ty) => {
        every_case!(@ $store;
            leased_first_run_then_byte_identical_replay,
            leased_duplicate_in_flight_is_409_with_retry_after,
            leased_duplicate_waits_under_the_wait_policy,
            leased_a_wait_without_end_waits,
            leased_a_killed_holders_lease_expires_and_the_next_request_runs_once,
            leased_a_stale_holders_late_completion_is_refused,
            leased_a_5xx_releases_the_claim_and_the_retry_runs,
            leased_a_streaming_response_is_answered_not_stored,
        );
    };
    (@ $store:ty; $($name:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread")]
            async fn $name() {
                super::$name::<$store>().await;
            }
        )*
    };
}

mod postgres {
    use super::*;
    every_case!(PgStore);
}

mod sqlite {
    use super::*;
    every_case!(SqliteStore);
}
