//! How a log is shaped and when it syncs.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use crate::error::{Error, Result};
use crate::record::RECORD_OVERHEAD;

/// When appended records are made durable with fsync (fdatasync).
///
/// Whatever the policy, a record is in the page cache once `append` returns, so it survives
/// the process being killed; the policy decides what survives a power loss or kernel crash.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FsyncPolicy {
    /// A record is durable only after a sync that covers it. Concurrent appenders share
    /// syncs (group commit): one sync covers everything written before it started.
    Always,
    /// A background sync at most this often, when something was written.
    Interval(Duration),
    /// Never sync (the OS writes back when it likes); durable = written.
    Never,
}

impl Default for FsyncPolicy {
    fn default() -> Self {
        FsyncPolicy::Interval(Duration::from_millis(100))
    }
}

impl fmt::Display for FsyncPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FsyncPolicy::Always => f.write_str("always"),
            FsyncPolicy::Interval(d) => write!(f, "interval={}", d.as_millis()),
            FsyncPolicy::Never => f.write_str("never"),
        }
    }
}

impl FromStr for FsyncPolicy {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "always" => Ok(FsyncPolicy::Always),
            "never" => Ok(FsyncPolicy::Never),
            _ => {
                let ms = s
                    .strip_prefix("interval=")
                    .and_then(|v| v.strip_suffix("ms").unwrap_or(v).parse::<u64>().ok())
                    .filter(|ms| *ms > 0)
                    .ok_or_else(|| {
                        format!(
                            "fsync policy {s:?}: expected always, never or interval=<ms> (ms > 0)"
                        )
                    })?;
                Ok(FsyncPolicy::Interval(Duration::from_millis(ms)))
            }
        }
    }
}

/// Which old records are removed. Whole sealed segments are removed, oldest first, so a log
/// keeps up to one segment more than a bytes or count limit says; the active segment is never
/// removed by retention.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Retention {
    /// Remove a segment once its newest record is older than this.
    pub max_age: Option<Duration>,
    /// Remove the oldest segments while the others still hold at least this many bytes.
    pub max_bytes: Option<u64>,
    /// Remove the oldest segments while the others still hold at least this many records.
    pub max_records: Option<u64>,
}

/// The shape of one log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LogConfig {
    /// A segment is sealed and a new one started once it would grow past this (default
    /// 128 MiB; at most 2 GiB). A record larger than this gets a segment of its own.
    pub segment_bytes: u64,
    /// One sparse index entry per this many bytes of records (default 4 KiB).
    pub index_interval_bytes: u32,
    /// The largest record accepted, overhead included (default 64 MiB + 128 KiB).
    pub max_record_bytes: usize,
    /// When records are synced.
    pub fsync: FsyncPolicy,
    /// What is removed by [`crate::Log::apply_retention`].
    pub retention: Retention,
}

impl Default for LogConfig {
    fn default() -> Self {
        LogConfig {
            segment_bytes: 128 << 20,
            index_interval_bytes: 4096,
            max_record_bytes: (64 << 20) + (128 << 10),
            fsync: FsyncPolicy::default(),
            retention: Retention::default(),
        }
    }
}

/// Segment files stay below this so that positions fit the index's u32.
pub(crate) const MAX_SEGMENT_BYTES: u64 = 2 << 30;

impl LogConfig {
    /// Checks the limits (segment size, index interval, record size, fsync interval).
    pub fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(Error::Config(m));
        if self.segment_bytes < 4096 || self.segment_bytes > MAX_SEGMENT_BYTES {
            return bad(format!(
                "segment_bytes {} is not in [4096, 2 GiB]",
                self.segment_bytes
            ));
        }
        if self.index_interval_bytes == 0 {
            return bad("index_interval_bytes must be above 0".into());
        }
        // An index file (20 bytes per interval at most) must stay loadable (64 MiB).
        if self.segment_bytes / u64::from(self.index_interval_bytes) * 20 > 60 << 20 {
            return bad(format!(
                "index_interval_bytes {} is too small for segment_bytes {} (index over 60 MiB)",
                self.index_interval_bytes, self.segment_bytes
            ));
        }
        if self.max_record_bytes <= RECORD_OVERHEAD
            || self.max_record_bytes as u64 > MAX_SEGMENT_BYTES / 2
        {
            return bad(format!(
                "max_record_bytes {} is not in ({RECORD_OVERHEAD}, 1 GiB]",
                self.max_record_bytes
            ));
        }
        if let FsyncPolicy::Interval(d) = self.fsync
            && d.is_zero()
        {
            return bad("fsync interval must be above 0".into());
        }
        Ok(())
    }

    /// The largest record body the length field may announce.
    pub(crate) fn max_body(&self) -> u32 {
        u32::try_from(self.max_record_bytes - crate::record::FRAME_HEADER_LEN).unwrap_or(u32::MAX)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fsync_policy_parses_and_prints() {
        for s in ["always", "never", "interval=250"] {
            assert_eq!(s.parse::<FsyncPolicy>().unwrap().to_string(), s);
        }
        assert_eq!(
            "interval=5ms".parse::<FsyncPolicy>(),
            Ok(FsyncPolicy::Interval(Duration::from_millis(5)))
        );
        for bad in ["", "sometimes", "interval=", "interval=0", "interval=-3"] {
            assert!(bad.parse::<FsyncPolicy>().is_err(), "{bad}");
        }
    }

    #[test]
    fn config_limits_are_checked() {
        assert!(LogConfig::default().validate().is_ok());
        assert!(
            LogConfig {
                segment_bytes: 10,
                ..LogConfig::default()
            }
            .validate()
            .is_err()
        );
        assert!(
            LogConfig {
                index_interval_bytes: 0,
                ..LogConfig::default()
            }
            .validate()
            .is_err()
        );
        assert!(
            LogConfig {
                max_record_bytes: 3,
                ..LogConfig::default()
            }
            .validate()
            .is_err()
        );
    }
}
