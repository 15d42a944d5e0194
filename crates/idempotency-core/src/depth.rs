//! The one limit on how deep stored JSON may nest, shared by every backend and the HTTP edge.

/// The deepest nesting of JSON arrays and objects that is stored anywhere: an outcome's
/// payload, a rejection's details, an outbox event's payload. A request body nested deeper is
/// refused by `idempotency-axum` before its handler runs.
///
/// 31 because MariaDB's `json_valid`, which checks those columns, refuses 32 levels (its
/// `JSON_DEPTH_LIMIT`); MySQL 8 allows 100, SQLite 1000, PostgreSQL's `json` more, and
/// `serde_json` reads 128. One limit on every backend, the strictest, so that a value one
/// backend stores is never refused by another, and a value too deep is refused before
/// anything is written, as a typed error instead of a database error:
///
/// - an outcome ([`ExecutionResult`](crate::ExecutionResult)'s value or rejection details,
///   as the [`ResultSerializer`](crate::ResultSerializer) wrote it): `execute` fails with
///   [`Error::Serialization`](crate::Error::Serialization)`(`[`SerializationError::TooDeep`](crate::SerializationError::TooDeep)`)`
///   before the record is completed; the transaction rolls back with the action's changes;
/// - an outbox event: `idempotency_outbox::Error::InvalidEvent`, nothing enqueued;
/// - an HTTP request body declared JSON: `422 invalid-request-body`, nothing stored.
///
/// An outcome is refused *after* its action ran: its depth is that of the value the action
/// returns, known only once the action has returned it and the serializer has written it, so
/// no check can come before the action. Nothing of that run is kept (its database changes roll
/// back with the transaction, and no record is stored or left claimed), so a retry of the same
/// request finds the key free and runs the action again, and fails again if its result is as
/// deep: effects outside the transaction (a call to a payment provider, an e-mail) happen once
/// per try. Keep results shallow (return an id or a summary rather than a deep document), and
/// test an action's deepest result.
///
/// Depth counts brackets: `1` and `"x"` are 0 deep, `[]` and `{}` 1, `{"a":[1]}` 2.
pub const MAX_JSON_DEPTH: usize = 31;

/// A JSON text nests deeper than [`MAX_JSON_DEPTH`].
///
/// ```
/// use idempotency_core::{JsonTooDeep, MAX_JSON_DEPTH, check_json_depth};
///
/// let deep = format!("{}{}", "[".repeat(40), "]".repeat(40));
/// assert_eq!(check_json_depth(&deep), Err(JsonTooDeep { depth: 40 }));
/// assert!(JsonTooDeep { depth: 40 }.to_string().contains(&MAX_JSON_DEPTH.to_string()));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the JSON nests {depth} levels deep; at most {MAX_JSON_DEPTH} are stored")]
pub struct JsonTooDeep {
    /// How deep the value nests.
    pub depth: usize,
}

/// The deepest nesting of arrays and objects in the JSON text `json`; brackets inside strings
/// do not count. One pass over the bytes, no allocation, no recursion: safe on any input
/// (on text that is not JSON the count means nothing, and parsing it fails anyway).
///
/// ```
/// use idempotency_core::json_depth;
///
/// assert_eq!(json_depth("1"), 0);
/// assert_eq!(json_depth(r#"{"a":[1,{"b":[]}]}"#), 4);
/// assert_eq!(json_depth(r#"["[[{", {}]"#), 2);
/// assert_eq!(json_depth(b"[[]]"), 2);
/// ```
pub fn json_depth(json: impl AsRef<[u8]>) -> usize {
    let (mut depth, mut deepest, mut in_string, mut escaped) = (0_usize, 0_usize, false, false);
    for &byte in json.as_ref() {
        if in_string {
            match byte {
                _ if escaped => escaped = false,
                b'\\' => escaped = true,
                b'"' => in_string = false,
                _ => {}
            }
            continue;
        }
        match byte {
            b'"' => in_string = true,
            b'[' | b'{' => {
                depth += 1;
                deepest = deepest.max(depth);
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    deepest
}

/// Refuses the JSON text `json` when it nests deeper than [`MAX_JSON_DEPTH`].
///
/// ```
/// use idempotency_core::{MAX_JSON_DEPTH, check_json_depth};
///
/// let deepest = format!("{}{}", "[".repeat(MAX_JSON_DEPTH), "]".repeat(MAX_JSON_DEPTH));
/// assert!(check_json_depth(&deepest).is_ok());
/// assert!(check_json_depth(format!("[{deepest}]")).is_err());
/// ```
pub fn check_json_depth(json: impl AsRef<[u8]>) -> Result<(), JsonTooDeep> {
    match json_depth(json) {
        depth if depth > MAX_JSON_DEPTH => Err(JsonTooDeep { depth }),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nested(depth: usize) -> String {
        format!(r#"{}"x"{}"#, "[".repeat(depth), "]".repeat(depth))
    }

    #[test]
    fn depth_counts_brackets_outside_strings() {
        assert_eq!(json_depth("1"), 0);
        assert_eq!(json_depth(r#""[{""#), 0);
        assert_eq!(json_depth(r#"{"a":[1,{"b":[]}]}"#), 4);
        assert_eq!(json_depth(r#"["[[\"{{", {}]"#), 2);
        assert_eq!(
            json_depth(r#"["\\", [[]]]"#),
            3,
            "an escaped backslash ends"
        );
        assert_eq!(
            json_depth(r#"[{"a":1},{"b":2}]"#),
            2,
            "siblings do not add up"
        );
    }

    #[test]
    fn the_limit_is_inclusive() {
        assert_eq!(check_json_depth(nested(MAX_JSON_DEPTH)), Ok(()));
        assert_eq!(
            check_json_depth(nested(MAX_JSON_DEPTH + 1)),
            Err(JsonTooDeep {
                depth: MAX_JSON_DEPTH + 1
            })
        );
        // serde_json's own limit (128) is far above: its parser never sees such a value.
        assert_eq!(
            check_json_depth(nested(10_000)),
            Err(JsonTooDeep { depth: 10_000 })
        );
    }

    /// The count agrees with serde_json's own view of the value.
    #[test]
    fn depth_agrees_with_a_parsed_value() {
        fn parsed_depth(value: &serde_json::Value) -> usize {
            match value {
                serde_json::Value::Array(items) => {
                    1 + items.iter().map(parsed_depth).max().unwrap_or(0)
                }
                serde_json::Value::Object(members) => {
                    1 + members.values().map(parsed_depth).max().unwrap_or(0)
                }
                _ => 0,
            }
        }
        for text in [
            r#"{"a":{"b":{"c":[1,2,{"d":"]]]"}]}},"e":[]}"#,
            r#"[[[[]]],[[[["\"[["]]]]]"#,
            r#""plain""#,
            r#"{"k\"[":{"x":[{}]}}"#,
        ] {
            let value: serde_json::Value = serde_json::from_str(text).expect("JSON");
            assert_eq!(json_depth(text), parsed_depth(&value), "{text}");
        }
    }
}
