//! `Idempotency-Key` field values: `parse_key` and `parse_uuid_key` against the README grammar.
//!
//! Checks, for every input: the parser accepts exactly what the grammar accepts and returns the
//! key the grammar says; an accepted key is 1..=255 visible ASCII and means itself again in the
//! quoted (and, when possible, the bare) spelling; a UUID key is the grammar key in the
//! hyphenated form, lower-cased, and every case variant of it is the same key.

#![no_main]

use idempotency_axum::{InvalidKey, parse_key, parse_uuid_key};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|value: &[u8]| check(value));

fn check(value: &[u8]) {
    let parsed = parse_key(value).map(|key| key.into_inner());
    let expected = model_key(value);
    assert_eq!(
        parsed.as_ref().ok(),
        expected.as_ref(),
        "{value:?}: {parsed:?}"
    );

    if let Ok(key) = &parsed {
        assert!((1..=255).contains(&key.len()), "{key:?}");
        assert!(key.bytes().all(|b| (0x21..=0x7e).contains(&b)), "{key:?}");
        let requoted = parse_key(&quoted(key.as_bytes())).map(|k| k.into_inner());
        assert_eq!(requoted.as_ref(), Ok(key), "quoted spelling of {key:?}");
        if key.bytes().all(is_bare_char) {
            let bare = parse_key(key.as_bytes()).map(|k| k.into_inner());
            assert_eq!(bare.as_ref(), Ok(key), "bare spelling of {key:?}");
        }
    }

    let uuid_parsed = parse_uuid_key(value);
    let uuid_expected = model_uuid_key(value);
    assert_eq!(
        uuid_parsed.as_ref().ok().map(|(key, _)| key.as_str()),
        uuid_expected.as_deref(),
        "{value:?}: {uuid_parsed:?}"
    );
    match (&parsed, &uuid_parsed) {
        (Err(plain), Err(uuid)) => assert_eq!(plain, uuid, "{value:?}"),
        (Ok(_), Err(uuid)) => assert_eq!(*uuid, InvalidKey::NotUuid, "{value:?}"),
        (Ok(plain), Ok((key, uuid))) => {
            assert_eq!(key.as_str(), uuid.hyphenated().to_string());
            assert_eq!(plain.to_ascii_lowercase(), key.as_str());
            for variant in [plain.to_ascii_uppercase(), plain.to_ascii_lowercase()] {
                let again =
                    parse_uuid_key(&quoted(variant.as_bytes())).map(|(k, u)| (k.into_inner(), u));
                assert_eq!(again, Ok((key.as_str().to_owned(), *uuid)), "{variant:?}");
            }
        }
        (Err(_), Ok(_)) => panic!("{value:?}: a UUID key that is not a key"),
    }
}

fn quoted(key: &[u8]) -> Vec<u8> {
    let mut out = vec![b'"'];
    for &byte in key {
        if byte == b'"' || byte == b'\\' {
            out.push(b'\\');
        }
        out.push(byte);
    }
    out.push(b'"');
    out
}

// The reference model: the README grammar, written directly (the same model as
// crates/idempotency-axum/tests/header_properties.rs).

fn is_ows(byte: u8) -> bool {
    byte == b' ' || byte == b'\t'
}

/// `bare-char = %x21 / %x23-2B / %x2D-3A / %x3C-7E`
fn is_bare_char(byte: u8) -> bool {
    matches!(byte, 0x21 | 0x23..=0x2b | 0x2d..=0x3a | 0x3c..=0x7e)
}

/// `key-char = %x21 / %x23-5B / %x5D-7E`
fn is_key_char(byte: u8) -> bool {
    matches!(byte, 0x21 | 0x23..=0x5b | 0x5d..=0x7e)
}

fn model_key(value: &[u8]) -> Option<String> {
    let start = value
        .iter()
        .position(|&b| !is_ows(b))
        .unwrap_or(value.len());
    let end = value
        .iter()
        .rposition(|&b| !is_ows(b))
        .map_or(start, |i| i + 1);
    let value = &value[start..end];
    let key = if value.first() == Some(&b'"') {
        let mut key = Vec::new();
        let mut i = 1;
        loop {
            match *value.get(i)? {
                b'\\' => match *value.get(i + 1)? {
                    c @ (b'"' | b'\\') => {
                        key.push(c);
                        i += 2;
                    }
                    _ => return None,
                },
                b'"' if i + 1 == value.len() => break,
                c if is_key_char(c) => {
                    key.push(c);
                    i += 1;
                }
                _ => return None,
            }
        }
        key
    } else if value.iter().all(|&b| is_bare_char(b)) {
        value.to_vec()
    } else {
        return None;
    };
    if (1..=255).contains(&key.len()) {
        String::from_utf8(key).ok()
    } else {
        None
    }
}

fn model_uuid_key(value: &[u8]) -> Option<String> {
    let key = model_key(value)?.to_ascii_lowercase();
    let shaped = key.len() == 36
        && key.bytes().enumerate().all(|(i, b)| match i {
            8 | 13 | 18 | 23 => b == b'-',
            _ => b.is_ascii_hexdigit(),
        });
    let nil = "00000000-0000-0000-0000-000000000000";
    let max = "ffffffff-ffff-ffff-ffff-ffffffffffff";
    (shaped && key != nil && key != max).then_some(key)
}
