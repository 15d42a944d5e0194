//! Which `Idempotency-Key` each request sends, and the payment body derived from it.

use std::path::Path;

use crate::Error;

/// Where the keys of a run come from. Request `n` (counted over all clients, from 0) sends
/// [`KeySource::key`]`(n)`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeySource {
    /// `K` distinct keys `<prefix>-k<i>`, taken in turn (`n mod K`): every key is sent by many
    /// clients at once, which is the contention an idempotency layer must absorb.
    Pool {
        /// Key prefix, unique per run.
        prefix: String,
        /// How many distinct keys.
        size: u64,
    },
    /// A new key per request, `<prefix>-f<n>`: every request is a first execution.
    Fresh {
        /// Key prefix, unique per run.
        prefix: String,
    },
    /// The same key for every request (replays of one key).
    One(String),
    /// Each key of the list once, in order; the run ends when the list is exhausted.
    List(Vec<String>),
}

impl KeySource {
    /// The key of request `n`, or `None` when a list is exhausted.
    pub fn key(&self, n: u64) -> Option<String> {
        match self {
            Self::Pool { prefix, size } => Some(format!("{prefix}-k{}", n % (*size).max(1))),
            Self::Fresh { prefix } => Some(format!("{prefix}-f{n}")),
            Self::One(key) => Some(key.clone()),
            Self::List(keys) => usize::try_from(n).ok().and_then(|i| keys.get(i).cloned()),
        }
    }

    /// How many requests the source allows (`Some` for a list only).
    pub fn limit(&self) -> Option<u64> {
        match self {
            Self::List(keys) => Some(keys.len() as u64),
            _ => None,
        }
    }

    /// Reads a list of keys: one key per line, or the JSON lines of a key log
    /// (`{"key": ...}`, as written by `--key-log`). Blank lines are skipped.
    pub fn from_file(path: &Path) -> Result<Self, Error> {
        let text = std::fs::read_to_string(path).map_err(|source| Error::File {
            path: path.to_owned(),
            source,
        })?;
        let mut keys = Vec::new();
        for line in text.lines().map(str::trim).filter(|l| !l.is_empty()) {
            if line.starts_with('{') {
                let entry: serde_json::Value = serde_json::from_str(line)?;
                match entry.get("key").and_then(serde_json::Value::as_str) {
                    Some(key) => keys.push(key.to_owned()),
                    None => return Err(Error::KeyLogLine(line.to_owned())),
                }
            } else {
                keys.push(line.to_owned());
            }
        }
        Ok(Self::List(keys))
    }
}

/// FNV-1a, 64 bits: a stable hash (the standard library's hasher is randomly seeded).
fn fnv1a(text: &str) -> u64 {
    fnv1a_bytes(text.as_bytes())
}

