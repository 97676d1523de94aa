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

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use bytes::Bytes;
use futures::StreamExt;
use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufReadExt, AsyncReadExt};

use crate::driver::{Conn, Sub, Topic, point_prefix};
use crate::target::{System, Target};
use crate::{Record, with_runtime};

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

/// Runs every point for every target (`runs` times, rotating the order of the targets) and
/// returns one record per (point, target): the median of each figure over the runs.
pub fn rpc(opts: &RpcOptions) -> anyhow::Result<Vec<Record>> {
    let pb = crate::progress::bar(opts.points.len() * opts.targets.len() * opts.runs.max(1));
    let mut out = Vec::new();
    for point in &opts.points {
        let n = opts.targets.len();
        let mut per: Vec<Vec<Record>> = vec![Vec::new(); n];
        for r in 0..opts.runs.max(1) {
            for k in 0..n {
                let i = (k + r) % n;
                let t = &opts.targets[i];
                pb.set_message(format!(
                    "{} {} calls x{}",
                    t.system(),
                    point.calls,
                    point.concurrency
                ));
                per[i].push(rpc_point(t, *point, opts));
                pb.inc(1);
            }
        }
        out.extend(per.into_iter().map(crate::lat::merge_runs));
    }
    pb.finish_and_clear();
    Ok(out)
}

/// One point on one target, in a runtime of its own.
pub(crate) fn rpc_point(target: &Target, point: RpcPoint, opts: &RpcOptions) -> Record {
    let mut r = Record::new(target.system(), method_mode(target), "rpc", 0);
    r.target = target.to_string();
    r.concurrency = Some(point.concurrency);
    let limit = opts.max_time + opts.call_timeout + Duration::from_secs(60);
    let res = with_runtime(|rt| {
        rt.block_on(async {
            tokio::time::timeout(limit, run(target, point, opts))
                .await
                .with_context(|| format!("rpc: timed out after {limit:?}"))?
        })
    });
    r.client = client_label(target, &opts.server);
    match res {
        Ok(o) => {
            r.server_version = o.version;
            let secs = o.elapsed.as_secs_f64();
            r.msgs_per_sec = Some(o.calls as f64 / secs);
            let us = |q: f64| o.hist.value_at_quantile(q) as f64 / 1000.0;
            r.p50_us = Some(us(0.5));
            r.p99_us = Some(us(0.99));
            r.p999_us = Some(us(0.999));
            r.samples = o.calls as usize;
            if o.calls < point.calls {
                tracing::info!(
                    "rpc {}: stopped after {} of {} calls ({:?})",
                    target.system(),
                    o.calls,
                    point.calls,
                    opts.max_time
                );
            }
        }
        Err(e) => r.error = Some(format!("{e:#}")),
    }
    r
}

/// "brokered", or "peer-to-peer" for ZeroMQ and Zenoh in peer mode.
fn method_mode(target: &Target) -> &'static str {
    target.mode()
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

/// The pub/sub request-reply server's answer to `"<caller> <n>"`: `(caller, n + 1)`.
fn pubsub_answer(req: &[u8]) -> Option<(u64, Bytes)> {
    let s = std::str::from_utf8(req).ok()?;
    let (caller, n) = s.split_once(' ')?;
    Some((caller.parse().ok()?, add_one(n.as_bytes())))
}

struct Outcome {
    version: Option<String>,
    calls: u64,
    elapsed: Duration,
    hist: Histogram<u64>,
}

/// The serving side of a point; stopped by [`Server::stop`].
#[cfg_attr(not(feature = "peers"), allow(dead_code))]
struct Server {
    tasks: Vec<tokio::task::JoinHandle<()>>,
    conns: Vec<Conn>,
    /// Where callers find the server (ZeroMQ's endpoint; Zenoh peer mode's listener; the
    /// Hayate peer's address).
    endpoint: Option<String>,
    /// Hayate peer to peer: the direct listener.
    peer: Option<hayate_client::peer::PeerServer>,
    #[cfg(feature = "peers")]
    amqp: Option<crate::driver::amqp::RpcServer>,
    #[cfg(feature = "peers")]
    zenoh: Option<::zenoh::Session>,
}

