//! The client against a real server: axum with `IdempotencyLayer` on SQLite, over TCP.

#![allow(clippy::unwrap_used)] // tests fail loudly on unexpected errors

mod support;

use std::time::{Duration, Instant};

use idempotency_client::{
    Cause, Error, GiveUp, IdempotencyMiddleware, KeyFormat, KeyGenerator, ResponseExt, RetryPolicy,
};
use idempotency_core::InFlightPolicy;
use reqwest::StatusCode;
use reqwest_middleware::ClientWithMiddleware;

fn client(middleware: IdempotencyMiddleware) -> ClientWithMiddleware {
    let inner = reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    reqwest_middleware::ClientBuilder::new(inner)
        .with(middleware)
        .build()
}

fn fast() -> RetryPolicy {
    RetryPolicy::default()
        .initial_backoff(Duration::from_millis(10))
        .max_backoff(Duration::from_millis(20))
}

/// The crate's error inside the middleware error.
fn error(result: reqwest_middleware::Result<reqwest::Response>) -> Error {
    let wrapped = result.expect_err("the call should fail");
    match wrapped {
        reqwest_middleware::Error::Middleware(inner) => inner.downcast().unwrap(),
        other => panic!("not the middleware's error: {other:?}"),
    }
}

#[tokio::test]
async fn an_answer_lost_after_the_commit_is_replayed_on_retry_and_the_payment_runs_once() {
    let server = support::start(InFlightPolicy::Reject).await;
    let proxy = support::lose_first_answer(server.addr).await;
    let client = client(IdempotencyMiddleware::new().retry_policy(fast()));
    let response = client
        .post(format!("http://{proxy}/payments"))
        .header("content-type", "application/json")
        .body(r#"{"amount":10}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::CREATED);
    let delivery = response.delivery().unwrap().clone();
    assert_eq!(delivery.attempts, 2, "{delivery:?}");
    assert!(
        delivery.replayed,
        "the second attempt got the stored answer"
    );
    assert!(
        delivery.key.starts_with('"'),
        "an sf-string: {}",
        delivery.key
    );
    let body: serde_json::Value = serde_json::from_str(&response.text().await.unwrap()).unwrap();
    assert_eq!(body["amount"], 10);
    assert_eq!(server.payments().await, 1, "one payment for two attempts");
}

#[tokio::test]
async fn a_concurrent_holder_is_waited_for_with_retry_after_then_replayed() {
    // PostgreSQL: on SQLite the duplicate queues on the write lock and never sees a 409.
    let server = support::start_on::<idempotency_pg::PgStore>(InFlightPolicy::Reject).await;
    let body = r#"{"amount":10,"slow":true}"#;
    let first = {
        let url = server.url("/payments");
        tokio::spawn(async move {
            reqwest::Client::new()
                .post(url)
                .header("idempotency-key", "k-slow")
                .header("content-type", "application/json")
                .body(body)
                .send()
                .await
                .unwrap()
                .text()
                .await
                .unwrap()
        })
    };
    server.hooks.entered.notified().await;
    let started = Instant::now();
    let response = client(IdempotencyMiddleware::new().retry_policy(fast()))
        .post(server.url("/payments"))
        .header("idempotency-key", "k-slow") // the caller's key is kept
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .unwrap();
    let waited = started.elapsed();
    assert_eq!(response.status(), StatusCode::CREATED);
    let delivery = response.delivery().unwrap().clone();
    assert_eq!(delivery.key, "k-slow");
    // 409, then the replay (one more 409 if the holder outlives the first Retry-After).
    assert!(delivery.attempts >= 2, "409 then the replay: {delivery:?}");
    assert!(delivery.replayed);
    assert!(
        waited >= Duration::from_secs(idempotency_axum::RETRY_AFTER_IN_FLIGHT),
        "Retry-After honoured: {waited:?}"
    );
    assert_eq!(response.text().await.unwrap(), first.await.unwrap());
    assert_eq!(server.payments().await, 1, "not a second execution");
}

#[tokio::test]
async fn a_key_reused_for_another_request_is_refused_with_422_and_not_retried() {
    let server = support::start(InFlightPolicy::Reject).await;
    let client = client(
        IdempotencyMiddleware::new()
            .key_generator(KeyGenerator::new(|| "k-reused".to_owned()))
            .retry_policy(fast()),
    );
    let send = |amount: i64| {
        client
            .post(server.url("/payments"))
            .header("content-type", "application/json")
            .body(format!(r#"{{"amount":{amount}}}"#))
            .send()
    };
    assert_eq!(send(10).await.unwrap().status(), StatusCode::CREATED);
    let refused = error(send(20).await);
    let Error::Refused {
        status,
        attempt,
        ref body,
        ..
    } = refused
    else {
        panic!("{refused:?}")
    };
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(attempt, 1, "not retried");
    assert!(
        String::from_utf8_lossy(body).contains("reuse"),
        "the problem is kept: {}",
        String::from_utf8_lossy(body)
    );
    let message = refused.to_string();
    assert!(
        message.contains("send its body again with the same key"),
        "{message}"
    );
    assert_eq!(server.payments().await, 1);
}

#[tokio::test]
async fn a_bad_body_is_refused_with_400_and_not_retried() {
    let server = support::start(InFlightPolicy::Reject).await;
    let refused = error(
        client(IdempotencyMiddleware::new().retry_policy(fast()))
            .post(server.url("/payments"))
            .header("content-type", "application/json")
            .body("{not json")
            .send()
            .await,
    );
    assert!(
        matches!(
            refused,
            Error::Refused {
                status: StatusCode::BAD_REQUEST,
                attempt: 1,
                ..
            }
        ),
        "{refused:?}"
    );
    assert_eq!(server.payments().await, 0);
}

/// A business rejection (`422 request-rejected`, stored by the server) is the request's
/// outcome: returned as a response the first time, as its replay is, never as
/// `Error::Refused` (whose advice, a new key, would run the request again).
#[tokio::test]
async fn a_business_rejection_is_a_response_the_first_time_as_on_its_replay() {
    let server = support::start(InFlightPolicy::Reject).await;
    let client = client(
        IdempotencyMiddleware::new()
            .key_generator(KeyGenerator::new(|| "k-rejected".to_owned()))
            .retry_policy(fast()),
    );
    let send = || {
        client
            .post(server.url("/payments"))
            .header("content-type", "application/json")
            .body(r#"{"amount":5000}"#)
            .send()
    };
    let first = send().await.unwrap();
    assert_eq!(first.status(), StatusCode::UNPROCESSABLE_ENTITY);
    let delivery = first.delivery().unwrap().clone();
    assert_eq!((delivery.attempts, delivery.replayed), (1, false));
    assert_eq!(delivery.key, "\"k-rejected\"");
    assert_eq!(
        first.headers()["content-type"],
        "application/problem+json",
        "the answer as sent"
    );
    let first_body = first.text().await.unwrap();
    assert!(first_body.contains("LIMIT_EXCEEDED"), "{first_body}");
    let replay = send().await.unwrap();
    assert_eq!(replay.status(), StatusCode::UNPROCESSABLE_ENTITY);
    assert!(replay.delivery().unwrap().replayed);
    assert_eq!(replay.text().await.unwrap(), first_body);
    assert_eq!(server.rejections(), 1, "the handler ran once");
}

/// A `400 body-unreadable` (the server could not read the body; nothing ran) is sent again
/// with the same key, never `Refused` with the advice of a new one.
#[tokio::test]
async fn a_body_the_server_could_not_read_is_sent_again_with_the_same_key() {
    let server = support::start(InFlightPolicy::Reject).await;
    let exhausted = error(
        client(IdempotencyMiddleware::new().retry_policy(fast().max_attempts(3)))
            .post(server.url("/unreadable"))
            .body("x")
            .send()
            .await,
    );
    assert!(
        matches!(exhausted, Error::Exhausted { ref attempts, .. } if attempts.len() == 3),
        "{exhausted:?}"
    );
    let keys = server.keys();
    assert_eq!(keys.len(), 3, "{keys:?}");
    assert!(
        keys.iter().all(|key| key.is_some() && *key == keys[0]),
        "{keys:?}"
    );
}

/// A `422` problem document cut off by a lost connection (the status and headers arrived,
/// then the connection closed before the body's end) says nothing of whether the request
/// refuses: it is sent again with the same key, which meets the stored answer's replay
/// (before: reqwest reports any failed body read as a decode error, and the middleware
/// returned it bare after one attempt, without the key).
#[tokio::test]
async fn a_problem_document_cut_off_is_sent_again_with_the_same_key() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// Reads one request (headers, then `content-length` bytes of body); its key.
    async fn request_key(socket: &mut tokio::net::TcpStream) -> Option<String> {
        let mut buffer = Vec::new();
        let mut chunk = [0u8; 4096];
        loop {
            if let Some(end) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
                let head = String::from_utf8_lossy(&buffer[..end]).to_lowercase();
                let header = |name: &str| {
                    head.lines()
                        .find_map(|line| line.strip_prefix(name).map(|v| v.trim().to_owned()))
                };
                let length: usize = header("content-length:").map_or(0, |v| v.parse().unwrap());
                if buffer.len() >= end + 4 + length {
                    return header("idempotency-key:");
                }
            }
            let n = socket.read(&mut chunk).await.unwrap();
            assert!(n > 0, "the request ended early");
            buffer.extend_from_slice(&chunk[..n]);
        }
    }

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/payments", listener.local_addr().unwrap());
    let server = tokio::spawn(async move {
        let mut keys = Vec::new();
        let (mut first, _) = listener.accept().await.unwrap();
        keys.push(request_key(&mut first).await);
        first
            .write_all(
                b"HTTP/1.1 422 Unprocessable Entity\r\n\
                  content-type: application/problem+json\r\n\
                  content-length: 200\r\n\r\n{\"type\":\"https://exa",
            )
            .await
            .unwrap();
        drop(first); // the rest of the body never comes
        let (mut second, _) = listener.accept().await.unwrap();
        keys.push(request_key(&mut second).await);
        second
            .write_all(
                b"HTTP/1.1 201 Created\r\nidempotent-replayed: true\r\n\
                  content-length: 2\r\nconnection: close\r\n\r\nok",
            )
            .await
            .unwrap();
        keys
    });
    let response = client(IdempotencyMiddleware::new().retry_policy(fast().max_attempts(3)))
        .post(&url)
        .body("x")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::CREATED);
    let delivery = response.delivery().unwrap().clone();
    assert_eq!((delivery.attempts, delivery.replayed), (2, true));
    let keys = server.await.unwrap();
    assert_eq!(keys.len(), 2);
    assert!(keys[0].is_some(), "{keys:?}");
    assert_eq!(keys[0], keys[1], "the same key on the retry");
    assert_eq!(
        keys[0].as_deref(),
        Some(delivery.key.to_lowercase().as_str())
    );
}

/// A problem document longer than the middleware reads for its `type` (1 MiB) is an outcome,
/// handed back whole: the part read, then the rest.
#[tokio::test]
async fn a_long_problem_document_is_handed_back_whole() {
    let server = support::start(InFlightPolicy::Reject).await;
    let response = client(IdempotencyMiddleware::new().retry_policy(fast()))
        .post(server.url("/long-rejection"))
        .body("x")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(response.delivery().unwrap().attempts, 1);
    let body: serde_json::Value = serde_json::from_slice(&response.bytes().await.unwrap()).unwrap();
    assert_eq!(body["errors"].as_str().unwrap().len(), 2 * 1024 * 1024);
}

/// A retrying middleware placed before this one (reqwest-retry's way: the request again,
/// with the same extensions) sends the key this one generated, not a new one per retry; a
/// different request given the same extensions gets a key of its own.
#[tokio::test]
async fn an_outer_retry_sends_the_key_generated_for_its_request() {
    /// Sends the request, then (with the same extensions) again, or another one.
    struct Twice {
        another: bool,
    }

    #[async_trait::async_trait]
    impl reqwest_middleware::Middleware for Twice {
        async fn handle(
            &self,
            request: reqwest::Request,
            extensions: &mut http::Extensions,
            next: reqwest_middleware::Next<'_>,
        ) -> reqwest_middleware::Result<reqwest::Response> {
            let mut again = request.try_clone().unwrap();
            if self.another {
                *again.body_mut() = Some("y".into());
            }
            let _ = next.clone().run(request, extensions).await;
            next.run(again, extensions).await
        }
    }

    for another in [false, true] {
        let server = support::start(InFlightPolicy::Reject).await;
        let inner = reqwest::Client::builder()
            .timeout(Duration::from_secs(5))
            .build()
            .unwrap();
        let client = reqwest_middleware::ClientBuilder::new(inner)
            .with(Twice { another })
            .with(IdempotencyMiddleware::new().retry_policy(fast().max_attempts(1)))
            .build();
        let _ = client
            .post(server.url("/unavailable"))
            .body("x")
            .send()
            .await;
        let keys = server.keys();
        assert_eq!(keys.len(), 2, "{keys:?}");
        assert!(keys[0].is_some() && keys[1].is_some());
        if another {
            assert_ne!(keys[0], keys[1], "another request, another key");
        } else {
            assert_eq!(
                keys[0], keys[1],
                "one key for the request and its outer retry"
            );
        }
    }
}

/// A middleware after this one fails the retry (a circuit breaker opened by the first
/// attempt's 503): the first attempt reached the server and may have run, so the error carries
/// its key and the earlier attempt (before: the breaker's error passed through, no key).
#[tokio::test]
async fn an_error_after_an_attempt_was_sent_carries_the_key() {
    struct Breaker(std::sync::atomic::AtomicU32);

    #[async_trait::async_trait]
    impl reqwest_middleware::Middleware for Breaker {
        async fn handle(
            &self,
            request: reqwest::Request,
            extensions: &mut http::Extensions,
            next: reqwest_middleware::Next<'_>,
        ) -> reqwest_middleware::Result<reqwest::Response> {
            if self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst) == 0 {
                next.run(request, extensions).await
            } else {
                Err(reqwest_middleware::Error::middleware(
                    std::io::Error::other("breaker open"),
                ))
            }
        }
    }

    let server = support::start(InFlightPolicy::Reject).await;
    let inner = reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    let client = reqwest_middleware::ClientBuilder::new(inner)
        .with(IdempotencyMiddleware::new().retry_policy(fast()))
        .with(Breaker(std::sync::atomic::AtomicU32::new(0)))
        .build();
    let error = error(
        client
            .post(server.url("/unavailable?token=secret"))
            .body("x")
            .send()
            .await,
    );
    let sent = server.keys();
    assert_eq!(sent.len(), 1, "{sent:?}");
    assert_eq!(error.key(), sent[0].as_deref(), "{error}");
    assert_eq!(error.attempts(), 2);
    let Error::Interrupted { earlier, .. } = &error else {
        panic!("{error:?}");
    };
    assert_eq!(earlier.len(), 1);
    let source = std::error::Error::source(&error).unwrap().to_string();
    assert!(source.contains("breaker open"), "{source}");
    assert!(
        !error.to_string().contains("breaker open"),
        "once, as the source"
    );
    assert!(!format!("{error:?}").contains(sent[0].as_deref().unwrap()));
}

