//! Decoding: check that a whole frame is buffered (no allocation), then parse it.

use bytes::{Buf, Bytes, BytesMut};

use crate::escape::unescape;
use crate::frame::{Command, Frame, Item, Version};

/// How much one frame may hold. Exceeding a limit is a [`DecodeError`], reported as soon as
/// the excess is visible in the buffer (never after waiting for the rest of the frame).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Limits {
    /// Most header lines in one frame (repeats count). Default 128.
    pub max_headers: usize,
    /// Most bytes of the command line, the header lines and the blank line that ends them,
    /// line ends included. Default 64 KiB.
    pub max_header_bytes: usize,
    /// Most bytes of body (the NUL terminator not counted). Default 64 MiB.
    pub max_body: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_headers: 128,
            max_header_bytes: 64 * 1024,
            max_body: 64 * 1024 * 1024,
        }
    }
}

/// Why bytes could not be decoded. The `Display` text is meant for the `message` header of the
/// ERROR frame a server sends before closing the connection. Offending input is quoted
/// shortened to 32 bytes, with control characters escaped.
#[derive(Clone, PartialEq, Eq, Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DecodeError {
    /// The command line is not one of the STOMP commands (they are case-sensitive).
    #[error("unknown command \"{0}\"")]
    UnknownCommand(String),
    /// A header line has no `:` between name and value.
    #[error("malformed header line \"{0}\" (expected name:value)")]
    BadHeaderLine(String),
    /// A header contains an escape sequence other than `\\`, `\n`, `\r` and `\c`.
    #[error(
        "invalid escape sequence \"{0}\" in a header (only \\\\, \\n, \\r and \\c are allowed)"
    )]
    BadEscape(String),
    /// The `content-length` header is not a decimal number.
    #[error("invalid content-length \"{0}\" (expected a decimal number of bytes)")]
    BadContentLength(String),
    /// The byte after `content-length` bytes of body is not the NUL that ends a frame.
    #[error("frame body is not followed by a NUL octet after content-length {0} bytes")]
    MissingNul(usize),
    /// More header lines than [`Limits::max_headers`].
    #[error("too many headers (at most {max} are allowed)")]
    TooManyHeaders {
        /// The limit.
        max: usize,
    },
    /// Command and headers longer than [`Limits::max_header_bytes`].
    #[error("command and headers exceed the maximum of {max} bytes")]
    HeadersTooLong {
        /// The limit.
        max: usize,
    },
    /// A body longer than [`Limits::max_body`] (announced by `content-length`, or no NUL
    /// within that many bytes).
    #[error("frame body exceeds the maximum of {max} bytes")]
    BodyTooLarge {
        /// The limit.
        max: usize,
    },
    /// A header name or value is not valid UTF-8.
    #[error("header is not valid UTF-8")]
    NonUtf8Header,
}

/// Longest possible command line: `UNSUBSCRIBE`, an optional CR and the LF. A buffer this long without an LF cannot start with a command.
const MAX_COMMAND_LINE: usize = "UNSUBSCRIBE\r\n".len();

/// Quotes at most 32 bytes of offending input for an error message.
pub(crate) fn snippet(b: &[u8]) -> String {
    const MAX: usize = 32;
    let cut = &b[..b.len().min(MAX)];
    let mut s = String::with_capacity(cut.len() + 8);
    for c in String::from_utf8_lossy(cut).chars() {
        if c.is_control() {
            s.extend(c.escape_default());
        } else {
            s.push(c);
        }
    }
    if b.len() > MAX {
        s.push_str("...");
    }
    s
}

#[inline]
fn find(b: &[u8], byte: u8) -> Option<usize> {
    b.iter().position(|&x| x == byte)
}

#[inline]
fn strip_cr(line: &[u8]) -> &[u8] {
    match line {
        [rest @ .., b'\r'] => rest,
        _ => line,
    }
}

/// What the check pass learnt about a complete header section.
struct Head {
    command: Command,
    /// Offset of the first header line.
    headers_start: usize,
    /// Offset of the blank line that ends the headers.
    headers_end: usize,
    /// Offset of the body (just after the blank line).
    body_start: usize,
    /// Number of header lines.
    count: usize,
    /// The first `content-length` header, parsed.
    content_length: Option<usize>,
}

/// Neither end of the header section nor an excess yet: need more bytes, unless the buffer
/// already holds more than the header section may take.
fn incomplete_head(len: usize, limits: &Limits) -> Result<Option<Head>, DecodeError> {
    if len >= limits.max_header_bytes {
        Err(DecodeError::HeadersTooLong {
            max: limits.max_header_bytes,
        })
    } else {
        Ok(None)
    }
}

