//! Delivery: a publication's way along its route (local subscriptions, one member per
//! queue group on whichever node, each node once over its link or this node's ring), what a
//! full local subscription does (`block`: wait up to `max_block`, then end it as a slow
//! consumer; `drop`: count), and requests waiting for replies.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use bytes::Bytes;
use hayate_core::sync::lock;
use hayate_core::{Key, Message};
use tokio::sync::oneshot;

use super::routes::{LocalTarget, Member, Route, Sink};
use super::{NodeInner, TO_HEADER, server};
use crate::sub::TrySendError;
use crate::{Client, Error, Result};

/// Queue-group members chosen on one node: the node, its link, whether all are `drop`, and
/// the members (subscription id, group).
type Named = (u64, Client, bool, Vec<(u32, Arc<str>)>);

impl NodeInner {
    /// `key`'s route (cached until the routes change).
    pub(super) fn route(&self, key: &Key) -> Arc<Route> {
        lock(&self.state).route(key)
    }

    /// Publishes `msg` to every matching subscription, local or on another node.
    pub(super) async fn publish(&self, msg: Message) -> Result<()> {
        if self.is_stopped() {
            return Err(Error::Closed);
        }
        if msg.payload.len() as u64 > self.options.max_payload {
            return Err(Error::PayloadTooLarge {
                size: msg.payload.len(),
                max: self.options.max_payload,
            });
        }
        let route = self.route(&msg.key);
        if route.locals.is_empty() && route.remotes.is_empty() && route.groups.is_empty() {
            // Nothing here waits, ever: a task publishing to no one in a loop gives its
            // worker up now and then (as a Tokio channel's sender does). Not on the other
            // paths: yielding every 128 publishes cut 64 B throughput over TCP to a third
            // (smaller writes); they wait when their link or ring is full.
            tokio::task::coop::consume_budget().await;
            return Ok(());
        }
        // Queue groups: one member each, anywhere.
        let mut local_members: Vec<LocalTarget> = Vec::new();
        let mut named: Vec<Named> = Vec::new();
        // Members on nodes reading the ring: (node, subscription, group).
        let mut shm_named: Vec<(u64, u32, Arc<str>)> = Vec::new();
        // The cursor entries of the nodes reading the ring that this message is for.
        let mut to_ring: u64 = 0;
        for g in &route.groups {
            let Some(member) = g.rr.pick(&g.members) else {
                continue;
            };
            match member {
                Member::Local(t) => local_members.push(t.clone()),
                Member::Remote {
                    peer,
                    sid,
                    shm: Some(entry),
                    ..
                } => {
                    to_ring |= 1 << entry;
                    shm_named.push((*peer, *sid, g.name.clone()));
                }
                Member::Remote {
                    peer,
                    link,
                    sid,
                    drop,
                    ..
                } => match named.iter_mut().find(|n| n.0 == *peer) {
                    Some(n) => {
                        n.2 &= *drop;
                        n.3.push((*sid, g.name.clone()));
                    }
                    None => named.push((*peer, link.clone(), *drop, vec![(*sid, g.name.clone())])),
                },
            }
        }
        for t in route.locals.iter().chain(local_members.iter()) {
            self.deliver(t, vec![msg.clone()]).await;
        }
        // Sending to several nodes over TCP in turn: no inline writes (see
        // `Inner::publish_plain_opt`).
        let tcp_nodes = route.remotes.iter().filter(|r| r.shm.is_none()).count()
            + named
                .iter()
                .filter(|n| !route.remotes.iter().any(|r| r.peer == n.0))
                .count();
        let inline_ok = tcp_nodes <= 1;
        for r in &route.remotes {
            if let Some(entry) = r.shm {
                to_ring |= 1 << entry;
                continue;
            }
            let (drop, to) = match named.iter().position(|n| n.0 == r.peer) {
                Some(i) => {
                    let n = named.swap_remove(i);
                    (r.drop && n.2, n.3)
                }
                None => (r.drop, Vec::new()),
            };
            self.send_remote(&r.link, &msg, &to, drop, inline_ok).await;
        }
        for (_, link, drop, to) in &named {
            self.send_remote(link, &msg, to, *drop, inline_ok).await;
        }
        if to_ring != 0
            && let Some(out) = &self.outgoing
        {
            self.shm_publish(out, &msg, &shm_named, to_ring).await;
            self.stats.shm_sent.fetch_add(1, Ordering::Relaxed);
        }
        Ok(())
    }