#[tokio::test]
async fn an_exhausted_budget_lists_every_attempt_and_its_cause() {
    let server = support::start(InFlightPolicy::Reject).await;
    let policy = fast().max_attempts(3);
    let client = client(IdempotencyMiddleware::new().retry_policy(policy.clone()));
    let exhausted = error(
        client
            .post(server.url("/unavailable"))
            .body("x")
            .send()
            .await,
    );
    let message = exhausted.to_string();
    let Error::Exhausted {
        reason, attempts, ..
    } = exhausted
    else {
        panic!("{message}")
    };
    assert_eq!(reason, GiveUp::MaxAttempts(3));
    assert_eq!(attempts.len(), 3);
    for (i, failure) in attempts.iter().enumerate() {
        assert_eq!(failure.attempt as usize, i + 1);
        assert!(matches!(
            failure.cause,
            Cause::Status {
                status: StatusCode::SERVICE_UNAVAILABLE,
                ..
            }
        ));
    }
    assert_eq!(
        message,
        "gave up after 3 attempt(s) (3 attempts made, the maximum): \
         #1 503 Service Unavailable; #2 503 Service Unavailable; #3 503 Service Unavailable"
    );
    let keys = server.keys();
    assert_eq!(keys.len(), 3);
    assert!(keys[0].is_some());
    assert!(keys.iter().all(|k| *k == keys[0]), "one key: {keys:?}");

    // Connection errors, listed the same way.
    let closed = support::closed_port().await;
    let exhausted = error(client.post(format!("http://{closed}/x")).send().await);
    let message = exhausted.to_string();
    let Error::Exhausted { attempts, .. } = exhausted else {
        panic!("{message}")
    };
    assert_eq!(attempts.len(), 3, "{message}");
    assert!(
        attempts
            .iter()
            .all(|f| matches!(f.cause, Cause::Connection(_))),
        "{message}"
    );
    assert!(message.contains("#3 connection error"), "{message}");
}

