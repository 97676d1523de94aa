//! The [`Sink`] a connection's outbox writes through and [`write_some`], the one vectored
//! write loop over it.

use std::collections::VecDeque;
use std::io::{self, IoSlice};

use bytes::Bytes;

use crate::chunks::{MAX_IOV, advance, fill_iov};

/// A socket the outbox can write to without waiting (a non-blocking `writev`), so that the
/// task that queued data can send it at once instead of waking the session's writer.
pub trait Sink: Send + Sync + 'static {
    /// Writes what it can without blocking; `WouldBlock` when nothing can be written now.
    fn try_write_vectored(&self, bufs: &[IoSlice<'_>]) -> io::Result<usize>;

    /// Bytes it accepted are still waiting inside it (TLS records not yet on the socket): a
    /// writer must wait for readiness (which pushes them) before its queue counts as
    /// written. Never, for a plain socket.
    fn pending(&self) -> bool {
        false
    }
}

/// The one vectored write loop: writes chunks of `q` to `sink` (up to [`MAX_IOV`] slices a
/// call) until `q` is empty and the sink holds nothing back (`Ok(true)`) or the sink would
/// block (`Ok(false)`, possibly with `q` empty: see [`Sink::pending`]); written bytes leave
/// `q`. A sink that accepts 0 bytes is an error (`WriteZero`). A connection's writer
/// waits for readiness between calls (hayate-io's `transport::write_chunks`); an inline flush
/// stops at the first `false`.
pub fn write_some<S: Sink + ?Sized>(sink: &S, q: &mut VecDeque<Bytes>) -> io::Result<bool> {
    while !q.is_empty() {
        // A few chunks (a reply, a delivery or two) are the common case on a quiet
        // connection: a small slice array, not 256 slots set up for every write.
        let r = if q.len() <= FEW_IOV {
            write_vectored::<S, FEW_IOV>(sink, q)
        } else {
            write_vectored::<S, MAX_IOV>(sink, q)
        };
        match r {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => advance(q, n),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
            Err(e) => return Err(e),
        }
    }
    Ok(!sink.pending())
}

/// Chunks written with a small slice array ([`write_some`]).
const FEW_IOV: usize = 8;

/// One vectored write of the first (up to `N`) chunks of `q`.
fn write_vectored<S: Sink + ?Sized, const N: usize>(
    sink: &S,
    q: &VecDeque<Bytes>,
) -> io::Result<usize> {
    let mut iov = [IoSlice::new(&[]); N];
    let k = fill_iov(q, &mut iov);
    sink.try_write_vectored(&iov[..k])
}
