//! The AMQP 0-9-1 front-end: RabbitMQ's clients (pika, kombu, amqp091-go, lapin, the Java
//! client) on Hayate's core. docs/amqp.md describes the model and its limits.
//!
//! - Exchanges are names with a type (direct, fanout, topic, headers); `""`, `amq.direct`,
//!   `amq.fanout`, `amq.topic`, `amq.headers` and `amq.match` exist from the start. An
//!   exchange holds nothing: publishing to it publishes to the broker on the key
//!   [`names::publish_key`] gives, where every protocol's subscribers can see it.
//! - Queues ([`queue::Queue`]) hold messages for their consumers; their bindings are broker
//!   subscriptions on [`names::binding_expr`], so an MQTT publish on `a/b` reaches a queue
//!   bound to `amq.topic` with `a.b` (or `a.*`, `#`).
//! - Queues are in memory (the streams issue brings durable ones): `durable` is accepted
//!   and kept, the messages do not survive a restart.
//!
//! # Layout
//! - this module: [`Amqp`] (the front-end's shared state: exchanges, queues, settings);
//! - `names`: exchanges and routing keys as keys;
//! - `queue`: queues, consumers, channels' delivery state, dispatch;
//! - `delivery`: messages ↔ frames and properties, the connection session's encoder;
//! - `conn`: one connection (handshake, channels, every method).

pub mod conn;
pub(crate) mod delivery;
pub(crate) mod names;
pub(crate) mod queue;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use hayate_amqp::{FieldTable, FieldValue};
use hayate_broker::Broker;
use hayate_core::{Key, KeyExpr, Message};

use crate::auth::Authenticator;
use crate::config::{AmqpSection, Config};
use names::Kind;
use queue::{Queue, lock};

/// A declared exchange.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Exchange {
    pub(crate) kind: Kind,
    pub(crate) durable: bool,
    pub(crate) auto_delete: bool,
    pub(crate) internal: bool,
    /// Predeclared (`""`, `amq.*`): cannot be deleted.
    pub(crate) builtin: bool,
}

/// Exchanges and queues of a virtual host.
#[derive(Debug, Default)]
pub(crate) struct Registry {
    pub(crate) exchanges: HashMap<String, Exchange>,
    pub(crate) queues: HashMap<String, Arc<Queue>>,
}

/// A virtual host: its exchanges and queues, and where its keys are.
#[derive(Debug)]
pub(crate) struct VHost {
    pub(crate) name: String,
    /// What every key of the vhost starts with: nothing for `/` (whose keys meet MQTT,
    /// STOMP and native clients' as they are), `amqp-vhost/<name>/` for the others.
    pub(crate) prefix: String,
    pub(crate) registry: Mutex<Registry>,
    /// Bumped whenever an exchange is declared or deleted: a connection's cached exchange
    /// is good while it is unchanged (publishing takes no registry lock).
    pub(crate) exchanges_changed: AtomicU64,
}

impl VHost {
    fn new(name: &str) -> VHost {
        let mut reg = Registry::default();
        for (x, kind) in [
            ("", Kind::Direct),
            ("amq.direct", Kind::Direct),
            ("amq.fanout", Kind::Fanout),
            ("amq.topic", Kind::Topic),
            ("amq.headers", Kind::Headers),
            ("amq.match", Kind::Headers),
        ] {
            reg.exchanges.insert(
                x.to_string(),
                Exchange {
                    kind,
                    durable: true,
                    auto_delete: false,
                    internal: false,
                    builtin: true,
                },
            );
        }
        let prefix = if name == "/" {
            String::new()
        } else {
            // One key segment, with nothing a key expression would read as a wildcard.
            let mut p = String::from("amqp-vhost/");
            for c in name.chars() {
                match c {
                    '%' => p.push_str("%25"),
                    '/' => p.push_str("%2F"),
                    '*' => p.push_str("%2A"),
                    c => p.push(c),
                }
            }
            p.push('/');
            p
        };
        VHost {
            name: name.to_string(),
            prefix,
            registry: Mutex::new(reg),
            exchanges_changed: AtomicU64::new(0),
        }
    }

