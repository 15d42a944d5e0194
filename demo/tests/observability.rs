//! The shipped Grafana dashboard and Prometheus alert rules query only metrics the demo
//! exposes: traffic of every kind is driven through the demo (first executions, replays from
//! each tier, a reused key, a key in flight, a failing Redis, charges whose events are
//! published or dead-lettered, the reconciliation check), then every metric name the files
//! query must be on `GET /metrics`.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use axum::body::Body;
use axum::http::Request;
use http_body_util::BodyExt;
use idempotency_core::config::{InFlightPolicyKind, SchemaMode};
use idempotency_core::{Call, ExecutionResult, IdempotencyKey};
use idempotency_demo::config::DemoConfig;
use idempotency_demo::db::Postgres;
use idempotency_demo::{App, assemble, reconcile, router};
use idempotency_outbox::{Ack, OutboxMessage, PublishError, PublishErrorKind, Publisher};
use tower::ServiceExt;

/// Refuses its first publish, then logs and confirms.
#[derive(Debug, Default)]
struct FailsFirst {
    failed: AtomicBool,
}

impl Publisher for FailsFirst {
    fn destination(&self) -> &str {
        "test"
    }

    async fn publish(&self, _message: &OutboxMessage) -> Result<Ack, PublishError> {
        if self.failed.swap(true, Ordering::SeqCst) {
            Ok(Ack { duplicate: false })
        } else {
            // Refused, not unavailable: a failure that is the broker's does not count towards
            // max-attempts, and this test wants its dead letter.
            Err(PublishError::kind_only(PublishErrorKind::Rejected))
        }
    }
}

fn queried_metrics() -> BTreeSet<String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let dashboard =
        std::fs::read_to_string(root.join("deploy/grafana/idempotency-dashboard.json")).unwrap();
    let alerts =
        std::fs::read_to_string(root.join("deploy/prometheus/idempotency-alerts.yaml")).unwrap();
    // Both files must be what they claim to be.
    let dashboard: serde_json::Value = serde_json::from_str(&dashboard).unwrap();
    let exprs: Vec<String> = dashboard["panels"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|panel| panel["targets"].as_array().unwrap().clone())
        .map(|target| target["expr"].as_str().unwrap().to_owned())
        .chain(
            alerts
                .lines()
                .filter_map(|line| line.trim().strip_prefix("expr: "))
                .map(str::to_owned),
        )
        .collect();
    assert!(exprs.len() >= 20, "{} expressions", exprs.len());
    let mut names = BTreeSet::new();
    for expr in exprs {
        for word in expr.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')) {
            if ["idempotency_", "outbox_", "demo_"]
                .iter()
                .any(|p| word.starts_with(p))
            {
                let base = word
                    .strip_suffix("_bucket")
                    .or_else(|| word.strip_suffix("_count"))
                    .or_else(|| word.strip_suffix("_sum"))
                    .unwrap_or(word);
                names.insert(base.to_owned());
            }
        }
    }
    names
}

