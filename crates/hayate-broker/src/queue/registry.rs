//! The broker's table of queues: every queue a front-end made, by [`QueueId`], and what
//! [`Broker::queues`] lists of each ([`QueueView`]).

use std::sync::Arc;

use hayate_core::sync::lock;

use super::{Queue, QueueId};
use crate::Broker;

/// One queue, as [`Broker::queues`] lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueView {
    pub ns: String,
    pub name: String,
    /// `memory` or `durable`.
    pub kind: &'static str,
    pub durable: bool,
    /// Messages ready.
    pub depth: usize,
    /// Deliveries not yet acknowledged.
    pub unacked: usize,
    pub consumers: usize,
    pub dropped: u64,
    pub dead_lettered: u64,
    /// What the messages held (ready and unacknowledged) cost the process.
    pub bytes: usize,
}

impl Queue {
    /// What [`Broker::queues`] shows of it.
    pub fn view(&self) -> QueueView {
        let st = lock(&self.st);
        QueueView {
            ns: self.id.ns.to_string(),
            name: self.id.name.to_string(),
            kind: if self.store.is_some() {
                "durable"
            } else {
                "memory"
            },
            durable: self.cfg.durable,
            depth: st.ledger.ready_len(),
            unacked: st.ledger.in_flight_len(),
            consumers: st.consumers.len(),
            dropped: self.dropped(),
            dead_lettered: self.dead_lettered(),
            bytes: st.ledger.held_bytes(),
        }
    }
}

impl Broker {
    /// Enters queue `q` in the table under its id (in place of any other there).
    pub fn queue_insert(&self, q: &Arc<Queue>) {
        lock(&self.shared.queues).insert(q.id.clone(), q.clone());
    }

    /// The queue named `id`, unless deleted.
    pub fn queue(&self, id: &QueueId) -> Option<Arc<Queue>> {
        lock(&self.shared.queues)
            .get(id)
            .filter(|q| !q.is_deleted())
            .cloned()
    }

    /// Takes queue `q` out of the table (if it is the one there), removes its bindings and
    /// deletes it; the number of messages it held.
    pub fn queue_delete(&self, q: &Arc<Queue>) -> u32 {
        {
            let mut t = lock(&self.shared.queues);
            if t.get(&q.id).is_some_and(|x| Arc::ptr_eq(x, q)) {
                t.remove(&q.id);
            }
        }
        self.queue_unbind_all(q);
        q.delete()
    }

    /// Every queue, by namespace and name.
    pub fn queues(&self) -> Vec<QueueView> {
        let all: Vec<Arc<Queue>> = lock(&self.shared.queues).values().cloned().collect();
        let mut v: Vec<QueueView> = all.iter().map(|q| q.view()).collect();
        v.sort_by(|a, b| (&a.ns, &a.name).cmp(&(&b.ns, &b.name)));
        v
    }
}
