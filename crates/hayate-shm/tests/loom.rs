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

/// Reports how many interleavings a model ran and checks there were more than `at_least`:
/// a change that made a model run once would otherwise pass without checking anything.
fn explored(runs: &std::sync::atomic::AtomicUsize, at_least: usize) {
    let runs = runs.load(std::sync::atomic::Ordering::Relaxed);
    eprintln!("loom: {runs} interleavings");
    assert!(runs > at_least, "loom explored only {runs} interleavings");
}

fn payload(n: u64) -> Vec<u8> {
    // Two words, so a torn copy can mix two messages.
    let mut p = n.to_le_bytes().to_vec();
    p.extend_from_slice(&(!n).to_le_bytes());
    p
}

/// A ring of two slots of 16 bytes, a writer thread publishing messages 0, 1 and 2
/// (`payload`), so it laps a reader that lags, and `read` run on a reader of it.
fn lapping_writer(read: impl FnOnce(&mut Reader<'_>)) {
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
    read(&mut r);
    writer.join().unwrap();
}

#[test]
fn a_reader_never_accepts_a_torn_message() {
    static RUNS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    loom::model(|| {
        RUNS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        lapping_writer(|r| {
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
        });
    });
    // It ran 1,358,884 interleavings when written.
    explored(&RUNS, 1000);
}

/// A reader that passes over some messages unread (`read_append_if`): whenever a read
/// returns `Ok`, the bytes it showed the decision were the intact message, a declined message
/// was not copied, and a taken one was copied whole.
#[test]
fn a_reader_that_skips_decides_on_intact_bytes() {
    static RUNS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    // Bounded to 2 preemptions (the whole space took 411 s): enough to tear a read, and
    // it fails when a declined message skips the second look at `seq` (checked when
    // written).
    let mut model = loom::model::Builder::new();
    model.preemption_bound = Some(2);
    model.check(|| {
        RUNS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        lapping_writer(|r| {
            let mut out = Vec::new();
            let mut accounted = 0u64;
            while accounted < 3 {
                out.clear();
                let mut shown = Vec::new();
                // Takes the odd-numbered messages, as the bytes shown say: message 0, which
                // message 2 overwrites when the writer laps the reader, is declined.
                let res = r.read_append_if(&mut out, |p| {
                    shown = p.to_vec();
                    p.len() >= 8 && u64::from_le_bytes(p[..8].try_into().unwrap()) % 2 == 1
                });
                match res {
                    Ok(Some((n, copied))) => {
                        assert_eq!(shown, payload(n), "decided on torn bytes for {n}");
                        assert_eq!(copied, n % 2 == 1);
                        if copied {
                            assert_eq!(out, payload(n), "torn message {n}");
                        } else {
                            assert!(out.is_empty(), "a declined message was copied");
                        }
                        accounted += 1;
                    }
                    Ok(None) => loom::thread::yield_now(),
                    Err(ReadError::Lost(k)) => accounted += k,
                    Err(ReadError::Corrupt) => {
                        panic!("a well-behaved writer made the ring look corrupt")
                    }
                }
                assert_eq!(accounted, r.position());
            }
        });
    });
    explored(&RUNS, 1000);
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

/// Wake-ups, both ways, in every interleaving: a reader that decides to sleep (nothing new
/// when it looked) is in the sleepers the writer takes after its next publication, and a
/// writer that flagged itself waiting is seen by a reader that reads on (commits) after it
/// looked at the cursors. A lost wake-up would leave a process asleep with work to do. 22
/// interleavings. Fails when `sleepers` is a plain load instead of the read-modify-write
/// (checked when written). Removing the writer's fence in `prepare_wait` did *not* make it
/// fail: loom does not produce that store-buffering reordering, so the writer's side rests
/// on the argument in docs/shm.md (a SeqCst fence on each side), not on this model.
#[test]
fn no_wake_up_is_lost() {
    use loom::sync::atomic::AtomicBool;
    use std::sync::atomic::Ordering::SeqCst;
    static RUNS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    loom::model(|| {
        RUNS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let words = region_words(1, 8);
        let mem: Arc<Vec<AtomicU64>> = Arc::new((0..words).map(|_| AtomicU64::new(0)).collect());
        Ring::init(&mem, 1, 8).unwrap();
        let mut r = Reader::register(Ring::attach(&mem).unwrap()).unwrap();
        let bell = Arc::new(AtomicBool::new(false));
        let writer_bell = Arc::new(AtomicBool::new(false));
        let (m2, b2) = (mem.clone(), bell.clone());
        let writer = loom::thread::spawn(move || {
            let mut w = Writer::new(Ring::attach(&m2).unwrap());
            w.publish(b"one").unwrap();
            if w.sleepers() != 0 {
                b2.store(true, SeqCst);
            }
            // One slot, unread: the writer must wait for the reader.
            if w.try_publish(b"two").unwrap().is_none() {
                w.prepare_wait();
                if w.try_publish(b"two").unwrap().is_none() {
                    // It sleeps: some reader must ring, or it sleeps forever.
                    return true;
                }
            }
            false
        });
        let mut out = Vec::new();
        let mut slept = false;
        let mut read = 0;
        if r.read(&mut out).unwrap().is_some() {
            read += 1;
        } else if r.prepare_sleep() {
            slept = true;
        }
        let rang_writer = if read == 1 { r.writer_waits() } else { false };
        if rang_writer {
            writer_bell.store(true, SeqCst);
        }
        let writer_slept = writer.join().unwrap();
        if slept {
            assert!(
                bell.load(SeqCst),
                "the reader slept with a message published and nobody rang"
            );
        }
        if writer_slept && read == 1 {
            assert!(
                writer_bell.load(SeqCst),
                "the writer slept although the reader had read on, and nobody rang"
            );
        }
    });
    explored(&RUNS, 10);
}

/// The end of a byte stream (hayate-io's shared-memory transport): a reader that sees the
/// ring closed and then finds nothing new has read every message published before the close
/// (what it reads after seeing the flag is complete). Fails if `close` or `closed` were
/// relaxed (the reader could see the flag and miss the last message).
#[test]
fn nothing_is_missed_at_the_close() {
    static RUNS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    loom::model(|| {
        RUNS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let words = region_words(2, 8);
        let mem: Arc<Vec<AtomicU64>> = Arc::new((0..words).map(|_| AtomicU64::new(0)).collect());
        Ring::init(&mem, 2, 8).unwrap();
        let mut r = Reader::register(Ring::attach(&mem).unwrap()).unwrap();
        let m2 = mem.clone();
        let writer = loom::thread::spawn(move || {
            let mut w = Writer::new(Ring::attach(&m2).unwrap());
            w.publish(b"one").unwrap();
            w.publish(b"two").unwrap();
            w.close();
        });
        let ring = Ring::attach(&mem).unwrap();
        let mut out = Vec::new();
        let mut got = 0;
        // The transport's loop: read; when nothing, look at the flag; after seeing it, one
        // more read, then the end.
        let mut last_look = false;
        loop {
            match r.read(&mut out).unwrap() {
                Some(_) => got += 1,
                None if last_look => break,
                None if ring.closed() => last_look = true,
                None => loom::thread::yield_now(),
            }
        }
        writer.join().unwrap();
        assert_eq!(got, 2, "the reader ended before the last message");
    });
    explored(&RUNS, 5);
}
