//! The memory a ring lives in: a memfd, sealed against resizing, mapped shared by the writer
//! and by every reader (each in its own process, given the descriptor over a Unix socket).
//!
//! A memfd has no name in any file system: when the last descriptor and mapping go (its
//! writer and readers exited, however they died), the kernel frees it, so a dead peer never
//! leaves a segment behind. The seals matter for readers: a writer that could shrink the
//! file would make a reader's next access past the new end a SIGBUS; so [`Segment::open`]
//! refuses a descriptor that is not sealed against shrinking, growing and further sealing.
//!
//! The one `unsafe` of the crate is here: mapping the file ([`memmap2::MmapOptions::map_mut`]:
//! the file must not be truncated while mapped, which the seals guarantee), viewing the
//! mapping as `&[AtomicU64]` (see [`Segment::words`] for why that is sound), a read-only
//! mapping's bytes in place ([`Segment::bytes_in_place`]), and copying payloads in and out
//! of a region with `memcpy` ([`copy_in`], [`copy_out`], and [`append_out`] straight into a
//! `BytesMut`'s spare room).

use std::fs::File;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::AtomicU64;

use rustix::fs::{MemfdFlags, SealFlags};

/// Largest segment accepted (a reader must not map whatever size a hostile peer claims).
pub const MAX_SEGMENT_BYTES: u64 = 1 << 34;

/// The seals a segment must carry.
const SEALS: SealFlags = SealFlags::SHRINK
    .union(SealFlags::GROW)
    .union(SealFlags::SEAL);

/// Why a descriptor is not a usable segment.
#[derive(Debug, thiserror::Error)]
pub enum SegmentError {
    /// A system call failed.
    #[error("shared memory: {0}")]
    Io(#[from] io::Error),
    /// The memfd can still be resized, or (a segment to map read-only) written by other
    /// processes; or it is not a memfd.
    #[error(
        "shared memory: the segment is not sealed (against resizing, or against writing by others)"
    )]
    NotSealed,
    /// Not ordinary shared memory (a huge-page memfd, a file on disk, ...).
    #[error("shared memory: the segment is not an ordinary memfd")]
    NotShmem,
    /// Empty, not a whole number of 64-bit words, or larger than [`MAX_SEGMENT_BYTES`].
    #[error("shared memory: a segment of {0} bytes is not acceptable")]
    Size(u64),
}

/// `statfs` type of tmpfs (shmem), where ordinary memfds live.
const TMPFS_MAGIC: u64 = 0x0102_1994;

/// Seals of a segment only its maker writes ([`Segment::create_for_readers`]): no mapping
/// made after the seal may write it (the maker's own, made before, still does).
const READ_ONLY_SEALS: SealFlags = SEALS.union(SealFlags::FUTURE_WRITE);

/// A mapping: writable (the segments of rings) or read-only (another process's segment
/// sealed against writing, [`Segment::open_read_only`]).
#[derive(Debug)]
enum Map {
    Rw(memmap2::MmapMut),
    Ro(memmap2::Mmap),
}

impl Map {
    fn as_ptr(&self) -> *const u8 {
        match self {
            Map::Rw(m) => m.as_ptr(),
            Map::Ro(m) => m.as_ptr(),
        }
    }
}

/// A mapped segment.
#[derive(Debug)]
pub struct Segment {
    fd: OwnedFd,
    map: Map,
    words: usize,
    /// Made by [`Segment::create`] (all zeros, never handed out before).
    fresh: bool,
}

impl Segment {
    /// A new segment of `bytes` bytes (rounded up to whole words), zeroed and sealed.
    pub fn create(name: &str, bytes: usize) -> Result<Segment, SegmentError> {
        Segment::create_sealed(name, bytes, SEALS)
    }

    /// [`Segment::create`], sealed also against writing by any mapping but this one
    /// (`F_SEAL_FUTURE_WRITE`, Linux 5.1): the processes it is handed to can only map it
    /// read-only ([`Segment::open_read_only`]), so none of them can change what the
    /// others read. An error on a kernel without that seal.
    pub fn create_for_readers(name: &str, bytes: usize) -> Result<Segment, SegmentError> {
        Segment::create_sealed(name, bytes, READ_ONLY_SEALS)
    }

