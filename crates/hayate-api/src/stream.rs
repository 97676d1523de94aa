//! The stream API's wire types: the JSON bodies of requests published on
//! `$hayate/api/stream/<op>` and `$hayate/api/consumer/<op>` and of their replies
//! (request/reply, as NATS JetStream's `$JS.API`), and the stream and consumer definitions
//! they carry. docs/protocol.md ("Stream API") lists the operations and their bodies. The
//! broker answers them (`hayate_broker::stream::api::handle`); the client sends them.

use serde::{Deserialize, Serialize};

/// Every API key starts with this.
pub const API_PREFIX: &str = "$hayate/api/";
/// The stream operations' keys start with this; the operation follows.
pub const STREAM_API: &str = "$hayate/api/stream/";

/// Every consumer operation's key starts with this.
pub const CONSUMER_API: &str = "$hayate/api/consumer/";

/// A stream's definition, as kept in the meta log (`stream/<name>`), given in the config file and sent by
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

/// hayate-log's default fsync policy (`FsyncPolicy::default()`), as written in a definition.
pub const DEFAULT_FSYNC: &str = "interval=100";

fn default_fsync() -> String {
    DEFAULT_FSYNC.to_owned()
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

/// Where a new consumer starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Start {
    /// The first record kept.
    #[default]
    First,
    /// Records appended after the consumer is created.
    New,
    /// This offset (or the first kept, if it is gone).
    Offset(u64),
    /// The first record at or after this time (ms since the Unix epoch).
    Time(i64),
}

fn default_ack_wait() -> u64 {
    30_000
}
fn default_max_in_flight() -> u32 {
    1000
}

/// A consumer's definition (the body of `$hayate/api/consumer/add`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConsumerConfig {
    /// The stream.
    pub stream: String,
    /// `[A-Za-z0-9_-]`, 1 to 64 characters.
    pub name: String,
    /// Only messages whose key matches this expression (others are skipped).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub filter: Option<String>,
    /// Where it starts.
    #[serde(default)]
    pub start: Start,
    /// A delivery not acknowledged within this many ms is delivered again (to any member).
    #[serde(default = "default_ack_wait")]
    pub ack_wait_ms: u64,
    /// Most messages in flight (delivered, not acknowledged) across its members.
    #[serde(default = "default_max_in_flight")]
    pub max_in_flight: u32,
    /// After this many deliveries a message goes to the dead-letter stream (or is dropped
    /// without one); 0: no limit.
    #[serde(default)]
    pub max_deliver: u32,
    /// The stream dead letters are published into (key `<dead_letter_prefix>/<stream>/<consumer>`
    /// is not used: the original key is kept, with headers saying why).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dead_letter: Option<String>,
    /// The user who created it through the API (set by the broker from the caller's
    /// login, never taken from a request): only that user may join it (native CONSUME,
    /// STOMP) or delete it. `None`: anyone allowed to serve its keys may.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
    /// The user who created it (set by the broker, never taken from a request): the owner,
    /// or for an unowned shared consumer (a front-end's durable queue: STOMP's `/queue/`) its
    /// maker (through the API, or the subscription that made it on first use). It counts
    /// against that user's `limits.max_consumers_per_user`, and its dead letters go only
    /// into a stream that user owns or that has no owner. One saved without it (made before it was recorded)
    /// counts as its owner's ([`ConsumerConfig::made_by`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub creator: Option<String>,
}

impl ConsumerConfig {
    /// A consumer `name` of `stream` with the defaults.
    pub fn new(stream: &str, name: &str) -> ConsumerConfig {
        ConsumerConfig {
            stream: stream.to_owned(),
            name: name.to_owned(),
            filter: None,
            start: Start::First,
            ack_wait_ms: default_ack_wait(),
            max_in_flight: default_max_in_flight(),
            max_deliver: 0,
            dead_letter: None,
            owner: None,
            creator: None,
        }
    }

    /// The user it counts against and whose dead letters it moves: its creator, or for one
    /// made before creators were recorded (saved without one), its owner.
    pub fn made_by(&self) -> Option<&str> {
        self.creator.as_deref().or(self.owner.as_deref())
    }
}

/// Counters of one consumer.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConsumerInfo {
    /// Every offset below is done.
    pub floor: u64,
    /// The first offset never delivered.
    pub next: u64,
    /// Delivered and not acknowledged.
    pub in_flight: u64,
    /// Waiting for redelivery or for their scheduled time.
    pub waiting: u64,
    /// Done offsets above the floor.
    pub done_above_floor: u64,
    /// Records in the stream not yet delivered (`stream next - next`).
    pub pending: u64,
    /// Messages moved to the dead-letter stream after `max_deliver` (since the broker
    /// started).
    #[serde(default)]
    pub dead_lettered: u64,
    /// Dead letters dropped because they had been dead-lettered out of this consumer's
    /// stream before (a cycle: a consumer dead-lettering into its own stream, or streams
    /// dead-lettering into each other), since the broker started.
    #[serde(default)]
    pub dead_letter_cycles: u64,
    /// Messages dropped after `max_deliver` without being kept in a dead-letter stream
    /// (none is set, it is gone, or another user owns it now), since the broker started.
    #[serde(default)]
    pub dead_letter_dropped: u64,
}

/// A request body naming one consumer (`consumer/rm`, `consumer/info`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConsumerRequest {
    /// The stream.
    pub stream: String,
    /// The consumer.
    pub name: String,
}

/// A consumer's definition and state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConsumerView {
    /// The definition.
    pub config: ConsumerConfig,
    /// The state.
    pub state: ConsumerInfo,
}

/// A request body naming one stream (`rm`, `info`, `purge`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NameRequest {
    /// The stream.
    pub name: String,
}

/// What a purge removed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct RemovedInfo {
    /// Records removed.
    pub records: u64,
    /// Bytes removed.
    pub bytes: u64,
    /// Segment files removed.
    pub segments: usize,
}

/// Every API reply. `ok` says whether the operation succeeded; `error` says why not.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApiReply {
    /// Whether the operation succeeded.
    pub ok: bool,
    /// Why it failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// `add`: whether the stream was created (false: it existed with this definition).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created: Option<bool>,
    /// `add`, `info`: the stream.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub info: Option<StreamInfo>,
    /// `ls`: every stream, by name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub streams: Option<Vec<StreamInfo>>,
    /// `consumer/add`, `consumer/info`: the consumer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub consumer: Option<ConsumerView>,
    /// `consumer/ls`: the stream's consumers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub consumers: Option<Vec<ConsumerView>>,
    /// `purge`: what was removed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub removed: Option<RemovedInfo>,
}

impl ApiReply {
    /// A failure, saying why.
    pub fn err(e: impl ToString) -> ApiReply {
        ApiReply {
            ok: false,
            error: Some(e.to_string()),
            ..ApiReply::default()
        }
    }
    /// A success with nothing more to say (the caller fills in the rest).
    pub fn ok() -> ApiReply {
        ApiReply {
            ok: true,
            ..ApiReply::default()
        }
    }
}
