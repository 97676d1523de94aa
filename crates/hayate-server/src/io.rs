//! Writing queued chunks with as few syscalls as possible.

use std::collections::VecDeque;
use std::io::IoSlice;

use bytes::{BufMut, Bytes, BytesMut};
use hayate_core::chunks::{MAX_IOV, advance, fill_iov};
use tokio::io::{AsyncRead, AsyncReadExt};

/// Reads into `buf`: at most `limit` bytes when given (see [`hayate_wire::ReadPlanner`]),
/// otherwise as much as fits.
pub async fn read_some<R: AsyncRead + Unpin>(
    r: &mut R,
    buf: &mut BytesMut,
    limit: Option<usize>,
) -> std::io::Result<usize> {
    let n = match limit {
        Some(n) => r.read_buf(&mut buf.limit(n)).await,
        None => r.read_buf(buf).await,
    }?;
    if n > 0 {
        crate::busy::touch();
    }
    Ok(n)
}

/// The write side of a connection, shared by the session's writer task and by inline flushes
/// from publishers' tasks (both write through `&self`: `writable` + `try_write_vectored`).
#[derive(Debug)]
pub enum WriteHalf {
    /// TCP.
    Tcp(tokio::net::tcp::OwnedWriteHalf),
    /// Unix socket.
    Unix(tokio::net::unix::OwnedWriteHalf),
}

impl WriteHalf {
    /// Waits until the socket may accept more bytes.
    pub async fn writable(&self) -> std::io::Result<()> {
        match self {
            WriteHalf::Tcp(w) => w.writable().await,
            WriteHalf::Unix(w) => w.writable().await,
        }
    }

    /// Shuts down the write direction (the peer sees end of stream).
    pub fn shutdown(&self) {
        let r = match self {
            WriteHalf::Tcp(w) => {
                socket2::SockRef::from(w.as_ref()).shutdown(std::net::Shutdown::Write)
            }
            WriteHalf::Unix(w) => {
                socket2::SockRef::from(w.as_ref()).shutdown(std::net::Shutdown::Write)
            }
        };
        if let Err(e) = r {
            tracing::debug!("shutdown: {e}");
        }
    }

    /// Writes every chunk of `q` (emptying it), waiting for the socket as needed.
    pub async fn write_chunks(&self, q: &mut VecDeque<Bytes>) -> std::io::Result<()> {
        while !q.is_empty() {
            let mut iov = [IoSlice::new(&[]); MAX_IOV];
            let k = fill_iov(q, &mut iov);
            match hayate_broker::Sink::try_write_vectored(self, &iov[..k]) {
                Ok(0) => return Err(std::io::ErrorKind::WriteZero.into()),
                Ok(n) => advance(q, n),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => self.writable().await?,
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }
}

impl hayate_broker::Sink for WriteHalf {
    fn try_write_vectored(&self, bufs: &[IoSlice<'_>]) -> std::io::Result<usize> {
        match self {
            WriteHalf::Tcp(w) => w.try_write_vectored(bufs),
            WriteHalf::Unix(w) => w.try_write_vectored(bufs),
        }
    }
}
