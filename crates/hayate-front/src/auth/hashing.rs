//! The argon2 workers: every password check runs here, never on the I/O threads.
//!
//! - At most [`workers`] checks run at once (two, or one on a machine with one core), each
//!   on a thread of this pool. A thread keeps one argon2 memory block (19 MiB for the
//!   default parameters) and reuses it for every check, so the memory password checks hold
//!   is bounded by the pool, whatever the number of logins: no allocation per check, nothing
//!   for the allocator to keep per thread. The blocks are charged to the broker's memory
//!   budget ([`Hashers::charge_to`]) from the first check on, for the life of the broker.
//! - Checks wait in two lanes of at most [`MAX_WAITING`] each: logins from an (address,
//!   user) pair that has not failed lately go first, pairs that have failed after them. A
//!   login that finds its lane full, or whose check has not finished within [`MAX_WAIT`], is
//!   refused as busy (not as a wrong password, and not counted as a failure); a check whose
//!   login gave up is skipped.
//! - Threads start with the first check and end with the authenticator.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock, PoisonError};
use std::time::Duration;

use argon2::password_hash::PasswordHash;
use argon2::{Algorithm, Argon2, Block, Params, Version};
use hayate_io::memory::Memory;
use tokio::sync::oneshot;

/// Checks waiting in one lane at most: a further login in that lane is refused as busy at
/// once.
pub(super) const MAX_WAITING: usize = 16;
/// How long a login waits for its check (waiting and running) before it is refused as busy.
pub(super) const MAX_WAIT: Duration = Duration::from_secs(5);

/// Checks running at once: one per core, at most two.
pub(super) fn workers() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
        .clamp(1, 2)
}

/// Which queue a check waits in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Lane {
    /// The (address, user) pair has not failed within the failure window: served first.
    Clean,
    /// It has: served when no clean check waits.
    Failed,
}

/// A check could not be made in time (lane full, or not done within [`MAX_WAIT`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Busy;

/// What the pool has done, for tests and logs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct HashStats {
    /// Checks running now.
    pub running: usize,
    /// The most checks that ever ran at once.
    pub peak: usize,
    /// The pool's size: `peak` never exceeds it.
    pub workers: usize,
    /// Checks finished.
    pub done: u64,
    /// Logins refused as busy.
    pub busy: u64,
    /// Bytes of argon2 memory the pool holds (and has charged to the budget).
    pub memory: usize,
}

struct Job {
    phc: Arc<str>,
    password: Vec<u8>,
    reply: oneshot::Sender<bool>,
}

#[derive(Default)]
struct Queue {
    clean: VecDeque<Job>,
    failed: VecDeque<Job>,
    threads: usize,
    idle: usize,
    closed: bool,
}

impl Queue {
    fn lane(&mut self, lane: Lane) -> &mut VecDeque<Job> {
        match lane {
            Lane::Clean => &mut self.clean,
            Lane::Failed => &mut self.failed,
        }
    }

    /// The next check whose login still waits for it.
    fn next(&mut self) -> Option<Job> {
        while let Some(j) = self.clean.pop_front().or_else(|| self.failed.pop_front()) {
            if !j.reply.is_closed() {
                return Some(j);
            }
        }
        None
    }
}

struct Shared {
    queue: Mutex<Queue>,
    ready: Condvar,
    workers: usize,
    running: AtomicUsize,
    peak: AtomicUsize,
    done: AtomicU64,
    busy: AtomicU64,
    held: AtomicUsize,
    memory: OnceLock<Arc<Memory>>,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The pool (see the module's comment).
pub(super) struct Hashers {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for Hashers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Hashers")
            .field("stats", &self.stats())
            .finish()
    }
}

impl Hashers {
    pub(super) fn new(workers: usize) -> Hashers {
        Hashers {
            shared: Arc::new(Shared {
                queue: Mutex::new(Queue::default()),
                ready: Condvar::new(),
                workers: workers.max(1),
                running: AtomicUsize::new(0),
                peak: AtomicUsize::new(0),
                done: AtomicU64::new(0),
                busy: AtomicU64::new(0),
                held: AtomicUsize::new(0),
                memory: OnceLock::new(),
            }),
        }
    }

    /// Charges the argon2 memory to `pool`: what the threads hold now, and what they take
    /// later. Only the first call counts.
    pub(super) fn charge_to(&self, pool: &Arc<Memory>) {
        if self.shared.memory.set(pool.clone()).is_ok() {
            pool.force(self.shared.held.load(Ordering::Relaxed));
        }
    }

    pub(super) fn stats(&self) -> HashStats {
        let s = &self.shared;
        HashStats {
            running: s.running.load(Ordering::Relaxed),
            peak: s.peak.load(Ordering::Relaxed),
            workers: s.workers,
            done: s.done.load(Ordering::Relaxed),
            busy: s.busy.load(Ordering::Relaxed),
            memory: s.held.load(Ordering::Relaxed),
        }
    }

