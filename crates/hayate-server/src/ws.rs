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
//! - broker → client ([`WsWrite`], a [`WriteHalf`]): each vectored write becomes one binary
//!   frame (header and payload slices in one `writev`, at most 1 MiB of payload a frame),
//!   so a payload is not copied on its way out. When the socket takes only part of a frame,
//!   the rest is copied aside and written before anything else (a frame is never
//!   interleaved); `shutdown` sends a close frame (1000) and ends the TCP write side.
//!
//! Back-pressure holds both ways: the reader reads the socket only when the front-end
//! reads, and the writer reports `WouldBlock` until any partial frame is out.

use std::io::{self, IoSlice};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, ready};
use std::time::Duration;

use bytes::{Buf, BytesMut};
use hayate_io::Sink;
use hayate_io::chunks::MAX_IOV;
use hayate_io::transport::{Reader, WriteHalf, Writer};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt, ReadBuf};
use tokio::net::TcpStream;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};

/// How long a client has to complete the HTTP upgrade.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// The longest upgrade request accepted.
const MAX_REQUEST: usize = 8 * 1024;
/// The most payload bytes the broker puts in one frame.
const MAX_OUT_FRAME: usize = 1024 * 1024;
/// What the reader asks of the socket at a time.
const READ_CHUNK: usize = 64 * 1024;

/// Close codes (RFC 6455 section 7.4.1).
mod code {
    pub(super) const NORMAL: u16 = 1000;
    pub(super) const PROTOCOL: u16 = 1002;
    pub(super) const TOO_BIG: u16 = 1009;
}

mod op {
    pub(super) const CONTINUATION: u8 = 0x0;
    pub(super) const TEXT: u8 = 0x1;
    pub(super) const BINARY: u8 = 0x2;
    pub(super) const CLOSE: u8 = 0x8;
    pub(super) const PING: u8 = 0x9;
    pub(super) const PONG: u8 = 0xA;
}

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
    mut stream: TcpStream,
    subprotocol: &'static str,
    max_message: usize,
) -> io::Result<(Reader, Writer)> {
    stream.set_nodelay(true)?;
    let (head_len, mut buf) =
        match tokio::time::timeout(HANDSHAKE_TIMEOUT, read_request(&mut stream)).await {
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
            let _ = stream.write_all(refusal.as_bytes()).await;
            let _ = stream.shutdown().await;
            return Err(invalid(format!("WebSocket upgrade refused: {why}")));
        }
    };
    stream.write_all(response.as_bytes()).await?;
    buf.advance(head_len);
    let (r, w) = stream.into_split();
    let writer = Arc::new(WsWrite {
        tcp: w,
        out: Mutex::new(Out::default()),
    });
    let reader = WsReader {
        tcp: r,
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
async fn read_request(stream: &mut TcpStream) -> io::Result<(usize, BytesMut)> {
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

/// A frame (header, unmasked) of `len` payload bytes with `opcode`, FIN set.
fn frame_header(opcode: u8, len: usize, out: &mut [u8; 10]) -> usize {
    out[0] = 0x80 | opcode;
    if len < 126 {
        out[1] = len as u8;
        2
    } else if len <= u16::MAX as usize {
        out[1] = 126;
        out[2..4].copy_from_slice(&(len as u16).to_be_bytes());
        4
    } else {
        out[1] = 127;
        out[2..10].copy_from_slice(&(len as u64).to_be_bytes());
        10
    }
}

/// A whole control frame.
fn control_frame(opcode: u8, payload: &[u8]) -> Vec<u8> {
    let mut h = [0u8; 10];
    let n = frame_header(opcode, payload.len(), &mut h);
    let mut f = h[..n].to_vec();
    f.extend_from_slice(payload);
    f
}

fn close_frame(code: u16) -> Vec<u8> {
    control_frame(op::CLOSE, &code.to_be_bytes())
}

/// XORs `buf` with the masking key, `buf[0]` being payload byte number `offset` (RFC 6455
/// section 5.3), eight bytes at a time.
fn unmask(buf: &mut [u8], mask: [u8; 4], offset: usize) {
    let r: [u8; 4] = std::array::from_fn(|i| mask[(offset + i) % 4]);
    let m = u64::from_ne_bytes([r[0], r[1], r[2], r[3], r[0], r[1], r[2], r[3]]);
    let mut chunks = buf.chunks_exact_mut(8);
    for c in &mut chunks {
        let w = u64::from_ne_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]) ^ m;
        c.copy_from_slice(&w.to_ne_bytes());
    }
    for (i, b) in chunks.into_remainder().iter_mut().enumerate() {
        *b ^= r[i % 4];
    }
}

