//! An arena: a segment one process writes and others read, holding entries at places the
//! writer chooses and tells the readers about by other means (the broker's fan-out: one copy
//! of a message for all of its local subscribers, docs/shm.md, *Fan-out*).
//!
//! The writer ([`ArenaWriter`]) makes the segment sealed against writing by anyone else
//! ([`Segment::create_for_readers`]); readers ([`ArenaView`]) map it read-only, so no
//! reader can change what the others read. Where entries go, when a place may be written
//! again and how readers learn of entries is the writer's business: the arena only
//! writes and reads an entry, checked.
//!
//! An entry at word `w` is `tag` (never 0), `len` (bytes), then the bytes, padded to whole
//! words. A reader is told `(w * 8, len, tag)` and checks all of it: within the segment, the
//! same tag and length in the entry before and after the copy (an acquire fence between),
//! so a place written again while it copied is an error, never torn data taken as good.
//!
//! [`Places`] (`place.rs`) is the one allocator over an [`ArenaWriter`]: where entries go,
//! their tags and numbers, holders' quotas, and holders that have gone.

use std::os::fd::{BorrowedFd, OwnedFd};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering, fence};

use crate::segment::{Segment, SegmentError};
use crate::{ReadBuf, load_bytes, store_bytes};

mod place;

pub use place::{Departures, Fit, Held, Holder, MAX_DEPARTED, Placed, Places, Policy};

/// Words of an entry before its bytes (`tag`, `len`).
pub const ENTRY_HEADER_WORDS: usize = 2;

/// Words an entry of `len` bytes takes.
pub fn entry_words(len: usize) -> usize {
    ENTRY_HEADER_WORDS + len.div_ceil(8)
}

/// Why an entry could not be read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum EntryError {
    /// The place is not a whole word, or the entry would end past the segment.
    #[error("arena entry at byte {at} of {len} bytes is outside the arena")]
    OutOfBounds {
        /// Byte offset given.
        at: u64,
        /// Length given.
        len: u64,
    },
    /// The place holds another entry (not written yet, or written again since).
    #[error("arena entry at byte {0} is not the one named (overwritten or never written)")]
    Stale(u64),
}

/// The writing side of an arena.
#[derive(Debug)]
pub struct ArenaWriter {
    segment: Segment,
}

impl ArenaWriter {
    /// A new arena of `bytes` bytes (rounded up to whole words) in a fresh segment named
    /// `name`. Fails on a kernel without `F_SEAL_FUTURE_WRITE` (before 5.1).
    pub fn create(name: &str, bytes: usize) -> Result<ArenaWriter, SegmentError> {
        Ok(ArenaWriter {
            segment: Segment::create_for_readers(name, bytes)?,
        })
    }

    /// Words in the arena.
    pub fn words(&self) -> usize {
        self.segment.words().len()
    }

    /// The descriptor to hand to readers.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.segment.fd()
    }

    /// Ends the entry at word `at`: its tag becomes 0, so a reader still holding its name
    /// gets [`EntryError::Stale`], and one copying it now sees the change after its copy.
    /// Call it for every entry the next [`ArenaWriter::put`]s overlap, before them.
    pub fn clear(&self, at: usize) {
        self.segment.words()[at].store(0, Ordering::Relaxed);
    }

    /// Writes an entry tagged `tag` (not 0) holding the concatenation of `parts` at word
    /// `at`. The caller places it: it must fit (`at + entry_words(len) <= words()`), and
    /// every entry it overlaps must have been [`ArenaWriter::clear`]ed (a reader of one of
    /// those then gets [`EntryError::Stale`], never the new entry's bytes as the old one's:
    /// the release fence here orders the clearing before any byte written).
    ///
    /// The tag is stored last (release): a reader that loads it (acquire) sees the bytes.
    /// Readers must learn of the entry through something ordered after this call (a
    /// release store, a write to a socket).
    pub fn put<'a, P>(&self, at: usize, tag: u64, parts: P)
    where
        P: IntoIterator<Item = &'a [u8]> + Clone,
    {
        debug_assert_ne!(tag, 0);
        let len: usize = parts.clone().into_iter().map(<[u8]>::len).sum();
        let words = &self.segment.words()[at..at + entry_words(len)];
        // A reader still looking at the old entry sees its tag change before any of its
        // bytes do.
        words[0].store(0, Ordering::Relaxed);
        fence(Ordering::Release);
        words[1].store(len as u64, Ordering::Relaxed);
        store_bytes(&words[ENTRY_HEADER_WORDS..], parts);
        words[0].store(tag, Ordering::Release);
    }
}

