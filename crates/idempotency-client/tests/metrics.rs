//! The client's metrics through the `metrics` facade, read from a `DebuggingRecorder` (the
//! only test of this binary: the recorder is process-wide).

#![allow(clippy::unwrap_used)] // tests fail loudly on unexpected errors

mod support;

use std::time::Duration;

use idempotency_client::{IdempotencyMiddleware, RetryPolicy};
use idempotency_core::InFlightPolicy;
use idempotency_testing::recorded::Recorded;
use metrics_util::debugging::DebuggingRecorder;

#[tokio::test]
async fn attempts_retries_by_cause_replays_and_give_ups_are_counted() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    recorder.install().unwrap();
    let server = support::start(InFlightPolicy::Reject).await;
    let proxy = support::lose_first_answer(server.addr).await;
    let policy = RetryPolicy::default()
        .max_attempts(2)
        .initial_backoff(Duration::from_millis(10));
    let client = reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
        .with(IdempotencyMiddleware::new().retry_policy(policy))
        .build();

    // A lost answer, then its replay.
    client
        .post(format!("http://{proxy}/payments"))
        .header("content-type", "application/json")
        .body(r#"{"amount":10}"#)
        .send()
        .await
        .unwrap();
    // Two 503s, then the budget is spent.
    client
        .post(server.url("/unavailable"))
        .send()
        .await
        .unwrap_err();
    // Not handled: not counted.
    client.get(server.url("/unavailable")).send().await.unwrap();

    let recorded = Recorded::take(&snapshotter);
    assert_eq!(
        recorded.counter("idempotency_client_attempts_total", &[("method", "POST")]),
        4
    );
    assert_eq!(recorded.total("idempotency_client_attempts_total"), 4);
    assert_eq!(
        recorded.counter(
            "idempotency_client_retries_total",
            &[("cause", "connection")]
        ),
        1
    );
    assert_eq!(
        recorded.counter("idempotency_client_retries_total", &[("cause", "503")]),
        1
    );
    assert_eq!(recorded.counter("idempotency_client_replays_total", &[]), 1);
    assert_eq!(recorded.counter("idempotency_client_gave_up_total", &[]), 1);
    assert_eq!(server.payments().await, 1);
}
