//! [`IdempotencyMiddleware`]: one key per logical request, kept on every retry.

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use http::Extensions;
use reqwest::header::{HeaderMap, HeaderName, HeaderValue};
use reqwest::{Method, Request, Response, StatusCode};
use reqwest_middleware::{Next, Result};
use tracing::Instrument;

use crate::answer::{Judged, delivered, judged, retry_after};
use crate::durable::DynKeyStore;
use crate::{
    Cause, Error, Failure, GiveUp, KeyFormat, KeyGenerator, KeyStore, Operation, RetryPolicy,
};

/// The `Idempotency-Key` header.
pub const IDEMPOTENCY_KEY: HeaderName = HeaderName::from_static("idempotency-key");
/// The header a server sets on a replayed answer (`Idempotent-Replayed: true`).
pub const IDEMPOTENT_REPLAYED: HeaderName = HeaderName::from_static("idempotent-replayed");

/// A [`reqwest_middleware::Middleware`] that gives each request of the configured methods (and
/// each request with an [`Operation`]) an `Idempotency-Key` (or keeps the caller's) and
/// retries it with that same key.
///
/// Requests of other methods pass through untouched. The returned response carries a
/// [`Delivery`](crate::Delivery) (read it with [`ResponseExt`](crate::ResponseExt)): the key, the attempts,
/// whether the server replayed a stored answer.
///
/// ```no_run
/// use idempotency_client::{IdempotencyMiddleware, ResponseExt, RetryPolicy};
///
/// # async fn demo() -> Result<(), reqwest_middleware::Error> {
/// let client = reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
///     .with(IdempotencyMiddleware::new().retry_policy(RetryPolicy::default().max_attempts(5)))
///     .build();
/// let response = client
///     .post("http://127.0.0.1:3000/payments")
///     .header("content-type", "application/json")
///     .body(r#"{"order_id":"o-1","amount_cents":4900}"#)
///     .send()
///     .await?;
/// let delivery = response.delivery().expect("a POST goes through the middleware");
/// println!("{} after {} attempt(s), replayed: {}", response.status(), delivery.attempts, delivery.replayed);
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct IdempotencyMiddleware {
    methods: Vec<Method>,
    format: KeyFormat,
    keys: KeyGenerator,
    policy: RetryPolicy,
    replay_headers: Vec<HeaderName>,
    store: Option<SharedKeyStore>,
}

/// The key generated for a send, in its extensions (see [`IdempotencyMiddleware::key`]), with
/// the digest of the request it was made for: extensions a caller passes to two different
/// requests never give the second the first's key.
#[derive(Debug, Clone)]
struct Generated {
    value: HeaderValue,
    request: [u8; 32],
}

/// The SHA-256 of a request's method, URL and body bytes; `None` for a streamed body (sent
/// once, never again).
fn request_digest(request: &Request) -> Option<[u8; 32]> {
    use sha2::Digest;
    let body = match request.body() {
        None => &[][..],
        Some(body) => body.as_bytes()?,
    };
    let mut digest = sha2::Sha256::new();
    for part in [
        request.method().as_str().as_bytes(),
        request.url().as_str().as_bytes(),
        body,
    ] {
        digest.update(u64::try_from(part.len()).unwrap_or(u64::MAX).to_be_bytes());
        digest.update(part);
    }
    Some(digest.finalize().into())
}

/// The configured [`KeyStore`], shared by the clones of the middleware.
#[derive(Clone)]
struct SharedKeyStore(Arc<dyn DynKeyStore>);

impl fmt::Debug for SharedKeyStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("KeyStore(..)")
    }
}

impl Default for IdempotencyMiddleware {
    fn default() -> Self {
        Self::new()
    }
}

impl IdempotencyMiddleware {
    /// POST, PUT, PATCH and DELETE (the methods the idempotency layer of a server keys by
    /// default), UUID v7 keys as sf-strings, [`RetryPolicy::default`], replays read from
    /// `Idempotent-Replayed`.
    ///
    /// ```
    /// use idempotency_client::{IdempotencyMiddleware, KeyFormat, KeyGenerator};
    ///
    /// let middleware = IdempotencyMiddleware::new()
    ///     .methods([reqwest::Method::POST, reqwest::Method::PUT])
    ///     .key_format(KeyFormat::Bare)
    ///     .key_generator(KeyGenerator::new(|| "job-7".to_owned()))
    ///     .replay_header(reqwest::header::HeaderName::from_static("x-idempotent-replayed"));
    /// # let _ = middleware;
    /// ```
    pub fn new() -> Self {
        Self {
            methods: vec![Method::POST, Method::PUT, Method::PATCH, Method::DELETE],
            format: KeyFormat::default(),
            keys: KeyGenerator::default(),
            policy: RetryPolicy::default(),
            replay_headers: vec![IDEMPOTENT_REPLAYED],
            store: None,
        }
    }

