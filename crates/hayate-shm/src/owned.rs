//! A ring in a [`Segment`] held by reference count, with an owned writer and owned
//! readers (for tasks that outlive any borrow): the same [`Writer`] and [`Reader`], over a
//! geometry checked once.

use std::sync::Arc;

use super::{LayoutError, NoCursor, ReadError, Reader, Ring, TooLarge, Writer};
use crate::segment::Segment;

/// A segment and the ring in it (geometry checked when made).
#[derive(Debug, Clone)]
pub struct SharedRing {
    segment: Arc<Segment>,
    slots: usize,
    slot_words: usize,
}

impl SharedRing {
    /// Makes `segment` an empty ring ([`Ring::init`]).
    pub fn init(
        segment: Segment,
        slots: usize,
        max_payload: usize,
    ) -> Result<SharedRing, LayoutError> {
        let (slots, slot_words) = {
            // A segment just made is zero already: writing zeros would make every page
            // of it resident at once.
            let r = Ring::init_with(segment.words(), slots, max_payload, !segment.fresh())?;
            (r.slots, r.slot_words)
        };
        Ok(SharedRing {
            segment: Arc::new(segment),
            slots,
            slot_words,
        })
    }

    /// The ring another process made in `segment` ([`Ring::attach`]: checked against
    /// the segment's size once; the geometry is not read again).
    pub fn attach(segment: Segment) -> Result<SharedRing, LayoutError> {
        let (slots, slot_words) = {
            let r = Ring::attach(segment.words())?;
            (r.slots, r.slot_words)
        };
        Ok(SharedRing {
            segment: Arc::new(segment),
            slots,
            slot_words,
        })
    }

    /// The ring, borrowed.
    pub fn ring(&self) -> Ring<'_> {
        Ring {
            words: self.segment.words(),
            slots: self.slots,
            slot_words: self.slot_words,
        }
    }

    /// Messages published so far.
    pub fn head(&self) -> u64 {
        self.ring().head()
    }

    /// [`Ring::take_sleepers`] (no writer needed).
    pub fn take_sleepers(&self, mask: u64) -> u64 {
        self.ring().take_sleepers(mask)
    }

    /// Whether the reader registered at cursor `index` has committed every message
    /// before `upto` (or that entry is free now: no one to wait for).
    pub fn has_read(&self, index: usize, upto: u64) -> bool {
        if index >= super::MAX_READERS {
            return true;
        }
        let v =
            self.ring().words[super::CURSORS + index].load(std::sync::atomic::Ordering::Acquire);
        // Behind `upto` by less than 2^47 (modulo 2^48): not yet.
        let behind = upto.wrapping_sub(v) & super::POS_MASK;
        v == 0 || behind == 0 || behind >= 1 << 47
    }

    /// [`Ring::evict`].
    pub fn evict(&self, index: usize) {
        self.ring().evict(index);
    }

    /// Header word 4, which the ring leaves alone: the writer's side may publish
    /// something of its own in it for the readers' side (the broker transport: how many
    /// fan-out entries the client has released). Nothing in it is trusted by the ring.
    pub fn owner_word(&self) -> &std::sync::atomic::AtomicU64 {
        &self.ring().words[super::OWNER]
    }

    /// The segment (to hand its descriptor to readers).
    pub fn segment(&self) -> &Segment {
        &self.segment
    }
}

/// The writer of a [`SharedRing`], owned.
#[derive(Debug)]
pub struct SharedWriter {
    ring: SharedRing,
    next: u64,
    room: u64,
}

impl SharedWriter {
    /// The writer, continuing after what the ring holds.
    pub fn new(ring: SharedRing) -> SharedWriter {
        let next = ring.ring().head();
        SharedWriter {
            ring,
            next,
            room: 0,
        }
    }

