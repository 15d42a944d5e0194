//! Validated identifiers: the idempotency key, the operation name and the scope.
//!
//! Every value is checked when it is built, so a bad key is a typed error before any I/O.

use std::fmt;

use serde::{Deserialize, Serialize};

/// Longest idempotency key accepted, in bytes (and characters: keys are ASCII).
pub const MAX_KEY_LEN: usize = 255;
/// Longest operation name accepted.
pub const MAX_OPERATION_LEN: usize = 128;
/// Longest scope accepted.
pub const MAX_SCOPE_LEN: usize = 255;

/// Why a key, an operation name or a scope was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum KeyError {
    /// The value is empty.
    #[error("{what} is empty")]
    Empty {
        /// Which value: `idempotency key`, `operation` or `scope`.
        what: &'static str,
    },
    /// The value is longer than allowed.
    #[error("{what} is {len} bytes long; at most {max} are allowed")]
    TooLong {
        /// Which value.
        what: &'static str,
        /// Its length in bytes.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// The value holds a byte outside the allowed set.
    #[error("{what} contains a character outside visible ASCII (0x21..=0x7E) at byte {position}")]
    InvalidCharacter {
        /// Which value.
        what: &'static str,
        /// Byte offset of the first offending character.
        position: usize,
    },
}

fn check(what: &'static str, value: &str, max: usize, allow_empty: bool) -> Result<(), KeyError> {
    if value.is_empty() && !allow_empty {
        return Err(KeyError::Empty { what });
    }
    if value.len() > max {
        return Err(KeyError::TooLong {
            what,
            len: value.len(),
            max,
        });
    }
    if let Some(position) = value.bytes().position(|b| !b.is_ascii_graphic()) {
        return Err(KeyError::InvalidCharacter { what, position });
    }
    Ok(())
}

macro_rules! string_newtype {
    ($name:ident) => {
        impl $name {
            /// The value as a string slice.
            pub fn as_str(&self) -> &str {
                &self.0
            }

            /// Consumes the value and returns the inner string.
            pub fn into_inner(self) -> String {
                self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl AsRef<str> for $name {
            fn as_ref(&self) -> &str {
                &self.0
            }
        }

        impl TryFrom<String> for $name {
            type Error = KeyError;
            fn try_from(value: String) -> Result<Self, KeyError> {
                Self::new(value)
            }
        }

        impl TryFrom<&str> for $name {
            type Error = KeyError;
            fn try_from(value: &str) -> Result<Self, KeyError> {
                Self::new(value)
            }
        }

        impl std::str::FromStr for $name {
            type Err = KeyError;
            fn from_str(value: &str) -> Result<Self, KeyError> {
                Self::new(value)
            }
        }
    };
}

/// A client-supplied idempotency key: 1 to 255 visible ASCII characters (`0x21..=0x7E`).
///
/// ```
/// use idempotency_core::IdempotencyKey;
///
/// let key = IdempotencyKey::new("8e03978e-40d5-43e8-bc93-6894a57f9324")?;
/// assert_eq!(key.as_str().len(), 36);
/// assert!(IdempotencyKey::new("").is_err());
/// assert!(IdempotencyKey::new("has space").is_err());
/// assert!(IdempotencyKey::new("x".repeat(256)).is_err());
/// # Ok::<(), idempotency_core::KeyError>(())
/// ```
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct IdempotencyKey(String);

impl IdempotencyKey {
    /// Validates `value` as an idempotency key.
    pub fn new(value: impl Into<String>) -> Result<Self, KeyError> {
        let value = value.into();
        check("idempotency key", &value, MAX_KEY_LEN, false)?;
        Ok(Self(value))
    }
}

impl fmt::Debug for IdempotencyKey {
    // Keys are client secrets of a kind: debug output shows a short digest, not the key.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "IdempotencyKey(#{})",
            crate::fingerprint::short_hash(&self.0)
        )
    }
}

impl From<IdempotencyKey> for String {
    fn from(value: IdempotencyKey) -> Self {
        value.0
    }
}

string_newtype!(IdempotencyKey);

