//! Property tests of the `Idempotency-Key` header parser ([`parse_key`], [`parse_uuid_key`])
//! against the grammar in the crate README.
//!
//! The parser is compared with an independent reference model of the grammar (`model_key`,
//! written from the README's ABNF, not from `src/header.rs`) on arbitrary bytes, on bytes drawn
//! from the grammar's interesting characters and on mutated valid spellings. Valid keys
//! round-trip through the bare and the quoted spelling; lists, parameters, controls and
//! non-ASCII are refused with their documented reason.
//!
//! 256 cases per property by default; `PROPTEST_CASES=100000 cargo test -p idempotency-axum
//! --test header_properties --release` for a deep run.

#![allow(clippy::unwrap_used)] // tests fail loudly on unexpected errors

use idempotency_axum::{InvalidKey, parse_key, parse_uuid_key};
use proptest::prelude::*;
use proptest::sample::{Index, select};
use proptest::test_runner::Config;
use uuid::Uuid;

/// Cases per property when `PROPTEST_CASES` is not set.
const DEFAULT_CASES: u32 = 256;

/// The default config (which reads the `PROPTEST_*` environment variables) with a fast default
/// case count. Failures are not persisted to files: a failing input is kept as a `#[test]`.
fn config() -> Config {
    let mut config = Config::default();
    if std::env::var_os("PROPTEST_CASES").is_none() {
        config.cases = DEFAULT_CASES;
    }
    config.failure_persistence = None;
    config
}

// ---------------------------------------------------------------------------------------------
// The reference model: the README grammar, written directly.
// ---------------------------------------------------------------------------------------------

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

/// The key a field value stands for under the README grammar, or `None` when it is refused.
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
                // The closing quote must end the value (OWS was trimmed).
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

/// The UUID key a field value stands for: a model key in the hyphenated 8-4-4-4-12 form, not
/// nil nor max, lower-cased.
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

// ---------------------------------------------------------------------------------------------
// Spellings and generators.
// ---------------------------------------------------------------------------------------------

/// The RFC 8941 sf-string spelling of `key`: `"` and `\` escaped.
fn quoted(key: &str) -> Vec<u8> {
    quoted_bytes(key.as_bytes())
}

/// [`quoted`] for keys that are not text (to build refused values).
fn quoted_bytes(key: &[u8]) -> Vec<u8> {
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

fn surrounded(ows_before: &[u8], spelling: &[u8], ows_after: &[u8]) -> Vec<u8> {
    [ows_before, spelling, ows_after].concat()
}

/// Optional whitespace: up to three spaces or tabs.
fn ows() -> impl Strategy<Value = Vec<u8>> {
    prop::collection::vec(select(&b" \t"[..]), 0..=3)
}

/// A visible ASCII character, often one the grammar treats specially.
fn key_char() -> impl Strategy<Value = u8> {
    prop_oneof![
        3 => 0x21u8..=0x7e,
        1 => select(&b"\"\\,;=-"[..]),
    ]
}

/// Any valid key: 1 to 255 visible ASCII characters (quotes, backslashes, commas included).
fn valid_key() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => prop::collection::vec(key_char(), 1..=40),
        1 => prop::collection::vec(key_char(), 1..=255),
        1 => prop::collection::vec(key_char(), 250..=255),
    ]
    .prop_map(|bytes| String::from_utf8(bytes).unwrap())
}

/// A valid key that can also be sent bare (no `"`, `,` or `;`).
fn bare_key(len: std::ops::RangeInclusive<usize>) -> impl Strategy<Value = String> {
    let bare_chars: Vec<u8> = (0x21u8..=0x7e).filter(|&b| is_bare_char(b)).collect();
    prop::collection::vec(select(bare_chars), len)
        .prop_map(|bytes| String::from_utf8(bytes).unwrap())
}

/// Bytes the grammar cares about, to reach deep parser states more often than random bytes.
const INTERESTING: &[u8] = b"\"\\,;= \tab-9\x00\x01\x1f\x7f\x80\xc3\xa9\xff";

