//! Durable keys: a caller that gave up (or restarted) mid-operation sends the operation's key
//! again and gets the replay.

#![allow(clippy::unwrap_used)] // tests fail loudly on unexpected errors

mod support;

use std::time::Duration;

use idempotency_client::{
    Error, IdempotencyMiddleware, KeyStore, MemoryKeyStore, Operation, ResponseExt, RetryPolicy,
};
use idempotency_core::InFlightPolicy;
use reqwest::StatusCode;

fn client(store: impl KeyStore) -> reqwest_middleware::ClientWithMiddleware {
    let policy = RetryPolicy::default()
        .max_attempts(1)
        .initial_backoff(Duration::from_millis(10));
    reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
        .with(
            IdempotencyMiddleware::new()
                .retry_policy(policy)
                .key_store(store),
        )
        .build()
}

/// The first client loses the answer after the server committed and gives up; a second client
/// (the caller after a restart) sends the operation again with the stored key: the replay.
async fn a_new_client_reuses_the_operations_key<K: KeyStore + Clone>(store: K) {
    let server = support::start(InFlightPolicy::Reject).await;
    let proxy = support::lose_first_answer(server.addr).await;
    let send = |client: reqwest_middleware::ClientWithMiddleware, url: String| async move {
        client
            .post(url)
            .header("content-type", "application/json")
            .body(r#"{"amount":10}"#)
            .with_extension(Operation::new("payout-1"))
            .send()
            .await
    };
    let lost = send(client(store.clone()), format!("http://{proxy}/payments"))
        .await
        .unwrap_err();
    assert!(
        matches!(Error::from_middleware(&lost), Some(Error::Exhausted { .. })),
        "{lost:?}"
    );
    assert_eq!(server.payments().await, 1, "the server committed");

    let after_restart = send(client(store.clone()), server.url("/payments"))
        .await
        .unwrap();
    assert_eq!(after_restart.status(), StatusCode::CREATED);
    assert!(after_restart.is_replay(), "the same key: the stored answer");
    assert_eq!(server.payments().await, 1, "one execution");

    // Once forgotten, the operation id starts a new operation.
    store.forget("payout-1").await.unwrap();
    let again = send(client(store), server.url("/payments")).await.unwrap();
    assert!(!again.is_replay());
    assert_eq!(server.payments().await, 2);
}

#[tokio::test]
async fn in_memory_keys_survive_a_new_client() {
    a_new_client_reuses_the_operations_key(MemoryKeyStore::default()).await;
}

#[tokio::test]
async fn an_operation_without_a_key_store_is_not_sent() {
    let server = support::start(InFlightPolicy::Reject).await;
    let client = reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
        .with(IdempotencyMiddleware::new())
        .build();
    let refused = client
        .post(server.url("/unavailable"))
        .with_extension(Operation::new("payout-1"))
        .send()
        .await
        .unwrap_err();
    assert!(
        matches!(
            Error::from_middleware(&refused),
            Some(Error::NoKeyStore { operation }) if operation == "payout-1"
        ),
        "{refused:?}"
    );
    assert!(server.keys().is_empty(), "nothing sent");
}
