//! The `Idempotency-Key` header grammar: a bare key or an RFC 8941 sf-string.

use axum::http::{HeaderMap, HeaderName};
use idempotency_core::{IdempotencyKey, KeyError, MAX_KEY_LEN};
use uuid::Uuid;

/// The request header carrying the key (`Idempotency-Key`; names are case-insensitive).
pub static IDEMPOTENCY_KEY: HeaderName = HeaderName::from_static("idempotency-key");

/// The response header set on replays: `Idempotent-Replayed: true`.
pub static IDEMPOTENT_REPLAYED: HeaderName = HeaderName::from_static("idempotent-replayed");

/// Why an `Idempotency-Key` header value was refused. [`code`](Self::code) is the `reason`
/// member of the `idempotency-key-invalid` problem.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum InvalidKey {
    /// The key is empty (`Idempotency-Key:` or `Idempotency-Key: ""`).
    #[error("the Idempotency-Key is empty")]
    Empty,
    /// The key is longer than 255 characters.
    #[error("the Idempotency-Key is {len} characters long; at most 255 are allowed")]
    TooLong {
        /// Its length, after unquoting.
        len: usize,
    },
    /// The key holds a character outside visible ASCII (`0x21..=0x7E`): a space, a control
    /// character or a non-ASCII byte.
    #[error("the Idempotency-Key contains a character outside visible ASCII")]
    InvalidCharacter,
    /// A quoted key is not a valid sf-string: no closing quote, an escape other than `\"` or
    /// `\\`, a stray `"` in a bare key, or text after the closing quote.
    #[error("the Idempotency-Key is not a valid bare key nor a valid quoted string")]
    Malformed,
    /// The value is a list (`"a", "b"` or `a,b`); exactly one key is allowed.
    #[error("the Idempotency-Key holds a list; send exactly one key")]
    List,
    /// The value has parameters (`"a";x=1` or `a;x=1`), which the header does not define.
    #[error("the Idempotency-Key has parameters, which are not allowed")]
    Parameters,
    /// The header was given more than once.
    #[error("the Idempotency-Key header was given more than once")]
    Repeated,
    /// The endpoint asks for a UUID and the key is not one (or is the nil or max UUID).
    #[error(
        "this endpoint requires the Idempotency-Key to be a UUID (8-4-4-4-12 hexadecimal digits)"
    )]
    NotUuid,
}

impl InvalidKey {
    /// A stable machine-readable code: `empty`, `too-long`, `invalid-character`, `malformed`,
    /// `list`, `parameters`, `repeated` or `not-uuid`.
    pub fn code(self) -> &'static str {
        match self {
            Self::Empty => "empty",
            Self::TooLong { .. } => "too-long",
            Self::InvalidCharacter => "invalid-character",
            Self::Malformed => "malformed",
            Self::List => "list",
            Self::Parameters => "parameters",
            Self::Repeated => "repeated",
            Self::NotUuid => "not-uuid",
        }
    }
}

impl From<KeyError> for InvalidKey {
    fn from(error: KeyError) -> Self {
        match error {
            KeyError::Empty { .. } => Self::Empty,
            KeyError::TooLong { len, .. } => Self::TooLong { len },
            _ => Self::InvalidCharacter,
        }
    }
}

/// Parses one `Idempotency-Key` field value (the grammar is in the crate docs).
///
/// ```
/// use idempotency_axum::{InvalidKey, parse_key};
///
/// assert_eq!(parse_key(b"abc-123")?.as_str(), "abc-123");
/// assert_eq!(parse_key(br#""abc-123""#)?.as_str(), "abc-123");
/// assert_eq!(parse_key(br#""a\"b""#)?.as_str(), r#"a"b"#);
/// assert_eq!(parse_key(br#""a", "b""#), Err(InvalidKey::List));
/// assert_eq!(parse_key(br#""a";x=1"#), Err(InvalidKey::Parameters));
/// assert_eq!(parse_key(b"has space"), Err(InvalidKey::InvalidCharacter));
/// # Ok::<(), InvalidKey>(())
/// ```
pub fn parse_key(value: &[u8]) -> Result<IdempotencyKey, InvalidKey> {
    let value = trim_ows(value);
    match value.first() {
        Some(b'"') => parse_sf_string(value),
        _ => parse_bare(value),
    }
}

