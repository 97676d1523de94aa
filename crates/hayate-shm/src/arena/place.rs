//! Where an arena's entries go, and who holds them: the one allocator of the broker's
//! fan-out (`hayate_server::fanout`) and of peer nodes' messages read in place
//! (`hayate_client::peer`), docs/shm.md, *Room, quota and copies* and *Messages read in
//! place*.
//!
//! [`Places`] keeps the live entries by place (a `BTreeMap`: an entry is freed whatever its
//! age, so one held long is a hole, not a wall), finds room by the arena's [`Fit`], names
//! each entry by a number (counted from 0) and a tag no reader can predict, and clears an
//! entry's tag when it is freed. Its user says when an entry is freed (when every reference
//! to it is released, by whatever bookkeeping of its own), and charges each holder's
//! references to a [`Held`] against the arena's quota ([`Policy::quota_share`]). A reader
//! that holds entries in place is a [`Holder`]: its release table, its process, and once it
//! has gone ([`Holder::depart`]), whether that process has exited; [`Departures`] counts
//! the holders gone and not yet let go of, at most [`MAX_DEPARTED`].

use std::collections::{BTreeMap, btree_map};
use std::hash::BuildHasher;
use std::os::fd::BorrowedFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use super::{ArenaWriter, RefState, ReleaseTable, entry_words};
use crate::announce::PeerProcess;

/// Where a new entry goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fit {
    /// The first gap large enough from the arena's start: places freed are written again
    /// soon, while still in the caches, and only as much of the arena is ever backed by
    /// memory as was held at once.
    First,
    /// The first gap large enough from where the last entry placed ended, then from the
    /// start: the arena is written round, and a search does not walk again past entries
    /// still held near its start.
    Next,
}

/// How an arena is shared out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Policy {
    /// Where entries go.
    pub fit: Fit,
    /// One holder's live references take at most `1 / quota_share` of the arena's words
    /// (each reference counts its whole entry, header and padding included).
    pub quota_share: usize,
}

/// An entry placed: its size, its names and what the arena's user keeps with it.
#[derive(Debug)]
pub struct Placed<E> {
    /// Words it takes ([`entry_words`]).
    pub words: usize,
    /// Its tag (never 0).
    pub tag: u64,
    /// Its number: entries are counted from 0, in the order placed.
    pub number: u64,
    /// The user's.
    pub data: E,
}

/// An arena's writer and its live entries by place (under its user's lock).
#[derive(Debug)]
pub struct Places<E> {
    arena: ArenaWriter,
    words: usize,
    policy: Policy,
    live: BTreeMap<usize, Placed<E>>,
    /// Where the last entry placed ended ([`Fit::Next`] searches from there).
    head: usize,
    /// The smallest entry (in words) no room was found for since the last entry was freed:
    /// one at least as large is not searched for until something is freed.
    full_for: usize,
    /// Makes tags unpredictable (a reader must not be able to write, in a payload of its
    /// own landing where a freed entry's tag was, the tag of another entry at its place).
    tags: std::collections::hash_map::RandomState,
    next_number: u64,
}

impl<E> Places<E> {
    /// The entries of `arena`, placed by `policy`.
    pub fn new(arena: ArenaWriter, policy: Policy) -> Places<E> {
        assert!(policy.quota_share > 0, "a quota share of 0");
        Places {
            words: arena.words(),
            arena,
            policy,
            live: BTreeMap::new(),
            head: 0,
            full_for: usize::MAX,
            tags: Default::default(),
            next_number: 0,
        }
    }

