//! The broker's table of queues: every queue a front-end made, by [`QueueId`], what
//! [`Broker::queues`] lists of each ([`QueueView`]), and the implicit queues of the
//! default namespace ([`Broker::queue_implicit`]).

use std::sync::Arc;
use std::sync::atomic::Ordering;

use hayate_core::sync::lock;
use hayate_core::{Key, KeyExpr};

use super::{Overflow, Queue, QueueConfig, QueueId};
use crate::Broker;

/// Most implicit queues ([`Broker::queue_implicit`]) the broker holds at once by default
/// ([`Broker::set_max_implicit_queues`]). Only implicit queues count: queues a front-end
/// declared (AMQP, which has its own `amqp.max_queues` per vhost) neither count nor are
/// counted against that.
pub const MAX_IMPLICIT_QUEUES: usize = 10_000;

/// Why [`Broker::queue_implicit`] made no queue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ImplicitError {
    /// The broker holds as many implicit queues as it may (the number).
    TooMany(usize),
    /// The queue there is exclusive to a connection.
    Exclusive,
    /// The key is no expression (cannot be bound).
    BadName(String),
}

impl std::fmt::Display for ImplicitError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ImplicitError::TooMany(n) => {
                write!(f, "too many queues: the broker holds {n} implicit queues")
            }
            ImplicitError::Exclusive => f.write_str("the queue is exclusive to a connection"),
            ImplicitError::BadName(e) => write!(f, "not a queue name: {e}"),
        }
    }
}

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

    /// Queue `key` of the default namespace (`""`: AMQP vhost `/`, STOMP `/queue/<key>`,
    /// native CONSUME), as a first use by STOMP or the native protocol finds it: the one
    /// there (declared by AMQP or made by an earlier use), or else a new *implicit* queue
    /// (`declared: false`, in memory, at most [`BrokerConfig::queue_max_length`] messages
    /// and [`BrokerConfig::queue_max_bytes`] body bytes ready, reject-publish; at most
    /// [`Broker::set_max_implicit_queues`] such queues, [`ImplicitError::TooMany`]) bound to
    /// `key` (its default binding: whatever is published on `key` enters it). An implicit
    /// queue lives until deleted. True when it was made now.
    ///
    /// [`BrokerConfig::queue_max_length`]: crate::BrokerConfig::queue_max_length
    /// [`BrokerConfig::queue_max_bytes`]: crate::BrokerConfig::queue_max_bytes
    pub fn queue_implicit(&self, key: &Key) -> Result<(Arc<Queue>, bool), ImplicitError> {
        let id = QueueId {
            ns: Arc::from(""),
            name: Arc::from(key.as_str()),
        };
        let found = |q: Arc<Queue>| match q.config().owner {
            Some(_) => Err(ImplicitError::Exclusive),
            None => Ok((q, false)),
        };
        if let Some(q) = self.queue(&id) {
            return found(q);
        }
        let expr = KeyExpr::new(key.as_str()).map_err(|e| ImplicitError::BadName(e.to_string()))?;
        let c = self.config();
        let cfg = QueueConfig {
            max_length: Some(c.queue_max_length),
            max_body_bytes: (c.queue_max_bytes > 0).then_some(c.queue_max_bytes),
            overflow: Overflow::RejectPublish,
            declared: false,
            ..QueueConfig::default()
        };
        let q = {
            let mut t = lock(&self.shared.queues);
            if let Some(q) = t.get(&id).filter(|q| !q.is_deleted()).cloned() {
                drop(t);
                return found(q);
            }
            let most = self.shared.max_implicit.load(Ordering::Relaxed);
            // Counted only near the limit (the table holds declared queues too).
            if t.len() >= most && t.values().filter(|q| !q.cfg.declared).count() >= most {
                return Err(ImplicitError::TooMany(most));
            }
            let q = Queue::new(id.clone(), cfg, &c.memory, None);
            t.insert(id, q.clone());
            q
        };
        self.queue_bind(&q, expr, None, None);
        Ok((q, true))
    }

    /// Sets the most implicit queues the broker holds at once (default
    /// [`MAX_IMPLICIT_QUEUES`]); those there stay.
    pub fn set_max_implicit_queues(&self, n: usize) {
        self.shared.max_implicit.store(n, Ordering::Relaxed);
    }

    /// Every queue, by namespace and name.
    pub fn queues(&self) -> Vec<QueueView> {
        let all: Vec<Arc<Queue>> = lock(&self.shared.queues).values().cloned().collect();
        let mut v: Vec<QueueView> = all.iter().map(|q| q.view()).collect();
        v.sort_by(|a, b| (&a.ns, &a.name).cmp(&(&b.ns, &b.name)));
        v
    }
}
