//! ZeroMQ PUB/SUB driver (`zmq://HOST:PORT`), brokerless, through the pure-Rust `zeromq` crate.
//!
//! There is no broker: records say mode "peer-to-peer". Every connection of a point binds a PUB
//! socket on HOST (port 0, the default: a free port; a given port P: P for the first
//! connection of a point, P+1 for the second...). [`ZmqConn::topic`] makes the connection the
//! publisher of a key; a subscription is a SUB socket that subscribes the key as its prefix and
//! connects to the PUB of the connection that publishes that key (as soon as it is known: all
//! connections of a point are in this process and meet in a [`Hub`]). Messages are two frames,
//! `[topic, payload]`; a SUB keeps only messages whose topic frame is exactly its key.
//!
//! - Throughput is what arrives: like libzmq, the `zeromq` crate's PUB drops a message for a
//!   subscriber whose queue is full (it never blocks the publisher). The publisher yields to the
//!   runtime every 32 messages so that the socket's writer tasks get CPU time.
//! - Latency: the echo side is a second PUB/SUB pair in the other direction (the pinger
//!   publishes `<prefix>/ping` from its PUB, the echo publishes `<prefix>/pong` from its PUB).
//! - Flush: ZeroMQ has no acknowledgement of a subscription, so flush sends "hello" messages
//!   (three frames `[topic, "", "hello"]`, skipped by readers) through the publisher of each
//!   key this connection subscribes or publishes, until every SUB of the key has seen one:
//!   then the subscription has reached the PUB and later messages are delivered.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use bytes::Bytes;
use hayate_core::sync::lock;
use tokio::sync::{mpsc, watch};
use zeromq::{PubSocket, Socket, SocketRecv, SocketSend, SubSocket, ZmqMessage};

use crate::target::Target;

/// The client library, for records.
pub(crate) const CLIENT: &str = "zeromq (pure Rust) 0.7";

const HELLO: &[u8] = b"hello";
/// The publisher yields to the runtime after this many messages (PUB never blocks).
const YIELD_EVERY: u64 = 32;

type PubHandle = Arc<tokio::sync::Mutex<PubSocket>>;

/// Where the connections of one target meet: who publishes which key, who subscribes it.
struct Hub {
    /// key -> (endpoint of the publishing socket, the socket).
    pubs: Mutex<HashMap<String, (String, PubHandle)>>,
    subs: Mutex<HashMap<String, Vec<Arc<SubState>>>>,
    /// Bumped when a publisher is registered.
    changed: watch::Sender<u64>,
    /// Connections made (for the port of the next bind).
    conns: Mutex<u16>,
}

struct SubState {
    key: String,
    /// Hellos seen.
    hellos: watch::Sender<u64>,
}

impl Hub {
    fn get(target: &Target) -> Arc<Hub> {
        static HUBS: Mutex<Vec<(String, Weak<Hub>)>> = Mutex::new(Vec::new());
        let mut hubs = lock(&HUBS);
        hubs.retain(|(_, w)| w.strong_count() > 0);
        let addr = target.addr();
        if let Some(h) = hubs
            .iter()
            .find(|(a, _)| *a == addr)
            .and_then(|(_, w)| w.upgrade())
        {
            return h;
        }
        let h = Arc::new(Hub {
            pubs: Mutex::default(),
            subs: Mutex::default(),
            changed: watch::channel(0).0,
            conns: Mutex::new(0),
        });
        hubs.push((addr, Arc::downgrade(&h)));
        h
    }

    fn publisher(&self, key: &str) -> Option<(String, PubHandle)> {
        lock(&self.pubs).get(key).cloned()
    }
}