    /// Whether `password` matches the PHC string `phc`, checked on the pool; [`Busy`] when
    /// the check could not be made in time.
    pub(super) async fn verify(
        &self,
        phc: Arc<str>,
        password: &[u8],
        lane: Lane,
    ) -> Result<bool, Busy> {
        let rx = self.submit(phc, password.to_vec(), lane)?;
        match tokio::time::timeout(MAX_WAIT, rx).await {
            Ok(Ok(ok)) => Ok(ok),
            _ => {
                // Gave up waiting (the check is skipped if not started), or the pool could
                // not start a thread.
                self.shared.busy.fetch_add(1, Ordering::Relaxed);
                Err(Busy)
            }
        }
    }

    fn submit(
        &self,
        phc: Arc<str>,
        password: Vec<u8>,
        lane: Lane,
    ) -> Result<oneshot::Receiver<bool>, Busy> {
        let (tx, rx) = oneshot::channel();
        let mut q = self.shared.lock();
        let l = q.lane(lane);
        if l.len() >= MAX_WAITING {
            l.retain(|j| !j.reply.is_closed());
        }
        if l.len() >= MAX_WAITING {
            drop(q);
            self.shared.busy.fetch_add(1, Ordering::Relaxed);
            return Err(Busy);
        }
        l.push_back(Job {
            phc,
            password,
            reply: tx,
        });
        if q.idle == 0 && q.threads < self.shared.workers {
            let shared = self.shared.clone();
            let started = std::thread::Builder::new()
                .name("hayate-argon2".into())
                .spawn(move || work(&shared));
            match started {
                Ok(_) => q.threads += 1,
                Err(e) => tracing::warn!("cannot start a password-check thread: {e}"),
            }
        } else {
            self.shared.ready.notify_one();
        }
        Ok(rx)
    }
}

impl Drop for Hashers {
    fn drop(&mut self) {
        self.shared.lock().closed = true;
        self.shared.ready.notify_all();
    }
}

fn work(shared: &Shared) {
    // The argon2 memory: grown to the largest hash's size, reused for every check.
    let mut mem: Vec<Block> = Vec::new();
    loop {
        let job = {
            let mut q = shared.lock();
            loop {
                if let Some(j) = q.next() {
                    break Some(j);
                }
                if q.closed {
                    break None;
                }
                q.idle += 1;
                q = shared.ready.wait(q).unwrap_or_else(PoisonError::into_inner);
                q.idle -= 1;
            }
        };
        let Some(job) = job else { break };
        let n = shared.running.fetch_add(1, Ordering::Relaxed) + 1;
        shared.peak.fetch_max(n, Ordering::Relaxed);
        let ok = check(shared, &mut mem, &job.phc, &job.password);
        shared.running.fetch_sub(1, Ordering::Relaxed);
        shared.done.fetch_add(1, Ordering::Relaxed);
        let _ = job.reply.send(ok);
    }
    let bytes = mem.len() * Block::SIZE;
    drop(mem);
    shared.held.fetch_sub(bytes, Ordering::Relaxed);
    if let Some(pool) = shared.memory.get() {
        pool.release(bytes);
    }
}

/// The argon2 check of `password` against `phc` in `mem` (grown, and charged, as needed).
fn check(shared: &Shared, mem: &mut Vec<Block>, phc: &str, password: &[u8]) -> bool {
    let Ok(h) = PasswordHash::new(phc) else {
        return false;
    };
    let (Some(salt), Some(expected)) = (h.salt, h.hash) else {
        return false;
    };
    let (Ok(alg), Ok(params)) = (Algorithm::try_from(h.algorithm), Params::try_from(&h)) else {
        return false;
    };
    let version = match h.version.map(Version::try_from) {
        None => Version::default(),
        Some(Ok(v)) => v,
        Some(Err(_)) => return false,
    };
    let mut salt_buf = [0u8; 64];
    let Ok(salt) = salt.decode_b64(&mut salt_buf) else {
        return false;
    };
    let need = params.block_count();
    if mem.len() < need {
        let more = (need - mem.len()) * Block::SIZE;
        if let Some(pool) = shared.memory.get() {
            pool.force(more);
        }
        shared.held.fetch_add(more, Ordering::Relaxed);
        mem.resize(need, Block::new());
    }
    let mut out = [0u8; 64];
    let Some(out) = out.get_mut(..expected.len()) else {
        return false;
    };
    let Some(blocks) = mem.get_mut(..need) else {
        return false;
    };
    Argon2::new(alg, version, params)
        .hash_password_into_with_memory(password, salt, &mut *out, blocks)
        .is_ok()
        && same(out, expected.as_bytes())
}

/// Equal, in a time that does not depend on where they differ.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}