    /// The methods that get a key and retries (instead of POST, PUT, PATCH and DELETE). A
    /// request with an [`Operation`] gets them whatever its method.
    #[must_use]
    pub fn methods(mut self, methods: impl IntoIterator<Item = Method>) -> Self {
        self.methods = methods.into_iter().collect();
        self
    }

    /// How a generated key is written.
    #[must_use]
    pub fn key_format(mut self, format: KeyFormat) -> Self {
        self.format = format;
        self
    }

    /// Where keys come from.
    #[must_use]
    pub fn key_generator(mut self, keys: KeyGenerator) -> Self {
        self.keys = keys;
        self
    }

    /// When to retry.
    #[must_use]
    pub fn retry_policy(mut self, policy: RetryPolicy) -> Self {
        self.policy = policy;
        self
    }

    /// Another header whose value `true` marks a replay (besides `Idempotent-Replayed`).
    #[must_use]
    pub fn replay_header(mut self, name: HeaderName) -> Self {
        self.replay_headers.push(name);
        self
    }

    /// Durable keys: a request with an [`Operation`] extension is sent with the key `store`
    /// holds for it (the header value, stored on the operation's first request).
    ///
    /// ```
    /// use idempotency_client::{IdempotencyMiddleware, MemoryKeyStore, Operation};
    ///
    /// let client = reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
    ///     .with(IdempotencyMiddleware::new().key_store(MemoryKeyStore::default()))
    ///     .build();
    /// let request = client
    ///     .post("http://127.0.0.1:8080/api/payments")
    ///     .with_extension(Operation::new("payout-42"));
    /// # let _ = request;
    /// ```
    #[must_use]
    pub fn key_store(mut self, store: impl KeyStore) -> Self {
        self.store = Some(SharedKeyStore(Arc::new(store)));
        self
    }

    /// The request's key header value: the caller's, the one stored for its operation, the
    /// one generated for this send before, or a new one.
    ///
    /// A generated key is kept in the send's extensions: a retrying middleware placed before
    /// this one (reqwest-retry's) runs it again with the same extensions, and its retries get
    /// the same key, not one each.
    async fn key(
        &self,
        request: &mut Request,
        extensions: &mut Extensions,
    ) -> std::result::Result<String, Error> {
        if let Some(own) = request.headers().get(&IDEMPOTENCY_KEY) {
            return Ok(String::from_utf8_lossy(own.as_bytes()).into_owned());
        }
        // Only a key of no operation's is kept in the extensions: an operation's is the store's.
        let digest = extensions
            .get::<Operation>()
            .is_none()
            .then(|| request_digest(request))
            .flatten();
        if let Some(generated) = extensions.get::<Generated>()
            && digest == Some(generated.request)
        {
            let value = generated.value.clone();
            let key = String::from_utf8_lossy(value.as_bytes()).into_owned();
            request.headers_mut().insert(IDEMPOTENCY_KEY, value);
            return Ok(key);
        }
        let value = self.format.header_value(&self.keys.generate())?;
        let fresh = String::from_utf8_lossy(value.as_bytes()).into_owned();
        let Some(operation) = extensions.get::<Operation>() else {
            if let Some(request) = digest {
                extensions.insert(Generated {
                    value: value.clone(),
                    request,
                });
            }
            request.headers_mut().insert(IDEMPOTENCY_KEY, value);
            return Ok(fresh);
        };
        let Some(store) = &self.store else {
            return Err(Error::NoKeyStore {
                operation: operation.as_str().to_owned(),
            });
        };
        let key = store.0.key_for(operation.as_str(), &fresh).await?;
        let value =
            HeaderValue::from_str(&key).map_err(|_| Error::InvalidKey { key: key.clone() })?;
        request.headers_mut().insert(IDEMPOTENCY_KEY, value);
        Ok(key)
    }