/// A valid spelling (bare or quoted, with OWS) changed by one insertion, deletion or
/// replacement of a byte.
fn mutated_spelling() -> impl Strategy<Value = Vec<u8>> {
    (
        valid_key(),
        any::<bool>(),
        ows(),
        ows(),
        0u8..3,
        any::<Index>(),
        prop_oneof![select(INTERESTING), any::<u8>()],
    )
        .prop_map(|(key, bare, before, after, op, at, byte)| {
            let spelling = if bare { key.into_bytes() } else { quoted(&key) };
            let mut value = surrounded(&before, &spelling, &after);
            let i = at.index(value.len() + 1);
            match op {
                0 => value.insert(i, byte),
                1 if i < value.len() => {
                    value.remove(i);
                }
                _ if i < value.len() => value[i] = byte,
                _ => value.push(byte),
            }
            value
        })
}

/// Field values of every kind: random bytes, bytes from [`INTERESTING`], mutated spellings.
fn field_value() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        prop::collection::vec(any::<u8>(), 0..300),
        prop::collection::vec(select(INTERESTING), 0..24),
        mutated_spelling(),
    ]
}

/// A UUID that is neither nil nor max.
fn some_uuid() -> impl Strategy<Value = Uuid> {
    any::<u128>()
        .prop_filter("not nil nor max", |&n| n != 0 && n != u128::MAX)
        .prop_map(Uuid::from_u128)
}

/// `text` with the letters at the positions where `upper` is true in upper case.
fn with_case(text: &str, upper: &[bool]) -> String {
    text.chars()
        .zip(upper.iter().chain(std::iter::repeat(&false)))
        .map(|(c, &up)| if up { c.to_ascii_uppercase() } else { c })
        .collect()
}

// ---------------------------------------------------------------------------------------------
// Properties.
// ---------------------------------------------------------------------------------------------

