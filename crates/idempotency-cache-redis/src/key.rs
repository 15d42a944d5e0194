//! Redis key encoding: injective over `(operation, scope, key)`.

use idempotency_core::RecordId;

/// The Redis key of a record: `<prefix><len(op)>:<op>:<len(scope)>:<scope>:<key>`.
///
/// Lengths make the encoding injective: no two `(operation, scope, key)` triples share a Redis
/// key, even when their parts contain `:` (plain `operation:key` concatenation collides, e.g.
/// `("a:b", "", "c")` and `("a", "b:", "c")`).
///
/// One record is one key, and every command of the cache touches one key: on a Redis Cluster no
/// command spans two slots, so the key carries no hash tag and records spread over every master.
///
/// ```
/// use idempotency_core::{IdempotencyKey, Operation, RecordId, Scope};
/// let id = RecordId::new(Operation::new("CREATE_PAYMENT")?, Scope::default(), IdempotencyKey::new("demo-1")?);
/// assert_eq!(idempotency_cache_redis::redis_key("idempotency:", &id), "idempotency:14:CREATE_PAYMENT:0::demo-1");
/// # Ok::<(), idempotency_core::KeyError>(())
/// ```
pub fn redis_key(prefix: &str, id: &RecordId) -> String {
    let (operation, scope, key) = (id.operation.as_str(), id.scope.as_str(), id.key.as_str());
    let mut out =
        String::with_capacity(prefix.len() + operation.len() + scope.len() + key.len() + 12);
    out.push_str(prefix);
    for part in [operation, scope] {
        out.push_str(&part.len().to_string());
        out.push(':');
        out.push_str(part);
        out.push(':');
    }
    out.push_str(key);
    out
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

    #[test]
    fn triples_that_collide_when_concatenated_do_not_collide() {
        let pairs = [
            (id("a:b", "", "c"), id("a", "b:", "c")),
            (id("a", "b:c", "d"), id("a", "b", "c:d")),
            (id("op", "1:x", "k"), id("op", "1", "x:k")),
            (id("1", "2", "3"), id("12", "", "3")),
        ];
        for (left, right) in pairs {
            let plain = |i: &RecordId| format!("{}:{}:{}", i.operation, i.scope, i.key);
            let naive_collides = plain(&left) == plain(&right)
                || format!("{}{}{}", left.operation, left.scope, left.key)
                    == format!("{}{}{}", right.operation, right.scope, right.key);
            assert!(
                naive_collides,
                "{left:?} / {right:?} is not a collision example"
            );
            assert_ne!(redis_key("p:", &left), redis_key("p:", &right));
        }
    }

    #[test]
    fn encoding_is_decodable() {
        // Decoding proves injectivity: the parts come back from the key.
        let original = id("op:x", "t:1:", "k::9");
        let encoded = redis_key("idempotency:", &original);
        let mut rest = encoded.strip_prefix("idempotency:").unwrap();
        let mut parts = Vec::new();
        for _ in 0..2 {
            let (len, tail) = rest.split_once(':').unwrap();
            let len: usize = len.parse().unwrap();
            parts.push(&tail[..len]);
            rest = &tail[len + 1..];
        }
        assert_eq!((parts[0], parts[1], rest), ("op:x", "t:1:", "k::9"));
    }
}
