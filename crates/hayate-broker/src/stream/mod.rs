//! Streams: durable logs (`hayate-log`) that capture the messages published on some key
//! expressions. The broker appends every captured message before delivering it live; a
//! publisher that asks for a confirm gets it once the record is durable under the stream's
//! fsync policy.
//!
//! A stream's log lives in `<data_dir>/streams/<name>/` (through the broker's storage
//! root); its definition is the meta log's record `stream/<name>` (`crate::meta`).

pub mod api;
pub mod codec;
pub mod consumer;
pub mod member;
pub(crate) mod registry;

use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use hayate_core::{Key, KeyExpr};
use hayate_log::{Entry, FsyncPolicy, Log, LogConfig, LogStats, Retention};

use crate::Batch;

/// A stream's definition and state as the API carries them (hayate-native's wire types).
pub use hayate_api::stream::{StreamConfig, StreamInfo};
pub use registry::Stored;

/// Checks a stream's definition; returns the parsed capture expressions and log
/// configuration.
pub fn check(config: &StreamConfig) -> Result<(Vec<KeyExpr>, LogConfig), StreamError> {
    let bad = |m: String| Err(StreamError::Invalid(m));
    let n = &config.name;
    check_name("stream", n)?;
    if config.capture.is_empty() {
        return bad(format!("stream {n}: capture at least one key expression"));
    }
    let mut exprs = Vec::new();
    for c in &config.capture {
        match KeyExpr::new(c) {
            Ok(e) => exprs.push(e),
            Err(e) => return bad(format!("stream {n}: capture {c:?}: {e}")),
        }
    }
    let fsync: FsyncPolicy = config.fsync.parse().map_err(StreamError::Invalid)?;
    let mut log = LogConfig {
        fsync,
        retention: Retention {
            max_age: config.max_age_secs.map(Duration::from_secs),
            max_bytes: config.max_bytes,
            max_records: config.max_records,
        },
        ..LogConfig::default()
    };
    if let Some(s) = config.segment_bytes {
        // Every sealed segment keeps its files open: tiny segments would use up file
        // descriptors.
        if s < MIN_SEGMENT_BYTES {
            return bad(format!(
                "stream {n}: segment_bytes {s} is below {MIN_SEGMENT_BYTES} (1 MiB)"
            ));
        }
        log.segment_bytes = s;
    }
    log.validate()
        .map_err(|e| StreamError::Invalid(format!("stream {n}: {e}")))?;
    Ok((exprs, log))
}

/// The smallest segment a stream may ask for.
pub const MIN_SEGMENT_BYTES: u64 = 1 << 20;

/// Checks a stream or consumer name: 1 to 64 of `A-Z a-z 0-9 _ -` (it names files).
pub(crate) fn check_name(what: &str, n: &str) -> Result<(), StreamError> {
    let ok = !n.is_empty()
        && n.len() <= 64
        && n.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    if ok {
        Ok(())
    } else {
        Err(StreamError::Invalid(format!(
            "{what} name {n:?}: 1 to 64 of A-Z a-z 0-9 _ -"
        )))
    }
}

/// Why a stream operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StreamError {
    /// The definition is not valid.
    #[error("{0}")]
    Invalid(String),
    /// A stream of that name exists with another definition.
    #[error("stream {0} exists with another definition")]
    Exists(String),
    /// No stream of that name.
    #[error("no stream {0}")]
    NotFound(String),
    /// The broker has no data directory (streams need one).
    #[error("streams need a data directory")]
    NoDataDir,
    /// The caller is not the owner of the stream or consumer it names.
    #[error("{what} belongs to user {owner}")]
    NotOwner {
        /// `stream <name>` or `consumer <stream>/<name>`.
        what: String,
        /// Its owner.
        owner: String,
    },
    /// The stream's files or its log failed.
    #[error("stream {name}: {source}")]
    Log {
        /// The stream.
        name: String,
        /// What failed.
        #[source]
        source: hayate_log::Error,
    },
    /// The stream's directory or definition file failed.
    #[error("stream {name}: {source}")]
    Io {
        /// The stream.
        name: String,
        /// What failed.
        #[source]
        source: std::io::Error,
    },
}