#[tokio::test]
async fn a_retry_after_beyond_the_bound_or_a_spent_time_budget_ends_the_retries() {
    let server = support::start(InFlightPolicy::Reject).await;
    let too_long = error(
        client(IdempotencyMiddleware::new().retry_policy(fast()))
            .post(server.url("/busy"))
            .send()
            .await,
    );
    assert!(
        matches!(
            too_long,
            Error::Exhausted {
                reason: GiveUp::RetryAfterTooLong { .. },
                ..
            }
        ),
        "{too_long:?}"
    );
    assert_eq!(too_long.attempts(), 1);
    assert!(
        too_long
            .to_string()
            .contains("#1 409 Conflict (Retry-After 60s)")
    );

    let policy = RetryPolicy::default()
        .initial_backoff(Duration::from_secs(2))
        .max_elapsed(Duration::from_millis(500));
    let spent = error(
        client(IdempotencyMiddleware::new().retry_policy(policy))
            .post(server.url("/unavailable"))
            .send()
            .await,
    );
    assert!(
        matches!(
            spent,
            Error::Exhausted {
                reason: GiveUp::MaxElapsed(_),
                ..
            }
        ),
        "{spent:?}"
    );
    assert_eq!(spent.attempts(), 1);
}

#[tokio::test]
async fn a_streamed_body_is_sent_once_and_the_error_says_why() {
    let server = support::start(InFlightPolicy::Reject).await;
    let chunks = futures_util::stream::iter([Ok::<_, std::io::Error>("x")]);
    let failed = error(
        client(IdempotencyMiddleware::new().retry_policy(fast()))
            .post(server.url("/unavailable"))
            .body(reqwest::Body::wrap_stream(chunks))
            .send()
            .await,
    );
    assert!(matches!(failed, Error::NotReplayable { .. }), "{failed:?}");
    assert!(failed.to_string().contains("cannot be cloned"), "{failed}");
    assert_eq!(server.keys().len(), 1, "sent once");
}

