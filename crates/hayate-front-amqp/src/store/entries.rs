//! The `acks` and `returns` files: entries of a fixed size, appended between rewrites.

use std::io::Write;
use std::path::Path;

use hayate_log::storage::write_atomically;

/// `acks` and `returns` are rewritten (with only what is still needed) once they are this
/// large and have doubled since they were last rewritten.
pub(super) const REWRITE_BYTES: u64 = 1 << 20;

/// A file of fixed-size entries appended between rewrites (`acks`, `returns`).
#[derive(Debug)]
pub(super) struct Entries {
    name: &'static str,
    file: std::fs::File,
    /// Its size after it was last rewritten.
    base: u64,
}

impl Entries {
    /// Writes `dir/name` with `bytes` (atomically) and opens it for appending.
    pub(super) fn create(dir: &Path, name: &'static str, bytes: &[u8]) -> std::io::Result<Entries> {
        write_atomically(dir, name, bytes)?;
        let file = std::fs::OpenOptions::new()
            .append(true)
            .open(dir.join(name))?;
        Ok(Entries {
            name,
            file,
            base: bytes.len() as u64,
        })
    }

    /// Appends `bytes` whole or not at all: a failed write is cut off again, so the entries
    /// after it stay aligned.
    pub(super) fn append(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        let len = self.file.metadata()?.len();
        self.file.write_all(bytes).inspect_err(|_| {
            let _ = self.file.set_len(len);
        })
    }

    /// It has grown enough to be rewritten.
    pub(super) fn wants_rewrite(&self) -> bool {
        let size = self.file.metadata().map_or(0, |m| m.len());
        size >= REWRITE_BYTES && size >= 2 * self.base
    }

    /// Replaces the file with `bytes`.
    pub(super) fn rewrite(&mut self, dir: &Path, bytes: &[u8]) -> std::io::Result<()> {
        let mut e = Entries::create(dir, self.name, bytes)?;
        e.base = e.base.max(REWRITE_BYTES / 2);
        *self = e;
        Ok(())
    }
}

/// The entries of `N` bytes in `path` (none if it does not exist; a torn last one is
/// ignored).
pub(super) fn read_entries<const N: usize>(path: &Path) -> std::io::Result<Vec<[u8; N]>> {
    let raw = match std::fs::read(path) {
        Ok(r) => r,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
        Err(e) => return Err(e),
    };
    Ok(raw
        .chunks_exact(N)
        .map(|c| c.try_into().unwrap_or([0; N]))
        .collect())
}

/// `acks`' entries: offsets, 8 bytes big-endian.
pub(super) fn acks_bytes(acks: impl IntoIterator<Item = u64>) -> Vec<u8> {
    acks.into_iter().flat_map(u64::to_be_bytes).collect()
}

/// `returns`' entries: an id (8 bytes) and its count (4), big-endian.
pub(super) fn returns_bytes(returns: impl IntoIterator<Item = (u64, u32)>) -> Vec<u8> {
    let mut v = Vec::new();
    for (id, n) in returns {
        v.extend_from_slice(&id.to_be_bytes());
        v.extend_from_slice(&n.to_be_bytes());
    }
    v
}
