//! Large messages read in place (docs/shm.md, *Messages read in place*): a writing node puts
//! each frame larger than a slot once into an arena of its own (a sealed memfd the local
//! nodes reading its ring map read-only), and writes into the ring only a reference to it.
//! The reading nodes decode the frame where it lies, and their subscribers get payloads
//! that are slices of the arena: no copy on the reading side, whatever their number.
//!
//! The writer writes a place again only when every node the reference was for is done
//! with it: each such node says so in its release table (`ReleaseTable`, a memfd it writes
//! and the writer maps), marking a reference taken before it reads it and released when
//! the last `Bytes` of it is dropped. A reference a node never took (lost by a best-effort
//! node a ring behind, or sent just as it was evicted) is freed once that node's cursor is
//! past it. A node that took references and then went (evicted, its link closed) holds
//! them until it releases them or its process exits. Nobody waits for the arena: a message
//! that finds no room is copied through the ring, as before.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{Ordering, fence};

use hayate_shm::SharedRing;
use hayate_shm::announce::PeerProcess;
use hayate_shm::arena::{
    ArenaWriter, Departures, Fit, Held, Holder as InPlaceHolder, Places, Policy, RELEASE_SLOTS,
    ReleaseTable, entry_words,
};

/// Bytes of a reference in the ring: the entry's byte offset, length and tag, and the
/// reference's number, each a `u64` little-endian.
pub(super) const REF_BYTES: usize = 32;

/// How peer nodes place entries: first fit (places freed are written again soon, while
/// still in the caches: next fit through the whole arena measured half as fast, docs/shm.md,
/// *Messages read in place*), and a node's quota a half of the arena (a message goes to
/// every local node reading in place, each counting the whole entry: what one node that
/// keeps messages can take from the others).
const POLICY: Policy = Policy {
    fit: Fit::First,
    quota_share: 2,
};

/// A node reading this node's ring that reads references in place.
#[derive(Debug)]
pub(super) struct Holder {
    /// Its cursor entry (the bit of the ring messages' masks) while attached.
    entry: usize,
    /// Its release table and process, and whether it has gone (evicted, its attachment
    /// ended: references it took are held until released or its process exits).
    holder: InPlaceHolder,
    /// Arena words its live references hold (each counts the whole entry): at most a
    /// half of the arena (`POLICY`).
    held: Held,
}

impl Holder {
    pub(super) fn new(
        entry: usize,
        table: ReleaseTable,
        process: PeerProcess,
        departures: &Departures,
    ) -> Holder {
        Holder {
            entry,
            holder: InPlaceHolder::new(table, process, departures),
            held: Held::default(),
        }
    }

    /// Its node has gone (evicted, or the attachment ended).
    pub(super) fn depart(&self) {
        self.holder.depart();
    }

    /// Whether this node is done with the entry numbered `number`, whose reference is
    /// before ring position `pos`: released it, never took it and never will (its cursor
    /// is past the reference, or it was evicted), or took it and its process has exited
    /// since it departed.
    fn done_with(&self, number: u64, pos: u64, ring: &SharedRing) -> bool {
        if let Some(done) = self.holder.done_with(number) {
            return done;
        }
        // Its cursor past the reference (acquire: what it marked before committing is seen
        // below), or its cursor entry freed (evicted).
        if !ring.has_read(self.entry, pos) {
            return false;
        }
        // A node evicted just now may be taking it: it marks it taken, then (after a fence)
        // checks it is still registered (`SharedReader::registered`). The eviction came
        // before this look at the cursor, and this fence before the second look at the
        // mark: one of the two sides sees the other's store.
        fence(Ordering::SeqCst);
        self.holder.done_with(number).unwrap_or(true)
    }
}

/// What is kept with an entry written and not yet done with by every node it was for.
#[derive(Debug)]
struct Live {
    /// The ring position after the reference's ring message: a node whose cursor is there
    /// has read (or lost) it.
    pos: u64,
    /// The nodes it was for that may still hold it.
    holders: Vec<Arc<Holder>>,
}

/// Where a reference points: the entry's byte offset, length and tag, and its number.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Ref {
    pub at: u64,
    pub len: u64,
    pub tag: u64,
    pub number: u64,
}

impl Ref {
    pub(super) fn encode(&self) -> [u8; REF_BYTES] {
        let mut b = [0u8; REF_BYTES];
        for (i, v) in [self.at, self.len, self.tag, self.number]
            .iter()
            .enumerate()
        {
            b[i * 8..i * 8 + 8].copy_from_slice(&v.to_le_bytes());
        }
        b
    }

