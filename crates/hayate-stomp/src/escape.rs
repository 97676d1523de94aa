//! Header escaping (STOMP 1.1 and 1.2).

use std::borrow::Cow;

use bytes::BytesMut;

use crate::decode::{DecodeError, snippet};

/// Writes `value` escaped for a STOMP 1.1/1.2 header: `\` → `\\`, LF → `\n`, CR → `\r`,
/// `:` → `\c`. Everything else is copied as is.
///
/// ```
/// let mut out = bytes::BytesMut::new();
/// hayate_stomp::escape("a:b\nc\\", &mut out);
/// assert_eq!(&out[..], b"a\\cb\\nc\\\\");
/// ```
pub fn escape(value: &str, out: &mut BytesMut) {
    let bytes = value.as_bytes();
    let mut start = 0;
    for (i, &b) in bytes.iter().enumerate() {
        let replacement: &[u8] = match b {
            b'\\' => b"\\\\",
            b':' => b"\\c",
            b'\n' => b"\\n",
            b'\r' => b"\\r",
            _ => continue,
        };
        out.extend_from_slice(&bytes[start..i]);
        out.extend_from_slice(replacement);
        start = i + 1;
    }
    out.extend_from_slice(&bytes[start..]);
}

/// Writes `value` for a frame whose headers are not escaped (STOMP 1.0, and CONNECT and
/// CONNECTED in every version). Such a header cannot carry a line end, so CR and LF are
/// written as spaces to keep the frame well-formed.
pub(crate) fn write_raw(value: &str, out: &mut BytesMut) {
    let bytes = value.as_bytes();
    let mut start = 0;
    for (i, &b) in bytes.iter().enumerate() {
        if b == b'\n' || b == b'\r' {
            out.extend_from_slice(&bytes[start..i]);
            out.extend_from_slice(b" ");
            start = i + 1;
        }
    }
    out.extend_from_slice(&bytes[start..]);
}

/// Undoes [`escape`]: `\\`, `\n`, `\r` and `\c` become `\`, LF, CR and `:`. Any other escape
/// sequence (`\t`, or a `\` at the end) is an error, as STOMP 1.1 and 1.2 require.
/// Borrows when there is nothing to unescape.
///
/// The `\r` escape is defined by 1.2 only; it is accepted in 1.1 too.
///
/// ```
/// use hayate_stomp::{DecodeError, unescape};
/// assert_eq!(unescape("a\\cb\\nc\\\\").unwrap(), "a:b\nc\\");
/// assert!(matches!(unescape("tab\\t"), Err(DecodeError::BadEscape(_))));
/// ```
pub fn unescape(raw: &str) -> Result<Cow<'_, str>, DecodeError> {
    let Some(first) = raw.find('\\') else {
        return Ok(Cow::Borrowed(raw));
    };
    let bytes = raw.as_bytes();
    let mut out = String::with_capacity(raw.len());
    let mut start = 0;
    let mut at = first;
    loop {
        // `at` is the index of a `\`; slicing there and two bytes on stays on char boundaries
        // because both `\` and every valid escape letter are ASCII.
        out.push_str(&raw[start..at]);
        let c = match bytes.get(at + 1) {
            Some(b'\\') => '\\',
            Some(b'n') => '\n',
            Some(b'r') => '\r',
            Some(b'c') => ':',
            _ => {
                let bad: String = raw[at..].chars().take(2).collect();
                return Err(DecodeError::BadEscape(snippet(bad.as_bytes())));
            }
        };
        out.push(c);
        start = at + 2;
        match raw[start..].find('\\') {
            Some(off) => at = start + off,
            None => break,
        }
    }
    out.push_str(&raw[start..]);
    Ok(Cow::Owned(out))
}