    fn with<T>(&mut self, f: impl FnOnce(&mut Writer<'_>) -> T) -> T {
        let mut w = Writer {
            ring: self.ring.ring(),
            next: self.next,
            room: self.room,
        };
        let r = f(&mut w);
        self.next = w.next;
        self.room = w.room;
        r
    }

    /// [`Writer::publish`].
    pub fn publish(&mut self, payload: &[u8]) -> Result<u64, TooLarge> {
        self.with(|w| w.publish(payload))
    }

    /// [`Writer::try_publish`].
    pub fn try_publish(&mut self, payload: &[u8]) -> Result<Option<u64>, TooLarge> {
        self.with(|w| w.try_publish(payload))
    }

    /// [`Writer::try_publish_parts`].
    pub fn try_publish_parts(&mut self, parts: &[&[u8]]) -> Result<Option<u64>, TooLarge> {
        self.with(|w| w.try_publish_parts(parts))
    }

    /// [`Writer::blocking_reader`].
    pub fn blocking_reader(&mut self) -> Option<usize> {
        self.with(|w| w.blocking_reader())
    }

    /// [`Writer::prepare_wait`].
    pub fn prepare_wait(&mut self) {
        self.with(|w| w.prepare_wait());
    }

    /// [`Writer::sleepers`].
    pub fn sleepers(&mut self) -> u64 {
        self.with(|w| w.sleepers())
    }

    /// [`Writer::sleepers_among`].
    pub fn sleepers_among(&mut self, mask: u64) -> u64 {
        self.with(|w| w.sleepers_among(mask))
    }

    /// The largest payload a slot holds.
    pub fn max_payload(&self) -> usize {
        self.ring.ring().max_payload()
    }

    /// [`Writer::close`].
    pub fn close(&mut self) {
        self.with(|w| w.close());
    }

    /// The ring.
    pub fn shared(&self) -> &SharedRing {
        &self.ring
    }
}

/// A reader of a [`SharedRing`], owned (its cursor entry, if registered, is freed when
/// it is dropped).
#[derive(Debug)]
pub struct SharedReader {
    ring: SharedRing,
    next: u64,
    cursor: Option<(usize, u64)>,
    committed: u64,
    deferred: bool,
}

impl SharedReader {
    /// [`Reader::register_with`].
    pub fn register(ring: SharedRing, waits: bool) -> Result<SharedReader, NoCursor> {
        let (next, cursor) = {
            let mut r = Reader::register_with(ring.ring(), waits)?;
            (r.next, r.cursor.take())
        };
        Ok(SharedReader {
            ring,
            next,
            cursor,
            committed: next,
            deferred: false,
        })
    }

    fn borrowed(&mut self) -> Reader<'_> {
        Reader {
            ring: self.ring.ring(),
            next: self.next,
            cursor: self.cursor.take(),
            committed: self.committed,
            deferred: self.deferred,
        }
    }

    fn with<T>(&mut self, f: impl FnOnce(&mut Reader<'_>) -> T) -> T {
        let mut r = self.borrowed();
        let out = f(&mut r);
        let (next, committed, deferred) = (r.next, r.committed, r.deferred);
        // Taken back, so that dropping `r` leaves the entry registered.
        let cursor = r.cursor.take();
        drop(r);
        self.next = next;
        self.committed = committed;
        self.deferred = deferred;
        self.cursor = cursor;
        out
    }

    /// [`Reader::set_deferred`].
    pub fn set_deferred(&mut self, deferred: bool) {
        self.with(|r| r.set_deferred(deferred));
    }

    /// [`Reader::commit`].
    pub fn commit(&mut self) -> bool {
        self.with(|r| r.commit())
    }

    /// [`Reader::read`].
    pub fn read(&mut self, out: &mut Vec<u8>) -> Result<Option<u64>, ReadError> {
        self.with(|r| r.read(out))
    }

    /// [`Reader::cursor`].
    pub fn cursor(&self) -> Option<usize> {
        self.cursor.map(|(i, _)| i)
    }

    /// The largest message a slot holds (what one read may append).
    pub fn max_payload(&self) -> usize {
        self.ring.ring().max_payload()
    }

    /// [`Reader::read_append`].
    pub fn read_append<B: super::ReadBuf + ?Sized>(
        &mut self,
        out: &mut B,
    ) -> Result<Option<u64>, ReadError> {
        self.with(|r| r.read_append(out))
    }

    /// [`Reader::read_append_if`].
    pub fn read_append_if<B: super::ReadBuf + ?Sized>(
        &mut self,
        out: &mut B,
        take: impl FnOnce(&[u8]) -> bool,
    ) -> Result<Option<(u64, bool)>, ReadError> {
        self.with(|r| r.read_append_if(out, take))
    }

    /// [`Reader::registered`].
    pub fn registered(&mut self) -> bool {
        self.with(|r| r.registered())
    }

    /// [`Reader::waited_for`].
    pub fn waited_for(&mut self) -> bool {
        self.with(|r| r.waited_for())
    }

    /// [`Reader::set_waited_for`].
    pub fn set_waited_for(&mut self, waits: bool) -> bool {
        self.with(|r| r.set_waited_for(waits))
    }

    /// [`Reader::prepare_sleep`].
    pub fn prepare_sleep(&mut self) -> bool {
        self.with(|r| r.prepare_sleep())
    }

    /// [`Reader::end_sleep`].
    pub fn end_sleep(&mut self) {
        self.with(|r| r.end_sleep());
    }

    /// [`Reader::writer_waits`].
    pub fn writer_waits(&mut self) -> bool {
        self.with(|r| r.writer_waits())
    }

    /// Whether the writer has published past this reader's position (there is
    /// something to read, or to learn lost).
    pub fn pending(&self) -> bool {
        self.ring.ring().head() != self.next
    }

    /// [`Reader::position`].
    pub fn position(&self) -> u64 {
        self.next
    }

    /// [`Ring::closed`].
    pub fn closed(&self) -> bool {
        self.ring.ring().closed()
    }
}

impl Drop for SharedReader {
    fn drop(&mut self) {
        // The borrowed reader's drop frees the entry.
        drop(self.borrowed());
    }
}
