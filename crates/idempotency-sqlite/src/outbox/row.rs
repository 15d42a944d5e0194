//! Rows of the outbox table as [`OutboxMessage`]s and [`DeadLetter`]s, and the JSON lists
//! that carry batches into statements.

use std::collections::BTreeMap;
use std::time::Duration;

use chrono::{DateTime, Utc};
use idempotency_outbox::store::Failure;
use idempotency_outbox::{DeadLetter, Error, NewEvent, OutboxMessage};
use serde::Serialize;
use uuid::Uuid;

use super::error::corrupt;

/// `id, aggregate_type, aggregate_id, sequence, event_type, payload, headers, created_at,
/// attempts, age at claim (seconds)`.
pub(crate) type MessageRow = (
    String,
    String,
    String,
    Option<i64>,
    String,
    String,
    String,
    i64,
    i64,
    f64,
);

/// A [`MessageRow`], then `last_error, dead_lettered_at`.
pub(crate) type DeadLetterRow = (
    String,
    String,
    String,
    Option<i64>,
    String,
    String,
    String,
    i64,
    i64,
    f64,
    Option<String>,
    i64,
);

fn time(what: &str, id: &str, millis: i64) -> Result<DateTime<Utc>, Error> {
    DateTime::from_timestamp_millis(millis)
        .ok_or_else(|| corrupt(format!("{what} of {id} is out of range: {millis}")))
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
    let uuid =
        Uuid::parse_str(&id).map_err(|e| corrupt(format!("id {id:?} is not a UUID: {e}")))?;
    let headers: BTreeMap<String, String> = serde_json::from_str(&headers).map_err(|e| {
        corrupt(format!(
            "headers of {id} are not a JSON object of strings: {e}"
        ))
    })?;
    Ok(OutboxMessage::new(
        uuid,
        aggregate_type,
        aggregate_id,
        sequence,
        event_type,
        payload,
        headers,
        time("created_at", &id, created_at)?,
        u32::try_from(attempts).unwrap_or_default(),
    )
    .with_age_at_claim(age))
}

pub(crate) fn dead_letter(row: DeadLetterRow) -> Result<DeadLetter, Error> {
    let (a, b, c, d, e, f, g, h, i, j, last_error, at) = row;
    let at = time("dead_lettered_at", &a, at)?;
    Ok(DeadLetter::new(
        message((a, b, c, d, e, f, g, h, i, j))?,
        last_error,
        at,
    ))
}

/// Milliseconds, capped so that `now + ms` cannot overflow.
pub(crate) fn millis(duration: Duration) -> i64 {
    crate::clock::ttl_millis(Some(duration)).unwrap_or(i64::MAX / 2)
}

/// One event as `enqueue` hands it to SQL (keys match `statements::INPUT`).
#[derive(Serialize)]
struct EventJson<'a> {
    id: Uuid,
    t: &'a str,
    a: &'a str,
    e: &'a str,
    p: &'a str,
    h: String,
}

/// Checks every event (names, headers, JSON payload) before anything is written, then lists
/// them as one JSON array.
pub(crate) fn events_json(events: &[NewEvent]) -> Result<String, Error> {
    let mut rows = Vec::with_capacity(events.len());
    for event in events {
        event.validate()?;
        rows.push(EventJson {
            id: event.id(),
            t: event.aggregate_type(),
            a: event.aggregate_id(),
            e: event.event_type(),
            p: event.payload(),
            h: serde_json::to_string(&*event.headers_to_store()).map_err(Error::Payload)?,
        });
    }
    serde_json::to_string(&rows).map_err(Error::Payload)
}

/// Ids as a JSON array of strings.
pub(crate) fn ids_json(ids: &[Uuid]) -> Result<String, Error> {
    serde_json::to_string(ids).map_err(Error::Payload)
}

/// One failure as `mark_failed` hands it to SQL (keys match `statements::FAILURES`).
#[derive(Serialize)]
struct FailureJson<'a> {
    id: Uuid,
    error: &'a str,
    delay: i64,
    dead: bool,
    transient: bool,
}

pub(crate) fn failures_json(failures: &[Failure]) -> Result<String, Error> {
    let rows: Vec<FailureJson<'_>> = failures
        .iter()
        .map(|f| FailureJson {
            id: f.id,
            error: &f.error,
            delay: millis(f.retry_in),
            dead: f.dead_letter,
            transient: f.transient,
        })
        .collect();
    serde_json::to_string(&rows).map_err(Error::Payload)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_are_checked_before_they_are_listed() {
        let good = NewEvent::new("order", "o-1", "Placed", &serde_json::json!({"n": 1}))
            .unwrap()
            .header("trace", "x");
        let json: serde_json::Value =
            serde_json::from_str(&events_json(std::slice::from_ref(&good)).unwrap()).unwrap();
        assert_eq!(json[0]["id"], good.id().to_string());
        assert_eq!(json[0]["p"], r#"{"n":1}"#);
        assert_eq!(json[0]["h"], r#"{"trace":"x"}"#);

        let not_json = NewEvent::from_json_text("order", "o-1", "Placed", "{oops");
        assert!(matches!(
            events_json(&[good.clone(), not_json]),
            Err(Error::InvalidEvent { .. })
        ));
        let bad_header = good.header("a:b", "x");
        assert!(matches!(
            events_json(&[bad_header]),
            Err(Error::InvalidEvent { .. })
        ));
    }

    #[test]
    fn rows_with_bad_ids_or_headers_are_corrupt() {
        let row = |id: &str, headers: &str| -> MessageRow {
            (
                id.into(),
                "t".into(),
                "a".into(),
                None,
                "e".into(),
                "{}".into(),
                headers.into(),
                0,
                1,
                0.0,
            )
        };
        let id = Uuid::now_v7().to_string();
        assert!(message(row(&id, "{}")).is_ok());
        assert!(matches!(
            message(row("nope", "{}")),
            Err(Error::Corrupt { .. })
        ));
        assert!(matches!(
            message(row(&id, "[1]")),
            Err(Error::Corrupt { .. })
        ));
    }
}
