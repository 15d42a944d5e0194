//! The stored idempotency record, as stores and caches see it.

use std::fmt;
use std::str::FromStr;
use std::time::SystemTime;

use serde::{Deserialize, Serialize};

use crate::fingerprint::Fingerprint;
use crate::store::StoreError;
use crate::trace::SpanRef;

/// The lifecycle status of a record.
///
/// A committed record is always terminal (`Completed` or `Rejected`): `Processing` only exists
/// inside the transaction that acquired the key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum RecordStatus {
    /// Acquired; the action is running in the acquiring transaction.
    Processing,
    /// The action succeeded; its value is stored.
    Completed,
    /// The action was rejected for a business reason; code and details are stored.
    Rejected,
}

impl RecordStatus {
    /// The stored spelling: `PROCESSING`, `COMPLETED` or `REJECTED`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Processing => "PROCESSING",
            Self::Completed => "COMPLETED",
            Self::Rejected => "REJECTED",
        }
    }

    /// Whether the status is final (`Completed` or `Rejected`).
    pub fn is_terminal(self) -> bool {
        !matches!(self, Self::Processing)
    }
}

impl fmt::Display for RecordStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A status string that is not one of the three known ones.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown record status {0:?}")]
pub struct UnknownStatus(pub String);

impl FromStr for RecordStatus {
    type Err = UnknownStatus;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "PROCESSING" => Ok(Self::Processing),
            "COMPLETED" => Ok(Self::Completed),
            "REJECTED" => Ok(Self::Rejected),
            other => Err(UnknownStatus(other.to_owned())),
        }
    }
}

/// A terminal outcome in stored form: JSON text, ready for a database column or a cache entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "status", rename_all = "SCREAMING_SNAKE_CASE")]
pub enum StoredOutcome {
    /// The success value as JSON text (`null` for a result-less operation).
    Completed {
        /// JSON text of the value.
        payload: String,
    },
    /// A business rejection.
    Rejected {
        /// The rejection code.
        code: String,
        /// JSON text of the details, if any.
        details: Option<String>,
    },
}

impl StoredOutcome {
    /// The status this outcome stores.
    pub fn status(&self) -> RecordStatus {
        match self {
            Self::Completed { .. } => RecordStatus::Completed,
            Self::Rejected { .. } => RecordStatus::Rejected,
        }
    }

    /// The outcome as the canonical schema stores it: the JSON column (the value, or the
    /// rejection details) and the rejection-code column.
    ///
    /// ```
    /// use idempotency_core::StoredOutcome;
    /// let rejected = StoredOutcome::Rejected { code: "NO".into(), details: None };
    /// assert_eq!(rejected.to_columns(), (None, Some("NO")));
    /// ```
    pub fn to_columns(&self) -> (Option<&str>, Option<&str>) {
        match self {
            Self::Completed { payload } => (Some(payload.as_str()), None),
            Self::Rejected { code, details } => (details.as_deref(), Some(code.as_str())),
        }
    }

    /// The outcome read back from the status, JSON and code columns; `None` while
    /// `PROCESSING`. A missing payload of a completed record reads as `null`; an unknown status,
    /// or a rejection without a code, is [`StoreError::Corrupt`].
    ///
    /// ```
    /// use idempotency_core::StoredOutcome;
    /// let outcome = StoredOutcome::from_columns("COMPLETED", None, None)?;
    /// assert_eq!(outcome, Some(StoredOutcome::Completed { payload: "null".into() }));
    /// assert!(StoredOutcome::from_columns("REJECTED", None, None).is_err());
    /// # Ok::<(), idempotency_core::StoreError>(())
    /// ```
    pub fn from_columns(
        status: &str,
        payload: Option<String>,
        code: Option<String>,
    ) -> Result<Option<Self>, StoreError> {
        let corrupt = |reason: String| StoreError::Corrupt { reason };
        let status: RecordStatus = status
            .parse()
            .map_err(|e: UnknownStatus| corrupt(e.to_string()))?;
        Ok(match status {
            RecordStatus::Processing => None,
            RecordStatus::Completed => Some(Self::Completed {
                payload: payload.unwrap_or_else(|| "null".to_owned()),
            }),
            RecordStatus::Rejected => Some(Self::Rejected {
                code: code
                    .ok_or_else(|| corrupt("REJECTED record without error_code".to_owned()))?,
                details: payload,
            }),
        })
    }
}

/// One idempotency record as read from a store or a cache.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IdempotencyRecord {
    /// Fingerprint of the request that created the record.
    pub fingerprint: Fingerprint,
    /// The outcome, or `None` while the record is `PROCESSING`.
    pub outcome: Option<StoredOutcome>,
    /// When the key was acquired (database clock).
    pub created_at: SystemTime,
    /// When the outcome was stored (database clock).
    pub completed_at: Option<SystemTime>,
    /// When cleanup may delete the record; `None` keeps it forever. Not consulted on the request
    /// path: a record replays until it is physically deleted.
    pub expires_at: Option<SystemTime>,
    /// The span of the execution that stored the outcome (feature `otel`, a sampled span), for
    /// the span link of its replays; `None` otherwise, and in entries written before it existed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub execution_span: Option<SpanRef>,
}

impl IdempotencyRecord {
    /// The record's status.
    pub fn status(&self) -> RecordStatus {
        self.outcome
            .as_ref()
            .map_or(RecordStatus::Processing, StoredOutcome::status)
    }

    /// Whether the record holds a final outcome and may be replayed or cached.
    pub fn is_terminal(&self) -> bool {
        self.outcome.is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_round_trip() {
        for status in [
            RecordStatus::Processing,
            RecordStatus::Completed,
            RecordStatus::Rejected,
        ] {
            assert_eq!(status.as_str().parse::<RecordStatus>().unwrap(), status);
        }
        assert!("DONE".parse::<RecordStatus>().is_err());
        assert!(!RecordStatus::Processing.is_terminal());
    }
}