    async fn send_remote(
        &self,
        link: &Client,
        msg: &Message,
        to: &[(u32, Arc<str>)],
        drop: bool,
        inline_ok: bool,
    ) {
        if drop && !link.inner.has_room() {
            self.stats.dropped_on_links.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let r = if to.is_empty() {
            link.inner.publish_message_opt(msg, inline_ok).await
        } else {
            let m =
                server::with_named(msg, TO_HEADER, to.iter().map(|(sid, g)| (None, *sid, &**g)));
            link.inner.publish_message_opt(&m, inline_ok).await
        };
        if let Err(e) = r {
            // The link broke: its watcher removes it; the message is lost for that node as
            // it would be for a subscriber whose connection to a broker broke.
            tracing::debug!("peer: send on a link failed: {e}");
        }
    }

    /// Hands `batch` to one local target, as its QoS says (waits for room for `block`, at
    /// most `max_block`, then ends the subscription as a slow consumer).
    pub(super) async fn deliver(&self, t: &LocalTarget, batch: Vec<Message>) {
        match &t.sink {
            Sink::Inbox => {
                for m in batch {
                    self.complete_request(m);
                }
            }
            Sink::Sub { tx, lost, drop } => match tx.try_send(crate::sub::Batch::Messages(batch)) {
                Ok(()) | Err(TrySendError::Closed) => {}
                Err(TrySendError::Full(b)) if *drop => {
                    lost.fetch_add(b.len() as u64, Ordering::Relaxed);
                }
                Err(TrySendError::Full(b)) => {
                    // A node that stops ends its subscriptions: its links and ring readers
                    // do not wait for room in them past that (they would for `max_block`).
                    let mut stopped = self.stop.subscribe();
                    if *stopped.borrow_and_update() {
                        return;
                    }
                    let room = tokio::time::timeout(self.options.max_block, tx.reserve(b.bytes()));
                    tokio::select! {
                        r = room => match r {
                            Ok(Ok(permit)) => permit.send(b),
                            Ok(Err(_)) => {}
                            Err(_) => self.cut_slow(t.sid),
                        },
                        _ = stopped.changed() => {}
                    }
                }
            },
        }
    }

    /// Ends local subscription `sid`, which held its publishers past `max_block`.
    pub(super) fn cut_slow(&self, sid: u32) {
        tracing::warn!(
            sid,
            "peer: a subscription held its publishers past max_block: ended as a slow consumer"
        );
        self.stats.slow_consumers.fetch_add(1, Ordering::Relaxed);
        self.remove_local(sid);
    }

    /// A reply came to this node's inbox: to the request waiting for it.
    pub(super) fn complete_request(&self, m: Message) {
        crate::sub::complete_request(&self.requests, m);
    }

    /// Publishes `m` as a request and waits up to `timeout` for its reply.
    pub(super) async fn request(&self, mut m: Message, timeout: Duration) -> Result<Message> {
        let token = self.next_token.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        lock(&self.requests).insert(token, tx);
        m.reply_to = Some(Key::new(&format!("{}/{token}", self.inbox))?);
        m.correlation_id = Some(Bytes::copy_from_slice(&token.to_be_bytes()));
        if let Err(e) = self.publish(m).await {
            lock(&self.requests).remove(&token);
            return Err(e);
        }
        match tokio::time::timeout(timeout, rx).await {
            Ok(Ok(reply)) => Ok(reply),
            Ok(Err(_)) => Err(Error::Closed),
            Err(_) => {
                lock(&self.requests).remove(&token);
                Err(Error::Timeout)
            }
        }
    }
}
