//! Encoding: a general [`encode`] for any [`Frame`], and allocation-free encoders for the hot
//! path (SEND from a client, MESSAGE from a server).

use bytes::BytesMut;

use crate::escape::{escape, write_raw};
use crate::frame::{Command, Frame, Version};

/// Writes a header name or value, escaped or not.
#[inline]
fn write_text(escaped: bool, s: &str, out: &mut BytesMut) {
    if escaped {
        escape(s, out);
    } else {
        write_raw(s, out);
    }
}

#[inline]
fn write_header(escaped: bool, name: &str, value: &str, out: &mut BytesMut) {
    write_text(escaped, name, out);
    out.extend_from_slice(b":");
    write_text(escaped, value, out);
    out.extend_from_slice(b"\n");
}

/// Writes `n` in decimal without allocating.
fn write_usize(mut n: usize, out: &mut BytesMut) {
    let mut digits = [0u8; 20];
    let mut at = digits.len();
    loop {
        at -= 1;
        // `n % 10 < 10`, so the cast cannot truncate.
        digits[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    out.extend_from_slice(&digits[at..]);
}

/// Writes `content-length:<len>`, its LF and the blank line that ends the headers.
#[inline]
fn write_content_length_and_blank(len: usize, out: &mut BytesMut) {
    out.extend_from_slice(b"content-length:");
    write_usize(len, out);
    out.extend_from_slice(b"\n\n");
}

fn headers_len(headers: &[(&str, &str)]) -> usize {
    headers.iter().map(|(n, v)| n.len() + v.len() + 2).sum()
}

/// Appends `frame` to `out`, with LF line ends.
///
/// Header names and values are escaped when the version and command call for it (1.1 and
/// 1.2, except CONNECT and CONNECTED). Where headers are not escaped, CR and LF inside them
/// are written as spaces (such a header cannot carry a line end), and a `:` in a name will be
/// read back as the end of the name.
///
/// A `content-length` header is added after the frame's own headers when the body is not
/// empty and the frame carries no `content-length` of its own (for any command, so that a
/// body containing NULs always survives; STOMP only allows bodies in SEND, MESSAGE and
/// ERROR). A `content-length` the frame carries is written as is and must be right.
pub fn encode(frame: &Frame, version: Version, out: &mut BytesMut) {
    let escaped = frame.command.escapes_headers(version);
    let add_length = !frame.body.is_empty() && frame.get("content-length").is_none();
    let headers: usize = frame
        .headers
        .iter()
        .map(|(n, v)| n.len() + v.len() + 2)
        .sum();
    out.reserve(frame.command.as_str().len() + headers + frame.body.len() + 40);

    out.extend_from_slice(frame.command.as_str().as_bytes());
    out.extend_from_slice(b"\n");
    for (name, value) in &frame.headers {
        write_header(escaped, name, value, out);
    }
    if add_length {
        write_content_length_and_blank(frame.body.len(), out);
    } else {
        out.extend_from_slice(b"\n");
    }
    out.extend_from_slice(&frame.body);
    out.extend_from_slice(b"\0");
}

/// Appends a SEND frame: `destination`, then `headers` in order, then `content-length`, then
/// `body`. Allocates nothing beyond growing `out`. `headers` must not hold `destination` or
/// `content-length` (they would be repeated, and the first one wins).
pub fn encode_send(
    destination: &str,
    headers: &[(&str, &str)],
    body: &[u8],
    version: Version,
    out: &mut BytesMut,
) {
    let escaped = Command::Send.escapes_headers(version);
    out.reserve(destination.len() + headers_len(headers) + body.len() + 64);
    out.extend_from_slice(b"SEND\ndestination:");
    write_text(escaped, destination, out);
    out.extend_from_slice(b"\n");
    for (name, value) in headers {
        write_header(escaped, name, value, out);
    }
    write_content_length_and_blank(body.len(), out);
    out.extend_from_slice(body);
    out.extend_from_slice(b"\0");
}

/// Appends a MESSAGE frame: `destination`, `subscription`, `message-id`, then `headers` in
/// order, then `content-length`, then `body`. Allocates nothing beyond growing `out`.
/// `headers` must not repeat the named ones or `content-length`.
pub fn encode_message(
    destination: &str,
    subscription: &str,
    message_id: &str,
    headers: &[(&str, &str)],
    body: &[u8],
    version: Version,
    out: &mut BytesMut,
) {
    out.reserve(
        destination.len()
            + subscription.len()
            + message_id.len()
            + headers_len(headers)
            + body.len()
            + 96,
    );
    encode_message_head(
        destination,
        subscription,
        message_id,
        headers,
        body.len(),
        version,
        out,
    );
    out.extend_from_slice(body);
    out.extend_from_slice(b"\0");
}

/// Appends everything of a MESSAGE frame that comes before its body, for a writer that sends
/// a large body by reference: the caller then writes the `body_len` body bytes and one NUL
/// octet (`b"\0"`). Otherwise the same as [`encode_message`].
pub fn encode_message_head(
    destination: &str,
    subscription: &str,
    message_id: &str,
    headers: &[(&str, &str)],
    body_len: usize,
    version: Version,
    out: &mut BytesMut,
) {
    let escaped = Command::Message.escapes_headers(version);
    out.reserve(
        destination.len() + subscription.len() + message_id.len() + headers_len(headers) + 96,
    );
    out.extend_from_slice(b"MESSAGE\ndestination:");
    write_text(escaped, destination, out);
    out.extend_from_slice(b"\nsubscription:");
    write_text(escaped, subscription, out);
    out.extend_from_slice(b"\nmessage-id:");
    write_text(escaped, message_id, out);
    out.extend_from_slice(b"\n");
    for (name, value) in headers {
        write_header(escaped, name, value, out);
    }
    write_content_length_and_blank(body_len, out);
}
