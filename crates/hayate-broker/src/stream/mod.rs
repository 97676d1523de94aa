//! Streams: durable logs (`hayate-log`) that capture the messages published on some key
//! expressions. The broker appends every captured message before delivering it live; a
//! publisher that asks for a confirm gets it once the record is durable under the stream's
//! fsync policy.
//!
//! A stream lives in `<data_dir>/streams/<name>/`: `stream.json` (its definition, written
//! atomically) and the log's segment files.

pub mod api;
pub mod codec;
pub mod consumer;
pub mod member;
pub(crate) mod registry;

use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use hayate_core::{Key, KeyExpr};
use hayate_log::{Entry, FsyncPolicy, Log, LogConfig, LogStats, Retention};
use serde::{Deserialize, Serialize};

use crate::Batch;

pub use registry::Stored;

/// A stream's definition, as kept in `stream.json`, given in the config file and sent by
/// `hayate stream add`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StreamConfig {
    /// `[A-Za-z0-9_-]`, 1 to 64 characters.
    pub name: String,
    /// Key expressions whose messages the stream keeps (at least one).
    pub capture: Vec<String>,
    /// `always`, `interval=<ms>` or `never` (default `interval=100`).
    #[serde(default = "default_fsync")]
    pub fsync: String,
    /// Remove records older than this many seconds (whole segments).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_age_secs: Option<u64>,
    /// Keep about this many bytes (whole segments).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_bytes: Option<u64>,
    /// Keep about this many records (whole segments).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_records: Option<u64>,
    /// Segment size in bytes (default 128 MiB).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub segment_bytes: Option<u64>,
    /// A message older than this many ms (since it was stored) is not delivered by
    /// consumers (a default time to live; a message's own expiry applies too).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_ttl_ms: Option<u64>,
    /// Work-queue retention: segments every consumer is done with are removed (checked with
    /// the other retention every minute; with no consumer nothing is removed by it). The
    /// records are kept until their receivers free them.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub work_queue: bool,
    /// The user who created it through the API (set by the broker from the caller's
    /// login, never taken from a request): only that user may delete or purge it. `None`:
    /// made by the configuration, the command line or an anonymous client; anyone allowed
    /// the API may.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
}

fn default_fsync() -> String {
    FsyncPolicy::default().to_string()
}

impl StreamConfig {
    /// A stream named `name` capturing `capture`, with the defaults.
    pub fn new(name: &str, capture: &[&str]) -> StreamConfig {
        StreamConfig {
            name: name.to_owned(),
            capture: capture.iter().map(|s| (*s).to_owned()).collect(),
            fsync: default_fsync(),
            max_age_secs: None,
            max_bytes: None,
            max_records: None,
            segment_bytes: None,
            default_ttl_ms: None,
            work_queue: false,
            owner: None,
        }
    }

    /// Checks the definition; returns the parsed capture expressions and log configuration.
    pub fn check(&self) -> Result<(Vec<KeyExpr>, LogConfig), StreamError> {
        let bad = |m: String| Err(StreamError::Invalid(m));
        let n = &self.name;
        check_name("stream", n)?;
        if self.capture.is_empty() {
            return bad(format!("stream {n}: capture at least one key expression"));
        }
        let mut exprs = Vec::new();
        for c in &self.capture {
            match KeyExpr::new(c) {
                Ok(e) => exprs.push(e),
                Err(e) => return bad(format!("stream {n}: capture {c:?}: {e}")),
            }
        }
        let fsync: FsyncPolicy = self.fsync.parse().map_err(StreamError::Invalid)?;
        let mut log = LogConfig {
            fsync,
            retention: Retention {
                max_age: self.max_age_secs.map(Duration::from_secs),
                max_bytes: self.max_bytes,
                max_records: self.max_records,
            },
            ..LogConfig::default()
        };
        if let Some(s) = self.segment_bytes {
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
    pub(crate) dir: PathBuf,
    /// Set when the stream is deleted: appends through routes made before are refused.
    pub(crate) deleted: AtomicBool,
    /// Its durable consumers, by name.
    pub(crate) consumers:
        std::sync::Mutex<std::collections::BTreeMap<String, Arc<consumer::Consumer>>>,
}

/// What `hayate stream info` shows.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StreamInfo {
    /// The definition.
    pub config: StreamConfig,
    /// First offset kept.
    pub first: u64,
    /// Next offset to be written.
    pub next: u64,
    /// Records kept.
    pub records: u64,
    /// Bytes in segment files.
    pub bytes: u64,
    /// Segment files.
    pub segments: usize,
    /// Offsets below this are durable under the fsync policy.
    pub confirmed: u64,
}

impl Stream {
    fn open(dir: &Path, config: StreamConfig) -> Result<Stream, StreamError> {
        let (capture, log_config) = config.check()?;
        let log = Log::open_dir(dir, log_config).map_err(|source| StreamError::Log {
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
            dir: dir.to_path_buf(),
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

    /// Opens the consumers kept in `consumers/`.
    pub(crate) fn load_consumers(self: &Arc<Self>) -> Result<(), StreamError> {
        let dir = self.dir.join("consumers");
        let Ok(entries) = std::fs::read_dir(&dir) else {
            return Ok(());
        };
        let mut map = self.consumers.lock().unwrap_or_else(|p| p.into_inner());
        for e in entries.flatten() {
            let p = e.path();
            match p.extension().and_then(|x| x.to_str()) {
                Some("json") => {}
                Some("tmp") => {
                    let _ = std::fs::remove_file(&p); // a temporary file of an interrupted save
                    continue;
                }
                _ => continue, // set aside earlier
            }
            // A state file that cannot be used is moved aside (the broker still starts; the
            // consumer can be created again).
            match consumer::Consumer::load(self.clone(), p.clone()) {
                Ok(c) => {
                    map.insert(c.config().name.clone(), Arc::new(c));
                }
                Err(e) => {
                    let aside = p.with_extension(format!("json.bad-{}", codec::now_ms()));
                    tracing::error!(stream = %self.name(), file = %p.display(), "consumer state unusable ({e}); moved to {}", aside.display());
                    let _ = std::fs::rename(&p, &aside);
                }
            }
        }
        Ok(())
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