impl Server {
    fn new() -> Server {
        Server {
            tasks: Vec::new(),
            conns: Vec::new(),
            endpoint: None,
            peer: None,
            #[cfg(feature = "peers")]
            amqp: None,
            #[cfg(feature = "peers")]
            zenoh: None,
        }
    }

    /// The server's version, when its connection says (Hayate, STOMP, MQTT, Kafka).
    fn version(&self) -> Option<String> {
        self.conns.first().and_then(Conn::server_version)
    }

    async fn stop(self) {
        for t in &self.tasks {
            t.abort();
        }
        if let Some(p) = self.peer {
            p.close().await;
        }
        for c in self.conns {
            c.close(Duration::from_secs(5)).await;
        }
        #[cfg(feature = "peers")]
        if let Some(a) = self.amqp {
            a.close().await;
        }
        #[cfg(feature = "peers")]
        if let Some(z) = self.zenoh {
            let _ = z.close().await;
        }
    }
}

/// One caller: a connection with one request in flight.
enum Caller {
    Hayate(hayate_client::Client, hayate_core::Key),
    Nats(async_nats::Client, async_nats::Subject),
    Stomp(
        crate::driver::stomp::StompConn,
        crate::driver::stomp::StompSub,
        String,
    ),
    PubSub {
        conn: Conn,
        topic: Topic,
        replies: Sub,
        id: u64,
    },
    #[cfg(feature = "peers")]
    Amqp(crate::driver::amqp::RpcCaller),
    #[cfg(feature = "peers")]
    Zmq(crate::driver::zmq::RpcCaller),
    #[cfg(feature = "peers")]
    Grpc(crate::driver::grpc::RpcCaller),
    #[cfg(feature = "peers")]
    Zenoh(::zenoh::Session, String),
}

impl Caller {
    async fn call(&mut self, n: u64, timeout: Duration) -> anyhow::Result<Bytes> {
        let req = Bytes::from(n.to_string());
        let fut = async {
            Ok(match self {
                Caller::Hayate(c, k) => c.request(k, req, timeout).await?.payload,
                Caller::Nats(c, s) => c.request(s.clone(), req).await?.payload,
                Caller::Stomp(c, replies, dest) => {
                    c.send(dest, &[("reply-to", "/temp-queue/rpc")], &req)
                        .await?;
                    replies
                        .next_frame()
                        .await
                        .context("stomp: the connection ended")?
                        .body
                }
                Caller::PubSub {
                    conn,
                    topic,
                    replies,
                    id,
                } => {
                    let mut p = id.to_string().into_bytes();
                    p.push(b' ');
                    p.extend_from_slice(&req);
                    conn.publish(topic, Bytes::from(p)).await?;
                    replies
                        .next()
                        .await
                        .context("the reply subscription ended")?
                }
                #[cfg(feature = "peers")]
                Caller::Amqp(c) => c.call(&req).await?,
                #[cfg(feature = "peers")]
                Caller::Zmq(c) => c.call(req).await?,
                #[cfg(feature = "peers")]
                Caller::Grpc(c) => c.call(req).await?,
                #[cfg(feature = "peers")]
                Caller::Zenoh(s, key) => {
                    crate::driver::zenoh::rpc_call(s, key, req, timeout).await?
                }
            })
        };
        tokio::time::timeout(timeout, fut)
            .await
            .with_context(|| format!("rpc: no reply to request {n} within {timeout:?}"))?
    }

