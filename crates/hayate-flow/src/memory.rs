//! The broker-wide memory budget: one pool of bytes that every large holder of message data
//! charges before it holds more (outboxes past their free allowance, unhandled input past the
//! read allowance, offline sessions, queues without consumers, retained messages).
//!
//! When the pool is full, a holder that can wait does (a publisher's reader stops reading, so
//! TCP back-pressure slows the publisher) and one that cannot refuses (the message is dropped
//! and counted, as a full queue of its own would). A charge comes before the bytes it covers,
//! except for data that exists already (a session restored from disk) and the one delivery
//! an empty outbox always takes ([`Charge::force`]).
//!
//! The pool is one atomic counter. Holders charge in steps of [`STEP`] through a [`Charge`],
//! which keeps the bytes it was granted, so the counter is touched only when a holder crosses
//! a step, not per message.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

/// The granularity of a [`Charge`]: it grows and shrinks by whole steps (so a holder whose
/// size wobbles around a step boundary does not touch the pool on every message).
pub const STEP: usize = 256 * 1024;

/// A pool of bytes shared by every holder in one broker.
pub struct Memory {
    limit: usize,
    used: AtomicUsize,
    peak: AtomicUsize,
    refused: AtomicU64,
}

impl fmt::Debug for Memory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Memory")
            .field("limit", &self.limit)
            .field("used", &self.used())
            .finish_non_exhaustive()
    }
}

impl Memory {
    /// A pool of `limit` bytes.
    pub fn new(limit: usize) -> Arc<Memory> {
        Arc::new(Memory {
            limit,
            used: AtomicUsize::new(0),
            peak: AtomicUsize::new(0),
            refused: AtomicU64::new(0),
        })
    }

    /// A pool that never refuses (tests, the client library's peer server).
    pub fn unlimited() -> Arc<Memory> {
        Memory::new(usize::MAX)
    }

    /// Takes `n` bytes if the pool has room for them; false (and counted) if not.
    pub fn try_charge(&self, n: usize) -> bool {
        let mut cur = self.used.load(Ordering::Relaxed);
        loop {
            let next = match cur.checked_add(n) {
                Some(v) if v <= self.limit => v,
                _ => {
                    self.refused.fetch_add(1, Ordering::Relaxed);
                    return false;
                }
            };
            match self
                .used
                .compare_exchange_weak(cur, next, Ordering::AcqRel, Ordering::Relaxed)
            {
                Ok(_) => {
                    self.peak.fetch_max(next, Ordering::Relaxed);
                    return true;
                }
                Err(c) => cur = c,
            }
        }
    }

    /// Takes `n` bytes whatever the pool holds (data that exists already: a session
    /// restored from disk, the one delivery an empty outbox always takes).
    pub fn force(&self, n: usize) {
        let next = self.used.fetch_add(n, Ordering::AcqRel).saturating_add(n);
        self.peak.fetch_max(next, Ordering::Relaxed);
    }

    /// Gives `n` bytes back. (Nobody is woken: a holder that waits for room, a reader
    /// with a half-read frame, looks again every few milliseconds; waiting is rare, and a
    /// release on every written batch must stay one atomic operation.)
    pub fn release(&self, n: usize) {
        if n == 0 {
            return;
        }
        let prev = self.used.fetch_sub(n, Ordering::AcqRel);
        debug_assert!(prev >= n, "memory pool released more than it was charged");
    }

    /// The pool's size in bytes.
    pub fn limit(&self) -> usize {
        self.limit
    }

    /// Bytes charged now.
    pub fn used(&self) -> usize {
        self.used.load(Ordering::Relaxed)
    }

    /// The most bytes ever charged at once.
    pub fn peak(&self) -> usize {
        self.peak.load(Ordering::Relaxed)
    }

    /// Charges refused so far (each is a delivery dropped, a message not kept or a reader
    /// made to wait).
    pub fn refused(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }
}

/// The bytes one holder has charged to a pool. It grows before the holder holds more
/// ([`Charge::cover`]), shrinks when the holder frees some ([`Charge::shrink`]) and gives
/// everything back when dropped.
pub struct Charge {
    pool: Arc<Memory>,
    bytes: usize,
    /// [`STEP`], or 1 for an exact charge.
    step: usize,
}

impl fmt::Debug for Charge {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Charge")
            .field("bytes", &self.bytes)
            .finish()
    }
}

