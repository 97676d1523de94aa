//! The broker → client direction: [`WsWrite`], a [`WriteHalf`] that frames each vectored
//! write as one binary frame without copying the payload, and sends control frames between
//! data frames.

use std::io::{self, IoSlice};
use std::sync::Mutex;
use std::task::{Context, Poll, ready};

use bytes::{Buf, BytesMut};
use hayate_io::Sink;
use hayate_io::chunks::MAX_IOV;
use hayate_io::transport::WriteHalf;
use hayate_io::transport::Writer;

use super::MAX_OUT_FRAME;
use super::frame::{close_frame, code, frame_header, op};

/// Control frames (PONGs) waiting to be written, at most.
pub(super) const MAX_PONGS: usize = 4096;

/// Output state between writes. A data frame's header is written with the start of its
/// payload; when the socket takes only part of it, the rest of the header waits in `head`
/// and the payload still owed in `frame_left`: the next write continues the same frame from
/// the caller's queue (which then starts exactly there), so payloads are never copied.
/// Control frames (pong, close) wait in `control` until no data frame is open.
#[derive(Debug, Default)]
pub(super) struct Out {
    head: BytesMut,
    frame_left: usize,
    control: BytesMut,
    closed: bool,
}

/// The broker → client direction (see the module docs).
pub struct WsWrite {
    /// The transport under the WebSocket (TCP, or TLS for `wss`).
    pub(super) tcp: Writer,
    pub(super) out: Mutex<Out>,
}

impl std::fmt::Debug for WsWrite {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WsWrite").finish_non_exhaustive()
    }
}

/// Writes `b` until it is empty (true) or the socket would block (false).
fn write_buf(tcp: &Writer, b: &mut BytesMut) -> io::Result<bool> {
    while !b.is_empty() {
        match tcp.try_write_vectored(&[IoSlice::new(b)]) {
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
        hayate_core::sync::lock(&self.out)
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
    pub(super) fn send_control(&self, frame: &[u8]) {
        let mut out = self.lock();
        if out.closed {
            return;
        }
        out.control.extend_from_slice(frame);
        let _ = self.flush_before(&mut out);
    }

    /// Queues a PONG, unless PONGs not yet written already hold [`MAX_PONGS`] bytes (a
    /// client that sends PINGs and does not read): then it is not sent, as RFC 6455 allows
    /// (5.5.3: a PONG for the latest PING only), and what waits stays bounded.
    pub(super) fn send_pong(&self, frame: &[u8]) {
        let mut out = self.lock();
        if out.closed {
            return;
        }
        if out.control.len() + frame.len() <= MAX_PONGS {
            out.control.extend_from_slice(frame);
        }
        let _ = self.flush_before(&mut out);
    }

    pub(super) fn flush_control(&self) {
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

    fn pending(&self) -> bool {
        // What the transport under the WebSocket holds back (TLS records, for wss).
        self.tcp.pending()
    }
}

impl WriteHalf for WsWrite {
    fn poll_write_ready(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        loop {
            {
                let mut out = self.lock();
                if self.flush_before(&mut out)? {
                    drop(out);
                    return self.tcp.poll_write_ready(cx);
                }
            }
            ready!(self.tcp.poll_write_ready(cx))?;
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
        drop(out);
        self.tcp.shutdown();
    }

    fn name(&self) -> &'static str {
        if self.tcp.name() == "tls" {
            "wss"
        } else {
            "ws"
        }
    }
}
