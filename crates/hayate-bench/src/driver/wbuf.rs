//! A client's write buffer (the STOMP and AMQP drivers'): publishers append encoded frames,
//! one writer task sends everything buffered with one `write_all` per batch, and a
//! publisher waits while more than a high-water mark is buffered.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use bytes::BytesMut;
use hayate_core::sync::lock;
use tokio::io::{AsyncWrite, AsyncWriteExt};
use tokio::sync::Notify;

pub(crate) struct WriteBuf {
    out: Mutex<BytesMut>,
    /// Wakes the writer task.
    wake: Notify,
    /// Wakes publishers waiting for buffer space.
    space: Notify,
    closed: AtomicBool,
    high_water: usize,
    /// The first error that ended the connection (it fails the point).
    trouble: Mutex<Option<String>>,
}

impl WriteBuf {
    /// A buffer that makes publishers wait past `high_water` bytes.
    pub(crate) fn new(high_water: usize) -> WriteBuf {
        WriteBuf {
            out: Mutex::new(BytesMut::with_capacity(high_water)),
            wake: Notify::new(),
            space: Notify::new(),
            closed: AtomicBool::new(false),
            high_water,
            trouble: Mutex::default(),
        }
    }

    /// Records what ended the connection (the first report stands).
    pub(crate) fn fail(&self, msg: String) {
        let mut t = lock(&self.trouble);
        if t.is_none() {
            *t = Some(msg);
        }
    }

    /// What ended the connection, if something did.
    pub(crate) fn trouble(&self) -> Option<String> {
        lock(&self.trouble).clone()
    }

    /// The connection ended: writers stop waiting.
    pub(crate) fn close(&self) {
        self.closed.store(true, Ordering::Release);
        self.space.notify_waiters();
        self.wake.notify_one();
    }

    pub(crate) fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    /// Appends with `f`, waiting while the buffer is over its high-water mark; false when
    /// the connection is closed.
    pub(crate) async fn write(&self, f: impl Fn(&mut BytesMut)) -> bool {
        loop {
            let space = self.space.notified();
            tokio::pin!(space);
            space.as_mut().enable();
            if self.is_closed() {
                return false;
            }
            {
                let mut out = lock(&self.out);
                if out.len() < self.high_water {
                    f(&mut out);
                    break;
                }
            }
            space.await;
        }
        self.wake.notify_one();
        true
    }

    /// The writer task: sends what is buffered until the connection closes.
    pub(crate) async fn write_loop<W: AsyncWrite + Unpin>(
        &self,
        wr: &mut W,
    ) -> std::io::Result<()> {
        loop {
            let chunk = {
                let mut out = lock(&self.out);
                if out.is_empty() {
                    None
                } else {
                    Some(out.split())
                }
            };
            match chunk {
                Some(c) => {
                    wr.write_all(&c).await?;
                    self.space.notify_waiters();
                    // Give the buffer back when it is the only reference (reuse the
                    // allocation).
                    let mut out = lock(&self.out);
                    if out.is_empty() {
                        let mut c = c;
                        c.clear();
                        out.unsplit(c);
                    }
                }
                None => {
                    if self.is_closed() {
                        return Ok(());
                    }
                    self.wake.notified().await;
                }
            }
        }
    }
}

/// Spawns the writer task of a connection whose shared state `shared` holds its write
/// buffer (`buf` finds it): it writes until the buffer closes, and a write error (named
/// after `proto`) is the connection's trouble.
pub(crate) fn spawn_writer<S, W>(
    shared: std::sync::Arc<S>,
    mut wr: W,
    buf: fn(&S) -> &WriteBuf,
    proto: &'static str,
) -> tokio::task::AbortHandle
where
    S: Send + Sync + 'static,
    W: AsyncWrite + Unpin + Send + 'static,
{
    tokio::spawn(async move {
        let b = buf(&shared);
        if let Err(e) = b.write_loop(&mut wr).await {
            b.fail(format!("{proto} write: {e}"));
        }
        b.close();
    })
    .abort_handle()
}
