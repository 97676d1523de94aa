//! Hayate's shared-memory ring: the data structure under the shared-memory transport of the
//! peer-to-peer issue (one writer, any number of readers on the same host, one copy of each
//! message whatever the number of readers).
//!
//! The ring works over any region of 64-bit words; [`segment`] provides the region shared
//! between processes (a sealed memfd), [`announce`] hands it to another process over a Unix
//! socket, and [`doorbell`] wakes a process waiting for it; peer nodes on one host use them
//! (`hayate_client::peer`, docs/shm.md). The ring is safe Rust: the region is `&[AtomicU64]`, and every
//! byte of a message is moved by atomic word loads and stores, so a reader racing the
//! writer (or a hostile process writing the region) can read torn data but never cause
//! undefined behaviour. Mapping the memfd and viewing it as `&[AtomicU64]` is the crate's
//! one `unsafe`, confined to [`segment`] with its invariants beside it.
//!
//! # Layout (all little-endian 64-bit words)
//!
//! | words | what |
//! |---|---|
//! | 0 | magic `HYTSHM01` |
//! | 1 | `slots` (low 32 bits), `slot_words` (high 32 bits) |
//! | 2 | registrations so far (the tag of the next cursor) |
//! | 3 | closed: non-zero once the writer publishes nothing more (a byte stream's end) |
//! | 4 | the owner's word: the ring's writer may use it for anything; the ring does not (the broker transport: fan-out entries released, docs/shm.md) |
//! | 5..8 | zero (the header's cache line) |
//! | 8 | `head`: the number of messages published |
//! | 9 | sleepers: bit `i` set while the reader of cursor `i` waits for a wake-up |
//! | 10 | the writer waits for a registered reader (non-zero) |
//! | 11..16 | zero (`head` and the wake-up words on their own cache line) |
//! | 16..80 | the cursor table: per registered reader, a 16-bit tag (never 0; its top bit set: the writer does not wait for it) and its next message modulo 2^48 (0: free) |
//! | 80.. | `slots` slots of `slot_words` words: `seq`, `len`, then the payload |
//!
//! # Protocol (a sequence lock per slot)
//!
//! Message `n` goes to slot `n % slots`. The writer stores the slot's `seq` as `2n + 1`
//! (odd: being written), then a release fence, the length and the payload words, then `seq
//! = 2n + 2` (release) and `head = n + 1` (release). A reader of message `n` loads `seq`
//! (acquire), which must be `2n + 2`, then the length (checked against the slot) and the
//! payload, then an acquire fence and `seq` again: a change means the writer lapped it while
//! it copied, and the copy is thrown away. So a reader gets whole messages or knows it lost
//! some; it never blocks the writer (best-effort, overwrite mode: a slow reader loses the
//! oldest messages and is told how many).
//!
//! Nothing a reader finds in the region is trusted: the geometry in the header is checked
//! against the region's size, and a length larger than its slot, or a `seq` or `head` that
//! cannot be, is [`ReadError::Corrupt`].

#[cfg(not(loom))]
pub mod announce;
#[cfg(not(loom))]
pub mod arena;
#[cfg(not(loom))]
pub mod doorbell;
#[cfg(not(loom))]
pub mod segment;

mod copy;
#[cfg(not(loom))]
mod owned;

pub use copy::ReadBuf;
#[cfg(not(loom))]
pub use copy::Region;
pub(crate) use copy::{load_bytes, store_bytes};

#[cfg(loom)]
use loom::sync::atomic::{AtomicU64, Ordering, fence};
#[cfg(not(loom))]
use std::sync::atomic::{AtomicU64, Ordering, fence};

