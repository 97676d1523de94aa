//! Transports: the byte streams connections run on, behind one trait.
//!
//! A connection is a read half (any [`AsyncRead`]) and a write half ([`WriteHalf`]), shared
//! by the session's writer task and by inline flushes from publishers' tasks (so it writes
//! through `&self`: a non-blocking vectored write plus a readiness wait). TCP and Unix sockets
//! implement it directly; WebSocket ([`crate::ws`]) frames the stream in process; TLS and
//! shared memory will be further implementations. [`write_chunks`] is the one blocking
//! write loop over any of them (the non-blocking one is
//! [`hayate_broker::outbox::write_some`], which this calls).

use std::collections::VecDeque;
use std::io::{self, IoSlice};
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::{BufMut, Bytes, BytesMut};
use hayate_broker::Sink;
use hayate_broker::outbox::write_some;
use tokio::io::{AsyncRead, AsyncReadExt};

/// The write half of a connection.
pub trait WriteHalf: Sink {
    /// Ready when the transport may accept more bytes (after a `WouldBlock`).
    fn poll_write_ready(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>>;
    /// Ends the write direction (the peer sees the end of the stream; WebSocket sends a
    /// close frame first).
    fn shutdown(&self);
    /// What the transport is, for logs (`tcp`, `unix`, `ws`).
    fn name(&self) -> &'static str;
}

/// A shared write half.
pub type Writer = Arc<dyn WriteHalf>;

/// A read half.
pub type Reader = Box<dyn AsyncRead + Unpin + Send>;

/// Writes every chunk of `q` (emptying it), waiting for the transport as needed.
pub async fn write_chunks(w: &dyn WriteHalf, q: &mut VecDeque<Bytes>) -> io::Result<()> {
    while !write_some(w, q)? {
        std::future::poll_fn(|cx| w.poll_write_ready(cx)).await?;
    }
    Ok(())
}

/// Writes `bytes` whole (handshake answers before a session exists).
pub async fn write_all(w: &dyn WriteHalf, bytes: Bytes) -> io::Result<()> {
    write_chunks(w, &mut VecDeque::from([bytes])).await
}

/// Reads into `buf`: at most `limit` bytes when given (see [`hayate_native::ReadPlanner`]),
/// otherwise as much as fits. Input is noted for busy-polling when `busy` is given.
pub async fn read_some<R: AsyncRead + Unpin + ?Sized>(
    r: &mut R,
    buf: &mut BytesMut,
    limit: Option<usize>,
    busy: Option<&crate::busy::BusyPoll>,
) -> io::Result<usize> {
    let n = match limit {
        Some(n) => r.read_buf(&mut buf.limit(n)).await,
        None => r.read_buf(buf).await,
    }?;
    if n > 0
        && let Some(b) = busy
    {
        b.note_input();
    }
    Ok(n)
}

/// TCP.
#[derive(Debug)]
pub struct Tcp(pub tokio::net::tcp::OwnedWriteHalf);

/// A Unix socket.
#[derive(Debug)]
pub struct Unix(pub tokio::net::unix::OwnedWriteHalf);

fn shutdown_socket(s: socket2::SockRef<'_>) {
    if let Err(e) = s.shutdown(std::net::Shutdown::Write) {
        tracing::debug!("shutdown: {e}");
    }
}

impl Sink for Tcp {
    fn try_write_vectored(&self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        self.0.try_write_vectored(bufs)
    }
}

impl WriteHalf for Tcp {
    fn poll_write_ready(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.0.as_ref().poll_write_ready(cx)
    }
    fn shutdown(&self) {
        shutdown_socket(socket2::SockRef::from(self.0.as_ref()));
    }
    fn name(&self) -> &'static str {
        "tcp"
    }
}

impl Sink for Unix {
    fn try_write_vectored(&self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        self.0.try_write_vectored(bufs)
    }
}

impl WriteHalf for Unix {
    fn poll_write_ready(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.0.as_ref().poll_write_ready(cx)
    }
    fn shutdown(&self) {
        shutdown_socket(socket2::SockRef::from(self.0.as_ref()));
    }
    fn name(&self) -> &'static str {
        "unix"
    }
}

