//! RFC 8785 JSON Canonicalization Scheme (JCS), written over `serde_json::Value`.
//!
//! Why not an existing crate: the canonicalizers on crates.io format every number through an
//! `f64`, so two different 64-bit integers above 2^53 (snowflake ids, amounts in minor units)
//! canonicalize to the same text and their requests would share a fingerprint. This module keeps
//! RFC 8785 for everything else and uses the `ryu-js` crate (ECMAScript `Number::toString`, the
//! formatting RFC 8785 requires) for floating-point numbers.
//!
//! **Deliberate deviation from RFC 8785:** a number that is an integer in the JSON value (it fits
//! in `i64`/`u64`, or is an integer literal when serde_json's `arbitrary_precision` feature is on)
//! is written with all its digits. For integers up to 2^53 this is exactly what RFC 8785 writes;
//! above 2^53 RFC 8785 would round them to the nearest double. So that a value keeps one text
//! however it is spelled, an integral double from 2^53 up to the 64-bit range (`2^60` written as
//! `1152921504606846976.0`) is written with its exact digits too, where RFC 8785 would print
//! ECMAScript's shortest form (`1152921504606847000`, which would then collide with that other
//! integer). Beyond 64 bits, doubles follow RFC 8785.
//!
//! A limit no canonicalizer can lift: a JSON number with a fraction or an exponent is parsed into
//! a double, so `9007199254740993.0` is the double `9007199254740992` before it gets here.

use serde_json::{Map, Number, Value};

/// Where canonical bytes go: a buffer, or straight into a hash.
pub(crate) trait Sink {
    fn put(&mut self, bytes: &[u8]);
}

impl Sink for Vec<u8> {
    fn put(&mut self, bytes: &[u8]) {
        self.extend_from_slice(bytes);
    }
}

/// Writes the canonical form of `value` into `out`.
pub(crate) fn write_value<S: Sink>(value: &Value, out: &mut S) {
    match value {
        Value::Null => out.put(b"null"),
        Value::Bool(true) => out.put(b"true"),
        Value::Bool(false) => out.put(b"false"),
        Value::Number(number) => write_number(number, out),
        Value::String(string) => write_string(string, out),
        Value::Array(items) => {
            out.put(b"[");
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.put(b",");
                }
                write_value(item, out);
            }
            out.put(b"]");
        }
        Value::Object(map) => write_object(map, out),
    }
}

fn write_object<S: Sink>(map: &Map<String, Value>, out: &mut S) {
    // Sort by UTF-16 code units (RFC 8785 section 3.2.3). serde_json's map order is byte order,
    // or insertion order when `preserve_order` is on somewhere in the build, so sort always.
    let mut entries: Vec<(&String, &Value)> = map.iter().collect();
    entries.sort_by(|(a, _), (b, _)| a.encode_utf16().cmp(b.encode_utf16()));
    out.put(b"{");
    for (i, (key, value)) in entries.into_iter().enumerate() {
        if i > 0 {
            out.put(b",");
        }
        write_string(key, out);
        out.put(b":");
        write_value(value, out);
    }
    out.put(b"}");
}

fn write_number<S: Sink>(number: &Number, out: &mut S) {
    if let Some(n) = number.as_u64() {
        out.put(itoa_u64(n, &mut [0; 20]));
    } else if let Some(n) = number.as_i64() {
        out.put(b"-");
        out.put(itoa_u64(n.unsigned_abs(), &mut [0; 20]));
    } else {
        let text = number.to_string();
        if is_integer_literal(&text) {
            // Only reachable with serde_json's `arbitrary_precision`: an integer beyond 64 bits.
            write_big_integer(&text, out);
        } else if let Some(float) = number.as_f64() {
            if let Some(integer) = exact_integer(float) {
                // Same text as the same value spelled as an integer (see the module docs).
                write_i128(integer, out);
            } else {
                let mut buffer = ryu_js::Buffer::new();
                // JSON numbers are finite, and ECMAScript prints -0 as "0".
                out.put(
                    buffer
                        .format(if float == 0.0 { 0.0 } else { float })
                        .as_bytes(),
                );
            }
        } else {
            out.put(text.as_bytes());
        }
    }
}

/// 2^53: below it, ECMAScript formatting of an integral double already prints every digit.
const EXACT_FLOAT_INTEGERS: f64 = 9_007_199_254_740_992.0;