    /// The arena's descriptor, to hand to readers.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.arena.fd()
    }

    /// Words in the arena.
    pub fn words(&self) -> usize {
        self.words
    }

    /// The most words one holder's references may take.
    pub fn quota(&self) -> usize {
        self.words / self.policy.quota_share
    }

    /// Whether a reference to an entry of `words` words keeps `held` within its quota.
    pub fn within_quota(&self, held: &Held, words: usize) -> bool {
        held.words() + words <= self.quota()
    }

    /// The number the next entry placed gets.
    pub fn next_number(&self) -> u64 {
        self.next_number
    }

    /// A place for an entry of `words` words, if there is room (by the arena's [`Fit`]).
    /// Finding none, entries as large are not searched for again until one is freed.
    pub fn room(&mut self, words: usize) -> Option<usize> {
        if words >= self.full_for {
            return None;
        }
        let at = match self.policy.fit {
            Fit::First => self.gap_from(0, words),
            Fit::Next => self
                .gap_from(self.head, words)
                .or_else(|| self.gap_from(0, words)),
        };
        if at.is_none() {
            self.full_for = self.full_for.min(words);
        }
        at
    }

    /// The first gap of `words` words or more from word `pos` on.
    fn gap_from(&self, mut pos: usize, words: usize) -> Option<usize> {
        if let Some((&at, e)) = self.live.range(..pos).next_back() {
            pos = pos.max(at + e.words);
        }
        for (&at, e) in self.live.range(pos..) {
            if at - pos >= words {
                return Some(pos);
            }
            pos = at + e.words;
        }
        (self.words.saturating_sub(pos) >= words).then_some(pos)
    }

    /// Writes the concatenation of `parts` as a new entry at word `at` (a place
    /// [`Places::room`] gave, nothing placed since), keeping `data` with it.
    pub fn put<'a, P>(&mut self, at: usize, parts: P, data: E) -> &mut Placed<E>
    where
        P: IntoIterator<Item = &'a [u8]> + Clone,
    {
        let len: usize = parts.clone().into_iter().map(<[u8]>::len).sum();
        let words = entry_words(len);
        let number = self.next_number;
        self.next_number += 1;
        let tag = self.tags.hash_one(number).max(1);
        self.arena.put(at, tag, parts);
        self.head = at + words;
        let placed = Placed {
            words,
            tag,
            number,
            data,
        };
        match self.live.entry(at) {
            btree_map::Entry::Vacant(v) => v.insert(placed),
            // Not a place `room` gave: the entry there is written over.
            btree_map::Entry::Occupied(o) => {
                let e = o.into_mut();
                *e = placed;
                e
            }
        }
    }

    /// The live entry at word `at`.
    pub fn get(&self, at: usize) -> Option<&Placed<E>> {
        self.live.get(&at)
    }

    /// The live entry at word `at`, to change what its user keeps with it.
    pub fn get_mut(&mut self, at: usize) -> Option<&mut Placed<E>> {
        self.live.get_mut(&at)
    }

    /// Frees the entry at word `at`: its tag is cleared in the arena (a reader still
    /// holding its name reads it as stale) and its place may be written again.
    pub fn free(&mut self, at: usize) -> Option<Placed<E>> {
        let e = self.live.remove(&at)?;
        self.arena.clear(at);
        self.full_for = usize::MAX;
        Some(e)
    }

    /// The places of the live entries, in order.
    pub fn places(&self) -> impl Iterator<Item = usize> + '_ {
        self.live.keys().copied()
    }

    /// Entries live.
    pub fn len(&self) -> usize {
        self.live.len()
    }

    /// Whether no entry is live.
    pub fn is_empty(&self) -> bool {
        self.live.is_empty()
    }

    /// Bytes the live entries take (headers and padding included).
    pub fn held_bytes(&self) -> usize {
        self.live.values().map(|e| e.words * 8).sum()
    }
}

/// The arena words one holder's live references take (each counts its whole entry),
/// against its quota ([`Places::within_quota`]). Changed under the arena user's lock
/// only; an atomic so that it can live in a holder shared with other threads.
#[derive(Debug, Default)]
pub struct Held(AtomicUsize);

impl Held {
    /// Words held now.
    pub fn words(&self) -> usize {
        self.0.load(Ordering::Relaxed)
    }

    /// A reference to an entry of `words` words taken.
    pub fn add(&self, words: usize) {
        self.0.fetch_add(words, Ordering::Relaxed);
    }

    /// A reference to an entry of `words` words let go of.
    pub fn sub(&self, words: usize) {
        self.0.fetch_sub(words, Ordering::Relaxed);
    }
}

/// Holders gone and not yet let go of, past which an arena is offered to no new reader
/// that would hold entries in place (those copy instead): each keeps a release table
/// mapped and a process descriptor open in the writer.
pub const MAX_DEPARTED: usize = 64;

/// The count of an arena's holders that have gone ([`Holder::depart`]) and are not yet
/// dropped (the last entry such a holder held freed, its user drops it).
#[derive(Debug, Clone, Default)]
pub struct Departures(Arc<AtomicUsize>);

impl Departures {
    /// Holders gone and not yet dropped.
    pub fn count(&self) -> usize {
        self.0.load(Ordering::Relaxed)
    }

