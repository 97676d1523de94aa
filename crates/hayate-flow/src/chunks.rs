//! Helpers for queues of [`Bytes`] chunks written with vectored I/O (pure: no I/O here).

use std::collections::VecDeque;
use std::io::IoSlice;

use bytes::{Buf, Bytes};

/// Most slices handed to one vectored write.
pub const MAX_IOV: usize = 256;

/// Points `iov` at the first chunks of `q`; returns how many slots were filled.
pub fn fill_iov<'a>(q: &'a VecDeque<Bytes>, iov: &mut [IoSlice<'a>]) -> usize {
    let mut k = 0;
    for (slot, b) in iov.iter_mut().zip(q.iter()) {
        *slot = IoSlice::new(b);
        k += 1;
    }
    k
}

/// Drops the first `n` bytes of `q` (after a write of `n` bytes).
pub fn advance(q: &mut VecDeque<Bytes>, mut n: usize) {
    while n > 0 {
        let Some(front) = q.front_mut() else { return };
        if front.len() <= n {
            n -= front.len();
            q.pop_front();
        } else {
            front.advance(n);
            n = 0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn advance_across_chunks() {
        let mut q: VecDeque<Bytes> = [&b"abc"[..], b"de", b"fgh"].map(Bytes::from_static).into();
        advance(&mut q, 4);
        assert_eq!(
            q,
            VecDeque::from([&b"e"[..], b"fgh"].map(Bytes::from_static))
        );
        let mut iov = [IoSlice::new(&[]); 4];
        assert_eq!(fill_iov(&q, &mut iov), 2);
        advance(&mut q, 10);
        assert!(q.is_empty());
    }
}