/// The header of a client frame (RFC 6455 section 5.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// The last frame of its message.
    pub fin: bool,
    /// 0 continuation, 1 text, 2 binary, 8 close, 9 ping, 10 pong.
    pub opcode: u8,
    /// Payload length.
    pub len: u64,
    /// The masking key.
    pub mask: [u8; 4],
    /// Bytes of the header (2 to 14).
    pub header_len: usize,
}

/// Parses the header of a client frame at the front of `raw` (sans-IO): `Ok(None)` when more
/// bytes are needed, `Err` (a reason for close 1002) when the frame is not acceptable from a
/// client: unmasked, reserved bits set, an unknown opcode, a fragmented or longer than 125
/// bytes control frame, a continuation outside a message or a new message inside one
/// (`in_message`: the previous data frame was not final).
pub fn parse_header(raw: &[u8], in_message: bool) -> Result<Option<Header>, &'static str> {
    let [b0, b1, ..] = *raw else {
        return Ok(None);
    };
    let (fin, rsv, opcode) = (b0 & 0x80 != 0, b0 & 0x70, b0 & 0x0F);
    if b1 & 0x80 == 0 {
        return Err("unmasked client frame");
    }
    if rsv != 0 {
        return Err("reserved bits set");
    }
    let len7 = u64::from(b1 & 0x7F);
    let ext = match len7 {
        126 => 2,
        127 => 8,
        _ => 0,
    };
    let header_len = 2 + ext + 4;
    if raw.len() < header_len {
        return Ok(None);
    }
    let len = match ext {
        2 => u64::from(u16::from_be_bytes([raw[2], raw[3]])),
        8 => u64::from_be_bytes(raw[2..10].try_into().unwrap_or_default()),
        _ => len7,
    };
    let mask: [u8; 4] = raw[2 + ext..header_len].try_into().unwrap_or_default();
    match opcode {
        op::CLOSE | op::PING | op::PONG if !fin || len > 125 => {
            return Err("fragmented or long control frame");
        }
        op::CLOSE | op::PING | op::PONG => {}
        op::CONTINUATION if !in_message => return Err("continuation without a message"),
        op::TEXT | op::BINARY if in_message => return Err("new message inside a fragmented one"),
        op::CONTINUATION | op::TEXT | op::BINARY => {}
        _ => return Err("unknown opcode"),
    }
    Ok(Some(Header {
        fin,
        opcode,
        len,
        mask,
        header_len,
    }))
}

/// The frame being read.
#[derive(Debug)]
struct InFrame {
    opcode: u8,
    remaining: u64,
    mask: [u8; 4],
    /// Payload bytes unmasked so far (the mask index).
    done: usize,
    /// A control frame's payload, gathered whole.
    control: Vec<u8>,
}

/// The client → broker direction: a byte stream of the data messages' payloads.
pub struct WsReader {
    tcp: OwnedReadHalf,
    /// Bytes read from the socket and not yet decoded.
    raw: BytesMut,
    frame: Option<InFrame>,
    /// Bytes of the current data message so far.
    message: u64,
    /// A data message is open (its next frame is a continuation).
    in_message: bool,
    max_message: usize,
    writer: Arc<WsWrite>,
    /// Closed (by the client, a protocol error or the socket): end of stream.
    done: bool,
}

impl std::fmt::Debug for WsReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WsReader").finish_non_exhaustive()
    }
}

/// What the decoder needs next.
enum Step {
    /// Payload bytes were produced.
    Produced,
    /// Nothing decodable: read more.
    NeedMore,
    /// A frame or control message was handled; go on decoding.
    Again,
    /// The stream ends.
    End,
}

impl WsReader {
    fn fail(&mut self, code: u16, why: &str) -> Step {
        tracing::debug!("ws: {why}: closing with {code}");
        self.writer.send_control(&close_frame(code));
        self.done = true;
        Step::End
    }

