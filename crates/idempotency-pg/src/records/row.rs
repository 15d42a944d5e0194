//! Rows of the records table, decoded into core records.

use std::time::SystemTime;

use chrono::{DateTime, Utc};
use idempotency_core::store::StoreError;
use idempotency_core::{Fingerprint, IdempotencyRecord, StoredOutcome};

pub(super) type FindRow = (
    String,
    String,
    Option<String>,
    Option<String>,
    DateTime<Utc>,
    Option<DateTime<Utc>>,
    Option<DateTime<Utc>>,
);

pub(super) type CompleteRow = (
    String,
    DateTime<Utc>,
    Option<DateTime<Utc>>,
    Option<DateTime<Utc>>,
);

pub(super) fn record_from_row(row: FindRow) -> Result<IdempotencyRecord, StoreError> {
    let (hash, status, payload, code, created_at, completed_at, expires_at) = row;
    let outcome = StoredOutcome::from_columns(&status, payload, code)?;
    Ok(IdempotencyRecord {
        fingerprint: Fingerprint::new(hash),
        outcome,
        created_at: SystemTime::from(created_at),
        completed_at: completed_at.map(SystemTime::from),
        expires_at: expires_at.map(SystemTime::from),
    })
}

pub(super) type InsertedRow = (
    Option<DateTime<Utc>>,
    Option<DateTime<Utc>>,
    Option<DateTime<Utc>>,
);
