//! Read planning: how much a reader should ask the socket for next, so that large frames are
//! read straight into a buffer of their own and never copied.
//!
//! A reader normally reads as much as fits its buffer and decodes every frame in it. For a
//! large frame that would leave part of the *next* frame at the end of a buffer whose earlier
//! bytes are still referenced (payload slices queued for other sessions), so growing the buffer
//! for the next large frame would copy that part. [`ReadPlanner`] avoids it: after a large
//! frame it reads just the next header, then exactly the rest of that frame.
//!
//! It also recycles the buffers of large frames: fresh multi-megabyte allocations come from
//! `mmap` and cost a page fault and a page clear per 4 KiB, a quarter of the broker's time at
//! 64 MiB payloads. The planner keeps a reference to the last two large frames' buffers and,
//! once everything else has let go of one (its payload was written out), reads the next large
//! frame into it.

use bytes::{Bytes, BytesMut};

use crate::{Frame, HEADER_LEN};

/// Large-frame buffers kept for reuse, per connection.
const RECYCLE: usize = 2;
/// Buffers above this size are not kept (bounds what an idle connection holds).
const RECYCLE_MAX: usize = 64 * 1024 * 1024 + 64 * 1024;

/// Frames at least this long (length prefix included) are read exactly.
pub const LARGE_FRAME: usize = 64 * 1024;

/// Tracks whether the stream is carrying large frames and plans each read.
#[derive(Debug, Default, Clone)]
pub struct ReadPlanner {
    after_large: bool,
    recycle: Vec<Bytes>,
}

impl ReadPlanner {
    /// A planner in normal (small-frame) mode.
    pub fn new() -> ReadPlanner {
        ReadPlanner::default()
    }

    /// Decodes the frame at the front of `buf` (see [`crate::decode`]) and notes its size
    /// ([`ReadPlanner::decoded`]): what every reader of the native protocol does.
    pub fn decode(
        &mut self,
        buf: &mut bytes::BytesMut,
        max_frame: usize,
    ) -> Result<Option<Frame>, crate::DecodeError> {
        let before = buf.len();
        let frame = crate::decode(buf, max_frame)?;
        if let Some(f) = &frame {
            self.decoded(before - buf.len(), f);
        }
        Ok(frame)
    }

    /// Call after decoding `frame`, which was `total` bytes long (length prefix included).
    pub fn decoded(&mut self, total: usize, frame: &Frame) {
        self.after_large = total >= LARGE_FRAME;
        if !self.after_large {
            self.recycle.clear();
            return;
        }
        if total <= RECYCLE_MAX
            && let Some(p) = any_payload(frame)
        {
            if self.recycle.len() == RECYCLE {
                self.recycle.remove(0);
            }
            self.recycle.push(p.clone());
        }
    }

    /// Swaps an empty `buf` for a recycled large buffer that nothing else uses any more.
    fn reuse(&mut self, buf: &mut BytesMut) {
        if !buf.is_empty() {
            return;
        }
        if let Some(i) = self.recycle.iter().position(Bytes::is_unique)
            && let Ok(mut m) = self.recycle.swap_remove(i).try_into_mut()
        {
            m.clear();
            if m.capacity() > buf.capacity() {
                *buf = m;
            }
        }
    }

    /// Prepares `buf` for the next read: returns `Some(n)` to read at most `n` bytes (room is
    /// reserved), or `None` for an ordinary read after reserving `normal` bytes of room.
    /// Call only after every complete frame has been decoded from `buf`.
    pub fn plan(&mut self, buf: &mut BytesMut, normal: usize) -> Option<usize> {
        if buf.len() >= HEADER_LEN {
            let total = 4 + u32::from_be_bytes([buf[0], buf[1], buf[2], buf[3]]) as usize;
            if total >= LARGE_FRAME && total > buf.len() {
                let need = total - buf.len();
                buf.reserve(need);
                return Some(need);
            }
        } else if self.after_large {
            self.reuse(buf);
            let need = HEADER_LEN - buf.len();
            buf.reserve(need);
            return Some(need);
        }
        if buf.capacity() - buf.len() < normal / 4 {
            buf.reserve(normal);
        }
        None
    }
}

/// A payload slice of `frame`, if it carries one (it shares the frame's buffer).
fn any_payload(frame: &Frame) -> Option<&Bytes> {
    match frame {
        Frame::Pub(m) | Frame::Msg { msg: m, .. } | Frame::MsgAcked { msg: m, .. } => {
            Some(&m.payload)
        }
        Frame::PubBatch { payloads, .. } => payloads.first(),
        Frame::MsgBatch { payloads, .. } => Some(payloads.wire()),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plans() {
        let mut p = ReadPlanner::new();
        let mut b = BytesMut::new();
        assert_eq!(p.plan(&mut b, 1024), None);
        assert!(b.capacity() >= 1024);
        // A large frame's header: read exactly the rest.
        b.extend_from_slice(&(100_000u32).to_be_bytes());
        b.extend_from_slice(&[3, 0, 0]);
        assert_eq!(p.plan(&mut b, 1024), Some(100_004 - 7));
        assert!(b.capacity() >= 100_004);
        // After a large frame, read only the next header.
        p.decoded(100_004, &Frame::Close);
        let mut e = BytesMut::new();
        assert_eq!(p.plan(&mut e, 1024), Some(HEADER_LEN));
        p.decoded(20, &Frame::Close);
        assert_eq!(p.plan(&mut e, 1024), None);
    }

    #[test]
    fn recycles_a_released_large_buffer() {
        let mut p = ReadPlanner::new();
        let mut big = BytesMut::with_capacity(200_000);
        big.resize(150_000, 7);
        let payload = big.freeze().slice(100..);
        let frame = Frame::PubBatch {
            key: hayate_core::Key::new("k").unwrap(),
            payloads: vec![payload],
        };
        p.decoded(150_000, &frame);
        let mut buf = BytesMut::new();
        // Still referenced by the frame: not reused.
        p.plan(&mut buf, 1024);
        assert!(buf.capacity() < 150_000);
        drop(frame);
        let mut buf = BytesMut::new();
        p.plan(&mut buf, 1024);
        assert!(buf.capacity() >= 149_000, "capacity {}", buf.capacity());
    }
}