/// The reading side of an arena: its segment mapped read-only.
#[derive(Debug)]
pub struct ArenaView {
    segment: Segment,
}

impl ArenaView {
    /// Maps the arena another process made (its descriptor, received over a Unix socket),
    /// read-only, after the checks of [`Segment::open`].
    pub fn open(fd: OwnedFd) -> Result<ArenaView, SegmentError> {
        Ok(ArenaView {
            segment: Segment::open_read_only(fd)?,
        })
    }

    /// Bytes in the arena.
    pub fn bytes(&self) -> u64 {
        self.segment.words().len() as u64 * 8
    }

    /// The words of the entry at byte `at`, of `len` bytes, tagged `tag` (header first),
    /// checked: within the arena, and holding that tag (acquire: its bytes are visible)
    /// and length now.
    fn entry(&self, at: u64, len: u64, tag: u64) -> Result<(&[AtomicU64], usize), EntryError> {
        let words = self.segment.words();
        let oob = EntryError::OutOfBounds { at, len };
        if !at.is_multiple_of(8) || tag == 0 {
            return Err(if tag == 0 { EntryError::Stale(at) } else { oob });
        }
        let w = usize::try_from(at / 8).map_err(|_| oob)?;
        let n = usize::try_from(len).map_err(|_| oob)?;
        let end = entry_words(n).checked_add(w).ok_or(oob)?;
        if end > words.len() {
            return Err(oob);
        }
        let entry = &words[w..end];
        if entry[0].load(Ordering::Acquire) != tag || entry[1].load(Ordering::Relaxed) != len {
            return Err(EntryError::Stale(at));
        }
        Ok((entry, n))
    }

    /// The entry at byte `at`, of `len` bytes, tagged `tag`, checked as [`ArenaView::get`]
    /// checks it, as bytes read in place (no copy) for as long as the [`InPlace`] lives,
    /// which keeps the mapping and `hold`: whatever tells the writer, once dropped, that
    /// this reader is done with the entry. Until then the writer must not write the place
    /// again (the arena's protocol: the broker writes a place again only once every
    /// reader counted it released). `None` on a big-endian host, where entries are not
    /// their bytes in order: copy with [`ArenaView::get`] there.
    pub fn get_in_place<H>(
        self: &Arc<Self>,
        at: u64,
        len: u64,
        tag: u64,
        hold: H,
    ) -> Result<Option<InPlace<H>>, EntryError> {
        if cfg!(target_endian = "big") {
            return Ok(None);
        }
        let (_, n) = self.entry(at, len, tag)?;
        Ok(Some(InPlace {
            view: self.clone(),
            start: at as usize + ENTRY_HEADER_WORDS * 8,
            len: n,
            _hold: hold,
        }))
    }

    /// Appends the bytes of the entry at byte `at`, of `len` bytes, tagged `tag`, to `out`.
    /// On an error nothing is appended.
    pub fn get<B: ReadBuf + ?Sized>(
        &self,
        at: u64,
        len: u64,
        tag: u64,
        out: &mut B,
    ) -> Result<(), EntryError> {
        let (entry, n) = self.entry(at, len, tag)?;
        let base = out.len();
        load_bytes(&entry[ENTRY_HEADER_WORDS..], n, out);
        fence(Ordering::Acquire);
        if entry[0].load(Ordering::Relaxed) != tag {
            out.truncate(base);
            return Err(EntryError::Stale(at));
        }
        Ok(())
    }
}

/// How many references a [`ReleaseTable`] tells apart: a reader holds fewer than this
/// many at once (the writer sends no more before some are released).
pub const RELEASE_SLOTS: usize = 4096;

/// The largest reference number a [`ReleaseTable`] holds (`n + 1` and its taken mark must
/// fit in a word). A number from another process is checked against it before it is used.
pub const MAX_REFERENCE: u64 = TAKEN - 2;

/// What a reader that holds entries in place ([`ArenaView::get_in_place`]) says it is done
/// with, in any order: a segment the reader makes and writes and the arena's writer reads.
/// The reader numbers the references it receives from 0; done with reference `n`, it
/// stores `n + 1` in slot `n % RELEASE_SLOTS`. A slot holding anything else says nothing
/// of `n` (an older reference's number, or garbage from a hostile reader: its own loss,
/// as it can only release its own references early, or never).
#[derive(Debug)]
pub struct ReleaseTable {
    segment: Segment,
}

