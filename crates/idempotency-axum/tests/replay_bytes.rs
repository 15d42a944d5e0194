//! A replay answers the bytes the first response went out with, from every tier (L1, L2, the
//! committed record), and a record spelled by a `jsonb` column (an earlier schema) still
//! replays as it always did: its value serialized again. On a real PostgreSQL
//! (`idempotency_pg::PgStore` on an isolated schema), through `oneshot`.
//!
//! L1 and L2 here are in-memory maps: the tiers are about where the record comes from, not
//! about Redis or moka (their own crates test them).

#![allow(clippy::unwrap_used)] // tests fail loudly on unexpected errors

mod support;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use axum::extract::State;
use axum::http::{HeaderValue, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use idempotency_axum::{
    Error, IdempotencyLayer, IdempotentJson, OutcomeExt, ScopedKey, SharedScope, TenantHeader,
};
use idempotency_core::{
    CacheError, DistributedCache, ExecutionResult, IdempotencyRecord, IdempotencyService,
    LocalCache, RecordId,
};
use idempotency_pg::PgStore;
use serde::{Deserialize, Serialize};
use serde_json::json;
use sqlx::PgPool;
use support::{MapL1, Reply, send};

/// A shared L2 standing in for Redis: a map of whole records.
#[derive(Clone, Default)]
struct MapL2(Arc<Mutex<HashMap<RecordId, IdempotencyRecord>>>);

impl DistributedCache for MapL2 {
    async fn get(&self, id: &RecordId) -> Result<Option<IdempotencyRecord>, CacheError> {
        Ok(self.0.lock().unwrap().get(id).cloned())
    }
    async fn put(&self, id: &RecordId, record: &IdempotencyRecord) -> Result<(), CacheError> {
        assert!(record.is_terminal(), "a PROCESSING record reached L2");
        self.0.lock().unwrap().insert(id.clone(), record.clone());
        Ok(())
    }
}

#[derive(Debug, Serialize, Deserialize)]
struct CreatePayment {
    order_id: String,
    amount_cents: i64,
}

/// A payment whose JSON has what a spelling can differ on: escapes, non-ASCII text, a
/// fraction, a nested object and an array.
#[derive(Debug, Serialize, Deserialize)]
struct Payment {
    id: i64,
    order_id: String,
    note: String,
    rate: f64,
    amount: Amount,
    tags: Vec<String>,
}

#[derive(Debug, Serialize, Deserialize)]
struct Amount {
    cents: i64,
    currency: String,
}

async fn create_payment<L: LocalCache, D: DistributedCache>(
    State(service): State<IdempotencyService<PgStore, L, D>>,
    scoped: ScopedKey<TenantHeader>,
    Json(request): Json<CreatePayment>,
) -> Result<IdempotentJson<Payment>, Error> {
    let outcome = service
        .execute(scoped.call("CREATE_PAYMENT", &request), async |conn| {
            let id: i64 = sqlx::query_scalar(
                "INSERT INTO payments (order_id, amount_cents) VALUES ($1, $2) RETURNING id",
            )
            .bind(&request.order_id)
            .bind(request.amount_cents)
            .fetch_one(&mut *conn)
            .await
            .map_err(Error::internal)?;
            Ok::<_, Error>(ExecutionResult::success(Payment {
                id,
                order_id: request.order_id.clone(),
                note: "a \"quoted\" note, é, ✓, a tab\tand a \\ backslash".to_owned(),
                rate: 0.1 + 0.2,
                amount: Amount {
                    cents: request.amount_cents,
                    currency: "EUR".to_owned(),
                },
                tags: vec!["a".to_owned(), "b c".to_owned()],
            }))
        })
        .await?;
    Ok(outcome.into_json(StatusCode::CREATED))
}

fn router<L: LocalCache + Clone, D: DistributedCache + Clone>(
    service: IdempotencyService<PgStore, L, D>,
) -> Router {
    Router::new()
        .route("/payments", post(create_payment::<L, D>))
        .with_state(service)
}

async fn database() -> (PgPool, PgStore) {
    let pool = idempotency_testing::pg_pool().await;
    let store = PgStore::new(pool.clone());
    store.create_schema().await.unwrap();
    sqlx::raw_sql(
        "CREATE TABLE payments (id bigserial PRIMARY KEY, order_id text NOT NULL, amount_cents bigint NOT NULL)",
    )
    .execute(&pool)
    .await
    .unwrap();
    (pool, store)
}

async fn pay(app: &Router, key: &str) -> Reply {
    let body = json!({"order_id": "o-1", "amount_cents": 1250});
    send(
        app,
        Method::POST,
        "/payments",
        &[
            ("idempotency-key", key.as_bytes()),
            ("x-tenant-id", b"acme"),
        ],
        Some(&body),
    )
    .await
}

#[track_caller]
fn assert_same_answer(replay: &Reply, first: &Reply, tier: &str) {
    assert!(replay.is_replay(), "{tier}: Idempotent-Replayed");
    assert_eq!(replay.status, first.status, "{tier}: status");
    assert_eq!(
        replay.header("content-type"),
        first.header("content-type"),
        "{tier}: content type"
    );
    assert_eq!(
        replay.body, first.body,
        "{tier}: the replay's bytes are the first response's"
    );
}

/// The first response's bytes, replayed from the committed record, from L2 and from L1.
#[tokio::test]
async fn a_replay_sends_the_first_responses_bytes_from_every_tier() {
    let (_pool, store) = database().await;
    let l2 = MapL2::default();
    let l1 = MapL1::default();
    let service = IdempotencyService::builder(store.clone())
        .local_cache(l1.clone())
        .distributed_cache(l2.clone())
        .build();
    let app = router(service);
    let first = pay(&app, "k-bytes").await;
    assert_eq!(first.status, 201, "{}", first.text());
    assert!(!first.is_replay());

    // The committed record: a service without caches.
    let from_store = router(IdempotencyService::builder(store.clone()).build());
    assert_same_answer(&pay(&from_store, "k-bytes").await, &first, "store");
    // L2: a service of another instance, sharing only the L2 (its own L1 is empty).
    let from_l2 = router(
        IdempotencyService::builder(store.clone())
            .local_cache(MapL1::default())
            .distributed_cache(l2.clone())
            .build(),
    );
    assert_same_answer(&pay(&from_l2, "k-bytes").await, &first, "L2");
    // L1: the instance that executed (twice: the second read is of the same cached record).
    for _ in 0..2 {
        assert_same_answer(&pay(&app, "k-bytes").await, &first, "L1");
    }
    assert_eq!(l1.0.lock().unwrap().len(), 1);
}

/// A record whose payload a `jsonb` column rewrote (spaces, keys reordered) replays as it did
/// before replays sent stored bytes: the value read back and serialized again, which is the
/// first response's spelling.
#[tokio::test]
async fn a_jsonb_spelled_record_replays_its_value_serialized_again() {
    let (pool, store) = database().await;
    let app = router(IdempotencyService::builder(store.clone()).build());
    let first = pay(&app, "k-jsonb").await;
    assert_eq!(first.status, 201, "{}", first.text());
    let jsonb: String = sqlx::query_scalar(
        "UPDATE idempotency_records SET result_payload = (result_payload::jsonb)::text::json \
         WHERE idempotency_key = 'k-jsonb' RETURNING result_payload::text",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_ne!(
        jsonb.as_bytes(),
        &first.body[..],
        "jsonb respelled the payload"
    );

    let fresh = router(IdempotencyService::builder(store).build());
    assert_same_answer(&pay(&fresh, "k-jsonb").await, &first, "jsonb-spelled store");
}

/// A handler behind the layer: a response with headers the layer stores (content type,
/// location, etag), one it does not (`x-request-id`), and a body naming the call.
async fn create_file(State(calls): State<Arc<Mutex<u32>>>) -> Response {
    let call = {
        let mut calls = calls.lock().unwrap();
        *calls += 1;
        *calls
    };
    let mut response = (
        StatusCode::CREATED,
        Json(json!({"call": call, "note": "é \"quoted\""})),
    )
        .into_response();
    let headers = response.headers_mut();
    headers.insert(header::LOCATION, HeaderValue::from_static("/files/1"));
    headers.insert(header::ETAG, HeaderValue::from_static("\"v1\""));
    headers.insert("x-request-id", HeaderValue::from_static("r-1"));
    response
}

/// Through `IdempotencyLayer`: the first replay from L1 reads the stored response, the next
/// ones answer what it read for that cached record; every one is the same answer, byte for
/// byte, and the first response's status, stored headers and body.
#[tokio::test]
async fn layer_replays_from_l1_are_the_first_responses_bytes_each_time() {
    let (_pool, store) = database().await;
    let calls = Arc::new(Mutex::new(0));
    let l1 = MapL1::default();
    let layer = IdempotencyLayer::new(
        IdempotencyService::builder(store)
            .local_cache(l1.clone())
            .build(),
    )
    .scope::<SharedScope>();
    let app = Router::new()
        .route("/files", post(create_file))
        .route_layer(layer)
        .with_state(Arc::clone(&calls));
    let post_file = |key: &'static str| {
        let app = app.clone();
        async move {
            send(
                &app,
                Method::POST,
                "/files",
                &[("idempotency-key", key.as_bytes())],
                Some(&json!({"name": "a.txt"})),
            )
            .await
        }
    };
    let first = post_file("k-layer").await;
    assert_eq!(first.status, 201, "{}", first.text());
    assert_eq!(first.header("x-request-id"), Some("r-1"));
    let mut replays = Vec::new();
    for _ in 0..3 {
        let replay = post_file("k-layer").await;
        assert_same_answer(&replay, &first, "layer, L1");
        for name in ["location", "etag"] {
            assert_eq!(replay.header(name), first.header(name), "{name}");
        }
        assert_eq!(replay.header("x-request-id"), None, "not on the allow-list");
        replays.push(replay);
    }
    for replay in &replays[1..] {
        assert_eq!(
            replay.headers, replays[0].headers,
            "the same headers every time"
        );
    }
    // Another key: its own response, not the one kept for the first key.
    let other = post_file("k-layer-2").await;
    assert!(!other.is_replay());
    assert_ne!(other.body, first.body);
    assert_same_answer(
        &post_file("k-layer-2").await,
        &other,
        "layer, L1, second key",
    );
    assert_eq!(*calls.lock().unwrap(), 2);
    assert_eq!(l1.0.lock().unwrap().len(), 2);
}

/// A response whose body is encoded (`Content-Encoding: gzip`, as a handler that relays an
/// upstream answer or serves a compressed file sends it) replays with its encoding: the stored
/// bytes are the encoded ones, and without the header a client would read them as the
/// `Content-Type` says (before: `Content-Encoding` was not on the default allow-list, and the
/// replay was gzip bytes labelled `application/json`).
#[tokio::test]
async fn an_encoded_body_replays_with_its_content_encoding() {
    const GZIP: &[u8] = &[
        0x1f, 0x8b, 0x08, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x03, 0xab, 0xae, 0x05, 0x00, 0x43,
        0xbf, 0xa6, 0xa3, 0x02, 0x00, 0x00, 0x00,
    ];
    let (_pool, store) = database().await;
    let layer = IdempotencyLayer::new(IdempotencyService::new(store)).scope::<SharedScope>();
    let app = Router::new()
        .route(
            "/exports",
            post(|| async {
                (
                    StatusCode::CREATED,
                    [
                        (header::CONTENT_TYPE, "application/json"),
                        (header::CONTENT_ENCODING, "gzip"),
                    ],
                    GZIP,
                )
            }),
        )
        .route_layer(layer);
    let body = json!({});
    let export = || {
        send(
            &app,
            Method::POST,
            "/exports",
            &[("idempotency-key", b"k-gzip")],
            Some(&body),
        )
    };
    let first = export().await;
    assert_eq!(first.status, 201, "{}", first.text());
    let replay = export().await;
    assert!(replay.is_replay());
    assert_eq!(replay.header("content-encoding"), Some("gzip"));
    assert_eq!(replay.header("content-type"), Some("application/json"));
    assert_eq!(&replay.body[..], GZIP);
}
