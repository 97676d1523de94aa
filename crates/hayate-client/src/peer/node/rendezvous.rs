//! Discovery through a broker: a node connects to the broker as a client, announces itself
//! on `_peer/rendezvous/<id>` (payload `<id> <HOST:PORT>`, as a scouting datagram without
//! its prefix) every few seconds and dials the nodes it hears there. A node whose listener
//! is bound to an unspecified host announces the address it reaches the broker from.
//! On a broker with permissions the node's user needs publish and subscribe rights on
//! `_peer/rendezvous/*`.

use std::sync::Arc;
use std::time::Duration;

use hayate_core::Key;

use super::{NodeInner, lock};
use crate::Client;

/// The key expression nodes announce themselves under.
pub(super) const RENDEZVOUS_EXPR: &str = "_peer/rendezvous/*";

/// How often a node announces itself at the broker.
const EVERY: Duration = Duration::from_secs(2);

/// The address to announce: the advertised one, its unspecified host replaced by the local
/// address that routes to the broker.
fn announced(node: &NodeInner, broker: &str) -> String {
    let Ok(a) = node.advertise.parse::<std::net::SocketAddr>() else {
        return node.advertise.clone();
    };
    if !a.ip().is_unspecified() {
        return a.to_string();
    }
    let local = std::net::UdpSocket::bind("0.0.0.0:0")
        .and_then(|s| s.connect(broker).map(|()| s))
        .and_then(|s| s.local_addr());
    match local {
        Ok(l) => std::net::SocketAddr::new(l.ip(), a.port()).to_string(),
        Err(_) => a.to_string(),
    }
}

pub(super) async fn run(node: Arc<NodeInner>, broker: String) {
    let mut stop = node.stop.subscribe();
    let mut warned = false;
    loop {
        let mut options = node.options.link.clone();
        options.name = format!("hayate-peer rendezvous {:016x}", node.id);
        let client = tokio::select! {
            r = Client::connect_with(&broker, options) => r,
            _ = stop.changed() => return,
        };
        match client {
            Ok(c) => {
                warned = false;
                if session(&node, &c, &broker, &mut stop).await {
                    let _ = c.close().await;
                    return;
                }
            }
            Err(e) if !warned => {
                warned = true;
                tracing::warn!(%broker, "peer node: rendezvous broker unreachable: {e}");
            }
            Err(_) => {}
        }
        tokio::select! {
            () = tokio::time::sleep(node.options.redial) => {}
            _ = stop.changed() => return,
        }
    }
}

/// One connection to the broker; true when the node stops.
async fn session(
    node: &Arc<NodeInner>,
    c: &Client,
    broker: &str,
    stop: &mut tokio::sync::watch::Receiver<bool>,
) -> bool {
    let Ok(mut sub) = c.subscribe(RENDEZVOUS_EXPR).await else {
        return false;
    };
    let Ok(key) = Key::new(&format!("_peer/rendezvous/{:016x}", node.id)) else {
        return false;
    };
    let me = format!("{:016x} {}", node.id, announced(node, broker));
    let mut tick = tokio::time::interval(EVERY);
    loop {
        let send = tokio::select! {
            _ = tick.tick() => true,
            m = sub.next() => match m {
                None => return false,
                Some(m) => {
                    let Some((id, addr)) = std::str::from_utf8(&m.payload)
                        .ok()
                        .and_then(|s| s.split_once(' '))
                        .and_then(|(i, a)| Some((u64::from_str_radix(i, 16).ok()?, a.to_string())))
                    else {
                        continue;
                    };
                    if id == node.id {
                        continue;
                    }
                    let known = lock(&node.state).links.contains_key(&id);
                    if !known {
                        node.discovered(id, addr);
                    }
                    !known
                }
            },
            _ = stop.changed() => return true,
        };
        if send && c.publish(&key, me.clone()).await.is_err() {
            return false;
        }
    }
}
