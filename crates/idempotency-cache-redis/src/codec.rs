//! The cached value: a version tag, then the record as JSON.

use idempotency_core::IdempotencyRecord;

/// The current format tag. Entries with another tag read as a miss (written by a newer or older
/// release), never as an error.
const TAG: &str = "v1:";

pub(crate) fn encode(record: &IdempotencyRecord) -> Result<String, serde_json::Error> {
    let mut out = String::from(TAG);
    out.push_str(&serde_json::to_string(record)?);
    Ok(out)
}

/// What a stored value turned out to be.
#[derive(Debug)]
pub(crate) enum Decoded {
    Record(IdempotencyRecord),
    OtherVersion,
    Corrupt(serde_json::Error),
}

pub(crate) fn decode(value: &str) -> Decoded {
    match value.strip_prefix(TAG) {
        Some(json) => match serde_json::from_str::<IdempotencyRecord>(json) {
            Ok(record) if record.is_terminal() => Decoded::Record(record),
            Ok(_) => Decoded::Corrupt(serde_json::Error::io(std::io::Error::other(
                "a PROCESSING record was cached",
            ))),
            Err(error) => Decoded::Corrupt(error),
        },
        None if is_version_tag(value) => Decoded::OtherVersion,
        None => Decoded::Corrupt(serde_json::Error::io(std::io::Error::other(
            "no version tag",
        ))),
    }
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
    use std::time::SystemTime;

    use idempotency_core::{Fingerprint, StoredOutcome};

    use super::*;

    fn record(outcome: Option<StoredOutcome>) -> IdempotencyRecord {
        IdempotencyRecord {
            fingerprint: Fingerprint::new("f".repeat(64)),
            outcome,
            created_at: SystemTime::UNIX_EPOCH,
            completed_at: None,
            expires_at: Some(SystemTime::now()),
        }
    }

    #[test]
    fn round_trip() {
        let original = record(Some(StoredOutcome::Rejected {
            code: "NO".into(),
            details: Some("{\"a\":1}".into()),
        }));
        let Decoded::Record(back) = decode(&encode(&original).unwrap()) else {
            panic!()
        };
        assert_eq!(back, original);
    }

    #[test]
    fn other_versions_are_misses_and_garbage_is_corrupt() {
        assert!(matches!(
            decode("v2:{\"whatever\":true}"),
            Decoded::OtherVersion
        ));
        assert!(matches!(decode("v1:{not json"), Decoded::Corrupt(_)));
        assert!(matches!(decode("hello"), Decoded::Corrupt(_)));
        assert!(matches!(decode(""), Decoded::Corrupt(_)));
        let processing = encode(&record(None)).unwrap();
        assert!(matches!(decode(&processing), Decoded::Corrupt(_)));
    }
}
