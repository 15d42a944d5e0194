//! The key: how it is made ([`KeyGenerator`]) and how it is written ([`KeyFormat`]).

use std::fmt;
use std::sync::Arc;

use reqwest::header::HeaderValue;

use crate::Error;

/// The longest key (in characters, before any quoting) a server accepts.
pub const MAX_KEY_LEN: usize = 255;

/// How a generated key is written in the `Idempotency-Key` header. A key the caller set on the
/// request is sent as the caller wrote it.
///
/// ```
/// use idempotency_client::KeyFormat;
///
/// assert_eq!(KeyFormat::SfString.header_value("k-1").unwrap(), "\"k-1\"");
/// assert_eq!(KeyFormat::Bare.header_value("k-1").unwrap(), "k-1");
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum KeyFormat {
    /// A Structured Field string (`"0193..."`), as the IETF draft writes it.
    #[default]
    SfString,
    /// The key alone (`0193...`), for servers that do not parse Structured Fields.
    Bare,
}

impl KeyFormat {
    /// The header value of `key` in this format.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidKey`] when `key` is not 1 to [`MAX_KEY_LEN`] visible ASCII characters,
    /// or, bare, has a `,`, `;` or `"`: keys the idempotency servers refuse with `400` (a
    /// space, which an sf-string could carry, included) are refused here, before anything is
    /// sent.
    #[allow(
        clippy::result_large_err,
        reason = "the crate's one error type; it leaves the middleware boxed (reqwest_middleware::Error)"
    )]
    pub fn header_value(self, key: &str) -> Result<HeaderValue, Error> {
        let invalid = || Error::InvalidKey {
            key: key.to_owned(),
        };
        if key.is_empty() || key.len() > MAX_KEY_LEN || !key.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(invalid());
        }
        // Bare, these would read as a list, parameters or a broken sf-string.
        if self == Self::Bare && key.contains([',', ';', '"']) {
            return Err(invalid());
        }
        let text = match self {
            Self::Bare => key.to_owned(),
            Self::SfString => {
                let mut quoted = String::with_capacity(key.len() + 2);
                quoted.push('"');
                for c in key.chars() {
                    if matches!(c, '"' | '\\') {
                        quoted.push('\\');
                    }
                    quoted.push(c);
                }
                quoted.push('"');
                quoted
            }
        };
        HeaderValue::from_str(&text).map_err(|_| invalid())
    }
}

/// Makes one key per logical request: UUID v7 by default, or the caller's function.
///
/// ```
/// use idempotency_client::KeyGenerator;
///
/// let fixed = KeyGenerator::new(|| "order-42".to_owned());
/// assert_eq!(fixed.generate(), "order-42");
/// assert_eq!(KeyGenerator::default().generate().len(), 36);
/// ```
#[derive(Clone)]
pub struct KeyGenerator(Arc<dyn Fn() -> String + Send + Sync>);

impl KeyGenerator {
    /// Keys from `generate`, called once per logical request.
    pub fn new(generate: impl Fn() -> String + Send + Sync + 'static) -> Self {
        Self(Arc::new(generate))
    }

    /// A new key.
    pub fn generate(&self) -> String {
        (self.0)()
    }
}

impl Default for KeyGenerator {
    /// UUID v7 keys (time-ordered, 36 characters).
    fn default() -> Self {
        Self::new(|| uuid::Uuid::now_v7().to_string())
    }
}

impl fmt::Debug for KeyGenerator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("KeyGenerator(..)")
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn an_sf_string_escapes_quotes_and_backslashes() {
        let value = KeyFormat::SfString.header_value(r#"a"b\c"#).unwrap();
        assert_eq!(value, r#""a\"b\\c""#);
    }

    #[test]
    fn keys_a_server_refuses_are_refused() {
        let long = "k".repeat(MAX_KEY_LEN + 1);
        for key in ["", "é", "a\nb", "a b", long.as_str()] {
            for format in [KeyFormat::SfString, KeyFormat::Bare] {
                assert!(format.header_value(key).is_err(), "{format:?} {key:?}");
            }
        }
        for key in ["a,b", "a;b", "a\"b"] {
            assert!(KeyFormat::Bare.header_value(key).is_err(), "{key:?}");
            assert!(KeyFormat::SfString.header_value(key).is_ok(), "{key:?}");
        }
        let longest = "k".repeat(MAX_KEY_LEN);
        assert!(KeyFormat::SfString.header_value(&longest).is_ok());
    }
}