    /// `k` (a key of the `/` mapping) as a key of this vhost.
    pub(crate) fn key(&self, k: Option<Key>) -> Option<Key> {
        let k = k?;
        if self.prefix.is_empty() {
            return Some(k);
        }
        Key::new(&format!("{}{}", self.prefix, k.as_str())).ok()
    }

    /// `e` (an expression of the `/` mapping) as an expression of this vhost.
    pub(crate) fn expr(&self, e: Option<KeyExpr>) -> Option<KeyExpr> {
        let e = e?;
        if self.prefix.is_empty() {
            return Some(e);
        }
        KeyExpr::new(&format!("{}{}", self.prefix, e.as_str())).ok()
    }

    /// The key a publish to exchange `x` with routing key `rk` goes to in this vhost:
    /// [`names::publish_key`] under the vhost's prefix; `None` (unroutable) for a key of
    /// another vhost (`/` reaching `amqp-vhost/...`). Inboxes (direct reply-to) belong to no
    /// vhost: the default exchange reaches them as they are.
    pub(crate) fn publish_key(&self, x: &str, kind: Kind, rk: &str) -> Option<Key> {
        if x.is_empty() && (rk.starts_with(names::REPLY_TO_PREFIX) || hayate_core::is_inbox_key(rk))
        {
            return names::queue_key(rk);
        }
        self.key(names::publish_key(x, kind, rk))
            .filter(|k| !self.foreign(k.as_str()))
    }

    /// A key of this vhost as a key of the `/` mapping (what routing keys and reply-to
    /// queue names are read from).
    pub(crate) fn strip<'a>(&self, key: &'a str) -> &'a str {
        if self.prefix.is_empty() {
            return key;
        }
        key.strip_prefix(self.prefix.as_str()).unwrap_or(key)
    }

    /// A key of another vhost (so not this one's, when this one is `/`)?
    pub(crate) fn foreign(&self, key: &str) -> bool {
        if self.prefix.is_empty() {
            key.starts_with(VHOST_KEYS)
        } else {
            !key.starts_with(self.prefix.as_str())
        }
    }
}

/// Where the keys of the vhosts other than `/` are.
pub(crate) const VHOST_KEYS: &str = "amqp-vhost/";

/// The AMQP front-end's shared state.
pub struct Amqp {
    pub(crate) broker: Broker,
    pub(crate) cfg: AmqpSection,
    pub(crate) auth: Arc<dyn Authenticator>,
    pub(crate) handshake_timeout: std::time::Duration,
    /// Largest connection.start-ok accepted before login (`limits.max_preauth_bytes`).
    pub(crate) max_preauth: usize,
    /// The virtual hosts (`[amqp] vhosts`).
    pub(crate) vhosts: HashMap<String, Arc<VHost>>,
    /// Numbers connections (exclusive queues' owners) and server-named queues.
    next: AtomicU64,
    /// The broker session dead letters are published from.
    dead_letters: tokio::sync::Mutex<Option<hayate_broker::Session>>,
}

impl std::fmt::Debug for Amqp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Amqp").finish_non_exhaustive()
    }
}

impl Amqp {
    /// The front-end for `broker` with `config`'s AMQP and auth settings.
    pub fn new(broker: Broker, config: &Config, auth: Arc<dyn Authenticator>) -> Arc<Amqp> {
        let vhosts = config
            .amqp
            .vhosts
            .iter()
            .map(|v| (v.clone(), Arc::new(VHost::new(v))))
            .collect();
        Arc::new(Amqp {
            broker,
            cfg: config.amqp.clone(),
            auth,
            handshake_timeout: std::time::Duration::from_millis(config.limits.handshake_timeout_ms),
            max_preauth: (config.limits.max_preauth_bytes as usize).max(4096),
            vhosts,
            next: AtomicU64::new(1),
            dead_letters: tokio::sync::Mutex::new(None),
        })
    }

