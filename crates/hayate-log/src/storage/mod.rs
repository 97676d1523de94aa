//! The I/O seam: a directory of files the log reads and writes through, so that tests can
//! swap the file system for one that fails on purpose ([`FaultyStorage`]).
//!
//! Semantics follow POSIX: `write_at` may write less than asked (the caller loops),
//! data written but not synced survives a process crash but not a power loss, a created
//! or removed name is durable only after [`Storage::sync_dir`], and a removed file stays
//! readable through handles already open.

use std::fmt;
use std::io;
use std::sync::Arc;

use bytes::Bytes;

mod faulty;
mod fs;
pub(crate) mod map;
mod root;

pub use faulty::{CrashMode, FaultyStorage};
pub use fs::FsStorage;
pub use root::{FaultyRoot, FsRoot, Root};

/// One open file.
#[allow(clippy::len_without_is_empty)] // `len` is an I/O call; emptiness is not a question the log asks
pub trait StorageFile: Send + Sync + fmt::Debug {
    /// Its current length in bytes.
    fn len(&self) -> io::Result<u64>;
    /// Reads at `pos`; returns the bytes read (0 at the end).
    fn read_at(&self, buf: &mut [u8], pos: u64) -> io::Result<usize>;
    /// Writes at `pos`; may write fewer bytes than given.
    fn write_at(&self, buf: &[u8], pos: u64) -> io::Result<usize>;
    /// Truncates or extends (with zeros) to `len`.
    fn set_len(&self, len: u64) -> io::Result<()>;
    /// Makes the data written so far durable (fdatasync).
    fn sync_data(&self) -> io::Result<()>;
    /// `len` bytes at `pos` without copying them (a memory mapping), where the storage can;
    /// `None` where it cannot (the log then reads a copy). The log asks only for whole
    /// records it will not rewrite or truncate (see `map.rs` for the invariants).
    fn map(&self, _pos: u64, _len: usize) -> Option<io::Result<Bytes>> {
        None
    }
}

/// A directory of files.
pub trait Storage: Send + Sync + fmt::Debug {
    /// The names of the files in the directory.
    fn list(&self) -> io::Result<Vec<String>>;
    /// Opens `name` for reading and writing; creates it (empty) if `create` and it is absent.
    fn open(&self, name: &str, create: bool) -> io::Result<Arc<dyn StorageFile>>;
    /// Removes `name`.
    fn remove(&self, name: &str) -> io::Result<()>;
    /// Makes creations and removals in the directory durable.
    fn sync_dir(&self) -> io::Result<()>;
}

/// Writes all of `buf` at `pos`, looping over short writes.
pub(crate) fn write_all_at(f: &dyn StorageFile, mut buf: &[u8], mut pos: u64) -> io::Result<()> {
    while !buf.is_empty() {
        match f.write_at(buf, pos) {
            Ok(0) => return Err(io::Error::new(io::ErrorKind::WriteZero, "write returned 0")),
            Ok(n) => {
                buf = &buf[n..];
                pos += n as u64;
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Reads until `buf` is full or the file ends; returns the bytes read.
pub(crate) fn read_full_at(f: &dyn StorageFile, buf: &mut [u8], pos: u64) -> io::Result<usize> {
    let mut got = 0;
    while got < buf.len() {
        match f.read_at(&mut buf[got..], pos + got as u64) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(got)
}
