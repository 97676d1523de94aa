//! The admin listener's connection slots: which connections hold the `MAX_CONNECTIONS`
//! served slots and the `SPARE_SLOTS`, which to close for a new one (idle, or writes
//! blocked), and what each connection's socket and service tell the accept loop.

use std::sync::Arc;

use axum::Router;
use hayate_core::sync::lock;

use super::{MAX_CONNECTIONS, SPARE_SLOTS, WRITE_BLOCKED_CUT, WRITE_TIMEOUT};

/// Which slots a connection holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Kind {
    /// One of the [`MAX_CONNECTIONS`]: every route.
    Served,
    /// One of the [`SPARE_SLOTS`]: health checks only.
    Spare,
}

/// What the accept loop knows of one connection.
#[derive(Debug)]
pub(super) struct ConnState {
    /// A request is being served: its head came, its response has not been sent whole.
    pub(super) busy: std::sync::atomic::AtomicBool,
    /// The last read found nothing to read: the connection waits for its client.
    pub(super) waiting: std::sync::atomic::AtomicBool,
    /// Since when the socket has taken no bytes (a write or flush found it full), in
    /// milliseconds since `opened`, plus one; 0 while writes go through.
    pub(super) write_blocked: std::sync::atomic::AtomicU64,
    pub(super) opened: std::time::Instant,
}

impl ConnState {
    pub(super) fn new() -> Self {
        ConnState {
            busy: Default::default(),
            waiting: Default::default(),
            write_blocked: Default::default(),
            opened: std::time::Instant::now(),
        }
    }

    /// Waiting for a request head: idle between requests, or only part of a head sent. A
    /// connection whose task has not read yet is not (it may hold a whole request).
    pub(super) fn idle(&self) -> bool {
        use std::sync::atomic::Ordering::Relaxed;
        self.waiting.load(Relaxed) && !self.busy.load(Relaxed)
    }

    /// How long its writes have been blocked at `now` (its client reads nothing), if they
    /// are.
    pub(super) fn write_blocked_for(&self, now: std::time::Instant) -> Option<std::time::Duration> {
        let since = self
            .write_blocked
            .load(std::sync::atomic::Ordering::Relaxed)
            .checked_sub(1)?;
        let since = self.opened + std::time::Duration::from_millis(since);
        Some(now.saturating_duration_since(since))
    }

    /// Notes a write's outcome: blocked (from now, unless it already was), or bytes taken.
    pub(super) fn wrote<T>(
        &self,
        r: &std::task::Poll<std::io::Result<T>>,
        progress: impl Fn(&T) -> bool,
    ) {
        use std::sync::atomic::Ordering::Relaxed;
        match r {
            std::task::Poll::Pending => {
                if self.write_blocked.load(Relaxed) == 0 {
                    let ms = self.opened.elapsed().as_millis() as u64 + 1;
                    self.write_blocked.store(ms, Relaxed);
                }
            }
            std::task::Poll::Ready(Ok(v)) if progress(v) => self.write_blocked.store(0, Relaxed),
            std::task::Poll::Ready(_) => {}
        }
    }
}

/// One open connection in the slot table.
pub(super) struct Slot {
    pub(super) state: Arc<ConnState>,
    /// Set once the connection's task is spawned (after the slot is taken).
    pub(super) abort: Option<tokio::task::AbortHandle>,
}

/// The admin listener's connections, by slot, oldest first (ids grow with each accept).
#[derive(Default)]
pub(super) struct Slots {
    pub(super) table: std::sync::Mutex<SlotTable>,
}

impl Slots {
    pub(super) fn lock(&self) -> std::sync::MutexGuard<'_, SlotTable> {
        lock(&self.table)
    }
}

#[derive(Default)]
pub(super) struct SlotTable {
    pub(super) next: u64,
    pub(super) served: std::collections::BTreeMap<u64, Slot>,
    pub(super) spare: std::collections::BTreeMap<u64, Slot>,
    /// Connections closed to make room, and new ones closed for want of any.
    pub(super) cut: u64,
}

impl SlotTable {
    pub(super) fn next_id(&mut self) -> u64 {
        self.next += 1;
        self.next
    }

    /// The slot a new connection gets (`None` when every slot is in a request), and the
    /// connection to close to make room for it, if any (closed by the caller, once the
    /// table is unlocked: the task's end gives its slot back under the same lock).
    pub(super) fn make_room(&mut self) -> (Option<Kind>, Option<tokio::task::AbortHandle>) {
        let now = std::time::Instant::now();
        if self.served.len() < MAX_CONNECTIONS {
            return (Some(Kind::Served), None);
        }
        if let Some(id) = oldest_cuttable(&self.served, now) {
            return (Some(Kind::Served), self.take(Kind::Served, id));
        }
        if self.spare.len() < SPARE_SLOTS {
            return (Some(Kind::Spare), None);
        }
        if let Some(id) = oldest_cuttable(&self.spare, now) {
            return (Some(Kind::Spare), self.take(Kind::Spare, id));
        }
        self.cut += 1;
        (None, None)
    }

    /// Takes out every connection whose writes have been blocked for [`WRITE_TIMEOUT`], to
    /// be closed (by the caller, once the table is unlocked).
    pub(super) fn take_stalled(&mut self) -> Vec<tokio::task::AbortHandle> {
        let now = std::time::Instant::now();
        let stalled = |map: &std::collections::BTreeMap<u64, Slot>| -> Vec<u64> {
            map.iter()
                .filter(|(_, s)| {
                    s.state
                        .write_blocked_for(now)
                        .is_some_and(|d| d >= WRITE_TIMEOUT)
                })
                .map(|(id, _)| *id)
                .collect()
        };
        let mut out = Vec::new();
        for id in stalled(&self.served) {
            out.extend(self.take(Kind::Served, id));
        }
        for id in stalled(&self.spare) {
            out.extend(self.take(Kind::Spare, id));
        }
        out
    }

