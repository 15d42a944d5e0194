//! Request fingerprints: a digest of the canonical JSON of the request.
//!
//! The default strategy, [`JcsFingerprint`], canonicalizes with RFC 8785 (see [`canonicalize`]
//! for the one deliberate deviation on large integers) and hashes with SHA-256, SHA-384 or
//! SHA-512 (the `sha2` crate), written as lower-case hex.

mod jcs;

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use sha2::Digest;

/// Longest fingerprint a store must accept (SHA-512 in hex).
pub const MAX_FINGERPRINT_LEN: usize = 128;

/// A request fingerprint: lower-case hex of a digest of the canonical request.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Fingerprint(String);

impl Fingerprint {
    /// Wraps an already computed fingerprint, as read from a store.
    pub fn new(value: impl Into<String>) -> Self {
        Self(value.into())
    }

    /// The fingerprint text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Why a request could not be fingerprinted.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FingerprintError {
    /// The request could not be serialized to JSON (a map with non-string keys, an integer
    /// beyond 64 bits, a failing `Serialize` impl, ...).
    #[error("the request could not be serialized to JSON")]
    Serialize(#[source] serde_json::Error),
    /// A custom strategy failed.
    #[error("fingerprint strategy failed: {0}")]
    Strategy(String),
}

/// Computes the fingerprint of a request, given as a JSON value.
///
/// Implement it to fingerprint only some fields, or to use another digest. It is called once per
/// `execute`, before any I/O.
pub trait FingerprintStrategy: Send + Sync + fmt::Debug + 'static {
    /// The fingerprint of `request`.
    fn fingerprint(&self, request: &serde_json::Value) -> Result<Fingerprint, FingerprintError>;

    /// While the fingerprint is being changed (another algorithm, other fields), the fingerprint
    /// the previous strategy gives `request`: a record stored with it still replays instead of
    /// answering a payload conflict. `None` (the default) accepts only
    /// [`fingerprint`](Self::fingerprint).
    fn previous_fingerprint(
        &self,
        request: &serde_json::Value,
    ) -> Result<Option<Fingerprint>, FingerprintError> {
        let _ = request;
        Ok(None)
    }
}

/// The fingerprints a stored record may carry and still match a request: the current one and,
/// during a transition, the previous strategy's.
#[derive(Debug, Clone)]
pub(crate) struct Fingerprints {
    /// What is stored for a new record.
    pub(crate) current: Fingerprint,
    /// Also accepted on replay.
    pub(crate) previous: Option<Fingerprint>,
}

impl Fingerprints {
    /// Whether a record stored with `stored` is the same request.
    pub(crate) fn accepts(&self, stored: &Fingerprint) -> bool {
        *stored == self.current || self.previous.as_ref() == Some(stored)
    }
}

/// Digest algorithm for [`JcsFingerprint`]; configured as `SHA-256`, `SHA-384` or `SHA-512`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum HashAlgorithm {
    /// SHA-256 (64 hex characters). The default.
    #[default]
    #[serde(rename = "SHA-256")]
    Sha256,
    /// SHA-384 (96 hex characters).
    #[serde(rename = "SHA-384")]
    Sha384,
    /// SHA-512 (128 hex characters).
    #[serde(rename = "SHA-512")]
    Sha512,
}

/// An algorithm name that is not `SHA-256`, `SHA-384` or `SHA-512`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown fingerprint algorithm {0:?}; expected SHA-256, SHA-384 or SHA-512")]
pub struct UnknownAlgorithm(pub String);

impl FromStr for HashAlgorithm {
    type Err = UnknownAlgorithm;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_uppercase().replace('_', "-").as_str() {
            "SHA-256" | "SHA256" => Ok(Self::Sha256),
            "SHA-384" | "SHA384" => Ok(Self::Sha384),
            "SHA-512" | "SHA512" => Ok(Self::Sha512),
            _ => Err(UnknownAlgorithm(s.to_owned())),
        }
    }
}