#[derive(Clone)]
pub(crate) struct ZmqConn {
    hub: Arc<Hub>,
    socket: PubHandle,
    endpoint: String,
    /// Keys this connection subscribes and publishes.
    subscribed: Arc<Mutex<Vec<Arc<SubState>>>>,
    published: Arc<Mutex<Vec<String>>>,
    readers: Arc<Mutex<Vec<tokio::task::AbortHandle>>>,
    trouble: Arc<Mutex<Option<String>>>,
    cap: usize,
    sent: Arc<AtomicU64>,
}

pub(crate) struct ZmqSub(mpsc::Receiver<Bytes>);

impl ZmqConn {
    pub(crate) async fn connect(target: &Target, expect_payload: usize) -> anyhow::Result<ZmqConn> {
        let hub = Hub::get(target);
        let index = {
            let mut n = lock(&hub.conns);
            *n += 1;
            *n - 1
        };
        let port = if target.port == 0 {
            0
        } else {
            target
                .port
                .checked_add(index)
                .context("zmq: port out of range")?
        };
        let host = if target.host.contains(':') {
            format!("[{}]", target.host)
        } else {
            target.host.clone()
        };
        let mut socket = PubSocket::new();
        let endpoint = socket
            .bind(&format!("tcp://{host}:{port}"))
            .await
            .with_context(|| format!("binding a PUB socket on {host}:{port}"))?
            .to_string();
        Ok(ZmqConn {
            hub,
            socket: Arc::new(tokio::sync::Mutex::new(socket)),
            endpoint,
            subscribed: Arc::default(),
            published: Arc::default(),
            readers: Arc::default(),
            trouble: Arc::default(),
            cap: ((256usize << 20) / (expect_payload + 64)).clamp(16, 4096),
            sent: Arc::default(),
        })
    }

    /// Makes this connection the publisher of `key`.
    pub(crate) fn topic(&self, key: &str) -> anyhow::Result<String> {
        let mut pubs = lock(&self.hub.pubs);
        if let Some((ep, _)) = pubs.get(key)
            && *ep != self.endpoint
        {
            bail!("zmq: {key} already has a publisher ({ep})");
        }
        pubs.insert(
            key.to_string(),
            (self.endpoint.clone(), self.socket.clone()),
        );
        drop(pubs);
        lock(&self.published).push(key.to_string());
        self.hub.changed.send_modify(|v| *v += 1);
        Ok(key.to_string())
    }

    #[inline]
    pub(crate) async fn publish(&self, topic: &str, payload: Bytes) -> anyhow::Result<()> {
        let mut m = ZmqMessage::from(Bytes::copy_from_slice(topic.as_bytes()));
        m.push_back(payload);
        self.socket.lock().await.send(m).await?;
        if self
            .sent
            .fetch_add(1, Ordering::Relaxed)
            .is_multiple_of(YIELD_EVERY)
        {
            tokio::task::yield_now().await;
        }
        Ok(())
    }

    pub(crate) async fn subscribe(&self, key: &str) -> anyhow::Result<ZmqSub> {
        let state = Arc::new(SubState {
            key: key.to_string(),
            hellos: watch::channel(0).0,
        });
        let mut sock = SubSocket::new();
        sock.subscribe(key).await?;
        let (tx, rx) = mpsc::channel(self.cap);
        let reader = {
            let (hub, state, trouble) = (self.hub.clone(), state.clone(), self.trouble.clone());
            let mut changed = self.hub.changed.subscribe();
            tokio::spawn(async move {
                let endpoint = loop {
                    if let Some((ep, _)) = hub.publisher(&state.key) {
                        break ep;
                    }
                    if changed.changed().await.is_err() {
                        return;
                    }
                };
                drop(hub);
                if let Err(e) = sock.connect(&endpoint).await {
                    lock(&trouble).get_or_insert(format!("zmq: connecting to {endpoint}: {e}"));
                    return;
                }
                let key = state.key.as_bytes();
                loop {
                    let m = match sock.recv().await {
                        Ok(m) => m,
                        Err(e) => {
                            lock(&trouble).get_or_insert(format!("zmq: receiving: {e}"));
                            return;
                        }
                    };
                    if m.get(0).map(|t| t.as_ref()) != Some(key) {
                        continue;
                    }
                    match m.len() {
                        2 => {
                            let Some(payload) = m.into_vec().pop() else {
                                continue;
                            };
                            if tx.send(payload).await.is_err() {
                                return;
                            }
                        }
                        3 if m.get(2).map(|h| h.as_ref()) == Some(HELLO) => {
                            state.hellos.send_modify(|n| *n += 1);
                        }
                        _ => {}
                    }
                }
            })
        };
        lock(&self.readers).push(reader.abort_handle());
        lock(&self.hub.subs)
            .entry(key.to_string())
            .or_default()
            .push(state.clone());
        lock(&self.subscribed).push(state);
        Ok(ZmqSub(rx))
    }