/// Refuses `caller` an operation on something `owner` created (`what` names it).
pub(crate) fn check_owner(
    owner: Option<&str>,
    caller: Option<&str>,
    what: impl FnOnce() -> String,
) -> Result<(), StreamError> {
    match owner {
        Some(o) if caller != Some(o) => Err(StreamError::NotOwner {
            what: what(),
            owner: o.to_owned(),
        }),
        _ => Ok(()),
    }
}

/// One stream: its definition and its log.
#[derive(Debug)]
pub struct Stream {
    config: StreamConfig,
    capture: Vec<KeyExpr>,
    log: Log,
    /// Set when the stream is deleted: appends through routes made before are refused.
    pub(crate) deleted: AtomicBool,
    /// Its durable consumers, by name.
    pub(crate) consumers:
        std::sync::Mutex<std::collections::BTreeMap<String, Arc<consumer::Consumer>>>,
}

impl Stream {
    fn open(root: &dyn hayate_log::Root, config: StreamConfig) -> Result<Stream, StreamError> {
        let (capture, log_config) = check(&config)?;
        let rel = format!("streams/{}", config.name);
        let log = Log::open_in(root, &rel, log_config).map_err(|source| StreamError::Log {
            name: config.name.clone(),
            source,
        })?;
        let rep = log.recovery();
        for r in &rep.repairs {
            tracing::warn!(stream = %config.name, "recovery: {r}");
        }
        Ok(Stream {
            config,
            capture,
            log,
            deleted: AtomicBool::new(false),
            consumers: Default::default(),
        })
    }

    /// The name.
    pub fn name(&self) -> &str {
        &self.config.name
    }

    /// The definition.
    pub fn config(&self) -> &StreamConfig {
        &self.config
    }

    /// The log (reads, offsets, confirms).
    pub fn log(&self) -> &Log {
        &self.log
    }

    /// Whether the stream keeps messages published on `key`.
    pub fn captures(&self, key: &Key) -> bool {
        self.capture.iter().any(|e| e.matches(key))
    }

    /// Appends the messages of `batch`; returns their offsets.
    pub fn append(
        &self,
        batch: Batch<'_>,
        scratch: &mut Vec<u8>,
    ) -> Result<Range<u64>, hayate_log::Error> {
        if self.deleted.load(Ordering::Acquire) {
            return Err(hayate_log::Error::Closed);
        }
        let ts = codec::now_ms();
        match batch {
            Batch::One(m) => {
                codec::encode_meta(m, scratch);
                let e = Entry {
                    timestamp: ts,
                    key: m.key.as_bytes(),
                    headers: scratch,
                    value: &m.payload,
                };
                self.log.append_batch(std::slice::from_ref(&e))
            }
            Batch::Plain { key, payloads } => {
                let entries: Vec<Entry<'_>> = payloads
                    .iter()
                    .map(|p| Entry {
                        timestamp: ts,
                        key: key.as_bytes(),
                        headers: &[],
                        value: p,
                    })
                    .collect();
                self.log.append_batch(&entries)
            }
        }
    }

    /// The consumer named `name`.
    pub fn consumer(&self, name: &str) -> Option<Arc<consumer::Consumer>> {
        self.consumers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(name)
            .cloned()
    }

    /// Every consumer, by name.
    pub fn consumer_list(&self) -> Vec<Arc<consumer::Consumer>> {
        self.consumers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .cloned()
            .collect()
    }

    /// The stream's state now.
    pub fn info(&self) -> StreamInfo {
        let LogStats {
            start,
            end,
            confirmed,
            segments,
            bytes,
            ..
        } = self.log.stats();
        StreamInfo {
            config: self.config.clone(),
            first: start,
            next: end,
            records: end - start,
            bytes,
            segments,
            confirmed,
        }
    }
}
