//! The in-memory transport: a connection with no socket, for tests.

use std::collections::VecDeque;
use std::io::{self, IoSlice};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};

use tokio::io::AsyncRead;

use super::{Reader, WriteHalf, Writer};
use crate::sink::Sink;

/// An in-memory connection: what a session writes to its [`Writer`] the peer reads from
/// [`MemoryPeer`], and what the peer writes the session reads from its [`Reader`], with no
/// socket at all, so a protocol front-end can be driven by a test byte for byte
/// (deterministic, in the style of quinn-proto's in-memory pairs).
///
/// Each direction holds at most `capacity` bytes (at least 1): back-pressure is real. A full
/// server-to-peer buffer makes the writer's `try_write_vectored` return `WouldBlock` and
/// `poll_write_ready` wait until the peer reads; a full peer-to-server buffer makes the
/// peer's writes wait until the session reads. [`WriteHalf::shutdown`] makes the peer read
/// the end of the stream once it has read what was written before; dropping the peer makes
/// further writes fail with `BrokenPipe`, as a socket whose peer went away; shutting the
/// peer's write side down (`AsyncWriteExt::shutdown`) or dropping the peer makes the session
/// read the end of the stream.
pub fn memory(capacity: usize) -> ((Reader, Writer), MemoryPeer) {
    let capacity = capacity.max(1);
    let (to_server, server_reads) = tokio::io::duplex(capacity);
    let pipe = Arc::new(Pipe {
        capacity,
        state: Mutex::new(PipeState::default()),
    });
    let writer = Memory { pipe: pipe.clone() };
    let peer = MemoryPeer {
        from_server: pipe,
        to_server,
    };
    ((Box::new(server_reads), Arc::new(writer)), peer)
}

/// The server-to-peer direction: a bounded byte buffer and the tasks waiting on it.
#[derive(Debug)]
struct Pipe {
    capacity: usize,
    state: Mutex<PipeState>,
}

#[derive(Debug, Default)]
struct PipeState {
    buf: VecDeque<u8>,
    /// The write side was shut down (or every handle to it dropped): the peer reads what is
    /// buffered, then the end of the stream.
    shut: bool,
    /// The peer is gone: writes fail.
    peer_gone: bool,
    /// The peer's read, waiting for data.
    read_waker: Option<std::task::Waker>,
    /// Writers waiting for room (usually one: the session's writer task).
    write_wakers: Vec<std::task::Waker>,
}

impl Pipe {
    /// Locks the state, ignoring poisoning: nothing panics while holding it.
    fn lock(&self) -> MutexGuard<'_, PipeState> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl PipeState {
    fn wake_reader(&mut self) {
        if let Some(w) = self.read_waker.take() {
            w.wake();
        }
    }

    fn wake_writers(&mut self) {
        for w in self.write_wakers.drain(..) {
            w.wake();
        }
    }
}

/// The session's side of an in-memory connection (see [`memory`]).
#[derive(Debug)]
pub struct Memory {
    pipe: Arc<Pipe>,
}

impl Sink for Memory {
    fn try_write_vectored(&self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        let mut st = self.pipe.lock();
        if st.peer_gone || st.shut {
            return Err(io::ErrorKind::BrokenPipe.into());
        }
        let room = self.pipe.capacity.saturating_sub(st.buf.len());
        if bufs.iter().all(|b| b.is_empty()) {
            return Ok(0);
        }
        if room == 0 {
            return Err(io::ErrorKind::WouldBlock.into());
        }
        let mut n = 0;
        for b in bufs {
            let take = b.len().min(room - n);
            st.buf.extend(&b[..take]);
            n += take;
            if n == room {
                break;
            }
        }
        st.wake_reader();
        Ok(n)
    }
}

impl WriteHalf for Memory {
    fn poll_write_ready(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let mut st = self.pipe.lock();
        if st.peer_gone || st.shut {
            // The next write says why.
            return Poll::Ready(Ok(()));
        }
        if st.buf.len() < self.pipe.capacity {
            return Poll::Ready(Ok(()));
        }
        if !st.write_wakers.iter().any(|w| w.will_wake(cx.waker())) {
            st.write_wakers.push(cx.waker().clone());
        }
        Poll::Pending
    }
    fn shutdown(&self) {
        let mut st = self.pipe.lock();
        st.shut = true;
        st.wake_reader();
        st.wake_writers();
    }
    fn name(&self) -> &'static str {
        "memory"
    }
}

impl Drop for Memory {
    fn drop(&mut self) {
        // The last handle to the write side is gone: nothing more can arrive.
        WriteHalf::shutdown(self);
    }
}

/// The test's side of an in-memory connection (see [`memory`]): reads what the session
/// wrote ([`AsyncRead`]) and writes what the session reads ([`tokio::io::AsyncWrite`]).
#[derive(Debug)]
pub struct MemoryPeer {
    from_server: Arc<Pipe>,
    to_server: tokio::io::DuplexStream,
}

impl MemoryPeer {
    /// Bytes the session wrote that the peer has not read yet.
    pub fn buffered(&self) -> usize {
        self.from_server.lock().buf.len()
    }

    /// True once the session's write side is shut down (bytes may still be buffered).
    pub fn is_shut_down(&self) -> bool {
        self.from_server.lock().shut
    }
}

impl AsyncRead for MemoryPeer {
    fn poll_read(
        self: std::pin::Pin<&mut Self>,
        cx: &mut Context<'_>,
        out: &mut tokio::io::ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let mut st = self.from_server.lock();
        if st.buf.is_empty() {
            if st.shut {
                return Poll::Ready(Ok(())); // end of stream
            }
            if out.remaining() > 0 {
                st.read_waker = Some(cx.waker().clone());
                return Poll::Pending;
            }
            return Poll::Ready(Ok(()));
        }
        let n = out.remaining().min(st.buf.len());
        let (a, b) = st.buf.as_slices();
        let from_a = n.min(a.len());
        out.put_slice(&a[..from_a]);
        out.put_slice(&b[..n - from_a]);
        st.buf.drain(..n);
        st.wake_writers();
        Poll::Ready(Ok(()))
    }
}

impl tokio::io::AsyncWrite for MemoryPeer {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        std::pin::Pin::new(&mut self.to_server).poll_write(cx, buf)
    }
    fn poll_write_vectored(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        std::pin::Pin::new(&mut self.to_server).poll_write_vectored(cx, bufs)
    }
    fn is_write_vectored(&self) -> bool {
        self.to_server.is_write_vectored()
    }
    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<io::Result<()>> {
        std::pin::Pin::new(&mut self.to_server).poll_flush(cx)
    }
    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<io::Result<()>> {
        std::pin::Pin::new(&mut self.to_server).poll_shutdown(cx)
    }
}

impl Drop for MemoryPeer {
    fn drop(&mut self) {
        let mut st = self.from_server.lock();
        st.peer_gone = true;
        st.buf.clear();
        st.wake_writers();
    }
}