/// The first word of a ring ("HYTSHM01").
pub const MAGIC: u64 = u64::from_le_bytes(*b"HYTSHM01");
/// Readers that can register a cursor (the reliable mode's readers).
pub const MAX_READERS: usize = 64;
/// Where the cursor table starts.
const CURSORS: usize = 16;
/// The header word counting registrations (the next cursor's tag).
const REGISTRATIONS: usize = 2;
/// A cursor's position bits (the rest is its tag).
const POS_MASK: u64 = (1 << 48) - 1;
/// A cursor with this bit (the tag's top bit) is not waited for by the writer: a registered
/// reader in best-effort mode (it takes an entry for the wake-ups).
const NO_WAIT: u64 = 1 << 63;
/// The sleepers' bitmask (bit `i`: the reader of cursor `i` waits for a wake-up).
const SLEEPERS: usize = 9;
/// Non-zero while the writer waits for a registered reader to read on.
const WRITER_WAITS: usize = 10;
/// Non-zero once the writer has closed the ring ([`Writer::close`]).
const CLOSED: usize = 3;
/// The owner's word ([`SharedRing::owner_word`]): the ring neither reads nor writes it.
#[cfg_attr(loom, allow(dead_code))]
const OWNER: usize = 4;

/// A cursor word: `tag` (1..=65535) and position `next` modulo 2^48.
fn cursor_word(tag: u64, next: u64) -> u64 {
    (tag << 48) | (next & POS_MASK)
}
/// Words before the first slot.
pub const HEADER_WORDS: usize = CURSORS + MAX_READERS;
/// Words of a slot before its payload (`seq`, `len`).
pub const SLOT_HEADER_WORDS: usize = 2;

const HEAD: usize = 8;

/// More messages than any writer publishes (2^62: `seq`, twice the number, stays in range).
/// A `head` beyond it is corrupt.
const MAX_MESSAGES: u64 = 1 << 62;

/// Why a region is not a ring.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LayoutError {
    /// The first word is not [`MAGIC`].
    #[error("not a Hayate ring (bad magic)")]
    Magic,
    /// No slots, a slot without room for a payload word, or a geometry larger than the
    /// region.
    #[error("ring geometry {slots} x {slot_words} words does not fit a region of {words} words")]
    Geometry {
        /// Slots the header claims.
        slots: u64,
        /// Words per slot the header claims.
        slot_words: u64,
        /// Words of the region.
        words: usize,
    },
}

/// Why a read gave no message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ReadError {
    /// The writer overwrote messages before this reader got to them: this many were lost,
    /// and the reader now continues with the oldest one still in the ring.
    #[error("{0} messages lost (overwritten before they were read)")]
    Lost(u64),
    /// The region holds something the protocol cannot produce (a writer that is not
    /// Hayate's, or memory damaged): the reader should stop using it.
    #[error("the ring is corrupt")]
    Corrupt,
}

/// A ring over a region of words: its geometry, checked.
#[derive(Debug, Clone, Copy)]
pub struct Ring<'a> {
    words: &'a [AtomicU64],
    slots: usize,
    slot_words: usize,
}

/// The number of words a ring of `slots` slots holding payloads of up to `max_payload` bytes
/// needs.
pub fn region_words(slots: usize, max_payload: usize) -> usize {
    HEADER_WORDS + slots * (SLOT_HEADER_WORDS + max_payload.div_ceil(8).max(1))
}

