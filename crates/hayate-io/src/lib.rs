//! Hayate's byte I/O: the byte-stream transports connections run on (TCP, Unix, TLS, shared
//! memory, in-memory) and the connection driver over them, shared by the server and the
//! client. The output queue they write from and the one vectored write loop are hayate-flow's.
//!
//! # Layout
//! - [`transport`]: the transport trait [`transport::WriteHalf`] (a write half shared through
//!   `&self`: a non-blocking vectored write plus a readiness wait) with [`transport::Reader`]
//!   and [`transport::Writer`]; TCP ([`transport::tcp`]), Unix ([`transport::unix`]) and the
//!   in-memory pair for tests ([`transport::memory`]); [`transport::write_chunks`], the
//!   blocking write of a chunk queue, and [`transport::read_some`]. WebSocket lives in
//!   hayate-server (it frames a TCP stream and implements the same trait); TLS and shared
//!   memory will be further implementations.
//! - [`conn`]: the connection driver, one lifecycle for every protocol's server side
//!   ([`conn::Handler`], [`conn::Conn`]) over an output queue ([`conn::Outgoing`], the
//!   broker's outbox) and its writer task.
//! - [`busy`]: [`busy::BusyPoll`], busy-polling of the I/O driver (an opt-in latency mode).
//! - re-exported from hayate-flow at their old paths, for the crates above: [`sink`]
//!   ([`Sink`], [`write_some`]: the one vectored write loop), [`chunks`], [`memory`] (the
//!   broker-wide memory budget), [`traffic`] (traffic counters), [`registry`] (the live
//!   connections of a server).
//!
//! Nothing here knows about a protocol or the broker: of Hayate's crates this one depends on
//! `hayate-flow` (the output queue and its accounting) and `hayate-shm` only.

pub mod busy;
pub mod conn;
pub mod transport;

pub use hayate_flow::{Sink, chunks, memory, registry, sink, traffic, write_some};
