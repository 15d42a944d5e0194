//! Whether the numbers of a JSON body keep their exact value in its canonical form.
//!
//! serde_json reads a number with a fraction or an exponent, or an integer beyond 64 bits, as a
//! double: `0.1` and `0.10000000000000000001`, or `1234567890123456789012345678901` and `...902`,
//! become one double and so one RFC 8785 text. A handler that parses decimals exactly treats
//! them as two payloads, so such a body is fingerprinted by its bytes instead.

/// Whether every number of `json` (a valid JSON text) has the exact decimal value of the text
/// the canonical form writes for it.
pub(super) fn all_exact(json: &[u8]) -> bool {
    let mut bytes = json.iter().copied().peekable();
    let mut in_string = false;
    while let Some(byte) = bytes.next() {
        if in_string {
            match byte {
                b'\\' => {
                    bytes.next();
                }
                b'"' => in_string = false,
                _ => {}
            }
            continue;
        }
        match byte {
            b'"' => in_string = true,
            b'-' | b'0'..=b'9' => {
                let mut token = vec![byte];
                while let Some(&next) = bytes.peek() {
                    if !matches!(next, b'-' | b'+' | b'.' | b'e' | b'E' | b'0'..=b'9') {
                        break;
                    }
                    token.push(next);
                    bytes.next();
                }
                if !exact(&token) {
                    return false;
                }
            }
            _ => {}
        }
    }
    true
}

/// Whether the number `token` keeps its value: an integer within 64 bits is written with all
/// its digits; any other number is read as a double, written with the exact digits of an
/// integral double in the 64-bit range, else with its shortest round-trip digits.
fn exact(token: &[u8]) -> bool {
    let Ok(text) = std::str::from_utf8(token) else {
        return false;
    };
    if text.parse::<u64>().is_ok() || text.parse::<i64>().is_ok() {
        return true;
    }
    let Ok(float) = text.parse::<f64>() else {
        return false;
    };
    if !float.is_finite() {
        return false;
    }
    let written = if float.fract() == 0.0
        && (-9_223_372_036_854_775_808.0..18_446_744_073_709_551_616.0).contains(&float)
    {
        // Exact: an integral double of this range fits an i128.
        #[allow(clippy::cast_possible_truncation)]
        let integer = float as i128;
        integer.to_string()
    } else {
        format!("{float:e}")
    };
    decimal(text) == decimal(&written)
}

/// A decimal number as (negative, significant digits, exponent of the last digit); zero is
/// `(false, "", 0)` whatever its sign. `None` for an exponent out of range.
fn decimal(text: &str) -> Option<(bool, String, i64)> {
    let (negative, text) = match text.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, text),
    };
    let (mantissa, exponent) = match text.split_once(['e', 'E']) {
        Some((mantissa, exponent)) => (mantissa, exponent.parse::<i64>().ok()?),
        None => (text, 0),
    };
    let (integer, fraction) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    let digits = format!("{integer}{fraction}");
    let mut exponent = exponent.checked_sub(i64::try_from(fraction.len()).ok()?)?;
    let digits = digits.trim_start_matches('0');
    let significant = digits.trim_end_matches('0');
    if significant.is_empty() {
        return Some((false, String::new(), 0));
    }
    exponent = exponent.checked_add(i64::try_from(digits.len() - significant.len()).ok()?)?;
    Some((negative, significant.to_owned(), exponent))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_that_keep_their_value_are_exact_and_others_are_not() {
        for exact in [
            r#"{"n":1}"#,
            r#"{"n":-0}"#,
            r#"{"n":0.1}"#,
            r#"{"n":100.00}"#,
            r#"{"n":1e2}"#,
            r#"{"n":18446744073709551615}"#,
            r#"{"n":-9223372036854775808}"#,
            r#"{"n":1152921504606846976.0}"#,
            r#"{"n":1.5e300}"#,
            r#"{"s":"0.10000000000000000001 \" 12345678901234567890123"}"#,
        ] {
            assert!(all_exact(exact.as_bytes()), "{exact}");
        }
        for inexact in [
            r#"{"n":1234567890123456789012345678901}"#,
            r#"{"n":0.10000000000000000001}"#,
            r#"[1, 9007199254740993.0]"#,
            r#"{"n":18446744073709551616}"#,
            r#"{"n":1e400}"#,
        ] {
            assert!(!all_exact(inexact.as_bytes()), "{inexact}");
        }
    }
}
