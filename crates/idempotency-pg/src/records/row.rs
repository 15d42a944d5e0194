//! Rows of the records table, decoded into core records.

use std::time::SystemTime;

use chrono::{DateTime, Utc};
use idempotency_core::store::StoreError;
use idempotency_core::trace::SpanRef;
use idempotency_core::{Fingerprint, IdempotencyRecord, StoredOutcome};

pub(super) type FindRow = (
    String,
    String,
    Option<String>,
    Option<String>,
    DateTime<Utc>,
    Option<DateTime<Utc>>,
    Option<DateTime<Utc>>,
    Option<String>,
    Option<String>,
);

pub(super) type CompleteRow = (
    String,
    DateTime<Utc>,
    Option<DateTime<Utc>>,
    Option<DateTime<Utc>>,
);

pub(super) fn record_from_row(row: FindRow) -> Result<IdempotencyRecord, StoreError> {
    let (hash, status, payload, code, created_at, completed_at, expires_at, trace_id, span_id) =
        row;
    let outcome = StoredOutcome::from_columns(&status, payload, code)?;
    Ok(IdempotencyRecord {
        fingerprint: Fingerprint::new(hash),
        outcome,
        created_at: SystemTime::from(created_at),
        completed_at: completed_at.map(SystemTime::from),
        expires_at: expires_at.map(SystemTime::from),
        execution_span: SpanRef::from_columns(trace_id.as_deref(), span_id.as_deref()),
    })
}

pub(super) type InsertedRow = (
    Option<DateTime<Utc>>,
    Option<DateTime<Utc>>,
    Option<DateTime<Utc>>,
);

/// The two trace columns of `span`: lower-case hex, or NULLs.
pub(crate) fn span_columns(span: Option<SpanRef>) -> (Option<String>, Option<String>) {
    span.map(|s| (s.trace_id_hex(), s.span_id_hex())).unzip()
}
