//! Rows of the records table, and how they become [`IdempotencyRecord`]s.

use std::time::SystemTime;

use chrono::NaiveDateTime;
use idempotency_core::store::StoreError;
use idempotency_core::trace::SpanRef;
use idempotency_core::{Fingerprint, IdempotencyRecord, RecordStatus, StoredOutcome};

pub(super) fn parse_status(status: &str) -> Result<RecordStatus, StoreError> {
    status
        .parse()
        .map_err(|e: idempotency_core::UnknownStatus| StoreError::Corrupt {
            reason: e.to_string(),
        })
}

/// A `DATETIME(6)` written from `UTC_TIMESTAMP(6)`.
pub(super) fn time(value: NaiveDateTime) -> SystemTime {
    SystemTime::from(value.and_utc())
}

/// `request_hash, status, result_payload, error_code, created_at, completed_at, expires_at,
/// trace_id, span_id`.
pub(super) type FindRow = (
    String,
    String,
    Option<String>,
    Option<String>,
    NaiveDateTime,
    Option<NaiveDateTime>,
    Option<NaiveDateTime>,
    Option<String>,
    Option<String>,
);

/// `request_hash, created_at, completed_at, expires_at`, read after `complete`.
pub(super) type CompleteRow = (
    String,
    NaiveDateTime,
    Option<NaiveDateTime>,
    Option<NaiveDateTime>,
);

/// `created_at, completed_at, expires_at` of a row just inserted.
pub(super) type TimesRow = (NaiveDateTime, Option<NaiveDateTime>, Option<NaiveDateTime>);

pub(super) fn record_from_row(row: FindRow) -> Result<IdempotencyRecord, StoreError> {
    let (hash, status, payload, code, created_at, completed_at, expires_at, trace_id, span_id) =
        row;
    let outcome = StoredOutcome::from_columns(&status, payload, code)?;
    Ok(IdempotencyRecord {
        fingerprint: Fingerprint::new(hash),
        outcome,
        created_at: time(created_at),
        completed_at: completed_at.map(time),
        expires_at: expires_at.map(time),
        execution_span: SpanRef::from_columns(trace_id.as_deref(), span_id.as_deref()),
    })
}

/// The terminal record `complete` returns.
pub(super) fn completed_record(
    row: CompleteRow,
    outcome: StoredOutcome,
    execution_span: Option<SpanRef>,
) -> IdempotencyRecord {
    let (hash, created_at, completed_at, expires_at) = row;
    IdempotencyRecord {
        fingerprint: Fingerprint::new(hash),
        outcome: Some(outcome),
        created_at: time(created_at),
        completed_at: completed_at.map(time),
        expires_at: expires_at.map(time),
        execution_span,
    }
}

/// The two trace columns of `span`: lower-case hex, or NULLs.
pub(super) fn span_columns(span: Option<SpanRef>) -> (Option<String>, Option<String>) {
    span.map(|s| (s.trace_id_hex(), s.span_id_hex())).unzip()
}