impl<'a> Ring<'a> {
    /// Makes `words` an empty ring of `slots` slots for payloads of up to `max_payload`
    /// bytes (the writer's side, before any reader attaches).
    pub fn init(
        words: &'a [AtomicU64],
        slots: usize,
        max_payload: usize,
    ) -> Result<Ring<'a>, LayoutError> {
        Ring::init_with(words, slots, max_payload, true)
    }

    /// [`Ring::init`]; `zero: false` for a region known to be all zeros.
    fn init_with(
        words: &'a [AtomicU64],
        slots: usize,
        max_payload: usize,
        zero: bool,
    ) -> Result<Ring<'a>, LayoutError> {
        let slot_words = SLOT_HEADER_WORDS + max_payload.div_ceil(8).max(1);
        let bad = || LayoutError::Geometry {
            slots: slots as u64,
            slot_words: slot_words as u64,
            words: words.len(),
        };
        if slots == 0 || slots > u32::MAX as usize || slot_words > u32::MAX as usize {
            return Err(bad());
        }
        let need = slots
            .checked_mul(slot_words)
            .and_then(|n| n.checked_add(HEADER_WORDS))
            .ok_or_else(bad)?;
        if need > words.len() {
            return Err(bad());
        }
        if zero {
            for w in &words[..need] {
                w.store(0, Ordering::Relaxed);
            }
        }
        words[1].store(
            slots as u64 | ((slot_words as u64) << 32),
            Ordering::Relaxed,
        );
        // The magic last: a reader that sees it sees the geometry.
        words[0].store(MAGIC, Ordering::Release);
        Ok(Ring {
            words,
            slots,
            slot_words,
        })
    }

    /// Reads the geometry of the ring in `words` (the reader's side), checking it against
    /// the region's size.
    pub fn attach(words: &'a [AtomicU64]) -> Result<Ring<'a>, LayoutError> {
        if words.len() < HEADER_WORDS || words[0].load(Ordering::Acquire) != MAGIC {
            return Err(LayoutError::Magic);
        }
        let g = words[1].load(Ordering::Relaxed);
        let (slots, slot_words) = (g & 0xffff_ffff, g >> 32);
        let bad = LayoutError::Geometry {
            slots,
            slot_words,
            words: words.len(),
        };
        let fits = (slots as usize)
            .checked_mul(slot_words as usize)
            .and_then(|n| n.checked_add(HEADER_WORDS))
            .is_some_and(|n| n <= words.len());
        if slots == 0 || (slot_words as usize) <= SLOT_HEADER_WORDS || !fits {
            return Err(bad);
        }
        Ok(Ring {
            words,
            slots: slots as usize,
            slot_words: slot_words as usize,
        })
    }

    /// Slots in the ring.
    pub fn slots(&self) -> usize {
        self.slots
    }

    /// The largest payload a slot holds, in bytes.
    pub fn max_payload(&self) -> usize {
        (self.slot_words - SLOT_HEADER_WORDS) * 8
    }

    /// Messages published so far.
    pub fn head(&self) -> u64 {
        self.words[HEAD].load(Ordering::Acquire)
    }

    /// Whether the writer closed the ring ([`Writer::close`]): after this returns `true`, a
    /// reader that then finds nothing new has read everything.
    pub fn closed(&self) -> bool {
        self.words[CLOSED].load(Ordering::Acquire) != 0
    }

    /// Frees cursor `index` of the table (a registered reader that died): the writer no
    /// longer waits for it. Its process, if alive, reads on without a cursor. Needs no
    /// writer (which may be busy waiting for that very reader).
    pub fn evict(&self, index: usize) {
        if index < MAX_READERS {
            self.words[CURSORS + index].store(0, Ordering::Release);
        }
    }

    /// The readers of `mask` (cursor entries) waiting for a wake-up, whose bits are taken
    /// down: the caller wakes each. After a publication, a reader that flagged itself asleep
    /// before it is in the result, or saw the publication (see below).
    pub fn take_sleepers(&self, mask: u64) -> u64 {
        // A read-modify-write of the sleepers word, not a load: the readers set their bits
        // by read-modify-writes of the same word, so one of the two comes first in its
        // modification order. If the reader's comes first, this sees its bit; if this comes
        // first, the reader's reads what this wrote, which synchronises with it (release),
        // so the reader's look at `head` after it sees the `head` stored before this.
        // Cheaper than a full fence on every publication.
        self.words[SLEEPERS].fetch_and(!mask, Ordering::AcqRel) & mask
    }

    fn slot(&self, n: u64) -> &'a [AtomicU64] {
        let i = (n % self.slots as u64) as usize;
        let at = HEADER_WORDS + i * self.slot_words;
        &self.words[at..at + self.slot_words]
    }
}

/// The one writer of a ring.
#[derive(Debug)]
pub struct Writer<'a> {
    ring: Ring<'a>,
    next: u64,
    /// Messages it may publish before it looks at the cursors again (no reader waited for
    /// can be a ring behind before then: readers only move on).
    room: u64,
}

/// A payload larger than the ring's slots.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("payload of {len} bytes is larger than the ring's slots ({max} bytes)")]
pub struct TooLarge {
    /// The payload's length.
    pub len: usize,
    /// The largest payload a slot holds.
    pub max: usize,
}