    fn is_replay(&self, headers: &HeaderMap) -> bool {
        self.replay_headers.iter().any(|name| {
            headers
                .get(name)
                .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"true"))
        })
    }

    /// The wait before the next attempt, or why there is none.
    fn wait(
        &self,
        cause: &Cause,
        retries: u32,
        started: Instant,
    ) -> std::result::Result<Duration, GiveUp> {
        if retries + 1 >= self.policy.attempts() {
            return Err(GiveUp::MaxAttempts(retries + 1));
        }
        let wait = match cause {
            Cause::Status {
                retry_after: Some(retry_after),
                ..
            } => {
                let bound = self.policy.retry_after_bound();
                if *retry_after > bound {
                    return Err(GiveUp::RetryAfterTooLong {
                        retry_after: *retry_after,
                        bound,
                    });
                }
                *retry_after
            }
            _ => self.policy.backoff(retries + 1),
        };
        let budget = self.policy.elapsed_budget();
        if started.elapsed().saturating_add(wait) > budget {
            return Err(GiveUp::MaxElapsed(budget));
        }
        Ok(wait)
    }

    /// Runs the attempts of one logical request.
    async fn send(
        &self,
        mut request: Request,
        extensions: &mut Extensions,
        next: Next<'_>,
    ) -> Result<Response> {
        let key = self
            .key(&mut request, extensions)
            .await
            .map_err(reqwest_middleware::Error::middleware)?;
        let method = request.method().as_str().to_owned();
        let started = Instant::now();
        let mut failures = Vec::new();
        let mut attempt = 0u32;
        loop {
            attempt += 1;
            let spare = request.try_clone();
            let span = tracing::info_span!(
                "idempotency_client.attempt",
                attempt,
                method = %method,
                // no query: it may carry credentials
                host = request.url().host_str().unwrap_or_default(),
                path = request.url().path(),
                // the key stands for a credential of a kind: its short hash, the one the
                // server's spans carry (`idempotency.key_hash`), never the key
                idempotency_key_hash = %key_hash(&key),
                status = tracing::field::Empty,
            );
            metrics::counter!("idempotency_client_attempts_total", "method" => method.clone())
                .increment(1);
            let result = next
                .clone()
                .run(request, extensions)
                .instrument(span.clone())
                .await;
            let cause = match result {
                Ok(response) => {
                    let status = response.status();
                    span.record("status", status.as_u16());
                    if self.is_replay(response.headers()) {
                        // A stored answer: the request ran once; sending it again changes nothing.
                        metrics::counter!("idempotency_client_replays_total").increment(1);
                        return Ok(delivered(response, key, attempt, true));
                    }
                    if matches!(
                        status,
                        StatusCode::BAD_REQUEST | StatusCode::UNPROCESSABLE_ENTITY
                    ) {
                        match judged(response, key.clone(), attempt).await {
                            Judged::Outcome(response) => return Ok(response),
                            Judged::Transient => Cause::Status {
                                status,
                                retry_after: None,
                            },
                            Judged::Refused(error) => {
                                return Err(reqwest_middleware::Error::middleware(error));
                            }
                            // Cut off: retried with the same key, which meets it again or its
                            // replay. reqwest reports every failed body read as a decode
                            // error, a lost connection's included, so none is told apart: a
                            // body that truly cannot be decoded is retried the same way (its
                            // replay, or `Exhausted` with the key).
                            Judged::Unread(e) if e.is_timeout() => Cause::Timeout(without_query(e)),
                            Judged::Unread(e) => Cause::Connection(without_query(e)),
                        }
                    } else if !self.policy.retries(status) {
                        return Ok(delivered(response, key, attempt, false));
                    } else {
                        Cause::Status {
                            status,
                            retry_after: retry_after(response.headers()),
                        }
                    }
                }
                Err(reqwest_middleware::Error::Reqwest(e)) if e.is_timeout() => {
                    Cause::Timeout(without_query(e))
                }
                Err(reqwest_middleware::Error::Reqwest(e)) if e.is_connect() || e.is_request() => {
                    Cause::Connection(without_query(e))
                }
                // Sent before (and maybe run): the caller needs the key to send it again.
                Err(other) if attempt > 1 => {
                    let source = match other {
                        reqwest_middleware::Error::Reqwest(e) => {
                            reqwest_middleware::Error::Reqwest(without_query(e))
                        }
                        other => other,
                    };
                    let error = Error::Interrupted {
                        key,
                        attempt,
                        earlier: failures,
                        source,
                    };
                    // Not the error's text: another middleware's may hold the URL's query.
                    tracing::warn!(
                        attempt,
                        "idempotent request failed with an error that is not retried"
                    );
                    return Err(reqwest_middleware::Error::middleware(error));
                }
                Err(other) => return Err(other),
            };
            let label = cause.label();
            let failure = Failure::new(attempt, cause);
            let Some(again) = spare else {
                tracing::warn!(%failure, "idempotent request failed; its streamed body cannot be sent again");
                return Err(reqwest_middleware::Error::middleware(
                    Error::NotReplayable { key, failure },
                ));
            };
            let wait = self.wait(&failure.cause, attempt - 1, started);
            failures.push(failure);
            let wait = match wait {
                Ok(wait) => wait,
                Err(reason) => {
                    metrics::counter!("idempotency_client_gave_up_total").increment(1);
                    let error = Error::Exhausted {
                        key,
                        reason,
                        attempts: failures,
                    };
                    tracing::warn!(%error, "idempotent request gave up");
                    return Err(reqwest_middleware::Error::middleware(error));
                }
            };
            metrics::counter!("idempotency_client_retries_total", "cause" => label.clone())
                .increment(1);
            tracing::info!(cause = %label, ?wait, attempt, "retrying with the same idempotency key");
            tokio::time::sleep(wait).await;
            request = again;
        }
    }
}

