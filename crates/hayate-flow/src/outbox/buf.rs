//! Encoded output: [`OutBuf`] (chunks plus a contiguous tail). It is written through a
//! [`Sink`](crate::Sink) with [`write_some`](crate::write_some).

use std::collections::VecDeque;

use bytes::{Bytes, BytesMut};

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