/// Finds the end of the header section without allocating, validating what can be validated
/// early: the command, the header count, the header section's size, header lines having a
/// `:`, and the first `content-length`.
fn check_head(buf: &[u8], limits: &Limits) -> Result<Option<Head>, DecodeError> {
    let probe = &buf[..buf.len().min(MAX_COMMAND_LINE)];
    let Some(nl) = find(probe, b'\n') else {
        if buf.len() >= MAX_COMMAND_LINE {
            return Err(DecodeError::UnknownCommand(snippet(probe)));
        }
        return incomplete_head(buf.len(), limits);
    };
    let command = Command::from_bytes(strip_cr(&buf[..nl]))
        .ok_or_else(|| DecodeError::UnknownCommand(snippet(strip_cr(&buf[..nl]))))?;
    let headers_start = nl + 1;
    if headers_start > limits.max_header_bytes {
        return Err(DecodeError::HeadersTooLong {
            max: limits.max_header_bytes,
        });
    }

    let window = &buf[..buf.len().min(limits.max_header_bytes)];
    let mut pos = headers_start;
    let mut count = 0;
    let mut content_length = None;
    loop {
        let Some(off) = find(&window[pos..], b'\n') else {
            return incomplete_head(buf.len(), limits);
        };
        let line_end = pos + off;
        let line = strip_cr(&window[pos..line_end]);
        if line.is_empty() {
            return Ok(Some(Head {
                command,
                headers_start,
                headers_end: pos,
                body_start: line_end + 1,
                count,
                content_length,
            }));
        }
        count += 1;
        if count > limits.max_headers {
            return Err(DecodeError::TooManyHeaders {
                max: limits.max_headers,
            });
        }
        let Some(colon) = find(line, b':') else {
            return Err(DecodeError::BadHeaderLine(snippet(line)));
        };
        if content_length.is_none() && &line[..colon] == b"content-length" {
            content_length = Some(parse_content_length(&line[colon + 1..], limits)?);
        }
        pos = line_end + 1;
    }
}

/// A decimal number of bytes, blanks around it tolerated. Larger than the body limit (or
/// than `usize`) is [`DecodeError::BodyTooLarge`].
fn parse_content_length(raw: &[u8], limits: &Limits) -> Result<usize, DecodeError> {
    let digits = raw.trim_ascii();
    if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
        return Err(DecodeError::BadContentLength(snippet(raw)));
    }
    let too_large = DecodeError::BodyTooLarge {
        max: limits.max_body,
    };
    let mut n: usize = 0;
    for &d in digits {
        n = n
            .checked_mul(10)
            .and_then(|n| n.checked_add(usize::from(d - b'0')))
            .ok_or_else(|| too_large.clone())?;
    }
    if n > limits.max_body {
        return Err(too_large);
    }
    Ok(n)
}

/// Parses the header lines of a checked header section into owned, unescaped strings.
fn parse_headers(
    section: &[u8],
    count: usize,
    escaped: bool,
) -> Result<Vec<(String, String)>, DecodeError> {
    let mut headers = Vec::with_capacity(count);
    for line in section.split(|&b| b == b'\n').take(count) {
        let line = strip_cr(line);
        let colon = find(line, b':').ok_or_else(|| DecodeError::BadHeaderLine(snippet(line)))?;
        let name = std::str::from_utf8(&line[..colon]).map_err(|_| DecodeError::NonUtf8Header)?;
        let value =
            std::str::from_utf8(&line[colon + 1..]).map_err(|_| DecodeError::NonUtf8Header)?;
        if escaped {
            headers.push((unescape(name)?.into_owned(), unescape(value)?.into_owned()));
        } else {
            headers.push((name.to_owned(), value.to_owned()));
        }
    }
    Ok(headers)
}

/// Decodes the item at the front of `buf`.
///
/// - `Ok(None)`: the item is not complete yet; `buf` is untouched. Read more and call again.
/// - `Ok(Some(Item::HeartBeat))`: one bare EOL was consumed.
/// - `Ok(Some(Item::Frame(_)))`: exactly one frame, NUL included, was consumed; EOLs after the
///   NUL stay in `buf` and come back as heart-beats. The body is a zero-copy slice of `buf`.
/// - `Err(_)`: the input is malformed or over a limit; the connection should be closed
///   (after an ERROR frame, on a server). `buf` is left as it was.
///
/// `version` is the negotiated version: it decides whether headers are unescaped (1.1 and
/// 1.2, except in CONNECT and CONNECTED frames). Before negotiation, any version works for
/// a CONNECT frame.
///
/// Call it in a loop until it returns `Ok(None)`: one read may hold many frames.
pub fn decode(
    buf: &mut BytesMut,
    version: Version,
    limits: &Limits,
) -> Result<Option<Item>, DecodeError> {
    decode_resuming(buf, version, limits, &mut Scanned::default())
}

