//! Hayate's engine: who is subscribed to what, and how a message reaches them.
//!
//! The broker knows no protocol. A front-end (native, MQTT, STOMP, ...) opens a [`Session`]
//! per connection with an [`Encoder`] that turns deliveries into its own bytes, calls
//! [`Session::subscribe`] and [`Session::publish`], and runs a writer that drains the
//! session's [`Outbox`] into its socket.
//!
//! # Layout
//! - the route table is [`hayate_core::route`]'s `Table` (trie, subscriptions, queue
//!   groups) with the broker's targets (`route.rs`: outbox and QoS), and its `RouteCache`.
//! - [`outbox`]: [`Outbox`], the bounded (in bytes) queue of encoded output of one session,
//!   with `drop` and `block` behaviour, and the [`Encoder`] seam.
//! - [`batch`]: [`Batch`], one message or many plain messages on one key.
//! - [`session`]: [`Broker`], [`Session`] and the per-session route cache.
//! - [`queue`]: queues as a broker noun ([`queue::Queue`]: ready messages per priority,
//!   consumers with credit, limits and overflow, dead letters, the `QueueSink`,
//!   `QueueStore` and `DeadLetterer` seams front-ends implement), and the broker's table
//!   of them ([`Broker::queues`]).
//! - `backlog`: [`Backlog`], the messages a declared queue group holds without members.
//!
//! # Ownership and locks
//! The [`Broker`] owns the route table behind one `RwLock` and a generation counter bumped on every
//! change. Each [`Session`] is owned by its connection's reader task and keeps a private cache
//! of routes per key, valid while the generation is unchanged, so the publish path takes no
//! global lock: it reads one atomic, looks up its own cache and locks each target outbox once
//! per batch. Lock order: index → outbox; an outbox lock is never held while taking another
//! lock or awaiting.

mod backlog;
mod broker;
pub mod footprint;
pub mod keys;
pub mod meta;
pub mod queue;
mod route;
pub mod session;
pub mod stream;

pub use backlog::Backlog;
pub use broker::{
    Broker, BrokerConfig, BrokerStats, KeyGuard, SubFilter, SubscribeError, SubscriptionView,
};
pub use hayate_flow::{Batch, Ledger};
/// A session's output, the delivery ledger, batches and delivery latency live in hayate-flow
/// (the client library's peer servers use them too); re-exported at their old paths.
pub use hayate_flow::{batch, latency, ledger, outbox};
pub use outbox::{Delivery, Encoder, FREE_BYTES, OutBuf, Outbox, Settle, Taken};
pub use session::{PublishRest, Session};
pub use stream::consumer::{Consumer, ConsumerConfig, ConsumerInfo, Start};
pub use stream::{Stored, Stream, StreamConfig, StreamError, StreamInfo};
