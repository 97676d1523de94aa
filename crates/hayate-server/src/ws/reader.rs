//! The client → broker direction: [`WsReader`], which decodes client frames into the byte
//! stream of the data messages' payloads and answers control frames.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use bytes::{Buf, BytesMut};
use hayate_io::transport::Reader;
use tokio::io::{AsyncRead, ReadBuf};

use super::READ_CHUNK;
use super::frame::{close_frame, code, control_frame, op, parse_header, unmask};
use super::writer::WsWrite;

/// The frame being read.
#[derive(Debug)]
pub(super) struct InFrame {
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
    /// The transport under the WebSocket (TCP, or TLS for `wss`).
    pub(super) tcp: Reader,
    /// Bytes read from the socket and not yet decoded.
    pub(super) raw: BytesMut,
    pub(super) frame: Option<InFrame>,
    /// Bytes of the current data message so far.
    pub(super) message: u64,
    /// A data message is open (its next frame is a continuation).
    pub(super) in_message: bool,
    pub(super) max_message: usize,
    pub(super) writer: Arc<WsWrite>,
    /// Closed (by the client, a protocol error or the socket): end of stream.
    pub(super) done: bool,
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
                self.writer.send_pong(&control_frame(op::PONG, payload));
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
