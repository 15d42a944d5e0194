//! [`Error`]: why a request did not get an answer worth returning.

use std::fmt;
use std::time::Duration;

use reqwest::StatusCode;
use reqwest::header::HeaderMap;

/// What went wrong, and what the caller should do about it.
///
/// The middleware returns it inside [`reqwest_middleware::Error::Middleware`]; get it back
/// with [`Error::from_middleware`].
///
/// ```
/// use idempotency_client::{Cause, Error, Failure, GiveUp};
/// use reqwest::StatusCode;
///
/// let error = Error::Exhausted {
///     key: "\"0193-k\"".into(),
///     reason: GiveUp::MaxAttempts(2),
///     attempts: vec![
///         Failure::new(1, Cause::Status { status: StatusCode::BAD_GATEWAY, retry_after: None }),
///         Failure::new(2, Cause::Status { status: StatusCode::SERVICE_UNAVAILABLE, retry_after: None }),
///     ],
/// };
/// assert_eq!(
///     error.to_string(),
///     "gave up after 2 attempt(s) (2 attempts made, the maximum): \
///      #1 502 Bad Gateway; #2 503 Service Unavailable"
/// );
/// // The request may have run (an answer lost after the server committed): send it again
/// // later with the same key, never with a new one.
/// assert_eq!(error.key(), Some("\"0193-k\""));
/// ```
#[derive(thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The server refused the request itself, before anything ran: a `400` or `422` problem
    /// document whose `type` is a refusal of the server contract (`idempotency-key-missing`,
    /// `idempotency-key-invalid`, `idempotency-key-reused`, `invalid-request-body`,
    /// `invalid-request-query`, `invalid-request-path`, `scope-invalid`).
    /// Not retried. A `422 idempotency-key-reused` says the server holds another request under
    /// this key, which may have run: if this request is a retry of that one (its body rebuilt
    /// with a field that changed, a timestamp), send that request's body again with this key,
    /// never this one with a new key, or the operation may run twice; only a new request takes
    /// a new key (a request that names an [`Operation`](crate::Operation) gets the key its
    /// [`KeyStore`](crate::KeyStore) keeps: [`forget`](crate::KeyStore::forget) the operation
    /// first). The other refusals say nothing ran: fix the request and send it with a new
    /// key. Any other `400` or `422`
    /// (a business rejection the server stored) is the request's outcome, returned as a
    /// response like its replay.
    #[error("the server refused the request with {status} at attempt {attempt}, not retried: {}", hint(*.status))]
    Refused {
        /// The `Idempotency-Key` header value it was sent with.
        key: String,
        /// `400` or `422`.
        status: StatusCode,
        /// The attempt that got it (a retry can get it when the first attempt's answer was lost).
        attempt: u32,
        /// The answer's headers.
        headers: HeaderMap,
        /// The answer's body (at most 64 KiB of it), often an RFC 9457 problem.
        body: Vec<u8>,
    },
    /// Every attempt the budget allowed failed.
    #[error("gave up after {} attempt(s) ({reason}): {}", .attempts.len(), Listed(.attempts))]
    Exhausted {
        /// The `Idempotency-Key` header value every attempt was sent with: the request may
        /// have run (an answer lost after the server committed), so send it again with this
        /// key, never with a new one.
        key: String,
        /// The budget that ran out.
        reason: GiveUp,
        /// Each attempt and why it failed, in order.
        attempts: Vec<Failure>,
    },
    /// After an attempt was sent (and may have run), a later one failed with an error the
    /// middleware does not retry: another middleware's (placed after this one), or reqwest's
    /// own (a redirect it refused). Returned at once, with the key: send the request again
    /// with it, never with a new one. The same error on the first attempt passes through
    /// unchanged.
    #[error(
        "attempt {attempt} failed with an error that is not retried, after: {}",
        Listed(.earlier)
    )]
    Interrupted {
        /// The `Idempotency-Key` header value every attempt was sent with.
        key: String,
        /// The attempt that failed (2 or more).
        attempt: u32,
        /// The earlier attempts, in order, and why each failed.
        earlier: Vec<Failure>,
        /// What failed (a reqwest error's URL without its query; another middleware's error
        /// as it gave it).
        #[source]
        source: reqwest_middleware::Error,
    },
    /// The request's body is a stream that cannot be sent twice: it was sent once and failed.
    #[error(
        "the request body is a stream that cannot be cloned, so it was sent once and not retried; it failed with {failure}"
    )]
    NotReplayable {
        /// The `Idempotency-Key` header value it was sent with: send the request again (with
        /// a body that can be cloned) with this key.
        key: String,
        /// The one attempt.
        failure: Failure,
    },
    /// The request names an [`Operation`](crate::Operation) but the middleware has no
    /// [`KeyStore`](crate::KeyStore): its key would not survive a restart. Not sent.
    #[error(
        "the request names operation {operation:?} but the middleware has no key store; not sent"
    )]
    NoKeyStore {
        /// The operation id.
        operation: String,
    },
    /// The [`KeyStore`](crate::KeyStore) failed. Not sent.
    #[error(transparent)]
    KeyStore(#[from] crate::KeyStoreError),
    /// The generated key cannot be written in the configured format.
    #[error(
        "the idempotency key {key:?} is not one a server accepts: empty, longer than 255, a \
         character other than visible ASCII, or, bare, a `,`, `;` or `\"`"
    )]
    InvalidKey {
        /// The key as generated.
        key: String,
    },
}

