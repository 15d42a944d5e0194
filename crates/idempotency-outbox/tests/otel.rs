//! Traces from the request to the consumer, with the OpenTelemetry SDK's in-memory exporter:
//! one HTTP request through `IdempotencyLayer` on PostgreSQL (the span tree and its
//! attributes), its replay, the event it enqueued on a real NATS JetStream and a real
//! RabbitMQ carrying the request's trace id, the relay's publish span linked to the request,
//! and the inbox consumer's span in the request's trace. Malformed `traceparent` values on a
//! request and on a message are ignored (a new trace), never copied into events.

#![cfg(all(feature = "nats", feature = "rabbitmq", feature = "otel"))]
#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::http::{Request, StatusCode};
use axum::routing::post;
use common::amqp::TestQueue;
use common::nats::TestStream;
use common::*;
use common::{amqp, nats};
use idempotency_axum::{IdempotencyLayer, IdempotentTx, SharedScope};
use idempotency_core::IdempotencyService;
use idempotency_core::config::SchemaMode;
use idempotency_core::trace::TraceParent;
use idempotency_outbox::config::{InboxConfig, Ordering};
use idempotency_outbox::{NewEvent, Relay, inbox_span};
use idempotency_pg::{PgInbox, PgOutbox, PgStore};
use opentelemetry::trace::{SpanId, TraceId, TracerProvider as _};
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider, SpanData};
use sqlx::PgPool;
use tower::ServiceExt;
use tracing::Instrument;
use tracing_subscriber::layer::SubscriberExt;

const CLIENT_TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CLIENT_SPAN: &str = "00f067aa0ba902b7";
const KEY: &str = "otel-secret-key";

/// The in-memory exporter as this thread's subscriber (the tests run on current-thread
/// runtimes, so the relay's tasks report here too).
struct Traces {
    exporter: InMemorySpanExporter,
    provider: SdkTracerProvider,
    _guard: tracing::subscriber::DefaultGuard,
}

impl Traces {
    fn install() -> Self {
        let exporter = InMemorySpanExporter::default();
        let provider = SdkTracerProvider::builder()
            .with_simple_exporter(exporter.clone())
            .build();
        let layer = tracing_opentelemetry::layer().with_tracer(provider.tracer("otel-test"));
        let guard = tracing::subscriber::set_default(tracing_subscriber::registry().with(layer));
        Self {
            exporter,
            provider,
            _guard: guard,
        }
    }

    fn spans(&self) -> Vec<SpanData> {
        self.provider.force_flush().unwrap();
        self.exporter.get_finished_spans().unwrap()
    }
}

fn attr(span: &SpanData, key: &str) -> Option<String> {
    span.attributes
        .iter()
        .find(|kv| kv.key.as_str() == key)
        .map(|kv| kv.value.as_str().into_owned())
}

fn named<'a>(spans: &'a [SpanData], name: &str) -> Vec<&'a SpanData> {
    spans.iter().filter(|s| s.name == name).collect()
}

#[derive(Clone)]
struct App {
    outbox: PgOutbox,
}

/// `POST /orders`: enqueues one event in the layer's transaction.
async fn create(State(app): State<App>, mut tx: IdempotentTx<PgStore>, body: String) -> StatusCode {
    let event = NewEvent::new(
        "order",
        "o-1",
        "OrderCreated",
        &serde_json::json!({"body": body}),
    )
    .unwrap();
    app.outbox.enqueue(&mut tx, &event).await.unwrap();
    StatusCode::CREATED
}

async fn service(config: &idempotency_outbox::config::OutboxConfig) -> (PgPool, Router) {
    let (pool, outbox) = outbox(config).await;
    let store = PgStore::new(pool.clone());
    store.create_schema().await.unwrap();
    let router = Router::new()
        .route("/orders", post(create))
        .route_layer(IdempotencyLayer::new(IdempotencyService::new(store)).scope::<SharedScope>())
        .with_state(App { outbox });
    (pool, router)
}

async fn send(app: &Router, traceparent: Option<&str>) -> StatusCode {
    let mut request = Request::post("/orders").header("idempotency-key", KEY);
    if let Some(traceparent) = traceparent {
        request = request.header("traceparent", traceparent);
    }
    let response = app
        .clone()
        .oneshot(request.body(Body::from("one order")).unwrap())
        .await
        .unwrap();
    response.status()
}

async fn inbox(pool: &PgPool) -> PgInbox {
    let mut config = InboxConfig::default();
    config.schema.mode = SchemaMode::Create;
    PgInbox::from_config(pool.clone(), &config).await.unwrap()
}

