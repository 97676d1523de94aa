//! Every interleaving of one writer and one reader (loom): a message the reader accepts is
//! exactly the one published under that number (never torn), numbers only go up, and
//! what it does not get it is told it lost. Two slots, three messages of two words: the
//! writer laps the reader in some interleavings. Removing either fence of the sequence lock,
//! or the reader's second look at `seq`, makes it fail (checked when written). Run with
//! `RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target/loom cargo test -p hayate-shm --test loom
//! --release` (scripts/test-all does).

#![cfg(loom)]
#![allow(clippy::unwrap_used)]

use hayate_shm::{ReadError, Reader, Ring, Writer, region_words};
use loom::sync::Arc;
use loom::sync::atomic::AtomicU64;

fn payload(n: u64) -> Vec<u8> {
    // Two words, so a torn copy can mix two messages.
    let mut p = n.to_le_bytes().to_vec();
    p.extend_from_slice(&(!n).to_le_bytes());
    p
}

#[test]
fn a_reader_never_accepts_a_torn_message() {
    static RUNS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    loom::model(|| {
        RUNS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let words = region_words(2, 16);
        let mem: Arc<Vec<AtomicU64>> = Arc::new((0..words).map(|_| AtomicU64::new(0)).collect());
        Ring::init(&mem, 2, 16).unwrap();
        let mut r = Reader::new(Ring::attach(&mem).unwrap());
        let m2 = mem.clone();
        let writer = loom::thread::spawn(move || {
            let mut w = Writer::new(Ring::attach(&m2).unwrap());
            for n in 0..3 {
                w.publish(&payload(n)).unwrap();
            }
        });

        let mut out = Vec::new();
        let mut seen = 0u64;
        let mut accounted = 0u64;
        // Until every message is read or reported lost; the yield lets the writer run (a
        // reader that finds nothing waits, in the transport, for the writer's wake-up).
        while accounted < 3 {
            match r.read(&mut out) {
                Ok(Some(n)) => {
                    assert_eq!(out, payload(n), "torn or misnumbered message {n}");
                    assert!(n >= seen);
                    seen = n + 1;
                    accounted += 1;
                }
                Ok(None) => loom::thread::yield_now(),
                Err(ReadError::Lost(k)) => accounted += k,
                Err(ReadError::Corrupt) => {
                    panic!("a well-behaved writer made the ring look corrupt")
                }
            }
            assert_eq!(
                accounted,
                r.position(),
                "every message is read or reported lost"
            );
        }
        writer.join().unwrap();
    });
    let runs = RUNS.load(std::sync::atomic::Ordering::Relaxed);
    eprintln!("loom: {runs} interleavings");
    // The model must branch (it did 1,358,884 times when written): a change that made it
    // run once would pass without checking anything.
    assert!(runs > 1000, "loom explored only {runs} interleavings");
}

#[test]
fn loom_sanity_finds_a_lost_update() {
    let r = std::panic::catch_unwind(|| {
        loom::model(|| {
            let a = Arc::new(AtomicU64::new(0));
            let b = a.clone();
            let t = loom::thread::spawn(move || {
                let v = b.load(std::sync::atomic::Ordering::SeqCst);
                b.store(v + 1, std::sync::atomic::Ordering::SeqCst);
            });
            let v = a.load(std::sync::atomic::Ordering::SeqCst);
            a.store(v + 1, std::sync::atomic::Ordering::SeqCst);
            t.join().unwrap();
            assert_eq!(a.load(std::sync::atomic::Ordering::SeqCst), 2);
        });
    });
    assert!(r.is_err(), "loom did not explore the interleavings");
}

/// The reliable mode: a registered reader gets every message, never a loss, while the writer
/// (2 slots, 3 messages) waits whenever the next one would overwrite what it has not read.
/// (4 messages took 181 s; 3 make the writer wait too.) Fails if the writer's check is off
/// by one (checked when written).
#[test]
fn a_registered_reader_loses_nothing() {
    loom::model(|| {
        let words = region_words(2, 16);
        let mem: Arc<Vec<AtomicU64>> = Arc::new((0..words).map(|_| AtomicU64::new(0)).collect());
        Ring::init(&mem, 2, 16).unwrap();
        let mut r = Reader::register(Ring::attach(&mem).unwrap()).unwrap();
        let m2 = mem.clone();
        let writer = loom::thread::spawn(move || {
            let mut w = Writer::new(Ring::attach(&m2).unwrap());
            let mut n = 0;
            while n < 3 {
                match w.try_publish(&payload(n)).unwrap() {
                    Some(_) => n += 1,
                    None => loom::thread::yield_now(),
                }
            }
        });
        let mut out = Vec::new();
        let mut next = 0;
        while next < 3 {
            match r.read(&mut out) {
                Ok(Some(n)) => {
                    assert_eq!(n, next);
                    assert_eq!(out, payload(n));
                    next += 1;
                }
                Ok(None) => loom::thread::yield_now(),
                Err(e) => panic!("a registered reader got {e}"),
            }
        }
        writer.join().unwrap();
    });
}