    pub(super) fn decode(b: &[u8]) -> Option<Ref> {
        if b.len() != REF_BYTES {
            return None;
        }
        let w = |i: usize| {
            let mut x = [0u8; 8];
            x.copy_from_slice(&b[i * 8..i * 8 + 8]);
            u64::from_le_bytes(x)
        };
        Some(Ref {
            at: w(0),
            len: w(1),
            tag: w(2),
            number: w(3),
        })
    }
}

/// A writing node's arena and its live entries (under the writer's lock).
#[derive(Debug)]
pub(super) struct Arena {
    /// Live entries by place (`hayate_shm::arena::Places`): an entry is freed whatever its
    /// age (a node holding an old one leaves a hole, not a wall). An entry's number is its
    /// reference's.
    places: Places<Live>,
    /// Live entries by number: the oldest must be less than a table's slots behind the
    /// next (two live references never share a slot of a release table).
    numbers: BTreeMap<u64, usize>,
}

impl Arena {
    /// A new arena of `bytes` bytes for node `id`.
    pub(super) fn new(id: u64, bytes: usize) -> Result<Arena, hayate_shm::segment::SegmentError> {
        let arena = ArenaWriter::create(&format!("hayate-peer-arena-{id:016x}"), bytes)?;
        Ok(Arena {
            places: Places::new(arena, POLICY),
            numbers: BTreeMap::new(),
        })
    }

