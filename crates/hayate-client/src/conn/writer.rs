//! The writer task: sends everything buffered in one vectored write (large payloads are
//! queued by reference) through hayate-io's [`write_chunks`], the loop the server's writers
//! use too.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use bytes::Bytes;
use hayate_io::transport::write_chunks;

use super::{Inner, Writer, lock};

pub(super) async fn write_loop(inner: Arc<Inner>, w: Writer) {
    let mut q: VecDeque<Bytes> = VecDeque::new();
    let result: std::io::Result<()> = async {
        loop {
            let has_data = {
                let mut out = lock(&inner.out);
                out.wake_pending = false;
                if out.writing {
                    // A publisher is writing inline; it wakes this task for what is left.
                    false
                } else if out.tail.is_empty() && out.chunks.is_empty() {
                    if out.closing || inner.is_closed() {
                        return Ok(());
                    }
                    false
                } else {
                    out.seal_tail();
                    q.append(&mut out.chunks);
                    out.writing = true;
                    true
                }
            };
            if has_data {
                inner.space.notify_waiters();
                let r = write_chunks(&*w, &mut q).await;
                lock(&inner.out).writing = false;
                r?;
                continue;
            }
            let notified = inner.wake_writer.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let idle = {
                let out = lock(&inner.out);
                out.writing || (out.tail.is_empty() && out.chunks.is_empty() && !out.closing)
            };
            if idle && !inner.is_closed() {
                notified.await;
            }
        }
    }
    .await;
    // Nothing is buffered below `write_chunks` (TCP and Unix write halves flush nothing):
    // ending the write direction is all that is left.
    w.shutdown();
    if let Err(e) = result {
        inner.fail(Some(e.into()));
    }
    inner.writer_finished.store(true, Ordering::Release);
    inner.writer_done.notify_waiters();
}
