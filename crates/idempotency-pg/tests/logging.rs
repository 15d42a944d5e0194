//! Logs carry a short hash of the idempotency key, never the key itself, at every level.

#![allow(clippy::unwrap_used)] // tests fail loudly on unexpected errors

use std::io::Write;
use std::sync::{Arc, Mutex};

use idempotency_core::fingerprint::short_hash;
use idempotency_core::{Call, Error, ExecutionResult, IdempotencyKey, IdempotencyService, Outcome};
use idempotency_pg::PgStore;

#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test]
async fn logs_carry_a_hash_of_the_key_not_the_key() {
    let captured = Captured::default();
    let writer = captured.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::TRACE)
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);

    let store = PgStore::new(idempotency_testing::pg_pool().await);
    store.create_schema().await.unwrap();
    let service = IdempotencyService::new(store);
    let secret = "customer-secret-key-4a1f9c";
    let key = IdempotencyKey::new(secret).unwrap();
    for amount in [1, 1, 2] {
        let result: Result<Outcome<i32>, Error> = service
            .execute(Call::new("PAY", key.clone(), &amount), async |_c| {
                Ok(ExecutionResult::success(amount))
            })
            .await;
        if amount == 2 {
            let error = result.unwrap_err();
            assert!(
                !format!("{error} {error:?}").contains(secret),
                "the error text carries the key"
            );
        }
    }
    tracing::debug!(key = ?key, "a key logged by an application through Debug");

    let logs = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
    assert!(
        logs.contains(&short_hash(secret)),
        "no key hash in the logs:\n{logs}"
    );
    assert!(
        !logs.contains(secret),
        "the raw key reached the logs:\n{logs}"
    );
}
