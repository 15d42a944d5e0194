//! HTML escaping: every value the page shows goes through [`escape`].

use std::fmt::Write as _;

/// `text` with `&`, `<`, `>`, `"` and `'` replaced by character references: safe in element
/// content and in quoted attribute values.
pub(crate) fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// `value` formatted, then escaped.
pub(crate) fn esc(value: impl std::fmt::Display) -> String {
    let mut text = String::new();
    let _ = write!(text, "{value}");
    escape(&text)
}

#[cfg(test)]
mod tests {
    use super::escape;

    #[test]
    fn escapes_markup_and_quotes() {
        assert_eq!(
            escape(r#"<script>alert("x")</script> & 'y'"#),
            "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt; &amp; &#39;y&#39;"
        );
        assert_eq!(escape("plain"), "plain");
    }
}
