//! The client side of the idempotency crates: a [`reqwest_middleware`] middleware that makes
//! retries safe.
//!
//! [`IdempotencyMiddleware`] gives each request of the configured methods (POST, PUT, PATCH
//! and DELETE by default) one `Idempotency-Key` (a UUID v7, the caller's generator, or the caller's own
//! header) and sends that same key on every retry, so a server that implements the IETF
//! draft (such as [`idempotency-axum`](https://docs.rs/idempotency-axum)'s `IdempotencyLayer`)
//! runs the request at most once and replays its answer to the retries.
//!
//! - Retried: connection errors, timeouts, `5xx`, `409` and `429`, with exponential backoff
//!   and jitter or the answer's `Retry-After` (any retried status) up to a bound, within a
//!   number of attempts and a time budget ([`RetryPolicy`]).
//! - Never retried: `400` and `422` (but one whose problem document could not be read to
//!   its end, a lost connection's or a timeout's, and a `400 body-unreadable`, are sent again with the same key). A refusal of the request itself (a reused key, a body, query
//!   or path the server could not take: the problem types [`Error::Refused`] lists; a `413`
//!   or `415` is an ordinary response) is [`Error::Refused`]: the request must change (a
//!   reused key: unless this is a retry of the request the key was used for, whose body must
//!   then be sent again with it); any other (a business rejection) is returned as the
//!   response, as its replay would be. A streamed body is sent once
//!   ([`Error::NotReplayable`] when it fails); an error that is not retried, on a later
//!   attempt than the first, is [`Error::Interrupted`], with the key.
//! - The response carries a [`Delivery`]: the key, the attempts, whether the server replayed a
//!   stored answer (`Idempotent-Replayed: true`). A budget that runs out is
//!   [`Error::Exhausted`], with every attempt and its cause.
//! - Metrics through the `metrics` facade: `idempotency_client_attempts_total{method}`,
//!   `idempotency_client_retries_total{cause}` (`timeout`, `connection` or the status code),
//!   `idempotency_client_replays_total`, `idempotency_client_gave_up_total`; a tracing span
//!   `idempotency_client.attempt` per attempt.
//! - Durable keys: a request that names an [`Operation`] gets the key a [`KeyStore`] keeps for
//!   it, so a caller restarted mid-operation sends the same key again ([`MemoryKeyStore`];
//!   `SqliteKeyStore` and `PgKeyStore` with the features `sqlite` and `postgres`).
//!
//! ```
//! use idempotency_client::{IdempotencyMiddleware, RetryPolicy};
//! use std::time::Duration;
//!
//! let client = reqwest_middleware::ClientBuilder::new(
//!     reqwest::Client::builder().timeout(Duration::from_secs(5)).build().unwrap(),
//! )
//! .with(IdempotencyMiddleware::new().retry_policy(RetryPolicy::default().max_attempts(5)))
//! .build();
//! # let _ = client;
//! ```

#![cfg_attr(docsrs, feature(doc_cfg))]

mod answer;
mod delivery;
mod durable;
mod error;
mod key;
mod middleware;
mod policy;
#[cfg(any(feature = "sqlite", feature = "postgres"))]
mod sql;

pub use delivery::{Delivery, ResponseExt};
pub use durable::{KeyStore, KeyStoreError, MemoryKeyStore, Operation};
pub use error::{Cause, Error, Failure, GiveUp};
pub use key::{KeyFormat, KeyGenerator, MAX_KEY_LEN};
pub use middleware::{IDEMPOTENCY_KEY, IDEMPOTENT_REPLAYED, IdempotencyMiddleware};
pub use policy::RetryPolicy;
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub use sql::KEYS_TABLE;
#[cfg(feature = "postgres")]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
pub use sql::PgKeyStore;
#[cfg(feature = "sqlite")]
#[cfg_attr(docsrs, doc(cfg(feature = "sqlite")))]
pub use sql::SqliteKeyStore;
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub use sqlx;

pub use reqwest;
pub use reqwest_middleware;

/// The README's example, compiled as a doctest.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
