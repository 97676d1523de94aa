//! MQTT over WebSocket (`ws://`, subprotocol `mqtt`), as browser clients use it: a
//! [transport](hayate_io::transport) that frames the connection's byte stream in process.
//!
//! [`accept`] performs the HTTP upgrade (RFC 6455 section 4.2) and returns a reader and a
//! writer for the front-end, which serves them like any other connection:
//!
//! - client → broker ([`WsReader`], an `AsyncRead`): the payload of every binary message
//!   (and, leniently, text message) is unmasked straight into the front-end's read buffer,
//!   so a packet split across messages, or several packets in one message, reach it as the
//!   plain stream it expects. Pings are answered, pongs ignored; a close frame is answered
//!   and ends the stream. Unmasked client frames, reserved bits, unknown opcodes, fragmented
//!   or long control frames are protocol errors (close 1002); a message longer than
//!   `max_message` closes with 1009. Either way the reader then reports end of stream.
//! - broker → client ([`WsWrite`], a [`WriteHalf`](hayate_io::transport::WriteHalf)): each
//!   vectored write becomes one binary frame (header and payload slices in one `writev`, at
//!   most 1 MiB of payload a frame), so a payload is not copied on its way out. When the
//!   socket takes only part of a frame, the rest is copied aside and written before anything
//!   else (a frame is never interleaved); `shutdown` sends a close frame (1000) and ends the
//!   TCP write side.
//!
//! Back-pressure holds both ways: the reader reads the socket only when the front-end
//! reads, and the writer reports `WouldBlock` until any partial frame is out.
//!
//! # Layout
//! - this module: [`accept`], the HTTP upgrade (request, checks, subprotocol, answer);
//! - `frame`: frames, sans-IO: [`parse_header`] (a client frame's [`Header`]), the header of
//!   a broker frame, control frames, the opcodes and close codes, unmasking;
//! - `reader`: [`WsReader`], the client → broker direction;
//! - `writer`: [`WsWrite`], the broker → client direction.

use std::io;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::{Buf, Bytes, BytesMut};
use hayate_io::transport::{Reader, Writer};
use tokio::io::AsyncReadExt;

mod frame;
mod reader;
mod writer;

pub use frame::{Header, parse_header};
pub use reader::WsReader;
use writer::Out;
pub use writer::WsWrite;

/// How long a client has to complete the HTTP upgrade.
#[cfg(test)]
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// The longest upgrade request accepted.
const MAX_REQUEST: usize = 8 * 1024;
/// The most payload bytes the broker puts in one frame.
const MAX_OUT_FRAME: usize = 1024 * 1024;
/// What the reader asks of the socket at a time.
const READ_CHUNK: usize = 64 * 1024;

fn invalid(msg: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg.into())
}

/// Accepts a WebSocket connection on `stream` (server side of the HTTP upgrade, any path)
/// and returns its reader and writer (see the module docs).
///
/// If the client offers subprotocols, `subprotocol` must be among them (for `mqtt`, the
/// older `mqttv3.1` is accepted too) and the response names the one chosen, in the client's
/// spelling; otherwise the upgrade is refused with HTTP 400. A client that offers none is
/// accepted without one. Messages larger than `max_message` bytes close the connection. The
/// handshake must finish within 10 seconds and its request fit in 8 KiB.
pub async fn accept(
    mut reader: Reader,
    writer: Writer,
    subprotocol: &'static str,
    max_message: usize,
    handshake_timeout: Duration,
) -> io::Result<(Reader, Writer)> {
    let (head_len, mut buf) =
        match tokio::time::timeout(handshake_timeout, read_request(&mut reader)).await {
            Ok(r) => r?,
            Err(_) => {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "WebSocket handshake timed out",
                ));
            }
        };
    let response = match upgrade(&buf[..head_len], subprotocol) {
        Ok(r) => r,
        Err(why) => {
            let body = format!("{why}\n");
            let refusal = format!(
                "HTTP/1.1 400 Bad Request\r\ncontent-type: text/plain\r\nconnection: close\r\n\
                 content-length: {}\r\n\r\n{body}",
                body.len()
            );
            let _ = hayate_io::transport::write_all(&*writer, Bytes::from(refusal)).await;
            writer.shutdown();
            return Err(invalid(format!("WebSocket upgrade refused: {why}")));
        }
    };
    hayate_io::transport::write_all(&*writer, Bytes::from(response)).await?;
    buf.advance(head_len);
    let writer = Arc::new(WsWrite {
        tcp: writer,
        out: Mutex::new(Out::default()),
    });
    let reader = WsReader {
        tcp: reader,
        raw: buf,
        frame: None,
        message: 0,
        in_message: false,
        max_message,
        writer: writer.clone(),
        done: false,
    };
    Ok((Box::new(reader), writer))
}

