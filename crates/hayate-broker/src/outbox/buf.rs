//! Encoded output and the one vectored write loop: [`OutBuf`] (chunks plus a contiguous
//! tail), the [`Sink`] a connection writes through, and [`write_some`].

use std::collections::VecDeque;

use bytes::{Bytes, BytesMut};
use hayate_core::chunks::{advance, fill_iov};

use super::MAX_IOV;

/// Payloads at least this large are queued by reference instead of copied.
pub const ZERO_COPY_THRESHOLD: usize = 16 * 1024;

/// Encoded output: a queue of chunks plus a contiguous tail for small writes.
#[derive(Debug, Default)]
pub struct OutBuf {
    chunks: VecDeque<Bytes>,
    tail: BytesMut,
    chunk_bytes: usize,
}

impl OutBuf {
    /// The contiguous buffer to encode small things into.
    pub fn tail(&mut self) -> &mut BytesMut {
        &mut self.tail
    }

    /// Appends `payload`: copied into the tail when small, queued by reference when large.
    pub fn put_payload(&mut self, payload: &Bytes) {
        if payload.len() < ZERO_COPY_THRESHOLD {
            self.tail.extend_from_slice(payload);
        } else {
            self.seal_tail();
            self.chunk_bytes += payload.len();
            self.chunks.push_back(payload.clone());
        }
    }

    fn seal_tail(&mut self) {
        if !self.tail.is_empty() {
            let t = self.tail.split().freeze();
            self.chunk_bytes += t.len();
            self.chunks.push_back(t);
        }
    }

    /// Bytes queued.
    pub fn len(&self) -> usize {
        self.chunk_bytes + self.tail.len()
    }

    /// True if nothing is queued.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub(super) fn take_into(&mut self, into: &mut VecDeque<Bytes>) {
        self.seal_tail();
        into.append(&mut self.chunks);
        self.chunk_bytes = 0;
    }

    /// Puts chunks that could not be written back at the front, ahead of anything queued
    /// since they were taken.
    pub(super) fn restore_front(&mut self, left: &mut VecDeque<Bytes>) {
        while let Some(c) = left.pop_back() {
            self.chunk_bytes += c.len();
            self.chunks.push_front(c);
        }
    }
}

/// A socket the outbox can write to without waiting (a non-blocking `writev`), so that the
/// task that queued data can send it at once instead of waking the session's writer.
pub trait Sink: Send + Sync + 'static {
    /// Writes what it can without blocking; `WouldBlock` when nothing can be written now.
    fn try_write_vectored(&self, bufs: &[std::io::IoSlice<'_>]) -> std::io::Result<usize>;
}

/// The one vectored write loop: writes chunks of `q` to `sink` (up to [`MAX_IOV`] slices a
/// call) until `q` is empty (`Ok(true)`) or the sink would block (`Ok(false)`); written bytes
/// leave `q`. A sink that accepts 0 bytes is an error (`WriteZero`). The session's writer
/// waits for readiness between calls; an inline flush stops at the first `false`.
pub fn write_some<S: Sink + ?Sized>(sink: &S, q: &mut VecDeque<Bytes>) -> std::io::Result<bool> {
    while !q.is_empty() {
        let mut iov = [std::io::IoSlice::new(&[]); MAX_IOV];
        let k = fill_iov(q, &mut iov);
        match sink.try_write_vectored(&iov[..k]) {
            Ok(0) => return Err(std::io::ErrorKind::WriteZero.into()),
            Ok(n) => advance(q, n),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return Ok(false),
            Err(e) => return Err(e),
        }
    }
    Ok(true)
}
