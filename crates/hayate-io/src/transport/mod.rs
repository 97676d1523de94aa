//! Transports: the byte streams connections run on, behind one trait.
//!
//! A connection is a read half (any [`AsyncRead`]) and a write half ([`WriteHalf`]), shared
//! by the session's writer task and by inline flushes from publishers' tasks (so it writes
//! through `&self`: a non-blocking vectored write plus a readiness wait). TCP ([`Tcp`]) and
//! Unix sockets ([`Unix`]) implement it directly, [`memory`] is an in-memory pair for tests;
//! WebSocket (hayate-server's `ws`) frames another transport in process; [`tls`] is TLS over
//! TCP (rustls); [`shm`] is shared memory between two processes on one host (two rings and
//! doorbells). [`write_chunks`] is the one blocking write loop over any of them (the
//! non-blocking one is [`write_some`], which this calls).

use std::collections::VecDeque;
use std::io::{self, IoSlice};
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::{BufMut, Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt};

use crate::busy::BusyPoll;
use crate::sink::{Sink, write_some};

mod memory;
pub mod shm;
#[cfg(test)]
mod tests;
pub mod tls;

pub use memory::{Memory, MemoryPeer, memory};

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

/// Polls `read` as one read that spends the task's Tokio budget, as a socket read does
/// (the budget is given back when it is pending). For transports that read with `try_read`
/// or from memory, which spend none: a task reading a peer that never pauses would never
/// yield, and a task it woke into its worker's LIFO slot, which no other worker can steal,
/// would wait until the flood stopped.
pub(crate) fn poll_read_budgeted<T>(
    cx: &mut std::task::Context<'_>,
    read: impl FnOnce(&mut std::task::Context<'_>) -> std::task::Poll<T>,
) -> std::task::Poll<T> {
    let coop = std::task::ready!(tokio::task::coop::poll_proceed(cx));
    let r = read(cx);
    if r.is_ready() {
        coop.made_progress();
    }
    r
}

/// Writes `bytes` whole (handshake answers before a session exists).
pub async fn write_all(w: &dyn WriteHalf, bytes: Bytes) -> io::Result<()> {
    write_chunks(w, &mut VecDeque::from([bytes])).await
}

/// Reads into `buf`: at most `limit` bytes when given (a protocol's read planner),
/// otherwise as much as fits. Input is noted for busy-polling when `busy` is given.
pub async fn read_some<R: AsyncRead + Unpin + ?Sized>(
    r: &mut R,
    buf: &mut BytesMut,
    limit: Option<usize>,
    busy: Option<&BusyPoll>,
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
