//! The stream administration API: JSON requests published on `$hayate/api/stream/<op>`
//! with a reply-to key, answered on it (request/reply, as NATS JetStream's `$JS.API`).
//! docs/protocol.md ("Stream API") lists the operations and their bodies.

use serde::Deserialize;

/// The API's keys and bodies are the native protocol's (hayate-native); re-exported here.
pub use hayate_api::stream::{
    API_PREFIX, ApiReply, CONSUMER_API, ConsumerRequest, ConsumerView, NameRequest, RemovedInfo,
    STREAM_API,
};

use super::StreamConfig;
use super::consumer::{Consumer, ConsumerConfig};
use crate::broker::Broker;

fn body<'a, T: Deserialize<'a>>(b: &'a [u8]) -> Result<T, String> {
    serde_json::from_slice(b).map_err(|e| format!("bad request body: {e}"))
}

/// Handles the API request published on `key` (which starts with [`API_PREFIX`]) with
/// `payload`, for `caller` (the logged-in user; `None`: anonymous). What a user creates is
/// theirs: its `owner` is set to the caller (whatever the request said; none for a shared
/// consumer, `BrokerConfig::shared_consumers`), and only the owner may delete or purge it,
/// or join the consumer. Blocking file I/O (creating,
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
            // The consumers a front-end makes for a durable queue (STOMP's `/queue/`, named
            // with a prefix in `BrokerConfig::shared_consumers`) are shared work queues: one
            // made beforehand through the API is not owned either, or its maker could keep
            // everyone else off the queue.
            let shared = broker
                .config()
                .shared_consumers
                .iter()
                .any(|p| cfg.name.starts_with(p.as_str()));
            cfg.owner = caller.filter(|_| !shared).map(str::to_owned);
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