    async fn close(self) {
        let t = Duration::from_secs(5);
        match self {
            Caller::Hayate(c, _) => {
                let _ = tokio::time::timeout(t, c.close()).await;
            }
            Caller::Nats(..) => {}
            Caller::Stomp(c, _, _) => {
                let _ = tokio::time::timeout(t, c.close()).await;
            }
            Caller::PubSub { conn, .. } => conn.close(t).await,
            #[cfg(feature = "peers")]
            Caller::Amqp(c) => c.close().await,
            #[cfg(feature = "peers")]
            Caller::Zmq(_) | Caller::Grpc(_) => {}
            #[cfg(feature = "peers")]
            Caller::Zenoh(s, _) => {
                let _ = s.close().await;
            }
        }
    }
}

/// The client library and request/reply method, and where the server ran, for records:
/// `"tonic 0.14 (unary); server in a child process"`.
fn client_label(target: &Target, server: &ServerPlacement) -> String {
    let how = match target.system {
        System::Hayate if target.mode() == "peer-to-peer" => "request, direct to a PeerServer",
        System::Hayate => "request, inbox reply",
        System::Nats => "request/reply",
        System::Stomp => "temp-queue reply-to",
        System::Amqp => "direct reply-to",
        System::Zmq => "REQ -> ROUTER",
        System::Grpc => "unary",
        System::Zenoh => "get/queryable",
        System::Mqtt | System::Kafka => "pub/sub request-reply, a reply topic per caller",
    };
    format!(
        "{} ({how}); {}",
        crate::driver::client_name(target),
        server.label()
    )
}

/// The server of pub/sub request-reply (MQTT, Kafka): answers `"<caller> <n>"` on
/// `<prefix>/rep/<caller>`.
async fn start_pubsub_server(
    target: &Target,
    key: &str,
    prefix: &str,
    server: &mut Server,
) -> anyhow::Result<()> {
    let conn = Conn::connect(target, "bench-rpc-server", 64).await?;
    let mut sub = conn.subscribe(key).await?;
    conn.flush().await?;
    let srv = conn.clone();
    let prefix = prefix.to_string();
    server.tasks.push(tokio::spawn(async move {
        let mut topics: std::collections::HashMap<u64, Topic> = std::collections::HashMap::new();
        while let Some(req) = sub.next().await {
            let Some((caller, answer)) = pubsub_answer(&req) else {
                continue;
            };
            if let std::collections::hash_map::Entry::Vacant(e) = topics.entry(caller) {
                match srv.topic(&format!("{prefix}/rep/{caller}")).await {
                    Ok(t) => {
                        e.insert(t);
                    }
                    Err(_) => break,
                }
            }
            if srv.publish(&topics[&caller], answer).await.is_err() {
                break;
            }
        }
    }));
    server.conns.push(conn);
    Ok(())
}

/// A caller of pub/sub request-reply (MQTT, Kafka), with its reply topic subscribed.
async fn connect_pubsub_caller(
    target: &Target,
    key: &str,
    prefix: &str,
    id: u64,
) -> anyhow::Result<Caller> {
    let conn = Conn::connect(target, &format!("bench-rpc-{id}"), 64).await?;
    let replies = conn.subscribe(&format!("{prefix}/rep/{id}")).await?;
    conn.flush().await?;
    let topic = conn.topic(key).await?;
    Ok(Caller::PubSub {
        conn,
        topic,
        replies,
        id,
    })
}

