//! The ring through its public API: order, loss reports, limits, and hostile regions (a
//! reader given any bytes gets an error or a message, never a panic or an out-of-bounds
//! read). The model-checked interleavings are in tests/loom.rs.

#![cfg(not(loom))]
#![allow(clippy::unwrap_used)]

use std::sync::atomic::{AtomicU64, Ordering};

use hayate_shm::{LayoutError, ReadError, Reader, Ring, TooLarge, Writer, region_words};
use proptest::prelude::*;

fn region(words: usize) -> Vec<AtomicU64> {
    (0..words).map(|_| AtomicU64::new(0)).collect()
}

/// `read_append_if` shows each message's last bytes (all of a short one), copies exactly
/// the messages taken, and passes the others over without touching the buffer.
#[test]
fn a_reader_decides_on_each_message_trailer() {
    let mem = region(region_words(64, 100));
    let ring = Ring::init(&mem, 64, 100).unwrap();
    let mut w = Writer::new(ring);
    let mut r = Reader::new(Ring::attach(&mem).unwrap());
    let msgs: Vec<Vec<u8>> = (0..=100u8)
        .map(|len| (0..len).map(|i| i.wrapping_mul(7) ^ len).collect())
        .collect();
    let mut out = vec![0xEE; 3];
    for (i, m) in msgs.iter().enumerate() {
        w.publish(m).unwrap();
        let mut shown = Vec::new();
        let (n, copied) = r
            .read_append_if(&mut out, |t| {
                shown = t.to_vec();
                i % 3 != 0
            })
            .unwrap()
            .unwrap();
        assert_eq!(n, i as u64);
        assert_eq!(
            shown,
            m[m.len().saturating_sub(hayate_shm::PEEK)..],
            "message {i}"
        );
        assert_eq!(copied, i % 3 != 0);
        let mut expect = vec![0xEE; 3];
        if copied {
            expect.extend_from_slice(m);
        }
        assert_eq!(out, expect, "message {i}");
        out.truncate(3);
    }
    assert_eq!(r.read(&mut out), Ok(None));
}

#[test]
fn readers_get_every_message_in_order_one_copy_for_all() {
    let mem = region(region_words(8, 100));
    let ring = Ring::init(&mem, 8, 100).unwrap();
    let mut w = Writer::new(ring);
    let mut readers: Vec<Reader<'_>> = (0..3)
        .map(|_| Reader::new(Ring::attach(&mem).unwrap()))
        .collect();
    let mut out = Vec::new();
    for round in 0..5u8 {
        for i in 0..6u8 {
            let p = vec![round ^ i; usize::from(i) * 17];
            w.publish(&p).unwrap();
        }
        for r in &mut readers {
            for i in 0..6u8 {
                let n = r.read(&mut out).unwrap().unwrap();
                assert_eq!(n, u64::from(round) * 6 + u64::from(i));
                assert_eq!(out, vec![round ^ i; usize::from(i) * 17]);
            }
            assert_eq!(r.read(&mut out), Ok(None));
        }
    }
}

#[test]
fn a_slow_reader_is_told_how_many_it_lost_and_goes_on() {
    let mem = region(region_words(4, 8));
    let ring = Ring::init(&mem, 4, 8).unwrap();
    let mut w = Writer::new(ring);
    let mut r = Reader::new(ring);
    let mut out = Vec::new();
    for i in 0..10u64 {
        w.publish(&i.to_le_bytes()).unwrap();
    }
    assert_eq!(r.read(&mut out), Err(ReadError::Lost(6)));
    for i in 6..10u64 {
        assert_eq!(r.read(&mut out), Ok(Some(i)));
        assert_eq!(out, i.to_le_bytes());
    }
    assert_eq!(r.read(&mut out), Ok(None));
}

#[test]
fn limits_and_geometry() {
    let mem = region(region_words(2, 16));
    let ring = Ring::init(&mem, 2, 16).unwrap();
    assert_eq!(ring.max_payload(), 16);
    let mut w = Writer::new(ring);
    assert_eq!(w.publish(&[0; 17]), Err(TooLarge { len: 17, max: 16 }));
    assert!(matches!(
        Ring::init(&mem, 3, 16),
        Err(LayoutError::Geometry { .. })
    ));
    assert!(matches!(
        Ring::init(&mem, 0, 16),
        Err(LayoutError::Geometry { .. })
    ));
    let small = region(10);
    assert_eq!(Ring::attach(&small).err(), Some(LayoutError::Magic));
    // A header claiming more than the region: refused, not read past.
    mem[1].store(1000 | (1000 << 32), Ordering::Relaxed);
    assert!(matches!(
        Ring::attach(&mem),
        Err(LayoutError::Geometry { .. })
    ));
}