/// Reads the upgrade request; returns its length (through the blank line) and everything
/// read (a client may not send frames before our answer, but what it sent is kept).
async fn read_request(stream: &mut Reader) -> io::Result<(usize, BytesMut)> {
    let mut buf = BytesMut::with_capacity(1024);
    loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            return Ok((i + 4, buf));
        }
        if buf.len() >= MAX_REQUEST {
            return Err(invalid("WebSocket upgrade request too long"));
        }
        buf.reserve(1024);
        if stream.read_buf(&mut buf).await? == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
    }
}

/// Checks the upgrade request and builds the 101 answer, or says why not.
fn upgrade(head: &[u8], wanted: &str) -> Result<String, String> {
    let mut headers = [httparse::EMPTY_HEADER; 64];
    let mut req = httparse::Request::new(&mut headers);
    match req.parse(head) {
        Ok(httparse::Status::Complete(_)) => {}
        _ => return Err("malformed HTTP request".into()),
    }
    if req.method != Some("GET") {
        return Err("a WebSocket upgrade is a GET".into());
    }
    let headers: &[httparse::Header<'_>] = req.headers;
    let values = |name: &'static str| {
        headers
            .iter()
            .filter(move |h| h.name.eq_ignore_ascii_case(name))
            .filter_map(|h| std::str::from_utf8(h.value).ok())
            .flat_map(|v| v.split(','))
            .map(str::trim)
            .filter(|v| !v.is_empty())
    };
    if !values("upgrade").any(|v| v.eq_ignore_ascii_case("websocket")) {
        return Err("missing `Upgrade: websocket`".into());
    }
    if !values("connection").any(|v| v.eq_ignore_ascii_case("upgrade")) {
        return Err("missing `Connection: Upgrade`".into());
    }
    if !values("sec-websocket-version").any(|v| v == "13") {
        return Err("unsupported WebSocket version (13 is spoken)".into());
    }
    let key = headers
        .iter()
        .find(|h| h.name.eq_ignore_ascii_case("sec-websocket-key"))
        .map(|h| h.value.trim_ascii())
        .filter(|k| !k.is_empty())
        .ok_or("missing Sec-WebSocket-Key")?;
    let mut offered_any = false;
    let mut chosen: Option<&str> = None;
    for p in values("sec-websocket-protocol") {
        offered_any = true;
        // The exact name wins over an alias, whatever the order of the offer.
        if acceptable(p, wanted) && chosen.is_none_or(|c| !c.eq_ignore_ascii_case(wanted)) {
            chosen = Some(p);
        }
    }
    if offered_any && chosen.is_none() {
        return Err(format!(
            "unsupported WebSocket subprotocol (expected {wanted})"
        ));
    }
    let accept = tokio_tungstenite::tungstenite::handshake::derive_accept_key(key);
    let mut r = format!(
        "HTTP/1.1 101 Switching Protocols\r\nupgrade: websocket\r\nconnection: Upgrade\r\n\
         sec-websocket-accept: {accept}\r\n"
    );
    if let Some(p) = chosen {
        // Echo the client's own spelling: browsers fail a response naming anything else.
        r.push_str(&format!("sec-websocket-protocol: {p}\r\n"));
    }
    r.push_str("\r\n");
    Ok(r)
}

/// Whether `offered` names `wanted`, or an older name of it.
fn acceptable(offered: &str, wanted: &str) -> bool {
    offered.eq_ignore_ascii_case(wanted)
        || (wanted.eq_ignore_ascii_case("mqtt") && offered.eq_ignore_ascii_case("mqttv3.1"))
}

#[cfg(test)]
mod tests;