proptest! {
    #![proptest_config(config())]

    /// Any bytes: no panic, and exactly the values the grammar accepts are accepted, as the
    /// key the grammar says.
    #[test]
    fn parse_key_agrees_with_the_grammar(value in field_value()) {
        let parsed = parse_key(&value).map(|key| key.into_inner());
        let expected = model_key(&value);
        prop_assert_eq!(parsed.as_ref().ok(), expected.as_ref(), "{:?}", parsed);
        if let Ok(key) = &parsed {
            prop_assert!((1..=255).contains(&key.len()));
            prop_assert!(key.bytes().all(|b| (0x21..=0x7e).contains(&b)), "{key:?}");
        }
    }

    /// Any bytes: a UUID key is exactly a grammar key in the hyphenated form, lower-cased.
    #[test]
    fn parse_uuid_key_agrees_with_the_grammar(value in field_value()) {
        let parsed = parse_uuid_key(&value);
        let expected = model_uuid_key(&value);
        prop_assert_eq!(
            parsed.as_ref().ok().map(|(key, _)| key.as_str()),
            expected.as_deref()
        );
        if let Ok((key, uuid)) = &parsed {
            prop_assert_eq!(key.as_str(), uuid.hyphenated().to_string());
            let plain = parse_key(&value).unwrap();
            prop_assert_eq!(plain.as_str().to_ascii_lowercase(), key.as_str());
        } else if parse_key(&value).is_ok() {
            prop_assert_eq!(parsed.unwrap_err(), InvalidKey::NotUuid);
        }
    }

    /// A valid key means itself in the quoted spelling, and in the bare one when it has no
    /// `"`, `,` or `;` (and never otherwise); OWS around either does not matter.
    #[test]
    fn valid_keys_round_trip(key in valid_key(), before in ows(), after in ows()) {
        let quoted_value = surrounded(&before, &quoted(&key), &after);
        prop_assert_eq!(parse_key(&quoted_value).unwrap().into_inner(), key.as_str());
        let bare_value = surrounded(&before, key.as_bytes(), &after);
        let bare = parse_key(&bare_value).map(|k| k.into_inner());
        if key.bytes().all(is_bare_char) {
            prop_assert_eq!(bare.unwrap(), key.as_str());
        } else {
            // Refused, or (starting with `"`) read as a quoted key, which is another key.
            prop_assert_ne!(bare.ok(), Some(key));
        }
    }

    /// Longer than 255 characters after unescaping is refused in both spellings.
    #[test]
    fn too_long_keys_are_refused(key in bare_key(256..=400), quote_count in 0usize..4) {
        prop_assert_eq!(
            parse_key(key.as_bytes()),
            Err(InvalidKey::TooLong { len: key.len() })
        );
        // Escapes count once: 255 characters of which some are `"` is still a valid key.
        let mut exact: String = key[..255 - quote_count].to_owned();
        exact.push_str(&"\"".repeat(quote_count));
        prop_assert_eq!(parse_key(&quoted(&exact)).unwrap().into_inner(), exact.as_str());
        prop_assert_eq!(
            parse_key(&quoted(&key)),
            Err(InvalidKey::TooLong { len: key.len() })
        );
    }

    /// Two or more keys, bare or quoted, with or without spaces after the comma: `list`.
    #[test]
    fn lists_are_refused(
        first in bare_key(1..=20),
        second in valid_key(),
        first_quoted in any::<bool>(),
        second_quoted in any::<bool>(),
        space in ows(),
    ) {
        let head = if first_quoted { quoted(&first) } else { first.clone().into_bytes() };
        let tail = if second_quoted { quoted(&second) } else { second.clone().into_bytes() };
        let value = [&head[..], b",", &space, &tail].concat();
        prop_assert_eq!(parse_key(&value), Err(InvalidKey::List), "{:?}", String::from_utf8_lossy(&value));
        prop_assert!(parse_uuid_key(&value).is_err());
    }

    /// A key with parameters, bare or quoted: `parameters`.
    #[test]
    fn parameters_are_refused(
        key in valid_key(),
        name in "[a-z*][a-z0-9_.*-]{0,8}",
        param_value in prop_oneof![Just(String::new()), "=[a-z0-9]{1,8}", "=\"[a-z ]{0,8}\""],
        space in ows(),
    ) {
        let params = format!(";{name}{param_value}");
        let value = [&quoted(&key)[..], &space, params.as_bytes()].concat();
        prop_assert_eq!(parse_key(&value), Err(InvalidKey::Parameters), "{:?}", String::from_utf8_lossy(&value));
        let bare: String = key.chars().filter(|&c| is_bare_char(c as u8)).collect();
        if !bare.is_empty() {
            let value = [bare.as_bytes(), params.as_bytes()].concat();
            prop_assert_eq!(parse_key(&value), Err(InvalidKey::Parameters), "{:?}", String::from_utf8_lossy(&value));
        }
    }

    /// A control character, DEL or a space inside a key, bare or quoted: `invalid-character`.
    #[test]
    fn controls_and_spaces_are_refused(
        head in bare_key(1..=100),
        tail in bare_key(1..=100),
        bad in prop_oneof![0u8..=0x20, Just(0x7f)],
        is_quoted in any::<bool>(),
    ) {
        let key = [head.as_bytes(), &[bad], tail.as_bytes()].concat();
        let value = if is_quoted { quoted_bytes(&key) } else { key };
        prop_assert_eq!(parse_key(&value), Err(InvalidKey::InvalidCharacter), "{:?}", value);
    }

    /// Non-ASCII anywhere in a key (a UTF-8 character or a lone high byte), bare or quoted:
    /// `invalid-character`.
    #[test]
    fn non_ascii_is_refused(
        head in bare_key(0..=50),
        tail in bare_key(0..=50),
        bad in prop_oneof![
            prop_oneof![0x80u32..0xd800, 0xe000u32..=0x10ffff]
                .prop_map(|n| char::from_u32(n).unwrap().to_string().into_bytes()),
            (0x80u8..=0xff).prop_map(|b| vec![b]),
        ],
        is_quoted in any::<bool>(),
    ) {
        let key = [head.as_bytes(), &bad, tail.as_bytes()].concat();
        let value = if is_quoted { quoted_bytes(&key) } else { key };
        prop_assert_eq!(parse_key(&value), Err(InvalidKey::InvalidCharacter), "{:?}", value);
    }

    /// Any case variant of a UUID, bare or quoted, is one key: the lower-case hyphenated form.
    #[test]
    fn uuid_case_variants_are_one_key(
        uuid in some_uuid(),
        upper in prop::collection::vec(any::<bool>(), 36),
        is_quoted in any::<bool>(),
        before in ows(),
        after in ows(),
    ) {
        let lower = uuid.hyphenated().to_string();
        let spelled = with_case(&lower, &upper);
        let spelling = if is_quoted { quoted(&spelled) } else { spelled.clone().into_bytes() };
        let value = surrounded(&before, &spelling, &after);
        let (key, parsed) = parse_uuid_key(&value).unwrap();
        prop_assert_eq!(key.as_str(), lower.as_str());
        prop_assert_eq!(parsed, uuid);
        // The plain parser keeps the client's spelling.
        prop_assert_eq!(parse_key(&value).unwrap().into_inner(), spelled.as_str());
    }

    /// Simple, braced and URN forms are valid keys but not UUID keys.
    #[test]
    fn other_uuid_forms_are_refused(uuid in some_uuid(), upper in any::<bool>(), form in 0u8..3) {
        let text = match form {
            0 => uuid.simple().to_string(),
            1 => uuid.braced().to_string(),
            _ => uuid.urn().to_string(),
        };
        let text = if upper { text.to_ascii_uppercase() } else { text };
        prop_assert!(parse_key(text.as_bytes()).is_ok());
        prop_assert_eq!(parse_uuid_key(text.as_bytes()).unwrap_err(), InvalidKey::NotUuid);
    }
}