async fn start_server(target: &Target, prefix: &str) -> anyhow::Result<Server> {
    let mut server = Server::new();
    let key = format!("{prefix}/req");
    match target.system {
        System::Hayate if target.mode() == "peer-to-peer" => {
            // Direct: a PeerServer on the target's host (a free port) that callers connect to.
            let host = if target.host.contains(':') {
                format!("[{}]", target.host)
            } else {
                target.host.clone()
            };
            let peer = hayate_client::peer::PeerServer::bind(
                &format!("{host}:0"),
                &[&key],
                |m: hayate_core::Message| async move { m.reply(add_one(&m.payload)) },
            )
            .await?;
            server.endpoint = Some(peer.local_addr().to_string());
            server.peer = Some(peer);
        }
        System::Hayate => {
            let c = hayate_client::Client::connect(&target.addr()).await?;
            let mut sub = c.subscribe(&key).await?;
            c.flush().await?;
            let srv = c.clone();
            server.tasks.push(tokio::spawn(async move {
                while let Some(m) = sub.next().await {
                    if srv.reply(&m, add_one(&m.payload)).await.is_err() {
                        break;
                    }
                }
            }));
            server.conns.push(Conn::Hayate(c));
        }
        System::Nats => {
            let c = async_nats::connect(format!("nats://{}", target.addr())).await?;
            let mut sub = c.subscribe(key.replace('/', ".")).await?;
            c.flush().await?;
            let srv = c.clone();
            server.tasks.push(tokio::spawn(async move {
                while let Some(m) = sub.next().await {
                    if let Some(reply) = m.reply
                        && srv.publish(reply, add_one(&m.payload)).await.is_err()
                    {
                        break;
                    }
                }
            }));
            let _ = c.flush().await;
        }
        System::Stomp => {
            let Conn::Stomp(c) = Conn::connect(target, "bench-rpc-server", 64).await? else {
                bail!("stomp: unexpected connection kind");
            };
            let mut sub = c.subscribe_destination(&stomp_queue(prefix)).await?;
            c.flush(Duration::from_secs(10)).await?;
            let srv = c.clone();
            server.tasks.push(tokio::spawn(async move {
                while let Some(f) = sub.next_frame().await {
                    let Some(reply_to) = f.get("reply-to") else {
                        continue;
                    };
                    let mut headers = Vec::new();
                    if let Some(id) = f.get("correlation-id") {
                        headers.push(("correlation-id", id));
                    }
                    if srv
                        .send(reply_to, &headers, &add_one(&f.body))
                        .await
                        .is_err()
                    {
                        break;
                    }
                }
            }));
            server.conns.push(Conn::Stomp(c));
        }
        #[cfg(feature = "peers")]
        System::Amqp => {
            server.amqp = Some(
                crate::driver::amqp::RpcServer::start(target, &amqp_queue(prefix), add_one).await?,
            );
        }
        #[cfg(feature = "peers")]
        System::Zmq => {
            let (endpoint, task) = crate::driver::zmq::rpc_serve(target, add_one).await?;
            server.endpoint = Some(endpoint);
            server.tasks.push(task);
        }
        #[cfg(feature = "peers")]
        System::Grpc => {
            let (endpoint, task) = crate::driver::grpc::rpc_serve(target, add_one).await?;
            server.endpoint = Some(endpoint);
            server.tasks.push(task);
        }
        #[cfg(feature = "peers")]
        System::Zenoh => {
            let (session, endpoint) = crate::driver::zenoh::open_server(target).await?;
            let task =
                crate::driver::zenoh::rpc_serve(session.clone(), key.clone(), add_one).await?;
            server.tasks.push(task);
            server.endpoint = endpoint;
            server.zenoh = Some(session);
        }
        System::Mqtt => start_pubsub_server(target, &key, prefix, &mut server).await?,
        #[cfg(feature = "peers")]
        System::Kafka => start_pubsub_server(target, &key, prefix, &mut server).await?,
        #[cfg(not(feature = "peers"))]
        other => bail!("rpc: the {} driver is not compiled in", other.name()),
    }
    Ok(server)
}

fn stomp_queue(prefix: &str) -> String {
    format!("/queue/{}", prefix.replace('/', "."))
}

#[cfg(feature = "peers")]
fn amqp_queue(prefix: &str) -> String {
    format!("{}.rpc", prefix.replace('/', "."))
}