/// Splits a TCP stream into a reader and a shared writer.
pub fn tcp(s: tokio::net::TcpStream) -> (Reader, Writer) {
    let (r, w) = s.into_split();
    (Box::new(r), Arc::new(Tcp(w)))
}

/// Splits a Unix stream into a reader and a shared writer.
pub fn unix(s: tokio::net::UnixStream) -> (Reader, Writer) {
    let (r, w) = s.into_split();
    (Box::new(r), Arc::new(Unix(w)))
}

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
        state: std::sync::Mutex::new(PipeState::default()),
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
    state: std::sync::Mutex<PipeState>,
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
    fn lock(&self) -> std::sync::MutexGuard<'_, PipeState> {
        crate::lock(&self.state)
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

#[cfg(test)]
mod tests {
    use std::pin::Pin;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::task::{Wake, Waker};

    use tokio::io::{AsyncReadExt, AsyncWrite, AsyncWriteExt};

    use super::*;

    /// A waker that counts its wake-ups.
    #[derive(Default)]
    struct Count(AtomicUsize);

    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn counting() -> (Arc<Count>, Waker) {
        let c = Arc::new(Count::default());
        (c.clone(), Waker::from(c))
    }

    fn woken(c: &Count) -> usize {
        c.0.load(Ordering::SeqCst)
    }

    fn would_block(r: io::Result<usize>) -> bool {
        matches!(r, Err(e) if e.kind() == io::ErrorKind::WouldBlock)
    }

    #[tokio::test]
    async fn memory_carries_bytes_both_ways() {
        let ((mut r, w), mut peer) = memory(64);
        assert_eq!(w.name(), "memory");
        write_all(&*w, Bytes::from_static(b"to the peer"))
            .await
            .unwrap();
        assert_eq!(peer.buffered(), 11);
        let mut got = [0u8; 11];
        peer.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"to the peer");
        assert_eq!(peer.buffered(), 0);