    /// The first virtual host of `[amqp] vhosts` (`/` by default).
    pub(crate) fn first_vhost(&self) -> Arc<VHost> {
        self.cfg
            .vhosts
            .first()
            .and_then(|v| self.vhosts.get(v))
            .cloned()
            .unwrap_or_else(|| Arc::new(VHost::new("/")))
    }

    pub(crate) fn next_id(&self) -> u64 {
        self.next.fetch_add(1, Ordering::Relaxed)
    }

    /// Publishes a dead letter of queue `queue` to its dead-letter exchange (with its
    /// dead-letter routing key, or the message's own), with an `x-death`-like header
    /// (`x-first-death-reason`, `x-first-death-queue`).
    pub(crate) async fn dead_letter(
        self: &Arc<Self>,
        vhost: &VHost,
        queue: &str,
        exchange: &str,
        routing_key: Option<&str>,
        m: queue::QMsg,
        why: &'static str,
    ) {
        let kind = match lock(&vhost.registry).exchanges.get(exchange) {
            Some(x) => x.kind,
            None => return, // RabbitMQ drops dead letters to a missing exchange too.
        };
        let rk = routing_key.unwrap_or(m.routing_key.as_str().unwrap_or(""));
        let Some(key) = vhost.publish_key(exchange, kind, rk) else {
            return;
        };
        let mut msg = m.msg;
        // A cycle (a queue's dead letters coming back to it without a client rejecting
        // them, as RabbitMQ defines it): dropped, not sent round for ever.
        let first = msg
            .headers
            .iter()
            .flatten()
            .find(|(k, _)| k == "x-first-death-queue")
            .map(|(_, v)| v.clone());
        if why != queue::REJECTED && first.is_some_and(|q| q == queue.as_bytes()) {
            return;
        }
        msg.key = key;
        msg.attrs.expires = None;
        let h = msg.headers.get_or_insert_with(Vec::new);
        if !h.iter().any(|(k, _)| k == "x-first-death-reason") {
            h.push((
                "x-first-death-reason".into(),
                bytes::Bytes::from_static(why.as_bytes()),
            ));
            h.push((
                "x-first-death-queue".into(),
                bytes::Bytes::copy_from_slice(queue.as_bytes()),
            ));
        }
        let mut s = self.dead_letters.lock().await;
        let session = s.get_or_insert_with(|| self.broker.open_session(Box::new(Discard)));
        session.publish(hayate_broker::Batch::One(&msg)).await;
        session.flush();
    }
}

/// The encoder of a session that receives nothing (the dead-letter publisher).
struct Discard;

impl hayate_broker::Encoder for Discard {
    fn encode(
        &mut self,
        _sid: u32,
        _batch: hayate_broker::Batch<'_>,
        _origin: u64,
        _out: &mut hayate_broker::OutBuf,
    ) {
    }
    fn encode_lost(&mut self, _sid: u32, _count: u64, _out: &mut hayate_broker::OutBuf) {}
}

/// Does a message match a headers-exchange binding's arguments (`x-match` `all`, the
/// default, or `any`; the other `x-` arguments are not compared)? Values compare as text.
pub(crate) fn headers_match(args: &FieldTable, msg: &Message) -> bool {
    let any = args
        .get("x-match")
        .and_then(FieldValue::as_str)
        .is_some_and(|m| m.starts_with("any"));
    let header = |name: &str| {
        msg.headers
            .iter()
            .flatten()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
    };
    let mut wanted = args
        .0
        .iter()
        .filter(|(k, _)| !k.as_bytes().starts_with(b"x-"))
        .peekable();
    if wanted.peek().is_none() {
        return true;
    }
    let mut results = wanted.map(|(k, v)| {
        let Some(name) = k.as_str() else { return false };
        match (header(name), v) {
            (None, _) => false,
            (Some(_), FieldValue::Void) => true,
            (Some(h), FieldValue::LongStr(want)) => h == *want,
            (Some(h), v) => v
                .as_i64()
                .map(|n| n.to_string())
                .or_else(|| v.as_bool().map(|b| b.to_string()))
                .is_some_and(|t| h == t.as_bytes()),
        }
    });
    if any {
        results.any(|r| r)
    } else {
        results.all(|r| r)
    }
}