/// An integral double from 2^53 up to the 64-bit integer range, as the integer it is exactly.
/// Written with all its digits, it canonicalizes like the same value parsed as an `i64`/`u64`.
fn exact_integer(float: f64) -> Option<i128> {
    let in_range = (-9_223_372_036_854_775_808.0..18_446_744_073_709_551_616.0).contains(&float);
    if in_range && float.abs() >= EXACT_FLOAT_INTEGERS && float.fract() == 0.0 {
        // Exact: the value is an integer that fits in an i128.
        Some(float as i128)
    } else {
        None
    }
}

fn write_i128<S: Sink>(integer: i128, out: &mut S) {
    if integer < 0 {
        out.put(b"-");
    }
    out.put(integer.unsigned_abs().to_string().as_bytes());
}

fn is_integer_literal(text: &str) -> bool {
    let digits = text.strip_prefix('-').unwrap_or(text);
    !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit())
}

fn write_big_integer<S: Sink>(text: &str, out: &mut S) {
    let (negative, digits) = match text.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, text),
    };
    let digits = digits.trim_start_matches('0');
    if digits.is_empty() {
        out.put(b"0");
        return;
    }
    if negative {
        out.put(b"-");
    }
    out.put(digits.as_bytes());
}

fn itoa_u64(mut n: u64, buffer: &mut [u8; 20]) -> &[u8] {
    let mut at = buffer.len();
    loop {
        at -= 1;
        buffer[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    &buffer[at..]
}

fn write_string<S: Sink>(string: &str, out: &mut S) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    out.put(b"\"");
    let bytes = string.as_bytes();
    let mut start = 0;
    for (i, &byte) in bytes.iter().enumerate() {
        let escape: &[u8] = match byte {
            b'"' => b"\\\"",
            b'\\' => b"\\\\",
            b'\n' => b"\\n",
            b'\r' => b"\\r",
            b'\t' => b"\\t",
            0x08 => b"\\b",
            0x0c => b"\\f",
            0x00..=0x1f => &[
                b'\\',
                b'u',
                b'0',
                b'0',
                HEX[(byte >> 4) as usize],
                HEX[(byte & 0xf) as usize],
            ],
            _ => continue,
        };
        out.put(&bytes[start..i]);
        out.put(escape);
        start = i + 1;
    }
    out.put(&bytes[start..]);
    out.put(b"\"");
}

#[cfg(test)]
mod tests {
    use super::*;

    fn canon(text: &str) -> String {
        let value: Value = serde_json::from_str(text).unwrap();
        let mut out = Vec::new();
        write_value(&value, &mut out);
        String::from_utf8(out).unwrap()
    }

    fn number(bits: u64) -> String {
        let value = Value::from(f64::from_bits(bits));
        let mut out = Vec::new();
        write_value(&value, &mut out);
        String::from_utf8(out).unwrap()
    }

    /// RFC 8785 section 3.2.2: the canonical example.
    #[test]
    fn rfc8785_example() {
        let input = r#"{
            "numbers": [333333333.33333329, 1E30, 4.50, 2e-3, 0.000000000000000000000000001],
            "string": "\u20ac$\u000F\u000aA'\u0042\u0022\u005c\\\"\/",
            "literals": [null, true, false]
        }"#;
        assert_eq!(
            canon(input),
            r#"{"literals":[null,true,false],"numbers":[333333333.3333333,1e+30,4.5,0.002,1e-27],"string":"€$\u000f\nA'B\"\\\\\"/"}"#
        );
    }

    /// RFC 8785 section 3.2.3: property sorting by UTF-16 code units.
    #[test]
    fn rfc8785_sorting() {
        let input = r#"{
            "\u20ac": "Euro Sign",
            "\r": "Carriage Return",
            "\ufb33": "Hebrew Letter Dalet With Dagesh",
            "1": "One",
            "\ud83d\ude00": "Emoji: Grinning Face",
            "\u0080": "Control",
            "\u00f6": "Latin Small Letter O With Diaeresis"
        }"#;
        let expected = "{\"\\r\":\"Carriage Return\",\"1\":\"One\",\"\u{80}\":\"Control\",\
            \"\u{f6}\":\"Latin Small Letter O With Diaeresis\",\"\u{20ac}\":\"Euro Sign\",\
            \"\u{1f600}\":\"Emoji: Grinning Face\",\"\u{fb33}\":\"Hebrew Letter Dalet With Dagesh\"}";
        assert_eq!(canon(input), expected);
    }

    /// RFC 8785 appendix B: IEEE 754 doubles and their canonical text.
    #[test]
    fn rfc8785_number_appendix() {
        let cases: &[(u64, &str)] = &[
            (0x0000000000000000, "0"),
            (0x8000000000000000, "0"),
            (0x0000000000000001, "5e-324"),
            (0x8000000000000001, "-5e-324"),
            (0x7fefffffffffffff, "1.7976931348623157e+308"),
            (0xffefffffffffffff, "-1.7976931348623157e+308"),
            (0x4340000000000000, "9007199254740992"),
            (0xc340000000000000, "-9007199254740992"),
            (0x4430000000000000, "295147905179352830000"),
            (0x44b52d02c7e14af5, "9.999999999999997e+22"),
            (0x44b52d02c7e14af6, "1e+23"),
            (0x44b52d02c7e14af7, "1.0000000000000001e+23"),
            (0x444b1ae4d6e2ef4e, "999999999999999700000"),
            (0x444b1ae4d6e2ef4f, "999999999999999900000"),
            (0x444b1ae4d6e2ef50, "1e+21"),
            (0x3eb0c6f7a0b5ed8c, "9.999999999999997e-7"),
            (0x3eb0c6f7a0b5ed8d, "0.000001"),
            (0x41b3de4355555553, "333333333.3333332"),
            (0x41b3de4355555554, "333333333.33333325"),
            (0x41b3de4355555555, "333333333.3333333"),
            (0x41b3de4355555556, "333333333.3333334"),
            (0x41b3de4355555557, "333333333.33333343"),
            (0xbecbf647612f3696, "-0.0000033333333333333333"),
            (0x43143ff3c1cb0959, "1424953923781206.2"),
        ];
        for &(bits, expected) in cases {
            assert_eq!(number(bits), expected, "bits {bits:#018x}");
        }
    }

    #[test]
    fn number_spellings_agree() {
        for spelling in ["100", "100.0", "1e2", "1E+2", "100.00", "10e1", "1000e-1"] {
            assert_eq!(canon(spelling), "100", "{spelling}");
        }
        assert_eq!(canon("-0"), "0");
        assert_eq!(canon("-0.0"), "0");
        assert_eq!(canon("0.1"), "0.1");
        assert_eq!(canon("-12"), "-12");
        assert_eq!(canon(&i64::MIN.to_string()), i64::MIN.to_string());
        assert_eq!(canon(&u64::MAX.to_string()), u64::MAX.to_string());
    }

    /// Integral doubles above 2^53 print like the same integer, and never like another one.
    #[test]
    fn integral_doubles_above_2_53_print_their_exact_digits() {
        assert_eq!(canon("1152921504606846976.0"), "1152921504606846976");
        assert_eq!(
            canon("1.152921504606846976e18"),
            canon("1152921504606846976")
        );
        assert_ne!(canon("1152921504606846976.0"), canon("1152921504606847000"));
        assert_eq!(canon("-9223372036854775808.0"), "-9223372036854775808");
        assert_eq!(canon("9007199254740992.0"), "9007199254740992");
        assert_eq!(
            canon("1e20"),
            "100000000000000000000",
            "beyond 64 bits: RFC 8785 formatting"
        );
        assert_eq!(canon("1.5e300"), "1.5e+300");
    }

    /// The documented deviation: integers above 2^53 keep all their digits.
    #[test]
    fn large_integers_do_not_collide() {
        assert_eq!(canon("9007199254740993"), "9007199254740993");
        assert_ne!(canon("9007199254740993"), canon("9007199254740992"));
        assert_eq!(canon("1234567890123456789"), "1234567890123456789");
    }

    #[test]
    fn string_escapes() {
        assert_eq!(
            canon(r#""\u0000\u001f\u007f\b\f""#),
            "\"\\u0000\\u001f\u{7f}\\b\\f\""
        );
        assert_eq!(canon(r#""\u2028""#), "\"\u{2028}\"");
        assert_eq!(canon(r#""a\/b""#), "\"a/b\"");
    }

    #[test]
    fn big_integer_literal_normalization() {
        let mut out = Vec::new();
        write_big_integer("-000", &mut out);
        assert_eq!(out, b"0");
        out.clear();
        write_big_integer("-0012345678901234567890123", &mut out);
        assert_eq!(out, b"-12345678901234567890123");
    }
}