/// FNV-1a, 64 bits, of `bytes`.
pub(crate) fn fnv1a_bytes(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |hash, byte| {
        (hash ^ u64::from(*byte)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// The `POST /api/payments` body for `key`: the same key always sends the same payload.
///
/// `orderId` is the key itself (so payment rows can be matched to keys: `order_id = key`),
/// the recipient is `load`, and the amount is derived from the key, between 1.00 and 998.99,
/// under the demo's balance (1000.00) so that no payment is rejected.
pub fn payment_body(key: &str) -> String {
    let cents = 100 + fnv1a(key) % 99_800;
    // Keys in order, written without building a `Value` map for every request; the key is
    // escaped as a JSON string by its `Value`'s `Display`.
    let order = serde_json::Value::from(key);
    format!(
        "{{\"amount\":\"{}.{:02}\",\"orderId\":{order},\"recipient\":\"load\"}}",
        cents / 100,
        cents % 100
    )
}

/// The `Idempotency-Key` sent for `key` to `POST /charges`, which takes UUID keys only: a
/// version-8 UUID made of two FNV-1a hashes of the key, so that the same key is always the same
/// UUID (and a key log replays the same charges).
pub fn charge_key(key: &str) -> String {
    let high = fnv1a(key);
    let low = fnv1a(&format!("{key}#charge"));
    format!(
        "{:08x}-{:04x}-8{:03x}-{:04x}-{:012x}",
        high >> 32,
        (high >> 16) & 0xffff,
        high & 0x0fff,
        0x8000 | ((low >> 48) & 0x3fff),
        low & 0xffff_ffff_ffff
    )
}

/// The `POST /charges` body for `key`: `{"amountCents": n}`, n between 1 and 99,999 and a
/// function of the key.
pub fn charge_body(key: &str) -> String {
    serde_json::json!({ "amountCents": 1 + fnv1a(key) % 99_999 }).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_charge_key_is_a_stable_version_8_uuid_per_key() {
        let key = charge_key("load-1-k0");
        assert_eq!(key, charge_key("load-1-k0"));
        assert_ne!(key, charge_key("load-1-k1"));
        assert_eq!(key.len(), 36);
        let groups: Vec<_> = key.split('-').map(str::len).collect();
        assert_eq!(groups, [8, 4, 4, 4, 12]);
        assert_eq!(&key[14..15], "8", "version 8: {key}");
        assert!(
            matches!(&key[19..20], "8" | "9" | "a" | "b"),
            "variant: {key}"
        );
        let body: serde_json::Value = serde_json::from_str(&charge_body("k")).unwrap();
        assert!((1..100_000).contains(&body["amountCents"].as_i64().unwrap()));
    }

    #[test]
    fn the_body_is_a_function_of_the_key() {
        assert_eq!(payment_body("a-1"), payment_body("a-1"));
        assert_ne!(payment_body("a-1"), payment_body("a-2"));
        let body: serde_json::Value = serde_json::from_str(&payment_body("a-1")).unwrap();
        assert_eq!(body["orderId"], "a-1");
        let amount: f64 = body["amount"].as_str().unwrap().parse().unwrap();
        assert!((1.0..1000.0).contains(&amount), "{amount}");
    }

    #[test]
    fn the_body_is_the_json_a_value_gives_with_its_keys_in_order() {
        let cents = 100 + fnv1a("a-1") % 99_800;
        assert_eq!(
            payment_body("a-1"),
            format!(
                r#"{{"amount":"{}.{:02}","orderId":"a-1","recipient":"load"}}"#,
                cents / 100,
                cents % 100
            )
        );
        for key in [
            "a-1",
            "quote\" back\\slash",
            "tab\tnewline\n",
            "unicode é ✓",
        ] {
            let cents = 100 + fnv1a(key) % 99_800;
            let expected = serde_json::json!({
                "orderId": key,
                "recipient": "load",
                "amount": format!("{}.{:02}", cents / 100, cents % 100),
            });
            let body: serde_json::Value = serde_json::from_str(&payment_body(key)).unwrap();
            assert_eq!(body, expected, "{key:?}");
        }
    }

    #[test]
    fn a_pool_cycles_through_its_keys_and_a_list_ends() {
        let pool = KeySource::Pool {
            prefix: "p".into(),
            size: 3,
        };
        let keys: Vec<_> = (0..6).map(|n| pool.key(n).unwrap()).collect();
        assert_eq!(keys, ["p-k0", "p-k1", "p-k2", "p-k0", "p-k1", "p-k2"]);
        let fresh = KeySource::Fresh { prefix: "f".into() };
        assert_ne!(fresh.key(1), fresh.key(2));
        let list = KeySource::List(vec!["x".into(), "y".into()]);
        assert_eq!(
            (list.key(1), list.key(2), list.limit()),
            (Some("y".into()), None, Some(2))
        );
    }

    #[test]
    fn a_key_log_is_read_back() {
        let path = std::env::temp_dir().join(format!("keys-{}.jsonl", std::process::id()));
        std::fs::write(&path, "{\"key\":\"a\",\"first_status\":\"201\"}\n\nb\n").unwrap();
        let source = KeySource::from_file(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        assert_eq!(source, KeySource::List(vec!["a".into(), "b".into()]));
    }
}