#[async_trait::async_trait]
impl reqwest_middleware::Middleware for IdempotencyMiddleware {
    async fn handle(
        &self,
        request: Request,
        extensions: &mut Extensions,
        next: Next<'_>,
    ) -> Result<Response> {
        if !self.methods.contains(request.method()) && extensions.get::<Operation>().is_none() {
            return next.run(request, extensions).await;
        }
        self.send(request, extensions, next).await
    }
}

/// `error` without its URL's query and fragment: reqwest writes the URL into its message, and
/// a query may carry credentials (the failures are logged and shown in [`Error`]'s text).
fn without_query(mut error: reqwest::Error) -> reqwest::Error {
    if let Some(url) = error.url_mut() {
        url.set_query(None);
        url.set_fragment(None);
    }
    error
}

/// The short hash of a key header value: the first 8 bytes of the SHA-256 of the key (trimmed,
/// an sf-string's content unquoted), in hex, as the server's spans write it (a server that
/// normalizes keys further, such as UUIDs to lower case, hashes what it normalized).
pub(crate) fn key_hash(value: &str) -> String {
    use sha2::Digest;
    let value = value.trim_matches([' ', '\t']);
    let key = match value
        .strip_prefix('"')
        .and_then(|inner| inner.strip_suffix('"'))
    {
        Some(inner) => {
            let mut key = String::with_capacity(inner.len());
            let mut chars = inner.chars();
            while let Some(c) = chars.next() {
                key.push(if c == '\\' {
                    chars.next().unwrap_or(c)
                } else {
                    c
                });
            }
            key
        }
        None => value.to_owned(),
    };
    let digest = sha2::Sha256::digest(key.as_bytes());
    digest[..8].iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn the_key_hash_is_the_servers_for_both_formats() {
        let hash = key_hash("k-1");
        assert_eq!(hash, idempotency_core::fingerprint::short_hash("k-1"));
        assert_eq!(key_hash("\"k-1\""), hash);
        assert_eq!(key_hash(" \"k-1\"\t"), hash);
        assert_eq!(key_hash(r#""a\"b""#), key_hash(r#"a"b"#));
        assert_ne!(key_hash("k-2"), hash);
    }

    #[test]
    fn a_huge_retry_after_ends_the_retries_without_overflow() {
        let middleware = IdempotencyMiddleware::new()
            .retry_policy(RetryPolicy::default().max_retry_after(Duration::MAX));
        let cause = Cause::Status {
            status: StatusCode::SERVICE_UNAVAILABLE,
            retry_after: Some(Duration::MAX),
        };
        let started = Instant::now().checked_sub(Duration::from_secs(2)).unwrap();
        assert!(matches!(
            middleware.wait(&cause, 0, started),
            Err(GiveUp::MaxElapsed(_))
        ));
        let bounded = IdempotencyMiddleware::new();
        assert!(matches!(
            bounded.wait(&cause, 0, started),
            Err(GiveUp::RetryAfterTooLong { .. })
        ));
    }
}
