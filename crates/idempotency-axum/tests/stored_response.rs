//! `StoredResponse` as the stored value of `execute`, on a real PostgreSQL: the allowed headers
//! and the body replay byte for byte; credentials are neither stored nor replayed.

#![allow(clippy::unwrap_used)] // tests fail loudly on unexpected errors

mod support;

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderName, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use idempotency_axum::{
    Error, HeaderFilter, IdempotencyKeyHeader, IdempotentResponse, StoredResponse,
};
use idempotency_core::{ExecutionResult, IdempotencyService};
use idempotency_pg::PgStore;
use sqlx::{self, PgPool};
use support::{Reply, send_post};

const BINARY: &[u8] = &[0x00, 0xff, 0x10, 0x80, b'P', b'N', b'G'];

/// What the application would answer: representation headers, a custom one, credentials.
fn live_response(binary: bool) -> Response {
    let body = if binary {
        axum::body::Body::from(BINARY)
    } else {
        axum::body::Body::from(r#"{"document":"d-1"}"#)
    };
    let mut response = (StatusCode::CREATED, body).into_response();
    let headers = response.headers_mut();
    let content_type = if binary {
        "image/png"
    } else {
        "application/json"
    };
    for (name, value) in [
        ("content-type", content_type),
        ("location", "/documents/d-1"),
        ("etag", "\"v1\""),
        ("x-trace-id", "trace-123"),
        ("x-internal-shard", "shard-9"),
        ("set-cookie", "session=SECRET-COOKIE; HttpOnly"),
        ("authorization", "Bearer SECRET-BEARER"),
        ("proxy-authorization", "Basic SECRET-PROXY"),
        ("cookie", "a=SECRET-COOKIE2"),
        ("x-api-key", "SECRET-API-KEY"),
        ("x-refresh-token", "SECRET-REFRESH"),
        ("x-client-secret", "SECRET-CLIENT"),
    ] {
        headers.append(name, value.parse().unwrap());
    }
    response
}

async fn create_document(
    State(service): State<IdempotencyService<PgStore>>,
    IdempotencyKeyHeader(key): IdempotencyKeyHeader,
    uri: axum::http::Uri,
) -> Result<IdempotentResponse, Error> {
    let binary = uri.path().ends_with("/binary");
    let filter = HeaderFilter::default()
        .allow(HeaderName::from_static("x-trace-id"))
        .map_err(Error::internal)?;
    let request = serde_json::json!({"binary": binary});
    let outcome = service
        .execute(
            idempotency_core::Call::new("CREATE_DOCUMENT", key, &request),
            async |_conn| {
                let stored =
                    StoredResponse::capture(live_response(binary), &filter, 1 << 20).await?;
                Ok::<_, Error>(ExecutionResult::success(stored))
            },
        )
        .await?;
    Ok(IdempotentResponse::new(outcome))
}

async fn setup() -> (PgPool, Router) {
    let pool = idempotency_testing::pg_pool().await;
    let store = PgStore::new(pool.clone());
    store.create_schema().await.unwrap();
    let app = Router::new()
        .route("/documents", post(create_document))
        .route("/documents/binary", post(create_document))
        .with_state(IdempotencyService::new(store));
    (pool, app)
}

const CREDENTIALS: &[&str] = &[
    "set-cookie",
    "authorization",
    "proxy-authorization",
    "cookie",
    "x-api-key",
    "x-refresh-token",
    "x-client-secret",
];

fn assert_clean(reply: &Reply) {
    for name in CREDENTIALS {
        assert_eq!(reply.headers.get(*name), None, "{name} was replayed");
    }
    assert_eq!(
        reply.headers.get("x-internal-shard"),
        None,
        "not on the allow-list"
    );
    assert_eq!(reply.header("location"), Some("/documents/d-1"));
    assert_eq!(reply.header("etag"), Some("\"v1\""));
    assert_eq!(
        reply.header("x-trace-id"),
        Some("trace-123"),
        "explicitly allowed"
    );
}

#[tokio::test]
async fn credentials_are_never_stored_nor_replayed() {
    let (pool, app) = setup().await;
    let key = [("idempotency-key", &b"doc-1"[..])];
    let first = send_post(&app, "/documents", &key).await;
    assert_eq!(first.status, 201, "{}", first.text());
    assert!(!first.is_replay());
    assert_clean(&first);

    let replay = send_post(&app, "/documents", &key).await;
    assert_eq!(replay.status, 201);
    assert!(replay.is_replay());
    assert_clean(&replay);
    assert_eq!(replay.header("content-type"), Some("application/json"));
    assert_eq!(replay.body, first.body);
    assert_eq!(replay.text(), r#"{"document":"d-1"}"#);

    let stored: String = sqlx::query_scalar("SELECT result_payload::text FROM idempotency_records")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert!(
        !stored.contains("SECRET"),
        "a credential reached the database: {stored}"
    );
    assert!(stored.contains("trace-123"), "{stored}");
}

#[tokio::test]
async fn binary_bodies_replay_byte_for_byte() {
    let (pool, app) = setup().await;
    let key = [("idempotency-key", &b"doc-bin"[..])];
    let first = send_post(&app, "/documents/binary", &key).await;
    let replay = send_post(&app, "/documents/binary", &key).await;
    assert!(replay.is_replay());
    assert_eq!(&first.body[..], BINARY);
    assert_eq!(&replay.body[..], BINARY);
    assert_eq!(replay.header("content-type"), Some("image/png"));
    let stored: String =
        sqlx::query_scalar("SELECT result_payload->>'body_base64' FROM idempotency_records")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(stored, "AP8QgFBORw==");
}

#[test]
fn sensitive_names_cannot_be_allowed() {
    for name in [
        "authorization",
        "proxy-authorization",
        "set-cookie",
        "cookie",
        "x-api-key",
        "api-key",
        "x-auth-token",
        "x-csrf-token",
        "x-session-id",
        "x-client-secret",
        "x-password",
        "x-amz-signature",
    ] {
        let refused = HeaderFilter::default().allow(HeaderName::from_static(name));
        assert!(refused.is_err(), "{name} was allowed");
    }
    let filter = HeaderFilter::none()
        .allow(header::CONTENT_TYPE)
        .unwrap()
        .allow(HeaderName::from_static("x-request-cost"))
        .unwrap();
    assert!(filter.allows(&HeaderName::from_static("x-request-cost")));
    assert!(!filter.allows(&header::LOCATION));
}

#[test]
fn a_tampered_record_does_not_replay_credentials() {
    let json = serde_json::json!({
        "status": 200,
        "headers": [["set-cookie", "s=1"], ["authorization", "Bearer x"], ["content-type", "text/plain"]],
        "body": "hi"
    });
    let stored: StoredResponse = serde_json::from_value(json).unwrap();
    let response = stored.into_response();
    let headers: &HeaderMap = response.headers();
    assert_eq!(headers.get("set-cookie"), None);
    assert_eq!(headers.get("authorization"), None);
    assert_eq!(headers["content-type"], "text/plain");

    let bad = serde_json::json!({"status": 1000, "body": ""});
    assert!(serde_json::from_value::<StoredResponse>(bad).is_err());
}