impl<'a> Writer<'a> {
    /// The writer of `ring`, continuing after what it holds.
    pub fn new(ring: Ring<'a>) -> Writer<'a> {
        Writer {
            next: ring.head(),
            ring,
            room: 0,
        }
    }

    /// Publishes `payload` unless that would overwrite a message a registered reader has not
    /// read yet (the reliable mode): `Ok(None)` then, and the caller waits and tries again.
    /// Unregistered readers are not waited for. A registered reader that stops reading
    /// holds the writer back until it is evicted ([`Writer::evict`]).
    pub fn try_publish(&mut self, payload: &[u8]) -> Result<Option<u64>, TooLarge> {
        self.try_publish_parts(&[payload])
    }

    /// [`Writer::try_publish`] of the concatenation of `parts` (one message).
    pub fn try_publish_parts(&mut self, parts: &[&[u8]]) -> Result<Option<u64>, TooLarge> {
        if self.room == 0 {
            self.room = self.room_now();
            if self.room == 0 {
                return Ok(None);
            }
        }
        self.publish_parts(parts).map(Some)
    }

    /// Messages it may publish now without overwriting one that a reader it waits for has
    /// not read.
    fn room_now(&self) -> u64 {
        let slots = self.ring.slots as u64;
        self.waited_unread().fold(slots, |room, (_, unread)| {
            room.min(slots.saturating_sub(unread))
        })
    }

    /// The entry of a registered reader (waited for) that has not read the message the next
    /// publication would overwrite, if any.
    pub fn blocking_reader(&self) -> Option<usize> {
        let slots = self.ring.slots as u64;
        self.waited_unread()
            .find(|(_, unread)| *unread >= slots)
            .map(|(i, _)| i)
    }

    /// Every registered reader the writer waits for: its entry and how many messages it has
    /// not committed, from its position to ours (modulo 2^48: a reader is never 2^47
    /// messages behind; a cursor that says so is ignored).
    fn waited_unread(&self) -> impl Iterator<Item = (usize, u64)> + '_ {
        self.ring.words[CURSORS..CURSORS + MAX_READERS]
            .iter()
            .enumerate()
            .filter_map(|(i, c)| {
                let v = c.load(Ordering::Acquire);
                let unread = self.next.wrapping_sub(v) & POS_MASK;
                (v != 0 && v & NO_WAIT == 0 && unread < 1 << 47).then_some((i, unread))
            })
    }

    /// The writer is about to wait for a registered reader: flags it, so that the reader,
    /// once it has read on, wakes the writer ([`Reader::writer_waits`]). The caller then
    /// tries again ([`Writer::try_publish`]) before it sleeps: a reader that read on
    /// before the flag was up does not wake it.
    pub fn prepare_wait(&self) {
        self.ring.words[WRITER_WAITS].store(1, Ordering::SeqCst);
        // Pairs with the reader's fence in `writer_waits`: the flag is ordered before the
        // writer's next look at the cursors (one of the two sees the other).
        fence(Ordering::SeqCst);
    }

    /// The readers waiting for a wake-up since the last call (a bitmask of cursor entries;
    /// their bits are cleared): the caller wakes each. Call after publishing.
    pub fn sleepers(&self) -> u64 {
        self.ring.take_sleepers(u64::MAX)
    }

    /// [`Writer::sleepers`] among the readers of `mask` (cursor entries) only: the others
    /// keep sleeping, their bits set (what was published is not for them; they are woken
    /// when something is, or when the writer waits for room, or by [`Ring::take_sleepers`]).
    pub fn sleepers_among(&self, mask: u64) -> u64 {
        self.ring.take_sleepers(mask)
    }

    /// [`Ring::evict`].
    pub fn evict(&self, index: usize) {
        self.ring.evict(index);
    }

    /// Publishes nothing more: readers that have read everything see the end
    /// ([`Ring::closed`]). The caller then wakes the sleepers ([`Writer::sleepers`]).
    pub fn close(&self) {
        // Release: everything published before is visible to a reader that sees the flag.
        self.ring.words[CLOSED].store(1, Ordering::Release);
    }

    /// Publishes `payload` as the next message; returns its number. Never waits: a reader
    /// that has not read the message this overwrites loses it.
    pub fn publish(&mut self, payload: &[u8]) -> Result<u64, TooLarge> {
        self.publish_parts(&[payload])
    }

