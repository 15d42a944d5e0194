//! Sending requests to a router with `oneshot` and checking problem responses.

#![allow(dead_code)] // each test file uses a part

pub(crate) mod stores;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, HeaderValue, Method, Request, StatusCode};
use http_body_util::BodyExt;
use serde_json::Value;
use tower::ServiceExt;

/// A buffered response.
#[derive(Debug)]
pub(crate) struct Reply {
    pub(crate) status: StatusCode,
    pub(crate) headers: HeaderMap,
    pub(crate) body: Bytes,
}

impl Reply {
    pub(crate) fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("body is not JSON ({e}): {:?}", self.body))
    }

    pub(crate) fn text(&self) -> String {
        String::from_utf8(self.body.to_vec()).unwrap()
    }

    pub(crate) fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).map(|v| v.to_str().unwrap())
    }

    pub(crate) fn is_replay(&self) -> bool {
        self.header("idempotent-replayed") == Some("true")
    }

    /// Asserts an `application/problem+json` answer with `status` and the type
    /// `https://idempotency-rs.github.io/problems/{slug}`; returns the body.
    #[track_caller]
    pub(crate) fn assert_problem(&self, status: u16, slug: &str) -> Value {
        assert_eq!(
            self.status.as_u16(),
            status,
            "status; body: {}",
            self.text()
        );
        assert_eq!(
            self.header("content-type"),
            Some("application/problem+json"),
            "content type"
        );
        let body = self.json();
        assert_eq!(
            body["type"],
            format!("https://idempotency-rs.github.io/problems/{slug}"),
            "problem type; body: {body}"
        );
        assert_eq!(body["status"], status, "status member");
        assert!(body["title"].is_string(), "title: {body}");
        body
    }

    /// Asserts a `400 idempotency-key-invalid` with `reason`.
    #[track_caller]
    pub(crate) fn assert_invalid_key(&self, reason: &str) {
        let body = self.assert_problem(400, "idempotency-key-invalid");
        assert_eq!(body["reason"], reason, "reason: {body}");
    }
}

/// Sends one request through `app`. Headers are appended in order (a name may repeat); values
/// are raw bytes.
pub(crate) async fn send(
    app: &Router,
    method: Method,
    uri: &str,
    headers: &[(&str, &[u8])],
    body: Option<&Value>,
) -> Reply {
    let mut request = Request::builder().method(method).uri(uri);
    for (name, value) in headers {
        request = request.header(*name, HeaderValue::from_bytes(value).unwrap());
    }
    let request = match body {
        Some(json) => request
            .header("content-type", "application/json")
            .body(Body::from(serde_json::to_vec(json).unwrap())),
        None => request.body(Body::empty()),
    }
    .unwrap();
    reply(app.clone().oneshot(request).await.unwrap()).await
}

/// A response, its body read.
pub(crate) async fn reply(response: axum::response::Response) -> Reply {
    let (parts, body) = response.into_parts();
    Reply {
        status: parts.status,
        headers: parts.headers,
        body: body.collect().await.unwrap().to_bytes(),
    }
}

/// `POST uri` with the given headers and no body.
pub(crate) async fn send_post(app: &Router, uri: &str, headers: &[(&str, &[u8])]) -> Reply {
    send(app, Method::POST, uri, headers, None).await
}

/// An in-process L1: a map.
#[derive(Clone, Default)]
pub(crate) struct MapL1(
    pub(crate)  std::sync::Arc<
        std::sync::Mutex<
            std::collections::HashMap<
                idempotency_core::RecordId,
                std::sync::Arc<idempotency_core::IdempotencyRecord>,
            >,
        >,
    >,
);

impl idempotency_core::LocalCache for MapL1 {
    fn get(
        &self,
        id: &idempotency_core::RecordId,
    ) -> Option<std::sync::Arc<idempotency_core::IdempotencyRecord>> {
        self.0.lock().unwrap().get(id).cloned()
    }
    fn put(
        &self,
        id: &idempotency_core::RecordId,
        record: std::sync::Arc<idempotency_core::IdempotencyRecord>,
    ) {
        assert!(record.is_terminal(), "a PROCESSING record reached L1");
        self.0.lock().unwrap().insert(id.clone(), record);
    }
}
