//! Zenoh driver (`zenoh://HOST:PORT`, feature `peers`), through the `zenoh` crate (the same
//! version as the router that `bench/peers/zenoh.sh` installs), TCP transport only.
//!
//! Two modes, chosen with `?mode=`:
//! - `client` (the default): every connection is a Zenoh session in client mode connected to
//!   the router (`zenohd`) at `tcp/HOST:PORT`. Records say mode "brokered".
//! - `peer`: brokerless. Connections pair up in the order they are made: the first of a pair
//!   opens a peer session that listens on `tcp/HOST:<a free port>`, the second opens a peer
//!   session that connects to it (the harness always makes a point's two connections one
//!   after the other: subscriber then publisher, echo then pinger). Records say mode
//!   "peer-to-peer". Multicast scouting and gossip are off in both modes (loopback only).
//!
//! Settings: reliable (the default), congestion control `Block` for publications (as
//! Hayate's default), Zenoh's automatic batching on; `?express=1` sends each publication at
//! once instead (lower latency, lower throughput). Subscribers use a FIFO channel of 64 Ki
//! samples. Received payloads reach the harness without a copy when Zenoh delivers them in one
//! slice ([`to_bytes`]).
//!
//! Flush: Zenoh has no round trip on a session, but a publisher knows whether a subscriber
//! matches it ([`zenoh::pubsub::Publisher::matching_status`]); flush waits until every
//! publisher of the connection has a match, so no measured message is sent into the void. A
//! subscriber's declaration and the publications of its session travel in order, which
//! covers the echo direction of the latency test.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::bail;
use bytes::Bytes;
use hayate_core::sync::lock;
use zenoh::handlers::FifoChannelHandler;
use zenoh::pubsub::{Publisher, Subscriber};
use zenoh::qos::CongestionControl;
use zenoh::sample::Sample;

use crate::target::Target;

/// The client library, for records.
pub(crate) const CLIENT: &str = "zenoh (Rust) 1.10.2";

/// Capacity of a subscriber's channel, in samples.
const SUB_CAPACITY: usize = 64 << 10;

/// Whether a target runs in peer-to-peer mode (`?mode=peer`).
pub(crate) fn is_peer(target: &Target) -> bool {
    target.param("mode") == Some("peer")
}

fn express(target: &Target) -> bool {
    matches!(target.param("express"), Some("1" | "true"))
}

/// Checks a target's parameters (called when the URL is parsed).
pub(crate) fn check_params(target: &Target) -> anyhow::Result<()> {
    match target.param("mode") {
        None | Some("client" | "peer") => {}
        Some(m) => bail!("zenoh: mode must be client or peer, not {m:?}"),
    }
    match target.param("express") {
        None | Some("0" | "1" | "true" | "false") => Ok(()),
        Some(e) => bail!("zenoh: express must be 0 or 1, not {e:?}"),
    }
}

fn host_of(target: &Target) -> String {
    if target.host.contains(':') {
        format!("[{}]", target.host)
    } else {
        target.host.clone()
    }
}

/// Peer mode: the endpoint of the first connection of a pair, waiting for its partner, per
/// target address.
static PENDING: Mutex<Option<HashMap<String, String>>> = Mutex::new(None);

/// How a session is opened.
enum Role {
    /// Client of the router at the target's address.
    Client,
    /// Peer listening on this endpoint.
    Listen(String),
    /// Peer connecting to this endpoint.
    Connect(String),
}

/// A fresh `tcp/HOST:PORT` endpoint for a listening peer (the target's port, or a free one
/// when it is 0).
fn listen_endpoint(target: &Target) -> anyhow::Result<String> {
    let port = if target.port == 0 {
        std::net::TcpListener::bind((target.host.as_str(), 0))?
            .local_addr()?
            .port()
    } else {
        target.port
    };
    Ok(format!("tcp/{}:{port}", host_of(target)))
}

async fn open_as(target: &Target, role: Role) -> anyhow::Result<zenoh::Session> {
    let mut config = zenoh::Config::default();
    let set = |c: &mut zenoh::Config, k: &str, v: &str| {
        c.insert_json5(k, v)
            .map_err(|e| anyhow::anyhow!("zenoh config {k} = {v}: {e}"))
    };
    set(&mut config, "scouting/multicast/enabled", "false")?;
    set(&mut config, "scouting/gossip/enabled", "false")?;
    match role {
        Role::Client => {
            set(&mut config, "mode", "\"client\"")?;
            let endpoint = format!("tcp/{}:{}", host_of(target), target.port);
            set(
                &mut config,
                "connect/endpoints",
                &format!("[\"{endpoint}\"]"),
            )?;
        }
        Role::Listen(endpoint) => {
            set(&mut config, "mode", "\"peer\"")?;
            set(
                &mut config,
                "listen/endpoints",
                &format!("[\"{endpoint}\"]"),
            )?;
        }
        Role::Connect(endpoint) => {
            set(&mut config, "mode", "\"peer\"")?;
            set(
                &mut config,
                "connect/endpoints",
                &format!("[\"{endpoint}\"]"),
            )?;
            set(&mut config, "listen/endpoints", "[]")?;
        }
    }
    zenoh::open(config)
        .await
        .map_err(|e| anyhow::anyhow!("opening a zenoh session for {target}: {e}"))
}