    /// [`Writer::publish`] of the concatenation of `parts` (one message), copied once, into
    /// the slot.
    pub fn publish_parts(&mut self, parts: &[&[u8]]) -> Result<u64, TooLarge> {
        let max = self.ring.max_payload();
        let len: usize = parts.iter().map(|p| p.len()).sum();
        if len > max {
            return Err(TooLarge { len, max });
        }
        let n = self.next;
        let slot = self.ring.slot(n);
        slot[0].store(2 * n + 1, Ordering::Relaxed);
        fence(Ordering::Release);
        slot[1].store(len as u64, Ordering::Relaxed);
        store_bytes(&slot[SLOT_HEADER_WORDS..], parts.iter().copied());
        slot[0].store(2 * n + 2, Ordering::Release);
        self.next = n + 1;
        self.room = self.room.saturating_sub(1);
        self.ring.words[HEAD].store(self.next, Ordering::Release);
        Ok(n)
    }
}

/// How many of a message's last bytes [`Reader::read_append_if`] shows before deciding (a
/// trailer: the reader then drops it from what it copied by shortening its buffer).
pub const PEEK: usize = 16;

/// One reader of a ring: its own position, in its own process.
#[derive(Debug)]
pub struct Reader<'a> {
    ring: Ring<'a>,
    next: u64,
    /// Its entry in the cursor table and its tag, if registered.
    cursor: Option<(usize, u64)>,
    /// The position its cursor shows the writer (behind `next` until [`Reader::commit`]
    /// when `deferred`).
    committed: u64,
    /// The cursor moves on only at [`Reader::commit`], not at each read.
    deferred: bool,
}

/// Every cursor of the table is taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the ring has {MAX_READERS} registered readers already")]
pub struct NoCursor;

