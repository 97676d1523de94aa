//! Routes: where a key's messages go (fan-out targets, one member per queue group, the
//! backlogs of declared queues without members), built from the registry and cached per
//! session while the broker's generation is unchanged.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use hayate_core::{Congestion, Key, Stall};

use crate::broker::Broker;
use crate::outbox::Outbox;
use crate::queue::Backlog;

#[derive(Debug, Clone)]
pub(crate) struct Target {
    pub(crate) outbox: Arc<Outbox>,
    pub(crate) session: u64,
    pub(crate) sid: u32,
    pub(crate) congestion: Congestion,
    pub(crate) stall: Stall,
    pub(crate) no_echo: bool,
}

#[derive(Debug)]
pub(crate) struct GroupRoute {
    pub(crate) id: Arc<str>,
    pub(crate) rr: Arc<AtomicUsize>,
    pub(crate) members: Vec<Target>,
}

#[derive(Debug)]
pub(crate) struct Route {
    pub(crate) fanout: Vec<Target>,
    pub(crate) groups: Vec<GroupRoute>,
    /// Declared queues matching the key that have no member now.
    pub(crate) backlogs: Vec<Arc<Backlog>>,
    /// Streams that capture the key.
    pub(crate) streams: Vec<Arc<crate::stream::Stream>>,
}

impl Broker {
    pub(crate) fn route(&self, key: &Key) -> (u64, Arc<Route>) {
        let reg = self.read();
        let generation = self.shared.generation.load(Ordering::Acquire);
        let mut route = Route {
            fanout: Vec::new(),
            groups: Vec::new(),
            backlogs: Vec::new(),
            streams: Vec::new(),
        };
        let mut by_group: Vec<(Arc<str>, Vec<Target>)> = Vec::new();
        for sk in reg.index.matches(key) {
            let Some(e) = reg.subs.get(&sk) else { continue };
            if e.guard.as_ref().is_some_and(|g| !g.admits(key)) {
                continue;
            }
            let t = Target {
                outbox: e.outbox.clone(),
                session: sk.0,
                sid: sk.1,
                congestion: e.qos.effective_congestion(),
                stall: e.qos.effective_stall(),
                no_echo: e.qos.no_echo,
            };
            match &e.group {
                None => route.fanout.push(t),
                Some(g) => match by_group.iter_mut().find(|(n, _)| n == g) {
                    Some((_, v)) => v.push(t),
                    None => by_group.push((g.clone(), vec![t])),
                },
            }
        }
        for (id, expr, backlog) in reg.queues.iter().map(|(id, (e, b))| (id, e, b)) {
            if expr.matches(key) && !by_group.iter().any(|(g, _)| g == id) {
                route.backlogs.push(backlog.clone());
            }
        }
        for s in self
            .shared
            .streams
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .values()
        {
            // Replies (`_inbox/...`) are never stored: an inbox is readable by its session
            // alone, and a stream's consumers would read it too.
            if s.captures(key) && !hayate_core::is_inbox_key(key.as_str()) {
                route.streams.push(s.clone());
            }
        }
        for (g, members) in by_group {
            if let Some((rr, _)) = reg.groups.get(&g) {
                route.groups.push(GroupRoute {
                    id: g,
                    rr: rr.clone(),
                    members,
                });
            }
        }
        (generation, Arc::new(route))
    }
}
