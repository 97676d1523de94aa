//! Links between nodes: the outgoing connection to each node this node knows (dialled, kept
//! while static, found again by discovery), the names nodes give themselves in HELLO and
//! WELCOME, and interest announcements sent on links.

use std::net::SocketAddr;
use std::sync::Arc;

use hayate_core::sync::lock;
use hayate_core::{Key, Message};

use super::interest::{INTEREST_KEY, Interest};
use super::{Link, NODE_PREFIX, NodeInner, ShmMode};
use crate::{Client, Error, Result};

/// Parses a node's HELLO name: its id and advertised address.
pub(super) fn parse_hello_name(name: &str) -> Option<(u64, String)> {
    let rest = name.strip_prefix(NODE_PREFIX)?;
    let (id, addr) = rest.split_once(' ')?;
    Some((u64::from_str_radix(id, 16).ok()?, addr.to_string()))
}

/// `addr` with an unspecified host replaced by `seen` (the address it came from).
pub(crate) fn resolve_advertised(addr: &str, seen: std::net::IpAddr) -> Option<String> {
    let a: SocketAddr = addr.parse().ok()?;
    if a.ip().is_unspecified() {
        Some(SocketAddr::new(seen, a.port()).to_string())
    } else {
        Some(a.to_string())
    }
}

impl NodeInner {
    pub(super) fn hello_name(&self) -> String {
        format!("{NODE_PREFIX}{:016x} {}", self.id, self.advertise)
    }

    pub(super) fn welcome_name(&self) -> String {
        format!("{NODE_PREFIX}{:016x}", self.id)
    }

    /// Dials `addr`; `Ok(Some(id))` once linked (or already linked) to node `id` (this
    /// node's own id when `addr` is this node), `Ok(None)` when someone is dialling it
    /// already.
    pub(super) async fn dial(self: Arc<Self>, addr: String) -> Result<Option<u64>> {
        if self.is_stopped() {
            return Err(Error::Closed);
        }
        if !lock(&self.state).dialing.insert(addr.clone()) {
            return Ok(None); // someone is at it
        }
        let r = self.clone().dial_inner(&addr).await;
        lock(&self.state).dialing.remove(&addr);
        if let Err(e) = &r {
            tracing::debug!(node = %format_args!("{:016x}", self.id), %addr, "peer: dial failed: {e}");
        }
        r
    }

    async fn dial_inner(self: Arc<Self>, addr: &str) -> Result<Option<u64>> {
        let mut options = self.options.link.clone();
        options.name = self.hello_name();
        let client = Client::connect_with(addr, options).await?;
        let Some(rid) = client
            .server_name()
            .strip_prefix(NODE_PREFIX)
            .and_then(|id| u64::from_str_radix(id, 16).ok())
        else {
            let _ = client.close().await;
            return Err(Error::Protocol(format!(
                "{addr} is not a peer node (server {:?})",
                client.server_name()
            )));
        };
        if rid == self.id {
            let _ = client.close().await;
            return Ok(Some(rid)); // this node itself
        }
        if lock(&self.state).links.contains_key(&rid) {
            let _ = client.close().await;
            return Ok(Some(rid));
        }
        // Shared memory first, before any publication can use the link: all of this node's
        // publications for that node then go through the ring.
        let shm = match self.options.shm.mode {
            ShmMode::Off => None,
            mode => match self.shm_offer(rid, &client).await {
                Ok(Some(entry)) => Some(entry),
                Ok(None) | Err(_) if mode == ShmMode::Require => {
                    let _ = client.close().await;
                    return Err(Error::Protocol(format!(
                        "{addr}: shared memory required, and that node cannot take it"
                    )));
                }
                Ok(None) => None,
                Err(e) => {
                    tracing::debug!("peer: shared memory with {rid:016x} failed: {e}");
                    None
                }
            },
        };
        // Ok(true): linked now; Ok(false): linked already; Err: stopping.
        let linked: Result<bool> = {
            let mut st = lock(&self.state);
            if st.stopped {
                Err(Error::Closed)
            } else if st.links.contains_key(&rid) {
                Ok(false)
            } else {
                // Everything this node subscribes to, in order, before any publication can
                // use the link (both under the lock that subscribe and unsubscribe take).
                let mut r = announce(&client, &Interest::Reset);
                for i in st.local_interest() {
                    r = r.and_then(|()| announce(&client, &i));
                }
                r.map(|()| {
                    st.links.insert(
                        rid,
                        Link {
                            client: client.clone(),
                            addr: addr.to_string(),
                            shm,
                        },
                    );
                    st.changed();
                    true
                })
            }
        };
        match linked {
            Ok(true) => {}
            Ok(false) => {
                let _ = client.close().await;
                return Ok(Some(rid));
            }
            Err(e) => {
                let _ = client.close().await;
                return Err(e);
            }
        }
        // The PING after the announcements tells the other node they are all there.
        let _ = tokio::time::timeout(self.options.confirm_timeout, client.flush()).await;
        tracing::debug!(node = %format_args!("{:016x}", self.id), peer = %format_args!("{rid:016x}"), %addr, shm, "peer: linked");
        let me = self.clone();
        tokio::spawn(async move {
            client.inner.closed().await;
            let mut st = lock(&me.state);
            if st
                .links
                .get(&rid)
                .is_some_and(|l| Arc::ptr_eq(&l.client.inner, &client.inner))
            {
                st.links.remove(&rid);
                st.changed();
            }
        });
        Ok(Some(rid))
    }

    /// Keeps a link to the static peer at `addr`: dials until it answers, and again after
    /// its link breaks.
    pub(super) async fn keep_linked(self: Arc<Self>, addr: String) {
        let mut stop = self.stop.subscribe();
        loop {
            if self.is_stopped() {
                return;
            }
            let linked = match self.clone().dial(addr.clone()).await {
                Ok(Some(id)) if id == self.id => {
                    tracing::debug!(%addr, "peer: a static peer address is this node itself");
                    return;
                }
                Ok(Some(id)) => lock(&self.state).links.get(&id).map(|l| l.client.clone()),
                // This node itself, someone else dialling it now, or unreachable: look again
                // later.
                Ok(None) | Err(_) => None,
            };
            match linked {
                Some(c) => {
                    tokio::select! {
                        () = c.inner.closed() => {}
                        _ = stop.changed() => return,
                    }
                }
                None => {
                    tokio::select! {
                        () = tokio::time::sleep(self.options.redial) => {}
                        _ = stop.changed() => return,
                    }
                }
            }
        }
    }

    /// A node announced itself at `addr` (scouting, rendezvous, or its own HELLO): dial it
    /// unless linked already.
    pub(super) fn discovered(self: &Arc<Self>, id: u64, addr: String) {
        if id == self.id || self.is_stopped() {
            return;
        }
        {
            let st = lock(&self.state);
            if st.links.contains_key(&id)
                || st.dialing.contains(&addr)
                || st.links.values().any(|l| l.addr == addr)
            {
                return;
            }
        }
        let me = self.clone();
        tokio::spawn(async move {
            let _ = me.dial(addr).await;
        });
    }
}

/// Sends announcement `i` on `link`.
pub(super) fn announce(link: &Client, i: &Interest) -> Result<()> {
    let key = Key::new(INTEREST_KEY)?;
    link.inner.publish_now(&Message::new(key, i.encode()))
}