    fn create_sealed(name: &str, bytes: usize, seals: SealFlags) -> Result<Segment, SegmentError> {
        let bytes = bytes.div_ceil(8) as u64 * 8;
        if bytes == 0 || bytes > MAX_SEGMENT_BYTES {
            return Err(SegmentError::Size(bytes));
        }
        let fd = rustix::fs::memfd_create(name, MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING)
            .map_err(io::Error::from)?;
        rustix::fs::ftruncate(&fd, bytes).map_err(io::Error::from)?;
        // Mapped before the seals: `FUTURE_WRITE` leaves this (earlier) mapping writable.
        let mut s = Segment::map(fd, true)?;
        rustix::fs::fcntl_add_seals(&s.fd, seals).map_err(io::Error::from)?;
        s.fresh = true;
        Ok(s)
    }

    /// Maps a segment another process made (its descriptor, received over a Unix socket),
    /// after checking its seals and size.
    pub fn open(fd: OwnedFd) -> Result<Segment, SegmentError> {
        Segment::check(&fd)?;
        Segment::map(fd, true)
    }

    /// [`Segment::open`], mapped read-only: for a segment its maker alone writes
    /// ([`Segment::create_for_readers`]), which must be sealed against writing by any other
    /// mapping (`F_SEAL_FUTURE_WRITE`): no other process it was handed to can change it.
    pub(crate) fn open_read_only(fd: OwnedFd) -> Result<Segment, SegmentError> {
        Segment::check_seals(&fd, READ_ONLY_SEALS)?;
        Segment::map(fd, false)
    }

    /// The checks [`Segment::open`] makes: sealed against resizing, ordinary shared memory.
    fn check(fd: &OwnedFd) -> Result<(), SegmentError> {
        Segment::check_seals(fd, SEALS)
    }

    /// [`Segment::check`] with the seals `want`.
    fn check_seals(fd: &OwnedFd, want: SealFlags) -> Result<(), SegmentError> {
        let seals = rustix::fs::fcntl_get_seals(fd).map_err(|_| SegmentError::NotSealed)?;
        if !seals.contains(want) {
            return Err(SegmentError::NotSealed);
        }
        // Only ordinary shared memory (tmpfs, where memfds live): a huge-page memfd can be
        // sealed too, but its owner can take its pages back (a hole punched, the pool
        // emptied) and the next read of the mapping here would fault (SIGBUS).
        let fs = rustix::fs::fstatfs(fd).map_err(io::Error::from)?;
        if fs.f_type as u64 & 0xFFFF_FFFF != TMPFS_MAGIC {
            return Err(SegmentError::NotShmem);
        }
        Ok(())
    }

    fn map(fd: OwnedFd, writable: bool) -> Result<Segment, SegmentError> {
        let size = rustix::fs::fstat(&fd).map_err(io::Error::from)?.st_size as u64;
        if size == 0 || !size.is_multiple_of(8) || size > MAX_SEGMENT_BYTES {
            return Err(SegmentError::Size(size));
        }
        let file = File::from(fd.try_clone()?);
        #[allow(unsafe_code)]
        // SAFETY: the file is tmpfs (checked by `open`; `create` makes a plain memfd) and
        // cannot shrink while mapped (sealed: checked by `open`, applied by `create`), so
        // no access within `size` bytes faults (a hole punched in it reads as zeros). Its contents may change under
        // us (that is the point), which is why it is only ever read as atomics.
        let map = unsafe {
            let mut o = memmap2::MmapOptions::new();
            o.len(size as usize);
            if writable {
                Map::Rw(o.map_mut(&file)?)
            } else {
                Map::Ro(o.map(&file)?)
            }
        };
        Ok(Segment {
            fd,
            words: size as usize / 8,
            map,
            fresh: false,
        })
    }