/// The name of an idempotent operation, such as `CREATE_PAYMENT`: 1 to 128 visible ASCII
/// characters. The same key may be used once per operation.
///
/// ```
/// use idempotency_core::Operation;
/// let op = Operation::new("CREATE_PAYMENT")?;
/// assert_eq!(op.as_str(), "CREATE_PAYMENT");
/// # Ok::<(), idempotency_core::KeyError>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct Operation(String);

impl Operation {
    /// Validates `value` as an operation name.
    pub fn new(value: impl Into<String>) -> Result<Self, KeyError> {
        let value = value.into();
        check("operation", &value, MAX_OPERATION_LEN, false)?;
        Ok(Self(value))
    }
}

impl From<Operation> for String {
    fn from(value: Operation) -> Self {
        value.0
    }
}

string_newtype!(Operation);

/// Who owns a key: a tenant or principal. Keys are unique per `(operation, scope, key)`, so two
/// clients that pick the same key never see each other's results.
///
/// The default scope is empty (one shared namespace). A non-empty scope is at most 255 visible
/// ASCII characters; derive it from an authenticated identity, never from unchecked input.
///
/// ```
/// use idempotency_core::Scope;
/// assert_eq!(Scope::default().as_str(), "");
/// assert_eq!(Scope::new("tenant-42")?.as_str(), "tenant-42");
/// # Ok::<(), idempotency_core::KeyError>(())
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct Scope(String);

impl Scope {
    /// Validates `value` as a scope; the empty string is the default scope.
    pub fn new(value: impl Into<String>) -> Result<Self, KeyError> {
        let value = value.into();
        check("scope", &value, MAX_SCOPE_LEN, true)?;
        Ok(Self(value))
    }

    /// Whether this is the default, empty scope.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl From<Scope> for String {
    fn from(value: Scope) -> Self {
        value.0
    }
}

string_newtype!(Scope);

/// The identity of one idempotency record: `(operation, scope, key)`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct RecordId {
    /// The operation the key belongs to.
    pub operation: Operation,
    /// The tenant or principal that owns the key.
    pub scope: Scope,
    /// The client's key.
    pub key: IdempotencyKey,
}

impl RecordId {
    /// Builds a record identity from its three parts.
    pub fn new(operation: Operation, scope: Scope, key: IdempotencyKey) -> Self {
        Self {
            operation,
            scope,
            key,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_bounds() {
        assert!(IdempotencyKey::new("a").is_ok());
        assert!(IdempotencyKey::new("a".repeat(255)).is_ok());
        assert_eq!(
            IdempotencyKey::new("a".repeat(256)),
            Err(KeyError::TooLong {
                what: "idempotency key",
                len: 256,
                max: 255
            })
        );
        assert_eq!(
            IdempotencyKey::new(""),
            Err(KeyError::Empty {
                what: "idempotency key"
            })
        );
    }

    #[test]
    fn key_rejects_invisible_and_non_ascii() {
        for bad in ["a b", "a\tb", "a\nb", "a\u{7f}", "é", "a\0", "ключ"] {
            assert!(
                matches!(
                    IdempotencyKey::new(bad),
                    Err(KeyError::InvalidCharacter { .. })
                ),
                "{bad:?} accepted"
            );
        }
        assert!(IdempotencyKey::new("!~azAZ09-_.:\"{}").is_ok());
    }

    #[test]
    fn debug_hides_the_key() {
        let key = IdempotencyKey::new("secret-key-123").unwrap();
        let debug = format!("{key:?}");
        assert!(!debug.contains("secret"), "{debug}");
    }

    #[test]
    fn scope_may_be_empty_operation_may_not() {
        assert!(Scope::new("").is_ok());
        assert!(Operation::new("").is_err());
        assert!(Operation::new("x".repeat(129)).is_err());
        assert!(Scope::new("tenant a").is_err());
    }

    #[test]
    fn serde_validates() {
        let err = serde_json::from_str::<IdempotencyKey>("\"bad key\"");
        assert!(err.is_err());
        let ok: IdempotencyKey = serde_json::from_str("\"k-1\"").unwrap();
        assert_eq!(ok.as_str(), "k-1");
    }
}
