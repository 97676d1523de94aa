//! What flows out of a connection and what it costs: a session's bounded output (the
//! [`Outbox`] and its [`Encoder`] seam), the one vectored write loop it is written with, and
//! the accounting around it (the broker-wide memory budget, traffic counters, the live
//! connections). The engine (`hayate-broker`), the transports and connection driver
//! (`hayate-io`) and the client library's peer servers all build on it.
//!
//! # Layout
//! - [`outbox`]: [`Outbox`], the bounded (in bytes) queue of encoded output of one session,
//!   with `drop` and `block` behaviour, and the [`Encoder`] seam; [`OutBuf`], the encoded
//!   output.
//! - [`outgoing`]: [`outgoing::Outgoing`], a connection's output queue as its writer task
//!   sees it (the outbox is the one implementation), and [`Taken`].
//! - [`ledger`]: [`Ledger`], the one delivery ledger: ids, window, ready items per priority,
//!   deliveries in flight and how they are settled (ack, requeue in place, dead letter).
//! - [`batch`]: [`Batch`], one message or many plain messages on one key.
//! - [`latency`]: the sampled delivery-latency histogram an outbox's probe records into.
//! - [`sink`]: [`Sink`] (what an outbox writes to without waiting) and [`write_some`], the one
//!   vectored write loop: every write of queued chunks, inline flush or writer task, server
//!   or client, goes through it.
//! - [`chunks`]: pure helpers for queues of [`bytes::Bytes`] chunks written with vectored I/O.
//! - [`memory`]: [`memory::Memory`], the broker-wide memory budget, and [`memory::Charge`],
//!   one holder's share of it.
//! - [`traffic`]: per-session message and byte counters, and per-listener totals that stay
//!   exact as sessions end.
//! - [`registry`]: the live connections of a server (admin API): protocol, addresses, user,
//!   session, and closing one.
//!
//! Nothing here knows a protocol, a socket, TLS or shared memory: this crate depends on
//! `hayate-core` alone among Hayate's crates.

pub mod batch;
pub mod chunks;
pub mod latency;
pub mod ledger;
pub mod memory;
pub mod outbox;
pub mod outgoing;
pub mod registry;
pub mod sink;
pub mod traffic;

pub use batch::Batch;
pub use ledger::Ledger;
pub use outbox::{Delivery, Encoder, FREE_BYTES, OutBuf, Outbox, Settle, Taken};
pub use sink::{Sink, write_some};
