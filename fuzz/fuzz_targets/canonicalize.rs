//! JSON bytes: `serde_json::from_slice`, then the RFC 8785 canonicalizer and `JcsFingerprint`.
//!
//! Checks, for every input that is JSON: the canonical text is JSON that denotes the same value
//! and is a fixed point; the fingerprint (every algorithm) of the value, of the re-parsed
//! canonical text and of serde_json's own compact and pretty outputs are equal; the canonical
//! text has no whitespace outside strings; and, when every integer (and integral double) is
//! within +-2^53 (where RFC 8785 and the crate's large-integer deviation agree), the text equals
//! the one of an independent RFC 8785 implementation (`serde_json_canonicalizer`).

#![no_main]

use idempotency_core::fingerprint::canonicalize;
use idempotency_core::{FingerprintStrategy, HashAlgorithm, JcsFingerprint};
use libfuzzer_sys::fuzz_target;
use serde_json::Value;

const TWO_53: u64 = 1 << 53;

fuzz_target!(|data: &[u8]| {
    if let Ok(value) = serde_json::from_slice::<Value>(data) {
        check(&value);
    }
});

fn check(value: &Value) {
    let canonical = canonicalize(value);
    let reparsed: Value = serde_json::from_str(&canonical)
        .unwrap_or_else(|e| panic!("canonical text {canonical:?} is not JSON: {e}"));
    assert_eq!(canonicalize(&reparsed), canonical, "not a fixed point");
    assert!(same_value(value, &reparsed), "{value} became {reparsed}");
    assert!(no_whitespace_outside_strings(&canonical), "{canonical:?}");

    let compact: Value = serde_json::from_str(&serde_json::to_string(value).unwrap()).unwrap();
    let pretty: Value =
        serde_json::from_str(&serde_json::to_string_pretty(value).unwrap()).unwrap();
    assert_eq!(
        canonicalize(&compact),
        canonical,
        "compact serde_json output"
    );
    for algorithm in [
        HashAlgorithm::Sha256,
        HashAlgorithm::Sha384,
        HashAlgorithm::Sha512,
    ] {
        let strategy = JcsFingerprint::new(algorithm);
        let fingerprint = strategy.fingerprint(value).unwrap();
        assert_eq!(strategy.fingerprint(&reparsed).unwrap(), fingerprint);
        assert_eq!(strategy.fingerprint(&pretty).unwrap(), fingerprint);
    }

    if integers_within_2_53(value) {
        let reference = serde_json_canonicalizer::to_string(value).unwrap();
        assert_eq!(
            canonical, reference,
            "differs from serde_json_canonicalizer"
        );
    }
}

/// JSON equality with numbers compared by value: integers exactly, anything involving a double
/// as doubles (`-0` equals `0`).
fn same_value(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => match (x.as_i128(), y.as_i128()) {
            (Some(x), Some(y)) => x == y,
            _ => x.as_f64() == y.as_f64(),
        },
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(x, y)| same_value(x, y))
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len()
                && x.iter()
                    .all(|(k, v)| y.get(k).is_some_and(|w| same_value(v, w)))
        }
        _ => a == b,
    }
}

fn integers_within_2_53(value: &Value) -> bool {
    match value {
        // Integers beyond 2^53, and integral doubles from 2^53 to the 64-bit range, are the
        // documented deviation from RFC 8785: they keep their exact digits.
        Value::Number(n) => match n.as_i128() {
            Some(i) => i.unsigned_abs() <= u128::from(TWO_53),
            None => n.as_f64().is_none_or(|f| {
                f.fract() != 0.0
                    || f.abs() < TWO_53 as f64
                    || f.abs() >= 18_446_744_073_709_551_616.0
            }),
        },
        Value::Array(items) => items.iter().all(integers_within_2_53),
        Value::Object(map) => map.values().all(integers_within_2_53),
        _ => true,
    }
}

fn no_whitespace_outside_strings(text: &str) -> bool {
    let mut in_string = false;
    let mut escaped = false;
    for byte in text.bytes() {
        match (in_string, escaped, byte) {
            (true, true, _) => escaped = false,
            (true, false, b'\\') => escaped = true,
            (true, false, b'"') => in_string = false,
            (true, false, _) => {}
            (false, _, b'"') => in_string = true,
            (false, _, b' ' | b'\t' | b'\n' | b'\r') => return false,
            (false, _, _) => {}
        }
    }
    !in_string
}
