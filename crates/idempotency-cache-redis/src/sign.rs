//! [`CacheSecret`] and the entry tag: an HMAC-SHA-256 over the record's identity and its value,
//! so that whoever can write to Redis but does not hold the secret cannot make the service
//! replay a response of their choosing.
//!
//! The tag covers the operation, the scope, the key (each length-prefixed, so no two triples
//! share a message) and the encoded value (fingerprint, status, stored response, times). An
//! entry copied from another key, or changed in any byte, does not verify.

use std::fmt;

use hmac::{Hmac, KeyInit, Mac};
use idempotency_core::RecordId;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use sha2_hmac::Sha256;

/// The shortest secret accepted, in bytes: 128 bits of a random string's entropy need at least
/// this much text.
pub const MIN_SECRET_LEN: usize = 32;

/// Length of the tag in hex digits (the whole HMAC-SHA-256).
pub(crate) const TAG_HEX_LEN: usize = 64;

/// The secret that authenticates the cache's entries
/// (`idempotency.distributed-cache.secret`): at least [`MIN_SECRET_LEN`] bytes, the same in
/// every instance that shares the Redis, and known to nobody else. Its `Debug` output hides it.
///
/// ```
/// use idempotency_cache_redis::CacheSecret;
///
/// let secret = CacheSecret::new("4f0c8a8e2b7d4c3e9a1f6b5d0e7c2a9b")?;
/// assert_eq!(format!("{secret:?}"), "CacheSecret(***)");
/// assert!(CacheSecret::new("short").is_err());
/// # Ok::<(), idempotency_cache_redis::SecretTooShort>(())
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct CacheSecret(String);

/// A [`CacheSecret`] shorter than [`MIN_SECRET_LEN`] bytes.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the distributed cache secret has {len} bytes; at least {MIN_SECRET_LEN} are needed")]
pub struct SecretTooShort {
    /// The length given.
    pub len: usize,
}

impl CacheSecret {
    /// A secret from its text.
    pub fn new(secret: impl Into<String>) -> Result<Self, SecretTooShort> {
        let secret = secret.into();
        if secret.len() < MIN_SECRET_LEN {
            return Err(SecretTooShort { len: secret.len() });
        }
        Ok(Self(secret))
    }
}

impl fmt::Debug for CacheSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("CacheSecret(***)")
    }
}

impl Serialize for CacheSecret {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for CacheSecret {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        Self::new(String::deserialize(deserializer)?).map_err(serde::de::Error::custom)
    }
}

/// Computes and checks entry tags with one secret.
#[derive(Clone)]
pub(crate) struct Signer {
    mac: Hmac<Sha256>,
}

impl Signer {
    /// A signer keyed with `secret`, for the entries under the key prefix `prefix`: the
    /// prefix is part of every tag, so an entry copied from one deployment's prefix to
    /// another's (two deployments sharing a Redis and a secret) does not verify.
    pub(crate) fn new(secret: &CacheSecret, prefix: &str) -> Self {
        Self::keyed_with(secret.0.as_bytes(), prefix)
    }

    fn keyed_with(key: &[u8], prefix: &str) -> Self {
        // HMAC takes keys of any length; the error cannot happen.
        let mut mac = Hmac::<Sha256>::new_from_slice(key)
            .unwrap_or_else(|_| unreachable!("HMAC accepts keys of any length"));
        mac.update(&(prefix.len() as u64).to_be_bytes());
        mac.update(prefix.as_bytes());
        Self { mac }
    }

    /// A signer with the empty key, as a forger who knows the format but not the secret
    /// would tag an entry.
    #[cfg(test)]
    pub(crate) fn unkeyed(prefix: &str) -> Self {
        Self::keyed_with(&[], prefix)
    }

    fn keyed(&self, id: &RecordId, value: &str) -> Hmac<Sha256> {
        let mut mac = self.mac.clone();
        for part in [id.operation.as_str(), id.scope.as_str(), id.key.as_str()] {
            mac.update(&(part.len() as u64).to_be_bytes());
            mac.update(part.as_bytes());
        }
        mac.update(value.as_bytes());
        mac
    }

