//! How result values and rejection details become stored text, and back.

use serde::Serialize;
use serde::de::DeserializeOwned;

/// A stored payload could not be written or read back.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SerializationError {
    /// The value could not be serialized.
    #[error("the result could not be serialized")]
    Serialize(#[source] serde_json::Error),
    /// The stored text could not be read as the expected type (the type changed since it was
    /// stored, or the payload is corrupt).
    #[error("the stored result could not be deserialized into the expected type")]
    Deserialize(#[source] serde_json::Error),
    /// A custom serializer failed.
    #[error("result serializer failed: {0}")]
    Custom(String),
    /// A rejection code is empty or longer than [`MAX_REJECTION_CODE_LEN`] characters, so it
    /// cannot be stored. Nothing was written; the transaction must be rolled back.
    #[error(
        "a rejection code must be 1 to {MAX_REJECTION_CODE_LEN} characters long, this one has {len}"
    )]
    RejectionCode {
        /// The length of the code, in characters.
        len: usize,
    },
    /// The stored text of a result (or of a rejection's details) nests JSON deeper than
    /// [`MAX_JSON_DEPTH`](crate::MAX_JSON_DEPTH), which not every backend can store. Found
    /// after the action ran and before anything of its outcome was written: `execute` rolls
    /// the transaction back (the action's changes with it), `execute_in`'s caller must. A
    /// retry of the same request runs the action again (the depth is known only once the
    /// action returned its result) and fails the same way; keep results shallower.
    #[error("the result cannot be stored")]
    TooDeep(#[from] crate::JsonTooDeep),
}

/// The longest rejection code a store keeps (the `error_code` column is `VARCHAR(128)`).
pub const MAX_REJECTION_CODE_LEN: usize = 128;

/// Turns result values into stored text and back.
///
/// The stored text must be a JSON document, because stores keep it in JSON columns (`JSONB` on
/// PostgreSQL). Replace the default to encrypt or sign payloads at rest, wrapping the JSON.
/// The service checks the text it returns against [`MAX_JSON_DEPTH`](crate::MAX_JSON_DEPTH)
/// (envelope included) before anything is written: deeper is [`SerializationError::TooDeep`].
pub trait ResultSerializer: Send + Sync + std::fmt::Debug + 'static {
    /// The stored JSON text of `value`.
    fn serialize<T: Serialize + ?Sized>(&self, value: &T) -> Result<String, SerializationError>;
    /// Reads `stored` back into a `T`.
    fn deserialize<T: DeserializeOwned>(&self, stored: &str) -> Result<T, SerializationError>;
    /// Whether the stored text of a value is exactly `serde_json::to_string(value)`, so that
    /// a replay may answer the stored text itself as the value's JSON instead of serializing
    /// the value read back from it ([`Outcome::stored_json`](crate::Outcome::stored_json)).
    /// `false` unless a serializer says so: an encrypting or signing one must not.
    fn stores_plain_json(&self) -> bool {
        false
    }
}

/// Whether `text` is spelled as `serde_json` spells what it writes, as far as a replay
/// answering it as is must know: no whitespace outside strings, and no number that a `jsonb`
/// column may have rewritten from an exponent (longer than 15 characters, or a fraction
/// starting with four zeros). Rows from the `jsonb` era (`{"a": 1}`, keys reordered) fail, and
/// are serialized again on replay as they always were.
///
/// Called on every replay of a success, so the common case is one pass without branches: an
/// object with no byte at or below the space anywhere (JSON has no raw control characters) is
/// compact, and a `jsonb` column never spells a non-empty object without `": "`.
pub(crate) fn is_compact_json(text: &str) -> bool {
    let bytes = text.as_bytes();
    // `fold` rather than `all`: no early exit, so the loop vectorizes.
    let spaceless = bytes
        .iter()
        .fold(true, |spaceless, &byte| spaceless & (byte > b' '));
    if spaceless && bytes.first() == Some(&b'{') {
        return true;
    }
    is_compact_json_scanned(bytes)
}