#[test]
fn damage_is_reported_as_corrupt() {
    let mem = region(region_words(4, 16));
    let ring = Ring::init(&mem, 4, 16).unwrap();
    let mut w = Writer::new(ring);
    let mut r = Reader::new(ring);
    w.publish(b"hello").unwrap();
    // A length past the slot.
    let len_word = hayate_shm::HEADER_WORDS + 1;
    mem[len_word].store(1 << 40, Ordering::Relaxed);
    let mut out = Vec::new();
    assert_eq!(r.read(&mut out), Err(ReadError::Corrupt));
    // A head that went backwards.
    let mut r2 = Reader::new(ring);
    mem[8].store(0, Ordering::Relaxed);
    assert_eq!(r2.read(&mut out), Err(ReadError::Corrupt));
}

proptest! {
    /// Any contents of a region: attaching either fails or gives a geometry within it, and
    /// reading never panics.
    #[test]
    fn hostile_regions_never_crash_a_reader(
        words in proptest::collection::vec(any::<u64>(), 0..256),
        magic in any::<bool>(),
        slots in 0u64..40,
        slot_words in 0u64..40,
    ) {
        let mem: Vec<AtomicU64> = words.iter().map(|&w| AtomicU64::new(w)).collect();
        if magic && mem.len() > 1 {
            mem[0].store(hayate_shm::MAGIC, Ordering::Relaxed);
            mem[1].store(slots | (slot_words << 32), Ordering::Relaxed);
        }
        if let Ok(ring) = Ring::attach(&mem) {
            prop_assert!(hayate_shm::HEADER_WORDS + ring.slots() * (ring.max_payload() / 8 + 2) <= mem.len());
            let mut r = Reader::new(ring);
            let mut out = Vec::new();
            for _ in 0..8 {
                // Moving the head around as a hostile writer would.
                let h = words.first().copied().unwrap_or(0);
                mem[8].store(if h % 2 == 0 { h % 64 } else { h }, Ordering::Relaxed);
                if let Ok(Some(_)) = r.read(&mut out) {
                    prop_assert!(out.len() <= ring.max_payload());
                }
            }
        }
    }
}

#[test]
fn the_reliable_mode_waits_for_registered_readers_only() {
    use hayate_shm::{MAX_READERS, NoCursor};
    let mem = region(region_words(4, 8));
    let ring = Ring::init(&mem, 4, 8).unwrap();
    let mut w = Writer::new(ring);
    let mut slow = Reader::register(ring).unwrap();
    let mut casual = Reader::new(ring);
    let mut out = Vec::new();
    for i in 0..4u64 {
        assert_eq!(w.try_publish(&i.to_le_bytes()), Ok(Some(i)));
    }
    // The registered reader has read nothing: a fifth would overwrite message 0.
    assert_eq!(w.try_publish(b"no"), Ok(None));
    assert_eq!(slow.read(&mut out), Ok(Some(0)));
    assert_eq!(w.try_publish(&4u64.to_le_bytes()), Ok(Some(4)));
    assert_eq!(w.try_publish(b"no"), Ok(None));
    for i in 1..5u64 {
        assert_eq!(slow.read(&mut out), Ok(Some(i)));
        assert_eq!(out, i.to_le_bytes());
    }
    // The unregistered reader was not waited for, nor did it lose anything yet.
    assert_eq!(casual.read(&mut out), Err(ReadError::Lost(1)));
    // Evicting (a dead reader) and dropping free the cursor.
    let stuck = Reader::register(ring).unwrap();
    for i in 5..9u64 {
        assert_eq!(w.try_publish(&i.to_le_bytes()), Ok(Some(i)));
    }
    assert_eq!(w.try_publish(b"no"), Ok(None));
    w.evict(stuck.cursor().unwrap());
    drop(slow);
    assert_eq!(w.try_publish(&9u64.to_le_bytes()), Ok(Some(9)));
    // The table is bounded; the evicted reader's drop leaves its old entry's new owner be.
    let all: Vec<_> = (0..MAX_READERS)
        .map(|_| Reader::register(ring).unwrap())
        .collect();
    assert_eq!(Reader::register(ring).err(), Some(NoCursor));
    drop(stuck);
    assert_eq!(Reader::register(ring).err(), Some(NoCursor));
    drop(all);
    assert!(Reader::register(ring).is_ok());
}

