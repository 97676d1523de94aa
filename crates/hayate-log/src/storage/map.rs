//! Zero-copy reads: a byte range of a segment file mapped into memory and handed out as
//! [`Bytes`] (the mapping lives as long as any slice of it). The one place in the crate with
//! `unsafe` code.
//!
//! # Invariants (why the mapping is sound)
//!
//! Mapping a file is `unsafe` because the bytes behind the mapping can change, or vanish, while
//! Rust code holds a `&[u8]` into them: another writer changes them (the slice is not immutable
//! after all), or the file is truncated below the mapped range (touching those pages raises
//! `SIGBUS`). The log maps only ranges it will never write or truncate again while this process
//! runs:
//!
//! 1. Only whole records that were completely written before the read started are mapped
//!    (the read stops at the segment's valid size, taken under the log's lock).
//! 2. The log never rewrites a byte of a record once written: appends go past the end.
//! 3. The log truncates a segment only (a) in recovery at open, before any read, and (b) after
//!    a failed append, back to the segment's valid size, which is at or beyond every mapped
//!    range by 1.
//! 4. Removing a segment (retention, purge, stream deletion) unlinks the file: a mapping of an
//!    unlinked file stays valid until unmapped.
//! 5. Nobody else writes the directory: the broker holds `<data_dir>/lock`, and the docs say
//!    that editing a live data directory by hand is unsupported (docs/log-format.md). A process
//!    that truncates a segment under a running broker anyway can crash it with `SIGBUS`; the
//!    records' CRC is still checked on the mapped bytes, so changed bytes are caught as
//!    corruption at read time (not after).

use std::fs::File;
use std::io;

use bytes::Bytes;
use memmap2::MmapOptions;

/// Bytes from which the log maps a record instead of copying it.
pub(crate) const MAP_MIN: usize = 64 << 10;

/// `len` bytes of `file` at `pos`, mapped read-only (populated up front: one system call
/// instead of a page fault per 4 KiB).
pub(crate) fn map(file: &File, pos: u64, len: usize) -> io::Result<Bytes> {
    if len == 0 {
        return Ok(Bytes::new());
    }
    let page = page_size();
    let start = pos - pos % page;
    let skip = usize::try_from(pos - start).map_err(io::Error::other)?;
    let mut opts = MmapOptions::new();
    opts.offset(start).len(skip + len).populate();
    // SAFETY: see the module's invariants: the range holds whole records the log will neither
    // rewrite nor truncate while the mapping lives.
    #[allow(unsafe_code)]
    let m = unsafe { opts.map(file)? };
    #[cfg(unix)]
    {
        // Readers go through large records front to back, once.
        let _ = m.advise(memmap2::Advice::Sequential);
    }
    Ok(Bytes::from_owner(m).slice(skip..skip + len))
}

/// The mapping offset must be a multiple of the page size: 4 KiB on x86-64; elsewhere 64 KiB,
/// a multiple of every page size Linux uses there (4, 16 and 64 KiB).
fn page_size() -> u64 {
    if cfg!(target_arch = "x86_64") {
        4 << 10
    } else {
        64 << 10
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn maps_an_unaligned_range_and_outlives_the_unlinked_file() {
        let dir = std::env::temp_dir().join(format!("hayate-map-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("f");
        let data: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
        std::fs::File::create(&path)
            .unwrap()
            .write_all(&data)
            .unwrap();
        let f = File::open(&path).unwrap();
        for (pos, len) in [(0usize, 10usize), (70_000, 100_000), (299_999, 1), (5, 0)] {
            let b = map(&f, pos as u64, len).unwrap();
            assert_eq!(&b[..], &data[pos..pos + len], "{pos}+{len}");
        }
        let held = map(&f, 100_001, 150_000).unwrap();
        drop(f);
        std::fs::remove_file(&path).unwrap();
        std::fs::remove_dir(&dir).unwrap();
        assert_eq!(&held[..], &data[100_001..250_001]);
    }
}
