//! The writer task: sends the write buffer, one `write_all` per batch.

use std::sync::atomic::Ordering;

use hayate_core::sync::lock;
use tokio::io::AsyncWriteExt;

use super::Shared;

pub(super) async fn write_loop(wr: &mut super::Wr, s: &Shared) -> std::io::Result<()> {
    loop {
        let chunk = {
            let mut out = lock(&s.out);
            if out.buf.is_empty() {
                None
            } else {
                Some(out.buf.split())
            }
        };
        match chunk {
            Some(c) => {
                wr.write_all(&c).await?;
                wr.flush().await?;
                s.wrote.store(true, Ordering::Relaxed);
                s.space.notify_waiters();
                // Give the buffer back when it is the only reference (reuse the allocation).
                let mut out = lock(&s.out);
                if out.buf.is_empty() {
                    let mut c = c;
                    c.clear();
                    out.buf.unsplit(c);
                }
            }
            None => {
                if s.closed.load(Ordering::Acquire) || s.closing.load(Ordering::Acquire) {
                    // Everything (the DISCONNECT last) is written.
                    let _ = wr.shutdown().await;
                    return Ok(());
                }
                s.wake.notified().await;
            }
        }
    }
}