    /// Decodes from `raw` into `out`.
    fn step(&mut self, out: &mut ReadBuf<'_>) -> Step {
        let Some(f) = &mut self.frame else {
            return self.header();
        };
        if f.opcode >= op::CLOSE {
            let take = (f.remaining as usize).min(self.raw.len());
            let start = f.control.len();
            f.control.extend_from_slice(&self.raw[..take]);
            self.raw.advance(take);
            unmask(&mut f.control[start..], f.mask, start);
            f.remaining -= take as u64;
            if f.remaining > 0 {
                return Step::NeedMore;
            }
            let f = self.frame.take().expect("a frame");
            return self.control(f.opcode, &f.control);
        }
        if f.remaining == 0 {
            self.frame = None;
            return Step::Again;
        }
        let n = (f.remaining as usize)
            .min(self.raw.len())
            .min(out.remaining());
        if n == 0 {
            return if self.raw.is_empty() {
                Step::NeedMore
            } else {
                Step::Produced // `out` is full
            };
        }
        let at = out.filled().len();
        out.put_slice(&self.raw[..n]);
        unmask(&mut out.filled_mut()[at..], f.mask, f.done);
        self.raw.advance(n);
        f.done += n;
        f.remaining -= n as u64;
        if f.remaining == 0 {
            self.frame = None;
        }
        Step::Produced
    }

    fn header(&mut self) -> Step {
        let h = match parse_header(&self.raw, self.in_message) {
            Ok(Some(h)) => h,
            Ok(None) => return Step::NeedMore,
            Err(why) => return self.fail(code::PROTOCOL, why),
        };
        if h.opcode < op::CLOSE {
            if !self.in_message {
                self.message = 0;
            }
            self.message = self.message.saturating_add(h.len);
            if self.message > self.max_message as u64 {
                return self.fail(code::TOO_BIG, "message too big");
            }
            self.in_message = !h.fin;
        }
        self.raw.advance(h.header_len);
        self.frame = Some(InFrame {
            opcode: h.opcode,
            remaining: h.len,
            mask: h.mask,
            done: 0,
            control: Vec::new(),
        });
        Step::Again
    }

    fn control(&mut self, opcode: u8, payload: &[u8]) -> Step {
        match opcode {
            op::PING => {
                self.writer.send_control(&control_frame(op::PONG, payload));
                Step::Again
            }
            op::CLOSE => {
                // Answer with the client's code (or 1000), then end the stream.
                let c = match payload {
                    [a, b, ..] => u16::from_be_bytes([*a, *b]),
                    _ => code::NORMAL,
                };
                self.writer.send_control(&close_frame(c));
                self.done = true;
                Step::End
            }
            _ => Step::Again, // pong
        }
    }
}

impl AsyncRead for WsReader {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        out: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        // Control answers that the socket did not take earlier.
        this.writer.flush_control();
        let start = out.filled().len();
        loop {
            if this.done {
                return Poll::Ready(Ok(()));
            }
            match this.step(out) {
                Step::Produced => {
                    if out.remaining() == 0 || out.filled().len() > start && this.raw.is_empty() {
                        return Poll::Ready(Ok(()));
                    }
                }
                Step::Again => {}
                Step::End => return Poll::Ready(Ok(())),
                Step::NeedMore => {
                    if out.filled().len() > start {
                        return Poll::Ready(Ok(()));
                    }
                    // Inside a data frame with nothing buffered: read straight into the
                    // caller's buffer and unmask there (no copy, no zeroing).
                    if let Some(f) = &mut this.frame
                        && f.opcode < op::CLOSE
                        && this.raw.is_empty()
                        && out.remaining() > 0
                    {
                        ready!(Pin::new(&mut this.tcp).poll_read(cx, out))?;
                        let got = out.filled().len() - start;
                        if got == 0 {
                            this.done = true;
                            return Poll::Ready(Ok(()));
                        }
                        let take = usize::try_from(f.remaining).unwrap_or(usize::MAX).min(got);
                        unmask(&mut out.filled_mut()[start..start + take], f.mask, f.done);
                        if got > take {
                            // The start of the next frame: decoded from `raw` next time.
                            this.raw.extend_from_slice(&out.filled()[start + take..]);
                            out.set_filled(start + take);
                        }
                        f.done += take;
                        f.remaining -= take as u64;
                        if f.remaining == 0 {
                            this.frame = None;
                        }
                        return Poll::Ready(Ok(()));
                    }
                    let len = this.raw.len();
                    this.raw.resize(len + READ_CHUNK, 0);
                    let mut rb = ReadBuf::new(&mut this.raw[len..]);
                    let r = Pin::new(&mut this.tcp).poll_read(cx, &mut rb);
                    let n = rb.filled().len();
                    this.raw.truncate(len + n);
                    ready!(r)?;
                    if n == 0 {
                        this.done = true;
                        return Poll::Ready(Ok(()));
                    }
                }
            }
        }
    }
}