async fn post(app: &axum::Router, uri: &str, key: &str, body: &str) -> axum::http::StatusCode {
    let request = Request::post(uri)
        .header("content-type", "application/json")
        .header("idempotency-key", key)
        .body(Body::from(body.to_owned()))
        .unwrap();
    app.clone().oneshot(request).await.unwrap().status()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_metric_the_dashboard_and_the_alerts_query_is_exposed() {
    let prometheus = idempotency::metrics::install().unwrap();
    reconcile::describe();

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let dead_redis = format!("redis://{}", listener.local_addr().unwrap());
    drop(listener);
    let mut config = DemoConfig::default();
    config.idempotency.persistence.schema.mode = SchemaMode::Create;
    config.idempotency.local_cache.statistics = true;
    config.idempotency.distributed_cache.url = Some(dead_redis);
    config.idempotency.distributed_cache.secret = Some(
        idempotency_cache_redis::CacheSecret::new("tests-only-secret-0123456789abcdef").unwrap(),
    );
    config.idempotency.distributed_cache.timeout = Duration::from_millis(20);
    config.idempotency.in_flight.policy = InFlightPolicyKind::Reject;
    config.outbox.schema.mode = SchemaMode::Create;
    config.outbox.notify_channel = Some(idempotency_testing::unique_name("obs"));
    config.outbox.relay.workers = 1;
    config.outbox.relay.max_attempts = 1;
    config.outbox.relay.poll_interval = Duration::from_millis(100);
    config.outbox.relay.stats_interval = Duration::from_millis(100);
    let pool = idempotency_testing::pg_pool().await;
    let (db, idempotency) = assemble::<Postgres, _>(
        pool,
        &config,
        Some(Arc::new(FailsFirst::default())),
        Some(prometheus.clone()),
    )
    .await
    .unwrap();
    let mut app = App::new(
        db.clone(),
        idempotency.service().clone(),
        config.demo.clone(),
    );
    app.prometheus = Some(prometheus);
    app.health = Some(idempotency.health_check());
    let app = router(app, config.server.max_body_bytes);

    // First execution, replays (L1), a reused key.
    let payment = r#"{"orderId":"o-1","recipient":"bob","amount":10}"#;
    assert_eq!(post(&app, "/api/payments", "obs-1", payment).await, 201);
    assert_eq!(post(&app, "/api/payments", "obs-1", payment).await, 201);
    let other = r#"{"orderId":"o-2","recipient":"bob","amount":11}"#;
    assert_eq!(post(&app, "/api/payments", "obs-1", other).await, 422);
    // A key in flight: held by an open transaction, refused at once (policy reject).
    let service = idempotency.service().clone();
    let (release, released) = tokio::sync::oneshot::channel::<()>();
    let (held, is_held) = tokio::sync::oneshot::channel::<()>();
    let holder = tokio::spawn(async move {
        let mut tx = service.begin().await.unwrap();
        let request = serde_json::json!({});
        let key = IdempotencyKey::new("obs-held").unwrap();
        let _ = service
            .execute_in(&mut tx, Call::new("HOLD", key, &request), async |_conn| {
                let _ = held.send(());
                let _ = released.await;
                Ok::<_, idempotency_core::Error>(ExecutionResult::success(()))
            })
            .await;
        let _ = tx.rollback().await;
    });
    is_held.await.unwrap();
    let request = serde_json::json!({});
    let refused = idempotency
        .service()
        .execute(
            Call::new("HOLD", IdempotencyKey::new("obs-held").unwrap(), &request),
            async |_conn| Ok::<_, idempotency_core::Error>(ExecutionResult::success(())),
        )
        .await;
    assert!(matches!(refused, Err(idempotency_core::Error::InFlight)));
    drop(release);
    holder.await.unwrap();
    // Two charges: the first event's publish fails (dead-lettered at max-attempts 1), the second
    // is published.
    for key in [uuid::Uuid::now_v7(), uuid::Uuid::now_v7()] {
        assert_eq!(
            post(&app, "/charges", &key.to_string(), r#"{"amountCents":100}"#).await,
            201
        );
    }
    assert_eq!(
        reconcile::check_once(&db, Duration::from_secs(3600))
            .await
            .unwrap(),
        0,
        "every charge has its event"
    );

    let scrape = async || {
        let response = app
            .clone()
            .oneshot(Request::get("/metrics").body(Body::empty()).unwrap())
            .await
            .unwrap();
        let bytes = response.into_body().collect().await.unwrap().to_bytes();
        String::from_utf8(bytes.to_vec()).unwrap()
    };
    let wanted = queried_metrics();
    let mut missing: Vec<String> = Vec::new();
    for _ in 0..100 {
        let text = scrape().await;
        missing = wanted
            .iter()
            .filter(|name| !text.contains(&format!("# TYPE {name} ")))
            .cloned()
            .collect();
        if missing.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        missing.is_empty(),
        "queried by the dashboard or the alerts, absent from /metrics: {missing:?}"
    );
    idempotency.shutdown().await;
}