/// Applies one message through the inbox in `inbox_span`, as a consumer does.
async fn consume(pool: &PgPool, inbox: &PgInbox, id: &str, traceparent: Option<&str>) {
    async {
        let mut tx = pool.begin().await.unwrap();
        assert!(inbox.record(&mut tx, "projector", id).await.unwrap());
        tx.commit().await.unwrap();
    }
    .instrument(inbox_span("projector", id, traceparent, None))
    .await;
}

fn one<'a>(spans: &'a [SpanData], name: &str) -> &'a SpanData {
    let found = named(spans, name);
    assert_eq!(found.len(), 1, "one {name} span: {found:#?}");
    found[0]
}

/// The request's spans: the layer span is the client's child, the store statements its
/// children, the replay another layer span; no attribute holds the key.
fn check_request_spans(spans: &[SpanData]) -> SpanId {
    let client_trace = TraceId::from_hex(CLIENT_TRACE).unwrap();
    let layers = named(spans, "idempotency");
    assert_eq!(layers.len(), 2, "the request and its replay");
    let (first, replay) = (layers[0], layers[1]);
    for layer in [first, replay] {
        assert_eq!(layer.span_context.trace_id(), client_trace);
        assert_eq!(layer.parent_span_id, SpanId::from_hex(CLIENT_SPAN).unwrap());
        assert_eq!(attr(layer, "operation").as_deref(), Some("POST:/orders"));
    }
    assert_eq!(attr(first, "outcome").as_deref(), Some("executed"));
    assert_eq!(attr(replay, "outcome").as_deref(), Some("replayed"));
    assert_eq!(attr(replay, "tier").as_deref(), Some("persistence"));
    let statements: Vec<(String, String)> = spans
        .iter()
        .filter(|s| {
            s.name == "idempotency.store" && s.parent_span_id == first.span_context.span_id()
        })
        .map(|s| {
            assert_eq!(attr(s, "db.system").as_deref(), Some("postgresql"));
            (
                attr(s, "db.statement.name").unwrap(),
                attr(s, "db.operation").unwrap(),
            )
        })
        .collect();
    assert_eq!(
        statements,
        [
            ("acquire".into(), "INSERT".into()),
            ("complete".into(), "UPDATE".into())
        ]
    );
    let replayed: Vec<String> = spans
        .iter()
        .filter(|s| {
            s.name == "idempotency.store" && s.parent_span_id == replay.span_context.span_id()
        })
        .map(|s| attr(s, "db.statement.name").unwrap())
        .collect();
    assert_eq!(replayed, ["acquire", "find"]);
    for span in spans {
        for kv in &span.attributes {
            assert!(!kv.value.as_str().contains(KEY), "{span:#?}");
        }
    }
    first.span_context.span_id()
}

/// The publish span: the relay's batch child, linked to the span that enqueued the message.
fn check_publish_span(spans: &[SpanData], system: &str, id: &str, producer: SpanId) {
    let publish = one(spans, "outbox.publish");
    let batch = one(spans, "outbox.relay.batch");
    assert_eq!(publish.parent_span_id, batch.span_context.span_id());
    assert_eq!(attr(publish, "messaging.system").as_deref(), Some(system));
    assert_eq!(attr(publish, "messaging.message.id").as_deref(), Some(id));
    assert!(attr(publish, "messaging.destination.name").is_some());
    let links: Vec<_> = publish
        .links
        .iter()
        .map(|l| l.span_context.clone())
        .collect();
    assert_eq!(links.len(), 1, "{links:?}");
    assert_eq!(
        links[0].trace_id(),
        TraceId::from_hex(CLIENT_TRACE).unwrap()
    );
    assert_eq!(links[0].span_id(), producer);
    assert_ne!(
        publish.span_context.trace_id(),
        links[0].trace_id(),
        "a link, not a parent"
    );
}

/// The consumer's span: in the request's trace, the child of the span that enqueued.
fn check_inbox_span(spans: &[SpanData], id: &str, producer: SpanId) {
    let consumer = one(spans, "outbox.inbox.process");
    assert_eq!(
        consumer.span_context.trace_id(),
        TraceId::from_hex(CLIENT_TRACE).unwrap()
    );
    assert_eq!(consumer.parent_span_id, producer);
    assert_eq!(attr(consumer, "messaging.message.id").as_deref(), Some(id));
    assert_eq!(
        attr(consumer, "messaging.consumer.group.name").as_deref(),
        Some("projector")
    );
}

fn client_traceparent() -> String {
    format!("00-{CLIENT_TRACE}-{CLIENT_SPAN}-01")
}

