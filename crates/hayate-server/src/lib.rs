//! Hayate's server: listeners and connections, wiring protocol front-ends to the broker.
//!
//! # Layout
//! - [`config`], [`auth`], [`tls`], [`ops`] and [`frontend`]: re-exported from
//!   [`hayate_front`], the front-end layer (settings, users and permissions, TLS, operational
//!   state, the connection driver and the checks every front-end shares).
//! - [`server`]: [`Server`]: binds the configured listeners (TCP, Unix) and runs until a
//!   shutdown future completes; [`Server::from_listener`] embeds it in a test or a program.
//! - [`native`], [`shm`], [`fanout`]: re-exported from [`hayate_front_native`], the native
//!   protocol front-end (one reader loop and one writer task per connection, the encoder
//!   that turns deliveries into MSG / MSG_BATCH frames, the shared-memory offer and the
//!   fan-out arena).
//! - [`ws`]: WebSocket as a transport (HTTP upgrade, RFC 6455 framing in process) on top of
//!   TCP.
//! - [`transport`] and [`busy`]: re-exported from [`hayate_io`] (the transport trait, TCP,
//!   Unix and in-memory transports, the vectored write loop; busy-polling, the opt-in latency
//!   mode `[server] busy_poll_us`).
//!
//! # The path of a message
//! socket → reader (`read_buf` into a large buffer; decode *every* frame in it) →
//! [`hayate_broker::Session::publish`] (cached route per key, no global lock) → each target's
//! [`hayate_broker::Outbox`] (encoded in the target's protocol under its lock) → the target's
//! writer task (takes everything queued, one vectored write) → socket.

pub use hayate_front_amqp as amqp;
pub use hayate_front_mqtt as mqtt;
pub use hayate_front_stomp as stomp;
pub mod server;
pub mod ws;

/// The native front-end, now the crate [`hayate_front_native`]: its modules keep their old
/// paths (`crate::native`, `hayate_server::shm`, `hayate_server::fanout`).
pub use hayate_front_native::{fanout, native, shm};

/// The front-end layer every front-end here builds on, now the crate [`hayate_front`]: its
/// modules keep their old paths (`crate::auth`, `hayate_server::config`, ...), and the layer
/// itself is `crate::frontend`.
pub use hayate_front::{self as frontend, auth, config, ops, tls};

/// The admin HTTP listener (JSON API, `/metrics`, dashboard, health checks), now the crate
/// [`hayate_admin`]; `server/figures.rs` hands it the front-ends' figures.
pub use hayate_admin as admin;

pub use config::Config;
pub use hayate_io::{busy, transport};
pub use server::{Protocol, Server};