impl<'a> Reader<'a> {
    /// A reader of `ring` starting with the next message published.
    pub fn new(ring: Ring<'a>) -> Reader<'a> {
        let next = ring.head().min(MAX_MESSAGES);
        Reader {
            next,
            ring,
            cursor: None,
            committed: next,
            deferred: false,
        }
    }

    /// A reader that the writer's [`Writer::try_publish`] waits for: it takes an entry of
    /// the cursor table (released when the reader is dropped). It gets every message from
    /// the first it reads on; messages published while it registers may be reported lost.
    pub fn register(ring: Ring<'a>) -> Result<Reader<'a>, NoCursor> {
        Reader::register_with(ring, true)
    }

    /// A registered reader that the writer waits for (`waits`) or not (best effort: it
    /// takes an entry for the wake-ups, [`Reader::prepare_sleep`]).
    pub fn register_with(ring: Ring<'a>, waits: bool) -> Result<Reader<'a>, NoCursor> {
        let next = ring.head().min(MAX_MESSAGES);
        let mut tag = ring.words[REGISTRATIONS].fetch_add(1, Ordering::Relaxed) % 0x7fff + 1;
        if !waits {
            tag |= NO_WAIT >> 48;
        }
        for (i, c) in ring.words[CURSORS..CURSORS + MAX_READERS]
            .iter()
            .enumerate()
        {
            if c.compare_exchange(
                0,
                cursor_word(tag, next),
                Ordering::AcqRel,
                Ordering::Relaxed,
            )
            .is_ok()
            {
                return Ok(Reader {
                    ring,
                    next,
                    cursor: Some((i, tag)),
                    committed: next,
                    deferred: false,
                });
            }
        }
        Err(NoCursor)
    }

    /// Its entry in the cursor table (for the writer's [`Writer::evict`]), if registered.
    pub fn cursor(&self) -> Option<usize> {
        self.cursor.map(|(i, _)| i)
    }

    /// Whether the writer waits for this reader (registered, and not best effort).
    pub fn waited_for(&self) -> bool {
        self.cursor
            .is_some_and(|(_, tag)| tag & (NO_WAIT >> 48) == 0)
    }

    /// Makes the writer wait for this registered reader, or stop waiting for it. `false`
    /// when it is not registered (any more: evicted). The writer may still publish the room
    /// it counted before it looks at the cursors again (at most a ring): switch to `true`
    /// when caught up with `head` (as before sleeping), and that overwrites nothing unread.
    pub fn set_waited_for(&mut self, waits: bool) -> bool {
        let Some((i, tag)) = self.cursor else {
            return false;
        };
        let new = if waits {
            tag & !(NO_WAIT >> 48)
        } else {
            tag | (NO_WAIT >> 48)
        };
        if new == tag {
            return true;
        }
        let ok = self.swap_cursor(
            i,
            cursor_word(tag, self.committed),
            cursor_word(new, self.committed),
        );
        if ok {
            self.cursor = Some((i, new));
        }
        ok
    }

    /// Before waiting for the writer's wake-up (its doorbell): flags this reader as asleep
    /// and looks at `head` again. `true`: nothing new, sleep (the writer wakes it after its
    /// next publication); `false`: something came, read on (the flag is taken down). Only a
    /// registered reader can sleep (its entry names it): `false` otherwise.
    pub fn prepare_sleep(&self) -> bool {
        let Some((i, _)) = self.cursor else {
            return false;
        };
        let s = &self.ring.words[SLEEPERS];
        s.fetch_or(1 << i, Ordering::SeqCst);
        if self.ring.words[HEAD].load(Ordering::SeqCst) == self.next {
            return true;
        }
        s.fetch_and(!(1 << i), Ordering::SeqCst);
        false
    }

    /// After a wake-up (or giving up waiting): takes this reader's flag down.
    pub fn end_sleep(&self) {
        if let Some((i, _)) = self.cursor {
            self.ring.words[SLEEPERS].fetch_and(!(1 << i), Ordering::SeqCst);
        }
    }

    /// After reading on: whether the writer waits for a reader to read on (and then takes
    /// its flag down): the caller wakes it.
    pub fn writer_waits(&self) -> bool {
        // Orders the cursor just advanced before the load of the flag (the writer raises
        // it, then looks at the cursors: one of the two sees the other).
        fence(Ordering::SeqCst);
        let w = &self.ring.words[WRITER_WAITS];
        w.load(Ordering::Relaxed) != 0 && w.swap(0, Ordering::SeqCst) != 0
    }

    fn advance(&mut self, next: u64) {
        self.next = next;
        if !self.deferred {
            self.commit();
        }
    }

    /// Makes the cursor move on only at [`Reader::commit`] (`true`), not at every read: the
    /// writer may then not reuse the slots of what was read (a reader that hands messages
    /// on in batches commits once they are handed on), and the cursor's cache line moves
    /// between the processes once per batch rather than once per message.
    pub fn set_deferred(&mut self, deferred: bool) {
        self.deferred = deferred;
        if !deferred {
            self.commit();
        }
    }

    /// Shows the writer this reader's position (what it read is done with). `false` when
    /// it is not registered (any more: evicted).
    pub fn commit(&mut self) -> bool {
        let Some((i, tag)) = self.cursor else {
            return false;
        };
        if self.committed != self.next {
            // Release: the copies of what it read are done before the writer may reuse
            // those slots.
            if !self.swap_cursor(
                i,
                cursor_word(tag, self.committed),
                cursor_word(tag, self.next),
            ) {
                return false;
            }
            self.committed = self.next;
        }
        true
    }

    /// Whether this reader is still registered (not evicted), looked at after a
    /// sequentially consistent fence. A store this reader made before the call (a mark in
    /// a release table, say) and a writer's [`Ring::evict`] followed by a fence and a load
    /// of that store's place cannot miss each other: either this sees the eviction, or
    /// the writer sees the store. `false` when evicted (it then reads on unregistered).
    pub fn registered(&mut self) -> bool {
        let Some((i, tag)) = self.cursor else {
            return false;
        };
        fence(Ordering::SeqCst);
        let word = self.ring.words[CURSORS + i].load(Ordering::Relaxed);
        if word != cursor_word(tag, self.committed) {
            self.cursor = None;
            return false;
        }
        true
    }

    /// Replaces this reader's cursor word `old` (entry `i`) with `new`, by compare-exchange:
    /// if the writer evicted this reader (and the entry went to another), it fails, and the
    /// reader reads on unregistered.
    fn swap_cursor(&mut self, i: usize, old: u64, new: u64) -> bool {
        let ok = self.ring.words[CURSORS + i]
            .compare_exchange(old, new, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok();
        if !ok {
            self.cursor = None;
        }
        ok
    }

    /// The number of the next message this reader expects.
    pub fn position(&self) -> u64 {
        self.next
    }

    /// Reads the next message into `out` (replacing its contents): `Ok(Some(n))` with its
    /// number, `Ok(None)` when nothing new was published, or why not.
    pub fn read(&mut self, out: &mut Vec<u8>) -> Result<Option<u64>, ReadError> {
        out.clear();
        self.read_append(out)
    }

    /// [`Reader::read`], appending the message to `out` (which keeps what it held, and only
    /// that when no message is read).
    pub fn read_append<B: ReadBuf + ?Sized>(
        &mut self,
        out: &mut B,
    ) -> Result<Option<u64>, ReadError> {
        self.read_append_if(out, |_| true)
            .map(|r| r.map(|(n, _)| n))
    }

    /// [`Reader::read_append`], asking `take` first whether to copy the message: `take`
    /// is shown the message's last [`PEEK`] bytes (all of it if shorter) read in place, and
    /// a message it declines is passed over without being copied. `Some((n, copied))`.
    ///
    /// The bytes `take` is shown may be torn (the writer lapping this reader while they
    /// were read): its answer counts only when the read returns `Ok`, which it does only
    /// when the message was intact throughout.
    pub fn read_append_if<B: ReadBuf + ?Sized>(
        &mut self,
        out: &mut B,
        take: impl FnOnce(&[u8]) -> bool,
    ) -> Result<Option<(u64, bool)>, ReadError> {
        let base = out.len();
        let head = self.ring.head();
        if head == self.next {
            return Ok(None);
        }
        if head < self.next || head > MAX_MESSAGES {
            // Published messages do not go away: not a ring this reader has been reading.
            return Err(ReadError::Corrupt);
        }
        let slots = self.ring.slots as u64;
        if head - self.next > slots {
            let oldest = head - slots;
            let lost = oldest - self.next;
            self.advance(oldest);
            return Err(ReadError::Lost(lost));
        }
        let n = self.next;
        let slot = self.ring.slot(n);
        let want = 2 * n + 2;
        let s1 = slot[0].load(Ordering::Acquire);
        if s1 != want {
            return if s1 > want {
                self.lapped(n)
            } else {
                // `head` says message n is complete: its slot cannot hold an older one.
                Err(ReadError::Corrupt)
            };
        }
        let len = slot[1].load(Ordering::Relaxed);
        let fits = usize::try_from(len).is_ok_and(|l| l <= self.ring.max_payload());
        let copy = !fits || {
            // The words holding the last `PEEK` bytes (three at most), read in place.
            let len = len as usize;
            let from = len.saturating_sub(PEEK);
            let first = from / 8;
            let mut peek = [0u8; PEEK + 8];
            for (b, w) in peek
                .chunks_exact_mut(8)
                .zip(&slot[SLOT_HEADER_WORDS + first..SLOT_HEADER_WORDS + len.div_ceil(8)])
            {
                b.copy_from_slice(&w.load(Ordering::Relaxed).to_le_bytes());
            }
            take(&peek[from - first * 8..len - first * 8])
        };
        if fits && copy {
            load_bytes(&slot[SLOT_HEADER_WORDS..], len as usize, out);
        }
        fence(Ordering::Acquire);
        let s2 = slot[0].load(Ordering::Relaxed);
        if s2 != s1 {
            // Overwritten while copied (the length too, maybe): what was copied is torn.
            out.truncate(base);
            return self.lapped(n);
        }
        if !fits {
            return Err(ReadError::Corrupt);
        }
        self.advance(n + 1);
        Ok(Some((n, copy)))
    }

    /// Message `n` was overwritten: skip to the oldest message the ring may still hold.
    fn lapped<T>(&mut self, n: u64) -> Result<Option<T>, ReadError> {
        let head = self.ring.head();
        let oldest = head.saturating_sub(self.ring.slots as u64).max(n + 1);
        self.advance(oldest);
        Err(ReadError::Lost(oldest - n))
    }
}

impl Drop for Reader<'_> {
    fn drop(&mut self) {
        if let Some((i, tag)) = self.cursor {
            // Only its own entry: after an eviction it may be someone else's.
            let _ = self.ring.words[CURSORS + i].compare_exchange(
                cursor_word(tag, self.committed),
                0,
                Ordering::AcqRel,
                Ordering::Relaxed,
            );
        }
    }
}

#[cfg(not(loom))]
pub use owned::{SharedReader, SharedRing, SharedWriter};
