//! Read planning: how much a reader should ask the socket for next, so that large frames are
//! read straight into a buffer of their own and never copied.
//!
//! A reader normally reads as much as fits its buffer and decodes every frame in it. For a
//! large frame that would leave part of the *next* frame at the end of a buffer whose earlier
//! bytes are still referenced (payload slices queued for other sessions), so growing the buffer
//! for the next large frame would copy that part. [`ReadPlanner`] avoids it: after a large
//! frame it reads just the next header, then exactly the rest of that frame.

use bytes::BytesMut;

use crate::HEADER_LEN;

/// Frames at least this long (length prefix included) are read exactly.
pub const LARGE_FRAME: usize = 64 * 1024;

/// Tracks whether the stream is carrying large frames and plans each read.
#[derive(Debug, Default, Clone)]
pub struct ReadPlanner {
    after_large: bool,
}

impl ReadPlanner {
    /// A planner in normal (small-frame) mode.
    pub fn new() -> ReadPlanner {
        ReadPlanner::default()
    }

    /// Call after decoding a frame of `total` bytes (length prefix included).
    pub fn decoded(&mut self, total: usize) {
        self.after_large = total >= LARGE_FRAME;
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
        p.decoded(100_004);
        let mut e = BytesMut::new();
        assert_eq!(p.plan(&mut e, 1024), Some(HEADER_LEN));
        p.decoded(20);
        assert_eq!(p.plan(&mut e, 1024), None);
    }
}
