//! Meters as Prometheus users expect them, through the assembled service: `_total` counters,
//! `_seconds` histograms with buckets, the L1 statistics as counters, a `/metrics` route.
//! One global recorder per test binary: this file holds one test.

#![allow(clippy::unwrap_used)]

use axum::body::Body;
use http_body_util::BodyExt;
use idempotency::{Builder, Call, ExecutionResult, IdempotencyKey, Loader, Settings};
use tower::ServiceExt;

#[tokio::test]
async fn the_assembled_service_exports_prometheus_meters_and_l1_statistics() {
    let handle = idempotency::metrics::install().unwrap();
    let file =
        std::env::temp_dir().join(format!("idempotency-metrics-{}.yaml", uuid::Uuid::now_v7()));
    // No Redis: with feature `redis` the L2 cache is on by default and would need a URL;
    // without it the section is not known.
    let no_redis = if cfg!(feature = "redis") {
        "  distributed-cache:\n    enabled: false\n"
    } else {
        ""
    };
    std::fs::write(
        &file,
        format!(
            "idempotency:\n  local-cache:\n    statistics: true\n{no_redis}  persistence:\n    schema:\n      mode: create\n"
        ),
    )
    .unwrap();
    let settings: Settings = Loader::new()
        .file(&file)
        .environment(Vec::<(String, String)>::new())
        .load()
        .unwrap();
    std::fs::remove_file(&file).unwrap();
    let path =
        std::env::temp_dir().join(format!("idempotency-metrics-{}.db", uuid::Uuid::now_v7()));
    let pool = sqlx::SqlitePool::connect(&format!("sqlite://{}?mode=rwc", path.display()))
        .await
        .unwrap();
    let idempotency = Builder::new(&settings)
        .prometheus(handle)
        .build(pool)
        .await
        .unwrap();
    for _ in 0..3 {
        let request = serde_json::json!({"n": 1});
        idempotency
            .service()
            .execute(
                Call::new("METERED", IdempotencyKey::new("k").unwrap(), &request),
                async |_conn| Ok::<_, idempotency::core::Error>(ExecutionResult::success(1)),
            )
            .await
            .unwrap();
    }

    let text = idempotency.render_metrics().unwrap();
    for line in [
        "# TYPE idempotency_acquired_total counter",
        "# TYPE idempotency_replays_total counter",
        // the starter's meters keep their handles; every call still counts
        "idempotency_replays_total{operation=\"METERED\",status=\"COMPLETED\"} 2",
        "idempotency_lookup_hits_total{operation=\"METERED\",level=\"local\"} 2",
        "idempotency_acquired_total{operation=\"METERED\"} 1",
        "# TYPE idempotency_acquire_wait_seconds histogram",
        "idempotency_acquire_wait_seconds_bucket{operation=\"METERED\",le=\"0.005\"}",
        "idempotency_local_cache_hits_total 2",
        "idempotency_local_cache_misses_total 1",
        "# HELP idempotency_local_cache_evictions_total",
    ] {
        assert!(text.contains(line), "missing {line:?} in\n{text}");
    }

    let router: axum::Router = idempotency.metrics_router();
    let response = router
        .oneshot(
            axum::http::Request::get("/metrics")
                .body(Body::empty())
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let body = response.into_body().collect().await.unwrap().to_bytes();
    assert!(String::from_utf8_lossy(&body).contains("idempotency_local_cache_hits_total"));
    idempotency.shutdown().await;
}
