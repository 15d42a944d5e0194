//! The cached value: a version tag, the entry's HMAC tag, then a compact JSON object.
//!
//! `v3:<64 hex digits>:{"f":"<fingerprint>","s":"C"|"R","p":<payload or details>,"c":"<code>","t":[created,completed,expires],"x":["<trace id>","<span id>"]}`
//! The stored payload is already JSON, so it is embedded as is (no escaping, and decoding borrows
//! it); times are milliseconds since the Unix epoch. `p` is absent only for a rejection without
//! details: a rejection whose details are JSON `null` has `"p":null`. `x` (the span of the
//! execution that stored the record) is absent when there is none, and in entries written
//! before it existed: they still decode. The hex digits are the
//! HMAC-SHA-256 of the key prefix, the record's identity and the JSON ([`Signer`]); an entry
//! whose tag does not verify is [`Decoded::Forged`]. `v1:` entries (the same JSON without a
//! tag) and `v2:` entries (tagged without the key prefix) are read as another version: a miss.

use std::borrow::Cow;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use idempotency_core::trace::SpanRef;
use idempotency_core::{Fingerprint, IdempotencyRecord, RecordId, StoredOutcome};
use serde::{Deserialize, Deserializer, Serialize};
use serde_json::value::RawValue;

use crate::sign::{Signer, TAG_HEX_LEN};

/// The current format tag. Entries with another tag read as a miss (written by a newer or older
/// release), never as an error.
const TAG: &str = "v3:";

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
enum Status {
    #[serde(rename = "C")]
    Completed,
    #[serde(rename = "R")]
    Rejected,
}

#[derive(Debug, Serialize, Deserialize)]
struct Wire<'a> {
    #[serde(borrow)]
    f: Cow<'a, str>,
    s: Status,
    /// Absent: no details. Present, even as `null`: that JSON (see [`present`]).
    #[serde(
        borrow,
        default,
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    p: Option<&'a RawValue>,
    #[serde(borrow, default, skip_serializing_if = "Option::is_none")]
    c: Option<Cow<'a, str>>,
    t: (u64, Option<u64>, Option<u64>),
    /// The span of the execution that stored the record, as `[trace id, span id]` in hex.
    /// Absent when there is none, and in entries written before it existed (still `v3`: they
    /// decode as before, with no span); a release before it ignores the field.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    x: Option<(String, String)>,
}

/// A present field is `Some`, also when it is `null`: a plain `Option` would read `"p":null` as
/// absent and lose the `null` details of a rejection. Entries written before this distinction was
/// read already wrote `"p":null` only for `null` JSON, so they keep their meaning.
fn present<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<&'de RawValue>, D::Error> {
    <&RawValue>::deserialize(deserializer).map(Some)
}