impl Charge {
    /// Nothing charged yet, to `pool`; grows and shrinks in steps of [`STEP`] (for holders
    /// that charge only past a free allowance: few holders, often crossing boundaries).
    pub fn new(pool: &Arc<Memory>) -> Charge {
        Charge {
            pool: pool.clone(),
            bytes: 0,
            step: STEP,
        }
    }

    /// Nothing charged yet, to `pool`; charges exactly what is held, without steps or slack
    /// (for holders that charge from their first byte: many small holders, such as offline
    /// sessions, would otherwise each take a step).
    pub fn exact(pool: &Arc<Memory>) -> Charge {
        Charge {
            pool: pool.clone(),
            bytes: 0,
            step: 1,
        }
    }

    fn round_up(&self, n: usize) -> usize {
        n.div_ceil(self.step).saturating_mul(self.step)
    }

    /// The pool charged.
    pub fn pool(&self) -> &Arc<Memory> {
        &self.pool
    }

    /// Bytes charged.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Makes the charge cover `need` bytes: true if it does already or the pool had room
    /// for the difference (rounded up to a step when it can); false, unchanged, if not.
    pub fn cover(&mut self, need: usize) -> bool {
        if need <= self.bytes {
            return true;
        }
        let target = self.round_up(need);
        if target > need && self.pool.try_charge(target - self.bytes) {
            self.bytes = target;
            return true;
        }
        if self.pool.try_charge(need - self.bytes) {
            self.bytes = need;
            return true;
        }
        false
    }

    /// Makes the charge cover `need` bytes whatever the pool holds.
    pub fn force(&mut self, need: usize) {
        if need > self.bytes {
            self.pool.force(need - self.bytes);
            self.bytes = need;
        }
    }

    /// The holder now holds `held` bytes: gives back what the charge no longer needs. A
    /// stepped charge keeps one step of slack (so a holder hovering around a boundary does
    /// not touch the pool each time) except when nothing is held.
    pub fn shrink(&mut self, held: usize) {
        let keep = if held == 0 || self.step == 1 {
            held
        } else {
            self.round_up(held).saturating_add(self.step)
        };
        if keep < self.bytes {
            self.pool.release(self.bytes - keep);
            self.bytes = keep;
        }
    }
}

impl Drop for Charge {
    fn drop(&mut self) {
        self.pool.release(self.bytes);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn charges_within_the_limit_and_refuses_past_it() {
        let m = Memory::new(3 * STEP);
        let mut a = Charge::new(&m);
        let mut b = Charge::new(&m);
        assert!(a.cover(1));
        assert_eq!(a.bytes(), STEP, "rounded up to a step");
        assert!(b.cover(2 * STEP));
        assert_eq!(m.used(), 3 * STEP);
        assert!(!b.cover(2 * STEP + 1), "past the limit");
        assert_eq!(b.bytes(), 2 * STEP, "a refused charge is unchanged");
        assert_eq!(m.refused(), 2, "the rounded and the exact attempt");
        a.shrink(0);
        assert_eq!(m.used(), 2 * STEP);
        assert!(b.cover(2 * STEP + 1));
        drop(b);
        assert_eq!(m.used(), 0);
        assert_eq!(m.peak(), 3 * STEP);
    }

    #[test]
    fn an_exact_charge_fits_where_a_rounded_one_does_not() {
        let m = Memory::new(STEP + 10);
        let mut a = Charge::new(&m);
        assert!(a.cover(STEP + 10));
        assert_eq!(a.bytes(), STEP + 10);
        assert!(!Charge::new(&m).cover(1));
    }

    #[test]
    fn an_exact_charge_has_no_steps_nor_slack() {
        let m = Memory::new(1000);
        let mut a = Charge::exact(&m);
        assert!(a.cover(10));
        assert_eq!(m.used(), 10);
        assert!(a.cover(990));
        assert!(!a.cover(1001));
        a.shrink(7);
        assert_eq!(m.used(), 7);
        let mut b = Charge::exact(&m);
        assert!(b.cover(993));
        assert!(!b.cover(994));
    }

    #[test]
    fn shrinking_keeps_one_step_of_slack() {
        let m = Memory::unlimited();
        let mut a = Charge::new(&m);
        assert!(a.cover(10 * STEP));
        a.shrink(9 * STEP + 1);
        assert_eq!(a.bytes(), 10 * STEP, "within the slack: unchanged");
        a.shrink(STEP);
        assert_eq!(a.bytes(), 2 * STEP);
        a.force(5 * STEP);
        assert_eq!(m.used(), 5 * STEP);
        a.shrink(0);
        assert_eq!(m.used(), 0);
    }
}