        peer.write_all(b"to the server").await.unwrap();
        let mut buf = BytesMut::new();
        while buf.len() < 13 {
            assert!(read_some(&mut r, &mut buf, None, None).await.unwrap() > 0);
        }
        assert_eq!(&buf[..], b"to the server");
    }

    #[test]
    fn memory_write_blocks_when_full_and_wakes_when_the_peer_reads() {
        let ((_r, w), mut peer) = memory(8);
        // Partial across slices: the first fits, the second only in part.
        let n = w
            .try_write_vectored(&[IoSlice::new(b"abcde"), IoSlice::new(b"fghij")])
            .unwrap();
        assert_eq!(n, 8);
        assert!(would_block(w.try_write_vectored(&[IoSlice::new(b"ij")])));

        let (count, waker) = counting();
        let mut cx = Context::from_waker(&waker);
        assert!(w.poll_write_ready(&mut cx).is_pending());
        assert!(w.poll_write_ready(&mut cx).is_pending());
        assert_eq!(woken(&count), 0);

        // The peer reads 3 bytes: room for 3, and the writer is woken once.
        let mut three = [0u8; 3];
        let mut rb = tokio::io::ReadBuf::new(&mut three);
        assert!(matches!(
            Pin::new(&mut peer).poll_read(&mut cx, &mut rb),
            Poll::Ready(Ok(()))
        ));
        assert_eq!(rb.filled(), b"abc");
        assert_eq!(woken(&count), 1);
        assert!(matches!(w.poll_write_ready(&mut cx), Poll::Ready(Ok(()))));
        assert_eq!(w.try_write_vectored(&[IoSlice::new(b"ijkl")]).unwrap(), 3);
        assert!(would_block(w.try_write_vectored(&[IoSlice::new(b"l")])));

        // Everything arrives in order.
        let mut rest = [0u8; 16];
        let mut rb = tokio::io::ReadBuf::new(&mut rest);
        assert!(Pin::new(&mut peer).poll_read(&mut cx, &mut rb).is_ready());
        assert_eq!(rb.filled(), b"defghijk");
        // Empty now: the peer waits, and a write wakes it.
        let mut rb = tokio::io::ReadBuf::new(&mut rest);
        let (rcount, rwaker) = counting();
        let mut rcx = Context::from_waker(&rwaker);
        assert!(
            Pin::new(&mut peer)
                .poll_read(&mut rcx, &mut rb)
                .is_pending()
        );
        assert_eq!(w.try_write_vectored(&[IoSlice::new(b"l")]).unwrap(), 1);
        assert_eq!(woken(&rcount), 1);
    }

    #[tokio::test]
    async fn memory_shutdown_is_the_end_of_the_stream_after_what_was_written() {
        let ((_r, w), mut peer) = memory(16);
        write_all(&*w, Bytes::from_static(b"last words"))
            .await
            .unwrap();
        assert!(!peer.is_shut_down());
        w.shutdown();
        assert!(peer.is_shut_down());
        let mut got = Vec::new();
        peer.read_to_end(&mut got).await.unwrap();
        assert_eq!(got, b"last words");
        // Writing after shutdown fails, as on a socket.
        let e = w.try_write_vectored(&[IoSlice::new(b"x")]).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::BrokenPipe);
    }

    #[tokio::test]
    async fn memory_dropped_writer_wakes_a_waiting_peer_with_the_end_of_the_stream() {
        let ((_r, w), mut peer) = memory(16);
        let (count, waker) = counting();
        let mut cx = Context::from_waker(&waker);
        let mut b = [0u8; 4];
        let mut rb = tokio::io::ReadBuf::new(&mut b);
        assert!(Pin::new(&mut peer).poll_read(&mut cx, &mut rb).is_pending());
        drop(w);
        assert_eq!(woken(&count), 1);
        assert_eq!(peer.read(&mut b).await.unwrap(), 0);
    }

    #[test]
    fn memory_peer_gone_wakes_the_writer_and_breaks_the_pipe() {
        let ((_r, w), peer) = memory(4);
        assert_eq!(w.try_write_vectored(&[IoSlice::new(b"full")]).unwrap(), 4);
        let (count, waker) = counting();
        let mut cx = Context::from_waker(&waker);
        assert!(w.poll_write_ready(&mut cx).is_pending());
        drop(peer);
        assert_eq!(woken(&count), 1);
        assert!(w.poll_write_ready(&mut cx).is_ready());
        let e = w.try_write_vectored(&[IoSlice::new(b"x")]).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::BrokenPipe);
        let mut q = VecDeque::from([Bytes::from_static(b"x")]);
        assert!(write_some(&*w, &mut q).is_err());
    }

    #[tokio::test]
    async fn memory_peer_writes_wait_for_the_session_to_read() {
        let ((mut r, _w), mut peer) = memory(4);
        let (count, waker) = counting();
        let mut cx = Context::from_waker(&waker);
        let p = Pin::new(&mut peer);
        assert!(matches!(
            p.poll_write(&mut cx, b"abcdef"),
            Poll::Ready(Ok(4))
        ));
        assert!(Pin::new(&mut peer).poll_write(&mut cx, b"ef").is_pending());
        let mut buf = BytesMut::new();
        assert_eq!(read_some(&mut r, &mut buf, Some(2), None).await.unwrap(), 2);
        assert_eq!(woken(&count), 1);
        assert!(matches!(
            Pin::new(&mut peer).poll_write(&mut cx, b"ef"),
            Poll::Ready(Ok(2))
        ));
        // The peer's shutdown is the session's end of stream, after the buffered bytes.
        peer.shutdown().await.unwrap();
        while read_some(&mut r, &mut buf, None, None).await.unwrap() > 0 {}
        assert_eq!(&buf[..], b"abcdef");
    }

    #[tokio::test]
    async fn write_chunks_moves_a_large_payload_through_a_small_buffer() {
        let ((_r, w), mut peer) = memory(7);
        let chunks: VecDeque<Bytes> = (0..50u8)
            .map(|i| Bytes::from(vec![i; 200 + usize::from(i)]))
            .collect();
        let want: Vec<u8> = chunks.iter().flat_map(|c| c.iter().copied()).collect();
        let writer = tokio::spawn({
            let w = w.clone();
            let mut q = chunks;
            async move {
                write_chunks(&*w, &mut q).await.unwrap();
                w.shutdown();
            }
        });
        drop(w);
        let mut got = Vec::new();
        peer.read_to_end(&mut got).await.unwrap();
        writer.await.unwrap();
        assert_eq!(got.len(), want.len());
        assert!(got == want, "bytes arrive whole and in order");
    }
}