/// Parses one field value as a UUID key and normalizes it to lower-case hyphenated form.
///
/// ```
/// use idempotency_axum::{InvalidKey, parse_uuid_key};
///
/// let (key, uuid) = parse_uuid_key(b"\"8E03978E-40D5-43E8-BC93-6894A57F9324\"")?;
/// assert_eq!(key.as_str(), "8e03978e-40d5-43e8-bc93-6894a57f9324");
/// assert_eq!(uuid.get_version_num(), 4);
/// assert_eq!(parse_uuid_key(b"not-a-uuid").unwrap_err(), InvalidKey::NotUuid);
/// # Ok::<(), InvalidKey>(())
/// ```
pub fn parse_uuid_key(value: &[u8]) -> Result<(IdempotencyKey, Uuid), InvalidKey> {
    let key = parse_key(value)?;
    // Only the hyphenated form: `Uuid::try_parse` also takes simple, braced and URN forms,
    // which are longer or shorter than 36.
    if key.as_str().len() != 36 {
        return Err(InvalidKey::NotUuid);
    }
    let uuid = Uuid::try_parse(key.as_str()).map_err(|_| InvalidKey::NotUuid)?;
    if uuid.is_nil() || uuid.is_max() {
        return Err(InvalidKey::NotUuid);
    }
    let normalized = IdempotencyKey::new(uuid.hyphenated().to_string())?;
    Ok((normalized, uuid))
}

/// The single `Idempotency-Key` value of `headers`: `Ok(None)` when absent, an error when
/// repeated.
pub(crate) fn single_value(headers: &HeaderMap) -> Result<Option<&[u8]>, InvalidKey> {
    let mut values = headers.get_all(&IDEMPOTENCY_KEY).iter();
    let Some(first) = values.next() else {
        return Ok(None);
    };
    if values.next().is_some() {
        return Err(InvalidKey::Repeated);
    }
    Ok(Some(first.as_bytes()))
}

fn trim_ows(mut value: &[u8]) -> &[u8] {
    while let [b' ' | b'\t', rest @ ..] = value {
        value = rest;
    }
    while let [rest @ .., b' ' | b'\t'] = value {
        value = rest;
    }
    value
}

fn parse_bare(value: &[u8]) -> Result<IdempotencyKey, InvalidKey> {
    if value.contains(&b',') {
        return Err(InvalidKey::List);
    }
    if value.contains(&b';') {
        return Err(InvalidKey::Parameters);
    }
    if value.contains(&b'"') {
        return Err(InvalidKey::Malformed);
    }
    key_from_bytes(value)
}

/// RFC 8941 section 4.2.5: `DQUOTE *( unescaped / "\" ( DQUOTE / "\" ) ) DQUOTE`, where
/// `unescaped` is `%x20-21 / %x23-5B / %x5D-7E`.
fn parse_sf_string(value: &[u8]) -> Result<IdempotencyKey, InvalidKey> {
    let mut out = Vec::with_capacity(value.len());
    let mut i = 1;
    loop {
        match value.get(i) {
            None => return Err(InvalidKey::Malformed),
            Some(b'\\') => match value.get(i + 1) {
                Some(&c @ (b'"' | b'\\')) => {
                    out.push(c);
                    i += 2;
                }
                _ => return Err(InvalidKey::Malformed),
            },
            Some(b'"') => {
                i += 1;
                break;
            }
            Some(&c @ 0x20..=0x7e) => {
                out.push(c);
                i += 1;
            }
            Some(_) => return Err(InvalidKey::InvalidCharacter),
        }
    }
    match value.get(i..).map(trim_ows).and_then(<[u8]>::first) {
        None => key_from_bytes(&out),
        Some(b';') => Err(InvalidKey::Parameters),
        Some(b',') => Err(InvalidKey::List),
        Some(_) => Err(InvalidKey::Malformed),
    }
}

