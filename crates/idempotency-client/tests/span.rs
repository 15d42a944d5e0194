//! One `idempotency_client.attempt` span per attempt, with its number, key hash and status.

#![allow(clippy::unwrap_used)] // tests fail loudly on unexpected errors

mod support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use idempotency_client::{IdempotencyMiddleware, KeyGenerator, RetryPolicy};
use idempotency_core::InFlightPolicy;
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing_subscriber::layer::{Context, SubscriberExt};

/// A span's fields: name and value, as recorded.
type SpanFields = Vec<(String, String)>;

/// The fields of every `idempotency_client.attempt` span, in order.
#[derive(Clone, Default)]
struct Spans(Arc<Mutex<Vec<SpanFields>>>);

struct Fields<'a>(&'a mut SpanFields);

impl Visit for Fields<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.push((field.name().to_owned(), format!("{value:?}")));
    }
}

impl<S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>>
    tracing_subscriber::Layer<S> for Spans
{
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        if attrs.metadata().name() == "idempotency_client.attempt" {
            let mut fields = Vec::new();
            attrs.record(&mut Fields(&mut fields));
            let mut spans = self.0.lock().unwrap();
            spans.push(fields);
            ctx.span(id)
                .unwrap()
                .extensions_mut()
                .insert(spans.len() - 1);
        }
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, ctx: Context<'_, S>) {
        let span = ctx.span(id).unwrap();
        if let Some(index) = span.extensions().get::<usize>() {
            values.record(&mut Fields(&mut self.0.lock().unwrap()[*index]));
        }
    }
}

#[tokio::test]
async fn each_attempt_has_its_span_with_the_same_key() {
    let spans = Spans::default();
    let _guard =
        tracing::subscriber::set_default(tracing_subscriber::registry().with(spans.clone()));
    let server = support::start(InFlightPolicy::Reject).await;
    let policy = RetryPolicy::default()
        .max_attempts(2)
        .initial_backoff(Duration::from_millis(10));
    let client = reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
        .with(
            IdempotencyMiddleware::new()
                .key_generator(KeyGenerator::new(|| "k-secret-1".to_owned()))
                .retry_policy(policy),
        )
        .build();
    client
        .post(server.url("/unavailable"))
        .send()
        .await
        .unwrap_err();
    let spans = spans.0.lock().unwrap().clone();
    assert_eq!(spans.len(), 2, "{spans:?}");
    let field = |span: &SpanFields, name: &str| {
        span.iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.clone())
            .unwrap_or_else(|| panic!("{name} in {span:?}"))
    };
    for (i, span) in spans.iter().enumerate() {
        assert_eq!(field(span, "attempt"), (i + 1).to_string());
        assert_eq!(field(span, "method"), "POST");
        assert_eq!(field(span, "status"), "503");
    }
    // The key's short hash, the server's `idempotency.key_hash`; never the key itself (a
    // credential of a kind: who reads the traces could replay another caller's outcome).
    let hash = idempotency_core::fingerprint::short_hash("k-secret-1");
    for span in &spans {
        assert_eq!(field(span, "idempotency_key_hash"), hash);
        assert!(
            span.iter().all(|(_, value)| !value.contains("k-secret-1")),
            "{span:?}"
        );
    }
}
