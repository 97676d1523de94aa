//! RPC: request/reply over each system, by rpc-bench's method (the seeds' NewtMQ benchmark).
//! The client sends a number, the server answers with the number plus one, and every reply is
//! checked. A point is `calls` requests made by `concurrency` callers, each with its own
//! connection and one request in flight; the server is one connection handling requests one
//! by one. Reported: calls per second over the whole point and the percentiles of the call
//! time (a full round trip, not a half).
//!
//! # Where the server runs
//! As in rpc-bench, the serving side runs in a program of its own: with
//! [`ServerPlacement::Child`] (what `hayate bench rpc` uses) each point starts a child
//! process, `EXE bench rpc-server --target URL --prefix PREFIX` (the same executable; it calls
//! [`serve_rpc_point`]), which starts the server of that system (the subscription, queryable,
//! ROUTER socket or gRPC server below), writes one JSON line to its stdout (the endpoint the
//! callers need, for ZeroMQ, gRPC and Zenoh peer mode, and the server version when known) and
//! serves until its stdin closes. The callers run in the benchmark's process; when they are
//! done the child's stdin is closed, it stops its server and exits (killed if it has not
//! within 10 s, and killed at once if the point fails or times out). A brokerless call
//! therefore crosses a process boundary, as a brokered one does (twice). With
//! [`ServerPlacement::InProcess`] (`--server-in-process`, the method before) the server runs
//! on the callers' Tokio runtime. The client field of each record says which was used
//! (`...; server in a child process` or `...; server in-process`).
//!
//! # Request/reply of each system
//! Each system does request/reply its own way (the method is recorded in the client field):
//! - Hayate: `Client::request`, replies to the requester's inbox (`_inbox/...`); through
//!   the broker, or with `hayate://HOST?mode=peer` peer to peer: the server is a
//!   `hayate_client::peer::PeerServer` on HOST (a free port) and each caller connects its
//!   `Client` to it directly (two sockets crossed per call instead of four).
//! - NATS: `Client::request` (a reply subject per request, on the client's inbox prefix).
//! - STOMP (RabbitMQ): a temp-queue: `SEND /queue/<name>` with `reply-to:/temp-queue/rpc`;
//!   the server sends its reply to the (rewritten) `reply-to` destination.
//! - AMQP (RabbitMQ): direct reply-to (`amq.rabbitmq.reply-to`).
//! - ZeroMQ: brokerless, one REQ socket per caller and one ROUTER socket serving them all,
//!   answering each request to the identity it came from (REQ -> ROUTER).
//! - gRPC: brokerless, unary calls through tonic (one HTTP/2 connection per caller, one
//!   server); see [`crate::driver::grpc`].
//! - Zenoh: `get` on the server's queryable (through the router, or peer to peer).
//! - MQTT and Kafka have no request/reply of their own here: "pub/sub request-reply", each
//!   caller subscribes to a reply topic of its own and sends `"<caller> <n>"` to the request
//!   topic; the server publishes the answer to that caller's reply topic (what MQTT 3.1.1
//!   applications do; MQTT 5's response-topic property carries the same information).
//!
//! # Layout
//! - this module: the settings ([`RpcOptions`], [`RpcPoint`], [`ServerPlacement`]) and the
//!   arithmetic of a call (the server's answer, the check of each reply);
//! - `run`: [`rpc`], each point on each target (server in-process or in a child process) and
//!   its record;
//! - `server`: the serving side of each system, in this process;
//! - `caller`: the caller of each system, and the callers of a point making their calls;
//! - `pubsub`: pub/sub request-reply (MQTT, Kafka): its server and its callers;
//! - `child`: the server in a child process: starting and stopping it from the benchmark,
//!   and [`serve_rpc_point`], what the child runs;
//! - `relay`: the baseline (`--baseline`): callers, a relay process that only copies bytes
//!   and a server process, over loopback TCP: the floor of a brokered call on this host;
//!   [`serve_relay`] is what its child processes run.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, bail};
use bytes::Bytes;
use hdrhistogram::Histogram;

use crate::target::Target;

mod caller;
mod child;
mod pubsub;
mod relay;
mod run;
mod server;

pub use child::serve_rpc_point;
pub use relay::serve_relay;
pub use run::rpc;

/// One RPC point: `calls` requests in all, by `concurrency` callers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RpcPoint {
    /// Requests in all.
    pub calls: u64,
    /// Callers, each with one request in flight.
    pub concurrency: usize,
}