impl Error {
    /// This crate's error inside a middleware error, if it is one.
    ///
    /// ```
    /// use idempotency_client::Error;
    ///
    /// let wrapped = reqwest_middleware::Error::middleware(Error::InvalidKey { key: String::new() });
    /// assert!(matches!(Error::from_middleware(&wrapped), Some(Error::InvalidKey { .. })));
    /// ```
    pub fn from_middleware(error: &reqwest_middleware::Error) -> Option<&Self> {
        match error {
            reqwest_middleware::Error::Middleware(inner) => inner.downcast_ref(),
            reqwest_middleware::Error::Reqwest(_) => None,
        }
    }

    /// The `Idempotency-Key` header value the request was sent with, when it was sent: a
    /// request that may have run must be sent again with it (never with a new key), or its
    /// operation may run twice. `None` when nothing was sent.
    pub fn key(&self) -> Option<&str> {
        match self {
            Self::Refused { key, .. }
            | Self::Exhausted { key, .. }
            | Self::Interrupted { key, .. }
            | Self::NotReplayable { key, .. } => Some(key),
            Self::InvalidKey { .. } | Self::NoKeyStore { .. } | Self::KeyStore(_) => None,
        }
    }

    /// The number of attempts made before this error.
    pub fn attempts(&self) -> u32 {
        match self {
            Self::Refused { attempt, .. } | Self::Interrupted { attempt, .. } => *attempt,
            Self::Exhausted { attempts, .. } => u32::try_from(attempts.len()).unwrap_or(u32::MAX),
            Self::NotReplayable { .. } => 1,
            Self::InvalidKey { .. } | Self::NoKeyStore { .. } | Self::KeyStore(_) => 0,
        }
    }
}

/// The key of a sent request stands for a credential of a kind: `Debug` shows its short hash
/// (the span's `idempotency_key_hash`), never the key; [`Error::key`] gives it back.
impl fmt::Debug for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let hash = |key: &str| crate::middleware::key_hash(key);
        match self {
            Self::Refused {
                key,
                status,
                attempt,
                headers,
                body,
            } => f
                .debug_struct("Refused")
                .field("key_hash", &hash(key))
                .field("status", status)
                .field("attempt", attempt)
                .field("headers", &Headers(headers))
                .field("body", &String::from_utf8_lossy(body))
                .finish(),
            Self::Interrupted {
                key,
                attempt,
                earlier,
                source,
            } => f
                .debug_struct("Interrupted")
                .field("key_hash", &hash(key))
                .field("attempt", attempt)
                .field("earlier", earlier)
                .field("source", source)
                .finish(),
            Self::Exhausted {
                key,
                reason,
                attempts,
            } => f
                .debug_struct("Exhausted")
                .field("key_hash", &hash(key))
                .field("reason", reason)
                .field("attempts", attempts)
                .finish(),
            Self::NotReplayable { key, failure } => f
                .debug_struct("NotReplayable")
                .field("key_hash", &hash(key))
                .field("failure", failure)
                .finish(),
            Self::NoKeyStore { operation } => f
                .debug_struct("NoKeyStore")
                .field("operation", operation)
                .finish(),
            Self::KeyStore(e) => f.debug_tuple("KeyStore").field(e).finish(),
            Self::InvalidKey { key } => f.debug_struct("InvalidKey").field("key", key).finish(),
        }
    }
}

/// An answer's headers for `Debug`: the value of one that may carry a credential (a cookie
/// the server sets, an authorization, a name with `auth`, `token`, `key`, `secret` or
/// `session` in it) is hidden.
struct Headers<'a>(&'a HeaderMap);

impl fmt::Debug for Headers<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use reqwest::header::{AUTHORIZATION, COOKIE, PROXY_AUTHORIZATION, SET_COOKIE};
        f.debug_map()
            .entries(self.0.iter().map(|(name, value)| {
                let hidden = [SET_COOKIE, COOKIE, AUTHORIZATION, PROXY_AUTHORIZATION]
                    .contains(name)
                    || ["auth", "token", "key", "secret", "session"]
                        .iter()
                        .any(|part| name.as_str().contains(part))
                    || value.is_sensitive();
                let value: &dyn fmt::Debug = if hidden { &"<redacted>" } else { value };
                (name, value)
            }))
            .finish()
    }
}