/// How much of the body of the frame at the start of a buffer is known to hold no NUL (for
/// a frame without `content-length`): [`decode_resuming`] starts looking for the NUL there,
/// so a body that arrives a little at a time is scanned once, not once per read (a client
/// trickling a large body could otherwise keep a core busy rescanning it).
#[derive(Debug, Default, Clone, Copy)]
pub struct Scanned(usize);

/// [`decode`] for a connection that keeps a [`Scanned`] between calls (the same buffer, the
/// same one for every call; it resets itself when a frame is taken).
pub fn decode_resuming(
    buf: &mut BytesMut,
    version: Version,
    limits: &Limits,
    scanned: &mut Scanned,
) -> Result<Option<Item>, DecodeError> {
    let r = decode_frame(buf, version, limits, scanned);
    if !matches!(r, Ok(None)) {
        *scanned = Scanned::default();
    }
    r
}

fn decode_frame(
    buf: &mut BytesMut,
    version: Version,
    limits: &Limits,
    scanned: &mut Scanned,
) -> Result<Option<Item>, DecodeError> {
    match buf.first() {
        None => return Ok(None),
        Some(b'\n') => {
            buf.advance(1);
            return Ok(Some(Item::HeartBeat));
        }
        Some(b'\r') => match buf.get(1) {
            None => return Ok(None),
            Some(b'\n') => {
                buf.advance(2);
                return Ok(Some(Item::HeartBeat));
            }
            // Not an EOL: the command line check rejects it.
            Some(_) => {}
        },
        Some(_) => {}
    }

    let Some(head) = check_head(buf, limits)? else {
        return Ok(None);
    };
    let body_start = head.body_start;
    let body_len = match head.content_length {
        Some(n) => {
            // `body_start <= max_header_bytes` and `n <= max_body`, but both limits are
            // caller-chosen: do not trust the sum not to overflow.
            let Some(nul) = body_start.checked_add(n) else {
                return Err(DecodeError::BodyTooLarge {
                    max: limits.max_body,
                });
            };
            match buf.get(nul) {
                None => return Ok(None),
                Some(0) => n,
                Some(_) => return Err(DecodeError::MissingNul(n)),
            }
        }
        None => {
            let end = buf
                .len()
                .min(body_start.saturating_add(limits.max_body).saturating_add(1));
            let from = body_start.saturating_add(scanned.0).min(end);
            match find(&buf[from..end], 0) {
                Some(n) => from - body_start + n,
                None if buf.len() - body_start > limits.max_body => {
                    return Err(DecodeError::BodyTooLarge {
                        max: limits.max_body,
                    });
                }
                None => {
                    scanned.0 = end - body_start;
                    return Ok(None);
                }
            }
        }
    };

    let headers = parse_headers(
        &buf[head.headers_start..head.headers_end],
        head.count,
        head.command.escapes_headers(version),
    )?;
    buf.advance(body_start);
    let body = if body_len == 0 {
        // Keep the read buffer uniquely owned so it can be reused without reallocating.
        Bytes::new()
    } else {
        buf.split_to(body_len).freeze()
    };
    buf.advance(1); // the NUL
    Ok(Some(Item::Frame(Frame {
        command: head.command,
        headers,
        body,
    })))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A body without `content-length` that arrives a byte at a time is searched for its
    /// NUL once: each call starts where the last one stopped, and the frame is the same as
    /// when it arrives whole.
    #[test]
    fn a_trickled_body_is_scanned_once() {
        let body = vec![b'x'; 5000];
        let mut wire = b"SEND\ndestination:/queue/a\n\n".to_vec();
        let head = wire.len();
        wire.extend_from_slice(&body);
        wire.push(0);
        let limits = Limits::default();
        let (mut buf, mut scanned) = (BytesMut::new(), Scanned::default());
        for (i, b) in wire.iter().enumerate() {
            buf.extend_from_slice(&[*b]);
            match decode_resuming(&mut buf, Version::V1_2, &limits, &mut scanned).unwrap() {
                None => {
                    // Everything of the body that arrived was searched.
                    assert_eq!(scanned.0, (i + 1).saturating_sub(head), "at byte {i}");
                }
                Some(Item::Frame(f)) => {
                    assert_eq!(i, wire.len() - 1);
                    assert_eq!(&f.body[..], &body[..]);
                    assert_eq!(scanned.0, 0, "reset for the next frame");
                    return;
                }
                Some(other) => panic!("{other:?}"),
            }
        }
        panic!("no frame");
    }
}
