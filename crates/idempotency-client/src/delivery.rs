//! [`Delivery`]: what the middleware tells about a response it returns.

/// How a response was obtained, in the response's extensions.
///
/// ```
/// use idempotency_client::{Delivery, ResponseExt};
///
/// let mut response = reqwest::Response::from(http::Response::new(""));
/// assert_eq!(response.delivery(), None);
/// response.extensions_mut().insert(Delivery { key: "\"k\"".into(), attempts: 2, replayed: true });
/// assert!(response.is_replay());
/// assert_eq!(response.delivery().unwrap().attempts, 2);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delivery {
    /// The `Idempotency-Key` header value sent on every attempt.
    pub key: String,
    /// Attempts made, this one included.
    pub attempts: u32,
    /// Whether the server said this answer is a replay of a stored one
    /// (`Idempotent-Replayed: true`): the request had already run, on an earlier attempt or an
    /// earlier request with the same key.
    pub replayed: bool,
}

/// Reads the [`Delivery`] of a response the middleware returned.
pub trait ResponseExt {
    /// The delivery, `None` for a request the middleware did not handle.
    fn delivery(&self) -> Option<&Delivery>;

    /// Whether the answer is a replay.
    fn is_replay(&self) -> bool {
        self.delivery().is_some_and(|d| d.replayed)
    }
}

impl ResponseExt for reqwest::Response {
    fn delivery(&self) -> Option<&Delivery> {
        self.extensions().get()
    }
}