    /// The segment as words, for [`crate::Ring`].
    pub fn words(&self) -> &[AtomicU64] {
        #[allow(unsafe_code)]
        // SAFETY: the mapping is page-aligned (so aligned for `AtomicU64`, which has the size
        // and alignment of `u64`), at least `words * 8` bytes long, and lives as long as
        // `self`. Every access goes through `AtomicU64`, so other threads and processes
        // writing the same memory at the same time is no data race in this process; what
        // they write may be nonsense, which the ring's reader checks. A read-only mapping
        // (`Map::Ro`) is only ever loaded from: atomic loads of read-only memory are sound
        // for lock-free widths (std's `atomic` docs), and a store would fault, not corrupt;
        // its users (`crate::arena::ArenaView`) never store.
        unsafe {
            std::slice::from_raw_parts(self.map.as_ptr().cast::<AtomicU64>(), self.words)
        }
    }

    /// The bytes of the read-only mapping from byte `start`, `len` of them, in place: for
    /// [`crate::arena::ArenaView::get_in_place`] only, which checks the range, and whose
    /// writer does not write the range while the slice lives (the arena's protocol).
    ///
    /// Panics on a range outside the segment, on a writable mapping (this process's own
    /// segments are written through [`Segment::words`] while read), and on a big-endian
    /// host (the bytes are stored as little-endian words: in place they read in order only
    /// on a little-endian one).
    pub(crate) fn bytes_in_place(&self, start: usize, len: usize) -> &[u8] {
        if cfg!(target_endian = "big") {
            panic!("in-place bytes need little-endian words");
        }
        assert!(
            matches!(self.map, Map::Ro(_)),
            "in place only from a read-only mapping"
        );
        let end = start.checked_add(len).expect("range overflows");
        assert!(end <= self.words * 8, "range past the segment");
        #[allow(unsafe_code)]
        // SAFETY: the range is within the mapping (asserted), which lives as long as `self`
        // and cannot shrink (sealed), so every byte is mapped and readable for the slice's
        // lifetime. No mapping in this process writes it (read-only, `Map::Ro`; the maker's
        // writable mapping is in another process, `F_SEAL_FUTURE_WRITE` having refused any
        // other writable one), so nothing here breaks the slice's immutability. The one
        // writer is the segment's maker, through its own mapping (in another process; in
        // tests, another mapping of this one): the arena's protocol has it
        // leave an entry unwritten until every reader counted it released, and a reader
        // counts it released only once it dropped its slices. A maker that broke that
        // protocol could change bytes under the reader (what a reader trusts its maker not
        // to do, as it trusts it with every message: the broker, or a peer node of the same
        // user, which could as well send it other bytes); it could never make a read leave
        // the mapping, whose bounds are fixed.
        unsafe {
            std::slice::from_raw_parts(self.map.as_ptr().add(start), len)
        }
    }

    /// Whether this process made it ([`Segment::create`]): all zeros until written. It does
    /// not know whether it was written through [`Segment::words`] since; its one use is
    /// [`crate::SharedRing::init`], which takes a segment just made.
    pub fn fresh(&self) -> bool {
        self.fresh
    }

