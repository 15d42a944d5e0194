//! What a business action returns, and what `execute` hands back to the caller.

use std::fmt;
use std::sync::Arc;

use serde::Serialize;
use serde::de::DeserializeOwned;

/// The deterministic outcome of a business action. Both variants are persisted and replayed;
/// a technical failure is an `Err` of the action instead, and nothing is stored for it.
///
/// ```
/// use idempotency_core::ExecutionResult;
///
/// let ok: ExecutionResult<u32> = ExecutionResult::success(7);
/// assert_eq!(ok.into_result().unwrap(), 7);
///
/// let no: ExecutionResult<u32> = ExecutionResult::rejected("INSUFFICIENT_FUNDS");
/// let status = no.fold(|_| 201, |rejection| {
///     assert_eq!(rejection.code(), "INSUFFICIENT_FUNDS");
///     422
/// });
/// assert_eq!(status, 422);
/// ```
#[derive(Debug, Clone, PartialEq)]
pub enum ExecutionResult<T> {
    /// The operation succeeded with this value.
    Success(T),
    /// The operation was refused for a business reason (insufficient funds, limit exceeded, ...).
    Rejected(Rejection),
}

impl<T> ExecutionResult<T> {
    /// A successful outcome.
    pub fn success(value: T) -> Self {
        Self::Success(value)
    }

    /// A business rejection with a code and no details.
    pub fn rejected(code: impl Into<String>) -> Self {
        Self::Rejected(Rejection::new(code))
    }

    /// A business rejection with a code and serializable details.
    ///
    /// ```
    /// use idempotency_core::ExecutionResult;
    /// #[derive(serde::Serialize, serde::Deserialize, PartialEq, Debug)]
    /// #[serde(rename_all = "camelCase")]
    /// struct Funds { requested_amount: String, available_balance: String }
    ///
    /// let r: ExecutionResult<()> = ExecutionResult::rejected_with(
    ///     "INSUFFICIENT_FUNDS",
    ///     &Funds { requested_amount: "5000.00".into(), available_balance: "1000.00".into() },
    /// )?;
    /// let details: Funds = r.rejection().unwrap().details_as()?.unwrap();
    /// assert_eq!(details.available_balance, "1000.00");
    /// # Ok::<(), serde_json::Error>(())
    /// ```
    pub fn rejected_with<D: Serialize + ?Sized>(
        code: impl Into<String>,
        details: &D,
    ) -> Result<Self, serde_json::Error> {
        Ok(Self::Rejected(Rejection::with_details(code, details)?))
    }

    /// Whether this is a success.
    pub fn is_success(&self) -> bool {
        matches!(self, Self::Success(_))
    }

    /// Whether this is a business rejection.
    pub fn is_rejected(&self) -> bool {
        matches!(self, Self::Rejected(_))
    }

    /// The success value, if any.
    pub fn value(&self) -> Option<&T> {
        match self {
            Self::Success(value) => Some(value),
            Self::Rejected(_) => None,
        }
    }

    /// The rejection, if any.
    pub fn rejection(&self) -> Option<&Rejection> {
        match self {
            Self::Success(_) => None,
            Self::Rejected(rejection) => Some(rejection),
        }
    }

    /// The value, or the rejection as an error: use it outside the transaction, so that a
    /// rejection never rolls the stored outcome back.
    pub fn into_result(self) -> Result<T, Rejection> {
        match self {
            Self::Success(value) => Ok(value),
            Self::Rejected(rejection) => Err(rejection),
        }
    }

    /// Maps both cases to one type.
    pub fn fold<R>(
        self,
        on_success: impl FnOnce(T) -> R,
        on_rejected: impl FnOnce(Rejection) -> R,
    ) -> R {
        match self {
            Self::Success(value) => on_success(value),
            Self::Rejected(rejection) => on_rejected(rejection),
        }
    }

    /// Maps the success value.
    pub fn map<U>(self, f: impl FnOnce(T) -> U) -> ExecutionResult<U> {
        match self {
            Self::Success(value) => ExecutionResult::Success(f(value)),
            Self::Rejected(rejection) => ExecutionResult::Rejected(rejection),
        }
    }
}

/// A deterministic business rejection: a machine-readable code and optional JSON details.
#[derive(Debug, Clone, PartialEq)]
pub struct Rejection {
    code: String,
    details: Option<serde_json::Value>,
}

impl Rejection {
    /// A rejection without details.
    pub fn new(code: impl Into<String>) -> Self {
        Self {
            code: code.into(),
            details: None,
        }
    }

    /// A rejection whose details are `details` serialized to JSON.
    pub fn with_details<D: Serialize + ?Sized>(
        code: impl Into<String>,
        details: &D,
    ) -> Result<Self, serde_json::Error> {
        Ok(Self {
            code: code.into(),
            details: Some(serde_json::to_value(details)?),
        })
    }

    /// Builds a rejection from an already built JSON value.
    pub fn from_parts(code: impl Into<String>, details: Option<serde_json::Value>) -> Self {
        Self {
            code: code.into(),
            details,
        }
    }

    /// The rejection code, such as `INSUFFICIENT_FUNDS`.
    pub fn code(&self) -> &str {
        &self.code
    }

    /// The details as JSON, if any.
    pub fn details(&self) -> Option<&serde_json::Value> {
        self.details.as_ref()
    }