/// The nil and max UUIDs are refused in every case variant.
#[test]
fn nil_and_max_uuids_are_refused() {
    for text in [
        "00000000-0000-0000-0000-000000000000",
        "ffffffff-ffff-ffff-ffff-ffffffffffff",
        "FFFFFFFF-FFFF-FFFF-FFFF-FFFFFFFFFFFF",
        "\"fFfFfFfF-ffff-FFFF-ffff-FFFFFFFFFFFF\"",
    ] {
        assert_eq!(
            parse_uuid_key(text.as_bytes()).unwrap_err(),
            InvalidKey::NotUuid,
            "{text}"
        );
    }
}

/// The reference model itself, on the README's examples, so a wrong model cannot make the
/// properties pass vacuously.
#[test]
fn model_follows_the_readme_examples() {
    assert_eq!(model_key(b"abc").as_deref(), Some("abc"));
    assert_eq!(model_key(b" \t\"abc\"\t ").as_deref(), Some("abc"));
    assert_eq!(model_key(br#""a\"b""#).as_deref(), Some("a\"b"));
    assert_eq!(model_key(br#""a\\b""#).as_deref(), Some("a\\b"));
    assert_eq!(model_key(br#""a,b;c""#).as_deref(), Some("a,b;c"));
    for refused in [
        &b""[..],
        b"\"\"",
        br#""a b""#,
        br#""a\nb""#,
        br#""a", "b""#,
        b"a,b",
        br#""a";x=1"#,
        b"a;x=1",
        b"a\"b",
        br#""abc"#,
        br#""a" "b""#,
        "é".as_bytes(),
    ] {
        assert_eq!(model_key(refused), None, "{refused:?}");
    }
    assert_eq!(model_key(&[b'a'; 255]).map(|k| k.len()), Some(255));
    assert_eq!(model_key(&[b'a'; 256]), None);
    assert_eq!(
        model_uuid_key(b"\"8E03978E-40D5-43E8-BC93-6894A57F9324\"").as_deref(),
        Some("8e03978e-40d5-43e8-bc93-6894a57f9324")
    );
    assert_eq!(
        model_uuid_key(b"{8e03978e-40d5-43e8-bc93-6894a57f9324}"),
        None
    );
}