/// Opens a session for `target`: client of the router, or one side of a peer pair (the
/// first of a pair listens, the second connects to it), or (`?connect=ENDPOINT`, the
/// fan-out's subscriber processes) a peer connected to that endpoint. With the endpoint the
/// session listens on, if it does.
async fn open(target: &Target) -> anyhow::Result<(zenoh::Session, Option<String>)> {
    if !is_peer(target) {
        return Ok((open_as(target, Role::Client).await?, None));
    }
    if let Some(ep) = target.param("connect") {
        return Ok((open_as(target, Role::Connect(ep.to_string())).await?, None));
    }
    let partner = lock(&PENDING)
        .get_or_insert_with(HashMap::new)
        .remove(&target.addr());
    match partner {
        Some(endpoint) => Ok((open_as(target, Role::Connect(endpoint)).await?, None)),
        None => {
            let endpoint = listen_endpoint(target)?;
            let s = open_as(target, Role::Listen(endpoint.clone())).await?;
            lock(&PENDING)
                .get_or_insert_with(HashMap::new)
                .insert(target.addr(), endpoint.clone());
            Ok((s, Some(endpoint)))
        }
    }
}

/// The RPC server's session: a client of the router, or (peer mode) a peer listening on a
/// fresh endpoint, returned for the callers.
pub(crate) async fn open_server(
    target: &Target,
) -> anyhow::Result<(zenoh::Session, Option<String>)> {
    if is_peer(target) {
        let endpoint = listen_endpoint(target)?;
        let s = open_as(target, Role::Listen(endpoint.clone())).await?;
        Ok((s, Some(endpoint)))
    } else {
        Ok((open_as(target, Role::Client).await?, None))
    }
}

/// An RPC caller's session: a client of the router, or (peer mode) a peer connected to the
/// server's endpoint.
pub(crate) async fn open_client(
    target: &Target,
    server: Option<&str>,
) -> anyhow::Result<zenoh::Session> {
    match (is_peer(target), server) {
        (true, Some(ep)) => open_as(target, Role::Connect(ep.to_string())).await,
        (true, None) => bail!("zenoh peer mode: no server endpoint"),
        (false, _) => open_as(target, Role::Client).await,
    }
}

#[derive(Clone)]
pub(crate) struct ZenohConn {
    session: zenoh::Session,
    /// The endpoint this peer session listens on (peer mode, the first of a pair).
    listen: Option<String>,
    express: bool,
    /// Publishers declared by [`ZenohConn::publisher`], by key.
    publishers: Arc<Mutex<HashMap<String, Arc<Publisher<'static>>>>>,
    /// Trouble noticed asynchronously (none is reported by Zenoh today; kept for symmetry).
    trouble: Arc<Mutex<Option<String>>>,
}

pub(crate) struct ZenohSub(Subscriber<FifoChannelHandler<Sample>>);

/// A Zenoh sample's payload as `Bytes`: without a copy when it is one slice.
fn to_bytes(sample: Sample) -> Bytes {
    struct Owner(Sample);
    impl AsRef<[u8]> for Owner {
        fn as_ref(&self) -> &[u8] {
            self.0.payload().slices().next().unwrap_or(&[])
        }
    }
    if sample.payload().slices().nth(1).is_none() {
        Bytes::from_owner(Owner(sample))
    } else {
        Bytes::from(sample.payload().to_bytes().into_owned())
    }
}

impl ZenohConn {
    pub(crate) async fn connect(target: &Target) -> anyhow::Result<ZenohConn> {
        let (session, listen) = open(target).await?;
        Ok(ZenohConn {
            session,
            listen,
            express: express(target),
            publishers: Arc::default(),
            trouble: Arc::default(),
        })
    }

    /// The endpoint this session listens on (a peer session that others connect to).
    pub(crate) fn listen_endpoint(&self) -> Option<&str> {
        self.listen.as_deref()
    }

