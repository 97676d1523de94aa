//! The copies between a region of shared words and bytes: [`store_bytes`] and
//! [`load_bytes`] (by `memcpy` on a little-endian host, by atomic word stores and loads
//! under loom and on a big-endian one), the [`ReadBuf`] a reader appends to, and the
//! [`Region`] it appends from.

#[cfg(loom)]
use loom::sync::atomic::{AtomicU64, Ordering};
#[cfg(not(loom))]
use std::sync::atomic::{AtomicU64, Ordering};

#[cfg(not(loom))]
use crate::segment;

/// Stores the concatenation of `parts` into `words` (which must hold it), little-endian
/// (byte `i` of the message is byte `i % 8` of word `i / 8` in little-endian order), the
/// last word padded with zeros. On a little-endian host each part is one `memcpy`
/// (`segment::copy_in`): about twice as fast as word stores for large payloads.
pub(crate) fn store_bytes<'a>(words: &[AtomicU64], parts: impl IntoIterator<Item = &'a [u8]>) {
    #[cfg(all(not(loom), target_endian = "little"))]
    {
        let mut off = 0;
        for p in parts {
            segment::copy_in(words, off, p);
            off += p.len();
        }
        let pad = off.next_multiple_of(8) - off;
        if pad > 0 {
            segment::copy_in(words, off, &[0u8; 8][..pad]);
        }
    }
    #[cfg(any(loom, target_endian = "big"))]
    store_words(words, parts);
}

/// Appends the first `len` bytes held by `words` (which must hold them) to `out`: what a
/// writer stores meanwhile can tear the copy, which the caller finds out by its own
/// protocol (a sequence word read again after an acquire fence). On a little-endian host
/// by `memcpy` (`segment::copy_out`), through [`ReadBuf::append_region`]: straight into
/// the spare room of a `BytesMut`, through a buffer on the stack for other buffers.
pub(crate) fn load_bytes<B: ReadBuf + ?Sized>(words: &[AtomicU64], len: usize, out: &mut B) {
    #[cfg(all(not(loom), target_endian = "little"))]
    {
        out.reserve(len);
        out.append_region(Region { words, len });
    }
    #[cfg(any(loom, target_endian = "big"))]
    load_words(words, len, out);
}

/// The first `len` bytes of a region of shared memory, which another process may be writing
/// meanwhile: what [`ReadBuf::append_region`] copies. A copy can be torn; the reader that
/// made it finds out by its own protocol and throws it away.
#[cfg(not(loom))]
#[derive(Debug, Clone, Copy)]
pub struct Region<'a> {
    words: &'a [AtomicU64],
    len: usize,
}

#[cfg(not(loom))]
impl Region<'_> {
    /// Bytes in the region.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it holds no byte.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Copies `dst.len()` bytes of the region, from byte `offset` on, into `dst`.
    ///
    /// Panics unless the range is within the region.
    pub fn copy_to(&self, offset: usize, dst: &mut [u8]) {
        let end = offset.checked_add(dst.len()).expect("range overflows");
        assert!(end <= self.len, "range past the region");
        segment::copy_out(self.words, offset, dst);
    }
}

/// [`store_bytes`] by relaxed atomic word stores, 8 bytes each (under loom, and on a
/// big-endian host).
#[cfg_attr(all(not(loom), target_endian = "little", not(test)), allow(dead_code))]
fn store_words<'a>(words: &[AtomicU64], parts: impl IntoIterator<Item = &'a [u8]>) {
    // Whole words straight from each part; the bytes where two parts meet gather in `acc`
    // (`fill` of its 8 bytes taken).
    let (mut wi, mut acc, mut fill) = (0, [0u8; 8], 0);
    for part in parts {
        let mut p = part;
        if fill > 0 {
            let take = (8 - fill).min(p.len());
            acc[fill..fill + take].copy_from_slice(&p[..take]);
            fill += take;
            p = &p[take..];
            if fill < 8 {
                continue; // this part is used up
            }
            words[wi].store(u64::from_le_bytes(acc), Ordering::Relaxed);
            wi += 1;
        }
        let whole = p.chunks_exact(8);
        let rest = whole.remainder();
        for c in whole {
            let mut b = [0u8; 8];
            b.copy_from_slice(c);
            words[wi].store(u64::from_le_bytes(b), Ordering::Relaxed);
            wi += 1;
        }
        acc[..rest.len()].copy_from_slice(rest);
        fill = rest.len();
    }
    if fill > 0 {
        acc[fill..].fill(0);
        words[wi].store(u64::from_le_bytes(acc), Ordering::Relaxed);
    }
}

