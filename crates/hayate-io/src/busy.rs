//! Busy-polling: a latency mode (hayate-server's `[server] busy_poll_us`, flag
//! `--busy-poll-us`).
//!
//! By default the broker's I/O threads sleep in `epoll_wait` whenever no connection has input,
//! and every message that arrives after a pause pays for waking a thread (and, when its CPU was
//! idle, the CPU). On a virtual machine that wake-up is the largest part of a request/reply
//! round trip: the broker relays each call twice, so a brokered call pays four of them (see
//! `docs/performance.md`).
//!
//! With busy-polling on, after input arrives the broker keeps polling its sockets (epoll with a
//! zero timeout) for `busy_poll_us` microseconds instead of going to sleep, so input that comes
//! within the window (the reply to a request it just relayed, the next call of a caller) is
//! read at once. Once the window passes with no input, it sleeps as usual: an idle broker burns
//! nothing, a busy one burns up to one CPU.
//!
//! How: one task, [`BusyPoll::spin`], yields in a loop while input is recent. Tokio polls its
//! I/O driver with a zero timeout before it runs a yielded task again, so each turn of the loop
//! is one non-blocking epoll. This only works when that task's thread is the one that polls the
//! driver: the `hayate broker` binary therefore runs the broker on **one** I/O thread when
//! busy-polling is on. Input is noted by [`BusyPoll::note_input`], called by
//! [`crate::transport::read_some`] on every connection's read path with the server's handle.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tokio::sync::Notify;

#[derive(Debug)]
struct State {
    epoch: Instant,
    /// Nanoseconds since `epoch` of the last input.
    last: AtomicU64,
    /// The spinner sleeps and waits for `wake`.
    sleeping: AtomicBool,
    wake: Notify,
    /// Turns of the spin loop so far (tests and statistics).
    turns: AtomicU64,
}

/// The busy-polling state of one server: a handle (cheap to clone) that the server gives
/// each connection, which notes its input with [`BusyPoll::note_input`], and that
/// [`BusyPoll::spin`] watches. No lock: atomics and a `Notify`.
#[derive(Debug, Clone)]
pub struct BusyPoll(Arc<State>);

impl Default for BusyPoll {
    fn default() -> Self {
        BusyPoll::new()
    }
}

impl BusyPoll {
    /// A new handle, with no input noted yet.
    pub fn new() -> BusyPoll {
        BusyPoll(Arc::new(State {
            epoch: Instant::now(),
            last: AtomicU64::new(0),
            sleeping: AtomicBool::new(false),
            wake: Notify::new(),
            turns: AtomicU64::new(0),
        }))
    }

    fn now(&self) -> u64 {
        u64::try_from(self.0.epoch.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    /// Notes that input arrived (a front-end read returned bytes).
    #[inline]
    pub fn note_input(&self) {
        let s = &self.0;
        s.last.store(self.now(), Ordering::SeqCst);
        if s.sleeping.load(Ordering::SeqCst) && s.sleeping.swap(false, Ordering::SeqCst) {
            s.wake.notify_one();
        }
    }

    /// Turns of the spin loop so far.
    pub fn turns(&self) -> u64 {
        self.0.turns.load(Ordering::Relaxed)
    }

    /// Keeps the current runtime thread polling for I/O while input arrived within
    /// `window`; sleeps (costing nothing) while it did not. Runs until dropped.
    pub async fn spin(self, window: Duration) {
        let s = &*self.0;
        let window = u64::try_from(window.as_nanos()).unwrap_or(u64::MAX);
        let idle = || self.now().saturating_sub(s.last.load(Ordering::SeqCst)) > window;
        loop {
            if idle() {
                let woken = s.wake.notified();
                tokio::pin!(woken);
                woken.as_mut().enable();
                s.sleeping.store(true, Ordering::SeqCst);
                // Input noted between the check above and `sleeping` being set has not
                // notified: look again before sleeping.
                if idle() {
                    woken.await;
                }
                s.sleeping.store(false, Ordering::SeqCst);
                continue;
            }
            s.turns.fetch_add(1, Ordering::Relaxed);
            // Let other threads runnable on this CPU (a client of the broker, say) go first.
            std::thread::yield_now();
            // Tokio polls the I/O driver (epoll, zero timeout) before running this task again.
            tokio::task::yield_now().await;
        }
    }
}