    /// Takes back this session's place in the pairing of peer connections: a session that
    /// others connect to by `?connect=` is no one's partner.
    pub(crate) fn unpair(&self, target: &Target) {
        if let Some(m) = lock(&PENDING).as_mut() {
            m.remove(&target.addr());
        }
    }

    /// Declares (once) the publisher of `key`.
    pub(crate) async fn publisher(&self, key: &str) -> anyhow::Result<Arc<Publisher<'static>>> {
        if let Some(p) = lock(&self.publishers).get(key) {
            return Ok(p.clone());
        }
        let p = self
            .session
            .declare_publisher(key.to_string())
            .congestion_control(CongestionControl::Block)
            .express(self.express)
            .await
            .map_err(|e| anyhow::anyhow!("zenoh: declaring a publisher on {key}: {e}"))?;
        let p = Arc::new(p);
        lock(&self.publishers).insert(key.to_string(), p.clone());
        Ok(p)
    }

    pub(crate) async fn publish(
        &self,
        p: &Publisher<'static>,
        payload: Bytes,
    ) -> anyhow::Result<()> {
        p.put(payload)
            .await
            .map_err(|e| anyhow::anyhow!("zenoh put: {e}"))
    }

    pub(crate) async fn subscribe(&self, key: &str) -> anyhow::Result<ZenohSub> {
        let s = self
            .session
            .declare_subscriber(key.to_string())
            .with(zenoh::handlers::FifoChannel::new(SUB_CAPACITY))
            .await
            .map_err(|e| anyhow::anyhow!("zenoh: declaring a subscriber on {key}: {e}"))?;
        Ok(ZenohSub(s))
    }

    /// Waits until every publisher of this connection has a matching subscriber.
    pub(crate) async fn flush(&self, timeout: Duration) -> anyhow::Result<()> {
        let pubs: Vec<(String, Arc<Publisher<'static>>)> = lock(&self.publishers)
            .iter()
            .map(|(k, p)| (k.clone(), p.clone()))
            .collect();
        let deadline = Instant::now() + timeout;
        for (key, p) in pubs {
            loop {
                let m = p
                    .matching_status()
                    .await
                    .map_err(|e| anyhow::anyhow!("zenoh matching status: {e}"))?;
                if m.matching() {
                    break;
                }
                if Instant::now() > deadline {
                    bail!("zenoh: no subscriber matched {key} within {timeout:?}");
                }
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        }
        Ok(())
    }

    pub(crate) fn trouble(&self) -> Option<String> {
        if self.session.is_closed() {
            return Some("the zenoh session closed".into());
        }
        lock(&self.trouble).clone()
    }

    pub(crate) async fn close(self) {
        lock(&self.publishers).clear();
        if let Err(e) = self.session.close().await {
            tracing::debug!("closing a zenoh session: {e}");
        }
    }
}

impl ZenohSub {
    pub(crate) async fn next(&mut self) -> Option<Bytes> {
        self.0.recv_async().await.ok().map(to_bytes)
    }
}

/// The number sent by an RPC request and checked in its reply, Zenoh style: the client
/// `get`s the server's key with the number as payload; the server's queryable replies on the
/// same key.
pub(crate) async fn rpc_serve(
    session: zenoh::Session,
    key: String,
    handler: fn(&[u8]) -> Bytes,
) -> anyhow::Result<tokio::task::JoinHandle<()>> {
    let q = session
        .declare_queryable(key.clone())
        .await
        .map_err(|e| anyhow::anyhow!("zenoh: declaring a queryable on {key}: {e}"))?;
    Ok(tokio::spawn(async move {
        while let Ok(query) = q.recv_async().await {
            let req = query
                .payload()
                .map(|p| p.to_bytes().into_owned())
                .unwrap_or_default();
            if query.reply(key.clone(), handler(&req)).await.is_err() {
                break;
            }
        }
    }))
}

/// One call: a `get` on `key` with `payload`; the first reply's payload.
pub(crate) async fn rpc_call(
    session: &zenoh::Session,
    key: &str,
    payload: Bytes,
    timeout: Duration,
) -> anyhow::Result<Bytes> {
    let replies = session
        .get(key)
        .payload(payload)
        .timeout(timeout)
        .await
        .map_err(|e| anyhow::anyhow!("zenoh get {key}: {e}"))?;
    let reply = replies
        .recv_async()
        .await
        .map_err(|_| anyhow::anyhow!("zenoh get {key}: no reply within {timeout:?}"))?;
    match reply.into_result() {
        Ok(sample) => Ok(to_bytes(sample)),
        Err(e) => bail!("zenoh get {key}: error reply {:?}", e.payload().to_bytes()),
    }
}