#[tokio::test]
async fn bare_keys_and_methods_outside_the_list() {
    let server = support::start(InFlightPolicy::Reject).await;
    let client = client(
        IdempotencyMiddleware::new()
            .key_format(KeyFormat::Bare)
            .retry_policy(fast().max_attempts(1)),
    );
    let _ = client.post(server.url("/unavailable")).send().await;
    let key = server.keys()[0].clone().unwrap();
    assert_eq!(
        uuid::Uuid::parse_str(&key).unwrap().get_version_num(),
        7,
        "{key}"
    );

    // A GET is not handled: no key, no retry, no delivery.
    let response = client.get(server.url("/unavailable")).send().await.unwrap();
    assert_eq!(response.status(), StatusCode::METHOD_NOT_ALLOWED);
    assert!(response.delivery().is_none());
}

/// PUT and DELETE get a key by default, as the server's layer asks one of them by default
/// (before: passed through without one, and the layer answered 400); a request with an
/// `Operation` gets its stored key whatever the configured methods (before: sent without).
#[tokio::test]
async fn put_delete_and_any_operation_get_a_key() {
    let server = support::start(InFlightPolicy::Reject).await;
    let one = fast().max_attempts(1);
    let keyed = client(IdempotencyMiddleware::new().retry_policy(one.clone()));
    for method in [reqwest::Method::PUT, reqwest::Method::DELETE] {
        let failed = error(
            keyed
                .request(method.clone(), server.url("/unavailable"))
                .send()
                .await,
        );
        assert!(
            matches!(failed, Error::Exhausted { .. }),
            "{method}: {failed:?}"
        );
    }
    let keys = server.keys();
    assert_eq!(keys.len(), 2);
    assert!(keys.iter().all(Option::is_some), "{keys:?}");
    let store = idempotency_client::MemoryKeyStore::default();
    let post_only = client(
        IdempotencyMiddleware::new()
            .methods([reqwest::Method::POST])
            .key_store(store)
            .retry_policy(one),
    );
    let _ = post_only
        .put(server.url("/unavailable"))
        .with_extension(idempotency_client::Operation::new("op-put"))
        .send()
        .await;
    let _ = post_only
        .put(server.url("/unavailable"))
        .with_extension(idempotency_client::Operation::new("op-put"))
        .send()
        .await;
    let keys = server.keys();
    assert_eq!(keys.len(), 4);
    assert!(keys[2].is_some(), "{keys:?}");
    assert_eq!(keys[2], keys[3], "the operation's one key");
}