    /// The tag of `value` stored for `id`, in lower-case hex.
    pub(crate) fn tag(&self, id: &RecordId, value: &str) -> String {
        let bytes = self.keyed(id, value).finalize().into_bytes();
        let mut out = String::with_capacity(TAG_HEX_LEN);
        for byte in bytes.iter() {
            out.push(char::from(HEX[usize::from(byte >> 4)]));
            out.push(char::from(HEX[usize::from(byte & 0xf)]));
        }
        out
    }

    /// Whether `tag` (hex) is the tag of `value` for `id`; compared in constant time.
    pub(crate) fn verify(&self, id: &RecordId, value: &str, tag: &str) -> bool {
        let Some(bytes) = unhex(tag) else {
            return false;
        };
        self.keyed(id, value).verify_slice(&bytes).is_ok()
    }
}

impl fmt::Debug for Signer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Signer(***)")
    }
}

const HEX: &[u8; 16] = b"0123456789abcdef";

fn unhex(text: &str) -> Option<Vec<u8>> {
    if text.len() != TAG_HEX_LEN {
        return None;
    }
    let digit = |b: u8| {
        char::from(b)
            .to_digit(16)
            .and_then(|d| u8::try_from(d).ok())
    };
    text.as_bytes()
        .chunks_exact(2)
        .map(|pair| Some(digit(pair[0])? << 4 | digit(pair[1])?))
        .collect()
}

#[cfg(test)]
mod tests {
    use idempotency_core::{IdempotencyKey, Operation, Scope};

    use super::*;

    fn id(op: &str, scope: &str, key: &str) -> RecordId {
        RecordId::new(
            Operation::new(op).unwrap(),
            Scope::new(scope).unwrap(),
            IdempotencyKey::new(key).unwrap(),
        )
    }

    fn signer(secret: &str) -> Signer {
        Signer::new(&CacheSecret::new(secret).unwrap(), "idempotency:")
    }

    /// The key prefix is part of the tag: two deployments sharing a Redis and a secret, each
    /// with a prefix of its own, cannot replay each other's entries copied across (before: the
    /// tag covered the record's identity and value only, and the copy verified).
    #[test]
    fn a_tag_verifies_only_under_its_key_prefix() {
        let secret = CacheSecret::new("a".repeat(32)).unwrap();
        let (billing, shipping) = (
            Signer::new(&secret, "billing:"),
            Signer::new(&secret, "shipping:"),
        );
        let me = id("POST:/p", "", "k-1");
        let tag = billing.tag(&me, "{}");
        assert!(billing.verify(&me, "{}", &tag));
        assert!(!shipping.verify(&me, "{}", &tag), "another prefix");
        assert!(
            !Signer::new(&secret, "billing").verify(&me, ":{}", &tag),
            "the prefix's end is not movable into the value"
        );
    }

    #[test]
    fn a_tag_verifies_only_for_its_secret_identity_and_value() {
        let one = signer(&"a".repeat(32));
        let other = signer(&"b".repeat(32));
        let me = id("POST:/p", "tenant-a", "k-1");
        let tag = one.tag(&me, "{}");
        assert_eq!(tag.len(), TAG_HEX_LEN);
        assert!(one.verify(&me, "{}", &tag));
        assert!(!other.verify(&me, "{}", &tag), "another secret");
        assert!(!one.verify(&me, "{ }", &tag), "another value");
        for moved in [
            id("POST:/p", "tenant-b", "k-1"),
            id("POST:/q", "tenant-a", "k-1"),
            id("POST:/p", "tenant-a", "k-2"),
            id("POST:/p", "tenant-ak-1", "a"),
        ] {
            assert!(!one.verify(&moved, "{}", &tag), "{moved:?}");
        }
        assert!(
            !one.verify(&me, "{}", &format!("g{}", &tag[1..])),
            "not hex"
        );
        assert!(!one.verify(&me, "{}", "00"));
    }

    #[test]
    fn short_secrets_are_refused_and_never_printed() {
        assert_eq!(CacheSecret::new("x"), Err(SecretTooShort { len: 1 }));
        let secret: CacheSecret = serde_json::from_str(&format!("\"{}\"", "s".repeat(40))).unwrap();
        assert!(!format!("{secret:?}").contains(&"s".repeat(40)));
        assert!(serde_json::from_str::<CacheSecret>("\"short\"").is_err());
    }
}