    /// The details deserialized into `D`; `Ok(None)` when there are none.
    pub fn details_as<D: DeserializeOwned>(&self) -> Result<Option<D>, serde_json::Error> {
        self.details
            .as_ref()
            .map(|value| D::deserialize(value))
            .transpose()
    }
}

impl fmt::Display for Rejection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "rejected: {}", self.code)
    }
}

impl std::error::Error for Rejection {}

/// Where a replayed outcome was found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Level {
    /// The in-process cache (L1).
    Local,
    /// The shared cache (L2).
    Distributed,
    /// The database, the source of truth.
    Persistence,
}

impl Level {
    /// The label used in metrics: `local`, `distributed` or `persistence`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Local => "local",
            Self::Distributed => "distributed",
            Self::Persistence => "persistence",
        }
    }
}

/// Whether the action ran in this call or its earlier outcome was replayed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Origin {
    /// The business action ran in this call (or idempotency is disabled).
    Executed,
    /// The stored outcome of an earlier call was returned; the action did not run.
    Replayed {
        /// Where the stored outcome came from.
        from: Level,
    },
}

/// The result of [`IdempotencyService::execute`](crate::IdempotencyService::execute): the
/// outcome, and whether it was executed now or replayed.
///
/// ```
/// use idempotency_core::{ExecutionResult, Origin, Outcome};
/// let outcome = Outcome::new(ExecutionResult::success(1), Origin::Executed);
/// assert!(!outcome.is_replayed());
/// assert_eq!(outcome.into_result().into_result().unwrap(), 1);
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome<T> {
    result: ExecutionResult<T>,
    origin: Origin,
    stored: StoredJson,
}

/// The committed record a replayed success was read from, kept so that its stored text can be
/// answered as is ([`Outcome::stored_json`]). It is the result's own serialized form, so it
/// never makes two outcomes differ: equality compares the results and origins only.
#[derive(Clone, Default)]
struct StoredJson(Option<Arc<crate::IdempotencyRecord>>);

impl StoredJson {
    fn text(&self) -> Option<&str> {
        match self.0.as_deref()?.outcome.as_ref()? {
            crate::StoredOutcome::Completed { payload } => Some(payload),
            crate::StoredOutcome::Rejected { .. } => None,
        }
    }
}

impl PartialEq for StoredJson {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl fmt::Debug for StoredJson {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.text() {
            Some(text) => write!(f, "{} bytes", text.len()),
            None => f.write_str("none"),
        }
    }
}

impl<T> Outcome<T> {
    /// Pairs a result with its origin.
    pub fn new(result: ExecutionResult<T>, origin: Origin) -> Self {
        Self {
            result,
            origin,
            stored: StoredJson::default(),
        }
    }

    /// A replayed success that also keeps the committed record it was read from, whose stored
    /// text is exactly the success value's `serde_json` text (checked by the caller).
    pub(crate) fn with_stored_json(mut self, record: Arc<crate::IdempotencyRecord>) -> Self {
        self.stored = StoredJson(Some(record));
        self
    }

    /// On a replayed success, the stored text of its value when it is exactly what
    /// `serde_json::to_string` writes for it: the bytes the first execution's value serialized
    /// to, which an HTTP answer can send as is instead of serializing the value again. `None`
    /// on executions, on rejections, with a serializer that does not store plain JSON
    /// ([`ResultSerializer::stores_plain_json`](crate::ResultSerializer::stores_plain_json)),
    /// and for text another spelling wrote (a `jsonb` column's: spaces, rewritten numbers),
    /// which a replay serializes again as it always did.
    pub fn stored_json(&self) -> Option<&str> {
        if !self.is_replayed() || !self.result.is_success() {
            return None;
        }
        self.stored.text()
    }

    /// Whether the stored outcome of an earlier call was replayed.
    pub fn is_replayed(&self) -> bool {
        matches!(self.origin, Origin::Replayed { .. })
    }

    /// Whether the action ran in this call.
    pub fn is_executed(&self) -> bool {
        self.origin == Origin::Executed
    }

    /// Where the outcome came from.
    pub fn origin(&self) -> Origin {
        self.origin
    }

    /// The outcome.
    pub fn result(&self) -> &ExecutionResult<T> {
        &self.result
    }

    /// Consumes the outcome and returns the result.
    pub fn into_result(self) -> ExecutionResult<T> {
        self.result
    }

    /// Splits into result and origin.
    pub fn into_parts(self) -> (ExecutionResult<T>, Origin) {
        (self.result, self.origin)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn helpers() {
        let ok: ExecutionResult<i32> = ExecutionResult::success(2);
        assert!(ok.is_success());
        assert_eq!(ok.value(), Some(&2));
        assert_eq!(ok.clone().map(|v| v * 2).into_result().unwrap(), 4);

        let no: ExecutionResult<i32> =
            ExecutionResult::rejected_with("LIMIT", &serde_json::json!({"max": 5})).unwrap();
        assert!(no.is_rejected());
        assert_eq!(no.value(), None);
        let rejection = no.into_result().unwrap_err();
        assert_eq!(rejection.code(), "LIMIT");
        let details: serde_json::Value = rejection.details_as().unwrap().unwrap();
        assert_eq!(details["max"], 5);
        assert_eq!(Rejection::new("X").details_as::<i32>().unwrap(), None);
    }
}
