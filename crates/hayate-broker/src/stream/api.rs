//! The stream administration API: JSON requests published on `$hayate/api/stream/<op>`
//! with a reply-to key, answered on it (request/reply, as NATS JetStream's `$JS.API`).
//! docs/protocol.md ("Stream API") lists the operations and their bodies.

use serde::{Deserialize, Serialize};

use super::consumer::{Consumer, ConsumerConfig, ConsumerInfo};
use super::{StreamConfig, StreamInfo};
use crate::broker::Broker;

/// Every API key starts with this.
pub const API_PREFIX: &str = "$hayate/api/";
/// The stream operations' keys start with this; the operation follows.
pub const STREAM_API: &str = "$hayate/api/stream/";

/// Every consumer operation's key starts with this.
pub const CONSUMER_API: &str = "$hayate/api/consumer/";

/// The names of the consumers the STOMP front-end makes for a durable `/queue/<name>`
/// start with this (`stomp-<name>`, see hayate-server's STOMP front-end). They have no
/// owner.
pub const STOMP_CONSUMER_PREFIX: &str = "stomp-";

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
    fn err(e: impl ToString) -> ApiReply {
        ApiReply {
            ok: false,
            error: Some(e.to_string()),
            ..ApiReply::default()
        }
    }
    fn ok() -> ApiReply {
        ApiReply {
            ok: true,
            ..ApiReply::default()
        }
    }
}

fn body<'a, T: Deserialize<'a>>(b: &'a [u8]) -> Result<T, String> {
    serde_json::from_slice(b).map_err(|e| format!("bad request body: {e}"))
}

/// Handles the API request published on `key` (which starts with [`API_PREFIX`]) with
/// `payload`, for `caller` (the logged-in user; `None`: anonymous). What a user creates is
/// theirs: its `owner` is set to the caller (whatever the request said), and only the
/// owner may delete or purge it, or join the consumer. Blocking file I/O (creating,
/// deleting, purging): call it where that is fine.
pub fn handle(broker: &Broker, key: &str, payload: &[u8], caller: Option<&str>) -> ApiReply {
    if let Some(op) = key.strip_prefix(CONSUMER_API) {
        return consumer_op(broker, op, payload, caller).unwrap_or_else(ApiReply::err);
    }
    let Some(op) = key.strip_prefix(STREAM_API) else {
        return ApiReply::err(format!("unknown API {key}"));
    };
    let r = match op {
        "add" => body::<StreamConfig>(payload).map(|mut c| {
            c.owner = caller.map(str::to_owned);
            match broker.create_stream(c) {
                Ok((s, created)) => ApiReply {
                    created: Some(created),
                    info: Some(s.info()),
                    ..ApiReply::ok()
                },
                Err(e) => ApiReply::err(e),
            }
        }),
        "rm" => {
            body::<NameRequest>(payload).map(|n| match broker.delete_stream_by(&n.name, caller) {
                Ok(()) => ApiReply::ok(),
                Err(e) => ApiReply::err(e),
            })
        }
        "info" => body::<NameRequest>(payload).map(|n| match broker.stream(&n.name) {
            Some(s) => ApiReply {
                info: Some(s.info()),
                ..ApiReply::ok()
            },
            None => ApiReply::err(super::StreamError::NotFound(n.name)),
        }),
        "ls" => Ok::<_, String>(ApiReply {
            streams: Some(broker.streams().iter().map(|s| s.info()).collect()),
            ..ApiReply::ok()
        }),
        "purge" => {
            body::<NameRequest>(payload).map(|n| match broker.purge_stream_by(&n.name, caller) {
                Ok(r) => ApiReply {
                    removed: Some(RemovedInfo {
                        records: r.records,
                        bytes: r.bytes,
                        segments: r.segments,
                    }),
                    ..ApiReply::ok()
                },
                Err(e) => ApiReply::err(e),
            })
        }
        _ => Err(format!(
            "unknown stream operation {op:?} (add, rm, ls, info, purge)"
        )),
    };
    r.unwrap_or_else(ApiReply::err)
}

fn view(c: &Consumer) -> ConsumerView {
    ConsumerView {
        config: c.config().clone(),
        state: c.info(),
    }
}

fn consumer_op(
    broker: &Broker,
    op: &str,
    payload: &[u8],
    caller: Option<&str>,
) -> Result<ApiReply, String> {
    let e = |e: super::StreamError| e.to_string();
    Ok(match op {
        "add" => {
            let mut cfg = body::<ConsumerConfig>(payload)?;
            // The consumers the STOMP front-end makes for a durable `/queue/` (`stomp-...`)
            // are shared work queues: one made beforehand through the API is not owned
            // either, or its maker could keep everyone else off the queue.
            cfg.owner = caller
                .filter(|_| !cfg.name.starts_with(STOMP_CONSUMER_PREFIX))
                .map(str::to_owned);
            // Whoever made it, owned or not: counted against that user's limit.
            cfg.creator = caller.map(str::to_owned);
            let (c, created) = broker.create_consumer(cfg).map_err(e)?;
            ApiReply {
                created: Some(created),
                consumer: Some(view(&c)),
                ..ApiReply::ok()
            }
        }
        "rm" => {
            let r = body::<ConsumerRequest>(payload)?;
            broker
                .delete_consumer_by(&r.stream, &r.name, caller)
                .map_err(e)?;
            ApiReply::ok()
        }
        "info" => {
            let r = body::<ConsumerRequest>(payload)?;
            let s = broker
                .stream(&r.stream)
                .ok_or_else(|| format!("no stream {}", r.stream))?;
            let c = s
                .consumer(&r.name)
                .ok_or_else(|| format!("no consumer {}/{}", r.stream, r.name))?;
            ApiReply {
                consumer: Some(view(&c)),
                ..ApiReply::ok()
            }
        }
        "ls" => {
            let r = body::<NameRequest>(payload)?;
            let s = broker
                .stream(&r.name)
                .ok_or_else(|| format!("no stream {}", r.name))?;
            ApiReply {
                consumers: Some(s.consumer_list().iter().map(|c| view(c)).collect()),
                ..ApiReply::ok()
            }
        }
        _ => {
            return Err(format!(
                "unknown consumer operation {op:?} (add, rm, ls, info)"
            ));
        }
    })
}
