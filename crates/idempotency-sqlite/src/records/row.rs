//! Rows of the records table, and how they become [`IdempotencyRecord`]s.

use idempotency_core::store::StoreError;
use idempotency_core::{Fingerprint, IdempotencyRecord, RecordStatus, StoredOutcome};

use crate::clock::to_system_time;

fn corrupt(reason: impl Into<String>) -> StoreError {
    StoreError::Corrupt {
        reason: reason.into(),
    }
}

pub(super) fn parse_status(status: &str) -> Result<RecordStatus, StoreError> {
    status
        .parse()
        .map_err(|e: idempotency_core::UnknownStatus| corrupt(e.to_string()))
}

/// `request_hash, status, result_payload, error_code, created_at, completed_at, expires_at`.
pub(super) type FindRow = (
    String,
    String,
    Option<String>,
    Option<String>,
    i64,
    Option<i64>,
    Option<i64>,
);

/// `request_hash, created_at, completed_at, expires_at`, returned by `complete`.
pub(super) type CompleteRow = (String, i64, Option<i64>, Option<i64>);

pub(super) fn record_from_row(row: FindRow) -> Result<IdempotencyRecord, StoreError> {
    let (hash, status, payload, code, created_at, completed_at, expires_at) = row;
    let outcome = match parse_status(&status)? {
        RecordStatus::Processing => None,
        RecordStatus::Completed => Some(StoredOutcome::Completed {
            payload: payload.unwrap_or_else(|| "null".to_owned()),
        }),
        RecordStatus::Rejected => Some(StoredOutcome::Rejected {
            code: code.ok_or_else(|| corrupt("REJECTED record without error_code"))?,
            details: payload,
        }),
    };
    Ok(IdempotencyRecord {
        fingerprint: Fingerprint::new(hash),
        outcome,
        created_at: to_system_time(created_at),
        completed_at: completed_at.map(to_system_time),
        expires_at: expires_at.map(to_system_time),
    })
}

/// The terminal record `complete` returns, from its `RETURNING` row.
pub(super) fn completed_record(row: CompleteRow, outcome: StoredOutcome) -> IdempotencyRecord {
    let (hash, created_at, completed_at, expires_at) = row;
    IdempotencyRecord {
        fingerprint: Fingerprint::new(hash),
        outcome: Some(outcome),
        created_at: to_system_time(created_at),
        completed_at: completed_at.map(to_system_time),
        expires_at: expires_at.map(to_system_time),
    }
}

/// The `result_payload` and `error_code` columns of a terminal outcome.
pub(super) fn payload_and_code(outcome: &StoredOutcome) -> (Option<&str>, Option<&str>) {
    match outcome {
        StoredOutcome::Completed { payload } => (Some(payload.as_str()), None),
        StoredOutcome::Rejected { code, details } => (details.as_deref(), Some(code.as_str())),
    }
}