impl ReleaseTable {
    /// The reader's new table (all zeros: nothing released).
    pub fn create(name: &str) -> Result<ReleaseTable, SegmentError> {
        Ok(ReleaseTable {
            segment: Segment::create(name, RELEASE_SLOTS * 8)?,
        })
    }

    /// The writer's view of a reader's table (its descriptor, received over a Unix
    /// socket): checked as [`Segment::open`] checks, and of exactly the table's size.
    pub fn open(fd: OwnedFd) -> Result<ReleaseTable, SegmentError> {
        let segment = Segment::open(fd)?;
        let bytes = segment.words().len() as u64 * 8;
        if segment.words().len() != RELEASE_SLOTS {
            return Err(SegmentError::Size(bytes));
        }
        Ok(ReleaseTable { segment })
    }

    /// The descriptor to hand to the writer.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.segment.fd()
    }

    /// Reference `n` is done with (release: whatever was read of its entry happened
    /// before the writer sees this).
    pub fn release(&self, n: u64) {
        self.segment.words()[n as usize % RELEASE_SLOTS].store(n + 1, Ordering::Release);
    }

    /// Whether reference `n` was said done with (acquire: the writer may write its entry's
    /// place again).
    pub fn released(&self, n: u64) -> bool {
        self.segment.words()[n as usize % RELEASE_SLOTS].load(Ordering::Acquire) == n + 1
    }

    /// Reference `n` is taken, and about to be read in place (a relaxed store: a reader
    /// publishes it with a later release store of its own, or orders it with a fence;
    /// [`ReleaseTable::release`] replaces it when done). For a writer that must tell a
    /// reference its reader took and holds from one it never took (lost, or not to be
    /// taken any more): [`ReleaseTable::state`].
    pub fn take(&self, n: u64) {
        self.segment.words()[n as usize % RELEASE_SLOTS].store((n + 1) | TAKEN, Ordering::Relaxed);
    }

    /// What the table says of reference `n` (acquire).
    pub fn state(&self, n: u64) -> RefState {
        match self.segment.words()[n as usize % RELEASE_SLOTS].load(Ordering::Acquire) {
            v if v == n + 1 => RefState::Released,
            v if v == (n + 1) | TAKEN => RefState::Taken,
            _ => RefState::Unknown,
        }
    }
}

/// Reference `n` held by a reader that reads its entry in place: dropped (with the last
/// thing that reads the entry, such as an [`InPlace`] it is the hold of), it releases the
/// reference in the reader's table.
#[derive(Debug)]
pub struct Release {
    table: Arc<ReleaseTable>,
    n: u64,
}

impl Release {
    /// Holds reference `n` of `table` until dropped.
    pub fn new(table: Arc<ReleaseTable>, n: u64) -> Release {
        Release { table, n }
    }
}

impl Drop for Release {
    fn drop(&mut self) {
        self.table.release(self.n);
    }
}

/// The bit [`ReleaseTable::take`] adds to a reference's number plus one.
const TAKEN: u64 = 1 << 63;

/// What a [`ReleaseTable`] says of one reference.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RefState {
    /// Done with ([`ReleaseTable::release`]).
    Released,
    /// Taken and not yet done with ([`ReleaseTable::take`]).
    Taken,
    /// Nothing about it (not taken yet, never to be, or garbage).
    Unknown,
}

/// An entry's bytes in place in the arena ([`ArenaView::get_in_place`]): the mapping is
/// kept while it lives, and so is its `hold` (dropped after the bytes are no longer seen).
#[derive(Debug)]
pub struct InPlace<H> {
    view: Arc<ArenaView>,
    start: usize,
    len: usize,
    _hold: H,
}