    /// The descriptor, to hand to readers.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

/// Copies `dst.len()` bytes of `words`, from byte `offset` on, into `dst`: one `memcpy`
/// (what [`crate::load_bytes`] uses on a little-endian host, instead of 8-byte word loads).
///
/// Panics unless the range is within `words`.
pub(crate) fn copy_out(words: &[AtomicU64], offset: usize, dst: &mut [u8]) {
    let end = offset.checked_add(dst.len()).expect("range overflows");
    assert!(end <= words.len() * 8, "range past the region");
    #[allow(unsafe_code)]
    // SAFETY: the source range is within `words` (asserted), memory this process may read
    // for as long as the borrow lives; `dst` is a distinct, exclusively borrowed buffer
    // (not shared memory), so the ranges do not overlap. The bytes live in `AtomicU64`s,
    // whose `UnsafeCell` allows them to change behind a shared reference, and any byte is a
    // valid `u8`. What a writer stores meanwhile (another process through its own mapping,
    // or, in tests and in a process that runs both ends, another thread through another
    // mapping) can tear the copy: the byte-wise race the sequence lock exists for. Every
    // caller reads its slot's or entry's sequence word again after an acquire fence and
    // throws the copy away if it changed, as it did with the word loads this replaces;
    // the compiler sees an opaque copy from memory it may not assume unchanged, so it
    // cannot make more of the race than torn bytes.
    unsafe {
        std::ptr::copy_nonoverlapping(
            words.as_ptr().cast::<u8>().add(offset),
            dst.as_mut_ptr(),
            dst.len(),
        );
    }
}

/// Appends the first `len` bytes of `words` to `out`, copied straight into its spare room
/// (one `memcpy`, no buffer between): what [`crate::ReadBuf::append_region`] does for a
/// `BytesMut`.
///
/// Panics unless `words` holds `len` bytes.
pub(crate) fn append_out(words: &[AtomicU64], len: usize, out: &mut bytes::BytesMut) {
    assert!(len <= words.len() * 8, "range past the region");
    out.reserve(len);
    let spare = &mut out.spare_capacity_mut()[..len];
    #[allow(unsafe_code)]
    // SAFETY: as for `copy_out`: the source range is within `words` (asserted), bytes that
    // may change behind the shared reference (`AtomicU64`'s `UnsafeCell`) and whose tearing
    // the caller's sequence check catches; the destination is `len` bytes of `out`'s spare
    // capacity (`reserve` made it, the slice index checks it), this process's own memory,
    // so the ranges do not overlap. After the copy those `len` bytes are initialised (any
    // byte is a valid `u8`), which is what `set_len` requires of the new length.
    unsafe {
        std::ptr::copy_nonoverlapping(
            words.as_ptr().cast::<u8>(),
            spare.as_mut_ptr().cast::<u8>(),
            len,
        );
        out.set_len(out.len() + len);
    }
}

/// Copies `src` into `words` from byte `offset` on: one `memcpy` (what
/// [`crate::store_bytes`] uses on a little-endian host, instead of 8-byte word stores).
///
/// Panics unless the range is within `words`.
pub(crate) fn copy_in(words: &[AtomicU64], offset: usize, src: &[u8]) {
    let end = offset.checked_add(src.len()).expect("range overflows");
    assert!(end <= words.len() * 8, "range past the region");
    #[allow(unsafe_code)]
    // SAFETY: the destination range is within `words` (asserted); the `AtomicU64`s'
    // `UnsafeCell` allows writing them through a shared reference; `src` is this
    // process's own buffer, not shared memory, so the ranges do not overlap. Only a
    // writer calls this, on its own writable mapping (a read-only one would fault, not
    // corrupt), on a slot or entry it has marked as being written (an odd sequence word,
    // then a release fence) and publishes afterwards with a release store: readers racing
    // it get torn bytes, which their sequence check throws away (`copy_out`).
    unsafe {
        std::ptr::copy_nonoverlapping(
            src.as_ptr(),
            words.as_ptr().cast::<u8>().cast_mut().add(offset),
            src.len(),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A huge-page memfd, sealed like a segment, is refused: its owner could take its pages
    /// back under the mapping (a SIGBUS in the broker).
    #[test]
    fn a_sealed_huge_page_memfd_is_refused() {
        let fd = match rustix::fs::memfd_create(
            "huge",
            MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING | MemfdFlags::HUGETLB,
        ) {
            Ok(fd) => fd,
            Err(e) => {
                eprintln!("no huge-page memfd on this kernel ({e}): nothing to check");
                return;
            }
        };
        rustix::fs::ftruncate(&fd, 2 << 20).unwrap();
        rustix::fs::fcntl_add_seals(&fd, SEALS).unwrap();
        assert!(matches!(Segment::open(fd), Err(SegmentError::NotShmem)));
        // An ordinary sealed memfd still opens.
        let ok = Segment::create("ok", 4096).unwrap();
        let fd = ok.fd.try_clone().unwrap();
        assert!(Segment::open(fd).is_ok());
    }
}