#[cfg_attr(not(feature = "peers"), allow(unused_variables))]
async fn connect_caller(
    target: &Target,
    prefix: &str,
    endpoint: Option<&str>,
    id: u64,
) -> anyhow::Result<Caller> {
    let key = format!("{prefix}/req");
    Ok(match target.system {
        System::Hayate => {
            let addr = match endpoint {
                Some(ep) => ep.to_string(),
                None => target.addr(),
            };
            let c = hayate_client::Client::connect(&addr).await?;
            Caller::Hayate(c, hayate_core::Key::new(&key)?)
        }
        System::Nats => {
            let c = async_nats::connect(format!("nats://{}", target.addr())).await?;
            Caller::Nats(c, async_nats::Subject::from(key.replace('/', ".")))
        }
        System::Stomp => {
            let Conn::Stomp(c) = Conn::connect(target, &format!("bench-rpc-{id}"), 64).await?
            else {
                bail!("stomp: unexpected connection kind");
            };
            // Replies to a temp-queue come with `subscription:/temp-queue/rpc`.
            let replies = c.listen("/temp-queue/rpc");
            Caller::Stomp(c, replies, stomp_queue(prefix))
        }
        #[cfg(feature = "peers")]
        System::Amqp => Caller::Amqp(
            crate::driver::amqp::RpcCaller::connect(target, &amqp_queue(prefix)).await?,
        ),
        #[cfg(feature = "peers")]
        System::Zmq => {
            let ep = endpoint.context("zmq: no server endpoint")?;
            Caller::Zmq(crate::driver::zmq::RpcCaller::connect(ep).await?)
        }
        #[cfg(feature = "peers")]
        System::Grpc => {
            let ep = endpoint.context("grpc: no server endpoint")?;
            Caller::Grpc(crate::driver::grpc::RpcCaller::connect(ep).await?)
        }
        #[cfg(feature = "peers")]
        System::Zenoh => {
            let s = crate::driver::zenoh::open_client(target, endpoint).await?;
            Caller::Zenoh(s, key)
        }
        System::Mqtt => connect_pubsub_caller(target, &key, prefix, id).await?,
        #[cfg(feature = "peers")]
        System::Kafka => connect_pubsub_caller(target, &key, prefix, id).await?,
        #[cfg(not(feature = "peers"))]
        other => bail!("rpc: the {} driver is not compiled in", other.name()),
    })
}

async fn run(target: &Target, point: RpcPoint, opts: &RpcOptions) -> anyhow::Result<Outcome> {
    if point.concurrency == 0 || point.calls == 0 {
        bail!("rpc: calls and concurrency must be at least 1");
    }
    let prefix = point_prefix();
    match &opts.server {
        ServerPlacement::InProcess => {
            let server = start_server(target, &prefix).await?;
            let result = run_callers(target, &prefix, server.endpoint.as_deref(), point, opts)
                .await
                .map(|mut o| {
                    o.version = server.version();
                    o
                });
            server.stop().await;
            result
        }
        ServerPlacement::Child(exe) => {
            // Dropped on an error or a timeout of the point: the child is killed.
            let server = ChildServer::start(ChildServer::command(exe, target, &prefix)).await?;
            let result = run_callers(
                target,
                &prefix,
                server.ready.endpoint.as_deref(),
                point,
                opts,
            )
            .await
            .map(|mut o| {
                o.version = server.ready.version.clone();
                o
            });
            server.stop().await;
            result
        }
    }
}

/// What `bench rpc-server` writes on its one line of stdout, as JSON.
#[derive(Debug, Default, PartialEq, Serialize, Deserialize)]
struct ReadyLine {
    /// Where the callers find the server (ZeroMQ, gRPC, Zenoh peer mode).
    #[serde(default)]
    endpoint: Option<String>,
    /// The server's version, when known.
    #[serde(default)]
    version: Option<String>,
    /// Set (and nothing served) when the server could not start.
    #[serde(default)]
    error: Option<String>,
}

/// How long a child server may take to start (Kafka creates a topic).
const CHILD_READY_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a child server may take to stop after its stdin closed, before it is killed.
const CHILD_STOP_TIMEOUT: Duration = Duration::from_secs(10);

