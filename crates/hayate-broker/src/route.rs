//! Routes: where a key's messages go (fan-out targets, one member per queue group, the
//! backlogs of declared queues without members), built from the registry and cached per
//! session while the broker's generation is unchanged.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use hayate_core::{Congestion, Key, Stall};

use crate::backlog::Backlog;
use crate::broker::{Broker, To};
use crate::outbox::Outbox;
use crate::queue::QueueRoute;

/// One subscription a key's messages go to: the route table's target for the broker.
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
pub(crate) struct Route {
    /// Fan-out targets, and one member per queue group (with the group's turn).
    pub(crate) to: hayate_core::route::Route<Target>,
    /// Declared queues matching the key that have no member now.
    pub(crate) backlogs: Vec<Arc<Backlog>>,
    /// Streams that capture the key.
    pub(crate) streams: Vec<Arc<crate::stream::Stream>>,
    /// Queues bound to the key (one entry per queue, with its matching bindings' filters).
    pub(crate) queues: Vec<QueueRoute>,
}

impl Broker {
    pub(crate) fn route(&self, key: &Key) -> (u64, Arc<Route>) {
        let reg = self.read();
        let generation = self.shared.generation.load(Ordering::Acquire);
        let mut queues: Vec<QueueRoute> = Vec::new();
        let to = reg.routes.route(key, |(session, sid), s| {
            let e = &s.target;
            if e.guard.as_ref().is_some_and(|g| !g.admits(key)) {
                return None;
            }
            let outbox = match &e.to {
                To::Outbox(o) => o.clone(),
                To::Queue(q, filter) => {
                    match queues.iter_mut().find(|r| Arc::ptr_eq(&r.queue, q)) {
                        Some(r) => r.filters.push(filter.clone()),
                        None => queues.push(QueueRoute {
                            queue: q.clone(),
                            filters: vec![filter.clone()],
                        }),
                    }
                    return None;
                }
            };
            Some(Target {
                outbox,
                session,
                sid,
                congestion: e.qos.effective_congestion(),
                stall: e.qos.effective_stall(),
                no_echo: e.qos.no_echo,
            })
        });
        let mut route = Route {
            to,
            backlogs: Vec::new(),
            streams: Vec::new(),
            queues,
        };
        for (id, expr, backlog) in reg.queues.iter().map(|(id, (e, b))| (id, e, b)) {
            if expr.matches(key) && route.to.group(id).is_none() {
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
        (generation, Arc::new(route))
    }
}
