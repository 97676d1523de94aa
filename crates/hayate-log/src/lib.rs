//! Hayate's durable log: a segmented, append-only sequence of records, each with a
//! consecutive offset, a timestamp, a key, headers and a value.
//!
//! - **Records** carry a CRC-32C; a reader or a recovering log never returns bytes that do
//!   not check out ([`record`]).
//! - **Segments** are files named by their first offset; the active one takes appends, sealed
//!   ones get a sparse offset index and a time index (`.idx`).
//! - **Durability** follows an [`FsyncPolicy`]: `always` syncs before confirming, sharing one
//!   fsync among concurrent appenders (group commit); `interval=<ms>` confirms once written
//!   and syncs in the background; `never` leaves it to the OS. Whatever the policy, an
//!   appended record survives the process being killed (it is in the page cache).
//! - **Recovery** on open truncates a torn or garbage tail and rebuilds missing indexes.
//! - **Retention** removes whole sealed segments by age, bytes or count.
//! - **Storage** goes through the [`Storage`] trait; [`FaultyStorage`] injects full disks,
//!   short writes, failed fsyncs and crashes for tests. After a failed fsync the log refuses
//!   writes ([`Error::Poisoned`]).
//!
//! The log knows nothing of sessions, keys' meaning or consumers (DESIGN.md); streams and
//! consumers live in the broker. The on-disk format is in docs/log-format.md.

mod config;
mod error;
mod index;
mod log;
pub mod record;
mod recover;
mod segment;
pub mod storage;
mod sync;

pub use config::{FsyncPolicy, LogConfig, Retention};
pub use error::{Error, Result};
pub use log::{Batch, Log, LogStats, ReadLimit, Removed, SegmentStats};
pub use record::{Entry, Record};
pub use recover::RecoveryReport;
pub use storage::{
    CrashMode, FaultyRoot, FaultyStorage, FsRoot, FsStorage, Root, Storage, StorageFile,
};
pub use sync::Confirmed;