/// The serving side of a point in a child process. Dropped without [`ChildServer::stop`] (an
/// error, a timeout, a panic), it kills the child.
struct ChildServer {
    child: Option<tokio::process::Child>,
    /// Closing it tells the child to stop.
    stdin: Option<tokio::process::ChildStdin>,
    ready: ReadyLine,
}

impl ChildServer {
    /// `EXE bench rpc-server --target URL --prefix PREFIX`.
    fn command(exe: &Path, target: &Target, prefix: &str) -> tokio::process::Command {
        let mut cmd = tokio::process::Command::new(exe);
        cmd.args(["bench", "rpc-server", "--target"])
            .arg(target.to_string())
            .args(["--prefix", prefix]);
        cmd
    }

    /// Starts `cmd` (stdin and stdout piped, stderr inherited) and waits for its ready line.
    async fn start(mut cmd: tokio::process::Command) -> anyhow::Result<ChildServer> {
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .with_context(|| {
                format!(
                    "rpc: starting the server process {}",
                    cmd.as_std().get_program().to_string_lossy()
                )
            })?;
        let stdin = child.stdin.take();
        let stdout = child.stdout.take();
        let mut server = ChildServer {
            child: Some(child),
            stdin,
            ready: ReadyLine::default(),
        };
        let mut lines = tokio::io::BufReader::new(stdout.context("rpc: no server stdout")?).lines();
        let line = tokio::time::timeout(CHILD_READY_TIMEOUT, async {
            loop {
                match lines.next_line().await? {
                    Some(l) if l.trim_start().starts_with('{') => return anyhow::Ok(Some(l)),
                    Some(l) => eprintln!("rpc server: {l}"),
                    None => return Ok(None),
                }
            }
        })
        .await
        .with_context(|| {
            format!("rpc: the server process was not ready within {CHILD_READY_TIMEOUT:?}")
        })??;
        let Some(line) = line else {
            let status = match server.child.as_mut() {
                Some(c) => tokio::time::timeout(Duration::from_secs(5), c.wait())
                    .await
                    .ok()
                    .and_then(Result::ok)
                    .map(|s| s.to_string()),
                None => None,
            };
            bail!(
                "rpc: the server process ended before it was ready ({})",
                status.unwrap_or_else(|| "still running".into())
            );
        };
        server.ready = serde_json::from_str(&line)
            .with_context(|| format!("rpc: the server process said {line:?}"))?;
        if let Some(e) = &server.ready.error {
            bail!("rpc server: {e}");
        }
        // Keep reading the child's stdout (to stderr): a closed pipe would fail its next
        // write.
        tokio::spawn(async move {
            while let Ok(Some(l)) = lines.next_line().await {
                eprintln!("rpc server: {l}");
            }
        });
        Ok(server)
    }

    /// Closes the child's stdin and waits for it to exit (killed after a timeout).
    async fn stop(mut self) {
        drop(self.stdin.take());
        let Some(mut child) = self.child.take() else {
            return;
        };
        match tokio::time::timeout(CHILD_STOP_TIMEOUT, child.wait()).await {
            Ok(Ok(s)) if s.success() => {}
            Ok(Ok(s)) => tracing::warn!("rpc: the server process ended with {s}"),
            Ok(Err(e)) => tracing::warn!("rpc: waiting for the server process: {e}"),
            Err(_) => {
                tracing::warn!(
                    "rpc: the server process did not stop within {CHILD_STOP_TIMEOUT:?}: killed"
                );
                let _ = child.kill().await;
            }
        }
    }
}

impl Drop for ChildServer {
    fn drop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        // Killed and reaped here when possible (kill_on_drop would also kill it, but leave
        // reaping to the runtime).
        let _ = child.start_kill();
        let deadline = Instant::now() + Duration::from_secs(2);
        while Instant::now() < deadline {
            match child.try_wait() {
                Ok(Some(_)) | Err(_) => return,
                Ok(None) => std::thread::sleep(Duration::from_millis(10)),
            }
        }
        tracing::warn!("rpc: the server process was killed but has not exited yet");
    }
}