/// The default strategy: RFC 8785 canonical JSON, hashed, in lower-case hex.
///
/// Key order, whitespace and number spelling (`100`, `100.0`, `1e2`) do not change it.
///
/// ```
/// use idempotency_core::{FingerprintStrategy, JcsFingerprint};
/// use serde_json::json;
///
/// let strategy = JcsFingerprint::default();
/// let a = strategy.fingerprint(&json!({"amount": 100, "currency": "EUR"}))?;
/// let b = strategy.fingerprint(&serde_json::from_str(r#"{ "currency":"EUR","amount":1e2 }"#)?)?;
/// assert_eq!(a, b);
/// assert_eq!(a.as_str().len(), 64);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// Changing the algorithm of a running service: records stored with the old one would no
/// longer match their retries (a 422 instead of a replay). Accept the old one for as long as
/// such retries can come (the longest record TTL), then drop it:
///
/// ```
/// use idempotency_core::{FingerprintStrategy, HashAlgorithm, JcsFingerprint};
///
/// let strategy = JcsFingerprint::new(HashAlgorithm::Sha512).accepting(HashAlgorithm::Sha256);
/// let request = serde_json::json!({"amount": 100});
/// let previous = strategy.previous_fingerprint(&request)?.unwrap();
/// assert_eq!(previous, JcsFingerprint::default().fingerprint(&request)?);
/// # Ok::<(), idempotency_core::FingerprintError>(())
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct JcsFingerprint {
    algorithm: HashAlgorithm,
    previous: Option<HashAlgorithm>,
}

impl JcsFingerprint {
    /// A strategy using `algorithm`.
    pub fn new(algorithm: HashAlgorithm) -> Self {
        Self {
            algorithm,
            previous: None,
        }
    }

    /// Also accepts records fingerprinted with `previous` (see
    /// [`FingerprintStrategy::previous_fingerprint`]); new records get `algorithm`. Costs one
    /// more digest per call while set.
    pub fn accepting(self, previous: HashAlgorithm) -> Self {
        Self {
            previous: (previous != self.algorithm).then_some(previous),
            ..self
        }
    }

    /// The digest algorithm in use.
    pub fn algorithm(&self) -> HashAlgorithm {
        self.algorithm
    }

    /// The previous algorithm still accepted, if any.
    pub fn previous_algorithm(&self) -> Option<HashAlgorithm> {
        self.previous
    }
}

fn digest(algorithm: HashAlgorithm, request: &serde_json::Value) -> Fingerprint {
    Fingerprint(match algorithm {
        HashAlgorithm::Sha256 => digest_hex::<sha2::Sha256>(request),
        HashAlgorithm::Sha384 => digest_hex::<sha2::Sha384>(request),
        HashAlgorithm::Sha512 => digest_hex::<sha2::Sha512>(request),
    })
}

thread_local! {
    /// The canonical text is written here, then hashed in one call: fewer, larger hash updates,
    /// and no allocation once the buffer has grown to the usual request size.
    static CANONICAL: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

fn digest_hex<D: Digest>(value: &serde_json::Value) -> String {
    CANONICAL.with(|buffer| match buffer.try_borrow_mut() {
        Ok(mut buffer) => {
            buffer.clear();
            jcs::write_value(value, &mut *buffer);
            let digest = to_hex(&D::digest(buffer.as_slice()));
            if buffer.capacity() > 1 << 20 {
                *buffer = Vec::new(); // do not keep a huge request's buffer alive
            }
            digest
        }
        // Re-entered from inside a custom `Serialize` impl: use a fresh buffer.
        Err(_) => {
            let mut fresh = Vec::new();
            jcs::write_value(value, &mut fresh);
            to_hex(&D::digest(&fresh))
        }
    })
}

fn to_hex(bytes: &[u8]) -> String {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(bytes.len() * 2);
    for &byte in bytes {
        out.push(HEX[(byte >> 4) as usize] as char);
        out.push(HEX[(byte & 0xf) as usize] as char);
    }
    out
}

impl FingerprintStrategy for JcsFingerprint {
    fn fingerprint(&self, request: &serde_json::Value) -> Result<Fingerprint, FingerprintError> {
        Ok(digest(self.algorithm, request))
    }

    fn previous_fingerprint(
        &self,
        request: &serde_json::Value,
    ) -> Result<Option<Fingerprint>, FingerprintError> {
        Ok(self.previous.map(|previous| digest(previous, request)))
    }
}

/// The RFC 8785 canonical JSON text of `value`.
///
/// Integers that fit in 64 bits, and integral doubles up to the 64-bit range, keep all their
/// digits (RFC 8785 would round those above 2^53 through a double); every other value is
/// canonicalized exactly as RFC 8785 says.
///
/// ```
/// let value = serde_json::json!({"b": [1.50, "x"], "a": null});
/// assert_eq!(idempotency_core::fingerprint::canonicalize(&value), r#"{"a":null,"b":[1.5,"x"]}"#);
/// ```
pub fn canonicalize(value: &serde_json::Value) -> String {
    let mut out = Vec::new();
    jcs::write_value(value, &mut out);
    // The writer copies valid UTF-8 and adds only ASCII.
    String::from_utf8(out).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned())
}