    /// Takes connection `id` out of its slot, to be closed.
    pub(super) fn take(&mut self, kind: Kind, id: u64) -> Option<tokio::task::AbortHandle> {
        let map = match kind {
            Kind::Served => &mut self.served,
            Kind::Spare => &mut self.spare,
        };
        let slot = map.remove(&id)?;
        self.cut += 1;
        slot.abort
    }

    /// The handle that closes connection `id`, once its task is spawned.
    pub(super) fn set_abort(&mut self, kind: Kind, id: u64, abort: tokio::task::AbortHandle) {
        let map = match kind {
            Kind::Served => &mut self.served,
            Kind::Spare => &mut self.spare,
        };
        if let Some(slot) = map.get_mut(&id) {
            slot.abort = Some(abort);
        }
    }

    pub(super) fn insert(&mut self, kind: Kind, id: u64, slot: Slot) {
        match kind {
            Kind::Served => self.served.insert(id, slot),
            Kind::Spare => self.spare.insert(id, slot),
        };
    }

    pub(super) fn open(&self) -> usize {
        self.served.len() + self.spare.len()
    }
}

/// The connection of `map` to close for a new one: the oldest waiting for a request head,
/// else the oldest whose writes have been blocked for [`WRITE_BLOCKED_CUT`] (in a request
/// or not: a client that pipelines requests and never reads their answers).
pub(super) fn oldest_cuttable(
    map: &std::collections::BTreeMap<u64, Slot>,
    now: std::time::Instant,
) -> Option<u64> {
    let idle = map.iter().find(|(_, s)| s.state.idle());
    idle.or_else(|| {
        map.iter().find(|(_, s)| {
            s.state
                .write_blocked_for(now)
                .is_some_and(|d| d >= WRITE_BLOCKED_CUT)
        })
    })
    .map(|(id, _)| *id)
}

/// Gives a connection's slot back when its task ends (or is aborted).
pub(super) struct Release {
    pub(super) slots: Arc<Slots>,
    pub(super) id: u64,
}

impl Drop for Release {
    fn drop(&mut self) {
        let mut t = self.slots.lock();
        t.served.remove(&self.id);
        t.spare.remove(&self.id);
    }
}

/// An admin connection's socket, noting when a read finds nothing to read, and when its
/// writes are blocked.
pub(super) struct Watched {
    pub(super) s: tokio::net::TcpStream,
    pub(super) state: Arc<ConnState>,
}

impl tokio::io::AsyncRead for Watched {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        let r = std::pin::Pin::new(&mut self.s).poll_read(cx, buf);
        self.state
            .waiting
            .store(r.is_pending(), std::sync::atomic::Ordering::Relaxed);
        r
    }
}

impl tokio::io::AsyncWrite for Watched {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        let r = std::pin::Pin::new(&mut self.s).poll_write(cx, buf);
        self.state.wrote(&r, |n| *n > 0);
        r
    }

    fn poll_write_vectored(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> std::task::Poll<std::io::Result<usize>> {
        let r = std::pin::Pin::new(&mut self.s).poll_write_vectored(cx, bufs);
        self.state.wrote(&r, |n| *n > 0);
        r
    }

    fn is_write_vectored(&self) -> bool {
        self.s.is_write_vectored()
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        // A flush that goes through is no progress (a TCP socket has nothing to flush).
        let r = std::pin::Pin::new(&mut self.s).poll_flush(cx);
        self.state.wrote(&r, |_| false);
        r
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.s).poll_shutdown(cx)
    }
}

/// The router as a hyper service that marks its connection busy from a request's head until
/// its response has been sent whole (or given up).
#[derive(Clone)]
pub(super) struct Marked {
    pub(super) inner: hyper_util::service::TowerToHyperService<Router>,
    pub(super) state: Arc<ConnState>,
}

impl Marked {
    pub(super) fn new(app: Router, state: Arc<ConnState>) -> Self {
        Marked {
            inner: hyper_util::service::TowerToHyperService::new(app),
            state,
        }
    }
}

type BoxFuture<T> = std::pin::Pin<Box<dyn std::future::Future<Output = T> + Send>>;

impl hyper::service::Service<hyper::Request<hyper::body::Incoming>> for Marked {
    type Response = hyper::Response<Tracked>;
    type Error = std::convert::Infallible;
    type Future = BoxFuture<Result<Self::Response, Self::Error>>;

    fn call(&self, req: hyper::Request<hyper::body::Incoming>) -> Self::Future {
        self.state
            .busy
            .store(true, std::sync::atomic::Ordering::Relaxed);
        let done = Done(self.state.clone());
        let fut = hyper::service::Service::call(&self.inner, req);
        Box::pin(async move {
            let r = fut.await?;
            Ok(r.map(|body| Tracked { body, _done: done }))
        })
    }
}

/// Marks its connection no longer busy when dropped.
pub(super) struct Done(Arc<ConnState>);

impl Drop for Done {
    fn drop(&mut self) {
        self.0
            .busy
            .store(false, std::sync::atomic::Ordering::Relaxed);
    }
}

/// A response body that marks its connection no longer busy once it has been sent (or
/// dropped).
pub(super) struct Tracked {
    pub(super) body: axum::body::Body,
    pub(super) _done: Done,
}

impl hyper::body::Body for Tracked {
    type Data = bytes::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<Self::Data>, Self::Error>>> {
        std::pin::Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.body.size_hint()
    }
}