fn key_from_bytes(bytes: &[u8]) -> Result<IdempotencyKey, InvalidKey> {
    if bytes.len() > MAX_KEY_LEN {
        return Err(InvalidKey::TooLong { len: bytes.len() });
    }
    let text = std::str::from_utf8(bytes).map_err(|_| InvalidKey::InvalidCharacter)?;
    Ok(IdempotencyKey::new(text)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(value: &[u8]) -> String {
        parse_key(value).unwrap().into_inner()
    }

    #[test]
    fn bare_and_quoted_forms_give_the_same_key() {
        assert_eq!(ok(b"k-1"), "k-1");
        assert_eq!(ok(b"\"k-1\""), "k-1");
        assert_eq!(ok(b"  \t\"k-1\" \t"), "k-1");
        assert_eq!(ok(b" k-1 "), "k-1");
    }

    #[test]
    fn escapes_and_separators_inside_quotes() {
        assert_eq!(ok(br#""a\\b""#), r"a\b");
        assert_eq!(ok(br#""a\"b""#), "a\"b");
        assert_eq!(ok(br#""a,b;c""#), "a,b;c");
        assert_eq!(parse_key(br#""a\nb""#), Err(InvalidKey::Malformed));
        assert_eq!(parse_key(br#""a\"#), Err(InvalidKey::Malformed));
        assert_eq!(parse_key(br#""abc"#), Err(InvalidKey::Malformed));
        assert_eq!(parse_key(br#""a"b"#), Err(InvalidKey::Malformed));
        assert_eq!(parse_key(br#""a" "b""#), Err(InvalidKey::Malformed));
    }

    #[test]
    fn empty_long_and_bad_characters() {
        assert_eq!(parse_key(b""), Err(InvalidKey::Empty));
        assert_eq!(parse_key(b"  "), Err(InvalidKey::Empty));
        assert_eq!(parse_key(b"\"\""), Err(InvalidKey::Empty));
        assert_eq!(ok(&[b'a'; 255]).len(), 255);
        assert_eq!(
            parse_key(&[b'a'; 256]),
            Err(InvalidKey::TooLong { len: 256 })
        );
        let mut quoted = vec![b'"'];
        quoted.extend([b'a'; 256]);
        quoted.push(b'"');
        assert_eq!(parse_key(&quoted), Err(InvalidKey::TooLong { len: 256 }));
        for bad in [
            &b"a b"[..],
            b"a\tb",
            b"a\x00b",
            b"a\x7fb",
            "é".as_bytes(),
            b"\xff",
        ] {
            assert_eq!(parse_key(bad), Err(InvalidKey::InvalidCharacter), "{bad:?}");
        }
        for bad in [
            &b"\"a b\""[..],
            b"\"a\tb\"",
            "\"é\"".as_bytes(),
            b"\"a\x01\"",
        ] {
            assert_eq!(parse_key(bad), Err(InvalidKey::InvalidCharacter), "{bad:?}");
        }
    }

    #[test]
    fn lists_and_parameters() {
        assert_eq!(parse_key(br#""a", "b""#), Err(InvalidKey::List));
        assert_eq!(parse_key(br#""a","b""#), Err(InvalidKey::List));
        assert_eq!(parse_key(b"a,b"), Err(InvalidKey::List));
        assert_eq!(parse_key(b"a, b"), Err(InvalidKey::List));
        assert_eq!(parse_key(br#""a";x=1"#), Err(InvalidKey::Parameters));
        assert_eq!(parse_key(b"a;x=1"), Err(InvalidKey::Parameters));
        assert_eq!(parse_key(b"a\"b"), Err(InvalidKey::Malformed));
    }

    #[test]
    fn uuid_keys() {
        let (key, _) = parse_uuid_key(b"8E03978E-40D5-43E8-BC93-6894A57F9324").unwrap();
        assert_eq!(key.as_str(), "8e03978e-40d5-43e8-bc93-6894a57f9324");
        for bad in [
            &b"8e03978e40d543e8bc936894a57f9324"[..],
            b"{8e03978e-40d5-43e8-bc93-6894a57f9324}",
            b"urn:uuid:8e03978e-40d5-43e8-bc93-6894a57f9324",
            b"8e03978e-40d5-43e8-bc93-6894a57f932g",
            b"00000000-0000-0000-0000-000000000000",
            b"ffffffff-ffff-ffff-ffff-ffffffffffff",
            b"8e03978e+40d5-43e8-bc93-6894a57f9324",
        ] {
            assert_eq!(
                parse_uuid_key(bad).unwrap_err(),
                InvalidKey::NotUuid,
                "{bad:?}"
            );
        }
        assert_eq!(parse_uuid_key(b"").unwrap_err(), InvalidKey::Empty);
    }
}