/// A short, stable digest of a secret-ish string (an idempotency key) for logs: the first 16 hex
/// characters of its SHA-256.
///
/// It correlates log lines; it does not hide the key. The hash is unkeyed, so a guessable key
/// (an order number, a counter) is recovered from it by hashing candidates: use random keys
/// (UUID v4/v7), or treat logs as holding the keys (SECURITY.md, "`key_hash` in logs is not a
/// secret").
///
/// ```
/// let hash = idempotency_core::fingerprint::short_hash("order-1042");
/// assert_eq!(hash.len(), 16);
/// // Anyone can compute it: an order number is found again by trying candidates.
/// assert!((1000..2000).any(|n| idempotency_core::fingerprint::short_hash(&format!("order-{n}")) == hash));
/// ```
pub fn short_hash(value: &str) -> String {
    let digest = sha2::Sha256::digest(value.as_bytes());
    to_hex(&digest[..8])
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn algorithms_have_their_lengths() {
        let value = json!({"a": 1});
        for (algorithm, len) in [
            (HashAlgorithm::Sha256, 64),
            (HashAlgorithm::Sha384, 96),
            (HashAlgorithm::Sha512, 128),
        ] {
            let fp = JcsFingerprint::new(algorithm).fingerprint(&value).unwrap();
            assert_eq!(fp.as_str().len(), len);
            assert!(
                fp.as_str()
                    .bytes()
                    .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
            );
        }
    }

    /// Stable across runs and versions: a fixed input has a fixed fingerprint.
    #[test]
    fn known_digest() {
        let fp = JcsFingerprint::default()
            .fingerprint(&json!({"orderId": "o-1", "amount": 100}))
            .unwrap();
        // `printf '%s' '{"amount":100,"orderId":"o-1"}' | sha256sum`
        assert_eq!(
            fp.as_str(),
            "561aebc6d11025aecf75cf480da418800400a72795c7fd09522ca289177a1932"
        );
    }

    #[test]
    fn spelling_and_order_do_not_matter() {
        let s = JcsFingerprint::default();
        let a: serde_json::Value = serde_json::from_str(r#"{"x":100,"y":{"b":1,"a":2}}"#).unwrap();
        let b: serde_json::Value =
            serde_json::from_str("{ \"y\" : { \"a\" : 2.0 , \"b\" : 1e0 } ,\n \"x\" : 1E2 }")
                .unwrap();
        assert_eq!(s.fingerprint(&a).unwrap(), s.fingerprint(&b).unwrap());
        let c = json!({"x": 101, "y": {"a": 2, "b": 1}});
        assert_ne!(s.fingerprint(&a).unwrap(), s.fingerprint(&c).unwrap());
    }

    #[test]
    fn algorithm_names() {
        assert_eq!(
            "SHA-384".parse::<HashAlgorithm>().unwrap(),
            HashAlgorithm::Sha384
        );
        assert_eq!(
            "sha512".parse::<HashAlgorithm>().unwrap(),
            HashAlgorithm::Sha512
        );
        assert!("MD5".parse::<HashAlgorithm>().is_err());
        let parsed: HashAlgorithm = serde_json::from_str("\"SHA-256\"").unwrap();
        assert_eq!(parsed, HashAlgorithm::Sha256);
    }

    #[test]
    fn short_hash_is_short_and_stable() {
        assert_eq!(short_hash("k"), short_hash("k"));
        assert_eq!(short_hash("k").len(), 16);
        assert_ne!(short_hash("k"), short_hash("K"));
    }
}
