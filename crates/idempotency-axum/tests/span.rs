//! The `idempotency` span of `IdempotencyLayer`: the operation, the key's hash (never the key),
//! the outcome and the tier that answered, on a real PostgreSQL.

#![allow(clippy::unwrap_used)] // tests fail loudly on unexpected errors

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::http::Request;
use axum::routing::post;
use idempotency_axum::{IdempotencyLayer, SharedScope};
use idempotency_core::IdempotencyService;
use idempotency_core::fingerprint::short_hash;
use idempotency_pg::PgStore;
use tower::ServiceExt;
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};

/// The fields of every `idempotency` span, in the order the spans were created.
#[derive(Clone, Default)]
struct Spans(Arc<Mutex<Vec<BTreeMap<String, String>>>>);

struct Fields<'a>(&'a mut BTreeMap<String, String>);

impl Visit for Fields<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.insert(field.name().to_owned(), format!("{value:?}"));
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_owned(), value.to_owned());
    }
}

/// The index of a span in `Spans`, kept in the span's extensions.
struct Index(usize);

impl<S> Layer<S> for Spans
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
{
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        if attrs.metadata().name() != "idempotency" {
            return;
        }
        let mut fields = BTreeMap::new();
        attrs.record(&mut Fields(&mut fields));
        let mut spans = self.0.lock().unwrap();
        spans.push(fields);
        ctx.span(id)
            .unwrap()
            .extensions_mut()
            .insert(Index(spans.len() - 1));
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, ctx: Context<'_, S>) {
        let span = ctx.span(id).unwrap();
        if let Some(Index(i)) = span.extensions().get::<Index>() {
            values.record(&mut Fields(&mut self.0.lock().unwrap()[*i]));
        }
    }
}

#[tokio::test(flavor = "current_thread")]
async fn each_request_has_a_span_with_the_key_hash_the_outcome_and_the_tier() {
    let spans = Spans::default();
    let _guard =
        tracing::subscriber::set_default(tracing_subscriber::registry().with(spans.clone()));
    let store = PgStore::new(idempotency_testing::pg_pool().await);
    store.create_schema().await.unwrap();
    let app = Router::new()
        .route("/echo", post(|body: Bytes| async move { body }))
        .route_layer(IdempotencyLayer::new(IdempotencyService::new(store)).scope::<SharedScope>());
    for body in ["a", "a", "b"] {
        let request = Request::post("/echo")
            .header("idempotency-key", "secret-key-1")
            .body(Body::from(body))
            .unwrap();
        app.clone().oneshot(request).await.unwrap();
    }
    let spans = spans.0.lock().unwrap().clone();
    let seen: Vec<(&str, &str)> = spans
        .iter()
        .map(|s| (s["outcome"].as_str(), s["tier"].as_str()))
        .collect();
    assert_eq!(
        seen,
        [
            ("executed", "handler"),
            ("replayed", "persistence"),
            ("conflict", "persistence")
        ]
    );
    for span in &spans {
        assert_eq!(span["operation"], "POST:/echo");
        assert_eq!(span["key_hash"], short_hash("secret-key-1"));
        assert!(
            !span.values().any(|v| v.contains("secret-key-1")),
            "{span:?}"
        );
    }
}