/// The serving side of one RPC point, in this process: what `hayate bench rpc-server
/// --target URL --prefix PREFIX` runs (see [`ServerPlacement::Child`]). Starts the server of
/// `target` under the key prefix `prefix`, writes one JSON line to stdout
/// (`{"endpoint":...,"version":...,"error":null}`; `error` set when the server could not
/// start), then serves until stdin is closed (or reaches its end) and stops the server.
pub fn serve_rpc_point(target: &Target, prefix: &str) -> anyhow::Result<()> {
    if !target.system.available() {
        bail!(
            "rpc: the {} driver is not compiled in",
            target.system.name()
        );
    }
    with_runtime(|rt| {
        rt.block_on(async {
            let started = start_server(target, prefix).await;
            let ready = match &started {
                Ok(s) => ReadyLine {
                    endpoint: s.endpoint.clone(),
                    version: s.version(),
                    error: None,
                },
                Err(e) => ReadyLine {
                    error: Some(format!("{e:#}")),
                    ..ReadyLine::default()
                },
            };
            {
                let mut out = std::io::stdout().lock();
                writeln!(out, "{}", serde_json::to_string(&ready)?)?;
                out.flush()?;
            }
            let server = started?;
            // Serve until the parent closes stdin (or ends: its end of the pipe closes too).
            let mut stdin = tokio::io::stdin();
            let mut buf = [0u8; 256];
            loop {
                match stdin.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {}
                }
            }
            server.stop().await;
            Ok(())
        })
    })
}

async fn run_callers(
    target: &Target,
    prefix: &str,
    endpoint: Option<&str>,
    point: RpcPoint,
    opts: &RpcOptions,
) -> anyhow::Result<Outcome> {
    let mut callers = Vec::with_capacity(point.concurrency);
    for id in 0..point.concurrency as u64 {
        let mut c = connect_caller(target, prefix, endpoint, id).await?;
        // Warm-up and readiness: a first call must succeed (the server's subscription or
        // queryable has reached the caller's side). Retried for up to 10 s.
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let probe = u64::MAX / 2;
            match c.call(probe, Duration::from_secs(1)).await {
                Ok(r) if check_reply(probe, &r).is_ok() => break,
                Ok(r) => bail!("rpc: warm-up call got {r:?}"),
                Err(e) if Instant::now() > deadline => {
                    return Err(e.context("rpc: the server never answered"));
                }
                // A reply that was late for the probe could arrive with the next call:
                // reconnect to start clean.
                Err(_) => {
                    c.close().await;
                    c = connect_caller(target, prefix, endpoint, id).await?;
                }
            }
        }
        for i in 0..20 {
            let r = c.call(i, opts.call_timeout).await?;
            check_reply(i, &r)?;
        }
        callers.push(c);
    }
    let next = Arc::new(AtomicU64::new(0));
    let t0 = Instant::now();
    let stop_at = t0 + opts.max_time;
    let mut tasks = Vec::new();
    for mut c in callers {
        let next = next.clone();
        let timeout = opts.call_timeout;
        let calls = point.calls;
        tasks.push(tokio::spawn(async move {
            let mut hist = crate::lat::new_histogram()?;
            let mut done = 0u64;
            let res: anyhow::Result<()> = async {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= calls || Instant::now() > stop_at {
                        return Ok(());
                    }
                    let t = Instant::now();
                    let r = c.call(i, timeout).await?;
                    let el = t.elapsed();
                    check_reply(i, &r)?;
                    hist.saturating_record((el.as_nanos() as u64).max(1));
                    done += 1;
                }
            }
            .await;
            // The point's time ends with the last call, not with the connection's close.
            let end = t0.elapsed();
            c.close().await;
            res.map(|()| (hist, done, end))
        }));
    }
    let mut hist = crate::lat::new_histogram()?;
    let mut calls = 0;
    let mut elapsed = Duration::ZERO;
    let mut first_err = None;
    for t in tasks {
        match t.await.context("rpc caller task")? {
            Ok((h, d, end)) => {
                hist.add(&h)?;
                calls += d;
                elapsed = elapsed.max(end);
            }
            Err(e) => {
                first_err.get_or_insert(e);
            }
        }
    }
    if let Some(e) = first_err {
        return Err(e);
    }
    Ok(Outcome {
        version: None,
        calls,
        elapsed,
        hist,
    })
}