/// Output state between writes. A data frame's header is written with the start of its
/// payload; when the socket takes only part of it, the rest of the header waits in `head`
/// and the payload still owed in `frame_left`: the next write continues the same frame from
/// the caller's queue (which then starts exactly there), so payloads are never copied.
/// Control frames (pong, close) wait in `control` until no data frame is open.
#[derive(Debug, Default)]
struct Out {
    head: BytesMut,
    frame_left: usize,
    control: BytesMut,
    closed: bool,
}

/// The broker → client direction (see the module docs).
pub struct WsWrite {
    tcp: OwnedWriteHalf,
    out: Mutex<Out>,
}

impl std::fmt::Debug for WsWrite {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WsWrite").finish_non_exhaustive()
    }
}

/// Writes `b` until it is empty (true) or the socket would block (false).
fn write_buf(tcp: &OwnedWriteHalf, b: &mut BytesMut) -> io::Result<bool> {
    while !b.is_empty() {
        match tcp.try_write(b) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => b.advance(n),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
            Err(e) => return Err(e),
        }
    }
    Ok(true)
}

impl WsWrite {
    fn lock(&self) -> std::sync::MutexGuard<'_, Out> {
        crate::lock(&self.out)
    }

    /// Writes what must go before new data: the rest of a header, then (between frames)
    /// control frames. True when the way is clear.
    fn flush_before(&self, out: &mut Out) -> io::Result<bool> {
        if !write_buf(&self.tcp, &mut out.head)? {
            return Ok(false);
        }
        if out.frame_left == 0 {
            return write_buf(&self.tcp, &mut out.control);
        }
        Ok(true)
    }

    /// Queues a whole control frame (between data frames) and writes what it can now.
    fn send_control(&self, frame: &[u8]) {
        let mut out = self.lock();
        if out.closed {
            return;
        }
        out.control.extend_from_slice(frame);
        let _ = self.flush_before(&mut out);
    }

    fn flush_control(&self) {
        let mut out = self.lock();
        if !out.control.is_empty() || !out.head.is_empty() {
            let _ = self.flush_before(&mut out);
        }
    }
}

/// `bufs` cut to their first `total` bytes, after `first` (if any), in `iov`; returns the
/// number of slices and the bytes they hold beyond `first`.
fn cut_iov<'a>(
    first: Option<&'a [u8]>,
    bufs: &'a [IoSlice<'a>],
    total: usize,
    iov: &mut [IoSlice<'a>],
) -> (usize, usize) {
    let mut k = 0;
    if let Some(f) = first {
        iov[0] = IoSlice::new(f);
        k = 1;
    }
    let mut left = total;
    for b in bufs {
        if left == 0 || k == iov.len() {
            break;
        }
        let n = b.len().min(left);
        iov[k] = IoSlice::new(&b[..n]);
        k += 1;
        left -= n;
    }
    (k, total - left)
}

impl Sink for WsWrite {
    fn try_write_vectored(&self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        let mut out = self.lock();
        if out.closed {
            return Err(io::ErrorKind::BrokenPipe.into());
        }
        if !self.flush_before(&mut out)? {
            return Err(io::ErrorKind::WouldBlock.into());
        }
        let available = bufs.iter().map(|b| b.len()).sum::<usize>();
        let mut iov = [IoSlice::new(&[]); MAX_IOV + 1];
        if out.frame_left > 0 {
            // The payload of the frame under way, straight from the caller's buffers.
            let (k, _) = cut_iov(None, bufs, out.frame_left.min(available), &mut iov);
            let n = self.tcp.try_write_vectored(&iov[..k])?;
            if n == 0 {
                return Err(io::ErrorKind::WriteZero.into());
            }
            out.frame_left -= n;
            return Ok(n);
        }
        let mut hdr = [0u8; 10];
        let total = available.min(MAX_OUT_FRAME);
        if total == 0 {
            return Ok(0);
        }
        // The frame holds what fits in the iovec (the header takes one slot).
        let (_, total) = cut_iov(None, bufs, total, &mut iov[1..]);
        let h = frame_header(op::BINARY, total, &mut hdr);
        let (k, _) = cut_iov(Some(&hdr[..h]), bufs, total, &mut iov);
        let n = self.tcp.try_write_vectored(&iov[..k])?;
        if n < h {
            // Part of the header: the rest goes first next time, then the whole payload.
            out.head.extend_from_slice(&hdr[n..h]);
            out.frame_left = total;
            return Err(io::ErrorKind::WouldBlock.into());
        }
        let payload = n - h;
        out.frame_left = total - payload;
        if payload == 0 {
            return Err(io::ErrorKind::WouldBlock.into());
        }
        Ok(payload)
    }
}

