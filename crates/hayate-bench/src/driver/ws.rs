//! A minimal WebSocket client transport (RFC 6455), for MQTT over WebSocket targets
//! (`mqtt://HOST:PORT?transport=ws`): the HTTP upgrade with subprotocol `mqtt`, then each
//! write is one masked binary frame and reads yield the payloads of the server's data frames
//! as one byte stream (control frames are answered or skipped). It measures the broker's
//! WebSocket path with the same MQTT client as the TCP path; it is not a general client.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use anyhow::{Context as _, bail};
use bytes::{Buf, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::TcpStream;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};

/// Connects and upgrades; returns the read and write halves of the framed stream.
pub(crate) async fn connect(
    stream: TcpStream,
    host: &str,
    path: &str,
) -> anyhow::Result<(WsRead, WsWrite)> {
    let (mut rd, mut wr) = stream.into_split();
    let key = "dGhlIHNhbXBsZSBub25jZQ=="; // any 16 bytes, base64: the server only echoes a hash
    let req = format!(
        "GET {path} HTTP/1.1\r\nHost: {host}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
         Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Protocol: mqtt\r\n\r\n"
    );
    wr.write_all(req.as_bytes()).await?;
    let mut buf = BytesMut::with_capacity(4096);
    let end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        if buf.len() > 16 * 1024 || rd.read_buf(&mut buf).await? == 0 {
            bail!("no WebSocket upgrade answer");
        }
    };
    let head = std::str::from_utf8(&buf[..end]).context("upgrade answer is not text")?;
    if !head.starts_with("HTTP/1.1 101") {
        bail!(
            "WebSocket upgrade refused: {}",
            head.lines().next().unwrap_or("")
        );
    }
    buf.advance(end);
    Ok((
        WsRead {
            rd,
            raw: buf,
            left: 0,
            skip: false,
        },
        WsWrite {
            wr,
            pending: BytesMut::new(),
            accepted: 0,
            mask_seed: 0x9E37_79B9,
        },
    ))
}

/// XORs `buf` with `mask` (RFC 6455 section 5.3), eight bytes at a time.
fn mask_in_place(buf: &mut [u8], mask: [u8; 4]) {
    let m = u64::from_ne_bytes([
        mask[0], mask[1], mask[2], mask[3], mask[0], mask[1], mask[2], mask[3],
    ]);
    let mut chunks = buf.chunks_exact_mut(8);
    for c in &mut chunks {
        let w = u64::from_ne_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]) ^ m;
        c.copy_from_slice(&w.to_ne_bytes());
    }
    for (i, b) in chunks.into_remainder().iter_mut().enumerate() {
        *b ^= mask[i % 4];
    }
}

/// The read half: the payloads of the server's data frames.
pub(crate) struct WsRead {
    rd: OwnedReadHalf,
    raw: BytesMut,
    /// Payload bytes of the current frame still to come.
    left: u64,
    /// The current frame is a control frame: its payload is skipped.
    skip: bool,
}

impl AsyncRead for WsRead {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        out: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        loop {
            if this.left > 0 && !this.raw.is_empty() {
                let n = (this.left as usize).min(this.raw.len());
                if this.skip {
                    this.raw.advance(n);
                    this.left -= n as u64;
                    continue;
                }
                let n = n.min(out.remaining());
                out.put_slice(&this.raw[..n]);
                this.raw.advance(n);
                this.left -= n as u64;
                return Poll::Ready(Ok(()));
            }
            if this.left == 0 && this.raw.len() >= 2 {
                let (b0, b1) = (this.raw[0], this.raw[1]);
                let (ext, len7) = match b1 & 0x7F {
                    126 => (2, 0),
                    127 => (8, 0),
                    l => (0, u64::from(l)),
                };
                if this.raw.len() >= 2 + ext {
                    let len = match ext {
                        2 => u64::from(u16::from_be_bytes([this.raw[2], this.raw[3]])),
                        8 => u64::from_be_bytes(this.raw[2..10].try_into().unwrap_or_default()),
                        _ => len7,
                    };
                    this.raw.advance(2 + ext);
                    let opcode = b0 & 0x0F;
                    if opcode == 0x8 {
                        return Poll::Ready(Ok(())); // close: end of stream
                    }
                    this.skip = opcode >= 0x8;
                    this.left = len;
                    continue;
                }
            }
            let len = this.raw.len();
            this.raw.resize(len + 64 * 1024, 0);
            let mut rb = ReadBuf::new(&mut this.raw[len..]);
            let r = Pin::new(&mut this.rd).poll_read(cx, &mut rb);
            let n = rb.filled().len();
            this.raw.truncate(len + n);
            ready!(r)?;
            if n == 0 {
                return Poll::Ready(Ok(()));
            }
        }
    }
}

/// The write half: each write becomes one masked binary frame.
pub(crate) struct WsWrite {
    wr: OwnedWriteHalf,
    /// The framed bytes of the write under way.
    pending: BytesMut,
    /// How many caller bytes `pending` carries (reported once it is all written).
    accepted: usize,
    mask_seed: u32,
}

impl AsyncWrite for WsWrite {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if this.pending.is_empty() {
            let n = buf.len().min(1 << 20);
            // xorshift: masks need not be secret here, only present.
            this.mask_seed ^= this.mask_seed << 13;
            this.mask_seed ^= this.mask_seed >> 17;
            this.mask_seed ^= this.mask_seed << 5;
            let mask = this.mask_seed.to_be_bytes();
            this.pending.extend_from_slice(&[0x82]);
            if n < 126 {
                this.pending.extend_from_slice(&[0x80 | n as u8]);
            } else if n <= 0xFFFF {
                this.pending.extend_from_slice(&[0x80 | 126]);
                this.pending.extend_from_slice(&(n as u16).to_be_bytes());
            } else {
                this.pending.extend_from_slice(&[0x80 | 127]);
                this.pending.extend_from_slice(&(n as u64).to_be_bytes());
            }
            this.pending.extend_from_slice(&mask);
            let start = this.pending.len();
            this.pending.extend_from_slice(&buf[..n]);
            mask_in_place(&mut this.pending[start..], mask);
            this.accepted = n;
        }
        while !this.pending.is_empty() {
            let n = ready!(Pin::new(&mut this.wr).poll_write(cx, &this.pending))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            this.pending.advance(n);
        }
        Poll::Ready(Ok(this.accepted))
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().wr).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().wr).poll_shutdown(cx)
    }
}
