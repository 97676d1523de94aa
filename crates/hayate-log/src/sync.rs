//! What is confirmed and synced, who waits for it, and the background syncer.
//!
//! Two marks, both exclusive ends (every offset below them qualifies):
//! - `synced`: covered by an fsync of its segment (and of the directory entry);
//! - `confirmed`: durable under the log's policy, the point a publisher's confirm waits for.
//!   `always`: the synced mark. `interval` and `never`: written (in the page cache, so it
//!   survives a process kill), like Kafka's acks=1.
//!
//! Group commit: appenders under `always` only set `requested` and wake the syncer; a round
//! snapshots the end of the log, syncs, and raises both marks to that end, so one fsync
//! covers every append made before it started. Appends go on while it runs.

use std::cmp::Ordering;
use std::collections::BinaryHeap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use crate::error::{Error, Result};

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

struct Waiter {
    offset: u64,
    /// Registration order: waiters of one offset are woken first come, first served (the
    /// members of a stream consumer take turns).
    seq: u64,
    waker: Waker,
}

impl PartialEq for Waiter {
    fn eq(&self, o: &Self) -> bool {
        (self.offset, self.seq) == (o.offset, o.seq)
    }
}
impl Eq for Waiter {}
impl PartialOrd for Waiter {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Waiter {
    fn cmp(&self, o: &Self) -> Ordering {
        (o.offset, o.seq).cmp(&(self.offset, self.seq)) // a min-heap by offset, then age
    }
}

#[derive(Default)]
pub(crate) struct SyncState {
    pub(crate) confirmed: u64,
    pub(crate) synced: u64,
    /// An `always` appender asked for a round.
    pub(crate) requested: bool,
    pub(crate) stop: bool,
    /// Set when the log was poisoned: waiters get it.
    pub(crate) error: Option<String>,
    waiters: BinaryHeap<Waiter>,
    next_seq: u64,
}

/// The marks and their waiters, shared by the log, the syncer and [`Confirmed`] futures.
#[derive(Default)]
pub(crate) struct Marks {
    pub(crate) state: Mutex<SyncState>,
    /// Wakes the syncer.
    pub(crate) work: Condvar,
    /// Wakes blocking waiters.
    pub(crate) changed: Condvar,
}

impl Marks {
    pub(crate) fn new(confirmed: u64, synced: u64) -> Marks {
        let m = Marks::default();
        {
            let mut s = lock(&m.state);
            s.confirmed = confirmed;
            s.synced = synced;
        }
        m
    }

    /// Raises the marks (never lowers them) and wakes whoever they satisfy.
    pub(crate) fn raise(&self, confirmed: Option<u64>, synced: Option<u64>) {
        let mut wake = Vec::new();
        {
            let mut s = lock(&self.state);
            if let Some(c) = confirmed {
                s.confirmed = s.confirmed.max(c);
            }
            if let Some(c) = synced {
                s.synced = s.synced.max(c);
            }
            while s.waiters.peek().is_some_and(|w| w.offset < s.confirmed) {
                if let Some(w) = s.waiters.pop() {
                    wake.push(w.waker);
                }
            }
        }
        self.changed.notify_all();
        wake.into_iter().for_each(Waker::wake);
    }

    /// Records the failure and wakes every waiter with it.
    pub(crate) fn fail(&self, why: &str) {
        let wake: Vec<Waker> = {
            let mut s = lock(&self.state);
            s.error.get_or_insert_with(|| why.to_owned());
            s.waiters.drain().map(|w| w.waker).collect()
        };
        self.changed.notify_all();
        self.work.notify_all();
        wake.into_iter().for_each(Waker::wake);
    }

    /// Asks the syncer for a round (group commit); cheap when one is already asked for.
    pub(crate) fn request(&self) {
        let mut s = lock(&self.state);
        if !s.requested {
            s.requested = true;
            drop(s);
            self.work.notify_one();
        }
    }

    pub(crate) fn stop(&self) {
        lock(&self.state).stop = true;
        self.work.notify_all();
    }

    /// Blocks until `offset` is confirmed, the log fails, or `timeout` passes (`Ok(false)`).
    pub(crate) fn wait(&self, offset: u64, timeout: Duration) -> Result<bool> {
        let deadline = std::time::Instant::now() + timeout;
        let mut s = lock(&self.state);
        loop {
            // Confirmed before a later failure is still durable.
            if s.confirmed > offset {
                return Ok(true);
            }
            if let Some(e) = &s.error {
                return Err(Error::Poisoned(e.clone()));
            }
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                return Ok(false);
            }
            s = self
                .changed
                .wait_timeout(s, left)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }

    /// Syncer side: waits for work. `Some(())` = run a round, `None` = stop.
    pub(crate) fn next_round(&self, interval: Option<Duration>) -> Option<()> {
        let mut s = lock(&self.state);
        loop {
            if s.stop || s.error.is_some() {
                return None;
            }
            match interval {
                None if s.requested => {
                    s.requested = false;
                    return Some(());
                }
                None => s = self.work.wait(s).unwrap_or_else(|p| p.into_inner()),
                Some(d) => {
                    s = self
                        .work
                        .wait_timeout(s, d)
                        .unwrap_or_else(|p| p.into_inner())
                        .0;
                    if s.stop || s.error.is_some() {
                        return None;
                    }
                    return Some(());
                }
            }
        }
    }
}

/// Resolves once an offset is confirmed (durable under the log's fsync policy), or with
/// [`Error::Poisoned`] if the log fails first. Runtime-agnostic; `'static`.
pub struct Confirmed {
    pub(crate) marks: Arc<Marks>,
    pub(crate) offset: u64,
    pub(crate) registered: bool,
}

impl std::fmt::Debug for Confirmed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Confirmed")
            .field("offset", &self.offset)
            .finish()
    }
}

impl Future for Confirmed {
    type Output = Result<()>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<()>> {
        let offset = self.offset;
        let registered = self.registered;
        let mut s = lock(&self.marks.state);
        // Confirmed before a later failure is still durable.
        if s.confirmed > offset {
            return Poll::Ready(Ok(()));
        }
        if let Some(e) = &s.error {
            return Poll::Ready(Err(Error::Poisoned(e.clone())));
        }
        if registered {
            // Polled again before being woken: replace our waker rather than add one.
            let mut ws = std::mem::take(&mut s.waiters).into_vec();
            ws.retain(|w| !(w.offset == offset && w.waker.will_wake(cx.waker())));
            s.waiters = ws.into();
        }
        let seq = s.next_seq;
        s.next_seq += 1;
        s.waiters.push(Waiter {
            offset,
            seq,
            waker: cx.waker().clone(),
        });
        drop(s);
        self.registered = true;
        Poll::Pending
    }
}