/// A request given up on may have run (its answer lost after the server committed): the
/// error carries the key it was sent with, and the same request sent again with that key is
/// answered by the replay; the payment ran once (before: the key was lost with the error, and
/// a resend could only pay again).
#[tokio::test]
async fn a_request_given_up_on_can_be_sent_again_with_the_key_its_error_carries() {
    let server = support::start(InFlightPolicy::Reject).await;
    let proxy = support::lose_first_answer(server.addr).await;
    let once = client(IdempotencyMiddleware::new().retry_policy(fast().max_attempts(1)));
    let lost = error(
        once.post(format!("http://{proxy}/payments"))
            .header("content-type", "application/json")
            .body(r#"{"amount":10}"#)
            .send()
            .await,
    );
    let key = lost.key().expect("the key it was sent with").to_owned();
    assert!(
        !lost.to_string().contains(&key),
        "not in the message: {lost}"
    );
    let debug = format!("{lost:?}");
    let bare = key.trim_matches('"');
    assert!(!debug.contains(bare), "not in Debug: {debug}");
    assert!(
        debug.contains(&idempotency_core::fingerprint::short_hash(bare)),
        "its hash: {debug}"
    );
    let response = once
        .post(server.url("/payments"))
        .header("idempotency-key", &key)
        .header("content-type", "application/json")
        .body(r#"{"amount":10}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::CREATED);
    assert!(response.is_replay(), "the first attempt had paid");
    assert_eq!(server.payments().await, 1);
}

/// reqwest writes the URL into its errors; the query may carry a credential. The failures
/// the client lists and logs leave it out (before: `…for url (http://…/x?api_key=s3cr3t)`).
#[tokio::test]
async fn a_failed_attempt_does_not_show_the_query() {
    let closed = support::closed_port().await;
    let client = client(IdempotencyMiddleware::new().retry_policy(fast().max_attempts(2)));
    let failed = error(
        client
            .post(format!("http://{closed}/x?api_key=s3cr3t#frag"))
            .send()
            .await,
    );
    assert!(matches!(failed, Error::Exhausted { .. }), "{failed:?}");
    for text in [failed.to_string(), format!("{failed:?}")] {
        assert!(!text.contains("s3cr3t"), "{text}");
        assert!(!text.contains("frag"), "{text}");
    }
    assert!(failed.to_string().contains("/x"), "{failed}");
}
