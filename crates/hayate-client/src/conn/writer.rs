//! The writer task: sends everything buffered in one write (vectored when large payloads are
//! queued by reference).

use std::collections::VecDeque;
use std::io::IoSlice;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use bytes::Bytes;
use hayate_core::chunks::{MAX_IOV, advance, fill_iov};
use tokio::io::AsyncWriteExt;

use super::{Inner, Writer, lock};

pub(super) async fn write_loop(inner: Arc<Inner>, mut w: Writer) {
    let mut q: VecDeque<Bytes> = VecDeque::new();
    let result: std::io::Result<()> = async {
        loop {
            let has_data = {
                let mut out = lock(&inner.out);
                out.wake_pending = false;
                if out.tail.is_empty() && out.chunks.is_empty() {
                    if out.closing || inner.is_closed() {
                        return Ok(());
                    }
                    false
                } else {
                    out.seal_tail();
                    q.append(&mut out.chunks);
                    true
                }
            };
            if has_data {
                inner.space.notify_waiters();
                write_all(&mut w, &mut q).await?;
                continue;
            }
            let notified = inner.wake_writer.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let idle = {
                let out = lock(&inner.out);
                out.tail.is_empty() && out.chunks.is_empty() && !out.closing
            };
            if idle && !inner.is_closed() {
                notified.await;
            }
        }
    }
    .await;
    let _ = w.flush().await;
    let _ = w.shutdown().await;
    if let Err(e) = result {
        inner.fail(Some(e.into()));
    }
    inner.writer_finished.store(true, Ordering::Release);
    inner.writer_done.notify_waiters();
}

async fn write_all(w: &mut Writer, q: &mut VecDeque<Bytes>) -> std::io::Result<()> {
    while !q.is_empty() {
        let n = if q.len() == 1 {
            w.write(&q[0]).await?
        } else {
            let mut iov = [IoSlice::new(&[]); MAX_IOV];
            let k = fill_iov(q, &mut iov);
            w.write_vectored(&iov[..k]).await?
        };
        if n == 0 {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        advance(q, n);
    }
    Ok(())
}
