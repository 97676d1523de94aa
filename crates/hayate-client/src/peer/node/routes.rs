//! A node's routes: its route table ([`hayate_core::route::Table`], the broker's) holds this
//! node's subscriptions and those other nodes announced; a key's [`Route`] is made from it
//! once (then cached until the table or the links change): the local subscriptions, the
//! nodes to send to, and each queue group's members on every node.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use hayate_core::qos::Congestion;
use hayate_core::route::{self, RoundRobin, Sub, SubKey, Table};
use hayate_core::{Key, Qos};

use super::interest::Interest;
use super::{INBOX_SID, Link, State};
use crate::Client;

/// The connection number of this node's own subscriptions in its table (those of other
/// nodes are under the incoming connection that announced them, numbered from 1).
pub(super) const LOCAL: u64 = 0;

/// Where a local delivery goes.
#[derive(Debug, Clone)]
pub(super) enum Sink {
    Sub {
        tx: crate::sub::SubSender,
        lost: Arc<AtomicU64>,
        drop: bool,
    },
    /// The node's reply inbox: completes a waiting request.
    Inbox,
}

#[derive(Debug, Clone)]
pub(super) struct LocalTarget {
    pub(super) sid: u32,
    pub(super) sink: Sink,
}

/// What a subscription in a node's table leads to.
#[derive(Debug)]
pub(super) enum Target {
    /// One of this node's (under `(LOCAL, sid)`), with its QoS (announced to other nodes).
    Local { target: LocalTarget, qos: Qos },
    /// One that node `peer` announced (under `(connection, sid)`); `drop`: its congestion.
    Remote { peer: u64, drop: bool },
}

#[derive(Debug, Clone)]
pub(super) enum Member {
    Local(LocalTarget),
    Remote {
        peer: u64,
        link: Client,
        sid: u32,
        drop: bool,
        shm: Option<usize>,
    },
}

/// A queue group's part of a key's route.
#[derive(Debug)]
pub(super) struct GroupRoute {
    /// The group's name.
    pub(super) name: Arc<str>,
    /// Its turn (one per group, over every key and for both picks below).
    pub(super) rr: RoundRobin,
    /// Every member, on whichever node (a publishing node picks among these).
    pub(super) members: Vec<Member>,
    /// The members on this node (a receiving node picks among these).
    pub(super) locals: Vec<LocalTarget>,
}

#[derive(Debug)]
pub(super) struct RemoteRoute {
    pub(super) peer: u64,
    pub(super) link: Client,
    /// Every matching subscription of that node is `drop`.
    pub(super) drop: bool,
    /// The node reads this node's ring (with this cursor entry).
    pub(super) shm: Option<usize>,
}

/// Where messages on one key go.
#[derive(Debug, Default)]
pub(super) struct Route {
    pub(super) locals: Vec<LocalTarget>,
    pub(super) remotes: Vec<RemoteRoute>,
    pub(super) groups: Vec<GroupRoute>,
}

/// `key`'s route in `table`: other nodes' subscriptions count once their node is linked
/// (`links`), each once even if it announced them on two connections (a redial racing the
/// old link's end).
fn build(table: &Table<Target>, links: &HashMap<u64, Link>, key: &Key) -> Route {
    let mut seen: HashSet<(u64, u32)> = HashSet::new();
    let to = table.route(key, |(_, sid), s| match &s.target {
        Target::Local { target, .. } => Some(Member::Local(target.clone())),
        Target::Remote { peer, drop } => {
            // Not linked yet: its interest waits for the link.
            let link = links.get(peer)?;
            seen.insert((*peer, sid)).then(|| Member::Remote {
                peer: *peer,
                link: link.client.clone(),
                sid,
                drop: *drop,
                shm: link.shm,
            })
        }
    });
    let mut r = Route::default();
    for m in to.fanout {
        match m {
            Member::Local(t) => r.locals.push(t),
            Member::Remote {
                peer,
                link,
                drop,
                shm,
                ..
            } => match r.remotes.iter_mut().find(|x| x.peer == peer) {
                Some(x) => x.drop &= drop,
                None => r.remotes.push(RemoteRoute {
                    peer,
                    link,
                    drop,
                    shm,
                }),
            },
        }
    }
    r.groups = to.groups.into_iter().map(group_route).collect();
    r
}

fn group_route(g: route::GroupRoute<Member>) -> GroupRoute {
    let locals = g
        .members
        .iter()
        .filter_map(|m| match m {
            Member::Local(t) => Some(t.clone()),
            Member::Remote { .. } => None,
        })
        .collect();
    GroupRoute {
        name: g.id,
        rr: g.rr,
        members: g.members,
        locals,
    }
}

/// The announcement of local subscription `sid`.
pub(super) fn add(sid: u32, s: &Sub<Target>) -> Option<Interest> {
    let Target::Local { qos, .. } = &s.target else {
        return None;
    };
    Some(Interest::Add {
        sid,
        qos: *qos,
        group: s.group.as_deref().map(str::to_string),
        expr: s.expr.clone(),
    })
}

impl State {
    /// Routes, and whatever caches them outside the lock, must be made again.
    pub(super) fn changed(&mut self) {
        self.generation.fetch_add(1, Ordering::Release);
    }

    /// `key`'s route: cached while nothing changed.
    pub(super) fn route(&mut self, key: &Key) -> Arc<Route> {
        let generation = self.generation.load(Ordering::Acquire);
        let (subs, links) = (&self.subs, &self.links);
        self.cache.get_or_build(generation, key, || {
            (generation, Arc::new(build(subs, links, key)))
        })
    }

    /// What incoming connection `conn` announced: `i`.
    pub(super) fn interest(&mut self, conn: u64, i: Interest) {
        let Some(peer) = self.inbound.get(&conn).map(|inb| inb.peer) else {
            return; // the node is stopping
        };
        match i {
            Interest::Add {
                expr,
                group,
                qos,
                sid,
            } => {
                let drop = qos.effective_congestion() == Congestion::Drop;
                let to = Target::Remote { peer, drop };
                self.subs.insert((conn, sid), expr, group.as_deref(), to);
            }
            Interest::Remove { sid } => {
                self.subs.remove((conn, sid));
            }
            Interest::Reset => {
                self.subs.retain(|(c, _), _| c != conn);
            }
        }
        self.changed();
    }

    /// Incoming connection `conn` ended: what it announced goes with it.
    pub(super) fn inbound_gone(&mut self, conn: u64) {
        if self.inbound.remove(&conn).is_some() {
            self.subs.retain(|(c, _), _| c != conn);
            self.changed();
        }
    }

    /// This node's subscriptions (its reply inbox's first), as announced to a new link.
    pub(super) fn local_interest(&self) -> Vec<Interest> {
        let mut locals: Vec<(SubKey, &Sub<Target>)> =
            self.subs.iter().filter(|(id, _)| id.0 == LOCAL).collect();
        locals.sort_unstable_by_key(|((_, sid), _)| sid.wrapping_add(1));
        locals
            .iter()
            .filter_map(|((_, sid), s)| add(*sid, s))
            .collect()
    }

    /// Whether every subscription of this node is `drop` (and there is at least one).
    pub(super) fn all_drop(&self) -> bool {
        let mut subs = self
            .subs
            .iter()
            .filter(|((c, sid), _)| *c == LOCAL && *sid != INBOX_SID)
            .peekable();
        subs.peek().is_some()
            && subs.all(|(_, s)| {
                matches!(
                    &s.target,
                    Target::Local {
                        target: LocalTarget {
                            sink: Sink::Sub { drop: true, .. },
                            ..
                        },
                        ..
                    }
                )
            })
    }
}