/// Settings of an RPC run.
#[derive(Debug, Clone)]
pub struct RpcOptions {
    /// Systems, in this order (rotated between runs).
    pub targets: Vec<Target>,
    /// The points, in order.
    pub points: Vec<RpcPoint>,
    /// Repetitions of each point (rotated order; medians reported).
    pub runs: usize,
    /// A point stops early after this long (slow systems): the calls made so far count.
    pub max_time: Duration,
    /// How long one call may take before the point fails.
    pub call_timeout: Duration,
    /// Where the serving side of each point runs.
    pub server: ServerPlacement,
    /// Also measure the floor of a brokered call on this host: callers, a relay process
    /// that only copies bytes, and a server process (system `tcp`, mode `relay`).
    pub include_baseline: bool,
}

impl Default for RpcOptions {
    fn default() -> Self {
        RpcOptions {
            targets: Vec::new(),
            points: default_points(),
            runs: 1,
            max_time: Duration::from_secs(120),
            call_timeout: Duration::from_secs(10),
            server: ServerPlacement::InProcess,
            include_baseline: false,
        }
    }
}

/// Where the serving side of an RPC point runs (see the module docs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ServerPlacement {
    /// In the benchmark's process, on the callers' Tokio runtime.
    InProcess,
    /// In a child process per point: this executable, run as
    /// `EXE bench rpc-server --target URL --prefix PREFIX`, must call [`serve_rpc_point`].
    Child(PathBuf),
}

impl ServerPlacement {
    /// How records say it, after the method in the client field.
    fn label(&self) -> &'static str {
        match self {
            ServerPlacement::InProcess => "server in-process",
            ServerPlacement::Child(_) => "server in a child process",
        }
    }
}

/// rpc-bench's points: 32k, 64k, 128k, 256k and 512k calls at concurrency 1, then 10k calls at
/// concurrency 4, 8, 16, 32 and 64.
pub fn default_points() -> Vec<RpcPoint> {
    let mut v: Vec<RpcPoint> = [32u64, 64, 128, 256, 512]
        .iter()
        .map(|k| RpcPoint {
            calls: k * 1000,
            concurrency: 1,
        })
        .collect();
    v.extend([4, 8, 16, 32, 64].iter().map(|&c| RpcPoint {
        calls: 10_000,
        concurrency: c,
    }));
    v
}

/// The server's answer: the number plus one (garbage in: `u64::MAX`, which no check accepts).
pub(crate) fn add_one(req: &[u8]) -> Bytes {
    let n: u64 = std::str::from_utf8(req)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(u64::MAX - 1);
    Bytes::from((n + 1).to_string())
}

/// Checks that `reply` answers request `i`.
pub(crate) fn check_reply(i: u64, reply: &[u8]) -> anyhow::Result<()> {
    let got: u64 = std::str::from_utf8(reply)
        .ok()
        .and_then(|s| s.parse().ok())
        .with_context(|| format!("rpc: request {i} got a reply that is not a number: {reply:?}"))?;
    if got != i + 1 {
        bail!("rpc: request {i} got {got}, expected {}", i + 1);
    }
    Ok(())
}

struct Outcome {
    version: Option<String>,
    calls: u64,
    elapsed: Duration,
    hist: Histogram<u64>,
}

fn stomp_queue(prefix: &str) -> String {
    format!("/queue/{}", prefix.replace('/', "."))
}

fn amqp_queue(prefix: &str) -> String {
    format!("{}.rpc", prefix.replace('/', "."))
}

/// The workspace's AMQP client on blocking sockets (`client=hayate&io=blocking`): each
/// caller and the server on a thread of its own.
fn amqp_blocking(target: &Target) -> bool {
    target.param("client") == Some("hayate") && target.param("io") == Some("blocking")
}

#[cfg(test)]
mod tests {
    use super::pubsub::pubsub_answer;
    use super::*;

    #[test]
    fn arithmetic_and_checks() {
        assert_eq!(&add_one(b"41")[..], b"42");
        check_reply(41, b"42").unwrap();
        assert!(check_reply(41, b"41").is_err());
        assert!(check_reply(41, b"x").is_err());
        assert_eq!(pubsub_answer(b"3 41"), Some((3, Bytes::from("42"))));
        assert_eq!(pubsub_answer(b"41"), None);
        assert_eq!(pubsub_answer(b"x 41"), None);
    }

    #[test]
    fn default_points_follow_rpc_bench() {
        let p = default_points();
        assert_eq!(p.len(), 10);
        assert_eq!(
            p[0],
            RpcPoint {
                calls: 32_000,
                concurrency: 1
            }
        );
        assert_eq!(p[4].calls, 512_000);
        assert_eq!(
            p[9],
            RpcPoint {
                calls: 10_000,
                concurrency: 64
            }
        );
    }
}
