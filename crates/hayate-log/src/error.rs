//! The log's errors.

use std::io;

use crate::record::Corruption;

/// What went wrong in a log operation.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The storage failed. `op` names what the log was doing.
    #[error("{op}: {source}")]
    Io {
        /// What the log was doing: "append", "sync", "read", "open", ...
        op: &'static str,
        /// The storage's error.
        #[source]
        source: io::Error,
    },
    /// An earlier write or sync failed, so the log no longer knows what reached the disk and
    /// refuses writes; reopening it runs recovery.
    #[error("the log refuses writes after an earlier storage failure ({0}); reopen it to recover")]
    Poisoned(String),
    /// Bytes in a sealed segment are not a valid record (found while reading; recovery
    /// truncates damage only at the tail).
    #[error("corrupt record in segment {segment} at byte {position}: {kind}")]
    Corrupt {
        /// The segment's base offset.
        segment: u64,
        /// Byte position in the segment file.
        position: u64,
        /// What is wrong.
        kind: Corruption,
    },
    /// The offset is not in the log.
    #[error("offset {offset} is outside the log [{start}, {end})")]
    OffsetOutOfRange {
        /// The offset asked for.
        offset: u64,
        /// The first offset still kept.
        start: u64,
        /// The next offset to be written.
        end: u64,
    },
    /// A record is larger than the configured limit.
    #[error("record of {size} bytes exceeds the limit of {max}")]
    RecordTooLarge {
        /// Bytes the record would take.
        size: usize,
        /// The limit ([`crate::LogConfig::max_record_bytes`]).
        max: usize,
    },
    /// The configuration is not usable.
    #[error("invalid log configuration: {0}")]
    Config(String),
    /// The log was closed.
    #[error("the log is closed")]
    Closed,
}

impl Error {
    pub(crate) fn io(op: &'static str) -> impl FnOnce(io::Error) -> Error {
        move |source| Error::Io { op, source }
    }
}

/// The log's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;