#[tokio::test]
async fn a_request_its_replay_its_event_on_nats_and_the_consumer_share_one_trace() {
    let traces = Traces::install();
    let config = config(Ordering::Unordered);
    let (pool, app) = service(&config).await;
    let stream = TestStream::new().await;
    assert_eq!(
        send(&app, Some(&client_traceparent())).await,
        StatusCode::CREATED
    );
    assert_eq!(
        send(&app, Some(&client_traceparent())).await,
        StatusCode::CREATED
    );

    let outbox = PgOutbox::from_config(pool.clone(), &config).await.unwrap();
    let handle = Relay::new(outbox, stream.publisher().await, &config)
        .unwrap()
        .spawn();
    let messages = stream.read(1).await;
    assert!(handle.shutdown().await.graceful);
    let message = &messages[0];
    let id = nats::header(message, "Nats-Msg-Id").unwrap().to_owned();
    let carried = TraceParent::parse(nats::header(message, "traceparent").unwrap()).unwrap();
    assert_eq!(
        carried.trace_id_hex(),
        CLIENT_TRACE,
        "the request's trace id on NATS"
    );

    let inbox = inbox(&pool).await;
    consume(&pool, &inbox, &id, nats::header(message, "traceparent")).await;

    let spans = traces.spans();
    let layer = check_request_spans(&spans);
    assert_eq!(
        carried.span_id_hex(),
        layer.to_string(),
        "enqueued in the layer's span"
    );
    check_publish_span(&spans, "nats", &id, layer);
    check_inbox_span(&spans, &id, layer);
    stream.delete().await;
}

#[tokio::test]
async fn the_event_of_a_request_arrives_on_rabbitmq_with_the_request_trace() {
    let traces = Traces::install();
    let config = config(Ordering::Unordered);
    let (pool, app) = service(&config).await;
    let queue = TestQueue::new().await;
    let mut consumer = queue.consumer().await;
    assert_eq!(
        send(&app, Some(&client_traceparent())).await,
        StatusCode::CREATED
    );
    assert_eq!(
        send(&app, Some(&client_traceparent())).await,
        StatusCode::CREATED
    );

    let outbox = PgOutbox::from_config(pool.clone(), &config).await.unwrap();
    let publisher = idempotency_outbox::publisher::rabbitmq::RabbitMqPublisher::new(
        idempotency_testing::amqp_url(),
    )
    .with_routing_key(&queue.name)
    .unwrap();
    let handle = Relay::new(outbox, publisher, &config).unwrap().spawn();
    let deliveries = TestQueue::receive(&mut consumer, 1).await;
    assert!(handle.shutdown().await.graceful);
    let delivery = &deliveries[0];
    let id = delivery
        .properties
        .message_id()
        .as_ref()
        .unwrap()
        .to_string();
    let traceparent = amqp::header(delivery, "traceparent").unwrap();
    let carried = TraceParent::parse(&traceparent).unwrap();
    assert_eq!(
        carried.trace_id_hex(),
        CLIENT_TRACE,
        "the request's trace id on RabbitMQ"
    );

    let inbox = inbox(&pool).await;
    consume(&pool, &inbox, &id, Some(&traceparent)).await;

    let spans = traces.spans();
    let layer = check_request_spans(&spans);
    check_publish_span(&spans, "rabbitmq", &id, layer);
    check_inbox_span(&spans, &id, layer);
    queue.delete().await;
}

#[tokio::test]
async fn a_malformed_traceparent_starts_a_new_trace_and_is_never_copied() {
    let traces = Traces::install();
    let config = config(Ordering::Unordered);
    let (pool, app) = service(&config).await;
    let bad = "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01";
    assert_eq!(send(&app, Some(bad)).await, StatusCode::CREATED);
    let headers: String = sqlx::query_scalar("SELECT headers::text FROM outbox")
        .fetch_one(&pool)
        .await
        .unwrap();
    let headers: std::collections::BTreeMap<String, String> =
        serde_json::from_str(&headers).unwrap();
    assert!(!headers.values().any(|v| v == bad), "{headers:?}");
    let stored = TraceParent::parse(&headers["traceparent"]).unwrap();

    // A message with a malformed traceparent: consumed in a new trace, no error.
    let inbox = inbox(&pool).await;
    consume(&pool, &inbox, "m-bad", Some("not-a-traceparent")).await;

    let spans = traces.spans();
    let layer = one(&spans, "idempotency");
    assert_eq!(
        layer.parent_span_id,
        SpanId::INVALID,
        "a root: the bad parent was ignored"
    );
    assert_eq!(
        stored.trace_id_hex(),
        layer.span_context.trace_id().to_string()
    );
    assert_ne!(stored.trace_id_hex(), CLIENT_TRACE.to_owned());
    let consumer = one(&spans, "outbox.inbox.process");
    assert_eq!(consumer.parent_span_id, SpanId::INVALID);
    assert_ne!(
        consumer.span_context.trace_id(),
        layer.span_context.trace_id()
    );
    tokio::time::sleep(Duration::from_millis(1)).await;
}
