//! AMQP queues: the engine's queues ([`hayate_broker::queue::Queue`], which hold the
//! messages, serve the consumers and dead-letter) with what AMQP adds: the `x-` arguments,
//! the bindings and the routes exchange-to-exchange bindings lead to, the channels that
//! consume ([`Chan`]) and the dead letters' exchange.
//!
//! Its bindings (the default exchange's binding to its own key included) are entries of the
//! broker's route table, each with its filter ([`AmqpFilter`]: headers arguments, a
//! route's hops, the exchange and routing key shown): a message published by any protocol
//! on a key a binding covers is offered to the queue by the publishing session, once
//! however many of its bindings and routes cover it. Routes are the bindings
//! exchange-to-exchange bindings lead to ([`Binding`], [`Queue::set_routes`]).
//!
//! Locks, in order: a queue's bindings (bind, unbind, set_routes) → the broker's registry;
//! a publisher (no lock) → the engine queue's state → a channel's state ([`Chan`]) → the
//! consumer connection's outbox (a leaf).
//!
//! # Layout
//! - this module: [`Queue`], an engine queue with its vhost, arguments and bindings;
//! - `args`: [`QueueArgs`], the `x-` arguments of queue.declare, and the engine's
//!   [`QueueConfig`](hayate_broker::queue::QueueConfig) they make;
//! - `binding`: bindings and routes ([`Binding`], [`Hop`], [`Route`]);
//! - `consumer`: channels as queues see them ([`Chan`]: the engine's sink, writing
//!   basic.deliver and basic.get-ok);
//! - `dead`: the queue's dead letters to its dead-letter exchange ([`AmqpDeadLetters`]);
//! - `filter`: what a binding lets in ([`AmqpFilter`]).

mod args;
mod binding;
mod consumer;
mod dead;
mod filter;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use hayate_broker::queue::QItem;
use hayate_core::sync::lock;

pub(crate) use args::QueueArgs;
pub(crate) use binding::{Binding, Hop, Route, route_id};
pub(crate) use consumer::{Chan, ChanState, ConsumerSink};
pub(crate) use dead::AmqpDeadLetters;
use hayate_broker::queue::store::Store;

/// Bindings per queue, at most.
pub(crate) const MAX_BINDINGS: usize = 4096;

/// Routes (derived bindings, through exchange-to-exchange bindings) per queue, at most.
pub(crate) const MAX_ROUTES: usize = 1024;

/// The cost of one queue's routes (`super::route_cost`: one per route and per hop of each
/// of its paths), at most.
pub(crate) const MAX_ROUTE_COST: usize = 8192;

/// A queue's bindings, under their lock.
#[derive(Debug, Default)]
struct Bindings {
    list: Vec<Binding>,
}

/// An AMQP queue: the engine's queue ([`Queue::core`], which it derefs to) with its
/// bindings.
pub(crate) struct Queue {
    /// Its virtual host (registry, key prefix).
    pub(crate) vhost: Arc<super::VHost>,
    pub(crate) name: String,
    pub(crate) args: QueueArgs,
    pub(crate) core: Arc<hayate_broker::queue::Queue>,
    /// The broker (its table of queues).
    broker: hayate_broker::Broker,
    bind: Mutex<Bindings>,
    /// A durable queue's store and number there (persistent messages are kept in it).
    pub(crate) store: Option<(Arc<Store>, u64)>,
    /// The cost of its routes (`super::route_cost`), counted in its vhost's too until it is
    /// deleted.
    route_cost: AtomicUsize,
}

impl std::ops::Deref for Queue {
    type Target = hayate_broker::queue::Queue;

    fn deref(&self) -> &Self::Target {
        &self.core
    }
}

impl std::fmt::Debug for Queue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Queue")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

impl Queue {
    /// An AMQP queue on engine queue `core`.
    pub(crate) fn new(
        vhost: Arc<super::VHost>,
        name: String,
        args: QueueArgs,
        core: Arc<hayate_broker::queue::Queue>,
        broker: hayate_broker::Broker,
        store: Option<(Arc<Store>, u64)>,
    ) -> Arc<Queue> {
        Arc::new(Queue {
            vhost,
            name,
            args,
            core,
            broker,
            bind: Mutex::new(Bindings::default()),
            store,
            route_cost: AtomicUsize::new(0),
        })
    }

    /// Puts messages read back from the store into the (new, durable) queue, in order.
    pub(crate) fn restore(&self, msgs: Vec<QItem>) {
        self.core.restore(msgs);
    }

    /// Has the queue expire through `super::conn::delete_queue`.
    pub(crate) fn attach(self: &Arc<Self>) {
        let weak = Arc::downgrade(self);
        self.core.set_on_expired(Box::new(move || {
            if let Some(q) = weak.upgrade() {
                super::conn::delete_queue(&q);
            }
        }));
    }

    /// Enters the queue in the broker's table of queues.
    pub(crate) fn listed(&self) {
        self.broker.queue_insert(&self.core);
    }

    /// Marks the queue deleted (its consumers are told: basic.cancel), ends its bindings;
    /// the number of messages it held.
    pub(crate) fn delete(&self) -> u32 {
        // Under the bindings' lock, as set_routes counts: its routes stop counting against
        // the vhost's.
        let mut st = lock(&self.bind);
        let n = self.broker.queue_delete(&self.core);
        st.list.clear();
        let cost = self.route_cost.swap(0, Ordering::AcqRel);
        self.vhost.route_cost.fetch_sub(cost, Ordering::AcqRel);
        n
    }
}
