//! The JSON the operator tools write: one shape per thing, shared by the command line's
//! `--json` and the admin router's API, so that a script written against one reads the other.

use std::collections::BTreeMap;
use std::time::SystemTime;

use idempotency_outbox::DeadLetter;
use idempotency_outbox::admin::OutboxStatus;
use serde::Serialize;

use super::KeyView;

/// RFC 3339 in seconds, UTC: how the operator tools write a record's times (a dead letter's
/// keep the database's precision, as chrono writes them).
///
/// ```
/// use std::time::{Duration, UNIX_EPOCH};
///
/// let at = UNIX_EPOCH + Duration::from_secs(1_780_000_000);
/// assert_eq!(idempotency::ops::rfc3339(at), "2026-05-28T20:26:40Z");
/// ```
pub fn rfc3339(at: SystemTime) -> String {
    humantime::format_rfc3339_seconds(at).to_string()
}

/// One key's record with its name, as JSON (`keys show --json`, `GET /api/keys`).
///
/// ```
/// use idempotency::core::{Fingerprint, IdempotencyRecord, StoredOutcome};
/// use idempotency::ops::{KeyJson, KeyView};
///
/// let record = IdempotencyRecord {
///     fingerprint: Fingerprint::new("abc".to_owned()),
///     outcome: Some(StoredOutcome::Completed { payload: "{\"id\":1}".into() }),
///     created_at: std::time::SystemTime::UNIX_EPOCH,
///     completed_at: None,
///     expires_at: None,
///     execution_span: None,
/// };
/// let view = KeyView::of(&record);
/// let json = serde_json::to_value(KeyJson::new("CHARGE", "", "k-1", &view, None)).unwrap();
/// assert_eq!(json["status"], "COMPLETED");
/// assert_eq!(json["created_at"], "1970-01-01T00:00:00Z");
/// assert_eq!(json["outcome_size"], 8);
/// assert_eq!(json["lease_token"], serde_json::Value::Null);
/// ```
#[derive(Debug, Clone, Serialize)]
pub struct KeyJson<'a> {
    operation: &'a str,
    scope: &'a str,
    key: &'a str,
    status: &'static str,
    created_at: String,
    completed_at: Option<String>,
    expires_at: Option<String>,
    fingerprint: &'a str,
    rejection_code: Option<&'a str>,
    outcome_size: usize,
    preview: Option<&'a str>,
    lease_token: Option<i64>,
    redis_key: Option<&'a str>,
}

impl<'a> KeyJson<'a> {
    /// The record `view` of `key` of `operation` in `scope`; `redis_key` is its L2 key, when
    /// Redis is configured.
    pub fn new(
        operation: &'a str,
        scope: &'a str,
        key: &'a str,
        view: &'a KeyView,
        redis_key: Option<&'a str>,
    ) -> Self {
        Self {
            operation,
            scope,
            key,
            status: view.status.as_str(),
            created_at: rfc3339(view.created_at),
            completed_at: view.completed_at.map(rfc3339),
            expires_at: view.expires_at.map(rfc3339),
            fingerprint: &view.fingerprint,
            rejection_code: view.rejection_code.as_deref(),
            outcome_size: view.outcome_size,
            preview: view.preview.as_deref(),
            lease_token: view.lease_token.map(|token| token.0),
            redis_key,
        }
    }
}

/// One dead letter as JSON (`outbox dead list|show --json`, `GET /api/outbox/dead[/{id}]`).
///
/// [`summary`](Self::summary) leaves out the payload and headers (the list);
/// [`full`](Self::full) has them (one letter).
///
/// ```
/// use idempotency::ops::DeadLetterJson;
/// use idempotency::outbox::DeadLetter;
///
/// fn show(letter: &DeadLetter) -> serde_json::Value {
///     serde_json::to_value(DeadLetterJson::full(letter)).unwrap_or_default()
/// }
/// ```
#[derive(Debug, Clone, Serialize)]
pub struct DeadLetterJson<'a> {
    id: String,
    aggregate_type: &'a str,
    aggregate_id: &'a str,
    sequence: Option<i64>,
    event_type: &'a str,
    attempts: u32,
    created_at: String,
    dead_lettered_at: String,
    last_error: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    payload: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    headers: Option<&'a BTreeMap<String, String>>,
}

impl<'a> DeadLetterJson<'a> {
    /// The letter without its payload and headers.
    pub fn summary(letter: &'a DeadLetter) -> Self {
        let m = &letter.message;
        Self {
            id: m.id.to_string(),
            aggregate_type: &m.aggregate_type,
            aggregate_id: &m.aggregate_id,
            sequence: m.sequence,
            event_type: &m.event_type,
            attempts: m.attempts,
            created_at: m.created_at.to_rfc3339(),
            dead_lettered_at: letter.dead_lettered_at.to_rfc3339(),
            last_error: letter.last_error.as_deref(),
            payload: None,
            headers: None,
        }
    }

    /// The letter with its payload and headers.
    pub fn full(letter: &'a DeadLetter) -> Self {
        Self {
            payload: Some(&letter.message.payload),
            headers: Some(&letter.message.headers),
            ..Self::summary(letter)
        }
    }
}

/// The outbox's state as JSON (`outbox status --json`, `GET /api/outbox/status`).
///
/// ```
/// use idempotency::ops::OutboxStatusJson;
/// use idempotency::outbox::admin::OutboxStatus;
///
/// let status = OutboxStatus::new(3, 0.5, 1, 0, 0, 0);
/// let json = serde_json::to_value(OutboxStatusJson::from(&status)).unwrap();
/// assert_eq!(json["oldest_pending_age_seconds"], 0.5);
/// ```
#[derive(Debug, Clone, Copy, Serialize)]
pub struct OutboxStatusJson {
    pending: u64,
    oldest_pending_age_seconds: f64,
    leased: u64,
    dead_lettered: u64,
    dead_letter_aggregates: u64,
    blocked_aggregates: u64,
}

impl From<&OutboxStatus> for OutboxStatusJson {
    fn from(s: &OutboxStatus) -> Self {
        Self {
            pending: s.pending,
            oldest_pending_age_seconds: s.oldest_pending_age,
            leased: s.leased,
            dead_lettered: s.dead_lettered,
            dead_letter_aggregates: s.dead_letter_aggregates,
            blocked_aggregates: s.blocked_aggregates,
        }
    }
}