impl WriteHalf for WsWrite {
    fn poll_write_ready(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        loop {
            {
                let mut out = self.lock();
                if self.flush_before(&mut out)? {
                    drop(out);
                    return self.tcp.as_ref().poll_write_ready(cx);
                }
            }
            ready!(self.tcp.as_ref().poll_write_ready(cx))?;
        }
    }

    fn shutdown(&self) {
        let mut out = self.lock();
        if !out.closed {
            out.closed = true;
            // A close frame, unless a data frame was left unfinished (then the connection
            // just ends).
            if out.frame_left == 0 {
                out.control.extend_from_slice(&close_frame(code::NORMAL));
                let _ = self.flush_before(&mut out);
            }
        }
        if let Err(e) =
            socket2::SockRef::from(self.tcp.as_ref()).shutdown(std::net::Shutdown::Write)
        {
            tracing::debug!("ws shutdown: {e}");
        }
    }

    fn name(&self) -> &'static str {
        "ws"
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use futures::{SinkExt, StreamExt};
    use hayate_io::transport::write_all;
    use tokio::net::TcpListener;
    use tokio_tungstenite::WebSocketStream;
    use tokio_tungstenite::tungstenite::client::IntoClientRequest;
    use tokio_tungstenite::tungstenite::http::{StatusCode, header};
    use tokio_tungstenite::tungstenite::protocol::CloseFrame;
    use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
    use tokio_tungstenite::tungstenite::{Error as WsError, Message};

    type Client = WebSocketStream<TcpStream>;
    type ClientResponse = tokio_tungstenite::tungstenite::handshake::client::Response;
    type Accepted = tokio::task::JoinHandle<io::Result<(Reader, Writer)>>;

    const T: Duration = Duration::from_secs(10);