/// [`load_bytes`] by relaxed atomic word loads (under loom, and on a big-endian host).
#[cfg_attr(all(not(loom), target_endian = "little", not(test)), allow(dead_code))]
fn load_words<B: ReadBuf + ?Sized>(words: &[AtomicU64], len: usize, out: &mut B) {
    let base = out.len();
    let words = &words[..len.div_ceil(8)];
    out.reserve(words.len() * 8);
    // Through a small buffer on the stack: word loads into it, then one copy out (the
    // output is neither zeroed first nor written 8 bytes per call).
    let mut stage = [0u8; 512];
    for group in words.chunks(stage.len() / 8) {
        for (b, w) in stage.chunks_exact_mut(8).zip(group) {
            b.copy_from_slice(&w.load(Ordering::Relaxed).to_le_bytes());
        }
        out.extend_from_slice(&stage[..group.len() * 8]);
    }
    out.truncate(base + len);
}

/// A growable byte buffer a reader appends messages to ([`crate::Reader::read_append`]):
/// `Vec<u8>`, or a caller's own (a `BytesMut` behind a newtype).
pub trait ReadBuf {
    /// Bytes held.
    fn len(&self) -> usize;
    /// Whether it holds nothing.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Makes room for `additional` more bytes.
    fn reserve(&mut self, additional: usize);
    /// Appends `bytes`.
    fn extend_from_slice(&mut self, bytes: &[u8]);
    /// Shrinks to `len` bytes (no-op if shorter).
    fn truncate(&mut self, len: usize);
    /// Appends the bytes of `region` (room for them was reserved just before). By default
    /// through a buffer on the stack, 4 KiB at a time; a `BytesMut` (or a newtype that
    /// hands this on to one) copies straight into its spare room.
    #[cfg(not(loom))]
    fn append_region(&mut self, region: Region<'_>) {
        let mut stage = [0u8; 4096];
        let mut off = 0;
        while off < region.len() {
            let n = (region.len() - off).min(stage.len());
            region.copy_to(off, &mut stage[..n]);
            self.extend_from_slice(&stage[..n]);
            off += n;
        }
    }
}

impl ReadBuf for bytes::BytesMut {
    fn len(&self) -> usize {
        bytes::BytesMut::len(self)
    }
    fn reserve(&mut self, additional: usize) {
        bytes::BytesMut::reserve(self, additional);
    }
    fn extend_from_slice(&mut self, bytes: &[u8]) {
        bytes::BytesMut::extend_from_slice(self, bytes);
    }
    fn truncate(&mut self, len: usize) {
        bytes::BytesMut::truncate(self, len);
    }
    #[cfg(not(loom))]
    fn append_region(&mut self, region: Region<'_>) {
        segment::append_out(region.words, region.len, self);
    }
}

impl ReadBuf for Vec<u8> {
    fn len(&self) -> usize {
        Vec::len(self)
    }
    fn reserve(&mut self, additional: usize) {
        Vec::reserve(self, additional);
    }
    fn extend_from_slice(&mut self, bytes: &[u8]) {
        Vec::extend_from_slice(self, bytes);
    }
    fn truncate(&mut self, len: usize) {
        Vec::truncate(self, len);
    }
}

#[cfg(all(test, not(loom), target_endian = "little"))]
mod copy_tests {
    use super::*;

    proptest::proptest! {
        /// The `memcpy` copies leave the region exactly as the word stores do (padding
        /// included) and read back what the word loads read, through the stack (`Vec`) or
        /// straight into a `BytesMut`, for any split into parts and any length.
        #[test]
        fn memcpy_and_word_copies_agree(
            parts in proptest::collection::vec(proptest::collection::vec(proptest::prelude::any::<u8>(), 0..40), 0..6),
            junk in proptest::prelude::any::<u64>(),
            prefix in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..9),
        ) {
            let len: usize = parts.iter().map(Vec::len).sum();
            let n = len.div_ceil(8) + 2;
            let a: Vec<AtomicU64> = (0..n).map(|_| AtomicU64::new(junk)).collect();
            let b: Vec<AtomicU64> = (0..n).map(|_| AtomicU64::new(junk)).collect();
            store_bytes(&a, parts.iter().map(Vec::as_slice));
            store_words(&b, parts.iter().map(Vec::as_slice));
            let words = |r: &[AtomicU64]| r.iter().map(|w| w.load(Ordering::Relaxed)).collect::<Vec<_>>();
            proptest::prop_assert_eq!(words(&a), words(&b));
            let (mut x, mut y) = (prefix.clone(), prefix.clone());
            load_bytes(&a, len, &mut x);
            load_words(&a, len, &mut y);
            proptest::prop_assert_eq!(&x, &y);
            // Straight into a `BytesMut`'s spare room (`append_out`), after what it held.
            let mut z = bytes::BytesMut::from(&prefix[..]);
            load_bytes(&a, len, &mut z);
            proptest::prop_assert_eq!(&z[..], &x[..]);
            proptest::prop_assert_eq!(&x[prefix.len()..], &parts.concat()[..]);
        }
    }
}