fn millis(time: SystemTime) -> u64 {
    time.duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

fn time(millis: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_millis(millis)
}

fn raw(json: &str) -> Result<Box<RawValue>, serde_json::Error> {
    RawValue::from_string(json.to_owned())
}

/// Encodes a terminal record stored for `id`, tagged by `signer`; `None` for a `PROCESSING`
/// one, which is never cached.
pub(crate) fn encode(
    id: &RecordId,
    record: &IdempotencyRecord,
    signer: &Signer,
) -> Result<Option<String>, serde_json::Error> {
    let (status, payload, code) = match &record.outcome {
        Some(StoredOutcome::Completed { payload }) => {
            (Status::Completed, Some(raw(payload)?), None)
        }
        Some(StoredOutcome::Rejected { code, details }) => (
            Status::Rejected,
            details.as_deref().map(raw).transpose()?,
            Some(Cow::Borrowed(code.as_str())),
        ),
        None => return Ok(None),
    };
    let span = record
        .execution_span
        .map(|s| (s.trace_id_hex(), s.span_id_hex()));
    let wire = Wire {
        f: Cow::Borrowed(record.fingerprint.as_str()),
        s: status,
        p: payload.as_deref(),
        c: code,
        t: (
            millis(record.created_at),
            record.completed_at.map(millis),
            record.expires_at.map(millis),
        ),
        x: span,
    };
    let json = serde_json::to_string(&wire)?;
    let mut out = String::with_capacity(TAG.len() + TAG_HEX_LEN + 1 + json.len());
    out.push_str(TAG);
    out.push_str(&signer.tag(id, &json));
    out.push(':');
    out.push_str(&json);
    Ok(Some(out))
}

/// What a stored value turned out to be.
#[derive(Debug)]
pub(crate) enum Decoded {
    Record(IdempotencyRecord),
    OtherVersion,
    Corrupt(serde_json::Error),
    /// The tag does not verify: written without the secret, or for another record.
    Forged,
}

fn corrupt(reason: &str) -> Decoded {
    Decoded::Corrupt(serde_json::Error::io(std::io::Error::other(
        reason.to_owned(),
    )))
}

/// Decodes the value found at `id`'s key, checking its tag with `signer` before anything else.
pub(crate) fn decode(id: &RecordId, value: &str, signer: &Signer) -> Decoded {
    let Some(tagged) = value.strip_prefix(TAG) else {
        return if is_version_tag(value) {
            Decoded::OtherVersion
        } else {
            corrupt("no version tag")
        };
    };
    let Some((tag, json)) = tagged.split_once(':') else {
        return Decoded::Forged;
    };
    if !signer.verify(id, json, tag) {
        return Decoded::Forged;
    }
    let wire: Wire<'_> = match serde_json::from_str(json) {
        Ok(wire) => wire,
        Err(error) => return Decoded::Corrupt(error),
    };
    let outcome = match (wire.s, wire.p, wire.c) {
        // A payload is always written; a missing one reads as `null` (a result-less operation).
        (Status::Completed, payload, None) => StoredOutcome::Completed {
            payload: payload.map_or("null", RawValue::get).to_owned(),
        },
        (Status::Rejected, details, Some(code)) => StoredOutcome::Rejected {
            code: code.into_owned(),
            details: details.map(|d| d.get().to_owned()),
        },
        _ => return corrupt("inconsistent status, payload and code"),
    };
    let (created, completed, expires) = wire.t;
    Decoded::Record(IdempotencyRecord {
        fingerprint: Fingerprint::new(wire.f.into_owned()),
        outcome: Some(outcome),
        created_at: time(created),
        completed_at: completed.map(time),
        expires_at: expires.map(time),
        // A malformed span costs the link, never the entry.
        execution_span: wire
            .x
            .and_then(|(trace_id, span_id)| SpanRef::from_hex(&trace_id, &span_id)),
    })
}

/// `v<digits>:` at the start.
fn is_version_tag(value: &str) -> bool {
    value
        .strip_prefix('v')
        .and_then(|rest| rest.split_once(':'))
        .is_some_and(|(digits, _)| !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()))
}

#[cfg(test)]
mod tests {
    use idempotency_core::{IdempotencyKey, Operation, Scope};

    use super::*;
    use crate::sign::CacheSecret;

    fn id() -> RecordId {
        RecordId::new(
            Operation::new("OP").unwrap(),
            Scope::new("tenant").unwrap(),
            IdempotencyKey::new("k").unwrap(),
        )
    }

    fn signer() -> Signer {
        Signer::new(&CacheSecret::new("c".repeat(32)).unwrap(), "idempotency:")
    }

    fn enc(record: &IdempotencyRecord) -> Result<Option<String>, serde_json::Error> {
        encode(&id(), record, &signer())
    }

    fn dec(value: &str) -> Decoded {
        decode(&id(), value, &signer())
    }

    /// A current-version value holding `json`, correctly tagged.
    fn tagged(json: &str) -> String {
        format!("{TAG}{}:{json}", signer().tag(&id(), json))
    }

    fn record(outcome: Option<StoredOutcome>) -> IdempotencyRecord {
        IdempotencyRecord {
            fingerprint: Fingerprint::new("f".repeat(64)),
            outcome,
            created_at: UNIX_EPOCH + Duration::from_millis(1_796_000_000_123),
            completed_at: Some(UNIX_EPOCH + Duration::from_millis(1_796_000_000_456)),
            expires_at: None,
            execution_span: None,
        }
    }