proptest! {
    /// A message published in parts (split anywhere, empty parts too) is read back as their
    /// concatenation; `read_append` keeps what the buffer held before it.
    #[test]
    fn parts_are_read_back_as_one_message(
        parts in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..20), 0..6),
        prefix in proptest::collection::vec(any::<u8>(), 0..10),
    ) {
        let words: Vec<AtomicU64> = (0..region_words(4, 128)).map(|_| AtomicU64::new(0)).collect();
        let ring = Ring::init(&words, 4, 128).unwrap();
        let mut r = Reader::register(ring).unwrap();
        let mut w = Writer::new(ring);
        let slices: Vec<&[u8]> = parts.iter().map(Vec::as_slice).collect();
        prop_assert_eq!(w.try_publish_parts(&slices).unwrap(), Some(0));
        let mut out = prefix.clone();
        prop_assert_eq!(r.read_append(&mut out).unwrap(), Some(0));
        let mut want = prefix;
        want.extend(parts.concat());
        prop_assert_eq!(out, want);
    }
}

/// The writer counts the room a waited-for reader leaves instead of looking at every
/// cursor on each message: it still stops exactly a ring ahead of that reader, and sees a
/// reader that read on.
#[test]
fn the_room_counted_by_the_writer_stops_it_exactly_a_ring_ahead() {
    let words: Vec<AtomicU64> = (0..region_words(4, 8)).map(|_| AtomicU64::new(0)).collect();
    let ring = Ring::init(&words, 4, 8).unwrap();
    let mut r = Reader::register(ring).unwrap();
    let mut w = Writer::new(ring);
    for i in 0..4u64 {
        assert_eq!(w.try_publish(&i.to_le_bytes()).unwrap(), Some(i));
    }
    assert_eq!(w.try_publish(b"x").unwrap(), None);
    let mut out = Vec::new();
    assert_eq!(r.read(&mut out).unwrap(), Some(0));
    assert_eq!(w.try_publish(&4u64.to_le_bytes()).unwrap(), Some(4));
    assert_eq!(w.try_publish(b"x").unwrap(), None);
    // A second reader registering now starts at the head: the writer waits for both.
    let mut late = Reader::register(ring).unwrap();
    for want in 1..=4u64 {
        assert_eq!(r.read(&mut out).unwrap(), Some(want));
    }
    assert_eq!(w.try_publish(&5u64.to_le_bytes()).unwrap(), Some(5));
    assert_eq!(late.read(&mut out).unwrap(), Some(5));
    assert_eq!(out, 5u64.to_le_bytes());
}

/// Best-effort registered readers (not waited for), the wake-up words, and deferred
/// commits.
#[test]
fn no_wait_readers_wake_ups_and_deferred_commits() {
    let words: Vec<AtomicU64> = (0..region_words(4, 8)).map(|_| AtomicU64::new(0)).collect();
    let ring = Ring::init(&words, 4, 8).unwrap();
    let mut w = Writer::new(ring);

    // A reader the writer does not wait for: it loses what it did not read in time.
    let mut lazy = Reader::register_with(ring, false).unwrap();
    assert!(!lazy.waited_for());
    for i in 0..6u64 {
        assert_eq!(w.try_publish(&i.to_le_bytes()).unwrap(), Some(i));
    }
    let mut out = Vec::new();
    assert_eq!(lazy.read(&mut out), Err(ReadError::Lost(2)));
    for want in 2..6u64 {
        assert_eq!(lazy.read(&mut out).unwrap(), Some(want));
    }
    // Made a waited-for reader once caught up (the writer may still use the room it
    // counted before; from the head on, that overwrites nothing unread): the writer stops a
    // ring ahead of it.
    assert!(lazy.set_waited_for(true));
    assert!(lazy.waited_for());
    for i in 6..10u64 {
        assert_eq!(w.try_publish(&i.to_le_bytes()).unwrap(), Some(i));
    }
    assert_eq!(w.try_publish(b"x").unwrap(), None);

    // The writer waits: the reader that reads on says so once.
    w.prepare_wait();
    assert_eq!(lazy.read(&mut out).unwrap(), Some(6));
    assert!(lazy.writer_waits());
    assert!(!lazy.writer_waits());

    // Deferred: reading does not move the cursor; commit does.
    lazy.set_deferred(true);
    assert_eq!(lazy.read(&mut out).unwrap(), Some(7));
    assert_eq!(
        w.try_publish(b"x").unwrap(),
        Some(10),
        "room for one, from the read of 6"
    );
    assert_eq!(
        w.try_publish(b"x").unwrap(),
        None,
        "7 is read but not committed"
    );
    assert!(lazy.commit());
    assert_eq!(w.try_publish(b"x").unwrap(), Some(11));

    // Sleeping: nothing new means sleep and the writer learns of it after publishing;
    // something new means read on.
    for want in 8..12u64 {
        assert_eq!(lazy.read(&mut out).unwrap(), Some(want));
    }
    assert!(lazy.commit());
    assert!(lazy.prepare_sleep(), "nothing new: sleep");
    assert_eq!(w.sleepers(), 1 << lazy.cursor().unwrap());
    assert_eq!(w.sleepers(), 0, "taken down by the writer");
    lazy.end_sleep();
    w.publish(b"y").unwrap();
    assert!(!lazy.prepare_sleep(), "something new: read on");
    assert_eq!(w.sleepers(), 0);
    // An unregistered reader cannot sleep (no entry to name it).
    assert!(!Reader::new(ring).prepare_sleep());
}

