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
    /// retry of the same request fails the same way; keep results shallower.
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
}