    /// See the module docs: every subscription of a key this connection subscribes (when its
    /// publisher is known) or publishes has seen a hello from the publisher.
    pub(crate) async fn flush(&self, timeout: Duration) -> anyhow::Result<()> {
        let deadline = Instant::now() + timeout;
        let mut todo: Vec<Arc<SubState>> = lock(&self.subscribed).clone();
        for key in lock(&self.published).iter() {
            if let Some(subs) = lock(&self.hub.subs).get(key) {
                todo.extend(subs.iter().cloned());
            }
        }
        for sub in todo {
            let Some((_, publisher)) = self.hub.publisher(&sub.key) else {
                continue; // no publisher yet: its flush confirms this subscription
            };
            let mut seen = sub.hellos.subscribe();
            let before = *seen.borrow_and_update();
            loop {
                let mut m = ZmqMessage::from(Bytes::copy_from_slice(sub.key.as_bytes()));
                m.push_back(Bytes::new());
                m.push_back(Bytes::from_static(HELLO));
                publisher.lock().await.send(m).await?;
                let wait = tokio::time::timeout(Duration::from_millis(20), seen.changed()).await;
                if wait.is_ok() && *seen.borrow() > before {
                    break;
                }
                if Instant::now() > deadline {
                    bail!(
                        "zmq: the subscription of {} saw no hello within {timeout:?}",
                        sub.key
                    );
                }
            }
        }
        Ok(())
    }

    pub(crate) fn trouble(&self) -> Option<String> {
        lock(&self.trouble).clone()
    }

    pub(crate) async fn close(self) {
        for r in lock(&self.readers).drain(..) {
            r.abort();
        }
        let mut pubs = lock(&self.hub.pubs);
        for key in lock(&self.published).iter() {
            pubs.remove(key);
        }
        drop(pubs);
        let mut subs = lock(&self.hub.subs);
        for s in lock(&self.subscribed).iter() {
            if let Some(v) = subs.get_mut(&s.key) {
                v.retain(|x| !Arc::ptr_eq(x, s));
            }
        }
    }
}

impl ZmqSub {
    #[inline]
    pub(crate) async fn next(&mut self) -> Option<Bytes> {
        self.0.recv().await
    }
}

/// The RPC server: a ROUTER socket bound on the target's HOST:PORT (port 0: a free port)
/// answering each request with `handler`, sent back to the identity it came from. A REQ
/// caller's request arrives as `[identity, "", body]` (the envelope, its empty delimiter, the
/// body); the answer goes out as `[identity, "", answer]`. A REP socket is locked in
/// receive/answer steps with one current requester, and the `zeromq` crate's REP returns an
/// error from `recv` when a caller's connection fails; ROUTER fair-queues the requests of all
/// callers with their identities and the server addresses each answer itself, so concurrent
/// callers are served, and one that goes away costs only its own answers (a failed send is
/// skipped). Requests are answered one at a time, in arrival order. Returns its endpoint and
/// its task.
pub(crate) async fn rpc_serve(
    target: &Target,
    handler: fn(&[u8]) -> Bytes,
) -> anyhow::Result<(String, tokio::task::JoinHandle<()>)> {
    let host = if target.host.contains(':') {
        format!("[{}]", target.host)
    } else {
        target.host.clone()
    };
    let mut router = zeromq::RouterSocket::new();
    let endpoint = router
        .bind(&format!("tcp://{host}:{}", target.port))
        .await
        .with_context(|| format!("binding a ROUTER socket on {host}:{}", target.port))?
        .to_string();
    let task = tokio::spawn(async move {
        while let Ok(m) = router.recv().await {
            let Some(reply) = router_reply(m, handler) else {
                continue; // no envelope: not from a REQ socket
            };
            if let Err(e) = router.send(reply).await {
                tracing::debug!("zmq: an answer was not sent (its caller is gone?): {e}");
            }
        }
    });
    Ok((endpoint, task))
}

