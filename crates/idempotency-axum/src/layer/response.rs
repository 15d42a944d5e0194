//! The response side: whether a response can be stored, and its stored form.

use axum::body::{Body, Bytes, HttpBody};
use axum::response::Response;
use idempotency_core::ResultSerializer;
use idempotency_core::cache::{DistributedCache, LocalCache};
use idempotency_core::{IdempotencyMetrics, IdempotencyStore, StoredOutcome};

use super::Shared;
use super::replay::Keyed;
use crate::error::Error;
use crate::problem::RefusedRequest;
use crate::stored::StoredResponse;

impl<S, L, D, M, Z> Shared<S, L, D, M, Z>
where
    S: IdempotencyStore,
    L: LocalCache,
    D: DistributedCache,
    M: IdempotencyMetrics,
    Z: ResultSerializer,
{
    /// Whether `response` is stored: a status [`StoredStatuses`](super::StoredStatuses)
    /// stores, unless the request never executed. A request refused by the handler's
    /// extractors stores nothing, so the corrected retry runs: a problem that refuses the body
    /// (`ProblemJson`'s rejections, `400 invalid-request-body`, `413`, `415`), the query
    /// (`ProblemQuery`'s `400 invalid-request-query`) or a path parameter (`ProblemPath`'s
    /// `400 invalid-request-path`), or any 4xx to a body declared JSON that does not parse
    /// (axum's `Json` refuses it as plain text).
    pub(super) fn stores(&self, keyed: Option<&Keyed>, response: &Response) -> bool {
        let status = response.status();
        if !self.settings.statuses.stores(status) {
            return false;
        }
        let refused = response.extensions().get::<RefusedRequest>().is_some()
            || (status.is_client_error() && keyed.is_some_and(|k| k.malformed_json));
        if refused {
            tracing::debug!(%status, "the request was refused before the handler ran; not stored");
        }
        !refused
    }

    /// The whole response body, when it can be stored: an exact length within the limit.
    /// Otherwise why not, and the body when it was not consumed.
    pub(super) async fn capture(&self, body: Body) -> Result<Bytes, Unstorable> {
        let max = self.settings.max_response_body;
        match body.size_hint().exact() {
            None => return Err(Unstorable::new("streaming", Some(body))),
            Some(len) if len > max as u64 => {
                return Err(Unstorable::new("too-large", Some(body)));
            }
            Some(_) => {}
        }
        axum::body::to_bytes(body, max)
            .await
            .map_err(|_| Unstorable::new("unreadable", None))
    }

    /// The stored form of a response: `COMPLETED`, or `REJECTED` with code `HTTP_<status>` for
    /// a 4xx.
    pub(super) fn outcome(
        &self,
        parts: &axum::http::response::Parts,
        body: &Bytes,
    ) -> Result<StoredOutcome, Error> {
        let stored = StoredResponse::from_parts(
            parts.status,
            &parts.headers,
            body.clone(),
            &self.settings.headers,
        );
        // The service's serializer (an encrypting or signing one wraps the JSON), within the
        // depth every store keeps, as `execute` stores a result.
        let payload = self
            .service
            .serializer()
            .serialize(&stored)
            .map_err(Error::internal)?;
        idempotency_core::check_json_depth(&payload).map_err(Error::internal)?;
        Ok(if parts.status.is_client_error() {
            StoredOutcome::Rejected {
                code: format!("HTTP_{}", parts.status.as_u16()),
                details: Some(payload),
            }
        } else {
            StoredOutcome::Completed { payload }
        })
    }
}

/// A response the layer cannot store.
pub(super) struct Unstorable {
    pub(super) reason: &'static str,
    /// The body, when it was not consumed.
    pub(super) body: Option<Body>,
}

impl Unstorable {
    pub(super) fn new(reason: &'static str, body: Option<Body>) -> Self {
        Self { reason, body }
    }

    /// The warning and the `idempotency_layer_unstored_total` count.
    pub(super) fn report(&self, operation: &str, then: &'static str) {
        tracing::warn!(
            operation,
            reason = self.reason,
            "response cannot be stored; {then}"
        );
        metrics::counter!(
            "idempotency_layer_unstored_total",
            "operation" => operation.to_owned(),
            "reason" => self.reason
        )
        .increment(1);
    }
}
