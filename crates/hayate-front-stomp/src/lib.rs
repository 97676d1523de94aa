//! The STOMP 1.0, 1.1 and 1.2 front-end.
//!
//! One connection = one broker [`Session`](hayate_broker::Session) with a
//! [`delivery::StompEncoder`]. Destinations map onto the core model:
//! - `/topic/<expr>`: the key (SEND) or key expression (SUBSCRIBE, `*` and `**` allowed)
//!   `<expr>`, fan-out: `/topic/a/b` is the key `a/b`, which MQTT's `a/b` and the native
//!   protocol's `a/b` also name.
//! - `/queue/<name>`: the broker's queue `<name>` (AMQP's `<name>` in vhost `/`, the native
//!   protocol's CONSUME of `<name>`), made implicitly at the first SEND or SUBSCRIBE if no
//!   protocol has made it ([`hayate_broker::Broker::queue_implicit`]: at most
//!   `stomp.queue_max_backlog` messages ready). SEND publishes to the key `<name>` (its
//!   binding); SUBSCRIBE is one of its consumers ([`hayate_front::Memberships::join_queue`]).
//!   A NACKed message, or one unacknowledged when its consumer unsubscribes or disconnects,
//!   goes back to its place in the queue: another consumer gets it. A durable `/queue/` (a
//!   stream captures its key) joins the stream's consumer `stomp-<name>` instead.
//! - `/temp-queue/<name>`: a private reply queue of the connection, the key
//!   `_inbox/<session>/<name>` (the native protocol's inbox convention). A SEND with
//!   `reply-to:/temp-queue/<name>` goes out with `reply-to:/queue/_inbox/<session>/<name>`;
//!   a reply SENT there reaches only this connection, as a MESSAGE with
//!   `subscription:/temp-queue/<name>` (RabbitMQ's convention), without a SUBSCRIBE.
//!
//! Message metadata: `reply-to` ↔ the message's reply-to key, `correlation-id` ↔ its
//! correlation id, every other application header (`content-type` included) ↔ a message
//! header, so MQTT 5.0 user properties and content type arrive as STOMP headers and back.

pub mod conn;
pub mod delivery;

use std::sync::Arc;

use hayate_broker::Broker;

use hayate_front::auth::Authenticator;
use hayate_front::config::{Config, StompSection};

/// The names of the durable consumers this front-end makes for a durable `/queue/<name>`
/// start with this (`stomp-<name>`). They are shared work queues, with no owner: the server
/// lists the prefix in `BrokerConfig::shared_consumers`, so that one made beforehand through
/// the stream API has none either.
pub const QUEUE_CONSUMER_PREFIX: &str = "stomp-";

/// The STOMP front-end's shared state.
pub struct Stomp {
    pub(crate) broker: Broker,
    pub(crate) cfg: StompSection,
    pub(crate) auth: Arc<dyn Authenticator>,
    pub(crate) server_name: String,
    pub(crate) handshake_timeout: std::time::Duration,
    /// Largest CONNECT frame accepted (`limits.max_preauth_bytes`).
    pub(crate) max_preauth: usize,
}

impl std::fmt::Debug for Stomp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stomp").finish_non_exhaustive()
    }
}

impl Stomp {
    /// The front-end for `broker` with `config`'s STOMP and auth settings.
    pub fn new(broker: Broker, config: &Config, auth: Arc<dyn Authenticator>) -> Arc<Stomp> {
        Arc::new(Stomp {
            broker,
            cfg: config.stomp.clone(),
            auth,
            server_name: config.server.name.clone(),
            handshake_timeout: std::time::Duration::from_millis(config.limits.handshake_timeout_ms),
            max_preauth: (config.limits.max_preauth_bytes as usize).max(64),
        })
    }
}
