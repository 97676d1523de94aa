//! Hayate's byte I/O: the byte-stream transports connections run on and the one vectored
//! write loop over them, shared by the server, the broker's outboxes and the client.
//!
//! # Layout
//! - [`transport`]: the transport trait [`transport::WriteHalf`] (a write half shared through
//!   `&self`: a non-blocking vectored write plus a readiness wait) with [`transport::Reader`]
//!   and [`transport::Writer`]; TCP ([`transport::tcp`]), Unix ([`transport::unix`]) and the
//!   in-memory pair for tests ([`transport::memory`]); [`transport::write_chunks`], the
//!   blocking write of a chunk queue, and [`transport::read_some`]. WebSocket lives in
//!   hayate-server (it frames a TCP stream and implements the same trait); TLS and shared
//!   memory will be further implementations.
//! - [`sink`]: [`Sink`] (what an outbox writes to without waiting) and [`write_some`], the one
//!   vectored write loop: every write of queued chunks, inline flush or writer task, server
//!   or client, goes through it.
//! - [`chunks`]: pure helpers for queues of [`bytes::Bytes`] chunks written with vectored I/O.
//! - [`conn`]: the connection driver, one lifecycle for every protocol's server side
//!   ([`conn::Handler`], [`conn::Conn`]) over an output queue ([`conn::Outgoing`], the
//!   broker's outbox) and its writer task.
//! - [`memory`]: [`memory::Memory`], the broker-wide memory budget, and [`memory::Charge`],
//!   one holder's share of it.
//! - [`busy`]: [`busy::BusyPoll`], busy-polling of the I/O driver (an opt-in latency mode).
//! - [`traffic`]: per-session message and byte counters, and per-listener totals that stay
//!   exact as sessions end.
//! - [`registry`]: the live connections of a server (admin API): protocol, addresses, user,
//!   session, and closing one.
//!
//! Nothing here knows about a protocol or the broker: this crate depends on no other Hayate
//! crate.

pub mod busy;
pub mod chunks;
pub mod conn;
pub mod memory;
pub mod registry;
pub mod sink;
pub mod traffic;
pub mod transport;

pub use sink::{Sink, write_some};