    #[test]
    fn the_execution_span_round_trips_and_an_entry_without_it_still_decodes() {
        let mut traced = record(Some(StoredOutcome::Completed {
            payload: "1".into(),
        }));
        traced.execution_span =
            SpanRef::from_hex("4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7");
        let encoded = enc(&traced).unwrap().unwrap();
        assert!(
            encoded.contains(r#""x":["4bf92f3577b34da6a3ce929d0e0e4736","00f067aa0ba902b7"]"#),
            "{encoded}"
        );
        let Decoded::Record(back) = dec(&encoded) else {
            panic!("{encoded}")
        };
        assert_eq!(back, traced);
        // Written by a release before the field: the same v3 entry, without `x`.
        let old = tagged(r#"{"f":"x","s":"C","p":1,"t":[1,2,null]}"#);
        let Decoded::Record(back) = dec(&old) else {
            panic!("{old}")
        };
        assert_eq!(back.execution_span, None);
        assert_eq!(
            back.outcome,
            Some(StoredOutcome::Completed {
                payload: "1".into()
            })
        );
        // A damaged span is no span, never a corrupt entry.
        let damaged = tagged(r#"{"f":"x","s":"C","p":1,"t":[1,2,null],"x":["zz","00"]}"#);
        let Decoded::Record(back) = dec(&damaged) else {
            panic!("{damaged}")
        };
        assert_eq!(back.execution_span, None);
    }

    #[test]
    fn round_trip() {
        for outcome in [
            StoredOutcome::Completed {
                payload: r#"{"paymentId":"p-1","amount":"1.00","n":[1,null,"\u00e9"]}"#.into(),
            },
            StoredOutcome::Completed {
                payload: "null".into(),
            },
            StoredOutcome::Rejected {
                code: "NO".into(),
                details: Some(r#"{"a":1}"#.into()),
            },
            StoredOutcome::Rejected {
                code: "NO\"pe".into(),
                details: None,
            },
        ] {
            let original = record(Some(outcome));
            let encoded = enc(&original).unwrap().unwrap();
            let Decoded::Record(back) = dec(&encoded) else {
                panic!("{encoded}")
            };
            assert_eq!(back, original);
        }
    }

    #[test]
    fn a_rejection_with_null_details_is_not_a_rejection_without_details() {
        for details in [Some("null"), None] {
            let original = record(Some(StoredOutcome::Rejected {
                code: "NO".into(),
                details: details.map(str::to_owned),
            }));
            let encoded = enc(&original).unwrap().unwrap();
            let Decoded::Record(back) = dec(&encoded) else {
                panic!("{encoded}")
            };
            assert_eq!(back, original, "{encoded}");
        }
    }

    #[test]
    fn the_payload_is_embedded_not_escaped() {
        let encoded = enc(&record(Some(StoredOutcome::Completed {
            payload: r#"{"a":"b"}"#.into(),
        })))
        .unwrap()
        .unwrap();
        assert!(encoded.contains(r#""p":{"a":"b"}"#), "{encoded}");
    }

    #[test]
    fn other_versions_are_misses_and_garbage_is_corrupt() {
        assert!(matches!(
            dec("v4:{\"whatever\":true}"),
            Decoded::OtherVersion
        ));
        assert!(matches!(dec(&tagged("{not json")), Decoded::Corrupt(_)));
        assert!(
            matches!(
                dec(&tagged(r#"{"f":"x","s":"R","t":[1,null,null]}"#)),
                Decoded::Corrupt(_)
            ),
            "a rejection needs a code"
        );
        assert!(matches!(dec("hello"), Decoded::Corrupt(_)));
        assert!(matches!(dec(""), Decoded::Corrupt(_)));
        assert!(
            enc(&record(None)).unwrap().is_none(),
            "PROCESSING is never encoded"
        );
    }

    #[test]
    fn an_untagged_or_wrongly_tagged_entry_is_forged_and_v1_is_another_version() {
        let json = r#"{"f":"x","s":"C","p":{"a":1},"t":[1,null,null]}"#;
        assert!(matches!(dec(&tagged(json)), Decoded::Record(_)));
        assert!(matches!(dec(&format!("v1:{json}")), Decoded::OtherVersion));
        let v2 = format!("v2:{}:{json}", signer().tag(&id(), json));
        assert!(
            matches!(dec(&v2), Decoded::OtherVersion),
            "tagged without the prefix"
        );
        assert!(matches!(dec(&format!("{TAG}{json}")), Decoded::Forged));
        let other_secret = Signer::new(&CacheSecret::new("d".repeat(32)).unwrap(), "idempotency:");
        let forged = format!("{TAG}{}:{json}", other_secret.tag(&id(), json));
        assert!(matches!(dec(&forged), Decoded::Forged));
        let unkeyed = format!(
            "{TAG}{}:{json}",
            Signer::unkeyed("idempotency:").tag(&id(), json)
        );
        assert!(matches!(dec(&unkeyed), Decoded::Forged));
        let changed = tagged(json).replace(r#"{"a":1}"#, r#"{"a":2}"#);
        assert!(matches!(dec(&changed), Decoded::Forged));
    }
}
