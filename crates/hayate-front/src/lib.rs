//! The front-end layer: what every protocol's server side (native, MQTT, STOMP, AMQP) and
//! the admin side build on.
//!
//! A protocol front-end is a [`Handler`]: it decodes frames, handles them against its broker
//! session and says when its timers are due. The driver ([`Conn`], from [`hayate_io::conn`])
//! owns the lifecycle they share: attach the session's outbox to the transport and run its
//! writer task, decode and handle *every* complete frame of a read before reading again,
//! flush what the read produced from this task, then wait for the next read, the handler's
//! timer, an outside event (an MQTT session takeover), the writer's end or shutdown; and at
//! the end let the writer flush and stop. Each protocol's own code is its handshake, its
//! frame handling and its translation.
//!
//! # Layout
//! - [`config`]: [`config::Config`], the broker's settings as plain serde structs with
//!   defaults.
//! - [`auth`]: users, tokens and permissions ([`auth::Authenticator`], [`auth::Identity`]).
//! - [`tls`]: the server's TLS settings loaded ([`tls::ServerTls`]).
//! - [`ops`]: what operators see of a running server (listeners' counts, live connections).
//! - `serve`: what every protocol's `serve` does around its own handshake and frames: the
//!   prologue ([`Serving::open`], [`Serving::attach`]), the login ([`Peer::login`]) and the
//!   epilogue ([`Serving::close`]); and [`PublishOnly`], the encoder of a session that only
//!   publishes.
//! - `subs`: each connection's subscription table ([`SubTable`]) and its memberships of
//!   stream consumers and queues ([`Memberships`]).
//! - [`queues`]: a connection's consumers of the engine's queues ([`queues::OutboxSink`]).
//! - `checks`: the permission checks every front-end goes through ([`check_publish`],
//!   [`subscribe_checked`], [`check_consume`], [`check_stream_api`]).

pub mod auth;
pub mod config;
pub mod ops;
pub mod queues;
pub mod tls;

mod checks;
mod serve;
mod subs;

pub use checks::{
    SubFail, check_consume, check_publish, check_stream_api, filter_stream_api_reply,
    subscribe_checked,
};
pub use hayate_io::conn::{Accepted, Conn, Handler, InputBudget, READ_BUF, Stop};
pub use serve::{Peer, PublishOnly, Serving};
pub use subs::{MAX_MEMBERSHIPS, Memberships, SubTable};

/// FNV-1a of `s`: a hash that is the same in every run and build, for names kept on disk
/// (a STOMP durable queue's consumer, an AMQP vhost's directory) that had to be cut.
pub fn stable_hash(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}