#[cfg(test)]
mod tests {
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

    /// Runs a child server that is `sh -c SCRIPT`.
    #[cfg(unix)]
    async fn sh_server(script: &str) -> anyhow::Result<ChildServer> {
        let mut cmd = tokio::process::Command::new("sh");
        cmd.arg("-c").arg(script);
        ChildServer::start(cmd).await
    }

    #[cfg(unix)]
    fn gone(pid: u32) -> bool {
        !Path::new(&format!("/proc/{pid}")).exists()
    }

    #[cfg(unix)]
    #[test]
    fn child_servers_are_stopped_or_killed() {
        with_runtime(|rt| {
            rt.block_on(async {
                // Dropped (an error or a timeout of the point): killed and reaped at once.
                let s = sh_server(
                    "echo 'a log line'; \
                     echo '{\"endpoint\":\"tcp://127.0.0.1:1\",\"version\":\"v1\"}'; \
                     exec sleep 600",
                )
                .await?;
                assert_eq!(s.ready.endpoint.as_deref(), Some("tcp://127.0.0.1:1"));
                assert_eq!(s.ready.version.as_deref(), Some("v1"));
                let pid = s.child.as_ref().and_then(|c| c.id()).context("pid")?;
                assert!(!gone(pid));
                drop(s);
                assert!(gone(pid), "the dropped child {pid} still exists");

                // stop(): the child ends when its stdin closes.
                let s = sh_server("echo '{}'; cat >/dev/null").await?;
                assert_eq!(s.ready, ReadyLine::default());
                let pid = s.child.as_ref().and_then(|c| c.id()).context("pid")?;
                let t = Instant::now();
                s.stop().await;
                assert!(gone(pid));
                assert!(t.elapsed() < CHILD_STOP_TIMEOUT);

                // A server that could not start says why.
                let e = sh_server("echo '{\"error\":\"no broker here\"}'; exit 1")
                    .await
                    .err()
                    .context("an error")?;
                assert!(format!("{e:#}").contains("no broker here"), "{e:#}");
                // One that ends without a word.
                let e = sh_server("exit 3").await.err().context("an error")?;
                assert!(
                    format!("{e:#}").contains("ended before it was ready"),
                    "{e:#}"
                );
                Ok(())
            })
        })
        .unwrap();
    }

    #[test]
    fn ready_line_is_json() {
        let r = ReadyLine {
            endpoint: Some("http://127.0.0.1:5000".into()),
            version: None,
            error: None,
        };
        let s = serde_json::to_string(&r).unwrap();
        assert!(!s.contains('\n'));
        assert_eq!(serde_json::from_str::<ReadyLine>(&s).unwrap(), r);
        assert_eq!(
            serde_json::from_str::<ReadyLine>("{}").unwrap(),
            ReadyLine::default()
        );
    }

    #[test]
    fn records_say_where_the_server_ran() {
        let t = Target::parse("hayate://127.0.0.1:4700").unwrap();
        assert_eq!(
            client_label(&t, &ServerPlacement::Child(PathBuf::from("hayate"))),
            concat!(
                "hayate-client ",
                env!("CARGO_PKG_VERSION"),
                " (request, inbox reply); server in a child process"
            )
        );
        assert!(client_label(&t, &ServerPlacement::InProcess).ends_with("; server in-process"));
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