/// [`is_compact_json`] token by token: whitespace outside strings, and long numbers.
fn is_compact_json_scanned(bytes: &[u8]) -> bool {
    fn plain_number(token: &[u8]) -> bool {
        let digits = token.strip_prefix(b"-").unwrap_or(token);
        token.len() <= 15 && !digits.starts_with(b"0.0000")
    }
    let (mut in_string, mut escaped) = (false, false);
    let mut number: Option<usize> = None;
    for (i, &byte) in bytes.iter().enumerate() {
        if in_string {
            if escaped {
                escaped = false;
            } else if byte == b'\\' {
                escaped = true;
            } else if byte == b'"' {
                in_string = false;
            }
            continue;
        }
        let numeric = byte == b'-' || byte.is_ascii_digit();
        if number.is_some() && (numeric || matches!(byte, b'.' | b'e' | b'E' | b'+')) {
            continue;
        }
        if let Some(start) = number.take()
            && !plain_number(&bytes[start..i])
        {
            return false;
        }
        match byte {
            b'"' => in_string = true,
            b' ' | b'\t' | b'\n' | b'\r' => return false,
            _ if numeric => number = Some(i),
            _ => {}
        }
    }
    number.is_none_or(|start| plain_number(&bytes[start..]))
}

/// The default serializer: plain `serde_json`.
///
/// ```
/// use idempotency_core::{JsonSerializer, ResultSerializer};
/// let text = JsonSerializer.serialize(&vec![1, 2])?;
/// let back: Vec<i32> = JsonSerializer.deserialize(&text)?;
/// assert_eq!(back, [1, 2]);
/// # Ok::<(), idempotency_core::SerializationError>(())
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct JsonSerializer;

impl ResultSerializer for JsonSerializer {
    fn serialize<T: Serialize + ?Sized>(&self, value: &T) -> Result<String, SerializationError> {
        serde_json::to_string(value).map_err(SerializationError::Serialize)
    }

    fn deserialize<T: DeserializeOwned>(&self, stored: &str) -> Result<T, SerializationError> {
        serde_json::from_str(stored).map_err(SerializationError::Deserialize)
    }

    fn stores_plain_json(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compact_json_is_what_serde_json_writes() {
        let value = serde_json::json!({
            "id": "0193a1b2-7c00-7000-8000-000000000001",
            "amount": "12.50",
            "cents": 1250,
            "ratio": -0.25,
            "text": "a \"quoted\" word, a tab\t, a \\ and a {brace}: kept",
            "list": [1, 2, {"nested": true}],
            "none": null,
        });
        let text = serde_json::to_string(&value).unwrap();
        assert!(is_compact_json(&text), "{text}");
        assert!(is_compact_json("7"));
        assert!(is_compact_json("\"x y\""));
        assert!(is_compact_json("[]"));
    }

    #[test]
    fn jsonb_spellings_are_not_compact() {
        // jsonb's text output: spaces after ':' and ',', keys reordered, exponents written out.
        assert!(!is_compact_json(r#"{"id": "x", "amount": "1.00"}"#));
        assert!(!is_compact_json("[1, 2]"));
        assert!(!is_compact_json("{\n\"a\":1}"));
        assert!(!is_compact_json("[10000000000000000000000000]"));
        assert!(!is_compact_json("0.0000001"));
        assert!(!is_compact_json("[-0.00001]"));
        assert!(is_compact_json("[1e-7,12345678901234]"));
        assert!(!is_compact_json("{\"n\":[10000000000000000000000000]} "));
    }

    #[test]
    fn whitespace_inside_strings_is_scanned_not_refused() {
        assert!(is_compact_json(r#"{"note":"a b\tc"}"#));
        assert!(!is_compact_json(r#"{"note":"a b", "n":1}"#));
    }
}