    /// A listener that accepts one connection through [`accept`].
    async fn server(max_message: usize) -> (std::net::SocketAddr, Accepted) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let task = tokio::spawn(async move {
            let (stream, _) = listener.accept().await?;
            accept(stream, "mqtt", max_message).await
        });
        (addr, task)
    }

    async fn connect(
        addr: std::net::SocketAddr,
        protocols: Option<&str>,
    ) -> Result<(Client, ClientResponse), WsError> {
        let tcp = TcpStream::connect(addr).await.unwrap();
        let mut request = format!("ws://{addr}/mqtt").into_client_request().unwrap();
        if let Some(p) = protocols {
            request
                .headers_mut()
                .insert(header::SEC_WEBSOCKET_PROTOCOL, p.parse().unwrap());
        }
        tokio_tungstenite::client_async(request, tcp).await
    }

    fn selected(response: &ClientResponse) -> Option<&str> {
        response
            .headers()
            .get(header::SEC_WEBSOCKET_PROTOCOL)
            .map(|v| v.to_str().unwrap())
    }

    /// A broker that echoes everything until end of stream, then closes.
    fn echo((mut r, w): (Reader, Writer)) -> tokio::task::JoinHandle<usize> {
        tokio::spawn(async move {
            let mut n = 0;
            let mut buf = BytesMut::with_capacity(64 * 1024);
            loop {
                buf.clear();
                let k = r.read_buf(&mut buf).await.unwrap();
                if k == 0 {
                    break;
                }
                n += k;
                write_all(&*w, buf.split().freeze()).await.unwrap();
            }
            w.shutdown();
            n
        })
    }

    /// Receives binary messages until `n` bytes have arrived.
    async fn receive(client: &mut Client, n: usize) -> Vec<u8> {
        let mut got = Vec::new();
        while got.len() < n {
            match tokio::time::timeout(T, client.next()).await.unwrap() {
                Some(Ok(Message::Binary(b))) => {
                    assert!(b.len() <= MAX_OUT_FRAME, "message of {} bytes", b.len());
                    got.extend_from_slice(&b);
                }
                other => panic!("unexpected {other:?}"),
            }
        }
        got
    }

    /// The next message that is not a data message; then the end of the stream.
    async fn expect_close(client: &mut Client) -> Option<CloseFrame> {
        let frame = loop {
            match tokio::time::timeout(T, client.next()).await.unwrap() {
                Some(Ok(Message::Close(f))) => break f,
                Some(Ok(Message::Binary(_))) => {}
                other => panic!("unexpected {other:?}"),
            }
        };
        // tungstenite's client ends the stream once the server has closed the TCP connection.
        match tokio::time::timeout(T, client.next()).await.unwrap() {
            None | Some(Err(_)) => {}
            other => panic!("unexpected {other:?}"),
        }
        frame
    }

    async fn read_to_end(r: &mut Reader) -> Vec<u8> {
        let mut got = Vec::new();
        tokio::time::timeout(T, r.read_to_end(&mut got))
            .await
            .unwrap()
            .unwrap();
        got
    }

    #[tokio::test]
    async fn round_trip() {
        let (addr, accepted) = server(4 << 20).await;
        let (mut client, response) = connect(addr, Some("mqtt")).await.unwrap();
        assert_eq!(selected(&response), Some("mqtt"));
        let echoed = echo(accepted.await.unwrap().unwrap());

        client
            .send(Message::binary(&b"\x10\x0c\x00\x04MQTT"[..]))
            .await
            .unwrap();
        assert_eq!(receive(&mut client, 8).await, b"\x10\x0c\x00\x04MQTT");

        // One packet split across three messages, the last also starting the next packet.
        client
            .send(Message::binary(&b"\x30\x05"[..]))
            .await
            .unwrap();
        client
            .send(Message::binary(&b"\x00\x01t"[..]))
            .await
            .unwrap();
        client
            .send(Message::binary(&b"x\xc0\x00"[..]))
            .await
            .unwrap();
        assert_eq!(receive(&mut client, 8).await, b"\x30\x05\x00\x01tx\xc0\x00");

        // Text messages are taken as bytes too.
        client.send(Message::text("abc")).await.unwrap();
        assert_eq!(receive(&mut client, 3).await, b"abc");

        // 3 MiB in one message: unmasked right across frame and read boundaries, and back.
        let big: Vec<u8> = (0..3 * 1024 * 1024).map(|i| (i * 7 % 251) as u8).collect();
        client.send(Message::binary(big.clone())).await.unwrap();
        assert_eq!(receive(&mut client, big.len()).await, big);

        // Pings are answered.
        client
            .send(Message::Ping(Bytes::from_static(b"p")))
            .await
            .unwrap();
        match tokio::time::timeout(T, client.next()).await.unwrap() {
            Some(Ok(Message::Pong(p))) => assert_eq!(&p[..], b"p"),
            other => panic!("unexpected {other:?}"),
        }

        client.close(None).await.unwrap();
        assert_eq!(echoed.await.unwrap(), 8 + 8 + 3 + big.len());
    }

    #[tokio::test]
    async fn subprotocol_selection() {
        for (offer, want) in [
            (None, None),
            (Some("mqtt"), Some("mqtt")),
            (Some("mqttv3.1"), Some("mqttv3.1")),
            (Some("foo, mqttv3.1, mqtt"), Some("mqtt")),
            (Some("MQTT"), Some("MQTT")),
        ] {
            let (addr, accepted) = server(1 << 20).await;
            let (_client, response) = connect(addr, offer).await.unwrap();
            assert_eq!(selected(&response), want, "offer {offer:?}");
            accepted.await.unwrap().unwrap();
        }
    }

    #[tokio::test]
    async fn unknown_subprotocol_is_refused() {
        let (addr, accepted) = server(1 << 20).await;
        match connect(addr, Some("foo, bar")).await {
            Err(WsError::Http(r)) => {
                assert_eq!(r.status(), StatusCode::BAD_REQUEST);
                assert!(r.headers().get(header::SEC_WEBSOCKET_PROTOCOL).is_none());
            }
            other => panic!("unexpected {:?}", other.map(|(_, r)| r)),
        }
        let e = accepted.await.unwrap().err().unwrap();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData);
    }

    #[tokio::test]
    async fn not_an_upgrade_is_refused() {
        let (addr, accepted) = server(1 << 20).await;
        let mut tcp = TcpStream::connect(addr).await.unwrap();
        tcp.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        let mut answer = String::new();
        tokio::time::timeout(T, tcp.read_to_string(&mut answer))
            .await
            .unwrap()
            .unwrap();
        assert!(answer.starts_with("HTTP/1.1 400"), "{answer}");
        assert!(accepted.await.unwrap().is_err());
        // An endless request line is cut off at 8 KiB.
        let (addr, accepted) = server(1 << 20).await;
        let mut tcp = TcpStream::connect(addr).await.unwrap();
        let _ = tcp.write_all(&vec![b'a'; 9000]).await;
        let e = accepted.await.unwrap().err().unwrap();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData);
    }

    #[tokio::test]
    async fn client_close_gives_broker_eof() {
        let (addr, accepted) = server(1 << 20).await;
        let (mut client, _) = connect(addr, Some("mqtt")).await.unwrap();
        let (mut r, w) = accepted.await.unwrap().unwrap();
        client.send(Message::binary(&b"bye"[..])).await.unwrap();
        client.close(None).await.unwrap();
        assert_eq!(read_to_end(&mut r).await, b"bye");
        drop((r, w));
        // The client gets the server's closing reply, then the end of the connection.
        let f = expect_close(&mut client).await;
        assert!(
            f.as_ref().is_none_or(|f| f.code == CloseCode::Normal),
            "{f:?}"
        );
    }

    #[tokio::test]
    async fn broker_shutdown_closes_client() {
        let (addr, accepted) = server(1 << 20).await;
        let (mut client, _) = connect(addr, Some("mqtt")).await.unwrap();
        let (r, w) = accepted.await.unwrap().unwrap();
        write_all(&*w, Bytes::from_static(b"\x20\x02\x00\x00"))
            .await
            .unwrap();
        w.shutdown();
        drop((r, w));
        assert_eq!(receive(&mut client, 4).await, b"\x20\x02\x00\x00");
        let frame = expect_close(&mut client).await.unwrap();
        assert_eq!(frame.code, CloseCode::Normal);
    }

    #[tokio::test]
    async fn oversized_message_closes() {
        let (addr, accepted) = server(1024).await;
        let (mut client, _) = connect(addr, Some("mqtt")).await.unwrap();
        let (mut r, _w) = accepted.await.unwrap().unwrap();
        client.send(Message::binary(vec![1u8; 1024])).await.unwrap();
        client.send(Message::binary(vec![2u8; 1025])).await.unwrap();
        assert_eq!(read_to_end(&mut r).await, vec![1u8; 1024]);
        let frame = tokio::time::timeout(T, async {
            loop {
                match client.next().await {
                    Some(Ok(Message::Close(f))) => break f,
                    Some(Ok(_)) => {}
                    other => panic!("unexpected {other:?}"),
                }
            }
        })
        .await
        .unwrap()
        .unwrap();
        assert_eq!(frame.code, CloseCode::Size);
    }

    /// Raw frames a conforming client never sends: each is a protocol error (close 1002)
    /// and the end of the broker's stream, after the data before it.
    #[tokio::test]
    async fn hostile_frames_close_with_a_protocol_error() {
        let mask = [1u8, 2, 3, 4];
        let masked = |b0: u8, payload: &[u8]| {
            let mut f = vec![b0, 0x80 | payload.len() as u8];
            f.extend_from_slice(&mask);
            f.extend(payload.iter().enumerate().map(|(i, b)| b ^ mask[i % 4]));
            f
        };
        let cases: Vec<(&str, Vec<u8>)> = vec![
            ("unmasked", vec![0x82, 0x01, b'x']),
            ("reserved bit", masked(0xC2, b"x")),
            ("unknown opcode", masked(0x83, b"x")),
            ("fragmented ping", masked(0x09, b"x")),
            ("continuation first", masked(0x80, b"x")),
            ("long ping", {
                let mut f = vec![0x89, 0x80 | 126, 0, 200];
                f.extend_from_slice(&mask);
                f.extend(std::iter::repeat_n(0u8, 200));
                f
            }),
        ];
        for (what, bad) in cases {
            let (addr, accepted) = server(1 << 20).await;
            let (client, _) = connect(addr, Some("mqtt")).await.unwrap();
            let (mut r, _w) = accepted.await.unwrap().unwrap();
            let mut tcp = client.into_inner();
            let mut bytes = masked(0x82, b"ok");
            bytes.extend_from_slice(&bad);
            tcp.write_all(&bytes).await.unwrap();
            assert_eq!(read_to_end(&mut r).await, b"ok", "{what}");
            // The close frame: 0x88, length 2, code 1002.
            let mut answer = [0u8; 4];
            tokio::time::timeout(T, tcp.read_exact(&mut answer))
                .await
                .unwrap()
                .unwrap();
            assert_eq!(answer, [0x88, 2, 0x03, 0xEA], "{what}");
        }
    }

    /// A client header as a conforming client writes it.
    fn client_header(fin: bool, opcode: u8, len: u64, mask: [u8; 4]) -> Vec<u8> {
        let mut h = vec![u8::from(fin) << 7 | opcode];
        if len < 126 {
            h.push(0x80 | len as u8);
        } else if len <= 0xFFFF {
            h.push(0x80 | 126);
            h.extend_from_slice(&(len as u16).to_be_bytes());
        } else {
            h.push(0x80 | 127);
            h.extend_from_slice(&len.to_be_bytes());
        }
        h.extend_from_slice(&mask);
        h
    }

    proptest::proptest! {
        /// The word-wise unmasking equals the definition, at any offset and length.
        #[test]
        fn unmask_matches_the_definition(data in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..100), mask: [u8; 4], offset in 0usize..8) {
            let mut fast = data.clone();
            unmask(&mut fast, mask, offset);
            let slow: Vec<u8> = data.iter().enumerate().map(|(i, b)| b ^ mask[(offset + i) % 4]).collect();
            proptest::prop_assert_eq!(fast, slow);
        }

        /// Whatever the bytes: no panic, and an accepted header fits in them and obeys the
        /// rules a client frame must.
        #[test]
        fn parse_header_never_panics(raw in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..20), in_message: bool) {
            if let Ok(Some(h)) = parse_header(&raw, in_message) {
                proptest::prop_assert!(h.header_len <= raw.len());
                proptest::prop_assert!(raw[1] & 0x80 != 0 && raw[0] & 0x70 == 0);
                if h.opcode >= op::CLOSE {
                    proptest::prop_assert!(h.fin && h.len <= 125);
                }
            }
        }

        /// Every header a conforming client writes parses back to its fields, and each
        /// proper prefix of it asks for more.
        #[test]
        fn client_headers_round_trip(fin: bool, data in 0u8..3, len in 0u64..(1 << 40), mask: [u8; 4]) {
            let opcode = [op::CONTINUATION, op::TEXT, op::BINARY][usize::from(data)];
            let in_message = opcode == op::CONTINUATION;
            let raw = client_header(fin, opcode, len, mask);
            for k in 0..raw.len() {
                proptest::prop_assert_eq!(parse_header(&raw[..k], in_message), Ok(None));
            }
            let h = parse_header(&raw, in_message).unwrap().unwrap();
            proptest::prop_assert_eq!(h, Header { fin, opcode, len, mask, header_len: raw.len() });
        }
    }

    /// Neither direction buffers without bound: with nobody reading, writers stall.
    #[tokio::test]
    async fn back_pressure() {
        const LIMIT: usize = 32 << 20;
        const CHUNK: usize = 64 * 1024;
        let stalls = |sent: usize| assert!(sent < LIMIT, "{sent} bytes taken without a reader");
        let (addr, accepted) = server(1 << 20).await;
        let (mut client, _) = connect(addr, Some("mqtt")).await.unwrap();
        let (_r, w) = accepted.await.unwrap().unwrap();
        let chunk = Bytes::from(vec![0u8; CHUNK]);
        let mut sent = 0;
        while let Ok(r) = tokio::time::timeout(
            Duration::from_millis(300),
            client.send(Message::Binary(chunk.clone())),
        )
        .await
        {
            r.unwrap();
            sent += CHUNK;
            stalls(sent);
        }
        let mut sent = 0;
        while let Ok(r) =
            tokio::time::timeout(Duration::from_millis(300), write_all(&*w, chunk.clone())).await
        {
            r.unwrap();
            sent += CHUNK;
            stalls(sent);
        }
    }
}
