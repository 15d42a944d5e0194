//! `ProblemJson`: every way a JSON body is refused answers `application/problem+json` with a
//! type of its own (not axum's plain text, and not `idempotency-key-reused`), through `oneshot`.

#![allow(clippy::unwrap_used)] // tests fail loudly on unexpected errors

mod support;

use axum::Router;
use axum::body::Body;
use axum::extract::DefaultBodyLimit;
use axum::http::{Request, StatusCode};
use axum::routing::post;
use http_body_util::BodyExt;
use idempotency_axum::{ProblemJson, ProblemKind};
use serde::Deserialize;
use serde_json::Value;
use support::Reply;
use tower::ServiceExt;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct CreatePayment {
    order_id: String,
    amount_cents: u64,
}

async fn create(ProblemJson(body): ProblemJson<CreatePayment>) -> String {
    format!("{} {}", body.order_id, body.amount_cents)
}

fn app() -> Router {
    Router::new()
        .route("/payments", post(create))
        .layer(DefaultBodyLimit::max(256))
}

async fn post_body(content_type: Option<&str>, body: impl Into<Body>) -> Reply {
    let mut request = Request::builder().method("POST").uri("/payments");
    if let Some(content_type) = content_type {
        request = request.header("content-type", content_type);
    }
    let response = app()
        .oneshot(request.body(body.into()).unwrap())
        .await
        .unwrap();
    let (parts, body) = response.into_parts();
    Reply {
        status: parts.status,
        headers: parts.headers,
        body: body.collect().await.unwrap().to_bytes(),
    }
}

const JSON: Option<&str> = Some("application/json");

#[tokio::test]
async fn a_valid_body_is_extracted() {
    let reply = post_body(JSON, r#"{"order_id":"o-1","amount_cents":100}"#).await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(reply.text(), "o-1 100");
    // A structured-syntax JSON type is JSON too.
    let reply = post_body(
        Some("application/merge-patch+json"),
        r#"{"order_id":"o-2","amount_cents":1}"#,
    )
    .await;
    assert_eq!(reply.status, StatusCode::OK);
}

#[tokio::test]
async fn bad_json_syntax_is_400_invalid_request_body() {
    for body in ["{not json", r#"{"order_id":"o-1","amount_cents":1"#, ""] {
        let reply = post_body(JSON, body).await;
        let problem = reply.assert_problem(400, "invalid-request-body");
        assert!(problem["detail"].is_string(), "{body:?}: {problem}");
    }
}

#[tokio::test]
async fn json_that_does_not_match_the_type_is_422_invalid_request_body() {
    for (body, says) in [
        (r#"{"order_id":"o-1"}"#, "missing field `amount_cents`"),
        (r#"{"order_id":"o-1","amount_cents":"100"}"#, "invalid type"),
        (r#"{"order_id":"o-1","amount_cents":-5}"#, "invalid value"),
        (
            r#"{"order_id":"o-1","amount_cents":1,"extra":true}"#,
            "unknown field `extra`",
        ),
        ("[1, 2]", "invalid type"),
    ] {
        let reply = post_body(JSON, body).await;
        let problem = reply.assert_problem(422, "invalid-request-body");
        assert_ne!(
            problem["type"],
            ProblemKind::KeyReused.type_uri(),
            "a body problem is not a key reuse"
        );
        assert!(problem.get("code").is_none(), "{problem}");
        let detail = problem["detail"].as_str().unwrap();
        assert!(detail.contains(says), "{body}: {detail}");
    }
}

#[tokio::test]
async fn a_missing_or_wrong_content_type_is_415_unsupported_media_type() {
    let body = r#"{"order_id":"o-1","amount_cents":100}"#;
    for content_type in [
        None,
        Some("text/plain"),
        Some("application/x-www-form-urlencoded"),
    ] {
        let reply = post_body(content_type, body).await;
        let problem = reply.assert_problem(415, "unsupported-media-type");
        assert_eq!(
            problem["title"],
            ProblemKind::UnsupportedMediaType.title(),
            "{content_type:?}"
        );
    }
}

#[tokio::test]
async fn a_body_above_the_limit_is_413_payload_too_large() {
    let body = format!(r#"{{"order_id":"{}","amount_cents":1}}"#, "x".repeat(300));
    post_body(JSON, body)
        .await
        .assert_problem(413, "payload-too-large");
}

/// The statuses are axum's own for each rejection; only the body changes.
#[tokio::test]
async fn statuses_match_axum_json() {
    async fn plain(axum::Json(_): axum::Json<Value>) {}
    let plain_app = Router::new().route("/payments", post(plain));
    for (content_type, body, status) in [
        (JSON, "{not json", 400),
        (None, "{}", 415),
        (Some("text/plain"), "{}", 415),
    ] {
        let mut request = Request::builder().method("POST").uri("/payments");
        if let Some(content_type) = content_type {
            request = request.header("content-type", content_type);
        }
        let response = plain_app
            .clone()
            .oneshot(request.body(Body::from(body)).unwrap())
            .await
            .unwrap();
        assert_eq!(response.status().as_u16(), status);
        assert_ne!(
            response.headers()["content-type"],
            "application/problem+json",
            "axum's own rejection is plain text"
        );
        assert_eq!(post_body(content_type, body).await.status.as_u16(), status);
    }
}
