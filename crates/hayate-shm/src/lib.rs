//! Hayate's shared-memory ring: the data structure under the shared-memory transport of the
//! peer-to-peer issue (one writer, any number of readers on the same host, one copy of each
//! message whatever the number of readers).
//!
//! The ring works over any region of 64-bit words; [`segment`] provides the region shared
//! between processes (a sealed memfd); announcing it over a Unix socket and the transport
//! built on it come next. The ring is safe Rust: the region is `&[AtomicU64]`, and every
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
//! | 2..8 | zero (the header's cache line) |
//! | 8 | `head`: the number of messages published |
//! | 9..16 | zero (`head` alone on its cache line) |
//! | 16.. | `slots` slots of `slot_words` words: `seq`, `len`, then the payload |
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
pub mod segment;

#[cfg(loom)]
use loom::sync::atomic::{AtomicU64, Ordering, fence};
#[cfg(not(loom))]
use std::sync::atomic::{AtomicU64, Ordering, fence};

/// The first word of a ring ("HYTSHM01").
pub const MAGIC: u64 = u64::from_le_bytes(*b"HYTSHM01");
/// Words before the first slot.
pub const HEADER_WORDS: usize = 16;
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
    HEADER_WORDS + slots * (SLOT_HEADER_WORDS + max_payload.div_ceil(8))
}

impl<'a> Ring<'a> {
    /// Makes `words` an empty ring of `slots` slots for payloads of up to `max_payload`
    /// bytes (the writer's side, before any reader attaches).
    pub fn init(
        words: &'a [AtomicU64],
        slots: usize,
        max_payload: usize,
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
        for w in &words[..need] {
            w.store(0, Ordering::Relaxed);
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
        }
    }

    /// Publishes `payload` as the next message; returns its number. Never waits: a reader
    /// that has not read the message this overwrites loses it.
    pub fn publish(&mut self, payload: &[u8]) -> Result<u64, TooLarge> {
        let max = self.ring.max_payload();
        if payload.len() > max {
            return Err(TooLarge {
                len: payload.len(),
                max,
            });
        }
        let n = self.next;
        let slot = self.ring.slot(n);
        slot[0].store(2 * n + 1, Ordering::Relaxed);
        fence(Ordering::Release);
        slot[1].store(payload.len() as u64, Ordering::Relaxed);
        for (w, chunk) in slot[SLOT_HEADER_WORDS..].iter().zip(payload.chunks(8)) {
            let mut b = [0u8; 8];
            b[..chunk.len()].copy_from_slice(chunk);
            w.store(u64::from_le_bytes(b), Ordering::Relaxed);
        }
        slot[0].store(2 * n + 2, Ordering::Release);
        self.next = n + 1;
        self.ring.words[HEAD].store(self.next, Ordering::Release);
        Ok(n)
    }
}

/// One reader of a ring: its own position, in its own process.
#[derive(Debug)]
pub struct Reader<'a> {
    ring: Ring<'a>,
    next: u64,
}

impl<'a> Reader<'a> {
    /// A reader of `ring` starting with the next message published.
    pub fn new(ring: Ring<'a>) -> Reader<'a> {
        Reader {
            next: ring.head().min(MAX_MESSAGES),
            ring,
        }
    }

    /// The number of the next message this reader expects.
    pub fn position(&self) -> u64 {
        self.next
    }

    /// Reads the next message into `out` (replacing its contents): `Ok(Some(n))` with its
    /// number, `Ok(None)` when nothing new was published, or why not.
    pub fn read(&mut self, out: &mut Vec<u8>) -> Result<Option<u64>, ReadError> {
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
            self.next = oldest;
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
        out.clear();
        if fits {
            let len = len as usize;
            for w in &slot[SLOT_HEADER_WORDS..SLOT_HEADER_WORDS + len.div_ceil(8)] {
                out.extend_from_slice(&w.load(Ordering::Relaxed).to_le_bytes());
            }
            out.truncate(len);
        }
        fence(Ordering::Acquire);
        let s2 = slot[0].load(Ordering::Relaxed);
        if s2 != s1 {
            // Overwritten while copied (the length too, maybe): what was copied is torn.
            out.clear();
            return self.lapped(n);
        }
        if !fits {
            return Err(ReadError::Corrupt);
        }
        self.next = n + 1;
        Ok(Some(n))
    }

    /// Message `n` was overwritten: skip to the oldest message the ring may still hold.
    fn lapped(&mut self, n: u64) -> Result<Option<u64>, ReadError> {
        let head = self.ring.head();
        let oldest = head.saturating_sub(self.ring.slots as u64).max(n + 1);
        self.next = oldest;
        Err(ReadError::Lost(oldest - n))
    }
}