    /// Whether a new reader may hold entries in place: fewer than [`MAX_DEPARTED`]
    /// holders are gone and not yet let go of.
    pub fn may_hold(&self) -> bool {
        self.count() < MAX_DEPARTED
    }
}

/// A reader holding an arena's entries in place: its release table (where it says what it
/// took and released, in any order), its process (once the reader has gone, only that
/// process's exit ends what it holds: its mapping lives as long as the process), and
/// whether it has gone.
#[derive(Debug)]
pub struct Holder {
    table: ReleaseTable,
    process: PeerProcess,
    /// Gone (its connection or attachment ended): counted in `departures` until dropped.
    departed: AtomicBool,
    /// Its process was seen to have exited (for good: not looked at again).
    exited: AtomicBool,
    departures: Departures,
}

impl Holder {
    /// A holder saying what it holds in `table`, in `process`, counted in `departures`
    /// once gone.
    pub fn new(table: ReleaseTable, process: PeerProcess, departures: &Departures) -> Holder {
        Holder {
            table,
            process,
            departed: AtomicBool::new(false),
            exited: AtomicBool::new(false),
            departures: departures.clone(),
        }
    }

    /// Its reader has gone (its connection or attachment ended): what it took stays held
    /// until released or its process exits. Counted once, however often called.
    pub fn depart(&self) {
        if !self.departed.swap(true, Ordering::AcqRel) {
            self.departures.0.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Whether its reader has gone and its process has exited (a system call until it
    /// has): nothing it holds is read any more.
    pub fn gone(&self) -> bool {
        if self.exited.load(Ordering::Relaxed) {
            return true;
        }
        let gone = self.departed.load(Ordering::Acquire) && self.process.exited();
        if gone {
            self.exited.store(true, Ordering::Relaxed);
        }
        gone
    }

    /// Whether its table says reference `n` released.
    pub fn released(&self, n: u64) -> bool {
        self.table.released(n)
    }

    /// What its table says of reference `n`.
    pub fn state(&self, n: u64) -> RefState {
        self.table.state(n)
    }

    /// Whether it is done with reference `n` by its table alone: released, or taken and
    /// gone (`Some(true)`); taken and not gone (`Some(false)`); `None` when the table
    /// says nothing of it (not taken, or not yet: the writer's own protocol decides).
    pub fn done_with(&self, n: u64) -> Option<bool> {
        match self.table.state(n) {
            RefState::Released => Some(true),
            RefState::Taken => Some(self.gone()),
            RefState::Unknown => None,
        }
    }
}

impl Drop for Holder {
    fn drop(&mut self) {
        if *self.departed.get_mut() {
            self.departures.0.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeSet;

    const ARENA_WORDS: usize = 256;

    /// What the test does to the arena.
    #[derive(Debug, Clone)]
    enum Op {
        /// An entry of this many bytes for the holders of the mask (bit `i`: holder `i`).
        Place(usize, u8),
        /// Holder `i` releases the `k`-th entry it holds (modulo their number).
        Release(usize, usize),
        /// Holder `i` takes (marks) the `k`-th entry it holds.
        Take(usize, usize),
        /// Holder `i`'s reader goes.
        Depart(usize),
        /// Holder `i`'s process exits.
        Exit(usize),
    }

    fn op(holders: usize) -> impl Strategy<Value = Op> {
        prop_oneof![
            6 => (0usize..600, 1u8..(1 << holders)).prop_map(|(b, m)| Op::Place(b, m)),
            4 => (0..holders, 0usize..8).prop_map(|(i, k)| Op::Release(i, k)),
            1 => (0..holders, 0usize..8).prop_map(|(i, k)| Op::Take(i, k)),
            1 => (0..holders).prop_map(Op::Depart),
            1 => (0..holders).prop_map(Op::Exit),
        ]
    }

    /// One test holder: the table its reader writes, the writer's [`Holder`] and
    /// [`Held`], and the process it watches.
    struct Reader {
        table: ReleaseTable,
        holder: Arc<Holder>,
        held: Held,
        child: std::process::Child,
        exited: bool,
    }

    fn reader(departures: &Departures) -> Reader {
        let table = ReleaseTable::create("t").unwrap();
        let theirs = ReleaseTable::open(table.fd().try_clone_to_owned().unwrap()).unwrap();
        let child = std::process::Command::new("sleep")
            .arg("60")
            .spawn()
            .unwrap();
        let process = PeerProcess::pid(child.id()).unwrap();
        Reader {
            table,
            holder: Arc::new(Holder::new(theirs, process, departures)),
            held: Held::default(),
            child,
            exited: false,
        }
    }

    /// An entry's holders still holding it (by index), as the model has them.
    type Model = BTreeMap<usize, (usize, BTreeSet<usize>)>;

    /// Frees what every holder is done with, as a user of [`Places`] does: a reference
    /// its holder released, or took and then went with its process; `Unknown` is held.
    fn sweep(places: &mut Places<Vec<usize>>, readers: &[Reader], model: &mut Model) {
        let all: Vec<usize> = places.places().collect();
        for at in all {
            let e = places.get_mut(at).unwrap();
            let (words, n) = (e.words, e.number);
            e.data.retain(|&i| {
                let r = &readers[i];
                let done = r.holder.done_with(n) == Some(true) || r.holder.gone();
                if done {
                    r.held.sub(words);
                    model.get_mut(&at).unwrap().1.remove(&i);
                }
                !done
            });
            if e.data.is_empty() {
                places.free(at).unwrap();
                assert!(model.remove(&at).unwrap().1.is_empty());
            }
        }
    }

    /// Whether the model has a gap of `words` words anywhere.
    fn model_has_room(model: &Model, words: usize) -> bool {
        let mut pos = 0;
        for (&at, (w, _)) in model {
            if at - pos >= words {
                return true;
            }
            pos = at + w;
        }
        ARENA_WORDS - pos >= words
    }

    /// The place of the `k`-th entry holder `i` holds (modulo their number), by the model.
    fn nth_of(model: &Model, i: usize, k: usize) -> Option<usize> {
        let mine: Vec<usize> = model
            .iter()
            .filter(|(_, (_, hs))| hs.contains(&i))
            .map(|(&at, _)| at)
            .collect();
        (!mine.is_empty()).then(|| mine[k % mine.len()])
    }

    /// After each step: no two live entries overlap, each is within the arena, the model
    /// and the allocator agree on what is live and who holds it, every holder's [`Held`]
    /// is what its entries take and within its quota, and the departed are counted.
    fn check(
        places: &Places<Vec<usize>>,
        readers: &[Reader],
        model: &Model,
        departures: &Departures,
    ) {
        let mut end = 0;
        for at in places.places() {
            let e = places.get(at).unwrap();
            assert!(at >= end, "entry at {at} overlaps the one ending at {end}");
            end = at + e.words;
            assert!(end <= ARENA_WORDS);
            let (w, hs) = &model[&at];
            assert_eq!(
                (e.words, e.data.iter().copied().collect::<BTreeSet<_>>()),
                (*w, hs.clone())
            );
        }
        assert_eq!(places.len(), model.len());
        for (i, r) in readers.iter().enumerate() {
            let mine: usize = model
                .values()
                .filter(|(_, hs)| hs.contains(&i))
                .map(|(w, _)| w)
                .sum();
            assert_eq!(r.held.words(), mine, "holder {i}");
            assert!(
                r.held.words() <= places.quota(),
                "holder {i} past its quota"
            );
        }
        let gone_alive = readers
            .iter()
            .filter(|r| r.holder.departed.load(Ordering::Relaxed))
            .count();
        assert_eq!(departures.count(), gone_alive);
    }

    fn run(fit: Fit, ops: Vec<Op>) {
        const HOLDERS: usize = 3;
        let arena = ArenaWriter::create("t", ARENA_WORDS * 8).unwrap();
        let view = super::super::ArenaView::open(arena.fd().try_clone_to_owned().unwrap()).unwrap();
        let mut places: Places<Vec<usize>> = Places::new(
            arena,
            Policy {
                fit,
                quota_share: 2,
            },
        );
        let departures = Departures::default();
        let mut readers: Vec<Reader> = (0..HOLDERS).map(|_| reader(&departures)).collect();
        let mut model = Model::new();
        let mut names: BTreeMap<usize, (u64, u64, Vec<u8>)> = BTreeMap::new();
        for op in ops {
            match op {
                Op::Place(bytes, mask) => {
                    let words = entry_words(bytes);
                    let to: Vec<usize> = (0..HOLDERS)
                        .filter(|&i| {
                            mask & (1 << i) != 0
                                && !readers[i].holder.departed.load(Ordering::Relaxed)
                        })
                        .collect();
                    if to.is_empty() {
                        continue;
                    }
                    let quota = to
                        .iter()
                        .all(|&i| places.within_quota(&readers[i].held, words));
                    let mut at = quota.then(|| places.room(words)).flatten();
                    if quota && at.is_none() {
                        sweep(&mut places, &readers, &mut model);
                        at = places.room(words);
                    }
                    // Room found whenever the model has a gap: nothing freed is lost.
                    assert_eq!(
                        at.is_some(),
                        quota && model_has_room(&model, words),
                        "{words} words"
                    );
                    let Some(at) = at else { continue };
                    let payload: Vec<u8> = (0..bytes).map(|b| (b + at) as u8).collect();
                    let e = places.put(at, [&payload[..]], to.clone());
                    let (tag, number) = (e.tag, e.number);
                    assert_eq!(e.words, words);
                    for &i in &to {
                        readers[i].held.add(words);
                    }
                    model.insert(at, (words, to.into_iter().collect()));
                    names.insert(at, (tag, number, payload));
                }
                Op::Release(i, k) | Op::Take(i, k) => {
                    let Some(at) = nth_of(&model, i, k) else {
                        continue;
                    };
                    let n = places.get(at).unwrap().number;
                    if matches!(op, Op::Release(..)) {
                        readers[i].table.release(n);
                    } else {
                        readers[i].table.take(n);
                    }
                    sweep(&mut places, &readers, &mut model);
                }
                Op::Depart(i) => {
                    readers[i].holder.depart();
                    sweep(&mut places, &readers, &mut model);
                }
                Op::Exit(i) => {
                    if !readers[i].exited {
                        readers[i].child.kill().unwrap();
                        readers[i].child.wait().unwrap();
                        readers[i].exited = true;
                    }
                    sweep(&mut places, &readers, &mut model);
                }
            }
            check(&places, &readers, &model, &departures);
            // Every live entry reads back under its name.
            for (&at, (tag, _, payload)) in names.iter().filter(|(at, _)| model.contains_key(at)) {
                let mut out = Vec::new();
                view.get(at as u64 * 8, payload.len() as u64, *tag, &mut out)
                    .unwrap();
                assert_eq!(&out, payload);
            }
        }
        // Every reader gone with its process: all freed, and the whole arena is one place
        // again.
        for r in &mut readers {
            let _ = r.child.kill();
            let _ = r.child.wait();
            r.holder.depart();
        }
        sweep(&mut places, &readers, &mut model);
        assert!(places.is_empty() && model.is_empty());
        check(&places, &readers, &model, &departures);
        assert_eq!(places.room(ARENA_WORDS), Some(0));
        drop(places);
        drop(readers);
        assert_eq!(departures.count(), 0);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(48))]

        /// Random placements for three holders, releases, takes, departures and process
        /// exits against a model, first fit and next fit: no two live entries overlap,
        /// every holder stays within its quota, room is found whenever the model has a
        /// gap (nothing freed is lost), and everything is freed and reusable at the end.
        #[test]
        fn placements_never_overlap_keep_quotas_and_reuse_what_is_freed(
            next in any::<bool>(),
            ops in proptest::collection::vec(op(3), 1..80),
        ) {
            run(if next { Fit::Next } else { Fit::First }, ops);
        }
    }

    /// Tags are not the count of entries (a reader could predict them), never 0; numbers
    /// are; first fit takes the lowest gap, next fit the one after the last entry.
    #[test]
    fn first_and_next_fit_place_as_named() {
        let mk = |fit| {
            Places::<()>::new(
                ArenaWriter::create("t", 64 * 8).unwrap(),
                Policy {
                    fit,
                    quota_share: 4,
                },
            )
        };
        for fit in [Fit::First, Fit::Next] {
            let mut p = mk(fit);
            let ats: Vec<usize> = (0..4)
                .map(|_| {
                    let at = p.room(10).unwrap();
                    p.put(at, [&[0u8; 64][..]], ());
                    at
                })
                .collect();
            assert_eq!(ats, [0, 10, 20, 30]);
            assert_eq!(p.get(10).unwrap().number, 1);
            assert!(p.get(10).unwrap().tag > 1 << 20);
            p.free(0).unwrap();
            let at = p.room(10).unwrap();
            assert_eq!(at, if fit == Fit::First { 0 } else { 40 }, "{fit:?}");
            assert_eq!(p.quota(), 16);
        }
    }
}
