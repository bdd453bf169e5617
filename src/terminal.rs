//! Text for people's terminals: the one escape of control characters that
//! every text output (`drover status`, `log`, `check`, `windows`, errors)
//! and every Kubernetes Event goes through.
//!
//! Much of what drover prints comes from others: a status report's
//! message, a health query's labels, a commit's author, a config's freeze
//! reason. A terminal obeys the control characters in it: an ESC sequence
//! can move the cursor and draw a row that is not there (a fake "confirmed
//! trusted"), a carriage return or a line feed can overwrite or add one.
//! [`escape`] writes each such character visibly instead, as Rust escapes
//! it (`\u{1b}`, `\n`), so nothing in a field can change how the rest of
//! the output reads. JSON output needs none of this: it is escaped by
//! its own grammar.

use std::borrow::Cow;

/// `n` and the noun, singular for one: `1 node`, `3 nodes`, `0 nodes`.
pub fn count(n: impl Into<u64>, one: &str, many: &str) -> String {
    let n = n.into();
    format!("{n} {}", if n == 1 { one } else { many })
}

/// Whether `c` must not reach a terminal as is: C0 and C1 controls and DEL
/// (Unicode's `Cc`), and the bidirectional formatting characters that
/// reorder what is displayed (the "Trojan Source" characters).
fn unsafe_char(c: char) -> bool {
    c.is_control()
        || matches!(c, '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

/// `text` with every control character (line feeds included: a field never
/// breaks a line) and every bidirectional formatting character written as
/// an escape; borrowed when there is none, as almost always.
pub fn escape(text: &str) -> Cow<'_, str> {
    if !text.chars().any(unsafe_char) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        if unsafe_char(c) {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn controls_are_escaped_and_plain_text_is_borrowed() {
        assert!(matches!(
            escape("stage-1 confirmed 1.13.2 · ↳ ok"),
            Cow::Borrowed(_)
        ));
        assert_eq!(
            escape("a\u{1b}[2K\u{1b}[1Arow\r\nx\ty\u{7f}\u{9b}"),
            "a\\u{1b}[2K\\u{1b}[1Arow\\r\\nx\\ty\\u{7f}\\u{9b}"
        );
        assert_eq!(escape("abc\u{202e}cba"), "abc\\u{202e}cba");
    }
}