    /// The descriptor to hand to reading nodes.
    pub(super) fn fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.places.fd()
    }

    /// Writes `parts` as an entry for `holders`, whose reference will be the ring message
    /// at position `pos - 1`: its reference, or `None` (no room, a holder at its quota, or
    /// too many references live) and the message is to be copied through the ring.
    pub(super) fn put(
        &mut self,
        parts: &[&[u8]],
        holders: Vec<Arc<Holder>>,
        pos: u64,
        ring: &SharedRing,
    ) -> Option<Ref> {
        let len: usize = parts.iter().map(|p| p.len()).sum();
        let words = entry_words(len);
        if words > self.places.quota() {
            return None; // never fits
        }
        // What readers released in order, freed at once: the places written stay few and
        // warm in the caches (a search for room starts at the arena's start).
        self.free_oldest(ring);
        let fits = |s: &mut Arena| {
            let next = s.places.next_number();
            let room = holders
                .iter()
                .all(|h| s.places.within_quota(&h.held, words))
                && s.numbers
                    .first_key_value()
                    .is_none_or(|(&n, _)| next - n < RELEASE_SLOTS as u64);
            room.then(|| s.places.room(words)).flatten()
        };
        let at = match fits(self) {
            Some(at) => at,
            None => {
                self.reclaim(ring);
                fits(self)?
            }
        };
        for h in &holders {
            h.held.add(words);
        }
        let e = self
            .places
            .put(at, parts.iter().copied(), Live { pos, holders });
        let (tag, number) = (e.tag, e.number);
        self.numbers.insert(number, at);
        Some(Ref {
            at: at as u64 * 8,
            len: len as u64,
            tag,
            number,
        })
    }

    /// Frees the oldest entries while every node is done with them (the common case: a
    /// reader that keeps up releases in order); stops at the first one still held.
    fn free_oldest(&mut self, ring: &SharedRing) {
        while let Some((_, &at)) = self.numbers.first_key_value()
            && self.settle(at, ring)
        {
            self.free(at);
        }
    }

    /// Drops from entry `at` the nodes done with it: whether none is left.
    fn settle(&mut self, at: usize, ring: &SharedRing) -> bool {
        let Some(e) = self.places.get_mut(at) else {
            return false;
        };
        let (words, number, pos) = (e.words, e.number, e.data.pos);
        e.data.holders.retain(|h| {
            let done = h.done_with(number, pos, ring);
            if done {
                h.held.sub(words);
            }
            !done
        });
        e.data.holders.is_empty()
    }

    fn free(&mut self, at: usize) {
        if let Some(e) = self.places.free(at) {
            self.numbers.remove(&e.number);
        }
    }

    /// Frees every entry that all its nodes are done with.
    pub(super) fn reclaim(&mut self, ring: &SharedRing) {
        let places: Vec<usize> = self.places.places().collect();
        for at in places {
            if self.settle(at, ring) {
                self.free(at);
            }
        }
    }

    /// Entries live now, and the bytes they take (headers and padding included).
    pub(super) fn held(&self) -> (usize, usize) {
        (self.places.len(), self.places.held_bytes())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hayate_shm::segment::Segment;
    use hayate_shm::{SharedReader, SharedWriter};

    fn ring() -> SharedRing {
        let words = hayate_shm::region_words(8, 64);
        SharedRing::init(Segment::create("t", words * 8).unwrap(), 8, 64).unwrap()
    }

    /// Departed nodes are counted once from their departure until their holder is let go
    /// of (past `hayate_shm::arena::MAX_DEPARTED` of them the arena is offered to no new node); nodes that
    /// never departed are not.
    #[test]
    fn departed_nodes_are_counted_until_let_go() {
        let count = Departures::default();
        let make = || {
            let table = ReleaseTable::create("t").unwrap();
            let process = PeerProcess::pid(std::process::id()).unwrap();
            Arc::new(Holder::new(0, table, process, &count))
        };
        let h = make();
        let in_an_entry = h.clone();
        h.depart();
        h.depart();
        assert_eq!(count.count(), 1);
        drop(h);
        assert_eq!(count.count(), 1, "still held by an entry");
        drop(in_an_entry);
        assert_eq!(count.count(), 0);
        drop(make());
        assert_eq!(count.count(), 0);
    }

    /// A holder at cursor `entry`, and the table its node writes.
    fn holder(entry: usize) -> (Arc<Holder>, ReleaseTable) {
        let table = ReleaseTable::create("t").unwrap();
        let theirs = ReleaseTable::open(table.fd().try_clone_to_owned().unwrap()).unwrap();
        let process = PeerProcess::pid(std::process::id()).unwrap();
        let h = Arc::new(Holder::new(entry, theirs, process, &Departures::default()));
        (h, table)
    }

    /// An entry stays until its node releases it; one its node never took is freed once
    /// the node's cursor is past its reference, not before; one taken by a node that then
    /// departed stays while its process lives.
    #[test]
    fn entries_are_freed_by_release_by_a_cursor_past_them_or_never_while_held() {
        let ring = ring();
        let mut reader = SharedReader::register(ring.clone(), true).unwrap();
        let mut w = SharedWriter::new(ring.clone());
        let (h, table) = holder(reader.cursor().unwrap());
        // An arena of 64 words: half (the quota) holds one 17-word entry at a time.
        let mut a = Arena::new(1, 64 * 8).unwrap();
        let pos = ring.head() + 1;
        let r0 = a.put(&[&[1u8; 120]], vec![h.clone()], pos, &ring).unwrap();
        assert_eq!(r0.number, 0);
        assert!(
            a.put(&[&[2u8; 120]], vec![h.clone()], pos, &ring).is_none(),
            "quota"
        );
        // Released: freed at the next need of room.
        table.release(0);
        let r1 = a
            .put(&[&[3u8; 120]], vec![h.clone()], pos + 1, &ring)
            .unwrap();
        assert_eq!(a.held().0, 1);
        // Not taken, and the node has not read that far: held.
        assert!(a.put(&[&[4u8; 120]], vec![h.clone()], pos, &ring).is_none());
        // The reference's ring message, read and committed without taking it: freed.
        w.publish(b"ref").unwrap();
        w.publish(b"ref").unwrap();
        let mut buf = Vec::new();
        while reader.read(&mut buf).unwrap().is_some() {}
        reader.commit();
        let r2 = a
            .put(&[&[5u8; 120]], vec![h.clone()], ring.head() + 1, &ring)
            .unwrap();
        assert_ne!(r1.number, r2.number);
        // Taken, then the node departs: held while its process (this one) lives.
        table.take(r2.number);
        w.publish(b"ref").unwrap();
        while reader.read(&mut buf).unwrap().is_some() {}
        reader.commit();
        h.depart();
        assert!(
            a.put(&[&[6u8; 120]], vec![h.clone()], ring.head() + 1, &ring)
                .is_none()
        );
        table.release(r2.number);
        assert!(
            a.put(&[&[6u8; 120]], vec![h.clone()], ring.head() + 1, &ring)
                .is_some()
        );
    }

    /// An evicted node that took nothing holds nothing.
    #[test]
    fn an_evicted_node_s_untaken_entries_are_freed() {
        let ring = ring();
        let reader = SharedReader::register(ring.clone(), true).unwrap();
        let (h, _table) = holder(reader.cursor().unwrap());
        let mut a = Arena::new(1, 64 * 8).unwrap();
        a.put(&[&[1u8; 120]], vec![h.clone()], ring.head() + 5, &ring)
            .unwrap();
        assert!(
            a.put(&[&[1u8; 120]], vec![h.clone()], ring.head() + 5, &ring)
                .is_none()
        );
        ring.evict(h.entry);
        h.depart();
        assert!(
            a.put(&[&[1u8; 120]], vec![h.clone()], ring.head() + 5, &ring)
                .is_some()
        );
    }

    #[test]
    fn a_reference_reads_back() {
        let r = Ref {
            at: 8,
            len: u64::MAX,
            tag: 3,
            number: 1 << 40,
        };
        assert_eq!(Ref::decode(&r.encode()), Some(r));
        assert_eq!(Ref::decode(&r.encode()[..31]), None);
    }
}