/// Waking only the readers a message is for: the others keep their sleeping bits until the
/// writer takes them all (as it does before it waits for room).
#[test]
fn sleepers_among_wakes_only_the_readers_named() {
    let words: Vec<AtomicU64> = (0..region_words(4, 8)).map(|_| AtomicU64::new(0)).collect();
    let ring = Ring::init(&words, 4, 8).unwrap();
    let w = Writer::new(ring);
    let a = Reader::register(ring).unwrap();
    let b = Reader::register(ring).unwrap();
    let (ba, bb) = (1 << a.cursor().unwrap(), 1 << b.cursor().unwrap());
    assert!(a.prepare_sleep() && b.prepare_sleep());
    assert_eq!(w.sleepers_among(ba), ba, "a is woken");
    assert_eq!(w.sleepers_among(ba), 0, "once");
    assert_eq!(w.sleepers(), bb, "b slept on until everyone was taken");
    assert_eq!(ring.take_sleepers(u64::MAX), 0);
}

/// A writer lapping its reader on another thread, as fast as it goes: every message the
/// reader gets is whole (its length and every byte are what message `n` was published
/// with), and every other one is counted lost. The copies in and out are `memcpy`s that
/// race (`segment::copy_in`, `copy_out`): the sequence lock must throw every torn one away.
#[test]
fn a_reader_racing_its_writer_gets_whole_messages_or_counts_them_lost() {
    const SLOTS: usize = 4;
    const MAX: usize = 4096;
    const N: u64 = 200_000;
    let len_of = |n: u64| (n as usize * 613) % MAX + 1;
    let mem = region(region_words(SLOTS, MAX));
    let ring = Ring::init(&mem, SLOTS, MAX).unwrap();
    let mut r = Reader::new(ring);
    std::thread::scope(|s| {
        s.spawn(|| {
            let mut w = Writer::new(ring);
            let mut buf = vec![0u8; MAX];
            for n in 0..N {
                let len = len_of(n);
                buf[..len].fill(n as u8);
                // Two parts, split unevenly, so both ends of a part meet a word's middle.
                let cut = len / 3;
                w.publish_parts(&[&buf[..cut], &buf[cut..len]]).unwrap();
            }
        });
        let (mut whole, mut lost, mut torn_caught) = (0u64, 0u64, 0u64);
        let mut out = Vec::new();
        while whole + lost < N {
            match r.read(&mut out) {
                Ok(Some(n)) => {
                    assert_eq!(out.len(), len_of(n), "message {n}: length");
                    assert!(out.iter().all(|b| *b == n as u8), "message {n}: torn bytes");
                    whole += 1;
                }
                Ok(None) => std::hint::spin_loop(),
                Err(ReadError::Lost(k)) => {
                    lost += k;
                    torn_caught += 1;
                }
                Err(e) => panic!("{e:?}"),
            }
        }
        assert_eq!(whole + lost, N);
        eprintln!("{whole} read whole, {lost} lost ({torn_caught} reports)");
    });
}
