//! Writing queued chunks with as few syscalls as possible.

use std::collections::VecDeque;
use std::io::IoSlice;

use bytes::{Buf, Bytes};
use tokio::io::{AsyncWrite, AsyncWriteExt};

/// Most slices handed to one `writev`.
const MAX_IOV: usize = 64;

/// Writes every chunk of `q` (emptying it), one vectored write per up to [`MAX_IOV`] chunks.
pub async fn write_chunks<W: AsyncWrite + Unpin>(
    w: &mut W,
    q: &mut VecDeque<Bytes>,
) -> std::io::Result<()> {
    while !q.is_empty() {
        let n = if q.len() == 1 {
            w.write(&q[0]).await?
        } else {
            let slices: Vec<IoSlice<'_>> =
                q.iter().take(MAX_IOV).map(|b| IoSlice::new(b)).collect();
            w.write_vectored(&slices).await?
        };
        if n == 0 {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        advance(q, n);
    }
    Ok(())
}

fn advance(q: &mut VecDeque<Bytes>, mut n: usize) {
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