fn hint(status: StatusCode) -> &'static str {
    if status == StatusCode::UNPROCESSABLE_ENTITY {
        "the key was already used for a different request (or the request is invalid); if this is a retry of that request, send its body again with the same key, as a new key may run it twice; a new request takes a new key"
    } else {
        "the request is malformed; fix it and send it with a new key"
    }
}

struct Listed<'a>(&'a [Failure]);

impl fmt::Display for Listed<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, failure) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            write!(f, "{failure}")?;
        }
        Ok(())
    }
}

/// Which budget of the [`RetryPolicy`](crate::RetryPolicy) ran out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum GiveUp {
    /// This many attempts were made, the configured maximum.
    MaxAttempts(u32),
    /// The next retry would have started after the maximum elapsed time.
    MaxElapsed(Duration),
    /// The server asked for a wait longer than the configured bound.
    RetryAfterTooLong {
        /// The server's `Retry-After`.
        retry_after: Duration,
        /// The bound.
        bound: Duration,
    },
}

impl fmt::Display for GiveUp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::MaxAttempts(n) => write!(f, "{n} attempts made, the maximum"),
            Self::MaxElapsed(budget) => {
                write!(f, "the next retry would start after the {budget:?} budget")
            }
            Self::RetryAfterTooLong { retry_after, bound } => write!(
                f,
                "the server asked to wait {retry_after:?}, more than the {bound:?} bound"
            ),
        }
    }
}

/// One failed attempt.
#[derive(Debug)]
#[non_exhaustive]
pub struct Failure {
    /// 1 for the first attempt.
    pub attempt: u32,
    /// Why it failed.
    pub cause: Cause,
}

impl Failure {
    /// Attempt `attempt` failed with `cause`.
    pub fn new(attempt: u32, cause: Cause) -> Self {
        Self { attempt, cause }
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "#{} {}", self.attempt, self.cause)
    }
}

/// Why an attempt failed in a way worth retrying.
#[derive(Debug)]
#[non_exhaustive]
pub enum Cause {
    /// A retried status (`5xx`, `409`, `429` by default).
    Status {
        /// The answer's status.
        status: StatusCode,
        /// Its `Retry-After`, when it had one the client could read.
        retry_after: Option<Duration>,
    },
    /// The attempt timed out (reqwest's timeouts).
    Timeout(reqwest::Error),
    /// The connection failed or closed before a whole answer came back, or the body of a
    /// `400`/`422` problem document could not be read or decoded to its end.
    Connection(reqwest::Error),
}

impl Cause {
    /// A short label: `timeout`, `connection` or the status code (the metrics' `cause`).
    pub fn label(&self) -> String {
        match self {
            Self::Status { status, .. } => status.as_str().to_owned(),
            Self::Timeout(_) => "timeout".to_owned(),
            Self::Connection(_) => "connection".to_owned(),
        }
    }
}

impl fmt::Display for Cause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Status {
                status,
                retry_after: Some(wait),
            } => write!(f, "{status} (Retry-After {wait:?})"),
            Self::Status { status, .. } => write!(f, "{status}"),
            Self::Timeout(e) => write!(f, "timeout: {}", Chain(e)),
            Self::Connection(e) => write!(f, "connection error: {}", Chain(e)),
        }
    }
}

/// An error and its sources, `: `-separated (reqwest's own message omits the cause).
struct Chain<'a>(&'a reqwest::Error);

impl fmt::Display for Chain<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)?;
        let mut source = std::error::Error::source(self.0);
        while let Some(cause) = source {
            write!(f, ": {cause}")?;
            source = cause.source();
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use reqwest::header::{HeaderValue, SET_COOKIE};

    /// `Debug` of a refusal shows the answer's headers, not a cookie the server set.
    #[test]
    fn debug_hides_a_cookie_the_server_set() {
        let mut headers = HeaderMap::new();
        headers.insert(SET_COOKIE, HeaderValue::from_static("sid=s3cr3t"));
        headers.insert("x-request-id", HeaderValue::from_static("r-1"));
        headers.insert("x-api-key", HeaderValue::from_static("s3cr3t-key"));
        let error = Error::Refused {
            key: "\"k\"".into(),
            status: StatusCode::BAD_REQUEST,
            attempt: 1,
            headers,
            body: b"{}".to_vec(),
        };
        let debug = format!("{error:?}");
        assert!(!debug.contains("s3cr3t"), "{debug}");
        assert!(
            debug.contains("set-cookie") && debug.contains("r-1"),
            "{debug}"
        );
    }

    /// A reused key's hint never tells a retry to take a new key.
    #[test]
    fn a_reused_key_is_not_told_to_take_a_new_key_for_a_retry() {
        let hint = hint(StatusCode::UNPROCESSABLE_ENTITY);
        assert!(
            hint.contains("send its body again with the same key"),
            "{hint}"
        );
    }
}