/// The answer to a request received by a ROUTER: the request's envelope (the frames up to and
/// including the first empty one: the identity, then the delimiter) followed by
/// `handler(body)`. `None` when there is no delimiter or no body.
fn router_reply(m: ZmqMessage, handler: fn(&[u8]) -> Bytes) -> Option<ZmqMessage> {
    let mut frames = m.into_vecdeque();
    let delim = frames.iter().position(|f| f.is_empty())?;
    let answer = handler(frames.get(delim + 1)?);
    frames.truncate(delim + 1);
    let mut reply = ZmqMessage::from(answer);
    for f in frames.into_iter().rev() {
        reply.push_front(f);
    }
    Some(reply)
}

/// An RPC caller: a REQ socket connected to the server's ROUTER.
pub(crate) struct RpcCaller(zeromq::ReqSocket);

impl RpcCaller {
    pub(crate) async fn connect(endpoint: &str) -> anyhow::Result<RpcCaller> {
        let mut s = zeromq::ReqSocket::new();
        s.connect(endpoint)
            .await
            .with_context(|| format!("connecting a REQ socket to {endpoint}"))?;
        Ok(RpcCaller(s))
    }

    pub(crate) async fn call(&mut self, req: Bytes) -> anyhow::Result<Bytes> {
        self.0.send(ZmqMessage::from(req)).await?;
        let m = self.0.recv().await?;
        m.get(0).cloned().context("zmq: empty reply")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn router_answers_to_the_envelope() {
        let mut m = ZmqMessage::from(Bytes::from_static(b"41"));
        m.push_front(Bytes::new());
        m.push_front(Bytes::from_static(b"\x00id"));
        let r = router_reply(m, crate::rpc::add_one).unwrap().into_vec();
        assert_eq!(
            r,
            vec![
                Bytes::from_static(b"\x00id"),
                Bytes::new(),
                Bytes::from_static(b"42")
            ]
        );
        assert!(
            router_reply(
                ZmqMessage::from(Bytes::from_static(b"41")),
                crate::rpc::add_one
            )
            .is_none()
        );
    }

    #[test]
    fn req_callers_share_one_router() {
        crate::with_runtime(|rt| {
            rt.block_on(async {
                let t = Target::parse("zmq://127.0.0.1:0")?;
                let (ep, task) = rpc_serve(&t, crate::rpc::add_one).await?;
                let mut callers = Vec::new();
                for _ in 0..4 {
                    callers.push(RpcCaller::connect(&ep).await?);
                }
                let mut calls = Vec::new();
                for (k, mut c) in callers.into_iter().enumerate() {
                    calls.push(tokio::spawn(async move {
                        for i in 0..50u64 {
                            let n = k as u64 * 1000 + i;
                            let r = c.call(Bytes::from(n.to_string())).await?;
                            crate::rpc::check_reply(n, &r)?;
                        }
                        anyhow::Ok(())
                    }));
                }
                for c in calls {
                    c.await??;
                }
                task.abort();
                Ok(())
            })
        })
        .unwrap();
    }
}
