//! Escaping of caller-supplied key segments.
//!
//! A segment is percent-encoded so that only `[A-Za-z0-9_.-]` and `%` remain. That alphabet holds
//! no separator (`:`), no hash-tag brace and no SCAN glob character (`* ? [ ] \`), so a segment can
//! neither forge another key's structure nor widen a pattern. Percent-encoding is injective, so two
//! distinct inputs never share a key.

use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, percent_decode_str, utf8_percent_encode};

use super::KeyError;

/// Longest caller-supplied segment accepted, in bytes before escaping.
pub const MAX_SEGMENT_BYTES: usize = 256;

/// Everything except ASCII letters, digits, `_`, `.` and `-` is escaped.
const SEGMENT_ESCAPES: &AsciiSet = &NON_ALPHANUMERIC.remove(b'_').remove(b'.').remove(b'-');

/// Validates and escapes one caller-supplied segment; `what` names it in errors.
pub fn escape(what: &'static str, raw: &str) -> Result<String, KeyError> {
    if raw.is_empty() {
        return Err(KeyError::Empty { what });
    }
    if raw.len() > MAX_SEGMENT_BYTES {
        return Err(KeyError::TooLong {
            what,
            len: raw.len(),
            max: MAX_SEGMENT_BYTES,
        });
    }
    Ok(utf8_percent_encode(raw, SEGMENT_ESCAPES).to_string())
}

/// Reverses [`escape`]; `None` when the text is not a segment this module produced.
pub fn unescape(escaped: &str) -> Option<String> {
    if !escaped.bytes().all(is_escaped_byte) {
        return None;
    }
    percent_decode_str(escaped)
        .decode_utf8()
        .ok()
        .map(|decoded| decoded.into_owned())
}

/// True for the bytes an escaped segment may contain.
pub fn is_escaped_byte(byte: u8) -> bool {
    byte.is_ascii_alphanumeric() || matches!(byte, b'_' | b'.' | b'-' | b'%')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_segments_pass_through() {
        assert_eq!(
            escape("id", "abc-DEF_1.2").ok().as_deref(),
            Some("abc-DEF_1.2")
        );
    }

    #[test]
    fn separators_braces_and_globs_are_escaped() {
        let escaped = escape("name", "a:b*c?[d]\\e{f}%").unwrap_or_default();
        assert_eq!(escaped, "a%3Ab%2Ac%3F%5Bd%5D%5Ce%7Bf%7D%25");
        assert_eq!(unescape(&escaped).as_deref(), Some("a:b*c?[d]\\e{f}%"));
    }

    #[test]
    fn empty_and_oversized_are_rejected() {
        assert_eq!(escape("token", ""), Err(KeyError::Empty { what: "token" }));
        let long = "x".repeat(MAX_SEGMENT_BYTES + 1);
        assert_eq!(
            escape("token", &long),
            Err(KeyError::TooLong {
                what: "token",
                len: MAX_SEGMENT_BYTES + 1,
                max: MAX_SEGMENT_BYTES
            })
        );
    }

    #[test]
    fn unescape_rejects_foreign_text() {
        assert_eq!(unescape("a:b"), None);
        assert_eq!(unescape("%FF"), None);
    }
}