impl<H> AsRef<[u8]> for InPlace<H> {
    fn as_ref(&self) -> &[u8] {
        self.view.segment.bytes_in_place(self.start, self.len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    fn pair(bytes: usize) -> (ArenaWriter, Arc<ArenaView>) {
        let w = ArenaWriter::create("test-arena", bytes).unwrap();
        let v = ArenaView::open(w.fd().try_clone_to_owned().unwrap()).unwrap();
        (w, Arc::new(v))
    }

    /// An entry read in place is its bytes, checked as a copy is; the mapping and the hold
    /// live as long as the bytes, and the hold goes when they go.
    #[test]
    fn an_entry_reads_in_place_and_holds_until_dropped() {
        let (w, v) = pair(4096);
        w.put(5, 11, [&b"in "[..], b"place, no copy"]);
        let hold = Arc::new(());
        let e = v.get_in_place(40, 17, 11, hold.clone()).unwrap().unwrap();
        assert_eq!(e.as_ref(), b"in place, no copy");
        drop(v);
        assert_eq!(
            e.as_ref(),
            b"in place, no copy",
            "the mapping went with the view"
        );
        assert_eq!(Arc::strong_count(&hold), 2);
        drop(e);
        assert_eq!(Arc::strong_count(&hold), 1, "the hold outlived its bytes");
        // Checked as `get` is: stale, out of bounds.
        let (w, v) = pair(4096);
        w.put(0, 3, [&[7u8; 100][..]]);
        assert_eq!(
            v.get_in_place(0, 100, 4, ()).unwrap_err(),
            EntryError::Stale(0)
        );
        assert_eq!(
            v.get_in_place(0, 99, 3, ()).unwrap_err(),
            EntryError::Stale(0)
        );
        assert!(matches!(
            v.get_in_place(4096 - 8, 100, 3, ()),
            Err(EntryError::OutOfBounds { .. })
        ));
        assert!(matches!(
            v.get_in_place(8, u64::MAX, 3, ()),
            Err(EntryError::OutOfBounds { .. })
        ));
    }

    /// Releases in any order are seen, each for its own number only; a table of another
    /// size is refused.
    #[test]
    fn a_release_table_tells_each_reference_apart() {
        let mine = ReleaseTable::create("releases").unwrap();
        let theirs = ReleaseTable::open(mine.fd().try_clone_to_owned().unwrap()).unwrap();
        mine.release(7);
        mine.release(2);
        assert!(theirs.released(7) && theirs.released(2));
        assert!(!theirs.released(0) && !theirs.released(3));
        // A slot is shared by numbers RELEASE_SLOTS apart: only the last one stored counts.
        let far = 7 + RELEASE_SLOTS as u64;
        assert!(!theirs.released(far));
        mine.release(far);
        assert!(theirs.released(far) && !theirs.released(7));
        let small = Segment::create("small", 4096).unwrap();
        assert!(ReleaseTable::open(small.fd().try_clone_to_owned().unwrap()).is_err());
    }

    #[test]
    fn an_entry_reads_back_from_its_place() {
        let (w, v) = pair(4096);
        w.put(3, 7, [&b"hello, "[..], b"arena"]);
        let mut out = b"x".to_vec();
        v.get(24, 12, 7, &mut out).unwrap();
        assert_eq!(out, b"xhello, arena");
        // An empty entry.
        w.put(100, 8, []);
        let mut out = Vec::new();
        v.get(800, 0, 8, &mut out).unwrap();
        assert!(out.is_empty());
    }

    #[test]
    fn a_wrong_tag_length_or_place_is_an_error_and_appends_nothing() {
        let (w, v) = pair(4096);
        w.put(0, 5, [&[1u8; 40][..]]);
        let mut out = Vec::new();
        assert_eq!(v.get(0, 40, 6, &mut out), Err(EntryError::Stale(0)));
        assert_eq!(v.get(0, 41, 5, &mut out), Err(EntryError::Stale(0)));
        assert_eq!(v.get(0, 40, 0, &mut out), Err(EntryError::Stale(0)));
        assert!(matches!(
            v.get(4, 40, 5, &mut out),
            Err(EntryError::OutOfBounds { .. })
        ));
        // Past the end, and lengths that overflow.
        assert!(matches!(
            v.get(4096 - 16, 8, 5, &mut out),
            Err(EntryError::OutOfBounds { .. })
        ));
        assert!(matches!(
            v.get(0, u64::MAX, 5, &mut out),
            Err(EntryError::OutOfBounds { .. })
        ));
        assert!(matches!(
            v.get(u64::MAX - 7, 0, 5, &mut out),
            Err(EntryError::OutOfBounds { .. })
        ));
        // Written again under another tag: the old name is stale.
        w.put(0, 9, [&b"new"[..]]);
        assert_eq!(v.get(0, 40, 5, &mut out), Err(EntryError::Stale(0)));
        assert!(out.is_empty());
        v.get(0, 3, 9, &mut out).unwrap();
        assert_eq!(out, b"new");
    }

    /// A reader cannot map the arena writable, nor write it: what every reader reads is
    /// the writer's alone.
    #[test]
    fn readers_cannot_write_the_arena() {
        let (w, _v) = pair(4096);
        let fd = w.fd().try_clone_to_owned().unwrap();
        assert!(Segment::open(fd).is_err(), "a writable mapping was allowed");
        let fd = w.fd().try_clone_to_owned().unwrap();
        assert!(rustix::io::write(fd.as_fd(), b"scribble").is_err());
        // Nor can the seals be taken off or the arena resized.
        assert!(rustix::fs::ftruncate(&fd, 0).is_err());
    }

    proptest::proptest! {
        /// A table tells taken from released from neither for any reference number, and
        /// never takes what it says of one reference for another sharing its slot.
        #[test]
        fn a_table_says_taken_released_or_nothing_per_reference(n in 0u64..(1 << 62)) {
            let t = ReleaseTable::create("t").unwrap();
            let other = n.wrapping_add(RELEASE_SLOTS as u64);
            proptest::prop_assert_eq!(t.state(n), RefState::Unknown);
            t.take(n);
            proptest::prop_assert_eq!(t.state(n), RefState::Taken);
            proptest::prop_assert!(!t.released(n));
            proptest::prop_assert_eq!(t.state(other), RefState::Unknown);
            t.release(n);
            proptest::prop_assert_eq!(t.state(n), RefState::Released);
            proptest::prop_assert!(t.released(n));
            proptest::prop_assert_eq!(t.state(other), RefState::Unknown);
        }

        /// Whatever a MSG_REF names (any place, length, tag), a read either gives exactly
        /// the entry that was put there under that tag, or an error with nothing appended;
        /// it never panics nor reads past the arena.
        #[test]
        fn any_reference_reads_the_named_entry_or_nothing(
            puts in proptest::collection::vec((0usize..64, 1u64..5, 0usize..200), 1..20),
            gets in proptest::collection::vec((0u64..600, 0u64..300, 0u64..6), 1..50),
        ) {
            // Tags with every byte set, as real ones (keyed hashes) have: a payload of its
            // own cannot forge one (a 1-byte payload of 3, padded with zeros, was tag 3 at
            // the place of an entry it overwrote, whose length word was still there).
            let wide = |t: u64| t * 0x0101_0101_0101_0101;
            let puts: Vec<(usize, u64, usize)> = puts.iter().map(|&(a, t, l)| (a, wide(t), l)).collect();
            let gets: Vec<(u64, u64, u64)> = gets.iter().map(|&(a, l, t)| (a, l, wide(t))).collect();
            let (w, v) = pair(512);
            let mut model: std::collections::BTreeMap<usize, (u64, Vec<u8>)> = Default::default();
            for &(at, tag, len) in &puts {
                if at + entry_words(len) > w.words() {
                    continue;
                }
                let bytes: Vec<u8> = (0..len).map(|i| (i as u64 * 7 + tag) as u8).collect();
                // The entries it overlaps end first, as the arena's users must do.
                model.retain(|&a, (_, b)| {
                    let apart = a + entry_words(b.len()) <= at || a >= at + entry_words(len);
                    if !apart {
                        w.clear(a);
                    }
                    apart
                });
                w.put(at, tag, [&bytes[..]]);
                model.insert(at, (tag, bytes));
            }
            // Every name ever given (most stale by now), and made-up ones.
            let named = puts.iter().map(|&(at, tag, len)| (at as u64 * 8, len as u64, tag));
            for (at, len, tag) in named.chain(gets) {
                let mut out = vec![0xAA];
                match v.get(at, len, tag, &mut out) {
                    Ok(()) => {
                        let (t, b) = model.get(&((at / 8) as usize)).expect("read where nothing was put");
                        proptest::prop_assert_eq!(*t, tag);
                        proptest::prop_assert_eq!(&out[1..], &b[..]);
                        let e = v.get_in_place(at, len, tag, ()).unwrap().unwrap();
                        proptest::prop_assert_eq!(e.as_ref(), &b[..]);
                    }
                    Err(_) => {
                        proptest::prop_assert_eq!(out, vec![0xAA]);
                        proptest::prop_assert!(v.get_in_place(at, len, tag, ()).is_err());
                    }
                }
            }
        }
    }
}
