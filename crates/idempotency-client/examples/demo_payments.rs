//! Pays through the demo with safe retries: one key per payment, kept on every retry; a second
//! send with the same key is answered from the stored outcome.
//!
//! ```sh
//! cargo run -p idempotency-demo                                   # in one terminal
//! cargo run -p idempotency-client --example demo_payments         # in another
//! DEMO_URL=http://127.0.0.1:8080 cargo run -p idempotency-client --example demo_payments
//! ```

#![allow(clippy::print_stdout)] // an example shows what it got

use std::time::Duration;

use idempotency_client::{Error, IdempotencyMiddleware, ResponseExt, RetryPolicy};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let base = std::env::var("DEMO_URL").unwrap_or_else(|_| "http://127.0.0.1:8080".to_owned());
    let client = reqwest_middleware::ClientBuilder::new(
        reqwest::Client::builder()
            .timeout(Duration::from_secs(5))
            .build()?,
    )
    .with(IdempotencyMiddleware::new().retry_policy(RetryPolicy::default().max_attempts(5)))
    .build();
    let order = uuid::Uuid::now_v7();
    let body = format!(r#"{{"orderId":"{order}","recipient":"alice","amount":100.00}}"#);
    let key = format!("pay-{order}");
    // The caller's own key, twice: the second answer is the stored one.
    for round in 1..=2 {
        let sent = client
            .post(format!("{base}/api/payments"))
            .header("content-type", "application/json")
            .header("idempotency-key", &key)
            .body(body.clone())
            .send()
            .await;
        match sent {
            Ok(response) => {
                let delivery = response.delivery().cloned();
                println!("send {round}: {} {delivery:?}", response.status());
                println!("  {}", response.text().await?);
            }
            Err(e) => match Error::from_middleware(&e) {
                Some(error) => println!("send {round}: {error}"),
                None => return Err(e.into()),
            },
        }
    }
    // The same key with another amount: 422, not retried.
    let reused = client
        .post(format!("{base}/api/payments"))
        .header("content-type", "application/json")
        .header("idempotency-key", &key)
        .body(body.replace("100.00", "5.00"))
        .send()
        .await;
    if let Err(e) = reused {
        println!("key reused: {e}");
    }
    Ok(())
}
