//! Rows of the outbox table, and how they become [`OutboxMessage`]s.

use std::collections::BTreeMap;

use chrono::NaiveDateTime;
use idempotency_outbox::{DeadLetter, Error, OutboxMessage};
use uuid::Uuid;

use super::error::corrupt;

/// `id, aggregate_type, aggregate_id, sequence, event_type, payload, headers, created_at,
/// attempts, age in seconds` (see `statements::MESSAGE_COLUMNS`).
pub(crate) type MessageRow = (
    Uuid,
    String,
    String,
    Option<i64>,
    String,
    String,
    String,
    NaiveDateTime,
    i32,
    f64,
);

/// A [`MessageRow`], then whether the row still holds a claim token (1: a dead relay left it
/// unmarked), as a claim reads it.
pub(crate) type ClaimRow = (
    Uuid,
    String,
    String,
    Option<i64>,
    String,
    String,
    String,
    NaiveDateTime,
    i32,
    f64,
    i64,
);

/// A [`MessageRow`], then `last_error, dead_lettered_at`.
pub(crate) type DeadLetterRow = (
    Uuid,
    String,
    String,
    Option<i64>,
    String,
    String,
    String,
    NaiveDateTime,
    i32,
    f64,
    Option<String>,
    NaiveDateTime,
);

/// The message a claim hands out: `attempts` counts that claim.
pub(crate) fn claimed(row: MessageRow) -> Result<OutboxMessage, Error> {
    let (id, t, a, s, e, p, h, created_at, attempts, age) = row;
    message((
        id,
        t,
        a,
        s,
        e,
        p,
        h,
        created_at,
        attempts.saturating_add(1),
        age,
    ))
}

pub(crate) fn message(row: MessageRow) -> Result<OutboxMessage, Error> {
    let (
        id,
        aggregate_type,
        aggregate_id,
        sequence,
        event_type,
        payload,
        headers,
        created_at,
        attempts,
        age,
    ) = row;
    let headers: BTreeMap<String, String> = serde_json::from_str(&headers).map_err(|e| {
        corrupt(format!(
            "headers of {id} are not a JSON object of strings: {e}"
        ))
    })?;
    Ok(OutboxMessage::new(
        id,
        aggregate_type,
        aggregate_id,
        sequence,
        event_type,
        payload,
        headers,
        created_at.and_utc(),
        u32::try_from(attempts).unwrap_or_default(),
    )
    .with_age_at_claim(age.max(0.0)))
}

pub(crate) fn dead_letter(row: DeadLetterRow) -> Result<DeadLetter, Error> {
    let (a, b, c, d, e, f, g, h, i, j, last_error, at) = row;
    Ok(DeadLetter::new(
        message((a, b, c, d, e, f, g, h, i, j))?,
        last_error,
        at.and_utc(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn claimed_rows_count_the_claim_and_bad_headers_are_corrupt() {
        let row = |headers: &str| -> MessageRow {
            (
                Uuid::now_v7(),
                "t".into(),
                "a".into(),
                None,
                "e".into(),
                "{}".into(),
                headers.into(),
                NaiveDateTime::default(),
                2,
                -0.5,
            )
        };
        let message = claimed(row(r#"{"k":"v"}"#)).unwrap();
        assert_eq!(message.attempts, 3);
        assert_eq!(message.age_at_claim, 0.0);
        assert!(matches!(claimed(row("[1]")), Err(Error::Corrupt { .. })));
    }
}
